"""The proxy as users run it: a real router process, a real proxy process
(``twistd elvin-proxy``) and real clients, all on 127.0.0.1."""

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

from twisted.internet import defer, reactor, task, utils
from twisted.trial import unittest

from elvin import client
from elvin.test.places import REPO, free_port, start_twistd, wait_listening
from elvin.client import CloseUnconfirmed
from elvin.test.test_client_flavours import shared_router, start_router, stop_router


def start_proxy(upstream, database, port=None, extra=()):
    """A proxy process on ``port`` (default a free one), its log appended to
    the database's name + ``.log``; its URI and process."""
    port, proc = start_twistd(
        "elvin-proxy",
        lambda p: ["-l", f"elvin://127.0.0.1:{p}", "-u", upstream, "-d", database, *extra], port,
        log=database + ".log")
    return f"elvin://127.0.0.1:{port}", proc


def sleep(seconds):
    return task.deferLater(reactor, seconds, lambda: None)


async def until(predicate, timeout=15.0, step=0.05):
    """Wait (at most ``timeout`` s) for ``predicate()``; returns its last value."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        await sleep(step)
    return predicate()


async def upstream_ready(proxy_uri, router_uri):
    """Wait until the proxy is subscribed upstream: a probe published to the
    router comes back through it (a subscription made before that sees only
    what is published once the proxy is connected)."""
    got = []
    probe = await client.connect(proxy_uri, reactor=reactor)
    await probe.subscribe("require(probe)", got.append)
    router = await client.connect(router_uri, reactor=reactor)
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        router.notify({"probe": 1})
        await sleep(0.1)
    await probe.close()
    await router.close()
    if not got:
        raise AssertionError("the proxy never connected upstream")


def router_for(test):
    """The router ``test`` publishes to and its proxy connects to: this
    module's shared router process, or one of the test's own (stopped
    when it ends) if the test stops or restarts it (``own_router``)."""
    if not getattr(getattr(test, test._testMethodName), "own_router", False):
        return shared_router(), None
    # (free ports chosen by the starters: they choose again if another
    # test's process takes one first; restarts reuse them)
    uri, proc = start_router()
    test.addCleanup(lambda: stop_router(test.router))
    return uri, proc


def own_router(method):
    """Mark a test that stops or restarts its router."""
    method.own_router = True
    return method


class ProxyIntegrationTest(unittest.TestCase):

    def setUp(self):
        self.router_uri, self.router = router_for(self)
        self.router_port = int(self.router_uri.rsplit(":", 1)[1])
        self.tmp = tempfile.mkdtemp()
        self.db = os.path.join(self.tmp, "proxy.db")
        self.proxy_uri, self.proxy = start_proxy(self.router_uri, self.db)
        self.proxy_port = int(self.proxy_uri.rsplit(":", 1)[1])
        self.addCleanup(lambda: stop_router(self.proxy))
        self.connections = []
        # (cleanups run last first: the test's clients close before the
        # proxy and router are stopped, which otherwise linger, blocking
        # this process, until these clients close, up to 5 s)
        self.addCleanup(self.close_connections)
        return defer.ensureDeferred(upstream_ready(self.proxy_uri, self.router_uri))

    def close_connections(self):
        # (a test may have stopped the proxy or router a client is on, so a
        # close they never confirm is fine)
        return defer.DeferredList([c.close().addErrback(lambda f: f.trap(CloseUnconfirmed))
                                   for c in self.connections if not c.is_closed])

    async def connect(self, uri, **kwargs):
        conn = await client.connect(uri, reactor=reactor, **kwargs)
        self.connections.append(conn)
        return conn

    async def publisher(self):
        return await self.connect(self.router_uri)

    def test_disconnect_publish_reconnect_gets_what_matched_and_had_not_expired(self):
        async def run():
            phone = await self.connect(self.proxy_uri, session="phone", password="pw")
            await phone.subscribe('Group == "chat"', lambda n: None)
            await phone.subscribe('Group == "stocks"', lambda n: None, ttl=1)
            await phone.close()
            pub = await self.publisher()
            pub.notify({"Group": "stocks", "n": 0})
            for n in range(1, 4):
                pub.notify({"Group": "chat", "n": n})
            pub.notify({"Group": "news", "n": 99})
            await pub.test_connection()
            await sleep(1.3)             # the stocks one (TTL 1 s) expires
            got = []
            phone = await self.connect(self.proxy_uri, session="phone", password="pw",
                                       reconnect=False)
            phone.on_notification = got.append
            self.assertEqual(sorted(s.expression for s in phone.session_subscriptions.values()),
                             ['Group == "chat"', 'Group == "stocks"'])
            self.assertEqual(phone.sessions["phone"].stored, 3)    # not the expired one
            await until(lambda: len(got) >= 3)
            await sleep(0.2)
            self.assertEqual([n["n"] for n in got], [1, 2, 3])
            chat = next(s.id for s in phone.session_subscriptions.values()
                        if s.expression == 'Group == "chat"')
            for note in got:
                self.assertEqual(note.secure + note.insecure, (chat,))
        return defer.ensureDeferred(run())

    def test_two_devices_non_destructive(self):
        async def run():
            pda = await self.connect(self.proxy_uri, session="me", receipt="non-destructive",
                                     client="pda")
            seen_pda = []
            pda.on_notification = seen_pda.append
            await pda.subscribe("require(n)", lambda n: None)
            pub = await self.publisher()
            pub.notify({"n": 1})
            self.assertTrue(await until(lambda: len(seen_pda) == 1))
            await pda.close()
            pub.notify({"n": 2})
            await pub.test_connection()
            await sleep(0.3)
            seen_laptop = []
            laptop = await self.connect(self.proxy_uri, session="me",
                                        receipt="non-destructive", client="laptop")
            laptop.on_notification = seen_laptop.append
            self.assertTrue(await until(lambda: len(seen_laptop) == 2))
            self.assertEqual([n["n"] for n in seen_laptop], [1, 2])
            seen_pda = []
            pda = await self.connect(self.proxy_uri, session="me",
                                     receipt="non-destructive", client="pda")
            pda.on_notification = seen_pda.append
            self.assertTrue(await until(lambda: len(seen_pda) == 1), seen_pda)
            pub.notify({"n": 3})
            await until(lambda: len(seen_pda) == 2 and len(seen_laptop) == 3)
            await sleep(0.3)
            self.assertEqual([n["n"] for n in seen_pda], [2, 3])        # 1 never twice
            self.assertEqual([n["n"] for n in seen_laptop], [1, 2, 3])
        return defer.ensureDeferred(run())

    def test_kill_9_mid_stream_loses_nothing_stored(self):
        async def run():
            phone = await self.connect(self.proxy_uri, session="phone")
            await phone.subscribe("require(n)", lambda n: None)
            await phone.close()
            pub = await self.publisher()

            def stored_ids():
                db = sqlite3.connect(self.db)
                try:
                    return [n for (n,) in db.execute("SELECT id FROM notifications")]
                finally:
                    db.close()
            for n in range(300):
                pub.notify({"n": n})
                if n % 50 == 49:
                    await sleep(0.01)
                if n == 200:
                    # Killed while it is storing (it has stored some, not all).
                    await until(lambda: len(stored_ids()) >= 20, step=0.005)
                    self.proxy.send_signal(signal.SIGKILL)
                    self.proxy.wait(10)
            await pub.test_connection()
            stored = stored_ids()
            self.assertGreater(len(stored), 0)
            _, self.proxy = start_proxy(self.router_uri, self.db, self.proxy_port)
            got = []
            phone = await self.connect(self.proxy_uri, session="phone")
            phone.on_notification = got.append
            self.assertEqual(phone.sessions["phone"].stored, len(stored))
            await until(lambda: len(got) >= len(stored))
            await sleep(0.2)
            values = [n["n"] for n in got]
            self.assertEqual(len(values), len(stored))
            self.assertEqual(values, sorted(set(values)))    # in order, none twice
            self.assertEqual(values, list(range(len(values))))  # and none lost before the kill
        return defer.ensureDeferred(run())

    @own_router
    def test_upstream_router_restart(self):
        async def run():
            got = []
            phone = await self.connect(self.proxy_uri, session="phone")
            phone.on_notification = got.append
            await phone.subscribe("require(n)", lambda n: None)
            # Stopped without blocking the reactor: the router lingers on a
            # connection until its client (the proxy, this process's own)
            # closes it, up to 5 s.
            self.router.terminate()
            for _ in range(200):
                if self.router.poll() is not None:
                    break
                await sleep(0.05)
            stop_router(self.router)
            _, self.router = start_router(self.router_port)
            pub = await self.publisher()
            n = 0
            deadline = time.monotonic() + 20
            while not got and time.monotonic() < deadline:
                pub.notify({"n": n})       # until the proxy has subscribed again
                n += 1
                await sleep(0.1)
            self.assertTrue(got, "no notification through the proxy after the restart")
            self.assertFalse(phone.is_closed)
        return defer.ensureDeferred(run())

    def test_sighup_is_logged_and_changes_nothing(self):
        """SIGHUP (the router's reload) does not end the proxy: one line in
        its log says it does not reload; its clients stay connected."""
        async def run():
            got = []
            phone = await self.connect(self.proxy_uri, session="hup",
                                       on_notification=got.append)
            await phone.subscribe("require(hup)", lambda n: None)
            self.proxy.send_signal(signal.SIGHUP)
            log = self.db + ".log"

            def logged():
                with open(log, encoding="utf-8", errors="replace") as f:
                    return "SIGHUP: the proxy does not reload its configuration" in f.read()
            self.assertTrue(await until(logged), "no SIGHUP line in the proxy's log")
            self.assertIsNone(self.proxy.poll())
            pub = await self.publisher()
            pub.notify({"hup": 1})
            self.assertTrue(await until(lambda: got))
            self.assertFalse(phone.is_closed)
        return defer.ensureDeferred(run())

    def test_elvin_subscribe_session_shows_what_was_stored(self):
        async def run():
            phone = await self.connect(self.proxy_uri, session="tool")
            await phone.subscribe('Group == "chat"', lambda n: None)
            await phone.close()
            pub = await self.publisher()
            pub.notify({"Group": "chat", "Message": "while you were out"})
            pub.notify({"Group": "chat", "Message": "and again"})
            await pub.test_connection()
            await sleep(0.3)
            out, err, code = await utils.getProcessOutputAndValue(
                sys.executable, ["-m", "elvin.tools.subscribe", "-e", self.proxy_uri,
                                 "--session", "tool", "-n", "2"],
                env=dict(os.environ), path=REPO, reactor=reactor)
            self.assertEqual(code, 0, err)
            text = out.decode()
            self.assertLess(text.index("while you were out"), text.index("and again"))
        return defer.ensureDeferred(run())

    def test_elvin_subscribe_session_tells_of_a_gap_once(self):
        """The proxy restarted while nobody was joined: its next client is
        told of the gap (Proxy.Dropped and Proxy.Gaps, then a DropWarn); the
        tool says so in one line on stderr, as a gap of unknown size (not
        as one notification)."""
        async def run():
            phone = await self.connect(self.proxy_uri, session="gap")
            await phone.subscribe('Group == "chat"', lambda n: None)
            await phone.close()
            self.proxy.send_signal(signal.SIGKILL)
            self.proxy.wait(10)
            _, self.proxy = start_proxy(self.router_uri, self.db, self.proxy_port)
            await upstream_ready(self.proxy_uri, self.router_uri)
            pub = await self.publisher()
            pub.notify({"Group": "chat", "Message": "after the restart"})
            await pub.test_connection()
            await sleep(0.3)
            out, err, code = await utils.getProcessOutputAndValue(
                sys.executable, ["-m", "elvin.tools.subscribe", "-e", self.proxy_uri,
                                 "--session", "gap", "-n", "1"],
                env=dict(os.environ), path=REPO, reactor=reactor)
            self.assertEqual(code, 0, err)
            self.assertIn("after the restart", out.decode())
            lost = [line for line in err.decode().splitlines() if "lost" in line]
            self.assertEqual(len(lost), 1, err)
            self.assertIn("the proxy reports notifications lost from session 'gap' in 1 gap of "
                          "unknown size", lost[0])
        return defer.ensureDeferred(run())

    def test_device_killed_mid_replay_loses_nothing(self):
        """elvin-subscribe --session acknowledges what it printed: killed
        with SIGKILL in the middle of a replay (its output read slowly, so
        it is a slow device), the next join gets everything it had not
        acknowledged; together, every notification, none lost."""
        async def run():
            total = 3000
            phone = await self.connect(self.proxy_uri, session="slow")
            await phone.subscribe("require(n)", lambda n: None)
            await phone.close()
            pub = await self.publisher()
            for n in range(total):
                pub.notify({"n": n, "pad": "x" * 100})
                if n % 500 == 499:
                    await pub.test_connection()

            def stored():
                db = sqlite3.connect(self.db)
                try:
                    return db.execute("SELECT count(*) FROM notifications").fetchone()[0]
                finally:
                    db.close()
            self.assertTrue(await until(lambda: stored() == total))
            device = subprocess.Popen(
                [sys.executable, "-m", "elvin.tools.subscribe", "-e", self.proxy_uri,
                 "--session", "slow"], stdout=subprocess.PIPE, cwd=REPO)
            printed = []
            for _ in range(4 * total):            # bounded: lines of the first 1,000
                line = device.stdout.readline()
                if not line:
                    break
                if line.startswith(b"n: "):
                    printed.append(int(line[3:]))
                    if len(printed) == 1000:
                        break
            device.send_signal(signal.SIGKILL)
            device.wait(10)
            # What it printed before it died (still in the pipe) it had handled.
            printed += [int(line[3:]) for line in device.stdout.read().splitlines()
                        if line.startswith(b"n: ")]
            device.stdout.close()
            self.assertEqual(printed, list(range(len(printed))))
            self.assertLess(len(printed), total)
            got = []
            again = await self.connect(self.proxy_uri, session="slow")
            again.on_notification = lambda note: got.append(note["n"])
            await until(lambda: got and got[-1] == total - 1)
            self.assertEqual(got, sorted(set(got)))                 # in order, once each
            self.assertEqual(set(printed) | set(got), set(range(total)))   # none lost
            self.assertLessEqual(got[0], len(printed))
            self.assertGreaterEqual(got[0], len(printed) - 256)     # at most the window again
        return defer.ensureDeferred(run())

    def test_tls_listener_and_upstream(self):
        """Clients reach the proxy over TLS, and the proxy its router."""
        import trustme
        from elvin.test.test_client_flavours import shared_tls_router
        router_uri, router_ca = shared_tls_router()
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert_file = os.path.join(self.tmp, "proxy.pem")
        ca_file = os.path.join(self.tmp, "ca.pem")
        cert.private_key_and_cert_chain_pem.write_to_path(cert_file)
        ca.cert_pem.write_to_path(ca_file)
        port = free_port()
        config = os.path.join(self.tmp, "tls.conf")
        with open(config, "w") as f:
            f.write(f"listen = elvin:/secure/127.0.0.1:{port}\ntls-certificate = {cert_file}\n"
                    f"upstream = {router_uri}\nupstream-tls-ca = {router_ca}\n"
                    f"database = {os.path.join(self.tmp, 'tls.db')}\n")
        proc = subprocess.Popen(
            [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
             "-n", "--pidfile=", "elvin-proxy", "-c", config],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: stop_router(proc))
        wait_listening(proc, port, "twistd elvin-proxy (TLS)")
        uri = f"elvin:/secure/127.0.0.1:{port}"

        async def run():
            deadline = time.monotonic() + 20
            while True:
                try:
                    conn = await self.connect(uri, session="tls", tls_ca=ca_file)
                    break
                except client.ConnectFailed:
                    if time.monotonic() > deadline:
                        raise
                    await sleep(0.2)
            got = []
            conn.on_notification = got.append
            await conn.subscribe("require(secret)", lambda n: None)
            pub = await self.connect(router_uri, tls_ca=router_ca)
            while not got and time.monotonic() < deadline + 20:
                pub.notify({"secret": 1})
                await sleep(0.1)
            self.assertEqual(got[0], {"secret": 1})
        return defer.ensureDeferred(run())


class ProxyFlavoursTest(unittest.TestCase):
    """The asyncio and blocking clients join sessions too."""

    def setUp(self):
        self.router_uri, self.router = router_for(self)
        self.tmp = tempfile.mkdtemp()
        self.proxy_uri, self.proxy = start_proxy(self.router_uri,
                                                 os.path.join(self.tmp, "p.db"))
        self.addCleanup(lambda: stop_router(self.proxy))
        return defer.ensureDeferred(upstream_ready(self.proxy_uri, self.router_uri))

    def test_blocking_client_session(self):
        from elvin import sync
        with sync.connect(self.proxy_uri, session="desk", admin_password="a") as conn:
            sub = conn.subscribe("require(n)", callback=lambda n: None, ttl=3600,
                                 max_count=5)
            self.assertEqual(conn.session_subscriptions[sub.id].max_count, 5)
            self.assertEqual(conn.session_subscriptions[sub.id].ttl, 3600)
        with sync.connect(self.router_uri) as pub:
            for n in range(8):
                pub.notify({"n": n})
        time.sleep(0.5)              # through the router to the proxy's store
        got = []
        with sync.connect(self.proxy_uri, session="desk", admin_password="a",
                          on_notification=got.append) as conn:
            self.assertEqual([s.expression for s in conn.session_subscriptions.values()],
                             ["require(n)"])
            conn.test_connection()
        self.assertEqual([n["n"] for n in got], [3, 4, 5, 6, 7])    # the newest five
        with sync.connect(self.proxy_uri, session="desk", admin_password="a") as conn:
            conn.delete_session("desk")
            self.assertEqual(conn.sessions, {})

    def test_blocking_client_acknowledges_what_the_program_took(self):
        from elvin import sync
        with sync.connect(self.proxy_uri, session="inbox") as conn:
            sub = conn.subscribe("require(n)", timeout=10)
            with sync.connect(self.router_uri) as pub:
                for n in range(20):
                    pub.notify({"n": n})
            taken = [sub.get(10)["n"] for _ in range(5)]
        self.assertEqual(taken, [0, 1, 2, 3, 4])
        got = []
        with sync.connect(self.proxy_uri, session="inbox", on_notification=got.append) as conn:
            deadline = time.monotonic() + 10
            while len(got) < 15 and time.monotonic() < deadline:
                time.sleep(0.05)
        # What was taken is gone; what arrived and was not taken comes again.
        self.assertEqual([n["n"] for n in got], list(range(5, 20)))

    def test_asyncio_client_session(self):
        import asyncio
        from elvin import aio

        async def run():
            async with aio.connect(self.proxy_uri, session=["one", ("two", "pw")]) as conn:
                self.assertEqual(sorted(conn.sessions), ["one", "two"])
                sub = await conn.subscribe("require(x)", ttl=10)
                self.assertEqual(conn.session_subscriptions[sub.id].ttl, 10)
                other = await conn.subscribe("require(y)")
                await conn.set_limits(other.id, max_count=4)
                self.assertEqual(conn.session_subscriptions[other.id].max_count, 4)
            with self.assertRaises(aio.NackError) as caught:
                await aio.connect(self.proxy_uri, session="two", password="wrong")
            self.assertEqual(caught.exception.code, 2)
            with self.assertRaises(aio.ConnectFailed):
                await aio.connect(self.router_uri, session="one", timeout=5)
        asyncio.run(run())
