"""Client handover: a drained router redirects its clients
(Disconn reason 2), and they follow with their subscriptions."""

import os
import subprocess
import sys
import tempfile

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from elvin import client
from elvin.core.router import Router
from elvin.protocols import packets
from elvin.protocols.server import ElvinServerFactory
from elvin.test.places import REPO
from elvin.test.polling import wait_until
from elvin.test.test_router import RecordingOutput


class DrainCoreTests(unittest.TestCase):

    def test_drain_redirects_connected_and_new_clients(self):
        router = Router()
        out = RecordingOutput()
        session = router.open_session(out, "c1")
        session.packet_received(packets.ConnRqst(1, 4, 0, {}))
        out.take()
        self.assertEqual(router.drain("elvin://other:2917"), 1)
        (disconn,) = out.take()
        self.assertEqual((disconn.reason, disconn.args), (2, "elvin://other:2917"))
        self.assertTrue(out.closed)
        late = RecordingOutput()
        router.open_session(late, "c2").packet_received(packets.ConnRqst(1, 4, 0, {}))
        kinds = [type(p) for p in late.take()]
        self.assertEqual(kinds, [packets.ConnRply, packets.Disconn])
        router.undrain()
        fresh = RecordingOutput()
        router.open_session(fresh, "c3").packet_received(packets.ConnRqst(1, 4, 0, {}))
        self.assertEqual([type(p) for p in fresh.take()], [packets.ConnRply])


class LocalRouter:
    def __init__(self, test):
        self.router = Router()
        self.port = reactor.listenTCP(0, ElvinServerFactory(self.router, reactor),
                                      interface="127.0.0.1")
        self.uri = f"elvin://127.0.0.1:{self.port.getHost().port}"
        test.addCleanup(self.stop)

    def stop(self):
        for session in list(self.router.sessions):
            transport = getattr(session.output, "transport", None)
            if transport is not None:
                transport.abortConnection()
        return self.port.stopListening()


class DrainTests(unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def test_hundred_clients_move_with_their_subscriptions(self):
        old, new = LocalRouter(self), LocalRouter(self)
        clients, got, moved = [], [], []
        for i in range(100):
            conn = yield client.connect(old.uri)
            self.addCleanup(lambda c=conn: c.protocol.transport.abortConnection()
                            if c.protocol and c.protocol.transport else None)
            seen = []
            got.append(seen)
            yield conn.subscribe(f"n >= 0 && k == {i % 10}", seen.append)
            conn.on_redirect = moved.append
            clients.append(conn)
        publisher = yield client.connect(new.uri)
        self.addCleanup(publisher.close)
        old.router.drain(new.uri)
        yield wait_until(lambda: sum(1 for s in new.router.sessions
                                     if s.state == s.CONNECTED) == 101
                         and len(new.router.subscriptions) == 100, timeout=30)
        self.assertEqual(len(moved), 100)
        self.assertEqual(len(old.router.subscriptions), 0)
        for k in range(10):
            publisher.notify({"n": 1, "k": k})
        yield wait_until(lambda: all(len(seen) == 1 for seen in got))
        yield publisher.test_connection()
        yield task.deferLater(reactor, 0.1, lambda: None)
        self.assertEqual([len(seen) for seen in got], [1] * 100)
        self.assertTrue(all(str(c.uri).endswith(new.uri.rsplit(":", 1)[1]) for c in clients))

    @defer.inlineCallbacks
    def test_redirect_loop_is_not_followed_for_ever(self):
        a, b = LocalRouter(self), LocalRouter(self)
        a.router.drain(b.uri)
        b.router.drain(a.uri)
        conn = yield client.connect(a.uri, reconnect=client.Reconnect(attempts=1))
        yield wait_until(lambda: conn.disconnected.called, timeout=30)


class SubscribeToolTests(unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def test_elvin_subscribe_keeps_running_across_a_redirect(self):
        old, new = LocalRouter(self), LocalRouter(self)
        folder = tempfile.mkdtemp()
        ready = os.path.join(folder, "ready")
        out = os.path.join(folder, "out")
        proc = subprocess.Popen(
            [sys.executable, "-m", "elvin.tools.subscribe", "-e", old.uri, "--ready",
             "-n", "2", "require(n)"], cwd=REPO,
            stdout=open(out, "w"), stderr=open(ready, "w"))
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        yield wait_until(lambda: "ready" in open(ready).read(), timeout=30)
        publisher = yield client.connect(old.uri)
        publisher.notify({"n": 1})
        yield wait_until(lambda: "n: 1" in open(out).read().replace("n: 1\n---", "n: 1"),
                         timeout=30)
        yield publisher.close()
        old.router.drain(new.uri)
        yield wait_until(lambda: len(new.router.subscriptions) == 1, timeout=30)
        publisher = yield client.connect(new.uri)
        publisher.notify({"n": 2})
        yield wait_until(lambda: proc.poll() is not None, timeout=30)
        yield publisher.close()
        self.assertEqual(proc.returncode, 0, open(ready).read())
        self.assertEqual(open(out).read(), "n: 1\n---\nn: 2\n---\n")
        self.assertIn("redirected to", open(ready).read())


def router_process(test, redirect_to):
    """A router process whose redirect-to is ``redirect_to``: (URI, process)."""
    from elvin.test.places import free_port
    from elvin.test.test_client_flavours import start_router, stop_router
    folder = tempfile.mkdtemp()
    port = free_port()
    config = os.path.join(folder, "elvind.conf")
    with open(config, "w") as f:
        f.write(f"listen = elvin://127.0.0.1:{port}\nredirect-to = {redirect_to}\n")
    uri, proc = start_router(port, ["-c", config])
    test.addCleanup(stop_router, proc)
    return uri, proc


class SignalTests(unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def test_sigusr1_drains_a_router_process_to_redirect_to(self):
        import signal
        new = LocalRouter(self)
        uri, proc = router_process(self, new.uri)
        got, moved = [], []
        conn = yield client.connect(uri)
        self.addCleanup(lambda: conn.protocol.transport.abortConnection()
                        if conn.protocol and conn.protocol.transport else None)
        conn.on_redirect = moved.append
        yield conn.subscribe("require(n)", got.append)
        proc.send_signal(signal.SIGUSR1)
        yield wait_until(lambda: len(new.router.subscriptions) == 1, timeout=30)
        self.assertEqual(len(moved), 1)
        publisher = yield client.connect(new.uri)
        publisher.notify({"n": 1})
        yield wait_until(lambda: got)
        yield publisher.close()
