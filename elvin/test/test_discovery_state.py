"""ERDP state machines driven directly with a fake clock (no sockets):
the router's Advertiser, the client's Solicitor and RouterCache, and
simulated storms of many clients on an in-memory "multicast" network."""

import random

from twisted.internet import task
from twisted.trial import unittest

from elvin.discovery.advertiser import RATE_LIMIT, Advertiser
from elvin.discovery.cache import DNS_SD, ERDP, RouterCache
from elvin.discovery.packets import SvrAdvt, SvrAdvtClose, SvrRqst
from elvin.discovery.solicitor import (
    PASSIVE_AFTER, PRE_REQUEST, REPEAT_GAP, Solicitor, steps_for)
from elvin.uri import ElvinURI


def run_clock(clock, until, max_steps=100000):
    """Advance ``clock`` from one delayed call to the next (exact times, no
    quantisation) until ``until`` seconds or nothing is left."""
    for _ in range(max_steps):
        calls = [c.getTime() for c in clock.getDelayedCalls()]
        if not calls or min(calls) > until:
            break
        clock.advance(max(0.0, min(calls) - clock.seconds()))
    if clock.seconds() < until:
        clock.advance(until - clock.seconds())


class Sent(list):
    """A send(packet, locality) callable that records (time, packet, locality)."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def __call__(self, packet, locality):
        self.append((self.clock.seconds(), packet, locality))

    def of(self, kind):
        return [item for item in self if type(item[1]) is kind]


class AdvertiserTests(unittest.TestCase):
    timeout = 30

    def setUp(self):
        self.clock = task.Clock()
        self.clock.advance(1000)
        self.sent = Sent(self.clock)
        self.adv = Advertiser(self.clock, self.sent, "router-1",
                              ["elvin://127.0.0.1:3000"], scope="s", default=True)

    def test_advertises_on_start(self):
        self.adv.start()
        ((when, packet, locality),) = self.sent
        self.assertEqual(packet, SvrAdvt(server="router-1", revision=1,
                                         uris=("elvin://127.0.0.1:3000",),
                                         scope="s", default=True))
        self.assertEqual(locality, 64)   # initial: min(ttl_limit, 64)
        self.adv.start()                 # idempotent
        self.assertEqual(len(self.sent), 1)

    def test_initial_locality_capped_by_ttl_limit(self):
        adv = Advertiser(self.clock, self.sent, "r", ["elvin://h"], ttl_limit=1)
        adv.start()
        self.assertEqual(self.sent[0][2], 1)
        with self.assertRaises(ValueError):
            Advertiser(self.clock, self.sent, "r", ["elvin://h"], ttl_limit=256)
        with self.assertRaises(ValueError):
            Advertiser(self.clock, self.sent, "r", [])

    def test_answer_immediately_when_quiet(self):
        self.adv.start()
        self.clock.advance(RATE_LIMIT)
        self.adv.received(SvrRqst(locality=2))
        self.assertEqual([(t - 1000, loc) for t, _, loc in self.sent],
                         [(0, 64), (RATE_LIMIT, 2)])

    def test_answers_coalesced_under_rate_limit(self):
        self.adv.start()
        for i, loc in enumerate([0, 3, 1, 2]):
            self.clock.advance(0.25)
            self.adv.received(SvrRqst(locality=loc))
        self.assertEqual(len(self.sent), 1)   # only the start-up advert so far
        self.clock.advance(RATE_LIMIT - 1.0 - 0.001)
        self.assertEqual(len(self.sent), 1)
        self.clock.advance(0.001)
        self.assertEqual(len(self.sent), 2)
        when, packet, locality = self.sent[1]
        self.assertEqual(when - 1000, RATE_LIMIT)
        self.assertEqual(locality, 3)         # the widest locality asked for
        self.assertEqual(self.adv.requests_seen, 4)

    def test_answer_locality_capped_by_ttl_limit(self):
        adv = Advertiser(self.clock, self.sent, "r", ["elvin://h"], ttl_limit=0)
        adv.start()
        self.clock.advance(5)
        adv.received(SvrRqst(locality=255))
        self.assertEqual([loc for _, _, loc in self.sent], [0, 0])

    def test_ignores_incompatible_and_non_requests(self):
        self.adv.start()
        self.clock.advance(10)
        self.adv.received(SvrRqst(locality=1, major=5))
        self.adv.received(SvrRqst(locality=1, major=3))
        self.adv.received(SvrAdvt(server="other", revision=1, uris=("elvin://x",)))
        self.adv.received(SvrAdvtClose(server="other"))
        self.assertEqual(len(self.sent), 1)
        self.adv.received(SvrRqst(locality=1, minor=7))   # later minor is fine
        self.assertEqual(len(self.sent), 2)

    def test_not_answering_before_start_or_after_stop(self):
        self.adv.received(SvrRqst())
        self.assertEqual(self.sent, [])
        self.adv.start()
        self.adv.stop()
        self.clock.advance(10)
        self.adv.received(SvrRqst())
        self.assertEqual([type(p) for _, p, _ in self.sent], [SvrAdvt, SvrAdvtClose])

    def test_update_bumps_revision_and_readvertises(self):
        self.adv.start()
        self.clock.advance(3)
        self.assertTrue(self.adv.update(scope="t"))
        self.assertFalse(self.adv.update(scope="t"))      # no change, no bump
        self.assertTrue(self.adv.update(default=False))   # within 2 s: deferred
        self.assertTrue(self.adv.update(uris=["elvin://127.0.0.1:3000",
                                              "elvin://127.0.0.1:3001"]))
        self.assertEqual(self.adv.revision, 4)
        self.clock.advance(RATE_LIMIT)
        adverts = [p for _, p, _ in self.sent.of(SvrAdvt)]
        self.assertEqual([a.revision for a in adverts], [1, 2, 4])
        self.assertEqual(adverts[-1].scope, "t")
        self.assertFalse(adverts[-1].default)
        self.assertEqual(len(adverts[-1].uris), 2)
        with self.assertRaises(ValueError):
            self.adv.update(scope="a:b")

    def test_revision_wraps_past_zero(self):
        self.adv.start()
        self.adv.revision = 0xFFFFFFFF
        self.adv.update(scope="other")
        self.assertEqual(self.adv.revision, 1)

    def test_withdrawal_at_highest_locality_sent(self):
        adv = Advertiser(self.clock, self.sent, "r", ["elvin://h"], ttl_limit=8)
        adv.start()                             # 8
        self.clock.advance(3)
        adv.received(SvrRqst(locality=2))       # 2
        self.clock.advance(3)
        adv.received(SvrRqst(locality=200))     # capped to 8
        self.assertTrue(adv.stop())
        when, packet, locality = self.sent[-1]
        self.assertEqual(packet, SvrAdvtClose(server="r"))
        self.assertEqual(locality, 8)
        self.assertEqual(adv.max_locality_sent, 8)
        self.assertFalse(adv.stop())            # once only

    def test_stop_cancels_pending_answer(self):
        self.adv.start()
        self.adv.received(SvrRqst())
        self.adv.stop()
        self.clock.advance(10)
        self.assertEqual([type(p) for _, p, _ in self.sent], [SvrAdvt, SvrAdvtClose])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_never_two_adverts_within_two_seconds(self):
        rng = random.Random(7)
        self.adv.start()
        for _ in range(2000):
            self.clock.advance(rng.uniform(0, 0.05))
            choice = rng.random()
            if choice < 0.9:
                self.adv.received(SvrRqst(locality=rng.randrange(0, 70)))
            elif choice < 0.95:
                self.adv.update(scope=f"s{rng.randrange(3)}")
            else:
                self.adv.update(default=rng.random() < 0.5)
        self.clock.advance(5)
        times = [t for t, _, _ in self.sent.of(SvrAdvt)]
        gaps = [b - a for a, b in zip(times, times[1:])]
        self.assertTrue(gaps)
        self.assertGreaterEqual(min(gaps), RATE_LIMIT - 1e-9)
        elapsed = times[-1] - times[0]
        self.assertLessEqual(len(times), 1 + elapsed / RATE_LIMIT + 1e-9)


class FixedRandom:
    """uniform() returns the midpoint, and records the call."""

    def __init__(self):
        self.calls = []

    def uniform(self, a, b):
        self.calls.append((a, b))
        return (a + b) / 2


class SolicitorTests(unittest.TestCase):
    timeout = 30

    def setUp(self):
        self.clock = task.Clock()
        self.sent = Sent(self.clock)
        self.events = []
        self.random = FixedRandom()
        self.sol = Solicitor(self.clock, self.sent, max_locality=64, random=self.random,
                             on_postponed=lambda: self.events.append("postponed"),
                             on_exhausted=lambda: self.events.append("exhausted"))

    def test_table(self):
        self.assertEqual([s[0] for s in PRE_REQUEST], [0, 1, 2, 4, 8, 16, 32, 64])
        self.assertEqual(steps_for(0), ((0, 0.0, 0.0),))
        self.assertEqual([s[0] for s in steps_for(3)], [0, 1, 2])
        with self.assertRaises(ValueError):
            steps_for(256)

    def test_passive_until_asked(self):
        self.clock.advance(100)
        self.assertEqual(self.sent, [])
        self.assertEqual(self.sol.mode, "passive")

    def test_expanding_search_with_pre_request_intervals(self):
        self.sol.solicit()
        self.assertEqual(self.sol.mode, "active")
        run_clock(self.clock, 60)
        times = [round(t, 6) for t, _, _ in self.sent]
        localities = [loc for _, _, loc in self.sent]
        self.assertEqual(localities, [0, 1, 2, 4, 8, 16, 32, 64])
        # packet locality == requested IP TTL, and the packets say so too
        self.assertEqual([p.locality for _, p, _ in self.sent], localities)
        # midpoints 0, 0.4, 2, 2, 2, 4, 4, 8, cumulative
        self.assertEqual(times, [0.0, 0.4, 2.4, 4.4, 6.4, 10.4, 14.4, 22.4])
        # the random variation was drawn afresh for every wait, within +/-
        self.assertEqual([(round(a, 9), round(b, 9)) for a, b in self.random.calls],
                         [(0.2, 0.6), (1.0, 3.0), (1.0, 3.0), (1.0, 3.0),
                          (2.0, 6.0), (2.0, 6.0), (4.0, 12.0)])
        self.assertEqual(self.events, ["exhausted"])
        self.assertFalse(self.sol.waiting)

    def test_real_random_intervals_within_table(self):
        sol = Solicitor(self.clock, self.sent, max_locality=64, random=random.Random(3))
        for _ in range(30):
            sol.index = 1
            sol._start_wait()
            start = self.clock.seconds()
            delay = sol._wait.getTime() - start
            self.assertTrue(0.2 <= delay <= 0.6, delay)
            sol._cancel_wait()

    def test_max_locality_limits_search(self):
        sol = Solicitor(self.clock, self.sent, max_locality=2, random=self.random,
                        on_exhausted=lambda: self.events.append("exhausted"))
        sol.solicit()
        self.clock.pump([0.1] * 100)
        self.assertEqual([loc for _, _, loc in self.sent], [0, 1, 2])
        self.assertEqual(self.events, ["exhausted"])

    def test_suppressed_by_equal_or_wider_request(self):
        self.sol.solicit()
        self.clock.advance(0)                    # L0 sent at once
        self.clock.advance(0.1)                  # waiting for L1
        self.sol.observed(SvrRqst(locality=0))   # narrower: no effect
        self.clock.advance(0.1)
        self.sol.observed(SvrRqst(locality=1))   # equal: suppresses our L1
        self.clock.advance(0.3)
        self.assertEqual([loc for _, _, loc in self.sent], [0])
        self.assertEqual([loc for _, loc in self.sol.suppressed], [1])
        self.assertTrue(self.sol.waiting)        # went on to L2
        self.assertEqual(self.sol.locality, 2)
        self.sol.observed(SvrRqst(locality=64))  # wider: suppresses L2
        self.clock.advance(2.0)
        self.assertEqual([loc for _, loc in self.sol.suppressed], [1, 2])
        self.clock.advance(2.0)
        self.assertEqual([loc for _, _, loc in self.sent], [0, 4])
        outcomes = [(loc, outcome) for _, _, loc, outcome in self.sol.history]
        self.assertEqual(outcomes, [(0, "sent"), (1, "suppressed"), (2, "suppressed"),
                                    (4, "sent")])

    def test_incompatible_request_does_not_suppress(self):
        self.sol.solicit()
        self.clock.advance(0)
        self.clock.advance(0.1)
        self.sol.observed(SvrRqst(locality=9, major=5))
        self.clock.advance(0.3)
        self.assertEqual([loc for _, _, loc in self.sent], [0, 1])

    def test_postponed_by_advertisement(self):
        self.sol.solicit()
        self.clock.advance(0.1)                          # L0 sent; waiting for L1
        self.sol.observed(SvrAdvt(server="r", revision=1, uris=("elvin://h",)))
        self.assertEqual(self.events, ["postponed"])
        self.assertFalse(self.sol.waiting)
        self.clock.advance(100)
        self.assertEqual([loc for _, _, loc in self.sent], [0])   # nothing more
        # The application asks again: the postponed step (L1) runs.
        self.sol.solicit()
        self.clock.advance(0.4)
        self.assertEqual([loc for _, _, loc in self.sent], [0, 1])
        # An advert while idle does nothing.
        self.sol.stop()
        self.sol.observed(SvrAdvt(server="r", revision=1, uris=("elvin://h",)))
        self.assertEqual(self.events, ["postponed"])

    def test_incompatible_advert_does_not_postpone(self):
        self.sol.solicit()
        self.clock.advance(0.1)
        self.sol.observed(SvrAdvt(server="r", revision=1, uris=("u",), major=3))
        self.assertTrue(self.sol.waiting)

    def test_solicit_while_waiting_is_a_no_op(self):
        self.sol.solicit()
        self.clock.advance(0)
        self.sol.solicit()
        self.sol.solicit()
        self.clock.advance(0.4)
        self.assertEqual([loc for _, _, loc in self.sent], [0, 1])

    def test_reverts_to_passive_after_five_minutes(self):
        sol = Solicitor(self.clock, self.sent, max_locality=1, random=self.random)
        sol.solicit()
        self.clock.advance(0)
        self.clock.advance(0.4)                   # L0, L1 sent; exhausted
        self.assertEqual(sol.mode, "active")
        self.clock.advance(PASSIVE_AFTER - 0.5)
        self.assertEqual(sol.mode, "active")
        self.clock.advance(1)
        self.assertEqual(sol.mode, "passive")
        self.assertEqual(sol.index, 0)
        sol.solicit()                             # starts again from locality 0
        self.clock.advance(0)
        self.assertEqual([loc for _, _, loc in self.sent], [0, 1, 0])

    def test_asking_again_within_five_minutes_continues(self):
        sol = Solicitor(self.clock, self.sent, max_locality=2, random=self.random)
        sol.solicit()
        self.clock.advance(0.1)
        sol.observed(SvrAdvt(server="r", revision=1, uris=("u",)))   # postponed at L1
        self.clock.advance(200)
        sol.solicit()                             # 200 s later: still active
        self.clock.advance(0.4)
        self.assertEqual([loc for _, _, loc in self.sent], [0, 1])
        self.clock.advance(2.0)
        self.assertEqual([loc for _, _, loc in self.sent], [0, 1, 2])

    def test_repeat_never_faster_than_repeat_gap(self):
        sol = Solicitor(self.clock, self.sent, max_locality=0, random=self.random)
        for _ in range(50):
            sol.solicit()
            self.clock.advance(0.05)
        times = [t for t, _, _ in self.sent]
        self.assertGreater(len(times), 1)
        gaps = [b - a for a, b in zip(times, times[1:])]
        self.assertGreaterEqual(min(gaps), REPEAT_GAP - 1e-9)

    def test_stop_leaves_no_timers(self):
        self.sol.solicit()
        self.clock.advance(0.1)
        self.sol.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])


class CacheTests(unittest.TestCase):
    timeout = 30

    def advert(self, server="r", revision=1, uris=("elvin://192.0.2.9:3000",),
               scope="", default=False):
        return SvrAdvt(server=server, revision=revision, uris=uris, scope=scope,
                       default=default)

    def setUp(self):
        self.cache = RouterCache(task.Clock())
        self.events = []
        self.cache.listeners.append(lambda e, r: self.events.append((e, r.name, r.revision)))

    def test_first_advert_then_duplicates_dropped(self):
        self.assertIsNotNone(self.cache.advert(self.advert()))
        self.assertIsNone(self.cache.advert(self.advert(uris=("elvin://other",))))
        self.assertEqual(self.cache.get("r").uris, ("elvin://192.0.2.9:3000",))
        self.assertEqual(self.cache.duplicates, 1)
        self.assertIsNotNone(self.cache.advert(self.advert(revision=2, uris=("elvin://n",))))
        self.assertEqual(self.cache.get("r").uris, ("elvin://n",))
        self.assertEqual(self.events, [("added", "r", 1), ("changed", "r", 2)])

    def test_bounded_against_a_flood_of_forged_adverts(self):
        from elvin.discovery.cache import MAX_ROUTERS, MAX_URIS
        clock = self.cache.clock
        self.cache.advert(self.advert(server="home"), local=True)
        self.cache.advert(self.advert(server="real"))
        for i in range(MAX_ROUTERS * 4):
            clock.advance(1)
            self.cache.advert(self.advert(server=f"forged-{i}"))
        self.assertEqual(len(self.cache), MAX_ROUTERS)
        self.assertEqual(self.cache.evicted, MAX_ROUTERS * 4 + 2 - MAX_ROUTERS)
        self.assertIsNotNone(self.cache.get("home"))        # this host's: kept
        self.assertIsNone(self.cache.get("real"))           # not heard from longest
        self.assertIn(("withdrawn", "real", 1), self.events)
        # A real router heard again comes back (the oldest forged one goes).
        self.cache.advert(self.advert(server="real"))
        self.assertIsNotNone(self.cache.get("real"))
        uris = tuple(f"elvin://192.0.2.9:{3000 + i}" for i in range(2000))
        self.cache.advert(self.advert(server="many", uris=uris))
        self.assertEqual(self.cache.get("many").uris, uris[:MAX_URIS])

    def test_withdraw(self):
        self.cache.advert(self.advert(server="a"))
        self.cache.advert(self.advert(server="b"))
        self.assertEqual(self.cache.withdraw("a").name, "a")
        self.assertIsNone(self.cache.withdraw("a"))
        self.assertEqual([r.name for r in self.cache], ["b"])
        self.assertEqual(self.events[-1], ("withdrawn", "a", 1))

    def test_withdraw_by_source_keeps_other_sources(self):
        self.cache.advert(self.advert())
        self.cache.learn("r", "", False, 1, ("elvin://x",), source=DNS_SD)
        self.assertEqual(self.cache.get("r").sources, {ERDP, DNS_SD})
        self.assertIsNone(self.cache.withdraw("r", source=DNS_SD))
        self.assertIsNotNone(self.cache.get("r"))
        self.assertIsNotNone(self.cache.withdraw("r"))   # ERDP close: gone

    def test_scope_and_default_selection(self):
        self.cache.advert(self.advert(server="a", scope="red", default=True))
        self.cache.advert(self.advert(server="b", scope="blue"))
        self.cache.advert(self.advert(server="c", scope="", default=False))
        self.assertEqual([r.name for r in self.cache.matching(None)], ["a"])
        self.assertEqual([r.name for r in self.cache.matching("blue")], ["b"])
        self.assertEqual([r.name for r in self.cache.matching("")], ["c"])
        self.assertEqual(self.cache.matching("green"), [])

    def test_candidates_filter_uris(self):
        uris = ("not a uri",
                "elvin:4.0/tcp,none,xdr/192.0.2.1:1",
                "elvin:5.0/tcp,none,xdr/192.0.2.1:2",      # wrong major version
                "elvin:4.0/x-foo,none,xdr/192.0.2.1:3",    # stack not supported
                "elvin:4.0/udp,none,xdr/192.0.2.1:4",      # datagrams only
                "elvin://0.0.0.0:5",                       # wildcard
                "elvin://127.0.0.1:6",                     # loopback, router remote
                "elvin://192.0.2.1:1")                     # same as the first
        self.cache.advert(self.advert(uris=uris, scope="s"))
        found = self.cache.candidates("s")
        self.assertEqual([str(u) for _, u in found],
                         ["elvin:4.0/tcp,none,xdr/192.0.2.1:1"])

    def test_no_spelling_of_loopback_or_wildcard_passes_for_a_remote_router(self):
        """A remote advert naming this host's loopback (or a wildcard) in
        any numeric form a resolver reads is not a way to a router."""
        hosts = ["127.1", "2130706433", "0x7f.1", "0177.0.0.1", "127.000.000.001",
                 "[::ffff:127.0.0.1]", "0", "0.0", "[::ffff:0.0.0.0]"]
        uris = tuple(f"elvin://{h}:{i + 10}" for i, h in enumerate(hosts))
        self.cache.advert(self.advert(uris=uris + ("elvin://192.0.2.1:1",), scope="s"))
        self.assertEqual([str(u) for _, u in self.cache.candidates("s")],
                         ["elvin:4.0/tcp,none,xdr/192.0.2.1:1"])

    def test_loopback_kept_for_local_router(self):
        self.cache.advert(self.advert(uris=("elvin://127.0.0.1:6", "elvin://[::1]:7"),
                                      scope="s"), address="127.0.0.1", local=True)
        self.assertEqual([u.port for _, u in self.cache.candidates("s")], [6, 7])

    def test_candidates_order_and_exclude(self):
        self.cache.advert(self.advert(server="a", scope="s",
                                      uris=("elvin://192.0.2.1:1", "elvin://192.0.2.1:2")))
        self.cache.advert(self.advert(server="b", scope="s", uris=("elvin://192.0.2.2:1",)))
        found = self.cache.candidates("s")
        self.assertEqual([(r.name, u.port) for r, u in found], [("a", 1), ("a", 2), ("b", 1)])
        tried = {("a", 1, ElvinURI("elvin://192.0.2.1:1"))}
        self.assertEqual([(r.name, u.port) for r, u in self.cache.candidates("s", tried)],
                         [("a", 2), ("b", 1)])
        # A new revision of a is a new chance for the same URI.
        self.cache.advert(self.advert(server="a", revision=2, scope="s",
                                      uris=("elvin://192.0.2.1:1",)))
        self.assertEqual([(r.name, u.port) for r, u in self.cache.candidates("s", tried)],
                         [("a", 1), ("b", 1)])

    def test_supported_stacks_read_at_call_time(self):
        from elvin import endpoints
        self.cache.advert(self.advert(scope="s", uris=("elvin:4.0/x-new,none,xdr/h:1",)))
        self.assertEqual(self.cache.candidates("s"), [])
        self.patch(endpoints, "SUPPORTED_STACKS",
                   frozenset(endpoints.SUPPORTED_STACKS) | {("x-new", "none", "xdr")})
        self.assertEqual(len(self.cache.candidates("s")), 1)


class SimNetwork:
    """An in-memory multicast group: every packet sent reaches every other
    member after ``latency`` seconds (0: at once, re-entrantly)."""

    def __init__(self, clock, latency=0.0):
        self.clock = clock
        self.latency = latency
        self.members = []
        self.log = []        # (time, sender, packet, locality)

    def join(self, name, receive):
        self.members.append((name, receive))

        def send(packet, locality):
            self.log.append((self.clock.seconds(), name, packet, locality))
            for other, deliver in list(self.members):
                if other == name:
                    continue
                if self.latency:
                    self.clock.callLater(self.latency, deliver, packet)
                else:
                    deliver(packet)
        return send

    def requests(self):
        return [(t, who, p.locality) for t, who, p, _ in self.log if type(p) is SvrRqst]


class StormSimulationTests(unittest.TestCase):
    """Many clients soliciting at once, on a simulated network."""

    timeout = 30

    N = 50

    def make_clients(self, net, max_locality, on_postponed=None):
        clients = {}
        heard = {}
        for i in range(self.N):
            name = f"c{i}"
            heard[name] = []

            def receive(packet, name=name):
                heard[name].append((net.clock.seconds(), packet))
                clients[name].observed(packet)
            send = net.join(name, receive)
            clients[name] = Solicitor(net.clock, send, max_locality=max_locality,
                                      random=random.Random(i))
        return clients, heard

    def check_suppression_rule(self, clients, heard):
        """Every SvrRqst a client sent had no equal-or-wider SvrRqst from
        anyone else reach it during its pre-request wait; every suppressed
        one had."""
        for name, sol in clients.items():
            for start, end, locality, outcome in sol.history:
                seen = [t for t, p in heard[name]
                        if type(p) is SvrRqst and p.locality >= locality
                        and start <= t <= end]
                if outcome == "sent":
                    # (a packet at the very instant the wait began or ended
                    # may have arrived just outside it)
                    inside = [t for t in seen if start < t < end]
                    self.assertEqual(inside, [], (name, start, end, locality))
                elif outcome == "suppressed":
                    self.assertTrue(seen, (name, start, end, locality))

    def test_storm_without_router(self):
        clock = task.Clock()
        net = SimNetwork(clock, latency=0.001)
        clients, heard = self.make_clients(net, max_locality=8)
        for sol in clients.values():
            sol.solicit()
        run_clock(clock, 60)
        requests = net.requests()
        by_locality = {}
        for _, _, loc in requests:
            by_locality[loc] = by_locality.get(loc, 0) + 1
        # Locality 0 has no pre-request interval: everyone asks once.
        self.assertEqual(by_locality[0], self.N)
        # Wider steps: suppression leaves a handful instead of N each
        # (without it there would be 4 * N = 200 more).
        for loc in (1, 2, 4, 8):
            self.assertGreaterEqual(by_locality.get(loc, 0), 1)
            self.assertLessEqual(by_locality.get(loc, 0), 5, by_locality)
        self.assertLessEqual(len(requests) - self.N, 10, by_locality)
        self.check_suppression_rule(clients, heard)

    def test_storm_with_router(self):
        clock = task.Clock()
        clock.advance(100)
        net = SimNetwork(clock, latency=0.001)
        adv_box = []
        send = net.join("router", lambda p: adv_box[0].received(p))
        adv = Advertiser(clock, send, "router", ["elvin://192.0.2.1:2917"], default=True)
        adv_box.append(adv)
        adv.start()
        clock.advance(10)
        clients, heard = self.make_clients(net, max_locality=64)
        for sol in clients.values():
            sol.solicit()
        run_clock(clock, clock.seconds() + 30)
        requests = net.requests()
        # Everyone sent locality 0 at once; the router's answer then
        # postponed every client: nobody widened the search.
        self.assertEqual(sorted(loc for _, _, loc in requests), [0] * self.N)
        self.assertTrue(all(sol.postponed == 1 for sol in clients.values()))
        adverts = [t for t, who, p, _ in net.log if type(p) is SvrAdvt]
        # start-up, one immediate answer, one coalesced answer 2 s later
        self.assertEqual(len(adverts), 3)
        gaps = [b - a for a, b in zip(adverts, adverts[1:])]
        self.assertGreaterEqual(min(gaps), RATE_LIMIT - 1e-9)
        self.check_suppression_rule(clients, heard)

    def test_storm_with_instant_delivery(self):
        # With no latency the router's first answer arrives while the other
        # clients are still in their (zero-length) wait: they never send.
        clock = task.Clock()
        clock.advance(100)
        net = SimNetwork(clock, latency=0.0)
        adv_box = []
        send = net.join("router", lambda p: adv_box[0].received(p))
        adv = Advertiser(clock, send, "router", ["elvin://192.0.2.1:2917"])
        adv_box.append(adv)
        adv.start()
        clock.advance(10)
        clients, heard = self.make_clients(net, max_locality=64)
        for sol in clients.values():
            sol.solicit()
        run_clock(clock, clock.seconds() + 30)
        self.assertEqual(len(net.requests()), 1)
        self.check_suppression_rule(clients, heard)


class JSONLogTests(unittest.TestCase):
    def test_a_malformed_erdp_packet_is_logged_with_a_text_reason_json_keeps(self):
        """--log-format json keeps only what JSON can hold: the reason is
        text (``why``), not the DecodeError (which would be unpersistable)."""
        import struct
        from twisted.internet.testing import MemoryReactor
        from elvin.discovery.channel import MulticastChannel
        from elvin.test.logjson import kept_fields, log_events
        events = log_events(self)
        channel = MulticastChannel(MemoryReactor(), lambda *a: None, local=())
        channel._datagram(struct.pack(">iii", 16, 4, 0), ("192.0.2.1", 9))     # no locality
        self.assertEqual(channel.malformed, 1)
        (event,) = [e for e in events if "malformed packet" in e.get("log_format", "")]
        self.assertIn("locality", kept_fields(self, event)["why"])
