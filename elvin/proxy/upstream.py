"""The proxy's one connection to its upstream router, kept up.

``Upstream`` is a Twisted service: it connects (to an ``elvin:`` URI, or to
a router found by discovery), tells the ``ProxyCore`` when the connection
comes and goes (``upstream_up`` / ``upstream_down``; the core then makes
every subscription again), hands it every NotifyDeliver, and offers the
core the few requests it makes upstream. A lost or refused connection is
tried again with backoff (``elvin.client.state.Reconnect``), for ever; a
connection that stops answering TestConn is dropped and made again.
"""

from twisted.application import service
from twisted.internet import defer, task
from twisted.logger import Logger

from elvin.client import connect
from elvin.client.state import ConnectionClosed, Reconnect

__all__ = ["Upstream"]


class Upstream(service.Service):
    """Keeps the proxy connected upstream (see the module docstring).

    ``connect_args``: keyword arguments for ``elvin.client.connect`` (the
    URI, or discovery's scope; TLS settings). ``keepalive``: seconds
    between liveness checks (0: none).
    """

    log = Logger()

    def __init__(self, reactor, core=None, connect_args=None, reconnect=None,
                 keepalive=30.0):
        self.reactor = reactor
        self.core = core
        self.connect_args = dict(connect_args or {})
        self.reconnect = reconnect or Reconnect(initial=0.5, maximum=30.0)
        self.keepalive = keepalive
        self.connection = None
        self.is_up = False
        self.connects = 0
        self._stopping = False
        self._running = None
        self._sleep = None
        self._checker = None

    def startService(self):
        super().startService()
        self._stopping = False
        self._running = defer.ensureDeferred(self._run())

    async def _run(self):
        delays = self.reconnect.delays()
        while not self._stopping:
            try:
                connection = await connect(reactor=self.reactor, **self.connect_args)
            except Exception as e:
                delay = next(delays)
                self.log.warn("cannot connect upstream ({why}); trying again in "
                              "{delay:.1f} s", why=e, delay=delay)
                self._sleep = task.deferLater(self.reactor, delay, lambda: None)
                try:
                    await self._sleep
                except defer.CancelledError:
                    return
                continue
            delays = self.reconnect.delays()
            if self._stopping:
                connection.close()
                return
            self.connection = connection
            connection.on_notification = self._notification
            self.is_up = True
            self.connects += 1
            self.log.info("connected upstream to {uri}", uri=connection.uri)
            self.core.upstream_up()
            self._start_checks(connection)
            await connection.disconnected
            self._stop_checks()
            self.is_up = False
            self.connection = None
            if not self._stopping:
                self.core.upstream_down()

    def _start_checks(self, connection):
        if not self.keepalive:
            return

        def check():
            d = connection.test_connection()
            d.addTimeout(self.keepalive, self.reactor)

            def dead(failure):
                if connection is self.connection and not self._stopping:
                    self.log.warn("upstream stopped answering; reconnecting")
                    protocol = connection.protocol
                    if protocol is not None and protocol.transport is not None:
                        protocol.transport.abortConnection()
            d.addErrback(dead)
        self._checker = task.LoopingCall(check)
        self._checker.clock = self.reactor
        self._checker.start(self.keepalive, now=False)

    def _stop_checks(self):
        if self._checker is not None and self._checker.running:
            self._checker.stop()
        self._checker = None

    def _notification(self, note):
        self.core.upstream_notification(note, note.secure, note.insecure)

    def stopService(self):
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

    def _request(self, make_packet):
        if self.connection is None:
            return defer.fail(ConnectionClosed("upstream is not connected"))
        return self.connection.call(make_packet)

    def subscribe(self, expression, accept_insecure, keys):
        connection = self.connection
        make = connection.sub_add_rqst(expression, accept_insecure, keys) if connection else None
        return self._request(make).addCallback(lambda reply: reply.subscription_id)

    def modify(self, upstream_id, expression, accept_insecure, add_keys, del_keys):
        connection = self.connection
        make = (connection.sub_mod_rqst(upstream_id, expression, accept_insecure,
                                        add_keys, del_keys) if connection else None)
        return self._request(make).addCallback(lambda reply: reply.subscription_id)

    def unsubscribe(self, upstream_id):
        connection = self.connection
        make = connection.sub_del_rqst(upstream_id) if connection else None
        return self._request(make)

    def notify(self, attributes, deliver_insecure, keys):
        connection = self.connection
        if connection is None:
            raise ConnectionClosed("upstream is not connected")
        connection.emit(attributes, deliver_insecure, keys)
