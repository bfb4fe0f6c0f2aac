"""Elvin 4.0 client-protocol packets (section 7.4) and their XDR codec.

Each packet is an immutable dataclass named by the spec's abbreviation,
with ``ID`` its pkt_id (section 8.2.3.1) and fields in the order of the
spec's struct. Field annotations are wire types (``ID32``, ``KEYS``, ...),
so a class definition reads like the spec and is also the codec table:
``define`` compiles it into an encoder and a decoder, merging runs of
fixed-size fields into one ``struct`` call.

``encode(packet)`` gives the XDR bytes, pkt_id first, with no framing;
``decode(data)`` gives a packet or raises ``xdr.DecodeError``
(``UnknownPacketError`` for an unregistered pkt_id, which carries the id).

Wire decisions beyond the XDR primitives (see ``xdr``'s docstring):

* uint8 (versions) and uint16 (Nack error) are 4-byte XDR unsigned ints;
  a decoded value outside 0..255 / 0..65535 is a DecodeError.
* id32 (xid, Disconn reason, key scheme) is XDR unsigned int; id64 is
  unsigned hyper, so ids are Python ints in 0..2**32-1 / 0..2**64-1. The
  spec says signedness does not matter; Avis's signed ids interoperate
  bit for bit. The reserved value zero is not rejected here: that is the
  session's business (it can Nack with the xid it got).
* Keys: ``int32 count`` of scheme entries, each ``id32 scheme``, ``int32
  count`` of key sets, each an ``int32 count`` of opaque keys (exactly
  what Avis writes). The codec does not check per-scheme key-set counts
  (Avis wants 1 for single and 2 for dual schemes) or scheme ids.
* NotifyEmit with no attributes is accepted although 8.2.3.5 says n > 0:
  that too is for the session to decide.
* ``decode(data, limits=...)`` takes the receiver's limits on the arrays
  a packet holds (``xdr.Reader``'s ``limits``, by ``Class.field``; a Keys
  field is held to its number of keys): an array over its limit is not
  read, and the packet comes back with an ``UnreadArray`` in that field
  and the fields after it empty, for the session to answer as it would
  the decoded packet (a router: ``ConnectionOptions.count_limits``).
"""

import operator
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar

from elvin.protocols.xdr import (CountOverLimit, DecodeError, EncodeError, Reader,
                                  RepeatedNameError, Writer)
from elvin.protocols.xdr import _accelerated_name_values as _compiled_name_values
from elvin.values import Int64 as _Int64

__all__ = [
    "UNotify", "Nack", "ConnRqst", "ConnRply", "DisconnRqst", "DisconnRply",
    "Disconn", "SecRqst", "SecRply", "NotifyEmit", "NotifyDeliver",
    "SubAddRqst", "SubModRqst", "SubDelRqst", "SubRply", "DropWarn",
    "TestConn", "ConfConn", "QosRqst", "QosRply", "QnchAddRqst",
    "QnchModRqst", "QnchDelRqst", "QnchRply", "SubAddNotify", "SubModNotify",
    "SubDelNotify", "Keys", "UnreadArray", "UnknownPacketError", "DecodeError",
    "EncodeError", "RepeatedNameError", "encode", "decode", "notification_repeating",
    "encode_attributes", "decode_notify_emit",
    "notify_emit_fields", "notify_emit_limits_from",
    "encode_notify_deliver_from", "define", "register", "Registry",
    "CLIENT", "WireType", "ID32", "UINT32", "INT32", "ID64", "UINT8",
    "UINT16", "BOOLEAN", "STRING", "NAME_VALUES", "OPTIONS", "VALUES", "STRINGS",
    "ID64S", "KEYS", "SUBAST",
]


class UnknownPacketError(DecodeError):
    """The pkt_id is not one this codec knows; ``packet_id`` is the id."""

    def __init__(self, packet_id):
        super().__init__(f"unknown packet id {packet_id}", 0)
        self.packet_id = packet_id


# -- Keys ------------------------------------------------------------------


class Keys:
    """The spec's Keys struct: (scheme id, key sets), each key set a tuple
    of opaque keys. Immutable; compares by structure (wire order).

    Build from a mapping ``{scheme: [[key, ...], ...]}`` or from pairs
    ``[(scheme, [[key, ...], ...]), ...]``. ``repr`` shows only counts:
    key bytes are secrets and must never reach a log.
    """

    __slots__ = ("_entries", "_hash")

    EMPTY: ClassVar["Keys"]

    def __init__(self, entries=()):
        if isinstance(entries, Keys):
            normalised = entries._entries
        else:
            items = entries.items() if isinstance(entries, Mapping) else entries
            normalised = tuple((_scheme_id(scheme), _key_sets(key_sets))
                               for scheme, key_sets in items)
        object.__setattr__(self, "_entries", normalised)
        object.__setattr__(self, "_hash", None)

    @classmethod
    def _trusted(cls, entries):
        keys = object.__new__(cls)
        object.__setattr__(keys, "_entries", entries)
        object.__setattr__(keys, "_hash", None)
        return keys

    def __setattr__(self, attr, value):
        raise AttributeError("Keys are immutable")

    def __delattr__(self, attr):
        raise AttributeError("Keys are immutable")

    def entries(self):
        """``((scheme, ((key, ...), ...)), ...)`` in wire order."""
        return self._entries

    def schemes(self):
        """The scheme ids, in wire order (a scheme may repeat)."""
        return tuple(scheme for scheme, _ in self._entries)

    def key_sets(self, scheme):
        """All key sets given for ``scheme`` (concatenated if repeated)."""
        return tuple(ks for s, sets in self._entries if s == scheme for ks in sets)

    def key_count(self):
        return sum(len(ks) for _, sets in self._entries for ks in sets)

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)

    def __bool__(self):
        return bool(self._entries)

    def __eq__(self, other):
        if not isinstance(other, Keys):
            return NotImplemented
        return self._entries == other._entries

    def __hash__(self):
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(self._entries))
        return self._hash

    def __repr__(self):
        if not self._entries:
            return "Keys.EMPTY"
        parts = []
        for scheme, sets in self._entries:
            sizes = "+".join(str(len(ks)) for ks in sets) or "0"
            parts.append(f"scheme {scheme}: {len(sets)} key set(s) of {sizes} key(s)")
        return f"<Keys {'; '.join(parts)}>"

    __str__ = __repr__

    def __reduce__(self):
        return (Keys, (self._entries,))


def _scheme_id(scheme):
    if isinstance(scheme, bool) or not isinstance(scheme, int):
        raise TypeError(f"key scheme id must be int, not {type(scheme).__name__}")
    if not 0 <= scheme <= 0xFFFFFFFF:
        raise ValueError(f"key scheme id {scheme} out of range for id32")
    return int(scheme)


def _key_sets(key_sets):
    result = []
    for key_set in key_sets:
        if isinstance(key_set, (bytes, bytearray, memoryview, str)):
            raise TypeError("a key set is a sequence of keys, not a single key")
        keys = []
        for key in key_set:
            if not isinstance(key, (bytes, bytearray, memoryview)):
                raise TypeError(f"a key must be bytes, not {type(key).__name__}")
            keys.append(bytes(key))
        result.append(tuple(keys))
    return tuple(result)


Keys.EMPTY = Keys()


def _write_keys(writer, keys):
    if not isinstance(keys, Keys):
        raise TypeError(f"expected Keys, not {type(keys).__name__}")
    entries = keys._entries
    writer.raw(struct.pack(">I", len(entries)))
    for scheme, sets in entries:
        writer.raw(struct.pack(">II", scheme, len(sets)))
        for key_set in sets:
            writer.raw(struct.pack(">I", len(key_set)))
            for key in key_set:
                writer.opaque(key)


#: The scheme entries and key sets a Keys field under a limit of L keys may
#: hold: max(L, this) together (3 schemes, a set or two each, is usual).
KEY_FIELD_MIN_SHAPES = 64


def _read_keys(reader, what=None):
    """A Keys field. With a limit in ``reader.limits`` for ``what`` (the
    field), the keys are counted as their counts are read, and
    CountOverLimit is raised as soon as there are more, before they are
    read."""
    pos = reader.pos
    n = reader.count(8, "Keys scheme")
    if n == 0:
        return Keys.EMPTY
    limits = reader.limits
    limit = None if limits is None else limits.get(what)
    if limit is not None:
        # Scheme entries and key sets hold no key and may be empty: held to
        # their own bound, so the field's decoding is bounded by its limit
        # whatever it holds; past it the field is answered as over its limit.
        shapes = max(limit, KEY_FIELD_MIN_SHAPES) - n
        if shapes < 0:
            raise CountOverLimit(what, limit + 1, limit, pos)
    total = 0
    entries = []
    for _ in range(n):
        scheme = reader.uint32("key scheme id")
        sets = []
        pos = reader.pos
        set_count = reader.count(4, "key set")
        if limit is not None:
            shapes -= set_count
            if shapes < 0:
                raise CountOverLimit(what, limit + 1, limit, pos)
        for _ in range(set_count):
            opaque = reader.opaque
            pos = reader.pos
            count = reader.count(4, "key")
            if limit is not None:
                total += count
                if total > limit:
                    raise CountOverLimit(what, total, limit, pos)
            sets.append(tuple([opaque("key") for _ in range(count)]))
        entries.append((scheme, tuple(sets)))
    return Keys._trusted(tuple(entries))


class UnreadArray:
    """An array field left unread because its count is over the receiver's
    limit for it (``xdr.CountOverLimit``): a stand-in the session answers
    as it would the decoded array. Its ``len`` (and, for a Keys field,
    ``key_count()``) is the count read (for Keys, the keys counted until
    the limit was passed), so every check of the count sees it over the
    limit; it has no items."""

    __slots__ = ("what", "count", "limit")

    def __init__(self, what, count, limit):
        self.what = what
        self.count = count
        self.limit = limit

    @classmethod
    def of(cls, error):
        """The stand-in for the array ``error`` (a CountOverLimit) refused."""
        return cls(error.what, error.count, error.limit)

    def __len__(self):
        return self.count

    def key_count(self):
        return self.count

    def __iter__(self):
        return iter(())

    def items(self):
        return iter(())

    def entries(self):
        return ()

    def __repr__(self):
        return f"<UnreadArray {self.what}: {self.count} items, over {self.limit}>"


# -- wire types ------------------------------------------------------------


class WireType:
    """How one packet field is marshalled; used as the field's annotation.

    Fixed-size types have a struct code (and an optional range/convert
    step); the others a reader and a writer function.
    """

    __slots__ = ("name", "code", "limit", "read", "write", "convert", "empty")

    def __init__(self, name, code=None, limit=None, read=None, write=None,
                 convert=None, empty=None):
        self.name = name
        self.code = code          # struct format char for fixed-size types
        self.limit = limit        # largest legal value, if narrower than code
        self.read = read          # read(reader, what) for variable types
        self.write = write        # write(writer, value) for variable types
        self.convert = convert    # normalise a constructor argument
        #: the value standing in for the field when it was not read (after
        #: an UnreadArray)
        self.empty = (0 if code is not None else "") if empty is None else empty

    def __repr__(self):
        return self.name


def _tuple(value):
    return value if type(value) is tuple else tuple(value)


def _dict(value):
    return value if type(value) is dict else dict(value)


def _bool(value):
    return value if value is True or value is False else bool(value)


def _keys(value):
    return value if isinstance(value, Keys) else Keys(value)


ID32 = WireType("id32", "I")
UINT32 = WireType("uint32", "I")
INT32 = WireType("int32", "i")
ID64 = WireType("id64", "Q")
UINT8 = WireType("uint8", "I", limit=0xFF)
UINT16 = WireType("uint16", "I", limit=0xFFFF)
BOOLEAN = WireType("boolean", "I", limit=1, convert=_bool, empty=False)
STRING = WireType("string", read=Reader.string, write=Writer.string)
NAME_VALUES = WireType("NameValue[]", read=Reader.name_values,
                       write=Writer.name_values, convert=_dict, empty={})
#: A connection options table: a NameValue array whose repeated name
#: takes its last value (``Reader.options``).
OPTIONS = WireType("options", read=Reader.options, write=Writer.name_values,
                   convert=_dict, empty={})
VALUES = WireType("Value[]", read=Reader.values, write=Writer.values,
                  convert=_tuple, empty=())
STRINGS = WireType("string[]", read=Reader.strings, write=Writer.strings,
                   convert=_tuple, empty=())
ID64S = WireType("id64[]", read=Reader.uint64s, write=Writer.uint64s,
                 convert=_tuple, empty=())
KEYS = WireType("Keys", read=_read_keys, write=_write_keys, convert=_keys,
                empty=Keys.EMPTY)
SUBAST = WireType("SubAST", read=lambda r, what: r.ast(None, what),
                  write=lambda w, node: w.ast(node))


# -- compiling a layout ----------------------------------------------------


def _builder(cls, names):
    """``build(args)`` making a packet from decoded field values.

    Decoded values are already tuples, dicts and Keys, so for our own
    slotted classes the normalising ``__post_init__`` (and the frozen
    dataclass ``__init__``) is skipped by setting the slots directly.
    """
    post_init = getattr(cls, "__post_init__", None)
    slots = [cls.__dict__.get(name) for name in names]
    if (post_init is not None and not getattr(post_init, "_normalises_only", False)) \
            or not all(type(slot).__name__ == "member_descriptor" for slot in slots):
        return lambda args: cls(*args)
    setters = tuple(slot.__set__ for slot in slots)
    new = object.__new__

    def build(args):
        packet = new(cls)
        for setter, value in zip(setters, args):
            setter(packet, value)
        return packet
    return build


def _compile(cls, layout):
    """Build (encoder, decoder) from ``[(field name, WireType), ...]``.

    Consecutive fixed-size fields become one Struct so decoding a reply or
    a request header costs one unpack_from.
    """
    steps = []
    run = []

    def flush():
        if run:
            st = struct.Struct(">" + "".join(t.code for _, t in run))
            checks = tuple((i, t) for i, (_, t) in enumerate(run) if t.limit is not None)
            steps.append((st, tuple(n for n, _ in run), checks, None, None, None))
            run.clear()

    for name, wire in layout:
        if not isinstance(wire, WireType):
            raise TypeError(f"{cls.__name__}.{name}: annotation {wire!r} is not a WireType")
        if wire.code is not None:
            run.append((name, wire))
        else:
            flush()
            steps.append((None, name, None, wire.read, wire.write,
                          f"{cls.__name__}.{name}"))
    flush()
    steps = tuple(steps)
    build = _builder(cls, [name for name, _ in layout])
    empties = tuple(wire.empty for _, wire in layout)

    def unread(reader, args, error):
        # An array over the reader's limit: the packet with a stand-in for
        # it and the fields after it empty, the rest of the data unread.
        args.append(UnreadArray.of(error))
        args.extend(empties[len(args):])
        reader.pos = reader.end
        return build(args)

    def decoder(reader):
        buf = reader._buf
        args = []
        for st, names, checks, read, _, what in steps:
            if st is None:
                try:
                    args.append(read(reader, what))
                except CountOverLimit as e:
                    return unread(reader, args, e)
                continue
            pos = reader.pos
            size = st.size
            if pos + size > reader.end:
                raise DecodeError(f"truncated {cls.__name__}: need {size} bytes "
                                  f"for {', '.join(names)}, have {reader.end - pos}", pos)
            got = st.unpack_from(buf, pos)
            reader.pos = pos + size
            if checks:
                got = list(got)
                for i, wire in checks:
                    if got[i] > wire.limit:
                        raise DecodeError(f"{cls.__name__}.{names[i]}: {got[i]} is not "
                                          f"a valid {wire.name}", pos + 4 * i)
                    if wire is BOOLEAN:
                        got[i] = got[i] == 1
            args.extend(got)
        return build(args)

    def encoder(writer, packet):
        for st, names, checks, _, write, _ in steps:
            if st is None:
                write(writer, getattr(packet, names))
                continue
            got = [getattr(packet, n) for n in names]
            for i, wire in checks:
                if wire is BOOLEAN:
                    got[i] = 1 if got[i] else 0
                elif not 0 <= got[i] <= wire.limit:
                    raise EncodeError(f"{cls.__name__}.{names[i]}: {got[i]!r} out of "
                                      f"range for {wire.name}")
            try:
                writer.raw(st.pack(*got))
            except struct.error as e:
                raise EncodeError(f"{cls.__name__}: {e} in {', '.join(names)} "
                                  f"= {got!r}") from None

    return encoder, decoder


# -- registry --------------------------------------------------------------

#: class -> (pkt_id bytes, encoder(writer, packet)); shared by all registries
_ENCODERS = {}


#: class -> encode(packet) for packets of two or more fixed-size, unchecked
#: fields (SubRply, say): one pack, no Writer. A struct.error falls back to
#: the general encoder, which words the error.
_FIXED_ENCODERS = {}


def _fixed_encoder(header, layout):
    if len(layout) < 2 or any(wire.code is None or wire.limit is not None
                              for _, wire in layout):
        return None
    pack = struct.Struct(">I" + "".join(wire.code for _, wire in layout)).pack
    get = operator.attrgetter(*[name for name, _ in layout])
    pkt_id = struct.unpack(">I", header)[0]
    return lambda packet: pack(pkt_id, *get(packet))


class Registry:
    """A set of decodable packets, keyed by pkt_id.

    ``CLIENT`` holds the client protocol; the federation protocol can make
    its own with ``CLIENT.copy()`` and ``register`` more classes into it,
    so a client channel never decodes federation-only packets.
    """

    def __init__(self):
        self._decoders = {}

    def copy(self):
        other = Registry()
        other._decoders.update(self._decoders)
        return other

    def classes(self):
        return tuple(cls for cls, _ in self._decoders.values())

    def register(self, packet_class, encoder=None, decoder=None, replace=False):
        """Make ``packet_class`` (with an ``ID`` attribute) en/decodable.

        ``encoder(writer, packet)`` writes the body after the pkt_id;
        ``decoder(reader)`` returns a packet from the body. Either, when
        omitted, is compiled from the dataclass fields' WireType
        annotations.
        """
        pkt_id = packet_class.ID
        if not replace and pkt_id in self._decoders and \
                self._decoders[pkt_id][0] is not packet_class:
            raise ValueError(f"packet id {pkt_id} is already registered to "
                             f"{self._decoders[pkt_id][0].__name__}")
        header = struct.pack(">I", pkt_id)
        _FIXED_ENCODERS.pop(packet_class, None)
        if encoder is None or decoder is None:
            layout = [(f.name, f.type) for f in fields(packet_class)]
            compiled_encoder, compiled_decoder = _compile(packet_class, layout)
            if encoder is None:
                fixed = _fixed_encoder(header, layout)
                if fixed is not None:
                    _FIXED_ENCODERS[packet_class] = fixed
            encoder = encoder or compiled_encoder
            decoder = decoder or compiled_decoder
        _ENCODERS[packet_class] = (header, encoder)
        self._decoders[pkt_id] = (packet_class, decoder)
        return packet_class

    def decode(self, data, repeats=None, limits=None):
        """Decode one whole packet (no framing header). ``repeats`` and
        ``limits``: see ``decode``."""
        reader = Reader(data, repeats=repeats, limits=limits)
        if reader.end < 4:
            raise DecodeError(f"packet of {reader.end} bytes has no pkt_id", 0)
        pkt_id = reader.int32("pkt_id")
        entry = self._decoders.get(pkt_id)
        if entry is None:
            raise UnknownPacketError(pkt_id)
        cls, decoder = entry
        try:
            packet = decoder(reader)
        except struct.error as e:
            # A corrupted count or length can make an unpack run off the end.
            raise DecodeError(f"malformed {cls.__name__}: {e}", reader.pos) from None
        if reader.pos != reader.end:
            raise DecodeError(f"{reader.end - reader.pos} trailing bytes after "
                              f"{cls.__name__}", reader.pos)
        return packet


CLIENT = Registry()


def register(packet_class, encoder=None, decoder=None, registry=None, replace=False):
    """Register a packet class in ``registry`` (default: ``CLIENT``)."""
    return (CLIENT if registry is None else registry).register(
        packet_class, encoder, decoder, replace)


def define(pkt_id, registry=None):
    """Class decorator: frozen slotted dataclass + ``ID`` + registration.

    Field annotations must be WireTypes; sequence, mapping and Keys fields
    are normalised to tuple, dict and Keys on construction.
    """
    def decorate(cls):
        cls.ID = pkt_id
        conversions = tuple((name, wire.convert)
                            for name, wire in cls.__dict__.get("__annotations__", {}).items()
                            if isinstance(wire, WireType) and wire.convert)
        if conversions and "__post_init__" not in cls.__dict__:
            def __post_init__(self):
                for name, convert in conversions:
                    value = getattr(self, name)
                    converted = convert(value)
                    if converted is not value:
                        object.__setattr__(self, name, converted)
            __post_init__._normalises_only = True
            cls.__post_init__ = __post_init__
        cls = dataclass(frozen=True, slots=True)(cls)
        register(cls, registry=registry)
        return cls
    return decorate


def encode(packet):
    """XDR bytes of ``packet``: pkt_id then body, no framing."""
    fixed = _FIXED_ENCODERS.get(type(packet))
    if fixed is not None:
        try:
            return fixed(packet)
        except struct.error:
            pass                    # the general encoder below words it
    try:
        header, encoder = _ENCODERS[type(packet)]
    except KeyError:
        raise TypeError(f"{type(packet).__name__} is not a registered packet") from None
    writer = Writer().raw(header)
    encoder(writer, packet)
    return writer.getvalue()


def decode(data, repeats=None, limits=None):
    """Decode one client-protocol packet (no framing header).

    A name repeated in a notification's attributes is a RepeatedNameError;
    with ``repeats`` a list, its last value is taken instead and the name
    added to ``repeats`` (see ``notification_repeating``). ``limits``: the
    most items an array may hold, by ``Class.field`` (see the module
    docstring): one over it is an ``UnreadArray``."""
    if data[:4] == _SUB_ADD_RQST_ID:
        packet = _decode_sub_add_rqst(data, limits)
        if packet is not None:
            return packet
    return CLIENT.decode(data, repeats, limits)


def notification_repeating(data, error, decoder=None, limits=None):
    """``(packet, problem)`` for ``data``, whose decoding raised ``error``
    (a DecodeError), when that is only a repeated attribute name: the
    packet decoded with each repeated name's last value, and why it is
    wrong. Section 7.3.3 makes that a protocol error in the notification,
    to be ignored, not a violation (7.3.2): the packet was unmarshalled.
    Raises ``error`` again, or the DecodeError of whatever else is wrong
    with the packet, when it cannot be used. ``decoder(data, repeats)``:
    the registry's (default: the client protocol's ``decode``, with
    ``limits``)."""
    if not isinstance(error, RepeatedNameError):
        raise error
    repeats = []
    if decoder is None:
        packet = decode(data, repeats, limits)
    else:
        packet = decoder(data, repeats)
    names = ", ".join(repr(name) for name in dict.fromkeys(repeats))
    return packet, f"attribute name{'s' if len(set(repeats)) > 1 else ''} {names} repeated"


def _decode_sub_add_rqst(data, limits=None):
    """A SubAddRqst read field by field (every placement takes this path),
    or None for anything the general decoder should read and word (or
    leave unread)."""
    reader = Reader(data, 4, limits=limits)
    try:
        (xid,) = _ID32.unpack_from(data, 4)
        reader.pos = 8
        expression = reader.string("SubAddRqst.expression")
        accept_insecure = reader.boolean("SubAddRqst.accept_insecure")
        keys = _read_keys(reader, "SubAddRqst.keys")
    except CountOverLimit as e:
        keys = UnreadArray.of(e)
        reader.pos = reader.end
    except (DecodeError, struct.error):
        return None
    if reader.pos != reader.end:
        return None
    return _build_sub_add_rqst((xid, expression, accept_insecure, keys))


#: A NotifyEmit's deliver_insecure (true, false) followed by an empty key list.
_INSECURE_NO_KEYS = b"\x00\x00\x00\x01\x00\x00\x00\x00"
_SECURE_NO_KEYS = bytes(8)


def decode_notify_emit(data):
    """A NotifyEmit's fields as ``(attributes, deliver_insecure, keys)``,
    without building the packet. ``data`` must start with NotifyEmit's
    pkt_id. Anything wrong is decoded again by ``decode``, so the
    DecodeError and its message are exactly decode's."""
    return notify_emit_fields(data)[:3]


def notify_emit_fields(data, limits=None):
    """``decode_notify_emit``'s fields and ``attributes_end``, because every
    notification a router routes takes this path: when the compiled
    decoder read the NameValue array (it takes only zero padding),
    ``data[4:attributes_end]`` is the array's canonical encoding, which a
    delivery may carry as it is; otherwise ``attributes_end`` is 0.
    ``limits``: as ``decode``'s; an array over its limit is an
    ``UnreadArray`` (and the fields after it empty)."""
    if limits is not None:
        limit = limits.get(_NOTIFY_EMIT_ATTRIBUTES)
        # (A packet shorter cannot hold a count over the limit.)
        if limit is not None and len(data) >= _shortest_over_attributes(limit):
            unread = _unread(data, 12, _NOTIFY_EMIT_ATTRIBUTES, limits)
            if unread is not None:
                return unread, False, Keys.EMPTY, 0
    got = None
    if _compiled_name_values is not None:
        got = _compiled_name_values(data, 4, len(data), _Int64)
    try:
        if got is not None:
            attributes, pos = got
        else:
            reader = Reader(data, 4)
            attributes = reader.name_values("attribute")
            pos = reader.pos
        end = pos if got is not None else 0
        if len(data) - pos == 8:
            # The usual tail, a boolean and no keys, compared whole.
            tail = data[pos:pos + 8]
            if tail == _INSECURE_NO_KEYS:
                return attributes, True, Keys.EMPTY, end
            if tail == _SECURE_NO_KEYS:
                return attributes, False, Keys.EMPTY, end
        reader = Reader(data, pos, limits=limits)
        deliver_insecure = reader.boolean("NotifyEmit.deliver_insecure")
        keys = _read_keys(reader, "NotifyEmit.keys")
    except CountOverLimit as e:
        return attributes, deliver_insecure, UnreadArray.of(e), end
    except (DecodeError, struct.error):
        reader = None
    if reader is None or reader.pos != reader.end:
        packet = decode(data, None, limits)      # raises the canonical error
        return packet.attributes, packet.deliver_insecure, packet.keys, 0
    return attributes, deliver_insecure, keys, end


_NOTIFY_EMIT_ATTRIBUTES = "NotifyEmit.attributes"
_NOTIFY_EMIT_KEYS = "NotifyEmit.keys"


def notify_emit_limits_from(limits):
    """The length of the shortest NotifyEmit that could hold an array over
    ``limits`` (None: no limits): a shorter one can be decoded without
    them (the router's hot path). Over Attribute.Max-Count A it takes
    A + 1 attributes of 12 bytes after the pkt_id and count; over K keys,
    K + 1 of 4 bytes after the pkt_id, an empty attribute array, the
    boolean and a Keys header of 16 bytes."""
    if not limits:
        return sys.maxsize
    shortest = sys.maxsize
    attributes, keys = limits.get(_NOTIFY_EMIT_ATTRIBUTES), limits.get(_NOTIFY_EMIT_KEYS)
    if attributes is not None:
        shortest = _shortest_over_attributes(attributes)
    if keys is not None:
        shortest = min(shortest, 28 + 4 * (keys + 1))
    return shortest


def _shortest_over_attributes(limit):
    """The shortest NotifyEmit holding more than ``limit`` attributes: the
    pkt_id and count, then ``limit + 1`` of at least 12 bytes."""
    return 8 + 12 * (limit + 1)


def _unread(data, min_item_size, what, limits):
    """An UnreadArray for the array whose count is at offset 4 of ``data``
    when the count is over ``limits[what]``; None when it is not, or is
    wrong in itself (the decoders word that)."""
    try:
        Reader(data, 4, limits=limits).count(min_item_size, what)
    except CountOverLimit as e:
        return UnreadArray.of(e)
    except DecodeError:
        pass
    return None


def encode_attributes(attributes):
    """The NameValue array body of a notification, to encode it once and
    splice it into many NotifyDeliver packets."""
    return Writer().name_values(attributes).getvalue()


_ND_HEADER = struct.pack(">I", 57)


def encode_notify_deliver_from(attributes_bytes, secure_ids, insecure_ids):
    """``encode(NotifyDeliver(attrs, secure_ids, insecure_ids))`` given
    ``attributes_bytes = encode_attributes(attrs)``."""
    ns, ni = len(secure_ids), len(insecure_ids)
    try:
        return b"".join((_ND_HEADER, attributes_bytes,
                         struct.pack(f">I{ns}Q", ns, *secure_ids),
                         struct.pack(f">I{ni}Q", ni, *insecure_ids)))
    except struct.error as e:
        raise EncodeError(f"bad subscription id in NotifyDeliver: {e}") from None


# -- the client protocol, section 7.4 ---------------------------------------
# Defaults are given only for trailing keys, options and argument lists.

_EMPTY = Keys.EMPTY


@define(32)
class UNotify:
    client_major_version: UINT8
    client_minor_version: UINT8
    attributes: NAME_VALUES
    deliver_insecure: BOOLEAN
    keys: KEYS = _EMPTY


@define(48)
class Nack:
    xid: ID32
    error: UINT16
    message: STRING
    args: VALUES = ()


@define(49)
class ConnRqst:
    xid: ID32
    client_major_version: UINT8
    client_minor_version: UINT8
    options: OPTIONS = field(default_factory=dict)
    nfn_keys: KEYS = _EMPTY
    sub_keys: KEYS = _EMPTY


@define(50)
class ConnRply:
    xid: ID32
    options: OPTIONS = field(default_factory=dict)


@define(51)
class DisconnRqst:
    xid: ID32


@define(52)
class DisconnRply:
    xid: ID32


@define(53)
class Disconn:
    reason: ID32
    args: STRING = ""


@define(54)
class SecRqst:
    xid: ID32
    add_nfn_keys: KEYS = _EMPTY
    del_nfn_keys: KEYS = _EMPTY
    add_sub_keys: KEYS = _EMPTY
    del_sub_keys: KEYS = _EMPTY


@define(55)
class SecRply:
    xid: ID32


@define(56)
class NotifyEmit:
    attributes: NAME_VALUES
    deliver_insecure: BOOLEAN
    keys: KEYS = _EMPTY


@define(57)
class NotifyDeliver:
    attributes: NAME_VALUES
    secure_matches: ID64S = ()
    insecure_matches: ID64S = ()


@define(58)
class SubAddRqst:
    xid: ID32
    expression: STRING
    accept_insecure: BOOLEAN
    keys: KEYS = _EMPTY


@define(59)
class SubModRqst:
    xid: ID32
    subscription_id: ID64
    expression: STRING
    accept_insecure: BOOLEAN
    add_keys: KEYS = _EMPTY
    del_keys: KEYS = _EMPTY


@define(60)
class SubDelRqst:
    xid: ID32
    subscription_id: ID64


@define(61)
class SubRply:
    xid: ID32
    subscription_id: ID64


@define(62)
class DropWarn:
    pass


@define(63)
class TestConn:
    pass


@define(64)
class ConfConn:
    pass


@define(70)
class QosRqst:
    xid: ID32
    options: OPTIONS = field(default_factory=dict)


@define(71)
class QosRply:
    xid: ID32
    options: OPTIONS = field(default_factory=dict)


@define(80)
class QnchAddRqst:
    xid: ID32
    names: STRINGS
    deliver_insecure: BOOLEAN
    keys: KEYS = _EMPTY


@define(81)
class QnchModRqst:
    xid: ID32
    quench_id: ID64
    names_add: STRINGS
    names_del: STRINGS
    deliver_insecure: BOOLEAN
    add_keys: KEYS = _EMPTY
    del_keys: KEYS = _EMPTY


@define(82)
class QnchDelRqst:
    xid: ID32
    quench_id: ID64


@define(83)
class QnchRply:
    xid: ID32
    quench_id: ID64


@define(84)
class SubAddNotify:
    secure_quench_ids: ID64S
    insecure_quench_ids: ID64S
    term_id: ID64
    sub_expr: SUBAST


@define(85)
class SubModNotify:
    secure_quench_ids: ID64S
    insecure_quench_ids: ID64S
    term_id: ID64
    sub_expr: SUBAST


@define(86)
class SubDelNotify:
    quench_ids: ID64S
    term_id: ID64


_SUB_ADD_RQST_ID = struct.pack(">I", SubAddRqst.ID)
_ID32 = struct.Struct(">I")
_build_sub_add_rqst = _builder(SubAddRqst, ["xid", "expression", "accept_insecure", "keys"])
