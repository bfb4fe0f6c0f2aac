"""The client connection's lifecycle machine (``elvin.clientcore.lifecycle``)
without I/O: events in, effects out, a fake clock and a list of packets
sent. Also: importing the asyncio and blocking clients loads no Twisted."""

import os
import subprocess
import sys

from twisted.trial import unittest

from elvin.clientcore.lifecycle import (CancelTimer, CloseChannel, ConnectFailedEffect,
                                        Connected, Dial, Ended, HandshakeTimeout, Lifecycle,
                                        PauseReading, Phase, ResumeReading, StartTimer)
from elvin.clientcore.state import (ClientState, CloseUnconfirmed, ConnectionClosed, NackError,
                                    PublishBufferFull, Reconnect, RequestTimeout)
from elvin.protocols import packets
from elvin.test.places import REPO
from elvin.uri import ElvinURI

A = ElvinURI("elvin://a.test:2917")
B = ElvinURI("elvin://b.test:2917")


class Sub:
    """A subscription as the machine sees one: an id and ``_end``."""

    def __init__(self, sub_id, expression="require(x)"):
        self.id = sub_id
        self.expression = expression
        self.accept_insecure = True
        self.ended = []

    def _end(self, error=None):
        self.ended.append(error)


class Harness:
    def __init__(self, uris=(A,), **kw):
        self.now = 0.0
        self.effects = []
        self.sent = []
        self.session = ClientState()
        kw.setdefault("timeout", 10.0)
        self.machine = Lifecycle(self.session, list(uris), self.effects.append,
                                 lambda: self.now, **kw)

    def take(self):
        effects, self.effects[:] = list(self.effects), []
        return effects

    def sent_kinds(self):
        sent, self.sent[:] = list(self.sent), []
        return [type(p).__name__ for p in sent]

    def open(self):
        """Dialled: returns the ConnRqst sent."""
        self.machine.dialled(self.sent.append)
        return self.sent[-1]

    def up(self, options=None):
        self.machine.start()
        rqst = self.open()
        self.machine.packet(packets.ConnRply(rqst.xid, options or {}))
        self.take()
        self.sent.clear()


class LifecycleTests(unittest.SynchronousTestCase):

    def test_first_connect(self):
        h = Harness()
        h.machine.start({"Subscription.Max-Count": 8})
        self.assertEqual(h.take(), [Dial(A)])
        self.assertIs(h.machine.phase, Phase.DIALLING)
        rqst = h.open()
        self.assertEqual(type(rqst), packets.ConnRqst)
        self.assertEqual(rqst.options, {"Subscription.Max-Count": 8})
        self.assertEqual(h.take(), [StartTimer(10.0)])
        h.machine.packet(packets.ConnRply(rqst.xid, {"Subscription.Max-Count": 8}))
        self.assertEqual(h.take(), [CancelTimer(), Connected()])
        self.assertIs(h.machine.phase, Phase.UP)
        self.assertEqual(h.session.options, {"Subscription.Max-Count": 8})

    def test_first_connect_refused_fails_without_retry(self):
        h = Harness()
        h.machine.start()
        h.take()
        refused = ConnectionRefusedError()
        h.machine.dial_failed(refused)
        self.assertEqual(h.take(), [CancelTimer(), ConnectFailedEffect(refused)])
        self.assertIs(h.machine.phase, Phase.CLOSED)

    def test_first_connect_retried_when_asked(self):
        h = Harness(retry_connect=True, reconnect=Reconnect(initial=0.1, jitter=0))
        h.machine.start()
        h.take()
        h.machine.dial_failed(ConnectionRefusedError())
        self.assertEqual(h.take(), [StartTimer(0.1)])
        h.machine.timer_fired()
        self.assertEqual(h.take(), [Dial(A)])
        h.machine.dial_failed(ConnectionRefusedError())
        self.assertEqual(h.take(), [StartTimer(0.2)])

    def test_handshake_timeout(self):
        h = Harness()
        h.machine.start()
        h.open()
        h.take()
        h.machine.timer_fired()
        effects = h.take()
        self.assertEqual(effects[0], CloseChannel(abort=True))
        self.assertIsInstance(effects[-1], ConnectFailedEffect)
        self.assertIsInstance(effects[-1].cause, HandshakeTimeout)

    def test_close_is_polite_and_ends_iterators_normally(self):
        h = Harness()
        h.up()
        sub = Sub(1)
        h.session.subscriptions[1] = sub
        h.machine.close()
        self.assertEqual(h.sent_kinds(), ["DisconnRqst"])
        self.assertTrue(h.machine.is_closed)
        self.assertEqual(h.take(), [StartTimer(5.0)])
        h.machine.packet(packets.DisconnRply(2))
        self.assertEqual(h.take(), [CloseChannel(abort=False)])
        h.machine.channel_lost()
        self.assertEqual(h.take(), [CancelTimer(), Ended(None)])
        self.assertEqual(sub.ended, [None])
        self.assertIsNone(h.machine.close_reason)

    def test_close_fails_waiting_requests_at_once(self):
        h = Harness()
        h.up()
        errors = []
        h.session.request(h.session.sub_add_rqst("x == 1", True, None), self.fail,
                          errors.append)
        h.session.ping(self.fail, errors.append)
        h.machine.close()
        self.assertEqual([str(e) for e in errors], ["connection is closed"] * 2)
        disconn = h.sent[-1]
        self.assertEqual(h.sent_kinds(), ["SubAddRqst", "TestConn", "DisconnRqst"])
        h.machine.packet(packets.DisconnRply(disconn.xid))
        h.machine.channel_lost()
        self.assertEqual(len(errors), 2)
        self.assertIsNone(h.machine.close_reason)

    def test_lost_ends_iterators_with_the_error(self):
        h = Harness()
        h.up()
        sub = Sub(1)
        h.session.subscriptions[1] = sub
        h.machine.channel_lost("reset by peer")
        (error,) = sub.ended
        self.assertIsInstance(error, ConnectionClosed)
        self.assertIn("was lost: reset by peer", str(error))
        self.assertIsNone(error.reason)
        self.assertEqual(h.take()[-1], Ended(error))

    def test_router_shutdown_says_so(self):
        h = Harness()
        h.up()
        sub = Sub(1)
        h.session.subscriptions[1] = sub
        disconns = []
        h.session.on_disconnect = lambda reason, text: disconns.append((reason, text))
        h.machine.packet(packets.Disconn(1, "router is shutting down"))
        self.assertEqual(h.take(), [CloseChannel(abort=False)])
        h.machine.channel_lost()
        (error,) = sub.ended
        self.assertEqual((error.reason, error.disconn_args), (1, "router is shutting down"))
        self.assertIn("shutting down", str(error))
        self.assertNotIn("lost", str(error))
        self.assertEqual(disconns, [(1, "router is shutting down")])

    def test_pending_request_fails_when_lost(self):
        h = Harness()
        h.up()
        errors = []
        h.session.request(h.session.sub_add_rqst("x == 1", True, None), None, errors.append)
        h.machine.channel_lost()
        self.assertIsInstance(errors[0], ConnectionClosed)

    def test_reconnect_buffers_then_replays_and_flushes(self):
        h = Harness(reconnect=Reconnect(initial=0.1, jitter=0))
        h.up()
        sub = Sub(7)
        h.session.subscriptions[7] = sub
        events = []
        h.session.on_connection_lost = lambda e: events.append("lost")
        h.session.on_reconnected = lambda c: events.append("back")
        h.machine.channel_lost()
        self.assertEqual(events, ["lost"])
        self.assertEqual(h.take(), [StartTimer(0.1)])
        self.assertFalse(h.machine.is_closed)
        h.session.emit({"kept": 1})               # buffered, no error
        replies = []
        h.session.request(h.session.qos_rqst({}), replies.append, replies.append)
        self.assertEqual(h.sent, [])
        h.machine.timer_fired()
        self.assertEqual(h.take(), [Dial(A)])
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertIs(h.machine.phase, Phase.REPLAYING)
        (readd,) = [p for p in h.sent if type(p) is packets.SubAddRqst]
        h.sent.clear()
        h.machine.packet(packets.SubRply(readd.xid, 70))
        self.assertIs(h.machine.phase, Phase.UP)
        self.assertEqual(sub.id, 70)
        self.assertEqual(list(h.session.subscriptions), [70])
        self.assertEqual(h.sent_kinds(), ["NotifyEmit", "QosRqst"])
        self.assertEqual(events, ["lost", "back"])
        self.assertEqual(h.machine.reconnects, 1)
        self.assertEqual(sub.ended, [])

    def test_buffer_full_is_an_error(self):
        h = Harness(reconnect=Reconnect(), pending_size=64)
        h.up()
        h.machine.channel_lost()
        h.session.emit({"a": 1})
        with self.assertRaises(PublishBufferFull):
            h.session.emit({"a": "x" * 100})
        h.machine.close()
        ended = h.take()[-1]
        self.assertIsInstance(ended, Ended)
        self.assertIsInstance(ended.error, CloseUnconfirmed)  # what the buffer held
        self.assertEqual(ended.error.unsent, 1)

    def test_no_buffer_refuses_at_once(self):
        h = Harness(reconnect=Reconnect(), pending_size=0)
        h.up()
        h.machine.channel_lost()
        with self.assertRaises(ConnectionClosed) as caught:
            h.session.emit({"a": 1})
        self.assertNotIsInstance(caught.exception, PublishBufferFull)

    def test_gives_up_after_attempts(self):
        h = Harness(reconnect=Reconnect(initial=0.1, attempts=2, jitter=0))
        h.up()
        sub = Sub(1)
        h.session.subscriptions[1] = sub
        h.machine.channel_lost()
        for _ in range(2):
            h.machine.timer_fired()
            h.machine.dial_failed(ConnectionRefusedError("refused"))
        self.assertIs(h.machine.phase, Phase.CLOSED)
        self.assertIn("gave up reconnecting", str(sub.ended[0]))

    def test_giving_up_says_what_was_not_sent(self):
        h = Harness(reconnect=Reconnect(initial=0.1, attempts=1, jitter=0))
        h.up()
        h.machine.channel_lost()
        h.session.emit({"a": 1})
        h.session.emit({"a": 2})
        with self.assertLogs("elvin.client", "WARNING") as logged:
            h.machine.timer_fired()
            h.machine.dial_failed(ConnectionRefusedError("refused"))
        self.assertIs(h.machine.phase, Phase.CLOSED)
        (line,) = logged.output
        self.assertIn("gave up reconnecting", line)
        self.assertIn("2 queued packets", line)

    def test_closing_while_away_says_what_was_not_sent(self):
        h = Harness(reconnect=Reconnect())
        h.up()
        h.machine.channel_lost()
        h.session.emit({"a": 1})
        with self.assertLogs("elvin.client", "WARNING") as logged:
            h.machine.close()
        (line,) = logged.output
        self.assertIn("1 packet queued (", line)

    def test_backoff_is_short_and_capped(self):
        delays = list(Reconnect(attempts=12).delays(rng=lambda: 1.0))
        self.assertLess(max(delays), 2.0)
        self.assertLess(delays[0], 0.2)

    def test_retry_now_dials_at_once_and_keeps_the_backoff(self):
        h = Harness(reconnect=Reconnect(initial=0.1, factor=2, maximum=1.0, jitter=0))
        h.up()
        self.assertFalse(h.machine.retry_now())       # up: nothing to do
        h.machine.channel_lost()
        self.assertEqual(h.take(), [StartTimer(0.1)])
        h.machine.timer_fired()
        h.machine.dial_failed(ConnectionRefusedError())
        self.assertEqual(h.take(), [Dial(A), StartTimer(0.2)])
        self.assertTrue(h.machine.retry_now())        # told the router is back
        self.assertEqual(h.take(), [CancelTimer(), Dial(A)])
        self.assertFalse(h.machine.retry_now())       # already dialling
        self.assertEqual(h.take(), [])
        h.machine.dial_failed(ConnectionRefusedError())
        self.assertEqual(h.take(), [StartTimer(0.4)])  # the back-off goes on
        self.assertTrue(h.machine.retry_now())
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertIs(h.machine.phase, Phase.UP)
        self.assertEqual(h.machine.reconnects, 1)
        self.assertFalse(h.machine.retry_now())

    def test_retry_now_does_nothing_once_closed(self):
        h = Harness(reconnect=Reconnect(jitter=0))
        h.up()
        h.machine.channel_lost()
        h.machine.close()
        h.take()
        self.assertFalse(h.machine.retry_now())
        self.assertEqual(h.take(), [])

    def test_fails_over_between_uris(self):
        h = Harness(uris=(A, B), retry_connect=True)
        h.machine.start()
        self.assertEqual(h.take(), [Dial(A)])
        h.machine.dial_failed(ConnectionRefusedError())
        self.assertEqual(h.take(), [Dial(B)])
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertEqual(h.machine.uri, B)

    def test_first_connect_tries_each_uri_once(self):
        h = Harness(uris=(A, B))           # no retry_connect: one round, then fail
        h.machine.start()
        self.assertEqual(h.take(), [Dial(A)])
        h.machine.dial_failed(ConnectionRefusedError())
        self.assertEqual(h.take(), [Dial(B)])
        last = ConnectionRefusedError("B too")
        h.machine.dial_failed(last)
        self.assertEqual(h.take(), [CancelTimer(), ConnectFailedEffect(last)])
        self.assertIs(h.machine.phase, Phase.CLOSED)
        h = Harness(uris=(A, B))
        h.machine.start()
        h.machine.dial_failed(ConnectionRefusedError())
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertEqual((h.machine.uri, h.machine.phase), (B, Phase.UP))

    def test_reconnection_fails_over_and_says_so(self):
        h = Harness(uris=(A, B), reconnect=Reconnect(jitter=0))
        h.up()
        moved = []
        h.session.on_redirect = moved.append
        h.machine.channel_lost()
        h.machine.timer_fired()
        self.assertEqual(h.take(), [StartTimer(0.1), Dial(A)])
        h.machine.dial_failed(ConnectionRefusedError())
        self.assertEqual(h.take(), [Dial(B)])
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertEqual((h.machine.uri, moved), (B, [B]))

    def test_redirect_followed_with_requests_kept(self):
        h = Harness()                 # no reconnect policy: redirection still followed
        h.up()
        moved = []
        h.session.on_redirect = moved.append
        h.machine.packet(packets.Disconn(2, "elvin://b.test:2917"))
        h.take()
        h.machine.channel_lost()
        self.assertEqual(h.take(), [Dial(B)])
        self.assertEqual(moved, [B])
        self.assertFalse(h.machine.is_closed)
        h.session.emit({"during": 1})        # no spurious ConnectionClosed
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertIs(h.machine.phase, Phase.UP)
        self.assertIn("NotifyEmit", h.sent_kinds())
        self.assertEqual(moved, [B])         # told once

    def test_redirect_sends_an_unanswered_subscribe_again(self):
        h = Harness()
        h.up()
        replies = []
        xid = h.session.request(h.session.sub_add_rqst("x == 1", True, None),
                                replies.append, replies.append)
        h.machine.packet(packets.Disconn(2, "elvin://b.test:2917"))
        h.machine.channel_lost()
        self.assertEqual(replies, [])                 # not failed: kept for the new router
        h.sent.clear()
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertEqual([(type(p), p.xid) for p in h.sent[1:]], [(packets.SubAddRqst, xid)])
        h.machine.packet(packets.SubRply(xid, 9))
        self.assertEqual([r.subscription_id for r in replies], [9])

    def test_liveness_check_answered_by_the_router_we_are_redirected_to(self):
        """A drained router answers ConnRqst, then redirects: a TestConn
        waiting then is answered by the new router, not failed."""
        h = Harness()
        h.up()
        alive, errors = [], []
        h.session.ping(alive.append, errors.append)
        h.machine.packet(packets.Disconn(2, "elvin://b.test:2917"))
        h.machine.channel_lost()
        self.assertEqual((alive, errors), ([], []))
        h.sent.clear()
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertEqual(h.sent_kinds(), ["ConnRqst", "TestConn"])
        h.machine.packet(packets.ConfConn())
        self.assertEqual((alive, errors), ([True], []))

    def test_liveness_check_fails_if_the_redirection_gives_up(self):
        h = Harness()
        h.up()
        errors = []
        h.session.ping(lambda _: None, errors.append)
        h.machine.packet(packets.Disconn(2, "elvin://b.test:2917"))
        h.machine.channel_lost()
        h.machine.close()
        self.assertEqual([type(e) for e in errors], [ConnectionClosed])

    def test_close_from_a_failed_request_as_the_channel_ends(self):
        """A program that closes in the errback of a request failed by the
        channel's end closes at once: no DisconnRqst on a channel that is
        gone, and the dial of the redirection drops."""
        h = Harness()
        h.up()
        h.session.request(h.session.sub_del_rqst(1), lambda _: None,
                          lambda _: h.machine.close())
        h.machine.packet(packets.Disconn(2, "elvin://b.test:2917"))
        h.take()
        h.sent.clear()
        h.machine.channel_lost()
        self.assertIs(h.machine.phase, Phase.CLOSED)
        effects = h.take()
        self.assertEqual(effects[:2], [CancelTimer(), Dial(B)])  # the request's timeout
        self.assertIn(CloseChannel(abort=True), effects)
        self.assertEqual(effects[-1], Ended(None))
        self.assertEqual(h.sent, [])
        self.assertIsNone(h.machine.close_reason)

    def _retry_in_errback(self, h):
        """A request failed by the channel's end makes requests from its
        errback (Twisted fires errbacks synchronously): what they meet."""
        met = []

        def retry(error):
            met.append(error)
            for call in (lambda: h.session.emit({"again": 1}),
                         lambda: h.session.request(h.session.sub_add_rqst(
                             "require(x)", True, None), met.append, met.append),
                         lambda: h.session.ping(met.append, met.append)):
                try:
                    call()
                    met.append("accepted")
                except ConnectionClosed as e:
                    met.append(e)
        h.session.request(h.session.sub_del_rqst(1), self.fail, retry)
        h.machine.channel_lost("reset")
        return met

    def test_a_request_from_a_failed_requests_errback_is_refused(self):
        h = Harness()
        h.up()
        met = self._retry_in_errback(h)
        self.assertIs(h.machine.phase, Phase.CLOSED)
        self.assertEqual(len(met), 4)
        for error in met:
            self.assertIsInstance(error, ConnectionClosed)
            self.assertIn("was lost: reset", str(error))

    def test_a_request_from_a_failed_requests_errback_waits_for_the_reconnection(self):
        h = Harness(reconnect=Reconnect(jitter=0))
        h.up()
        met = self._retry_in_errback(h)
        self.assertIs(h.machine.phase, Phase.WAITING)
        self.assertIsInstance(met[0], ConnectionClosed)
        self.assertEqual(met[1:3], ["accepted", "accepted"])    # buffered
        self.assertIsInstance(met[3], ConnectionClosed)         # TestConn: not while away
        self.assertGreater(h.machine.buffered, 0)
        h.sent.clear()
        h.machine.timer_fired()
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertEqual(h.sent_kinds(), ["ConnRqst", "NotifyEmit", "SubAddRqst"])

    def test_on_connection_lost_sees_the_reconnecting_phase(self):
        h = Harness(reconnect=Reconnect(jitter=0))
        h.up()
        seen = []
        h.session.on_connection_lost = lambda error: (seen.append(h.machine.phase),
                                                      h.session.emit({"from_hook": 1}))
        h.machine.channel_lost()
        self.assertEqual(seen, [Phase.WAITING])
        self.assertGreater(h.machine.buffered, 0)

    def test_redirect_not_followed_when_refused(self):
        h = Harness()
        h.up()
        h.session.follow_redirects = False
        h.machine.packet(packets.Disconn(2, "elvin://b.test:2917"))
        h.machine.channel_lost()
        self.assertEqual(h.machine.close_reason.reason, 2)

    def test_redirect_loop_ends(self):
        h = Harness()
        h.up()
        for _ in range(6):
            h.machine.packet(packets.Disconn(2, "elvin://b.test:2917"))
            h.machine.channel_lost()
            if h.machine.phase is Phase.CLOSED:
                break
            rqst = h.open()
            h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertIs(h.machine.phase, Phase.CLOSED)
        self.assertIn("redirection loop", str(h.machine.close_reason))

    def test_replay_nack_ends_only_that_subscription(self):
        h = Harness(reconnect=Reconnect(jitter=0))
        h.up()
        a, b = Sub(1, "a == 1"), Sub(2, "b == 1")
        h.session.subscriptions.update({1: a, 2: b})
        h.machine.channel_lost()
        h.machine.timer_fired()
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        first, second = [p for p in h.sent if type(p) is packets.SubAddRqst]
        h.machine.packet(packets.Nack(first.xid, 2006, "too many", ()))
        h.machine.packet(packets.SubRply(second.xid, 20))
        self.assertIs(h.machine.phase, Phase.UP)
        self.assertIsInstance(a.ended[0], NackError)
        self.assertEqual(list(h.session.subscriptions), [20])

    def _back_with(self, h, answers):
        """Reconnect ``h``: the replay's SubAddRqsts answered in order
        (an id, or None for a Nack); returns what was sent after."""
        h.machine.timer_fired()
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        readds = [p for p in h.sent if type(p) is packets.SubAddRqst]
        h.sent.clear()
        for readd, answer in zip(readds, answers):
            h.machine.packet(packets.SubRply(readd.xid, answer) if answer is not None
                             else packets.Nack(readd.xid, 2006, "too many", ()))
        self.assertIs(h.machine.phase, Phase.UP)
        return list(h.sent)

    def test_a_change_waiting_out_a_reconnection_names_the_replayed_id(self):
        """Built as it is sent: the replay gave a's old id to b."""
        h = Harness(reconnect=Reconnect(jitter=0))
        h.up()
        a, b = Sub(1, "a == 1"), Sub(2, "b == 1")
        h.session.subscriptions.update({1: a, 2: b})
        h.machine.channel_lost()
        replies = []
        h.session.request(h.session.sub_mod_rqst(a, "a == 2", True, None, None),
                          replies.append, self.fail)
        h.session.request(h.session.sub_del_rqst(a), replies.append, self.fail)
        modify, remove = self._back_with(h, [2, 1])
        self.assertEqual((type(modify), modify.subscription_id), (packets.SubModRqst, 2))
        self.assertEqual((type(remove), remove.subscription_id), (packets.SubDelRqst, 2))

    def test_a_change_to_what_the_replay_refused_is_not_sent(self):
        h = Harness(reconnect=Reconnect(jitter=0))
        h.up()
        a, b = Sub(1, "a == 1"), Sub(2, "b == 1")
        h.session.subscriptions.update({1: a, 2: b})
        h.machine.channel_lost()
        removed, failed = [], []
        h.session.request(h.session.sub_del_rqst(a), removed.append, self.fail)
        h.session.request(h.session.sub_mod_rqst(a, "a == 2", True, None, None),
                          self.fail, failed.append)
        h.session.emit({"after": 1})
        sent = self._back_with(h, [None, 1])
        self.assertEqual([type(p) for p in sent], [packets.NotifyEmit])
        self.assertEqual(removed, [None])               # done: it is gone
        self.assertEqual([e.code for e in failed], [1002])
        self.assertEqual(h.session._pending, {})

    def test_cancelled_request_is_taken_back_from_the_buffer(self):
        h = Harness(reconnect=Reconnect())
        h.up()
        h.machine.channel_lost()
        xid = h.session.request(h.session.sub_add_rqst("x == 1", True, None),
                                None, None)
        self.assertTrue(h.machine.unsend(xid))
        self.assertEqual(h.machine.buffered, 0)

    def test_abandoned_reply_goes_to_the_late_handler(self):
        h = Harness()
        h.up()
        late = []
        xid = h.session.request(h.session.sub_add_rqst("x == 1", True, None),
                                self.fail, self.fail)
        h.session.abandon(xid, late.append)
        h.machine.packet(packets.SubRply(xid, 5))
        self.assertEqual([r.subscription_id for r in late], [5])

    def test_receive_bound_pauses_and_resumes(self):
        h = Harness(receive_queue=10)
        h.up()
        h.machine.held(9)
        self.assertEqual(h.take(), [])
        h.machine.held(1)
        self.assertEqual(h.take(), [PauseReading()])
        h.machine.held(-4)
        self.assertEqual(h.take(), [])
        h.machine.held(-1)
        self.assertEqual(h.take(), [ResumeReading()])

    def test_close_while_waiting_ends_at_once(self):
        h = Harness(reconnect=Reconnect())
        h.up()
        h.machine.channel_lost()
        h.take()
        h.machine.close()
        self.assertEqual(h.take(), [CancelTimer(), CancelTimer(), Ended(None)])


class LivenessTests(unittest.SynchronousTestCase):
    """A router silent for ``liveness`` seconds is sent TestConn; silence
    after it ends the channel as lost (a half-open TCP connection, a
    router host gone, otherwise never noticed by a subscriber)."""

    def test_off_by_default_in_the_machine(self):
        h = Harness()
        h.up()
        h.machine.timer_fired()
        self.assertEqual((h.take(), h.sent), ([], []))
        self.assertIs(h.machine.phase, Phase.UP)

    def test_silence_then_testconn_then_lost(self):
        h = Harness(liveness=60.0)
        h.machine.start()
        rqst = h.open()
        h.take()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertEqual(h.take(), [StartTimer(60.0), Connected()])
        sub = Sub(1)
        h.session.subscriptions[1] = sub
        h.sent.clear()
        h.machine.timer_fired()                    # the first tick: the handshake was heard
        self.assertEqual((h.take(), h.sent), ([StartTimer(60.0)], []))
        h.machine.timer_fired()                    # 60 s of silence
        self.assertEqual(h.sent_kinds(), ["TestConn"])
        self.assertEqual(h.take(), [StartTimer(10.0)])
        h.machine.timer_fired()                    # no answer in the timeout
        effects = h.take()
        self.assertEqual(effects[0], CloseChannel(abort=True))
        self.assertIsInstance(effects[-1], Ended)
        (error,) = sub.ended
        self.assertIn("no answer to TestConn within 10 s after 60 s without a packet",
                      str(error))
        self.assertIs(h.machine.phase, Phase.CLOSED)
        self.assertEqual(h.machine.close_reason, error)

    def test_any_packet_answers(self):
        h = Harness(liveness=30.0)
        h.up()
        h.machine.timer_fired()
        h.machine.timer_fired()
        self.assertEqual(h.sent_kinds(), ["TestConn"])
        h.machine.packet(packets.DropWarn())      # queued packets instead of ConfConn
        h.take()
        h.machine.timer_fired()
        self.assertEqual((h.take(), h.sent), ([StartTimer(30.0)], []))
        self.assertIs(h.machine.phase, Phase.UP)

    def test_traffic_means_no_probe(self):
        h = Harness(liveness=30.0)
        h.up()
        for _ in range(5):
            h.machine.packet(packets.ConfConn())
            h.machine.timer_fired()
        self.assertEqual(h.sent, [])
        self.assertEqual(h.take(), [StartTimer(30.0)] * 5)

    def test_reading_paused_by_the_program_is_not_silence(self):
        h = Harness(liveness=30.0, receive_queue=1)
        h.up()
        h.machine.held(1)
        h.take()
        for _ in range(3):
            h.machine.timer_fired()
        self.assertEqual(h.sent, [])

    def test_lost_by_silence_reconnects_under_a_policy(self):
        h = Harness(liveness=30.0, reconnect=Reconnect(initial=0.1, jitter=0))
        h.up()
        lost = []
        h.session.on_connection_lost = lost.append
        h.machine.timer_fired()
        h.machine.timer_fired()
        h.machine.timer_fired()
        self.assertIs(h.machine.phase, Phase.WAITING)
        self.assertEqual(len(lost), 1)
        self.assertIn("no answer to TestConn", str(lost[0]))
        self.assertEqual(h.take()[-1], StartTimer(0.1))
        h.machine.timer_fired()
        self.assertEqual(h.take(), [Dial(A)])
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertIn(StartTimer(30.0), h.take())  # checked again on the new channel

    def test_no_timeout_waits_the_liveness_interval(self):
        h = Harness(liveness=20.0, timeout=None)
        h.up()
        h.machine.timer_fired()
        h.machine.timer_fired()
        self.assertEqual(h.take(), [StartTimer(20.0), StartTimer(20.0)])

    def test_set_while_up_restarts_or_stops_the_check(self):
        h = Harness()
        h.up()
        h.machine.liveness = 5
        self.assertEqual(h.take(), [StartTimer(5)])
        h.machine.liveness = 0
        self.assertEqual(h.take(), [CancelTimer()])
        self.assertIsNone(h.machine.liveness)
        with self.assertRaises(ValueError):
            h.machine.liveness = -1

    def test_values(self):
        h = Harness()
        for off in (None, 0, 0.0, float("inf")):
            h.machine.liveness = off
            self.assertIsNone(h.machine.liveness, off)
        h.machine.liveness = 2
        self.assertEqual(h.machine.liveness, 2.0)
        for bad, error in ((float("nan"), ValueError), (-0.5, ValueError), ("5", TypeError),
                           (True, TypeError), ([1], TypeError)):
            with self.assertRaises(error, msg=repr(bad)):
                h.machine.liveness = bad
            with self.assertRaises(error, msg=repr(bad)):
                Harness(liveness=bad)
        self.assertEqual(h.machine.liveness, 2.0)     # unchanged by the refusals

    def test_leaving_up_cancels_the_check(self):
        h = Harness(liveness=30.0)
        h.up()
        h.machine.channel_lost("reset")
        self.assertEqual(h.take()[0], CancelTimer())


class RequestTimeoutTests(unittest.SynchronousTestCase):
    """Each request the program sends waits at most ``timeout`` seconds for
    its reply: then it fails with RequestTimeout and the connection stays
    up (a router that answers TestConn but not a request, as Avis does not
    answer a subscription it cannot parse)."""

    def subscribe(self, h, expression="x == 2147483648", late=None):
        outcome = []
        xid = h.session.request(h.session.sub_add_rqst(expression, True, None),
                                outcome.append, outcome.append, late)
        return xid, outcome

    def test_unanswered_fails_the_request_not_the_connection(self):
        h = Harness()
        h.up()
        xid, outcome = self.subscribe(h)
        self.assertEqual(h.take(), [StartTimer(10.0)])
        h.now = 9.0
        other, answered = self.subscribe(h, "require(y)")
        self.assertEqual(h.take(), [])            # the timer is set for the first already
        h.now = 10.0
        with self.assertLogs("elvin.client", "WARNING") as logged:
            h.machine.timer_fired()
        (error,) = outcome
        self.assertIsInstance(error, RequestTimeout)
        self.assertIsInstance(error, TimeoutError)
        self.assertEqual(str(error), "the router at elvin:4.0/tcp,none,xdr/a.test:2917 did not "
                         "answer SubAddRqst (subscribe 'x == 2147483648') within 10 s")
        self.assertEqual((error.request, error.seconds), ("SubAddRqst", 10.0))
        self.assertEqual(len(logged.output), 1)
        self.assertIn("the connection stays open", logged.output[0])
        self.assertEqual(h.take(), [StartTimer(9.0)])  # for the second, sent at 9 s
        self.assertIs(h.machine.phase, Phase.UP)
        self.assertEqual(answered, [])
        # Its reply comes late: no one's, not the other request's; what it
        # made at the router is removed there.
        with self.assertLogs("elvin.client", "INFO") as logged:
            h.machine.packet(packets.SubRply(xid, 5))
        self.assertEqual(answered, [])
        (undo,) = h.sent[-1:]
        self.assertEqual((type(undo), undo.subscription_id), (packets.SubDelRqst, 5))
        self.assertIn("after it had timed out: removing subscription 5", logged.output[0])
        h.machine.packet(packets.SubRply(undo.xid, 5))
        h.machine.packet(packets.SubRply(other, 6))
        self.assertEqual([r.subscription_id for r in answered], [6])
        h.now = 19.0
        h.machine.timer_fired()                   # answered in time: nothing fails
        self.assertEqual(h.take(), [])
        self.assertEqual(h.session._pending, {})

    def test_a_late_nack_is_dropped_and_logged(self):
        h = Harness()
        h.up()
        xid, outcome = self.subscribe(h)
        h.now = 10.0
        with self.assertLogs("elvin.client", "WARNING"):
            h.machine.timer_fired()
        h.sent.clear()
        with self.assertLogs("elvin.client", "INFO") as logged:
            h.machine.packet(packets.Nack(xid, 2101, "parse error", ()))
        self.assertEqual(len(outcome), 1)
        self.assertEqual(h.sent, [])
        self.assertIn("dropped the router's late Nack to SubAddRqst", logged.output[0])
        h.machine.packet(packets.Nack(xid, 2101, "again", ()))   # unknown now: ignored
        h.machine.packet(packets.SubRply(xid, 3))
        self.assertEqual(h.sent, [])

    def test_a_late_reply_goes_to_the_late_handler(self):
        h = Harness()
        h.up()
        late = []
        xid, outcome = self.subscribe(h, late=late.append)
        h.now = 10.0
        with self.assertLogs("elvin.client", "WARNING"):
            h.machine.timer_fired()
        h.sent.clear()
        h.machine.packet(packets.SubRply(xid, 5))
        self.assertEqual([r.subscription_id for r in late], [5])
        self.assertEqual(h.sent, [])              # the handler decides (the flavours undo)

    def test_a_late_quench_is_removed(self):
        h = Harness()
        h.up()
        xid = h.session.request(h.session.qnch_add_rqst(["x"], True, None),
                                self.fail, lambda error: None)
        h.now = 10.0
        with self.assertLogs("elvin.client", "WARNING"):
            h.machine.timer_fired()
        h.machine.packet(packets.QnchRply(xid, 4))
        self.assertEqual((type(h.sent[-1]), h.sent[-1].quench_id), (packets.QnchDelRqst, 4))

    def test_shares_the_timer_with_the_liveness_check(self):
        h = Harness(liveness=60.0)
        h.up()
        self.subscribe(h)
        self.assertEqual(h.take(), [StartTimer(10.0)])
        h.now = 10.0
        with self.assertLogs("elvin.client", "WARNING"):
            h.machine.timer_fired()
        self.assertEqual(h.take(), [StartTimer(50.0)])  # the liveness tick, as before
        h.now = 60.0
        h.machine.timer_fired()
        self.assertEqual(h.take(), [StartTimer(60.0)])  # a packet was heard: no TestConn
        self.assertEqual(h.sent_kinds(), ["SubAddRqst"])

    def test_a_cancelled_request_keeps_its_late_handler(self):
        h = Harness()
        h.up()
        late = []
        xid, outcome = self.subscribe(h)
        h.session.abandon(xid, late.append)
        h.now = 10.0
        h.machine.timer_fired()
        h.machine.packet(packets.SubRply(xid, 5))
        self.assertEqual((outcome, [r.subscription_id for r in late]), ([], [5]))

    def test_off(self):
        for kw in ({"timeout": None}, {"timeout": 0}):
            h = Harness(**kw)
            h.up()
            self.subscribe(h)
            self.assertEqual(h.take(), [])
        h = Harness()
        h.machine.request_timeout = 0             # no bound, whatever the timeout
        h.up()
        self.subscribe(h)
        self.assertEqual(h.take(), [])

    def test_a_request_timeout_of_its_own(self):
        """``request_timeout`` bounds requests apart from ``timeout`` (the
        proxy's upstream-timeout); ``log_timeouts`` False: no warning (the
        proxy logs its own line)."""
        for timeout in (10.0, None):
            h = Harness(timeout=timeout)
            h.machine.request_timeout = 4.0
            h.machine.log_timeouts = False
            h.up()
            xid, outcome = self.subscribe(h)
            self.assertEqual(h.take()[-1], StartTimer(4.0))
            h.now = 4.0
            with self.assertNoLogs("elvin.client", "WARNING"):
                h.machine.timer_fired()
            self.assertIsInstance(outcome[0], RequestTimeout)
            self.assertEqual(outcome[0].seconds, 4.0)

    def test_a_buffered_request_waits_from_when_it_is_sent(self):
        h = Harness(reconnect=Reconnect(initial=0.1, jitter=0))
        h.up()
        h.machine.channel_lost()
        xid, outcome = self.subscribe(h)
        h.machine.timer_fired()
        h.now = 30.0
        rqst = h.open()
        h.take()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        self.assertEqual(h.take(), [CancelTimer(), StartTimer(10.0)])
        h.now = 40.0
        with self.assertLogs("elvin.client", "WARNING"):
            h.machine.timer_fired()
        self.assertIsInstance(outcome[0], RequestTimeout)

    def test_lost_as_before(self):
        """A request in flight when the channel goes fails with the loss,
        and its timer stops."""
        h = Harness(reconnect=Reconnect(initial=0.1, jitter=0))
        h.up()
        xid, outcome = self.subscribe(h)
        h.take()
        h.machine.channel_lost("reset")
        self.assertEqual(h.take(), [CancelTimer(), StartTimer(0.1)])
        self.assertIsInstance(outcome[0], ConnectionClosed)
        # Timed out on a channel since lost: its reply cannot come on the next.
        h.machine.timer_fired()
        h.now = 10.0
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        h.sent.clear()
        h.machine.packet(packets.SubRply(xid, 5))
        self.assertEqual((len(outcome), h.sent), (1, []))

    def test_timed_out_on_an_old_channel(self):
        h = Harness(reconnect=Reconnect(initial=0.1, jitter=0))
        h.up()
        xid, outcome = self.subscribe(h)
        h.now = 10.0
        with self.assertLogs("elvin.client", "WARNING"):
            h.machine.timer_fired()
        h.machine.channel_lost("reset")
        h.machine.timer_fired()
        rqst = h.open()
        h.machine.packet(packets.ConnRply(rqst.xid, {}))
        h.sent.clear()
        h.machine.packet(packets.SubRply(xid, 5))  # not this channel's: nothing undone
        self.assertEqual(h.sent, [])

    def test_close_from_the_errback(self):
        h = Harness()
        h.up()
        errors = []
        for _ in range(2):
            h.session.request(h.session.sub_add_rqst("x == 1", True, None), self.fail,
                              lambda error: (errors.append(error), h.machine.close()))
        h.now = 10.0
        with self.assertLogs("elvin.client", "WARNING"):
            h.machine.timer_fired()
        self.assertEqual([type(e) for e in errors], [RequestTimeout, ConnectionClosed])
        self.assertIs(h.machine.phase, Phase.CLOSING)
        self.assertEqual(h.take()[-1], StartTimer(5.0))

    def test_described(self):
        from elvin.clientcore.state import describe_request
        s = ClientState()
        for make, text in (
                (s.sub_mod_rqst(3, "x == 1", True, None, None), "SubModRqst (modify subscription 3)"),
                (s.sub_del_rqst(3), "SubDelRqst (remove subscription 3)"),
                (s.qnch_add_rqst(["a", "b"], True, None), "QnchAddRqst (quench a, b)"),
                (s.qnch_mod_rqst(4, ["c"], [], True, None, None), "QnchModRqst (modify quench 4)"),
                (s.qnch_del_rqst(4), "QnchDelRqst (remove quench 4)"),
                (s.sec_rqst(None, None, None, None), "SecRqst (set_keys)"),
                (s.qos_rqst({"b": 1, "a": 2}), "QosRqst (set_options a, b)"),
                (s.sub_add_rqst("x" * 100, True, None),
                 f"SubAddRqst (subscribe {'x' * 80!r}... (100 bytes))")):
            self.assertEqual(describe_request(make(1)), text)


class NoTwistedTests(unittest.SynchronousTestCase):

    def test_asyncio_and_blocking_clients_import_no_twisted(self):
        code = ("import sys, elvin.aio, elvin.sync\n"
                "print(sorted(m for m in sys.modules if m.split('.')[0] == 'twisted'))")
        done = subprocess.run([sys.executable, "-c", code],
                              cwd=REPO, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.strip(), "[]")
