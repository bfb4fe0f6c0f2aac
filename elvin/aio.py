"""The Elvin client for asyncio programs (issue 16): no Twisted reactor.

    import elvin.aio

    async with elvin.aio.connect("elvin://localhost:2917") as conn:
        conn.notify({"Group": "chat", "Message": "hello"})
        async with conn.subscribe('Group == "chat"') as sub:
            async for note in sub:
                print(note["Message"])

The session logic is ``elvin.client.state.ClientState``, the same state
machine the Twisted client runs; this module adds only asyncio transports
and futures. Errors are the same classes: ``NackError`` when the router
refuses a request, ``ConnectionClosed`` when the session ends under a
request, ``ConnectFailed`` when ``connect`` cannot open one.
"""

import asyncio
import itertools
import logging
import socket
import ssl
from typing import (Any, Awaitable, Callable, Coroutine, Dict, Generator, Generic, Iterable,
                    List, Mapping, NoReturn, Optional, Tuple, TypeVar, Union)

from elvin.client.state import (ClientState, ConnectFailed, ConnectionClosed, Deframer,
                                NackError, Notification, QuenchHandlers, QuenchState,
                                Reconnect, AutoQuenchBase, SessionArg, proxy_options)
from elvin.core.options import OPTIONS
from elvin.keys import Keys, consumer_keys, dual_keys, producer_keys
from elvin.protocols import packets as P
from elvin.protocols.xdr import DecodeError
from elvin.uri import ElvinURI
from elvin.values import normalise

__all__ = ["connect", "unotify", "Connection", "Subscription", "Quench", "Reconnect",
           "AutoQuench",
           "NackError",
           "ConnectionClosed", "ConnectFailed", "Notification", "DEFAULT_URI",
           "DEFAULT_CONNECT_TIMEOUT",
           "Keys", "producer_keys", "consumer_keys", "dual_keys"]

DEFAULT_URI = "elvin://localhost:2917"
#: Seconds ``connect`` waits for the channel and for the router's ConnRply.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds ``unotify`` keeps a stream channel open after sending (a router
#: may drop what it has not read when it sees the channel close).
UNOTIFY_LINGER = 0.1
_MAX_FRAME = OPTIONS["Packet.Max-Length"].high
_END = object()
T = TypeVar("T")
#: What a subscription's callback is given.
NoteCallback = Callable[[Notification], Any]

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


class _Protocol(asyncio.Protocol):
    """Bytes to packets for one Connection."""

    def __init__(self, connection: "Connection") -> None:
        self.connection = connection
        self.deframer = Deframer(_MAX_FRAME)
        self.transport: Any = None
        self.done: "asyncio.Future[None]" = connection.loop.create_future()    # set when this channel ends

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.connection._attached(self)

    def data_received(self, data: bytes) -> None:
        connection = self.connection
        if connection.first_bytes is None:
            connection.first_bytes = bytes(data[:16])
        try:
            for frame in self.deframer.feed(data):
                connection.packet_received(P.decode(frame))
        except (ValueError, DecodeError):
            connection.problem = "not_elvin"
            self.transport.abort()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        _settle(self.done)
        self.connection._lost(self, exc)

    def send(self, packet: Any) -> None:
        data = P.encode(packet)
        self.transport.write(len(data).to_bytes(4, "big") + data)


class Subscription:
    """A subscription registered with the router.

    Without a callback it is an async iterator of ``Notification``s
    (``async for note in sub``), which ends when the subscription is
    removed and raises ``ConnectionClosed`` when the session ends. With
    ``callback``, each notification is passed to it instead. As an async
    context manager it removes itself on exit.
    """

    def __init__(self, connection: "Connection", sub_id: int, expression: str,
                 accept_insecure: bool, callback: Optional[NoteCallback] = None,
                 keys: Optional[P.Keys] = None) -> None:
        self.connection = connection
        self.keys = keys          # as subscribed: registered again with these
        self.id = sub_id
        self.expression = expression
        self.accept_insecure = accept_insecure
        self.callback = callback
        self._queue: Optional["asyncio.Queue[Any]"] = asyncio.Queue() if callback is None else None
        self._ended: Any = None
        #: Called (on the loop) with the error, or None, when it ends.
        self.on_end: Optional[Callable[[Optional[Exception]], Any]] = None

    def _deliver_note(self, note: Notification) -> None:
        if self.callback is not None:
            self.callback(note)
        elif self._queue is not None:
            self._queue.put_nowait(note)

    def _end(self, error: Optional[Exception] = None) -> None:
        if self._ended is None:
            self._ended = error or _END
            if self._queue is not None:
                self._queue.put_nowait(_END)
            if self.on_end is not None:
                self.on_end(error)

    async def modify(self, expression: Optional[str] = None,
                     accept_insecure: Optional[bool] = None,
                     add_keys: Optional[P.Keys] = None,
                     del_keys: Optional[P.Keys] = None) -> "Subscription":
        """Change the expression, insecure flag or keys; returns self."""
        conn = self.connection
        insecure = self.accept_insecure if accept_insecure is None else accept_insecure
        reply = await conn._call(conn.sub_mod_rqst(self.id, expression, insecure,
                                                   add_keys, del_keys))
        return conn.subscription_modified(self, expression, insecure, reply)

    async def remove(self) -> None:
        """Delete the subscription (iteration then ends)."""
        conn = self.connection
        if self._ended is None:
            await conn._call(conn.sub_del_rqst(self.id))
        conn.subscriptions.pop(self.id, None)
        self._end()

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
            return self._finish()
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
                     add_keys: Optional[P.Keys] = None,
                     del_keys: Optional[P.Keys] = None) -> "Quench":
        conn = self.connection
        insecure = self.deliver_insecure if deliver_insecure is None else deliver_insecure
        await conn._call(conn.qnch_mod_rqst(self.id, add_names, del_names, insecure,
                                            add_keys, del_keys))
        self.names = (self.names | set(add_names)) - set(del_names)
        self.deliver_insecure = insecure
        return self

    async def remove(self) -> None:
        conn = self.connection
        await conn._call(conn.qnch_del_rqst(self.id))
        conn.quenches.pop(self.id, None)


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
                 deliver_insecure: bool = True, keys: Optional[P.Keys] = None) -> None:
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
            logging.getLogger("elvin.aio").warning("auto-quench registration failed: %s", e)
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
        return self._coroutine.__await__()

    async def __aenter__(self) -> T:
        self._made = await self._coroutine
        return self._made

    async def __aexit__(self, *exc: Any) -> None:
        await self._close(self._made)


class Connection(ClientState):
    """A session with an Elvin router (made by ``connect``).

    With ``reconnect`` (see ``connect``), a lost channel is not the end of
    the session: ``on_connection_lost(error)`` is called, requests raise
    ConnectionClosed meanwhile, and the connection dials again with
    backoff, connects with the options and keys it first had, replays its
    key changes and registers its subscriptions and quenches again (they
    get new router ids; iterators carry on), then calls
    ``on_reconnected(connection)``. If it gives up, it ends as without
    reconnection: subscriptions' iterators raise ConnectionClosed and
    ``closed`` is set.
    """

    def __init__(self, uri: ElvinURI, loop: Optional[asyncio.AbstractEventLoop] = None,
                 dial: Optional[Callable[[Callable[[], _Protocol]], Awaitable[Any]]] = None,
                 reconnect: Optional[Reconnect] = None) -> None:
        super().__init__()
        self.uri = uri
        self.loop = loop or asyncio.get_running_loop()
        self.protocol: Optional[_Protocol] = None
        self.first_bytes: Optional[bytes] = None
        self.problem: Optional[str] = None
        self.closed: "asyncio.Future[None]" = self.loop.create_future()  # the session ended
        self._closing: Optional["asyncio.Task[None]"] = None
        self._dial = dial                 # coroutine function: open a channel
        self._connect_args: Optional[Tuple[Any, Any, Any, Optional[float]]] = None
        self.reconnect = reconnect
        self.reconnects = 0
        self.on_connection_lost: Optional[Callable[[ConnectionClosed], Any]] = None
        self.on_reconnected: Optional[Callable[["Connection"], Any]] = None
        self._reconnecting: Optional["asyncio.Task[None]"] = None
        #: TLS arguments of ``_open``, kept to follow a redirection.
        self._open_args: Tuple[Any, ...] = (None, None, None, None, None)
        #: the discovery record of the router, when discovery chose it
        self.router: Any = None

    # -- transport callbacks -------------------------------------------------

    def _attached(self, protocol: _Protocol) -> None:
        self.protocol = protocol
        self.reopened(protocol.send)

    def _lost(self, protocol: _Protocol, exc: Optional[Exception]) -> None:
        if protocol is not self.protocol:
            return                        # a channel already replaced
        why = f": {exc}" if exc else ""
        error = ConnectionClosed(f"connection to the router was lost{why}")
        self.connection_lost(error)
        if self._reconnecting is not None and not self._reconnecting.done():
            return                        # a reconnect attempt's channel: it goes on
        target, self.redirect_to = self.redirect_to, None
        if (target and self.follow_redirects and self._closing is None
                and self._connect_args and self._redirected(target)):
            return
        if self.reconnect is not None and self._closing is None and self._connect_args:
            if self.on_connection_lost is not None:
                self.on_connection_lost(error)
            self._reconnecting = self.loop.create_task(self._reconnect())
            return
        self._finish(error)

    def _redirected(self, target: str) -> bool:
        """Follow a redirection (Disconn 2) to ``target`` at once, as a
        reconnection (elvin.client's Connection does the same)."""
        if not self.redirect_allowed(self.loop.time()):
            _log.warning("redirected more than 5 times in 10 s (a loop?); giving up at %r",
                         target)
            self._finish(ConnectionClosed(f"redirection loop, last to {target}"))
            return True
        try:
            uri = ElvinURI(target)
        except Exception as e:
            _log.warning("router redirected us to %r, which we cannot use: %s", target, e)
            return False
        open_args, loop = self._open_args, self.loop

        async def dial(protocol_factory: Callable[[], _Protocol]) -> Any:
            return await _open(uri, loop, protocol_factory, *open_args)
        self.uri, self._dial = uri, dial
        self.redirected(uri)
        self._reconnecting = self.loop.create_task(self._reconnect(at_once=True))
        return True

    def _finish(self, error: Optional[Exception] = None) -> None:
        """The session is over: end the iterators, set ``closed``."""
        self._closed = True
        for sub in list(self.subscriptions.values()):
            sub._end(error)
        _settle(self.closed)

    async def _handshake(self, options: Optional[Mapping[str, Any]], nfn_keys: Optional[P.Keys],
                         sub_keys: Optional[P.Keys], timeout: Optional[float]) -> None:
        """Open a channel and send ConnRqst; raises ConnectFailed/NackError."""
        target = self.uri
        assert self._dial is not None, "a Connection made by connect() can dial"
        try:
            await asyncio.wait_for(self._dial(lambda: _Protocol(self)), timeout or None)
        except ConnectFailed:
            raise
        except ConnectionRefusedError as e:
            raise ConnectFailed(f"{target}: connection refused: is the router running "
                                f"there?") from e
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as e:
            raise ConnectFailed(f"{target}: cannot connect: {e or 'timed out'}") from e
        protocol = self.protocol
        assert protocol is not None      # connection_made has run
        try:
            reply = await asyncio.wait_for(
                self._call(self.conn_rqst(options, nfn_keys, sub_keys)), timeout or None)
        except asyncio.TimeoutError:
            protocol.transport.abort()
            raise ConnectFailed(f"no Elvin ConnRply from {target} within {timeout:g} s: "
                                f"is this an Elvin router?") from None
        except NackError:
            protocol.transport.abort()
            raise
        except ConnectionClosed as e:
            raise ConnectFailed(f"{target} closed the connection before ConnRply"
                                + (" (it is not Elvin)" if self.problem else "")) from e
        self.options = dict(reply.options)
        self._connect_args = (options, nfn_keys, sub_keys, timeout)

    async def _reconnect(self, at_once: bool = False) -> None:
        last = None
        assert self._connect_args is not None
        policy = self.reconnect or Reconnect()
        delays = itertools.chain([0.0], policy.delays()) if at_once else policy.delays()
        for delay in delays:
            await asyncio.sleep(delay)
            if self._closing is not None:
                return
            try:
                await self._handshake(*self._connect_args)
                for make_packet, apply, owner in self.replay():
                    try:
                        reply = await self._call(make_packet)
                    except NackError as e:
                        if owner is None:
                            raise
                        # The router will not take it back (a new limit,
                        # say): it ends, and its iterator says why.
                        self.drop(*owner)
                        if hasattr(owner[1], "_end"):
                            owner[1]._end(e)
                        continue
                    if apply is not None:
                        apply(reply)
            except (ConnectFailed, ConnectionClosed, NackError) as e:
                last = e
                if self.protocol is not None and self.protocol.transport is not None:
                    self.protocol.transport.abort()
                continue
            self.reconnects += 1
            if self.on_reconnected is not None:
                self.on_reconnected(self)
            return
        self._finish(ConnectionClosed(f"gave up reconnecting to {self.uri}: {last}"))

    # -- requests --------------------------------------------------------------

    async def _call(self, make_packet: Callable[[int], Any]) -> Any:
        future = self.loop.create_future()
        self.request(make_packet,
                     lambda reply: _settle(future, reply),
                     lambda error: _settle(future, error=error))
        return await future

    def notify(self, attributes: Mapping[str, Any], deliver_insecure: bool = True,
               keys: Optional[P.Keys] = None) -> None:
        """Emit a notification (nothing comes back; errors are local)."""
        self.emit(attributes, deliver_insecure, keys)

    def subscribe(self, expression: str, callback: Optional[NoteCallback] = None,
                  accept_insecure: bool = True,
                  keys: Optional[P.Keys] = None) -> "_Pending[Subscription]":
        """Register ``expression``: ``await`` it for a ``Subscription``, or
        ``async with conn.subscribe(...) as sub`` to remove it on exit.
        A bad expression raises NackError (code 2101-2112)."""
        async def subscribed() -> Subscription:
            reply = await self._call(self.sub_add_rqst(expression, accept_insecure, keys))
            sub = Subscription(self, reply.subscription_id, expression, accept_insecure,
                               callback, keys)
            self.subscriptions[sub.id] = sub
            self.subscribed_in_session(sub.id, expression, accept_insecure)
            return sub

        async def remove(sub: Optional[Subscription]) -> None:
            if sub is not None and sub._ended is None and not self.is_closed:
                await sub.remove()
        return _Pending(subscribed(), remove)

    async def quench(self, names: Iterable[str], on_add: Optional[QuenchCallback] = None,
                     on_modify: Optional[QuenchCallback] = None,
                     on_delete: Optional[Callable[[int], Any]] = None,
                     deliver_insecure: bool = True,
                     keys: Optional[P.Keys] = None) -> Quench:
        """Be told of subscriptions referring to ``names`` (see Quench)."""
        names = tuple(sorted(set(names)))
        reply = await self._call(self.qnch_add_rqst(names, deliver_insecure, keys))
        quench = Quench(self, reply.quench_id, names, on_add, on_modify, on_delete,
                        deliver_insecure)
        quench.keys = keys
        self.quenches[quench.id] = quench
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

    async def set_keys(self, add_nfn_keys: Optional[P.Keys] = None,
                       del_nfn_keys: Optional[P.Keys] = None,
                       add_sub_keys: Optional[P.Keys] = None,
                       del_sub_keys: Optional[P.Keys] = None) -> None:
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
        return await asyncio.wait_for(future, timeout)

    async def close(self) -> None:
        """Disconnect politely (DisconnRqst, wait for DisconnRply)."""
        if self._closing is None:
            self._closing = self.loop.create_task(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        reconnecting = self._reconnecting
        if reconnecting is not None and not reconnecting.done():
            reconnecting.cancel()
        protocol = self.protocol
        if not self.is_closed and protocol is not None:
            try:
                await self._call(self.disconn_rqst())
            except (ConnectionClosed, NackError):
                pass
        self._closed = True
        if protocol is not None:
            protocol.transport.close()
            await protocol.done
        self._finish()

    async def __aenter__(self) -> "Connection":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def _ssl_context(tls_ca: Union[str, bytes, None],
                 tls_certificate: Optional[str], tls_key: Optional[str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls_ca if isinstance(tls_ca, str) else None,
                                         cadata=tls_ca.decode() if isinstance(tls_ca, bytes)
                                         else None)
    if tls_certificate is not None:
        context.load_cert_chain(tls_certificate, tls_key)
    return context


async def _open(uri: ElvinURI, loop: asyncio.AbstractEventLoop,
                protocol_factory: Callable[[], _Protocol], tls: Optional[ssl.SSLContext],
                tls_ca: Union[str, bytes, None], tls_certificate: Optional[str],
                tls_key: Optional[str], tls_hostname: Optional[str]) -> Any:
    if uri.transport not in ("tcp", "ssl", "tls"):
        raise ConnectFailed(f"{uri}: elvin.aio speaks tcp and TLS stacks; "
                            f"{','.join(uri.protocol)} is not supported here "
                            f"(use elvin.client for HTTP)")
    kwargs: Dict[str, Any] = {}
    if uri.is_secure:
        kwargs["ssl"] = tls or _ssl_context(tls_ca, tls_certificate, tls_key)
        kwargs["server_hostname"] = tls_hostname or uri.host
    return await loop.create_connection(protocol_factory, uri.host, uri.port, **kwargs)


def connect(uri: Union[str, ElvinURI, None] = None,
            options: Optional[Mapping[str, Any]] = None,
            nfn_keys: Optional[P.Keys] = None, sub_keys: Optional[P.Keys] = None, *,
            tls: Optional[ssl.SSLContext] = None, tls_ca: Union[str, bytes, None] = None,
            tls_certificate: Optional[str] = None, tls_key: Optional[str] = None,
            tls_hostname: Optional[str] = None,
            timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT,
            reconnect: Union[bool, Reconnect] = False,
            scope: Optional[str] = None, discover: bool = False, discoverer: Any = None,
            discovery_timeout: float = 10.0,
            discovery_interface: Optional[str] = None, session: SessionArg = None,
            password: Optional[str] = None, admin_password: Optional[str] = None,
            receipt: Optional[str] = None, client: Optional[str] = None,
            ttl: Optional[int] = None, max_count: Optional[int] = None,
            on_notification: Optional[NoteCallback] = None) -> "_Pending[Connection]":
    """Connect to the router at ``uri`` (default elvin://localhost:2917).

    ``await`` it for a Connection, or ``async with elvin.aio.connect(...)
    as conn`` to close it on exit. ``options`` are connection options to
    request; the router's answer is in ``conn.options``. TLS stacks verify
    the router's certificate against ``tls_ca`` (a PEM file path or PEM
    bytes; default the platform's trust store) and ``tls_hostname``
    (default the URI's host); ``tls_certificate``/``tls_key`` are
    presented to routers that verify clients; ``tls`` takes a ready
    ``ssl.SSLContext``. ``timeout`` bounds the connect and the handshake;
    a failure raises ConnectFailed naming the URI, a Nack raises NackError.
    ``reconnect=True`` (or an ``elvin.client.state.Reconnect`` policy)
    keeps the session across lost channels (see Connection).

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
    """
    session_options, session_names = proxy_options(session, password, admin_password,
                                                   receipt, client, ttl, max_count)
    if session_options:
        options = {**(options or {}), **session_options}
    kwargs: Dict[str, Any] = dict(
        tls=tls, tls_ca=tls_ca, tls_certificate=tls_certificate, tls_key=tls_key,
        tls_hostname=tls_hostname, reconnect=reconnect)

    async def opened() -> Connection:
        if uri is None and (discover or scope is not None or discoverer is not None):
            return await _connect_discovered(scope, discoverer, discovery_timeout,
                                             discovery_interface, options, nfn_keys,
                                             sub_keys, timeout, kwargs)
        target = ElvinURI(uri or DEFAULT_URI) if not isinstance(uri, ElvinURI) else uri
        loop = asyncio.get_running_loop()

        async def dial(protocol_factory: Callable[[], _Protocol]) -> Any:
            return await _open(target, loop, protocol_factory, tls, tls_ca,
                               tls_certificate, tls_key, tls_hostname)
        connection = Connection(target, loop, dial, Reconnect.from_argument(reconnect))
        connection._open_args = (tls, tls_ca, tls_certificate, tls_key, tls_hostname)
        connection.on_notification = on_notification
        joined: "asyncio.Future[None]" = loop.create_future()
        if session_names:
            connection.expect_joins(session_names, lambda: _settle(joined))
        await connection._handshake(options, nfn_keys, sub_keys, timeout)
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
                              kwargs: Dict[str, Any]) -> Connection:
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
                                         timeout=min(timeout or left, left), **kwargs)
                except (ConnectFailed, NackError) as e:
                    failures.append(f"{candidate} ({e})")
                    continue
                conn.router = record
                return conn
    finally:
        if own:
            await finder.stop()


async def unotify(uri: Union[str, ElvinURI], attributes: Mapping[str, Any],
                  deliver_insecure: bool = True, keys: Optional[P.Keys] = None, *,
                  tls: Optional[ssl.SSLContext] = None,
                  tls_ca: Union[str, bytes, None] = None,
                  tls_certificate: Optional[str] = None, tls_key: Optional[str] = None,
                  tls_hostname: Optional[str] = None) -> None:
    """Send one session-less notification (UNotify). Over
    ``udp,none,xdr`` it is one datagram and nothing confirms it arrived."""
    target = ElvinURI(uri) if not isinstance(uri, ElvinURI) else uri
    packet = P.UNotify(4, 0, normalise(attributes), deliver_insecure, keys or P.Keys.EMPTY)
    data = P.encode(packet)
    loop = asyncio.get_running_loop()
    if target.transport == "udp":
        transport, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, remote_addr=(target.host, target.port))
        try:
            transport.sendto(data)
        finally:
            transport.close()
        return
    connection = Connection(target, loop)
    await _open(target, loop, lambda: _Protocol(connection), tls, tls_ca, tls_certificate,
                tls_key, tls_hostname)
    protocol = connection.protocol
    assert protocol is not None
    protocol.transport.write(len(data).to_bytes(4, "big") + data)
    await asyncio.sleep(UNOTIFY_LINGER)
    protocol.transport.close()
    await protocol.done
