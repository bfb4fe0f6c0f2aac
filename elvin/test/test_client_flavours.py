"""One behavioural suite for the three client flavours: the
Twisted client (``elvin.client``), asyncio (``elvin.aio``) and blocking
(``elvin.sync``), each against a real router on loopback.

The router runs in its own process (``twistd -n elvin`` on a free port), so
the blocking client can block and the asyncio scenarios run under a plain
``asyncio.run`` loop, not Twisted's. Each scenario is written once, against
a small async *driver* per flavour.
"""

import asyncio
import os
import shutil
import socket
import subprocess
import sys

from twisted.internet import defer
from twisted.trial import unittest

from elvin import aio, client, sync
from elvin.client.state import (ConnectFailed, ConnectionClosed, NackError,
                                PublishBufferFull, Reconnect)
from elvin.core.keys import producer_keys
from elvin.test.places import REPO, free_port, start_twistd

TIMEOUT = 10.0


_ROUTER = []


def shared_router():
    """The URI of this module's router process, started on first use and
    stopped when the test run's interpreter exits (trial has no
    setUpClass)."""
    if not _ROUTER:
        import atexit
        uri, proc = start_router()
        atexit.register(stop_router, proc)
        _ROUTER.append(uri)
    return _ROUTER[0]


_TLS_ROUTER = []


def shared_tls_router():
    """(URI, CA file) of this module's TLS router process (trustme's CA
    and certificate for 127.0.0.1), started on first use."""
    if not _TLS_ROUTER:
        import atexit
        import tempfile
        import trustme
        folder = tempfile.mkdtemp(prefix="elvin-tls-")
        atexit.register(shutil.rmtree, folder, True)    # after the router stops
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        ca_file = os.path.join(folder, "ca.pem")
        cert_file = os.path.join(folder, "router.pem")
        ca.cert_pem.write_to_path(ca_file)
        cert.private_key_and_cert_chain_pem.write_to_path(cert_file)
        port = free_port()
        config = os.path.join(folder, "elvind.conf")
        with open(config, "w") as f:
            f.write(f"listen = elvin:/secure/127.0.0.1:{port}\n"
                    f"tls-certificate = {cert_file}\n")
        uri, proc = start_router(port, ["-c", config], probe_port=port)
        atexit.register(stop_router, proc)
        _TLS_ROUTER.append((f"elvin:/secure/127.0.0.1:{port}", ca_file))
    return _TLS_ROUTER[0]


def start_router(port=None, args=None, probe_port=None):
    """A router process on ``port`` (default a free one) of 127.0.0.1 (or
    as ``args`` say); its URI and process."""
    port, proc = start_twistd(
        "elvin", lambda p: args or ["-l", f"elvin://127.0.0.1:{p}"], port)
    return f"elvin://127.0.0.1:{port}", proc


def stop_router(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


# -- drivers: the same operations for each flavour, as coroutines ----------

#: How long ``nothing`` waits. A scenario asks it only after a barrier: a
#: later notification of the same producer received, or a round trip on the
#: connection (the router delivers in order), so that anything wrongly
#: delivered is already queued; the wait covers only the handing over to
#: the subscription (the blocking client's reader thread).
NOTHING_WAIT = 0.05



class AioDriver:
    name = "asyncio"

    async def connect(self, uri, **kw):
        return await aio.connect(uri, **kw)

    async def notify(self, conn, attributes, **kw):
        conn.notify(attributes, **kw)

    async def subscribe(self, conn, expression, **kw):
        return await conn.subscribe(expression, **kw)

    async def next(self, sub, timeout=TIMEOUT):
        return await asyncio.wait_for(sub.__anext__(), timeout)

    async def nothing(self, sub, timeout=NOTHING_WAIT):
        try:
            await asyncio.wait_for(sub.__anext__(), timeout)
        except (asyncio.TimeoutError, StopAsyncIteration):
            return True
        return False

    async def modify(self, sub, expression=None, **kw):
        await sub.modify(expression, **kw)

    async def remove(self, sub):
        await sub.remove()

    async def quench(self, conn, names, events):
        return await conn.quench(names, on_add=lambda t, tree, s: events.append(("add", t)),
                                 on_delete=lambda t: events.append(("delete", t)))

    async def set_keys(self, conn, **kw):
        await conn.set_keys(**kw)

    async def auto_quench(self, conn, names):
        return await aio.AutoQuench(conn, names).ready()

    async def ping(self, conn):
        return await conn.test_connection(TIMEOUT)

    async def close(self, conn):
        await conn.close()

    def lost(self, conn):
        conn.protocol.transport.abort()

    awaits_coroutines = True

    async def ended(self, conn, sub, timeout=TIMEOUT):
        """How iterating ``sub`` ends: None (normally) or the error."""
        async def drain():
            async for _ in sub:
                pass
        try:
            await asyncio.wait_for(drain(), timeout)
        except ConnectionClosed as e:
            return e
        return None

    async def cancelled_subscribe(self, conn, expression):
        task = asyncio.ensure_future(conn.subscribe(expression))
        await asyncio.sleep(0)            # sent; no reply yet
        task.cancel()
        with self_raises(asyncio.CancelledError):
            await task


AioDriver.stall = AioDriver.unstall = lambda self, conn: None


class self_raises:
    """``with self_raises(E):`` outside a TestCase."""

    def __init__(self, kind):
        self.kind = kind

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        assert kind is not None and issubclass(kind, self.kind), f"no {self.kind}"
        return True


class SyncDriver:
    """The blocking calls, made from the scenario's own (asyncio) thread:
    the sync client's loop is its own thread, so blocking here is fine."""

    name = "blocking"

    async def connect(self, uri, **kw):
        return sync.connect(uri, **kw)

    async def notify(self, conn, attributes, **kw):
        conn.notify(attributes, **kw)

    async def subscribe(self, conn, expression, **kw):
        return conn.subscribe(expression, **kw)

    async def next(self, sub, timeout=TIMEOUT):
        note = sub.get(timeout)
        if note is None:
            raise asyncio.TimeoutError
        return note

    async def nothing(self, sub, timeout=NOTHING_WAIT):
        return sub.get(timeout) is None

    async def modify(self, sub, expression=None, **kw):
        sub.modify(expression, **kw)

    async def remove(self, sub):
        sub.remove()

    async def quench(self, conn, names, events):
        return conn.quench(names, on_add=lambda t, tree, s: events.append(("add", t)),
                           on_delete=lambda t: events.append(("delete", t)))

    async def set_keys(self, conn, **kw):
        conn.set_keys(**kw)

    async def auto_quench(self, conn, names):
        return conn.auto_quench(names)

    async def ping(self, conn):
        return conn.test_connection(TIMEOUT)

    async def close(self, conn):
        conn.close()

    def lost(self, conn):
        loop = conn._inner.loop
        loop.call_soon_threadsafe(conn._inner.protocol.transport.abort)

    awaits_coroutines = False

    async def ended(self, conn, sub, timeout=TIMEOUT):
        sub.timeout = timeout
        try:
            for _ in sub:
                pass
        except ConnectionClosed as e:
            return e
        return None

    cancelled_subscribe = None            # a blocking call: nothing to cancel

    def stall(self, conn):
        """Nothing to do: an iterator nobody reads fills the receive bound."""

    unstall = stall


class TwistedDriver(AioDriver):
    """Deferreds awaited from coroutines run by ``defer.ensureDeferred``
    (what the asyncio driver does with awaitables works for them too)."""

    name = "twisted"

    async def connect(self, uri, **kw):
        return await client.connect(uri, **kw)

    async def subscribe(self, conn, expression, **kw):
        inbox = defer.DeferredQueue()
        sub = await conn.subscribe(expression, inbox.put, **kw)
        sub.inbox = inbox
        return sub

    async def next(self, sub, timeout=TIMEOUT):
        from twisted.internet import reactor
        d = sub.inbox.get()
        d.addTimeout(timeout, reactor)
        try:
            return await d
        except defer.TimeoutError:
            raise asyncio.TimeoutError from None

    async def nothing(self, sub, timeout=NOTHING_WAIT):
        try:
            await self.next(sub, timeout)
        except asyncio.TimeoutError:
            return True
        return False

    async def ping(self, conn):
        return await conn.test_connection()

    async def auto_quench(self, conn, names):
        auto = client.AutoQuench(conn, names)
        await auto.ready
        return auto

    def lost(self, conn):
        conn.protocol.transport.abortConnection()

    awaits_coroutines = False

    async def ended(self, conn, sub, timeout=TIMEOUT):
        """Callbacks, no iterators: the session's end and its reason."""
        from twisted.internet import reactor
        d = defer.Deferred()
        conn.disconnected.addBoth(lambda _: d.called or d.callback(None))
        d.addTimeout(timeout, reactor)
        await d
        return conn.close_reason

    async def cancelled_subscribe(self, conn, expression):
        d = conn.subscribe(expression, lambda note: None)
        d.cancel()
        with self_raises(defer.CancelledError):
            await d

    def stall(self, conn):
        conn.protocol.transport.pauseProducing()

    def unstall(self, conn):
        conn.protocol.transport.resumeProducing()


async def _sleep_via(driver, seconds):
    if isinstance(driver, TwistedDriver):
        from twisted.internet import reactor, task
        await task.deferLater(reactor, seconds, lambda: None)
    else:
        await asyncio.sleep(seconds)


async def _stop_router_via(driver, proc):
    """``stop_router`` without blocking the client's loop: the router
    lingers on a connection until its client closes (up to 5 s), which a
    client blocked by the test's own wait could not do."""
    proc.terminate()
    for _ in range(200):                 # 10 s at most, as stop_router
        if proc.poll() is not None:
            return
        await _sleep_via(driver, 0.05)
    stop_router(proc)


# -- the scenarios -------------------------------------------------------------


class Scenarios:
    """Every flavour must pass these (``self.run_scenario`` runs one)."""

    driver = None

    def setUp(self):
        self.uri = shared_router()

    async def scenario_notify_and_subscribe(self, d):
        consumer = await d.connect(self.uri)
        producer = await d.connect(self.uri)
        sub = await d.subscribe(consumer, 'Group == "chat" && size(Message) < 140')
        await d.notify(producer, {"Group": "chat", "Message": "hello", "Num": 42})
        await d.notify(producer, {"Group": "other", "Message": "no"})
        note = await d.next(sub)
        self.assertEqual(dict(note), {"Group": "chat", "Message": "hello", "Num": 42})
        await d.notify(producer, {"Group": "chat", "Message": "last"})   # (the barrier)
        self.assertEqual((await d.next(sub))["Message"], "last")
        self.assertTrue(await d.nothing(sub))
        await d.close(producer)
        await d.close(consumer)

    async def scenario_modify_and_remove(self, d):
        conn = await d.connect(self.uri)
        sub = await d.subscribe(conn, "n == 1")
        await d.modify(sub, "n == 2")
        await d.notify(conn, {"n": 1})
        await d.notify(conn, {"n": 2})
        self.assertEqual((await d.next(sub))["n"], 2)
        await d.remove(sub)
        await d.notify(conn, {"n": 2})
        self.assertTrue(await d.ping(conn))
        self.assertTrue(await d.nothing(sub))
        await d.close(conn)

    async def scenario_nacks(self, d):
        conn = await d.connect(self.uri)
        with self.assertRaises(NackError) as caught:
            await d.subscribe(conn, "x==1")
        self.assertEqual(caught.exception.code, 2101)
        with self.assertRaises(NackError):
            await d.subscribe(conn, "x == 1 &&")
        # the session survives a refused request
        sub = await d.subscribe(conn, "x == 1")
        await d.notify(conn, {"x": 1})
        self.assertEqual((await d.next(sub))["x"], 1)
        await d.close(conn)

    async def scenario_keys(self, d):
        secret = b"flavour secret"
        consumer = await d.connect(self.uri)
        producer = await d.connect(self.uri)
        nfn_keys, sub_keys = producer_keys(secret)
        await d.set_keys(consumer, add_sub_keys=sub_keys)
        sub = await d.subscribe(consumer, "require(k)", accept_insecure=False)
        await d.notify(producer, {"k": "plain"}, deliver_insecure=False)
        await d.set_keys(producer, add_nfn_keys=nfn_keys)
        await d.notify(producer, {"k": "keyed"}, deliver_insecure=False)
        self.assertEqual((await d.next(sub))["k"], "keyed")
        await d.notify(producer, {"k": "last"}, deliver_insecure=False)   # (the barrier)
        self.assertEqual((await d.next(sub))["k"], "last")
        self.assertTrue(await d.nothing(sub))
        await d.close(producer)
        await d.close(consumer)

    async def scenario_quench(self, d):
        producer = await d.connect(self.uri)
        consumer = await d.connect(self.uri)
        events = []
        await d.quench(producer, ["Quenched"], events)
        sub = await d.subscribe(consumer, "Quenched > 3")
        for _ in range(100):
            if events:
                break
            await d.ping(producer)
            await _sleep_via(d, 0.02)
        self.assertEqual([kind for kind, _ in events], ["add"])
        await d.remove(sub)
        for _ in range(100):
            if len(events) == 2:
                break
            await d.ping(producer)
            await _sleep_via(d, 0.02)
        self.assertEqual([kind for kind, _ in events], ["add", "delete"])
        await d.close(consumer)
        await d.close(producer)

    async def scenario_auto_quench(self, d):
        """Auto-quench sends only what a subscription could want, and
        follows subscriptions as they come and go."""
        producer = await d.connect(self.uri)
        consumer = await d.connect(self.uri)
        auto = await d.auto_quench(producer, {"file", "size"})
        self.assertFalse(auto.notify({"file": "a.txt", "size": 1}))   # nobody wants it
        sub = await d.subscribe(consumer, 'file == "b.txt"')
        for _ in range(200):
            if auto.notify({"file": "b.txt", "size": 2}):
                break
            await d.ping(producer)
            await _sleep_via(d, 0.02)
        else:
            self.fail("auto-quench never learned of the subscription")
        self.assertFalse(auto.notify({"file": "a.txt", "size": 3}))   # it cannot match
        self.assertEqual((await d.next(sub))["file"], "b.txt")
        await d.close(consumer)
        await d.close(producer)

    async def scenario_close_then_use(self, d):
        conn = await d.connect(self.uri)
        await d.close(conn)
        with self.assertRaises(ConnectionClosed):
            await d.notify(conn, {"a": 1})
        with self.assertRaises(ConnectionClosed):
            await d.subscribe(conn, "a == 1")

    async def scenario_lost_connection(self, d):
        conn = await d.connect(self.uri)
        d.lost(conn)
        for _ in range(100):
            try:
                await d.ping(conn)
            except ConnectionClosed:
                return
            await _sleep_via(d, 0.02)
        self.fail("a lost connection went unnoticed")

    async def scenario_connect_refused(self, d):
        with self.assertRaises(ConnectFailed) as caught:
            await d.connect(f"elvin://127.0.0.1:{free_port()}", timeout=5)
        self.assertIn("refused", str(caught.exception))

    async def scenario_reconnect(self, d):
        """The router goes away and comes back on the same port: the
        connection says so, keeps what is notified meanwhile, and
        afterwards its subscription (registered again) receives as before,
        the kept notification first."""
        port = free_port()
        uri, router = start_router(port)
        events = []
        try:
            conn = await d.connect(uri, reconnect=True, pending_size=300)
            conn.on_connection_lost = lambda error: events.append("lost")
            conn.on_reconnected = lambda c: events.append("reconnected")
            sub = await d.subscribe(conn, "require(after)")
            # Keys taken off a subscription stay off when it is registered again.
            nfn_keys, sub_keys = producer_keys(b"taken off")
            keyed = await d.subscribe(conn, "require(secret)", accept_insecure=False,
                                      keys=sub_keys)
            await d.modify(keyed, del_keys=sub_keys)
            await _stop_router_via(d, router)
            for _ in range(200):
                if events:
                    break
                await _sleep_via(d, 0.05)
            self.assertEqual(events, ["lost"])
            await d.notify(conn, {"after": 0})           # kept until the session is back
            with self.assertRaises(PublishBufferFull):    # beyond pending_size
                await d.notify(conn, {"after": -1, "pad": "x" * 400})
            uri, router = start_router(port)
            # Real sockets are the point here: the wait (at least 4 s, longer
            # on a loaded machine) is a generous bound, not a speed check;
            # test_client_lifecycle checks the back-off's cap without sockets.
            for _ in range(200):
                if "reconnected" in events:
                    break
                await _sleep_via(d, 0.02)
            self.assertEqual(events, ["lost", "reconnected"])
            producer = await d.connect(uri, nfn_keys=nfn_keys)
            await d.notify(producer, {"secret": 1}, deliver_insecure=False)
            await d.notify(producer, {"after": 1})
            self.assertEqual((await d.next(sub))["after"], 0)
            self.assertEqual((await d.next(sub))["after"], 1)
            self.assertTrue(await d.nothing(keyed))
            await d.close(producer)
            await d.close(conn)
        finally:
            stop_router(router)

    async def scenario_tls(self, d):
        """Over TLS, verifying the router against a CA the test made."""
        uri, ca_file = shared_tls_router()
        conn = await d.connect(uri, tls_ca=ca_file)
        sub = await d.subscribe(conn, "require(secret)")
        await d.notify(conn, {"secret": "over tls"})
        self.assertEqual((await d.next(sub))["secret"], "over tls")
        await d.close(conn)
        with self.assertRaises(ConnectFailed):       # the platform's CAs do not know it
            await d.connect(uri, timeout=5)

    async def scenario_close_ends_iteration_normally(self, d):
        conn = await d.connect(self.uri)
        sub = await d.subscribe(conn, "require(never)")
        await d.close(conn)
        self.assertIsNone(await d.ended(conn, sub))
        self.assertIsNone(conn.close_reason)

    async def scenario_router_shutdown_says_so(self, d):
        uri, router = start_router()
        try:
            conn = await d.connect(uri)
            reasons = []
            conn.on_disconnect = lambda reason, text: reasons.append(reason)
            sub = await d.subscribe(conn, "require(never)")
            await _stop_router_via(d, router)
            error = await d.ended(conn, sub)
        finally:
            stop_router(router)
        self.assertIsInstance(error, ConnectionClosed)
        self.assertEqual(error.reason, 1)
        self.assertIn("shutting down", str(error))
        self.assertNotIn("lost", str(error))
        self.assertEqual(reasons, [1])

    async def scenario_coroutine_callback(self, d):
        conn = await d.connect(self.uri)
        got = []

        async def handle(note):
            await asyncio.sleep(0)
            got.append(note["co"])
        if not d.awaits_coroutines:
            with self.assertRaises(TypeError):
                await d.subscribe(conn, "require(co)", callback=handle)
        else:
            await d.subscribe(conn, "require(co)", callback=handle)
            await d.notify(conn, {"co": 1})
            for _ in range(200):
                if got:
                    break
                await _sleep_via(d, 0.01)
            self.assertEqual(got, [1])
        await d.close(conn)

    async def scenario_cancelled_subscribe_is_removed(self, d):
        if d.cancelled_subscribe is None:
            raise unittest.SkipTest("a blocking subscribe cannot be cancelled")
        conn = await d.connect(self.uri)
        producer = await d.connect(self.uri)
        seen = []
        conn.on_notification = seen.append
        await d.cancelled_subscribe(conn, "require(cancelled)")
        await d.ping(conn)                # the SubRply came; the SubDelRqst went
        await d.ping(conn)
        await d.notify(producer, {"cancelled": 1})
        await d.ping(producer)
        await d.ping(conn)
        self.assertEqual(seen, [])
        await d.close(producer)
        await d.close(conn)

    async def scenario_slow_consumer_gets_dropwarn(self, d):
        warned = []
        slow = await d.connect(self.uri, options={"Send-Queue.Max-Length": 8192},
                               **({} if isinstance(d, TwistedDriver) else
                                  {"receive_queue": 20}),
                               on_dropwarn=lambda: warned.append(1))
        producer = await d.connect(self.uri)
        sub = await d.subscribe(slow, "require(slow)")
        d.stall(slow)
        total = 4000
        for n in range(total):
            await d.notify(producer, {"slow": n, "pad": "x" * 1000})
        await d.ping(producer)
        d.unstall(slow)
        got = []
        while not got or got[-1] != total - 1:
            got.append((await d.next(sub))["slow"])
        self.assertLess(len(got), total)
        self.assertGreater(slow.dropwarns, 0)
        self.assertTrue(warned)
        await d.close(producer)
        await d.close(slow)

    async def scenario_fails_over_to_the_next_uri(self, d):
        dead = f"elvin://127.0.0.1:{free_port()}"
        conn = await d.connect([dead, self.uri], retry_connect=True, timeout=5)
        self.assertEqual(str(conn.uri), str(client.ElvinURI(self.uri)))
        self.assertTrue(await d.ping(conn))
        await d.close(conn)

    async def scenario_first_connect_retried(self, d):
        import threading
        port = free_port()
        routers = []
        starter = threading.Timer(0.3, lambda: routers.append(start_router(port)[1]))
        starter.start()
        try:
            conn = await d.connect(f"elvin://127.0.0.1:{port}", retry_connect=True,
                                   reconnect=Reconnect(attempts=60))
            self.assertTrue(await d.ping(conn))
            await d.close(conn)
        finally:
            starter.join()
            for router in routers:
                stop_router(router)

    async def scenario_redirect_during_a_drain(self, d):
        """A drained router's clients, and one connecting during the drain,
        end up working at the new router without an error."""
        import signal
        import tempfile
        new_uri = self.uri           # where the drained router sends its clients
        folder = tempfile.mkdtemp()
        port = free_port()
        config = os.path.join(folder, "elvind.conf")
        with open(config, "w") as f:
            f.write(f"listen = elvin://127.0.0.1:{port}\nredirect-to = {new_uri}\n")
        old_uri, old = start_router(port, ["-c", config])
        try:
            conn = await d.connect(old_uri)
            moved = []
            conn.on_redirect = moved.append
            sub = await d.subscribe(conn, "require(drained)")
            old.send_signal(signal.SIGUSR1)
            for _ in range(500):
                if moved and conn.reconnects:
                    break
                await d.notify(conn, {"during": 1})        # never an error
                await _sleep_via(d, 0.01)
            self.assertEqual(len(moved), 1)
            late = await d.connect(old_uri)               # connecting during the drain
            late_sub = await d.subscribe(late, "require(drained)")
            self.assertFalse(late.is_closed)
            self.assertTrue(await d.ping(late))
            await d.notify(late, {"drained": 1})
            self.assertEqual((await d.next(sub))["drained"], 1)
            self.assertEqual((await d.next(late_sub))["drained"], 1)
            self.assertEqual(str(late.uri), str(client.ElvinURI(new_uri)))
            await d.close(late)
            await d.close(conn)
        finally:
            stop_router(old)
            shutil.rmtree(folder, True)

    async def scenario_options(self, d):
        conn = await d.connect(self.uri, options={"Subscription.Max-Count": 16})
        self.assertEqual(conn.options["Subscription.Max-Count"], 16)
        await d.close(conn)


def _add_tests(cls):
    for name in dir(Scenarios):
        if name.startswith("scenario_"):
            def test(self, _name=name):
                return self.run_scenario(getattr(self, _name))
            setattr(cls, "test_" + name[len("scenario_"):], test)
    return cls


@_add_tests
class AsyncioFlavourTests(Scenarios, unittest.SynchronousTestCase):
    """Under a plain asyncio event loop (``asyncio.run``), no reactor."""

    def run_scenario(self, scenario):
        asyncio.run(asyncio.wait_for(scenario(AioDriver()), 60))


@_add_tests
class BlockingFlavourTests(Scenarios, unittest.SynchronousTestCase):

    def run_scenario(self, scenario):
        asyncio.run(asyncio.wait_for(scenario(SyncDriver()), 60))


@_add_tests
class TwistedFlavourTests(Scenarios, unittest.TestCase):

    timeout = 60

    def run_scenario(self, scenario):
        return defer.ensureDeferred(scenario(TwistedDriver()))


class BlockingHelperTests(unittest.SynchronousTestCase):
    """``elvin.sync``'s one-call helpers and threads."""

    def setUp(self):
        self.uri = shared_router()

    def test_one_call_notify_and_subscribe(self):
        import threading
        got = []
        ready = threading.Event()

        def listen():
            with sync.connect(self.uri) as conn:
                with conn.subscribe('Topic == "one-call"', timeout=TIMEOUT) as sub:
                    ready.set()
                    for note in sub:
                        got.append(note["n"])
                        if len(got) == 2:
                            break
        listener = threading.Thread(target=listen)
        listener.start()
        self.assertTrue(ready.wait(TIMEOUT))
        sync.notify(self.uri, {"Topic": "one-call", "n": 1})
        sync.notify(self.uri, {"Topic": "one-call", "n": 2})
        listener.join(TIMEOUT)
        self.assertEqual(got, [1, 2])

    def test_subscribe_helper_counts_and_times_out(self):
        self.assertEqual(sync.subscribe(self.uri, "require(never_sent)", count=3,
                                        timeout=0.3), [])

    def test_many_threads_share_one_connection(self):
        import threading
        with sync.connect(self.uri) as conn:
            sub = conn.subscribe("require(thread)", timeout=TIMEOUT)
            threads = [threading.Thread(target=lambda i=i: [
                conn.notify({"thread": i, "k": k}) for k in range(50)]) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seen = []
            for note in sub:
                seen.append((note["thread"], note["k"]))
                if len(seen) == 200:
                    break
            self.assertEqual(sorted(seen), sorted((i, k) for i in range(4) for k in range(50)))
            for i in range(4):   # each thread's notifications stay in its order
                self.assertEqual([k for t, k in seen if t == i], list(range(50)))

    def test_a_script_that_exits_without_close_delivers_everything(self):
        """The blocking flavour closes its connections at interpreter exit:
        all 5,000 notifications of a script that never calls close()."""
        total = 5000
        with sync.connect(self.uri) as conn:
            sub = conn.subscribe("require(exiting)", timeout=TIMEOUT)
            code = ("import elvin.sync\n"
                    f"conn = elvin.sync.connect({self.uri!r})\n"
                    f"for n in range({total}):\n"
                    "    conn.notify({'exiting': n})\n")
            done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                                  text=True, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            seen = 0
            for note in sub:
                seen += 1
                if seen == total:
                    break
            self.assertEqual(seen, total)

    def test_quench_methods_block(self):
        with sync.connect(self.uri) as conn:
            quench = conn.quench(["blocking_quench"])
            self.assertIs(quench.modify(add_names=["other_name"]), quench)
            self.assertEqual(quench.names, {"blocking_quench", "other_name"})
            self.assertIsNone(quench.remove())

    def test_no_event_loop_leaks_into_the_caller(self):
        with sync.connect(self.uri) as conn:
            conn.notify({"x": 1})
        with self.assertRaises(RuntimeError):
            asyncio.get_running_loop()
        self.assertNotIn("twisted.internet.reactor", _fresh_imports(self.uri))


def _fresh_imports(uri):
    """The modules a fresh interpreter has after one elvin.sync.notify."""
    code = ("import sys, elvin.sync; elvin.sync.notify(%r, {'x': 1}); "
            "print('\\n'.join(sys.modules))" % uri)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env=dict(os.environ))
    return out.stdout.split()


class ClientDocsTests(unittest.SynchronousTestCase):
    """docs/client.md's Python examples run against a router (those that
    need a package the suite does not install are named, with why)."""

    EXCUSED = {
        "from fastapi import FastAPI": "FastAPI is not a dependency; the calls it makes "
                                       "are the asyncio flavour's, tested above",
        "from twisted.application import service": "a .tac for twistd -ny; its calls are "
                                                   "the Twisted flavour's, tested above",
        "from elvin.client.state import Reconnect": "a fragment; scenario_reconnect does "
                                                    "this against a router it restarts",
    }

    def test_examples_run(self):
        import re
        with open(os.path.join(REPO, "docs", "client.md"), encoding="utf-8") as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        ran = 0
        for block in blocks:
            if any(marker in block for marker in self.EXCUSED):
                continue
            code = block.replace("elvin://localhost:2917", shared_router())
            done = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                                  capture_output=True, text=True, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("hello", done.stdout)
            ran += 1
        self.assertEqual(ran, 2)


class DocumentedStateModuleTests(unittest.SynchronousTestCase):
    """``elvin.client.state`` is the documented name of the client's state
    classes (docs/client.md): every public name of ``elvin.clientcore.state``
    is there, the same object."""

    def test_every_public_name_is_there(self):
        import elvin.client.state as documented
        import elvin.clientcore.state as core
        namespace = {}
        exec("from elvin.client.state import *", namespace)
        for name in core.__all__ + ["ASK_LIMITS", "CloseUnconfirmed", "RequestTimeout"]:
            self.assertIs(getattr(documented, name, None), getattr(core, name), name)
        for name in core.__all__:
            self.assertIs(namespace[name], getattr(core, name), name)


class AsyncioDiscoveryTests(unittest.SynchronousTestCase):
    """``elvin.aio.connect(scope=...)`` and ``elvin.sync.connect(scope=...)``
    find a router process by ERDP on loopback multicast (TTL 0)."""

    def setUp(self):
        from elvin.discovery import packets as discovery_packets
        from elvin.discovery.aio import AsyncioMulticastChannel
        self.group_port = free_port(socket.SOCK_DGRAM)

        async def probe():
            heard = asyncio.get_running_loop().create_future()
            channel = AsyncioMulticastChannel(
                asyncio.get_running_loop(),
                lambda packet, address, own: heard.done() or heard.set_result(packet),
                port=free_port(socket.SOCK_DGRAM), interface="127.0.0.1", ttl_limit=0)
            try:
                await channel.start_async()
            except OSError as e:
                return f"multicast on the loopback interface is unavailable here: {e}"
            try:
                channel.send(discovery_packets.SvrRqst(), 0)
                await asyncio.wait_for(heard, 3)
            except asyncio.TimeoutError:
                return "multicast sent on 127.0.0.1 does not loop back here"
            finally:
                await channel.stop_async()
            return None
        reason = asyncio.run(probe())
        if reason:
            raise unittest.SkipTest(reason)
        import tempfile
        import uuid
        self.scope = f"aio-{uuid.uuid4().hex[:10]}"
        folder = tempfile.mkdtemp(prefix="elvin-disc-")
        self.addCleanup(shutil.rmtree, folder, True)
        port = free_port()
        config = os.path.join(folder, "elvind.conf")
        with open(config, "w") as f:
            f.write("discovery = yes\n"
                    f"discovery-scope = {self.scope}\n"
                    "discovery-default = no\n"
                    "discovery-interface = 127.0.0.1\n"
                    "discovery-ttl = 0\n"
                    f"discovery-dns-sd = {self.dns_sd}\n"
                    f"discovery-group = 224.4.0.1:{self.group_port}\n")
        self.router_args = (port, ["-c", config, "-l", f"elvin://127.0.0.1:{port}"])

    def start(self):
        """The router. The asyncio test starts it first, so the client
        solicits and the router answers (held back by the draft's two
        seconds between one router's adverts); the blocking test, on the
        same discoverer, starts it once the discoverer listens, and its
        start-up advertisement fills the cache without that wait."""
        self.uri, proc = start_router(*self.router_args)
        self.addCleanup(stop_router, proc)

    dns_sd = "no"

    def discoverer(self):
        from elvin.discovery.aio import AsyncioDiscoverer
        return AsyncioDiscoverer(interface="127.0.0.1", port=self.group_port, ttl_limit=0,
                                 dns_sd=False)

    def test_asyncio_connect_by_scope(self):
        from elvin.discovery.aio import NoRouterFound

        async def scenario():
            self.start()
            async with self.discoverer() as finder:
                conn = await aio.connect(scope=self.scope, discoverer=finder,
                                         discovery_timeout=10)
                self.assertEqual(str(conn.uri), str(client.ElvinURI(self.uri)))
                self.assertEqual(conn.router.scope, self.scope)
                self.assertEqual(conn.router.source,
                                 "dns-sd" if self.dns_sd == "yes" else "erdp")
                await conn.close()
                with self.assertRaises(NoRouterFound):
                    await aio.connect(scope="no-such-scope", discoverer=finder,
                                      discovery_timeout=0.2)
        asyncio.run(asyncio.wait_for(scenario(), 60))

    def test_blocking_connect_by_scope(self):
        from elvin import sync as blocking

        async def make():
            return await self.discoverer().start()
        finder = blocking._run(make())
        try:
            self.start()
            with blocking.connect(scope=self.scope, discoverer=finder,
                                  discovery_timeout=10) as conn:
                self.assertEqual(str(conn.uri), str(client.ElvinURI(self.uri)))
        finally:
            blocking._run(finder.stop())


class AsyncioDnsSdTests(AsyncioDiscoveryTests):
    """The same, found by DNS-SD alone (ERDP off in the client; the router
    registers ``_elvin._tcp.local.`` on 127.0.0.1)."""

    dns_sd = "yes"

    def setUp(self):
        from elvin.discovery import dnssd
        try:
            dnssd.make_zeroconf(["127.0.0.1"]).close()
        except Exception as e:
            raise unittest.SkipTest(f"zeroconf cannot bind to 127.0.0.1 here: {e}")
        super().setUp()

    def discoverer(self):
        from elvin.discovery.aio import AsyncioDiscoverer
        return AsyncioDiscoverer(interface="127.0.0.1", port=self.group_port, ttl_limit=0,
                                 erdp=False, dns_sd=True)
