"""Client side of the ``http,none,xdr`` tunnel (see docs/protocols.md and
``elvin.protocols.httptunnel`` for the router side).

:class:`HTTPTunnelEndpoint` is an ``IStreamClientEndpoint``: it opens a
tunnelled session with ``twisted.web.client.Agent`` and connects the given
protocol to a :class:`HTTPTunnelTransport`, so the client library runs the
very same framed protocol over HTTP as over TCP::

    conn = yield elvin.client.connect("elvin:/http,none,xdr/router:8080")

* Bytes the protocol writes are POSTed (one POST in flight at a time, so
  they arrive in order; what is written meanwhile goes in the next POST),
  numbered with ``seq`` so a POST whose response was lost is resent
  safely (up to ``POST_RETRIES`` times).
* One GET at a time receives what the router sends, streamed into the
  protocol as it arrives; when it ends the next GET is issued at once.
* 404 on the session means the router has ended it: the protocol's
  connection is lost (cleanly). Any other failure loses it with an error.
* ``loseConnection`` flushes pending POSTs, then DELETEs the session;
  ``abortConnection`` DELETEs at once. Either way every HTTP connection is
  closed before the protocol's ``connectionLost`` is called.
* When the tunnel fails (the router died, a POST or the GET failed), what
  the protocol wrote and no POST delivered -- the body of the POST in
  flight, the queue behind it, and what it writes until it is told -- is
  kept: ``unsent()`` returns it, so the client can send it again on its
  next session instead of losing it (a TCP socket has no such queue in
  user space).
* ``connect`` fails with :class:`TunnelTimeout` when the POST that opens
  the session has no answer (status and body) within the endpoint's
  ``timeout``: a server that accepts and stays silent.

URI options of the http module: ``mode=stream`` (default) or ``mode=poll``
(each GET ends after carrying some packets -- for proxies that buffer
responses), and ``proxy-host`` / ``proxy-port`` to go through an HTTP
proxy (requests then carry absolute URLs, as proxies expect).
"""

import re

from twisted.internet import defer, endpoints, error
from twisted.internet.address import HostnameAddress
from twisted.internet.interfaces import IStreamClientEndpoint, ITransport
from twisted.logger import Logger
from twisted.python import failure
from twisted.web import client, http
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from elvin.protocols.hostnames import hostname_endpoint
from elvin.protocols.httptunnel import CONTENT_TYPE, POLL, SESSION_PATH, STREAM

__all__ = ["HTTPTunnelEndpoint", "HTTPTunnelTransport", "TunnelError", "TunnelTimeout",
           "TunnelRefused",
           "POST_RETRIES"]

#: Times a POST is resent after a network failure before giving up.
POST_RETRIES = 2

#: Largest body batched into one POST (a single bigger packet goes alone).
POST_BATCH = 64 << 10

#: Seconds to wait for the DELETE that hangs up before closing anyway.
DELETE_TIMEOUT = 5.0

_RETRYABLE = (client.ResponseNeverReceived, client.RequestTransmissionFailed,
              error.ConnectionLost, error.ConnectionRefusedError,
              error.TimeoutError, error.ConnectError)


class TunnelError(error.ConnectionLost):
    """The HTTP tunnel failed (unexpected status, network error)."""


class TunnelTimeout(Exception):
    """No answer to the POST that opens a tunnelled session within
    ``timeout`` seconds."""

    def __init__(self, timeout):
        super().__init__(timeout)
        self.timeout = timeout

    def __str__(self):
        return f"no HTTP response within {self.timeout:g} s"


class TunnelRefused(TunnelError):
    """The POST that opens a tunnelled session was answered with another
    status than 201: ``status`` (code and phrase) and ``body`` (one line)."""

    def __init__(self, status, body):
        super().__init__(status, body)
        self.status = status
        self.body = body

    def __str__(self):
        return (f"the HTTP server refused to open a session ({self.status}"
                f"{': ' + self.body if self.body else ''})")


@implementer(IBodyProducer)
class _Bytes:
    """An IBodyProducer for bytes already in memory."""

    def __init__(self, data):
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer):
        consumer.write(self.data)
        return defer.succeed(None)

    def pauseProducing(self):
        pass

    def resumeProducing(self):
        pass

    def stopProducing(self):
        pass


def _one_line(body, most=200):
    """A response body for an error message: tags and line breaks out
    (a server's HTML error page becomes its words), at most ``most``
    characters."""
    text = re.sub(r"<[^>]*>", " ", body[:4096].decode("latin-1"))
    text = " ".join(text.split())
    return text if len(text) <= most else text[:most - 3] + "..."


def _url_host(host):
    return f"[{host}]" if ":" in host else host


def _options(uri):
    options = uri.options
    mode = options.get("mode", STREAM)
    if mode not in (STREAM, POLL):
        raise ValueError(f"{uri}: http option mode must be stream or poll, not {mode!r}")
    proxy = None
    if "proxy-host" in options:
        if not options["proxy-host"]:
            raise ValueError(f"{uri}: http option proxy-host needs a host name")
        try:
            proxy = (options["proxy-host"], int(options.get("proxy-port") or "8080"))
        except ValueError:
            raise ValueError(f"{uri}: proxy-port must be a number") from None
    return mode, proxy


@implementer(IAgentEndpointFactory)
class _TunnelEndpoints:
    """The Agent's connections to the router: plain TCP (the tunnel is
    ``http``), to any host name a resolver knows (``router_1`` too)."""

    def __init__(self, reactor, timeout):
        self.reactor = reactor
        self.timeout = timeout

    def endpointForURI(self, uri):
        return hostname_endpoint(self.reactor, uri.host.decode("ascii"), uri.port,
                                 timeout=self.timeout)


@implementer(IStreamClientEndpoint)
class HTTPTunnelEndpoint:
    """Connects protocols to an Elvin router through the HTTP tunnel."""

    def __init__(self, reactor, uri, timeout=30):
        self.reactor = reactor
        self.uri = uri
        self.timeout = timeout
        self.mode, self.proxy = _options(uri)
        base = f"http://{_url_host(uri.host)}:{uri.port}"
        self.base_url = base.encode("ascii") + SESSION_PATH

    def _agent(self, pool):
        if self.proxy is not None:
            host, port = self.proxy
            proxy = hostname_endpoint(self.reactor, host, port, timeout=self.timeout)
            return client.ProxyAgent(proxy, self.reactor, pool=pool)
        return client.Agent.usingEndpointFactory(
            self.reactor, _TunnelEndpoints(self.reactor, self.timeout), pool=pool)

    @defer.inlineCallbacks
    def _open_session(self, agent):
        """The POST that opens a session: (response, body)."""
        response = yield agent.request(
            b"POST", self.base_url, Headers({b"content-type": [CONTENT_TYPE]}),
            _Bytes(b""))
        body = yield client.readBody(response)
        return response, body

    def _no_answer(self, result, timeout):
        return failure.Failure(TunnelTimeout(timeout))

    @defer.inlineCallbacks
    def connect(self, factory):
        pool = client.HTTPConnectionPool(self.reactor, persistent=True)
        pool.retryAutomatically = False
        agent = self._agent(pool)
        try:
            opened = self._open_session(agent)
            if self.timeout:
                opened.addTimeout(self.timeout, self.reactor,
                                  onTimeoutCancel=self._no_answer)
            response, body = yield opened
            if response.code != http.CREATED:
                raise TunnelRefused(f"{response.code} {response.phrase.decode('latin-1')}",
                                    _one_line(body))
            session_id = body.strip().decode("ascii")
        except BaseException:
            yield pool.closeCachedConnections()
            raise
        transport = HTTPTunnelTransport(self.reactor, agent, pool,
                                        self.base_url + b"/" + session_id.encode("ascii"),
                                        HostnameAddress(self.uri.host.encode("utf-8"),
                                                        self.uri.port),
                                        self.mode)
        proto = factory.buildProtocol(transport.getPeer())
        if proto is None:
            yield transport._close(None, delete=True)
            raise error.ConnectError("factory refused the connection")
        transport.protocol = proto
        proto.makeConnection(transport)
        transport._poll()
        return proto


class _Downstream:
    """Receives one GET body into the tunnel's protocol."""

    def __init__(self, tunnel, done):
        self.tunnel = tunnel
        self.done = done
        self.transport = None

    def makeConnection(self, transport):
        self.transport = transport
        self.tunnel._body_transport = transport

    def dataReceived(self, data):
        tunnel = self.tunnel
        if not tunnel.closed and tunnel.protocol is not None:
            tunnel.protocol.dataReceived(data)

    def connectionLost(self, reason):
        self.tunnel._body_transport = None
        self.done.callback([reason])


@implementer(ITransport)
class HTTPTunnelTransport:
    """The transport of a client protocol running over the HTTP tunnel."""

    log = Logger()

    def __init__(self, reactor, agent, pool, url, peer, mode=STREAM):
        self.reactor = reactor
        self.agent = agent
        self.pool = pool
        self.url = url
        self.peer = peer
        self.mode = mode
        self.protocol = None
        self.closed = False          # no more traffic
        self.disconnecting = False   # loseConnection called: flush, then close
        self._outgoing = []
        self._outgoing_size = 0
        self._seq = 0
        self._post = None            # Deferred of the POST in flight
        self._post_body = None       # its body, until the router took it
        self._aborted = False        # abortConnection: nothing to keep
        self._get = None             # Deferred: the current GET is over
        self._get_request = None     # Deferred of the GET's response headers
        self._body_transport = None
        self._paused = False
        self._gone = False           # the router said the session is over
        self._finished = None

    # -- ITransport -------------------------------------------------------------

    def write(self, data):
        if self.closed and not self._aborted and not self.disconnecting and data:
            self._outgoing.append(data)  # failing: kept for unsent()
            return
        if self.closed or self.disconnecting or not data:
            return
        self._outgoing.append(data)
        self._outgoing_size += len(data)
        if self._post is None:
            self._send_next()

    def writeSequence(self, data):
        self.write(b"".join(data))

    def loseConnection(self):
        if self.closed or self.disconnecting:
            return
        self.disconnecting = True
        if self._post is None:
            self._close(None, delete=True)

    def abortConnection(self):
        self._aborted = True
        self._outgoing = []
        self._post_body = None
        if self.closed:
            return
        self._close(None, delete=True)

    def unsent(self):
        """The bytes written that no POST delivered (the POST in flight,
        if it failed, then the queue), once the tunnel has failed; b""
        after our own close or abort."""
        if self._aborted or self.disconnecting:
            return b""
        return (self._post_body or b"") + b"".join(self._outgoing)

    def getPeer(self):
        return self.peer

    def getHost(self):
        return HostnameAddress(b"localhost", 0)

    def pauseProducing(self):
        """Stop reading what the router sends (the GET body)."""
        self._paused = True
        if self._body_transport is not None:
            self._body_transport.pauseProducing()

    def resumeProducing(self):
        self._paused = False
        if self._body_transport is not None:
            self._body_transport.resumeProducing()

    # -- upstream ---------------------------------------------------------------

    def _send_next(self):
        chunks, size = [], 0
        while self._outgoing and (not chunks or size + len(self._outgoing[0]) <= POST_BATCH):
            chunk = self._outgoing.pop(0)
            chunks.append(chunk)
            size += len(chunk)
        self._outgoing_size -= size
        self._seq += 1
        self._post_body = b"".join(chunks)
        self._post = self._send_post(self._post_body, self._seq)
        self._post.addCallbacks(self._posted, self._post_failed)

    @defer.inlineCallbacks
    def _send_post(self, body, seq):
        url = self.url + b"?seq=%d" % seq
        headers = Headers({b"content-type": [CONTENT_TYPE]})
        for attempt in range(POST_RETRIES + 1):
            try:
                response = yield self.agent.request(b"POST", url, headers, _Bytes(body))
            except _RETRYABLE:
                if attempt == POST_RETRIES or self.closed:
                    raise
                continue
            text = yield client.readBody(response)
            if response.code != http.NO_CONTENT:
                if response.code == http.NOT_FOUND:
                    self._gone = True
                    raise error.ConnectionDone("the router has ended the HTTP session")
                raise TunnelError(f"POST to the HTTP tunnel failed: {response.code} "
                                  f"{_one_line(text)}")
            return None

    def _posted(self, _):
        self._post = None
        self._post_body = None
        if self.closed:
            return
        if self._outgoing:
            self._send_next()
        elif self.disconnecting:
            self._close(None, delete=True)

    def _post_failed(self, reason):
        self._post = None
        if not self.closed:
            self._close(reason, delete=not self._gone)
        return None

    # -- downstream -------------------------------------------------------------

    def _poll(self):
        if self.closed or self.disconnecting:
            return
        done = self._get = defer.Deferred()
        url = self.url + (b"?mode=poll" if self.mode == POLL else b"")
        d = self._get_request = self.agent.request(b"GET", url)

        def got(response):
            self._get_request = None
            if response.code == http.OK:
                response.deliverBody(_Downstream(self, done))
                if self._paused and self._body_transport is not None:
                    self._body_transport.pauseProducing()
                return
            if response.code == http.NOT_FOUND:
                self._gone = True
                reason = failure.Failure(
                    error.ConnectionDone("the router has ended the HTTP session"))
            else:
                reason = failure.Failure(TunnelError(
                    f"GET from the HTTP tunnel failed: {response.code}"))
            client.readBody(response).addBoth(lambda _: done.callback([reason]))

        def failed(reason):
            self._get_request = None
            done.callback([reason])
        d.addCallbacks(got, failed)
        done.addCallback(self._get_ended, done)

    def _get_ended(self, result, done):
        (reason,) = result
        if self._get is done:
            self._get = None
        if self.closed:
            return None
        if isinstance(reason, failure.Failure) and reason.check(
                client.ResponseDone, http.PotentialDataLoss):
            if self.disconnecting:
                return None
            self._poll()
            return None
        if self.disconnecting and not self._gone:
            return None  # our own close
        self._close(reason if isinstance(reason, failure.Failure) else None,
                    delete=not self._gone)
        return None

    # -- closing ----------------------------------------------------------------

    def _close(self, reason, delete):
        """End the tunnel: stop the GET, hang up, close the connections,
        then tell the protocol. Returns a Deferred."""
        if self._finished is not None:
            return self._finished
        self.closed = True
        self._finished = defer.ensureDeferred(self._closing(reason, delete))
        return self._finished

    async def _closing(self, reason, delete):
        if self._get_request is not None:
            self._get_request.cancel()
        if self._body_transport is not None:
            self._body_transport.stopProducing()
        if self._get is not None:
            await self._get
        if self._post is not None:
            self._post.cancel()
        if delete and not self._gone:
            d = self.agent.request(b"DELETE", self.url)
            d.addCallback(client.readBody)
            timer = self.reactor.callLater(DELETE_TIMEOUT, d.cancel)
            try:
                await d
            except Exception:
                pass  # best effort: the router times abandoned sessions out
            if timer.active():
                timer.cancel()
        await self.pool.closeCachedConnections()
        if reason is None or not isinstance(reason, failure.Failure):
            reason = failure.Failure(error.ConnectionDone("HTTP session closed"))
        elif not reason.check(error.ConnectionDone, error.ConnectionLost):
            reason = failure.Failure(TunnelError(
                f"HTTP tunnel failed: {reason.getErrorMessage()}"))
        if self.protocol is not None:
            self.protocol.connectionLost(reason)
