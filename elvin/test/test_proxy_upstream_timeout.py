"""An upstream router that never answers one request (as Avis never answers
``SubAddRqst 'x == 2147483648'``; here one of ``DEAF``) while it answers TestConn and everything
else: the proxy gives that request up after ``upstream-timeout``, refuses
its client (Nack 2006), keeps nothing of it, counts and logs it, serves
every other session meanwhile, and undoes upstream what a late answer made.

In memory, on a fake clock: the real ``Upstream`` and client connection
over iosim to a real ``Router`` that holds back the requests naming
``DEAF`` until the test lets them through; the proxy's clients are
ProxyClients writing to recording outputs.
"""

from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial import unittest

from elvin import errors
from elvin.core.router import Router
from elvin.keys import producer_keys
from elvin.protocols import packets
from elvin.proxy.core import EVENT, ProxyCore
from elvin.proxy.store import Store
from elvin.test.test_proxy_upstream import Net, start_upstream
from elvin.test.test_router import RecordingOutput
from elvin.values import Int64

DEAF = "x == 2147483648L"     # (our router refuses the overflowing int32 at once)
TIMEOUT = 5.0


class DeafRouter(Router):
    """Our router, holding back (``held``) every SubAddRqst and SubModRqst
    whose expression is DEAF until ``answer_late``."""

    def __init__(self):
        super().__init__()
        self.held = []
        self.deaf = True        # False: answers DEAF too, from now on
        self.holds = lambda packet: getattr(packet, "expression", None) == DEAF

    def open_session(self, output, peer=None):
        session = super().open_session(output, peer)
        handle = session.packet_received

        def received(packet):
            if self.deaf and self.holds(packet):
                self.held.append((handle, packet))
            else:
                handle(packet)
        session.packet_received = received
        return session

    def answer_late(self):
        held, self.held = self.held, []
        for handle, packet in held:
            handle(packet)


class UpstreamTimeoutTest(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.net = Net(self.clock)
        self.net.router = self.router = DeafRouter()
        self.store = Store(":memory:")
        self.core = ProxyCore(self.store, None, clock=self.clock.seconds,
                              call_later=self.clock.callLater)
        self.logged = []
        globalLogPublisher.addObserver(self.logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.logged.append)
        self.xids = iter(range(100, 10_000))

    def start(self, **kw):
        """The upstream connection (TestConn every second: it answers)."""
        kw.setdefault("keepalive", 1.0)
        self.upstream = start_upstream(self, self.net, self.clock, self.core,
                                       request_timeout=TIMEOUT, **kw)
        self.core.upstream = self.upstream
        return self.upstream

    def wait(self, seconds, step=0.25):
        for _ in range(round(seconds / step)):
            self.clock.advance(step)
            self.net.flush()

    def join(self, name):
        out = RecordingOutput()
        client = self.core.open_session(out, f"{name}-host")
        client.packet_received(packets.ConnRqst(next(self.xids), 4, 0, {"Proxy.Session": name}))
        self.net.flush()
        out.take()
        return client, out

    def ask(self, client, packet):
        client.packet_received(packet)
        self.net.flush()
        return getattr(packet, "xid", None)

    def subscribe(self, client, out, expression):
        xid = self.ask(client, packets.SubAddRqst(next(self.xids), expression, True))
        (reply,) = [p for p in out.take() if getattr(p, "xid", None) == xid]
        self.assertIsInstance(reply, packets.SubRply)
        return reply.subscription_id

    def publish(self, attributes, keys=packets.Keys.EMPTY, deliver_insecure=True):
        publisher = self.router.open_session(RecordingOutput(), "publisher")
        publisher.packet_received(packets.ConnRqst(1, 4, 0, {}))
        publisher.packet_received(packets.NotifyEmit(attributes, deliver_insecure, keys))
        publisher.connection_lost("done")
        self.net.flush()

    @staticmethod
    def delivered(out):
        return [dict(p.attributes) for p in out.take()
                if isinstance(p, packets.NotifyDeliver) and EVENT not in p.attributes]

    def upstream_expressions(self):
        return sorted(str(entry.subscription.expression)
                      for entry in self.router.subscriptions.values())

    def warnings(self):
        """The lines logged that speak of upstream-timeout."""
        lines = [event["log_format"].format(**event) for event in self.logged
                 if "log_format" in event]
        return [line for line in lines if "upstream-timeout" in line]

    def test_unanswered_subscription_is_refused_others_served_late_reply_undone(self):
        self.start()
        phone, phone_out = self.join("phone")
        xid = self.ask(phone, packets.SubAddRqst(next(self.xids), DEAF, True))
        self.assertEqual(phone_out.take(), [])
        # Meanwhile: another session is served, and the phone's TestConn.
        tablet, tablet_out = self.join("tablet")
        self.subscribe(tablet, tablet_out, "require(y)")
        self.publish({"y": 1})
        self.assertEqual(self.delivered(tablet_out), [{"y": 1}])
        self.ask(phone, packets.TestConn())
        self.assertEqual([type(p) for p in phone_out.take()], [packets.ConfConn])
        self.wait(TIMEOUT - 0.5)
        self.assertEqual(phone_out.take(), [])
        self.wait(0.5)
        (nack,) = phone_out.take()
        self.assertEqual((type(nack), nack.xid, nack.error), (packets.Nack, xid, errors.IMPL_LIMIT))
        self.assertIn("did not answer within 5 s", nack.message)
        # Nothing of it kept; upstream alive and connected all along.
        self.assertEqual([s.expression for s in self.core.subscriptions.values()],
                         ["require(y)"])
        self.assertEqual(self.store.subscriptions("phone"), [])
        self.assertEqual((self.upstream.is_up, self.upstream.connects), (True, 1))
        self.assertEqual(self.core.counters.upstream_timeouts, 1)
        (line,) = self.warnings()
        self.assertIn("SubAddRqst", line)
        self.assertIn("session 'phone'", line)
        self.assertIn(DEAF, line)
        # The phone goes on: its next request is answered.
        self.subscribe(phone, phone_out, "require(z)")
        # The late answer: what it made upstream is removed there.
        self.assertEqual(self.upstream_expressions(), ["require(y)", "require(z)"])
        self.router.answer_late()
        self.net.flush()
        self.assertEqual(self.upstream_expressions(), ["require(y)", "require(z)"])
        self.publish({"x": Int64(2147483648), "y": 2, "z": 3})
        self.assertEqual(self.delivered(tablet_out), [{"x": 2147483648, "y": 2, "z": 3}])
        self.assertEqual(len(self.delivered(phone_out)), 1)        # by require(z) only

    def test_unanswered_modification_is_refused_and_a_late_one_reversed(self):
        self.start()
        phone, phone_out = self.join("phone")
        sub_id = self.subscribe(phone, phone_out, "require(a)")
        xid = self.ask(phone, packets.SubModRqst(next(self.xids), sub_id, DEAF, True))
        self.wait(TIMEOUT)
        (nack,) = phone_out.take()
        self.assertEqual((type(nack), nack.xid, nack.error), (packets.Nack, xid, errors.IMPL_LIMIT))
        self.assertEqual(self.core.subscriptions[sub_id].expression, "require(a)")
        self.assertEqual(self.core.counters.upstream_timeouts, 1)
        self.router.answer_late()
        self.net.flush()
        self.assertEqual(self.upstream_expressions(), ["require(a)"])
        self.publish({"a": 1})
        self.assertEqual(self.delivered(phone_out), [{"a": 1}])

    def test_an_unanswered_change_of_the_sessions_keys_makes_it_again(self):
        # A key the session removes must stop letting notifications
        # through, answered or not: the subscription is made afresh.
        nfn, sub_keys = producer_keys(b"k")
        self.start()
        phone, phone_out = self.join("phone")
        self.ask(phone, packets.SecRqst(next(self.xids), add_sub_keys=sub_keys))
        self.subscribe(phone, phone_out, "require(n)")
        self.publish({"n": 0}, keys=nfn, deliver_insecure=False)
        self.assertEqual(len(self.delivered(phone_out)), 1)
        self.router.holds = lambda packet: isinstance(packet, packets.SubModRqst)
        self.ask(phone, packets.SecRqst(next(self.xids), del_sub_keys=sub_keys))
        self.assertEqual([type(p) for p in phone_out.take()], [packets.SecRply])
        self.wait(TIMEOUT)
        self.assertEqual(self.core.counters.upstream_timeouts, 1)
        (line,) = self.warnings()
        self.assertIn("removed upstream and made again", line)
        self.assertEqual([type(p) for p in phone_out.take()], [packets.DropWarn])
        self.publish({"n": 1}, keys=nfn, deliver_insecure=False)
        self.publish({"n": 2})
        self.assertEqual([n["n"] for n in self.delivered(phone_out)], [2])
        # The change answered at last, on what upstream no longer has.
        self.router.answer_late()
        self.net.flush()
        self.assertEqual(self.upstream_expressions(), ["require(n)"])
        self.publish({"n": 3}, keys=nfn, deliver_insecure=False)
        self.assertEqual(self.delivered(phone_out), [])

    def made_again_unanswered(self):
        """A DEAF subscription made while upstream is down (accepted, made
        upstream when it comes: the proxy's own request), and that request
        given up: (the client, its output, the subscription's id)."""
        self.net.up = False
        self.start(keepalive=0)
        phone, phone_out = self.join("phone")
        sub_id = self.subscribe(phone, phone_out, DEAF)
        self.net.up = True
        self.wait(2)
        self.assertTrue(self.upstream.is_up)
        self.wait(TIMEOUT)
        self.assertEqual(self.core.counters.upstream_timeouts, 1)
        return phone, phone_out, sub_id

    def test_a_subscription_made_again_is_bounded_and_a_late_answer_taken(self):
        # The subscription is kept in its session; a late answer places it.
        phone, phone_out, sub_id = self.made_again_unanswered()
        (line,) = self.warnings()
        self.assertIn("SubAddRqst (made again)", line)
        sub = self.core.subscriptions[sub_id]
        self.assertIn("asked again in 5 s", line)
        self.assertIsNone(sub.upstream_id)
        phone_out.take()
        self.router.answer_late()
        self.net.flush()
        self.assertIsNotNone(sub.upstream_id)
        # What was published while it was unplaced is lost to the phone: told.
        self.assertEqual([type(p) for p in phone_out.take()], [packets.DropWarn])
        self.assertEqual(self.core.counters.upstream_gaps, 1)
        self.publish({"x": Int64(2147483648)})
        self.assertEqual(self.delivered(phone_out), [{"x": 2147483648}])
        # The retry then scheduled finds it placed: nothing more upstream.
        self.wait(TIMEOUT)
        self.assertEqual(self.upstream_expressions(), [DEAF])

    def test_a_subscription_made_again_is_asked_for_again_until_placed(self):
        phone, phone_out, sub_id = self.made_again_unanswered()
        sub = self.core.subscriptions[sub_id]
        phone_out.take()
        # Unanswered again and again: asked at growing intervals (5, 10,
        # 20 s after each timeout), each try counted.
        self.wait(55)
        self.assertEqual(len(self.router.held), 4)
        self.assertEqual(self.core.counters.upstream_timeouts, 4)
        self.assertIsNone(sub.upstream_id)
        self.assertEqual(phone_out.take(), [])
        # Upstream answers again: the next try places it, the phone is told
        # of the gap, and the late answers to the earlier tries are removed.
        self.router.deaf = False
        self.wait(40)
        self.assertIsNotNone(sub.upstream_id)
        self.assertEqual([type(p) for p in phone_out.take()], [packets.DropWarn])
        self.router.answer_late()
        self.net.flush()
        self.assertEqual(self.upstream_expressions(), [DEAF])
        self.publish({"x": Int64(2147483648)})
        self.assertEqual(self.delivered(phone_out), [{"x": 2147483648}])
        self.assertEqual(self.core.counters.upstream_timeouts, 4)

    def test_a_lost_upstream_connection_cancels_the_tries(self):
        # A new connection makes every subscription again: no timer is
        # left for the old one's tries.
        self.made_again_unanswered()
        retries = lambda: [c for c in self.clock.getDelayedCalls()
                           if getattr(c.func, "__name__", "") == "_place_again"]
        self.assertEqual(len(retries()), 1)
        self.net.kill()
        self.assertFalse(self.upstream.is_up)
        self.assertEqual(retries(), [])

    def test_a_subscription_removed_while_unanswered_is_removed_upstream_when_answered(self):
        phone, _, sub_id = self.made_again_unanswered()
        self.ask(phone, packets.SubDelRqst(next(self.xids), sub_id))
        self.router.answer_late()
        self.net.flush()
        self.assertEqual(self.upstream_expressions(), [])
