"""Every client flavour knows a subscription (a quench) from the moment
its reply is read, not from when the awaiting caller resumes: a
NotifyDeliver (a SubAddNotify) that follows the reply in the same read is
not dropped. A router writes them together whenever a delivery is queued
behind the reply (a SubRply held for the federation peers, or a matching
notification routed just after it)."""

import asyncio
import struct

from twisted.internet import defer, protocol, reactor
from twisted.trial import unittest

from elvin import aio
from elvin.protocols import packets
from elvin.subscription import parse


def _frame(packet):
    data = packets.encode(packet)
    return struct.pack(">I", len(data)) + data


class _OneReadRouter:
    """Just enough of a router on 127.0.0.1: it answers a SubAddRqst with
    its SubRply and a NotifyDeliver for it, and a QnchAddRqst with its
    QnchRply and a SubAddNotify for it, each pair in one write."""

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"elvin://127.0.0.1:{port}"

    async def _serve(self, reader, writer):
        try:
            while True:
                (length,) = struct.unpack(">I", await reader.readexactly(4))
                packet = packets.decode(await reader.readexactly(length))
                if isinstance(packet, packets.ConnRqst):
                    writer.write(_frame(packets.ConnRply(packet.xid, {})))
                elif isinstance(packet, packets.SubAddRqst):
                    writer.write(_frame(packets.SubRply(packet.xid, 77))
                                 + _frame(packets.NotifyDeliver({"x": 1}, (), (77,))))
                elif isinstance(packet, packets.QnchAddRqst):
                    writer.write(_frame(packets.QnchRply(packet.xid, 5))
                                 + _frame(packets.SubAddNotify((), (5,), 9,
                                                               parse("x == 1"))))
                elif isinstance(packet, packets.DisconnRqst):
                    writer.write(_frame(packets.DisconnRply(packet.xid)))
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def stop(self):
        self.server.close()
        await self.server.wait_closed()


def _against_one_read_router(request):
    """Connect the asyncio client to a ``_OneReadRouter``, ``await
    request(conn, seen)``, let the loop turn once, and return ``seen``."""
    async def scenario():
        router = _OneReadRouter()
        uri = await router.start()
        conn = await aio.connect(uri)
        seen = []
        await request(conn, seen)
        await asyncio.sleep(0)
        await conn.close()
        await router.stop()
        return seen
    return asyncio.run(asyncio.wait_for(scenario(), 30))


class ReplyThenPacketTests(unittest.SynchronousTestCase):

    def test_a_delivery_read_with_the_subrply_reaches_the_subscription(self):
        got = _against_one_read_router(
            lambda conn, seen: conn.subscribe("x == 1", seen.append))
        self.assertEqual([dict(note) for note in got], [{"x": 1}])

    def test_a_term_read_with_the_qnchrply_reaches_the_quench(self):
        added = _against_one_read_router(
            lambda conn, seen: conn.quench(["x"], on_add=lambda term, tree, secure:
                                           seen.append(term)))
        self.assertEqual(added, [9])

    def test_the_blocking_client_too(self):
        import threading
        from elvin import sync
        ready = threading.Event()
        box = {}

        def serve():
            async def main():
                router = _OneReadRouter()
                box["uri"] = await router.start()
                box["stop"] = asyncio.Event()
                ready.set()
                await box["stop"].wait()
                await router.stop()
            box["loop"] = asyncio.new_event_loop()
            box["loop"].run_until_complete(main())
        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        self.assertTrue(ready.wait(10))
        got = []
        with sync.connect(box["uri"]) as conn:
            conn.subscribe("x == 1", callback=got.append)
            for _ in range(100):              # bounded: 1 s at most
                if got:
                    break
                threading.Event().wait(0.01)
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)
        self.assertEqual([dict(note) for note in got], [{"x": 1}])


class _OneReadProtocol(protocol.Protocol):
    """``_OneReadRouter``'s answers, from a Twisted server."""

    def connectionMade(self):
        self.buffer = b""

    def dataReceived(self, data):
        self.buffer += data
        while len(self.buffer) >= 4:
            (length,) = struct.unpack(">I", self.buffer[:4])
            if len(self.buffer) < 4 + length:
                return
            packet = packets.decode(self.buffer[4:4 + length])
            self.buffer = self.buffer[4 + length:]
            if isinstance(packet, packets.ConnRqst):
                self.transport.write(_frame(packets.ConnRply(packet.xid, {})))
            elif isinstance(packet, packets.SubAddRqst):
                self.transport.write(_frame(packets.SubRply(packet.xid, 77))
                                     + _frame(packets.NotifyDeliver({"x": 1}, (), (77,))))
            elif isinstance(packet, packets.DisconnRqst):
                self.transport.write(_frame(packets.DisconnRply(packet.xid)))


class TwistedClientTests(unittest.TestCase):
    """The Twisted client registers in its Deferred's callback, which runs
    as the reply is read: the same guarantee, checked."""

    @defer.inlineCallbacks
    def test_a_delivery_read_with_the_subrply_reaches_the_subscription(self):
        from elvin import client
        factory = protocol.Factory.forProtocol(_OneReadProtocol)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        conn = yield client.connect(f"elvin://127.0.0.1:{port.getHost().port}")
        got = []
        yield conn.subscribe("x == 1", got.append)
        yield conn.close()
        self.assertEqual([dict(note) for note in got], [{"x": 1}])
