"""The HTTP tunnel under the attacks of docs/reliability.md ("The same
attacks on TLS, the HTTP tunnel and UDP"), in memory (StringTransport
and a Clock): tunnels without ConnRqst cannot fill the router's channels,
the tunnel cap follows max-connections as fitted to the open-file limit,
and request bodies never take a temporary file (an open file the gate does
not count). bench/transport_attacks.py measures the same on a real router.
"""

import struct
from types import SimpleNamespace

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial import unittest
from twisted.web import http

from elvin.core.router import Router
from elvin.protocols import packets
from elvin.protocols.httptunnel import ElvinHTTPSite
from elvin.protocols.server import ElvinServerFactory


def frame(packet):
    data = packets.encode(packet)
    return struct.pack(">I", len(data)) + data


CONNRQST = frame(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY))


class TunnelAdmissionTests(unittest.TestCase):

    def setUp(self):
        self.router = Router()
        self.router.max_connections = 10_000          # as configured
        self.site = ElvinHTTPSite(ElvinServerFactory(self.router, Clock()), clock=Clock())
        self.site.timeOut = None
        self.router.max_connections = 8               # as fitted at start, later
        self.addCleanup(self.site.close_all)

    def post(self, body=b"", path=b"/elvin/session", length=None, sent=None):
        """One POST on a new HTTP connection: (status code, response body)."""
        channel = self.site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        length = len(body) if length is None else length
        channel.dataReceived(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                             % (path, length) + (body if sent is None else body[:sent]))
        response = transport.value()
        if not response:
            return None, b""
        head, _, data = response.partition(b"\r\n\r\n")
        return int(head.split()[1]), data

    def test_tunnel_cap_follows_fitted_max_connections(self):
        self.assertEqual(self.site.max_sessions, 8)
        self.assertEqual(self.site.max_connecting, 2)
        codes = [self.post(CONNRQST)[0] for _ in range(9)]
        self.assertEqual(codes, [http.CREATED] * 8 + [http.SERVICE_UNAVAILABLE])
        self.assertEqual(len(self.site.tunnels), 8)
        self.assertEqual(self.site.connecting, {})

    def test_tunnels_without_connrqst_cannot_fill_the_channels(self):
        codes = [self.post()[0] for _ in range(100)]
        self.assertEqual(set(codes), {http.CREATED})
        # Only a quarter of max-connections are kept; the oldest made room.
        self.assertEqual(len(self.site.tunnels), 2)
        self.assertEqual(len(self.router.sessions), 2)
        self.assertEqual(self.site.closed_connecting, 98)
        # A client whose first POST carries ConnRqst is admitted and
        # connected, and stays while the flood goes on.
        code, session_id = self.post(CONNRQST)
        self.assertEqual(code, http.CREATED)
        tunnel = self.site.tunnels[session_id.decode("ascii")]
        self.assertEqual(tunnel.protocol.session.state, tunnel.protocol.session.CONNECTED)
        for _ in range(100):
            self.post()
        self.assertIn(session_id.decode("ascii"), self.site.tunnels)
        self.assertEqual(len(self.site.connecting), 2)
        self.assertEqual(len(self.router.sessions), 3)

    def test_full_of_connected_tunnels_makes_room_from_connecting_ones(self):
        for _ in range(7):
            self.assertEqual(self.post(CONNRQST)[0], http.CREATED)
        self.assertEqual(self.post()[0], http.CREATED)      # 8 tunnels: the cap
        code, _ = self.post(CONNRQST)                       # closes the empty one
        self.assertEqual(code, http.CREATED)
        self.assertEqual((len(self.site.tunnels), len(self.site.connecting)), (8, 0))
        self.assertEqual(self.post(CONNRQST)[0], http.SERVICE_UNAVAILABLE)

    def test_large_bodies_take_no_temporary_file(self):
        opened = []
        self.patch(http.tempfile, "TemporaryFile", lambda *a, **k: opened.append(1))
        # Headers of a 200 KB body and nothing more; half of one; all of a 1 MiB one.
        self.assertEqual(self.post(length=200_000), (None, b""))
        self.assertEqual(self.post(bytes(200_000), sent=100_000), (None, b""))
        code, _ = self.post(CONNRQST + bytes(1 << 20))
        self.assertEqual(opened, [])
        self.assertEqual(code, http.CREATED)


class RequestDeadlineTests(unittest.TestCase):
    """Every HTTP request must arrive whole in time: the first request's
    headers within connect-timeout of the accept, any request within
    REQUEST_TIMEOUT of its first byte plus 1 s per REQUEST_MIN_RATE bytes
    of it (twisted.web's idle timer restarts on every byte)."""

    def setUp(self):
        self.clock = Clock()
        self.router = Router()
        self.site = ElvinHTTPSite(ElvinServerFactory(self.router, self.clock,
                                                     connect_timeout=30), clock=self.clock)
        self.site.timeOut = None
        self.addCleanup(self.site.close_all)
        self.channel = self.site.buildProtocol(None)
        self.pool = SimpleNamespace(requests_timed_out=0)
        self.channel.admission = SimpleNamespace(pool=self.pool, busy=lambda: None,
                                                 idle=lambda: None)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def trickle(self, data, seconds_per_byte=1.0):
        for i in range(len(data)):
            self.channel.dataReceived(data[i:i + 1])
            self.clock.advance(seconds_per_byte)

    def assertTimedOut(self):
        self.assertTrue(self.transport.value().startswith(b"HTTP/1.1 408 "))
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(self.pool.requests_timed_out, 1)

    def assertOpen(self):
        self.assertFalse(self.transport.disconnecting)
        self.assertEqual(self.pool.requests_timed_out, 0)

    def test_first_request_headers_trickled_are_cut_at_connect_timeout(self):
        self.trickle(b"POST /elvin/session HTTP/1.1\r\n"[:29])
        self.assertOpen()                       # 29 s
        self.trickle(b"H")
        self.assertTimedOut()                   # 30 s
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_body_trickled_is_cut_after_the_request_timeout(self):
        self.channel.dataReceived(b"POST /elvin/session HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: 1000\r\n\r\n")
        self.trickle(b"x" * 59)
        self.assertOpen()
        self.clock.advance(1)                  # 60 s, and 100 bytes buy 0.1 s more
        self.assertOpen()
        self.clock.advance(0.2)
        self.assertTimedOut()

    def test_a_slow_link_sending_a_big_body_is_not_cut(self):
        body = CONNRQST + b"\0" * (200 << 10)
        self.channel.dataReceived(b"POST /elvin/session HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: %d\r\n\r\n" % len(body))
        for n in range(0, len(body), 20 << 10):    # 20 KiB every 10 s: 2 KiB/s
            self.channel.dataReceived(body[n:n + (20 << 10)])
            self.clock.advance(10)
        self.assertOpen()
        self.assertIn(b" 201 ", self.transport.value().split(b"\r\n")[0] + b" ")
        # Between requests no deadline runs.
        self.clock.advance(3600)
        self.assertOpen()

    def test_later_requests_have_the_request_timeout_only(self):
        self.channel.dataReceived(b"POST /elvin/session HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: 0\r\n\r\n")
        self.clock.advance(100)
        self.transport.clear()
        request = b"GET /elvin/session/x HTTP/1.1\r\nHost: x\r\nUser-Agent: slow\r\n" * 2
        self.trickle(request[:59])
        self.assertOpen()                       # past connect-timeout
        self.clock.advance(2)
        self.assertTimedOut()
