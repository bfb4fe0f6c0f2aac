"""The open-file budget (docs/reliability.md, "Open files"): caps fitted
to the open-file limit, refusal at accept time, idle connections closed
oldest first when a pool is crowded, and a new client served while idle
sockets fill the cap. In memory (StringTransport, Clock), except one
router process under a 256-file limit."""

import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile

from twisted.internet import defer, threads
from twisted.internet.error import ConnectionAborted
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.logger import capturedLogs
from twisted.python.failure import Failure
from twisted.trial import unittest

from elvin.config import RouterConfig, parse
from elvin.core.admission import (CLIENT, FEDERATION, REAP_SLACK, STATUS,
                                  ConnectionBudget, fit_caps)
from elvin.core.router import Router
from elvin.protocols import packets
from elvin.protocols.gate import Admission, GateFactory, raise_open_file_limit
from elvin.protocols.server import ElvinServerFactory
from elvin.test.places import REPO, free_port, wait_listening
from elvin.test.test_server_protocol import frame, unframe
from elvin.test.transport_fixtures import memory_handshake

NOFILE = resource.RLIMIT_NOFILE


class Socket(StringTransport):
    """A StringTransport whose abortConnection tells the protocol at once."""

    aborted = False

    def abortConnection(self):
        if not self.aborted:
            self.aborted = True
            self.protocol.connectionLost(Failure(ConnectionAborted()))


class FitCapsTests(unittest.TestCase):
    """The arithmetic: caps plus reserved files fit the open-file limit."""

    wanted = {CLIENT: 10_000, FEDERATION: 64, STATUS: 32}

    def test_fits_unchanged_when_the_limit_is_high(self):
        caps, lowered = fit_caps(1 << 20, self.wanted, 100)
        self.assertEqual(caps, self.wanted)
        self.assertEqual(lowered, [])

    def test_common_limit_lowers_only_max_connections(self):
        caps, lowered = fit_caps(1024, self.wanted, 82)
        self.assertEqual(caps, {CLIENT: 1024 - 82 - 64 - 32, FEDERATION: 64, STATUS: 32})
        self.assertEqual(lowered, [(CLIENT, 10_000, 846)])
        self.assertLessEqual(sum(caps.values()) + 82, 1024)

    def test_small_limit_lowers_every_pool(self):
        caps, lowered = fit_caps(256, self.wanted, 82)
        room = 256 - 82
        self.assertEqual(caps[FEDERATION], room // 8)
        self.assertEqual(caps[STATUS], room // 8)
        self.assertEqual(caps[CLIENT], room - 2 * (room // 8))
        self.assertEqual([pool for pool, _, _ in lowered], [CLIENT, FEDERATION, STATUS])

    def test_every_cap_stays_at_least_one(self):
        caps, _ = fit_caps(10, self.wanted, 82)
        self.assertEqual(min(caps.values()), 1)

    def test_raise_soft_to_hard(self):
        calls = []
        got = raise_open_file_limit(lambda which: (1024, 4096),
                                    lambda which, limits: calls.append(limits))
        self.assertEqual(calls, [(4096, 4096)])
        self.assertEqual(got, (4096, 4096))

    def test_refused_raise_keeps_the_soft_limit(self):
        def refuse(which, limits):
            raise ValueError("not permitted")
        self.assertEqual(raise_open_file_limit(lambda which: (1024, 4096), refuse),
                         (1024, 4096))

    def test_unlimited_hard_limit_tries_a_finite_ceiling(self):
        calls = []
        got = raise_open_file_limit(lambda which: (1024, resource.RLIM_INFINITY),
                                    lambda which, limits: calls.append(limits))
        self.assertTrue(calls)
        self.assertGreater(got[0], 1024)
        self.assertNotEqual(got[0], resource.RLIM_INFINITY)

    def test_lowering_is_logged_once_from_what_to_what_and_why(self):
        admission = Admission({CLIENT: 10_000, FEDERATION: 64, STATUS: 32}, Clock())
        with capturedLogs() as events:
            caps = admission.fit({CLIENT: 10_000, FEDERATION: 64, STATUS: 32}, 66,
                                 getrlimit=lambda which: (256, 1024),
                                 setrlimit=lambda which, limits: None)
        self.assertEqual(caps[CLIENT], 1024 - 66 - REAP_SLACK - 64 - 32)
        self.assertEqual(admission.budget.pools[CLIENT].cap, caps[CLIENT])
        from twisted.logger import formatEvent
        lines = [formatEvent(e) for e in events]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn(f"max-connections lowered from 10000 to {caps[CLIENT]}", lines[0])
        self.assertIn("open-file limit of 1024", lines[0])

    def test_nothing_logged_when_nothing_lowered(self):
        admission = Admission({CLIENT: 100, FEDERATION: 4, STATUS: 4}, Clock())
        with capturedLogs() as events:
            admission.fit({CLIENT: 100, FEDERATION: 4, STATUS: 4}, 66,
                          getrlimit=lambda which: (4096, 4096),
                          setrlimit=lambda which, limits: None)
        self.assertEqual(list(events), [])


class BudgetTests(unittest.TestCase):
    """The sans-IO policy."""

    def setUp(self):
        self.clock = Clock()
        self.budget = ConnectionBudget({CLIENT: 10, STATUS: 2}, crowded_timeout=2.0,
                                       now=self.clock.seconds)
        self.closed = []

    def open(self, pool=CLIENT):
        admitted, victim = self.budget.admit(pool)
        if victim is not None:
            self.closed.append(victim)
        if not admitted:
            return None
        box = []
        ticket = self.budget.opened(pool, lambda: self.closed.append(box[0]))
        box.append(ticket)
        return ticket

    def test_busy_connections_are_refused_at_the_cap(self):
        tickets = [self.open() for _ in range(10)]
        for ticket in tickets:
            ticket.busy()
        self.assertIsNone(self.open())
        self.assertEqual(self.budget.pools[CLIENT].refused, 1)
        tickets[0].release()
        self.assertIsNotNone(self.open())

    def test_at_the_cap_the_oldest_idle_is_closed_first(self):
        tickets = []
        for _ in range(10):
            tickets.append(self.open())
            self.clock.advance(1)
        tickets[0].busy()
        tickets[4].busy()
        newer = self.open()
        self.assertIsNotNone(newer)
        self.assertEqual(self.closed, [tickets[1]])
        self.open()
        self.assertEqual(self.closed, [tickets[1], tickets[2]])

    def test_making_room_is_bounded_until_files_are_released(self):
        for _ in range(10):
            self.open()
        for _ in range(REAP_SLACK):
            self.assertIsNotNone(self.open())
        self.assertIsNone(self.open())          # 16 still on their way out
        self.closed[0].release()
        self.assertIsNotNone(self.open())

    def test_idle_again_goes_to_the_back(self):
        a, b = self.open(), self.open()
        a.busy()
        self.clock.advance(1)
        a.idle()
        for _ in range(8):
            self.open().busy()
        self.open()
        self.assertEqual(self.closed, [b])

    def test_crowded_pool_closes_idle_after_the_short_timeout(self):
        tickets = [self.open() for _ in range(8)]
        self.assertIsNone(self.budget.next_expiry())    # 8 of 10: not crowded
        tickets.append(self.open())                     # 9 of 10: crowded
        self.assertEqual(self.budget.next_expiry(), 2.0)
        self.clock.advance(1.0)
        self.assertEqual(self.budget.expired(), [])
        self.clock.advance(1.0)
        expired = self.budget.expired()
        self.assertEqual(expired, [tickets[0]])         # oldest; then not crowded
        for ticket in expired:
            ticket.release()
        self.assertIsNone(self.budget.next_expiry())

    def test_handshakes_beyond_the_cap_close_the_oldest(self):
        self.budget.max_handshakes = 3
        tickets = []
        for pool in (CLIENT, STATUS, CLIENT):
            tickets.append(self.open(pool))
            self.assertIsNone(self.budget.handshaking(tickets[-1]))
            self.clock.advance(1)
        tickets[1].handshake_done()          # finished: no longer counted
        fourth = self.open()
        self.assertIsNone(self.budget.handshaking(fourth))
        fifth = self.open()
        self.assertIs(self.budget.handshaking(fifth), tickets[0])    # over every pool
        self.assertFalse(tickets[0].is_idle)   # not closed a second time as idle
        self.assertEqual(self.budget.pools[CLIENT].handshakes_closed, 1)
        self.assertEqual(self.budget.stats()[CLIENT]["closed_in_handshake"], 1)
        tickets[0].release()
        fourth.release()                      # gone in its handshake: not counted
        self.assertEqual(list(self.budget.handshakes), [tickets[2], fifth])
        self.assertIn("1 client connection(s) closed in their TLS handshake",
                      self.budget.report(CLIENT))

    def test_handshakes_out_of_time_are_closed(self):
        self.budget.handshake_timeout = 5.0
        slow, quick = self.open(), self.open()
        self.budget.handshaking(slow)
        self.assertEqual(self.budget.next_expiry(), 5.0)
        self.clock.advance(3)
        self.budget.handshaking(quick)
        self.clock.advance(1)
        quick.handshake_done()
        self.assertEqual(self.budget.expired(), [])
        self.clock.advance(1)
        self.assertEqual(self.budget.expired(), [slow])
        self.assertIsNone(self.budget.next_expiry())
        self.assertEqual(self.budget.pools[CLIENT].handshakes_closed, 1)

    def test_no_handshake_bounds_when_switched_off(self):
        self.budget.max_handshakes = 0
        self.budget.handshake_timeout = 0
        for _ in range(5):
            self.assertIsNone(self.budget.handshaking(self.open()))
        self.clock.advance(3600)
        self.assertEqual(self.budget.expired(), [])
        self.assertIsNone(self.budget.next_expiry())

    def test_report_is_rate_limited(self):
        for _ in range(2):
            self.open(STATUS).busy()
        self.assertIsNone(self.open(STATUS))
        line = self.budget.report(STATUS)
        self.assertIn("status-max-connections 2", line)
        self.assertIn("1 refused", line)
        self.assertIsNone(self.open(STATUS))
        self.assertIsNone(self.budget.report(STATUS))
        self.clock.advance(10)
        self.assertIn("1 refused", self.budget.report(STATUS))


class GateTests(unittest.TestCase):
    """The gate in front of a listener, over StringTransport and a Clock."""

    def setUp(self):
        self.clock = Clock()
        self.router = Router()
        self.admission = Admission({CLIENT: 5, FEDERATION: 2, STATUS: 2}, self.clock,
                                   crowded_timeout=2.0)
        self.router.admission = self.admission
        self.factory = ElvinServerFactory(self.router, self.clock, connect_timeout=30)
        self.gate = GateFactory(self.factory, self.admission, CLIENT)

    def accept(self, gate=None):
        proto = (gate or self.gate).buildProtocol(None)
        if proto is None:
            return None, None
        transport = Socket()
        transport.protocol = proto
        proto.makeConnection(transport)
        return proto, transport

    def login(self, proto, transport):
        proto.dataReceived(frame(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY)))
        (reply,) = unframe(transport.value())
        self.assertIsInstance(reply, packets.ConnRply)
        transport.clear()

    def test_beyond_the_cap_connections_are_refused_at_accept(self):
        conns = [self.accept() for _ in range(5)]
        for proto, transport in conns:
            self.login(proto, transport)
        with capturedLogs() as events:
            self.assertEqual(self.accept(), (None, None))
        self.assertEqual(self.admission.budget.pools[CLIENT].refused, 1)
        self.assertEqual(len(events), 1)
        self.assertEqual(len(self.router.sessions), 5)
        conns[0][1].abortConnection()
        self.assertIsNotNone(self.accept()[0])

    def test_refusals_are_counted_in_status_and_metrics(self):
        from prometheus_client import generate_latest
        from elvin.ops.metrics import registry_for
        from elvin.ops.status import snapshot
        for _ in range(5):
            self.login(*self.accept())
        self.accept()
        sockets = snapshot(self.router)["totals"]["sockets"]
        self.assertEqual(sockets[CLIENT], {"open": 5, "cap": 5, "idle": 0, "refused": 1,
                                           "closed_idle": 0, "closed_in_handshake": 0,
                                           "closed_in_request": 0})
        text = generate_latest(registry_for(lambda: snapshot(self.router)))
        self.assertIn(b'elvin_sockets_refused_total{pool="client"} 1.0', text)
        self.assertIn(b'elvin_sockets_open{pool="client"} 5.0', text)

    def test_a_logged_in_connection_is_busy(self):
        proto, transport = self.accept()
        self.assertTrue(proto.admission.is_idle)
        self.login(proto, transport)
        self.assertFalse(proto.admission.is_idle)

    def test_a_federation_link_that_came_up_is_not_closed_as_idle(self):
        """The federation pool crowded (2 of 2): the socket that never
        finished its handshake goes after 2 s, the link that is up stays."""
        from elvin.federation import packets as fed_packets
        from elvin.federation.manager import FederationClass, FederationManager
        from elvin.federation.protocol import AcceptorFactory
        fed_class = FederationClass("Peer", hosts=["192.168.1.1"])
        manager = FederationManager(self.router, "ours.test", [fed_class], None, self.clock,
                                    mesh=False)
        gate = GateFactory(AcceptorFactory(manager, keepalive=0), self.admission, FEDERATION)
        linked, linked_socket = self.accept(gate)
        idle, idle_socket = self.accept(gate)
        linked.dataReceived(frame(fed_packets.FedConnRqst(1, 1, 0, "peer.test")))
        self.assertFalse(linked.admission.is_idle)
        self.assertTrue(idle.admission.is_idle)
        self.clock.advance(2.5)
        self.assertTrue(idle_socket.aborted)
        self.assertFalse(linked_socket.aborted)

    def test_idle_pre_login_connections_closed_oldest_first_when_crowded(self):
        attackers = []
        for _ in range(5):
            attackers.append(self.accept())
            self.clock.advance(0.1)
        # At the cap: the oldest idle one makes room for each newcomer.
        newcomer = self.accept()
        self.assertTrue(attackers[0][1].aborted)
        self.assertFalse(attackers[1][1].aborted)
        # Crowded: the idle ones go after 2 s, not connect-timeout's 30.
        self.login(*newcomer)
        self.clock.advance(2.0)
        aborted = [t.aborted for _, t in attackers]
        self.assertEqual(aborted, [True, True, False, False, False])   # below 90% now
        self.assertFalse(newcomer[1].aborted)
        self.assertEqual(self.admission.budget.pools[CLIENT].open, 4)

    def test_bystander_served_while_idle_sockets_fill_the_cap(self):
        """The cap full of idle attacker sockets: a new client connects,
        gets ConnRply and has its TestConn answered."""
        attackers = [self.accept() for _ in range(5)]
        for _ in range(10):                         # attackers keep coming
            attackers.append(self.accept())
        proto, transport = self.accept()
        self.assertIsNotNone(proto)
        self.login(proto, transport)
        proto.dataReceived(frame(packets.TestConn()))
        self.assertEqual(unframe(transport.value()), [packets.ConfConn()])
        more = [self.accept() for _ in range(10)]
        self.assertFalse(transport.aborted)
        self.assertTrue(all(p is not None for p, _ in more))
        self.assertLessEqual(self.admission.budget.pools[CLIENT].open, 5)

    def test_status_channels_idle_between_requests(self):
        from elvin.ops.web import StatusSite, status_root
        site = StatusSite(status_root(self.router), reactor=self.clock)
        gate = GateFactory(site, self.admission, STATUS)
        channel, transport = self.accept(gate)
        self.assertTrue(channel.admission.is_idle)
        channel.dataReceived(b"GET /status.json HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"200 OK", transport.value())
        self.assertTrue(channel.admission.is_idle)          # served: idle again
        self.accept(gate)
        self.assertEqual(self.accept(gate)[0] is not None, True)   # made room
        self.assertTrue(transport.aborted)                  # the oldest idle one

    def tls_gate(self):
        """A TLS listener's outermost factory, and the client side's TLS
        context (trusting the listener's certificate)."""
        import ssl
        import trustme
        from twisted.protocols.tls import TLSMemoryBIOFactory
        from elvin.protocols.tls import server_options
        ca = trustme.CA()
        pem = ca.issue_cert("localhost").private_key_and_cert_chain_pem.bytes()
        tls = TLSMemoryBIOFactory(server_options(pem), False, self.factory, self.clock)
        context = ssl.create_default_context()
        ca.configure_trust(context)
        return GateFactory(tls, self.admission, CLIENT), context

    def test_stalled_tls_handshakes_are_bounded(self):
        gate, context = self.tls_gate()
        self.admission.budget.max_handshakes = 2
        self.admission.budget.handshake_timeout = 10.0
        stalled = [self.accept(gate) for _ in range(2)]       # never say a word
        with capturedLogs() as events:
            third = self.accept(gate)
        self.assertTrue(stalled[0][1].aborted)               # the oldest went
        self.assertFalse(stalled[1][1].aborted)
        self.assertIn("closed in their TLS handshake", events[0]["line"])
        memory_handshake(third[0], third[1], context, "localhost",
                         lambda: self.clock.advance(0))     # a real client gets in
        self.assertEqual(list(self.admission.budget.handshakes),
                         [stalled[1][0].admission])
        self.clock.advance(10)
        self.assertTrue(stalled[1][1].aborted)               # out of time
        self.assertFalse(third[1].aborted)
        self.assertEqual(self.admission.budget.pools[CLIENT].handshakes_closed, 2)
        self.assertEqual(self.admission.budget.pools[CLIENT].open, 1)

    def test_every_stream_listener_is_gated_beneath_tls(self):
        from twisted.internet.ssl import CertificateOptions
        from elvin.endpoints import listener_service
        from elvin.uri import ElvinURI
        config = RouterConfig()
        for text in ("elvin://127.0.0.1:2917", "elvin:/secure/127.0.0.1:2916",
                     "elvin:/http,none,xdr/127.0.0.1:8080"):
            reactor = MemoryReactor()
            service = listener_service(reactor, ElvinURI(text), self.router, self.factory,
                                       config, tls=CertificateOptions())
            service.privilegedStartService()
            service.startService()
            outer = reactor.tcpServers[0][1]
            self.assertIsInstance(outer, GateFactory, text)
            self.assertEqual(outer.pool, CLIENT)
            if "secure" in text:     # the gate is outside TLS: nothing is built first
                self.assertEqual(type(outer.factory).__name__, "TLSMemoryBIOFactory")

    def test_status_listener_is_gated(self):
        from elvin import tap
        config = parse("status-listen = http://127.0.0.1:9917\n")
        reactor = MemoryReactor()
        listener = tap.status_service(reactor, config, self.router)
        listener.privilegedStartService()
        listener.startService()
        outer = reactor.tcpServers[0][1]
        self.assertIsInstance(outer, GateFactory)
        self.assertEqual(outer.pool, STATUS)
        self.assertEqual(outer.factory.timeOut, 10.0)


class SettingsTests(unittest.TestCase):
    def test_defaults_and_errors_name_file_and_line(self):
        config = RouterConfig()
        self.assertEqual((config.status_max_connections, config.status_idle_timeout,
                          config.max_federation_connections, config.reserved_files,
                          config.crowded_idle_timeout), (32, 10.0, 64, 64, 2.0))
        from elvin.configvalues import ConfigError
        with self.assertRaises(ConfigError) as cm:
            parse("verbose = no\nstatus-max-connections = 0\n", "r.conf")
        self.assertTrue(str(cm.exception).startswith("r.conf:2: "), str(cm.exception))
        with self.assertRaises(ConfigError) as cm:
            parse("crowded-idle-timeout = 0\n", "r.conf")
        self.assertTrue(str(cm.exception).startswith("r.conf:1: "), str(cm.exception))


def _reply(sock):
    """One packet from a blocking socket."""
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the router")
        data += chunk
    return unframe(data)


def _raw_round_trip(port, timeout=5.0):
    """ConnRqst, then TestConn, on a new socket: the packets answering them."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(frame(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY)))
        replies = _reply(s)
        s.sendall(frame(packets.TestConn()))
        return replies + _reply(s)


class LowLimitRouterTests(unittest.TestCase):
    """A router process under a 256-file limit, its cap held by idle
    sockets, still serves a new client."""

    timeout = 60

    @defer.inlineCallbacks
    def test_idle_sockets_beyond_the_cap_do_not_lock_out_a_client(self):
        folder = tempfile.mkdtemp()
        log = open(os.path.join(folder, "router.log"), "w")
        self.addCleanup(log.close)
        port = free_port()

        def limit():
            resource.setrlimit(NOFILE, (256, 256))
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from twisted.scripts.twistd import run; "
             f"sys.argv = ['twistd', '-n', '--pidfile=', 'elvin', '-l', "
             f"'elvin://127.0.0.1:{port}']; run()"],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit)

        def stop():
            proc.terminate()
            proc.wait(10)
        self.addCleanup(stop)
        wait_listening(proc, port, "router")
        caps, _ = fit_caps(256, {CLIENT: 10_000, FEDERATION: 64, STATUS: 32},
                           64 + 1 + REAP_SLACK)
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        # Real sockets and a real file limit are the point: a client locked
        # out would get no reply, and the round trip's socket timeout (5 s
        # a step, generous for a loaded machine) would raise.
        for _ in range(caps[CLIENT] + 10):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        replies = yield threads.deferToThread(_raw_round_trip, port)
        self.assertIsInstance(replies[0], packets.ConnRply)
        self.assertEqual(replies[1:], [packets.ConfConn()])
        with open(log.name) as f:
            text = f.read()
        self.assertIn(f"max-connections lowered from 10000 to {caps[CLIENT]}", text)
