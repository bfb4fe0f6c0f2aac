"""The Elvin client library (Deferred-based, on Twisted).

    d = elvin.client.connect("elvin://localhost:2917")
    conn = yield d
    sub = yield conn.subscribe('Group == "chat"', on_notification)
    conn.notify({"Group": "chat", "Message": "hello"})
    yield sub.modify('Group == "chat" || Group == "news"')
    yield sub.remove()
    yield conn.close()

Every request returns a Deferred that fires with the reply, or fails with
``NackError`` carrying the router's Nack code, message and arguments.
"""


from typing import (Any, Callable, Dict, Generator, Iterable, List, Mapping, Optional,
                    Sequence, Union)

from twisted.internet import defer, error, protocol, task
from twisted.internet.interfaces import IHandshakeListener
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from elvin.clientcore.lifecycle import (DEFAULT_LIVENESS, DEFAULT_PENDING_SIZE, CancelTimer,
                                        CloseChannel,
                                        ConnectFailedEffect, Connected, Dial, Ended,
                                        HandshakeTimeout, Lifecycle, LifecycleView,
                                        PauseReading, Phase,
                                        ResumeReading, StartTimer, TLS_FIRST_PACKET_DELAY)
from elvin.clientcore import messages
from elvin.clientcore.messages import (TLS_TRUST, TOOLS_TLS_TRUST, shown as _shown,
                                       stack_hint as _stack_hint)
from elvin.clientcore.state import ASK_LIMITS
from elvin.clientcore.state import (ClientState, CloseUnconfirmed, ConnectFailed,
                                    ConnectionClosed, Deframer, EndHook,
                                    NackError,
                                    Notification, PublishBufferFull, QuenchHandlers,
                                    QuenchState, Reconnect, RequestTimeout, AutoQuenchBase,
                                    JoinedSession,
                                    SessionArg, SessionSubscription, changed_keys, proxy_options,
                                    refuse_coroutine, coroutine_result_refused)
from elvin.core.options import OPTIONS
from elvin.keys import Keys, consumer_keys, dual_keys, producer_keys
from elvin.protocols import packets
from elvin.protocols.framing import FramedProtocol
from elvin.protocols.xdr import DecodeError
from elvin.uri import ElvinURI
from elvin.values import normalise

__all__ = ["connect", "connect_discovered", "unotify", "Connection", "ClientSubscription", "ConnectFailed",
           "DEFAULT_CONNECT_TIMEOUT", "ClientQuench", "QuenchState", "AutoQuench", "NackError",
           "ConnectionClosed", "PublishBufferFull", "CloseUnconfirmed", "RequestTimeout",
           "Notification", "Reconnect",
           "SessionSubscription",
           "JoinedSession",
           "Keys", "producer_keys", "consumer_keys", "dual_keys", "ASK_LIMITS"]

DEFAULT_URI = "elvin://localhost:2917"


#: Seconds ``unotify`` keeps a stream channel open after sending.
UNOTIFY_LINGER = 0.1


#: Seconds ``connect`` waits for the channel and for the router's ConnRply.
DEFAULT_CONNECT_TIMEOUT = 10.0


class ClientSubscription(EndHook):
    """A subscription registered with the router. ``on_end(error)`` is
    called once when it ends: None when removed or the program closed the
    connection, else the error (the session was lost)."""

    def __init__(self, connection, sub_id, expression, callback, accept_insecure):
        self.connection = connection
        self.id = sub_id
        self.expression = expression
        self.callback = callback
        self.accept_insecure = accept_insecure
        #: the keys it was subscribed with (subscribed again with them)
        self.keys: Optional[packets.Keys] = None

    def modify(self, expression: Optional[str] = None, accept_insecure: Optional[bool] = None,
               add_keys: Optional[packets.Keys] = None,
               del_keys: Optional[packets.Keys] = None) -> "defer.Deferred[ClientSubscription]":
        """Change the expression and/or insecure flag; Deferred fires with self."""
        return self.connection._modify(self, expression, accept_insecure,
                                       add_keys, del_keys)

    def remove(self) -> "defer.Deferred[None]":
        """Delete the subscription; Deferred fires when the router confirms
        (at once if it was removed already). Cancelled after it went out,
        the router's answer still removes it here."""
        return self.connection._remove(self)

    def _deliver_note(self, note):
        coroutine_result_refused(self.callback(note), self)

    def _end(self, error=None):
        self._ended_with(error)

    def __repr__(self):
        return f"<ClientSubscription {self.id} {self.expression!r}>"


class ClientQuench(QuenchHandlers):
    """A quench registered with the router (see ``Connection.quench``).

    ``on_add(term_id, tree, secure)``, ``on_modify(term_id, tree, secure)``
    and ``on_delete(term_id)`` are called as subscriptions referring to the
    quench's names come, change and go; ``tree`` is the subscription's
    ``elvin.subscription.ast.Node``.
    """

    def modify(self, add_names: Iterable[str] = (), del_names: Iterable[str] = (),
               deliver_insecure: Optional[bool] = None, add_keys: Optional[packets.Keys] = None,
               del_keys: Optional[packets.Keys] = None) -> "defer.Deferred[ClientQuench]":
        """Change the names (and flags/keys); fires with self."""
        return self.connection._modify_quench(self, add_names, del_names,
                                              deliver_insecure, add_keys, del_keys)

    def remove(self) -> "defer.Deferred[None]":
        return self.connection._remove_quench(self)


class AutoQuench(AutoQuenchBase):
    """Auto-quench (the Elvin4 paper): emit only what somebody could want.

    Wraps a Connection: the attribute names of everything emitted through
    ``notify`` are registered as a quench (the quench grows as new names
    appear), and a notification that no known subscription could match is
    silently dropped (counted in ``dropped``). ``ready`` fires once the
    initial registration and its notifications have arrived. Until the
    router has answered a change of names, notifications with the new names
    are dropped: auto-quench errs towards silence.
    """

    def __init__(self, connection, names=(), deliver_insecure=True, keys=None):
        self.connection = connection
        self.state = QuenchState()
        self.names = set(names)
        self.deliver_insecure = deliver_insecure
        self.keys = keys
        self.quench = None
        self.sent = 0
        self.dropped = 0
        self._pending = None
        self.ready: defer.Deferred[AutoQuench] = defer.Deferred()
        if self.names:
            self._sync()
        else:
            self.ready.callback(self)

    def _sync(self):
        """Make the router's quench cover ``names`` (one request at a time)."""
        if self._pending is not None:
            return
        conn = self.connection
        if self.quench is None:
            d = conn.quench(self.names, deliver_insecure=self.deliver_insecure,
                            keys=self.keys, **self.state.callbacks())
            d.addCallback(lambda quench: setattr(self, "quench", quench))
        else:
            missing = self.names - self.quench.names
            if not missing:
                return
            d = self.quench.modify(add_names=missing)
        # The round trip returns after the router's initial notifications.
        d.addCallback(lambda _: conn.test_connection())
        self._pending = d

        def settled(result):
            self._pending = None
            failed = isinstance(result, Exception) or hasattr(result, "value")
            if failed:
                # Before ``ready`` fires: what its callbacks send must find
                # the fallback (``unsupported``) already in place.
                error = getattr(result, "value", result)
                self._registration_failed(
                    error, lambda text: self.connection.log.warn("{text}", text=text))
            if not self.ready.called:
                self.ready.callback(self)
            if not failed:
                self._sync()  # names may have grown meanwhile
            return None
        d.addBoth(settled)



@implementer(IHandshakeListener)
class ElvinClientProtocol(FramedProtocol):
    """Frames, decodes and dispatches packets for one channel of a Connection.

    Over TLS, packets sent before the handshake has ended are held, and
    written ``TLS_FIRST_PACKET_DELAY`` seconds after it, in a write of their
    own (not with the handshake's last message).
    """

    log = Logger()

    #: The router limits what it accepts (Packet.Max-Length), not what it
    #: sends; accept any packet up to the largest it could be configured for.
    max_frame_length = OPTIONS["Packet.Max-Length"].high

    #: Frames held until the TLS handshake has ended (None: not held).
    _held_frames: Optional[list] = None
    _release: Any = None

    def connectionMade(self):
        set_nodelay = getattr(self.transport, "setTcpNoDelay", None)
        if set_nodelay is not None:
            try:
                set_nodelay(True)  # requests and notifications are small
            except OSError:
                pass
        self._waiters: list = []
        if isinstance(self.transport, TLSMemoryBIOProtocol):
            self._held_frames = []
        self.factory.connection._attached(self)

    def handshakeCompleted(self):
        if self._held_frames is not None and self._release is None:
            self._release = self.factory.connection.reactor.callLater(
                TLS_FIRST_PACKET_DELAY, self._send_held)

    def _send_held(self):
        held, self._held_frames = self._held_frames, None
        for data in held or ():
            self.sendFrame(data)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def written(self) -> "defer.Deferred[None]":
        """Fires once what was sent has been written to the transport
        (over TLS, after the handshake); fails with the reason the channel
        was lost if it is lost first."""
        if self._held_frames is None:
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(waiter)
        return waiter

    def dataReceived(self, data):
        if self.factory.connection.first_bytes is None:
            self.factory.connection.first_bytes = data[:16]
        super().dataReceived(data)

    def frameReceived(self, data):
        connection = self.factory.connection
        if connection.protocol is not self:
            return
        try:
            packet = packets.decode(data)
        except DecodeError as e:
            self.log.warn("undecodable packet from router: {why}", why=str(e))
            connection.problem = "not_elvin"
            if self.transport is not None:
                self.transport.abortConnection()
            return
        connection.lifecycle.packet(packet)

    def frameTooLong(self, length):
        self.factory.connection.problem = "not_elvin"
        super().frameTooLong(length)

    def badFrame(self, reason):
        self.factory.connection.problem = "not_elvin"
        super().badFrame(reason)

    def connectionLost(self, reason=None):
        if self._release is not None and self._release.active():
            self._release.cancel()
        waiters, self._waiters = getattr(self, "_waiters", []), []
        super().connectionLost(reason)
        self.factory.connection._lost(reason, self)
        for waiter in waiters:
            waiter.errback(reason if reason is not None else error.ConnectionDone())

    def send(self, packet):
        """Write ``packet``; the bytes it takes (with its header)."""
        data = packets.encode(packet)
        if self._held_frames is not None:
            self._held_frames.append(data)
        else:
            self.sendFrame(data)
        return len(data) + 4


class Connection(LifecycleView, ClientState):
    """A session with an Elvin router (made by ``connect``): the shared
    client core (``elvin.clientcore``) with Deferreds.

    Its life is ``self.lifecycle`` (``elvin.clientcore.lifecycle``); this
    class carries out what the machine asks on the reactor. With
    ``reconnect`` (see ``connect``), a lost channel is not the end of the
    session: ``on_connection_lost(error)`` is called, what the program
    sends waits in a bounded buffer, and the connection dials again with
    backoff, connects with the options and keys it first had, replays its
    key changes and registers its subscriptions and quenches again (new
    router ids, same objects), sends what waited, then calls
    ``on_reconnected(connection)``. ``disconnected`` fires only when the
    session ends for good.
    """

    log = Logger()

    def __init__(self, uri, reactor=None, endpoint=None, reconnect=None, *,
                 retry_connect=False, timeout=None, pending_size=DEFAULT_PENDING_SIZE):
        super().__init__()
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        self.call_later = reactor.callLater
        self.lifecycle = Lifecycle(self, uri, self._execute, reactor.seconds, reconnect,
                                   retry_connect, timeout, pending_size, owner=self)
        self.protocol = None
        self._endpoint = endpoint
        self._endpoint_uri = self.lifecycle.uri
        self._generation = 0
        self._dialling = None
        self._timer = None
        self.disconnected: defer.Deferred[None] = defer.Deferred()
        self._opened: defer.Deferred[Connection] = defer.Deferred(self._cancel_connect)
        self._connect_cancelled = False
        #: What the peer first sent, and whether it was not Elvin framing:
        #: for a message that says what the server at ``uri`` really is.
        self.first_bytes = None
        self.problem = None
        #: Why a bare channel (``unotify``) ended, if not cleanly.
        self.lost_detail = ""
        #: TLS arguments for the endpoint, kept to follow a redirection.
        self._tls_args = {}
        #: ``connect(..., failover=True)``: when our router is gone, ask
        #: router discovery for others (in this scope, with this discoverer).
        self.failover = False
        self._failover_scope = None
        self._failover_discoverer = None
        self._records = {}
        self.router = None

    def _cancel_connect(self, opened: "defer.Deferred[Connection]") -> None:
        """``connect``'s Deferred was cancelled (``cancel()``, ``addTimeout``):
        give up the dial or handshake; the Deferred fails with
        CancelledError (``addTimeout``: TimeoutError), not ConnectFailed."""
        self._connect_cancelled = True
        self.lifecycle.close()

    #: The name the command-line tools read.
    @property
    def _closed(self):
        return self.lifecycle.is_closed

    # -- the machine's effects -------------------------------------------------

    def _execute(self, effect):
        kind = type(effect)
        if kind is Dial:
            self._generation += 1
            self._dial(effect.uri, self._generation)
        elif kind is StartTimer:
            self._cancel_timer()
            self._timer = self.reactor.callLater(effect.delay, self._timer_fired)
        elif kind is CancelTimer:
            self._cancel_timer()
        elif kind is CloseChannel:
            protocol = self.protocol
            if effect.abort:
                self.protocol = None
                self._generation += 1
                dialling, self._dialling = self._dialling, None
                if dialling is not None and not dialling.called:
                    dialling.cancel()
                if protocol is not None and protocol.transport is not None:
                    protocol.transport.abortConnection()
            elif protocol is not None and protocol.transport is not None:
                protocol.transport.loseConnection()
        elif kind is PauseReading or kind is ResumeReading:
            transport = getattr(self.protocol, "transport", None)
            if transport is not None:
                (transport.pauseProducing if kind is PauseReading
                 else transport.resumeProducing)()
        elif kind is Connected:
            if not self._opened.called:
                self._opened.callback(self)
        elif kind is ConnectFailedEffect:
            if not self._opened.called and not self._connect_cancelled:
                self._opened.errback(effect.cause)
            self._finish()
        elif kind is Ended:
            if not self._opened.called:
                self._opened.errback(ConnectionClosed("connection is closed"))
            self._finish()

    def _cancel_timer(self):
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _timer_fired(self):
        self._timer = None
        self.lifecycle.timer_fired()

    def _finish(self):
        if not self.disconnected.called:
            self.disconnected.callback(None)

    def _dial(self, uri, generation):
        if self._endpoint is None or uri != self._endpoint_uri:
            self._endpoint = _endpoint(self.reactor, uri, self._tls_args)
            self._endpoint_uri = uri
        d = self._endpoint.connect(_ClientFactory(self, generation))
        self._dialling = d

        def failed(failure):
            if generation != self._generation:
                return None               # given up meanwhile
            if self.failover and self.lifecycle.established:
                return defer.ensureDeferred(self._discover_more()).addBoth(
                    lambda _: self.lifecycle.dial_failed(failure.value)
                    if generation == self._generation else None)
            self.lifecycle.dial_failed(failure.value)
            return None
        d.addErrback(failed)
        d.addErrback(lambda f: self.log.failure("dialling {uri}", f, uri=uri))

    async def _discover_more(self):
        """Our router is gone: add the routers discovery finds now to those
        the lifecycle fails over to (``connect(..., failover=True)``)."""
        from elvin.discovery.discoverer import Discoverer, NoRouterFound
        discoverer, own = self._failover_discoverer, False
        if discoverer is None:
            discoverer, own = Discoverer(self.reactor), True
            await discoverer.start()
        try:
            try:
                found = await discoverer.find(self._failover_scope, 2.0, exclude=set())
            except NoRouterFound:
                return
            uris = []
            for record, uri in found:
                parsed = ElvinURI(str(uri))
                self._records[str(parsed)] = record
                uris.append(parsed)
            self.lifecycle.add_uris(uris)
        finally:
            if own:
                await discoverer.stop()

    def _attached(self, proto):
        if proto.factory.generation != self._generation:
            proto.transport.abortConnection()    # a dial given up meanwhile
            return
        self.protocol = proto
        record = self._records.get(str(self.uri))
        if record is not None:
            self.router = record
        if self.lifecycle.phase is not Phase.IDLE:
            self.lifecycle.dialled(proto.send)

    def _callback_failed(self, what):
        self.log.failure("{what} raised", what=what)

    def _lost(self, reason, proto=None):
        if proto is not None and proto is not self.protocol:
            return                        # a channel already replaced
        self.protocol = None
        why = ""
        if hasattr(reason, "check") and not reason.check(error.ConnectionDone):
            from elvin.protocols.tls import failure_text
            why = failure_text(reason.value)  # e.g. a TLS verification failure
        if self.lifecycle.phase is Phase.IDLE:
            self.lost_detail = why
            self._finish()                # a bare channel (unotify)
            return
        self.lifecycle.channel_lost(why, _unsent_notifications(proto))

    # -- requests ------------------------------------------------------------

    def call(self, make_packet: Callable[[int], Any],
             late: Optional[Callable[[Any], Any]] = None) -> "defer.Deferred[Any]":
        """Send ``make_packet(xid)`` (one of ClientState's packet builders);
        the Deferred fires with the reply packet or fails with NackError,
        ConnectionClosed or RequestTimeout (no reply within the
        connection's ``timeout``). Cancelled or timed out, it stops
        waiting; ``late(reply)`` takes the reply if one still comes."""
        xid = [0]

        def cancel(d):
            if not self.lifecycle.unsend(xid[0]):
                self.abandon(xid[0], late)
        d: defer.Deferred[Any] = defer.Deferred(cancel)
        try:
            xid[0] = self.request(make_packet, d.callback, d.errback, late)
        except ConnectionClosed as e:
            return defer.fail(e)
        return d

    def _handshake(self, options, nfn_keys, sub_keys):
        """Open a session on the channel already attached (in-memory tests,
        a channel made by hand); fires with self."""
        assert self.protocol is not None, "no channel attached"
        self.lifecycle.attached(self.protocol.send, options, nfn_keys, sub_keys)
        return self._opened

    def subscribe(self, expression: str, callback: Callable[[Notification], Any],
                  accept_insecure: bool = True, keys: Optional[packets.Keys] = None, *,
                  ttl: Optional[int] = None,
                  max_count: Optional[int] = None) -> "defer.Deferred[ClientSubscription]":
        """Register ``expression``; ``callback(notification)`` for each match.

        Fires with a ClientSubscription, or fails with NackError (e.g. a
        parse error: ``code`` 2101-2112). A coroutine function as
        ``callback`` raises TypeError at once (wrap it:
        ``lambda note: defer.ensureDeferred(handle(note))``). Cancelled
        before the reply, the subscription is removed if the router made
        it. Through an Elvin proxy session, ``ttl`` (seconds) and
        ``max_count`` bound what the proxy keeps for it while no client of
        the session is connected (docs/proxy.md).
        """
        refuse_coroutine(callback, "elvin.client")
        d = self.call(self.sub_add_rqst(expression, accept_insecure, keys),
                      self._unsubscribe_late)

        def added(reply):
            sub = ClientSubscription(self, reply.subscription_id, expression,
                                     callback, accept_insecure)
            sub.keys = keys       # registered again with these after a reconnect
            self.subscriptions[sub.id] = sub
            self.subscribed_in_session(sub.id, expression, accept_insecure)
            return sub
        d.addCallback(added)
        if ttl is not None or max_count is not None:
            d.addCallback(lambda sub: self.set_limits(sub.id, ttl, max_count)
                          .addCallback(lambda _: sub))
        return d

    def _unsubscribe_late(self, reply):
        """A subscribe its caller gave up on was made after all: undo it."""
        try:
            self.request(self.sub_del_rqst(reply.subscription_id),
                         lambda _: None, lambda _: None)
        except ConnectionClosed:
            pass

    def set_limits(self, sub_id: int, ttl: Optional[int] = None,
                   max_count: Optional[int] = None) -> "defer.Deferred[Dict[str, Any]]":
        """Through a proxy session: keep what subscription ``sub_id``
        matches for at most ``ttl`` seconds and ``max_count``
        notifications (0: no limit; None: unchanged)."""
        d = self.set_options(self.limit_options(sub_id, ttl, max_count))

        def done(reply):
            self.limits_set(sub_id, ttl, max_count)
            return reply
        return d.addCallback(done)

    def delete_session(self, name: str) -> "defer.Deferred[Dict[str, Any]]":
        """Through a proxy: delete session ``name`` (needs its administrative
        password), its subscriptions and everything stored for it."""
        return self.set_options({"Proxy.Delete-Session": name})

    def _modify(self, sub, expression, accept_insecure, add_keys, del_keys):
        insecure = sub.accept_insecure if accept_insecure is None else accept_insecure

        def modified(reply):
            return self.subscription_modified(sub, expression, insecure, reply, add_keys,
                                              del_keys)
        # Cancelled after it went out, the router's answer still applies.
        return self.call(self.sub_mod_rqst(sub, expression, insecure, add_keys, del_keys),
                         modified).addCallback(modified)

    def _remove(self, sub):
        if not _holds(self.subscriptions, sub) or self.lifecycle.phase is Phase.CLOSED:
            return defer.succeed(None)    # removed already, or the session is over

        def removed(reply):
            if _holds(self.subscriptions, sub):
                del self.subscriptions[sub.id]
                sub._end(None)
            return None
        return self.call(self.sub_del_rqst(sub), removed).addCallback(removed)

    def quench(self, names: Iterable[str], on_add: Optional[Callable[[int, Any, bool], Any]] = None,
               on_modify: Optional[Callable[[int, Any, bool], Any]] = None,
               on_delete: Optional[Callable[[int], Any]] = None,
               deliver_insecure=True, keys=None):
        """Ask to be told about subscriptions referring to ``names``.

        Fires with a ClientQuench; its callbacks then receive every existing
        and future subscription on those names (see ClientQuench).
        """
        names = tuple(sorted(set(names)))
        d = self.call(self.qnch_add_rqst(names, deliver_insecure, keys))

        def added(reply):
            quench = ClientQuench(self, reply.quench_id, names, on_add, on_modify,
                                  on_delete, deliver_insecure)
            quench.keys = keys
            self.quenches[quench.id] = quench
            return quench
        return d.addCallback(added)

    def _modify_quench(self, quench, add_names, del_names, deliver_insecure,
                       add_keys, del_keys):
        insecure = quench.deliver_insecure if deliver_insecure is None else deliver_insecure
        add, delete = set(add_names), set(del_names)

        def modified(reply):
            quench.names = (quench.names | add) - delete
            quench.deliver_insecure = insecure
            if add_keys or del_keys:
                quench.keys = changed_keys(quench.keys, add_keys, del_keys)
            return quench
        return self.call(self.qnch_mod_rqst(quench, sorted(add), sorted(delete), insecure,
                                            add_keys, del_keys), modified).addCallback(modified)

    def _remove_quench(self, quench):
        if not _holds(self.quenches, quench) or self.lifecycle.phase is Phase.CLOSED:
            return defer.succeed(None)    # removed already, or the session is over

        def removed(reply):
            if _holds(self.quenches, quench):
                del self.quenches[quench.id]
        return self.call(self.qnch_del_rqst(quench), removed).addCallback(removed)

    def notify(self, attributes: Mapping[str, Any], deliver_insecure: bool = True,
               keys: Optional[packets.Keys] = None) -> None:
        """Emit a notification (no reply comes back; errors are local)."""
        self.emit(attributes, deliver_insecure, keys)

    def set_options(self, options: Mapping[str, Any]) -> "defer.Deferred[Dict[str, Any]]":
        """Renegotiate connection options (QosRqst); fires with the reply table."""
        d = self.call(self.qos_rqst(options))

        def done(reply):
            self.options.update(reply.options)
            return dict(reply.options)
        return d.addCallback(done)

    def set_keys(self, add_nfn_keys: Optional[packets.Keys] = None,
                 del_nfn_keys: Optional[packets.Keys] = None, add_sub_keys: Optional[packets.Keys] = None,
                 del_sub_keys=None):
        """Change the connection's keys (SecRqst)."""
        change = self.sec_rqst(add_nfn_keys, del_nfn_keys, add_sub_keys, del_sub_keys)
        return self.call(change).addCallback(lambda _: self.keys_changed(change))

    def test_connection(self, timeout: Optional[float] = None) -> "defer.Deferred[bool]":
        """Send TestConn; fires True when the router answers ConfConn (or
        anything else). With ``timeout`` (seconds), fails with TimeoutError
        naming the router if no answer comes in time (as the asyncio and
        blocking flavours' ``test_connection(timeout)``)."""
        d: defer.Deferred[Any] = defer.Deferred()
        try:
            self.ping(lambda alive: None if d.called else d.callback(alive),
                      lambda error: None if d.called else d.errback(error))
        except ConnectionClosed as e:
            return defer.fail(e)
        if timeout:
            uri = self.uri
            d.addTimeout(timeout, self.reactor, onTimeoutCancel=lambda result, after: Failure(
                TimeoutError(f"no answer to TestConn from {uri} within {after:g} s")))
        return d

    def close(self) -> "defer.Deferred[None]":
        """Disconnect politely (DisconnRqst, then the router's DisconnRply,
        which says everything sent before has reached it): fires once the
        session has ended. Fails with CloseUnconfirmed (also
        ``close_reason``, and logged) if the router did not confirm within
        5 s (or the channel ended first) while something sent was
        unconfirmed, or if notifications waiting to be sent while
        reconnecting were dropped: they may not have reached it."""
        already = self.lifecycle.phase is Phase.CLOSED
        self.lifecycle.close()
        if self.disconnected.called:
            return self._closed_outcome(already)
        d: defer.Deferred[None] = defer.Deferred()

        def ended(result: Any) -> Any:
            self._closed_outcome(already).chainDeferred(d)
            return result
        self.disconnected.addBoth(ended)
        return d

    def _closed_outcome(self, already: bool) -> "defer.Deferred[None]":
        error = self.close_reason
        if not already and isinstance(error, CloseUnconfirmed):
            return defer.fail(error)
        return defer.succeed(None)


def _unsent_notifications(proto: Any) -> List[Any]:
    """The notifications a failed channel took and never sent (the HTTP
    tunnel keeps them: ``HTTPTunnelTransport.unsent``), in order, to go
    back to the reconnection buffer. Requests among them are not: they
    fail with the loss, as over TCP."""
    unsent = getattr(getattr(proto, "transport", None), "unsent", None)
    data = unsent() if unsent is not None else b""
    if not data:
        return []
    found = []
    for frame in Deframer(ElvinClientProtocol.max_frame_length).feed(data):
        try:
            packet = packets.decode(frame)
        except DecodeError:
            break
        if type(packet) is packets.NotifyEmit:
            found.append(packet)
    return found


def _holds(table: Dict[int, Any], item: Any) -> bool:
    """Is ``item`` (a subscription, a quench) registered in ``table``?"""
    return table.get(item.id) is item


class _ClientFactory(protocol.Factory):
    protocol = ElvinClientProtocol
    noisy = False          # no "Starting factory <... at 0x...>" at each dial

    def __init__(self, connection, generation=None):
        self.connection = connection
        self.generation = connection._generation if generation is None else generation


def _endpoint(reactor, uri, tls=None):
    from elvin.endpoints import client_endpoint
    return client_endpoint(reactor, uri, **(tls or {}))


def _tls_args(tls, tls_ca, tls_certificate, tls_key, tls_hostname):
    return {"tls": tls, "tls_ca": tls_ca, "tls_certificate": tls_certificate,
            "tls_key": tls_key, "tls_hostname": tls_hostname}


@defer.inlineCallbacks
def connect(uri: Union[str, ElvinURI, Sequence[Union[str, ElvinURI]], None] = None,
            options: Optional[Mapping[str, Any]] = None,
            reactor: Any = None, nfn_keys: Optional[packets.Keys] = None,
            sub_keys: Optional[packets.Keys] = None, *, tls: Any = None, tls_ca: Any = None,
            tls_certificate: Any = None, tls_key: Any = None,
            tls_hostname: Optional[str] = None, scope: Optional[str] = None,
            discover: bool = False, discoverer: Any = None, discovery_timeout: float = 10.0,
            timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT,
            reconnect: Union[bool, Reconnect] = False, session: SessionArg = None,
            password: Optional[str] = None, admin_password: Optional[str] = None,
            receipt: Optional[str] = None, client: Optional[str] = None,
            ttl: Optional[int] = None, max_count: Optional[int] = None,
            on_notification: Optional[Callable[[Notification], Any]] = None,
            failover: bool = False, retry_connect: bool = False,
            pending_size: int = DEFAULT_PENDING_SIZE, follow_redirects: bool = True,
            on_disconnect: Optional[Callable[[int, str], Any]] = None,
            on_dropwarn: Optional[Callable[[], Any]] = None,
            ack_window: Optional[int] = None,
            liveness: Optional[float] = DEFAULT_LIVENESS) -> Generator[Any, Any, "Connection"]:
    """Connect to the router at ``uri``; fires with a Connection.

    ``options`` is a dict of connection options to request (section 7.5);
    the router's answer is in ``connection.options``.

    The URI's protocol stack picks the transport (docs/protocols.md). For
    TLS stacks (``secure``, ``ssl,none,xdr``, ``tcp,ssl,xdr``) the router's
    certificate is verified against ``tls_ca`` (PEM file path or bytes, an
    ``ssl.Certificate`` or any trust root; default: the platform's trust
    store) and must name ``tls_hostname`` (default: the URI's host).
    ``tls_certificate`` (PEM path with the key, or with ``tls_key``, or an
    ``ssl.PrivateCertificate``) is presented to routers that verify
    clients. ``tls`` takes ready-made client TLS options instead.

    Without a ``uri`` this connects to ``elvin://localhost:2917``, unless
    discovery is asked for -- ``discover=True``, a ``scope`` name, or a
    started ``elvin.discovery.Discoverer`` -- when a router is found by
    router discovery (ERDP multicast and DNS-SD, docs/discovery.md): with
    ``scope`` one of that scope, else a default router. Each usable URI
    is tried in turn for up to ``discovery_timeout`` seconds;
    ``connection.router`` is the router chosen.

    ``timeout`` (seconds, default 10; 0 or None: none) bounds both the
    connect and the ConnRqst/ConnRply handshake. Failing to open a session
    raises ``ConnectFailed`` (a ``ConnectionClosed``) whose message names
    the URI, what went wrong (refused, no ConnRply, not an Elvin server,
    TLS failure) and what to try; a Nack to ConnRqst raises ``NackError``.

    ``uri`` may be a list of URIs: the first that answers is used, and a
    reconnection fails over between them.

    ``reconnect=True`` (or an ``elvin.client.state.Reconnect`` policy)
    keeps the session across lost channels: see Connection;
    ``retry_connect=True`` retries the first connect by the same policy
    instead of failing. While reconnecting, notifications and requests
    wait in a buffer of ``pending_size`` bytes (0: refuse them with
    ConnectionClosed). ``follow_redirects``, ``on_disconnect(reason,
    text)`` and ``on_dropwarn()`` set the connection's attributes of those
    names before the handshake. ``liveness`` (seconds, default 60; 0 or
    None: off): after that long without a packet from the router the
    connection sends TestConn, and when nothing answers within ``timeout``
    (or ``liveness`` without one) the channel is lost, as if the socket had
    closed (docs/client.md, "Liveness"). With
    ``failover=True`` too (opt-in), a reconnection that cannot reach the
    router tries the routers router discovery finds (in ``scope``, with
    ``discoverer`` if given) and moves the session to the first that takes
    it, as a redirection would (``on_redirect``, then ``on_reconnected``).

    Through an Elvin proxy (docs/proxy.md), ``session`` joins a named
    session (or several: a list of names or of ``(name, password[, admin
    password])`` tuples), creating it if new, with ``password`` to join and
    ``admin_password`` to change it; ``receipt`` is "destructive" (the
    default: what this client receives is gone from the session) or
    "non-destructive" (left for the session's other clients; needs
    ``client``, a name for this device that stays the same); ``ttl`` and
    ``max_count`` are the defaults for subscriptions this connection adds.
    The Deferred fires once the proxy has told us the sessions'
    subscriptions (``connection.session_subscriptions``); what was stored
    while nobody was connected follows as ordinary deliveries, to
    ``on_notification`` (each Notification; set before the handshake).
    Each notification is acknowledged to the proxy once ``on_notification``
    and its callbacks have returned (``ack_window``: how many the proxy may
    have unacknowledged, default 256; 0: do not acknowledge, the proxy
    then counts what it wrote as received). docs/client.md, "Proxy
    sessions".
    """
    if reactor is None:
        from twisted.internet import reactor
    session_options, session_names = proxy_options(session, password, admin_password,
                                                   receipt, client, ttl, max_count,
                                                   ack_window)
    if session_options:
        options = {**(options or {}), **session_options}
    if uri is None and (discover or scope is not None or discoverer is not None):
        connection = yield connect_discovered(
            scope, discoverer, discovery_timeout, reactor, options=options,
            nfn_keys=nfn_keys, sub_keys=sub_keys, tls=tls, tls_ca=tls_ca,
            tls_certificate=tls_certificate, tls_key=tls_key,
            tls_hostname=tls_hostname, reconnect=reconnect, pending_size=pending_size,
            follow_redirects=follow_redirects, on_disconnect=on_disconnect,
            on_dropwarn=on_dropwarn, on_notification=on_notification, liveness=liveness)
        if failover:
            connection.reconnect = connection.reconnect or Reconnect()
            connection.failover = True
            connection._failover_scope = scope
            connection._failover_discoverer = discoverer
        return connection
    if uri is None:
        uri = DEFAULT_URI
    uris = ([uri if isinstance(uri, ElvinURI) else ElvinURI(uri)]
            if isinstance(uri, (str, ElvinURI))
            else [u if isinstance(u, ElvinURI) else ElvinURI(u) for u in uri])
    tls_args = _tls_args(tls, tls_ca, tls_certificate, tls_key, tls_hostname)
    if timeout:
        tls_args["timeout"] = timeout
    endpoint = _endpoint(reactor, uris[0], tls_args)
    connection = Connection(uris, reactor, endpoint, Reconnect.from_argument(reconnect),
                            retry_connect=retry_connect, timeout=timeout or None,
                            pending_size=pending_size)
    connection._tls_args = tls_args
    connection.on_notification = on_notification
    connection.follow_redirects = follow_redirects
    connection.on_disconnect = on_disconnect
    connection.on_dropwarn = on_dropwarn
    connection.liveness = liveness
    if failover:
        if connection.reconnect is None:
            connection.reconnect = Reconnect()
        connection.failover = True
        connection._failover_scope = scope
        connection._failover_discoverer = discoverer
    joined: defer.Deferred[None] = defer.Deferred()
    if session_names:
        connection.expect_joins(session_names, lambda: joined.callback(None))
    connection.lifecycle.start(options, nfn_keys, sub_keys)
    try:
        yield connection._opened
    except (NackError, ConnectFailed):
        raise
    except HandshakeTimeout:
        raise ConnectFailed(
            messages.handshake_timeout(connection.uri, timeout or 0)) from None
    except ConnectionClosed as e:
        raise ConnectFailed(_handshake_lost(connection.uri, connection, e)) from e
    except defer.CancelledError:
        raise
    except Exception as e:
        raise ConnectFailed(_cannot_connect(connection.uri, e)) from e
    if session_names:
        if "Proxy.Receipt" not in connection.options:
            _abort(connection)
            raise ConnectFailed(f"{_shown(connection.uri)} accepted the connection but not "
                                "the session: it is a router, not an Elvin proxy "
                                "(docs/proxy.md)")
        if connection.joins_pending:
            if timeout:
                joined.addTimeout(timeout, reactor)
            try:
                yield joined
            except defer.TimeoutError:
                _abort(connection)
                raise ConnectFailed(f"{_shown(connection.uri)} did not report joining "
                                    f"{', '.join(session_names)} within {timeout:g} s") from None
    return connection


def _abort(connection, proto=None):
    proto = proto or connection.protocol
    if proto is not None and proto.transport:
        proto.transport.abortConnection()


def _cannot_connect(uri, error_value):
    """A sentence for a failed TCP/TLS connect to ``uri``."""
    from elvin.protocols.httpclient import TunnelRefused, TunnelTimeout
    if isinstance(error_value, TunnelTimeout):
        return messages.no_http_response(uri, f"none within {error_value.timeout:g} s")
    if isinstance(error_value, TunnelRefused):
        return messages.http_refused(uri, error_value.status, error_value.body)
    if isinstance(error_value, (error.ConnectionRefusedError, ConnectionRefusedError)):
        kind = "refused"
    elif isinstance(error_value, (error.DNSLookupError,)):
        kind = "unresolved"
    elif isinstance(error_value, (error.TimeoutError, defer.TimeoutError, TimeoutError)):
        kind = "timeout"
    else:
        kind = None
    return messages.cannot_connect(uri, error_value, kind)


def _handshake_lost(uri, connection, closed):
    """A sentence for a channel that ended before ConnRply."""
    return messages.handshake_lost(uri, connection.problem, connection.first_bytes, closed)


@defer.inlineCallbacks
def connect_discovered(scope: Optional[str] = None, discoverer: Any = None,
                       timeout: Optional[float] = None, reactor: Any = None,
                       connect_timeout: float = 5.0,
                       **connect_kwargs: Any) -> Generator[Any, Any, "Connection"]:
    """Connect to a router found by discovery; fires with a Connection
    (its ``router`` attribute is the RouterRecord used).

    Tries each usable URI in turn (``connect_timeout`` seconds each), and
    when all fail solicits for more, until ``timeout`` seconds have passed.
    Without a ``discoverer`` one is made for this call and stopped after.
    """
    from elvin.discovery.discoverer import (DEFAULT_TIMEOUT, Discoverer, NoRouterFound,
                                            _describe_scope)
    if reactor is None:
        from twisted.internet import reactor
    if timeout is None:
        timeout = DEFAULT_TIMEOUT
    own = discoverer is None
    if own:
        discoverer = Discoverer(reactor)
        yield discoverer.start()
    failures: list[str] = []
    try:
        deadline = reactor.seconds() + timeout
        tried: set[Any] = set()
        while True:
            remaining = deadline - reactor.seconds()
            try:
                if remaining <= 0:
                    raise NoRouterFound(
                        f"no Elvin router found by discovery: looked for "
                        f"{_describe_scope(scope)} for {timeout:g} s")
                found = yield discoverer.find(scope, remaining, exclude=tried)
            except NoRouterFound as e:
                if failures:
                    raise NoRouterFound(f"{e.message}; could not connect to "
                                        + "; ".join(failures)) from None
                raise
            for record, uri in found:
                tried.add((record.name, record.revision, uri))
                left = max(0.5, deadline - reactor.seconds())
                attempt = connect(uri, reactor=reactor, **connect_kwargs)
                attempt.addTimeout(min(connect_timeout, left), reactor)
                try:
                    conn = yield attempt
                except Exception as e:
                    failures.append(f"{uri} ({e})")
                    discoverer.log.info("discovery: {uri} of {router} failed: {why}",
                                        uri=uri, router=record.name, why=str(e))
                    continue
                conn.router = record
                return conn
    finally:
        if own:
            yield discoverer.stop()


@defer.inlineCallbacks
def unotify(uri: Union[str, ElvinURI], attributes: Mapping[str, Any],
            deliver_insecure: bool = True, keys: Optional[packets.Keys] = None, reactor: Any = None,
            *, tls: Any = None, tls_ca: Any = None, tls_certificate: Any = None,
            tls_key: Any = None, tls_hostname: Optional[str] = None,
            timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT) -> Generator[Any, Any, None]:
    """Send one session-less notification (UNotify) and close the channel.

    Over ``udp,none,xdr`` it is one datagram, and nothing confirms that
    the router received it. TLS arguments as for ``connect``. Fails with
    ``ConnectFailed``, in ``connect``'s words, when the channel cannot be
    opened, its TLS handshake fails, or the peer answers or hangs up
    before the client does (no Elvin router does either). ``timeout``
    (seconds, default 10; 0 or None: none) bounds the connect, the TLS
    handshake (or the HTTP session's opening) and, after that, the close:
    a channel that does not close in time is aborted.
    """
    if reactor is None:
        from twisted.internet import reactor
    if not isinstance(uri, ElvinURI):
        uri = ElvinURI(uri)
    packet = packets.UNotify(4, 0, normalise(attributes), deliver_insecure,
                       keys or packets.Keys.EMPTY)
    if uri.transport == "udp":
        from elvin.endpoints import check_supported
        from elvin.protocols.udp import send_unotify
        yield send_unotify(reactor, check_supported(uri), packet)
        return
    connection = Connection(uri, reactor)
    tls_args = _tls_args(tls, tls_ca, tls_certificate, tls_key, tls_hostname)
    if timeout:
        tls_args["timeout"] = timeout
    endpoint = _endpoint(reactor, uri, tls_args)
    deadline = reactor.seconds() + timeout if timeout else None

    def bounded(d, text):
        """``d``, cancelled at the deadline and then failing with ``text``."""
        if deadline is not None:
            d.addTimeout(max(0.0, deadline - reactor.seconds()), reactor,
                         onTimeoutCancel=lambda result, t: Failure(ConnectFailed(text)))
        return d
    try:
        # The endpoint bounds this itself (the TCP connect, the HTTP POST
        # that opens a session).
        proto = yield endpoint.connect(_ClientFactory(connection))
    except Exception as e:
        raise ConnectFailed(_cannot_connect(uri, e)) from e

    def lost(sent):
        return ConnectFailed(messages.unotify_lost(uri, connection.problem,
                                                   connection.first_bytes,
                                                   connection.lost_detail, sent))
    proto.send(packet)
    try:
        # Over TLS: after the handshake.
        yield bounded(proto.written(), messages.unotify_timeout(uri, timeout or 0))
    except ConnectFailed:
        _abort(connection, proto)
        if connection.disconnected.called:
            raise lost(False) from None
        raise
    except Exception:
        raise lost(False) from None
    # Linger before closing: a router may discard packets it has not yet
    # processed when it sees the channel close (Avis drops most UNotifys).
    yield task.deferLater(reactor, UNOTIFY_LINGER, lambda: None)
    if connection.disconnected.called:
        raise lost(True)               # the peer hung up, or answered, first
    proto.transport.loseConnection()
    if timeout:
        # A polite close waits for the peer (TLS close_notify, the HTTP
        # DELETE): at most ``timeout`` seconds more.
        closing = reactor.callLater(timeout, _abort, connection, proto)
        connection.disconnected.addBoth(
            lambda result: closing.cancel() if closing.active() else None)
    yield connection.disconnected
