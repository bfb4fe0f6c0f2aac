"""Federation over any connected graph (elvin.federation.mesh)."""

import time

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from elvin.federation import filters
from elvin.federation.mesh import (DuplicateWindow, MeshState, id_of, notification_id,
                                   spanning_tree)
from elvin.test.polling import wait_until
from elvin.test.test_federation import FederationTestCase, FedRouter


class SpanningTreeTests(unittest.TestCase):

    def test_same_tree_whatever_the_order(self):
        ring = [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]
        tree = spanning_tree("abcd", ring)
        self.assertEqual(tree, spanning_tree("dcba", list(reversed(ring))))
        self.assertEqual(len(tree), 3)
        self.assertNotIn(("c", "d"), tree)        # the last edge in name order

    def test_a_forest_for_a_cut_graph(self):
        self.assertEqual(spanning_tree("abcd", [("a", "b"), ("c", "d")]),
                         {("a", "b"), ("c", "d")})

    def test_only_links_both_ends_advertise(self):
        mesh = MeshState("a", 1, lifetime=10)
        mesh.neighbours = {"b", "c"}
        mesh.receive("b", 1, 1, ["a", "c"], now=0)
        mesh.receive("c", 1, 1, ["b"], now=0)       # c does not (yet) say a
        self.assertEqual(mesh.edges(), {("a", "b"), ("b", "a"), ("b", "c"), ("c", "b")})
        self.assertEqual(mesh.tree_neighbours(), {"b"})

    def test_adverts_are_ordered_and_expire(self):
        mesh = MeshState("a", 1, lifetime=10)
        self.assertTrue(mesh.receive("b", 5, 2, ["a"], now=0))
        self.assertFalse(mesh.receive("b", 5, 1, [], now=1))      # older: ignored
        self.assertFalse(mesh.receive("b", 5, 2, ["a"], now=8))   # same: refreshed
        self.assertFalse(mesh.expire(now=12))
        self.assertTrue(mesh.receive("b", 6, 1, [], now=13))      # restarted: newer epoch
        self.assertTrue(mesh.expire(now=30))
        self.assertEqual(mesh.adverts, {})
        self.assertFalse(mesh.receive("a", 9, 9, [], now=0))      # our own, passed back

    def test_duplicate_window_is_bounded(self):
        window = DuplicateWindow(size=3)
        ids = [notification_id("a", 1, n) for n in range(5)]
        self.assertEqual([window.seen(i) for i in ids], [False] * 5)
        self.assertTrue(window.seen(ids[4]))
        self.assertFalse(window.seen(ids[0]))                     # forgotten
        self.assertEqual(len(window), 3)
        self.assertEqual(id_of(["x", ids[1], "y"]), ids[1])
        self.assertIsNone(id_of(["x", "y"]))

    def test_marker_survives_every_filter(self):
        mark = filters.marker("Elvin-Federation.Mesh-1")
        from elvin.subscription import parse
        for tree in (filters.TRUE, filters.FALSE, parse("x == 1"), parse("x == 1 || y > 2")):
            wire = filters.to_wire(filters.with_marker(tree, mark))
            stripped, marked = filters.strip_marker(wire, mark)
            self.assertTrue(marked)
            if stripped is not filters.TRUE and stripped is not filters.FALSE:
                stripped = filters.from_wire(stripped)
            self.assertEqual(stripped, tree)


class MeshTests(FederationTestCase):
    timeout = 60

    def routers(self, *domains, **kwargs):
        return [FedRouter(self, f"{d}.test", mesh_interval=0.5, **kwargs) for d in domains]

    @defer.inlineCallbacks
    def subscribers(self, routers):
        got = {}
        for r in routers:
            conn = yield self.connect(r)
            seen = []
            yield conn.subscribe("require(n)", seen.append)
            got[r.domain] = seen
        return got

    @defer.inlineCallbacks
    def wait_tree(self, routers, edges):
        """Until every router uses exactly ``edges`` (pairs of routers)."""
        want = {r.domain: set() for r in routers}
        for a, b in edges:
            want[a.domain].add(b.domain)
            want[b.domain].add(a.domain)
        yield wait_until(lambda: all(r.manager._tree == want[r.domain]
                                     and not r.manager._leaving for r in routers),
                         timeout=20)
        yield self.settle(*routers)

    def carried(self, routers):
        return sum(link.stats["in"] for r in routers for link in r.manager.links)

    @defer.inlineCallbacks
    def publish(self, router, first, count):
        producer = yield self.connect(router)
        for n in range(first, first + count):
            producer.notify({"n": n})
        yield producer.test_connection()
        return producer

    @defer.inlineCallbacks
    def test_ring_of_four_delivers_exactly_once_over_a_tree(self):
        a, b, c, d = self.routers("a", "b", "c", "d")
        for x, y in ((a, b), (b, c), (c, d), (d, a)):
            yield x.link_to(y)
        yield self.wait_tree([a, b, c, d], [(a, b), (b, c), (a, d)])   # c–d is last by name
        got = yield self.subscribers([a, b, c, d])
        yield self.settle(a, b, c, d)
        yield self.publish(c, 0, 200)
        yield self.publish(a, 200, 100)          # publishers on two routers
        yield wait_until(lambda: all(len(g) == 300 for g in got.values()))
        yield task.deferLater(reactor, 0.2, lambda: None)
        for seen in got.values():
            self.assertEqual(sorted(n["n"] for n in seen), list(range(300)))
        # Each notification crossed each of the tree's three links once.
        self.assertEqual(self.carried([a, b, c, d]), 3 * 300)
        self.assertEqual(c.link("d.test").stats["in"] + d.link("c.test").stats["in"], 0)

    @defer.inlineCallbacks
    def test_two_hubs_three_leaves(self):
        h1, h2, l1, l2, l3 = self.routers("h1", "h2", "l1", "l2", "l3")
        yield h1.link_to(h2)
        for leaf in (l1, l2, l3):
            yield leaf.link_to(h1)
            yield leaf.link_to(h2)
        routers = [h1, h2, l1, l2, l3]
        yield wait_until(lambda: all(len(r.manager._tree) > 0 and not r.manager._leaving
                                     for r in routers))
        yield self.settle(*routers)
        got = yield self.subscribers(routers)
        yield self.settle(*routers)
        yield self.publish(l2, 0, 100)
        yield wait_until(lambda: all(len(g) == 100 for g in got.values()))
        yield task.deferLater(reactor, 0.2, lambda: None)
        for seen in got.values():
            self.assertEqual(sorted(n["n"] for n in seen), list(range(100)))
        self.assertEqual(self.carried(routers), 4 * 100)     # a tree of five: four links

    @defer.inlineCallbacks
    def test_killed_router_is_routed_around_and_rejoins(self):
        a, b, c, d = self.routers("a", "b", "c", "d")
        for x, y in ((a, b), (b, c), (c, d), (d, a)):
            yield x.link_to(y)
        yield self.wait_tree([a, b, c, d], [(a, b), (b, c), (a, d)])
        got = yield self.subscribers([a, c, d])
        yield self.settle(a, b, c, d)
        producer = yield self.connect(a)
        sent = []
        times = {}
        stop = []

        def stream():
            if stop:
                return
            n = len(sent)
            producer.notify({"n": n})
            sent.append(n)
            times[n] = time.monotonic()
            reactor.callLater(0.005, stream)
        stream()
        yield task.deferLater(reactor, 0.3, lambda: None)
        killed_at = time.monotonic()
        yield b.kill()                          # c was reached through b
        yield wait_until(lambda: all(r.manager._tree == want for r, want in (
            (a, {"d.test"}), (c, {"d.test"}), (d, {"a.test", "c.test"}))), timeout=20)
        healed_at = time.monotonic()
        yield task.deferLater(reactor, 0.3, lambda: None)
        b2 = FedRouter(self, "b.test", mesh_interval=0.5)
        yield a.link_to(b2)
        yield b2.link_to(c)
        yield self.wait_tree([a, b2, c, d], [(a, b2), (b2, c), (a, d)])
        yield task.deferLater(reactor, 0.3, lambda: None)
        stop.append(True)
        yield producer.test_connection()
        last = sent[-1]
        yield wait_until(lambda: all(g and g[-1]["n"] == last for g in got.values()))
        for domain, seen in got.items():
            numbers = [n["n"] for n in seen]
            self.assertEqual(len(numbers), len(set(numbers)), f"a duplicate at {domain}")
            lost = set(sent) - set(numbers)
            # Only what was sent between the kill and the heal may be lost.
            late = [n for n in lost if not killed_at - 0.05 <= times[n] <= healed_at + 0.1]
            self.assertEqual(late, [], f"{domain} lost notifications outside the window")
        self.assertEqual({len(g) for g in [got["a.test"]]}, {len(sent)})  # local: all

    @defer.inlineCallbacks
    def test_plain_peer_in_the_graph(self):
        a, b = self.routers("a", "b")
        (plain,) = [FedRouter(self, "plain.test", mesh=False)]
        c, = self.routers("c")
        yield a.link_to(b)
        yield b.link_to(c)
        yield c.link_to(a)
        yield plain.link_to(b)                  # a plain EFP 1.0 peer: a leaf
        routers = [a, b, c, plain]
        # The plain peer is on the tree too, by its one link.
        yield wait_until(lambda: (a.manager._tree, b.manager._tree, c.manager._tree) == (
            {"b.test", "c.test"}, {"a.test", "plain.test"}, {"a.test"}), timeout=20)
        yield self.settle(*routers)
        self.assertIs(b.link("plain.test").mesh, False)
        got = yield self.subscribers(routers)
        yield self.settle(*routers)
        yield self.publish(plain, 0, 50)
        yield self.publish(c, 50, 50)
        yield wait_until(lambda: all(len(g) == 100 for g in got.values()))
        yield task.deferLater(reactor, 0.2, lambda: None)
        for seen in got.values():
            self.assertEqual(sorted(n["n"] for n in seen), list(range(100)))
        # The plain peer was never sent a mesh packet, nor asked for a mesh id.
        self.assertEqual(plain.manager.duplicates._seen, set())
