"""The router-wide receive budget (``max-receive-memory``): bytes held in
unfinished frames are counted, a channel may send at most 64 KiB before
its session is connected, and when the budget runs out the connections
holding the most are reset while everyone else is still served. All in
memory (StringTransport, iosim, a Clock)."""

import struct

from prometheus_client import generate_latest
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.test.iosim import connect, makeFakeClient, makeFakeServer
from twisted.trial import unittest

from elvin import config, tap
from elvin.client import Connection, _ClientFactory
from elvin.core.router import Router
from elvin.federation.manager import FederationClass, FederationManager
from elvin.federation.protocol import FederationProtocol
from elvin.ops.metrics import registry_for
from elvin.ops.status import snapshot
from elvin.protocols import packets as elvin_packets
from elvin.protocols.framing import (DEFAULT_MAX_RECEIVE_MEMORY, FramedProtocol,
                                     ReceiveBudget, frame, receive_budget_of)
from elvin.protocols.httptunnel import ElvinHTTPSite
from elvin.protocols.server import PRE_CONNECT_MAX_PACKET, ElvinServerFactory
from elvin.uri import ElvinURI


class Holder:
    """A budget holder that records being closed."""

    def __init__(self, name):
        self.name = name
        self.closed = []

    def receive_budget_peer(self):
        return self.name

    def receive_budget_closed(self, held):
        self.closed.append(held)


class Recorder(FramedProtocol):

    def __init__(self, budget):
        super().__init__()
        self.receive_budget = budget
        self.frames = []
        self.exhausted = []

    def frameReceived(self, data):
        self.frames.append(data)

    def receiveBudgetExhausted(self, held):
        self.exhausted.append(held)
        super().receiveBudgetExhausted(held)


def header(length):
    return struct.pack(">I", length)


class BudgetTests(unittest.TestCase):
    """ReceiveBudget on its own."""

    def test_accounting(self):
        budget = ReceiveBudget(1000)
        a, b = Holder("a"), Holder("b")
        budget.hold(a, 300)
        budget.hold(b, 200)
        budget.hold(a, 400)
        self.assertEqual((budget.total, len(budget), budget.held_by(a)), (600, 2, 400))
        budget.hold(a, 0)
        self.assertEqual((budget.total, len(budget), budget.held_by(a)), (200, 1, 0))
        budget.hold(a, 0)               # letting go twice changes nothing
        self.assertEqual(budget.total, 200)

    def test_largest_closed_first_until_a_tenth_under(self):
        budget = ReceiveBudget(1000)
        holders = [Holder(str(n)) for n in range(5)]
        for holder, held in zip(holders, (100, 350, 50, 300, 150)):
            budget.hold(holder, held)
        self.assertEqual(budget.total, 950)
        budget.hold(holders[2], 120)    # 1020 > 1000: close down to <= 900
        self.assertEqual(holders[1].closed, [350])
        self.assertEqual([h.closed for h in holders if h is not holders[1]], [[]] * 4)
        self.assertEqual((budget.total, budget.closes, budget.closed_bytes), (670, 1, 350))
        self.assertEqual(budget.held_by(holders[1]), 0)

    def test_closes_several_and_possibly_the_reporter(self):
        budget = ReceiveBudget(1000)
        others = [Holder(str(n)) for n in range(10)]
        for holder in others:
            budget.hold(holder, 100)
        small = Holder("small")
        budget.hold(small, 90)          # 1090: two of 100 go, to 890
        self.assertEqual(sum(len(h.closed) for h in others), 2)
        self.assertEqual((small.closed, budget.total), ([], 890))
        big = Holder("big")
        budget.hold(big, 50)
        budget.hold(big, 400)           # 1290: the reporter is the largest
        self.assertEqual((big.closed, budget.total), ([400], 890))
        self.assertEqual(budget.closes, 3)

    def test_zero_is_no_cap(self):
        budget = ReceiveBudget(0)
        holder = Holder("x")
        budget.hold(holder, 1 << 40)
        self.assertEqual(holder.closed, [])

    def test_router_budget_made_once_with_the_default(self):
        router = Router()
        budget = receive_budget_of(router)
        self.assertIs(receive_budget_of(router), budget)
        self.assertEqual(budget.max_bytes, DEFAULT_MAX_RECEIVE_MEMORY)


class FramingAccountingTests(unittest.TestCase):
    """FramedProtocol reports exactly the bytes it holds."""

    def setUp(self):
        self.budget = ReceiveBudget(1 << 30)
        self.transport = StringTransport()
        self.proto = Recorder(self.budget)
        self.proto.makeConnection(self.transport)

    def test_partial_frames_counted_and_released(self):
        body = bytes(range(256)) * 400               # 102,400 bytes
        data = frame(body) + frame(b"abcd")[:6]
        self.proto.dataReceived(data[:3])
        self.assertEqual(self.budget.total, 3)
        self.proto.dataReceived(data[3:50_000])
        self.assertEqual(self.budget.total, 50_000)
        self.assertEqual(self.proto.buffered, 50_000)
        self.proto.dataReceived(data[50_000:])       # completes it, 6 bytes of the next
        self.assertEqual(self.proto.frames, [body])
        self.assertEqual(self.budget.total, 6)
        self.proto.dataReceived(b"cd")
        self.assertEqual(self.proto.frames[1:], [b"abcd"])
        self.assertEqual((self.budget.total, len(self.budget)), (0, 0))

    def test_whole_frames_cost_no_accounting(self):
        self.proto.dataReceived(frame(b"abcd") * 100)
        self.assertEqual(len(self.proto.frames), 100)
        self.assertEqual(len(self.budget), 0)

    def test_trickled_bytes_are_coalesced(self):
        """A frame sent a byte at a time is held in few objects."""
        body = b"\x07" * (256 << 10)
        data = frame(body)
        for i in range(len(data) - 1):
            self.proto.dataReceived(data[i:i + 1])
        self.assertEqual(self.budget.total, len(data) - 1)
        self.assertLessEqual(len(self.proto._pieces), (256 << 10) // (16 << 10))
        self.proto.dataReceived(data[-1:])
        self.assertEqual(self.proto.frames, [body])
        self.assertEqual(self.budget.total, 0)

    def test_connection_lost_releases(self):
        self.proto.dataReceived(frame(b"x" * 4000)[:1000])
        self.proto.connectionLost(Failure(ConnectionLost()))
        self.assertEqual((self.budget.total, len(self.budget)), (0, 0))

    def test_out_of_budget_resets_and_drops_the_frame(self):
        self.budget.max_bytes = 10_000
        self.proto.dataReceived(header(20_000) + b"x" * 9_000)
        self.assertEqual(self.proto.exhausted, [])
        self.proto.dataReceived(b"x" * 2_000)
        self.assertEqual(self.proto.exhausted, [11_004])
        self.assertTrue(self.transport.disconnected)
        self.assertEqual((self.proto.buffered, self.budget.total), (0, 0))
        self.proto.dataReceived(b"x" * 20_000)       # nothing more is read
        self.assertEqual((self.proto.frames, self.budget.total), ([], 0))


def _decode_frames(data):
    packets, pos = [], 0
    while pos + 4 <= len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        packets.append(elvin_packets.decode(data[pos + 4:pos + 4 + length]))
        pos += 4 + length
    return packets


class RouterBudgetTests(unittest.TestCase):
    """Client channels of a router: the pre-ConnRqst cap and eviction."""

    def setUp(self):
        self.clock = Clock()
        self.router = Router()
        self.budget = receive_budget_of(self.router)
        self.factory = ElvinServerFactory(self.router, self.clock)

    def channel(self):
        proto = self.factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport

    def connected(self, options=None):
        proto, transport = self.channel()
        proto.dataReceived(frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0, options or {}))))
        self.assertIsInstance(_decode_frames(transport.value())[-1], elvin_packets.ConnRply)
        transport.clear()
        return proto, transport

    def test_pre_connect_cap(self):
        proto, transport = self.channel()
        self.assertEqual(proto.max_frame_length, PRE_CONNECT_MAX_PACKET)
        proto.dataReceived(header(PRE_CONNECT_MAX_PACKET + 4))
        self.assertTrue(transport.disconnected)
        # At the cap is fine; after ConnRqst the negotiated length applies.
        proto, transport = self.channel()
        proto.dataReceived(header(PRE_CONNECT_MAX_PACKET) + b"\0" * 100)
        self.assertFalse(transport.disconnected)
        proto, transport = self.connected({"Packet.Max-Length": 4 << 20})
        self.assertEqual(proto.max_frame_length, 4 << 20)
        proto.dataReceived(header(3 << 20) + b"\0" * 1000)
        self.assertFalse(transport.disconnected)
        self.assertEqual(self.budget.held_by(proto), 1004)

    def test_largest_holder_reset_bystanders_served(self):
        self.budget.max_bytes = 1 << 20
        bystander, bystander_io = self.channel()               # not connected yet
        bystander.dataReceived(frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0, {})))[:20])
        client, client_io = self.connected()
        attackers = [self.connected({"Packet.Max-Length": 4 << 20}) for _ in range(2)]
        big, big_io = attackers[0]
        big.dataReceived(header(2 << 20) + b"\0" * (600 << 10))
        other, other_io = attackers[1]
        other.dataReceived(header(2 << 20) + b"\0" * (300 << 10))
        self.assertEqual(self.budget.total, 20 + 4 + (600 << 10) + 4 + (300 << 10))
        other.dataReceived(b"\0" * (200 << 10))                # over 1 MiB
        self.assertTrue(big_io.disconnected)
        self.assertEqual(self.budget.closes, 1)
        self.assertEqual(self.budget.closed_bytes, 4 + (600 << 10))
        self.assertEqual(big.session.end_cause,
                         "router-wide receive memory (max-receive-memory) exhausted")
        for transport in (other_io, bystander_io, client_io):
            self.assertFalse(transport.disconnected)
        # The connected bystander is answered; the other finishes connecting.
        client.dataReceived(frame(elvin_packets.encode(elvin_packets.TestConn())))
        self.assertIsInstance(_decode_frames(client_io.value())[-1], elvin_packets.ConfConn)
        bystander.dataReceived(frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0, {})))[20:])
        self.assertIsInstance(_decode_frames(bystander_io.value())[-1], elvin_packets.ConnRply)
        self.assertEqual(self.budget.total, 4 + (500 << 10))

    def test_logged_and_counted_in_status_and_metrics(self):
        self.budget.max_bytes = 100_000
        proto, transport = self.connected()
        proto.dataReceived(header(200_000) + b"\0" * 50_000)
        status = snapshot(self.router)
        self.assertEqual(status["totals"]["receive_buffered_bytes"], 50_004)
        logged = []
        globalLogPublisher.addObserver(logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, logged.append)
        proto.dataReceived(b"\0" * 60_000)
        self.assertTrue(transport.disconnected)
        lines = [formatEvent(e) for e in logged if "max-receive-memory" in formatEvent(e)]
        self.assertEqual(lines, [
            "resetting connection from 192.168.1.1:54321: it held 110004 bytes of an "
            "unfinished packet when the router-wide receive memory (max-receive-memory, "
            "100000 bytes) ran out"])
        status = snapshot(self.router)
        self.assertEqual(status["totals"]["receive_budget_closes"], 1)
        text = generate_latest(registry_for(lambda: snapshot(self.router))).decode()
        self.assertIn("elvin_receive_budget_closes_total 1.0", text)
        self.assertIn("elvin_receive_buffered_bytes 0.0", text)

    def test_bystander_round_trip_in_memory(self):
        """A client over iosim, with the budget exhausted meanwhile by another
        connection: its TestConn is still answered."""
        self.budget.max_bytes = 256 << 10
        conn = Connection(ElvinURI("elvin://router.test:2917"), self.clock)
        server = self.factory.buildProtocol(None)
        client = _ClientFactory(conn).buildProtocol(None)
        pump = connect(server, makeFakeServer(server), client, makeFakeClient(client))
        pump.flush()
        handshake = conn._handshake({}, None, None)
        pump.flush()
        self.successResultOf(handshake)
        attacker, attacker_io = self.connected({"Packet.Max-Length": 1 << 20})
        attacker.dataReceived(header(1 << 20) + b"\0" * (300 << 10))
        self.assertTrue(attacker_io.disconnected)
        tested = conn.test_connection()
        pump.flush()
        self.successResultOf(tested)


class TransportsTests(unittest.TestCase):
    """Federation links and HTTP tunnel bodies count against the same budget."""

    def test_federation_link_counts(self):
        router = Router()
        clock = Clock()
        manager = FederationManager(router, "here.test", [FederationClass("P", hosts=["*"])],
                                    None, clock)
        proto = FederationProtocol(manager, False, None, keepalive=0)
        transport = StringTransport()
        proto.makeConnection(transport)
        budget = receive_budget_of(router)
        self.assertIs(proto.receive_budget, budget)
        budget.max_bytes = 100_000
        # Up first: before its handshake a link takes no frame over 64 KiB.
        from elvin.federation import packets as fed_packets
        hello = elvin_packets.encode(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        proto.dataReceived(struct.pack(">I", len(hello)) + hello)
        proto.dataReceived(header(1 << 20) + b"\0" * 120_000)
        self.assertTrue(transport.disconnected)
        self.assertEqual((budget.closes, budget.total), (1, 0))
        proto.connectionLost(None)
        manager.shutdown()

    def test_http_request_body_counts(self):
        router = Router()
        budget = receive_budget_of(router)
        budget.max_bytes = 300_000
        site = ElvinHTTPSite(ElvinServerFactory(router, Clock()), clock=Clock())
        site.timeOut = None

        def post(length, sent):
            channel = site.buildProtocol(None)
            transport = StringTransport()
            channel.makeConnection(transport)
            channel.dataReceived(b"POST /elvin/session HTTP/1.1\r\nHost: x\r\n"
                                 b"Content-Length: %d\r\n\r\n" % length + b"x" * sent)
            return channel, transport

        small, small_io = post(1_000, 10)
        big, big_io = post(1_000_000, 200_000)
        self.assertEqual(budget.total, 200_010)
        other, other_io = post(1_000_000, 150_000)
        self.assertTrue(big_io.disconnected)
        self.assertFalse(small_io.disconnected or other_io.disconnected)
        self.assertEqual((budget.closes, budget.total), (1, 150_010))
        for channel in (big, other):
            channel.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(budget.total, 10)
        small.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(budget.total, 0)


class ConfigTests(unittest.TestCase):

    def test_parsed_and_applied(self):
        cfg = config.parse("max-receive-memory = 1048576\n")
        self.assertEqual(cfg.max_receive_memory, 1048576)
        self.assertEqual(config.parse("").max_receive_memory, DEFAULT_MAX_RECEIVE_MEMORY)
        options = tap.Options()
        options.router_config = cfg
        cfg.listen = []
        top = tap.makeService(options, reactor=MemoryReactorClock())
        self.assertEqual(receive_budget_of(top.router).max_bytes, 1048576)

    def test_errors_name_file_and_line(self):
        for value, says in (("-1", "at least 0"), ("lots", "must be an integer")):
            with self.assertRaises(config.ConfigError) as caught:
                config.parse(f"verbose = no\nmax-receive-memory = {value}\n", "router.conf")
            self.assertIn("router.conf:2:", str(caught.exception))
            self.assertIn("max-receive-memory", str(caught.exception))
            self.assertIn(says, str(caught.exception))
