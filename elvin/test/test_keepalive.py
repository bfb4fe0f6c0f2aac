"""TCP keepalive on accepted client connections (``client-keepalive``):
the kernel probes an idle client's host, so one that vanished is found
out without anything asked of the client."""

import socket

from twisted.internet import defer, protocol, reactor, tcp
from twisted.trial import unittest

from elvin import config, tap
from elvin.core.router import Router
from elvin.protocols.keepalive import PROBES, keepalive_socket, set_keepalive
from elvin.protocols.server import ElvinServerFactory


class _Chain:
    """A transport wrapping another, as TLSMemoryBIOProtocol does."""

    _tlsConnection = object()

    def __init__(self, inner):
        self.transport = inner


class _Plain(tcp.Connection):
    """A TCP transport over ``sock`` (only what keepalive reads)."""

    def __init__(self, sock):
        self.socket = sock

    def getHandle(self):
        return self.socket


class KeepaliveSocketTests(unittest.SynchronousTestCase):

    def setUp(self):
        self.sock = socket.socket()
        self.addCleanup(self.sock.close)

    def test_set_on_the_socket(self):
        self.assertTrue(set_keepalive(_Plain(self.sock), 120))
        self.assertEqual(self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            options = [self.sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))
                       for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT")]
            self.assertEqual(options, [120, 30, PROBES])

    def test_found_under_a_tls_layer(self):
        self.assertIs(keepalive_socket(_Chain(_Plain(self.sock))), self.sock)
        self.assertTrue(set_keepalive(_Chain(_Plain(self.sock)), 8))
        self.assertEqual(self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), 1)

    def test_off_and_socketless_transports(self):
        self.assertFalse(set_keepalive(_Plain(self.sock), 0))
        self.assertEqual(self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), 0)
        self.assertFalse(set_keepalive(object(), 60))
        self.assertIsNone(keepalive_socket(_Chain(_Chain(object()))))


class AcceptedConnectionTests(unittest.TestCase):
    """The router's listener turns it on for each client it accepts."""

    @defer.inlineCallbacks
    def accepted(self, keepalive, tls=False):
        factory = ElvinServerFactory(Router(), reactor, client_keepalive=keepalive)
        made = []
        build = factory.buildProtocol

        def keep(addr):
            proto = build(addr)
            made.append(proto)
            return proto
        factory.buildProtocol = keep
        listening = factory
        if tls:
            from twisted.protocols.tls import TLSMemoryBIOFactory
            from elvin.protocols.tls import server_options
            from elvin.test.transport_fixtures import Certificates
            certificates = Certificates(self.mktemp())
            listening = TLSMemoryBIOFactory(server_options(certificates.server_cert,
                                                           certificates.server_key),
                                            False, factory)
        port = reactor.listenTCP(0, listening, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        client = yield protocol.ClientCreator(reactor, protocol.Protocol).connectTCP(
            "127.0.0.1", port.getHost().port)
        for _ in range(200):                    # bounded: the accept is a turn away
            if made:
                break
            yield _turn()
        self.addCleanup(client.transport.loseConnection)
        self.addCleanup(lambda: made[0].transport.loseConnection())
        return keepalive_socket(made[0].transport)

    @defer.inlineCallbacks
    def test_on_by_setting(self):
        sock = yield self.accepted(45)
        self.assertEqual(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            self.assertEqual(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE), 45)

    @defer.inlineCallbacks
    def test_on_under_tls(self):
        sock = yield self.accepted(45, tls=True)
        self.assertEqual(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), 1)

    @defer.inlineCallbacks
    def test_off(self):
        sock = yield self.accepted(0)
        self.assertEqual(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), 0)


def _turn():
    d = defer.Deferred()
    reactor.callLater(0.005, d.callback, None)
    return d


class SettingTests(unittest.SynchronousTestCase):

    def test_router_setting_reaches_the_factory(self):
        from twisted.internet.testing import MemoryReactor
        cfg = config.parse("client-keepalive = 300\n")
        self.assertEqual(cfg.client_keepalive, 300)
        self.assertEqual(config.parse("").client_keepalive, 120)
        for bad in ("-1", "nan", "32768", "1e9"):
            with self.assertRaises(config.ConfigError):
                config.parse(f"client-keepalive = {bad}\n")
        self.assertEqual(config.parse("client-keepalive = 32767\n").client_keepalive, 32767)
        options = tap.Options()
        options.router_config = cfg
        top = tap.makeService(options, reactor=MemoryReactor())
        self.assertEqual(top.factory.client_keepalive, 300)

    def test_proxy_setting(self):
        from elvin.proxy.config import parse
        self.assertEqual(parse("client-keepalive = 30\n").client_keepalive, 30)
