"""The proxy's store (elvin/proxy/store.py): one copy per notification,
TTL and maximum count, destructive and non-destructive receipt, caps,
passwords, and durability across a killed process."""

import os
import subprocess
import sys

from twisted.trial import unittest

from elvin.proxy.store import Store, check_password, hash_password
from elvin.test.places import REPO


class StoreTests(unittest.TestCase):

    def setUp(self):
        self.store = Store()
        self.addCleanup(self.store.close)
        self.store.create_session("phone")
        self.store.put_subscription("phone", 1, 'Group == "chat"')

    def ids(self, notes):
        return [n.id for n in notes]

    def test_stored_in_arrival_order_with_their_subscriptions(self):
        s = self.store
        s.put_subscription("phone", 2, "require(n)")
        a = s.store({"Group": "chat", "n": 1}, {"phone": [1, 2]}, now=10)
        b = s.store({"Group": "chat"}, {"phone": [1]}, now=11)
        notes = s.pending("phone", "dev", now=12)
        self.assertEqual(self.ids(notes), [a, b])
        self.assertEqual(notes[0].subscriptions, (1, 2))
        self.assertEqual(notes[0].attributes, {"Group": "chat", "n": 1})
        self.assertEqual(notes[1].subscriptions, (1,))

    def test_one_copy_however_many_sessions(self):
        s = self.store
        s.create_session("laptop")
        s.put_subscription("laptop", 7, 'Group == "chat"')
        s.store({"Group": "chat"}, {"phone": [1], "laptop": [7]}, now=1)
        self.assertEqual(s.counts()["notifications"], 1)
        self.assertEqual(s.counts()["pending"], 2)
        s.acknowledge("phone", "dev", [n.id for n in s.pending("phone", "dev", 2)])
        self.assertEqual(s.counts()["notifications"], 1)       # laptop is still owed it
        s.acknowledge("laptop", "pc", [n.id for n in s.pending("laptop", "pc", 2)])
        self.assertEqual(s.counts()["notifications"], 0)

    def test_unknown_subscriptions_store_nothing(self):
        self.assertIsNone(self.store.store({"a": 1}, {"phone": [99], "nobody": [1]}, now=1))
        self.assertEqual(self.store.counts()["notifications"], 0)

    def test_time_to_live_is_checked_on_read_and_swept(self):
        s = self.store
        s.put_subscription("phone", 1, 'Group == "chat"', ttl=60)
        note = s.store({"Group": "chat"}, {"phone": [1]}, now=100)
        self.assertEqual(self.ids(s.pending("phone", "dev", now=159)), [note])
        self.assertEqual(s.pending("phone", "dev", now=160), [])     # expired: never read
        self.assertEqual(s.counts()["notifications"], 1)
        self.assertEqual(s.sweep(now=161), (1, False))
        self.assertEqual(s.counts()["notifications"], 0)

    def test_a_longer_ttl_does_not_bring_back_what_expired(self):
        s = self.store
        s.put_subscription("phone", 1, "require(n)", ttl=2)
        for n in range(3):
            s.store({"n": n}, {"phone": [1]}, now=n)
        # At 3.5 the first two have expired (not swept); raising the TTL,
        # or removing it, keeps them expired and extends only the third.
        s.put_subscription("phone", 1, "require(n)", ttl=3600, now=3.5)
        self.assertEqual([n.attributes["n"] for n in s.pending("phone", "dev", now=10)], [2])
        self.assertEqual(s.unexpired_count("phone", 10), 1)
        s.put_subscription("phone", 1, "require(n)", ttl=None, now=11)
        self.assertEqual([n.attributes["n"] for n in s.pending("phone", "dev", now=10**6)],
                         [2])

    def test_expiry_is_per_subscription(self):
        s = self.store
        s.put_subscription("phone", 1, "require(x)", ttl=10)
        s.put_subscription("phone", 2, "require(x)")
        s.store({"x": 1}, {"phone": [1, 2]}, now=0)
        (note,) = s.pending("phone", "dev", now=20)
        self.assertEqual(note.subscriptions, (2,))       # only the one still keeping it

    def test_maximum_count_keeps_the_newest(self):
        s = self.store
        s.put_subscription("phone", 1, "require(n)", max_count=3)
        for i in range(5):
            s.store({"n": i}, {"phone": [1]}, now=i)
        self.assertEqual([n.attributes["n"] for n in s.pending("phone", "dev", now=9)],
                         [2, 3, 4])
        self.assertEqual(s.counts()["notifications"], 3)

    def test_ttl_and_count_together(self):
        """"Up to X seconds and no more than Y of them"."""
        s = self.store
        s.put_subscription("phone", 1, "require(n)", ttl=100, max_count=2)
        for i in range(4):
            s.store({"n": i}, {"phone": [1]}, now=i * 60)
        # at 200: 0 and 1 went over the count; 2 (arrived at 120) is kept
        self.assertEqual([n.attributes["n"] for n in s.pending("phone", "dev", now=200)],
                         [2, 3])
        # at 230: 2 is within the count but too old
        self.assertEqual([n.attributes["n"] for n in s.pending("phone", "dev", now=230)],
                         [3])

    def test_non_destructive_receipt(self):
        s = self.store
        a = s.store({"Group": "chat", "n": 1}, {"phone": [1]}, now=1)
        s.acknowledge("phone", "pda", [a], destructive=False)
        self.assertEqual(s.pending("phone", "pda", now=2), [])       # never twice
        self.assertEqual(self.ids(s.pending("phone", "laptop", now=2)), [a])
        s.acknowledge("phone", "laptop", [a], destructive=True)
        self.assertEqual(s.pending("phone", "other", now=2), [])
        self.assertEqual(s.counts(), {"sessions": 1, "subscriptions": 1, "notifications": 0,
                                      "pending": 0, "delivered": 0})

    def test_paged_reads(self):
        s = self.store
        notes = [s.store({"Group": "chat", "n": i}, {"phone": [1]}, now=i) for i in range(25)]
        got = []
        while True:
            page = s.pending("phone", "dev", now=100, limit=10)
            if not page:
                break
            got += self.ids(page)
            s.acknowledge("phone", "dev", self.ids(page), destructive=False)
        self.assertEqual(got, notes)

    def test_session_cap_drops_the_oldest_and_counts(self):
        s = Store(max_stored=3)
        self.addCleanup(s.close)
        s.create_session("phone")
        s.put_subscription("phone", 1, "require(n)")
        for i in range(5):
            s.store({"n": i}, {"phone": [1]}, now=i)
        self.assertEqual([n.attributes["n"] for n in s.pending("phone", "d", now=9)], [2, 3, 4])
        self.assertEqual(s.take_dropped("phone"), (2, 0))     # notifications, no gap
        self.assertEqual(s.take_dropped("phone"), (0, 0))

    def test_removing_a_subscription_or_session_reclaims(self):
        s = self.store
        s.store({"Group": "chat"}, {"phone": [1]}, now=1)
        s.remove_subscription("phone", 1)
        self.assertEqual(s.counts()["notifications"], 0)
        s.put_subscription("phone", 2, "require(a)")
        s.store({"a": 1}, {"phone": [2]}, now=1)
        s.delete_session("phone")
        self.assertEqual(s.counts(), {"sessions": 0, "subscriptions": 0, "notifications": 0,
                                      "pending": 0, "delivered": 0})

    def test_sessions_and_subscriptions_are_kept(self):
        s = self.store
        with self.assertRaises(KeyError):
            s.create_session("phone")
        s.put_subscription("phone", 3, "require(z)", accept_insecure=False, ttl=5, max_count=9)
        self.assertEqual(s.subscriptions("phone"),
                         [(1, 'Group == "chat"', True, None, None),
                          (3, "require(z)", False, 5.0, 9)])
        s.set_keys("phone", b"keys")
        self.assertEqual(s.session("phone").keys, b"keys")
        self.assertEqual(s.sessions(), ["phone"])
        self.assertIsNone(s.session("nobody"))

    def test_a_failed_batch_stores_nothing(self):
        s = self.store
        with self.assertRaises(RuntimeError):
            with s.batch():
                s.store({"Group": "chat"}, {"phone": [1]}, now=1)
                raise RuntimeError("boom")
        self.assertEqual(s.counts()["notifications"], 0)


class PasswordTests(unittest.TestCase):

    def test_salted_hashes(self):
        first, second = hash_password("secret"), hash_password("secret")
        self.assertNotEqual(first, second)               # salted
        self.assertNotIn(b"secret", first)
        self.assertTrue(check_password(first, "secret"))
        self.assertFalse(check_password(first, "Secret"))
        self.assertFalse(check_password(first, None))
        self.assertTrue(check_password(None, None))      # no password set

    def test_sessions_keep_only_hashes(self):
        s = Store()
        self.addCleanup(s.close)
        record = s.create_session("phone", password="join", admin_password="admin")
        self.assertTrue(check_password(s.session("phone").join_hash, "join"))
        self.assertTrue(check_password(record.admin_hash, "admin"))
        self.assertFalse(check_password(record.join_hash, "admin"))


class DurabilityTests(unittest.TestCase):
    """What was committed survives the process being killed (SIGKILL)."""

    def test_kill_9_loses_nothing_committed(self):
        path = os.path.abspath(self.mktemp() + ".sqlite3")
        code = (
            "import os, signal, sys\n"
            "from elvin.proxy.store import Store\n"
            "s = Store(sys.argv[1])\n"
            "s.create_session('phone')\n"
            "s.put_subscription('phone', 1, 'require(n)')\n"
            "for i in range(500):\n"
            "    with s.batch():\n"
            "        s.store({'n': i}, {'phone': [1]}, now=i)\n"
            "print('stored', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
        done = subprocess.run([sys.executable, "-c", code, path], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        self.assertIn("stored", done.stdout, done.stderr)
        self.assertEqual(done.returncode, -9)
        s = Store(path)
        self.addCleanup(s.close)
        notes = s.pending("phone", "dev", now=1000, limit=1000)
        self.assertEqual([n.attributes["n"] for n in notes], list(range(500)))


class CountKeepingTests(unittest.TestCase):
    """The store keeps each session's count as rows come and go, so its cap
    is checked without counting; the count must always be the true one."""

    def test_counts_stay_exact_under_random_operations(self):
        import random
        rng = random.Random(17)
        store = Store(":memory:", max_stored=7, max_stored_bytes=600)
        for name in ("a", "b"):
            store.create_session(name)
            store.put_subscription(name, 1, "require(n)", max_count=5)
            store.put_subscription(name, 2, "require(m)", ttl=50)
        now = 0.0
        for step in range(400):
            now += 1
            op = rng.random()
            if op < 0.6:
                matches = {name: rng.sample([1, 2], rng.randint(1, 2))
                           for name in rng.sample(["a", "b"], rng.randint(1, 2))}
                store.store({"n": step, "pad": "x" * rng.randint(0, 150)}, matches, now)
            elif op < 0.8:
                name = rng.choice(["a", "b"])
                ids = [n.id for n in store.pending(name, "c", now, limit=3)]
                store.acknowledge(name, "c", ids, destructive=rng.random() < 0.7)
            elif op < 0.85:
                store.sweep(now)
            for name in ("a", "b"):
                size = store.db.execute(
                    "SELECT coalesce(sum(length(body)), 0) FROM notifications WHERE id IN "
                    "(SELECT notification FROM pending WHERE session = ?)", (name,)).fetchone()[0]
                self.assertEqual(store._owed_of(name), [store.stored_count(name), size], step)
                self.assertLessEqual(store.stored_count(name), 7)
                self.assertLessEqual(size, 600)

    def test_byte_cap_drops_oldest_and_counts_them(self):
        store = Store(":memory:", max_stored_bytes=1000)
        store.create_session("s")
        store.put_subscription("s", 1, "require(n)")
        for n in range(10):
            store.store({"n": n, "pad": "x" * 200}, {"s": [1]}, now=n)
        kept = [note.attributes["n"] for note in store.pending("s", "c", now=20)]
        self.assertEqual(kept, list(range(10 - len(kept), 10)))
        self.assertLess(len(kept), 10)
        self.assertEqual(store.take_dropped("s"), (10 - len(kept), 0))


class EarlierDatabaseTests(unittest.TestCase):
    """A database from before notifications were sealed is converted when
    opened: what only secure matches are owed is sealed, the rest stays."""

    def test_secure_only_notifications_in_clear_are_sealed_on_open(self):
        import sqlite3
        path = os.path.abspath(self.mktemp() + ".sqlite3")
        s = Store(path)
        s.create_session("phone")
        s.put_subscription("phone", 1, "require(n)")
        secret = s.store({"n": 1, "word": "secret"}, {"phone": {1: True}}, now=1)
        public = s.store({"n": 2, "word": "public"}, {"phone": {1: False}}, now=2)
        clear = {note: s.sealer.open_body(body) if sealed else bytes(body)
                 for note, body, sealed in s.db.execute(
                     "SELECT id, body, sealed FROM notifications")}
        s.close()
        # As an earlier version left it: no sealed column, every body in clear.
        db = sqlite3.connect(path, isolation_level=None)
        db.executemany("UPDATE notifications SET body = ? WHERE id = ?",
                       [(body, note) for note, body in clear.items()])
        db.execute("ALTER TABLE notifications DROP COLUMN sealed")
        db.close()

        s = Store(path)
        self.addCleanup(s.close)
        self.assertEqual(s.sealed_at_open, 1)
        raw = {note: (bytes(body), sealed) for note, body, sealed in s.db.execute(
            "SELECT id, body, sealed FROM notifications")}
        self.assertEqual(raw[public], (clear[public], 0))
        self.assertEqual(raw[secret][1], 1)
        self.assertNotIn(b"secret", raw[secret][0])
        notes = s.pending("phone", "dev", now=3)
        self.assertEqual([n.attributes["word"] for n in notes], ["secret", "public"])
        s.close()
        again = Store(path)                  # converted once: nothing more to do
        self.addCleanup(again.close)
        self.assertEqual(again.sealed_at_open, 0)

    def session_from_before(self, column, dropped=0):
        """A store with session "old" (``dropped`` counted), opened again
        after ``column`` of its sessions table was taken away, as a
        database from before that column was added."""
        import sqlite3
        path = os.path.abspath(self.mktemp() + ".sqlite3")
        s = Store(path)
        s.create_session("old")
        s.add_dropped("old", dropped)
        s.close()
        db = sqlite3.connect(path, isolation_level=None)
        db.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
        db.close()
        s = Store(path)
        self.addCleanup(s.close)
        return s

    def test_sessions_from_before_creators_were_kept_have_none(self):
        s = self.session_from_before("creator")
        self.assertIsNone(s.session("old").creator)
        s.add_session("new", None, None, now=1, creator="10.0.0.1")
        self.assertEqual(s.session("new").creator, "10.0.0.1")

    def test_gaps_are_counted_apart_and_a_database_from_before_takes_them(self):
        """A gap of unknown size counts one drop and one gap; a session's
        drops from before gaps were kept apart are all notifications."""
        s = self.session_from_before("gaps", dropped=5)
        self.assertEqual(s.take_dropped("old"), (5, 0))
        s.add_dropped("old", 3)                  # three notifications
        s.add_dropped("old", 2, 2)               # two gaps
        self.assertEqual((s.session("old").dropped, s.session("old").gaps), (5, 2))
        self.assertEqual(s.take_dropped("old"), (5, 2))
        self.assertEqual(s.take_dropped("old"), (0, 0))
