"""Map ``elvin:`` URIs to Twisted endpoints and listeners: the URI is the
single source of truth for where a router listens and where a client
connects, and its protocol stack alone picks the transport.

=====================  =========  ==========================================
stack                  kind       router side / client side
=====================  =========  ==========================================
``tcp,none,xdr``       ``tcp``    framed packets on TCP / ``HostnameEndpoint``
``ssl,none,xdr``       ``tls``    the same inside TLS (Twisted's ``wrapServerTLS`` /
(alias ``secure``),               ``wrapClientTLS``), see ``elvin.protocols.tls``
``tcp,ssl,xdr``
``udp,none,xdr``       ``udp``    UNotify datagrams (``elvin.protocols.udp``)
``http,none,xdr``      ``http``   sessions tunnelled through HTTP
                                  (``elvin.protocols.httptunnel`` /
                                  ``elvin.protocols.httpclient``)
=====================  =========  ==========================================

Anything else is refused with :class:`UnsupportedStackError`. See
docs/protocols.md for each transport.
"""

import ipaddress

from twisted.application.internet import StreamServerEndpointService, UDPServer
from twisted.internet import defer, endpoints

from elvin.protocols.hostnames import hostname_endpoint
from elvin.uri import STACK_KINDS, ElvinURI, options_problem, stack_problem, version_problem

__all__ = ["check_supported", "stack_kind", "server_endpoint", "client_endpoint",
           "hostname_endpoint",
           "listener_service", "StreamListenerService", "DatagramListenerService", "bind_new", "close_unused",
           "UnsupportedStackError", "SUPPORTED_STACKS",
           "STACK_KINDS", "TCP", "TLS", "UDP", "HTTP", "listen_host"]

TCP, TLS, UDP, HTTP = "tcp", "tls", "udp", "http"

#: Protocol stacks this build speaks (elvin.uri.STACK_KINDS).
SUPPORTED_STACKS = frozenset(STACK_KINDS)


class UnsupportedStackError(ValueError):
    """The URI names a protocol version or stack this router or client
    cannot speak, or options its stack does not take."""


def check_supported(uri, listening=False):
    """Return ``uri`` as an ElvinURI, or raise UnsupportedStackError;
    ``listening``: ``uri`` is a listener's (``version_problem``)."""
    if not isinstance(uri, ElvinURI):
        uri = ElvinURI(uri)
    problem = version_problem(uri, listening) or stack_problem(uri)
    if problem is not None:
        raise UnsupportedStackError(problem)
    problem = options_problem(uri) if isinstance(uri, ElvinURI) else None
    if problem is not None:
        raise UnsupportedStackError(problem)
    return uri


def stack_kind(uri):
    """``"tcp"``, ``"tls"``, ``"udp"`` or ``"http"`` for a supported URI."""
    return STACK_KINDS[check_supported(uri).protocol]


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


def _tcp_server(reactor, uri, backlog):
    host = listen_host(uri.host)
    if _is_ipv6(host):
        return endpoints.TCP6ServerEndpoint(reactor, uri.port, backlog, host)
    return endpoints.TCP4ServerEndpoint(reactor, uri.port, backlog, host)


def server_endpoint(reactor, uri, backlog=128, tls=None, gate=None):
    """A stream server endpoint listening where ``uri`` says.

    For TLS stacks ``tls`` is the server's TLS options (see
    ``elvin.protocols.tls.server_options``); without it a TLS URI is refused, naming
    the missing setting. HTTP stacks get the plain TCP endpoint the web
    server listens on. UDP is not a stream transport: use
    :func:`listener_service`. ``gate`` (a function of the TCP endpoint,
    e.g. ``Admission.endpoint`` of ``elvin.protocols.gate``) wraps the TCP
    endpoint beneath TLS, so connections are admitted before any TLS.
    """
    uri = check_supported(uri, listening=True)
    kind = STACK_KINDS[uri.protocol]
    if kind == UDP:
        raise UnsupportedStackError(
            f"{uri}: udp,none,xdr is a datagram transport and has no stream "
            "endpoint (use elvin.endpoints.listener_service)")
    endpoint = _tcp_server(reactor, uri, backlog)
    if gate is not None:
        endpoint = gate(endpoint)
    if kind == TLS:
        if tls is None:
            from elvin.protocols.tls import TLSConfigError
            raise TLSConfigError(
                f"{uri}: a TLS listener needs the router's certificate: set "
                "tls-certificate (and tls-key, unless the key is in the same "
                "file) in the configuration file")
        endpoint = endpoints.wrapServerTLS(tls, endpoint)
    return endpoint


def client_endpoint(reactor, uri, timeout=30, tls=None, tls_ca=None,
                    tls_certificate=None, tls_key=None, tls_hostname=None):
    """A stream client endpoint connecting where ``uri`` says.

    TLS stacks verify the router's certificate: pass ready-made client TLS
    options as ``tls`` (e.g. ``ssl.optionsForClientTLS(...)``), or let them
    be made from ``tls_ca``, ``tls_certificate``, ``tls_key`` and
    ``tls_hostname`` (default: the URI's host) -- see
    ``elvin.protocols.tls.client_options``. HTTP stacks give an endpoint whose
    protocols run over the HTTP tunnel, so the client code is the same for
    every stream stack. UDP has no stream endpoint.
    """
    uri = check_supported(uri)
    kind = STACK_KINDS[uri.protocol]
    if kind == UDP:
        raise UnsupportedStackError(
            f"{uri}: udp,none,xdr carries only UNotify datagrams; it has no "
            "sessions (use elvin.client.unotify)")
    if kind == HTTP:
        from elvin.protocols.httpclient import HTTPTunnelEndpoint
        return HTTPTunnelEndpoint(reactor, uri, timeout=timeout)
    endpoint = hostname_endpoint(reactor, uri.host, uri.port, timeout=timeout)
    if kind == TLS:
        if tls is None:
            from elvin.protocols.tls import client_options
            tls = client_options(tls_hostname or uri.host, tls_ca, tls_certificate,
                                 tls_key)
        endpoint = endpoints.wrapClientTLS(tls, endpoint)
    return endpoint


class StreamListenerService(StreamServerEndpointService):
    """A stream listener that raises at once when it cannot bind, and binds
    once: a reload binds what it adds before it changes anything (a port
    in use refuses the whole file), then adds the bound listener to the
    running router, which must not bind it again."""

    _raiseSynchronously = True

    def privilegedStartService(self):
        if self._waitingForPort is None:
            super().privilegedStartService()

    def stopService(self):
        if self._waitingForPort is None:       # never bound
            self.running = False
            return defer.succeed(None)
        return super().stopService()


class DatagramListenerService(UDPServer):
    """A UDP listener that binds once (see StreamListenerService)."""

    def privilegedStartService(self):
        if self._port is None:
            super().privilegedStartService()


def close_unused(listeners):
    """Close listeners bound for a reload that will not use them; fires
    once they are closed."""
    return defer.gatherResults([defer.maybeDeferred(listener.stopService)
                                for listener in list(listeners)], consumeErrors=True)


def bind_new(uris, held, make):
    """Bind a listener, made by ``make(uri)``, for each of ``uris`` whose
    text is not in ``held``: what a reload adds, bound before it changes
    anything. Returns them by URI text; one that cannot bind raises
    (CannotListenError, or a ConfigError), those bound before it closed."""
    bound = {}
    try:
        for uri in uris:
            text = str(check_supported(uri, listening=True))
            if text in held or text in bound:
                continue
            listener = make(uri)
            listener.privilegedStartService()
            bound[text] = listener
    except BaseException:
        close_unused(bound.values())
        raise
    return bound


def listener_service(reactor, uri, router, factory, config, tls=None):
    """The service that listens on ``uri`` for ``router``.

    ``factory`` is the ElvinServerFactory shared by the stream listeners;
    ``config`` the RouterConfig (for the HTTP timeouts); ``tls`` the
    server TLS options, made from ``config`` when a TLS listener needs them.
    A stream listener's connections count against ``router.admission``
    (``elvin.protocols.gate``), when the router has one.
    """
    uri = check_supported(uri, listening=True)
    kind = STACK_KINDS[uri.protocol]
    if kind == UDP:
        from elvin.protocols.udp import UNotifyDatagramProtocol
        proto = UNotifyDatagramProtocol(router)
        service = DatagramListenerService(uri.port, proto, interface=listen_host(uri.host),
                            maxPacketSize=proto.read_size, reactor=reactor)
        service.datagram_protocol = proto
        return service
    if kind == TLS and tls is None:
        from elvin.protocols.tls import server_options_from_config
        tls = server_options_from_config(config)
    if kind == HTTP:
        from elvin.protocols.httptunnel import ElvinHTTPSite
        factory = ElvinHTTPSite(factory, session_timeout=config.http_session_timeout,
                                poll_timeout=config.http_poll_timeout)
    admission = getattr(router, "admission", None)
    gate = admission.endpoint if admission is not None else None
    return StreamListenerService(server_endpoint(reactor, uri, tls=tls, gate=gate), factory)
