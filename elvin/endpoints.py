"""Map ``elvin:`` URIs to Twisted endpoints: the URI is the single source
of truth for where a router listens and where a client connects.
"""

import ipaddress

from twisted.internet import endpoints

from elvin.uri import ElvinURI

__all__ = ["check_supported", "server_endpoint", "client_endpoint", "UnsupportedStackError",
           "SUPPORTED_STACKS", "listen_host"]

#: Protocol stacks (transport, security, marshalling) this build speaks.
SUPPORTED_STACKS = {("tcp", "none", "xdr")}


class UnsupportedStackError(ValueError):
    """The URI names a protocol stack this router or client cannot speak."""


def check_supported(uri):
    """Return ``uri`` as an ElvinURI, or raise UnsupportedStackError."""
    if not isinstance(uri, ElvinURI):
        uri = ElvinURI(uri)
    if uri.protocol not in SUPPORTED_STACKS:
        supported = ", ".join(",".join(s) for s in sorted(SUPPORTED_STACKS))
        raise UnsupportedStackError(
            f"{uri}: protocol stack {','.join(uri.protocol)} is not supported "
            f"(supported: {supported})")
    return uri


def _is_ipv6(host):
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def listen_host(host):
    """The address to bind for a URI host ('localhost' binds loopback)."""
    if host == "localhost":
        return "127.0.0.1"
    if host in ("*", "0.0.0.0", ""):
        return ""
    return host


def server_endpoint(reactor, uri, backlog=128):
    """A stream server endpoint listening where ``uri`` says."""
    uri = check_supported(uri)
    host = listen_host(uri.host)
    if _is_ipv6(host):
        return endpoints.TCP6ServerEndpoint(reactor, uri.port, backlog, host)
    return endpoints.TCP4ServerEndpoint(reactor, uri.port, backlog, host)


def client_endpoint(reactor, uri, timeout=30):
    """A stream client endpoint connecting where ``uri`` says."""
    uri = check_supported(uri)
    return endpoints.HostnameEndpoint(reactor, uri.host, uri.port, timeout=timeout)
