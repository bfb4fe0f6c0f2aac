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
from elvin.clientcore.lifecycle import Phase
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


class TwistedEdges(unittest.TestCase):

    def open(self, **kw):
        self.reactor = MemoryReactorClock()
        conn = tx.Connection(URI, self.reactor, **kw)
        router = FakeRouter(conn)
        router.open()
        return conn, router

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
                conn.close()
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
