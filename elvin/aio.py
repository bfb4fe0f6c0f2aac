"""The Elvin client for asyncio programs: no Twisted reactor, no Twisted import.

    import elvin.aio

    async with elvin.aio.connect("elvin://localhost:2917") as conn:
        conn.notify({"Group": "chat", "Message": "hello"})
        async with conn.subscribe('Group == "chat"') as sub:
            async for note in sub:
                print(note["Message"])

The session is ``elvin.clientcore``'s: ``ClientState`` (requests, replies,
deliveries) and ``Lifecycle`` (connecting, losing, reconnecting,
redirection, closing), the same machine the Twisted client and the
proxy's upstream run; this module only carries out its effects with
asyncio transports, timers and futures. Errors are the same classes:
``NackError`` when the router refuses a request, ``RequestTimeout`` when
it does not answer one within the connection's ``timeout``,
``ConnectionClosed`` when the session ends under a request
(``reason``/``disconn_args`` carry the router's Disconn), ``ConnectFailed``
when ``connect`` cannot open one.
"""

import asyncio
import inspect
import logging
import socket
import ssl
from typing import (Any, Awaitable, Callable, Coroutine, Dict, Generator, Generic, Iterable,
                    List, Mapping, NoReturn, Optional, Sequence, Tuple, TypeVar, Union)

from elvin.clientcore.lifecycle import (DEFAULT_PENDING_SIZE, DEFAULT_RECEIVE_QUEUE,
                                        CancelTimer, CloseChannel, ConnectFailedEffect,
                                        Connected, DEFAULT_LIVENESS, Dial, Effect, Ended,
                                        HandshakeTimeout,
                                        Lifecycle, LifecycleView, PauseReading, Phase,
                                        ResumeReading, StartTimer, TLS_FIRST_PACKET_DELAY)
from elvin.clientcore import messages
from elvin.clientcore.state import ASK_LIMITS
from elvin.clientcore.state import (ClientState, CloseUnconfirmed, ConnectFailed,
                                    ConnectionClosed, Deframer, EndHook, NackError, Notification, PublishBufferFull,
                                    QuenchHandlers, QuenchState, Reconnect, RequestTimeout,
                                    AutoQuenchBase,
                                    SessionArg, changed_keys, proxy_options)
from elvin.core.options import OPTIONS
from elvin.keys import Keys, consumer_keys, dual_keys, producer_keys
from elvin.protocols import packets
from elvin.protocols.xdr import DecodeError
from elvin.uri import ElvinURI, options_problem, stack_problem, version_problem
from elvin.values import normalise

__all__ = ["connect", "unotify", "Connection", "Subscription", "Quench", "Reconnect",
           "AutoQuench",
           "NackError",
           "ConnectionClosed", "ConnectFailed", "PublishBufferFull", "CloseUnconfirmed",
           "RequestTimeout", "Notification", "DEFAULT_URI", "DEFAULT_CONNECT_TIMEOUT",
           "Keys", "producer_keys", "consumer_keys", "dual_keys", "ASK_LIMITS"]

DEFAULT_URI = "elvin://localhost:2917"
#: Seconds ``connect`` waits for the channel and for the router's ConnRply.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds ``unotify`` keeps a stream channel open after sending (a router
#: may drop what it has not read when it sees the channel close).
UNOTIFY_LINGER = 0.1
_MAX_FRAME = OPTIONS["Packet.Max-Length"].high
_END = object()
T = TypeVar("T")
#: What a subscription's callback is given (it may be a coroutine function).
NoteCallback = Callable[[Notification], Any]
#: ``connect``'s ``uri``: one router, or several to fail over between.
URIs = Union[str, ElvinURI, Sequence[Union[str, ElvinURI]], None]

_log = logging.getLogger("elvin.aio")
#: A quench's add/modify handler: (term id, subscription tree, secure).
QuenchCallback = Callable[[int, Any, bool], Any]


def _settle(future: "asyncio.Future[Any]", value: Any = None,
            error: Optional[BaseException] = None) -> None:
    if not future.done():
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


def _uris(uri: URIs) -> List[ElvinURI]:
    """``connect``'s ``uri`` argument as a list of URIs."""
    if uri is None:
        return [ElvinURI(DEFAULT_URI)]
    if isinstance(uri, (str, ElvinURI)):
        return [uri if isinstance(uri, ElvinURI) else ElvinURI(uri)]
    return [u if isinstance(u, ElvinURI) else ElvinURI(u) for u in uri]


class _Protocol(asyncio.Protocol):
    """Bytes to packets for one channel of a Connection. What is sent in
    one loop iteration goes out in one ``transport.write``; over TLS, the
    first write waits ``TLS_FIRST_PACKET_DELAY`` seconds after the
    handshake (asyncio calls ``connection_made`` once it has ended)."""

    def __init__(self, connection: "Connection", generation: int) -> None:
        self.connection = connection
        self.generation = generation
        self.loop = connection.loop
        self.deframer = Deframer(_MAX_FRAME)
        self.transport: Any = None
        self.done: "asyncio.Future[None]" = connection.loop.create_future()    # set when this channel ends
        self._out: List[bytes] = []
        self._first_delay = 0.0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if transport.get_extra_info("ssl_object") is not None:
            self._first_delay = TLS_FIRST_PACKET_DELAY
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.connection._attached(self)

    def data_received(self, data: bytes) -> None:
        connection = self.connection
        if connection.protocol is not self:
            return
        if connection.first_bytes is None:
            connection.first_bytes = bytes(data[:16])
        try:
            frames = self.deframer.feed(data)
            lifecycle = connection.lifecycle
            for frame in frames:
                lifecycle.packet(packets.decode(frame))
                if connection.protocol is not self:
                    return                # dropped meanwhile
        except (ValueError, DecodeError):
            connection.problem = "not_elvin"
            self.transport.abort()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        _settle(self.done)
        self._out.clear()
        self.connection._lost(self, exc)

    def send(self, packet: Any) -> int:
        """Queue ``packet`` for this iteration's write; the bytes it takes."""
        data = packets.encode(packet)
        out = self._out
        if not out:
            if self._first_delay:
                self.loop.call_later(self._first_delay, self.flush)
                self._first_delay = 0.0
            else:
                self.loop.call_soon(self.flush)
        out.append(len(data).to_bytes(4, "big"))
        out.append(data)
        return len(data) + 4

    def flush(self) -> None:
        out = self._out
        if out:
            data = b"".join(out)
            out.clear()
            if not self.transport.is_closing():
                self.transport.write(data)


class Subscription(EndHook):
    """A subscription registered with the router.

    Without a callback it is an async iterator of ``Notification``s
    (``async for note in sub``), which ends when the subscription is
    removed or the connection closed by the program, and raises
    ``ConnectionClosed`` (with the router's Disconn reason, if it sent
    one) when the session is lost. With ``callback``, each notification is
    passed to it instead; a coroutine function (or a callback returning an
    awaitable) is run as a task, its errors logged. As an async context
    manager it removes itself on exit. ``on_end(error)`` is called once,
    on the loop, when it ends (None: removed or closed by the program;
    else the error, as the iterator raises it): a callback subscription's
    only sign that the session was lost.
    """

    def __init__(self, connection: "Connection", sub_id: int, expression: str,
                 accept_insecure: bool, callback: Optional[NoteCallback] = None,
                 keys: Optional[packets.Keys] = None) -> None:
        self.connection = connection
        self.keys = keys          # as subscribed: registered again with these
        self.id = sub_id
        self.expression = expression
        self.accept_insecure = accept_insecure
        self.callback = callback
        self._queue: Optional["asyncio.Queue[Any]"] = asyncio.Queue() if callback is None else None
        self._held = 0            # queued notifications counted by the lifecycle
        self._ended: Any = None

    def _deliver_note(self, note: Notification) -> None:
        if self.callback is not None:
            result = self.callback(note)
            if inspect.isawaitable(result):
                self.connection._run_callback(result, self, note)
        elif self._queue is not None:
            self._queue.put_nowait(note)
            self._held += 1
            self.connection.lifecycle.held(1)
            self.connection.ack_hold(note)       # handled once the iterator yields it

    def _end(self, error: Optional[Exception] = None) -> None:
        if self._ended is None:
            self._ended = error or _END
            if self._held:
                self.connection.lifecycle.held(-self._held)
                self._held = 0
            if self._queue is not None:
                self._queue.put_nowait(_END)
            self._ended_with(error)       # on_end, called on the loop

    async def modify(self, expression: Optional[str] = None,
                     accept_insecure: Optional[bool] = None,
                     add_keys: Optional[packets.Keys] = None,
                     del_keys: Optional[packets.Keys] = None) -> "Subscription":
        """Change the expression, insecure flag or keys; returns self."""
        conn = self.connection
        insecure = self.accept_insecure if accept_insecure is None else accept_insecure
        await conn._call(conn.sub_mod_rqst(self, expression, insecure, add_keys, del_keys),
                         at_reply=lambda reply: conn.subscription_modified(
                             self, expression, insecure, reply, add_keys, del_keys),
                         apply_late=True)
        return self

    async def remove(self) -> None:
        """Delete the subscription (iteration then ends). Removing one
        already removed (or ended) does nothing."""
        conn = self.connection
        if self._ended is not None:
            if conn.subscriptions.get(self.id) is self:
                del conn.subscriptions[self.id]
            return

        def removed(reply: Any) -> None:
            if conn.subscriptions.get(self.id) is self:
                del conn.subscriptions[self.id]
            self._end()
        await conn._call(conn.sub_del_rqst(self), at_reply=removed, apply_late=True)

    def __aiter__(self) -> "Subscription":
        if self._queue is None:
            raise TypeError("a subscription with a callback is not iterable")
        return self

    async def __anext__(self) -> Notification:
        queue = self._queue
        assert queue is not None, "__aiter__ refuses callback subscriptions"
        if queue.empty() and self._ended is not None:
            return self._finish()
        note = await queue.get()
        if note is _END:
            queue.put_nowait(_END)        # later calls end too
            return self._finish()
        if self._held:
            self._held -= 1
            self.connection.lifecycle.held(-1)
        self.connection.ack_release(note)
        return note

    def _finish(self) -> NoReturn:
        if self._ended is not _END and self._ended is not None:
            raise self._ended
        raise StopAsyncIteration

    async def __aenter__(self) -> "Subscription":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._ended is None and not self.connection.is_closed:
            await self.remove()

    def __repr__(self) -> str:
        return f"<elvin.aio.Subscription {self.id} {self.expression!r}>"


class Quench(QuenchHandlers):
    """A quench registered with the router: ``on_add(term_id, tree,
    secure)``, ``on_modify(...)`` and ``on_delete(term_id)`` are called as
    subscriptions on its names come, change and go."""

    async def modify(self, add_names: Iterable[str] = (), del_names: Iterable[str] = (),
                     deliver_insecure: Optional[bool] = None,
                     add_keys: Optional[packets.Keys] = None,
                     del_keys: Optional[packets.Keys] = None) -> "Quench":
        conn = self.connection
        insecure = self.deliver_insecure if deliver_insecure is None else deliver_insecure
        add, delete = set(add_names), set(del_names)

        def modified(reply: Any) -> "Quench":
            self.names = (self.names | add) - delete
            self.deliver_insecure = insecure
            if add_keys or del_keys:
                self.keys = changed_keys(self.keys, add_keys, del_keys)
            return self
        await conn._call(conn.qnch_mod_rqst(self, sorted(add), sorted(delete), insecure,
                                            add_keys, del_keys),
                         at_reply=modified, apply_late=True)
        return self

    async def remove(self) -> None:
        conn = self.connection
        if conn.quenches.get(self.id) is not self or conn.lifecycle.phase is Phase.CLOSED:
            return                        # removed already, or the session is over

        def removed(reply: Any) -> None:
            if conn.quenches.get(self.id) is self:
                del conn.quenches[self.id]
        await conn._call(conn.qnch_del_rqst(self), at_reply=removed, apply_late=True)


class AutoQuench(AutoQuenchBase):
    """Auto-quench (the Elvin4 paper): emit only what somebody could want.

    Wraps a Connection: the attribute names of everything emitted through
    ``notify`` are registered as a quench (growing as new names appear),
    and a notification that no known subscription could match is dropped
    (counted in ``dropped``; ``sent`` counts the others). ``await
    auto.ready()`` waits for the first registration and the router's
    notifications about the subscriptions that already exist. While the
    router has not answered a change of names, notifications are dropped:
    auto-quench errs towards silence. The same as ``elvin.client.AutoQuench``
    (both use ``elvin.client.state.QuenchState``).
    """

    def __init__(self, connection: "Connection", names: Iterable[str] = (),
                 deliver_insecure: bool = True, keys: Optional[packets.Keys] = None) -> None:
        self.connection = connection
        self.state = QuenchState()
        self.names = set(names)
        self.deliver_insecure = deliver_insecure
        self.keys = keys
        self.quench: Optional[Quench] = None
        self.sent = 0
        self.dropped = 0
        self._pending: Optional["asyncio.Task[None]"] = None
        self._ready: "asyncio.Future[None]" = connection.loop.create_future()
        if self.names:
            self._sync()
        else:
            _settle(self._ready)

    async def ready(self) -> "AutoQuench":
        await asyncio.shield(self._ready)
        return self

    def _sync(self) -> None:
        if self._pending is None:
            self._pending = self.connection.loop.create_task(self._register())

    async def _register(self) -> None:
        conn = self.connection
        try:
            while True:
                if self.quench is None:
                    self.quench = await conn.quench(
                        self.names, deliver_insecure=self.deliver_insecure, keys=self.keys,
                        **self.state.callbacks())
                else:
                    missing = self.names - self.quench.names
                    if not missing:
                        break
                    await self.quench.modify(add_names=missing)
                # The round trip returns after the router's initial notifications.
                await conn.test_connection()
                if self.names <= self.quench.names:
                    break
        except (NackError, ConnectionClosed) as e:
            self._registration_failed(e, logging.getLogger("elvin.aio").warning)
        finally:
            self._pending = None
            _settle(self._ready)



class _Pending(Generic[T]):
    """What ``subscribe``/``connect`` return: awaitable, and an async
    context manager that also closes (removes) what it made."""

    def __init__(self, coroutine: Coroutine[Any, Any, T],
                 close: Callable[[Optional[T]], Awaitable[None]]) -> None:
        self._coroutine = coroutine
        self._close = close
        self._made: Optional[T] = None

    def close(self) -> None:
        """Never awaited after all (``elvin.sync`` refusing a call)."""
        self._coroutine.close()

    def __await__(self) -> Generator[Any, None, T]:
        self._awaited = True
        return self._coroutine.__await__()

    _awaited = False

    def __del__(self) -> None:
        # Cancelled before it ever ran (``asyncio.wait_for(..., 0)``):
        # nothing was sent, and nothing is left to log.
        if (not self._awaited
                and inspect.getcoroutinestate(self._coroutine) == inspect.CORO_CREATED):
            self._coroutine.close()

    async def __aenter__(self) -> T:
        self._made = await self._coroutine
        return self._made

    async def __aexit__(self, *exc: Any) -> None:
        await self._close(self._made)


class Connection(LifecycleView, ClientState):
    """A session with an Elvin router (made by ``connect``).

    Its life is ``self.lifecycle`` (``elvin.clientcore.lifecycle``); this
    class carries out what the machine asks (dial, timers, closing the
    channel, pausing reads) on asyncio. With ``reconnect`` (see
    ``connect``), a lost channel is not the end of the session:
    ``on_connection_lost(error)`` is called, what the program sends waits
    in a bounded buffer, and the connection dials again with backoff,
    connects with the options and keys it first had, replays its key
    changes and registers its subscriptions and quenches again (they get
    new router ids; iterators carry on), sends what waited, then calls
    ``on_reconnected(connection)``. If it gives up, the session ends as
    without reconnection: iterators raise ConnectionClosed and ``closed``
    is set.
    """

    def __init__(self, uri: Union[ElvinURI, Sequence[ElvinURI]],
                 loop: Optional[asyncio.AbstractEventLoop] = None,
                 reconnect: Optional[Reconnect] = None, *, retry_connect: bool = False,
                 timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT,
                 pending_size: int = DEFAULT_PENDING_SIZE,
                 receive_queue: int = DEFAULT_RECEIVE_QUEUE,
                 open_args: Tuple[Any, ...] = (None, None, None, None, None)) -> None:
        super().__init__()
        self.loop = loop or asyncio.get_running_loop()
        self.lifecycle = Lifecycle(self, uri, self._execute, self.loop.time, reconnect,
                                   retry_connect, timeout, pending_size, receive_queue,
                                   owner=self)
        self.protocol: Optional[_Protocol] = None
        self.call_later = self.loop.call_later
        self.first_bytes: Optional[bytes] = None
        self.problem: Optional[str] = None
        #: set when the session has ended for good
        self.closed: "asyncio.Future[None]" = self.loop.create_future()
        #: set once the first session is up (or failed)
        self.opened: "asyncio.Future[Connection]" = self.loop.create_future()
        #: TLS arguments of ``_open``: (tls, tls_ca, tls_certificate, tls_key, tls_hostname)
        self._open_args = open_args
        self._generation = 0
        self._dialling: Optional["asyncio.Task[None]"] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._tasks: set = set()
        #: the discovery record of the router, when discovery chose it
        self.router: Any = None

    # -- the machine's effects -------------------------------------------------

    def _execute(self, effect: Effect) -> None:
        kind = type(effect)
        if kind is Dial:
            assert isinstance(effect, Dial)
            self._generation += 1
            self._dialling = self.loop.create_task(self._dial(effect.uri, self._generation))
        elif kind is StartTimer:
            assert isinstance(effect, StartTimer)
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(effect.delay, self._timer_fired)
        elif kind is CancelTimer:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        elif kind is CloseChannel:
            assert isinstance(effect, CloseChannel)
            protocol = self.protocol
            if effect.abort:
                self.protocol = None
                self._generation += 1
                if protocol is not None:
                    protocol.transport.abort()
            elif protocol is not None:
                protocol.flush()
                protocol.transport.close()
        elif kind is PauseReading or kind is ResumeReading:
            protocol = self.protocol
            if protocol is not None and not protocol.transport.is_closing():
                if kind is PauseReading:
                    protocol.transport.pause_reading()
                else:
                    protocol.transport.resume_reading()
        elif kind is Connected:
            _settle(self.opened, self)
        elif kind is ConnectFailedEffect:
            assert isinstance(effect, ConnectFailedEffect)
            _settle(self.opened, error=effect.cause)
            _settle(self.closed)
        elif kind is Ended:
            _settle(self.opened, error=ConnectionClosed("connection is closed"))
            _settle(self.closed)

    def _timer_fired(self) -> None:
        self._timer = None
        self.lifecycle.timer_fired()

    async def _dial(self, uri: ElvinURI, generation: int) -> None:
        try:
            await asyncio.wait_for(
                _open(uri, self.loop, lambda: _Protocol(self, generation), *self._open_args),
                self.lifecycle.timeout or None)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if generation == self._generation:
                self.lifecycle.dial_failed(e)

    def _attached(self, protocol: _Protocol) -> None:
        if protocol.generation != self._generation:
            protocol.transport.abort()   # a dial given up meanwhile
            return
        self.protocol = protocol
        self.lifecycle.dialled(protocol.send)

    def _lost(self, protocol: _Protocol, exc: Optional[Exception]) -> None:
        if protocol is not self.protocol:
            return                        # a channel already replaced
        self.protocol = None
        self.lifecycle.channel_lost(str(exc) if exc else "")

    def _run_callback(self, awaitable: Awaitable[Any], sub: Subscription,
                      note: Optional[Notification] = None) -> None:
        """A coroutine callback's result: run it as a task (counted against
        the receive bound while it runs; through a proxy session, ``note``
        is handled once it ends); its exception is logged."""
        task = asyncio.ensure_future(awaitable, loop=self.loop)
        self._tasks.add(task)
        self.lifecycle.held(1)
        if note is not None:
            self.ack_hold(note)

        def done(task: "asyncio.Future[Any]") -> None:
            self._tasks.discard(task)
            self.lifecycle.held(-1)
            if note is not None:
                self.ack_release(note)
            if not task.cancelled() and task.exception() is not None:
                _log.error("subscription callback for %r raised", sub,
                           exc_info=task.exception())
        task.add_done_callback(done)

    # -- requests --------------------------------------------------------------

    async def _call(self, make_packet: Callable[[int], Any],
                    late: Optional[Callable[[Any], Any]] = None,
                    at_reply: Optional[Callable[[Any], Any]] = None,
                    apply_late: bool = False) -> Any:
        """Send a request and wait for its reply (RequestTimeout when none
        comes within the connection's ``timeout``). If the caller is
        cancelled first, or the request timed out, ``late(reply)`` takes
        the reply when it comes.
        ``at_reply(reply)``, when given, runs as the reply is read, before
        any packet read after it, and its result is what the caller gets:
        a subscription or quench must be known before the NotifyDeliver or
        SubAddNotify that can follow its reply in the same read (the
        caller resumes only on a later turn of the loop). With
        ``apply_late``, ``at_reply`` runs even if the caller was cancelled
        after the request went out (a modify or remove the router carries
        out is carried out here too); one taken back from the
        reconnection buffer was never sent and changes nothing."""
        future: "asyncio.Future[Any]" = self.loop.create_future()

        def replied(reply: Any) -> None:
            if at_reply is not None:
                try:
                    reply = at_reply(reply)
                except Exception as error:
                    _settle(future, error=error)
                    return
            _settle(future, reply)

        xid = self.request(make_packet, replied, lambda error: _settle(future, error=error),
                           at_reply if apply_late else late)
        try:
            return await future
        except asyncio.CancelledError:
            if not self.lifecycle.unsend(xid):
                if future.done() and not future.cancelled() and future.exception() is None:
                    if late is not None:
                        late(future.result())
                elif apply_late and at_reply is not None:
                    self.abandon(xid, at_reply)
                else:
                    self.abandon(xid, late)
            raise

    def _unsubscribe_late(self, made: Any) -> None:
        """A subscribe its caller gave up on was made after all: undo it
        (``made``: the Subscription, or the SubRply if it came later)."""
        sub_id = made.id if isinstance(made, Subscription) else made.subscription_id
        self.subscriptions.pop(sub_id, None)
        self.session_subscriptions.pop(sub_id, None)
        try:
            self.request(self.sub_del_rqst(sub_id), lambda _: None, lambda _: None)
        except ConnectionClosed:
            pass                          # the session (and it) are gone

    def notify(self, attributes: Mapping[str, Any], deliver_insecure: bool = True,
               keys: Optional[packets.Keys] = None) -> None:
        """Emit a notification (nothing comes back; errors are local).
        While reconnecting it waits in the buffer (PublishBufferFull when
        full)."""
        self.emit(attributes, deliver_insecure, keys)

    def subscribe(self, expression: str, callback: Optional[NoteCallback] = None,
                  accept_insecure: bool = True,
                  keys: Optional[packets.Keys] = None, *, ttl: Optional[int] = None,
                  max_count: Optional[int] = None) -> "_Pending[Subscription]":
        """Register ``expression``: ``await`` it for a ``Subscription``, or
        ``async with conn.subscribe(...) as sub`` to remove it on exit.
        A bad expression raises NackError (code 2101-2112). Cancelled
        while waiting (``asyncio.wait_for``), it removes the subscription
        if the router made it. Through an Elvin proxy session, ``ttl``
        (seconds) and ``max_count`` bound what the proxy keeps for it
        (``set_limits``, as the Twisted client's ``subscribe``)."""
        def registered(reply: Any) -> Subscription:
            sub = Subscription(self, reply.subscription_id, expression, accept_insecure,
                               callback, keys)
            self.subscriptions[sub.id] = sub
            self.subscribed_in_session(sub.id, expression, accept_insecure)
            return sub

        async def subscribed() -> Subscription:
            sub: Subscription = await self._call(
                self.sub_add_rqst(expression, accept_insecure, keys), self._unsubscribe_late,
                at_reply=registered)
            if ttl is not None or max_count is not None:
                await self.set_limits(sub.id, ttl, max_count)
            return sub

        async def remove(sub: Optional[Subscription]) -> None:
            if sub is not None and sub._ended is None and not self.is_closed:
                await sub.remove()
        return _Pending(subscribed(), remove)

    async def quench(self, names: Iterable[str], on_add: Optional[QuenchCallback] = None,
                     on_modify: Optional[QuenchCallback] = None,
                     on_delete: Optional[Callable[[int], Any]] = None,
                     deliver_insecure: bool = True,
                     keys: Optional[packets.Keys] = None) -> Quench:
        """Be told of subscriptions referring to ``names`` (see Quench)."""
        names = tuple(sorted(set(names)))

        def registered(reply: Any) -> Quench:
            quench = Quench(self, reply.quench_id, names, on_add, on_modify, on_delete,
                            deliver_insecure)
            quench.keys = keys
            self.quenches[quench.id] = quench
            return quench
        quench: Quench = await self._call(self.qnch_add_rqst(names, deliver_insecure, keys),
                                          at_reply=registered)
        return quench

    async def set_options(self, options: Mapping[str, Any]) -> Dict[str, Any]:
        """Renegotiate connection options (QosRqst); returns the reply table."""
        reply = await self._call(self.qos_rqst(options))
        self.options.update(reply.options)
        return dict(reply.options)

    async def set_limits(self, sub_id: int, ttl: Optional[int] = None,
                         max_count: Optional[int] = None) -> Dict[str, Any]:
        """Through a proxy session: keep what subscription ``sub_id`` matches
        for at most ``ttl`` seconds and ``max_count`` notifications (0: no
        limit; None: unchanged). docs/proxy.md."""
        reply = await self.set_options(self.limit_options(sub_id, ttl, max_count))
        self.limits_set(sub_id, ttl, max_count)
        return reply

    async def delete_session(self, name: str) -> Dict[str, Any]:
        """Through a proxy: delete session ``name`` (needs its administrative
        password), its subscriptions and everything stored for it."""
        return await self.set_options({"Proxy.Delete-Session": name})

    async def set_keys(self, add_nfn_keys: Optional[packets.Keys] = None,
                       del_nfn_keys: Optional[packets.Keys] = None,
                       add_sub_keys: Optional[packets.Keys] = None,
                       del_sub_keys: Optional[packets.Keys] = None) -> None:
        """Change the connection's keys (SecRqst)."""
        change = self.sec_rqst(add_nfn_keys, del_nfn_keys, add_sub_keys, del_sub_keys)
        await self._call(change)
        self.keys_changed(change)

    async def test_connection(self, timeout: Optional[float] = None) -> bool:
        """TestConn; True once the router answers (TimeoutError after
        ``timeout`` seconds)."""
        future: "asyncio.Future[bool]" = self.loop.create_future()
        self.ping(lambda alive: _settle(future, alive),
                  lambda error: _settle(future, error=error))
        uri = self.uri
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            # Named as the Twisted flavour names it (wait_for's has no text).
            raise TimeoutError(f"no answer to TestConn from {uri} within {timeout:g} s") \
                from None

    async def close(self) -> None:
        """Disconnect politely: DisconnRqst, then the router's DisconnRply,
        which says everything sent before has reached it. Iterators then
        end normally. If the router does not confirm (no DisconnRply
        within 5 s, or the channel ends first) while something sent is
        unconfirmed, or notifications waiting to be sent while
        reconnecting are dropped, the connection is closed all the same
        and CloseUnconfirmed is raised (also ``close_reason``, and logged),
        naming how many packets and bytes may not have reached it."""
        already = self.lifecycle.phase is Phase.CLOSED
        self.lifecycle.close()
        await asyncio.shield(self.closed)
        error = self.close_reason
        if not already and isinstance(error, CloseUnconfirmed):
            raise error

    async def __aenter__(self) -> "Connection":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.close()
        except CloseUnconfirmed:
            if exc[0] is None:
                raise
            # The block's own error goes on; this one was logged.


def _ssl_context(tls_ca: Union[str, bytes, None],
                 tls_certificate: Optional[str], tls_key: Optional[str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls_ca if isinstance(tls_ca, str) else None,
                                         cadata=tls_ca.decode() if isinstance(tls_ca, bytes)
                                         else None)
    if tls_certificate is not None:
        context.load_cert_chain(tls_certificate, tls_key)
    return context


async def _open(uri: ElvinURI, loop: asyncio.AbstractEventLoop,
                protocol_factory: Callable[[], asyncio.Protocol], tls: Optional[ssl.SSLContext],
                tls_ca: Union[str, bytes, None], tls_certificate: Optional[str],
                tls_key: Optional[str], tls_hostname: Optional[str]) -> Any:
    problem = version_problem(uri) or stack_problem(uri)
    if problem is not None:
        raise ConnectFailed(problem)
    if uri.transport not in ("tcp", "ssl", "tls"):
        if uri.transport == "udp":
            why = ("udp,none,xdr carries only UNotify datagrams and has no sessions "
                   "(use unotify)")
        else:
            why = (f"{','.join(uri.protocol)} is not one of them (the HTTP tunnel is "
                   "elvin.client's only)")
        raise ConnectFailed(f"{uri}: the asyncio and blocking clients (elvin.aio, "
                            f"elvin.sync) speak tcp and TLS stacks; {why}")
    problem = options_problem(uri)
    if problem is not None:
        raise ConnectFailed(problem)
    kwargs: Dict[str, Any] = {}
    if uri.is_secure:
        kwargs["ssl"] = tls or _ssl_context(tls_ca, tls_certificate, tls_key)
        kwargs["server_hostname"] = tls_hostname or uri.host
    return await loop.create_connection(protocol_factory, uri.host, uri.port, **kwargs)


def _connect_error(connection: Connection, cause: BaseException,
                   timeout: Optional[float]) -> BaseException:
    """What ``connect`` raises for the lifecycle's ConnectFailed ``cause``:
    the Twisted client's words (``elvin.clientcore.messages``)."""
    target = connection.uri
    if isinstance(cause, (NackError, ConnectFailed)):
        return cause
    if isinstance(cause, HandshakeTimeout):
        return ConnectFailed(messages.handshake_timeout(target, timeout or 0))
    if isinstance(cause, ConnectionClosed):
        text = messages.handshake_lost(target, connection.problem, connection.first_bytes,
                                       cause)
        return ConnectFailed(text, cause.reason, cause.disconn_args)
    return _dial_error(target, cause)


def _dial_error(target: ElvinURI, cause: BaseException) -> BaseException:
    """ConnectFailed, in ``connect``'s words, for a channel to ``target``
    that could not be opened (``cause``: what ``_open`` raised)."""
    if isinstance(cause, ConnectFailed):
        return cause
    if isinstance(cause, ssl.SSLError):
        return ConnectFailed(messages.tls_failed(
            target, getattr(cause, "verify_message", None) or cause.reason or str(cause)))
    if target.is_secure and isinstance(cause, (ConnectionResetError, ConnectionAbortedError)):
        # The peer hung up on the ClientHello: e.g. a plain listener.
        return ConnectFailed(messages.tls_failed(target, str(cause)))
    if isinstance(cause, ConnectionRefusedError):
        kind: Optional[str] = "refused"
    elif isinstance(cause, socket.gaierror):
        kind = "unresolved"
    elif isinstance(cause, (TimeoutError, asyncio.TimeoutError)):
        kind = "timeout"
    else:
        kind = None
    return ConnectFailed(messages.cannot_connect(target, cause, kind))


def connect(uri: URIs = None,
            options: Optional[Mapping[str, Any]] = None,
            nfn_keys: Optional[packets.Keys] = None, sub_keys: Optional[packets.Keys] = None, *,
            tls: Optional[ssl.SSLContext] = None, tls_ca: Union[str, bytes, None] = None,
            tls_certificate: Optional[str] = None, tls_key: Optional[str] = None,
            tls_hostname: Optional[str] = None,
            timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT,
            reconnect: Union[bool, Reconnect] = False, retry_connect: bool = False,
            pending_size: int = DEFAULT_PENDING_SIZE,
            receive_queue: int = DEFAULT_RECEIVE_QUEUE,
            follow_redirects: bool = True,
            on_disconnect: Optional[Callable[[int, str], Any]] = None,
            on_dropwarn: Optional[Callable[[], Any]] = None,
            scope: Optional[str] = None, discover: bool = False, discoverer: Any = None,
            discovery_timeout: float = 10.0,
            discovery_interface: Optional[str] = None, session: SessionArg = None,
            password: Optional[str] = None, admin_password: Optional[str] = None,
            receipt: Optional[str] = None, client: Optional[str] = None,
            ttl: Optional[int] = None, max_count: Optional[int] = None,
            on_notification: Optional[NoteCallback] = None,
            ack_window: Optional[int] = None,
            liveness: Optional[float] = DEFAULT_LIVENESS) -> "_Pending[Connection]":
    """Connect to the router at ``uri`` (default elvin://localhost:2917; a
    list of URIs: the first that answers, failing over between them).

    ``await`` it for a Connection, or ``async with elvin.aio.connect(...)
    as conn`` to close it on exit. ``options`` are connection options to
    request; the router's answer is in ``conn.options``. TLS stacks verify
    the router's certificate against ``tls_ca`` (a PEM file path or PEM
    bytes; default the platform's trust store) and ``tls_hostname``
    (default the URI's host); ``tls_certificate``/``tls_key`` are
    presented to routers that verify clients; ``tls`` takes a ready
    ``ssl.SSLContext``. ``timeout`` bounds each connect and handshake;
    a failure raises ConnectFailed naming the URI, a Nack raises NackError.

    ``reconnect=True`` (or an ``elvin.client.state.Reconnect`` policy)
    keeps the session across lost channels (see Connection);
    ``retry_connect=True`` retries the first connect by the same policy
    instead of raising. While reconnecting, notifications and requests
    wait in a buffer of ``pending_size`` bytes (0: refuse them with
    ConnectionClosed). ``receive_queue``: notifications held for the
    program (iterators' queues, running coroutine callbacks) before the
    connection stops reading (docs/client.md). ``follow_redirects``,
    ``on_disconnect(reason, text)`` and ``on_dropwarn()`` set the
    connection's attributes of those names before the handshake.
    ``liveness`` (seconds, default 60; 0 or None: off): after that long
    without a packet from the router the connection sends TestConn, and
    when nothing answers within ``timeout`` (or ``liveness`` without one)
    the channel is lost, as if the socket had closed (docs/client.md,
    "Liveness").

    Without a ``uri``, ``discover=True``, a ``scope`` or a started
    ``elvin.discovery.aio.AsyncioDiscoverer`` finds a router by ERDP
    multicast (on ``discovery_interface``; docs/discovery.md): each usable
    URI is tried in turn for up to ``discovery_timeout`` seconds, and
    ``conn.router`` is the router chosen. NoRouterFound if none answers.

    Through an Elvin proxy, ``session`` and the arguments after it join
    sessions as for ``elvin.client.connect`` (docs/proxy.md); the
    connection is returned once the proxy has told us their subscriptions.
    What the sessions stored follows at once: pass ``on_notification`` (a
    callable taking each Notification, set before the handshake) to see it.
    The proxy is told what the program has handled (``ack_window``: how
    many it may have unacknowledged, default 256, 0: none; docs/client.md,
    "Proxy sessions"): a notification is handled once ``on_notification``
    and its callbacks have returned, a coroutine callback has finished, or
    an iterator has yielded it.
    """
    session_options, session_names = proxy_options(session, password, admin_password,
                                                   receipt, client, ttl, max_count,
                                                   ack_window)
    if session_options:
        options = {**(options or {}), **session_options}
    settings: Dict[str, Any] = dict(
        tls=tls, tls_ca=tls_ca, tls_certificate=tls_certificate, tls_key=tls_key,
        tls_hostname=tls_hostname, reconnect=reconnect, retry_connect=retry_connect,
        pending_size=pending_size, receive_queue=receive_queue,
        follow_redirects=follow_redirects, on_disconnect=on_disconnect,
        on_dropwarn=on_dropwarn, liveness=liveness)

    async def opened() -> Connection:
        if uri is None and (discover or scope is not None or discoverer is not None):
            return await _connect_discovered(scope, discoverer, discovery_timeout,
                                             discovery_interface, options, nfn_keys,
                                             sub_keys, timeout, settings)
        loop = asyncio.get_running_loop()
        connection = Connection(_uris(uri), loop, Reconnect.from_argument(reconnect),
                                retry_connect=retry_connect, timeout=timeout,
                                pending_size=pending_size, receive_queue=receive_queue,
                                open_args=(tls, tls_ca, tls_certificate, tls_key,
                                           tls_hostname))
        connection.on_notification = on_notification
        connection.follow_redirects = follow_redirects
        connection.on_disconnect = on_disconnect
        connection.on_dropwarn = on_dropwarn
        connection.liveness = liveness
        joined: "asyncio.Future[None]" = loop.create_future()
        if session_names:
            connection.expect_joins(session_names, lambda: _settle(joined))
        connection.lifecycle.start(options, nfn_keys, sub_keys)
        try:
            await asyncio.shield(connection.opened)
        except asyncio.CancelledError:
            connection.lifecycle.close()
            opened = connection.opened
            if opened.done() and not opened.cancelled():
                opened.exception()        # ours: nobody else will retrieve it
            raise
        except Exception as e:
            raise _connect_error(connection, e, timeout) from None
        target = connection.uri
        if session_names:
            if "Proxy.Receipt" not in connection.options:
                await connection.close()
                raise ConnectFailed(f"{target} accepted the connection but not the session: "
                                    "it is a router, not an Elvin proxy (docs/proxy.md)")
            try:
                await asyncio.wait_for(asyncio.shield(joined), timeout or None)
            except asyncio.TimeoutError:
                await connection.close()
                raise ConnectFailed(f"{target} did not report joining "
                                    f"{', '.join(session_names)} within {timeout:g} s") from None
        return connection

    async def close(connection: Optional[Connection]) -> None:
        if connection is not None:
            await connection.close()
    return _Pending(opened(), close)


async def _connect_discovered(scope: Optional[str], discoverer: Any, discovery_timeout: float,
                              interface: Optional[str], options: Any, nfn_keys: Any,
                              sub_keys: Any, timeout: Optional[float],
                              settings: Dict[str, Any]) -> Connection:
    """Try each router discovery offers until one takes a session."""
    from elvin.discovery.aio import AsyncioDiscoverer, NoRouterFound
    loop = asyncio.get_running_loop()
    own = discoverer is None
    finder = discoverer if discoverer is not None else AsyncioDiscoverer(loop,
                                                                        interface=interface)
    if own:
        await finder.start()
    failures: List[str] = []
    tried: set = set()
    deadline = loop.time() + discovery_timeout
    try:
        while True:
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise NoRouterFound(f"no Elvin router found by discovery in "
                                        f"{discovery_timeout:g} s"
                                        + (f" (scope {scope!r})" if scope else ""))
                found = await finder.find(scope, remaining, exclude=tried)
            except NoRouterFound as e:
                if failures:
                    raise NoRouterFound(f"{e.message}; could not connect to "
                                        + "; ".join(failures)) from None
                raise
            for record, candidate in found:
                tried.add((record.name, record.revision, candidate))
                left = max(0.5, deadline - loop.time())
                try:
                    conn = await connect(candidate, options, nfn_keys, sub_keys,
                                         timeout=min(timeout or left, left), **settings)
                except (ConnectFailed, NackError) as e:
                    failures.append(f"{candidate} ({e})")
                    continue
                conn.router = record
                return conn
    finally:
        if own:
            await finder.stop()


class _Raw(asyncio.Protocol):
    """A stream channel that only sends (``unotify``): what the peer sent
    first, and why the channel ended, for the error if it ends first."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.done: "asyncio.Future[None]" = loop.create_future()
        self.first_bytes: Optional[bytes] = None
        self.lost = ""

    def data_received(self, data: bytes) -> None:
        if self.first_bytes is None:
            self.first_bytes = bytes(data[:16])

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.lost = str(exc) if exc else ""
        _settle(self.done)


async def unotify(uri: Union[str, ElvinURI], attributes: Mapping[str, Any],
                  deliver_insecure: bool = True, keys: Optional[packets.Keys] = None, *,
                  tls: Optional[ssl.SSLContext] = None,
                  tls_ca: Union[str, bytes, None] = None,
                  tls_certificate: Optional[str] = None, tls_key: Optional[str] = None,
                  tls_hostname: Optional[str] = None,
                  timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT) -> None:
    """Send one session-less notification (UNotify). Over
    ``udp,none,xdr`` it is one datagram and nothing confirms it arrived.
    Fails with ``ConnectFailed``, in ``connect``'s words, when the channel
    cannot be opened (TLS handshake included), or the peer answers or
    hangs up before the client does. ``timeout`` (seconds; 0 or None:
    none) bounds the connect with its TLS handshake, and then the close
    (a channel not closed in time is aborted)."""
    target = ElvinURI(uri) if not isinstance(uri, ElvinURI) else uri
    packet = packets.UNotify(4, 0, normalise(attributes), deliver_insecure, keys or packets.Keys.EMPTY)
    data = packets.encode(packet)
    loop = asyncio.get_running_loop()
    problem = version_problem(target) or stack_problem(target) or options_problem(target)
    if problem is not None:
        raise ConnectFailed(problem)
    if target.transport == "udp":
        transport, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, remote_addr=(target.host, target.port))
        try:
            transport.sendto(data)
        finally:
            transport.close()
        return
    raw = _Raw(loop)
    try:
        transport, _ = await asyncio.wait_for(
            _open(target, loop, lambda: raw, tls, tls_ca, tls_certificate, tls_key,
                  tls_hostname), timeout or None)
    except asyncio.TimeoutError as e:
        raise ConnectFailed(messages.unotify_timeout(target, timeout or 0)
                            if target.is_secure
                            else messages.cannot_connect(target, e, "timeout")) from None
    except OSError as e:                           # ssl.SSLError is an OSError
        raise _dial_error(target, e) from e
    if transport.get_extra_info("ssl_object") is not None:
        await asyncio.sleep(TLS_FIRST_PACKET_DELAY)
    transport.write(len(data).to_bytes(4, "big") + data)
    await asyncio.sleep(UNOTIFY_LINGER)
    if raw.done.done() or raw.first_bytes is not None:
        # The peer answered or hung up first: no Elvin router does either.
        transport.abort()
        raise ConnectFailed(messages.unotify_lost(
            target, "not_elvin" if raw.first_bytes else None, raw.first_bytes, raw.lost,
            True))
    transport.close()
    try:
        await asyncio.wait_for(asyncio.shield(raw.done), timeout or None)
    except asyncio.TimeoutError:
        transport.abort()                 # the peer did not answer the close
