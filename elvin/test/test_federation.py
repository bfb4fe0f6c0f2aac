"""Federation: real routers linked on 127.0.0.1."""

import glob
import json
import os
import struct
from types import SimpleNamespace

from twisted.internet import defer, endpoints, reactor
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.test import iosim
from twisted.trial import unittest

from elvin import client, errors
from elvin.federation import filters
from elvin.federation import packets as fed_packets
from elvin.federation import protocol as fedproto
from elvin.federation.link import FederationLink
from elvin.federation.manager import FederationClass, FederationManager
from elvin.federation.protocol import (AcceptorFactory, ConnectorFactory, connector_service,
                                       parse_ewaf)
from elvin.protocols import packets
from elvin.federation.trace import TraceWriter, notification_digest
from elvin.protocols.server import ElvinServerFactory
from elvin.core.router import Router
from elvin.subscription import parse
from elvin.uri import ElvinURI, InvalidURIError
from elvin.test.test_integration import wait_until
from elvin.test.places import REPO, free_port


class FedRouter:
    """One router with a client port and a federation port."""

    def __init__(self, test, domain, fed_class=None, trace_dir=None, mesh=True,
                 mesh_interval=30.0):
        self.domain = domain
        self.router = Router()
        self.fed_class = fed_class or FederationClass("Default", hosts=["127.0.0.1"])
        trace = TraceWriter(trace_dir, domain) if trace_dir else None
        self.manager = FederationManager(self.router, domain, [self.fed_class], None,
                                         reactor, debounce=0.01, trace=trace, mesh=mesh,
                                         mesh_interval=mesh_interval)
        self.client_port = reactor.listenTCP(0, ElvinServerFactory(self.router, reactor),
                                             interface="127.0.0.1")
        self.fed_port = reactor.listenTCP(0, AcceptorFactory(self.manager, keepalive=0),
                                          interface="127.0.0.1")
        self.uri = f"elvin://127.0.0.1:{self.client_port.getHost().port}"
        self.connectors = []
        test.addCleanup(self.stop)

    @defer.inlineCallbacks
    def link_to(self, other):
        """Dial ``other``'s federation port; fires when the link is up."""
        endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1",
                                                other.fed_port.getHost().port)
        proto = yield endpoint.connect(ConnectorFactory(self.manager, self.fed_class, 0))
        self.connectors.append(proto)
        yield wait_until(lambda: any(l.peer_domain == other.domain for l in self.manager.links)
                         and any(l.peer_domain == self.domain for l in other.manager.links))
        return proto

    def link(self, domain):
        return next(l for l in self.manager.links if l.peer_domain == domain)

    def kill(self):
        """Die at once, as a killed process does: every connection reset."""
        for link in list(self.manager.links):
            if link.output.transport is not None:
                link.output.transport.abortConnection()
        for proto in self.connectors:
            if proto.transport is not None:
                proto.transport.abortConnection()
        for session in list(self.router.sessions):
            transport = getattr(session.output, "transport", None)
            if transport is not None:
                transport.abortConnection()
        return self.stop()

    @defer.inlineCallbacks
    def stop(self):
        yield self.manager.shutdown()
        for proto in self.connectors:
            if proto.transport is not None:
                proto.transport.abortConnection()
        yield self.client_port.stopListening()
        yield self.fed_port.stopListening()


class FederationTestCase(unittest.TestCase):
    timeout = 30

    def setUp(self):
        self.connections = []

    @defer.inlineCallbacks
    def tearDown(self):
        for conn in self.connections:
            if conn.protocol is not None and conn.protocol.transport is not None:
                conn.protocol.transport.abortConnection()
        yield defer.DeferredList([c.disconnected for c in self.connections])

    @defer.inlineCallbacks
    def connect(self, fed_router):
        conn = yield client.connect(fed_router.uri)
        self.connections.append(conn)
        return conn

    @defer.inlineCallbacks
    def settle(self, *routers):
        """Wait for pending filter updates to be sent and acknowledged."""
        def settled():
            for r in routers:
                call = r.manager._update_call
                if call is not None and call.active():
                    return False
                for link in r.manager.links:
                    if link.sent_filter is not link.acked_filter and link.sent_filter != link.acked_filter:
                        return False
            return True
        yield wait_until(settled)


@defer.inlineCallbacks
def subscribe_then_publish(test, at, publisher):
    """Subscribe ``x == i`` at router ``at`` and, as each SubRply arrives,
    publish ``{x: i}`` at ``publisher``; every one must arrive."""
    consumer = yield test.connect(at)
    producer = yield test.connect(publisher)
    got = []
    for i in range(3):
        yield consumer.subscribe(f"x == {i}", got.append)
        producer.notify({"x": i})
    yield wait_until(lambda: len(got) == 3)
    test.assertEqual(sorted(n["x"] for n in got), [0, 1, 2])


class ChainTests(FederationTestCase):
    @defer.inlineCallbacks
    def setUp(self):
        super().setUp()
        self.a = FedRouter(self, "a.test")
        self.b = FedRouter(self, "b.test")
        self.c = FedRouter(self, "c.test")
        yield self.a.link_to(self.b)
        yield self.c.link_to(self.b)

    @defer.inlineCallbacks
    def mesh_settled(self):
        """The three are mesh routers on their tree, filters answered."""
        yield self.settle(self.a, self.b, self.c)
        yield wait_until(lambda: all(link.mesh and r.manager.active(link)
                                     for r in (self.a, self.b, self.c)
                                     for link in r.manager.links))

    @defer.inlineCallbacks
    def test_subscribed_at_c_in_force_at_a_when_the_reply_arrives(self):
        """b holds its Ack of c's new filter until a answered the filter b
        then sends it (docs/federation.md)."""
        yield self.mesh_settled()
        yield subscribe_then_publish(self, self.c, self.a)

    @defer.inlineCallbacks
    def test_the_reply_waits_for_the_far_router(self):
        """a never answers b's filter: c's reply comes once b gave up on a
        (b's Filter.Wait), not before."""
        from elvin.federation import packets as fed_packets
        yield self.mesh_settled()
        self.b.manager.subscribe_wait = 0.5
        self.c.manager.subscribe_wait = 5
        link_ab = self.a.link("b.test")
        send = link_ab.output.send

        def no_acks(packet):
            if not isinstance(packet, fed_packets.Ack):
                send(packet)
        link_ab.output.send = no_acks
        consumer = yield self.connect(self.c)
        started = reactor.seconds()
        yield consumer.subscribe("x == 1", lambda n: None)
        self.assertGreaterEqual(reactor.seconds() - started, 0.45)
        self.assertEqual(self.b.manager.wait_stats["timed_out"], 1)
        self.assertEqual(self.c.manager.wait_stats["timed_out"], 0)

    @defer.inlineCallbacks
    def test_exactly_the_matching_subscribers_exactly_once(self):
        consumer = yield self.connect(self.c)
        bystander = yield self.connect(self.b)
        got, seen_b = [], []
        yield consumer.subscribe("x == 1", got.append)
        yield bystander.subscribe("y == 1", seen_b.append)
        yield self.settle(self.a, self.b, self.c)
        producer = yield self.connect(self.a)
        producer.notify({"x": 1})
        producer.notify({"x": 2})
        producer.notify({"y": 1})
        yield wait_until(lambda: got and seen_b)
        yield producer.test_connection()
        yield defer.succeed(None)
        self.assertEqual([n["x"] for n in got], [1])
        self.assertEqual([n["y"] for n in seen_b], [1])
        # a -> b carried only what b's side asked for: x == 1 and y == 1.
        self.assertEqual(self.a.link("b.test").stats["out"], 2)
        # b -> c carried only x == 1.
        self.assertEqual(self.b.link("c.test").stats["out"], 1)

    @defer.inlineCallbacks
    def test_filters_follow_subscriptions(self):
        consumer = yield self.connect(self.c)
        got = []
        sub = yield consumer.subscribe("x > 0", got.append)
        yield self.settle(self.a, self.b, self.c)
        link_ab = self.a.link("b.test")
        self.assertTrue(link_ab.remote_filter.matches({"x": 5}))
        yield sub.modify("x > 10")
        yield self.settle(self.a, self.b, self.c)
        self.assertFalse(link_ab.remote_filter.matches({"x": 5}))
        self.assertTrue(link_ab.remote_filter.matches({"x": 50}))
        yield sub.remove()
        yield self.settle(self.a, self.b, self.c)
        self.assertTrue(link_ab.remote_filter.is_false)
        producer = yield self.connect(self.a)
        producer.notify({"x": 50})
        yield producer.test_connection()
        self.assertEqual(link_ab.stats["out"], 0)

    @defer.inlineCallbacks
    def test_burst_of_changes_costs_one_replace(self):
        consumer = yield self.connect(self.c)
        yield self.settle(self.a, self.b, self.c)
        link_cb = self.c.link("b.test")
        before = link_cb._xids
        sent = []
        original = link_cb.send_filter

        def counting(tree):
            result = original(tree)
            if result:
                sent.append(tree)
            return result
        link_cb.send_filter = counting
        yield defer.gatherResults([consumer.subscribe(f"x == {i}", lambda n: None)
                                   for i in range(50)])
        yield self.settle(self.a, self.b, self.c)
        self.assertLessEqual(len(sent), 2)
        self.assertIs(link_cb._xids, before)


class StarTests(FederationTestCase):
    @defer.inlineCallbacks
    def test_leaf_to_leaf_through_hub_and_traces(self):
        trace_dir = self.mktemp()
        hub = FedRouter(self, "hub.test", trace_dir=os.path.join(trace_dir, "hub"))
        left = FedRouter(self, "left.test", trace_dir=os.path.join(trace_dir, "left"))
        right = FedRouter(self, "right.test", trace_dir=os.path.join(trace_dir, "right"))
        yield left.link_to(hub)
        yield right.link_to(hub)
        consumer = yield self.connect(right)
        got = []
        yield consumer.subscribe('topic == "news"', got.append)
        yield self.settle(hub, left, right)
        producer = yield self.connect(left)
        producer.notify({"topic": "news", "n": 1})
        producer.notify({"topic": "sport", "n": 2})
        yield wait_until(lambda: got)
        yield producer.test_connection()
        self.assertEqual([(n["topic"], n["n"]) for n in got], [("news", 1)])
        for r in (hub, left, right):
            r.manager.trace.flush()
        records = []
        for path in glob.glob(os.path.join(trace_dir, "*", "*.jsonl")):
            with open(path) as f:
                records.extend(json.loads(line) for line in f)
        digest = notification_digest({"topic": "news", "n": 1})
        hops = sorted((r["router"], r["event"]) for r in records if r.get("digest") == digest)
        self.assertIn(("left.test", "notify_forwarded"), hops)
        self.assertIn(("hub.test", "notify_received"), hops)
        self.assertIn(("hub.test", "notify_forwarded"), hops)
        self.assertIn(("right.test", "notify_received"), hops)
        forwarded = [r for r in records if r["router"] == "hub.test"
                     and r["event"] == "notify_forwarded" and r["digest"] == digest]
        self.assertEqual(forwarded[0]["routing"], ["left.test", "hub.test"])
        sport = notification_digest({"topic": "sport", "n": 2})
        self.assertIn(("left.test", "notify_suppressed_filter"),
                      [(r["router"], r["event"]) for r in records if r.get("digest") == sport])
        self.assertTrue(any(r["event"] == "link_up" for r in records))
        self.assertTrue(any(r["event"] == "subreplace_sent" for r in records))


class RejoinTests(FederationTestCase):
    @defer.inlineCallbacks
    def test_killed_and_restarted_router_rejoins(self):
        a = FedRouter(self, "a.test")
        b = FedRouter(self, "b.test")
        proto = yield a.link_to(b)
        consumer = yield self.connect(b)
        got = []
        yield consumer.subscribe("require(x)", got.append)
        yield self.settle(a, b)
        proto.transport.abortConnection()   # the link dies
        yield wait_until(lambda: not a.manager.links and not b.manager.links)
        yield a.link_to(b)                  # and is redialled
        yield self.settle(a, b)
        producer = yield self.connect(a)
        producer.notify({"x": 1})
        yield wait_until(lambda: got)
        self.assertEqual(len(got), 1)


class LoopTests(FederationTestCase):
    @defer.inlineCallbacks
    def test_triangle_is_stopped_by_routing_lists(self):
        a = FedRouter(self, "a.test")
        b = FedRouter(self, "b.test")
        c = FedRouter(self, "c.test")
        yield a.link_to(b)
        yield b.link_to(c)
        yield c.link_to(a)
        consumers = {}
        for r in (a, b, c):
            conn = yield self.connect(r)
            got = []
            yield conn.subscribe("require(x)", got.append)
            consumers[r.domain] = got
        yield self.settle(a, b, c)
        producer = yield self.connect(a)
        producer.notify({"x": 1})
        yield wait_until(lambda: all(consumers.values()))
        yield producer.test_connection()
        for r in (a, b, c):
            conn = yield self.connect(r)
            yield conn.test_connection()
        # Each router saw it at most twice (once per neighbour) and it stopped:
        # a sender never offers it to a router already in its routing list.
        def carried():
            return sum(l.stats["in"] for r in (a, b, c) for l in r.manager.links)
        before = carried()
        self.assertLessEqual(before, 4)
        for got in consumers.values():
            self.assertIn(len(got), (1, 2))
        yield self.settle(a, b, c)
        self.assertEqual(carried(), before)

    @defer.inlineCallbacks
    def linked_consumer(self):
        """b linked to a, a client of b subscribed to ``require(x)``: b's
        link to a, the client, and what it receives."""
        a = FedRouter(self, "a.test")
        b = FedRouter(self, "b.test")
        yield a.link_to(b)
        consumer = yield self.connect(b)
        got = []
        yield consumer.subscribe("require(x)", got.append)
        return b.link("a.test"), consumer, got

    @defer.inlineCallbacks
    def test_notification_with_own_domain_is_dropped(self):
        from elvin.federation import packets as fed_packets
        from elvin.protocols import packets
        link, consumer, got = yield self.linked_consumer()
        link.packet_received(fed_packets.FedNotify({"x": 1}, True, packets.Keys.EMPTY, ("a.test", "b.test")))
        link.packet_received(fed_packets.FedNotify({"x": 2}, True, packets.Keys.EMPTY, ("a.test",)))
        yield wait_until(lambda: got)
        yield consumer.test_connection()
        self.assertEqual([n["x"] for n in got], [2])
        self.assertEqual(link.stats["loops"], 1)


    @defer.inlineCallbacks
    def test_fednotify_repeating_an_attribute_name_is_dropped_and_the_link_kept(self):
        """7.3.3: a protocol error in a notification is ignored. A FedNotify
        naming an attribute twice is dropped (counted and traced as an
        import drop), not a violation ending the link."""
        from elvin.federation import packets as fed_packets
        from elvin.protocols import packets
        link, consumer, got = yield self.linked_consumer()
        good = packets.encode(fed_packets.FedNotify({"x": 1, "y": 7}, True, packets.Keys.EMPTY,
                                                    ("a.test",)))
        twice = good.replace(b"\0\0\0\x01y\0\0\0", b"\0\0\0\x01x\0\0\0")
        link.output.frameReceived(twice)
        link.output.frameReceived(good)
        yield wait_until(lambda: got)
        yield consumer.test_connection()
        self.assertEqual(got, [{"x": 1, "y": 7}])
        self.assertEqual(link.state, link.UP)
        self.assertEqual((link.stats["in"], link.stats["suppressed"]), (2, 1))
        # Not a FedNotify, or not yet up: still a violation.
        link.output.frameReceived(good[:4] + b"\0\0\0\x01" + good[4:])   # garbage
        self.assertEqual(link.state, link.CLOSED)

    @defer.inlineCallbacks
    def test_fednotify_with_more_keys_than_a_client_may_send_is_dropped_unhashed(self):
        """As a client's NotifyEmit: a FedNotify carrying more keys than
        Connection.Max-Keys is dropped at import (counted), its keys never
        hashed, and the link kept."""
        from elvin.core import keys as core_keys
        from elvin.federation import packets as fed_packets
        from elvin.protocols import packets
        link, consumer, got = yield self.linked_consumer()
        most = link._limits["Connection.Max-Keys"]
        hashed = []
        original = core_keys.KeyRing.from_wire
        self.patch(core_keys.KeyRing, "from_wire",
                   classmethod(lambda cls, wire, role: hashed.append(wire.key_count())
                               or original(wire, role)))
        bomb = packets.Keys({core_keys.SHA1_PRODUCER: [[bytes([i % 256, i // 256])
                                                        for i in range(most + 1)]]})
        link.packet_received(fed_packets.FedNotify({"x": 1}, True, bomb, ("a.test",)))
        link.packet_received(fed_packets.FedNotify({"x": 2}, True, packets.Keys.EMPTY,
                                                   ("a.test",)))
        yield wait_until(lambda: got)
        yield consumer.test_connection()
        self.assertEqual([n["x"] for n in got], [2])
        self.assertNotIn(most + 1, hashed)
        self.assertEqual(link.state, link.UP)
        self.assertEqual(link.stats["suppressed"], 1)

    @defer.inlineCallbacks
    def test_fednotify_holding_nul_is_a_violation_as_bad_utf8_is(self):
        """A string holding a NUL is not a string (client protocol 6.1.4):
        a FedNotify with one ends the link, as one with a string that is
        not UTF-8 does, and nothing of it is delivered."""
        from elvin.federation import packets as fed_packets
        from elvin.protocols import packets
        link, consumer, got = yield self.linked_consumer()
        data = packets.encode(fed_packets.FedNotify({"x": 1, "s": "a@b"}, True,
                                                    packets.Keys.EMPTY, ("a.test",)))
        link.output.frameReceived(data.replace(b"@", b"\0"))
        self.assertEqual(link.state, link.CLOSED)
        yield consumer.test_connection()
        self.assertEqual(got, [])


class RefusalTests(FederationTestCase):
    @defer.inlineCallbacks
    def test_same_domain_refused(self):
        a = FedRouter(self, "same.test")
        b = FedRouter(self, "same.test")
        endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", b.fed_port.getHost().port)
        proto = yield endpoint.connect(ConnectorFactory(a.manager, a.fed_class, 0))
        yield wait_until(lambda: proto.link.state == proto.link.CLOSED)
        self.assertEqual(a.manager.links, [])
        self.assertEqual(b.manager.links, [])

    @defer.inlineCallbacks
    def test_unknown_peer_refused(self):
        strict = FedRouter(self, "strict.test",
                           FederationClass("Partners", hosts=["partner.example.org"]))
        a = FedRouter(self, "a.test")
        endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1",
                                                strict.fed_port.getHost().port)
        proto = yield endpoint.connect(ConnectorFactory(a.manager, a.fed_class, 0))
        yield wait_until(lambda: proto.link.state == proto.link.CLOSED)
        self.assertEqual(strict.manager.links, [])

    @defer.inlineCallbacks
    def test_export_filter_limits_what_leaves(self):
        a = FedRouter(self, "a.test", FederationClass("Default", export_filter=parse("public == 1"),
                                                        hosts=["127.0.0.1"]))
        b = FedRouter(self, "b.test")
        yield a.link_to(b)
        consumer = yield self.connect(b)
        got = []
        yield consumer.subscribe("require(x)", got.append)
        yield self.settle(a, b)
        producer = yield self.connect(a)
        producer.notify({"x": 1})
        producer.notify({"x": 2, "public": 1})
        yield wait_until(lambda: got)
        yield producer.test_connection()
        self.assertEqual([n["x"] for n in got], [2])


class FilterUnitTests(unittest.TestCase):
    def test_wire_forms(self):
        self.assertIs(filters.from_wire(filters.to_wire(filters.TRUE)), filters.TRUE)
        self.assertIs(filters.from_wire(filters.to_wire(filters.FALSE)), filters.FALSE)
        tree = parse("x == 1")
        self.assertEqual(filters.from_wire(filters.to_wire(tree)), tree)

    def test_generalise_never_narrows(self):
        trees = [parse(f"x == {i} && y > {i}") for i in range(100)]
        general = filters.generalise(trees, 20)
        self.assertLessEqual(filters.node_count(general), 20)
        filt = filters.Filter(general)
        for i in range(100):
            self.assertTrue(filt.matches({"x": i, "y": i + 1}))

    def test_union_and_intersect(self):
        self.assertIs(filters.union([]), filters.FALSE)
        self.assertIs(filters.union([filters.TRUE, parse("x == 1")]), filters.TRUE)
        self.assertIs(filters.intersect(filters.TRUE, filters.FALSE), filters.FALSE)
        both = filters.Filter(filters.intersect(parse("x == 1"), parse("y == 2")))
        self.assertTrue(both.matches({"x": 1, "y": 2}))
        self.assertFalse(both.matches({"x": 1}))

    def test_ewaf_uris(self):
        self.assertEqual(parse_ewaf("ewaf://host").port, 2916)
        self.assertEqual(parse_ewaf("ewaf://host").version, (1, 0))
        self.assertEqual(parse_ewaf("ewaf://host:3000").port, 3000)
        self.assertEqual(parse_ewaf("ewaf:/secure/host:29160").protocol, ("ssl", "none", "xdr"))
        self.assertEqual(str(parse_ewaf("ewaf://host")), "ewaf:1.0/tcp,none,xdr/host:2916")
        self.assertEqual(repr(parse_ewaf("ewaf://[::1]:7")), "EwafURI('ewaf:1.0/tcp,none,xdr/[::1]:7')")
        self.assertEqual(parse_ewaf(str(parse_ewaf("ewaf://h;a=b"))), parse_ewaf("ewaf://h;a=b"))
        self.assertNotEqual(parse_ewaf("ewaf://h:2917"), ElvinURI("elvin://h:2917"))
        for bad in ("elvin://host", "ewaf://ho st", "ewaf:", "http://host"):
            self.assertRaises(InvalidURIError, parse_ewaf, bad)


class ConfigTests(FederationTestCase):
    def test_examples_load(self):
        from elvin.config import load
        root = os.path.join(REPO, "conf")
        paths = sorted(glob.glob(os.path.join(root, "federation-*.conf")))
        self.assertGreaterEqual(len(paths), 8)
        for path in paths:
            config = load(path)
            self.assertTrue(config.federation.enabled, path)

    def test_errors_name_file_and_line(self):
        from elvin.config import ConfigError, parse
        for text, fragment in [
            ("Federation.Connect[X] = http://host", ":1: bad federation URI"),
            ("\nFederation.Subscribe[X] = x ==", ":2: bad Federation.Subscribe[X] filter"),
            ("Federation.Bogus = 1", ":1: unknown federation setting"),
            ("Federation.Default-Class = Nope", "unknown class 'Nope'"),
        ]:
            with self.assertRaises(ConfigError) as cm:
                parse(text, "fed.conf")
            self.assertIn(fragment, str(cm.exception))
            self.assertIn("fed.conf", str(cm.exception))

    @defer.inlineCallbacks
    def test_pair_from_config_files(self):
        from elvin.config import parse
        from elvin.federation.service import FederationService
        from twisted.logger import formatEvent, globalLogPublisher
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        free = free_port()
        right_cfg = parse("Federation.Router-Name = right.test\n"
                          f"Federation.Listen = ewaf://127.0.0.1:{free}\n"
                          "Federation.Apply-Class[Peer] = 127.0.0.1\n"
                          "Federation.Provide[Peer] = require(ok)\n")
        right = Router()
        right_service = FederationService(right, right_cfg, reactor)
        right_service.startService()
        self.addCleanup(right_service.stopService)
        listener = list(right_service)[0]
        ports = []
        listener._waitingForPort.addCallback(lambda p: ports.append(p) or p)
        yield wait_until(lambda: ports)
        port = ports[0]
        left_cfg = parse("Federation.Router-Name = left.test\n"
                         f"Federation.Connect[Peer] = ewaf://127.0.0.1:{port.getHost().port}\n")
        left = Router()
        left_service = FederationService(left, left_cfg, reactor)
        left_service.startService()
        self.addCleanup(left_service.stopService)
        yield wait_until(lambda: left_service.manager.links and right_service.manager.links)
        self.assertEqual(left_service.manager.links[0].peer_domain, "right.test")
        self.assertEqual(right_service.manager.links[0].fed_class.name, "Peer")
        # Federation URIs are logged as what they are: ewaf:, never elvin:.
        text = "\n".join(formatEvent(e) for e in events)
        self.assertIn(f"ewaf:1.0/tcp,none,xdr/127.0.0.1:{port.getHost().port}", text)
        self.assertIn(f"ewaf:1.0/tcp,none,xdr/127.0.0.1:{free}", text)
        self.assertNotIn("elvin:1.0", text)


class _LinkOutput:
    """What a FederationLink writes, kept as packets (no sockets)."""

    def __init__(self):
        self.sent = []
        self.closed = False

    def send(self, packet):
        self.sent.append(packet)

    def send_encoded(self, data, droppable):
        from elvin.federation import packets as fed_packets
        self.sent.append(fed_packets.decode(data))
        return True

    def close(self):
        self.closed = True

    abort = close

    def is_tls(self):
        return False

    def peer_certificate(self):
        return None


class FederationKeyTests(unittest.TestCase):
    """A FedNotify carries the producer's keys as the producer gave them,
    as the Avis router sends and expects them (docs/federation.md), so
    key-restricted delivery works across an Avis link in both directions."""

    def setUp(self):
        from twisted.internet.task import Clock
        from elvin.federation import packets as fed_packets
        from elvin.federation.link import FederationLink
        from elvin.protocols import packets
        self.FP, self.P = fed_packets, packets
        self.router = Router()
        self.clock = Clock()
        fed_class = FederationClass("Peer", hosts=["peer.test"])
        self.manager = FederationManager(self.router, "ours.test", [fed_class], None,
                                         self.clock, debounce=0)
        self.out = _LinkOutput()
        self.link = FederationLink(self.manager, self.out, False, fed_class, "peer.test")
        self.link.start()
        self.link.packet_received(fed_packets.FedConnRqst(1, 1, 0, "avis.test"))
        self.link.packet_received(fed_packets.FedSubReplace(2, filters.to_wire(filters.TRUE)))
        self.clock.advance(1)
        self.out.sent.clear()

    def client(self):
        from elvin.test.test_router import RecordingOutput
        out = RecordingOutput()
        session = self.router.open_session(out, "client")
        session.packet_received(self.P.ConnRqst(1, 4, 0, {}, self.P.Keys.EMPTY,
                                                self.P.Keys.EMPTY))
        out.take()
        return session, out

    def test_incoming_raw_producer_key_is_prepared_here(self):
        from elvin.core import keys as key_schemes
        nfn_keys, sub_keys = key_schemes.producer_keys(b"secret")
        consumer, out = self.client()
        consumer.packet_received(self.P.SubAddRqst(2, "require(x)", False, sub_keys))
        out.take()
        self.link.packet_received(self.FP.FedNotify({"x": 1}, False, nfn_keys, ("avis.test",)))
        (delivery,) = out.take()
        (entry,) = consumer.subscriptions.values()
        self.assertEqual((tuple(delivery.secure_matches), tuple(delivery.insecure_matches)),
                         ((entry.id,), ()))

    def test_a_routing_list_without_the_senders_domain_gets_it(self):
        # EFP 6.2.4 has the sender add its domain; a peer that did not is
        # served, and the routers after us still see where it has been.
        routed = []
        self.manager.router.route = lambda *args, **kw: routed.append(kw["routing"])
        for routing in ((), ("other.test",), ("other.test", "avis.test")):
            self.link.packet_received(self.FP.FedNotify({"x": 1}, False, self.P.Keys.EMPTY,
                                                        routing))
        self.assertEqual(routed, [("avis.test",), ("other.test", "avis.test"),
                                  ("other.test", "avis.test")])
        self.link.packet_received(self.FP.FedNotify({"x": 1}, False, self.P.Keys.EMPTY,
                                                    ("ours.test",)))
        self.assertEqual((len(routed), self.link.stats["loops"]), (3, 1))

    def test_outgoing_fednotify_carries_the_producers_keys(self):
        from elvin.core import keys as key_schemes
        nfn_keys, _ = key_schemes.producer_keys(b"secret")
        conn_keys, _ = key_schemes.producer_keys(b"connection secret")
        producer, _ = self.client()
        producer.packet_received(self.P.SecRqst(3, conn_keys, self.P.Keys.EMPTY,
                                                self.P.Keys.EMPTY, self.P.Keys.EMPTY))
        producer.packet_received(self.P.NotifyEmit({"x": 1}, False, nfn_keys))
        (fed,) = [p for p in self.out.sent if isinstance(p, self.FP.FedNotify)]
        sent = {bytes(k) for _, sets in fed.keys.entries() for s in sets for k in s}
        self.assertEqual(sent, {b"secret", b"connection secret"})
        self.assertEqual(fed.routing, ("ours.test",))


class TraceQueueTests(unittest.TestCase):
    """The trace writer's queue is bounded: a disk that cannot keep up
    costs bounded memory, and what is dropped is counted."""

    @defer.inlineCallbacks
    def test_overflow_is_dropped_and_counted(self):
        import threading
        from types import SimpleNamespace
        gate = threading.Event()
        writer = TraceWriter(self.mktemp(), "ours.test", max_queued=3)
        real_open = writer._open

        def slow_open():
            gate.wait(10)     # the disk stalls while the first file opens
            real_open()
        writer._open = slow_open
        link = SimpleNamespace(peer_domain="peer.test", outgoing=True)
        writer.link(link, "link_up")          # taken by the writer thread
        deadline = 100
        while writer._lines and deadline:     # bounded: until the thread took it
            deadline -= 1
            threading.Event().wait(0.01)
        for _ in range(10):
            writer.link(link, "link_up")
        self.assertEqual((writer.records, writer.dropped_overflow), (4, 7))
        gate.set()
        yield writer.close()
        lines = sum(len(open(os.path.join(writer.directory, name)).readlines())
                    for name in os.listdir(writer.directory))
        self.assertEqual(lines, 4)

    @defer.inlineCallbacks
    def test_a_full_disk_loses_records_counted_and_writing_resumes(self):
        """ENOSPC part way through a batch: the records written whole
        count as written, the rest as lost (``dropped_error``), the file is
        cut back to its last whole record, the reason is logged, and once
        the disk takes writes again the writer goes on (it did not die)."""
        import errno
        said = []
        observer = lambda event: said.append(event)   # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        room = [10_000]

        class Disk:
            """A file on a disk with ``room[0]`` bytes left."""
            def __init__(self, raw):
                self.raw = raw

            def write(self, data):
                if room[0] <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                n = min(len(data), room[0])
                room[0] -= n
                return self.raw.write(bytes(data[:n]))

            def fileno(self):
                return self.raw.fileno()

            def close(self):
                self.raw.close()

        writer = TraceWriter(self.mktemp(), "ours.test")
        real_open = writer._open

        def open_on_disk():
            real_open()
            writer._file = Disk(writer._file)
        writer._open = open_on_disk
        link = SimpleNamespace(peer_domain="peer.test", outgoing=True)
        writer.link(link, "link_up")
        writer.flush()
        one = os.path.getsize(os.path.join(writer.directory, os.listdir(writer.directory)[0]))
        room[0] = int(2.5 * one)                # two records and a half fit
        for _ in range(5):
            writer.link(link, "link_up")
        writer.flush()
        self.assertEqual((writer.written, writer.dropped_error), (3, 3))
        room[0] = 10 ** 6                       # space freed
        for _ in range(4):
            writer.link(link, "link_down", reason="shutdown")
        writer.flush()
        self.assertTrue(writer._thread.is_alive())
        self.assertEqual((writer.records, writer.written, writer.dropped_error), (10, 7, 3))
        yield writer.close()
        (name,) = os.listdir(writer.directory)
        text = open(os.path.join(writer.directory, name), encoding="utf-8").read()
        self.assertTrue(text.endswith("\n"))
        self.assertEqual([json.loads(line)["event"] for line in text.splitlines()],
                         ["link_up"] * 3 + ["link_down"] * 4)
        texts = [formatEvent(e) for e in said if "trace writer" in (e.get("log_format") or "")]
        self.assertTrue(any("No space left on device" in t and "3 so far" in t
                            for t in texts), texts)
        self.assertTrue(any("writing again; 3 records were lost" in t for t in texts), texts)

    @defer.inlineCallbacks
    def test_close_does_not_block_while_the_disk_stalls(self):
        import threading
        from types import SimpleNamespace
        gate = threading.Event()
        writer = TraceWriter(self.mktemp(), "ours.test")
        real_open = writer._open

        def stalled_open():
            gate.wait(10)
            real_open()
        writer._open = stalled_open
        link = SimpleNamespace(peer_domain="peer.test", outgoing=True)
        writer.link(link, "link_up")
        closed = writer.close()               # returns at once, not after 10 s
        self.assertNoResult(closed)
        gate.set()
        yield closed
        self.assertFalse(writer._thread.is_alive())
        names = os.listdir(writer.directory)
        self.assertEqual(len(names), 1)
        self.assertIn('"link_up"', open(os.path.join(writer.directory, names[0])).read())

    @defer.inlineCallbacks
    def test_close_fires_after_the_thread_has_ended(self):
        """Whoever waits on close() (a shutdown) finds no writer thread
        left: the thread is slow to return after it asks the reactor to
        fire, and the Deferred still waits for it."""
        import threading
        from twisted.internet import reactor

        class SlowToReturn:
            def callFromThread(self, f, *args):
                reactor.callFromThread(f, *args)
                threading.Event().wait(0.3)   # the thread is not done yet

        writer = TraceWriter(self.mktemp(), "ours.test", reactor=SlowToReturn())
        yield writer.close()
        self.assertFalse(writer._thread.is_alive())


# -- the handshake, redials and link classes, in memory -------------------------------

class _ScriptedPeer(Protocol):
    """A raw federation peer (over iosim) that answers a FedConnRqst as
    ``plan`` says: ``good``, ``nack``, ``wrong_xid``, ``own_domain``
    (ours.test), ``empty``, ``hangup`` or ``stall`` (never). It answers
    TestConn with ConfConn, and can send any packet itself."""

    def __init__(self, plan="good"):
        self.plan = plan
        self.buffer = b""
        self.received = []

    def dataReceived(self, data):
        self.buffer += data
        while len(self.buffer) >= 4:
            (length,) = struct.unpack_from(">I", self.buffer)
            if len(self.buffer) < 4 + length:
                return
            frame, self.buffer = self.buffer[4:4 + length], self.buffer[4 + length:]
            packet = fed_packets.decode(frame)
            self.received.append(packet)
            self.answer(packet)

    def send(self, packet):
        data = packets.encode(packet)
        self.transport.write(struct.pack(">I", len(data)) + data)

    def answer(self, packet):
        if isinstance(packet, packets.TestConn):
            self.send(packets.ConfConn())
        if not isinstance(packet, fed_packets.FedConnRqst):
            return
        xid, plan = packet.xid, self.plan
        if plan == "nack":
            self.send(packets.Nack(xid, errors.AUTHZ_FAIL, "go away", ()))
        elif plan == "wrong_xid":
            self.send(fed_packets.FedConnRply(xid + 1, "peer.test"))
        elif plan == "own_domain":
            self.send(fed_packets.FedConnRply(xid, "ours.test"))
        elif plan == "empty":
            self.send(fed_packets.FedConnRply(xid, ""))
        elif plan == "hangup":
            self.transport.loseConnection()
        elif plan == "good":
            self.send(fed_packets.FedConnRply(xid, "peer.test"))

    def kinds(self):
        return [type(p).__name__ for p in self.received]


class _ScriptedEndpoint:
    """A client endpoint whose every connect reaches a new ``_ScriptedPeer``
    with the next of ``plans``, over an iosim pump of ``net``."""

    def __init__(self, net, plans):
        self.net = net
        self.plans = iter(plans)
        self.attempts = []
        self.peers = []

    def connect(self, factory):
        self.attempts.append(self.net.clock.seconds())
        peer = _ScriptedPeer(next(self.plans))
        self.peers.append(peer)
        ours = factory.buildProtocol(None)
        self.net.pumps.append(iosim.connect(peer, iosim.makeFakeServer(peer), ours,
                                            iosim.makeFakeClient(ours), greet=False,
                                            clock=self.net.clock))
        return defer.succeed(ours)


class _Logged:
    def __init__(self, test):
        self.lines = []
        globalLogPublisher.addObserver(self)
        test.addCleanup(globalLogPublisher.removeObserver, self)

    def __call__(self, event):
        self.lines.append(formatEvent(event))

    def having(self, text):
        return [line for line in self.lines if text in line]


class RedialBackoffTests(unittest.TestCase):
    """docs/federation.md, "Links": every redial that brings no link up
    doubles the delay (1, 2, 4 ... 30 s, plus the jitter), whether the TCP
    connect failed or the peer refused us once connected; it starts again
    from 1 s once a link has come up."""

    JITTER = 0.25

    def setUp(self):
        from elvin.test.fednet import Net
        self.patch(fedproto, "random", SimpleNamespace(random=lambda: self.JITTER))
        self.net = Net()
        self.manager = FederationManager(Router(), "ours.test",
                                         [FederationClass("Peer", hosts=["*"])], None,
                                         self.net.clock, debounce=0.05)
        self.log = _Logged(self)

    def keep(self, plans):
        endpoint = _ScriptedEndpoint(self.net, plans)
        factory = ConnectorFactory(self.manager, self.manager.classes["Peer"], 5.0)
        service = connector_service(self.net.clock, endpoint, factory,
                                    initial_delay=0.5, max_delay=30.0, name="ewaf://peer")
        service.startService()

        def stop():
            stopped = service.stopService()
            self.net.flush()            # the link's transport closes
            return stopped
        self.addCleanup(stop)
        return endpoint

    def run_until(self, endpoint, attempts, limit=400.0):
        while len(endpoint.attempts) < attempts and self.net.clock.seconds() < limit:
            self.net.run(0.01)

    def expected(self, *steps):
        return [min(0.5 * 2 ** n, 30.0) + self.JITTER for n in steps]

    def assert_intervals(self, times, expected):
        intervals = [b - a for a, b in zip(times, times[1:])]
        self.assertEqual(len(intervals), len(expected), intervals)
        for got, want in zip(intervals, expected):
            # The clock moves in steps of 10 ms.
            self.assertLessEqual(abs(got - want), 0.025, (intervals, expected))

    def test_refusals_after_connecting_back_off_to_the_cap(self):
        refusals = ["nack", "wrong_xid", "own_domain", "empty", "hangup", "nack", "nack",
                    "nack"]
        endpoint = self.keep(refusals + ["good"])
        self.run_until(endpoint, len(refusals) + 1)
        self.assertEqual([peer.kinds()[:1] for peer in endpoint.peers],
                         [["FedConnRqst"]] * (len(refusals) + 1))
        # 1.25, 2.25, 4.25, 8.25, 16.25, then 30.25 (the cap) three times.
        self.assert_intervals(endpoint.attempts, self.expected(*range(1, 9)))
        self.net.run(0.1)
        (link,) = self.manager.links
        self.assertEqual(link.peer_domain, "peer.test")
        self.assertEqual(len(self.log.having("federation link up")), 1)   # the last one
        redials = self.log.having("federation: redialling ewaf://peer")
        self.assertEqual(len(redials), len(refusals))
        self.assertIn("(attempt 8 since a link was up)", redials[-1])
        self.assertEqual(self.log.having("Scheduling retry"), [])

    def test_the_delay_starts_again_once_a_link_was_up(self):
        endpoint = self.keep(["nack", "nack", "nack", "good", "nack", "nack"])
        self.run_until(endpoint, 4)
        self.net.run(0.1)
        self.assertEqual(len(self.manager.links), 1)
        endpoint.peers[-1].transport.loseConnection()      # the link drops
        self.run_until(endpoint, 6)
        times = endpoint.attempts
        self.assert_intervals(times[:4], self.expected(1, 2, 3))
        dropped_at = times[3] + 0.1
        self.assertLessEqual(abs(times[4] - dropped_at - self.expected(1)[0]), 0.025)
        self.assert_intervals(times[4:], self.expected(2))

    def test_a_handshake_that_never_ends_counts_as_a_failed_attempt(self):
        """The peer answers every probe but never FedConnRply: closed at
        the handshake timeout, then redialled after a growing delay."""
        endpoint = self.keep(["stall", "stall", "good"])
        self.run_until(endpoint, 3, limit=100.0)
        timeout = fedproto.HANDSHAKE_TIMEOUT
        self.assert_intervals(endpoint.attempts,
                              [timeout + d for d in self.expected(1, 2)])
        self.assertIn("TestConn", endpoint.peers[0].kinds())   # probed, answered
        self.assertEqual(len(self.log.having("no FedConnRply within 20 s; closing")), 2)


class HandshakeLivenessTests(unittest.TestCase):
    """docs/federation.md, "Liveness" and "Handshake timeout": TestConn is
    answered whatever the state of the link, both ways; a handshake not
    done within HANDSHAKE_TIMEOUT closes the connection; a silent one is
    closed sooner by the liveness rule."""

    def setUp(self):
        self.router = Router()
        self.clock = Clock()
        self.fed_class = FederationClass("Peer", hosts=["*"])
        self.manager = FederationManager(self.router, "ours.test", [self.fed_class], None,
                                         self.clock, debounce=0)
        self.log = _Logged(self)

    def test_testconn_before_fedconnrqst_is_answered(self):
        out = _LinkOutput()
        link = FederationLink(self.manager, out, False, self.fed_class, "10.0.0.7")
        link.start()
        link.packet_received(packets.TestConn())
        link.packet_received(packets.ConfConn())
        self.assertEqual(out.sent, [packets.ConfConn()])
        self.assertEqual((link.state, out.closed), (link.AWAITING_REQUEST, False))
        link.packet_received(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        self.assertIsInstance(out.sent[1], fed_packets.FedConnRply)
        self.assertEqual(link.state, link.UP)

    def test_testconn_before_fedconnrply_is_answered(self):
        out = _LinkOutput()
        link = FederationLink(self.manager, out, True, self.fed_class, "10.0.0.9")
        link.start()
        (request,) = out.sent
        link.packet_received(packets.TestConn())
        link.packet_received(packets.ConfConn())
        self.assertEqual(out.sent[1:], [packets.ConfConn()])
        self.assertEqual((link.state, out.closed), (link.CONNECTING, False))
        link.packet_received(fed_packets.FedConnRply(request.xid, "peer.test"))
        self.assertEqual(link.state, link.UP)

    def test_a_disconn_before_fedconnrply_is_logged_with_its_reason(self):
        from twisted.logger import formatEvent, globalLogPublisher
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        out = _LinkOutput()
        link = FederationLink(self.manager, out, True, self.fed_class, "10.0.0.9")
        link.start()
        link.packet_received(packets.Disconn(4, "Unexpected FedConnRqst"))
        self.assertTrue(out.closed)
        logged = "\n".join(formatEvent(e) for e in events)
        self.assertIn("federation peer 10.0.0.9 disconnected before the link was up: "
                      "reason 4: Unexpected FedConnRqst", logged)

    def test_a_disconn_on_an_established_link_is_logged_with_its_text(self):
        out = _LinkOutput()
        link = FederationLink(self.manager, out, False, self.fed_class, "10.0.0.7")
        link.start()
        link.packet_received(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        self.assertEqual(link.state, link.UP)
        link.packet_received(packets.Disconn(4, "Remote server domain was not in "
                                                "FedNotify routing list"))
        self.assertTrue(out.closed)
        self.assertEqual(len(self.log.having(
            "federation peer peer.test disconnected (reason 4: Remote server domain was "
            "not in FedNotify routing list)")), 1)

    def accepted(self, peer, keepalive=5.0):
        """``peer`` connected to our federation listener (iosim, our clock)."""
        ours = AcceptorFactory(self.manager, keepalive).buildProtocol(None)
        pump = iosim.connect(ours, iosim.makeFakeServer(ours), peer,
                             iosim.makeFakeClient(peer), greet=False, clock=self.clock)
        return ours, pump

    def play(self, pump, seconds, step=0.05):
        for _ in range(round(seconds / step)):
            self.clock.advance(step)
            pump.flush()

    def test_a_connection_that_sends_nothing_is_probed_then_closed(self):
        peer = Protocol()
        peer.received = b""
        peer.dataReceived = lambda data: setattr(peer, "received", peer.received + data)
        ours, pump = self.accepted(peer)
        self.play(pump, 4.9)
        self.assertEqual(peer.received, b"")
        self.play(pump, 0.2)
        self.assertEqual(fed_packets.decode(peer.received[4:]), packets.TestConn())
        self.play(pump, 4.7)
        self.assertIsNotNone(ours.transport)
        self.play(pump, 0.3)                  # silent for 2 keepalives: closed
        self.assertTrue(pump.serverIO.disconnected)
        self.assertEqual(len(self.log.having("is silent; closing")), 1)

    def test_a_frame_too_long_before_the_handshake_is_named(self):
        peer = Protocol()
        ours, pump = self.accepted(peer)
        peer.transport.write(struct.pack(">I", 70_000))      # a 70,000-byte FedConnRqst
        self.play(pump, 0.2)
        self.assertTrue(pump.serverIO.disconnected)
        self.assertEqual(len(self.log.having(
            "a frame of 70000 bytes, over the 65536 bytes allowed before the link is up")), 1)

    def test_probes_do_not_stand_in_for_the_handshake(self):
        """A peer that answers and sends probes but no FedConnRqst is closed
        at the handshake timeout, not sooner."""
        for keepalive in (5.0, 0.0):
            peer = _ScriptedPeer("stall")
            ours, pump = self.accepted(peer, keepalive)
            for _ in range(19):
                peer.send(packets.TestConn())
                self.play(pump, 1.0)
            self.assertFalse(pump.serverIO.disconnected)
            self.assertEqual(peer.kinds().count("ConfConn"), 19)
            self.play(pump, 1.05)
            self.assertTrue(pump.serverIO.disconnected, keepalive)
        self.assertEqual(len(self.log.having("no FedConnRqst within 20 s; closing")), 2)
        self.assertEqual(self.manager.links, [])

    def test_before_the_handshake_only_handshake_packets_are_decoded(self):
        """Anyone who can open the port could send a 16 MiB FedSubReplace
        first: it is refused by its packet id, undecoded, and a frame
        longer than MAX_HANDSHAKE_LENGTH is refused by its header."""
        from elvin.subscription import parse as parse_expression
        decoded = []
        self.patch(fedproto.fed_packets, "decode",
                   lambda data, *a, _d=fed_packets.decode: decoded.append(data) or _d(data, *a))
        peer = _ScriptedPeer("stall")
        ours, pump = self.accepted(peer, keepalive=0.0)
        peer.send(fed_packets.FedSubReplace(1, parse_expression("a == 1")))
        self.play(pump, 0.1)
        self.assertTrue(pump.serverIO.disconnected)
        self.assertEqual(decoded, [])
        self.assertEqual(len(self.log.having("before the handshake is done")), 1)
        peer = _ScriptedPeer("stall")
        ours, pump = self.accepted(peer, keepalive=0.0)
        peer.transport.write(struct.pack(">I", fed_packets.MAX_HANDSHAKE_LENGTH + 4))
        self.play(pump, 0.1)
        self.assertTrue(pump.serverIO.disconnected)
        # Once up, the full length and every packet.
        peer = _ScriptedPeer()
        ours, pump = self.accepted(peer, keepalive=0.0)
        peer.send(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        self.play(pump, 0.1)
        self.assertEqual(ours.max_frame_length, fed_packets.MAX_PACKET_LENGTH)

    def peer_taking_everything(self):
        """A scripted peer linked to us (no keepalive) whose filter takes
        every notification: (peer, our protocol, pump, our link)."""
        peer = _ScriptedPeer()
        ours, pump = self.accepted(peer, keepalive=0.0)
        peer.send(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        peer.send(fed_packets.FedSubReplace(2, filters.to_wire(filters.TRUE)))
        self.play(pump, 0.1)
        (link,) = self.manager.links
        return peer, ours, pump, link

    def test_losses_are_logged_and_outlive_the_link(self):
        """A peer that does not read: each notification its full queue
        refuses is counted (overload) and logged at most once per 10 s;
        what was queued when the link went is counted (unsent); the
        router-wide totals (``losses``) keep both after the link is gone."""
        _, ours, _, link = self.peer_taking_everything()
        full = [False]
        real = ours.send_encoded
        ours.send_encoded = lambda data, droppable: (
            False if full[0] else real(data, droppable))
        ours.queue.push(b"\0" * 8, True)          # one still queued when the link goes
        full[0] = True
        for n in range(3):
            self.router.route({"n": n}, True)
        self.assertEqual(link.stats["overload"], 3)
        (line,) = self.log.having("a notification not forwarded")
        self.assertIn("send queue is full", line)
        ours.connectionLost(None)
        self.assertEqual(link.stats["unsent"], 1)
        self.assertEqual((self.manager.losses()["overload"], self.manager.losses()["unsent"]),
                         (3, 1))
        (down,) = self.log.having("federation link down")
        self.assertIn("notifications lost: overload 3, unsent 1", down)

    def test_out_counts_what_was_queued_and_out_less_unsent_what_was_written(self):
        """``out`` counts a FedNotify as it is queued for the peer; those
        still queued when the link goes are counted again as ``unsent``, so
        ``out - unsent`` were written to the socket (docs/federation.md,
        "Losses on a link"), as the metric's help text says."""
        from elvin.ops.metrics import registry_for
        from elvin.ops.status import snapshot
        peer, ours, pump, link = self.peer_taking_everything()
        for n in range(3):
            self.router.route({"n": n}, True)
        self.play(pump, 0.1)
        ours.pauseProducing()                     # as a full socket buffer does
        for n in range(3, 7):
            self.router.route({"n": n}, True)
        self.play(pump, 0.1)
        ours.connectionLost(None)
        written = [p for p in peer.received if isinstance(p, fed_packets.FedNotify)]
        self.assertEqual((link.stats["out"], link.stats["unsent"], len(written)), (7, 4, 3))
        self.assertEqual(link.stats["out"] - link.stats["unsent"], len(written))
        (family,) = [f for f in registry_for(lambda: snapshot(
            self.router, self.manager, started=0, domain="ours.test")).collect()
            if f.name == "elvin_federation_notifications"]
        self.assertIn("out: queued for the peer", family.documentation)
        self.assertIn("out - unsent were written", family.documentation)

    def test_queued_notifications_lost_with_a_silent_link_are_traced(self):
        """A peer gone silent is closed by the liveness rule: what its send
        queue still held (traced notify_forwarded, never written) is counted
        before the link goes down, so the link_down record, its log line
        and the totals all say how many (unsent)."""
        from elvin.federation.trace import NullTrace
        traced = []

        class Recording(NullTrace):
            def link(self, link, event, reason=None, unsent=0):
                traced.append((event, reason, unsent))
        self.manager.trace = Recording()
        peer = _ScriptedPeer()
        ours, pump = self.accepted(peer, keepalive=1.0)
        peer.send(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        self.play(pump, 0.1)
        (link,) = self.manager.links
        peer.dataReceived = lambda data: None          # silent from now on
        ours.queue.push(b"\0" * 8, True)
        ours.queue.push(b"\0" * 8, True)
        self.play(pump, 3.0)
        self.assertEqual(traced[-1], ("link_down", "liveness", 2))
        self.assertEqual((link.stats["unsent"], self.manager.losses()["unsent"]), (2, 2))
        (down,) = self.log.having("federation link down")
        self.assertIn("unsent 2", down)

    def test_a_link_that_came_up_has_no_handshake_timeout(self):
        peer = _ScriptedPeer()
        ours, pump = self.accepted(peer, keepalive=0.0)
        peer.send(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        self.play(pump, fedproto.HANDSHAKE_TIMEOUT * 2)
        self.assertFalse(pump.serverIO.disconnected)
        self.assertEqual([l.peer_domain for l in self.manager.links], ["peer.test"])
        self.assertIsNone(ours._handshake)


class MeshAdvertOnPlainLinkTests(unittest.TestCase):
    """docs/federation.md, "A link is what its peer's first filter says":
    a FedMeshAdvert on a link not marked mesh (plain, or before the
    peer's first filter) is ignored, counted and logged once a minute."""

    def setUp(self):
        self.router = Router()
        self.clock = Clock()
        self.fed_class = FederationClass("Peer", hosts=["*"])
        self.log = _Logged(self)

    def link(self, mesh=True):
        manager = FederationManager(self.router, "ours.test", [self.fed_class], None,
                                    self.clock, debounce=0, mesh=mesh)
        out = _LinkOutput()
        link = FederationLink(manager, out, False, self.fed_class, "10.0.0.7")
        link.start()
        link.packet_received(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        self.clock.advance(0.1)
        return manager, link, out

    @staticmethod
    def advert(sequence=1):
        return fed_packets.FedMeshAdvert("peer.test", 1, sequence, ["ours.test"])

    def test_a_plain_link_stays_plain(self):
        manager, link, out = self.link()
        link.packet_received(fed_packets.FedSubReplace(2, filters.to_wire(filters.TRUE)))
        self.clock.advance(0.1)
        self.assertIs(link.mesh, False)
        out.sent.clear()
        for sequence in range(1, 101):
            link.packet_received(self.advert(sequence))
            self.clock.advance(0.1)
        self.assertIs(link.mesh, False)
        self.assertEqual([p for p in out.sent if isinstance(p, fed_packets.FedMeshAdvert)], [])
        self.assertEqual(manager.mesh.adverts, {})
        self.assertNotIn("peer.test", manager.mesh.neighbours)
        self.assertIn("peer.test", manager.mesh.plain)
        self.assertEqual(link.stats["adverts_ignored"], 100)
        self.assertEqual(self.log.having("is a mesh link"), [])
        (line,) = self.log.having("ignored 1 mesh advert(s) from federation peer peer.test")
        self.assertIn("not a mesh link", line)
        self.clock.advance(60.0)
        link.packet_received(self.advert(101))
        self.assertEqual(len(self.log.having("ignored 100 mesh advert(s)")), 1)
        self.assertEqual(len(self.log.having("mesh advert(s)")), 2)

    def test_an_advert_before_the_first_filter_is_ignored(self):
        manager, link, out = self.link()
        link.packet_received(self.advert())
        self.assertIsNone(link.mesh)
        self.assertEqual((manager.mesh.adverts, link.stats["adverts_ignored"]), ({}, 1))
        self.assertEqual(len(self.log.having("its first pull filter has not arrived")), 1)
        # The first filter decides; later adverts are taken.
        marked = filters.with_marker(filters.TRUE, manager.mesh_marker)
        link.packet_received(fed_packets.FedSubReplace(2, filters.to_wire(marked)))
        self.assertIs(link.mesh, True)
        self.assertTrue(any(isinstance(p, fed_packets.FedMeshAdvert) for p in out.sent))
        link.packet_received(self.advert(2))
        self.assertEqual(list(manager.mesh.adverts), ["peer.test"])

    def mesh_link(self):
        manager, link, out = self.link()
        marked = filters.with_marker(filters.TRUE, manager.mesh_marker)
        link.packet_received(fed_packets.FedSubReplace(2, filters.to_wire(marked)))
        self.assertIs(link.mesh, True)
        return manager, link, out

    def test_what_a_mesh_peer_may_announce_is_bounded(self):
        """A mesh peer's adverts are held to MAX_ADVERT_NEIGHBOURS each and
        MAX_MESH_ROUTERS in all (100,000 neighbours an advert grew a router
        by 500 MB), and a flood of them computes the tree a few times a
        second, not once per advert."""
        from elvin.federation import manager as manager_module
        from elvin.federation.mesh import MAX_ADVERT_NEIGHBOURS, MAX_MESH_ROUTERS
        manager, link, out = self.mesh_link()
        many = [f"n{i}.test" for i in range(MAX_ADVERT_NEIGHBOURS + 1)]
        link.packet_received(fed_packets.FedMeshAdvert("wide.test", 1, 1, many))
        self.assertNotIn("wide.test", manager.mesh.adverts)
        self.assertEqual(link.stats["adverts_ignored"], 1)
        computed = []
        original = manager._mesh_changed
        manager._mesh_changed = lambda: computed.append(1) or original()
        for i in range(MAX_MESH_ROUTERS + 50):
            link.packet_received(fed_packets.FedMeshAdvert(f"r{i}.test", 1, 1, ["peer.test"]))
        self.assertEqual(len(manager.mesh.adverts), MAX_MESH_ROUTERS)
        self.assertEqual(len(computed), manager_module.MESH_RECOMPUTE_BURST)
        self.assertEqual(len(self.log.having("routers' adverts already")), 1)
        self.clock.advance(1.0)
        self.assertEqual(len(computed), manager_module.MESH_RECOMPUTE_BURST + 1)

    def test_a_router_without_mesh_ignores_adverts(self):
        manager, link, out = self.link(mesh=False)
        link.packet_received(fed_packets.FedSubReplace(2, filters.to_wire(filters.TRUE)))
        out.sent.clear()
        link.packet_received(self.advert())
        self.assertEqual((out.sent, link.stats["adverts_ignored"]), ([], 1))
        self.assertEqual(link.state, link.UP)


class LinkLossDropWarnTests(unittest.TestCase):
    """docs/federation.md, "Losses": a link that goes down without a
    closing handshake, or whose peer sends DropWarn, may have lost
    notifications for our subscribers; each connected local client with a
    subscription gets a DropWarn, counted and logged."""

    def setUp(self):
        from twisted.internet.testing import StringTransport
        self.router = Router()
        self.clock = Clock()
        self.fed_class = FederationClass("Peer", hosts=["*"])
        self.manager = FederationManager(self.router, "ours.test", [self.fed_class], None,
                                         self.clock, debounce=0, mesh=False)
        self.log = _Logged(self)
        factory = ElvinServerFactory(self.router, self.clock)
        self.transports = {}
        for name, subscribe in (("subscriber", True), ("idle", False)):
            proto = factory.buildProtocol(None)
            transport = self.transports[name] = StringTransport()
            proto.makeConnection(transport)
            data = packets.encode(packets.ConnRqst(1, 4, 0))
            proto.dataReceived(struct.pack(">I", len(data)) + data)
            if subscribe:
                data = packets.encode(packets.SubAddRqst(2, "require(x)", True,
                                                         packets.Keys.EMPTY))
                proto.dataReceived(struct.pack(">I", len(data)) + data)
        self.out = _LinkOutput()
        self.link = FederationLink(self.manager, self.out, False, self.fed_class, "10.0.0.7")
        self.link.start()
        self.link.packet_received(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
        self.manager.update_filters()
        self.assertIsNotNone(self.link.sent_filter)
        for transport in self.transports.values():
            transport.clear()

    def dropwarns(self, name):
        data = self.transports[name].value()
        found = []
        while data:
            (length,) = struct.unpack(">I", data[:4])
            found.append(packets.decode(data[4:4 + length]))
            data = data[4 + length:]
        return sum(type(p) is packets.DropWarn for p in found)

    def test_a_link_lost_warns_the_subscribers(self):
        self.link.connection_lost("connection_lost")
        self.assertEqual((self.dropwarns("subscriber"), self.dropwarns("idle")), (1, 0))
        self.assertEqual(self.manager.loss_dropwarns, 1)
        (down,) = self.log.having("federation link down")
        self.assertIn("DropWarn sent to 1 local subscribers", down)

    def test_a_closing_handshake_warns_nobody(self):
        self.link.packet_received(packets.Disconn(1, "shutdown"))
        self.assertEqual(self.dropwarns("subscriber"), 0)
        self.assertEqual(self.manager.loss_dropwarns, 0)

    def test_the_peers_dropwarn_is_passed_on(self):
        self.link.packet_received(packets.DropWarn())
        self.link.packet_received(packets.DropWarn())
        self.assertEqual((self.dropwarns("subscriber"), self.dropwarns("idle")), (2, 0))
        self.assertEqual(self.manager.loss_dropwarns, 2)
        self.assertEqual(len(self.log.having("dropped notifications for us")), 1)

    def test_a_link_asked_for_nothing_warns_nobody(self):
        self.link.sent_filter = filters.FALSE
        self.link.connection_lost("liveness")
        self.assertEqual(self.dropwarns("subscriber"), 0)


class LingeringCloseTests(unittest.TestCase):
    """A link the router closes while its peer is still sending lingers, as
    a client channel does (over real loopback sockets: an in-memory
    transport shows no reset): the peer reads everything written before
    the close, the Disconn last, then end of file, where closing with its
    input unread made our kernel reset the connection and the peer's
    throw away what it had not read."""

    TEST_CONNS = 2000

    def setUp(self):
        self.manager = FederationManager(Router(), "ours.test",
                                         [FederationClass("Peer", hosts=["*"])], None,
                                         reactor, debounce=0)
        self.addCleanup(self.manager.shutdown)
        port = reactor.listenTCP(0, AcceptorFactory(self.manager, keepalive=0),
                                 interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.port = port.getHost().port

    def peer(self):
        """A peer that asks for a link, then sends ConfConn for 0.5 s
        without reading, then reads to the end: (packets read, how it
        ended)."""
        import socket
        import time

        def run():
            sock = socket.create_connection(("127.0.0.1", self.port))
            sock.settimeout(2)
            try:
                data = packets.encode(fed_packets.FedConnRqst(1, 1, 0, "peer.test"))
                sock.sendall(struct.pack(">I", len(data)) + data)
                how = _send_unread(sock, 0.5)
                return _read_to_end(sock, how)
            finally:
                sock.close()
        from twisted.internet import threads
        return threads.deferToThread(run)

    @defer.inlineCallbacks
    def test_a_peer_still_sending_reads_all_it_was_written(self):
        done = self.peer()
        yield _links_up(self.manager, 2)
        (link,) = self.manager.links
        for _ in range(self.TEST_CONNS):
            link.output.send(packets.TestConn())
        link.close("shutdown")
        got, how = yield done
        self.assertEqual((sum(type(p) is packets.TestConn for p in got), how),
                         (self.TEST_CONNS, "eof"))
        self.assertIsInstance(got[0], fed_packets.FedConnRply)
        self.assertEqual(got[-1], packets.Disconn(1, "shutdown"))


class RemovedLinkCloseTests(unittest.TestCase):
    """A configured link a reload removes (its keeper stopped) is closed
    politely and lingering: the peer reads what was queued and a Disconn,
    then end of file, where ClientService alone dropped the connection
    with the peer's input unread (a reset); and the keeper's stop is
    bounded when the peer never reads."""

    def setUp(self):
        import socket
        self.manager = FederationManager(Router(), "ours.test",
                                         [FederationClass("Peer", hosts=["*"])], None,
                                         reactor, debounce=0)
        self.addCleanup(self.manager.shutdown)
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(1)
        self.server.settimeout(5)
        self.addCleanup(self.server.close)

    def keeper(self):
        factory = ConnectorFactory(self.manager, self.manager.classes["Peer"], keepalive=0)
        endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1",
                                                self.server.getsockname()[1])
        keeper = connector_service(reactor, endpoint, factory, name="ewaf://peer.test")
        keeper.startService()
        return keeper

    def peer(self, reads):
        """Accepts our link and brings it up, sends ConfConn for 0.3 s
        without reading, then (``reads``) reads to the end: (packets read,
        how it ended); else holds the socket unread until ``release``."""
        import threading
        import time
        self.release = threading.Event()

        def run():
            sock, _ = self.server.accept()
            sock.settimeout(3)
            try:
                header = sock.recv(4, socket_waitall())
                request = fed_packets.decode(sock.recv(struct.unpack(">I", header)[0],
                                                       socket_waitall()))
                reply = packets.encode(fed_packets.FedConnRply(request.xid, "peer.test"))
                sock.sendall(struct.pack(">I", len(reply)) + reply)
                how = _send_unread(sock, 0.3)
                if not reads:
                    self.release.wait(5)
                    return [], "unread"
                return _read_to_end(sock, how)
            finally:
                sock.close()
        from twisted.internet import threads
        return threads.deferToThread(run)

    @defer.inlineCallbacks
    def test_the_peer_reads_all_then_a_disconn_then_end_of_file(self):
        done = self.peer(reads=True)
        keeper = self.keeper()
        yield _links_up(self.manager, 3)
        (link,) = self.manager.links
        for _ in range(2000):
            link.output.send(packets.TestConn())
        said = []
        observer = lambda event: said.append(formatEvent(event))      # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        yield keeper.stopService()
        # The link's end is not followed by a redial, nor said to be.
        self.assertEqual([line for line in said if "redialling" in line], [])
        got, how = yield done
        self.assertEqual((sum(type(p) is packets.TestConn for p in got), how), (2000, "eof"))
        self.assertEqual(got[-1], packets.Disconn(1, "federation link removed"))
        self.assertFalse(keeper.running)
        self.assertEqual(self.manager.links, [])

    @defer.inlineCallbacks
    def test_stopping_is_bounded_when_the_peer_never_reads(self):
        self.patch(fedproto, "CLOSE_LINGER", 0.2)
        done = self.peer(reads=False)
        keeper = self.keeper()
        yield _links_up(self.manager, 3)
        (link,) = self.manager.links
        big = packets.Nack(1, 2001, "x" * 60_000, ())
        for _ in range(240):           # 14 MB: more than loopback's socket buffers
            link.output.send(big)
        started = reactor.seconds()
        try:
            yield keeper.stopService()
            self.assertLess(reactor.seconds() - started, 2.0)
            self.assertFalse(keeper.running)
        finally:
            self.release.set()
        yield done
        # What Twisted still held when the link was cut is counted (an
        # estimate in frames), where it went uncounted.
        self.assertGreaterEqual(link.stats["unsent"], 1)


def _links_up(manager, timeout):
    """A Deferred firing once ``manager`` has links and all are up."""
    return wait_until(lambda: manager.links and all(
        link.state == link.UP for link in manager.links), timeout=timeout)


def socket_waitall():
    import socket
    return socket.MSG_WAITALL


def _send_unread(sock, seconds):
    """Send ConfConns for ``seconds`` without reading: "eof" so far, or
    "reset" if sending failed."""
    import time
    conf = packets.encode(packets.ConfConn())
    conf = struct.pack(">I", len(conf)) + conf
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            sock.sendall(conf * 16)
            time.sleep(0.002)
    except OSError:                           # reset while sending
        return "reset"
    return "eof"


def _read_to_end(sock, how):
    """Read ``sock`` to its end: (the federation packets read, ``how``, or
    "reset" if reading failed)."""
    received = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    except OSError:
        how = "reset"
    got = []
    while len(received) >= 4:
        (length,) = struct.unpack(">I", received[:4])
        if len(received) < 4 + length:
            break
        got.append(fed_packets.decode(received[4:4 + length]))
        received = received[4 + length:]
    return got, how
