"""The HTTP tunnel under the attacks of docs/reliability.md ("The same
attacks on TLS, the HTTP tunnel and UDP"), in memory (StringTransport
and a Clock): tunnels without ConnRqst cannot fill the router's channels,
the tunnel cap follows max-connections as fitted to the open-file limit,
and request bodies never take a temporary file (an open file the gate does
not count). bench/transport_attacks.py measures the same on a real router.
"""

import struct

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
