"""The client flavours acknowledge to a proxy what the program has handled.

``AckTracker`` alone; then the Twisted and asyncio connections joined to
a real proxy core in memory (test_proxy_core's ProxyCoreCase: an
in-memory store, a routing core upstream), packets carried between them
by a ``Bridge`` with no socket and no running reactor or loop. The
blocking flavour's turn, which crosses threads, is in
test_proxy_integration (ProxyFlavoursTest) against a real proxy.
"""

import asyncio

from twisted.internet.testing import MemoryReactorClock
from twisted.trial import unittest

from elvin import aio
from elvin import client as tx
from elvin.clientcore.acks import ACK, ACK_WINDOW, AckTracker
from elvin.clientcore.state import proxy_options
from elvin.protocols import packets as elvin_packets
from elvin.proxy.core import EVENT
from elvin.test.test_proxy_core import ProxyCoreCase
from elvin.test.test_router import RecordingOutput
from elvin.uri import ElvinURI

URI = ElvinURI("elvin://proxy.invalid:2917")


class AckTrackerTest(unittest.TestCase):

    def test_the_count_is_the_run_of_handled_notifications(self):
        acks = AckTracker()
        acks.start(8)
        tokens = [acks.delivered() for _ in range(4)]
        acks.hold(tokens[1])                 # an iterator keeps the second
        for token in tokens:
            acks.release(token)
        self.assertEqual(acks.handled, 1)    # the second holds back 3 and 4
        acks.release(tokens[1])
        self.assertEqual(acks.handled, 4)
        self.assertTrue(acks.due())          # 4 >= 8 // 4
        self.assertEqual(acks.take(), 4)
        self.assertIsNone(acks.take())

    def test_tokens_of_an_earlier_channel_are_ignored(self):
        acks = AckTracker()
        acks.start(8)
        old = acks.delivered()
        acks.start(8)                        # a new ConnRply
        acks.release(old)
        self.assertEqual(acks.handled, 0)
        self.assertEqual(acks.received, 0)

    def test_no_window_no_tokens(self):
        acks = AckTracker()
        acks.start(0)
        self.assertIsNone(acks.delivered())
        self.assertFalse(acks.due())

    def test_only_sessions_ask_for_a_window(self):
        self.assertEqual(proxy_options(), ({}, []))
        options, _ = proxy_options("phone")
        self.assertEqual(options[ACK_WINDOW], 256)
        options, _ = proxy_options("phone", ack_window=0)
        self.assertNotIn(ACK_WINDOW, options)
        with self.assertRaises(ValueError):
            proxy_options(ack_window=8)          # without a session: refused


class BridgeOutput(RecordingOutput):
    def __init__(self, queue):
        super().__init__()
        self.queue = queue

    def send(self, packet):
        self.queue.append(elvin_packets.decode(elvin_packets.encode(packet)))

    def send_encoded(self, data, droppable):
        self.queue.append(elvin_packets.decode(data))


class Bridge:
    """A client connection's channel to a proxy core, in memory."""

    def __init__(self, core, connection):
        self.to_proxy, self.to_client = [], []
        self.connection = connection
        self.peer = core.open_session(BridgeOutput(self.to_client), "device")
        self.sent = []                      # every packet the client sent

    def client_send(self, packet):
        packet = elvin_packets.decode(elvin_packets.encode(packet))
        self.sent.append(packet)
        self.to_proxy.append(packet)

    def pump(self):
        for _ in range(100000):             # bounded: each step moves one packet
            if self.to_proxy:
                self.peer.packet_received(self.to_proxy.pop(0))
            elif self.to_client:
                self.connection.lifecycle.packet(self.to_client.pop(0))
            else:
                return
        raise AssertionError("the bridge never went quiet")

    def acks(self):
        return [p.options[ACK] for p in self.sent
                if isinstance(p, elvin_packets.QosRqst) and ACK in p.options]

    def drop(self):
        """The link drops (nothing more crosses it)."""
        self.to_proxy.clear()
        self.to_client.clear()
        self.peer.connection_lost("link dropped")
        self.connection.lifecycle.channel_lost("link dropped")


def values(packets):
    return [p.attributes["n"] for p in packets
            if isinstance(p, elvin_packets.NotifyDeliver) and EVENT not in p.attributes]


class FlavourCase(ProxyCoreCase):

    def rejoin_gets(self):
        """What a plain acknowledging client of the session gets next."""
        _, out = self.join("phone", Ack_Window=1000)
        return values(out.take())

    def attach(self, conn, **session):
        """``conn`` joins session "phone" over a Bridge."""
        bridge = Bridge(self.core, conn)
        options, names = proxy_options("phone", **session)
        conn.expect_joins(names)
        conn.lifecycle.attached(bridge.client_send, options)
        bridge.pump()
        self.assertFalse(conn.joins_pending)
        return conn, bridge

    def publish_many(self, count, bridge):
        for n in range(count):
            self.publish({"n": n})
            bridge.pump()


class TwistedAckTest(FlavourCase):

    def open(self, **session):
        self.reactor = MemoryReactorClock()
        return self.attach(tx.Connection(URI, self.reactor), **session)

    def subscribe(self, conn, bridge, callback):
        d = conn.subscribe("require(n)", callback)
        bridge.pump()
        return self.successResultOf(d)

    def test_what_the_callbacks_returned_from_is_acknowledged(self):
        conn, bridge = self.open(ack_window=8)
        self.assertEqual(conn.options[ACK_WINDOW], 8)
        got = []
        self.subscribe(conn, bridge, lambda note: got.append(note["n"]))
        self.publish_many(20, bridge)
        self.assertEqual(got, list(range(20)))
        self.assertEqual(bridge.acks()[-1], 20)          # every 2 (a quarter of 8)
        self.assertEqual(self.store.stored_count("phone"), 0)

    def test_a_lone_notification_is_acknowledged_after_the_interval(self):
        conn, bridge = self.open(ack_window=8)
        self.subscribe(conn, bridge, lambda note: None)
        self.publish_many(1, bridge)
        self.assertEqual(bridge.acks(), [])
        self.reactor.advance(0.1)
        bridge.pump()
        self.assertEqual(bridge.acks(), [1])
        self.assertEqual(self.store.stored_count("phone"), 0)

    def test_a_held_notification_is_delivered_again_with_what_followed(self):
        conn, bridge = self.open(ack_window=8)

        def handle(note):
            if note["n"] == 3:
                conn.ack_hold(note)          # the program is not done with it
        self.subscribe(conn, bridge, handle)
        self.publish_many(6, bridge)
        self.reactor.advance(0.1)
        bridge.pump()
        self.assertEqual(bridge.acks()[-1], 3)
        bridge.drop()
        self.assertEqual(self.rejoin_gets(), [3, 4, 5])

    def test_close_tells_the_proxy_first(self):
        conn, bridge = self.open(ack_window=100)
        self.subscribe(conn, bridge, lambda note: None)
        self.publish_many(5, bridge)
        self.assertEqual(bridge.acks(), [])              # 5 < a quarter of 100
        conn.close()
        bridge.pump()
        self.assertEqual(bridge.acks(), [5])
        kinds = [type(p) for p in bridge.sent]
        self.assertLess(kinds.index(elvin_packets.QosRqst), kinds.index(elvin_packets.DisconnRqst))
        self.assertEqual(self.store.stored_count("phone"), 0)

    def test_no_window_no_acknowledgements(self):
        conn, bridge = self.open(ack_window=0)
        self.assertNotIn(ACK_WINDOW, bridge.sent[0].options)
        self.subscribe(conn, bridge, lambda note: None)
        self.publish_many(5, bridge)
        self.reactor.advance(1)
        bridge.pump()
        self.assertEqual(bridge.acks(), [])

    def test_a_plain_router_sees_no_proxy_option(self):
        reactor = MemoryReactorClock()
        conn = tx.Connection(URI, reactor)
        sent = []
        conn.lifecycle.attached(sent.append, {})
        conn.lifecycle.packet(elvin_packets.ConnRply(sent[0].xid, {}))
        self.assertEqual(sent[0].options, {})
        conn.lifecycle.packet(elvin_packets.NotifyDeliver({"n": 1}, (), (7,)))
        reactor.advance(1)
        self.assertEqual([type(p) for p in sent], [elvin_packets.ConnRqst])


class AioAckTest(FlavourCase):

    def setUp(self):
        super().setUp()
        self.loop = asyncio.new_event_loop()
        self.addCleanup(self.loop.close)

    def run_(self, bridge, awaitable):
        async def wrapped():
            return await awaitable
        task = self.loop.create_task(wrapped())
        for _ in range(1000):                 # bounded
            self.loop.run_until_complete(asyncio.sleep(0))
            bridge.pump()
            if task.done():
                return task.result()
        raise AssertionError("never finished")

    def open(self, **session):
        return self.attach(aio.Connection(URI, self.loop), **session)

    def test_an_iterator_acknowledges_what_it_yielded(self):
        conn, bridge = self.open(ack_window=8)
        sub = self.run_(bridge, conn.subscribe("require(n)"))
        self.publish_many(20, bridge)
        taken = [self.run_(bridge, sub.__anext__())["n"] for _ in range(5)]
        self.assertEqual(taken, [0, 1, 2, 3, 4])
        self.assertEqual(bridge.acks(), [2, 4])
        conn.lifecycle.close()                # politely: the fifth is told first
        bridge.pump()
        self.assertEqual(bridge.acks(), [2, 4, 5])
        bridge.drop()
        self.assertEqual(self.rejoin_gets(), list(range(5, 20)))

    def test_a_coroutine_callback_is_handled_when_it_ends(self):
        conn, bridge = self.open(ack_window=4)
        gate = self.loop.create_future()
        done = []

        async def handle(note):
            if note["n"] == 0:
                await gate
            done.append(note["n"])
        self.run_(bridge, conn.subscribe("require(n)", handle))
        self.publish_many(3, bridge)
        self.run_(bridge, asyncio.sleep(0))
        self.assertEqual(sorted(done), [1, 2])
        self.assertEqual(bridge.acks(), [])     # the first is still running
        gate.set_result(None)
        self.run_(bridge, asyncio.sleep(0))
        self.assertEqual(bridge.acks(), [3])
        self.assertEqual(self.store.stored_count("phone"), 0)
