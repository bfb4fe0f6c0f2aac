"""Operating a router (issue 19, first part): status snapshot, Prometheus
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
from twisted.web import server

from elvin import client
from elvin.core.router import Router
from elvin.ops.metrics import registry_for
from elvin.ops.status import snapshot
from elvin.ops.web import StatusSite, status_root
from elvin.protocols import packets as P
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
        session.packet_received(P.ConnRqst(1, 4, 0, {}))
        out.take()
        return session, out

    def test_counts_follow_the_packets(self):
        sub, sub_out = self.session("sub")
        sub.packet_received(P.SubAddRqst(2, "require(x)", True, P.Keys.EMPTY))
        sub.packet_received(P.SubAddRqst(3, "x ==", True, P.Keys.EMPTY))   # Nack 2101
        pub, _ = self.session("pub")
        for n in range(5):
            pub.packet_received(P.NotifyEmit({"x": n}, True, P.Keys.EMPTY))
        pub.packet_received(P.NotifyEmit({"y": 1}, True, P.Keys.EMPTY))
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
            return subprocess.run([sys.executable, "-m", "elvin.tools.stat", "-e", self.base,
                                   *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=30)
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
