"""Quench across federation: a link's pull filter is what its far side
wants, so quenchers hear of it as terms (docs/quench.md, "Across
federation"). In memory (elvin.test.fednet): one fake clock, no sockets."""

from twisted.trial import unittest

from elvin.federation import filters as fed_filters
from elvin.protocols import packets as elvin_packets
from elvin.subscription.compiler import compile_tree
from elvin.test.fednet import Net


def _terms(packets, terms=None):
    """term id -> tree, from a quencher's SubAdd/Mod/DelNotify packets
    (applied in order to ``terms``, if given)."""
    terms = {} if terms is None else terms
    for packet in packets:
        if isinstance(packet, (elvin_packets.SubAddNotify, elvin_packets.SubModNotify)):
            terms[packet.term_id] = packet.sub_expr
        elif isinstance(packet, elvin_packets.SubDelNotify):
            terms.pop(packet.term_id, None)
    return terms


def _wanted(terms, attributes):
    return any(compile_tree(tree).fn(attributes) is True for tree in terms.values())


class QuenchAcrossFederationTests(unittest.TestCase):

    def line(self):
        net = Net()
        a, b, c = net.routers_named("a.test", "b.test", "c.test")
        net.link(a, b)
        net.link(c, b)
        net.run(1.0)
        return net, a, b, c

    def test_a_quencher_hears_of_a_subscription_two_hops_away_within_a_second(self):
        net, a, b, c = self.line()
        quencher = a.client()
        quencher.quench(["x"])
        self.assertEqual(_terms(quencher.take()), {})
        consumer = c.client()
        sub = consumer.subscribe("x == 1 && y > 2")
        terms = {}
        elapsed = 0.0
        while not terms and elapsed < 1.0:
            net.run(0.01)
            elapsed += 0.01
            packets = quencher.take()
            terms.update(_terms(packets))
        self.assertLess(elapsed, 1.0)
        (tree,) = terms.values()
        self.assertTrue(_wanted(terms, {"x": 1, "y": 3}))
        self.assertFalse(_wanted(terms, {"x": 2, "y": 3}))
        add = next(p for p in packets if isinstance(p, elvin_packets.SubAddNotify))
        self.assertEqual((add.secure_quench_ids, len(add.insecure_quench_ids)), ((), 1))
        # The subscription goes: so does the term.
        consumer.unsubscribe(sub)
        net.run(0.5)
        deleted = [p for p in quencher.take() if isinstance(p, elvin_packets.SubDelNotify)]
        self.assertEqual([d.term_id for d in deleted], list(terms))

    def test_a_quench_added_later_hears_of_what_is_there(self):
        net, a, b, c = self.line()
        c.client().subscribe("x == 1")
        b.client().subscribe("x == 2")
        net.run(0.5)
        quencher = a.client()
        quencher.quench(["x"], deliver_insecure=False)
        packets = quencher.take()
        terms = _terms(packets)
        self.assertTrue(_wanted(terms, {"x": 1}))
        self.assertTrue(_wanted(terms, {"x": 2}))
        self.assertTrue(all(p.secure_quench_ids and not p.insecure_quench_ids
                            for p in packets if isinstance(p, elvin_packets.SubAddNotify)))
        # ...and quenches on other names hear nothing of them.
        other = a.client()
        other.quench(["z"])
        self.assertEqual(_terms(other.take()), {})

    def test_a_peer_wanting_everything_is_a_term_for_every_quench(self):
        net, a, b, c = self.line()
        c.client().subscribe("x == 1")
        net.run(0.5)
        # A peer asking for everything (the Avis router's default, or a
        # filter generalised to TRUE) wants whatever a producer has.
        link = a.link("b.test")
        link.remote_filter = fed_filters.Filter(fed_filters.TRUE)
        a.manager.remote_filter_changed(link)
        quencher = a.client()
        quencher.quench(["unrelated"])
        terms = _terms(quencher.take())
        self.assertTrue(_wanted(terms, {"unrelated": 5}))

    def test_auto_quench_producer_sends_what_a_subscriber_elsewhere_wants(self):
        """The auto-quench decision (could any known term match?) across a
        ring: a producer on a sends exactly what b's and d's subscribers
        want, and each gets it."""
        net = Net()
        a, b, c, d = net.routers_named("a.test", "b.test", "c.test", "d.test")
        for x, y in ((a, b), (b, c), (c, d), (d, a)):
            net.link(x, y)
        net.run(3.0)
        on_b, on_d = b.client(), d.client()
        on_b.subscribe("n == 1")
        on_d.subscribe("n == 2")
        net.run(0.5)
        producer = a.client()
        producer.quench(["n"])
        terms = _terms(producer.take())
        sent = 0
        for n in range(4):
            if _wanted(terms, {"n": n}):
                producer.notify({"n": n})
                sent += 1
        net.run(0.2)
        self.assertEqual(sent, 2)
        self.assertEqual(on_b.deliveries(), [{"n": 1}])
        self.assertEqual(on_d.deliveries(), [{"n": 2}])

    def test_in_a_ring_one_term_which_follows_the_tree(self):
        """a-b-c-d-a (tree a-b, b-c, a-d): a quencher on a hears of c's
        subscription once (the idle c-d link carries no filter), and
        still holds a term for it after b, the router on the way, is
        stopped and the tree goes round by d."""
        net = Net()
        a, b, c, d = net.routers_named("a.test", "b.test", "c.test", "d.test")
        for x, y in ((a, b), (b, c), (c, d), (d, a)):
            net.link(x, y)
        net.run(3.0)
        self.assertEqual(net.trees()["c.test"], {"b.test"})
        quencher = a.client()
        quencher.quench(["x"])
        c.client().subscribe("x == 1")
        net.run(0.5)
        terms = _terms(quencher.take())
        self.assertEqual(len(terms), 1)
        self.assertTrue(_wanted(terms, {"x": 1}))
        stopped = []
        b.stop().addCallback(stopped.append)
        net.run(5.0)
        self.assertEqual(len(stopped), 1)
        self.assertEqual(net.trees()["c.test"], {"d.test"})
        _terms(quencher.take(), terms)
        self.assertEqual(len(terms), 1)
        self.assertTrue(_wanted(terms, {"x": 1}))
        self.assertFalse(_wanted(terms, {"x": 2}))
