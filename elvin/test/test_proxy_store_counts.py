"""The proxy store's kept counts at a subscription's maximum count
(elvin/proxy/store.py): a subscription at its cap is trimmed a range at a
time, and every count the store keeps in memory (each subscription's rows,
each session's owed notifications and bytes, the bytes of all) stays the
one the database holds: after trims, after a restart on an existing
database, and under random operations."""

import os
import random

from twisted.trial import unittest

from elvin.proxy.store import Store


def recount(store):
    """What the database holds, counted: ({(session, sub): rows},
    {session: [owed, bytes]}, bytes of all)."""
    rows = {(s, i): n for s, i, n in store.db.execute(
        "SELECT session, subscription, count(*) FROM pending GROUP BY 1, 2")}
    owed = {}
    for (name,) in store.db.execute("SELECT name FROM sessions"):
        owed[name] = list(store.db.execute(
            "SELECT count(*), coalesce(sum(length(body)), 0) FROM notifications WHERE id IN "
            "(SELECT notification FROM pending WHERE session = ?)", (name,)).fetchone())
    total = store.db.execute(
        "SELECT coalesce(sum(length(body)), 0) FROM notifications").fetchone()[0]
    return rows, owed, total


class TrimTests(unittest.TestCase):

    def kept(self, store, session, now=0):
        return [(note.attributes["n"], note.subscriptions)
                for note in store.pending(session, "c", now, 1000)]

    def assertCountsExact(self, store, step=None):
        rows, owed, total = recount(store)
        for key in store._sub_rows:
            self.assertEqual(store._sub_rows[key], rows.get(key, 0), (key, step))
        for name in owed:
            self.assertEqual(store._owed_of(name), owed[name], (name, step))
        self.assertEqual(store.total_bytes(), total, step)

    def test_the_oldest_go_and_what_others_keep_stays(self):
        """A trim takes the subscription's oldest; a notification another
        subscription of the session keeps stays owed (with only that one's
        id), one another session is owed stays stored, and the rest go, with
        the records of who had them."""
        store = Store(":memory:", max_total_bytes=10 ** 9)
        self.addCleanup(store.close)
        for name in ("a", "b"):
            store.create_session(name)
        store.put_subscription("a", 1, "require(n)", max_count=3)      # slack 1
        store.put_subscription("a", 2, "require(m)")
        store.put_subscription("b", 1, "require(n)")
        self.assertEqual(store.total_bytes(), 0)
        store.store({"n": 0, "m": 1}, {"a": [1, 2]}, now=0)        # a keeps it through 2
        store.store({"n": 1}, {"a": [1], "b": [1]}, now=1)         # b is owed it
        store.store({"n": 2}, {"a": [1]}, now=2)                   # a alone
        store.acknowledge("a", "pda", [3], destructive=False)       # pda had it
        self.assertEqual(store.counts()["delivered"], 1)
        for n in range(3, 6):
            store.store({"n": n}, {"a": [1]}, now=n)
        self.assertEqual(self.kept(store, "a"), [(0, (2,)), (3, (1,)), (4, (1,)), (5, (1,))])
        self.assertEqual(self.kept(store, "b"), [(1, (1,))])
        self.assertEqual(store.counts()["notifications"], 5)        # 0, 1, 3, 4, 5
        self.assertEqual(store.counts()["delivered"], 0)           # 2 went, and who had it
        self.assertEqual(store.stored_count("a"), 4)
        self.assertCountsExact(store)

    def test_max_count_trims_are_not_drops_but_session_caps_are(self):
        """What a subscription's own maximum count removes is its limit, not
        a loss; what max_stored takes is counted for the next client."""
        store = Store(":memory:", max_stored=6)
        self.addCleanup(store.close)
        store.create_session("s")
        store.put_subscription("s", 1, "require(n)", max_count=2)
        for n in range(10):
            store.store({"n": n}, {"s": [1]}, now=n)
        self.assertEqual(store.take_dropped("s"), (0, 0))
        self.assertEqual([n for n, _ in self.kept(store, "s")], [8, 9])
        store.put_subscription("s", 2, "require(m)")
        for n in range(10, 20):
            store.store({"n": n}, {"s": [2]}, now=n)
        # 2 of sub 1 and 10 of sub 2 against a cap of 6: the 6 oldest dropped
        self.assertEqual(store.take_dropped("s"), (6, 0))
        self.assertEqual([n for n, _ in self.kept(store, "s")], [14, 15, 16, 17, 18, 19])
        self.assertCountsExact(store)

    def test_counts_right_after_a_restart_from_an_existing_database(self):
        path = os.path.join(self.mktemp() + ".db")
        store = Store(path, max_stored=1000, max_total_bytes=10 ** 9)
        store.create_session("s")
        store.create_session("t")
        store.put_subscription("s", 1, "require(n)", max_count=16)     # slack 2
        store.put_subscription("s", 2, "require(m)")
        store.put_subscription("t", 1, "require(n)", max_count=4)
        for n in range(30):
            store.store({"n": n, "m": n}, {"s": [1] + [2] * (n % 3 == 0), "t": [1]}, now=n)
        self.assertCountsExact(store)
        store.close()
        again = Store(path, max_stored=1000, max_total_bytes=10 ** 9)
        self.addCleanup(again.close)
        # Left beyond their caps (within the slack) by the run before: the
        # first store at the cap trims them, and every count is the database's.
        for n in range(30, 33):
            again.store({"n": n}, {"s": [1], "t": [1]}, now=n)
            self.assertCountsExact(again, n)
        self.assertEqual([n for n, subs in self.kept(again, "s") if 1 in subs],
                         list(range(17, 33)))
        self.assertEqual([n for n, subs in self.kept(again, "s") if subs == (2,)],
                         [0, 3, 6, 9, 12, 15])
        self.assertEqual([n for n, _ in self.kept(again, "t")], [29, 30, 31, 32])
        self.assertCountsExact(again)

    def test_counts_stay_exact_with_shared_capped_subscriptions(self):
        """Random stores, acknowledgements, sweeps, changed caps, removed and
        added subscriptions (a session going from one subscription to two
        and back: the two ways a capped one's rows are walked) and
        restarts, with subscriptions of three sessions sharing
        notifications: every kept count matches a recount, and no reader
        sees more than a subscription's maximum count."""
        rng = random.Random(39)
        path = os.path.join(self.mktemp() + ".db")
        names = ["a", "b", "c"]
        caps = {("a", 1): 9, ("a", 2): None, ("b", 1): 17, ("b", 2): 3, ("c", 1): 6}
        open_store = lambda: Store(path, max_stored=40, max_total_bytes=6000)  # noqa: E731
        store = open_store()
        for name in names:
            store.create_session(name)
        for (name, sub), cap in caps.items():
            store.put_subscription(name, sub, f"require(x{sub})", ttl=rng.choice([None, 300]),
                                   max_count=cap)
        now = 0.0
        for step in range(900):
            now += 1
            op = rng.choices(["store", "take", "sweep", "cap", "unsubscribe", "restart",
                              "read"], [70, 10, 5, 5, 4, 3, 7])[0]
            if op == "store":
                matches = {name: rng.sample([1, 2], rng.randint(1, 2))
                           for name in rng.sample(names, rng.randint(1, 3))}
                store.store({"n": step, "pad": "x" * rng.randint(0, 120)}, matches, now)
            elif op == "take":
                name = rng.choice(names)
                taken = [n.id for n in store.pending(name, "c", now, limit=4)]
                store.acknowledge(name, "c", taken, destructive=rng.random() < 0.6)
            elif op == "sweep":
                store.sweep(now)
            elif op == "cap":
                name, sub = rng.choice(sorted(caps))
                caps[name, sub] = rng.choice([None, 2, 5, 12])
                store.put_subscription(name, sub, f"require(x{sub})", ttl=300,
                                       max_count=caps[name, sub])
            elif op == "unsubscribe":
                name = rng.choice(names)
                held = [sub for sub in (1, 2) if (name, sub) in caps]
                if len(held) == 2:                  # back to one subscription
                    sub = rng.choice(held)
                    store.remove_subscription(name, sub)
                    del caps[name, sub]
                else:                               # to two
                    sub = 3 - held[0]
                    caps[name, sub] = rng.choice([None, 4, 11])
                    store.put_subscription(name, sub, f"require(x{sub})",
                                           max_count=caps[name, sub])
            elif op == "restart":
                store.close()
                store = open_store()
            self.assertCountsExact(store, step)
            for (name, sub), cap in caps.items():
                if cap is not None:
                    seen = sum(sub in note.subscriptions
                               for note in store.pending(name, "nobody", now, 1000))
                    self.assertLessEqual(seen, cap, (name, sub, step))
        store.close()


class UnexpiredCountTest(unittest.TestCase):
    """What a joining client is told is stored leaves out what expired
    before the sweep removed it, by the expiry index alone."""

    def test_expired_unswept_rows_are_not_counted(self):
        store = Store(":memory:")
        store.create_session("a")
        store.create_session("b")
        store.put_subscription("a", 1, "require(t)", ttl=3)
        store.put_subscription("a", 2, "require(k)")
        store.put_subscription("b", 1, "require(t)", ttl=3)
        store.store({"t": 0}, {"a": [1], "b": [1]}, now=0)      # expires at 3
        store.store({"t": 1, "k": 1}, {"a": [1, 2]}, now=0)     # kept by 2
        store.store({"k": 2}, {"a": [2]}, now=0)
        store.store({"t": 3}, {"a": [1]}, now=9)                # expires at 12
        self.assertEqual(store.unexpired_count("a", 1), 4)
        self.assertEqual(store.unexpired_count("a", 10), 3)
        self.assertEqual(store.unexpired_count("b", 10), 0)
        self.assertEqual(store.stored_count("a"), 4)             # unswept: still there
        plan = " ".join(str(row) for row in store.db.execute(
            "EXPLAIN QUERY PLAN SELECT count(DISTINCT p.notification) FROM pending p "
            "INDEXED BY pending_by_expiry_set WHERE p.expires IS NOT NULL "
            "AND p.expires <= 10 AND p.session = 'a'"))
        self.assertIn("pending_by_expiry_set", plan)
