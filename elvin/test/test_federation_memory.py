"""Federation in memory (elvin.test.fednet): duplicates and their trace
event, graceful stops, hung peers and their replacements, plain routers
in cycles, restarted routers. One fake clock, no sockets: deterministic."""

from twisted.trial import unittest

from elvin.federation import packets as fed_packets
from elvin.federation.mesh import notification_id
from elvin.protocols import packets
from elvin.test.fednet import Net


class RecordingTrace:
    """What a TraceWriter would be asked to write: (router, peer, event)."""

    enabled = True

    def __init__(self, domain, events):
        self.domain = domain
        self.events = events

    def notify(self, link, event, direction, attributes, routing, size):
        self.events.append((self.domain, link.peer_domain, event))

    def link(self, link, event, reason=None):
        self.events.append((self.domain, link.peer_domain, event))

    def subreplace(self, link, direction, tree):
        pass

    def close(self):
        return None


def ring(net, *names, **kwargs):
    routers = net.routers_named(*names, **kwargs)
    for x, y in zip(routers, routers[1:] + routers[:1]):
        net.link(x, y)
    net.run(3.0)
    return routers


class DuplicateTraceTests(unittest.TestCase):

    def test_a_mesh_duplicate_is_traced_as_such_not_as_a_loop(self):
        net = Net()
        a, b = net.routers_named("a.test", "b.test")
        net.link(a, b)
        net.run(1.0)
        events = []
        b.manager.trace = RecordingTrace("b.test", events)
        consumer = b.client()
        consumer.subscribe("require(n)")
        link = b.link("a.test")
        ident = notification_id("x.test", 1, 7)
        packet = fed_packets.FedNotify({"n": 1}, True, packets.Keys.EMPTY, (ident, "x.test", "a.test"))
        link.packet_received(packet)
        link.packet_received(packet)
        self.assertEqual(len(consumer.deliveries()), 1)
        drops = [e for e in events if e[2].startswith("notify_dropped")]
        self.assertEqual(drops, [("b.test", "a.test", "notify_dropped_duplicate")])
        self.assertEqual((link.stats["duplicates"], link.stats["loops"]), (1, 0))
        # Our own domain in the routing list is still a loop.
        link.packet_received(fed_packets.FedNotify({"n": 2}, True, packets.Keys.EMPTY,
                                          ("b.test", "a.test")))
        self.assertEqual(events[-1], ("b.test", "a.test", "notify_dropped_loop"))


class Stream:
    """A producer on ``router`` sending {"n": N} every ``period`` seconds of
    the net's clock."""

    def __init__(self, net, router, period=0.005):
        self.producer = router.client()
        self.net = net
        self.period = period
        self.sent = []
        self.due = net.clock.seconds() + period
        self.call = net.clock.callLater(period, self.tick)

    def tick(self):
        now = self.net.clock.seconds()
        while self.due <= now + 1e-9:
            n = len(self.sent)
            self.producer.notify({"n": n})
            self.sent.append(n)
            self.due += self.period
        self.call = self.net.clock.callLater(self.due - now, self.tick)

    def stop(self):
        self.call.cancel()


def ring_of_four_with_consumers(test, net):
    """a-b-c-d-a, a consumer of ``n`` on a, c and d. The tree: a-b, b-c,
    a-d (c-d idle), so a's stream reaches c through b."""
    routers = ring(net, "a.test", "b.test", "c.test", "d.test")
    test.assertEqual(net.trees()["b.test"], {"a.test", "c.test"})
    consumers = {r.domain: r.client() for r in routers if r.domain != "b.test"}
    for consumer in consumers.values():
        consumer.subscribe("require(n)")
    return routers, consumers


class StreamChecks:

    def check_stream(self, net, stream, consumers, during):
        during()
        net.run(2.0)
        stream.stop()
        net.run(1.0)
        for name, consumer in consumers.items():
            got = [d["n"] for d in consumer.deliveries()]
            self.assertEqual(len(got), len(set(got)), f"duplicates at {name}")
            self.assertEqual(sorted(got), stream.sent, f"lost at {name}")


class GracefulStopTests(StreamChecks, unittest.TestCase):

    def test_stopping_the_router_carrying_a_stream_loses_nothing(self):
        net = Net()
        (a, b, c, d), consumers = ring_of_four_with_consumers(self, net)
        net.run(0.5)
        stream = Stream(net, a)             # 200 a second
        net.run(0.5)
        stopped = []
        self.check_stream(net, stream, consumers,
                          lambda: b.stop().addCallback(stopped.append))
        self.assertEqual(len(stopped), 1)
        self.assertEqual(b.manager.links, [])
        self.assertEqual(net.trees()["c.test"], {"d.test"})
        self.assertGreaterEqual(len(stream.sent), 500)

    def test_a_kill_is_what_loses(self):
        """The same without leaving first loses what was in the gap (so the
        test above measures something)."""
        net = Net()
        a, b, c, d = ring(net, "a.test", "b.test", "c.test", "d.test")
        consumer = c.client()
        consumer.subscribe("require(n)")
        net.run(0.5)
        stream = Stream(net, a)
        net.run(0.5)
        b.router.shutdown()                 # closes its links at once
        net.run(2.0)
        stream.stop()
        net.run(1.0)
        got = [d["n"] for d in consumer.deliveries()]
        self.assertLess(len(got), len(stream.sent))

    def test_a_leaf_or_a_plain_router_stops_at_once(self):
        net = Net()
        a, b = net.routers_named("a.test", "b.test")
        plain = net.router("plain.test", mesh=False)
        net.link(a, b)
        net.link(plain, a)
        a.client().subscribe("require(n)")
        net.run(1.0)
        stopped = []
        plain.stop().addCallback(stopped.append)
        self.assertEqual(len(stopped), 1)
        # a asks b for what a's client wants: b waits until a has taken it
        # off its tree (after a's grace), not longer than grace + 3 s.
        b.stop().addCallback(stopped.append)
        net.run(0.5)
        self.assertEqual(len(stopped), 1)
        net.run(1.0)
        self.assertEqual(len(stopped), 2)
        self.assertEqual(b.manager.links, [])


class PlainRouterInACycleTests(unittest.TestCase):
    """A plain EFP 1.0 router (the Avis router; here ours with the mesh
    off, which behaves alike on the wire) linked to two mesh routers."""

    def setUp(self):
        self.net = net = Net()
        self.x, self.y = net.routers_named("x.test", "y.test")
        self.plain = net.router("avis.test", mesh=False)
        net.link(self.x, self.y)
        net.link(self.plain, self.x)
        net.link(self.plain, self.y)
        net.run(3.0)

    def test_one_of_its_links_is_idle_and_nothing_arrives_twice(self):
        net, x, y, plain = self.net, self.x, self.y, self.plain
        # Mesh links first, then plain ones in name order: avis-x is kept.
        self.assertEqual(net.trees()["x.test"], {"y.test", "avis.test"})
        self.assertEqual(net.trees()["y.test"], {"x.test"})
        self.assertFalse(y.manager.active(y.link("avis.test")))
        consumers = {r.domain: r.client() for r in (x, y, plain)}
        for consumer in consumers.values():
            consumer.subscribe("require(n)")
        net.run(0.5)
        for n, origin in enumerate((plain, x, y) * 20):
            origin.client().notify({"n": n})
        net.run(0.5)
        for name, consumer in consumers.items():
            got = sorted(d["n"] for d in consumer.deliveries())
            self.assertEqual(got, list(range(60)), name)

    def test_the_idle_link_takes_over_when_the_other_fails(self):
        net, x, y, plain = self.net, self.x, self.y, self.plain
        on_y = y.client()
        on_y.subscribe("require(n)")
        net.run(0.5)
        x.kill()
        net.run(1.0)
        self.assertEqual(net.trees()["y.test"], {"avis.test"})
        plain.client().notify({"n": 1})
        net.run(0.5)
        self.assertEqual(on_y.deliveries(), [{"n": 1}])


class RestartTests(unittest.TestCase):

    def test_a_restarted_router_delivers_nothing_twice_while_it_rejoins(self):
        net = Net()
        a, b, c, d = ring(net, "a.test", "b.test", "c.test", "d.test")
        consumers = {r.domain: r.client() for r in (a, c, d)}
        for consumer in consumers.values():
            consumer.subscribe("require(n)")
        net.run(0.5)
        stream = Stream(net, a)
        net.run(0.3)
        b.kill()
        net.run(1.0)
        b2 = net.router("b.test")
        on_b2 = b2.client()
        on_b2.subscribe("require(n)")
        # Its links come up before any filter has crossed them: until the
        # peer's first filter says what it is, a link carries nothing.
        at_link_up = []
        link_up = b2.manager.link_up

        def record(link):
            at_link_up.append((link.mesh, b2.manager.active(link)))
            link_up(link)
        b2.manager.link_up = record
        net.link(a, b2)
        net.link(b2, c)
        self.assertEqual(at_link_up, [(None, False), (None, False)])
        net.run(3.0)
        stream.stop()
        net.run(1.0)
        self.assertEqual(net.trees()["b.test"], {"a.test", "c.test"})
        for name, consumer in list(consumers.items()) + [("b2", on_b2)]:
            got = [n["n"] for n in consumer.deliveries()]
            self.assertEqual(len(got), len(set(got)), f"a duplicate at {name}")
        got_c = {n for n in stream.sent}
        self.assertTrue(got_c)


class HungPeerTests(unittest.TestCase):
    """A peer that stops answering (SIGSTOP): its bytes go nowhere."""

    def setUp(self):
        self.net = net = Net()
        self.a = net.router("a.test", keepalive=5.0)
        self.b = net.router("b.test", keepalive=5.0)
        self.pump = net.link(self.b, self.a)
        net.run(1.0)

    def test_found_within_two_keepalive_intervals_whatever_the_phase(self):
        for idle in (0.0, 2.5, 4.99):
            net = self.net
            if idle:
                net.run(idle)
            if not self.a.manager.links:
                self.pump = net.link(self.b, self.a)
                net.run(1.0)
            net.frozen.add(self.pump)
            hung_at = net.clock.seconds()
            while self.a.manager.links and net.clock.seconds() - hung_at < 20:
                net.run(0.1)
            self.assertEqual(self.a.manager.links, [])
            self.assertLessEqual(net.clock.seconds() - hung_at, 10.0 + 0.1)
            net.frozen.discard(self.pump)
            net.flush()

    def test_a_replacement_with_the_same_name_is_taken_once_the_old_is_silent(self):
        net, a = self.net, self.a
        net.frozen.add(self.pump)                 # b hangs
        net.run(2.0)
        b2 = net.router("b.test", keepalive=5.0)  # a new b, same name
        net.link(b2, a)
        self.assertEqual(len(a.manager.links), 1)  # refused: the old one may be alive
        self.assertIsNot(a.manager.links[0].output, None)
        net.run(4.0)                               # past one interval: a probe unanswered
        net.link(b2, a)
        net.run(0.5)
        (link,) = a.manager.links
        self.assertEqual(link.peer_domain, "b.test")
        self.assertEqual(b2.manager.links[0].peer_domain, "a.test")
        consumer = b2.client()
        consumer.subscribe("require(n)")
        net.run(0.5)
        a.client().notify({"n": 1})
        net.run(0.1)
        self.assertEqual(consumer.deliveries(), [{"n": 1}])


class QuietPeerTests(unittest.TestCase):

    def test_an_idle_peer_that_answers_probes_keeps_its_link(self):
        """A plain peer (no adverts: the link is quiet) answers every
        TestConn; its link stays up however long it is idle."""
        net = Net()
        a = net.router("a.test", keepalive=2.0)
        plain = net.router("plain.test", mesh=False)
        net.link(plain, a)
        net.run(30.0, step=0.05)
        self.assertEqual([l.peer_domain for l in a.manager.links], ["plain.test"])


class SoftStateFilterTests(unittest.TestCase):
    """Pull filters are soft state (Federation.Filter.Refresh-Interval):
    each link's is sent again in full every 0.75 to 1.25 intervals."""

    INTERVAL = 60.0

    def setUp(self):
        self.net = net = Net()
        self.a, self.b = net.routers_named("a.test", "b.test",
                                           filter_refresh=self.INTERVAL)
        net.link(self.a, self.b)
        net.run(1.0)

    def test_a_filter_that_drifted_is_put_right_by_the_next_refresh(self):
        from elvin.federation import filters
        net, a, b = self.net, self.a, self.b
        consumer = b.client()
        consumer.subscribe("require(n)")
        net.run(0.5)
        producer = a.client()
        producer.notify({"n": 1})
        net.run(0.1)
        self.assertEqual(consumer.deliveries(), [{"n": 1}])
        # a's copy of b's filter is lost (an update misapplied, a peer's
        # restart seen late): a no longer forwards what b wants.
        link = a.link("b.test")
        link.remote_filter = filters.Filter(filters.FALSE)
        a.manager._file(link)
        producer.notify({"n": 2})
        net.run(0.1)
        self.assertEqual(consumer.deliveries(), [])
        net.run(self.INTERVAL * 1.25, step=0.5)
        producer.notify({"n": 3})
        net.run(0.1)
        self.assertEqual(consumer.deliveries(), [{"n": 3}])

    def test_one_full_filter_per_link_per_interval_and_none_sooner(self):
        net, a, b = self.net, self.a, self.b
        b.client().subscribe("require(n)")
        net.run(self.INTERVAL * 0.75 - 2.0, step=0.5)
        links = [a.link("b.test"), b.link("a.test")]
        self.assertEqual([l.stats["refreshed"] for l in links], [0, 0])
        net.run(self.INTERVAL * 10 - self.INTERVAL * 0.75 + 1.0, step=0.5)
        for link in links:
            # 10 intervals at 0.75 to 1.25 intervals apart: 8 to 13 refreshes.
            self.assertGreaterEqual(link.stats["refreshed"], 8)
            self.assertLessEqual(link.stats["refreshed"], 13)

    def test_off_with_zero_and_stopped_with_the_link(self):
        net = Net()
        a, b = net.routers_named("a.test", "b.test", filter_refresh=0.0)
        net.link(a, b)
        net.run(1.0)
        self.assertEqual(a.manager._refresh_calls, {})
        self.assertEqual(len(self.a.manager._refresh_calls), 1)
        self.b.kill()
        self.assertEqual(self.a.manager._refresh_calls, {})


class DrainTests(StreamChecks, unittest.TestCase):
    """SIGUSR1 (``RouterService.drain``): leave the tree, then hand
    clients over; the router keeps running, off the tree."""

    def test_draining_the_router_carrying_a_stream_loses_nothing(self):
        from types import SimpleNamespace
        from elvin import tap
        from elvin.core.router import DISCONN_REDIRECT
        from elvin.uri import ElvinURI
        net = Net()
        (a, b, c, d), consumers = ring_of_four_with_consumers(self, net)
        local = b.client()                    # b's own client, to be redirected
        local.subscribe("require(n)")
        net.run(0.5)
        service = tap.RouterService(b.router, SimpleNamespace(
            redirect_to=ElvinURI("elvin://other.test:2917"), discovery=False))
        service.federation_service = SimpleNamespace(manager=b.manager)
        stream = Stream(net, a)
        net.run(0.5)
        drained = []

        def drain():
            service.drain().addCallback(drained.append)
            self.assertEqual(drained, [])         # not before the peers rerouted
            self.assertEqual(b.router.redirect_uri, None)
        self.check_stream(net, stream, consumers, drain)
        self.assertEqual(drained, [1])
        self.assertGreaterEqual(len(stream.sent), 500)
        disconns = [p for p in local.take() if isinstance(p, packets.Disconn)]
        self.assertEqual([p.reason for p in disconns], [DISCONN_REDIRECT])
        # b keeps running, its links up and idle, and stays off the tree
        # through later adverts and a link made afresh.
        self.assertEqual(len(b.manager.links), 2)
        net.link(b, d)
        net.run(3.0)
        trees = net.trees()
        self.assertEqual(trees["c.test"], {"d.test"})
        self.assertNotIn("b.test", trees["a.test"] | trees["d.test"])
        self.assertTrue(all(l.remote_filter.is_false for l in b.manager.links))
