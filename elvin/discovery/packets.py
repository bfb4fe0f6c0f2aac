"""The Elvin Router Discovery Protocol (ERDP) packets and their XDR form.

Normative: the Elvin Router Discovery Protocol draft
(draft-arnold-elvin-discovery-prelim-00), sections 5.2-5.3 (abstract
packets) and 6.1 (IPv4 concrete protocol).  Each UDP datagram holds exactly
one packet::

    SvrRqst      = 16: uint8 major, uint8 minor, uint8 locality
    SvrAdvt      = 17: uint8 major, uint8 minor, boolean default_flag,
                       id32 revision, string scope_name, string server_name,
                       string uri[]
    SvrAdvtClose = 18: uint8 major, uint8 minor, string server

All items are XDR (RFC 1832): the pkt_id enum, every uint8 and the boolean
are 4-byte big-endian words, id32 is a 4-byte word, a string is a 4-byte
byte count, the UTF-8 bytes and zero padding to a multiple of four, and
``uri[]`` is a 4-byte count followed by that many strings.  The
``elvin.protocols.xdr`` Writer and Reader do the work.

Decisions where the draft is silent or loose (see docs/discovery.md):

* A uint8 word above 255, a boolean other than 0 or 1, a negative or
  impossible array count, bad UTF-8 or a truncated item is a
  ``DecodeError``; so is a SvrAdvt with no URI ("each SvrAdvt MUST contain
  at least one URI").  An unknown pkt_id is an ``UnknownPacketError``
  (a ``DecodeError``) so a receiver can ignore it quietly.
* Trailing bytes after a packet are an error when the packet's minor
  version is ours (4.0) or lower; a later minor version (4.1, ...) may
  append fields, so they are ignored there.
* The revision is an unsigned 32-bit value (the draft says signedness does
  not matter).  Zero is reserved: ``encode`` refuses it, ``decode``
  accepts it (be liberal in what you accept).
* A scope name must not contain ``:``.  ``encode`` refuses such a scope;
  ``decode`` accepts it (a foreign router's mistake should not hide it
  from clients that don't care about scopes).
* Version compatibility (section 5.2.1): same major version and our minor
  version no greater than the packet's.  ``compatible`` implements it;
  this module decodes any version, the receivers decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elvin.protocols.xdr import DecodeError, EncodeError, Reader, Writer

__all__ = [
    "GROUP", "PORT", "VERSION", "SVR_RQST", "SVR_ADVT", "SVR_ADVT_CLOSE",
    "MAX_LOCALITY", "MAX_ADVERT_SIZE", "SvrRqst", "SvrAdvt", "SvrAdvtClose",
    "UnknownPacketError", "DecodeError", "EncodeError", "encode", "decode",
    "compatible", "fit_advert", "check_scope",
]

#: The ERDP IPv4 multicast group and UDP port (section 6.1.1).
GROUP = "224.4.0.1"
PORT = 2917

#: The discovery protocol version this module speaks.
VERSION = (4, 0)

#: pkt_id values (section 6.1.2.1).
SVR_RQST = 16
SVR_ADVT = 17
SVR_ADVT_CLOSE = 18

#: Largest locality (it maps directly onto the 8-bit IPv4 TTL).
MAX_LOCALITY = 255

#: Largest SvrAdvt we send: an Ethernet MTU minus the IPv4 and UDP headers,
#: so an advertisement is never fragmented.  URIs that do not fit are left
#: out (section 5.3 allows it); see ``fit_advert``.
MAX_ADVERT_SIZE = 1500 - 20 - 8

_UINT8_MAX = 0xFF
_ID32_MAX = 0xFFFFFFFF


def _check_uint8(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _UINT8_MAX:
        raise ValueError(f"{what} must be 0-255, not {value}")


def check_scope(scope):
    """Raise ValueError unless ``scope`` is a valid scope name (no ':')."""
    if not isinstance(scope, str):
        raise TypeError(f"scope name must be str, not {type(scope).__name__}")
    if ":" in scope:
        raise ValueError(f"scope name {scope!r} must not contain ':'")
    return scope


@dataclass(frozen=True, kw_only=True)
class SvrRqst:
    """Router solicitation request (client to routers)."""

    locality: int = 0
    major: int = VERSION[0]
    minor: int = VERSION[1]

    pkt_id = SVR_RQST

    def __post_init__(self):
        _check_uint8(self.major, "major_version")
        _check_uint8(self.minor, "minor_version")
        _check_uint8(self.locality, "locality")


@dataclass(frozen=True, kw_only=True)
class SvrAdvt:
    """Router advertisement (router to clients).

    ``uris`` is a tuple of URI strings, exactly as sent: receivers parse
    (and may reject) each one themselves.
    """

    server: str
    revision: int
    uris: tuple = field(default=())
    scope: str = ""
    default: bool = False
    major: int = VERSION[0]
    minor: int = VERSION[1]

    pkt_id = SVR_ADVT

    def __post_init__(self):
        _check_uint8(self.major, "major_version")
        _check_uint8(self.minor, "minor_version")
        if not isinstance(self.server, str):
            raise TypeError("server name must be str")
        if not isinstance(self.scope, str):
            raise TypeError("scope name must be str")
        if isinstance(self.revision, bool) or not isinstance(self.revision, int):
            raise TypeError("revision must be an int")
        if not 0 <= self.revision <= _ID32_MAX:
            raise ValueError(f"revision must be 0-{_ID32_MAX}, not {self.revision}")
        uris = tuple(str(u) for u in self.uris)
        object.__setattr__(self, "uris", uris)
        object.__setattr__(self, "default", bool(self.default))


@dataclass(frozen=True, kw_only=True)
class SvrAdvtClose:
    """Router advertisement withdrawal (router to clients)."""

    server: str
    major: int = VERSION[0]
    minor: int = VERSION[1]

    pkt_id = SVR_ADVT_CLOSE

    def __post_init__(self):
        _check_uint8(self.major, "major_version")
        _check_uint8(self.minor, "minor_version")
        if not isinstance(self.server, str):
            raise TypeError("server name must be str")


class UnknownPacketError(DecodeError):
    """The datagram's pkt_id is not an ERDP packet type."""


def compatible(packet, ours=VERSION):
    """True if ``packet``'s version is compatible with ours (section 5.2.1):
    the same major version, and our minor version no greater than its."""
    return packet.major == ours[0] and ours[1] <= packet.minor


def encode(packet):
    """The XDR bytes of one ERDP packet (one UDP datagram)."""
    kind = type(packet)
    if kind not in (SvrRqst, SvrAdvt, SvrAdvtClose):
        raise TypeError(f"not an ERDP packet: {kind.__name__}")
    w = Writer()
    w.int32(packet.pkt_id)
    w.uint32(packet.major).uint32(packet.minor)
    if kind is SvrRqst:
        w.uint32(packet.locality)
    elif kind is SvrAdvt:
        if packet.revision == 0:
            raise EncodeError("revision 0 is reserved")
        if ":" in packet.scope:
            raise EncodeError(f"scope name {packet.scope!r} must not contain ':'")
        if not packet.uris:
            raise EncodeError("a SvrAdvt must carry at least one URI")
        w.boolean(packet.default).uint32(packet.revision)
        w.string(packet.scope).string(packet.server).strings(packet.uris)
    else:
        w.string(packet.server)
    return w.getvalue()


def _uint8(reader, what):
    pos = reader.pos
    value = reader.uint32(what)
    if value > _UINT8_MAX:
        raise DecodeError(f"{what} must be 0-255, not {value}", pos)
    return value


def decode(data):
    """Decode one datagram into a packet, or raise DecodeError."""
    r = Reader(data)
    pkt_id = r.int32("pkt_id")
    if pkt_id not in (SVR_RQST, SVR_ADVT, SVR_ADVT_CLOSE):
        raise UnknownPacketError(f"unknown discovery pkt_id {pkt_id}", 0)
    major = _uint8(r, "major_version")
    minor = _uint8(r, "minor_version")
    if pkt_id == SVR_RQST:
        packet = SvrRqst(major=major, minor=minor,
                         locality=_uint8(r, "locality"))
    elif pkt_id == SVR_ADVT:
        default = r.boolean("default_flag")
        revision = r.uint32("revision")
        scope = r.string("scope_name")
        server = r.string("server_name")
        pos = r.pos
        count = r.count(4, "uri array")
        if count == 0:
            raise DecodeError("SvrAdvt carries no URI", pos)
        uris = tuple(r.string("uri") for _ in range(count))
        packet = SvrAdvt(major=major, minor=minor, default=default,
                         revision=revision, scope=scope, server=server,
                         uris=uris)
    else:
        packet = SvrAdvtClose(major=major, minor=minor,
                              server=r.string("server"))
    if minor <= VERSION[1]:
        r.expect_end(type(packet).__name__)
    return packet


def fit_advert(packet, limit=MAX_ADVERT_SIZE):
    """``packet`` with trailing URIs dropped until it encodes in ``limit``
    bytes; returns ``(packet, dropped_uris)``.  Raises EncodeError if not
    even the first URI fits."""
    uris = packet.uris
    size = len(encode(packet))
    dropped = []
    while size > limit and len(uris) > 1:
        dropped.insert(0, uris[-1])
        uris = uris[:-1]
        packet = SvrAdvt(server=packet.server, revision=packet.revision,
                         uris=uris, scope=packet.scope, default=packet.default,
                         major=packet.major, minor=packet.minor)
        size = len(encode(packet))
    if size > limit:
        raise EncodeError(f"SvrAdvt of {size} bytes exceeds {limit} bytes "
                          "even with a single URI")
    return packet, dropped
