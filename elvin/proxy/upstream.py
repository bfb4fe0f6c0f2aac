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
"""

from typing import Any, Optional

from twisted.application import service
from twisted.internet import defer, task
from twisted.logger import Logger

from elvin.client import connect
from elvin.clientcore.state import ConnectionClosed, Reconnect

__all__ = ["Upstream"]


class Upstream(service.Service):
    """Keeps the proxy connected upstream (see the module docstring).

    ``connect_args``: keyword arguments for ``elvin.client.connect`` (the
    URI, or discovery's scope; TLS settings). ``keepalive``: seconds
    between liveness checks (0: none).
    """

    log = Logger()

    def __init__(self, reactor: Any, core: Any = None, connect_args: Any = None,
                 reconnect: Optional[Reconnect] = None, keepalive: float = 30.0) -> None:
        self.reactor = reactor
        self.core = core
        self.connect_args = dict(connect_args or {})
        # Tries at most a second apart (jitter +-25%): back within 2 s of the
        # router's return, for one connection attempt a second while it is away.
        self.reconnect = reconnect or Reconnect(maximum=1.0)
        self.keepalive = keepalive
        self.connection: Any = None
        self.is_up = False
        self.connects = 0
        self._stopping = False
        self._running: Any = None
        self._sleep: Any = None
        self._checker: Any = None

    def startService(self) -> None:
        super().startService()
        self._stopping = False
        self._running = defer.ensureDeferred(self._run())

    async def _run(self) -> None:
        """Make the first session (by discovery, tried again with the
        policy's delays), then leave its life to the client's lifecycle:
        it reconnects, follows redirections and, with a scope, fails over
        to other routers discovery finds."""
        delays = self.reconnect.delays()
        scope = self.connect_args.get("uri") is None and (
            self.connect_args.get("scope") is not None or self.connect_args.get("discover"))
        while not self._stopping:
            try:
                connection = await connect(reactor=self.reactor, reconnect=self.reconnect,
                                           failover=bool(scope), pending_size=0,
                                           **self.connect_args)
            except Exception as e:
                delay = next(delays, self.reconnect.maximum)
                self.log.warn("cannot connect upstream ({why}); trying again in "
                              "{delay:.1f} s", why=e, delay=delay)
                self._sleep = task.deferLater(self.reactor, delay, lambda: None)
                try:
                    await self._sleep
                except defer.CancelledError:
                    return
                continue
            if self._stopping:
                connection.close()
                return
            self.connection = connection
            connection.on_notification = self._notification
            connection.on_connection_lost = lambda error: self._down(f"lost ({error})")
            connection.on_redirect = lambda uri: self._down(f"redirected to {uri}")
            connection.on_reconnected = self._up
            self._up(connection)
            await connection.disconnected          # the session ended for good
            self._down("ended")
            self.connection = None
            delays = self.reconnect.delays()

    def _up(self, connection: Any) -> None:
        if self._stopping or self.is_up:
            return
        self.is_up = True
        self.connects += 1
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
            self.core.upstream_down()

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
        self._checker = task.LoopingCall(check)
        self._checker.clock = self.reactor
        self._checker.start(self.keepalive, now=False)

    def _stop_checks(self) -> None:
        if self._checker is not None and self._checker.running:
            self._checker.stop()
        self._checker = None

    def _notification(self, note: Any) -> None:
        self.core.upstream_notification(note, note.secure, note.insecure)

    def stopService(self) -> Any:
        super().stopService()
        self._stopping = True
        self._stop_checks()
        if self._sleep is not None and not self._sleep.called:
            self._sleep.cancel()
        connection, self.connection = self.connection, None
        self.is_up = False
        if connection is not None:
            d = connection.close()
            d.addTimeout(2, self.reactor)
            d.addErrback(lambda f: None)
            return d
        return None

    # -- what the core asks of upstream ----------------------------------------

    def _request(self, make_packet: Any) -> Any:
        if self.connection is None or not self.is_up:
            return defer.fail(ConnectionClosed("upstream is not connected"))
        return self.connection.call(make_packet)

    def subscribe(self, expression: str, accept_insecure: bool, keys: Any) -> Any:
        connection = self.connection
        make = connection.sub_add_rqst(expression, accept_insecure, keys) if connection else None
        return self._request(make).addCallback(lambda reply: reply.subscription_id)

    def modify(self, upstream_id: int, expression: str, accept_insecure: bool, add_keys: Any,
               del_keys: Any) -> Any:
        connection = self.connection
        make = (connection.sub_mod_rqst(upstream_id, expression, accept_insecure,
                                        add_keys, del_keys) if connection else None)
        return self._request(make).addCallback(lambda reply: reply.subscription_id)

    def unsubscribe(self, upstream_id: int) -> Any:
        connection = self.connection
        make = connection.sub_del_rqst(upstream_id) if connection else None
        return self._request(make)

    def notify(self, attributes: Any, deliver_insecure: bool, keys: Any) -> None:
        connection = self.connection
        if connection is None or not self.is_up:
            raise ConnectionClosed("upstream is not connected")
        connection.emit(attributes, deliver_insecure, keys)
