"""Operating a router: status snapshot, Prometheus
metrics, the status listener and elvin-stat."""

import json
import os
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest
from twisted.internet import defer, error, reactor, threads
from twisted.trial import unittest

from elvin import client
from elvin.core.router import Router
from elvin.ops.metrics import registry_for
from elvin.ops.status import snapshot
from elvin.ops.web import StatusSite, status_root
from elvin.protocols import packets
from elvin.protocols.server import ElvinServerFactory
from elvin.test.places import REPO, elvin_stat_on_a_thread
from elvin.test.polling import wait_until
from elvin.test.test_federation import _ScriptedEndpoint
from elvin.test.test_router import RecordingOutput


def samples(registry):
    """{(name, labels as a sorted tuple): value} of a registry's scrape."""
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class MetricsUnitTests(unittest.TestCase):
    """A router driven with packets, and what its metrics then say."""

    def setUp(self):
        self.router = Router()
        self.registry = registry_for(lambda: snapshot(self.router, started=0))

    def session(self, peer, out=None):
        out = out or RecordingOutput()
        session = self.router.open_session(out, peer)
        session.packet_received(packets.ConnRqst(1, 4, 0, {}))
        out.take()
        return session, out

    def test_counts_follow_the_packets(self):
        sub, sub_out = self.session("sub")
        sub.packet_received(packets.SubAddRqst(2, "require(x)", True, packets.Keys.EMPTY))
        sub.packet_received(packets.SubAddRqst(3, "x ==", True, packets.Keys.EMPTY))   # Nack 2101
        pub, _ = self.session("pub")
        for n in range(5):
            pub.packet_received(packets.NotifyEmit({"x": n}, True, packets.Keys.EMPTY))
        pub.packet_received(packets.NotifyEmit({"y": 1}, True, packets.Keys.EMPTY))
        got = samples(self.registry)
        self.assertEqual(got[("elvin_connections", (("transport", "tcp"),))], 2)
        self.assertEqual(got[("elvin_connections_opened_total", ())], 2)
        self.assertEqual(got[("elvin_subscriptions", ())], 1)
        self.assertEqual(got[("elvin_notifications_received_total", ())], 6)
        self.assertEqual(got[("elvin_deliveries_total", ())], 5)
        self.assertEqual(got[("elvin_nacks_total", (("code", "2101"),))], 1)
        status = snapshot(self.router)
        self.assertEqual(status["refusals"][-1]["name"], "PARSE_ERROR")
        self.assertEqual([c["subscriptions"] for c in status["clients"]
                          if c["peer"] == "sub"], [1])
        from elvin.tools.stat import format_status
        self.assertIn("dropped 0  rejected 0  slow clients reset 0",
                      format_status(snapshot(self.router, started=1)))
        sub.connection_lost()
        got = samples(self.registry)
        self.assertEqual(got[("elvin_connections", (("transport", "tcp"),))], 1)
        self.assertEqual(got[("elvin_subscriptions", ())], 0)

    def test_clients_largest_queue_and_most_dropped_first(self):
        """docs/operations.md, "status.json": clients come largest send
        queue first, then most dropped; ``clients_limit`` lists that many
        and counts the rest, the totals count every one."""
        figures = {"idle-b": (0, 0), "idle-a": (0, 0), "dropping": (0, 40),
                   "queued": (5000, 1), "queued-more": (9000, 0), "queued-dropping": (5000, 7)}
        for peer, (queued, dropped) in figures.items():
            session, out = self.session(peer, _Queued(queued))
            session.dropped = dropped
        order = ["queued-more", "queued-dropping", "queued", "dropping", "idle-a", "idle-b"]
        status = snapshot(self.router)
        self.assertEqual([c["peer"] for c in status["clients"]], order)
        self.assertEqual(status["clients_omitted"], 0)
        status = snapshot(self.router, clients_limit=2)
        self.assertEqual([c["peer"] for c in status["clients"]], order[:2])
        self.assertEqual(status["clients_omitted"], 4)
        self.assertEqual(status["totals"]["connections_open"], 6)
        self.assertEqual(status["totals"]["send_queue_bytes"], 19000)
        self.assertEqual(snapshot(self.router, clients_limit=0)["clients"], [])

    def test_names_follow_prometheus_conventions(self):
        text = generate_latest(self.registry).decode()
        for family in text_string_to_metric_families(text):
            self.assertTrue(family.name.startswith("elvin_"), family.name)
            if family.type == "counter":
                self.assertTrue(all(s.name.endswith("_total") for s in family.samples))


class StatusListenerTests(unittest.TestCase):
    """A real router with its status listener, scraped while it works."""

    def setUp(self):
        self.router = Router()
        self.elvin = reactor.listenTCP(0, ElvinServerFactory(self.router, reactor),
                                       interface="127.0.0.1")
        self.uri = f"elvin://127.0.0.1:{self.elvin.getHost().port}"
        site = StatusSite(status_root(self.router, listeners=[self.uri], token="s3cret"))
        self.web = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.base = f"http://127.0.0.1:{self.web.getHost().port}"
        self.addCleanup(self.web.stopListening)
        self.addCleanup(self.elvin.stopListening)

    def get(self, path, token="s3cret"):
        def fetch():
            request = urllib.request.Request(self.base + path)
            if token:
                request.add_header("Authorization", f"Bearer {token}")
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode()
        return threads.deferToThread(fetch)

    @defer.inlineCallbacks
    def test_scrape_under_load_matches_what_was_sent(self):
        consumer = yield client.connect(self.uri)
        producer = yield client.connect(self.uri)
        self.addCleanup(lambda: consumer.close())
        self.addCleanup(lambda: producer.close())
        got = []
        yield consumer.subscribe("require(n)", got.append)
        for n in range(2000):
            producer.notify({"n": n})
        yield wait_until(lambda: len(got) == 2000)
        _, text = yield self.get("/metrics")
        scraped = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}
        self.assertEqual(scraped[("elvin_notifications_received_total", ())], 2000)
        self.assertEqual(scraped[("elvin_deliveries_total", ())], 2000)
        self.assertEqual(scraped[("elvin_connections", (("transport", "tcp"),))], 2)
        self.assertGreater(scraped[("elvin_received_bytes_total", ())], 2000 * 20)
        self.assertGreater(scraped[("elvin_sent_bytes_total", ())], 2000 * 20)
        _, body = yield self.get("/status.json")
        status = json.loads(body)
        self.assertEqual(len(status["clients"]), 2)
        self.assertEqual(status["totals"]["subscriptions"], 1)
        status_code, page = yield self.get("/")
        self.assertIn("Elvin router status", page)

    @defer.inlineCallbacks
    def test_status_json_lists_at_most_clients_n(self):
        """``/status.json?clients=N`` (what the page asks for) lists N
        clients and counts the rest; elvin-stat asks for none."""
        import urllib.error
        from elvin.tools import stat
        for _ in range(3):
            conn = yield client.connect(self.uri)
            self.addCleanup(conn.close)
        _, body = yield self.get("/status.json?clients=1")
        status = json.loads(body)
        self.assertEqual((len(status["clients"]), status["clients_omitted"]), (1, 2))
        self.assertEqual(status["totals"]["connections_open"], 3)
        _, body = yield self.get("/status.json")
        self.assertEqual(len(json.loads(body)["clients"]), 3)
        status = yield threads.deferToThread(stat.fetch, self.base, "s3cret", 5.0, 0)
        self.assertEqual((status["clients"], status["clients_omitted"]), ([], 3))
        for wrong in ("x", "-1", "1.5"):
            with self.assertRaises(urllib.error.HTTPError) as caught:
                yield self.get(f"/status.json?clients={wrong}")
            self.assertEqual(caught.exception.code, 400)

    @defer.inlineCallbacks
    def test_token_is_required(self):
        import urllib.error
        with self.assertRaises(urllib.error.HTTPError) as caught:
            yield self.get("/metrics", token=None)
        self.assertEqual(caught.exception.code, 401)
        code, _ = yield self.get("/status.json?token=s3cret", token=None)
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_elvin_stat(self):
        conn = yield client.connect(self.uri)
        self.addCleanup(lambda: conn.close())
        yield conn.subscribe("require(x)", lambda n: None)

        code, stdout, stderr = yield elvin_stat_on_a_thread(self.base, "-t", "s3cret")
        self.assertEqual(code, 0, stderr)
        self.assertIn("clients 1 tcp=1  subscriptions 1", stdout)
        code, stdout, stderr = yield elvin_stat_on_a_thread(
            self.base, "-t", "s3cret", "--json", "-i", "0.2", "-n", "2")
        lines = stdout.splitlines()
        self.assertEqual(len(lines), 2)
        self.assertEqual(json.loads(lines[0])["totals"]["subscriptions"], 1)
        code, stdout, stderr = yield elvin_stat_on_a_thread(self.base)
        self.assertEqual(code, 1)
        self.assertIn("HTTP 401", stderr)
        self.assertIn("give --token", stderr)


    @defer.inlineCallbacks
    def test_elvin_stat_to_a_full_disk(self):
        """A stdout error other than a closed pipe: one line, exit 1."""
        def run():
            with open("/dev/full", "wb") as full:
                return subprocess.run(
                    [sys.executable, "-m", "elvin.tools.stat", "-e", self.base, "-t", "s3cret"],
                    stdout=full, stderr=subprocess.PIPE, timeout=30, cwd=REPO)
        done = yield threads.deferToThread(run)
        self.assertEqual((done.returncode, done.stderr),
                         (1, b"elvin-stat: error: cannot write to stdout: "
                             b"No space left on device\n"))


class TapTests(unittest.TestCase):

    def test_status_listen_adds_the_listener(self):
        from elvin import tap
        from elvin.test.places import free_port
        path = self.mktemp()
        port = free_port()
        with open(path, "w") as f:
            f.write(f"listen = elvin://127.0.0.1:{free_port()}\n"
                    f"status-listen = http://127.0.0.1:{port}\n")
        options = tap.Options()
        options.parseOptions(["-c", path])
        top = tap.makeService(options, reactor)
        sites = [s for s in top if isinstance(getattr(s, "factory", None), StatusSite)]
        self.assertEqual(len(sites), 1)
        self.assertEqual(options.router_config.status_listen, ("http", "127.0.0.1", port))


    def test_status_follows_a_reload(self):
        """status.json (and so the page and elvin-stat) names the listeners
        and domain in force, after a reload changes them."""
        from twisted.internet.testing import MemoryReactorClock
        from twisted.web.test.requesthelper import DummyRequest
        from elvin import tap
        path = os.path.abspath(self.mktemp())

        def write(listen, domain):
            with open(path, "w") as f:
                f.write("".join(f"listen = elvin://127.0.0.1:{port}\n" for port in listen)
                        + "status-listen = http://127.0.0.1:3009\n"
                        + "Federation.Listen = ewaf://127.0.0.1:3008\n"
                        + f"Federation.Router-Name = {domain}\n")
        write([3000], "first.test")
        options = tap.Options()
        options.parseOptions(["-c", path])
        top = tap.makeService(options, MemoryReactorClock())
        (site,) = [s.factory for s in top if isinstance(getattr(s, "factory", None),
                                                         StatusSite)]

        def status():
            request = DummyRequest([b"status.json"])
            return json.loads(site.getResourceFor(request).render(request))["router"]
        self.assertEqual((status()["listeners"], status()["domain"]),
                         (["elvin:4.0/tcp,none,xdr/127.0.0.1:3000"], "first.test"))
        write([3000, 3001], "second.test")
        applied, message = self.successResultOf(top.reload())
        self.assertTrue(applied, message)
        self.assertEqual((status()["listeners"], status()["domain"]),
                         (["elvin:4.0/tcp,none,xdr/127.0.0.1:3000",
                           "elvin:4.0/tcp,none,xdr/127.0.0.1:3001"], "second.test"))


class ReloadTests(unittest.TestCase):
    """SIGHUP re-reads the file: a federation link and a limit change, no
    client is dropped; a broken file leaves everything as it was."""
    timeout = 150

    @defer.inlineCallbacks
    def test_sighup_changes_link_and_limit_and_refuses_a_broken_file(self):
        import signal
        from elvin.test.places import free_port
        from elvin.test.test_client_flavours import start_router, stop_router
        from elvin.test.test_federation import FedRouter
        first = FedRouter(self, "first.test")
        second = FedRouter(self, "second.test")
        port, status_port = free_port(), free_port()
        path = os.path.abspath(self.mktemp() + "-dir")
        os.makedirs(path)
        conf = os.path.join(path, "elvind.conf")

        def write(peer, max_subs, extra=""):
            with open(conf, "w") as f:
                f.write(f"listen = elvin://127.0.0.1:{port}\n"
                        f"status-listen = http://127.0.0.1:{status_port}\n"
                        "status-token = t\n"
                        f"max-subscriptions = {max_subs}\n"
                        "Federation.Router-Name = reloaded.test\n"
                        f"Federation.Connect[Peer] = ewaf://127.0.0.1:"
                        f"{peer.fed_port.getHost().port}\n"
                        "Federation.Apply-Class[Peer] = 127.0.0.1\n" + extra)
        write(first, 10)
        uri, proc = start_router(port, ["-c", conf])
        self.addCleanup(stop_router, proc)
        # (a first dial that loses its handshake on a loaded machine is
        # closed after 20 s and redialled: allow for one)
        yield wait_until(lambda: first.manager.links, timeout=60)
        conn = yield client.connect(uri)
        self.addCleanup(lambda: conn.close())
        yield conn.subscribe("require(a)", lambda n: None)
        write(second, 2)
        proc.send_signal(signal.SIGHUP)
        yield wait_until(lambda: second.manager.links and not first.manager.links,
                         timeout=30)
        yield conn.subscribe("require(b)", lambda n: None)          # 2 of 2: fine
        with self.assertRaises(client.NackError) as caught:
            yield conn.subscribe("require(c)", lambda n: None)      # over the new limit
        self.assertEqual(caught.exception.code, 2006)
        self.assertFalse(conn.is_closed)                            # kept its session
        # A broken file: refused whole; the link and the limit stay.
        write(first, 100, extra="max-subscriptions = lots\n")
        proc.send_signal(signal.SIGHUP)
        yield task_sleep(1.0)
        self.assertTrue(second.manager.links)
        self.assertFalse(first.manager.links)
        with self.assertRaises(client.NackError):
            yield conn.subscribe("require(d)", lambda n: None)

        def stat_reload():
            """elvin-stat --reload, through the status listener with the token."""
            return threads.deferToThread(
                subprocess.run, [sys.executable, "-m", "elvin.tools.stat", "-e",
                                 f"http://127.0.0.1:{status_port}", "-t", "t", "--reload"],
                cwd=REPO, capture_output=True, text=True, timeout=60)
        # A file adding a listener on a port in use (the status listener's):
        # refused whole, and the answer says why; the limit and link stay.
        write(first, 100, extra=f"listen = elvin://127.0.0.1:{status_port}\n")
        done = yield stat_reload()
        self.assertEqual(done.returncode, 1, done.stdout)
        self.assertIn(f"refused: {conf}:8: listen elvin://127.0.0.1:{status_port}: address "
                      "already in use", done.stderr)
        with self.assertRaises(client.NackError):
            yield conn.subscribe("require(d)", lambda n: None)
        self.assertTrue(second.manager.links)
        write(first, 10)
        done = yield stat_reload()
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("reloaded:", done.stdout)
        yield wait_until(lambda: first.manager.links and not second.manager.links,
                         timeout=30)


def task_sleep(seconds):
    from twisted.internet import task
    return task.deferLater(reactor, seconds, lambda: None)


class JsonLogTests(unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def test_log_format_json_writes_one_object_per_event_with_fields(self):
        from elvin.test.places import free_port
        from elvin.test.test_client_flavours import stop_router
        port = free_port()
        log = os.path.abspath(self.mktemp())
        proc = subprocess.Popen(
            [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "-n",
             "--pidfile=", f"--logfile={log}", "elvin", "--log-format", "json",
             "-l", f"elvin://127.0.0.1:{port}"], cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(stop_router, proc)

        def connected():
            if not os.path.exists(log):
                return None
            with open(log, encoding="utf-8") as f:
                events = [json.loads(line) for line in f if line.strip()]
            return [e for e in events if e.get("log_format", "").startswith(
                "client connected from")]
        conn = None
        for _ in range(100):
            try:
                conn = yield client.connect(f"elvin://127.0.0.1:{port}")
                break
            except Exception:
                yield task_sleep(0.2)
        self.assertIsNotNone(conn)
        yield conn.close()
        yield wait_until(connected, timeout=20)
        (event,) = connected()
        self.assertTrue(event["peer"].startswith("127.0.0.1:"))
        self.assertEqual(event["log_level"]["name"], "info")


class DeclaredCountersTests(unittest.TestCase):
    """The snapshot reads each figure by its declared name from a router
    driven through the real server protocol (no socket): every total it
    shows here moved, so a figure that silently read 0 would fail."""

    def test_every_total_follows_the_traffic(self):
        from elvin.test.test_server_protocol import Harness, frame
        harness = Harness()
        router = harness.router
        sub, sub_t = harness.client()
        sent = frame(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY)) + frame(
            packets.SubAddRqst(2, "require(x)", True, packets.Keys.EMPTY))
        sub.dataReceived(sent)
        pub, _ = harness.client()
        pub.dataReceived(frame(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY)))
        sub.pauseProducing()           # the subscriber's socket stops draining
        for n in range(3):
            pub.dataReceived(frame(packets.NotifyEmit({"x": n}, True, packets.Keys.EMPTY)))
        status = snapshot(router)
        totals = status["totals"]
        (client_row,) = [c for c in status["clients"] if c["subscriptions"]]
        self.assertGreater(client_row["queue_bytes"], 0)
        self.assertEqual(client_row["queue_bytes"], sub.queue.size)
        self.assertEqual(totals["send_queue_bytes"], router.queue_budget.bytes)
        self.assertGreater(totals["send_queue_bytes"], 0)
        self.assertEqual((totals["connections_total"], totals["notifications_received"],
                          totals["deliveries"]), (2, 3, 3))
        self.assertGreaterEqual(totals["bytes_in"], len(sent))
        self.assertGreater(totals["bytes_out"], len(sub_t.value()) - 1)
        self.assertEqual(totals["udp_datagrams"], {"accepted": 0, "incompatible": 0,
                                                   "rejected": 0, "oversize": 0,
                                                   "malformed": 0, "unexpected": 0})

    def test_status_is_type_checked(self):
        """The declared counters (RouterStats, LinkStats, the router's
        budgets) fail a rename only where mypy reads elvin.ops.status."""
        import tomllib
        with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
            files = tomllib.load(f)["tool"]["mypy"]["files"]
        self.assertIn("elvin/ops/status.py", files)


class FederationMetricsTests(unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def test_link_metrics(self):
        from elvin.test.test_federation import FedRouter
        hub = FedRouter(self, "hub.test")
        leaf = FedRouter(self, "leaf.test")
        yield leaf.link_to(hub)
        consumer = yield client.connect(leaf.uri)
        self.addCleanup(consumer.close)
        got = []
        yield consumer.subscribe("require(n)", got.append)
        yield wait_until(lambda: not hub.link("leaf.test").remote_filter.is_false)
        producer = yield client.connect(hub.uri)
        self.addCleanup(producer.close)
        for n in range(10):
            producer.notify({"n": n})
        yield wait_until(lambda: len(got) == 10)
        scraped = samples(registry_for(lambda: snapshot(hub.router, hub.manager, started=0,
                                                        domain="hub.test")))
        peer = (("peer", "leaf.test"),)
        self.assertEqual(scraped[("elvin_federation_link_up", peer)], 1)
        self.assertEqual(scraped[("elvin_federation_notifications_total",
                                  (("direction", "out"), ("peer", "leaf.test")))], 10)
        self.assertGreater(scraped[("elvin_federation_bytes_total",
                                    (("direction", "out"), ("peer", "leaf.test")))], 10 * 20)
        self.assertLess(scraped[("elvin_federation_last_heard_seconds", peer)], 30)
        self.assertEqual(scraped[("elvin_federation_dropped_total",
                                  (("cause", "overload"), ("peer", "leaf.test")))], 0)
        self.assertEqual(scraped[("elvin_federation_dropped_all_total",
                                  (("cause", "unsent"),))], 0)
        # trace records lost are exported by cause (no tracing here: none)
        self.assertEqual(scraped[("elvin_trace_records_dropped_total",
                                  (("cause", "overflow"),))], 0)
        self.assertEqual(scraped[("elvin_trace_records_dropped_total",
                                  (("cause", "error"),))], 0)
        # the consumer's SubRply waited for the hub's answer to leaf's filter
        at_leaf = samples(registry_for(lambda: snapshot(leaf.router, leaf.manager, started=0,
                                                        domain="leaf.test")))
        self.assertEqual(at_leaf[("elvin_federation_replies_waited_total", ())], 1)
        self.assertEqual(at_leaf[("elvin_federation_replies_timed_out_total", ())], 0)



class ConfiguredLinkTests(unittest.TestCase):
    """docs/operations.md, "Metrics": a configured link (Federation.Connect)
    has a row in status.json and elvin-stat, and its series in /metrics,
    whether its peer is up or not: its state, last error and next attempt,
    link_up 0 while down, and counters that run on across reconnections
    (an in-memory router dialling scripted peers, on a fake clock)."""

    URI = "ewaf:1.0/tcp,none,xdr/peer.example:2916"

    def setUp(self):
        from types import SimpleNamespace
        from elvin.federation import protocol as fedproto
        from elvin.federation.manager import FederationClass, FederationManager
        from elvin.test.fednet import Net
        self.patch(fedproto, "random", SimpleNamespace(random=lambda: 0.25))
        self.net = Net()
        self.router = Router()
        self.manager = FederationManager(self.router, "ours.test",
                                         [FederationClass("Peer", hosts=["*"])], None,
                                         self.net.clock, debounce=0.05)

    def keep(self, plans):
        from elvin.federation.protocol import ConnectorFactory, connector_service
        endpoint = _Refusing(self.net, plans)
        factory = ConnectorFactory(self.manager, self.manager.classes["Peer"], 0)
        service = connector_service(self.net.clock, endpoint, factory, initial_delay=0.5,
                                    name=self.URI, host="peer.example")
        service.startService()

        def stop():
            stopped = service.stopService()
            self.net.flush()
            return stopped
        self.addCleanup(stop)
        return endpoint, service

    def status(self):
        return snapshot(self.router, self.manager, started=1, domain="ours.test")

    def scrape(self):
        return samples(registry_for(self.status))

    def run_until(self, test, limit=60.0):
        deadline = self.net.clock.seconds() + limit
        while not test() and self.net.clock.seconds() < deadline:
            self.net.run(0.01)
        self.assertTrue(test())

    def notify(self, endpoint, count):
        from elvin.federation import packets as fed_packets
        for n in range(count):
            endpoint.peers[-1].send(fed_packets.FedNotify({"n": n}, True, packets.Keys.EMPTY,
                                                          ("peer.test",)))
        self.net.flush()

    def test_a_configured_link_is_shown_up_or_down(self):
        from elvin.tools.stat import format_status
        endpoint, _ = self.keep(["refused", "good", "refused", "good"])
        (row,) = self.status()["links"]
        self.assertEqual((row["state"], row["uri"], row["host"], row["domain"]),
                         ("redialling", self.URI, "peer.example", None))
        self.assertIn("refused", row["last_error"])
        self.assertEqual((row["attempts"], row["next_attempt_s"]), (1, 1.25))
        self.assertEqual(self.scrape()[("elvin_federation_link_up", (("peer", self.URI),))], 0)
        self.assertIn(f"link (peer not yet known) ({self.URI}) REDIALLING (attempt 1 since up "
                      "in 1 s; last error 0 s ago: Connection was refused",
                      format_status(self.status()))

        self.run_until(lambda: self.manager.links)
        self.notify(endpoint, 3)
        (row,) = self.status()["links"]
        self.assertEqual((row["state"], row["domain"], row["in"], row["attempts"]),
                         ("up", "peer.test", 3, 0))
        peer = (("peer", "peer.test"),)
        scraped = self.scrape()
        self.assertEqual(scraped[("elvin_federation_link_up", peer)], 1)
        self.assertNotIn(("elvin_federation_link_up", (("peer", self.URI),)), scraped)
        bytes_in = row["bytes_in"]

        endpoint.peers[-1].transport.loseConnection()       # the peer goes away
        self.net.flush()
        (row,) = self.status()["links"]
        self.assertEqual((row["state"], row["domain"], row["in"], row["bytes_in"]),
                         ("redialling", "peer.test", 3, bytes_in))
        self.assertEqual(row["last_error"], "connection_lost")
        scraped = self.scrape()
        self.assertEqual(scraped[("elvin_federation_link_up", peer)], 0)
        self.assertEqual(scraped[("elvin_federation_notifications_total",
                                  (("direction", "in"), ("peer", "peer.test")))], 3)
        self.assertIn("link peer.test (" + self.URI + ") REDIALLING",
                      format_status(self.status()))

        self.run_until(lambda: self.manager.links)            # refused once, then back
        self.notify(endpoint, 2)
        (row,) = self.status()["links"]
        self.assertEqual((row["state"], row["in"]), ("up", 5))
        self.assertGreater(row["bytes_in"], bytes_in)
        self.assertEqual(self.scrape()[("elvin_federation_notifications_total",
                                        (("direction", "in"), ("peer", "peer.test")))], 5)

    def test_a_handshake_under_way_is_connecting(self):
        self.keep(["stall"])
        self.net.run(0.1)
        (row,) = self.status()["links"]
        self.assertEqual((row["state"], row["next_attempt_s"], row["pull_filter"]),
                         ("connecting", None, None))
        self.assertGreater(row["bytes_out"], 0)               # its FedConnRqst

    def test_a_stopped_keeper_is_forgotten(self):
        _, service = self.keep(["refused", "refused"])
        self.assertEqual(len(self.status()["links"]), 1)
        service.stopService()
        self.assertEqual(self.status()["links"], [])

    def test_one_series_a_peer(self):
        """A configured link redialling while its peer's own link to us is
        up (each side dials the other): one series for the peer, up."""
        from elvin.ops.metrics import RouterCollector
        status = self.status()
        row = dict.fromkeys(("in", "out", "bytes_in", "bytes_out", "loops", "suppressed",
                             "duplicates", "overload", "unsent", "filter_nodes"), 1)
        row.update(domain="peer.test", host="10.0.0.1", active=True, last_heard_s=2.0)
        status["links"] = [dict(row, state="redialling", uri=self.URI, active=False,
                                filter_nodes=0, last_heard_s=None),
                           dict(row, state="up", uri=None, filter_nodes=7)]
        collector = RouterCollector(lambda: status)
        from prometheus_client.core import CollectorRegistry
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        text = generate_latest(registry).decode()
        self.assertEqual(text.count('elvin_federation_link_up{peer="peer.test"}'), 1)
        scraped = samples(registry)
        peer = (("peer", "peer.test"),)
        self.assertEqual(scraped[("elvin_federation_link_up", peer)], 1)
        self.assertEqual(scraped[("elvin_federation_link_active", peer)], 1)
        self.assertEqual(scraped[("elvin_federation_pull_filter_nodes", peer)], 7)
        self.assertEqual(scraped[("elvin_federation_last_heard_seconds", peer)], 2.0)
        self.assertEqual(scraped[("elvin_federation_notifications_total",
                                  (("direction", "in"), ("peer", "peer.test")))], 2)


class _Queued(RecordingOutput):
    """A client's output with ``queued`` bytes waiting."""

    def __init__(self, queued):
        super().__init__()
        self.queued = queued

    def queued_bytes(self):
        return self.queued


class IncomingLinkTests(unittest.TestCase):
    """docs/operations.md, "Metrics": a link a peer dialled to us keeps a
    row (state down) and its series while it is down, and its counters run
    on when the peer dials again; at most gone.MAX_PEERS peers are kept."""

    def setUp(self):
        from elvin.test.fednet import Net
        self.net = Net()
        self.hub, self.leaf = self.net.routers_named("hub.test", "leaf.test")
        self.watcher = self.hub.client()
        self.watcher.subscribe("require(n)")
        self.publisher = self.leaf.client()

    def linked(self):
        self.net.link(self.leaf, self.hub)          # the leaf dials: incoming at the hub
        self.net.run(0.5)
        self.assertEqual([l.peer_domain for l in self.hub.manager.links], ["leaf.test"])

    def status(self):
        return snapshot(self.hub.router, self.hub.manager, started=1, domain="hub.test")

    def test_counters_run_on_across_the_peers_reconnection(self):
        from elvin.tools.stat import format_status
        peer = (("peer", "leaf.test"),)
        notified_in = ("elvin_federation_notifications_total",
                       (("direction", "in"), ("peer", "leaf.test")))
        self.linked()
        self.publisher.notify({"n": 1})
        self.net.flush()
        (row,) = self.status()["links"]
        self.assertEqual((row["state"], row["outgoing"], row["in"]), ("up", False, 1))
        bytes_in = row["bytes_in"]

        self.hub.link("leaf.test").output.transport.loseConnection()
        self.net.flush()
        self.assertEqual(self.hub.manager.links, [])
        (row,) = self.status()["links"]
        self.assertEqual((row["state"], row["domain"], row["in"], row["bytes_in"]),
                         ("down", "leaf.test", 1, bytes_in))
        self.assertIsNotNone(row["last_error"])
        scraped = samples(registry_for(self.status))
        self.assertEqual(scraped[("elvin_federation_link_up", peer)], 0)
        self.assertEqual(scraped[notified_in], 1)
        self.assertIn("leaf.test", format_status(self.status()))

        self.linked()
        self.publisher.notify({"n": 2})
        self.net.flush()
        (row,) = self.status()["links"]
        self.assertEqual((row["state"], row["in"]), ("up", 2))
        self.assertGreater(row["bytes_in"], bytes_in)
        scraped = samples(registry_for(self.status))
        self.assertEqual(scraped[("elvin_federation_link_up", peer)], 1)
        self.assertEqual(scraped[notified_in], 2)

    def test_only_the_latest_peers_gone_are_kept(self):
        from types import SimpleNamespace
        from elvin.federation.gone import IncomingPeers
        from elvin.federation.link import LinkStats
        kept = IncomingPeers(self.net.clock, limit=2)
        for n in range(5):
            stats = LinkStats()
            stats["in"] = n
            kept.went_down(SimpleNamespace(peer_domain=f"p{n}.test", peer_host="h",
                                           fed_class=None, last_heard=None, stats=stats,
                                           output=SimpleNamespace(bytes_in=1, bytes_out=1)),
                           "connection_lost")
        kept.went_down(SimpleNamespace(peer_domain=None), "refused")   # never up: not kept
        self.assertEqual((len(kept), kept.forgotten), (2, 3))
        self.assertEqual([p.domain for p in kept.down(["p4.test"])], ["p3.test"])
        self.assertEqual(kept.past("p4.test")["in"], 4)
        self.assertEqual(kept.past("p0.test"), {})


class _Refusing(_ScriptedEndpoint):
    """A ``_ScriptedEndpoint`` whose plan ``refused`` fails the TCP connect."""

    def __init__(self, net, plans):
        super().__init__(net, [])
        self.queue = list(plans)

    def connect(self, factory):
        plan = self.queue.pop(0)
        if plan == "refused":
            self.attempts.append(self.net.clock.seconds())
            return defer.fail(error.ConnectionRefusedError())
        self.plans = iter([plan])
        return super().connect(factory)

class HttpsTests(unittest.TestCase):
    timeout = 60

    def test_bare_port_means_loopback(self):
        from elvin.config import parse
        self.assertEqual(parse("status-listen = 9917\n").status_listen,
                         ("http", "127.0.0.1", 9917))

    @defer.inlineCallbacks
    def test_https_listener_with_the_router_certificate(self):
        import ssl
        import trustme
        from elvin import tap
        from elvin.config import parse
        from elvin.test.places import free_port
        ca = trustme.CA()
        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        cert = os.path.join(folder, "router.pem")
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(cert)
        port = free_port()
        config = parse(f"status-listen = https://127.0.0.1:{port}\n"
                       f"tls-certificate = {cert}\n", os.path.join(folder, "x.conf"))
        listener = tap.status_service(reactor, config, Router())
        listener.startService()
        self.addCleanup(listener.stopService)
        context = ssl.create_default_context()
        ca.configure_trust(context)

        def fetch():
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/status.json",
                                        context=context, timeout=10) as response:
                return json.loads(response.read())
        status = yield threads.deferToThread(fetch)
        self.assertEqual(status["totals"]["connections_open"], 0)


class LogWriteErrorTests(unittest.TestCase):
    """docs/operations.md, "A full disk": a log observer whose writes fail
    (ENOSPC, EFBIG) is counted in elvin_log_write_errors_total, read from
    the status listener, which needs no disk."""

    def test_failed_writes_are_counted_and_exported(self):
        import errno
        from twisted.logger import LogPublisher, Logger
        from elvin.ops import logerrors
        from elvin.ops.metrics import registry_for
        from elvin.ops.status import snapshot
        from prometheus_client import generate_latest

        def full_disk(event):
            raise OSError(errno.ENOSPC, "No space left on device")
        publisher = LogPublisher(full_disk)
        counter = logerrors.LogWriteErrors()
        counter.install(publisher)
        counter.install(publisher)
        log = Logger(observer=publisher)
        for n in range(3):
            log.info("line {n}", n=n)
        self.assertEqual(counter.count, 3)
        counter.uninstall(publisher)
        log.info("still watched")
        self.assertEqual(counter.count, 4)
        counter.uninstall(publisher)
        log.info("not watched")
        self.assertEqual(counter.count, 4)
        self.patch(logerrors.WRITE_ERRORS, "count", 4)
        from elvin.core.router import Router
        text = generate_latest(registry_for(lambda: snapshot(Router()))).decode()
        self.assertIn("elvin_log_write_errors_total 4.0", text)
