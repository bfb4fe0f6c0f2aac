"""Federation links pull through the router's index.

A peer's pull filter is split into disjuncts (``filters.disjuncts``) and
each is filed in ``Router.pull_index`` the way a subscription is filed in
its index, so a notification evaluates only the disjuncts it could satisfy
instead of every link's whole filter.
"""

from hypothesis import given, settings, strategies as st
from twisted.internet.task import Clock
from twisted.trial import unittest

from elvin.federation import filters
from elvin.federation.manager import FederationClass, FederationManager
from elvin.protocols import packets
from elvin.core.router import Router
from elvin.subscription import parse
from elvin.test.test_router import RecordingOutput


def _tree(text):
    return parse(text)


class DisjunctTests(unittest.TestCase):

    def test_or_is_flattened(self):
        parts = filters.disjuncts(_tree("a == 1 || (b == 2 || c == 3)"))
        self.assertEqual(len(parts), 3)

    def test_and_distributes_over_or(self):
        parts = filters.disjuncts(_tree("(a == 1 || b == 2) && c == 3"))
        self.assertEqual(len(parts), 2)
        for part, attrs in zip(parts, ({"a": 1, "c": 3}, {"b": 2, "c": 3})):
            self.assertTrue(filters.Filter(part).matches(attrs))

    def test_constants(self):
        self.assertEqual(filters.disjuncts(filters.TRUE), [filters.TRUE])
        self.assertEqual(filters.disjuncts(filters.FALSE), [])

    def test_a_wide_product_stays_one_disjunct(self):
        wide = " && ".join("(" + " || ".join(f"n{i} == {j}" for j in range(3)) + ")"
                           for i in range(5))      # 3**5 = 243 combinations
        tree = _tree(wide)
        self.assertEqual(filters.disjuncts(tree), [tree])

    @settings(max_examples=200, deadline=None)
    @given(st.dictionaries(st.sampled_from("abcd"), st.integers(0, 3), max_size=4))
    def test_disjuncts_match_exactly_when_the_filter_does(self, attrs):
        for text in ("a == 1 || b == 2 && (c == 3 || d < 2)",
                     "(a == 1 || !(b == 2)) && (c > 1 || d == 0)",
                     "require(a) && (b == 1 || c == 2 || d == 3)",
                     "!(a == 1 || b == 1) || c == 2"):
            tree = _tree(text)
            whole = filters.Filter(tree).matches(attrs)
            any_part = any(filters.Filter(p).matches(attrs) for p in filters.disjuncts(tree))
            self.assertEqual(whole, any_part, (text, attrs))


class RouterPullTests(unittest.TestCase):

    def test_pulled_by_uses_the_index(self):
        router = Router()
        router.set_pull_filter("left", filters.disjuncts(_tree("a == 1 || b == 2")))
        router.set_pull_filter("right", [_tree("c == 3")])
        self.assertEqual(list(router.pulled_by({"a": 1})), ["left"])
        self.assertEqual(sorted(router.pulled_by({"b": 2, "c": 3})), ["left", "right"])
        self.assertEqual(list(router.pulled_by({"z": 1})), [])
        # Only the disjuncts the notification could satisfy are candidates.
        self.assertEqual(len(router.pull_index.candidates({"a": 1})), 1)
        self.assertEqual(len(router.pull_index.candidates({"z": 1})), 0)

    def test_true_pulls_everything_and_replacing_and_removing(self):
        router = Router()
        router.set_pull_filter("link", [True])
        self.assertEqual(list(router.pulled_by({"anything": 1})), ["link"])
        router.set_pull_filter("link", [_tree("a == 1")])
        self.assertEqual(list(router.pulled_by({"anything": 1})), [])
        self.assertEqual(len(router.pull_index), 1)
        router.set_pull_filter("link", [])
        self.assertEqual((len(router.pull_index), list(router.pulled_by({"a": 1}))), (0, []))

    def test_pulls_are_not_subscriptions(self):
        router = Router()
        seen = []
        router.quench.subscription_added = seen.append
        router.set_pull_filter("link", [_tree("a == 1")])
        self.assertEqual((router.subscriptions, seen), ({}, []))

    def test_a_filter_past_max_pattern_work_passes_the_notification_on(self):
        """A peer's filter is held to max-pattern-work too; a test it
        refuses makes the filter true (EFP lets a router pass on more than
        its peer asked, never less)."""
        from elvin.subscription import patterns
        router = Router()
        weight = patterns.weighed_regexes(["x"])[1]
        router.max_pattern_work = weight * 100
        router.set_pull_filter("link", [_tree('regex(s, "x")')])
        router.set_pull_filter("other", [_tree('s == "never"')])
        self.assertEqual(list(router.pulled_by({"s": "y" * 99})), [])
        self.assertEqual(list(router.pulled_by({"s": "y" * 99 + "x"})), ["link"])
        self.assertEqual(list(router.pulled_by({"s": "y" * 101})), ["link"])
        self.assertEqual(router.stats["pattern_work_refusals"], 1)
        router.set_pull_filter("link", [])
        self.assertEqual(router._pull_budgets, {})


class _Output:
    def __init__(self):
        self.sent = []

    def send(self, packet):
        self.sent.append(packet)

    def send_encoded(self, data, droppable):
        self.sent.append(data)
        return True


class _FakeLink:
    """What the manager reads of an up FederationLink."""
    UP = state = 2
    outgoing = True
    fed_class = None
    peer_host = "127.0.0.1"
    mesh = False
    dial = None          # not a configured link's (elvin.federation.dial)
    sent_filter = None   # asked the peer for nothing

    def __init__(self, domain):
        self.peer_domain = domain
        self.output = _Output()
        self.stats = {key: 0 for key in ("in", "out", "loops", "suppressed", "duplicates",
                                         "overload", "unsent", "refreshed", "adverts_ignored")}
        self.remote_filter = filters.Filter(filters.FALSE)

    def send_filter(self, tree):
        pass


class ManagerPullTests(unittest.TestCase):
    """A link's received filter is filed in the router's pull index while it
    is up, and forwarding asks only the links the index found."""

    def setUp(self):
        self.router = Router()
        self.manager = FederationManager(self.router, "here.test",
                                         [FederationClass("Peer", hosts=["*"])], None,
                                         Clock())

    def _link(self, domain, text):
        link = _FakeLink(domain)
        self.manager.link_up(link)
        link.remote_filter = filters.Filter(filters.parse_filter(text))
        self.manager.remote_filter_changed(link)
        return link

    def test_only_pulling_links_get_the_notification(self):
        a = self._link("a.test", "x == 1 || y == 2")
        b = self._link("b.test", "z == 3")
        session = self.router.open_session(RecordingOutput(), "producer")
        session.packet_received(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY))
        session.packet_received(packets.NotifyEmit({"y": 2}, True, packets.Keys.EMPTY))
        session.packet_received(packets.NotifyEmit({"z": 3, "x": 1}, True, packets.Keys.EMPTY))
        session.packet_received(packets.NotifyEmit({"q": 1}, True, packets.Keys.EMPTY))
        self.assertEqual((a.stats["out"], b.stats["out"]), (2, 1))

    def test_a_link_that_goes_down_stops_pulling(self):
        a = self._link("a.test", "TRUE")
        self.assertEqual(len(self.router.pull_index), 1)
        self.manager.link_down(a, "gone", True)
        self.assertEqual(len(self.router.pull_index), 0)
        self.assertEqual(list(self.router.pulled_by({"x": 1})), [])
