"""The ``http,none,xdr`` transport: Elvin sessions tunnelled through HTTP.

For clients that can only reach the router through HTTP proxies or
firewalls. The bytes inside the tunnel are exactly the bytes of the TCP
transport -- packets behind their 4-byte length header (8.2.1) -- and the
router side of every tunnel is an ordinary ``ElvinServerProtocol`` (the
listener's factory's own kind: the proxy's for the proxy's listeners) whose
transport is a :class:`TunnelTransport`, so sessions, limits, the send
queue and its drop policies, timeouts and shutdown all behave exactly as
on TCP. docs/protocols.md has the wire description; in short::

    POST   /elvin/session            -> 201, body: session id (text)
    POST   /elvin/session/<id>?seq=N    body: framed packets  -> 204
    GET    /elvin/session/<id>[?mode=poll]
                                     -> 200, chunked body: framed packets
    DELETE /elvin/session/<id>       -> 204 (the client hangs up)

* Upstream, each POST body is fed to the protocol as if read from a
  socket. ``seq`` numbers a session's POSTs from 1 so a client may resend
  one whose response it lost: a repeat is acknowledged and ignored, a gap
  is refused with 409 (the session continues). A body still arriving
  counts against the router's receive budget (``max-receive-memory``),
  as an unfinished frame on TCP does; the bodies holding the most have
  their connections reset when it runs out.
* Downstream, a GET attaches to the session and receives what the router
  sends. With no GET attached the protocol is paused, exactly like a TCP
  socket that is not draining: packets wait in the session's SendQueue
  under its Send-Queue.Max-Length and drop policy. ``mode=stream`` (the
  default) keeps the response open, streaming packets as they come, until
  ``poll_timeout`` seconds have passed; ``mode=poll`` ends the response as
  soon as it has carried some packets. Either way the client simply
  issues the next GET. A newer GET replaces an older one (which is ended).
* A GET whose connection is lost after packets were written to it may
  have lost them, so the session is closed, as a reset TCP connection
  would close it; one lost before anything was written is just detached.
* A session with no GET attached and no POST for ``session_timeout``
  seconds is abandoned: it ends as if its TCP connection had been lost.
  The timers run on an injectable clock.
* When the router closes the session (DisconnRply, Disconn, a protocol
  violation, connect timeout) the GET is ended and the id forgotten: any
  further request for it gets 404, which tells the client the session is
  over.
* Session ids are 192 random bits and are the only credential of a
  session, so request URLs are never logged.
* Tunnels hold no socket, so the listener's gate does not count them.
  They are capped at the router's ``max-connections`` (as it is once fitted
  to the open-file limit, not as configured), and those that have not sent
  ConnRqst yet at a quarter of that: at either cap the oldest such tunnel
  is closed to make room (``ElvinHTTPSite.closed_connecting``), so a flood
  of empty ``POST /elvin/session`` cannot fill the router's channels and
  lock out every client, and a client whose first POST carries ConnRqst is
  always admitted.
* Request bodies are kept in memory, where the receive budget counts
  them, never in temporary files: twisted.web would open one per body of
  100,000 bytes or more as soon as its headers arrived, an open file the
  listener's gate does not see and the receive budget does not count.
"""

import io
import secrets

from twisted.internet import error
from twisted.internet.interfaces import IConsumer, IPushProducer, ITransport
from twisted.logger import Logger
from twisted.python import failure
from twisted.web import http, resource, server
from zope.interface import implementer

from elvin.protocols.gate import AdmittedHTTPChannel
from elvin.protocols.framing import peer_text, receive_budget_of
from elvin.protocols.server import ElvinServerProtocol

__all__ = ["ElvinHTTPSite", "TunnelTransport", "TunnelServerProtocol", "TunnelHTTPChannel",
           "tunnel_protocol", "REQUEST_TIMEOUT", "REQUEST_MIN_RATE",
           "SESSION_PATH", "STREAM", "POLL",
           "DEFAULT_SESSION_TIMEOUT", "DEFAULT_POLL_TIMEOUT"]

#: The URL path of the session collection.
SESSION_PATH = b"/elvin/session"

STREAM, POLL = "stream", "poll"

DEFAULT_SESSION_TIMEOUT = 60.0
DEFAULT_POLL_TIMEOUT = 20.0

#: Content type of tunnelled (framed XDR) bodies.
CONTENT_TYPE = b"application/x-elvin-xdr"

#: Upper bound on a POST body: the largest Packet.Max-Length a session may
#: negotiate (64 MiB), its header, and room for other frames batched with it.
MAX_BODY = (64 << 20) + 4 + (64 << 10)


class TunnelAbandoned(error.ConnectionLost):
    """No request arrived for a session for its whole session timeout."""


@implementer(ITransport, IConsumer, IPushProducer)
class TunnelTransport:
    """The transport of one tunnelled session's ElvinServerProtocol.

    It is the protocol's consumer (the protocol registers itself as a push
    producer, as on TCP) and the producer for the attached GET response.
    """

    log = Logger()
    disconnecting = False

    def __init__(self, site, session_id, peer, host):
        self.site = site
        self.session_id = session_id
        self._peer = peer
        self._host = host
        self.peer_text = f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"
        self.protocol = None
        self.producer = None
        self.closed = False
        self.next_seq = 1
        self.down = None          # the attached GET request
        self.down_mode = STREAM
        self.down_wrote = False
        self._draining = False
        self._pending = []        # written with no GET attached (not expected)
        self._hold_timer = None
        self._idle_timer = None

    # -- ITransport (used by the protocol) ------------------------------------

    def write(self, data):
        if self.closed or not data:
            return
        request = self.down
        if request is None:
            self._pending.append(data)
            return
        request.write(data)
        self.down_wrote = True
        if self.down_mode == POLL and not self._draining:
            self._pause_protocol()
            self._end_downstream()

    def writeSequence(self, data):
        self.write(b"".join(data))

    def loseConnection(self):
        """The router closes the session after flushing (the protocol only
        calls this once its queue is empty)."""
        self._shutdown(error.ConnectionDone("session closed by the router"))

    def abortConnection(self):
        self._shutdown(error.ConnectionAborted("session aborted by the router"))

    def getPeer(self):
        return self._peer

    def getHost(self):
        return self._host

    # -- IConsumer ------------------------------------------------------------

    def registerProducer(self, producer, streaming):
        self.producer = producer
        if self.down is None:
            producer.pauseProducing()

    def unregisterProducer(self):
        self.producer = None

    def _pause_protocol(self):
        if self.producer is not None:
            self.producer.pauseProducing()

    def _resume_protocol(self):
        if self.producer is not None:
            self.producer.resumeProducing()

    # -- IPushProducer (for the GET response) -----------------------------------

    def pauseProducing(self):
        self._pause_protocol()

    def resumeProducing(self):
        if self.down is not None and not self.closed:
            self._resume_protocol()

    def stopProducing(self):
        """The GET's connection went away; notifyFinish handles it."""

    # -- requests -------------------------------------------------------------

    def received(self, body):
        """A POST body: framed packets, as if read from the socket."""
        if self.down is None:
            self._start_idle_timer()
        if body:
            self.protocol.dataReceived(body)
            session = self.protocol.session
            if session is not None and session.state == session.CONNECTED:
                self.site.connecting.pop(self.session_id, None)

    def attach(self, request, mode):
        """A GET: send what the router has for the client on ``request``."""
        if self.down is not None:
            self._end_downstream()
        self._cancel(self._idle_timer)
        self._idle_timer = None
        self.down = request
        self.down_mode = mode
        self.down_wrote = False
        request.setResponseCode(http.OK)
        request.setHeader(b"content-type", CONTENT_TYPE)
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"x-accel-buffering", b"no")  # nginx: do not buffer
        request.registerProducer(self, True)
        request.notifyFinish().addBoth(self._downstream_finished, request)
        request.write(b"")  # headers now: the client knows it is attached
        self._hold_timer = self.site.clock.callLater(
            self.site.poll_timeout, self._hold_expired, request)
        pending, self._pending = self._pending, []
        self._draining = True
        try:
            for data in pending:
                self.write(data)
            self._resume_protocol()  # flushes the send queue into the response
        finally:
            self._draining = False
        if self.down is request and mode == POLL and self.down_wrote:
            self._pause_protocol()
            self._end_downstream()

    def client_closed(self):
        """DELETE: the client hung up, like closing its TCP connection."""
        self._shutdown(error.ConnectionDone("client closed the HTTP session"))

    # -- internals ----------------------------------------------------------

    def _end_downstream(self):
        request, self.down = self.down, None
        self._cancel(self._hold_timer)
        self._hold_timer = None
        self._pause_protocol()
        if request is not None:
            request.unregisterProducer()
            request.finish()
        if not self.closed:
            self._start_idle_timer()

    def _downstream_finished(self, result, request):
        if self.down is not request:
            return None  # we ended it ourselves
        # The client's connection went away in the middle of the response.
        self.down = None
        self._cancel(self._hold_timer)
        self._hold_timer = None
        self._pause_protocol()
        if self.down_wrote:
            self.log.info("HTTP tunnel from {peer}: response lost with data in it; "
                          "closing the session", peer=self.peer_text)
            self._shutdown(error.ConnectionLost("HTTP response lost in transit"))
        else:
            self._start_idle_timer()
        return None

    def _hold_expired(self, request):
        self._hold_timer = None
        if self.down is request:
            self._end_downstream()

    def _start_idle_timer(self):
        self._cancel(self._idle_timer)
        self._idle_timer = self.site.clock.callLater(self.site.session_timeout,
                                                     self._abandoned)

    def _abandoned(self):
        self._idle_timer = None
        self.log.info("HTTP tunnel from {peer} abandoned after {timeout}s",
                      peer=self.peer_text, timeout=self.site.session_timeout)
        self._shutdown(TunnelAbandoned("HTTP session abandoned"))

    @staticmethod
    def _cancel(call):
        if call is not None and call.active():
            call.cancel()

    def _shutdown(self, reason):
        if self.closed:
            return
        self.closed = True
        self.disconnecting = True
        self.site.tunnels.pop(self.session_id, None)
        self.site.connecting.pop(self.session_id, None)
        self._cancel(self._idle_timer)
        self._idle_timer = None
        if self.down is not None:
            self._end_downstream()
        self._pending = []
        if self.protocol is not None:
            self.protocol.connectionLost(failure.Failure(reason))


class TunnelServerProtocol(ElvinServerProtocol):
    """ElvinServerProtocol for a tunnel: nothing else differs but idleness.

    Between GETs the protocol is paused, yet nothing is stuck on its way
    to the client: with an empty queue the session is idle and answers
    TestConn (the reply waits for the next GET), as an idle TCP session
    would. Paused by the attached GET's connection, it is not idle.
    """

    #: What ``elvin.ops.status.transport_of`` reports for its session.
    transport_kind = "http"
    #: The tunnel's pauseProducing pauses our writing (its GET), not its
    #: POSTs: a cut turn's input just waits, and POSTs meanwhile after it.
    reading_pausable = False

    def is_idle(self):
        return not self.queue and (not self.paused or self.transport.down is None)


def tunnel_protocol(factory):
    """The protocol class serving one tunnel for ``factory``: its
    ``tunnel_protocol`` if it has one (a TunnelServerProtocol subclass
    that is also the factory's own protocol, as the proxy's is), else
    TunnelServerProtocol."""
    return getattr(factory, "tunnel_protocol", None) or TunnelServerProtocol


def origin_form(target):
    """A request target in origin form (``/path?query``): RFC 9112 3.2.2
    says a server MUST accept the absolute-form (``http://host:port/path``),
    which HTTP proxies forward as they received it; twisted.web would
    look the whole URL up as a path (404)."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return target
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i != -1),
              default=len(rest))
    path = rest[cut:]
    return path if path.startswith(b"/") else b"/" + path


class _LimitedRequest(server.Request):
    """A Request that stops storing a body past MAX_BODY bytes, and whose
    body, until it is complete, counts against the router's receive budget
    (``max-receive-memory``) like an unfinished frame on TCP."""

    body_too_large = False
    _body_size = 0
    _budget = None

    def gotLength(self, length):
        """In memory whatever the length (twisted.web would open a
        temporary file from 100,000 bytes): what a body holds is counted
        against the receive budget, and a file per body would be an open
        file the listener's gate does not count."""
        self.content = io.BytesIO()

    def handleContentChunk(self, data):
        if self.body_too_large:
            return
        self._body_size += len(data)
        if self._body_size > MAX_BODY:
            self.body_too_large = True
            self._release()
            return
        super().handleContentChunk(data)
        if self._budget is None:
            self._budget = receive_budget_of(self.channel.site.elvin_factory.router)
        self._budget.hold(self, self._body_size)

    def _release(self):
        if self._budget is not None:
            self._budget.hold(self, 0)

    def requestReceived(self, command, path, version):
        self._release()      # the body is complete: it goes to its tunnel now
        super().requestReceived(command, origin_form(path), version)

    def connectionLost(self, reason):
        self._release()
        super().connectionLost(reason)

    def receive_budget_peer(self):
        return peer_text(self.channel.transport)

    def receive_budget_closed(self, held):
        """Out of the receive budget: drop the body and reset the connection."""
        self.body_too_large = True
        self.channel.transport.abortConnection()


#: Seconds an HTTP request has to arrive whole (headers and body), from its
#: first byte (the first request's: from the accept), plus one for every
#: REQUEST_MIN_RATE bytes of it received: a slow link sending a big POST
#: is not cut off, a client trickling bytes to hold a connection is (as
#: Apache's mod_reqtimeout does; twisted.web's idle timer restarts on
#: every byte). The first request's headers have ``connect-timeout``.
REQUEST_TIMEOUT = 60.0
REQUEST_MIN_RATE = 1024


class TunnelHTTPChannel(AdmittedHTTPChannel):
    """The HTTP connection of a tunnel listener, with a deadline for every
    request (``REQUEST_TIMEOUT``) and for the first request's headers (the
    router's ``connect-timeout``, the time a TCP channel has to send
    ConnRqst). A request out of time gets 408 and the connection closes;
    logged and counted (``closed_in_request`` of its admission pool)."""

    #: When the request being received began (the clock's seconds), and
    #: its bytes so far; None between requests.
    _began = None
    _request_bytes = 0
    _headers_done = False
    _first = True
    _deadline = None

    def connectionMade(self):
        super().connectionMade()
        self._begin()

    def _begin(self):
        self._began = self.site.clock.seconds()
        self._request_bytes = 0
        self._headers_done = False
        self._arm(self._next_check(0.0))

    def _arm(self, delay):
        self._deadline = self.site.clock.callLater(delay, self._check)

    def _headers_limit(self):
        """Seconds the first request's headers have (0: no such limit)."""
        return self.site.elvin_factory.connect_timeout if self._first else 0

    def _next_check(self, elapsed):
        """Seconds from now until a limit may be reached."""
        limit = REQUEST_TIMEOUT + self._request_bytes / REQUEST_MIN_RATE
        headers = self._headers_limit()
        if headers and not self._headers_done:
            limit = min(limit, headers)
        return max(limit - elapsed, 0.0)

    def _check(self):
        self._deadline = None
        if self._began is None or self.transport is None:
            return
        elapsed = self.site.clock.seconds() - self._began
        wait = self._next_check(elapsed)
        if wait > 0:
            self._arm(wait)
            return
        headers = self._headers_limit()
        if headers and not self._headers_done:
            why = (f"its first request's headers were not complete within connect-timeout "
                   f"({headers:g} s)")
        else:
            why = (f"a request was not complete after {elapsed:.0f} s ({self._request_bytes} "
                   f"bytes so far; it had {REQUEST_TIMEOUT:g} s, and 1 s more for every "
                   f"{REQUEST_MIN_RATE} bytes)")
        TunnelTransport.log.info("closing HTTP connection from {peer}: {why}",
                                 peer=peer_text(self.transport), why=why)
        ticket = self.admission
        if ticket is not None:
            ticket.pool.requests_timed_out += 1
        self._began = None
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
                             b"Content-Length: 0\r\n\r\n")
        self.transport.loseConnection()

    def _stop(self):
        self._began = None
        call, self._deadline = self._deadline, None
        if call is not None and call.active():
            call.cancel()

    def dataReceived(self, data):
        if self._began is None and not self._handlingRequest:
            self._begin()          # a request's first byte
        if self._began is not None:
            self._request_bytes += len(data)
        super().dataReceived(data)

    def allHeadersReceived(self):
        self._headers_done = True
        super().allHeadersReceived()

    def allContentReceived(self):
        self._stop()
        self._first = False
        super().allContentReceived()

    def connectionLost(self, reason):
        self._stop()
        super().connectionLost(reason)


class SessionResource(resource.Resource):
    """``/elvin/session`` and ``/elvin/session/<id>``."""

    isLeaf = True

    def __init__(self, site):
        super().__init__()
        self.site = site

    def _tunnel(self, request):
        """The tunnel named by the path, or None (response code set)."""
        path = [p for p in request.postpath if p]
        if len(path) != 1:
            request.setResponseCode(http.NOT_FOUND)
            return None
        tunnel = self.site.tunnels.get(path[0].decode("ascii", "replace"))
        if tunnel is None:
            request.setResponseCode(http.NOT_FOUND)
        return tunnel

    @staticmethod
    def _body(request):
        if request.body_too_large:
            request.setResponseCode(http.REQUEST_ENTITY_TOO_LARGE)
            return None
        request.content.seek(0)
        return request.content.read()

    def render_POST(self, request):
        request.setHeader(b"cache-control", b"no-store")
        if not [p for p in request.postpath if p]:
            body = self._body(request)
            if body is None:
                return b""
            tunnel = self.site.open_tunnel(request)
            if tunnel is None or tunnel.closed:   # closed: the router's channel cap
                request.setResponseCode(http.SERVICE_UNAVAILABLE)
                return b"too many sessions\n"
            request.setResponseCode(http.CREATED)
            request.setHeader(b"content-type", b"text/plain; charset=ascii")
            request.setHeader(b"location", SESSION_PATH + b"/" +
                              tunnel.session_id.encode("ascii"))
            tunnel.received(body)
            return tunnel.session_id.encode("ascii")
        tunnel = self._tunnel(request)
        if tunnel is None:
            return b""
        seq = request.args.get(b"seq")
        if seq:
            try:
                number = int(seq[0])
            except ValueError:
                request.setResponseCode(http.BAD_REQUEST)
                return b"bad seq\n"
            if number < tunnel.next_seq:
                request.setResponseCode(http.NO_CONTENT)  # a resend: done already
                return b""
            if number > tunnel.next_seq:
                request.setResponseCode(http.CONFLICT)
                return b"expected seq=%d\n" % tunnel.next_seq
        body = self._body(request)
        if body is None:
            return b""
        tunnel.next_seq += 1
        request.setResponseCode(http.NO_CONTENT)
        tunnel.received(body)
        return b""

    def render_GET(self, request):
        tunnel = self._tunnel(request)
        if tunnel is None:
            return b""
        mode = request.args.get(b"mode", [b"stream"])[0]
        if mode not in (b"stream", b"poll"):
            request.setResponseCode(http.BAD_REQUEST)
            return b"mode must be stream or poll\n"
        tunnel.attach(request, mode.decode("ascii"))
        return server.NOT_DONE_YET

    def render_HEAD(self, request):
        """Refused (405): twisted.web would answer HEAD with render_GET,
        attaching it as the session's GET, so that the packets it carried
        (in headers-only responses, nowhere) were lost."""
        if self._tunnel(request) is None:
            return b""
        request.setResponseCode(http.NOT_ALLOWED)
        request.setHeader(b"allow", b"GET, POST, DELETE")
        return b""

    def render_DELETE(self, request):
        tunnel = self._tunnel(request)
        if tunnel is None:
            return b""
        request.setResponseCode(http.NO_CONTENT)
        tunnel.client_closed()
        return b""


class ElvinHTTPSite(server.Site):
    """The web server of an ``http,none,xdr`` listener.

    ``factory`` is the ElvinServerFactory whose protocols run inside the
    tunnels; ``clock`` (default: the factory's) runs the timeouts.
    ``max_sessions`` (default: the router's max-connections, read at each
    new tunnel) caps how many tunnels may exist at once, ``max_connecting``
    (default: a quarter of that) how many of them may be without ConnRqst;
    at either cap the oldest tunnel without ConnRqst is closed to make room.
    """

    displayTracebacks = False
    noisy = False
    requestFactory = _LimitedRequest
    #: Tells the connection budget which connections serve a request, and
    #: gives each request a deadline.
    protocol = TunnelHTTPChannel

    def __init__(self, factory, session_timeout=DEFAULT_SESSION_TIMEOUT,
                 poll_timeout=DEFAULT_POLL_TIMEOUT, clock=None, max_sessions=None,
                 max_connecting=None):
        root = resource.Resource()
        elvin = resource.Resource()
        root.putChild(b"elvin", elvin)
        elvin.putChild(b"session", SessionResource(self))
        super().__init__(root, parsePOSTFormSubmission=False)
        self.elvin_factory = factory
        self.clock = clock if clock is not None else factory.clock
        self.session_timeout = session_timeout
        self.poll_timeout = poll_timeout
        self._max_sessions = max_sessions
        self._max_connecting = max_connecting
        self.tunnels = {}
        #: Tunnels that have not sent ConnRqst yet, oldest first.
        self.connecting = {}
        #: Tunnels closed to make room for a new one, and when it was logged.
        self.closed_connecting = 0
        self._closed_unlogged = 0
        self._logged_at = None

    @property
    def max_sessions(self):
        """Tunnels at once: ``max_sessions`` if given, else the router's
        max-connections now (it is lowered at start to fit the open-file
        limit, after this site is made)."""
        if self._max_sessions is not None:
            return self._max_sessions
        return self.elvin_factory.router.max_connections

    @max_sessions.setter
    def max_sessions(self, value):
        self._max_sessions = value

    @property
    def max_connecting(self):
        """Tunnels without ConnRqst at once: a quarter of max_sessions."""
        if self._max_connecting is not None:
            return self._max_connecting
        return max(1, self.max_sessions // 4)

    def log(self, request):
        """Session ids in URLs are credentials: no access log."""

    def open_tunnel(self, request):
        if self.connecting and (len(self.connecting) >= self.max_connecting
                                or len(self.tunnels) >= self.max_sessions):
            self._close_oldest_connecting()
        if len(self.tunnels) >= self.max_sessions:
            return None
        session_id = secrets.token_urlsafe(24)
        peer = request.getClientAddress()
        tunnel = TunnelTransport(self, session_id, peer, request.getHost())
        self.tunnels[session_id] = tunnel
        proto = tunnel_protocol(self.elvin_factory)()
        proto.factory = self.elvin_factory
        tunnel.protocol = proto
        self.connecting[session_id] = tunnel
        proto.makeConnection(tunnel)
        if not tunnel.closed:
            tunnel._start_idle_timer()
        return tunnel

    def _close_oldest_connecting(self):
        """Close the oldest tunnel that has not sent ConnRqst, to make room
        for a new one; one log line per 10 s at most."""
        tunnel = next(iter(self.connecting.values()))
        self.connecting.pop(tunnel.session_id, None)
        tunnel.abortConnection()
        self.closed_connecting += 1
        self._closed_unlogged += 1
        now = self.clock.seconds()
        if self._logged_at is None or now - self._logged_at >= 10:
            TunnelTransport.log.warn(
                "HTTP tunnels at their cap ({open} open, {connecting} without ConnRqst, "
                "max {max}): closed {count} without ConnRqst to make room",
                open=len(self.tunnels), connecting=len(self.connecting),
                max=self.max_sessions, count=self._closed_unlogged)
            self._logged_at = now
            self._closed_unlogged = 0

    def close_all(self):
        """Abort every tunnelled session (tests, emergency stop)."""
        for tunnel in list(self.tunnels.values()):
            tunnel.abortConnection()
