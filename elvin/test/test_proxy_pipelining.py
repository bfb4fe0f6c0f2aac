"""Requests sent together, one waiting for upstream: the proxy answers them
in request order, as a router does, and a DisconnRqst after the replies to
everything before it (the client protocol's 7.4.5: the client reads until
DisconnRply).

Upstream is test_proxy_core's InProcessUpstream, its answers to
subscription requests held until the test lets them through.
"""

from twisted.internet import defer

from elvin.protocols import packets as elvin_packets
from elvin.test.test_proxy_core import InProcessUpstream, ProxyCoreCase


class SlowUpstream(InProcessUpstream):
    """Answers subscription requests only when ``answer`` is called."""

    def __init__(self):
        super().__init__()
        self.later = []

    def _held(self, real):
        d = defer.Deferred()
        self.later.append((real, d))
        return d

    def subscribe(self, *args):
        return self._held(super().subscribe(*args))

    def modify(self, *args):
        return self._held(super().modify(*args))

    def answer(self):
        later, self.later = self.later, []
        for real, d in later:
            real.chainDeferred(d)


def kinds(packets):
    return [(type(p).__name__, getattr(p, "xid", None)) for p in packets]


class PipeliningTest(ProxyCoreCase):

    def setUp(self):
        super().setUp()
        self.upstream.session.connection_lost("replaced")
        self.upstream = SlowUpstream()
        self.upstream.core = self.core
        self.core.upstream = self.upstream
        self.upstream.up()

    def test_disconnect_waits_for_the_reply_to_a_subscription_before_it(self):
        for client, out in (self.connect(), self.join("phone")):
            out.take()
            client.packet_received(elvin_packets.SubAddRqst(2, "require(n)", True))
            client.packet_received(elvin_packets.DisconnRqst(4))
            self.assertEqual(kinds(out.take()), [])
            self.assertFalse(out.closed)
            self.upstream.answer()
            self.assertEqual(kinds(out.take()), [("SubRply", 2), ("DisconnRply", 4)])
            self.assertTrue(out.closed)

    def test_replies_keep_request_order(self):
        client, out = self.join("phone")
        out.take()
        client.packet_received(elvin_packets.SubAddRqst(2, "require(n)", True))
        client.packet_received(elvin_packets.QosRqst(3, {}))
        client.packet_received(elvin_packets.SubAddRqst(5, "require(m)", True))
        client.packet_received(elvin_packets.SubDelRqst(6, 999))
        self.upstream.answer()
        self.assertEqual(kinds(out.take()), [("SubRply", 2), ("QosRply", 3)])
        self.upstream.answer()                   # the second waited for the first
        self.assertEqual(kinds(out.take()), [("SubRply", 5), ("Nack", 6)])

    def test_testconn_is_answered_at_once(self):
        """A client's liveness check is not held behind a request waiting
        for upstream (up to twice upstream-keepalive): the proxy is alive."""
        client, out = self.join("phone")
        out.take()
        client.packet_received(elvin_packets.SubAddRqst(2, "require(n)", True))
        client.packet_received(elvin_packets.TestConn())
        self.assertEqual(kinds(out.take()), [("ConfConn", None)])
        self.upstream.answer()
        self.assertEqual(kinds(out.take()), [("SubRply", 2)])

    def test_a_modification_waits_too(self):
        client, out = self.connect()
        client.packet_received(elvin_packets.SubAddRqst(2, "require(n)", True))
        self.upstream.answer()
        (reply,) = [p for p in out.take() if isinstance(p, elvin_packets.SubRply)]
        client.packet_received(elvin_packets.SubModRqst(3, reply.subscription_id,
                                                        "require(m)", True))
        client.packet_received(elvin_packets.DisconnRqst(4))
        self.assertEqual(kinds(out.take()), [])
        self.upstream.answer()
        self.assertEqual(kinds(out.take()), [("SubRply", 3), ("DisconnRply", 4)])

    def test_what_waits_is_bounded(self):
        client, out = self.connect()
        client.MAX_AWAITING = 3
        client.packet_received(elvin_packets.SubAddRqst(2, "require(n)", True))
        for xid in range(3, 7):
            client.packet_received(elvin_packets.QosRqst(xid, {}))
        self.assertTrue(out.aborted or out.closed)
        self.assertEqual(kinds(out.take())[-1], ("Disconn", None))
        self.flushLoggedErrors()
