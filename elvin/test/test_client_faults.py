"""Every client flavour under faults, in memory (a FakeRouter, Twisted's
Clock, a private asyncio loop turned by hand): nothing the program handed
over is lost without it being told (an error, a hook, a log line)."""

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
