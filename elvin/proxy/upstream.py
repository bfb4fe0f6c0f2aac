"""The proxy's one connection to its upstream router, kept up.

``Upstream`` is a Twisted service: it connects (to an ``elvin:`` URI, or to
a router found by discovery), tells the ``ProxyCore`` when the connection
comes and goes (``upstream_up`` / ``upstream_down``; the core then makes
every subscription again), hands it every NotifyDeliver, and offers the
core the few requests it makes upstream. The connection's life is the
client's (``elvin.clientcore.lifecycle``, through ``elvin.client``): a lost
connection or a redirection is followed with the client's backoff, for
ever; a first connect that fails is tried again the same way; a
connection that stops answering TestConn is dropped and made again.

Each request sent upstream waits at most ``request_timeout`` seconds
(``upstream-timeout``) for its answer, on the client's own timer
(``Lifecycle.request_timeout``): then its Deferred fails with
RequestTimeout and the connection stays open; what the core does then is
``elvin.proxy.relay``'s, and a late answer goes to the ``late`` handler
given with the request.

The back-off tries at most a second apart; two signs that the router is
back cut the wait short (``retry_now``). While upstream is down, the
router's port is probed every ``probe_interval`` seconds with a bare TCP
connect (closed at once, no Elvin packet); the first that succeeds in an
outage starts a connection attempt at once. And with a ``discoverer``
(router discovery, ERDP and DNS-SD: always with ``upstream = discover``,
with a URI when ``upstream-discovery`` is on), an announcement of the
upstream router -- of the scope sought, or advertising the configured
URI's host and port -- starts one too. Early tries are at most one a
second (a flood of announcements cannot make the proxy dial faster than
its back-off would); a try that fails goes on with the back-off.
"""

from typing import Any, Callable, Optional

from twisted.application import service
from twisted.internet import defer, protocol, task
from twisted.logger import Logger

from elvin.client import connect as client_connect
from elvin.clientcore.state import ConnectionClosed, Reconnect
from elvin.discovery.addresses import is_loopback
from elvin.endpoints import UDP, hostname_endpoint, stack_kind
from elvin.proxy.config import (DEFAULT_UPSTREAM_KEEPALIVE, DEFAULT_UPSTREAM_PROBE,
                                DEFAULT_UPSTREAM_TIMEOUT)
from elvin.uri import ElvinURI

__all__ = ["Upstream", "tcp_probe", "announces"]


def tcp_probe(reactor: Any, timeout: float = 2.0) -> Callable[[ElvinURI], Any]:
    """A probe: ``probe(uri)`` fires True if a TCP connection to the URI's
    host and port opens within ``timeout`` seconds (it is closed at once),
    else False."""

    def probe(uri: ElvinURI) -> Any:
        endpoint = hostname_endpoint(reactor, uri.host, uri.port, timeout=timeout)
        factory: Any = protocol.Factory.forProtocol(protocol.Protocol)
        d = endpoint.connect(factory)

        def opened(proto: Any) -> bool:
            proto.transport.loseConnection()
            return True
        return d.addCallbacks(opened, lambda failure: False)
    return probe


def _place(uri: ElvinURI) -> Any:
    return ("loopback" if is_loopback(uri.host) else uri.host.lower(), uri.port)


def announces(record: Any, uri: Optional[ElvinURI], scope: Optional[str]) -> bool:
    """Is router discovery's ``record`` (``elvin.discovery.cache``) the
    upstream router? With a ``uri``: one of its usable URIs has that host
    (any loopback address for a loopback one) and port. Without (``upstream
    = discover``): it is of ``scope``, or, with none, a default router, and
    has a usable URI."""
    usable = record.usable_uris()
    if uri is not None:
        return any(_place(u) == _place(uri) for u in usable)
    if not usable:
        return False
    return record.scope == scope if scope is not None else bool(record.default)


def _halt(loop: Optional[task.LoopingCall]) -> None:
    """Stop ``loop`` if it runs."""
    if loop is not None and loop.running:
        loop.stop()


class Upstream(service.Service):
    """Keeps the proxy connected upstream (see the module docstring).

    ``connect_args``: keyword arguments for ``elvin.client.connect`` (the
    URI, or discovery's scope; TLS settings). ``keepalive``: seconds
    between liveness checks (0: none). ``request_timeout``: seconds each
    request waits for its answer (0: for ever). ``probe_interval``: seconds between
    probes of the router's port while it is away (0: none); ``probe(uri)``
    gives a Deferred firing True if the port accepts (default
    ``tcp_probe``). ``discoverer``: an unstarted
    ``elvin.discovery.Discoverer`` to hear the router announced by (it is
    started and stopped with this service). ``connect``: what makes the
    connection (``elvin.client.connect``; tests give another).
    """

    log = Logger()

    def __init__(self, reactor: Any, core: Any = None, connect_args: Any = None,
                 reconnect: Optional[Reconnect] = None,
                 keepalive: float = DEFAULT_UPSTREAM_KEEPALIVE,
                 request_timeout: float = DEFAULT_UPSTREAM_TIMEOUT,
                 probe_interval: float = DEFAULT_UPSTREAM_PROBE, probe: Any = None,
                 discoverer: Any = None, connect: Any = None) -> None:
        self.reactor = reactor
        self.core = core
        self.connect_args = dict(connect_args or {})
        # Tries at most a second apart (jitter +-25%): back within 2 s of the
        # router's return, for one connection attempt a second while it is away.
        self.reconnect = reconnect or Reconnect(maximum=1.0)
        self.keepalive = keepalive
        self.request_timeout = request_timeout
        self.probe_interval = probe_interval
        self.probe = probe or tcp_probe(reactor)
        self.discoverer = discoverer
        self._connect = connect or client_connect
        self.connection: Any = None
        self.is_up = False
        self.connects = 0
        #: tries made at once because a probe or an announcement said the
        #: router was back
        self.early_retries = 0
        self._stopping = False
        self._running: Any = None
        self._sleep: Any = None
        self._wake: Any = None
        self._checker: Any = None
        self._prober: Any = None
        self._probing: Any = None
        #: a probe's success has been acted on in this outage
        self._probe_used = False
        self._last_early = float("-inf")

    def startService(self) -> None:
        super().startService()
        self._stopping = False
        self._probe_used = False
        self._running = defer.ensureDeferred(self._run())

    def _discovering(self) -> bool:
        """Is the router found by discovery (no URI configured)?"""
        args = self.connect_args
        return args.get("uri") is None and (
            args.get("scope") is not None or bool(args.get("discover")))

    async def _start_discoverer(self) -> None:
        discoverer = self.discoverer
        if discoverer is None:
            return
        try:
            await discoverer.start()
        except Exception as e:
            self.log.warn("upstream: cannot hear router discovery ({why}); the router's "
                          "return is noticed by probe and back-off only", why=str(e))
            self.discoverer = None
            return
        discoverer.cache.listeners.append(self._heard)

    async def _run(self) -> None:
        """Make the first session (by discovery, tried again with the
        policy's delays), then leave its life to the client's lifecycle:
        it reconnects, follows redirections and, with a scope, fails over
        to other routers discovery finds."""
        await self._start_discoverer()
        delays = self.reconnect.delays()
        scope = self._discovering()
        args = dict(self.connect_args)
        if scope and self.discoverer is not None:
            args["discoverer"] = self.discoverer
        while not self._stopping:
            try:
                connection = await self._connect(reactor=self.reactor, reconnect=self.reconnect,
                                                 failover=scope, pending_size=0, **args)
            except Exception as e:
                if self._stopping:
                    return
                delay = next(delays, self.reconnect.maximum)
                self.log.warn("cannot connect upstream ({why}); trying again in "
                              "{delay:.1f} s", why=str(e), delay=delay)
                self._start_probes()
                try:
                    await self._nap(delay)
                except defer.CancelledError:
                    return
                continue
            if self._stopping:
                connection.close().addErrback(lambda f: None)   # nothing was sent
                return
            self.connection = connection
            # A request to upstream waits request_timeout for its answer; the
            # core logs each one given up, naming the session.
            connection.lifecycle.request_timeout = self.request_timeout
            connection.lifecycle.log_timeouts = False
            connection.on_notification = self._notification
            connection.on_connection_lost = lambda error: self._down(f"lost ({error})")
            connection.on_redirect = lambda uri: self._down(f"redirected to {uri}")
            connection.on_reconnected = self._up
            self._up(connection)
            await connection.disconnected          # the session ended for good
            self._down("ended")
            self.connection = None
            delays = self.reconnect.delays()

    def _nap(self, delay: float) -> Any:
        """A Deferred firing after ``delay`` seconds, or sooner at
        ``_router_back`` (cancelling it cancels the wait)."""
        def cancel(d: Any) -> None:
            if self._wake is not None and self._wake.active():
                self._wake.cancel()
        self._sleep = defer.Deferred(cancel)
        self._wake = self.reactor.callLater(delay, self._woken)
        return self._sleep

    def _woken(self) -> None:
        if self._wake is not None and self._wake.active():
            self._wake.cancel()
        self._wake = None
        sleep, self._sleep = self._sleep, None
        if sleep is not None and not sleep.called:
            sleep.callback(None)

    def _up(self, connection: Any) -> None:
        if self._stopping or self.is_up:
            return
        self.is_up = True
        self.connects += 1
        self._stop_probes()
        self.log.info("connected upstream to {uri}", uri=connection.uri)
        connection.on_dropwarn = self.core.upstream_dropwarn
        self.core.upstream_up()
        self._start_checks(connection)

    def _down(self, why: str) -> None:
        self._stop_checks()
        if not self.is_up:
            return
        self.is_up = False
        self.log.info("upstream connection {why}", why=why)
        if not self._stopping:
            self._probe_used = False          # a new outage
            self._start_probes()
            self.core.upstream_down()

    # -- noticing the router's return ----------------------------------------

    def _router_back(self, why: str) -> bool:
        """A probe or an announcement says the router is back: try now if
        waiting out a back-off delay (at most once a second). True if a
        try started."""
        if self._stopping or self.is_up:
            return False
        now = self.reactor.seconds()
        if now - self._last_early < self.reconnect.maximum:
            return False
        connection = self.connection
        if connection is not None:
            started = bool(connection.retry_now())
        else:
            started = self._sleep is not None and not self._sleep.called
            if started:
                self._woken()
        if started:
            self._last_early = now
            self.early_retries += 1
            self.log.info("upstream router back ({why}): connecting now", why=why)
        return started

    def _target(self) -> Optional[ElvinURI]:
        """The URI to probe: the connection's router, or the one configured
        (None when discovery has not found one yet, or not a stream)."""
        uri = self.connection.uri if self.connection is not None else self.connect_args.get("uri")
        if uri is None:
            return None
        uri = uri if isinstance(uri, ElvinURI) else ElvinURI(str(uri))
        try:
            if stack_kind(uri) == UDP:
                return None
        except Exception:
            return None
        return uri

    def _start_probes(self) -> None:
        if (not self.probe_interval or self._probe_used or self._stopping
                or (self._prober is not None and self._prober.running)):
            return
        self._prober = self._every(self.probe_interval, self._probe_once)

    def _stop_probes(self) -> None:
        _halt(self._prober)
        self._prober = None
        probing, self._probing = self._probing, None
        if probing is not None and not probing.called:
            probing.cancel()

    def _probe_once(self) -> None:
        if self._probing is not None or self.is_up or self._stopping:
            return                            # one at a time
        uri = self._target()
        if uri is None:
            return
        d = self._probing = defer.maybeDeferred(self.probe, uri)

        def answered(accepts: Any) -> None:
            if self._probing is d:
                self._probing = None
            if accepts is True and self._router_back(f"{uri.host}:{uri.port} accepts"):
                self._probe_used = True       # once an outage: then the back-off
                self._stop_probes()
        d.addCallbacks(answered, lambda failure: None)

    def _heard(self, event: str, record: Any) -> None:
        """Router discovery's cache changed (``elvin.discovery.cache``)."""
        if event == "withdrawn" or self.is_up or self._stopping:
            return
        discovering = self._discovering()
        uri = None if discovering else self._target()
        if (discovering or uri is not None) and announces(
                record, uri, self.connect_args.get("scope")):
            self._router_back(f"announced by router discovery as {record.name}")

    def _start_checks(self, connection: Any) -> None:
        if not self.keepalive:
            return

        def check() -> None:
            d = connection.test_connection()
            d.addTimeout(self.keepalive, self.reactor)

            def dead(failure: Any) -> None:
                if connection is self.connection and self.is_up and not self._stopping:
                    self.log.warn("upstream stopped answering; reconnecting")
                    protocol = connection.protocol
                    if protocol is not None and protocol.transport is not None:
                        protocol.transport.abortConnection()
            d.addErrback(dead)
        self._checker = self._every(self.keepalive, check)

    def _stop_checks(self) -> None:
        _halt(self._checker)
        self._checker = None

    def _every(self, seconds: float, f: Callable[[], None]) -> task.LoopingCall:
        """``f()`` every ``seconds`` on this service's reactor, from one
        interval on."""
        loop = task.LoopingCall(f)
        loop.clock = self.reactor
        loop.start(seconds, now=False)
        return loop

    def _notification(self, note: Any) -> None:
        self.core.upstream_notification(note, note.secure, note.insecure)

    def stopService(self) -> Any:
        super().stopService()
        self._stopping = True
        self._stop_checks()
        self._stop_probes()
        if self._sleep is not None and not self._sleep.called:
            self._sleep.cancel()
        connection, self.connection = self.connection, None
        self.is_up = False
        waits = []
        if connection is not None:
            d = connection.close()
            d.addTimeout(2, self.reactor)
            d.addErrback(lambda f: None)
            waits.append(d)
        discoverer = self.discoverer
        if discoverer is not None and self._heard in discoverer.cache.listeners:
            discoverer.cache.listeners.remove(self._heard)
            waits.append(defer.maybeDeferred(discoverer.stop).addErrback(lambda f: None))
        if not waits:
            return None
        return defer.gatherResults(waits).addCallback(lambda _: None)

    # -- what the core asks of upstream ----------------------------------------

    def _request(self, make_packet: Any, late: Any = None) -> Any:
        """Send a request; its Deferred fires with the reply, or fails with
        NackError, ConnectionClosed or RequestTimeout (then ``late(reply)``
        takes a reply that still comes; without it a late SubRply to a
        SubAddRqst is undone by the client core)."""
        if self.connection is None or not self.is_up:
            return defer.fail(ConnectionClosed("upstream is not connected"))
        return self.connection.call(make_packet, late)

    def subscribe(self, expression: str, accept_insecure: bool, keys: Any,
                  late: Any = None) -> Any:
        connection = self.connection
        make = connection.sub_add_rqst(expression, accept_insecure, keys) if connection else None
        return self._request(make, late).addCallback(lambda reply: reply.subscription_id)

    def modify(self, upstream_id: int, expression: str, accept_insecure: bool, add_keys: Any,
               del_keys: Any, late: Any = None) -> Any:
        connection = self.connection
        make = (connection.sub_mod_rqst(upstream_id, expression, accept_insecure,
                                        add_keys, del_keys) if connection else None)
        return self._request(make, late).addCallback(lambda reply: reply.subscription_id)

    def unsubscribe(self, upstream_id: int) -> Any:
        connection = self.connection
        make = connection.sub_del_rqst(upstream_id) if connection else None
        return self._request(make)

    def notify(self, attributes: Any, deliver_insecure: bool, keys: Any) -> None:
        connection = self.connection
        if connection is None or not self.is_up:
            raise ConnectionClosed("upstream is not connected")
        try:
            connection.emit(attributes, deliver_insecure, keys)
        except ValueError as e:
            # What the router would end the upstream session for (larger
            # than its Packet.Max-Length): not forwarded, the session kept.
            self.log.warn("a client's notification not forwarded upstream: {why}", why=str(e))
