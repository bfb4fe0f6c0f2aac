"""The proxy's counters, as its status listener shows them: counted where
the work is done (a proxy core in memory, upstream a routing core), read
as a snapshot, as Prometheus metrics, and over HTTP on 127.0.0.1."""

from prometheus_client import generate_latest
from twisted.internet import defer, reactor
from twisted.web.client import Agent, readBody
from twisted.web.http_headers import Headers
from twisted.web.server import Site

from elvin.protocols import packets
from elvin.proxy.core import ACK, ProxyCore
from elvin.proxy.counters import registry_for, snapshot, status_root
from elvin.proxy.store import Store
from elvin.test.places import elvin_stat_on_a_thread
from elvin.test.test_proxy_core import InProcessUpstream, ProxyCoreCase
from elvin.values import Int64


class CountersTest(ProxyCoreCase):

    def test_stored_replayed_acknowledged_and_drops_by_cause(self):
        phone, out = self.join("phone")
        self.subscribe(phone, out, "require(n)")
        phone.connection_lost()
        for n in range(5):
            self.publish({"n": n})
        phone, out = self.join("phone", Ack_Window=100)
        phone.packet_received(packets.QosRqst(next(self.xids), {ACK: Int64(3)}))
        self.core.upstream_dropwarn()
        self.core.upstream.early_retries = 2      # as Upstream counts them
        self.core.counters.upstream_timeouts = 4  # as the relay counts them
        status = snapshot(self.core)
        self.assertEqual(status["stored"], 5)
        self.assertEqual(status["replayed"], 5)
        self.assertEqual(status["acknowledged"], 3)
        self.assertEqual(status["upstream_dropwarns"], 1)
        self.assertEqual(status["sessions"], 1)
        self.assertEqual(status["clients"], 1)
        self.assertEqual(status["upstream_up"], 1)
        self.assertEqual(status["upstream_early_retries"], 2)
        self.assertEqual(status["upstream_timeouts"], 4)
        self.assertEqual(status["dropped"], {"session_cap": 0, "total_cap": 0,
                                             "not_stored": 0, "client_queue": 0,
                                             "backlog": 0, "upstream_gap": 0,
                                             "restart": 0})
        text = generate_latest(registry_for(lambda: snapshot(self.core))).decode()
        self.assertIn("elvin_proxy_stored_total 5.0", text)
        self.assertIn("elvin_proxy_acknowledged_total 3.0", text)
        self.assertIn("elvin_proxy_upstream_dropwarns_total 1.0", text)
        self.assertIn("elvin_proxy_upstream_early_retries_total 2.0", text)
        self.assertIn("elvin_proxy_upstream_timeouts_total 4.0", text)
        self.assertIn('elvin_proxy_dropped_total{cause="session_cap"} 0.0', text)
        self.assertIn("elvin_proxy_sessions 1.0", text)

    def test_session_caps_and_a_closed_clients_queue_drops_are_counted(self):
        self.store = Store(":memory:", max_stored=2)
        self.restart()
        phone, out = self.join("phone")
        self.subscribe(phone, out, "require(n)")
        phone.connection_lost()
        for n in range(5):
            self.publish({"n": n})
        pda, _ = self.join("other")
        pda.dropped = 7                 # as the send queue counts what it dropped
        pda.connection_lost()
        self.core.session_closed(pda)   # told again as the connection goes: once counted
        dropped = snapshot(self.core)["dropped"]
        self.assertEqual(dropped["session_cap"], 3)
        self.assertEqual(dropped["client_queue"], 7)

    def test_throttled_password_checks(self):
        self.join("locked", Password="right")
        for _ in range(8):
            self.join("locked", Password="wrong")
        checks = snapshot(self.core)["password_checks"]
        # One scrypt to create the session, five to refuse; then the address
        # is throttled: three refused unchecked (failures count all eight).
        self.assertEqual(checks, {"checked": 6, "failed": 8, "throttled": 3, "busy": 0})


class StatusListenerTest(ProxyCoreCase):
    """``/metrics`` and ``/status.json`` over HTTP, with the token."""

    def setUp(self):
        super().setUp()
        site = Site(status_root(self.core, "s3cret", ["elvin://127.0.0.1:2916"],
                                "elvin://127.0.0.1:2917"))
        self.port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(self.port.stopListening)
        self.base = f"http://127.0.0.1:{self.port.getHost().port}"

    async def get(self, path, token=None):
        headers = Headers({b"Authorization": [f"Bearer {token}".encode()]} if token else {})
        response = await Agent(reactor).request(b"GET", (self.base + path).encode(),
                                                headers)
        return response.code, (await readBody(response)).decode()

    def test_metrics_and_status_need_the_token(self):
        async def run():
            code, _ = await self.get("/metrics")
            self.assertEqual(code, 401)
            code, text = await self.get("/metrics", "s3cret")
            self.assertEqual(code, 200)
            self.assertIn("elvin_proxy_replayed_total", text)
            code, text = await self.get("/status.json", "s3cret")
            self.assertEqual(code, 200)
            self.assertIn('"upstream_dropwarns": 0', text)
        return defer.ensureDeferred(run())

    def elvin_stat(self, *args):
        return elvin_stat_on_a_thread(self.base, *args)

    def test_elvin_stat_prints_the_proxys_figures(self):
        async def run():
            phone, out = self.join("phone")
            self.subscribe(phone, out, "require(n)")
            phone.connection_lost()
            self.publish({"n": 1})
            code, stdout, stderr = await self.elvin_stat("-t", "s3cret")
            self.assertEqual((code, stderr), (0, ""))
            for text in ("proxy version ", "listening on elvin://127.0.0.1:2916",
                         "upstream elvin://127.0.0.1:2917 up", "sessions 1  clients 0",
                         "stored 1  replayed 0", "dropped none"):
                self.assertIn(text, stdout)
            code, stdout, _ = await self.elvin_stat("-t", "s3cret", "-i", "0.2", "-n", "2")
            self.assertEqual(code, 0)
            self.assertIn("/s)", stdout)                       # rates, the second time
        return defer.ensureDeferred(run())

    def test_elvin_stat_refuses_what_is_not_a_status(self):
        from elvin.tools.stat import NotAStatus, format_status
        for text in ({"stored": 1}, [], {"router": {}}):
            self.assertRaises(NotAStatus, format_status, text)

    def test_elvin_stat_reload_is_told_the_proxy_does_not_reload(self):
        async def run():
            code, stdout, stderr = await self.elvin_stat("-t", "s3cret", "--reload")
            self.assertEqual((code, stdout), (1, ""))
            self.assertIn("the proxy does not reload its configuration file", stderr)
            self.assertNotIn("status-token", stderr)
            code, _, stderr = await self.elvin_stat("--reload")    # no token: refused
            self.assertEqual(code, 1)
            self.assertIn("HTTP 401", stderr)
        return defer.ensureDeferred(run())


# ProxyCore and InProcessUpstream are what ProxyCoreCase builds on; named
# here so that a reader finds what the snapshot reads.
__all__ = ["ProxyCore", "InProcessUpstream"]
