"""UDP transport (udp,none,xdr): session-less UNotify datagrams on 127.0.0.1."""

import struct

from twisted.internet import defer, protocol, reactor, task
from twisted.trial import unittest

from elvin import client
from elvin.endpoints import UnsupportedStackError
from elvin.protocols import packets
from elvin.protocols.framing import frame
from elvin.protocols.udp import MAX_UDP_PAYLOAD, UNotifyDatagramProtocol, send_unotify
from elvin.core.router import Router
from elvin.uri import ElvinURI

from elvin.test.transport_fixtures import RouterFixture, wait_until


def unotify_bytes(attrs, major=4, minor=0, insecure=True):
    return packets.encode(packets.UNotify(major, minor, attrs, insecure))


class _Listener(protocol.DatagramProtocol):
    """A client socket that records anything sent back to it."""

    def __init__(self):
        self.received = []

    def datagramReceived(self, data, addr):
        self.received.append(data)


class UDPFixture(RouterFixture):

    max_datagram = None

    def setUp(self):
        super().setUp()
        self.tcp_uri = self.listen_tcp()
        self.udp = UNotifyDatagramProtocol(self.router, max_datagram=self.max_datagram)
        port = reactor.listenUDP(0, self.udp, interface="127.0.0.1",
                                 maxPacketSize=self.udp.read_size)
        self.ports.append(port)
        self.udp_port = port.getHost().port
        self.udp_uri = f"elvin:/udp,none,xdr/127.0.0.1:{self.udp_port}"
        # A raw socket to send hand-made datagrams and to see any reply.
        self.sender = _Listener()
        self.sender_port = reactor.listenUDP(0, self.sender, interface="127.0.0.1")
        self.ports.append(self.sender_port)

    def send(self, data):
        self.sender_port.write(data, ("127.0.0.1", self.udp_port))

    @defer.inlineCallbacks
    def subscriber(self, expression="require(u)"):
        conn = yield client.connect(self.tcp_uri)
        self.connections.append(conn)
        got = []
        yield conn.subscribe(expression, got.append)
        return conn, got


class UNotifyTests(UDPFixture):

    @defer.inlineCallbacks
    def test_unotify_over_udp_delivered(self):
        conn, got = yield self.subscriber()
        yield client.unotify(self.udp_uri, {"u": "hello", "n": 7})
        yield wait_until(lambda: got)
        self.assertEqual(dict(got[0]), {"u": "hello", "n": 7})
        self.assertEqual(got[0].insecure, (next(iter(conn.subscriptions)),))
        self.assertEqual(self.udp.counters["accepted"], 1)
        self.assertEqual(self.router.stats["unotify"], 1)

    @defer.inlineCallbacks
    def test_unotify_over_tcp_delivered(self):
        conn, got = yield self.subscriber()
        yield client.unotify(self.tcp_uri, {"u": "over tcp"})
        yield wait_until(lambda: got)
        self.assertEqual(got[0]["u"], "over tcp")
        self.assertEqual(self.router.stats["unotify"], 1)

    @defer.inlineCallbacks
    def test_many_datagrams(self):
        conn, got = yield self.subscriber("require(n)")
        for n in range(50):
            yield client.unotify(self.udp_uri, {"n": n})
        yield wait_until(lambda: len(got) == 50)
        self.assertEqual(sorted(x["n"] for x in got), list(range(50)))

    @defer.inlineCallbacks
    def test_malformed_dropped_and_counted(self):
        conn, got = yield self.subscriber()
        good = unotify_bytes({"u": "ok"})
        self.send(b"\x00\x00\x00")                       # shorter than a pkt_id
        self.send(b"\xff" * 64)                          # garbage
        self.send(good[:-4])                             # truncated
        self.send(frame(good))                           # framed as on TCP
        self.send(packets.encode(packets.ConnRqst(1, 4, 0)))         # a session packet
        self.send(packets.encode(packets.TestConn()))
        self.send(good)                                  # still works after all that
        yield wait_until(lambda: got)
        yield wait_until(lambda: self.udp.counters["datagrams"] == 7)
        counters = self.udp.counters
        self.assertEqual((counters["malformed"], counters["unexpected"],
                          counters["accepted"], counters["oversize"]), (4, 2, 1, 0))
        self.assertEqual(len(got), 1)
        # Nothing is ever sent back, not even for the session packets.
        yield task.deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(self.sender.received, [])
        self.assertEqual(counters["suppressed"], 0)

    @defer.inlineCallbacks
    def test_incompatible_version_silently_discarded(self):
        conn, got = yield self.subscriber()
        self.send(unotify_bytes({"u": "future"}, major=5))
        self.send(unotify_bytes({"u": "now"}))
        yield wait_until(lambda: got)
        yield wait_until(lambda: self.udp.counters["datagrams"] == 2)
        self.assertEqual([x["u"] for x in got], ["now"])
        self.assertEqual(self.router.stats["unotify"], 1)
        self.assertEqual(self.sender.received, [])
        self.assertEqual((self.udp.counters["incompatible"], self.udp.counters["accepted"]),
                         (1, 1))

    @defer.inlineCallbacks
    def test_router_limits_apply(self):
        """The same attribute limits as a TCP UNotify (Attribute.Max-Count)."""
        conn, got = yield self.subscriber()
        too_many = {f"a{i}": i for i in range(300)}
        too_many["u"] = "big"
        self.send(unotify_bytes(too_many))
        self.send(unotify_bytes({"u": "small"}))
        yield wait_until(lambda: got)
        yield wait_until(lambda: self.udp.counters["datagrams"] == 2)
        self.assertEqual([x["u"] for x in got], ["small"])
        self.assertEqual(self.router.stats["rejected_notifications"], 1)
        self.assertEqual((self.udp.counters["rejected"], self.udp.counters["accepted"]),
                         (1, 1))

    @defer.inlineCallbacks
    def test_udp_session_not_registered_and_survives_shutdown(self):
        conn, got = yield self.subscriber()
        yield client.unotify(self.udp_uri, {"u": 1})
        yield wait_until(lambda: got)
        self.assertEqual(len(self.router.sessions), 1)  # only the subscriber


class OversizeTests(UDPFixture):

    max_datagram = 1024

    @defer.inlineCallbacks
    def test_oversize_dropped_and_counted(self):
        conn, got = yield self.subscriber()
        self.assertEqual(self.udp.read_size, 1025)
        big = unotify_bytes({"u": "x" * 2000})
        self.assertGreater(len(big), 1024)
        self.send(big)
        self.send(unotify_bytes({"u": "x" * 900}))       # fits
        yield wait_until(lambda: got)
        yield wait_until(lambda: self.udp.counters["datagrams"] == 2)
        self.assertEqual(self.udp.counters["oversize"], 1)
        self.assertEqual(len(got), 1)
        self.assertEqual(len(got[0]["u"]), 900)
        self.assertEqual(self.sender.received, [])


class UNotifyDatagramUnitTests(unittest.TestCase):
    """The datagram protocol without sockets."""

    def test_default_limit_is_packet_max_length_capped_by_udp(self):
        router = Router()
        proto = UNotifyDatagramProtocol(router)
        self.assertEqual(proto.max_datagram, MAX_UDP_PAYLOAD)
        self.assertEqual(proto.read_size, MAX_UDP_PAYLOAD + 1)
        spec = router.option_specs["Packet.Max-Length"]
        router.option_specs["Packet.Max-Length"] = spec.with_default(4096)
        self.assertEqual(UNotifyDatagramProtocol(router).max_datagram, 4096)

    def test_delivery_path(self):
        router = Router()
        routed = []
        router.route = lambda attrs, insecure, *keys, **kw: routed.append((attrs, insecure))
        proto = UNotifyDatagramProtocol(router)
        proto.datagramReceived(unotify_bytes({"a": 1}, insecure=False), ("192.0.2.1", 9))
        self.assertEqual(routed, [({"a": 1}, False)])
        self.assertEqual(proto._session.peer, "udp:192.0.2.1:9")
        self.assertNotIn(proto._session, router.sessions)

    def test_drops_reach_status_and_metrics(self):
        """What every UDP listener dropped is in /status.json and /metrics."""
        from prometheus_client import generate_latest
        from elvin.ops.metrics import registry_for
        from elvin.ops.status import snapshot
        router = Router()
        router.route = lambda *args, **kw: None
        first, second = UNotifyDatagramProtocol(router), UNotifyDatagramProtocol(router)
        peer = ("192.0.2.1", 9)
        first.datagramReceived(unotify_bytes({"a": 1}), peer)
        first.datagramReceived(b"\x00\x00\x00\x20junk", peer)
        second.datagramReceived(b"x" * (second.max_datagram + 1), peer)
        totals = snapshot(router, started=0)["totals"]["udp_datagrams"]
        self.assertEqual(totals, {"accepted": 1, "incompatible": 0, "rejected": 0,
                                  "oversize": 1, "malformed": 1, "unexpected": 0})
        text = generate_latest(registry_for(lambda: snapshot(router, started=0))).decode()
        self.assertIn('elvin_udp_datagrams_total{outcome="oversize"} 1.0', text)
        self.assertIn('elvin_udp_datagrams_total{outcome="malformed"} 1.0', text)


class UDPClientTests(unittest.TestCase):
    timeout = 30

    def test_connect_refused_for_udp(self):
        d = client.connect("elvin:/udp,none,xdr/127.0.0.1:2917")
        failure = self.failureResultOf(d, UnsupportedStackError)
        self.assertIn("UNotify", str(failure.value))

    def test_too_big_for_a_datagram(self):
        packet = packets.UNotify(4, 0, {"x": b"\0" * 70000}, True)
        d = send_unotify(reactor, ElvinURI("elvin:/udp,none,xdr/127.0.0.1:2917"), packet)
        self.failureResultOf(d, ValueError)

    @defer.inlineCallbacks
    def test_unotify_by_name(self):
        """A host name is resolved before sending."""
        got = []

        class Catch(protocol.DatagramProtocol):
            def datagramReceived(self, data, addr):
                got.append(data)
        port = reactor.listenUDP(0, Catch(), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        yield client.unotify(f"elvin:/udp,none,xdr/localhost:{port.getHost().port}",
                             {"a": 1})
        yield wait_until(lambda: got)
        packet = packets.decode(got[0])
        self.assertIsInstance(packet, packets.UNotify)
        self.assertEqual(struct.unpack(">i", got[0][:4])[0], 32)  # no length header


class JSONLogTests(unittest.TestCase):
    def test_a_malformed_datagram_is_logged_with_a_text_reason_json_keeps(self):
        """--log-format json keeps only what JSON can hold: the reason is
        text (``why``), not the exception (which would be unpersistable)."""
        from elvin.test.logjson import kept_fields, log_events
        events = log_events(self)
        proto = UNotifyDatagramProtocol(Router())
        proto.datagramReceived(struct.pack(">II", packets.UNotify.ID, 4) + b"\xff", ("192.0.2.1", 9))
        (event,) = [e for e in events if "malformed datagram" in e.get("log_format", "")]
        self.assertIn("UNotify", kept_fields(self, event)["why"])
