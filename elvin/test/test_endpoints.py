"""elvin.endpoints: the URI's protocol stack picks the transport, on both
sides; unknown stacks are refused; one router listens on several stacks."""

import socket

from twisted.application.internet import StreamServerEndpointService, UDPServer
from twisted.internet import defer, endpoints as tx_endpoints, reactor
from twisted.internet import endpoints as twisted_endpoints
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.trial import unittest

from elvin import client, endpoints, tap
from elvin.protocols import tls
from elvin.config import ConfigError, RouterConfig
from elvin.protocols.httpclient import HTTPTunnelEndpoint
from elvin.protocols.httptunnel import ElvinHTTPSite
from elvin.protocols.udp import UNotifyDatagramProtocol
from elvin.core.router import DISCONN_SHUTDOWN, Router
from elvin.protocols.server import ElvinServerFactory
from elvin.uri import ElvinURI

from elvin.test.transport_fixtures import Certificates, PubSubScenarios, RouterFixture, wait_until
from elvin.test.places import free_port

UNKNOWN = ["elvin:/xyz,none,xdr/h:1", "elvin:/tcp,none,json/h:1",
           "elvin:/tcp,x-rot13,xdr/h:1", "elvin:/udp,ssl,xdr/h:1",
           "elvin:/http,ssl,xdr/h:1", "elvin:/tls,none,xdr/h:1"]


class StackTests(unittest.TestCase):

    def test_supported_stacks(self):
        self.assertEqual(endpoints.SUPPORTED_STACKS, {
            ("tcp", "none", "xdr"), ("ssl", "none", "xdr"), ("tcp", "ssl", "xdr"),
            ("udp", "none", "xdr"), ("http", "none", "xdr")})

    def test_kinds(self):
        kinds = {
            "elvin://h": "tcp",
            "elvin:/tcp,none,xdr/h": "tcp",
            "elvin:/secure/h": "tls",
            "elvin:/ssl,none,xdr/h": "tls",
            "elvin:/tcp,ssl,xdr/h": "tls",
            "elvin:/udp,none,xdr/h": "udp",
            "elvin:/http,none,xdr/h": "http",
            "elvin:/HTTP,None,XDR/h": "http",
        }
        for uri, kind in kinds.items():
            self.assertEqual(endpoints.stack_kind(uri), kind, uri)
            self.assertEqual(endpoints.stack_kind(ElvinURI(uri)), kind, uri)

    def test_unknown_stacks_refused(self):
        for uri in UNKNOWN:
            with self.assertRaises(endpoints.UnsupportedStackError) as cm:
                endpoints.check_supported(uri)
            message = str(cm.exception)
            self.assertIn(",".join(ElvinURI(uri).protocol), message)
            self.assertIn("not supported", message)
            self.assertIn("tcp,none,xdr", message)  # says what is supported
            self.assertRaises(endpoints.UnsupportedStackError,
                              endpoints.server_endpoint, reactor, uri)
            self.assertRaises(endpoints.UnsupportedStackError,
                              endpoints.client_endpoint, reactor, uri)
            self.assertIsInstance(cm.exception, ValueError)

    def test_client_refuses_unknown_stack(self):
        for uri in UNKNOWN:
            self.failureResultOf(client.connect(uri), endpoints.UnsupportedStackError)
            self.failureResultOf(client.unotify(uri, {"a": 1}),
                                 endpoints.UnsupportedStackError)

    def test_proxy_options_only_for_http(self):
        """A proxy named on a TCP or TLS URI would be bypassed: refused."""
        import asyncio
        from elvin import aio
        for uri in ("elvin://127.0.0.1:2917;proxy-host=proxy.test",
                    "elvin:/secure/127.0.0.1:29170;proxy-host=proxy.test;proxy-port=3128"):
            with self.assertRaises(endpoints.UnsupportedStackError) as cm:
                endpoints.check_supported(uri)
            self.assertIn("apply to the http,none,xdr stack only", str(cm.exception))
            self.failureResultOf(client.connect(uri), endpoints.UnsupportedStackError)
            async def opened(uri=uri):
                return await aio.connect(uri, timeout=2)
            with self.assertRaises(client.ConnectFailed) as cm:
                asyncio.run(opened())
            self.assertIn("connects directly, without a proxy", str(cm.exception))
        endpoints.check_supported("elvin:/http,none,xdr/127.0.0.1:80;proxy-host=proxy.test")

    def test_unknown_uri_options_are_refused_by_name(self):
        """The URI scheme leaves options to each protocol module; one no
        module of the stack defines is refused, naming it, by clients,
        tools, listeners and config files alike, not silently ignored."""
        import asyncio
        from elvin import aio
        from elvin.config import parse
        from elvin.discovery.cache import RouterRecord
        from twisted.python import usage
        uri = "elvin://127.0.0.1:2917;frobnicate=1"
        with self.assertRaises(endpoints.UnsupportedStackError) as cm:
            endpoints.check_supported(uri)
        self.assertIn("unknown URI option 'frobnicate' (tcp,none,xdr takes no options)",
                      str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            endpoints.check_supported("elvin:/http,none,xdr/h:80;mode=poll;mod=poll;x")
        self.assertIn("options 'mod' and 'x' (http,none,xdr takes only mode, proxy-host, "
                      "proxy-port)", str(cm.exception))
        endpoints.check_supported("elvin:/http,none,xdr/h:80;mode=poll;proxy-host=p")
        self.failureResultOf(client.connect(uri), endpoints.UnsupportedStackError)
        async def opened():
            return await aio.connect(uri, timeout=2)
        with self.assertRaises(client.ConnectFailed) as cm:
            asyncio.run(opened())
        self.assertIn("'frobnicate'", str(cm.exception))
        with self.assertRaises(usage.UsageError) as cm:
            tap.Options().parseOptions(["-l", uri])
        self.assertIn("'frobnicate'", str(cm.exception))
        with self.assertRaises(ConfigError) as cm:
            parse("# listeners\nlisten = " + uri, "r.conf")
        self.assertTrue(str(cm.exception).startswith("r.conf:2: "), str(cm.exception))
        self.assertIn("'frobnicate'", str(cm.exception))
        with self.assertRaises(ConfigError) as cm:
            parse("Federation.Connect[a] = ewaf://hub;x=1", "f.conf")
        self.assertTrue(str(cm.exception).startswith("f.conf:1: "), str(cm.exception))
        record = RouterRecord("r", "s", False, 1, (uri, "elvin://192.0.2.1:2917"))
        self.assertEqual([str(u) for u in record.usable_uris()],
                         ["elvin:4.0/tcp,none,xdr/192.0.2.1:2917"])

    def test_tap_refuses_unknown_stack(self):
        from twisted.python import usage
        for uri in UNKNOWN:
            with self.assertRaises(usage.UsageError) as cm:
                tap.Options().parseOptions(["-l", uri])
            self.assertIn("not supported", str(cm.exception))


class ServerEndpointTests(unittest.TestCase):

    def test_tcp(self):
        ep = endpoints.server_endpoint(reactor, "elvin://localhost:2917")
        self.assertIsInstance(ep, tx_endpoints.TCP4ServerEndpoint)
        ep = endpoints.server_endpoint(reactor, "elvin:/tcp,none,xdr/[::1]:2917")
        self.assertIsInstance(ep, tx_endpoints.TCP6ServerEndpoint)

    def test_http_listens_on_tcp(self):
        ep = endpoints.server_endpoint(reactor, "elvin:/http,none,xdr/localhost:8080")
        self.assertIsInstance(ep, tx_endpoints.TCP4ServerEndpoint)

    def test_tls_needs_certificate(self):
        for uri in ("elvin:/secure/localhost", "elvin:/tcp,ssl,xdr/localhost:1"):
            with self.assertRaises(ConfigError) as cm:
                endpoints.server_endpoint(reactor, uri)
            self.assertIn("tls-certificate", str(cm.exception))

    def test_tls(self):
        certs = Certificates(self.mktemp())
        options = tls.server_options(certs.server_cert, certs.server_key)
        ep = endpoints.server_endpoint(reactor, "elvin:/secure/localhost", tls=options)
        # Twisted's own TLS wrapper (wrapServerTLS) around the TCP endpoint;
        # that it speaks TLS is tested over loopback in test_tls.
        self.assertTrue(IStreamServerEndpoint.providedBy(ep))
        self.assertNotIsInstance(ep, (twisted_endpoints.TCP4ServerEndpoint,
                                      twisted_endpoints.TCP6ServerEndpoint))

    def test_secure_default_port(self):
        """The URI draft gives secure stacks no port of their own: 2917."""
        self.assertEqual(ElvinURI("elvin:/secure/localhost").port, 2917)

    def test_udp_has_no_stream_endpoint(self):
        self.assertRaises(endpoints.UnsupportedStackError, endpoints.server_endpoint,
                          reactor, "elvin:/udp,none,xdr/localhost:2917")


class ClientEndpointTests(unittest.TestCase):

    def test_tcp(self):
        ep = endpoints.client_endpoint(reactor, "elvin://localhost:2917")
        self.assertIsInstance(ep, tx_endpoints.HostnameEndpoint)

    def test_tls_wraps_tcp(self):
        ep = endpoints.client_endpoint(reactor, "elvin:/secure/localhost:2917")
        self.assertNotIsInstance(ep, tx_endpoints.HostnameEndpoint)
        self.assertIsInstance(ep._wrappedEndpoint, tx_endpoints.HostnameEndpoint)

    def test_http(self):
        ep = endpoints.client_endpoint(reactor, "elvin:/http,none,xdr/localhost:8080")
        self.assertIsInstance(ep, HTTPTunnelEndpoint)

    def test_udp(self):
        self.assertRaises(endpoints.UnsupportedStackError, endpoints.client_endpoint,
                          reactor, "elvin:/udp,none,xdr/localhost:2917")


class _Hosts:
    """A name resolver that knows one name (``router_1``) only."""

    def resolveHostName(self, receiver, hostName, portNumber=0, addressTypes=None,
                        transportSemantics="TCP"):
        from twisted.internet.address import IPv4Address
        receiver.resolutionBegan(None)
        if hostName == "router_1":
            receiver.addressResolved(IPv4Address("TCP", "127.0.0.1", portNumber))
        receiver.resolutionComplete()


class HostNameTests(unittest.TestCase):
    """Every name a resolver knows is dialled, ``router_1`` included (Twisted's
    HostnameEndpoint refuses names IDNA 2008 forbids before resolving)."""

    def reactor(self):
        from twisted.internet.interfaces import IReactorPluggableNameResolver
        from twisted.internet.testing import MemoryReactorClock
        from zope.interface import alsoProvides
        memory = MemoryReactorClock()
        memory.nameResolver = _Hosts()
        alsoProvides(memory, IReactorPluggableNameResolver)
        return memory

    def dialled(self, endpoint, memory):
        from twisted.internet.protocol import Factory, Protocol
        endpoint.connect(Factory.forProtocol(Protocol))
        memory.advance(0)
        return [(host, port) for host, port, *_ in memory.tcpClients]

    def test_underscore_names_are_resolved_and_dialled(self):
        for uri in ("elvin://router_1:2917", "elvin:/secure/router_1:2916"):
            memory = self.reactor()
            ep = endpoints.client_endpoint(memory, uri, tls_hostname="router.test")
            self.assertEqual(self.dialled(ep, memory), [("127.0.0.1", int(uri[-4:]))], uri)

    def test_http_tunnel_dials_underscore_names(self):
        memory = self.reactor()
        tunnel = endpoints.client_endpoint(memory, "elvin:/http,none,xdr/router_1:8080")
        factory = tunnel._agent(None)._endpointFactory
        ep = factory.endpointForURI(__import__("twisted.web.client", fromlist=["URI"])
                                    .URI.fromBytes(b"http://router_1:8080/elvin"))
        self.assertEqual(self.dialled(ep, memory), [("127.0.0.1", 8080)])

    def test_unknown_names_still_fail_as_unresolved(self):
        from twisted.internet.error import DNSLookupError
        memory = self.reactor()
        ep = endpoints.hostname_endpoint(memory, "nowhere_1", 2917)
        from twisted.internet.protocol import Factory, Protocol
        d = ep.connect(Factory.forProtocol(Protocol))
        self.failureResultOf(d, DNSLookupError)

    def test_tls_to_a_name_no_certificate_can_hold_says_what_to_do(self):
        with self.assertRaises(ValueError) as caught:
            endpoints.client_endpoint(reactor, "elvin:/secure/router_1:2916")
        self.assertIn("tls_hostname", str(caught.exception))


class ListenerServiceTests(unittest.TestCase):

    def setUp(self):
        self.router = Router()
        self.factory = ElvinServerFactory(self.router, reactor)
        self.config = RouterConfig()

    def service(self, uri, **kwargs):
        return endpoints.listener_service(reactor, ElvinURI(uri), self.router,
                                          self.factory, self.config, **kwargs)

    def test_each_stack_builds_its_service(self):
        tcp = self.service("elvin://localhost:3000")
        self.assertIsInstance(tcp, StreamServerEndpointService)
        self.assertIs(tcp.factory, self.factory)

        udp = self.service("elvin:/udp,none,xdr/localhost:3001")
        self.assertIsInstance(udp, UDPServer)
        self.assertEqual(udp.args[0], 3001)
        self.assertIsInstance(udp.args[1], UNotifyDatagramProtocol)
        self.assertIs(udp.args[1].router, self.router)
        self.assertEqual(udp.kwargs["interface"], "127.0.0.1")

        self.config.http_session_timeout = 7
        self.config.http_poll_timeout = 3
        web = self.service("elvin:/http,none,xdr/localhost:3002")
        self.assertIsInstance(web.factory, ElvinHTTPSite)
        self.assertIs(web.factory.elvin_factory, self.factory)
        self.assertEqual((web.factory.session_timeout, web.factory.poll_timeout), (7, 3))

        self.assertRaises(ConfigError, self.service, "elvin:/secure/localhost:3003")
        certs = Certificates(self.mktemp())
        self.config.tls_certificate = certs.server_cert
        self.config.tls_key = certs.server_key
        secure = self.service("elvin:/secure/localhost:3003")
        self.assertNotIsInstance(secure.endpoint, (twisted_endpoints.TCP4ServerEndpoint,
                                                   twisted_endpoints.TCP6ServerEndpoint))


class TCPScenarioTests(RouterFixture, PubSubScenarios):
    """The shared publish/subscribe scenarios over plain TCP."""

    def setUp(self):
        super().setUp()
        self.uri = self.listen_tcp()


class MultiStackRouterTests(unittest.TestCase):
    """``twistd elvin -l URI -l URI ...`` with every stack at once, for real."""

    timeout = 30

    @defer.inlineCallbacks
    def test_one_router_every_stack(self):
        certs = Certificates(self.mktemp())
        conf = certs._write("elvind.conf", b"tls-certificate = server.pem\n"
                                           b"tls-key = server.key\n")
        uris = {
            "tcp": f"elvin://127.0.0.1:{free_port()}",
            "secure": f"elvin:/secure/127.0.0.1:{free_port()}",
            "tcpssl": f"elvin:/tcp,ssl,xdr/127.0.0.1:{free_port()}",
            "http": f"elvin:/http,none,xdr/127.0.0.1:{free_port()}",
            "udp": f"elvin:/udp,none,xdr/127.0.0.1:{free_port(socket.SOCK_DGRAM)}",
        }
        options = tap.Options()
        args = ["-c", conf]
        for uri in uris.values():
            args += ["-l", uri]
        options.parseOptions(args)
        top = tap.makeService(options, reactor=reactor)
        top.startService()
        stopped = False
        conns = []
        try:
            tls_args = {"tls_ca": certs.ca_path}
            for name in ("tcp", "secure", "tcpssl", "http"):
                conn = yield client.connect(uris[name],
                                            **(tls_args if name in ("secure", "tcpssl") else {}))
                conns.append(conn)
            got = {id(c): [] for c in conns}
            for conn in conns:
                yield conn.subscribe("require(n)", got[id(conn)].append)
            # Every connection, and a UDP producer, publishes once; every
            # subscriber hears all five.
            for i, conn in enumerate(conns):
                conn.notify({"n": i})
            yield client.unotify(uris["udp"], {"n": 99})
            yield wait_until(lambda: all(len(g) == 5 for g in got.values()))
            for g in got.values():
                self.assertEqual(sorted(x["n"] for x in g), [0, 1, 2, 3, 99])
            reasons = []
            for conn in conns:
                conn.on_disconnect = lambda reason, args: reasons.append(reason)
            stopped = True
            yield top.stopService()
            for conn in conns:
                yield conn.disconnected
            self.assertEqual(reasons, [DISCONN_SHUTDOWN] * 4)
        finally:
            for conn in conns:
                if not conn.disconnected.called:
                    conn.protocol.transport.abortConnection()
                    yield conn.disconnected
            if not stopped:
                yield top.stopService()
            for child in top:
                site = getattr(getattr(child, "factory", None), "close_all", None)
                if site is not None:
                    site()
