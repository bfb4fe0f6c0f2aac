"""The host's interface addresses, and listener URIs made advertisable.

A router listening on ``elvin://0.0.0.0:2917`` accepts clients on every
IPv4 address of the host, but ``0.0.0.0`` means nothing to a client, so an
advertisement carries one URI per real address instead.  ``localhost``
becomes ``127.0.0.1`` (what ``elvin.endpoints.listen_host`` binds).
Loopback addresses are listed after the others: a client on another host
ignores them (see ``is_loopback`` in the client's cache), a client on this
host can use them.
"""

from __future__ import annotations

import ipaddress
import socket

from elvin.uri import ElvinURI

__all__ = ["local_addresses", "advertisable_uris", "with_host", "is_loopback",
           "is_unspecified", "host_label"]

_IPV4_WILDCARDS = {"0.0.0.0", "*", ""}


def local_addresses():
    """Every IP address of this host's interfaces, as strings.

    IPv6 link-local addresses are left out: an Elvin URI cannot carry the
    zone (interface) they need.  Falls back to resolving the host name if
    the interface list cannot be read.
    """
    found = []
    try:
        import ifaddr
        for adapter in ifaddr.get_adapters():
            for ip in adapter.ips:
                address = ip.ip if ip.is_IPv4 else ip.ip[0]
                found.append(address)
    except Exception:  # pragma: no cover - platform dependent
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None)
        except OSError:
            infos = []
        found = [info[4][0] for info in infos] + ["127.0.0.1"]
    result = []
    for text in found:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            continue
        if address.version == 6 and address.is_link_local:
            continue
        if str(address) not in result:
            result.append(str(address))
    return result


def _address(host):
    """``host`` as the address a resolver would make of it, or None for a
    name: besides dotted quads and IPv6, the numeric IPv4 forms
    ``inet_aton`` reads (``127.1``, ``2130706433``, ``0x7f.1``,
    ``0177.0.0.1``), and an IPv4-mapped IPv6 address as its IPv4 one, so
    that no spelling of an address slips past the checks below."""
    text = host.strip("[]")
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        if not text or not text[0].isdigit():
            return None
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(text))
        except (OSError, ValueError):
            return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def is_loopback(host):
    """True for a loopback address, however it is spelt, or the name
    ``localhost``."""
    if host.lower().rstrip(".") == "localhost":
        return True
    address = _address(host)
    return address is not None and address.is_loopback


def is_unspecified(host):
    """True for a wildcard bind address (0.0.0.0 or ::), however spelt."""
    if host in _IPV4_WILDCARDS:
        return True
    address = _address(host)
    return address is not None and address.is_unspecified


def with_host(uri, host):
    """``uri`` (an ElvinURI) with its host replaced by ``host``."""
    text = str(uri)
    scheme_version, protocol, rest = text.split("/", 2)
    _endpoint, semi, options = rest.partition(";")
    bracketed = f"[{host}]" if ":" in host else host
    return ElvinURI(f"{scheme_version}/{protocol}/{bracketed}:{uri.port}"
                    f"{semi}{options}")


def _ordered(addresses, version):
    chosen = [a for a in addresses if ipaddress.ip_address(a).version == version]
    return ([a for a in chosen if not ipaddress.ip_address(a).is_loopback]
            + [a for a in chosen if ipaddress.ip_address(a).is_loopback])


def advertisable_uris(uris, addresses=None):
    """The URIs to advertise for listeners ``uris`` (ElvinURI or text).

    Wildcard hosts expand to every local address of their family (loopback
    last), ``localhost`` becomes ``127.0.0.1``, other hosts are kept.
    Duplicates are dropped, order is otherwise kept.  ``addresses``
    defaults to ``local_addresses()``.
    """
    if addresses is None:
        addresses = local_addresses()
    result = []
    for uri in uris:
        if not isinstance(uri, ElvinURI):
            uri = ElvinURI(uri)
        host = uri.host
        if host in _IPV4_WILDCARDS:
            expanded = [with_host(uri, a) for a in _ordered(addresses, 4)]
        elif is_unspecified(host):
            expanded = [with_host(uri, a) for a in _ordered(addresses, 6)]
        elif host.lower() == "localhost":
            expanded = [with_host(uri, "127.0.0.1")]
        else:
            expanded = [uri]
        for item in expanded:
            if item not in result:
                result.append(item)
    return result


def host_label(name=None):
    """The first label of a host name, lower-cased (``"a"`` for a.b.c)."""
    name = socket.gethostname() if name is None else name
    return name.split(".", 1)[0].lower()
