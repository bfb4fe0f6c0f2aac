"""The status page in a real headless browser (Debian's chromium, driven
over its DevTools protocol with websocket-client): it loads, a client
appears and a federation link comes up without a reload, and a screenshot
is saved (``status-page.png`` in the test's folder); with hundreds of
clients and a configured link that is down it stays short and fits a
narrow window (``status-page-many.png``, ``status-page-narrow.png``).

Skipped, with the reason, where no chromium is installed; ``.ci/run``
installs it."""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

from twisted.internet import defer, reactor, threads
from twisted.trial import unittest

from elvin import client
from elvin.ops.page import CLIENTS
from elvin.ops.web import StatusSite, status_root
from elvin.protocols import packets
from elvin.test.places import free_port
from elvin.test.test_federation import FedRouter
from elvin.test.test_ops import _Queued

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """A headless chromium and one page, over the DevTools protocol."""

    def __init__(self, path):
        import websocket
        self.profile = tempfile.mkdtemp(prefix="elvin-chromium-")
        self.proc = subprocess.Popen(
            [path, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={self.profile}", "--window-size=1200,900",
             "--no-first-run", "--no-default-browser-check", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._attach(websocket)
        except BaseException:
            self._stop()            # never leave a browser behind
            raise

    def _attach(self, websocket):
        # the browser creates the file, then writes it: wait for a whole first line
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + 30
        port = None
        while port is None:
            try:
                with open(port_file) as f:
                    line = f.readline()
                if line.endswith("\n"):
                    port = int(line)
            except FileNotFoundError:
                pass
            if port is None:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"headless browser wrote no port to {port_file} in 30 s")
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=10,
                                              suppress_origin=True)
        self.ids = 0

    def call(self, method, **params):
        self.ids += 1
        self.ws.send(json.dumps({"id": self.ids, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.ids:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def close(self):
        try:
            self.ws.close()
        finally:
            self._stop()

    def _stop(self):
        """Stop chromium and every process it started (its own group)."""
        import signal
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)


class StatusPageBrowserTest(unittest.TestCase):
    timeout = 120

    def setUp(self):
        self.browser_path = find_browser()
        if self.browser_path is None:
            raise unittest.SkipTest("no chromium installed (apt-get install chromium); "
                                    ".ci/run installs it")
        try:
            import websocket  # noqa: F401
        except ImportError:
            raise unittest.SkipTest("websocket-client is not installed "
                                    "(pip install '.[test]')")

    def screenshot(self, browser, name):
        shot = browser.call("Page.captureScreenshot", format="png")
        path = os.path.abspath(name)
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        self.assertGreater(os.path.getsize(path), 10_000)
        return path

    @defer.inlineCallbacks
    def test_many_clients_and_a_link_down_in_a_wide_and_a_narrow_window(self):
        """docs/operations.md, "The status page": links and refusals come
        first, then the CLIENTS clients with the largest queues and most
        drops and a line counting the others; a configured link whose peer
        is down shows why; in a 380 px window only the tables' own boxes
        scroll sideways."""
        from twisted.internet import endpoints
        from elvin.federation.protocol import ConnectorFactory, connector_service
        hub = FedRouter(self, "hub.test")
        dead = f"ewaf:1.0/tcp,none,xdr/127.0.0.1:{free_port()}"    # nobody listens
        keeper = connector_service(
            reactor, endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", int(dead.rsplit(":")[-1])),
            ConnectorFactory(hub.manager, hub.fed_class, 0), name=dead, host="127.0.0.1")
        keeper.startService()
        self.addCleanup(keeper.stopService)
        for n in range(3 * CLIENTS):
            out = _Queued(1000 * n if n % 50 == 7 else 0)
            session = hub.router.open_session(out, f"10.0.{n // 256}.{n % 256}:4000")
            session.packet_received(packets.ConnRqst(1, 4, 0, {}))
        session.packet_received(packets.SubAddRqst(2, "x ==", True, packets.Keys.EMPTY))
        self.addCleanup(lambda: [s.connection_lost() for s in list(hub.router.sessions)])
        site = StatusSite(status_root(hub.router, hub.manager, [hub.uri], "hub.test"))
        web = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(web.stopListening)
        browser = yield threads.deferToThread(Browser, self.browser_path)
        self.addCleanup(browser.close)
        yield threads.deferToThread(browser.call, "Page.enable")
        yield threads.deferToThread(browser.call, "Page.navigate",
                                    url=f"http://127.0.0.1:{web.getHost().port}/")
        page = """(() => {
          const top = id => document.getElementById(id).getBoundingClientRect().top;
          const rows = id => Array.from(document.querySelectorAll("#" + id + " tbody tr"),
                                        tr => tr.innerText);
          const box = document.querySelector("#clients").parentElement;
          return {clients: rows("clients"), links: rows("links"),
                  refusals: rows("refusals"),
                  more: document.getElementById("clients-more").innerText,
                  order: [top("links"), top("refusals"), top("clients")],
                  height: document.documentElement.scrollHeight,
                  page_wider: document.documentElement.scrollWidth > innerWidth,
                  box_wider: box.scrollWidth > box.clientWidth};
        })()"""

        @defer.inlineCallbacks
        def seen(test, seconds=20):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                got = yield threads.deferToThread(browser.evaluate, page)
                if got and got["clients"] and test(got):
                    return got
                yield threads.deferToThread(time.sleep, 0.25)
            raise AssertionError(f"the page never showed it: {got!r}")
        wide = yield seen(lambda p: "refused" in " ".join(p["links"]))
        self.assertEqual(len(wide["clients"]), CLIENTS)
        self.assertEqual(sorted(wide["order"]), wide["order"])     # clients last
        # The largest queues first: clients 7, 57, 107, ... (1000 bytes each n).
        self.assertTrue(wide["clients"][0].startswith("10.0.1.1:4000\t257,000\t"),
                        wide["clients"][0])
        self.assertIn(f"{2 * CLIENTS} more", wide["more"])
        (link,) = wide["links"]
        self.assertIn(dead, link)
        self.assertIn("Connection was refused", link)
        self.assertIn("2101", wide["refusals"][0])
        self.assertLess(wide["height"], 5000)
        self.assertFalse(wide["page_wider"])
        yield threads.deferToThread(self.screenshot, browser, "status-page-many.png")
        yield threads.deferToThread(browser.call, "Emulation.setDeviceMetricsOverride",
                                    width=380, height=800, deviceScaleFactor=1, mobile=False)
        narrow = yield seen(lambda p: p["box_wider"])
        self.assertFalse(narrow["page_wider"])
        self.assertEqual(sorted(narrow["order"]), narrow["order"])
        yield threads.deferToThread(self.screenshot, browser, "status-page-narrow.png")

    @defer.inlineCallbacks
    def test_page_shows_a_client_and_a_link_appear_without_reload(self):
        hub = FedRouter(self, "hub.test", mesh_interval=0.5)
        leaf = FedRouter(self, "leaf.test", mesh_interval=0.5)
        site = StatusSite(status_root(hub.router, hub.manager, [hub.uri], "hub.test",
                                      token="t0k"))
        web = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(web.stopListening)
        url = f"http://127.0.0.1:{web.getHost().port}/?token=t0k"
        browser = yield threads.deferToThread(Browser, self.browser_path)
        self.addCleanup(browser.close)

        def rows(table):
            return threads.deferToThread(
                browser.evaluate,
                f"Array.from(document.querySelectorAll('#{table} tbody tr'))"
                f".map(tr => tr.innerText)")
        yield threads.deferToThread(browser.call, "Page.enable")
        yield threads.deferToThread(browser.call, "Page.navigate", url=url)
        found = []

        @defer.inlineCallbacks
        def poll(table, test, seconds=20):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                got = yield rows(table)
                if got is not None and test(got):
                    found.append(got)
                    return got
                yield threads.deferToThread(time.sleep, 0.25)
            raise AssertionError(f"#{table} never showed it: {got!r}")
        yield poll("clients", lambda r: r == [])
        yield poll("links", lambda r: r == [])
        conn = yield client.connect(hub.uri)
        self.addCleanup(conn.close)
        yield conn.subscribe('Group == "ops"', lambda n: None)
        clients = yield poll("clients", lambda r: len(r) == 1 and "connected" in r[0])
        self.assertIn("tcp", clients[0])
        yield leaf.link_to(hub)
        links = yield poll("links", lambda r: len(r) == 1 and "up" in r[0])
        self.assertIn("leaf.test", links[0])
        # The leaf's subscriber shows as the link's pull filter, as text.
        remote = yield client.connect(leaf.uri)
        self.addCleanup(remote.close)
        yield remote.subscribe('Group == "ops" && Severity > 2', lambda n: None)
        yield poll("links", lambda r: len(r) == 1 and 'Group == "ops"' in r[0])
        for n in range(5):
            conn.notify({"Group": "ops", "Severity": n})
        try:
            yield conn.subscribe("Severity >", lambda n: None)     # a refusal to show
        except client.NackError:
            pass
        yield poll("refusals", lambda r: len(r) == 1 and "2101" in r[0])
        # The page was never reloaded: the same document all along.
        self.assertEqual((yield threads.deferToThread(
            browser.evaluate, "performance.getEntriesByType('navigation').length")), 1)
        shot = yield threads.deferToThread(browser.call, "Page.captureScreenshot",
                                           format="png")
        path = os.path.abspath("status-page.png")
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        self.assertGreater(os.path.getsize(path), 10_000)
        target = os.environ.get("ELVIN_STATUS_SCREENSHOT")
        if target:
            shutil.copy(path, target)
