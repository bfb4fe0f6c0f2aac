"""What the proxy promises its clients, without a reactor or a socket:
acknowledged delivery (at-least-once) and the faults it must survive,
drops announced, private sessions, limits that hold, a full disk.

The proxy core runs on an in-memory store (or a file in a temporary
folder where the file itself is under test), upstream a real routing core
(test_proxy_core's InProcessUpstream); time is a Clock.
"""

import os
import sqlite3
import tempfile

from twisted.internet import defer
from twisted.internet.task import Clock as ReactorClock
from prometheus_client import generate_latest
from twisted.trial import unittest

from elvin import errors
from elvin.core.keys import consumer_keys, producer_keys
from elvin.protocols import packets as elvin_packets
from elvin.protocols.xdr import Reader
from elvin.proxy.ack import Acknowledger
from elvin.proxy.core import ACK, ACK_WINDOW, EVENT, ProxyCore
from elvin.proxy.counters import registry_for, snapshot
from elvin.proxy.guard import Busy, PasswordGate
from elvin.proxy.store import Store, StoreError, StoreFailed
from elvin.test.test_proxy_core import InProcessUpstream, ProxyCoreCase
from elvin.values import Int64


def key_bytes(keys):
    return sorted(key for _, sets in keys.entries() for ks in sets for key in ks)


def values(packets):
    return [p.attributes["n"] for p in packets
            if isinstance(p, elvin_packets.NotifyDeliver) and EVENT not in p.attributes]


class AcknowledgedDeliveryTest(ProxyCoreCase):
    """A client with Proxy.Ack-Window: what it has not acknowledged is
    delivered again at its next join; at most the window is in flight."""

    def stored(self, count, name="phone"):
        phone, out = self.join(name)
        self.subscribe(phone, out, "require(n)")
        phone.connection_lost()
        for n in range(count):
            self.publish({"n": n})

    def ack(self, client, out, count):
        self.request(client, elvin_packets.QosRqst(next(self.xids), {ACK: Int64(count)}))
        return [p for p in out.sent if isinstance(p, (elvin_packets.QosRply, elvin_packets.Nack))][-1]

    def test_link_dropped_mid_replay_loses_nothing(self):
        self.stored(1000)
        phone, out = self.join("phone", Ack_Window=100)
        conn_rply = out.sent[0]
        self.assertEqual(conn_rply.options[ACK_WINDOW], 100)
        got = values(out.take())
        self.assertEqual(got, list(range(100)))          # the window, no more
        reply = self.ack(phone, out, 60)
        self.assertEqual(reply.options[ACK], 60)
        got += values(out.take())
        self.assertEqual(got, list(range(160)))          # 60 more as 60 were done
        phone.connection_lost()                          # 100 unacknowledged
        phone, out = self.join("phone", Ack_Window=1000)
        again = values(out.take())
        self.assertEqual(again, list(range(60, 1000)))   # none lost, 100 twice
        self.ack(phone, out, len(again))
        self.assertEqual(self.store.stored_count("phone"), 0)

    def test_live_notifications_are_kept_until_acknowledged(self):
        self.stored(0)
        phone, out = self.join("phone", Ack_Window=4)
        out.take()
        for n in range(10):
            self.publish({"n": n})
        self.assertEqual(values(out.take()), [0, 1, 2, 3])     # the window fills
        self.assertEqual(self.store.stored_count("phone"), 10)
        self.ack(phone, out, 2)
        self.assertEqual(values(out.take()), [4, 5])
        self.assertEqual(self.store.stored_count("phone"), 8)
        phone.connection_lost()                           # link drops: 4 in flight
        phone, out = self.join("phone")                   # a plain client now
        self.assertEqual(values(out.take()), list(range(2, 10)))

    def test_deliveries_to_an_acknowledging_client_are_never_dropped(self):
        # A send queue dropping one would shift the client's count against
        # what the proxy wrote: acknowledged would then name the wrong ones.
        self.stored(0)
        phone, out = self.join("phone", Ack_Window=8)
        plain, plain_out = self.join("phone", Receipt="non-destructive", Client="pda")
        out.take()
        plain_out.take()
        self.publish({"n": 1})
        self.assertEqual(values(out.sent), [1])
        self.assertEqual(out.droppable[-1], False)
        self.assertEqual(values(plain_out.sent), [1])
        self.assertEqual(plain_out.droppable[-1], True)

    def test_slow_device_never_has_more_than_the_window(self):
        self.stored(500)
        phone, out = self.join("phone", Ack_Window=32)
        done, most = [], 0
        for _ in range(100):                      # bounded: 500 / 8 steps needed
            got = values(out.take())
            done += got
            most = max(most, len(done) - phone._acked)
            if len(done) == 500 and phone._acked == 500:
                break
            self.ack(phone, out, min(len(done), phone._acked + 8))   # 8 at a time
        self.assertEqual(done, list(range(500)))
        self.assertLessEqual(most, 32)

    def test_non_destructive_acknowledgement_marks_only_this_device(self):
        self.stored(5)
        pda, out = self.join("phone", Ack_Window=10, Receipt="non-destructive", Client="pda")
        self.assertEqual(values(out.take()), [0, 1, 2, 3, 4])
        self.ack(pda, out, 3)
        pda.connection_lost()
        pda, out = self.join("phone", Ack_Window=10, Receipt="non-destructive", Client="pda")
        self.assertEqual(values(out.take()), [3, 4])
        laptop, out = self.join("phone", Receipt="non-destructive", Client="laptop")
        self.assertEqual(values(out.take()), [0, 1, 2, 3, 4])

    def test_restart_mid_replay_loses_nothing(self):
        self.stored(300)
        phone, out = self.join("phone", Ack_Window=50)
        self.ack(phone, out, 20)
        self.restart()                           # as after kill -9 of the proxy
        phone, out = self.join("phone", Ack_Window=1000)
        self.assertEqual(values(out.take()), list(range(20, 300)))

    def test_acknowledging_wrongly_is_a_protocol_error(self):
        self.stored(3)
        phone, out = self.join("phone", Ack_Window=10)
        out.take()
        self.assertEqual(self.ack(phone, out, 4).error, errors.PROT_ERROR)  # only 3 sent
        plain, out = self.join("phone")
        self.assertEqual(self.ack(plain, out, 0).error, errors.PROT_ERROR)

    def test_the_window_is_capped_by_max_inflight(self):
        self.core.max_inflight = 16
        phone, out = self.join("phone", Ack_Window=100000)
        self.assertEqual(out.sent[0].options[ACK_WINDOW], 16)

    def test_acknowledger_counts_and_sends(self):
        sent, reactor = [], ReactorClock()
        ack = Acknowledger(sent.append, reactor.callLater, window=8, interval=0.2)
        for _ in range(5):
            ack.handled()
        self.assertEqual(sent, [{ACK: 2}, {ACK: 4}])
        reactor.advance(0.2)
        self.assertEqual(sent[-1], {ACK: 5})
        self.assertIsNone(ack.flush())                     # nothing new
        ack.reset()
        ack.handled()
        ack.flush()
        self.assertEqual(sent[-1], {ACK: 1})


class SubscribedCase(ProxyCoreCase):
    """A proxy core, and sessions with and without subscriptions."""

    def subscribed(self):
        """Sessions with a subscription: "here" with its client connected,
        "away" without one, and an anonymous one; the outputs of the two
        connected clients."""
        here, here_out = self.join("here")
        self.subscribe(here, here_out, "require(n)")
        away, away_out = self.join("away")
        self.subscribe(away, away_out, "require(n)")
        away.connection_lost()
        plain, plain_out = self.connect()
        self.subscribe(plain, plain_out, "require(n)")
        return here_out, plain_out


class UpstreamDropTest(SubscribedCase):
    """A DropWarn from upstream is counted, logged and passed on."""

    def test_dropwarn_reaches_connected_clients_and_the_next_of_others(self):
        here_out, plain_out = self.subscribed()
        self.core.upstream_dropwarn()
        self.assertTrue(any(isinstance(p, elvin_packets.DropWarn) for p in here_out.take()))
        self.assertTrue(any(isinstance(p, elvin_packets.DropWarn) for p in plain_out.take()))
        self.assertEqual(self.core.counters.upstream_dropwarns, 1)
        self.flushLoggedErrors()
        away, away_out = self.join("away")
        packets = away_out.take()
        joined = [e for e in self.events(packets) if e[EVENT] == "joined"]
        self.assertEqual((joined[0]["Proxy.Dropped"], joined[0]["Proxy.Gaps"]), (1, 1))
        self.assertTrue(any(isinstance(p, elvin_packets.DropWarn) for p in packets))


class PrivateSessionTest(ProxyCoreCase):

    def test_a_session_with_only_an_admin_password_needs_it_to_join(self):
        owner, _ = self.join("mine", Admin_Password="s3cret")
        owner.connection_lost()
        for asked in ({}, {"Password": "guess"}, {"Admin_Password": "wrong"}):
            client, out = self.join("mine", **asked)
            (nack,) = out.take()
            self.assertEqual((nack.error, nack.message), (errors.AUTHZ_FAIL,
                                                          "authorisation failed"))
        client, out = self.join("mine", Admin_Password="s3cret")
        self.assertIsInstance(out.take()[0], elvin_packets.ConnRply)

    def test_admin_clients_are_told_the_session_keys(self):
        nfn, _ = producer_keys(b"n-secret")
        _, sub = consumer_keys(b"s-secret")
        owner, out = self.connect({"Proxy.Session": "k", "Proxy.Admin-Password": "a",
                                   "Proxy.Password": "j"}, nfn_keys=nfn, sub_keys=sub)
        owner.connection_lost()
        admin, out = self.join("k", Admin_Password="a")
        (keys,) = [e for e in self.events(out.take()) if e[EVENT] == "keys"]
        for attribute, given in (("Proxy.Notification-Keys", nfn),
                                 ("Proxy.Subscription-Keys", sub)):
            told = elvin_packets.KEYS.read(Reader(keys[attribute]), "keys")
            self.assertEqual(key_bytes(told), key_bytes(given))
        reader, out = self.join("k", Password="j")
        self.assertFalse([e for e in self.events(out.take()) if e[EVENT] == "keys"])


class GateTest(unittest.TestCase):
    """Password checks bounded and throttled (elvin.proxy.guard)."""

    def setUp(self):
        self.now = [0.0]
        self.running = []

        def run(work):
            d = defer.Deferred()
            self.running.append((d, work))
            return d
        self.gate = PasswordGate(lambda: self.now[0], run=run, workers=2, queue_limit=4)

    def finish(self):
        running, self.running = self.running, []
        for d, work in running:
            d.callback(work())

    def test_guesses_from_one_address_are_throttled_and_a_good_join_goes_first(self):
        attacker, owner = "10.0.0.9", "10.0.0.1"
        checks = 0
        for _ in range(300):
            if self.gate.refuses(attacker, "s"):
                continue
            d = self.gate.submit(attacker, lambda: False)
            d.addCallback(lambda ok: ok or self.gate.failed(attacker, "s"))
            d.addErrback(lambda f: f.trap(Busy))
            checks += 1
            self.finish()
        self.assertEqual(checks, 5)                      # peer_burst, then refused
        self.assertFalse(self.gate.refuses(owner, "s"))  # the owner is not locked out
        got = []
        self.gate.submit(owner, lambda: True).addCallback(got.append)
        self.finish()
        self.assertEqual(got, [True])
        self.now[0] += 60                                 # failures age out
        self.assertFalse(self.gate.refuses(attacker, "s"))

    def test_a_burst_used_up_gives_one_more_only_a_whole_period_later(self):
        for _ in range(5):
            self.gate.failed("10.0.0.9", "s")
        self.now[0] += 0.5                                # a fraction back: not a try
        self.assertTrue(self.gate.refuses("10.0.0.9", "s"))
        self.now[0] += 11.5                               # a whole one back
        self.assertFalse(self.gate.refuses("10.0.0.9", "s"))

    def test_the_queue_is_bounded_and_clean_addresses_go_first(self):
        for i in range(3):                                # 3 suspect addresses
            self.gate.failed(f"10.0.1.{i}", f"x{i}")
        outcomes = []
        for i in range(7):
            d = self.gate.submit(f"10.0.1.{i % 3}", lambda: "suspect")
            d.addCallbacks(outcomes.append, lambda f: outcomes.append(f.trap(Busy)))
        self.assertEqual(outcomes, [Busy])                # 2 running, 4 queued, 1 refused
        good = []
        self.gate.submit("10.0.0.1", lambda: "clean").addCallback(good.append)
        self.assertEqual(outcomes, [Busy, Busy])          # the newest suspect made room
        self.finish()                                     # the 2 that were running
        self.finish()                                     # the clean one goes first
        self.assertEqual(good, ["clean"])

    def test_a_session_guessed_from_many_addresses_still_admits_clean_ones(self):
        for i in range(10):
            self.gate.failed(f"10.0.2.{i}", "s")
        self.assertTrue(self.gate.refuses("10.0.2.1", "s"))    # a guesser, on a hot session
        self.assertFalse(self.gate.refuses("10.0.0.1", "s"))   # a clean address: checked

    def test_a_conn_rqst_with_many_sessions_stops_at_the_first_refusal(self):
        store = Store(":memory:")
        store.create_session("a", password="pa")
        store.create_session("b", password="pb")
        core = ProxyCore(store, InProcessUpstream())
        core.gate = self.gate
        d = core.check_passwords([("a", "wrong", None), ("b", "pb", None)], "10.0.0.3")
        self.finish()
        self.assertEqual(self.running, [])                  # b was never checked
        self.assertEqual([r for _, r, _ in self.successResultOf(d)], [None])


class LimitsTest(unittest.TestCase):
    """Limits that hold, without counting rows or scanning tables."""

    def setUp(self):
        self.store = Store(":memory:")
        self.store.create_session("s")
        self.statements = []
        self.store.db.set_trace_callback(self.statements.append)

    def test_max_count_at_its_cap_counts_no_rows(self):
        self.store.put_subscription("s", 1, "require(n)", max_count=100)
        for n in range(150):
            self.store.store({"n": n}, {"s": [1]}, now=n)
        self.statements.clear()
        for n in range(150, 200):
            self.store.store({"n": n}, {"s": [1]}, now=n)
        self.assertFalse([q for q in self.statements if "count(" in q])
        kept = [note.attributes["n"] for note in self.store.pending("s", "c", 0, 1000)]
        self.assertEqual(kept, list(range(100, 200)))

    def test_max_count_trims_in_steps_and_readers_see_it_exact(self):
        self.store.put_subscription("s", 1, "require(n)", max_count=80)   # slack 10
        self.store.put_subscription("s", 2, "require(m)")
        deletes = []
        for n in range(100):
            self.store.store({"n": n}, {"s": [1]}, now=n)
            self.store.store({"m": n}, {"s": [2]}, now=n)
            deletes.append(sum("DELETE FROM pending" in q for q in self.statements))
        trims = sorted(set(deletes))
        self.assertEqual(len(trims), 2)           # one trim (at 91 rows), not one per store
        self.assertEqual(self.store.stored_count("s"), 180)   # 80 + 100, exact
        kept = [note.attributes.get("n") for note in self.store.pending("s", "c", 0, 1000)]
        self.assertEqual([n for n in kept if n is not None], list(range(20, 100)))

    def test_a_cap_left_lagging_by_an_earlier_run_holds_after_a_restart(self):
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "p.db")
        store = Store(path)
        store.create_session("s")
        store.put_subscription("s", 1, "require(n)", max_count=80)
        for n in range(85):                       # 5 beyond, within the slack
            store.store({"n": n}, {"s": [1]}, now=n)
        store.close()                             # as if killed: nothing trimmed
        again = Store(path)
        self.assertEqual(again.stored_count("s"), 80)
        self.assertEqual(again.pending("s", "c", 0, 1000)[0].attributes["n"], 5)
        again.close()

    def test_a_database_of_the_earlier_layout_is_brought_up_to_date(self):
        path = os.path.join(tempfile.mkdtemp(), "p.db")
        store = Store(path)
        store.create_session("s")
        store.put_subscription("s", 1, "require(n)", max_count=3)
        store.put_subscription("s", 2, "require(m)")
        store.close()
        db = sqlite3.connect(path)
        db.executescript("""
            DROP TABLE pending;
            CREATE TABLE pending (session TEXT NOT NULL, subscription INTEGER NOT NULL,
                notification INTEGER NOT NULL, expires REAL,
                secure INTEGER NOT NULL DEFAULT 1,
                PRIMARY KEY (session, subscription, notification)) WITHOUT ROWID;
            CREATE INDEX pending_by_session ON pending (session, notification);
            CREATE INDEX pending_by_expiry ON pending (expires);
            INSERT INTO notifications (id, arrived, body) VALUES (1, 0, x''), (2, 0, x'');
            INSERT INTO pending (session, subscription, notification) VALUES
                ('s', 1, 1), ('s', 2, 1), ('s', 1, 2);
        """)
        db.close()
        store = Store(path)
        self.assertEqual(store.db.execute(
            "SELECT subscription, notification, capped FROM pending ORDER BY 1, 2").fetchall(),
            [(1, 1, 1), (1, 2, 1), (2, 1, 0)])
        indexes = {name for (name,) in store.db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'pending'")}
        self.assertEqual(indexes, {"pending_by_notification", "pending_by_expiry_set",
                                   "pending_capped"})
        for n in range(3, 6):
            store.store({"n": n}, {"s": [1]}, now=n)
        # sub 1 keeps its newest 3 (3, 4, 5); sub 2 still has 1
        self.assertEqual([note.id for note in store.pending("s", "c", 0)], [1, 3, 4, 5])
        store.close()

    def test_lowered_limits_apply_to_what_is_kept(self):
        self.store.put_subscription("s", 1, "require(n)")
        for n in range(6):
            self.store.store({"n": n}, {"s": [1]}, now=n * 1000.0)
        self.store.put_subscription("s", 1, "require(n)", max_count=2)
        self.assertEqual([n.attributes["n"] for n in self.store.pending("s", "c", 5000)],
                         [4, 5])
        self.store.put_subscription("s", 1, "require(n)", ttl=1, max_count=2)
        self.assertEqual(self.store.pending("s", "c", 5000.5)[0].attributes["n"], 5)
        self.assertEqual(self.store.pending("s", "c", 5001.5), [])

    def test_the_sweep_is_bounded_and_uses_the_expiry_index(self):
        self.store.put_subscription("s", 1, "require(n)", ttl=10)
        self.store.put_subscription("s", 2, "require(m)")
        for n in range(50):
            self.store.store({"n": n}, {"s": [1]}, now=n)
            self.store.store({"m": n}, {"s": [2]}, now=n)
        self.statements.clear()
        self.assertEqual(self.store.sweep(now=1000, limit=20), (20, True))
        self.assertFalse([q for q in self.statements if "NOT IN" in q])
        self.assertEqual(self.store.sweep(now=1000, limit=20), (20, True))
        self.assertEqual(self.store.sweep(now=1000, limit=20), (10, False))
        self.assertEqual(self.store.stored_count("s"), 50)

    def test_a_proxy_wide_byte_cap_drops_the_oldest_with_drop_counts(self):
        store = Store(":memory:", max_total_bytes=3000)
        for name in ("a", "b"):
            store.create_session(name)
            store.put_subscription(name, 1, "require(n)")
        for n in range(40):
            store.store({"n": n, "pad": "x" * 100}, {"a" if n % 2 else "b": [1]}, now=n)
        self.assertLessEqual(store.total_bytes(), 3000)
        self.assertEqual(store.total_bytes(), store.db.execute(
            "SELECT sum(length(body)) FROM notifications").fetchone()[0])
        kept = store.stored_count("a") + store.stored_count("b")
        self.assertEqual(store.take_dropped("a")[0] + store.take_dropped("b")[0], 40 - kept)


class SweepAndExpiryTest(ProxyCoreCase):

    def test_the_sweep_runs_in_steps_across_turns(self):
        reactor = ReactorClock()
        self.core.call_later = reactor.callLater
        self.core.sweep_step = 100
        phone, out = self.join("phone", TTL=5)
        self.subscribe(phone, out, "require(n)")
        phone.connection_lost()
        reactor.advance(0)
        for n in range(250):
            self.publish({"n": n})
        reactor.advance(0)
        self.clock.now += 10
        self.assertEqual(self.core.sweep(), 100)
        self.assertEqual(self.store.counts()["pending"], 150)
        reactor.advance(0)
        reactor.advance(0)
        self.assertEqual(self.store.counts()["pending"], 0)

    def test_a_longer_ttl_does_not_bring_back_what_expired(self):
        phone, out = self.join("phone", TTL=2)
        sub_id = self.subscribe(phone, out, "require(n)")
        phone.connection_lost()
        for n in range(5):
            self.publish({"n": n})
        self.clock.now += 3.5                       # expired, not swept
        admin, admin_out = self.join("phone")
        admin_out.take()
        self.request(admin, elvin_packets.QosRqst(next(self.xids),
                                                  {f"Proxy.TTL.{sub_id}": 3600}))
        admin.connection_lost()
        phone, out = self.join("phone")
        packets = out.take()
        (joined,) = [e for e in self.events(packets) if e[EVENT] == "joined"]
        self.assertEqual(joined["Proxy.Stored"], 0)
        self.assertEqual(values(packets), [])

    def test_idle_sessions_expire_and_leave_upstream(self):
        self.core.session_expiry = 3600
        phone, out = self.join("phone")
        self.subscribe(phone, out, "require(n)")
        busy, _ = self.join("busy")
        phone.connection_lost()
        self.clock.now += 3000
        self.core.sweep()
        self.assertIn("phone", self.core.named)
        self.clock.now += 1000
        self.core.sweep()
        self.assertNotIn("phone", self.core.named)
        self.assertIn("busy", self.core.named)              # it has a client
        self.assertEqual(self.upstream.session.subscriptions, {})


class DiskFullTest(ProxyCoreCase):
    """A store that cannot write: storing stops (counted and logged),
    joining and replaying go on; storing resumes when space is back."""

    def test_full_disk(self):
        reactor = ReactorClock()
        self.core.call_later = reactor.callLater
        phone, out = self.join("phone")
        self.subscribe(phone, out, "require(n)")
        phone.connection_lost()
        for n in range(3):
            self.publish({"n": n})
        reactor.advance(0)
        pages = self.store.db.execute("PRAGMA page_count").fetchone()[0]
        self.store.db.execute(f"PRAGMA max_page_count = {pages}")
        for n in range(3, 400):
            self.publish({"n": n, "pad": "x" * 200})
        reactor.advance(0)
        self.assertGreater(self.core.counters.store_failed, 0)
        self.assertGreater(self.core.counters.not_stored, 0)
        errors_logged = self.flushLoggedErrors()
        self.assertEqual(errors_logged, [])        # a log line, not tracebacks
        phone, out = self.join("phone")
        reactor.advance(0)
        packets = out.take()
        self.assertIsInstance(packets[0], elvin_packets.ConnRply)
        got = values(packets)
        self.assertEqual(got[:3], [0, 1, 2])       # the replay works
        (joined,) = [e for e in self.events(packets) if e[EVENT] == "joined"]
        self.assertGreater(joined["Proxy.Dropped"], 0)
        self.assertTrue(any(isinstance(p, elvin_packets.DropWarn) for p in packets))
        phone.connection_lost()
        self.store.db.execute("PRAGMA max_page_count = 1000000")
        self.clock.now += 2
        self.publish({"n": 1000})
        reactor.advance(0)
        self.assertIsNone(self.core.store_down_until)
        phone, out = self.join("phone")
        reactor.advance(0)
        self.assertIn(1000, values(out.take()))


    def stored_or_not(self, published):
        """``stored`` counts what is in the database, and with ``not_stored``
        every notification published."""
        counters = self.core.counters
        rows = self.store.db.execute("SELECT count(*) FROM notifications").fetchone()[0]
        self.assertEqual(counters.stored, rows)
        self.assertEqual(counters.stored + counters.not_stored, published)
        (joined,) = [e for e in self.events(self.join("phone")[1].take())
                     if e[EVENT] == "joined"]
        self.assertEqual(joined["Proxy.Dropped"], counters.not_stored)

    def test_a_turn_rolled_back_is_not_counted_as_stored(self):
        reactor = self.left_subscribed()
        for n in range(3):
            self.publish({"n": n})
        reactor.advance(0)
        pages = self.store.db.execute("PRAGMA page_count").fetchone()[0]
        self.store.db.execute(f"PRAGMA max_page_count = {pages}")
        for n in range(3, 400):               # one turn: it fills the disk part way
            self.publish({"n": n, "pad": "x" * 200})
        reactor.advance(0)
        self.assertEqual(self.core.counters.store_failed, 1)
        self.assertEqual(self.core.counters.stored, 3)
        self.stored_or_not(400)

    def test_a_turn_whose_commit_fails_is_not_counted_as_stored(self):
        reactor = self.left_subscribed()
        writable = self.refuse_commits()
        for n in range(5):
            self.publish({"n": n})
        reactor.advance(0)
        self.assertEqual(self.core.counters.store_failed, 1)
        self.assertEqual(self.core.counters.stored, 0)
        writable()
        self.clock.now += 2
        self.publish({"n": 5})
        reactor.advance(0)
        self.stored_or_not(6)

    def test_no_session_is_created_while_the_store_cannot_write(self):
        reactor = ReactorClock()
        self.core.call_later = reactor.callLater
        phone, out = self.join("phone")
        self.subscribe(phone, out, "require(n)")
        phone.connection_lost()
        pages = self.store.db.execute("PRAGMA page_count").fetchone()[0]
        self.store.db.execute(f"PRAGMA max_page_count = {pages}")
        for n in range(400):
            self.publish({"n": n, "pad": "x" * 200})
        reactor.advance(0)
        self.assertIsNotNone(self.core.store_down_until)
        # A session row would fit now (as one may where notifications do
        # not), but the store is still in its cannot-write second.
        self.store.db.execute("PRAGMA max_page_count = 1000000")
        _, out = self.join("new")
        (nack,) = out.take()
        self.assertEqual(nack.error, errors.IMPL_LIMIT)
        self.assertIn("cannot create a session now", nack.message)
        self.assertNotIn("new", self.core.named)
        self.assertIsNone(self.store.session("new"))
        phone, out = self.join("phone")                 # joining goes on
        self.assertIsInstance(out.take()[0], elvin_packets.ConnRply)
        phone.connection_lost()
        self.clock.now += 2                             # the store is tried again
        _, out = self.join("new")
        self.assertIsInstance(out.take()[0], elvin_packets.ConnRply)
        self.assertIsNotNone(self.store.session("new"))
        self.assertEqual(self.flushLoggedErrors(), [])


class DatabaseFileTest(unittest.TestCase):

    def setUp(self):
        self.folder = tempfile.mkdtemp()
        self.path = os.path.join(self.folder, "proxy.db")

    def test_files_are_owner_only_whatever_the_umask(self):
        old = os.umask(0o022)
        try:
            store = Store(self.path)
            store.create_session("s")
            store.put_subscription("s", 1, "require(n)")
            store.store({"n": 1}, {"s": [1]}, now=1)
        finally:
            os.umask(old)
        for name in ("proxy.db", "proxy.db-wal", "proxy.db-shm", "proxy.db.key"):
            mode = os.stat(os.path.join(self.folder, name)).st_mode & 0o777
            self.assertEqual(mode, 0o600, name)
        store.close()

    def test_an_existing_readable_database_is_made_private(self):
        Store(self.path).close()
        os.chmod(self.path, 0o644)
        Store(self.path).close()
        self.assertEqual(os.stat(self.path).st_mode & 0o777, 0o600)

    def test_keys_and_secure_only_notifications_are_not_in_clear(self):
        store = Store(self.path)
        store.create_session("s")
        store.set_keys("s", b'{"nfn": "KEYKEYKEY"}')
        store.put_subscription("s", 1, "require(n)", keys=b'{"sub": "SUBKEYSUBKEY"}')
        store.store({"secret": "TOPSECRET"}, {"s": {1: True}}, now=1)
        store.store({"open": "PUBLICTEXT"}, {"s": {1: False}}, now=2)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        raw = b""
        for name in os.listdir(self.folder):
            if not name.endswith(".key"):
                with open(os.path.join(self.folder, name), "rb") as f:
                    raw += f.read()
        for secret in (b"KEYKEYKEY", b"SUBKEYSUBKEY", b"TOPSECRET"):
            self.assertNotIn(secret, raw)
        self.assertIn(b"PUBLICTEXT", raw)                   # only what matched without keys
        self.assertEqual(store.session("s").keys, b'{"nfn": "KEYKEYKEY"}')
        self.assertEqual([n.attributes for n in store.pending("s", "c", 0)],
                         [{"secret": "TOPSECRET"}, {"open": "PUBLICTEXT"}])
        store.close()
        os.remove(self.path + ".key")
        os.rename(self.path, self.path + ".copy")          # the file alone, elsewhere
        with self.assertRaises(StoreError):
            Store(self.path + ".copy")
        self.assertFalse(os.path.exists(self.path + ".copy.key"))

    def sealed_database(self, notifications_only=False):
        """A database holding sealed values, closed; its key file's bytes."""
        store = Store(self.path)
        store.create_session("s")
        if notifications_only:
            store.put_subscription("s", 1, "require(n)")
        else:
            store.set_keys("s", b'{"nfn": "KEYKEYKEY"}')
            store.put_subscription("s", 1, "require(n)", keys=b'{"sub": "SUB"}')
        store.store({"secret": 1}, {"s": {1: True}}, now=1)
        store.close()
        with open(self.path + ".key", "rb") as f:
            return f.read()

    def assert_one_line(self, caught, *words):
        message = str(caught.exception)
        for word in (self.path + ".key",) + words:
            self.assertIn(word, message)
        self.assertNotIn("\n", message)

    def test_a_key_file_that_does_not_match_is_one_clear_error(self):
        for notifications_only in (False, True):
            self.sealed_database(notifications_only)
            with open(self.path + ".key", "wb") as f:
                f.write(os.urandom(32))
            with self.assertRaises(StoreError) as caught:
                Store(self.path)
            self.assert_one_line(caught, "not the one", "move the database aside")
            os.remove(self.path)
            os.remove(self.path + ".key")

    def test_a_missing_key_file_is_one_clear_error_and_not_made_anew(self):
        for notifications_only in (False, True):
            key = self.sealed_database(notifications_only)
            os.remove(self.path + ".key")
            with self.assertRaises(StoreError) as caught:
                Store(self.path)
            self.assert_one_line(caught, "missing", "put that key file back")
            self.assertFalse(os.path.exists(self.path + ".key"))
            with open(self.path + ".key", "wb") as f:          # put back: all there
                f.write(key)
            store = Store(self.path)
            self.assertEqual([n.attributes for n in store.pending("s", "c", 0)], [{"secret": 1}])
            store.close()
            os.remove(self.path)
            os.remove(self.path + ".key")

    def test_a_missing_key_file_is_made_for_a_database_with_nothing_sealed(self):
        store = Store(self.path)
        store.create_session("s")
        store.close()
        os.remove(self.path + ".key")
        Store(self.path).close()
        self.assertEqual(os.stat(self.path + ".key").st_size, 32)

    def test_a_corrupted_database_is_one_clear_error(self):
        with open(self.path, "wb") as f:
            f.write(b"this is not a database" * 100)
        with self.assertRaises(StoreError) as caught:
            Store(self.path)
        message = str(caught.exception)
        self.assertIn(self.path, message)
        self.assertIn("move it aside", message)
        self.assertNotIn("\n", message)


class GapTest(SubscribedCase):
    """What nobody reports is announced too: an upstream outage and the
    proxy's own absence, one gap per session with subscriptions."""

    def reconnect(self):
        """Upstream back (after ``self.upstream.down()``): a new connection."""
        self.upstream = InProcessUpstream()
        self.upstream.core = self.core
        self.core.upstream = self.upstream
        self.upstream.up()

    def gaps(self):
        dropped = snapshot(self.core)["dropped"]
        return dropped["upstream_gap"], dropped["restart"]

    def test_a_restart_is_announced_to_the_next_client_of_each_session(self):
        client, out = self.join("s")
        self.subscribe(client, out, "require(n)")
        client.connection_lost()
        empty, _ = self.join("empty")                  # no subscription: nothing lost
        empty.connection_lost()
        self.restart()
        self.assertEqual(self.gaps(), (0, 1))
        client, out = self.join("s")
        packets = out.take()
        (joined,) = [e for e in self.events(packets) if e[EVENT] == "joined"]
        self.assertEqual((joined["Proxy.Dropped"], joined["Proxy.Gaps"]), (1, 1))
        self.assertEqual(sum(isinstance(p, elvin_packets.DropWarn) for p in packets), 1)
        empty, out = self.join("empty")
        packets = out.take()
        (joined,) = [e for e in self.events(packets) if e[EVENT] == "joined"]
        self.assertEqual(joined["Proxy.Dropped"], 0)
        self.assertFalse(any(isinstance(p, elvin_packets.DropWarn) for p in packets))
        self.flushLoggedErrors()

    def test_a_new_proxy_counts_no_gap(self):
        self.assertEqual(self.gaps(), (0, 0))
        self.restart()                                 # a store with no sessions
        self.assertEqual(self.gaps(), (0, 0))

    def test_an_upstream_outage_is_announced_when_it_ends(self):
        here_out, plain_out = self.subscribed()
        idle, idle_out = self.join("idle")             # no subscription
        bare, bare_out = self.connect()                # anonymous, no subscription
        for out in (here_out, idle_out, plain_out, bare_out):
            out.take()
        self.upstream.down()
        self.assertFalse(any(isinstance(p, elvin_packets.DropWarn) for p in here_out.take()))
        self.assertEqual(self.gaps(), (0, 0))          # told when it ends
        self.reconnect()
        for out, warned in ((here_out, 1), (plain_out, 1), (idle_out, 0), (bare_out, 0)):
            self.assertEqual(sum(isinstance(p, elvin_packets.DropWarn) for p in out.take()), warned)
        self.assertEqual(self.gaps(), (3, 0))          # here, away, plain's own
        self.assertEqual(self.core.counters.upstream_dropwarns, 0)
        away, away_out = self.join("away")
        (joined,) = [e for e in self.events(away_out.take()) if e[EVENT] == "joined"]
        self.assertEqual(joined["Proxy.Dropped"], 1)
        self.flushLoggedErrors()

    def test_each_outage_is_one_gap(self):
        client, out = self.join("s")
        self.subscribe(client, out, "require(n)")
        client.connection_lost()
        for _ in range(2):
            self.upstream.down()
            self.reconnect()
        self.restart()                     # its own outage is the old proxy's
        self.assertEqual(self.gaps(), (0, 1))
        client, out = self.join("s")
        (joined,) = [e for e in self.events(out.take()) if e[EVENT] == "joined"]
        self.assertEqual(joined["Proxy.Dropped"], 3)    # two outages, one restart
        self.assertEqual(joined["Proxy.Gaps"], 3)       # all three of unknown size
        self.flushLoggedErrors()

    def test_the_metric_counts_by_cause(self):
        client, out = self.join("s")
        self.subscribe(client, out, "require(n)")
        self.upstream.down()
        self.reconnect()
        client.connection_lost()
        self.restart()
        text = generate_latest(registry_for(lambda: snapshot(self.core))).decode()
        self.assertIn('elvin_proxy_dropped_total{cause="restart"} 1.0', text)
        self.assertIn('elvin_proxy_dropped_total{cause="upstream_gap"} 0.0', text)
        self.flushLoggedErrors()

    def test_a_gap_the_database_cannot_take_is_told_all_the_same(self):
        client, out = self.join("s")
        self.subscribe(client, out, "require(n)")
        client.connection_lost()

        def full(name, count, gaps=0):
            raise StoreFailed("database or disk is full")
        self.patch(self.store, "add_dropped", full)
        self.upstream.down()
        self.reconnect()
        self.assertEqual(self.core.counters.store_failed, 1)
        self.assertEqual(self.gaps(), (1, 0))
        client, out = self.join("s")
        (joined,) = [e for e in self.events(out.take()) if e[EVENT] == "joined"]
        self.assertEqual((joined["Proxy.Dropped"], joined["Proxy.Gaps"]), (1, 1))
        self.flushLoggedErrors()
