"""The tests' own helpers for starting servers: a port answered by
another process is not taken for ours."""

import socket
import subprocess
import sys

from twisted.trial import unittest

from elvin.test import places
from elvin.test.test_client_flavours import stop_router

LISTEN = ("import socket, sys, time; s = socket.socket(); "
          "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(30)")


class WaitListeningTests(unittest.SynchronousTestCase):

    def held_port(self):
        """A port this test process listens on (as another test's server would)."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        self.addCleanup(sock.close)
        return sock.getsockname()[1]

    def spawn(self, port):
        proc = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)],
                                stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (proc.kill(), proc.wait(10)))
        return proc

    def test_another_process_on_the_port_is_not_ours(self):
        port = self.held_port()
        proc = self.spawn(port)          # cannot bind: exits
        with self.assertRaises(places.PortTaken) as caught:
            places.wait_listening(proc, port, "the server", timeout=10)
        self.assertIn(f"127.0.0.1:{port}", str(caught.exception))

    def test_our_own_listener(self):
        port = places.free_port()
        proc = self.spawn(port)
        places.wait_listening(proc, port, "the server", timeout=10)
        self.assertIsNone(proc.poll())

    def test_start_twistd_chooses_another_port(self):
        taken = self.held_port()
        real, given = places.free_port, []

        def free_port(kind=socket.SOCK_STREAM):
            # the first port offered is one another process holds
            given.append(real(kind) if given else taken)
            return given[-1]
        self.patch(places, "free_port", free_port)
        port, proc = places.start_twistd("elvin", lambda p: ["-l", f"elvin://127.0.0.1:{p}"])
        self.addCleanup(lambda: stop_router(proc))
        self.assertEqual(len(given), 2)
        self.assertEqual(port, given[1])
        self.assertNotEqual(port, taken)
