"""Operating a router: status snapshot, Prometheus
metrics, the status listener and elvin-stat."""

import json
import os
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest
from twisted.internet import defer, reactor, threads
from twisted.trial import unittest

from elvin import client
from elvin.core.router import Router
from elvin.ops.metrics import registry_for
from elvin.ops.status import snapshot
from elvin.ops.web import StatusSite, status_root
from elvin.protocols import packets
from elvin.protocols.server import ElvinServerFactory
from elvin.test.places import REPO
from elvin.test.polling import wait_until
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

    def session(self, peer):
        out = RecordingOutput()
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

        def run(*args):
            """elvin-stat's main in this process (on a thread: it blocks)."""
            import contextlib
            import io
            import types
            from elvin.tools import stat
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    stat.main(["-e", self.base, *args])
                    code = 0
                except SystemExit as e:
                    code = e.code or 0
            return types.SimpleNamespace(returncode=code, stdout=out.getvalue(),
                                         stderr=err.getvalue())
        done = yield threads.deferToThread(run, "-t", "s3cret")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("clients 1 tcp=1  subscriptions 1", done.stdout)
        done = yield threads.deferToThread(run, "-t", "s3cret", "--json", "-i", "0.2",
                                           "-n", "2")
        lines = done.stdout.splitlines()
        self.assertEqual(len(lines), 2)
        self.assertEqual(json.loads(lines[0])["totals"]["subscriptions"], 1)
        done = yield threads.deferToThread(run)
        self.assertEqual(done.returncode, 1)
        self.assertIn("HTTP 401", done.stderr)
        self.assertIn("give --token", done.stderr)


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


class ReloadTests(unittest.TestCase):
    """SIGHUP re-reads the file: a federation link and a limit change, no
    client is dropped; a broken file leaves everything as it was."""
    timeout = 90

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
        yield wait_until(lambda: first.manager.links, timeout=30)
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
        # And through the status listener, with the token (elvin-stat --reload).
        write(first, 10)
        done = yield threads.deferToThread(
            subprocess.run, [sys.executable, "-m", "elvin.tools.stat", "-e",
                             f"http://127.0.0.1:{status_port}", "-t", "t", "--reload"],
            cwd=REPO, capture_output=True, text=True, timeout=60)
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
        self.assertEqual(totals["send_queue_bytes"], router.queue_budget.total)
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
        # the consumer's SubRply waited for the hub's answer to leaf's filter
        at_leaf = samples(registry_for(lambda: snapshot(leaf.router, leaf.manager, started=0,
                                                        domain="leaf.test")))
        self.assertEqual(at_leaf[("elvin_federation_replies_waited_total", ())], 1)
        self.assertEqual(at_leaf[("elvin_federation_replies_timed_out_total", ())], 0)


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
