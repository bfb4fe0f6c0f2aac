"""The proxy process killed (SIGKILL) in the middle of a replay to an
acknowledging client, and started again on the same database: the client's
next join gets everything it had not acknowledged, so nothing the proxy
stored is lost, and what comes twice is at most the client's window.
(bench/proxy.py --kill-proxy measures the same with 20,000 notifications,
a slow device process and a publisher still sending.)"""

import signal
import sqlite3

from twisted.internet import defer
from twisted.trial import unittest

from elvin.test import test_proxy_integration as integration
from elvin.test.test_proxy_integration import start_proxy, until

TOTAL = 2000
HANDLED = 500          # the device handles these, then holds the rest
WINDOW = 256


class ProxyKilledMidReplayTest(unittest.TestCase):

    # The same router, proxy and clients as the other integration tests
    # (neither a subclass nor the class imported here: trial would run
    # their tests again in this module).
    setUp = integration.ProxyIntegrationTest.setUp
    close_connections = integration.ProxyIntegrationTest.close_connections
    connect = integration.ProxyIntegrationTest.connect
    publisher = integration.ProxyIntegrationTest.publisher

    def owed(self):
        db = sqlite3.connect(self.db)
        try:
            return db.execute("SELECT count(*) FROM pending WHERE session = 'phone'"
                              ).fetchone()[0]
        finally:
            db.close()

    def test_acknowledging_client_loses_nothing_when_the_proxy_is_killed_mid_replay(self):
        async def run():
            phone = await self.connect(self.proxy_uri, session="phone", ack_window=WINDOW)
            await phone.subscribe("require(n)", lambda n: None)
            await phone.close()
            pub = await self.publisher()
            for n in range(TOTAL):
                pub.notify({"n": n})
                if n % 500 == 499:
                    await pub.test_connection()
            self.assertTrue(await until(lambda: self.owed() == TOTAL), self.owed())

            # A device that handles the first HANDLED and holds the rest
            # (never acknowledged): the proxy stops at its window, mid-replay.
            first = []

            def arrived(note):
                if len(first) < HANDLED:
                    first.append(note["n"])
                else:
                    device.ack_hold(note)
            device = await self.connect(self.proxy_uri, session="phone", ack_window=WINDOW)
            device.on_notification = arrived
            # Killed once the proxy has committed the acknowledgements.
            self.assertTrue(await until(lambda: self.owed() == TOTAL - HANDLED), self.owed())
            self.assertEqual(first, list(range(HANDLED)))
            self.proxy.send_signal(signal.SIGKILL)
            self.proxy.wait(10)
            self.assertTrue(await until(lambda: device.is_closed))
            self.assertEqual(self.owed(), TOTAL - HANDLED)

            _, self.proxy = start_proxy(self.router_uri, self.db, self.proxy_port)
            again = []
            rejoined = await self.connect(self.proxy_uri, session="phone", ack_window=WINDOW)
            rejoined.on_notification = lambda note: again.append(note["n"])
            self.assertEqual(rejoined.sessions["phone"].stored, TOTAL - HANDLED)
            self.assertTrue(await until(lambda: again and again[-1] == TOTAL - 1), again[-3:])
            self.assertEqual(again, sorted(set(again)))                 # in order, once each
            self.assertEqual(set(first) | set(again), set(range(TOTAL)))   # none lost
            self.assertLessEqual(len(set(first) & set(again)), WINDOW)  # twice: the window
            self.assertTrue(await until(lambda: self.owed() == 0), self.owed())
        return defer.ensureDeferred(run())
