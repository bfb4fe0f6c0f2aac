"""The client and federation links over in-memory transports (iosim): the
same protocol code as on loopback, with no sockets and a fake clock, so a
whole exchange runs synchronously and deterministically, whatever the
machine's load."""

from twisted.internet.task import Clock
from twisted.test.iosim import connect, makeFakeClient, makeFakeServer
from twisted.trial import unittest

from elvin.client import Connection, _ClientFactory
from elvin.federation.manager import FederationClass, FederationManager
from elvin.federation.protocol import AcceptorFactory, ConnectorFactory
from elvin.protocols.server import ElvinServerFactory
from elvin.core.router import Router
from elvin.uri import ElvinURI


def _pair(server_factory, client_factory):
    """Connected server and client protocols and the pump between them."""
    server = server_factory.buildProtocol(None)
    client = client_factory.buildProtocol(None)
    server_io, client_io = makeFakeServer(server), makeFakeClient(client)
    pump = connect(server, server_io, client, client_io)
    return server, client, pump


class ClientInMemoryTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.router = Router()
        self.uri = ElvinURI("elvin://router.test:2917")

    def connection(self):
        conn = Connection(self.uri, self.clock)
        server, client, pump = _pair(ElvinServerFactory(self.router, self.clock),
                                     _ClientFactory(conn))
        pump.flush()
        handshake = conn._handshake({"Subscription.Max-Count": 32}, None, None)
        pump.flush()
        self.successResultOf(handshake)
        return conn, pump

    def test_session_subscribe_notify_close(self):
        conn, pump = self.connection()
        self.assertEqual(conn.options["Subscription.Max-Count"], 32)
        got = []
        sub = conn.subscribe("require(a) && b > 1", got.append)
        pump.flush()
        self.successResultOf(sub)
        conn.notify({"a": "x", "b": 2})
        conn.notify({"a": "x", "b": 0})
        pump.flush()
        self.assertEqual([dict(n) for n in got], [{"a": "x", "b": 2}])
        closed = conn.close()
        pump.flush()
        self.successResultOf(closed)
        self.assertEqual(self.router.sessions, set())

    def test_nack_reaches_the_caller(self):
        conn, pump = self.connection()
        d = conn.subscribe("size(1) > 2", lambda n: None)
        pump.flush()
        error = self.failureResultOf(d).value
        self.assertEqual((error.code, error.nack_args), (2106, (5, "1", "int32")))


class FederationInMemoryTests(unittest.TestCase):

    def manager(self, domain):
        router = Router()
        fed_class = FederationClass("Peer", hosts=["*"])
        manager = FederationManager(router, domain, [fed_class], None, self.clock,
                                    debounce=0.01)
        return router, manager, fed_class

    def setUp(self):
        self.clock = Clock()

    def test_link_filters_and_forwarding(self):
        left_router, left, left_class = self.manager("left.test")
        right_router, right, _ = self.manager("right.test")
        acceptor, connector, pump = _pair(AcceptorFactory(right, keepalive=0),
                                          ConnectorFactory(left, left_class, keepalive=0))
        pump.flush()
        self.assertEqual([l.peer_domain for l in left.links], ["right.test"])
        self.assertEqual([l.peer_domain for l in right.links], ["left.test"])

        # A subscriber on the right: its filter reaches the left.
        from elvin.test.test_router import RecordingOutput
        from elvin.protocols import packets
        out = RecordingOutput()
        consumer = right_router.open_session(out, "consumer")
        consumer.packet_received(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY))
        consumer.packet_received(packets.SubAddRqst(2, "require(greeting)", True, packets.Keys.EMPTY))
        out.take()
        self.clock.advance(0.02)   # the debounce
        pump.flush()
        self.assertTrue(left.links[0].remote_filter.matches({"greeting": "hi"}))

        # Published on the left, delivered on the right, exactly once.
        producer = left_router.open_session(RecordingOutput(), "producer")
        producer.packet_received(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY))
        producer.packet_received(packets.NotifyEmit({"greeting": "hi"}, True, packets.Keys.EMPTY))
        producer.packet_received(packets.NotifyEmit({"other": 1}, True, packets.Keys.EMPTY))
        pump.flush()
        deliveries = out.take()
        self.assertEqual([d.attributes for d in deliveries], [{"greeting": "hi"}])
        self.assertEqual(left.links[0].stats["out"], 1)
