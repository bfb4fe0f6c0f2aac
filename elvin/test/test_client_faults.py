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
