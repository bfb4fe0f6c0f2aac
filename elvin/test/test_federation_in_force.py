"""A subscription is in force at the linked peers when its SubRply arrives
(docs/federation.md), and pull filters are kept one subscription at a time
(``filters.LocalInterest``) instead of from every subscription's tree; a
link acknowledges what it reads at once, so a peer's Ack is not held by
its Nagle's algorithm."""

import socket

from hypothesis import given, settings, strategies as st
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial import unittest

from elvin.core.router import Router
from elvin.federation import filters
from elvin.federation import packets as fed_packets
from elvin.federation.link import FederationLink
from elvin.federation.manager import FederationClass, FederationManager
from elvin.protocols import packets
from elvin.protocols.server import ElvinServerFactory
from elvin.subscription import parse
from elvin.subscription.analysis import required_names
from elvin.test.test_federation import (FederationTestCase, FedRouter, _LinkOutput,
                                         subscribe_then_publish)
from elvin.test.test_server_protocol import frame as _frame, unframe


def _packets(transport):
    """The packets written to ``transport`` since the last call."""
    found = unframe(transport.value())
    transport.clear()
    return found


class _Linked:
    """One linked peer (its packets kept, no sockets) and clients on the
    router's own server protocol over in-memory transports."""

    wait = 2.0

    def setUp(self):
        wait = self.wait
        self.clock = Clock()
        self.router = Router()
        fed_class = FederationClass("Peer", hosts=["peer.test"])
        self.manager = FederationManager(self.router, "ours.test", [fed_class], None,
                                         self.clock, debounce=0.05, subscribe_wait=wait,
                                         mesh=False)
        self.peer = _LinkOutput()
        self.link = FederationLink(self.manager, self.peer, False, fed_class, "peer.test")
        self.link.start()
        self.link.packet_received(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        self.link.packet_received(fed_packets.FedSubReplace(2, filters.to_wire(filters.TRUE)))
        self.answer()
        self.factory = ElvinServerFactory(self.router, self.clock)

    def answer(self):
        """The peer acknowledges every FedSubReplace it was sent."""
        for packet in self.peer.sent:
            if isinstance(packet, fed_packets.FedSubReplace):
                self.link.packet_received(fed_packets.Ack(packet.xid))
        self.peer.sent.clear()

    def replaces(self):
        return [p for p in self.peer.sent if isinstance(p, fed_packets.FedSubReplace)]

    def client(self):
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(_frame(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY,
                                                      packets.Keys.EMPTY)))
        _packets(transport)
        self.addCleanup(protocol.connectionLost, None)
        return protocol, transport

    def subscribe(self, protocol, xid, expression):
        protocol.dataReceived(_frame(packets.SubAddRqst(xid, expression, True,
                                                        packets.Keys.EMPTY)))


class InForceTests(_Linked, unittest.TestCase):

    def test_reply_waits_for_the_peers_answer_and_what_follows_waits_behind_it(self):
        consumer, out = self.client()
        producer, _ = self.client()
        self.subscribe(consumer, 5, "x == 1")
        producer.dataReceived(_frame(packets.NotifyEmit({"x": 1}, True, packets.Keys.EMPTY)))
        self.assertEqual(_packets(out), [])             # held: neither reply nor delivery
        self.clock.advance(0)                           # next turn, not the 50 ms debounce
        (replace,) = self.replaces()
        self.assertTrue(filters.Filter(filters.from_wire(replace.pull_filter)).matches({"x": 1}))
        self.assertEqual(_packets(out), [])
        self.answer()
        reply, delivery = _packets(out)
        self.assertIsInstance(reply, packets.SubRply)
        self.assertEqual(reply.xid, 5)
        self.assertIsInstance(delivery, packets.NotifyDeliver)
        self.assertEqual(self.manager.wait_stats, {"waited": 1, "timed_out": 0})

    def test_a_subscription_the_filter_covers_is_answered_at_once(self):
        consumer, out = self.client()
        self.subscribe(consumer, 5, "x == 1")
        self.clock.advance(0)
        self.answer()
        _packets(out)
        self.subscribe(consumer, 6, "x == 1")           # the same tree: in the filter
        (reply,) = _packets(out)
        self.assertEqual(reply.xid, 6)
        self.assertEqual(self.manager.wait_stats["waited"], 1)

    def test_a_generalised_filter_covers_new_subscriptions(self):
        self.manager.max_filter_nodes = 10
        consumer, out = self.client()
        for i in range(5):
            self.subscribe(consumer, 10 + i, f"x == {i} && y > {i}")
        self.clock.advance(0)
        self.answer()
        self.assertEqual(len(_packets(out)), 5)
        self.assertEqual(str(self.link.sent_filter), "require(x) && require(y)")
        self.subscribe(consumer, 20, "x == 99 && y > 3")
        self.assertEqual([p.xid for p in _packets(out)], [20])
        self.assertEqual(self.replaces(), [])

    def test_a_silent_peer_holds_the_reply_no_longer_than_the_wait(self):
        consumer, out = self.client()
        self.subscribe(consumer, 5, "x == 1")
        self.clock.advance(0)
        self.clock.advance(1.9)
        self.assertEqual(_packets(out), [])
        self.clock.advance(0.2)
        (reply,) = _packets(out)
        self.assertEqual(reply.xid, 5)
        self.assertEqual(self.manager.wait_stats, {"waited": 1, "timed_out": 1})

    def test_a_link_going_down_releases_the_reply(self):
        consumer, out = self.client()
        self.subscribe(consumer, 5, "x == 1")
        self.clock.advance(0)
        self.link.connection_lost("gone")
        reply, warning = _packets(out)     # and the link may have lost some (DropWarn)
        self.assertEqual(reply.xid, 5)
        self.assertIsInstance(warning, packets.DropWarn)

    def test_a_nack_releases_the_reply(self):
        consumer, out = self.client()
        self.subscribe(consumer, 5, "x == 1")
        self.clock.advance(0)
        (replace,) = self.replaces()
        self.link.packet_received(packets.Nack(replace.xid, 1001, "no", ()))
        (reply,) = _packets(out)
        self.assertEqual(reply.xid, 5)

    def test_a_changed_expression_waits_and_a_key_change_does_not(self):
        consumer, out = self.client()
        self.subscribe(consumer, 5, "x == 1")
        self.clock.advance(0)
        self.answer()
        (reply,) = _packets(out)
        sub_id = reply.subscription_id
        consumer.dataReceived(_frame(packets.SubModRqst(6, sub_id, "x == 2", True,
                                                        packets.Keys.EMPTY,
                                                        packets.Keys.EMPTY)))
        self.assertEqual(_packets(out), [])
        self.clock.advance(0)
        self.answer()
        self.assertEqual([p.xid for p in _packets(out)], [6])
        consumer.dataReceived(_frame(packets.SubModRqst(7, sub_id, "", False,
                                                        packets.Keys.EMPTY,
                                                        packets.Keys.EMPTY)))
        self.assertEqual([p.xid for p in _packets(out)], [7])

    def test_removing_does_not_wait(self):
        consumer, out = self.client()
        self.subscribe(consumer, 5, "x == 1")
        self.clock.advance(0)
        self.answer()
        (reply,) = _packets(out)
        consumer.dataReceived(_frame(packets.SubDelRqst(6, reply.subscription_id)))
        (removed,) = _packets(out)
        self.assertEqual(removed.xid, 6)


class NoWaitTests(_Linked, unittest.TestCase):
    """``Federation.Filter.Wait 0``: the reply goes at once."""

    wait = 0

    def test_reply_goes_at_once(self):
        consumer, out = self.client()
        self.subscribe(consumer, 5, "x == 1")
        (reply,) = _packets(out)
        self.assertEqual(reply.xid, 5)
        self.assertEqual(self.manager.wait_stats["waited"], 0)



class HoldTests(unittest.TestCase):
    """The channel's hold: frames keep their order and the queue's rules."""

    def setUp(self):
        self.router = Router()
        self.protocol = ElvinServerFactory(self.router, Clock()).buildProtocol(None)
        self.transport = StringTransport()
        self.protocol.makeConnection(self.transport)
        self.addCleanup(self.protocol.connectionLost, None)

    def test_held_frames_go_in_order_on_the_last_release(self):
        p = self.protocol
        p.send_encoded(b"a", False)
        self.assertTrue(p.hold())
        self.assertTrue(p.hold())
        p.send_encoded(b"b", False)
        p.send_encoded(b"c", True)
        p.release()
        self.assertEqual(self.transport.value(), _frame_bytes(b"a"))
        p.release()
        self.assertEqual(self.transport.value(), b"".join(map(_frame_bytes, (b"a", b"b", b"c"))))

    def held_with_a(self):
        """The channel held, one frame (``a``) waiting."""
        p = self.protocol
        p.hold()
        p.send_encoded(b"a", False)
        return p

    def test_a_paused_transport_keeps_them_after_the_release(self):
        p = self.held_with_a()
        p.pauseProducing()
        p.release()
        self.assertEqual(self.transport.value(), b"")
        p.resumeProducing()
        self.assertEqual(self.transport.value(), _frame_bytes(b"a"))

    def test_a_resume_while_held_does_not_write(self):
        p = self.held_with_a()
        p.pauseProducing()
        p.resumeProducing()
        self.assertEqual(self.transport.value(), b"")
        p.release()
        self.assertEqual(self.transport.value(), _frame_bytes(b"a"))

    def test_a_close_waits_for_the_release(self):
        p = self.held_with_a()
        p.close()
        self.assertFalse(self.transport.disconnecting)
        p.release()
        self.assertEqual(self.transport.value(), _frame_bytes(b"a"))
        self.assertTrue(self.transport.disconnecting)


def _frame_bytes(data):
    """``data`` framed as the channel writes it."""
    return len(data).to_bytes(4, "big") + data


_NAMES = st.sampled_from(["a", "b", "c", "d"])
_TREES = st.builds(lambda n, m, v, op: parse(f"{n} {op} {v}" if m is None
                                             else f"{n} {op} {v} && {m} > 0"),
                   _NAMES, st.none() | _NAMES, st.integers(0, 5),
                   st.sampled_from(["==", ">", "<"]))


class LocalInterestTests(unittest.TestCase):
    """Kept one subscription at a time, the filter says what ``generalise``
    over every tree says, at every size limit."""

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 12), st.none() | _TREES), max_size=40),
           st.lists(_TREES, max_size=2), st.sampled_from([3, 8, 20, 2000]))
    def test_same_filter_as_from_every_tree(self, steps, peers, max_nodes):
        local = filters.LocalInterest()
        current = {}
        for key, tree in steps:
            if tree is None:
                local.remove(key)
                current.pop(key, None)
            else:
                local.add(key, required_names(tree), lambda t=tree: t)
                current[key] = tree
            built = filters.build_pull_filter(local, peers, filters.TRUE, max_nodes,
                                              lambda: iter(current.items()))
            trees = list(current.values()) + peers
            if local._exact is None:
                # trees dropped past the limit (kept again at half as many):
                # the filter is then the widened one, never narrower
                expected = filters._generalise(None, [filters.requirement(t) for t in trees],
                                               max_nodes)
            else:
                expected = filters.generalise(trees, max_nodes)
            self.assertEqual(filters.top_disjuncts(built), filters.top_disjuncts(expected))
            for key, tree in current.items():
                # built from them, so it covers each in a form covers() knows
                self.assertTrue(filters.covers(filters.top_disjuncts(built),
                                               local.tree_of(key), local.requirement_of(key)))

    def test_trees_are_dropped_past_the_limit_and_kept_again_at_half(self):
        local = filters.LocalInterest()
        trees = {i: parse(f"x == {i}") for i in range(10)}
        for key, tree in trees.items():
            local.add(key, {"x"}, lambda t=tree: t)
        again = lambda: iter(list(trees.items()))     # noqa: E731
        self.assertIsNone(local.exact_trees(12, again))
        self.assertIsNone(local.tree_of(0))
        for key in range(6):
            local.remove(key)
            del trees[key]
        self.assertEqual(sorted(map(str, local.exact_trees(12, again))),
                         sorted(str(t) for t in trees.values()))
        self.assertEqual(local.requirements, {parse("require(x)"): 4})

    def test_subscription_required_names_match_the_tree(self):
        from elvin.subscription.expression import Subscription
        for text in ('s1 == "a" && i1 >= 3 && i1 < 9', 'x > 1 || y > 2', "require(q)",
                     's1 == "b" && i1 >= 4 && i1 < 10'):
            sub = Subscription(text)
            self.assertEqual(set(sub.required_names()), set(required_names(parse(text))))
            sub.compact()
            self.assertEqual(set(sub.required_names()), set(required_names(parse(text))))


class _RecordingSocket(socket.socket):
    """A TCP socket that keeps the options set on it (never connected)."""

    def __init__(self):
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.options = []

    def setsockopt(self, *args):
        self.options.append(args)


class _SocketTransport(StringTransport):
    def __init__(self, sock):
        super().__init__()
        self.sock = sock

    def getHandle(self):
        return self.sock


class QuickAckTests(unittest.TestCase):
    def test_every_read_acknowledges_at_once(self):
        if not hasattr(socket, "TCP_QUICKACK"):
            raise unittest.SkipTest("no TCP_QUICKACK here (Linux only)")
        from elvin.federation.protocol import AcceptorFactory
        manager = FederationManager(Router(), "ours.test", [], None, Clock(), mesh=False)
        sock = _RecordingSocket()
        self.addCleanup(sock.close)
        protocol = AcceptorFactory(manager, keepalive=0).buildProtocol(None)
        protocol.makeConnection(_SocketTransport(sock))
        self.addCleanup(protocol.connectionLost, None)
        quick = (socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        before = sock.options.count(quick)
        protocol.dataReceived(b"\0\0")
        protocol.dataReceived(b"\0\0")
        self.assertEqual(sock.options.count(quick) - before, 2)

    def test_the_socket_is_found_under_tls(self):
        from elvin.federation.protocol import _tcp_socket
        sock = _RecordingSocket()
        self.addCleanup(sock.close)

        class Tls:
            transport = _SocketTransport(sock)

            def getHandle(self):
                return object()         # an OpenSSL connection, not a socket
        self.assertIs(_tcp_socket(Tls()), sock)
        self.assertIsNone(_tcp_socket(StringTransport()))


class PairTests(FederationTestCase):
    """Real routers on 127.0.0.1: subscribe at one, publish at the other at
    once, without waiting for the filters to settle."""

    @defer.inlineCallbacks
    def setUp(self):
        super().setUp()
        self.a = FedRouter(self, "a.test", mesh=False)
        self.b = FedRouter(self, "b.test", mesh=False)
        self.b.manager.debounce = 0.5       # the race the wait removes, made wide
        self.a.manager.debounce = 0.5
        yield self.a.link_to(self.b)

    def test_first_notification_after_the_reply_arrives(self):
        return subscribe_then_publish(self, self.b, self.a)


class ChainTests(FederationTestCase):
    """a - b - c: subscribe at c, publish at a at once. b sends a its new
    filter in the turn after c's arrives (no debounce), ahead of the
    client's reply and publication."""

    @defer.inlineCallbacks
    def setUp(self):
        super().setUp()
        self.a = FedRouter(self, "a.test", mesh=False)
        self.b = FedRouter(self, "b.test", mesh=False)
        self.c = FedRouter(self, "c.test", mesh=False)
        for router in self.a, self.b, self.c:
            router.manager.debounce = 0.5
        yield self.a.link_to(self.b)
        yield self.c.link_to(self.b)

    def test_first_notification_after_the_reply_arrives_two_hops_away(self):
        return subscribe_then_publish(self, self.c, self.a)

