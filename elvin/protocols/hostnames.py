"""A TCP client endpoint for every host name a resolver can look up.

Twisted's ``HostnameEndpoint`` refuses a name IDNA 2008 forbids, such as
``router_1``, before resolving it; /etc/hosts, Docker and DNS serve such
names, and an ``elvin:`` URI's host is any name the resolver knows
(docs/uri.md). Every client dial (clients, tools, federation links, the
proxy's upstream, the HTTP tunnel) goes through :func:`hostname_endpoint`.
"""

from twisted.internet import endpoints

__all__ = ["hostname_endpoint"]


class _AnyNameEndpoint(endpoints.HostnameEndpoint):
    """Twisted's HostnameEndpoint, taking every printable ASCII host name
    as it is (the resolver judges it); others as Twisted does."""

    @staticmethod
    def _hostAsBytesAndText(host):
        if isinstance(host, bytes):
            try:
                host = host.decode("ascii")
            except UnicodeDecodeError:
                return endpoints.HostnameEndpoint._hostAsBytesAndText(host)
        if host.isascii() and host.isprintable() and " " not in host:
            return False, host.encode("ascii"), host
        return endpoints.HostnameEndpoint._hostAsBytesAndText(host)


def hostname_endpoint(reactor, host, port, timeout=30):
    """A TCP client endpoint for ``host`` (a name or an address) and
    ``port``, resolving the name when it connects: HostnameEndpoint's
    behaviour (every address tried, IPv6 and IPv4), for every name a
    resolver can look up, ``router_1`` included."""
    return _AnyNameEndpoint(reactor, host, port, timeout=timeout)
