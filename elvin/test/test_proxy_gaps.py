"""Gaps in what a connected client is fed (docs/proxy.md, "Drops"): a
storage cap reached while a device is connected, and a DropWarn from
upstream while a device is behind, each told by a DropWarn at the place
of the gap in its stream, and counted exactly (what was written to a
client and not yet acknowledged is neither counted nor dropped by the
caps).

The proxy core runs on an in-memory store, upstream a real routing core
(test_proxy_core's InProcessUpstream); time is a Clock.
"""

from twisted.internet.task import Clock as ReactorClock

from elvin.protocols import packets as elvin_packets
from elvin.proxy.core import ACK, EVENT
from elvin.proxy.counters import snapshot
from elvin.test.test_proxy_core import ProxyCoreCase
from elvin.values import Int64

DW = "DropWarn"


def stream(packets):
    """The notifications' ``n`` and the DropWarns, in the order written."""
    seen = []
    for p in packets:
        if isinstance(p, elvin_packets.DropWarn):
            seen.append(DW)
        elif isinstance(p, elvin_packets.NotifyDeliver) and EVENT not in p.attributes:
            seen.append(p.attributes["n"])
    return seen


class GapCase(ProxyCoreCase):

    def device(self, window, name="phone"):
        """A session with a subscription, and its acknowledging client."""
        phone, out = self.join(name, Ack_Window=window)
        self.subscribe(phone, out, "require(n)")
        out.take()
        return phone, out

    def ack(self, client, count):
        self.request(client, elvin_packets.QosRqst(next(self.xids), {ACK: Int64(count)}))

    def drain(self, client, out, limit=100):
        """Acknowledge everything written until nothing more comes (bounded)."""
        got = stream(out.take())
        for _ in range(limit):
            self.ack(client, client._sent)
            more = stream(out.take())
            if not more:
                break
            got += more
        return got

    def joined_dropped(self, name="phone", gaps=0):
        """The next client's ``Proxy.Dropped``, checking that ``gaps`` of
        it are gaps of unknown size (``Proxy.Gaps``)."""
        client, out = self.join(name)
        (joined,) = [e for e in self.events(out.take()) if e[EVENT] == "joined"]
        client.connection_lost()
        self.assertEqual(joined["Proxy.Gaps"], gaps)
        return joined["Proxy.Dropped"]


class SessionCapGapTest(GapCase):

    def setUp(self):
        super().setUp(max_stored=10)

    def test_a_cap_reached_while_a_device_is_connected_is_told_where_it_is(self):
        phone, out = self.device(8)
        for n in range(50):
            self.publish({"n": n})
        self.assertEqual(stream(out.take()), list(range(8)))       # the window
        # The 8 in flight are the device's: kept until acknowledged, outside
        # the cap; of the 42 others the newest 10 are kept, 32 dropped.
        self.assertEqual(snapshot(self.core)["dropped"]["session_cap"], 32)
        got = self.drain(phone, out)
        self.assertEqual(got, [DW] + list(range(40, 50)))
        self.assertEqual(len(got) - 1 + 8 + 32, 50)      # received + counted
        phone.connection_lost()
        self.assertEqual(self.joined_dropped(), 32)
        self.flushLoggedErrors()

    def test_the_next_client_is_told_a_cap_s_count_and_a_gap_apart(self):
        """Proxy.Dropped counts the cap's notifications and the gap of
        unknown size as one; Proxy.Gaps says how many of it are gaps."""
        phone, out = self.device(8)
        phone.connection_lost()
        for n in range(15):
            self.publish({"n": n})
        self.core.upstream_dropwarn()
        self.assertEqual(self.joined_dropped(gaps=1), 5 + 1)
        self.assertEqual(self.joined_dropped(), 0)        # told once
        self.flushLoggedErrors()

    def test_in_flight_rows_kept_by_the_cap_go_when_acknowledged(self):
        phone, out = self.device(8)
        for n in range(30):
            self.publish({"n": n})
        self.assertEqual(self.store.stored_count("phone"), 18)     # 8 in flight + 10
        self.ack(phone, 8)
        self.assertLessEqual(self.store.stored_count("phone"), 10)
        self.flushLoggedErrors()

    def test_a_device_that_keeps_up_is_not_warned(self):
        phone, out = self.device(8)
        got = []
        for n in range(40):
            self.publish({"n": n})
            got += stream(out.take())
            self.ack(phone, phone._sent)
        self.assertEqual(got, list(range(40)))
        self.assertEqual(snapshot(self.core)["dropped"]["session_cap"], 0)

    def test_a_turn_rolled_back_drops_nothing_by_the_cap(self):
        """The cap's drops in a reactor turn whose commit fails are rolled
        back with it: every notification of the turn is counted once, as
        not stored, and the cap counts none of them."""
        reactor = self.left_subscribed()
        writable = self.refuse_commits()
        for n in range(30):                       # the cap (10) drops 20 in the turn
            self.publish({"n": n})
        reactor.advance(0)
        writable()
        dropped = snapshot(self.core)["dropped"]
        self.assertEqual((self.core.counters.stored, dropped["session_cap"],
                          dropped["not_stored"]), (0, 0, 30))
        self.clock.now += 2                       # writable again
        for n in range(30, 45):
            self.publish({"n": n})
        reactor.advance(0)
        dropped = snapshot(self.core)["dropped"]
        self.assertEqual((self.core.counters.stored, dropped["session_cap"]), (15, 5))
        self.assertEqual(self.joined_dropped(), 30 + 5)
        self.flushLoggedErrors()

    def test_a_non_acknowledging_client_mid_replay_is_warned_at_the_gap(self):
        reactor = ReactorClock()
        self.core.call_later = reactor.callLater
        self.core.page_size = 4
        phone, out = self.join("phone")
        self.subscribe(phone, out, "require(n)")
        phone.connection_lost()
        for n in range(10):
            self.publish({"n": n})
        reactor.advance(0)
        phone, out = self.join("phone")               # replaying, a page at a time
        self.assertEqual(stream(out.take()), [0, 1, 2, 3])
        for n in range(10, 18):                       # 8 more: the oldest 4 unsent go
            self.publish({"n": n})
        got = []
        for _ in range(20):
            reactor.advance(0)
            got += stream(out.take())
        self.assertEqual(got, [DW] + list(range(8, 18)))
        self.flushLoggedErrors()


class TotalCapGapTest(GapCase):

    def test_the_total_cap_leaves_what_is_in_flight_and_counts_the_rest(self):
        phone, out = self.device(8)
        self.publish({"n": 0})
        size = self.store.total_bytes()
        self.ack(phone, 1)
        stream(out.take())
        self.store.max_total_bytes = size * 10
        for n in range(1, 51):
            self.publish({"n": n})
        got = stream(out.take())
        self.assertEqual(got, list(range(1, 9)))
        dropped = snapshot(self.core)["dropped"]["total_cap"]
        got += self.drain(phone, out)
        received = [n for n in got if n != DW]
        self.assertEqual(len(received) + dropped, 50)
        self.assertGreaterEqual(len(received), 8 + 9)   # the window, and the cap's worth
        self.assertEqual(got.count(DW), 1)
        self.assertEqual(got[8], DW)                     # after the window, at the gap
        self.flushLoggedErrors()


class UpstreamDropPlaceTest(GapCase):

    def test_a_device_behind_gets_the_dropwarn_after_what_was_stored_before(self):
        phone, out = self.device(4)
        for n in range(10):
            self.publish({"n": n})
        self.core.upstream_dropwarn()
        for n in range(10, 15):
            self.publish({"n": n})
        self.assertEqual(stream(out.take()), [0, 1, 2, 3])     # no DropWarn yet
        got = [0, 1, 2, 3] + self.drain(phone, out)
        self.assertEqual(got, list(range(10)) + [DW] + list(range(10, 15)))
        self.flushLoggedErrors()

    def test_a_gap_after_everything_stored_is_told_as_the_replay_ends(self):
        phone, out = self.device(4)
        for n in range(6):
            self.publish({"n": n})
        self.core.upstream_dropwarn()
        got = stream(out.take()) + self.drain(phone, out)
        self.assertEqual(got, list(range(6)) + [DW])
        self.flushLoggedErrors()

    def test_a_live_client_gets_it_after_the_deliveries_of_the_same_turn(self):
        reactor = ReactorClock()
        self.core.call_later = reactor.callLater
        phone, out = self.join("phone", Receipt="non-destructive", Client="pda")
        self.subscribe(phone, out, "require(n)")
        plain, plain_out = self.connect()
        self.subscribe(plain, plain_out, "require(n)")
        out.take(), plain_out.take()
        reactor.advance(0)
        for n in range(3):
            self.publish({"n": n})         # stored: held until the turn commits
        self.core.upstream_dropwarn()
        self.assertEqual(stream(out.take()), [])
        reactor.advance(0)
        self.assertEqual(stream(out.take()), [0, 1, 2, DW])
        self.assertEqual(stream(plain_out.take()), [0, 1, 2, DW])
        self.flushLoggedErrors()


class OtherGapsTest(GapCase):

    def test_a_device_leaving_before_it_reached_an_upstream_gap_leaves_it_counted(self):
        phone, out = self.device(4)
        for n in range(10):
            self.publish({"n": n})
        self.core.upstream_dropwarn()
        self.assertNotIn(DW, stream(out.take()))
        phone.connection_lost()
        self.assertEqual(self.joined_dropped(gaps=1), 1)  # told to the next client
        self.flushLoggedErrors()

    def test_a_gap_counted_in_a_turn_rolled_back_is_still_told(self):
        """A gap counted for a session inside a reactor turn whose commit
        the disk refuses is rolled back with it: it is counted again."""
        reactor = self.left_subscribed()
        writable = self.refuse_commits()
        self.publish({"n": 0})                    # the turn's transaction is open
        self.core.upstream_dropwarn()             # the session's gap, counted in it
        reactor.advance(0)                        # its commit refused
        writable()
        self.assertEqual(self.joined_dropped(gaps=1), 1 + 1)     # the notification, the gap
        self.flushLoggedErrors()

    def test_a_device_told_of_an_upstream_gap_leaves_nothing_counted(self):
        phone, out = self.device(4)
        for n in range(6):
            self.publish({"n": n})
        self.core.upstream_dropwarn()
        self.assertIn(DW, self.drain(phone, out))
        phone.connection_lost()
        self.assertEqual(self.joined_dropped(), 0)
        self.flushLoggedErrors()

    def test_a_notification_the_store_could_not_keep_is_told_where_it_was(self):
        from elvin.proxy.store import StoreFailed
        phone, out = self.device(2)
        for n in range(4):
            self.publish({"n": n})
        real = self.store.store

        def full(*args):
            raise StoreFailed("database or disk is full")
        self.store.store = full
        self.publish({"n": 4})
        self.store.store = real
        self.clock.now += 2                               # writable again
        self.publish({"n": 5})
        self.assertEqual(self.drain(phone, out), [0, 1, 2, 3, DW, 5])
        self.flushLoggedErrors()
