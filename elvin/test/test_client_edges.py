"""The client flavours at the edges of a session, in memory: no socket,
a fake router that records what the client sends and answers when told,
Twisted's ``MemoryReactorClock`` and a private asyncio loop turned by
hand. The blocking flavour runs its private loop's thread, so its turns
are checked through that loop (``elvin.sync._run``)."""

import asyncio

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock
from twisted.trial import unittest

from elvin import aio
from elvin import client as tx
from elvin.clientcore.lifecycle import Dial, Phase
from elvin.clientcore.state import ConnectionClosed, NackError
from elvin.protocols import packets
from elvin.uri import ElvinURI

URI = ElvinURI("elvin://router.invalid:2917")


class FakeRouter:
    """What the client sends, decoded (so it must encode); ``answer``
    feeds the client a packet as if read from the channel."""

    def __init__(self, connection):
        self.connection = connection
        self.sent = []

    def send(self, packet):
        self.sent.append(packets.decode(packets.encode(packet)))

    def open(self, options=None):
        self.connection.lifecycle.attached(self.send, {})
        self.answer(packets.ConnRply(self.sent[-1].xid, options or {}))

    def answer(self, packet):
        self.connection.lifecycle.packet(packet)

    def last(self, kind):
        return [p for p in self.sent if isinstance(p, kind)][-1]

    def lost(self, detail="reset"):
        self.connection.lifecycle.channel_lost(detail)

    def back(self):
        """After ``lost``: the client dials again (the Dial is not carried
        out: this router takes it) and connects; returns the requests the
        replay sent, to be answered."""
        lifecycle = self.connection.lifecycle
        execute = lifecycle.execute
        lifecycle.execute = lambda effect: None if isinstance(effect, Dial) else execute(effect)
        try:
            lifecycle.retry_now()
        finally:
            lifecycle.execute = execute
        lifecycle.dialled(self.send)
        before = len(self.sent)
        self.answer(packets.ConnRply(self.last(packets.ConnRqst).xid, {}))
        return self.sent[before:]


class TwistedCase(unittest.TestCase):

    def open(self, **kw):
        self.reactor = MemoryReactorClock()
        conn = tx.Connection(URI, self.reactor, **kw)
        router = FakeRouter(conn)
        router.open()
        return conn, router


class TwistedEdges(TwistedCase):

    def test_a_request_from_the_errback_of_one_failed_by_the_loss(self):
        """Twisted fires errbacks as the channel ends: a request made there
        fails with the loss (or waits for the reconnection), never an
        AssertionError."""
        for reconnect in (None, tx.Reconnect()):
            conn, router = self.open(reconnect=reconnect)
            met = []

            def retry(failure):
                met.append(failure.value)
                try:
                    conn.notify({"x": 1})
                    met.append("notified")
                except ConnectionClosed as e:
                    met.append(e)
                conn.subscribe("require(x)", print).addErrback(
                    lambda f: met.append(f.value))
            conn.test_connection().addErrback(retry)
            router.lost()
            self.assertIsInstance(met[0], ConnectionClosed)
            if reconnect is None:
                self.assertEqual([type(e) for e in met], [ConnectionClosed] * 3)
            else:
                self.assertEqual(met[1], "notified")
                self.assertIs(conn.lifecycle.phase, Phase.WAITING)
                # The notification buffered was not sent: close says so.
                self.failureResultOf(conn.close(), tx.CloseUnconfirmed)
                self.assertIsInstance(met[2], ConnectionClosed)


class AioCase(unittest.TestCase):

    def setUp(self):
        self.loop = asyncio.new_event_loop()
        self.addCleanup(self.loop.close)

    def open(self, **kw):
        conn = aio.Connection(URI, self.loop, **kw)
        router = FakeRouter(conn)
        router.open()
        return conn, router

    def turn(self, times=3):
        for _ in range(times):
            self.loop.run_until_complete(asyncio.sleep(0))

    def start(self, awaitable):
        async def wrapped():
            return await awaitable
        task = self.loop.create_task(wrapped())
        self.turn()
        return task


class CancelledChangesTwisted(TwistedCase):
    """A modify or remove cancelled after it went out: the router carries
    it out, and so does the client's view (nothing registered again
    after a reconnection, the new expression kept)."""

    def test_cancelled_remove_is_carried_out(self):
        conn, router = self.open()
        d = conn.subscribe("require(a)", lambda note: None)
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 1))
        sub = self.successResultOf(d)
        d = sub.remove()
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertIn(1, conn.subscriptions)            # not answered yet
        router.answer(packets.SubRply(router.last(packets.SubDelRqst).xid, 1))
        self.assertEqual(conn.subscriptions, {})
        self.assertEqual(conn.replay(), [])

    def test_cancelled_modify_is_carried_out(self):
        conn, router = self.open()
        d = conn.subscribe("require(a)", lambda note: None)
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 1))
        sub = self.successResultOf(d)
        d = sub.modify("require(c)")
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        router.answer(packets.SubRply(router.last(packets.SubModRqst).xid, 1))
        self.assertEqual(sub.expression, "require(c)")

    def test_removing_twice_does_nothing(self):
        conn, router = self.open()
        d = conn.subscribe("require(a)", lambda note: None)
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 1))
        sub = self.successResultOf(d)
        d = sub.remove()
        router.answer(packets.SubRply(router.last(packets.SubDelRqst).xid, 1))
        self.assertIsNone(self.successResultOf(d))
        sent = len(router.sent)
        self.assertIsNone(self.successResultOf(sub.remove()))
        self.assertEqual(len(router.sent), sent)          # nothing asked of the router


class CancelledChangesAio(AioCase):

    def subscribed(self, conn, router, expression="require(a)", sub_id=1):
        task = self.start(conn.subscribe(expression))
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, sub_id))
        self.turn()
        return task.result()

    def test_subscribe_cancelled_before_it_ran_leaves_nothing_to_log(self):
        import gc
        import warnings
        conn, router = self.open()

        async def at_once():
            try:
                await asyncio.wait_for(conn.subscribe("require(a)"), 0)
            except asyncio.TimeoutError:
                pass
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.loop.run_until_complete(at_once())
            gc.collect()
        self.assertEqual([str(w.message) for w in caught], [])
        self.assertEqual([p for p in router.sent if isinstance(p, packets.SubAddRqst)], [])

    def test_cancelled_remove_is_carried_out(self):
        conn, router = self.open()
        sub = self.subscribed(conn, router)
        task = self.start(sub.remove())
        task.cancel()
        self.turn()
        self.assertTrue(task.cancelled())
        router.answer(packets.SubRply(router.last(packets.SubDelRqst).xid, 1))
        self.assertEqual(conn.subscriptions, {})
        self.assertIsNotNone(sub._ended)                  # its iterator ends
        self.assertEqual(conn.replay(), [])               # not registered again

    def test_cancelled_modify_is_carried_out(self):
        conn, router = self.open()
        sub = self.subscribed(conn, router)
        task = self.start(sub.modify("require(c)"))
        task.cancel()
        self.turn()
        router.answer(packets.SubRply(router.last(packets.SubModRqst).xid, 1))
        self.assertEqual(sub.expression, "require(c)")

    def test_cancelled_quench_changes_are_carried_out(self):
        conn, router = self.open()
        task = self.start(conn.quench(["a"]))
        router.answer(packets.QnchRply(router.last(packets.QnchAddRqst).xid, 5))
        self.turn()
        quench = task.result()
        task = self.start(quench.modify(add_names=["b"]))
        task.cancel()
        self.turn()
        router.answer(packets.QnchRply(router.last(packets.QnchModRqst).xid, 5))
        self.assertEqual(quench.names, {"a", "b"})
        task = self.start(quench.remove())
        task.cancel()
        self.turn()
        router.answer(packets.QnchRply(router.last(packets.QnchDelRqst).xid, 5))
        self.assertEqual(conn.quenches, {})

    def test_a_remove_cancelled_in_the_reconnection_buffer_changes_nothing(self):
        conn, router = self.open(reconnect=aio.Reconnect())
        sub = self.subscribed(conn, router)
        router.lost()
        task = self.start(sub.remove())
        task.cancel()
        self.turn()
        self.assertEqual(conn.lifecycle.buffered, 0)     # taken back: never sent
        self.assertIn(1, conn.subscriptions)
        self.assertIsNone(sub._ended)
        conn.lifecycle.close()

    def test_removing_twice_does_nothing(self):
        conn, router = self.open()
        sub = self.subscribed(conn, router)
        task = self.start(sub.remove())
        router.answer(packets.SubRply(router.last(packets.SubDelRqst).xid, 1))
        self.turn()
        self.assertIsNone(task.result())
        sent = len(router.sent)
        self.assertIsNone(self.loop.run_until_complete(sub.remove()))
        self.assertEqual(len(router.sent), sent)


class CancelledChangesBlocking(unittest.TestCase):
    """``elvin.sync`` cancels the work on its loop when the calling thread
    stops waiting (a KeyboardInterrupt, or ``_run``'s timeout here): the
    same path as an asyncio cancellation."""

    def test_an_interrupted_remove_is_carried_out(self):
        import concurrent.futures
        import threading
        from elvin import sync
        loop = sync._private_loop()

        async def opened():
            conn = aio.Connection(URI, loop)
            router = FakeRouter(conn)
            router.open()
            return conn, router
        conn, router = sync._run(opened())

        def answer(packet):
            asyncio.run_coroutine_threadsafe(_call(router.answer, packet), loop).result(10)
        subscribing = asyncio.run_coroutine_threadsafe(_awaited(conn.subscribe("require(a)")),
                                                       loop)
        for _ in range(500):              # bounded: 5 s
            if sync._run(_call(lambda: type(router.sent[-1]))) is packets.SubAddRqst:
                break
            threading.Event().wait(0.01)
        answer(packets.SubRply(router.last(packets.SubAddRqst).xid, 1))
        inner = subscribing.result(10)
        with self.assertRaises(concurrent.futures.TimeoutError):
            sync._run(inner.remove(), timeout=0.05)
        answer(packets.SubRply(router.last(packets.SubDelRqst).xid, 1))
        self.assertEqual(sync._run(_call(lambda: dict(conn.subscriptions))), {})
        sync._run(_call(conn.lifecycle.close))


async def _call(function, *args):
    return function(*args)


async def _awaited(awaitable):
    return await awaitable


class _SilentEndpoint:
    """Connects at once to a router that never answers ConnRqst."""

    def connect(self, factory):
        from twisted.internet.testing import StringTransport
        proto = factory.buildProtocol(None)
        proto.makeConnection(StringTransport())
        self.transport = proto.transport
        return defer.succeed(proto)


class CancelledConnectTwisted(unittest.TestCase):
    """Cancelling ``connect`` during the handshake fails it with
    CancelledError (TimeoutError with ``addTimeout``), as Twisted code
    expects, not with a ConnectFailed blaming the router."""

    def connect(self):
        self.reactor = MemoryReactorClock()
        endpoint = _SilentEndpoint()
        self.patch(tx, "_endpoint", lambda reactor, uri, tls=None: endpoint)
        d = tx.connect(URI, reactor=self.reactor, timeout=10)
        self.assertNotEqual(endpoint.transport.value(), b"")     # ConnRqst sent
        return d, endpoint

    def test_cancel(self):
        d, endpoint = self.connect()
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertTrue(endpoint.transport.disconnecting)

    def test_add_timeout(self):
        d, _ = self.connect()
        d.addTimeout(0.5, self.reactor)
        self.reactor.advance(0.5)
        self.failureResultOf(d, defer.TimeoutError)


class CancelledConnectAio(unittest.TestCase):

    def test_no_future_exception_left_unretrieved(self):
        import gc

        class Transport(asyncio.Transport):
            def get_extra_info(self, name, default=None):
                return default

            def write(self, data):
                pass

            def is_closing(self):
                return False

            def abort(self):
                pass

            close = abort

        async def silent(uri, loop, factory, *args):
            protocol = factory()
            transport = Transport()
            protocol.connection_made(transport)
            return transport, protocol
        self.patch(aio, "_open", silent)
        problems = []

        async def scenario():
            asyncio.get_running_loop().set_exception_handler(
                lambda loop, context: problems.append(context))
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(aio.connect(URI, timeout=10), 0.05)
            await asyncio.sleep(0)
            gc.collect()
        asyncio.run(scenario())
        self.assertEqual(problems, [])


def blocking(options=None, **kw):
    """An ``elvin.sync`` Connection over a FakeRouter (both on the
    blocking flavour's private loop): (connection, router, on_loop)
    where ``on_loop(f, *args)`` runs ``f`` there and returns its result."""
    from elvin import sync
    loop = sync._private_loop()

    def on_loop(function, *args):
        return sync._run(_call(function, *args))

    def opened():
        conn = aio.Connection(URI, loop, **kw)
        router = FakeRouter(conn)
        router.open(options)
        return conn, router
    inner, router = on_loop(opened)
    return sync.Connection(inner), router, on_loop


class OversizedNotifications(unittest.TestCase):
    """A notification the router would answer by ending the session
    (larger than its Packet.Max-Length, past the attribute limits it
    reported) raises ValueError in every flavour, and is not sent."""

    def flavours(self, options=None):
        """(name, notify, sent packets, close) for each flavour."""
        reactor = MemoryReactorClock()
        twisted = tx.Connection(URI, reactor)
        twisted_router = FakeRouter(twisted)
        twisted_router.open(options)
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        asyncio_conn = aio.Connection(URI, loop)
        asyncio_router = FakeRouter(asyncio_conn)
        asyncio_router.open(options)
        sync_conn, sync_router, on_loop = blocking(options)
        self.addCleanup(lambda: on_loop(sync_conn._inner.lifecycle.close))
        return [("twisted", twisted.notify, twisted_router.sent),
                ("asyncio", asyncio_conn.notify, asyncio_router.sent),
                ("blocking", sync_conn.notify, sync_router.sent)]

    def refused(self, options, attributes, words):
        for name, notify, sent in self.flavours(options):
            before = len(sent)
            with self.assertRaises(ValueError, msg=name) as caught:
                notify(attributes)
            self.assertIn(words, str(caught.exception), name)
            self.assertEqual(len(sent), before, name)

    def test_larger_than_the_negotiated_packet_max_length(self):
        self.refused({"Packet.Max-Length": 4096}, {"big": b"x" * 5000},
                     "Packet.Max-Length (4096)")

    def test_the_legacy_name_counts_too(self):
        self.refused({"router.packet.max-length": 4096}, {"big": "x" * 5000},
                     "Packet.Max-Length (4096)")

    def test_larger_than_the_default_when_the_router_did_not_say(self):
        self.refused(None, {"big": b"x" * (2 * 1024 * 1024)}, "the default")

    def test_attribute_limits_the_router_reported(self):
        self.refused({"Attribute.String.Max-Length": 1024}, {"s": "é" * 600},
                     "Attribute.String.Max-Length (1024)")
        self.refused({"Attribute.Opaque.Max-Length": 1024}, {"o": b"x" * 1025},
                     "Attribute.Opaque.Max-Length (1024)")
        self.refused({"Attribute.Max-Count": 16}, {f"a{n}": n for n in range(17)},
                     "Attribute.Max-Count (16)")
        self.refused({"Attribute.Name.Max-Length": 64}, {"n" * 65: 1},
                     "Attribute.Name.Max-Length (64)")

    def test_ask_limits_reports_them_unchanged(self):
        """ASK_LIMITS (what elvin-notify asks in ConnRqst): the router
        reports each limit notify checks, and changes none of them."""
        from elvin import aio, client, sync
        from elvin.core.options import ConnectionOptions
        self.assertIs(aio.ASK_LIMITS, client.ASK_LIMITS)
        self.assertIs(sync.ASK_LIMITS, client.ASK_LIMITS)
        options = ConnectionOptions()
        before = dict(options.values)
        reply = options.negotiate(client.ASK_LIMITS)
        self.assertEqual(options.values, before)
        self.assertEqual({name: reply[name] for name in client.ASK_LIMITS},
                         {name: before[name] for name in client.ASK_LIMITS})
        self.refused(reply, {f"a{n}": n for n in range(257)}, "Attribute.Max-Count (256)")

    def test_a_nul_in_a_name_or_string_is_refused(self):
        """A string has no NUL bytes (client protocol 6.1.4); a router
        ignores a notification holding one, so notify refuses it, naming
        the attribute."""
        self.refused(None, {"ok": 1, "v": "a\0b"},
                     "attribute 'v': string holds a NUL (U+0000) at character 1")
        self.refused(None, {"v\0": 1}, "attribute 'v\\x00': name holds a NUL")

    def test_a_bool_is_refused(self):
        for name, notify, sent in self.flavours():
            before = len(sent)
            with self.assertRaises(TypeError, msg=name) as caught:
                notify({"x": True})
            self.assertIn("bool is not an Elvin value type", str(caught.exception))
            self.assertEqual(len(sent), before, name)

    def test_within_the_limits_is_sent(self):
        from elvin import sync
        for name, notify, sent in self.flavours({"Packet.Max-Length": 4096}):
            notify({"fits": b"x" * 3000})
            sync._run(_call(lambda: None))    # the blocking flavour sends from its loop
            self.assertEqual(sent[-1].attributes, {"fits": b"x" * 3000}, name)


class NotifyAfterTheRoutersDisconn(unittest.TestCase):

    def test_blocking_notify_raises_the_cause(self):
        conn, router, on_loop = blocking()
        on_loop(router.answer, packets.Disconn(1, "router is shutting down"))
        on_loop(router.lost, "")
        self.assertTrue(conn.is_closed)
        with self.assertRaises(ConnectionClosed) as caught:
            conn.notify({"x": 1})
        self.assertEqual(caught.exception.reason, 1)
        self.assertIn("shutting down", str(caught.exception))

    def test_every_flavour_raises_the_same(self):
        reactor = MemoryReactorClock()
        twisted = tx.Connection(URI, reactor)
        router = FakeRouter(twisted)
        router.open()
        router.answer(packets.Disconn(1, "router is shutting down"))
        router.lost("")
        with self.assertRaises(ConnectionClosed) as caught:
            twisted.notify({"x": 1})
        self.assertEqual(caught.exception.reason, 1)


class AutoQuenchWithoutQuench(unittest.TestCase):
    """A router without quench (Avis, an Elvin proxy: Nack 2007): auto-
    quench says so and sends everything (the router filters anyway)."""

    NACK = staticmethod(lambda xid: packets.Nack(xid, 2007, "Quench not supported", ()))

    def test_twisted(self):
        conn = tx.Connection(URI, MemoryReactorClock())
        router = FakeRouter(conn)
        router.open()
        auto = tx.AutoQuench(conn, {"file"})
        # What ready's callbacks send already finds the fallback in place.
        first = []
        auto.ready.addCallback(lambda a: first.append(a.notify({"file": "first"})) or a)
        router.answer(self.NACK(router.last(packets.QnchAddRqst).xid))
        self.assertEqual(first, [True])
        self.assertIs(self.successResultOf(auto.ready), auto)
        self.assertTrue(auto.unsupported)
        self.assertTrue(auto.notify({"file": "a", "new": 1}))
        self.assertEqual(router.sent[-1].attributes, {"file": "a", "new": 1})
        self.assertEqual(len([p for p in router.sent if isinstance(p, packets.QnchAddRqst)]), 1)

    def test_asyncio(self):
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        conn = aio.Connection(URI, loop)
        router = FakeRouter(conn)
        router.open()

        async def scenario():
            auto = aio.AutoQuench(conn, {"file"})
            await asyncio.sleep(0)
            with self.assertLogs("elvin.aio", "WARNING") as logged:
                router.answer(self.NACK(router.last(packets.QnchAddRqst).xid))
                await auto.ready()
            self.assertIn("sends every notification", logged.output[0])
            return auto
        auto = loop.run_until_complete(scenario())
        self.assertTrue(auto.notify({"file": "a"}))
        self.assertEqual((auto.sent, auto.dropped), (1, 0))
        self.assertEqual(router.sent[-1].attributes, {"file": "a"})

    def test_blocking(self):
        import threading
        from elvin import sync
        conn, router, on_loop = blocking()
        made = {}
        thread = threading.Thread(target=lambda: made.setdefault("auto",
                                                                 conn.auto_quench({"file"})))
        thread.start()
        for _ in range(500):              # bounded: 5 s
            if on_loop(lambda: [p for p in router.sent if isinstance(p, packets.QnchAddRqst)]):
                break
            threading.Event().wait(0.01)
        on_loop(router.answer, self.NACK(router.last(packets.QnchAddRqst).xid))
        thread.join(10)
        auto = made["auto"]
        self.assertTrue(auto.unsupported)
        self.assertTrue(auto.notify({"file": "a"}))
        sync._run(_call(lambda: None))
        self.assertEqual(router.sent[-1].attributes, {"file": "a"})
        on_loop(conn._inner.lifecycle.close)


class ConnectFailureWording(unittest.TestCase):
    """``connect``'s failures read the same in every flavour (one builder,
    ``elvin.clientcore.messages``): the short URI, what went wrong, what
    to try."""

    def test_the_flavours_say_the_same(self):
        import socket
        from twisted.internet import error
        from elvin.clientcore.lifecycle import HandshakeTimeout
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        conn = aio.Connection(URI, loop)
        twisted = tx.Connection(URI, MemoryReactorClock())
        lost = ConnectionClosed(f"connection to the router at {URI} was lost")
        cases = [
            (ConnectionRefusedError(), tx._cannot_connect(URI, error.ConnectionRefusedError())),
            (socket.gaierror(-2, "Name or service not known"),
             tx._cannot_connect(URI, error.DNSLookupError("router.invalid"))),
            (TimeoutError(), tx._cannot_connect(URI, error.TimeoutError())),
            (lost, tx._handshake_lost(URI, twisted, lost)),
        ]
        for cause, twisted_says in cases:
            self.assertEqual(str(aio._connect_error(conn, cause, 5)), twisted_says)
        self.assertIn("elvin://router.invalid:2917", twisted_says)
        for side in (conn, twisted):
            side.problem, side.first_bytes = "not_elvin", b"HTTP/1.1 400"
        self.assertEqual(str(aio._connect_error(conn, lost, 5)),
                         tx._handshake_lost(URI, twisted, lost))
        self.assertIn("not Elvin", tx._handshake_lost(URI, twisted, lost))
        self.assertIn("within 5 s: is this an Elvin router?",
                      str(aio._connect_error(conn, HandshakeTimeout(), 5)))


#: A reconnection policy whose timer never fires within a test: the test
#: brings the router back itself (``FakeRouter.back``).
AWAY = aio.Reconnect(initial=60, maximum=60, jitter=0)
#: A replay answer refusing to register the subscription or quench again.
REFUSED = None


def answer_replay(router, ids):
    """Back after ``lost``: answer the replay, giving each subscription
    (by expression) and quench (by names) the new id in ``ids``, or a
    Nack where it says REFUSED."""
    for rqst in router.back():
        if isinstance(rqst, packets.SubAddRqst):
            new = ids[rqst.expression]
            reply = packets.SubRply(rqst.xid, new) if new is not REFUSED else None
        elif isinstance(rqst, packets.QnchAddRqst):
            new = ids[rqst.names]
            reply = packets.QnchRply(rqst.xid, new) if new is not REFUSED else None
        else:
            continue
        router.answer(reply or packets.Nack(rqst.xid, 2006, "too many", ()))
    assert router.connection.lifecycle.phase is Phase.UP


def after_replay(router, kinds):
    """What the client sent of ``kinds`` once the replay was answered."""
    connects = [i for i, p in enumerate(router.sent) if isinstance(p, packets.ConnRqst)]
    return [p for p in router.sent[connects[-1]:] if isinstance(p, kinds)]


CHANGES = (packets.SubModRqst, packets.SubDelRqst, packets.QnchModRqst, packets.QnchDelRqst)


class ChangesWhileReconnectingTwisted(TwistedCase):
    """A modify or remove asked for while reconnecting waits in the buffer
    and goes out after the replay, naming the subscription or quench by
    the id the router gave it then (the replay gives new ids)."""

    def subscribed(self, conn, router, expression, sub_id):
        d = conn.subscribe(expression, lambda note: None)
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, sub_id))
        return self.successResultOf(d)

    def quenched(self, conn, router, name, quench_id):
        d = conn.quench([name])
        router.answer(packets.QnchRply(router.last(packets.QnchAddRqst).xid, quench_id))
        return self.successResultOf(d)

    def test_a_remove_names_the_new_id(self):
        conn, router = self.open(reconnect=AWAY)
        a = self.subscribed(conn, router, "require(a)", 1)
        b = self.subscribed(conn, router, "require(b)", 2)
        router.lost()
        d = a.remove()
        # The replay swaps the ids: the old id of a is now b's.
        answer_replay(router, {"require(a)": 2, "require(b)": 1})
        (remove,) = after_replay(router, CHANGES)
        self.assertEqual(remove.subscription_id, 2)
        router.answer(packets.SubRply(remove.xid, 2))
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(conn.subscriptions, {1: b})

    def test_a_modify_names_the_new_id(self):
        conn, router = self.open(reconnect=AWAY)
        a = self.subscribed(conn, router, "require(a)", 1)
        router.lost()
        d = a.modify("require(c)")
        answer_replay(router, {"require(a)": 7})
        (modify,) = after_replay(router, CHANGES)
        self.assertEqual(modify.subscription_id, 7)
        router.answer(packets.SubRply(modify.xid, 7))
        self.assertIs(self.successResultOf(d), a)
        self.assertEqual((a.expression, conn.subscriptions), ("require(c)", {7: a}))

    def test_quench_changes_name_the_new_id(self):
        conn, router = self.open(reconnect=AWAY)
        q = self.quenched(conn, router, "a", 5)
        r = self.quenched(conn, router, "b", 6)
        router.lost()
        modified = q.modify(add_names=["c"])
        removed = q.remove()
        answer_replay(router, {("a",): 6, ("b",): 5})
        modify, remove = after_replay(router, CHANGES)
        self.assertEqual((modify.quench_id, remove.quench_id), (6, 6))
        router.answer(packets.QnchRply(modify.xid, 6))
        router.answer(packets.QnchRply(remove.xid, 6))
        self.assertIs(self.successResultOf(modified), q)
        self.assertIsNone(self.successResultOf(removed))
        self.assertEqual(conn.quenches, {5: r})

    def test_changes_to_what_the_replay_could_not_place_again(self):
        """A remove completes here, a modify fails: nothing is sent for
        either (their old ids may be another's now)."""
        conn, router = self.open(reconnect=AWAY)
        a = self.subscribed(conn, router, "require(a)", 1)
        b = self.subscribed(conn, router, "require(b)", 2)
        q = self.quenched(conn, router, "a", 5)
        router.lost()
        removed, modified, unquenched = a.remove(), b.modify("require(c)"), q.remove()
        answer_replay(router, {"require(a)": REFUSED, "require(b)": REFUSED,
                               ("a",): REFUSED})
        self.assertEqual(after_replay(router, CHANGES), [])
        self.assertIsNone(self.successResultOf(removed))
        self.assertIsNone(self.successResultOf(unquenched))
        self.failureResultOf(modified, NackError)
        self.assertEqual((conn.subscriptions, conn.quenches), ({}, {}))
        self.assertEqual(b.expression, "require(b)")


class ChangesWhileReconnectingAio(AioCase):
    """As ChangesWhileReconnectingTwisted, with asyncio."""

    def subscribed(self, conn, router, expression, sub_id):
        task = self.start(conn.subscribe(expression))
        router.answer(packets.SubRply(router.last(packets.SubAddRqst).xid, sub_id))
        self.turn()
        return task.result()

    def quenched(self, conn, router, name, quench_id):
        task = self.start(conn.quench([name]))
        router.answer(packets.QnchRply(router.last(packets.QnchAddRqst).xid, quench_id))
        self.turn()
        return task.result()

    def test_a_remove_names_the_new_id(self):
        conn, router = self.open(reconnect=AWAY)
        a = self.subscribed(conn, router, "require(a)", 1)
        b = self.subscribed(conn, router, "require(b)", 2)
        router.lost()
        task = self.start(a.remove())
        answer_replay(router, {"require(a)": 2, "require(b)": 1})
        (remove,) = after_replay(router, CHANGES)
        self.assertEqual(remove.subscription_id, 2)
        router.answer(packets.SubRply(remove.xid, 2))
        self.turn()
        self.assertIsNone(task.result())
        self.assertEqual(conn.subscriptions, {1: b})
        self.assertIsNone(b._ended)
        self.assertIsNotNone(a._ended)

    def test_a_modify_names_the_new_id(self):
        conn, router = self.open(reconnect=AWAY)
        a = self.subscribed(conn, router, "require(a)", 1)
        router.lost()
        task = self.start(a.modify("require(c)"))
        answer_replay(router, {"require(a)": 7})
        (modify,) = after_replay(router, CHANGES)
        self.assertEqual(modify.subscription_id, 7)
        router.answer(packets.SubRply(modify.xid, 7))
        self.turn()
        self.assertIs(task.result(), a)
        self.assertEqual((a.expression, conn.subscriptions), ("require(c)", {7: a}))

    def test_quench_changes_name_the_new_id(self):
        conn, router = self.open(reconnect=AWAY)
        q = self.quenched(conn, router, "a", 5)
        r = self.quenched(conn, router, "b", 6)
        router.lost()
        modified = self.start(q.modify(add_names=["c"]))
        removed = self.start(q.remove())
        answer_replay(router, {("a",): 6, ("b",): 5})
        modify, remove = after_replay(router, CHANGES)
        self.assertEqual((modify.quench_id, remove.quench_id), (6, 6))
        router.answer(packets.QnchRply(modify.xid, 6))
        router.answer(packets.QnchRply(remove.xid, 6))
        self.turn()
        self.assertIs(modified.result(), q)
        self.assertIsNone(removed.result())
        self.assertEqual(conn.quenches, {5: r})

    def test_changes_to_what_the_replay_could_not_place_again(self):
        conn, router = self.open(reconnect=AWAY)
        a = self.subscribed(conn, router, "require(a)", 1)
        b = self.subscribed(conn, router, "require(b)", 2)
        q = self.quenched(conn, router, "a", 5)
        router.lost()
        removed = self.start(a.remove())
        modified = self.start(b.modify("require(c)"))
        unquenched = self.start(q.remove())
        answer_replay(router, {"require(a)": REFUSED, "require(b)": REFUSED,
                               ("a",): REFUSED})
        self.turn()
        self.assertEqual(after_replay(router, CHANGES), [])
        self.assertIsNone(removed.result())
        self.assertIsNone(unquenched.result())
        self.assertIsInstance(modified.exception(), NackError)
        self.assertEqual((conn.subscriptions, conn.quenches), ({}, {}))
        self.assertIsInstance(a._ended, NackError)        # its iterator says why


class ChangesWhileReconnectingBlocking(unittest.TestCase):
    """The blocking flavour's remove, made on its own thread while the
    client reconnects, names the id the replay gave."""

    def test_a_remove_names_the_new_id(self):
        import concurrent.futures
        import threading
        conn, router, on_loop = blocking(reconnect=AWAY)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        self.addCleanup(pool.shutdown)
        self.addCleanup(on_loop, conn._inner.lifecycle.close)   # first: a call waiting fails

        def sent(kind):
            for _ in range(500):              # bounded: 5 s
                found = on_loop(lambda: [p for p in router.sent if isinstance(p, kind)])
                if found:
                    return found[-1]
                threading.Event().wait(0.01)
            self.fail(f"no {kind.__name__} sent")

        def subscribed(expression, sub_id):
            subscribing = pool.submit(conn.subscribe, expression, callback=lambda note: None)
            for _ in range(500):
                rqst = sent(packets.SubAddRqst)
                if rqst.expression == expression:
                    break
                threading.Event().wait(0.01)
            on_loop(router.answer, packets.SubRply(rqst.xid, sub_id))
            return subscribing.result(10)
        a = subscribed("require(a)", 1)
        b = subscribed("require(b)", 2)
        on_loop(router.lost)
        removing = pool.submit(a.remove)
        for _ in range(500):
            if on_loop(lambda: conn._inner.lifecycle.buffered):
                break
            threading.Event().wait(0.01)
        on_loop(answer_replay, router, {"require(a)": 2, "require(b)": 1})
        remove = sent(packets.SubDelRqst)
        self.assertEqual(remove.subscription_id, 2)
        on_loop(router.answer, packets.SubRply(remove.xid, 2))
        self.assertIsNone(removing.result(10))
        self.assertEqual(on_loop(lambda: dict(conn._inner.subscriptions)), {1: b._inner})


class UnsupportedStacksAio(unittest.SynchronousTestCase):
    """What the asyncio and blocking clients say of a stack they lack."""

    def refused(self, uri):
        from elvin import sync
        with self.assertRaises(aio.ConnectFailed) as cm:
            sync.connect(uri, timeout=2)
        return str(cm.exception)

    def test_udp_has_no_sessions(self):
        text = self.refused("elvin:/udp,none,xdr/127.0.0.1:2917")
        self.assertIn("(elvin.aio, elvin.sync) speak tcp and TLS stacks", text)
        self.assertIn("udp,none,xdr carries only UNotify datagrams", text)
        self.assertNotIn("HTTP", text)

    def test_http_is_the_twisted_clients(self):
        text = self.refused("elvin:/http,none,xdr/127.0.0.1:2917")
        self.assertIn("the HTTP tunnel is elvin.client's only", text)

    def test_layers_it_lacks_are_refused_not_skipped(self):
        # A security or marshalling layer asked for is never dropped in
        # silence: tcp,krb5,xdr would otherwise be plain XDR in clear.
        # (Refused before dialling: nothing listens on the port.)
        for stack in ("tcp,krb5,xdr", "tcp,none,xml", "udp,krb5,xdr"):
            uri = f"elvin:/{stack}/127.0.0.1:9"
            self.assertIn(f"protocol stack {stack} is not supported", self.refused(uri))
            from elvin import sync
            with self.assertRaises(aio.ConnectFailed) as cm:
                sync.unotify(uri, {"a": 1}, timeout=2)
            self.assertIn("is not supported", str(cm.exception))
