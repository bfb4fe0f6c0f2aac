"""HTTP tunnel transport (http,none,xdr) on 127.0.0.1: the client library
over the tunnel, and the wire protocol of docs/protocols.md driven by hand.
"""

import struct

from twisted.internet import defer, reactor, task
from twisted.web import client as webclient
from twisted.web.http_headers import Headers

from elvin import client
from elvin.protocols.httpclient import HTTPTunnelEndpoint, _Bytes
from elvin.protocols import packets as elvin_packets
from elvin.protocols.framing import frame
from elvin.uri import ElvinURI

from elvin.test.transport_fixtures import PubSubScenarios, RouterFixture, wait_until


def unframe(data):
    packets = []
    while len(data) >= 4:
        (length,) = struct.unpack(">I", data[:4])
        packets.append(elvin_packets.decode(data[4:4 + length]))
        data = data[4 + length:]
    return packets


class HTTPFixture(RouterFixture):
    mode = None

    def setUp(self):
        super().setUp()
        self.uri, self.site = self.listen_http()
        if self.mode:
            self.uri += f";mode={self.mode}"


class HTTPStreamTests(HTTPFixture, PubSubScenarios):
    """Every publish/subscribe scenario through the tunnel (streamed GETs)."""

    @defer.inlineCallbacks
    def test_close_ends_http_session(self):
        conn = yield self.open()
        self.assertEqual(len(self.site.tunnels), 1)
        yield conn.close()
        yield conn.disconnected
        self.assertEqual(self.site.tunnels, {})
        self.assertEqual(self.router.sessions, set())

    @defer.inlineCallbacks
    def test_sessions_counted_as_http(self):
        """status.json's connections_by_transport and /metrics'
        elvin_connections count a tunnelled session as http, not tcp."""
        from elvin.ops.status import snapshot, transport_of
        yield self.open()
        self.assertEqual([transport_of(s) for s in self.router.sessions], ["http"])
        totals = snapshot(self.router, started=0)["totals"]
        self.assertEqual(totals["connections_by_transport"], {"http": 1})

    @defer.inlineCallbacks
    def test_abort_deletes_session(self):
        conn = yield self.open()
        conn.protocol.transport.abortConnection()
        yield conn.disconnected
        yield wait_until(lambda: not self.site.tunnels and not self.router.sessions)

    @defer.inlineCallbacks
    def test_slow_consumer_gets_dropwarn_while_others_keep_receiving(self):
        slow = yield self.open({"Send-Queue.Max-Length": 8192})
        fast = yield self.open()
        producer = yield self.open()
        slow_got, fast_got = [], []
        yield slow.subscribe("require(n)", slow_got.append)
        yield fast.subscribe("require(n)", fast_got.append)
        slow.protocol.transport.pauseProducing()  # stop reading the GET body
        total = 3000
        pad = "x" * 1000
        for n in range(total):
            producer.notify({"n": n, "pad": pad})
        yield wait_until(lambda: len(fast_got) == total, timeout=25)
        session = next(s for s in self.router.sessions
                       if s.subscriptions and slow.subscriptions.keys() & s.subscriptions.keys())
        self.assertGreater(session.dropped, 0)
        slow.protocol.transport.resumeProducing()
        yield wait_until(lambda: slow.dropwarns > 0 and slow_got
                         and slow_got[-1]["n"] == total - 1, timeout=25)
        self.assertLess(len(slow_got), total)


class HTTPPollTests(HTTPFixture, PubSubScenarios):
    """The same scenarios with long-polled GETs (URI option mode=poll)."""

    mode = "poll"


class HTTPTimeoutTests(RouterFixture):
    """Abandoned sessions time out on the site's (injected) clock."""

    def setUp(self):
        super().setUp()
        self.clock = task.Clock()
        self.uri, self.site = self.listen_http(session_timeout=60, poll_timeout=20,
                                               clock=self.clock)

    @defer.inlineCallbacks
    def test_abandoned_session_times_out(self):
        conn = yield client.connect(self.uri)
        self.connections.append(conn)
        self.assertEqual(len(self.router.sessions), 1)
        # The client goes quiet: its GET ends when its hold time is up and
        # it never comes back.
        conn.protocol.transport.closed = True  # stop polling, silently
        self.clock.advance(19)
        self.assertEqual(len(self.router.sessions), 1)
        self.clock.advance(1)
        self.assertEqual(len(self.router.sessions), 1)
        self.clock.advance(59)
        self.assertEqual(len(self.router.sessions), 1)
        self.clock.advance(2)
        self.assertEqual(self.router.sessions, set())
        self.assertEqual(self.site.tunnels, {})
        conn.protocol.transport.closed = False
        conn.protocol.transport.abortConnection()
        yield conn.disconnected

    @defer.inlineCallbacks
    def test_requests_keep_session_alive(self):
        conn = yield client.connect(self.uri)
        self.connections.append(conn)
        for _ in range(5):
            self.clock.advance(19.5)   # GETs end and are re-issued
            yield conn.test_connection()
        self.assertEqual(len(self.router.sessions), 1)


class HTTPWireTests(RouterFixture):
    """The tunnel protocol itself, spoken with a bare HTTP client."""

    def setUp(self):
        super().setUp()
        self.clock = task.Clock()
        self.uri, self.site = self.listen_http(clock=self.clock)
        port = ElvinURI(self.uri).port
        self.base = b"http://127.0.0.1:%d/elvin/session" % port
        self.pool = webclient.HTTPConnectionPool(reactor, persistent=True)
        self.agent = webclient.Agent(reactor, pool=self.pool)
        self.addCleanup(self.site.close_all)
        self.addCleanup(self.pool.closeCachedConnections)

    @defer.inlineCallbacks
    def request(self, method, url, body=None):
        response = yield self.agent.request(
            method, url, Headers({b"content-type": [b"application/x-elvin-xdr"]}),
            _Bytes(body) if body is not None else None)
        data = yield webclient.readBody(response)
        return response, data

    @defer.inlineCallbacks
    def open_session(self):
        response, data = yield self.request(b"POST", self.base, b"")
        self.assertEqual(response.code, 201)
        session = data.decode("ascii")
        self.assertEqual(response.headers.getRawHeaders(b"location"),
                         [f"/elvin/session/{session}".encode("ascii")])
        return self.base + b"/" + data

    @defer.inlineCallbacks
    def test_session_exchange(self):
        url = yield self.open_session()
        self.assertGreaterEqual(len(url.rsplit(b"/", 1)[1]), 32)
        response, _ = yield self.request(
            b"POST", url + b"?seq=1", frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0))))
        self.assertEqual(response.code, 204)
        # Nothing was attached: the reply waited in the session's send queue.
        response, data = yield self.request(b"GET", url + b"?mode=poll")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders(b"content-type"),
                         [b"application/x-elvin-xdr"])
        (reply,) = unframe(data)
        self.assertIsInstance(reply, elvin_packets.ConnRply)
        # Three requests in one POST, all answered (with no GET attached
        # the session is idle, so TestConn is answered too).
        body = (frame(elvin_packets.encode(elvin_packets.TestConn()))
                + frame(elvin_packets.encode(elvin_packets.SubAddRqst(2, "require(x)", True)))
                + frame(elvin_packets.encode(elvin_packets.DisconnRqst(3))))
        response, _ = yield self.request(b"POST", url + b"?seq=2", body)
        self.assertEqual(response.code, 204)
        response, data = yield self.request(b"GET", url)
        kinds = [type(p) for p in unframe(data)]
        self.assertEqual(kinds, [elvin_packets.ConfConn, elvin_packets.SubRply, elvin_packets.DisconnRply])
        # DisconnRply closed the session.
        self.assertEqual(self.site.tunnels, {})
        response, _ = yield self.request(b"GET", url)
        self.assertEqual(response.code, 404)
        response, _ = yield self.request(b"POST", url + b"?seq=3", b"")
        self.assertEqual(response.code, 404)

    @defer.inlineCallbacks
    def test_head_takes_no_packets(self):
        """HEAD is refused; the ConnRply waiting in the session's queue is
        still there for the next GET (twisted.web answered HEAD as a GET,
        attaching it, and the packets it took went nowhere)."""
        url = yield self.open_session()
        connrqst = frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0)))
        response, _ = yield self.request(b"POST", url + b"?seq=1", connrqst)
        self.assertEqual(response.code, 204)
        for query in (b"?mode=poll", b""):
            response, _ = yield self.request(b"HEAD", url + query)
            self.assertEqual(response.code, 405)
            self.assertEqual(response.headers.getRawHeaders(b"allow"),
                             [b"GET, POST, DELETE"])
        response, _ = yield self.request(b"HEAD", self.base + b"/nope")
        self.assertEqual(response.code, 404)
        response, data = yield self.request(b"GET", url + b"?mode=poll")
        self.assertEqual([type(p) for p in unframe(data)], [elvin_packets.ConnRply])

    @defer.inlineCallbacks
    def test_seq_resend_ignored_and_gap_refused(self):
        url = yield self.open_session()
        connrqst = frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0)))
        response, _ = yield self.request(b"POST", url + b"?seq=1", connrqst)
        self.assertEqual(response.code, 204)
        response, _ = yield self.request(b"POST", url + b"?seq=1", connrqst)
        self.assertEqual(response.code, 204)  # a resend: acknowledged, ignored
        response, _ = yield self.request(b"POST", url + b"?seq=5", b"")
        self.assertEqual(response.code, 409)
        response, data = yield self.request(b"GET", url + b"?mode=poll")
        self.assertEqual([type(p) for p in unframe(data)], [elvin_packets.ConnRply])
        self.assertEqual(len(self.router.sessions), 1)

    @defer.inlineCallbacks
    def test_new_session_times_out(self):
        url = yield self.open_session()
        self.assertEqual(len(self.router.sessions), 1)
        self.clock.advance(self.site.session_timeout + 1)
        self.assertEqual(self.router.sessions, set())
        response, _ = yield self.request(b"GET", url)
        self.assertEqual(response.code, 404)

    @defer.inlineCallbacks
    def test_unknown_session_and_bad_requests(self):
        response, _ = yield self.request(b"GET", self.base + b"/nope")
        self.assertEqual(response.code, 404)
        response, _ = yield self.request(b"DELETE", self.base + b"/nope")
        self.assertEqual(response.code, 404)
        response, _ = yield self.request(b"PUT", self.base)
        self.assertIn(response.code, (405, 501))
        url = yield self.open_session()
        response, _ = yield self.request(b"GET", url + b"?mode=sideways")
        self.assertEqual(response.code, 400)
        response, _ = yield self.request(b"POST", url + b"?seq=x", b"")
        self.assertEqual(response.code, 400)
        response, _ = yield self.request(b"DELETE", url)
        self.assertEqual(response.code, 204)
        self.assertEqual(self.router.sessions, set())

    @defer.inlineCallbacks
    def test_violation_closes_session(self):
        url = yield self.open_session()
        # A frame announcing more than Packet.Max-Length resets the session,
        # as on TCP.
        response, _ = yield self.request(b"POST", url, struct.pack(">I", 1 << 30))
        self.assertEqual(response.code, 204)
        self.assertEqual(self.router.sessions, set())
        response, _ = yield self.request(b"GET", url)
        self.assertEqual(response.code, 404)

    @defer.inlineCallbacks
    def test_poll_returns_empty_when_hold_expires(self):
        url = yield self.open_session()
        d = self.request(b"GET", url + b"?mode=poll")
        yield task.deferLater(reactor, 0.05, lambda: None)
        self.assertFalse(d.called)
        self.clock.advance(self.site.poll_timeout)
        response, data = yield d
        self.assertEqual((response.code, data), (200, b""))
        self.assertEqual(len(self.router.sessions), 1)

    def test_client_endpoint_options(self):
        endpoint = HTTPTunnelEndpoint(reactor, ElvinURI(
            "elvin:/http,none,xdr/[::1]:8080;mode=poll;proxy-host=proxy;proxy-port=3128"))
        self.assertEqual(endpoint.base_url, b"http://[::1]:8080/elvin/session")
        self.assertEqual(endpoint.mode, "poll")
        self.assertEqual(endpoint.proxy, ("proxy", 3128))
        self.assertRaises(ValueError, HTTPTunnelEndpoint, reactor,
                          ElvinURI("elvin:/http,none,xdr/h:1;mode=sometimes"))


class HTTPSilentServerTests(RouterFixture):
    """A server that accepts and never answers: ``timeout`` bounds opening
    the tunnel (docs/router.md, "Never hanging")."""

    @defer.inlineCallbacks
    def test_connect_times_out(self):
        uri = f"elvin:/http,none,xdr/127.0.0.1:{self.listen_silent()}"
        for mode in ("", ";mode=poll"):
            started = reactor.seconds()
            with self.assertRaises(client.ConnectFailed) as cm:
                yield client.connect(uri + mode, timeout=0.5)
            self.assertLess(reactor.seconds() - started, 5)
            self.assertIn("no HTTP response (none within 0.5 s)", str(cm.exception))

    @defer.inlineCallbacks
    def test_unotify_times_out(self):
        uri = f"elvin:/http,none,xdr/127.0.0.1:{self.listen_silent()}"
        started = reactor.seconds()
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.unotify(uri, {"a": 1}, timeout=0.5)
        self.assertLess(reactor.seconds() - started, 5)
        self.assertIn("no HTTP response (none within 0.5 s)", str(cm.exception))


class HTTPProxyTests(RouterFixture):
    """The client reaches the router through an HTTP proxy."""

    def setUp(self):
        super().setUp()
        from twisted.web import proxy, http
        self.uri, self.site = self.listen_http()
        factory = http.HTTPFactory()
        factory.protocol = proxy.Proxy
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.ports.insert(0, port)
        self.uri += f";mode=poll;proxy-host=127.0.0.1;proxy-port={port.getHost().port}"

    @defer.inlineCallbacks
    def test_publish_subscribe_through_proxy(self):
        consumer = yield self.connect()
        producer = yield self.connect()
        got = []
        yield consumer.subscribe("require(p)", got.append)
        for n in range(20):
            producer.notify({"p": n})
        yield wait_until(lambda: len(got) == 20)
        self.assertEqual([x["p"] for x in got], list(range(20)))
        yield consumer.close()
        yield producer.close()


class AbsoluteFormTests(RouterFixture):
    """RFC 9112 3.2.2: the listener accepts requests whose target is a
    whole URL (as a pass-through HTTP proxy forwards them)."""

    @defer.inlineCallbacks
    def test_session_through_absolute_urls(self):
        # proxy-host naming the router itself: every request the client
        # sends carries the absolute-form, straight to the listener.
        uri, _ = self.listen_http()
        port = ElvinURI(uri).port
        for mode in ("stream", "poll"):
            self.uri = f"{uri};mode={mode};proxy-host=127.0.0.1;proxy-port={port}"
            conn = yield self.connect()
            got = []
            yield conn.subscribe("require(a)", got.append)
            conn.notify({"a": 1})
            yield wait_until(lambda: got)
            yield conn.close()


class HTTPErrorTextTests(RouterFixture):

    @defer.inlineCallbacks
    def test_refusal_page_in_one_line(self):
        """A web server that is not an Elvin tunnel answers with its HTML
        404 page: the error says so in one line."""
        from twisted.web import resource, server
        port = reactor.listenTCP(0, server.Site(resource.Resource()), interface="127.0.0.1")
        self.ports.append(port)
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.connect(f"elvin:/http,none,xdr/127.0.0.1:{port.getHost().port}",
                                 timeout=5)
        text = str(cm.exception)
        self.assertNotIn("\n", text)
        self.assertNotIn("<", text)
        self.assertIn("the HTTP server refused to open a session (404 Not Found: 404 - No "
                      "Such Resource", text)
