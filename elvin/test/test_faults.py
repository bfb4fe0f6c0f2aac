"""Faults: federation peers that vanish, stall or flap; clean shutdown.

Real routers federated on 127.0.0.1, outgoing links kept up by
``elvin.federation.protocol.connector_service`` (the jitter it adds to the
backoff is replaced by a small one, so redials take milliseconds):

* ``BackoffTests``: redials back off exponentially to the cap (fake clock).
* ``VanishTests``: a peer that disappears is forgotten at once -- its link,
  its pull filter, and the interest it forwarded from further peers -- and
  is redialled, with backoff, until it is back.
* ``StallTests``: a peer that stops reading is detected by the keepalive
  (TestConn unanswered) and the link closed and redialled.
* ``FlapTests``: a link going up and down repeatedly in a tree of routers
  never delivers a notification twice, leaves exactly one link per peer,
  and delivers everything once it is up again.
* ``ShutdownTests``: stopping the service tree ``elvin.tap.makeService``
  builds (what SIGTERM does) sends Disconn to clients and federation peers
  and flushes and closes the trace with every accepted event in it; and the
  same through a real ``twistd`` process and SIGTERM.
"""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types

from twisted.internet import defer, endpoints, error, reactor, task
from twisted.internet.task import Clock
from twisted.trial import unittest

from elvin import client
from elvin.federation import protocol as fedproto
from elvin.federation.protocol import ConnectorFactory, connector_service

from elvin.test.test_federation import FedRouter, FederationTestCase
from elvin.test.test_integration import wait_until

from elvin.test.places import REPO as ROOT
from elvin.test.places import free_port


class _FailingEndpoint:
    def __init__(self, clock):
        self.clock = clock
        self.attempts = []

    def connect(self, factory):
        self.attempts.append(self.clock.seconds())
        return defer.fail(error.ConnectionRefusedError())


class BackoffTests(unittest.TestCase):
    def redial_intervals(self, jitter, count=12):
        self.patch(fedproto, "random", types.SimpleNamespace(random=jitter))
        clock = Clock()
        endpoint = _FailingEndpoint(clock)
        service = connector_service(clock, endpoint, ConnectorFactory(None, None),
                                    initial_delay=0.5, max_delay=30.0)
        service.startService()
        while len(endpoint.attempts) < count:
            clock.advance(0.01)
        service.stopService()
        times = endpoint.attempts
        return [b - a for a, b in zip(times, times[1:])]

    def test_exponential_to_the_cap(self):
        intervals = self.redial_intervals(lambda: 0.0)
        for a, b in zip(intervals, intervals[1:]):
            self.assertTrue(b >= a - 0.02, intervals)
            if b < 29:
                self.assertTrue(1.9 < b / a < 2.1, intervals)
        self.assertGreaterEqual(intervals[0], 0.5)
        self.assertTrue(29.95 < intervals[-1] < 30.05, intervals)

    def test_jitter_is_added(self):
        plain = self.redial_intervals(lambda: 0.0, 8)
        jittered = self.redial_intervals(lambda: 0.75, 8)
        for a, b in zip(plain, jittered):
            self.assertTrue(0.7 < b - a < 0.8, (plain, jittered))


class FaultTestCase(FederationTestCase):
    timeout = 60

    def setUp(self):
        super().setUp()
        # Redials after 20-40 ms instead of 0.5 s plus up to a second.
        self.patch(fedproto, "random", types.SimpleNamespace(random=lambda: 0.01))

    def dial(self, source, target, keepalive=0, initial_delay=0.02, max_delay=0.2):
        """Keep a link from ``source`` to ``target`` up (ClientService)."""
        endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1",
                                                target.fed_port.getHost().port)
        service = connector_service(reactor, endpoint,
                                    ConnectorFactory(source.manager, source.fed_class,
                                                     keepalive),
                                    initial_delay=initial_delay, max_delay=max_delay)
        attempts = []
        original = endpoint.connect

        def counting_connect(factory):
            attempts.append(time.monotonic())
            return original(factory)
        endpoint.connect = counting_connect
        service.attempts = attempts
        service.startService()
        self.addCleanup(service.stopService)
        return service

    @staticmethod
    def linked(a, b):
        return (any(l.peer_domain == b.domain for l in a.manager.links)
                and any(l.peer_domain == a.domain for l in b.manager.links))

    @staticmethod
    def accepted_protocols(router):
        """Federation protocols on ``router``'s accepting side."""
        return [l.output for l in router.manager.links if not l.outgoing]

    def assert_one_link_per_peer(self, *routers):
        for r in routers:
            domains = [l.peer_domain for l in r.manager.links]
            self.assertEqual(len(domains), len(set(domains)), (r.domain, domains))


class VanishTests(FaultTestCase):
    @defer.inlineCallbacks
    def test_vanished_peer_is_forgotten_and_redialled(self):
        a = FedRouter(self, "a.test")
        b = FedRouter(self, "b.test")
        c = FedRouter(self, "c.test")
        service_ab = self.dial(a, b)
        dialler = self.dial(c, b)       # the chain a - b - c
        yield wait_until(lambda: self.linked(a, b) and self.linked(b, c))
        consumer = yield self.connect(c)
        got = []
        yield consumer.subscribe("x == 1", got.append)
        yield self.settle(a, b, c)
        link_ab = next(l for l in a.manager.links if l.peer_domain == "b.test")
        self.assertTrue(link_ab.remote_filter.matches({"x": 1}))   # c's interest, via b

        # c vanishes: its connection is reset, and it does not come back.
        for link in c.manager.links:
            link.output.transport.abortConnection()
        yield dialler.stopService()
        yield wait_until(lambda: not any(l.peer_domain == "c.test" for l in b.manager.links))
        yield self.settle(a, b)
        # Nothing of c is left: b's links, and the filter b asks a for.
        self.assertEqual([l.peer_domain for l in b.manager.links], ["a.test"])
        self.assertFalse(link_ab.remote_filter.matches({"x": 1}))
        self.assertTrue(link_ab.remote_filter.is_false)

        # b vanishes while a keeps dialling it: a forgets it and backs off.
        b_port = b.fed_port.getHost().port
        yield b.fed_port.stopListening()
        for proto in self.accepted_protocols(b):
            proto.transport.abortConnection()
        yield wait_until(lambda: not a.manager.links)
        self.assertEqual(a.manager.links, [])
        before = len(service_ab.attempts)
        yield task.deferLater(reactor, 0.8, lambda: None)
        tries = service_ab.attempts[before:]
        self.assertGreaterEqual(len(tries), 3)
        gaps = [y - x for x, y in zip(tries, tries[1:])]
        self.assertLess(len(tries), 30, "no backoff: redialled in a busy loop")
        self.assertGreater(max(gaps), min(gaps))
        # b comes back on the same port; a's redial finds it.
        b.fed_port = reactor.listenTCP(b_port, fedproto.AcceptorFactory(b.manager, keepalive=0),
                                       interface="127.0.0.1")
        yield wait_until(lambda: self.linked(a, b), timeout=10)
        consumer_b = yield self.connect(b)
        got_b = []
        yield consumer_b.subscribe("x == 1", got_b.append)
        yield self.settle(a, b)
        producer = yield self.connect(a)
        producer.notify({"x": 1})
        yield wait_until(lambda: got_b)
        yield producer.test_connection()
        yield consumer_b.test_connection()
        self.assertEqual(len(got_b), 1)
        self.assertEqual(got, [])


class StallTests(FaultTestCase):
    @defer.inlineCallbacks
    def test_stalled_peer_is_closed_by_keepalive_and_redialled(self):
        a = FedRouter(self, "a.test")
        b = FedRouter(self, "b.test")
        # (0.5 s: a period short enough to keep the test quick, long enough
        # that a loaded machine does not close the link before it stalls)
        keepalive = 0.5
        self.dial(a, b, keepalive=keepalive)
        yield wait_until(lambda: self.linked(a, b))
        consumer = yield self.connect(b)
        got = []
        yield consumer.subscribe("require(n)", got.append)
        yield self.settle(a, b)
        yield wait_until(lambda: bool(a.manager.links) and self.linked(a, b))
        link = a.manager.links[0]
        reasons = []
        silences = []
        original = a.manager.link_down

        def link_down(l, reason, was_up):
            reasons.append(reason)
            silences.append(l.output.silent_for())
            original(l, reason, was_up)
        a.manager.link_down = link_down
        (stalled,) = self.accepted_protocols(b)
        stalled.transport.pauseProducing()      # b stops reading, says nothing
        # Real sockets are the point here (a peer that stops reading): the
        # 5 s is a generous bound for a loaded machine, not a speed check;
        # test_federation_memory times the rule itself on a Clock.
        yield wait_until(lambda: link.state == link.CLOSED, timeout=5)
        # Closed by the liveness rule: silent for two keepalive periods.
        self.assertEqual(reasons[0], "liveness")
        self.assertGreaterEqual(silences[0], 2 * keepalive)
        self.assertNotIn(link, a.manager.links)
        self.assertTrue(all(l.peer_domain != "b.test" or l is not link
                            for l in a.manager.links))
        # b wakes up, sees the connection gone, and the redial gets through.
        stalled.transport.resumeProducing()
        yield wait_until(lambda: self.linked(a, b) and a.manager.links[0] is not link,
                         timeout=10)
        self.assert_one_link_per_peer(a, b)
        yield self.settle(a, b)
        producer = yield self.connect(a)
        for n in range(10):
            producer.notify({"n": n})
        yield wait_until(lambda: len(got) == 10)
        yield producer.test_connection()
        yield consumer.test_connection()
        self.assertEqual([x["n"] for x in got], list(range(10)))


class FlapTests(FaultTestCase):
    @defer.inlineCallbacks
    def test_flapping_link_in_a_tree_never_duplicates(self):
        # A tree: hub with leaves left and right; the left link flaps.
        hub = FedRouter(self, "hub.test")
        left = FedRouter(self, "left.test")
        right = FedRouter(self, "right.test")
        self.dial(left, hub)
        self.dial(right, hub)
        yield wait_until(lambda: self.linked(left, hub) and self.linked(right, hub))
        consumers = {}
        for r in (hub, right):
            conn = yield self.connect(r)
            got = []
            yield conn.subscribe("require(seq)", got.append)
            consumers[r.domain] = (conn, got)
        yield self.settle(hub, left, right)
        producer = yield self.connect(left)
        sent = []

        def publish():
            seq = len(sent)
            producer.notify({"seq": seq})
            sent.append(seq)
        ticker = task.LoopingCall(publish)
        ticker.start(0.005)
        flaps = 0
        try:
            for flaps in range(1, 6):
                yield task.deferLater(reactor, 0.1, lambda: None)
                for proto in self.accepted_protocols(hub):
                    if proto.link.peer_domain == "left.test":
                        proto.transport.abortConnection()
                yield wait_until(lambda: not any(l.peer_domain == "left.test"
                                                 for l in hub.manager.links))
                self.assert_one_link_per_peer(hub, left, right)
                yield wait_until(lambda: self.linked(left, hub), timeout=10)
                self.assert_one_link_per_peer(hub, left, right)
        finally:
            ticker.stop()
        yield self.settle(hub, left, right)
        # Now steady: everything published from here on arrives exactly once.
        steady = len(sent)
        for _ in range(20):
            publish()
        yield producer.test_connection()
        for domain, (conn, got) in consumers.items():
            yield wait_until(lambda got=got: got and got[-1]["seq"] == len(sent) - 1)
            yield conn.test_connection()
            seqs = [n["seq"] for n in got]
            self.assertEqual(len(seqs), len(set(seqs)), f"duplicates at {domain}")
            self.assertEqual(seqs, sorted(seqs), f"out of order at {domain}")
            self.assertEqual([s for s in seqs if s >= steady], list(range(steady, len(sent))))
        self.assertEqual(flaps, 5)
        self.assertEqual(len(hub.manager.links), 2)
        self.assertEqual(len(left.manager.links), 1)


class ShutdownTests(FaultTestCase):
    @defer.inlineCallbacks
    def test_service_stop_says_goodbye_and_closes_the_trace(self):
        from elvin import config, tap
        trace_dir = self.mktemp()
        client_port, fed_port = free_port(), free_port()
        cfg = config.parse(
            f"listen = elvin://127.0.0.1:{client_port}\n"
            "Federation.Router-Name = main.test\n"
            f"Federation.Listen = ewaf://127.0.0.1:{fed_port}\n"
            "Federation.Apply-Class[Peers] = 127.0.0.1\n"
            "Federation.Keepalive-Interval = 0\n"
            f"Federation.Trace-Directory = {trace_dir}\n")
        options = tap.Options()
        options.router_config = cfg
        top = tap.makeService(options, reactor=reactor)
        top.startService()
        stopped = [False]

        def stop_once():
            if not stopped[0]:
                stopped[0] = True
                return top.stopService()
        self.addCleanup(stop_once)
        uri = f"elvin://127.0.0.1:{client_port}"
        peer = FedRouter(self, "peer.test")
        peer_consumer = yield self.connect(peer)
        peer_got = []
        yield peer_consumer.subscribe("require(n)", peer_got.append)
        endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", fed_port)
        yield wait_until(lambda: _listening(fed_port))
        yield endpoint.connect(ConnectorFactory(peer.manager, peer.fed_class, 0))
        (manager,) = top.router.observers
        yield wait_until(lambda: manager.links and peer.manager.links)
        yield self.settle(peer)
        yield wait_until(lambda: manager.links[0].remote_filter.matches({"n": 1}))
        conn = yield client.connect(uri)
        self.connections.append(conn)
        reasons = []
        conn.on_disconnect = lambda reason, args: reasons.append(reason)
        for n in range(50):
            conn.notify({"n": n})
        yield wait_until(lambda: len(peer_got) == 50)
        writer = manager.trace
        accepted_before = writer.records

        yield stop_once()          # what twistd does on SIGTERM
        yield conn.disconnected
        self.assertEqual(reasons, [1])   # Disconn: router is shutting down
        yield wait_until(lambda: not peer.manager.links)
        # The trace: thread finished, file closed, every accepted record in it.
        self.assertFalse(writer._thread.is_alive())
        self.assertIsNone(writer._file)
        lines = []
        for path in sorted(glob.glob(os.path.join(trace_dir, "*.jsonl"))):
            with open(path) as f:
                lines.extend(json.loads(line) for line in f)
        self.assertEqual(len(lines), writer.records)
        records = writer.records
        self.assertGreaterEqual(writer.records, accepted_before)
        # (Probes of the listener before the peer came show up as link_down
        # with no peer: connections that ended before saying who they were.)
        lines = [r for r in lines if r["peer"] == "peer.test"]
        events = [r["event"] for r in lines]
        self.assertEqual(events.count("notify_forwarded"), 50)
        self.assertEqual(events[0], "link_up")
        self.assertEqual(events[-1], "link_down")
        self.assertEqual(lines[-1]["reason"], "shutdown")
        # Whatever happens after close is not accepted, so not lost either.
        writer.link(_FakeLink(), "link_down")
        self.assertEqual(writer.records, records)
        self.assertEqual(writer.dropped_after_close, 1)

    def test_sigterm_through_twistd(self):
        """The real thing: twistd, SIGTERM, Disconn to a client and a peer,
        and the trace complete on disk."""
        from elvin.protocols import packets as elvin_packets
        import struct
        workdir = os.path.abspath(self.mktemp())
        os.makedirs(workdir)
        client_port, fed_port = free_port(), free_port()
        trace_dir = os.path.join(workdir, "trace")
        conf = os.path.join(workdir, "router.conf")
        with open(conf, "w") as f:
            f.write(f"listen = elvin://127.0.0.1:{client_port}\n"
                    "Federation.Router-Name = main.test\n"
                    f"Federation.Listen = ewaf://127.0.0.1:{fed_port}\n"
                    "Federation.Apply-Class[Peers] = 127.0.0.1\n"
                    f"Federation.Trace-Directory = {trace_dir}\n")
        code = ("import sys; sys.argv = ['twistd', '-n', '--pidfile=', 'elvin', '-c', %r]; "
                "from twisted.scripts.twistd import run; run()" % conf)
        log = open(os.path.join(workdir, "router.log"), "w")
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        deadline = time.time() + 20
        while not (_listening(client_port) and _listening(fed_port)):
            self.assertIsNone(proc.poll(), "router exited")
            self.assertLess(time.time(), deadline, "router did not start")
            time.sleep(0.05)

        def framed(packet):
            data = elvin_packets.encode(packet)
            return struct.pack(">I", len(data)) + data

        def read_all(sock):
            sock.settimeout(10)
            data = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            packets = []
            while len(data) >= 4:
                (n,) = struct.unpack(">I", data[:4])
                packets.append(fed_packets.decode(data[4:4 + n]))
                data = data[4 + n:]
            return packets

        from elvin.federation import packets as fed_packets
        peer = socket.create_connection(("127.0.0.1", fed_port))
        peer.sendall(framed(fed_packets.FedConnRqst(1, 1, 0, "peer.test")))
        cli = socket.create_connection(("127.0.0.1", client_port))
        cli.sendall(framed(elvin_packets.ConnRqst(1, 4, 0)))
        # Wait for the ConnRply before shutting down.
        cli.settimeout(10)
        header = cli.recv(4)
        (n,) = struct.unpack(">I", header)
        body = b""
        while len(body) < n:
            body += cli.recv(n - len(body))
        self.assertIsInstance(elvin_packets.decode(body), elvin_packets.ConnRply)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        client_packets = read_all(cli)
        cli.close()                # at its end of file, as a client does
        peer_data = read_all(peer)
        proc.wait(20)
        self.assertIn(elvin_packets.Disconn(1, "router is shutting down"), client_packets)
        self.assertIsInstance(peer_data[0], fed_packets.FedConnRply)
        self.assertIn(elvin_packets.Disconn(1, "shutdown"), peer_data)
        records = []
        for path in glob.glob(os.path.join(trace_dir, "*.jsonl")):
            with open(path) as f:
                records.extend(json.loads(line) for line in f)
        self.assertEqual([r["event"] for r in records if r["peer"] == "peer.test"
                          and r["event"].startswith("link")], ["link_up", "link_down"])


class _FakeLink:
    peer_domain = "gone.test"
    outgoing = False


def _listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
