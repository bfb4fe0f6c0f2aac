"""A time slice per connection and reading turn (``max-turn-time``,
elvin.protocols.turns): past it the framing layer keeps the rest of a
connection's input, pauses reading it and goes on in a later reactor turn,
in order, so other connections are served in between. All in memory: a
Clock is the reactor, and a packet's cost is the time it adds to the
slice's own time (``Spent``: advancing the Clock from inside a packet
would run the reactor's next turn inside this one)."""

import struct

from prometheus_client import generate_latest
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial import unittest

from elvin.core.router import Router
from elvin.core.sendqueue import SendQueue
from elvin.federation.manager import FederationClass, FederationManager
from elvin.federation.protocol import FederationProtocol
from elvin.ops.metrics import registry_for
from elvin.ops.status import snapshot
from elvin.protocols import packets
from elvin.protocols.framing import SLICED, FramedProtocol, ReceiveBudget, frame
from elvin.protocols.output import QueuedFramedProtocol
from elvin.protocols.server import ElvinServerFactory
from elvin.protocols.turns import TurnSlice
from elvin.test.test_receive_budget import _decode_frames

#: The slice the tests use (seconds), and what each packet costs.
SLICE = 0.005
COST = 0.002


class ReactorClock(Clock):
    """A Clock whose ``turn`` runs only the calls due as it starts, as the
    reactor's own turn does: a ``callLater(0)`` made meanwhile waits for
    the next (``Clock.advance`` would run it at once)."""

    def turn(self):
        now = self.seconds()
        for call in [c for c in self.calls if c.getTime() <= now]:
            if call in self.calls:
                self.calls.remove(call)
                call.called = 1
                call.func(*call.args, **call.kw)


class Spent:
    """The time handling packets has taken: the TurnSlice's ``now``."""

    def __init__(self):
        self.seconds = 0.0

    def now(self):
        return self.seconds

    def spend(self, seconds=COST):
        self.seconds += seconds


class Costly(FramedProtocol):
    """Records each packet; each costs ``COST`` seconds of ``spent``."""

    def __init__(self, spent):
        super().__init__()
        self.spent = spent
        self.frames = []

    def frameReceived(self, data):
        self.frames.append(data)
        self.spent.spend()


class CostlyQueued(QueuedFramedProtocol):
    """The same with a send queue, registered as its transport's producer."""

    def __init__(self, spent):
        super().__init__()
        self.spent = spent
        self.frames = []
        self.queue = SendQueue(1 << 20, "oldest", b"")

    def connectionMade(self):
        self.registerAsProducer()

    def frameReceived(self, data):
        self.frames.append(data)
        self.writeOrQueue(b"re:" + data, False)
        self.spent.spend()


def packet(i):
    return struct.pack(">I", i)


def frames(first, count):
    return b"".join(frame(packet(i)) for i in range(first, first + count))


class Harness(unittest.TestCase):

    def connect(self, protocol_class=Costly, seconds=SLICE, budget=None):
        self.clock = ReactorClock()
        self.spent = Spent()
        self.turns = TurnSlice(seconds, self.clock, self.spent.now)
        proto = protocol_class(self.spent)
        proto.turn_slice = self.turns
        proto.receive_budget = budget
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport

    def run_turns(self, limit=100):
        """Run the reactor's later turns until none is due; how many ran."""
        for turn in range(limit):
            if not self.clock.getDelayedCalls():
                return turn
            self.clock.turn()
        self.fail("turns did not end")


class CutTurnTests(Harness):

    def test_cut_after_the_slice_rest_in_order_later(self):
        proto, transport = self.connect()
        proto.dataReceived(frames(0, 10))
        # 2 ms a packet: the third takes the turn past 5 ms.
        self.assertEqual(proto.frames, [packet(i) for i in range(3)])
        self.assertEqual(transport.producerState, "paused")
        self.assertEqual(proto.read_paused, {SLICED})
        self.assertEqual(proto.waiting, 7 * 8)
        self.assertEqual(self.turns.cuts, 1)
        self.clock.turn()
        self.assertEqual(proto.frames, [packet(i) for i in range(6)])
        self.assertEqual(transport.producerState, "paused")
        self.assertEqual(self.run_turns(), 2)
        self.assertEqual(proto.frames, [packet(i) for i in range(10)])
        self.assertEqual(transport.producerState, "producing")
        self.assertEqual((proto.read_paused, proto.waiting, self.turns.cuts), (set(), 0, 3))

    def test_a_turn_within_the_slice_is_not_cut(self):
        proto, transport = self.connect()
        proto.dataReceived(frames(0, 3))       # the last one ends past 5 ms: nothing after
        self.assertEqual(len(proto.frames), 3)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual((transport.producerState, self.turns.cuts), ("producing", 0))

    def test_zero_never_cuts(self):
        proto, transport = self.connect(seconds=0)
        proto.dataReceived(frames(0, 50))
        self.assertEqual(len(proto.frames), 50)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_input_read_meanwhile_waits_after_it(self):
        """TLS hands over a whole read's records, an HTTP tunnel its POSTs,
        while reading is paused: they wait after the cut turn's rest, and a
        packet split between reads is joined."""
        proto, transport = self.connect()
        data = frames(0, 10)
        proto.dataReceived(data[:-5])          # the last packet split
        self.assertEqual(len(proto.frames), 3)
        proto.dataReceived(data[-5:] + frames(10, 2)[:6])
        proto.dataReceived(frames(10, 2)[6:])
        self.assertEqual(len(proto.frames), 3)
        self.run_turns()
        self.assertEqual(proto.frames, [packet(i) for i in range(12)])
        self.assertEqual((proto.buffered, proto.waiting), (0, 0))
        self.assertEqual(transport.producerState, "producing")

    def test_each_later_turn_handles_a_packet_however_short_the_slice(self):
        proto, transport = self.connect(seconds=0.000001)
        proto.dataReceived(frames(0, 5))
        self.assertEqual(len(proto.frames), 1)
        self.assertEqual(self.run_turns(), 4)
        self.assertEqual(proto.frames, [packet(i) for i in range(5)])

    def test_a_packet_completed_by_a_read_counts_in_its_turn(self):
        proto, transport = self.connect()
        data = frames(0, 10)
        proto.dataReceived(data[:2])
        self.spent.spend(1)                     # an earlier turn's time is not this one's
        proto.dataReceived(data[2:])
        self.assertEqual(len(proto.frames), 3)
        self.run_turns()
        self.assertEqual(proto.frames, [packet(i) for i in range(10)])

    def test_a_reload_applies_from_the_next_turn(self):
        proto, transport = self.connect()
        proto.dataReceived(frames(0, 10))
        self.turns.seconds = 0
        self.clock.turn()
        self.assertEqual(len(proto.frames), 10)
        self.assertEqual(transport.producerState, "producing")

    def test_waiting_input_counts_against_the_receive_budget(self):
        budget = ReceiveBudget(10_000)
        proto, transport = self.connect(budget=budget)
        proto.dataReceived(frames(0, 10) + frame(packet(10))[:6])
        self.assertEqual(budget.held_by(proto), 7 * 8 + 6)
        self.run_turns()
        self.assertEqual((proto.buffered, budget.total), (6, 6))
        proto.dataReceived(frame(packet(10))[6:])
        self.assertEqual((len(proto.frames), budget.total), (11, 0))

    def test_out_of_budget_while_cut_drops_what_waits(self):
        budget = ReceiveBudget(100)
        proto, transport = self.connect(budget=budget)
        proto.dataReceived(frames(0, 10))
        proto.dataReceived(frames(10, 10))
        self.assertTrue(transport.disconnected)
        self.assertEqual((budget.closes, budget.total, proto.waiting), (1, 0, 0))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(len(proto.frames), 3)


class LostWhileCutTests(Harness):

    def test_connection_lost_cancels_the_continuation(self):
        budget = ReceiveBudget(10_000)
        proto, transport = self.connect(budget=budget)
        proto.dataReceived(frames(0, 10))
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        proto.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual((proto.waiting, budget.total), (0, 0))
        proto.dataReceived(frames(10, 1))
        self.clock.advance(1)
        self.assertEqual(len(proto.frames), 3)
        self.assertEqual(transport.producerState, "paused")   # never resumed

    def test_stopped_before_the_continuation_runs(self):
        """A channel aborted (a violation, a slow client) before its next
        turn handles nothing more and is not resumed."""
        proto, transport = self.connect(CostlyQueued)
        proto.dataReceived(frames(0, 10))
        proto.abort()
        self.clock.turn()
        self.assertEqual(len(proto.frames), 3)
        self.assertEqual(transport.producerState, "paused")

    def test_closed_while_cut_is_not_resumed(self):
        """A graceful close: what waits is still handled, but a transport
        that is disconnecting is not told to read again."""
        proto, transport = self.connect()
        proto.dataReceived(frames(0, 10))
        transport.loseConnection()
        self.run_turns()
        self.assertEqual(len(proto.frames), 10)
        self.assertEqual(transport.producerState, "paused")

    def test_a_raising_packet_in_a_later_turn_resets_the_connection(self):
        proto, transport = self.connect()
        proto.dataReceived(frames(0, 10))

        def boom(data):
            raise ValueError("broken")
        proto.frameReceived = boom
        self.clock.turn()
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)
        self.assertTrue(transport.disconnected)
        self.assertEqual((self.clock.getDelayedCalls(), proto.waiting), ([], 0))


class PauseReasonsTests(Harness):
    """Reading paused for a cut turn, and the transport pausing our
    writing (its write buffer full: QueuedFramedProtocol.pauseProducing),
    are separate: neither undoes the other."""

    def test_write_side_pause_survives_the_turn_ending(self):
        proto, transport = self.connect(CostlyQueued)
        self.assertIs(transport.producer, proto)
        proto.pauseProducing()                    # the write buffer is full
        proto.dataReceived(frames(0, 10))
        self.assertEqual(transport.producerState, "paused")
        self.run_turns()
        self.assertEqual(len(proto.frames), 10)
        self.assertEqual(transport.producerState, "producing")   # reading again
        self.assertTrue(proto.paused)                             # writing still paused
        self.assertEqual(transport.value(), b"")
        self.assertEqual(len(proto.queue), 10)
        proto.resumeProducing()
        self.assertEqual(len(proto.queue), 0)
        self.assertEqual(transport.value(), b"".join(frame(b"re:" + packet(i))
                                                     for i in range(10)))

    def test_write_side_resume_does_not_resume_reading(self):
        proto, transport = self.connect(CostlyQueued)
        proto.pauseProducing()
        proto.dataReceived(frames(0, 10))
        proto.resumeProducing()                   # the write buffer drained
        self.assertEqual(transport.producerState, "paused")
        self.assertFalse(proto.paused)
        self.run_turns()
        self.assertEqual(transport.producerState, "producing")

    def test_reading_paused_for_another_reason_stays_paused(self):
        proto, transport = self.connect()
        proto.pause_reading("other")
        self.assertEqual(transport.producerState, "paused")
        proto.dataReceived(frames(0, 10))
        self.run_turns()
        self.assertEqual(len(proto.frames), 10)
        self.assertEqual(proto.read_paused, {"other"})
        self.assertEqual(transport.producerState, "paused")
        proto.resume_reading("other")
        self.assertEqual(transport.producerState, "producing")

    def test_the_other_reason_ending_first_leaves_the_cut_turn_paused(self):
        proto, transport = self.connect()
        proto.dataReceived(frames(0, 10))
        proto.pause_reading("other")
        proto.resume_reading("other")
        self.assertEqual(transport.producerState, "paused")
        self.run_turns()
        self.assertEqual(transport.producerState, "producing")

    def test_a_tunnel_is_never_told_to_pause(self):
        """An HTTP tunnel's pauseProducing pauses our writing: its input
        waits without it."""
        from elvin.protocols.httptunnel import TunnelServerProtocol
        self.assertFalse(TunnelServerProtocol.reading_pausable)
        proto, transport = self.connect()
        proto.reading_pausable = False
        proto.dataReceived(frames(0, 10))
        self.assertEqual((transport.producerState, proto.read_paused), ("producing", {SLICED}))
        self.run_turns()
        self.assertEqual(len(proto.frames), 10)


class RouterTests(unittest.TestCase):
    """Client channels of one router on one fake reactor."""

    def setUp(self):
        self.clock = ReactorClock()
        self.spent = Spent()
        self.router = Router()
        self.router.turn_slice = TurnSlice(SLICE, self.clock, self.spent.now)
        self.factory = ElvinServerFactory(self.router, self.clock)
        self.events = []

    def connected(self, name):
        proto = self.factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        self.assertIs(proto.turn_slice, self.router.turn_slice)
        proto.dataReceived(frame(packets.encode(packets.ConnRqst(1, 4, 0, {}))))
        transport.clear()
        events = self.events

        def write(data):
            for reply in _decode_frames(data):
                events.append((name, reply))
        transport.write = write
        transport.writeSequence = lambda parts: write(b"".join(parts))
        return proto, transport

    def test_a_bystander_is_served_between_two_slices(self):
        attacker, attacker_io = self.connected("attacker")
        bystander, _ = self.connected("bystander")
        handle = attacker.frameReceived

        def costly(data):                 # each of its requests takes 2 ms
            handle(data)
            self.spent.spend()
        attacker.frameReceived = costly
        requests = b"".join(
            frame(packets.encode(packets.SubAddRqst(i, f"n == {i}", True))) for i in range(1, 11))
        # One reactor turn: the attacker's read, then the bystander's.
        attacker.dataReceived(requests)
        bystander.dataReceived(frame(packets.encode(packets.TestConn())))
        self.assertEqual(attacker_io.producerState, "paused")
        for _ in range(10):
            if not self.clock.getDelayedCalls():
                break
            self.clock.turn()
        who = [(name, type(reply).__name__) for name, reply in self.events]
        self.assertEqual(who, [("attacker", "SubRply")] * 3 + [("bystander", "ConfConn")]
                         + [("attacker", "SubRply")] * 7)
        self.assertEqual([reply.xid for name, reply in self.events if name == "attacker"],
                         list(range(1, 11)))
        self.assertEqual(attacker_io.producerState, "producing")
        self.assertEqual(snapshot(self.router)["totals"]["turns_sliced"], 3)
        text = generate_latest(registry_for(lambda: snapshot(self.router))).decode()
        self.assertIn("elvin_turns_sliced_total 3.0", text)

    def test_no_slice_without_the_routers(self):
        self.assertIsNone(Router().turn_slice)
        self.assertEqual(snapshot(Router())["totals"]["turns_sliced"], 0)


class FederationTests(unittest.TestCase):

    def test_a_link_is_cut_by_its_routers_slice(self):
        router = Router()
        clock = ReactorClock()
        spent = Spent()
        router.turn_slice = TurnSlice(SLICE, clock, spent.now)
        manager = FederationManager(router, "here.test", [FederationClass("P", hosts=["*"])],
                                    None, clock)
        proto = FederationProtocol(manager, False, None, keepalive=0, handshake_timeout=0)
        transport = StringTransport()
        proto.makeConnection(transport)
        self.assertIs(proto.turn_slice, router.turn_slice)
        seen = []

        def costly(data):
            seen.append(data)
            spent.spend()
        proto.frameReceived = costly
        proto.dataReceived(frames(0, 10))
        self.assertEqual((len(seen), transport.producerState), (3, "paused"))
        clock.turn()
        clock.turn()
        clock.turn()
        self.assertEqual(seen, [packet(i) for i in range(10)])
        self.assertEqual(transport.producerState, "producing")
        proto.connectionLost(None)
        manager.shutdown()
