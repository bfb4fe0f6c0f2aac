"""Shared fixtures for the transport tests: a real router listening on
127.0.0.1 (port 0) over one protocol stack, real clients, and the same
publish/subscribe scenarios for every stream stack (TCP, TLS, HTTP).
"""

import os

from twisted.internet import defer, reactor
from twisted.trial import unittest

from elvin import client, errors
from elvin.protocols.httptunnel import ElvinHTTPSite
from elvin.protocols.server import ElvinServerFactory
from elvin.core.router import Router
from elvin.values import Int64
from elvin.test.polling import wait_until



class Certificates:
    """Throwaway PEM files made with trustme, in ``directory``."""

    def __init__(self, directory, server_names=("router.test", "127.0.0.1")):
        import trustme
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.ca = trustme.CA()
        self.ca_path = self._write("ca.pem", self.ca.cert_pem.bytes())
        server = self.ca.issue_cert(*server_names)
        self.server_cert = self._write(
            "server.pem", b"".join(p.bytes() for p in server.cert_chain_pems))
        self.server_key = self._write("server.key", server.private_key_pem.bytes())
        # A client certificate from the same CA, and one from a stranger.
        good = self.ca.issue_cert("client@example.test")
        self.client_pem = self._write("client.pem",
                                      good.private_key_and_cert_chain_pem.bytes())
        other_ca = trustme.CA()
        self.other_ca_path = self._write("other-ca.pem", other_ca.cert_pem.bytes())
        bad = other_ca.issue_cert("mallory@example.test")
        self.stranger_pem = self._write("stranger.pem",
                                        bad.private_key_and_cert_chain_pem.bytes())

    def _write(self, name, data):
        path = os.path.join(self.directory, name)
        with open(path, "wb") as f:
            f.write(data)
        return path


class RouterFixture(unittest.TestCase):
    """A router and helpers to listen on each transport (loopback only)."""

    timeout = 30

    def setUp(self):
        self.router = Router()
        self.factory = ElvinServerFactory(self.router, reactor)
        self.connections = []
        self.ports = []
        self.sites = []

    @defer.inlineCallbacks
    def tearDown(self):
        for conn in self.connections:
            transport = getattr(conn.protocol, "transport", None)
            if transport is not None:
                transport.abortConnection()
            if not conn.disconnected.called:
                yield conn.disconnected
        for site in self.sites:
            site.close_all()
        for port in self.ports:
            yield port.stopListening()
        # Let the router side see its channels close (no dirty reactor).
        yield wait_until(lambda: not self.router.sessions)

    # -- listeners ------------------------------------------------------------

    def listen_tcp(self):
        port = reactor.listenTCP(0, self.factory, interface="127.0.0.1")
        self.ports.append(port)
        return f"elvin://127.0.0.1:{port.getHost().port}"

    def listen_tls(self, options, stack="ssl,none,xdr", host="127.0.0.1"):
        from twisted.internet import endpoints
        endpoint = endpoints.wrapServerTLS(
            options, endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1"))
        d = endpoint.listen(self.factory)
        port = self.successResultOf(d) if d.called else None
        if port is None:  # pragma: no cover - listen is synchronous on TCP
            raise RuntimeError("TLS listen did not complete")
        self.ports.append(port)
        return f"elvin:/{stack}/{host}:{port.getHost().port}"

    def listen_silent(self):
        """A TCP listener that accepts and never answers: its port."""
        from twisted.internet import protocol
        accepted = []

        class Silent(protocol.Protocol):
            def connectionMade(self):
                accepted.append(self)
        port = reactor.listenTCP(0, protocol.Factory.forProtocol(Silent),
                                 interface="127.0.0.1")
        self.ports.append(port)

        def hang_up():
            for silent in accepted:
                if silent.transport.connected:
                    silent.transport.abortConnection()
        self.addCleanup(hang_up)
        return port.getHost().port

    def listen_http(self, **kwargs):
        site = ElvinHTTPSite(self.factory, **kwargs)
        self.sites.append(site)
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.ports.append(port)
        return f"elvin:/http,none,xdr/127.0.0.1:{port.getHost().port}", site

    # -- clients --------------------------------------------------------------

    @defer.inlineCallbacks
    def connect(self, options=None, **kwargs):
        conn = yield client.connect(self.uri, options=options, **kwargs)
        self.connections.append(conn)
        return conn


class PubSubScenarios:
    """The same publish/subscribe scenarios for any stream transport.

    Mixed into a RouterFixture whose setUp sets ``self.uri`` (and, for
    TLS, ``self.client_args``: the TLS arguments every client needs).
    """

    client_args = {}

    def open(self, options=None):
        return self.connect(options, **self.client_args)

    @defer.inlineCallbacks
    def sync(self, conn):
        yield conn.test_connection()

    @defer.inlineCallbacks
    def test_publish_subscribe(self):
        consumer = yield self.open()
        producer = yield self.open()
        got = []
        yield consumer.subscribe('Group == "chat" && size(Message) < 140', got.append)
        producer.notify({"Group": "chat", "Message": "hi", "Num": 42,
                         "Big": Int64(12), "R": 3.25, "Blob": b"\xde\xad"})
        producer.notify({"Group": "other", "Message": "no"})
        yield wait_until(lambda: got)
        yield self.sync(producer)
        yield self.sync(consumer)
        self.assertEqual(len(got), 1)
        note = got[0]
        self.assertEqual(note["Message"], "hi")
        self.assertIs(type(note["Big"]), Int64)
        self.assertEqual(note["Blob"], b"\xde\xad")
        self.assertEqual(note["R"], 3.25)

    @defer.inlineCallbacks
    def test_multiple_subscriptions_modify_delete(self):
        conn = yield self.open()
        a, b = [], []
        sub_a = yield conn.subscribe("n < 10", a.append)
        sub_b = yield conn.subscribe("n >= 5", b.append)
        for n in range(12):
            conn.notify({"n": n})
        yield wait_until(lambda: len(a) == 10 and len(b) == 7)
        self.assertEqual([x["n"] for x in a], list(range(10)))
        both = [x for x in a if x["n"] in (5, 6, 7, 8, 9)]
        self.assertTrue(all(set(x.insecure) == {sub_a.id, sub_b.id} for x in both))
        yield sub_a.modify("n == 100")
        yield sub_b.remove()
        del a[:], b[:]
        conn.notify({"n": 100})
        conn.notify({"n": 7})
        yield wait_until(lambda: a)
        yield self.sync(conn)
        self.assertEqual([x["n"] for x in a], [100])
        self.assertEqual(b, [])

    @defer.inlineCallbacks
    def test_bad_subscription_is_nacked_and_connection_survives(self):
        conn = yield self.open()
        with self.assertRaises(client.NackError) as cm:
            yield conn.subscribe("x ==", lambda n: None)
        self.assertEqual(cm.exception.code, errors.PARSE_ERROR)
        got = []
        yield conn.subscribe("require(x)", got.append)
        conn.notify({"x": 1})
        yield wait_until(lambda: got)

    @defer.inlineCallbacks
    def test_options_negotiation(self):
        conn = yield self.open({"Subscription.Max-Count": 16})
        self.assertEqual(conn.options["Subscription.Max-Count"], 16)
        reply = yield conn.set_options({"Subscription.Max-Count": 32})
        self.assertEqual(reply["Subscription.Max-Count"], 32)

    @defer.inlineCallbacks
    def test_many_notifications_in_order(self):
        consumer = yield self.open()
        producer = yield self.open()
        got = []
        yield consumer.subscribe("require(n)", got.append)
        total = 500
        for n in range(total):
            producer.notify({"n": n, "pad": "x" * 200})
        yield wait_until(lambda: len(got) == total, timeout=20)
        self.assertEqual([x["n"] for x in got], list(range(total)))

    @defer.inlineCallbacks
    def test_unotify(self):
        conn = yield self.open()
        got = []
        yield conn.subscribe("require(u)", got.append)
        yield client.unotify(self.uri, {"u": "hello"}, **self.client_args)
        yield wait_until(lambda: got)
        self.assertEqual(got[0]["u"], "hello")
        self.assertEqual(self.router.stats["unotify"], 1)

    @defer.inlineCallbacks
    def test_close_gets_disconnect_reply(self):
        conn = yield self.open()
        yield conn.subscribe("require(x)", lambda n: None)
        yield conn.close()
        yield conn.disconnected
        yield wait_until(lambda: not self.router.sessions)
        self.assertEqual(len(self.router.index), 0)

    @defer.inlineCallbacks
    def test_shutdown_sends_disconn(self):
        conn = yield self.open()
        reasons = []
        conn.on_disconnect = lambda reason, args: reasons.append(reason)
        self.router.shutdown()
        yield conn.disconnected
        self.assertEqual(reasons, [1])


def memory_handshake(server, wire, context, hostname, settle=None, rounds=10):
    """Run a TLS client (an ``ssl`` module SSLObject of ``context`` for
    ``hostname``) against ``server``, a listener's TLS protocol writing to
    the StringTransport ``wire``, in memory; returns the client once its
    handshake is done and the server has its Finished (and the client what
    the server sent after it). ``settle()``, if given, runs after each of
    the server's reads (a Clock's ``advance(0)`` for delayed writes)."""
    import ssl

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_ = context.wrap_bio(incoming, outgoing, server_hostname=hostname)

    def exchange():
        if outgoing.pending:
            server.dataReceived(outgoing.read())
            if settle is not None:
                settle()
        incoming.write(wire.value())
        wire.clear()
    for _ in range(rounds):
        try:
            client_.do_handshake()
        except ssl.SSLWantReadError:
            exchange()
            continue
        exchange()                        # the client's Finished, and what follows
        return client_
    raise AssertionError(f"no TLS handshake in {rounds} rounds")
