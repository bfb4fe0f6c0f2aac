"""elvin.sync's ``retry_now``: the asyncio connection's, run on the private
loop's thread (where the client state lives) from any thread, callbacks
included, with its answer. The dialling itself is tested on the state
machine (test_client_lifecycle) and the asyncio/Twisted flavours."""

import asyncio
import threading

from twisted.trial import unittest

from elvin import sync


class _Inner:
    """What sync.Connection uses of an aio.Connection here."""

    def __init__(self, loop, answer):
        self.loop = loop
        self.answer = answer
        self.threads = []
        self.closed = asyncio.run_coroutine_threadsafe(self._future(), loop).result(5)

    async def _future(self):
        return asyncio.get_running_loop().create_future()

    def retry_now(self):
        self.threads.append(threading.current_thread().name)
        return self.answer


class RetryNowTests(unittest.SynchronousTestCase):

    def connection(self, answer):
        inner = _Inner(sync._private_loop(), answer)
        conn = sync.Connection(inner)
        self.addCleanup(inner.loop.call_soon_threadsafe, inner.closed.cancel)
        return conn, inner

    def test_from_the_program_runs_on_the_loop_and_answers(self):
        for answer in (True, False):
            conn, inner = self.connection(answer)
            self.assertIs(conn.retry_now(), answer)
            self.assertEqual(inner.threads, ["elvin.sync"])

    def test_from_a_callback_runs_at_once(self):
        conn, inner = self.connection(True)
        done = threading.Event()
        answers = []

        def callback():                      # as a subscription callback runs
            answers.append(conn.retry_now())
            done.set()
        inner.loop.call_soon_threadsafe(callback)
        self.assertTrue(done.wait(5))
        self.assertEqual(answers, [True])
        self.assertEqual(inner.threads, ["elvin.sync"])
