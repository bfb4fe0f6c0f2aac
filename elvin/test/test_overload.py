"""Overload: slow consumers, floods, router-wide caps, limits on every path.

A real router on 127.0.0.1 (port 0) with real clients:

* ``SendQueueTests``: the send queue's bookkeeping under random operations
  for every policy, and that dropping costs O(log n) however long it is.
* ``SlowConsumerTests``: a client that stops reading is held to its
  Send-Queue.Max-Length by its drop policy (the server-side queue is
  watched after every packet), gets DropWarn, and the router's socket
  buffer for it stays bounded too; a fast consumer meanwhile sees every
  notification. Policy ``none`` disconnects it; so does leaving replies
  unread.
* ``FloodTests``: a publisher writing as fast as its socket allows cannot
  starve another publisher (fair reading).
* ``RouterCapTests``: max-connections (and the channel cap), subscriptions
  and quenches per client and router-wide, and max-queue-memory.
* ``PathLimitTests``: connection-option limits on each path the router
  has -- TCP, TLS, HTTP, UDP and federation.
"""

import gc
import random
import socket
import struct
import tracemalloc

from twisted.internet import defer, endpoints, error, protocol, reactor, task
from twisted.trial import unittest

from elvin import client, errors
from elvin.federation import packets as fed_packets
from elvin.federation.manager import FederationClass, FederationManager
from elvin.core import keys as core_keys
from elvin.core.options import DropPolicy, OPTIONS
from elvin.protocols import packets
from elvin.protocols.framing import frame
from elvin.protocols import server as server_module
from elvin.protocols.server import ElvinServerFactory, ElvinServerProtocol
from elvin.protocols.udp import UNotifyDatagramProtocol
from elvin.core.router import Router
from elvin.core.sendqueue import REPLY_SLACK, QueueBudget, QueueOverflow, SendQueue

from elvin.test.transport_fixtures import Certificates, RouterFixture, wait_until

WARN = b"W" * 4


# -- the queue itself --------------------------------------------------------------


class SendQueueTests(unittest.TestCase):
    def check(self, q):
        """Bookkeeping: size is the bytes of the queued non-DropWarn
        packets, and no two DropWarns are adjacent."""
        entries = []
        node = q._head.next
        while node is not q._head:
            entries.append(node)
            node = node.next
        self.assertEqual(len(entries), len(q))
        self.assertEqual(q.size, sum(len(e.data) for e in entries if not e.dropwarn))
        for a, b in zip(entries, entries[1:]):
            self.assertFalse(a.dropwarn and b.dropwarn)

    def test_random_operations_keep_the_books(self):
        rng = random.Random(7)
        for policy in DropPolicy:
            q = SendQueue(1000, policy, WARN)
            expect_order = []
            for step in range(3000):
                op = rng.random()
                if op < 0.6:
                    data = bytes([step % 251]) * rng.randrange(1, 200)
                    droppable = rng.random() < 0.85
                    try:
                        q.push(data, droppable)
                    except QueueOverflow:
                        self.assertTrue(policy == DropPolicy.NONE or not droppable)
                        continue
                    expect_order.append(data)
                elif op < 0.9 and q:
                    q.pop()
                elif op < 0.95:
                    q.shed(rng.randrange(1, 500))
                else:
                    q.configure(rng.choice([500, 1000, 2000]), rng.choice(list(DropPolicy)))
                    policy = q.policy
                self.check(q)
                if all(not e.droppable for e in self._entries(q)):
                    continue
                # Deliveries never exceed the limit; replies at most REPLY_SLACK x
                # (the largest limit configured: a smaller one applies to
                # what is pushed next).
                self.assertLessEqual(q.size, REPLY_SLACK * 2000 + 200)
            # What comes out keeps the order it went in.
            out = []
            while q:
                out.append(q.pop())
            survivors = [d for d in out if d != WARN]
            positions = [expect_order.index(d) if d in expect_order else -1 for d in survivors]
            self.assertEqual(q.size, 0)
            self.assertEqual(len(positions), len(survivors))

    @staticmethod
    def _entries(q):
        node = q._head.next
        while node is not q._head:
            yield node
            node = node.next

    def test_deliveries_stay_under_the_limit(self):
        for policy in (DropPolicy.OLDEST, DropPolicy.NEWEST, DropPolicy.LARGEST):
            q = SendQueue(4096, policy, WARN)
            for i in range(2000):
                q.push(b"d" * (10 + i % 90), True)
                self.assertLessEqual(q.size, 4096)
            self.assertGreater(q.dropped, 0)

    def test_unread_replies_overflow(self):
        q = SendQueue(1024, DropPolicy.OLDEST, WARN)
        with self.assertRaises(QueueOverflow):
            for _ in range(1000):
                q.push(b"r" * 100, False)
        self.assertLessEqual(q.size, REPLY_SLACK * 1024)

    def test_budget_sheds_largest_then_evicts(self):
        budget = QueueBudget(10_000)
        evicted, shed = [], []
        queues = {}
        for name, policy in (("a", DropPolicy.OLDEST), ("b", DropPolicy.NONE),
                             ("c", DropPolicy.NEWEST)):
            q = queues[name] = SendQueue(1 << 20, policy, WARN)
            budget.join(q, evicted.append, lambda n, name=name: shed.append((name, n)))
        for i in range(30):
            for name in "abc":
                if queues[name] in evicted:
                    continue   # that client is gone
                queues[name].push(b"%d" % i * 100, True)
                budget.enforce()
                self.assertLessEqual(budget.total, 10_000)
        self.assertEqual(evicted, [queues["b"]])       # could not shed: evicted
        self.assertEqual(queues["b"].size, 0)
        self.assertTrue(shed and {name for name, _ in shed} <= {"a", "c"}, shed)
        self.assertEqual(budget.total, queues["a"].memory + queues["c"].memory)
        self.assertEqual(budget.bytes, queues["a"].size + queues["c"].size)
        self.assertEqual(budget.evictions, 1)
        for q in queues.values():
            budget.leave(q)
        self.assertEqual((budget.total, budget.bytes), (0, 0))
        self.assertEqual(len(budget), 0)

    def test_budget_keeps_the_books_of_its_queues_memory(self):
        """Whatever happens to its queues (pushes, drops, DropWarns, pops,
        sheds, policy changes, clears), the budget's total is their
        ``memory`` together and its bytes their ``size``."""
        rng = random.Random(11)
        budget = QueueBudget(0)
        queues = [SendQueue(1500, policy, WARN) for policy in DropPolicy]
        for q in queues:
            budget.join(q, lambda q: None)
        for step in range(4000):
            q = rng.choice(queues)
            op = rng.random()
            if op < 0.6:
                try:
                    q.push(b"x" * rng.randrange(1, 120), rng.random() < 0.9)
                except QueueOverflow:
                    pass
            elif op < 0.85 and q:
                q.pop()
            elif op < 0.93:
                q.shed(rng.randrange(1, 800))
            elif op < 0.98:
                q.configure(rng.choice([500, 1500]), rng.choice(list(DropPolicy)))
            else:
                q.clear()
            self.assertEqual(budget.total, sum(q.memory for q in queues))
            self.assertEqual(budget.bytes, sum(q.size for q in queues))
        for q in queues:
            budget.leave(q)
        self.assertEqual((budget.total, budget.bytes), (0, 0))

    def test_budget_counts_what_small_packets_cost(self):
        """With small deliveries, what a queue holds is mostly Python's
        bookkeeping, not packet bytes: the budget caps the memory, so 5,000
        deliveries of 44 bytes (220,000 bytes of packets) do not fit under a
        cap of 500,000."""
        budget = QueueBudget(500_000)
        shed = []
        q = SendQueue(1 << 30, DropPolicy.OLDEST, WARN)
        budget.join(q, lambda q: None, shed.append)
        for i in range(5000):
            q.push(b"d" * 44, True)
            budget.enforce()
            self.assertLessEqual(budget.total, 500_000)
        self.assertTrue(shed)
        self.assertLess(budget.bytes, 500_000 * 44 // (44 + 150))


    def test_dropping_costs_the_same_however_long_the_queue(self):
        """A victim is found in O(log n): a 4 MiB queue of small packets
        (about 50,000 of them) examines no more entries per push than a
        short one. Counted, not timed: the entries taken from the victim
        index (the deque, or the heap for ``largest``) and the entries a
        rebuild of the index walks."""
        work = {}
        for policy in (DropPolicy.OLDEST, DropPolicy.NEWEST, DropPolicy.LARGEST):
            for limit in (64 * 1024, 4 * 1024 * 1024):
                q = SendQueue(limit, policy, WARN)
                while q.size + 80 <= limit:
                    q.push(b"x" * 80, True)
                walked = []
                reindex = q._reindex

                def counted_reindex(q=q, reindex=reindex, walked=walked):
                    walked.append(len(q))
                    reindex()
                q._reindex = counted_reindex

                def indexed(q=q):
                    return len(q._heap) if policy == DropPolicy.LARGEST else len(q._victims)
                before, dropped = indexed(), q.dropped
                for i in range(2000):
                    q.push(b"y" * (40 + i % 80), True)
                self.assertEqual(walked, [], (policy, limit))
                taken = before + 2000 - indexed()
                work[policy, limit] = (taken, q.dropped - dropped)
        for policy in (DropPolicy.OLDEST, DropPolicy.NEWEST, DropPolicy.LARGEST):
            short, long = work[policy, 64 * 1024], work[policy, 4 * 1024 * 1024]
            # Each drop takes one live entry, plus at most the stale ones
            # earlier drops left: never a scan of the 50,000 queued.
            for taken, drops in (short, long):
                self.assertGreater(drops, 0, work)
                self.assertLessEqual(taken, 2 * drops + 2000, work)
            self.assertLessEqual(long[0], short[0] + 200, work)


class PacketCostTests(unittest.TestCase):
    """What ``SendQueue.memory`` counts against what the queue holds
    (tracemalloc), for small and larger packets and every policy."""

    def measure(self, policy, size, count=2_000):
        data = [bytearray(b"p" * size) for _ in range(count)]
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            q = SendQueue(1 << 40, policy, WARN)
            for d in data:
                q.push(bytes(d), True)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        return q.memory, held

    def test_memory_counts_what_the_queue_holds(self):
        for policy in DropPolicy:
            for size in (44, 1000):
                counted, held = self.measure(policy, size)
                # At least what tracemalloc sees, at most 1.4 times it (the
                # estimate rounds up to what RSS grows by).
                self.assertGreaterEqual(counted, held, (policy, size))
                self.assertLessEqual(counted, 1.4 * held, (policy, size))


# -- live routers ------------------------------------------------------------------


class _WatchedProtocol(ElvinServerProtocol):
    """Records, after every packet queued, the largest its queue and its
    transport's write buffer have been, and the router-wide total."""

    def send_encoded(self, data, droppable):
        super().send_encoded(data, droppable)
        factory = self.factory
        if self.queue is not None:
            factory.max_queue[self] = max(factory.max_queue.get(self, 0), self.queue.size)
        transport = self.transport
        if transport is not None and hasattr(transport, "_tempDataLen"):
            buffered = len(transport.dataBuffer) - transport.offset + transport._tempDataLen
            factory.max_buffer[self] = max(factory.max_buffer.get(self, 0), buffered)
        factory.max_total = max(factory.max_total, factory.router.queue_budget.total)


class LiveFixture(RouterFixture):
    timeout = 60

    def make_router(self):
        return Router()

    def setUp(self):
        super().setUp()
        self.router = self.make_router()
        self.factory = ElvinServerFactory(self.router, reactor)
        self.factory.protocol = _WatchedProtocol
        self.factory.max_queue = {}
        self.factory.max_buffer = {}
        self.factory.max_total = 0
        self.uri = self.listen_tcp()

    def stop_reading(self, conn):
        """Make ``conn`` stop reading its socket, with a small kernel send
        buffer on the router's end so its own queue is reached quickly.
        The client's receive buffer keeps its size: a small one would have
        the kernel trickle the backlog out at 200 ms window probes once the
        client reads again."""
        self.server_side(conn).transport.getHandle().setsockopt(socket.SOL_SOCKET,
                                                                socket.SO_SNDBUF, 4096)
        conn.protocol.transport.pauseProducing()

    def short_linger(self):
        """The router resets a client it closed for not reading after
        0.2 s instead of CLOSE_LINGER: these clients read nothing until the
        test resumes them, so the linger would only make the test wait."""
        self.patch(server_module, "CLOSE_LINGER", 0.2)

    def server_side(self, conn):
        """The router's protocol for client connection ``conn``."""
        ids = set(conn.subscriptions)
        for session in self.router.sessions:
            if ids and ids & set(session.subscriptions):
                return session.output
        raise LookupError("no session holds that connection's subscriptions")


class SlowConsumerTests(LiveFixture):
    LIMIT = 8192
    TOTAL = 1500

    @defer.inlineCallbacks
    def flood_past_slow_consumer(self, policy):
        slow = yield self.connect({"Send-Queue.Max-Length": self.LIMIT,
                                   "Send-Queue.Drop-Policy": policy})
        fast = yield self.connect()
        producer = yield self.connect()
        slow_got, fast_got = [], []
        yield slow.subscribe("require(n)", slow_got.append)
        yield fast.subscribe("require(n)", fast_got.append)
        server = self.server_side(slow)
        self.stop_reading(slow)
        pad = "x" * 1000
        for n in range(self.TOTAL):
            producer.notify({"n": n, "pad": pad})
        yield wait_until(lambda: len(fast_got) == self.TOTAL, timeout=30)
        yield producer.test_connection()
        return slow, fast, server, slow_got, fast_got

    @defer.inlineCallbacks
    def check_policy(self, policy):
        slow, fast, server, slow_got, fast_got = yield self.flood_past_slow_consumer(policy)
        # The fast consumer saw everything, in order.
        self.assertEqual([x["n"] for x in fast_got], list(range(self.TOTAL)))
        self.assertEqual(fast.dropwarns, 0)
        # The slow one was held to its limit all along: its queue, and the
        # router's socket buffer for it (one write buffer and one packet).
        self.assertGreater(server.session.dropped, 0)
        self.assertLessEqual(self.factory.max_queue[server], self.LIMIT)
        self.assertLessEqual(self.factory.max_buffer[server],
                             server.transport.bufferSize + 1100)
        # Reading again, it learns it missed notifications.
        slow.protocol.transport.resumeProducing()
        yield wait_until(lambda: slow.dropwarns > 0 and server.queue.size == 0, timeout=30)
        # Round trips until nothing more arrives (test_connection settles on
        # any packet, so one is not enough while deliveries are in flight).
        while True:
            before = len(slow_got)
            yield slow.test_connection()
            yield task.deferLater(reactor, 0.05, lambda: None)
            if len(slow_got) == before:
                break
        got = [x["n"] for x in slow_got]
        self.assertLess(len(got), self.TOTAL)
        self.assertEqual(got, sorted(got))   # what survived is in order
        return got

    @defer.inlineCallbacks
    def test_oldest(self):
        got = yield self.check_policy("oldest")
        self.assertEqual(got[-1], self.TOTAL - 1)   # the newest survive

    @defer.inlineCallbacks
    def test_newest(self):
        got = yield self.check_policy("newest")
        self.assertLess(got[-1], self.TOTAL - 1)     # the newest were dropped

    @defer.inlineCallbacks
    def test_largest(self):
        got = yield self.check_policy("largest")
        self.assertEqual(got[-1], self.TOTAL - 1)

    @defer.inlineCallbacks
    def test_none_disconnects_only_the_slow_client(self):
        self.short_linger()
        slow, fast, server, slow_got, fast_got = yield self.flood_past_slow_consumer("none")
        yield wait_until(lambda: server.session.state == server.session.CLOSED)
        self.assertEqual([x["n"] for x in fast_got], list(range(self.TOTAL)))
        self.assertLessEqual(self.factory.max_queue[server], self.LIMIT)
        slow.protocol.transport.resumeProducing()
        yield slow.disconnected
        self.assertFalse(fast.disconnected.called)

    @defer.inlineCallbacks
    def test_client_not_reading_its_replies_is_disconnected(self):
        """Replies are never dropped, so a client that keeps asking and never
        reads would grow its queue without bound: past REPLY_SLACK x its
        limit it is disconnected instead."""
        done = defer.Deferred()

        class Asker(protocol.Protocol):
            def connectionMade(self):
                self.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                self.transport.pauseProducing()    # never read
                options = {name: spec.default for name, spec in OPTIONS.items()}
                options["Send-Queue.Max-Length"] = 1024
                self.transport.write(frame(packets.encode(packets.ConnRqst(1, 4, 0, options))))
                request = frame(packets.encode(packets.QosRqst(2, options)))
                self.transport.write(request * 30000)   # about 30 MB of replies

            def connectionLost(self, reason):
                done.callback(None)

        yield endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", self.ports[0].getHost().port
                                           ).connect(protocol.Factory.forProtocol(Asker))
        yield wait_until(lambda: self.factory.max_queue and not self.router.sessions,
                         timeout=30)
        (server,) = self.factory.max_queue
        self.assertLessEqual(self.factory.max_queue[server], REPLY_SLACK * 1024)
        yield done

    @defer.inlineCallbacks
    def test_disconnected_client_still_sending_reads_to_the_end(self):
        """A slow client disconnected under policy none that keeps sending
        is not reset: the router reads and discards its input while it
        closes, so the client reads every delivery written, the DropWarn
        and the Disconn, then end of file; read and counted make all."""
        self.patch(server_module, "CLOSE_LINGER", 2.0)
        raw = _RawClient({"Send-Queue.Max-Length": self.LIMIT,
                          "Send-Queue.Drop-Policy": DropPolicy.NONE.value})
        yield endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", self.ports[0].getHost().port
                                           ).connect(protocol.Factory.forProtocol(lambda: raw))
        yield wait_until(lambda: len(raw.got) == 2)
        (server,) = [s.output for s in self.router.sessions]
        raw.transport.pauseProducing()
        producer = yield self.connect()
        for n in range(1000):
            producer.notify({"n": n, "pad": "x" * 1000})
        yield producer.test_connection()
        self.assertIn(server.session.state, (server.session.CLOSING, server.session.CLOSED))
        # The client goes on sending after the router closed it: input
        # the router never reads would make closing the socket a reset.
        emit = frame(packets.encode(packets.NotifyEmit({"chat": "y" * 500}, True)))
        raw.transport.write(emit * 40)
        yield task.deferLater(reactor, 0.1, lambda: None)
        raw.transport.resumeProducing()
        reason = yield raw.ended
        self.assertIsInstance(reason, error.ConnectionDone)
        self.assertIsInstance(raw.got[-1], packets.Disconn)
        self.assertEqual(raw.got[-1].reason, 4)
        self.assertEqual(raw.kinds(packets.DropWarn), 1)
        made = self.router.stats["deliveries"]     # to it, until it was shed
        self.assertGreater(server.session.dropped, 0)
        self.assertEqual(raw.kinds(packets.NotifyDeliver) + server.session.dropped, made)


class _RawClient(protocol.Protocol):
    """A client speaking raw frames: logs in with ``options``, subscribes to
    ``require(n)``, and collects every packet it reads; ``ended`` fires
    with how the connection ended (its exception)."""

    def __init__(self, options):
        self.options = options
        self.buffer = b""
        self.got = []
        self.ended = defer.Deferred()

    def connectionMade(self):
        self.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        options = {name: spec.default for name, spec in OPTIONS.items()}
        options.update(self.options)
        self.transport.write(frame(packets.encode(packets.ConnRqst(1, 4, 0, options)))
                             + frame(packets.encode(packets.SubAddRqst(2, "require(n)", True))))

    def dataReceived(self, data):
        self.buffer += data
        while len(self.buffer) >= 4:
            length = struct.unpack_from(">I", self.buffer)[0]
            if len(self.buffer) < 4 + length:
                break
            self.got.append(packets.decode(self.buffer[4:4 + length]))
            self.buffer = self.buffer[4 + length:]

    def kinds(self, kind):
        return sum(isinstance(p, kind) for p in self.got)

    def connectionLost(self, reason):
        self.ended.callback(reason.value)


class _Flooder(protocol.Protocol):
    """Writes ``count`` pre-encoded NotifyEmit frames as fast as the socket
    takes them."""

    def __init__(self, count):
        self.count = count

    def connectionMade(self):
        self.transport.write(frame(packets.encode(packets.ConnRqst(1, 4, 0))))
        note = frame(packets.encode(packets.NotifyEmit({"flood": 1, "pad": "f" * 64}, True)))
        self.transport.write(note * self.count)


class FloodTests(LiveFixture):
    @defer.inlineCallbacks
    def test_flooding_publisher_cannot_starve_another(self):
        flood_sub = yield self.connect()
        flood_seen = []
        yield flood_sub.subscribe("require(flood)", lambda n: flood_seen.append(1))
        good_sub = yield self.connect()
        good_pub = yield self.connect()
        # How long a good notification waits is counted in notifications
        # the router handled meanwhile, not in seconds: a publisher starved
        # by the flood would wait for most of its 40,000.
        waited = {}
        routed_at = {}
        received = []

        def routed():
            return self.router.stats["notifications"]

        def got(note):
            waited[note["seq"]] = routed() - routed_at[note["seq"]]
            received.append(note["seq"])
        yield good_sub.subscribe("require(seq)", got)
        flood = 40_000
        flooder = yield endpoints.TCP4ClientEndpoint(
            reactor, "127.0.0.1", self.ports[0].getHost().port).connect(
            protocol.Factory.forProtocol(lambda: _Flooder(flood)))
        self.addCleanup(lambda: flooder.transport.abortConnection())
        flood_start = self.router.stats["notifications"]
        sent = []

        def publish():
            seq = len(sent)
            routed_at[seq] = routed()
            good_pub.notify({"seq": seq})
            sent.append(seq)
        ticker = task.LoopingCall(publish)
        ticker.start(0.005)
        # Publish while the flood is being read ...
        yield wait_until(lambda: self.router.stats["notifications"] - flood_start
                         >= flood + len(sent), timeout=40)
        ticker.stop()
        flood_done = self.router.stats["notifications"] - flood_start - len(sent)
        yield wait_until(lambda: len(received) >= len(sent), timeout=10)
        yield good_pub.test_connection()
        yield task.deferLater(reactor, 0.1, lambda: None)
        # ... and every good notification got through, in order, during it.
        self.assertEqual(received, sent)
        self.assertEqual(flood_done, flood)
        self.assertGreater(len(sent), 20, "the flood was too short to measure")
        worst = max(waited.values())
        self.assertLess(worst, flood // 4,
                        f"a good notification waited for {worst} others during the flood")


class RouterCapTests(LiveFixture):
    def make_router(self):
        return Router(max_connections=3, max_subscriptions=40)

    @defer.inlineCallbacks
    def test_max_connections(self):
        conns = []
        for _ in range(3):
            conns.append((yield self.connect()))
        with self.assertRaises(client.NackError) as cm:
            yield self.connect()
        self.assertEqual(cm.exception.code, errors.IMPL_LIMIT)
        yield conns[0].close()
        yield wait_until(lambda: len(self.router.sessions) == 2)
        yield self.connect()

    @defer.inlineCallbacks
    def test_channels_beyond_twice_max_connections_are_closed(self):
        """Channels that never send ConnRqst count too: at most as many
        again as max-connections may wait, so idle sockets cannot pile up."""
        port = self.ports[0].getHost().port
        socks = []
        try:
            for _ in range(6):
                socks.append(socket.create_connection(("127.0.0.1", port)))
            yield wait_until(lambda: len(self.router.sessions) == 6)
            extra = socket.create_connection(("127.0.0.1", port))
            socks.append(extra)
            extra.setblocking(False)
            yield wait_until(lambda: _closed(extra), timeout=5)
            self.assertEqual(len(self.router.sessions), 6)
        finally:
            for sock in socks:
                sock.close()

    @defer.inlineCallbacks
    def test_subscriptions_per_client_and_router_wide(self):
        a = yield self.connect({"Subscription.Max-Count": 16})
        for i in range(16):
            yield a.subscribe(f"x == {i}", lambda n: None)
        with self.assertRaises(client.NackError) as cm:
            yield a.subscribe("x == 99", lambda n: None)
        self.assertEqual(cm.exception.code, errors.QOS_LIMIT)
        b = yield self.connect()
        for i in range(24):
            yield b.subscribe(f"y == {i}", lambda n: None)
        with self.assertRaises(client.NackError) as cm:
            yield b.subscribe("y == 99", lambda n: None)
        self.assertEqual(cm.exception.code, errors.IMPL_LIMIT)
        self.assertEqual(len(self.router.subscriptions), 40)

    @defer.inlineCallbacks
    def test_quenches_are_limited_like_subscriptions(self):
        conn = yield self.connect({"Subscription.Max-Count": 16, "Attribute.Max-Count": 16})
        with self.assertRaises(client.NackError) as cm:
            yield conn.quench([f"name{i}" for i in range(17)])
        self.assertEqual(cm.exception.nack_args, ("Attribute.Max-Count",))
        for i in range(16):
            yield conn.quench([f"q{i}"])
        with self.assertRaises(client.NackError) as cm:
            yield conn.quench(["one-too-many"])
        self.assertEqual(cm.exception.nack_args, ("Subscription.Max-Count",))
        self.assertEqual(len(self.router.quench), 16)


def _closed(sock):
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class QueueMemoryTests(LiveFixture):
    CAP = 48 * 1024

    def make_router(self):
        return Router(max_queue_memory=self.CAP)

    @defer.inlineCallbacks
    def test_router_wide_cap_sheds_then_evicts(self):
        """Two paused clients each allowed 64 KiB, the router only 48 KiB
        for all queues: the one that may drop (oldest) sheds, the one that
        may not (none) is disconnected once it is the largest."""
        self.short_linger()
        options = {"Send-Queue.Max-Length": 65536}
        shedder = yield self.connect(dict(options, **{"Send-Queue.Drop-Policy": "oldest"}))
        strict = yield self.connect(dict(options, **{"Send-Queue.Drop-Policy": "none"}))
        fast = yield self.connect()
        producer = yield self.connect()
        fast_got = []
        for conn in (shedder, strict):
            yield conn.subscribe("require(n)", lambda n: None)
        yield fast.subscribe("require(n)", fast_got.append)
        shedder_side = self.server_side(shedder)
        strict_side = self.server_side(strict)
        self.stop_reading(shedder)
        self.stop_reading(strict)
        # Paced, so the fast consumer keeps up: the cap takes from the
        # largest queues, whoever they belong to at the time.
        sent = iter(range(2000))

        def emit():
            for n in sent:
                producer.notify({"n": n, "pad": "x" * 500})
                if n % 20 == 19:
                    return
            ticker.stop()
        ticker = task.LoopingCall(emit)
        yield ticker.start(0.005)
        yield wait_until(lambda: len(fast_got) == 2000, timeout=30)
        self.assertEqual([x["n"] for x in fast_got], list(range(2000)))
        self.assertEqual(fast.dropwarns, 0)
        yield wait_until(lambda: strict_side.session.state == strict_side.session.CLOSED)
        self.assertLessEqual(self.factory.max_total, self.CAP)
        self.assertLessEqual(self.router.queue_budget.total, self.CAP)
        self.assertEqual(self.router.queue_budget.evictions, 1)
        self.assertGreater(shedder_side.session.dropped, 0)
        self.assertEqual(shedder_side.session.state, shedder_side.session.CONNECTED)
        shedder.protocol.transport.resumeProducing()
        yield wait_until(lambda: shedder.dropwarns > 0)
        strict.protocol.transport.resumeProducing()
        yield strict.disconnected
        self.assertFalse(fast.disconnected.called)

    def test_configured(self):
        from elvin import config, tap
        cfg = config.parse("max-queue-memory = 1048576\n")
        self.assertEqual(cfg.max_queue_memory, 1048576)
        options = tap.Options()
        options.router_config = cfg
        cfg.listen = []
        from twisted.internet.testing import MemoryReactor
        top = tap.makeService(options, reactor=MemoryReactor())
        self.assertEqual(top.router.queue_budget.max_bytes, 1048576)
        with self.assertRaises(config.ConfigError):
            config.parse("max-queue-memory = -1\n")


class CostTests(unittest.TestCase):
    """Packets built to be expensive are refused before the expense."""

    def connected(self):
        from twisted.internet.testing import StringTransport
        factory = ElvinServerFactory(Router(), task.Clock())
        proto = factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(frame(packets.encode(packets.ConnRqst(1, 4, 0))))
        transport.clear()
        return proto, transport

    def test_packet_a_client_never_sends_is_not_decoded(self):
        """A SubAddNotify (router-to-client) carrying a 2 MiB SubAST of
        130,000 nodes would take seconds to decode: it is refused unread."""
        proto, transport = self.connected()
        leaf = struct.pack(">ii", 1, 4) + struct.pack(">I", 1) + b"x\0\0\0"
        body = (struct.pack(">IIIQ", packets.SubAddNotify.ID, 0, 0, 1)
                + struct.pack(">iii", 16, 0, 130_000) + leaf * 130_000)
        decoded = []
        for name in ("decode", "decode_notify_emit", "notify_emit_fields"):
            def counted(data, real=getattr(packets, name), name=name):
                decoded.append(name)
                return real(data)
            self.patch(packets, name, counted)
        proto.dataReceived(struct.pack(">I", len(body)) + body)
        self.assertEqual(decoded, [])
        self.assertTrue(transport.disconnecting)

    def test_key_bomb_is_refused_before_hashing(self):
        proto, transport = self.connected()
        count = 200_000
        keys = (struct.pack(">IIII", 1, 2, 1, count)
                + (struct.pack(">I", 1) + b"k\0\0\0") * count)
        body = struct.pack(">II", packets.SecRqst.ID, 9) + keys + struct.pack(">III", 0, 0, 0)
        hashed = []

        def counted_public_key(private, real=core_keys.public_key):
            hashed.append(1)
            return real(private)
        self.patch(core_keys, "public_key", counted_public_key)
        proto.dataReceived(struct.pack(">I", len(body)) + body)
        (length,) = struct.unpack(">I", transport.value()[:4])
        nack = packets.decode(transport.value()[4:4 + length])
        self.assertEqual((nack.xid, nack.error), (9, errors.QOS_LIMIT))
        # Decoding 200,000 keys is the cost left: none of them is hashed.
        self.assertEqual(len(hashed), 0)
        self.assertFalse(transport.disconnecting)
        # A NotifyEmit carrying them is ignored (7.3.3), nothing hashed.
        transport.clear()
        body = (struct.pack(">II", packets.NotifyEmit.ID, 1) + struct.pack(">I", 1) + b"a\0\0\0"
                + struct.pack(">II", 1, 1) + struct.pack(">I", 1) + keys)
        before = proto.session.router.stats["rejected_notifications"]
        proto.dataReceived(struct.pack(">I", len(body)) + body)
        self.assertEqual(len(hashed), 0)
        self.assertEqual(proto.session.router.stats["rejected_notifications"], before + 1)
        self.assertEqual(transport.value(), b"")
        self.assertFalse(transport.disconnecting)


# -- one representative limit on every path ------------------------------------------


class PathLimitTests(RouterFixture):
    """Attribute.Max-Count and Packet.Max-Length on TCP, TLS and HTTP;
    Attribute.Max-Count and the datagram size on UDP; the federation
    link's own limits."""

    timeout = 60
    client_args = {}

    @defer.inlineCallbacks
    def check_stream_limits(self, uri):
        self.uri = uri
        watcher = yield self.connect(**self.client_args)
        got = []
        yield watcher.subscribe("require(a0)", got.append)
        small = yield self.connect({"Attribute.Max-Count": 16, "Packet.Max-Length": 1024},
                                   **self.client_args)
        self.assertEqual(small.options["Attribute.Max-Count"], 16)
        # The client refuses what the router said it would not take ...
        with self.assertRaises(ValueError):
            small.notify({f"a{i}": i for i in range(17)})
        # ... and the router ignores it when a client sends it anyway.
        small.post(packets.NotifyEmit({f"a{i}": i for i in range(17)}, True,
                                      packets.Keys.EMPTY), None)
        small.notify({f"a{i}": i for i in range(16)})   # at the limit: routed
        yield small.test_connection()
        yield wait_until(lambda: got)
        yield watcher.test_connection()
        self.assertEqual([len(n) for n in got], [16])
        self.assertEqual(self.router.stats["rejected_notifications"], 1)
        # A packet over Packet.Max-Length resets that connection only.
        with self.assertRaises(ValueError):
            small.notify({"a0": "x" * 2000})
        small.post(packets.NotifyEmit({"a0": "x" * 2000}, True, packets.Keys.EMPTY), None)
        yield small.disconnected
        self.connections.remove(small)
        yield watcher.test_connection()
        self.assertEqual(len(got), 1)

    def test_tcp(self):
        return self.check_stream_limits(self.listen_tcp())

    def test_tls(self):
        from elvin.protocols import tls
        certs = Certificates(self.mktemp())
        options = tls.server_options(certs.server_cert, certs.server_key)
        self.client_args = {"tls_ca": certs.ca_path}
        return self.check_stream_limits(self.listen_tls(options))

    def test_http(self):
        uri, _site = self.listen_http()
        return self.check_stream_limits(uri)

    @defer.inlineCallbacks
    def test_udp(self):
        from elvin.core.options import OPTIONS as SPECS
        specs = dict(SPECS)
        specs["Packet.Max-Length"] = specs["Packet.Max-Length"].with_default(8192)
        self.router = Router(specs)
        self.factory = ElvinServerFactory(self.router, reactor)
        self.uri = self.listen_tcp()
        udp = UNotifyDatagramProtocol(self.router)
        port = reactor.listenUDP(0, udp, interface="127.0.0.1", maxPacketSize=udp.read_size)
        self.ports.append(port)
        watcher = yield self.connect()
        got = []
        yield watcher.subscribe("require(a0)", got.append)
        sender = reactor.listenUDP(0, protocol.DatagramProtocol(), interface="127.0.0.1")
        self.ports.append(sender)
        target = ("127.0.0.1", port.getHost().port)
        many = OPTIONS["Attribute.Max-Count"].default + 1
        sender.write(packets.encode(packets.UNotify(4, 0, {f"a{i}": i for i in range(many)}, True)), target)
        sender.write(packets.encode(packets.UNotify(4, 0, {"a0": "y" * 9000}, True)), target)
        sender.write(packets.encode(packets.UNotify(4, 0, {"a0": 1}, True)), target)
        yield wait_until(lambda: got)
        self.assertEqual(udp.counters["oversize"], 1)
        self.assertEqual(self.router.stats["rejected_notifications"], 1)
        self.assertEqual([dict(n) for n in got], [{"a0": 1}])

    @defer.inlineCallbacks
    def test_federation(self):
        """A peer's notifications are held to this router's default
        attribute limits; a frame over the federation packet limit, or a
        packet a peer never sends, closes the link without being decoded;
        a pull filter bigger than we would ever send is widened to TRUE."""
        from twisted.internet.testing import StringTransport
        from elvin.federation import filters
        from elvin.federation.protocol import FederationProtocol
        from elvin.subscription.ast import Kind, Node

        self.uri = self.listen_tcp()
        manager = FederationManager(self.router, "here.test",
                                    [FederationClass("Peers", hosts=["*"])], None, reactor,
                                    max_filter_nodes=50)
        watcher = yield self.connect()
        got = []
        yield watcher.subscribe("require(a0)", got.append)

        def peer():
            proto = FederationProtocol(manager, False, None, keepalive=0)
            transport = StringTransport()
            proto.makeConnection(transport)
            proto.dataReceived(frame(packets.encode(fed_packets.FedConnRqst(1, 1, 0,
                                                             f"peer{len(manager.links)}.test"))))
            self.assertEqual(proto.link.state, proto.link.UP)
            return proto, transport

        proto, transport = peer()
        many = OPTIONS["Attribute.Max-Count"].default + 1
        proto.dataReceived(frame(packets.encode(fed_packets.FedNotify({f"a{i}": i for i in range(many)},
                                                       True, packets.Keys.EMPTY, ("far.test",)))))
        proto.dataReceived(frame(packets.encode(fed_packets.FedNotify({"a0": 1}, True, packets.Keys.EMPTY,
                                                       ("far.test",)))))
        yield wait_until(lambda: got)
        yield watcher.test_connection()
        self.assertEqual([dict(n) for n in got], [{"a0": 1}])
        self.assertEqual(proto.link.stats["suppressed"], 1)
        # A filter of more nodes than max_filter_nodes is taken as TRUE.
        wide = Node(Kind.OR, None, [Node(Kind.FUNC_REQUIRE, None, [Node(Kind.NAME, f"n{i}")])
                                    for i in range(100)])
        proto.dataReceived(frame(packets.encode(fed_packets.FedSubReplace(5, wide))))
        self.assertIs(proto.link.remote_filter.tree, filters.TRUE)
        # A packet only a router sends a client: refused undecoded.
        proto.dataReceived(frame(packets.encode(packets.SubRply(1, 1))))
        self.assertTrue(transport.disconnecting or proto.link.state == proto.link.CLOSED)
        self.assertNotIn(proto.link, manager.links)
        # A frame header over the federation packet limit resets the link.
        proto2, transport2 = peer()
        proto2.dataReceived(struct.pack(">I", fed_packets.MAX_PACKET_LENGTH + 4))
        self.assertTrue(transport2.disconnecting)
        proto2.connectionLost(None)
        self.assertEqual(manager.links, [])
        manager.shutdown()
