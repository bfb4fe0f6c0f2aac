"""Integration tests: a real router and real clients over TCP on 127.0.0.1."""

from twisted.internet import defer

from elvin import client, errors
from elvin.test import transport_fixtures
from elvin.test.polling import wait_until



class RouterFixture(transport_fixtures.RouterFixture):
    """A router listening on TCP (``self.uri``), and clients of it."""

    def setUp(self):
        super().setUp()
        self.uri = self.listen_tcp()
        self.port = self.ports[-1]

    @defer.inlineCallbacks
    def sync(self, conn):
        """Round trip: everything conn sent before has been processed."""
        yield conn.test_connection()


class PublishSubscribeTests(RouterFixture, transport_fixtures.PubSubScenarios):
    """The shared scenarios over TCP, and what only TCP tests here."""

    @defer.inlineCallbacks
    def test_regex_error_is_nacked(self):
        conn = yield self.connect()
        with self.assertRaises(client.NackError) as cm:
            yield conn.subscribe("regex(x, '(')", lambda n: None)
        self.assertEqual(cm.exception.code, errors.INVALID_REGEXP)

    @defer.inlineCallbacks
    def test_legacy_option_names(self):
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
