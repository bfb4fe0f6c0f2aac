"""Parsing and formatting of ``elvin:`` URIs.

Elvin routers advertise their endpoints, and clients name the router they
want, with URIs defined by the "Elvin URI Scheme" Internet-Draft
(Arnold, Boot, Phelps)::

    elvin_opaque_part = [ version ] "/" protocol "/" endpoint options
    version           = 1*digit [ "." 1*digit ]
    protocol          = protocol_name *( "," protocol_name )
    options           = *( ";" option_name [ "=" option_value ] )
    tcp_endpoint      = host [ ":" port ]        ; host as in RFC 2732

for example ``elvin:4.0/tcp,none,xdr/router.example.com:2917;opt=v``.

The router needs one strict, well-specified parser so that a URI given on
the command line, in a config file or in a discovery advert always means
the same thing, and so that a bad URI is reported once, clearly, as an
:class:`InvalidURIError` (a :class:`ValueError`) naming the offending text,
instead of failing later with a socket error.

Decisions taken where the draft is silent (see :class:`ElvinURI`):

* the version may be ``major`` alone (the grammar allows it); the minor
  number then defaults to 0.  Each part must fit the protocol's version
  fields (XDR int32, 0-2147483647); within that any version is accepted:
  compatibility is negotiated by the protocol, not by the parser.
* the protocol stack is exactly three modules,
  ``transport,security,marshalling`` (the Elvin 4 client protocol layering),
  or one of the two aliases: ``""`` (``tcp,none,xdr``) and ``secure``
  (``ssl,none,xdr``, as the draft says).  Module names and aliases are
  case-insensitive and are normalised to lower case.
* the endpoint is parsed as ``host[:port]`` for every transport; the port
  must be 1-65535 and, if the ``:`` is present, non-empty.
* option names and values are percent-decoded as UTF-8; an option without
  ``=`` (``;flag``) has the value ``None``, and ``;flag=`` the value ``""``;
  a repeated option name is an error.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Mapping
from urllib.parse import quote, unquote_to_bytes

from elvin.errors import echoed

__all__ = [
    "proxy_options_problem", "options_problem", "stack_problem", "version_problem",
    "STACK_KINDS",
    "DEFAULT_PORT",
    "DEFAULT_PROTOCOL",
    "DEFAULT_VERSION",
    "SECURE_PROTOCOL",
    "PROTOCOL_ALIASES",
    "ElvinURI",
    "EwafURI",
    "InvalidURIError",
    "parse_ewaf",
    "default_port",
]

#: The IANA-style well-known port for Elvin routers (used when a URI omits it).
DEFAULT_PORT = 2917

#: Protocol version of the URI syntax implemented here (used when omitted),
#: which is also the client protocol version this library speaks.
DEFAULT_VERSION = (4, 0)

#: The stack meant by the empty protocol alias, e.g. ``elvin://host``.
DEFAULT_PROTOCOL = ("tcp", "none", "xdr")

#: The stack meant by the ``secure`` alias, as defined by the draft.
SECURE_PROTOCOL = ("ssl", "none", "xdr")

#: Textual substitutions clients MUST perform on the protocol component.
PROTOCOL_ALIASES: Mapping[str, tuple[str, str, str]] = {
    "": DEFAULT_PROTOCOL,
    "secure": SECURE_PROTOCOL,
}

#: Transport modules, and security modules, that encrypt the connection.
#: Each protocol stack (transport, security, marshalling) this build
#: speaks, and the kind of transport that carries it (elvin.endpoints).
STACK_KINDS = {
    ("tcp", "none", "xdr"): "tcp",
    ("ssl", "none", "xdr"): "tls",   # also spelt "secure"
    ("tcp", "ssl", "xdr"): "tls",
    ("udp", "none", "xdr"): "udp",
    ("http", "none", "xdr"): "http",
}

_SECURE_TRANSPORTS = frozenset({"ssl", "tls"})
_SECURE_SECURITY = frozenset({"ssl", "tls"})

_SCHEME = "elvin"

# All patterns are ASCII-only on purpose: "\d" would accept e.g. Arabic-Indic
# digits, which are not URI characters.
_VERSION_RE = re.compile(r"([0-9]+)(?:\.([0-9]+))?\Z")
# official_name = alpha *( alphanum ); experimental_name = "x-" official_name
_PROTOCOL_NAME_RE = re.compile(r"(?:x-)?[A-Za-z][A-Za-z0-9]*\Z", re.IGNORECASE)
#: The longest host name a resolver can look up (RFC 1035: 255 bytes on
#: the wire, 253 characters written).
MAX_HOST_NAME = 253

# RFC 2396 hostname with the RFC 1123 relaxation (labels may start with a
# digit), which also covers RFC 2396 IPv4address; optional trailing dot.
# Labels may also hold '_' anywhere: container runtimes and internal DNS
# zones hand out such names, resolvers look them up, and the Avis router and
# client accept them.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?\Z")
_PORT_RE = re.compile(r"[0-9]+\Z")
# RFC 2396: unreserved = alphanum | mark; escaped = "%" hex hex
_UNRESERVED = r"A-Za-z0-9\-_.!~*'()"
_ESCAPED_TEXT_RE = re.compile(rf"(?:[{_UNRESERVED}]|%[0-9A-Fa-f]{{2}})*\Z")
_OPTION_NAME_START_RE = re.compile(r"[A-Za-z]")
# Characters left unescaped when formatting options: RFC 2396 unreserved.
_OPTION_SAFE = "-_.!~*'()"

_MAX_PORT = 65535
# Version numbers travel as XDR int32 (ConnRqst, router discovery).
_MAX_VERSION_PART = 2**31 - 1


class InvalidURIError(ValueError):
    """An Elvin URI could not be parsed.

    A ``ValueError`` subclass so callers that validate generic user input can
    catch it as such.  ``uri`` is the offending text and ``reason`` says what
    was wrong with it; both appear in the message.
    """

    def __init__(self, uri: object, reason: str) -> None:
        self.uri = uri
        self.reason = reason
        shown = echoed(uri) if isinstance(uri, (str, bytes)) else repr(uri)
        super().__init__(f"invalid Elvin URI {shown}: {reason}")


def default_port() -> int:
    """Return :data:`DEFAULT_PORT`, the port used when a URI names none."""
    return DEFAULT_PORT


class ElvinURI:
    """A parsed ``elvin:`` URI identifying an Elvin router endpoint.

    ``ElvinURI(text)`` parses *text* or raises :class:`InvalidURIError`.
    Instances are immutable and hashable (so they can key the router's
    endpoint tables); equality compares the parsed fields, so equivalent
    spellings such as ``elvin://host`` and ``elvin:4.0/tcp,none,xdr/host:2917``
    are equal.  ``str()`` gives the canonical form, which always re-parses to
    an equal object.

    Attributes (read-only):

    ``version``      ``(major, minor)``, default ``(4, 0)``
    ``protocol``     ``(transport, security, marshalling)``, aliases expanded
    ``host``         host name or address, IPv6 without brackets
    ``port``         ``int``, default :data:`DEFAULT_PORT`
    ``options``      ``dict`` of percent-decoded options, in URI order
                     (a fresh copy on every access); ``None`` for an
                     option given without ``=``
    """

    __slots__ = ("_version", "_protocol", "_host", "_port", "_options")

    _version: tuple[int, int]
    _protocol: tuple[str, str, str]
    _host: str
    _port: int
    _options: tuple[tuple[str, str | None], ...]

    #: The scheme this class parses and prints, and its defaults.
    SCHEME = _SCHEME
    DEFAULT_VERSION = DEFAULT_VERSION
    DEFAULT_PORT = DEFAULT_PORT

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise InvalidURIError(
                text, f"expected a str, not {type(text).__name__}")
        try:
            fields = _parse(text, self.SCHEME, self.DEFAULT_VERSION, self.DEFAULT_PORT)
        except InvalidURIError:
            raise
        except Exception as e:  # pragma: no cover - defensive
            # The contract is that bad input only ever raises InvalidURIError.
            raise InvalidURIError(text, f"unparseable ({e})") from e
        for name, value in zip(ElvinURI.__slots__, fields):
            object.__setattr__(self, name, value)

    # -- immutability --------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self):
        """Pickle/copy via the canonical text (``__setattr__`` is blocked)."""
        return (type(self), (str(self),))

    # -- fields --------------------------------------------------------------

    @property
    def version(self) -> tuple[int, int]:
        """Protocol version as ``(major, minor)``."""
        return self._version

    @property
    def protocol(self) -> tuple[str, str, str]:
        """Protocol stack ``(transport, security, marshalling)``."""
        return self._protocol

    @property
    def transport(self) -> str:
        """Transport module name, e.g. ``"tcp"`` or ``"ssl"``."""
        return self._protocol[0]

    @property
    def security(self) -> str:
        """Security module name, e.g. ``"none"`` or ``"ssl"``."""
        return self._protocol[1]

    @property
    def marshalling(self) -> str:
        """Marshalling module name, e.g. ``"xdr"``."""
        return self._protocol[2]

    @property
    def host(self) -> str:
        """Host name or IP address (IPv6 literals without brackets)."""
        return self._host

    @property
    def port(self) -> int:
        """TCP port number, 1-65535."""
        return self._port

    @property
    def options(self) -> dict[str, str | None]:
        """URI options as a new ``{name: value}`` dict, in URI order; the
        value of a bare ``;flag`` is ``None``."""
        return dict(self._options)

    @property
    def is_secure(self) -> bool:
        """True if the stack encrypts the connection (TLS/SSL transport or
        security layer), e.g. ``secure``, ``ssl,none,xdr`` or ``tcp,ssl,xdr``.
        """
        return (self.transport in _SECURE_TRANSPORTS
                or self.security in _SECURE_SECURITY)

    # -- comparison and text -------------------------------------------------

    def _key(self) -> tuple:
        # Options compare as a set: their order carries no meaning.
        return (self.SCHEME, self._version, self._protocol, self._host, self._port,
                frozenset(self._options))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ElvinURI):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        major, minor = self._version
        host = f"[{self._host}]" if ":" in self._host else self._host
        text = (f"{self.SCHEME}:{major}.{minor}/{','.join(self._protocol)}/"
                f"{host}:{self._port}")
        return text + "".join(f";{_quote(name)}" if value is None
                              else f";{_quote(name)}={_quote(value)}"
                              for name, value in self._options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class EwafURI(ElvinURI):
    """A parsed ``ewaf:`` URI: where a router offers or dials federation.

    The same grammar as ``elvin:`` (federation 1.0, section on URIs), with
    its own defaults: version 1.0 and port 2916. It prints as ``ewaf:``, so
    logs and traces name a federation link as what it is, and never equals
    an ``elvin:`` URI of the same fields.
    """

    __slots__ = ()

    SCHEME = "ewaf"
    #: Also the federation protocol version this library speaks.
    DEFAULT_VERSION = (1, 0)
    DEFAULT_PORT = 2916


def parse_ewaf(text: str) -> EwafURI:
    """An ``ewaf:`` URI, or InvalidURIError naming what was wrong."""
    if not isinstance(text, str) or not text.lower().startswith("ewaf:"):
        raise InvalidURIError(text, "a federation URI must start with 'ewaf:'")
    return EwafURI(text)


# -- parsing -----------------------------------------------------------------


def _parse(text: str, expected_scheme: str, default_version: tuple[int, int],
           default_port: int) -> tuple:
    """Split *text* into ElvinURI fields, or raise InvalidURIError."""

    def fail(reason: str) -> InvalidURIError:
        return InvalidURIError(text, reason)

    scheme, colon, rest = text.partition(":")
    if not colon:
        raise fail(f"missing '{expected_scheme}:' scheme")
    if not scheme.isascii() or scheme.lower() != expected_scheme:
        raise fail(f"wrong scheme {echoed(scheme)}, expected '{expected_scheme}'")

    # [ version ] "/" protocol "/" endpoint options
    version_text, slash, rest = rest.partition("/")
    if not slash:
        raise fail("missing '/' before the protocol stack "
                   f"(expected {expected_scheme}:[version]/[protocol]/host)")
    version = _parse_version(version_text, fail) if version_text else default_version

    protocol_text, slash, rest = rest.partition("/")
    if not slash:
        raise fail("missing '/' between the protocol stack and the endpoint "
                   f"(expected {expected_scheme}:[version]/[protocol]/host)")
    protocol = _parse_protocol(protocol_text, fail)

    endpoint, semi, options_text = rest.partition(";")
    host, port = _parse_endpoint(endpoint, fail)
    if port is None:
        port = default_port
    options = _parse_options(options_text, fail) if semi else ()
    return version, protocol, host, port, options


def _parse_version(text: str, fail) -> tuple[int, int]:
    if not text:
        return DEFAULT_VERSION
    match = _VERSION_RE.match(text)
    if match is None:
        raise fail(f"bad version {echoed(text)}, expected major[.minor] digits")
    major, minor = match.groups()
    parts = []
    for which, digits in (("major", major), ("minor", minor or "0")):
        number = _bounded(digits, 0, _MAX_VERSION_PART)
        if number is None:
            raise fail(f"bad version {echoed(text)}: the {which} number "
                       f"{echoed(digits, quote=False)} does not fit a protocol version "
                       f"(0-{_MAX_VERSION_PART})")
        parts.append(number)
    return parts[0], parts[1]


def _bounded(digits: str, low: int, high: int) -> int | None:
    """The number that ASCII ``digits`` spell if it is within low..high,
    else None. The length is checked before ``int()``, so a huge digit
    string is refused by its length, not by ``int()``'s own limits."""
    significant = digits.lstrip("0")
    if len(significant) > len(str(high)):
        return None
    number = int(significant or "0")
    return number if low <= number <= high else None


def _parse_protocol(text: str, fail) -> tuple[str, str, str]:
    lowered = text.lower()
    if "," not in text:
        try:
            return PROTOCOL_ALIASES[lowered]
        except KeyError:
            raise fail(
                f"unknown protocol stack alias {echoed(text)} (expected 'secure', "
                "empty, or transport,security,marshalling)") from None
    names = lowered.split(",")
    for name in names:
        if not name:
            raise fail(f"malformed protocol stack {echoed(text)}: "
                       "empty module name")
        if _PROTOCOL_NAME_RE.match(name) is None:
            raise fail(f"malformed protocol stack {echoed(text)}: bad module name "
                       f"{echoed(name)}")
    if len(names) != 3:
        raise fail(f"malformed protocol stack {echoed(text)}: expected exactly 3 "
                   f"modules (transport,security,marshalling), got "
                   f"{len(names)}")
    return names[0], names[1], names[2]


def _parse_endpoint(text: str, fail) -> tuple[str, int | None]:
    if not text:
        raise fail("missing host")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise fail("unterminated IPv6 literal (missing ']')")
        host = text[1:close]
        after = text[close + 1:]
        if not host:
            raise fail("missing host (empty IPv6 literal '[]')")
        if not _is_ipv6(host):
            raise fail(f"invalid IPv6 literal {echoed(host)}")
        if not after:
            return host, None
        if not after.startswith(":"):
            raise fail(f"unexpected {echoed(after)} after IPv6 literal "
                       "(expected ':port')")
        return host, _parse_port(after[1:], fail)

    if "/" in text:
        raise fail(f"unexpected '/' in endpoint {echoed(text)} (Elvin URIs have "
                   "no path)")
    if text.count(":") > 1:
        raise fail(f"IPv6 literal {echoed(text)} must be enclosed in brackets: "
                   "'[...]'")
    host, colon, port_text = text.partition(":")
    if not host:
        raise fail("missing host")
    if "]" in text or "[" in text:
        raise fail(f"invalid host {echoed(host)} (stray '[' or ']')")
    if _HOSTNAME_RE.match(host) is None:
        raise fail(f"invalid host {echoed(host)}")
    if len(host) > MAX_HOST_NAME:
        raise fail(f"invalid host {echoed(host)}: a host name is at most "
                   f"{MAX_HOST_NAME} characters (RFC 1035)")
    return host, _parse_port(port_text, fail) if colon else None


def _is_ipv6(text: str) -> bool:
    # RFC 2732 has no zone identifiers; ipaddress would accept "fe80::1%eth0".
    if "%" in text or not text.isascii():
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _parse_port(text: str, fail) -> int:
    if not text:
        raise fail("bad port: empty after ':'")
    if _PORT_RE.match(text) is None:
        raise fail(f"bad port {echoed(text)}: not a number")
    port = _bounded(text, 1, _MAX_PORT)
    if port is None:
        raise fail(f"bad port {echoed(text)}: must be 1-{_MAX_PORT}")
    return port


def _parse_options(text: str, fail) -> tuple[tuple[str, str | None], ...]:
    """Parse what follows the endpoint's first ';' into (name, value)
    pairs; a bare ``;flag`` has the value None."""
    options: dict[str, str | None] = {}
    for item in text.split(";"):
        raw_name, equals, raw_value = item.partition("=")
        if not raw_name:
            raise fail(f"malformed option {echoed(item)}: missing name")
        if _OPTION_NAME_START_RE.match(raw_name) is None:
            raise fail(f"malformed option {echoed(item)}: name must start with a "
                       "letter")
        name = _unquote(raw_name, item, fail)
        value = _unquote(raw_value, item, fail) if equals else None
        if name in options:
            raise fail(f"duplicate option {echoed(name)}")
        options[name] = value
    return tuple(options.items())


def _unquote(raw: str, item: str, fail) -> str:
    """Decode RFC 2396 ``*( unreserved | escaped )`` text as UTF-8."""
    if _ESCAPED_TEXT_RE.match(raw) is None:
        raise fail(f"malformed option {echoed(item)}: characters other than "
                   "letters, digits, -_.!~*'() and %XX escapes")
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise fail(f"malformed option {echoed(item)}: escapes are not "
                   "valid UTF-8") from None


def _quote(text: str) -> str:
    """Inverse of :func:`_unquote`: escape all but RFC 2396 unreserved."""
    return quote(text, safe=_OPTION_SAFE, encoding="utf-8", errors="strict")


def _named(uri: "ElvinURI") -> str:
    """``uri`` as a problem's message names it (cut when very long)."""
    return echoed(str(uri), quote=False)


#: The URI options that send an http,none,xdr stack's requests through an
#: HTTP proxy.
_PROXY_OPTIONS = ("proxy-host", "proxy-port")


#: The URI options each transport module takes: the HTTP tunnel's client
#: polling mode and HTTP proxy. The scheme leaves an option's meaning to a
#: protocol module's specification, so any other option is one nothing
#: here would read.
_TRANSPORT_OPTIONS = {"http": ("mode",) + _PROXY_OPTIONS}


def options_problem(uri: "ElvinURI") -> str | None:
    """Why ``uri``'s options cannot be honoured, or None: a proxy named
    for a stack that does not use one (``proxy_options_problem``), or an
    option no module of its stack defines, which would otherwise be
    silently ignored (a misspelt ``;mod=poll`` would quietly stream)."""
    problem = proxy_options_problem(uri)
    if problem is not None:
        return problem
    known = _TRANSPORT_OPTIONS.get(uri.protocol[0], ())
    unknown = [name for name in uri.options if name not in known]
    if not unknown:
        return None
    takes = f"takes only {', '.join(known)}" if known else "takes no options"
    return (f"{_named(uri)}: unknown URI option{'s' if len(unknown) > 1 else ''} "
            f"{' and '.join(echoed(name) for name in unknown)} "
            f"({','.join(uri.protocol)} {takes})")


def proxy_options_problem(uri: "ElvinURI") -> str | None:
    """Why ``uri``'s proxy options cannot be honoured, or None: only the
    HTTP tunnel goes through an HTTP proxy; the TCP and TLS stacks
    connect directly (they do not speak HTTP CONNECT), so a proxy named
    for them would be silently bypassed."""
    named = [name for name in _PROXY_OPTIONS if name in uri.options]
    if not named or uri.protocol[0] == "http":
        return None
    return (f"{_named(uri)}: {' and '.join(named)} apply to the http,none,xdr stack only "
            f"(its requests go through the HTTP proxy); {','.join(uri.protocol)} connects "
            "directly, without a proxy: remove the option, or use an "
            "elvin:/http,none,xdr/... URI through the proxy")


def stack_problem(uri: "ElvinURI") -> str | None:
    """Why no client or listener can use ``uri``'s protocol stack (one
    this build does not speak: a security or marshalling layer is not to
    be skipped silently), or None."""
    if uri.protocol in STACK_KINDS:
        return None
    supported = ", ".join(",".join(stack) for stack in sorted(STACK_KINDS))
    return (f"{_named(uri)}: protocol stack {','.join(uri.protocol)} is not supported "
            f"(supported: {supported}; 'secure' means ssl,none,xdr)")


def version_problem(uri: "ElvinURI", listening: bool = False) -> str | None:
    """Why ``uri``'s protocol version cannot be used, or None.

    A URI's version names the protocol the router at its endpoint
    implements (the URI scheme, "Version"). A client, or a router dialling
    a federation peer, can speak to one of its own major version: a later
    minor version is a compatible revision, and the version is negotiated
    on connecting. Another major version is a protocol this library does
    not speak, refused rather than ignored. A listener's URI (``listening``)
    is what the router advertises, so it must name the version the router
    speaks, exactly (``DEFAULT_VERSION``: 4.0 for ``elvin:``, 1.0 for
    ``ewaf:``)."""
    major, minor = uri.version
    ours = type(uri).DEFAULT_VERSION
    spoken = f"{ours[0]}.{ours[1]}"
    protocol = "federation" if isinstance(uri, EwafURI) else "client"
    fix = (f"write {uri.SCHEME}:{spoken}/... or leave the version out "
           f"({uri.SCHEME}://host:port)")
    if major != ours[0]:
        return (f"{_named(uri)}: protocol version {major}.{minor} is not supported "
                f"(this implementation speaks the Elvin {protocol} protocol {spoken}, "
                f"and other major versions are incompatible): {fix}")
    if listening and (major, minor) != ours:
        return (f"{_named(uri)}: a listener's URI names the protocol version spoken "
                f"there, and is advertised so: {spoken}, not {major}.{minor}: {fix}")
    return None
