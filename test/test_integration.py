"""Integration tests: a real router and real clients over TCP on 127.0.0.1."""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from elvin import client, errors
from elvin.protocols.server import ElvinServerFactory
from elvin.router import Router
from elvin.values import Int64
from test.polling import wait_until



class RouterFixture(unittest.TestCase):
    timeout = 30

    def setUp(self):
        self.router = Router()
        self.factory = ElvinServerFactory(self.router, reactor)
        self.port = reactor.listenTCP(0, self.factory, interface="127.0.0.1")
        self.uri = f"elvin://127.0.0.1:{self.port.getHost().port}"
        self.connections = []

    @defer.inlineCallbacks
    def tearDown(self):
        for conn in self.connections:
            if conn.protocol is not None and conn.protocol.transport is not None:
                conn.protocol.transport.abortConnection()
            if not conn.disconnected.called:
                yield conn.disconnected
        yield self.port.stopListening()

    @defer.inlineCallbacks
    def connect(self, options=None):
        conn = yield client.connect(self.uri, options=options)
        self.connections.append(conn)
        return conn

    @defer.inlineCallbacks
    def sync(self, conn):
        """Round trip: everything conn sent before has been processed."""
        yield conn.test_connection()


class PublishSubscribeTests(RouterFixture):
    @defer.inlineCallbacks
    def test_publish_subscribe(self):
        consumer = yield self.connect()
        producer = yield self.connect()
        got = []
        yield consumer.subscribe('Group == "chat" && size(Message) < 140', got.append)
        producer.notify({"Group": "chat", "Message": "hi", "Num": 42,
                         "Big": Int64(12), "R": 3.25, "Blob": b"\xde\xad"})
        producer.notify({"Group": "other", "Message": "no"})
        yield wait_until(lambda: got)
        yield self.sync(producer)
        yield self.sync(consumer)
        self.assertEqual(len(got), 1)
        note = got[0]
        self.assertEqual(note["Message"], "hi")
        self.assertIs(type(note["Big"]), Int64)
        self.assertEqual(note["Blob"], b"\xde\xad")
        self.assertEqual(note["R"], 3.25)

    @defer.inlineCallbacks
    def test_multiple_subscriptions_modify_delete(self):
        conn = yield self.connect()
        a, b = [], []
        sub_a = yield conn.subscribe("n < 10", a.append)
        sub_b = yield conn.subscribe("n >= 5", b.append)
        for n in range(12):
            conn.notify({"n": n})
        yield wait_until(lambda: len(a) == 10 and len(b) == 7)
        self.assertEqual([x["n"] for x in a], list(range(10)))
        # One delivery carries both ids when both match.
        both = [x for x in a if x["n"] in (5, 6, 7, 8, 9)]
        self.assertTrue(all(set(x.insecure) == {sub_a.id, sub_b.id} for x in both))
        yield sub_a.modify("n == 100")
        yield sub_b.remove()
        del a[:], b[:]
        conn.notify({"n": 100})
        conn.notify({"n": 7})
        yield wait_until(lambda: a)
        yield self.sync(conn)
        self.assertEqual([x["n"] for x in a], [100])
        self.assertEqual(b, [])

    @defer.inlineCallbacks
    def test_bad_subscription_is_nacked_and_connection_survives(self):
        conn = yield self.connect()
        with self.assertRaises(client.NackError) as cm:
            yield conn.subscribe("x ==", lambda n: None)
        self.assertEqual(cm.exception.code, errors.PARSE_ERROR)
        with self.assertRaises(client.NackError) as cm:
            yield conn.subscribe("regex(x, '(')", lambda n: None)
        self.assertEqual(cm.exception.code, errors.INVALID_REGEXP)
        got = []
        yield conn.subscribe("require(x)", got.append)
        conn.notify({"x": 1})
        yield wait_until(lambda: got)

    @defer.inlineCallbacks
    def test_options_negotiation(self):
        conn = yield self.connect({"Subscription.Max-Count": 16,
                                   "router.packet.max-length": 500000,
                                   "Made.Up": 1})
        self.assertEqual(conn.options["Subscription.Max-Count"], 16)
        self.assertEqual(conn.options["router.packet.max-length"], 500000)
        self.assertNotIn("Made.Up", conn.options)
        self.assertIn("Vendor-Identification", conn.options)
        reply = yield conn.set_options({"Subscription.Max-Count": 32})
        self.assertEqual(reply["Subscription.Max-Count"], 32)

    @defer.inlineCallbacks
    def test_limits_enforced_with_nacks(self):
        conn = yield self.connect({"Subscription.Max-Count": 16,
                                   "Subscription.Max-Length": 1024})
        for i in range(16):
            yield conn.subscribe(f"x == {i}", lambda n: None)
        with self.assertRaises(client.NackError) as cm:
            yield conn.subscribe("x == 99", lambda n: None)
        self.assertEqual(cm.exception.code, errors.QOS_LIMIT)
        self.assertEqual(cm.exception.nack_args, ("Subscription.Max-Count",))

    @defer.inlineCallbacks
    def test_unotify(self):
        conn = yield self.connect()
        got = []
        yield conn.subscribe("require(u)", got.append)
        yield client.unotify(self.uri, {"u": "hello"})
        yield wait_until(lambda: got)
        self.assertEqual(got[0]["u"], "hello")

    @defer.inlineCallbacks
    def test_close_gets_disconnect_reply(self):
        conn = yield self.connect()
        yield conn.subscribe("require(x)", lambda n: None)
        yield conn.close()
        yield wait_until(lambda: not self.router.sessions)
        self.assertEqual(len(self.router.index), 0)

    @defer.inlineCallbacks
    def test_shutdown_sends_disconn(self):
        conn = yield self.connect()
        reasons = []
        conn.on_disconnect = lambda reason, args: reasons.append(reason)
        self.router.shutdown()
        yield conn.disconnected
        self.assertEqual(reasons, [1])

    @defer.inlineCallbacks
    def test_slow_consumer_gets_dropwarn_while_others_keep_receiving(self):
        slow = yield self.connect({"Send-Queue.Max-Length": 8192})
        fast = yield self.connect()
        producer = yield self.connect()
        slow_got, fast_got = [], []
        yield slow.subscribe("require(n)", slow_got.append)
        yield fast.subscribe("require(n)", fast_got.append)
        slow.protocol.transport.pauseProducing()  # stop reading from the socket
        total = 3000
        pad = "x" * 1000  # about 1 KiB a delivery: a few fit in the queue
        for n in range(total):
            producer.notify({"n": n, "pad": pad})
        yield wait_until(lambda: len(fast_got) == total, timeout=20)
        session = next(s for s in self.router.sessions
                       if s.subscriptions and slow.subscriptions.keys() & s.subscriptions.keys())
        self.assertGreater(session.dropped, 0)
        slow.protocol.transport.resumeProducing()
        yield wait_until(lambda: slow.dropwarns > 0 and slow_got
                         and slow_got[-1]["n"] == total - 1, timeout=20)
        self.assertLess(len(slow_got), total)
