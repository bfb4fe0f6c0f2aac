"""Every client flavour under faults, in memory (a FakeRouter, Twisted's
Clock, a private asyncio loop turned by hand): nothing the program handed
over is lost without it being told (an error, a hook, a log line)."""

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock
from twisted.trial import unittest

from elvin import client as tx
from elvin.protocols import packets
from elvin.test.test_client_edges import URI, FakeRouter


class TwistedLiveness(unittest.TestCase):

    def test_test_connection_has_a_timeout(self):
        # As the asyncio and blocking flavours': a hung router is found out.
        reactor = MemoryReactorClock()
        conn = tx.Connection(URI, reactor)
        FakeRouter(conn).open()
        d = conn.test_connection(timeout=2)
        reactor.advance(1.9)
        self.assertNoResult(d)
        reactor.advance(0.2)
        failure = self.failureResultOf(d, TimeoutError)
        self.assertIn("no answer to TestConn from", str(failure.value))
        router = FakeRouter(conn)
        router.answer(packets.ConfConn())      # late: nothing breaks
        d = conn.test_connection(timeout=2)
        router.answer(packets.ConfConn())
        self.assertIs(self.successResultOf(d), True)
        reactor.advance(5)


class TestConnectionTimeoutWording(unittest.TestCase):
    """A timed-out ``test_connection`` names the router and the wait in the
    asyncio flavour (which the blocking one runs) as in the Twisted one."""

    def test_asyncio(self):
        import asyncio
        from elvin import aio
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        conn = aio.Connection(URI, loop, timeout=30)
        FakeRouter(conn).open()
        with self.assertRaises(TimeoutError) as caught:
            loop.run_until_complete(conn.test_connection(0.01))
        self.assertIn("no answer to TestConn from", str(caught.exception))
        self.assertIn("within 0.01 s", str(caught.exception))


class SilentRouter(unittest.TestCase):
    """A router that goes silent without closing the socket (a cut cable,
    a host gone: the kernel keeps the connection) is found out by the
    liveness check, in every flavour: TestConn after ``liveness`` seconds
    without a packet, the channel lost ``timeout`` seconds later."""

    def test_twisted(self):
        reactor = MemoryReactorClock()
        conn = tx.Connection(URI, reactor, timeout=10)
        conn.liveness = 60
        router = FakeRouter(conn)
        router.open()
        lost = []
        conn.on_connection_lost = lost.append
        reactor.advance(60)                        # the handshake was heard
        router.answer(packets.DropWarn())
        reactor.advance(60)
        self.assertEqual([p for p in router.sent if isinstance(p, packets.TestConn)], [])
        reactor.advance(60)                        # 60 s without a packet
        self.assertIsInstance(router.sent[-1], packets.TestConn)
        reactor.advance(9.9)
        self.assertEqual(lost, [])
        with self.assertLogs("elvin.client", "WARNING"):
            reactor.advance(0.2)
        (error,) = lost
        self.assertIn("no answer to TestConn within 10 s after 60 s", str(error))
        self.assertTrue(conn.is_closed)
        self.assertEqual(reactor.getDelayedCalls(), [])

    def test_asyncio_and_blocking(self):
        import asyncio
        from elvin import aio, sync
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        conn = aio.Connection(URI, loop, timeout=0.02)
        conn.liveness = 0.02
        router = FakeRouter(conn)
        router.open()
        ended = loop.create_future()
        conn.on_connection_lost = ended.set_result
        with self.assertLogs("elvin.client", "WARNING"):
            error = loop.run_until_complete(asyncio.wait_for(ended, 5))
        self.assertIn("no answer to TestConn", str(error))
        self.assertTrue(any(isinstance(p, packets.TestConn) for p in router.sent))
        wrapped = sync.Connection.__new__(sync.Connection)
        wrapped._inner = conn
        self.assertEqual(wrapped.liveness, 0.02)
        with self.assertRaises(ValueError):
            wrapped.liveness = -1

    def test_on_by_default_in_every_connect(self):
        import inspect
        from elvin import aio, sync
        for connect in (tx.connect, aio.connect, sync.connect):
            self.assertEqual(inspect.signature(connect).parameters["liveness"].default, 60.0)


def _flavours():
    """(name, connection, router, subscribe(callback) -> subscription,
    on_loop(f, *args)) for each flavour, without reconnection."""
    import asyncio
    from elvin import aio
    from elvin.test.test_client_edges import blocking
    made = []
    reactor = MemoryReactorClock()
    twisted = tx.Connection(URI, reactor)
    router = FakeRouter(twisted)
    router.open()

    def subscribe_twisted(callback):
        d = twisted.subscribe("require(x)", callback)
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 7))
        return d.result
    made.append(("twisted", twisted, router, subscribe_twisted, lambda f, *a: f(*a)))

    loop = asyncio.new_event_loop()
    inner = aio.Connection(URI, loop)
    arouter = FakeRouter(inner)
    arouter.open()

    def subscribe_aio(callback):
        task = loop.create_task(_awaited(inner.subscribe("require(x)", callback)))
        loop.run_until_complete(asyncio.sleep(0))
        arouter.answer(packets.SubRply(arouter.last(packets.SubAddRqst).xid, 7))
        return loop.run_until_complete(task)
    made.append(("aio", inner, arouter, subscribe_aio, lambda f, *a: f(*a)))

    conn, brouter, on_loop = blocking()

    def subscribe_sync(callback):
        import threading
        from elvin import sync
        result = []
        thread = threading.Thread(target=lambda: result.append(
            conn.subscribe("require(x)", callback=callback)))
        thread.start()
        for _ in range(500):              # bounded: 5 s
            if on_loop(lambda: any(isinstance(p, packets.SubAddRqst) for p in brouter.sent)):
                break
            threading.Event().wait(0.01)
        on_loop(brouter.answer, packets.SubRply(brouter.last(packets.SubAddRqst).xid, 7))
        thread.join(10)
        return result[0]
    made.append(("sync", conn, brouter, subscribe_sync, on_loop))
    return made, loop


async def _awaited(awaitable):
    return await awaitable


class LossIsTold(unittest.TestCase):
    """Without reconnection, a callback-only subscriber learns that its
    session died: ``on_connection_lost``, the subscription's ``on_end``,
    and a warning on the ``elvin.client`` logger, in every flavour."""

    def test_every_flavour(self):
        made, loop = _flavours()
        self.addCleanup(loop.close)
        for name, conn, router, subscribe, on_loop in made:
            told = []
            conn.on_connection_lost = lambda error: told.append(("lost", error))
            sub = subscribe(lambda note: None)
            sub.on_end = lambda error: told.append(("end", error))
            with self.assertLogs("elvin.client", "WARNING") as logged:
                on_loop(router.lost, "reset by peer")
            kinds = [kind for kind, _ in told]
            self.assertEqual(sorted(kinds), ["end", "lost"], name)
            for _, error in told:
                self.assertIsInstance(error, tx.ConnectionClosed, name)
                self.assertIn("was lost: reset by peer", str(error), name)
            self.assertTrue(conn.is_closed, name)
            self.assertIn("ended: connection to the router at", logged.output[0], name)
            # Set after the end, the hook is called at once.
            late = []
            sub.on_end = late.append
            self.assertEqual(len(late), 1, name)
            self.assertIsInstance(late[0], tx.ConnectionClosed, name)

    def test_on_end_after_remove_and_close(self):
        reactor = MemoryReactorClock()
        conn = tx.Connection(URI, reactor)
        router = FakeRouter(conn)
        router.open()
        ends = []
        d = conn.subscribe("require(x)", print)
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 7))
        sub = self.successResultOf(d)
        sub.on_end = ends.append
        removing = sub.remove()
        router.answer(packets.SubRply(router.last(packets.SubDelRqst).xid, 7))
        self.successResultOf(removing)
        self.assertEqual(ends, [None])
        d = conn.subscribe("require(y)", print)
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 8))
        other = self.successResultOf(d)
        other.on_end = ends.append
        conn.close()
        router.answer(packets.DisconnRply(router.last(packets.DisconnRqst).xid))
        router.lost("")
        self.assertEqual(ends, [None, None])


class CountingRouter(FakeRouter):
    """A FakeRouter whose channel says how many bytes each packet took."""

    def send(self, packet):
        super().send(packet)
        return len(packets.encode(packet)) + 4


def _three_flavours(test):
    """(name, open() -> (connection, router), close(connection) -> the
    exception close raised or None, run(f, *args)) for each flavour, the
    close timeout made short for the asyncio ones (a real loop)."""
    import asyncio
    from elvin import aio, sync
    from elvin.clientcore import lifecycle
    test.patch(lifecycle, "CLOSE_TIMEOUT", 0.05)
    made = []
    reactor = MemoryReactorClock()

    def open_twisted():
        return _opened(tx.Connection(URI, reactor))

    def close_twisted(conn):
        d = conn.close()
        reactor.advance(lifecycle.CLOSE_TIMEOUT)
        result = []
        d.addBoth(result.append)
        return getattr(result[0], "value", result[0])
    made.append(("twisted", open_twisted, close_twisted, lambda f, *a: f(*a)))

    loop = asyncio.new_event_loop()
    test.addCleanup(loop.close)

    def open_aio():
        return _opened(aio.Connection(URI, loop))

    def close_aio(conn):
        async def closing():
            try:
                await conn.close()
            except tx.ConnectionClosed as e:
                return e
        return loop.run_until_complete(closing())
    made.append(("aio", open_aio, close_aio, lambda f, *a: f(*a)))

    def on_loop(function, *args):
        return sync._run(_call(function, *args))

    def open_sync():
        inner, router = on_loop(lambda: _opened(aio.Connection(URI, sync._private_loop())))
        return sync.Connection(inner), router

    def close_sync(conn):
        try:
            conn.close()
        except tx.ConnectionClosed as e:
            return e
    made.append(("sync", open_sync, close_sync, on_loop))
    return made


async def _call(function, *args):
    return function(*args)


def _opened(conn):
    """``conn`` with its session open over a CountingRouter: (conn, router)."""
    router = CountingRouter(conn)
    router.open()
    return conn, router


class CloseUnconfirmedTests(unittest.TestCase):
    """A close the router does not confirm says what may be lost: close
    raises CloseUnconfirmed (the same in every flavour), ``close_reason``
    is it, and a warning names the packets and bytes."""

    def test_a_hung_router(self):
        for name, open_, close, run in _three_flavours(self):
            conn, router = open_()
            for i in range(3):
                conn.notify({"n": i})
            with self.assertLogs("elvin.client", "WARNING") as logged:
                error = close(conn)
            self.assertIsInstance(error, tx.CloseUnconfirmed, name)
            size = 3 * (len(packets.encode(packets.NotifyEmit({"n": 0}, True,
                                                              packets.Keys.EMPTY))) + 4)
            self.assertEqual((error.unconfirmed, error.unconfirmed_bytes), (3, size), name)
            self.assertIn(f"3 packets ({size} bytes) sent since it last confirmed receipt "
                          "may not have reached it", str(error))
            self.assertIn("no DisconnRply from", str(error))
            self.assertIs(conn.close_reason, error, name)
            self.assertIn("3 packets", logged.output[0], name)
            self.assertTrue(conn.is_closed, name)
            self.assertIsNone(close(conn), name)        # closed already: nothing more
            with self.assertRaises(tx.ConnectionClosed) as later:
                conn.notify({"n": 9})
            self.assertEqual(str(later.exception), "connection is closed", name)

    def test_only_what_follows_the_last_answer_counts(self):
        for name, open_, close, run in _three_flavours(self):
            conn, router = open_()
            conn.notify({"n": 1})
            conn.notify({"n": 2})
            lifecycle = getattr(conn, "_inner", conn).lifecycle
            run(lifecycle._post, packets.TestConn(), -1)    # as test_connection does
            run(router.answer, packets.ConfConn())
            conn.notify({"n": 3})
            error = close(conn)
            self.assertEqual(error.unconfirmed, 1, name)

    def test_confirmed_close(self):
        for name, open_, close, run in _three_flavours(self):
            conn, router = open_()
            conn.notify({"n": 1})
            # The router answers the DisconnRqst: everything reached it.
            run(lambda: router.answer(packets.DisconnRply(1)))   # not its xid: ignored
            self.assertIsInstance(close(conn), tx.CloseUnconfirmed, name)
            conn, router = open_()
            conn.notify({"n": 1})
            closing = []

            def answer_the_close():
                router.answer(packets.DisconnRply(router.last(packets.DisconnRqst).xid))
                router.lost("")
            if name == "twisted":
                d = conn.close()
                answer_the_close()
                d.addBoth(closing.append)
                self.assertEqual(closing, [None], name)
            else:
                run(getattr(conn, "_inner", conn).lifecycle.close)
                run(answer_the_close)
                self.assertIsNone(close(conn), name)
            self.assertIsNone(conn.close_reason, name)

    def test_nothing_unconfirmed_closes_quietly(self):
        for name, open_, close, run in _three_flavours(self):
            conn, router = open_()
            self.assertIsNone(close(conn), name)
            self.assertIsNone(conn.close_reason, name)

    def test_closed_while_reconnecting_with_a_buffer(self):
        reactor = MemoryReactorClock()
        conn = tx.Connection(URI, reactor, reconnect=tx.Reconnect())
        router = CountingRouter(conn)
        router.open()
        router.lost("reset")
        conn.notify({"n": 1})
        conn.notify({"n": 2})
        failure = self.failureResultOf(conn.close(), tx.CloseUnconfirmed)
        self.assertEqual((failure.value.unsent, failure.value.unconfirmed), (2, 0))
        self.assertIn("2 packets queued", str(failure.value))


class _DyingAgent:
    """An HTTP agent for the tunnel's transport: POSTs wait until the test
    ends them; once ``dead`` every request fails as a killed router's
    would (connection refused). GETs never answer."""

    def __init__(self):
        self.posts = []           # (body, Deferred)
        self.dead = False

    def request(self, method, url, headers=None, body=None):
        from twisted.internet import error
        if self.dead:
            return defer.fail(error.ConnectionRefusedError("killed"))
        d = defer.Deferred()
        if method == b"POST":
            self.posts.append((body.data, d))
        return d


class _Pool:
    def closeCachedConnections(self):
        return defer.succeed(None)


class HTTPTunnelGivesBack(unittest.TestCase):
    """The HTTP tunnel's failed POST and its queue go back to the
    reconnection buffer (in order, within ``pending_size``, what does not
    fit counted and logged), as nothing in user space is lost over TCP."""

    def tunnel(self, **kw):
        from twisted.internet.address import HostnameAddress
        from elvin.protocols.httpclient import HTTPTunnelTransport
        reactor = MemoryReactorClock()
        conn = tx.Connection(URI, reactor, reconnect=tx.Reconnect(), **kw)
        agent = _DyingAgent()
        transport = HTTPTunnelTransport(reactor, agent, _Pool(), b"http://r.invalid/s/1",
                                        HostnameAddress(b"r.invalid", 80))
        proto = tx._ClientFactory(conn).buildProtocol(None)
        transport.protocol = proto
        proto.makeConnection(transport)
        conn._handshake(None, None, None)
        conn.lifecycle.packet(packets.ConnRply(1, {}))       # (ConnRqst is xid 1)
        self.assertTrue(conn._opened.called)
        return conn, agent, transport

    def test_a_killed_router(self):
        conn, agent, transport = self.tunnel()
        for n in range(3):                 # behind the POST in flight (ConnRqst)
            conn.notify({"n": n})
        agent.dead = True
        agent.posts[0][1].errback(tx.error.ConnectionRefusedError("killed"))
        self.assertIs(conn.lifecycle.phase, tx.Phase.WAITING)
        conn.notify({"n": 3})              # while reconnecting
        self.assertEqual(conn.lifecycle.requeued, 3)
        router = FakeRouter(conn)
        router.back()
        self.assertEqual([p.attributes["n"] for p in router.sent
                          if isinstance(p, packets.NotifyEmit)], [0, 1, 2, 3])

    def test_the_buffer_bound_holds(self):
        size = len(packets.encode(packets.NotifyEmit({"n": 0}, True, packets.Keys.EMPTY)))
        conn, agent, transport = self.tunnel(pending_size=2 * size)
        for n in range(5):
            conn.notify({"n": n})
        agent.dead = True
        with self.assertLogs("elvin.client", "WARNING") as logged:
            agent.posts[0][1].errback(tx.error.ConnectionRefusedError("killed"))
        self.assertEqual((conn.lifecycle.requeued, conn.lifecycle.requeue_refused), (2, 3))
        self.assertTrue(any(f"3 notifications ({3 * size} bytes) written for" in line
                            for line in logged.output), logged.output)
        router = FakeRouter(conn)
        router.back()
        self.assertEqual([p.attributes["n"] for p in router.sent
                          if isinstance(p, packets.NotifyEmit)], [0, 1])

    def test_our_own_abort_keeps_nothing(self):
        conn, agent, transport = self.tunnel()
        conn.notify({"n": 1})
        transport.abortConnection()
        self.assertEqual(transport.unsent(), b"")


class DeafToRequests(FakeRouter):
    """A router that answers TestConn (``later(f)``: soon after) and never
    a request, as Avis does not answer a subscription whose literal
    overflows: only a request timeout ends the wait."""

    def __init__(self, connection, later):
        super().__init__(connection)
        self.later = later

    def send(self, packet):
        super().send(packet)
        if isinstance(packet, packets.TestConn):
            self.later(lambda: self.answer(packets.ConfConn()))


OVERFLOWING = "x == 2147483648"
UNANSWERED = "did not answer SubAddRqst (subscribe 'x == 2147483648') within"


class UnansweredRequests(unittest.TestCase):
    """Every flavour fails a request the router does not answer within the
    connection's ``timeout`` with RequestTimeout, and keeps the connection
    (the liveness check is answered all along); the subscription the
    router makes after all is removed there."""

    def test_twisted(self):
        reactor = MemoryReactorClock()
        conn = tx.Connection(URI, reactor, timeout=10)
        conn.liveness = 2
        router = DeafToRequests(conn, lambda f: reactor.callLater(0.1, f))
        router.open()
        d = conn.subscribe(OVERFLOWING, print)
        reactor.pump([0.5] * 19)
        self.assertNoResult(d)
        with self.assertLogs("elvin.client", "WARNING") as logged:
            reactor.advance(0.5)
        failure = self.failureResultOf(d, tx.RequestTimeout)
        self.assertIn(UNANSWERED + " 10 s", str(failure.value))
        self.assertIn(UNANSWERED, logged.output[0])
        self.assertFalse(conn.is_closed)
        self.assertTrue(any(isinstance(p, packets.TestConn) for p in router.sent))
        late = router.last(packets.SubAddRqst).xid
        d = conn.subscribe("require(y)", print)
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 8))
        self.assertEqual(self.successResultOf(d).id, 8)
        router.answer(packets.SubRply(late, 9))      # late: removed at the router
        self.assertEqual(router.last(packets.SubDelRqst).subscription_id, 9)
        self.assertEqual(list(conn.subscriptions), [8])
        conn.timeout = 2
        d = conn.set_keys()
        reactor.advance(2)
        self.failureResultOf(d, tx.RequestTimeout)
        self.assertEqual(conn.timeout, 2)
        with self.assertRaises(ValueError):
            conn.timeout = -1

    def test_asyncio(self):
        import asyncio
        from elvin import aio
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        conn = aio.Connection(URI, loop, timeout=0.05)
        conn.liveness = 0.01
        router = DeafToRequests(conn, loop.call_soon)
        router.open()
        with self.assertLogs("elvin.client", "WARNING"):
            with self.assertRaises(aio.RequestTimeout) as raised:
                loop.run_until_complete(asyncio.wait_for(_awaited(conn.subscribe(OVERFLOWING)), 5))
        self.assertIn(UNANSWERED + " 0.05 s", str(raised.exception))
        self.assertFalse(conn.is_closed)
        self.assertTrue(any(isinstance(p, packets.TestConn) for p in router.sent))
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 9))
        self.assertEqual(router.last(packets.SubDelRqst).subscription_id, 9)
        self.assertEqual(conn.subscriptions, {})
        _closed_politely(router)

    def test_blocking(self):
        from elvin import aio, sync
        from elvin.test.test_client_edges import blocking
        conn, router, on_loop = blocking(timeout=0.05)
        inner = conn._inner
        deaf = on_loop(lambda: DeafToRequests(inner, sync._private_loop().call_soon))
        inner.lifecycle.session.send = deaf.send
        conn.liveness = 0.01
        with self.assertLogs("elvin.client", "WARNING"):
            with self.assertRaises(sync.RequestTimeout) as raised:
                conn.subscribe(OVERFLOWING)
        self.assertIn(UNANSWERED + " 0.05 s", str(raised.exception))
        self.assertFalse(conn.is_closed)
        self.assertEqual(conn.timeout, 0.05)
        conn.timeout = 0.1
        self.assertEqual(inner.lifecycle.timeout, 0.1)
        with self.assertRaises(TypeError):
            conn.timeout = "5"
        self.assertIs(sync.RequestTimeout, aio.RequestTimeout)
        on_loop(_closed_politely, deaf)


def _closed_politely(router):
    router.connection.lifecycle.close()
    router.answer(packets.DisconnRply(router.last(packets.DisconnRqst).xid))
    router.lost("")
