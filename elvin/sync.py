"""The blocking Elvin client: for scripts, notebooks, Django and
Flask apps, cron jobs, anything that is not an event loop.

    import elvin.sync

    elvin.sync.notify("elvin://localhost:2917", {"Group": "chat", "Message": "hi"})
    notes = elvin.sync.subscribe("elvin://localhost:2917", 'Group == "chat"', count=3)

    with elvin.sync.connect("elvin://localhost:2917") as conn:
        conn.notify({"Group": "chat", "Message": "hello"})
        for note in conn.subscribe('Group == "chat"', timeout=30):
            print(note["Message"])

It runs ``elvin.aio`` on one private asyncio event loop in a daemon thread
(started on first use, shared by every connection of the process), so
nothing about the caller's thread changes: no reactor, no event loop
installed, no signal handlers. Every method may be called from any thread;
the work happens on the private loop, in the order it was asked for.
Callbacks (subscription ``callback``, quench handlers) run on that loop's
thread and must not block it. At interpreter exit every connection still
open is closed politely (``atexit``), so what a script notified reaches
the router even if it never called ``close()``.
"""

import asyncio
import atexit
import logging
import queue
import ssl
import threading
from typing import (Any, Awaitable, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Set, TypeVar, Union)

from elvin import aio
from elvin.clientcore.lifecycle import (DEFAULT_PENDING_SIZE, DEFAULT_RECEIVE_QUEUE,
                                        Lifecycle, Phase, liveness_seconds)
from elvin.clientcore.state import ASK_LIMITS
from elvin.clientcore.state import (CloseUnconfirmed, ConnectFailed, ConnectionClosed,
                                    NackError, Notification,
                                    PublishBufferFull, Reconnect, RequestTimeout, SessionArg,
                                    refuse_coroutine)
from elvin.keys import Keys, consumer_keys, dual_keys, producer_keys
from elvin.uri import ElvinURI

__all__ = ["connect", "notify", "subscribe", "unotify", "Connection", "Subscription",
           "Quench", "AutoQuench", "Reconnect",
           "NackError", "ConnectionClosed", "ConnectFailed", "PublishBufferFull",
           "CloseUnconfirmed", "RequestTimeout", "Notification", "Keys", "producer_keys", "consumer_keys", "dual_keys", "ASK_LIMITS"]

_END = object()
T = TypeVar("T")
_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_lock = threading.Lock()
#: The connections not closed yet: closed at interpreter exit.
_open: Set[aio.Connection] = set()
#: Seconds the exit handler waits for each connection to close.
EXIT_CLOSE_TIMEOUT = 10.0
#: Notifications a consumer thread takes before telling the loop (the
#: receive bound's accounting, without a thread hand-off per notification).
_RELEASE_EVERY = 256
_log = logging.getLogger("elvin.sync")


def _private_loop() -> asyncio.AbstractEventLoop:
    """The process's private event loop, running in its daemon thread."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()
            threading.Thread(target=run, name="elvin.sync", daemon=True).start()
            started.wait()
            if _loop is None:
                atexit.register(_close_all)
            _loop = loop
        return _loop


def _close_all() -> None:
    """At interpreter exit: close every connection still open, politely,
    so what was notified reaches the router (the loop's thread is a
    daemon and would otherwise die with what it had not sent)."""
    loop = _loop
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    for inner in list(_open):
        try:
            asyncio.run_coroutine_threadsafe(inner.close(), loop).result(EXIT_CLOSE_TIMEOUT)
        except CloseUnconfirmed:
            pass                          # logged as it happened, with what is at risk
        except Exception as e:
            _log.warning("closing %s at exit: %s", inner.uri, e)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _call(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on the private loop (through ``_run``)."""
    return function(*args)


def _run(awaitable: Awaitable[T], timeout: Optional[float] = None) -> T:
    """Run ``awaitable`` on the private loop; its result (or exception)."""
    loop = _private_loop()
    coroutine = _awaited(awaitable)
    if threading.current_thread().name == "elvin.sync":
        coroutine.close()
        close = getattr(awaitable, "close", None)
        if close is not None:
            close()
        raise RuntimeError("elvin.sync called from one of its own callbacks: it would "
                           "wait for itself (use the callback's arguments, or elvin.aio)")
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise


class _Inbox:
    """An iterated subscription's queue between the loop's thread (which
    puts) and the program's (which takes), counted against the connection's
    receive bound (``Lifecycle.held``)."""

    def __init__(self, connection: aio.Connection) -> None:
        self.queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.connection = connection
        self.lifecycle: Lifecycle = connection.lifecycle
        self.loop = connection.loop
        #: Notifications the program took, not yet released on the loop
        #: (through a proxy session they are then handled: acknowledged).
        self._handled: List[Notification] = []
        self._handing = False
        self.held = 0             # on the loop's thread only
        self.ended = False        # on the loop's thread only
        self._taken = 0           # by the program's threads
        self._lock = threading.Lock()

    def put(self, note: Notification) -> None:
        self.queue.put(note)
        self.held += 1
        self.lifecycle.held(1)
        self.connection.ack_hold(note)  # handled once the program takes it

    #: The program's ``Subscription.on_end`` (called after the iterator's end).
    on_end: Optional[Callable[[Optional[BaseException]], Any]] = None

    def watch(self, inner: aio.Subscription) -> None:
        """On the loop: end with ``inner`` (at once if it has ended)."""
        def ended(error: Optional[BaseException]) -> None:
            self.end(error)
            if self.on_end is not None:
                inner._tell_end(self.on_end)
        inner.on_end = ended

    def set_on_end(self, inner: aio.Subscription,
                   hook: Optional[Callable[[Optional[BaseException]], Any]]) -> None:
        """On the loop: the program's hook, called at once if ``inner`` ended."""
        self.on_end = hook
        if hook is not None and inner._end_told:
            inner._tell_end(hook)

    def end(self, error: Optional[BaseException]) -> None:
        self.ended = True
        if self.held:
            self.lifecycle.held(-self.held)
            self.held = 0
        self.queue.put(error if error is not None else _END)

    def took(self, note: Notification) -> None:
        """A program thread took a notification: tell the loop now and
        then (every ``_RELEASE_EVERY``, or once the queue is empty while
        reading is paused); one taken through a proxy session that takes
        acknowledgements is handed to the loop at once (one wake-up for
        as many as the program takes meanwhile)."""
        with self._lock:
            if note.ack_token is not None:
                self._handled.append(note)
                if not self._handing:
                    self._handing = True
                    self.loop.call_soon_threadsafe(self._acknowledge)
            self._taken += 1
            if self._taken < _RELEASE_EVERY and not (
                    self.lifecycle.held_count >= self.lifecycle.receive_queue // 2
                    and self.queue.empty()):
                return
            count, self._taken = self._taken, 0
        self.loop.call_soon_threadsafe(self._release, count)

    def _acknowledge(self) -> None:
        with self._lock:
            notes, self._handled = self._handled, []
            self._handing = False
        for note in notes:
            self.connection.ack_release(note)

    def _release(self, count: int) -> None:
        if not self.ended:
            count = min(count, self.held)
            self.held -= count
            self.lifecycle.held(-count)


class Subscription:
    """A subscription: iterate it for ``Notification``s (blocking), or give
    ``callback`` to ``Connection.subscribe`` instead.

    Iteration ends when the subscription is removed or the connection
    closed by the program, or when ``timeout`` seconds pass without a
    notification (when ``subscribe`` was given one); it raises
    ConnectionClosed (with the router's Disconn reason, if any) if the
    session is lost. ``get(timeout)`` takes one notification (None on
    timeout). As a context manager it removes itself on exit.
    """

    def __init__(self, connection: "Connection", inner: aio.Subscription,
                 timeout: Optional[float], inbox: Optional[_Inbox]) -> None:
        self.connection = connection
        self._inner = inner
        self.timeout = timeout
        self._inbox = inbox

    @property
    def id(self) -> int:
        return self._inner.id

    @property
    def expression(self) -> str:
        return self._inner.expression

    def get(self, timeout: Optional[float] = None) -> Optional[Notification]:
        """The next notification, or None after ``timeout`` seconds."""
        inbox = self._inbox
        if inbox is None:
            raise TypeError("a subscription with a callback has no queue")
        try:
            item = inbox.queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END or isinstance(item, BaseException):
            inbox.queue.put(item)        # later calls see the end too
            if isinstance(item, BaseException):
                raise item
            return None
        note: Notification = item
        inbox.took(note)
        return note

    def __iter__(self) -> Iterator[Notification]:
        while True:
            note = self.get(self.timeout)
            if note is None:
                return
            yield note

    def modify(self, expression: Optional[str] = None, accept_insecure: Optional[bool] = None,
               add_keys: Optional[Keys] = None,
               del_keys: Optional[Keys] = None) -> "Subscription":
        """Change the expression, insecure flag or keys; returns self."""
        _run(self._inner.modify(expression, accept_insecure, add_keys, del_keys))
        return self

    def remove(self) -> None:
        """Delete the subscription (iteration then ends)."""
        _run(self._inner.remove())       # ends the iteration (see subscribe)

    @property
    def on_end(self) -> Optional[Callable[[Optional[BaseException]], Any]]:
        """Called once, on the client's thread, when the subscription ends:
        None when removed or the connection closed by the program, else
        the error that ended it (the session lost: a callback
        subscription's only sign of it). Set after the end, it is called
        at once."""
        inbox = self._inbox
        return inbox.on_end if inbox is not None else self._inner.on_end

    @on_end.setter
    def on_end(self, hook: Optional[Callable[[Optional[BaseException]], Any]]) -> None:
        inbox = self._inbox

        def install() -> None:
            if inbox is not None:
                inbox.set_on_end(self._inner, hook)
            else:
                self._inner.on_end = hook
        if threading.current_thread().name == "elvin.sync":
            install()                     # in a callback: on the loop already
        else:
            _run(_call(install))

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._inner._ended is None and not self.connection._inner.is_closed:
            self.remove()

    def __repr__(self) -> str:
        return f"<elvin.sync.Subscription {self.id} {self.expression!r}>"


class Quench:
    """A quench (see ``elvin.aio.Quench``) with blocking ``modify`` and
    ``remove``; its handlers run on the client's thread."""

    def __init__(self, inner: aio.Quench) -> None:
        self._inner = inner

    @property
    def id(self) -> int:
        return self._inner.id

    @property
    def names(self) -> frozenset:
        return frozenset(self._inner.names)

    @property
    def deliver_insecure(self) -> bool:
        return self._inner.deliver_insecure

    def modify(self, add_names: Iterable[str] = (), del_names: Iterable[str] = (),
               deliver_insecure: Optional[bool] = None, add_keys: Optional[Keys] = None,
               del_keys: Optional[Keys] = None) -> "Quench":
        """Change the names (and flags/keys); returns self."""
        _run(self._inner.modify(add_names, del_names, deliver_insecure, add_keys, del_keys))
        return self

    def remove(self) -> None:
        _run(self._inner.remove())

    def __repr__(self) -> str:
        return f"<elvin.sync.Quench {self.id} {sorted(self.names)}>"


class AutoQuench:
    """Auto-quench (see ``elvin.aio.AutoQuench``) for a blocking
    Connection: made by ``Connection.auto_quench``, which returns once the
    first registration is done. ``notify`` returns True when it sent."""

    def __init__(self, inner: aio.AutoQuench) -> None:
        self._inner = inner

    @property
    def sent(self) -> int:
        return self._inner.sent

    @property
    def dropped(self) -> int:
        return self._inner.dropped

    @property
    def unsupported(self) -> bool:
        """The router has no quench (Nack 2007): everything is sent."""
        return self._inner.unsupported

    def could_interest(self, attributes: Mapping[str, Any]) -> bool:
        """Could a subscription the router has told of match ``attributes``?"""
        async def ask() -> bool:
            return self._inner.state.could_interest(attributes)
        return _run(ask())

    def notify(self, attributes: Mapping[str, Any], deliver_insecure: bool = True,
               keys: Optional[Keys] = None) -> bool:
        # On the loop: the quench state changes there.
        async def send() -> bool:
            return self._inner.notify(attributes, deliver_insecure, keys)
        return _run(send())


class Connection:
    """A session with an Elvin router (made by ``connect``); a context
    manager that closes it on exit."""

    def __init__(self, inner: aio.Connection) -> None:
        self._inner = inner
        _open.add(inner)
        inner.closed.add_done_callback(lambda _: _open.discard(inner))

    @property
    def options(self) -> Dict[str, Any]:
        """The connection options the router granted."""
        return self._inner.options

    @property
    def uri(self) -> Any:
        return self._inner.uri

    @property
    def is_closed(self) -> bool:
        return self._inner.is_closed

    # With connect(..., reconnect=...): called on the client's thread.
    @property
    def on_connection_lost(self) -> Optional[Callable[[ConnectionClosed], Any]]:
        return self._inner.on_connection_lost

    @on_connection_lost.setter
    def on_connection_lost(self, callback: Optional[Callable[[ConnectionClosed], Any]]) -> None:
        self._inner.on_connection_lost = callback

    @property
    def on_reconnected(self) -> Optional[Callable[..., Any]]:
        return self._inner.on_reconnected

    @on_reconnected.setter
    def on_reconnected(self, callback: Optional[Callable[["Connection"], Any]]) -> None:
        self._inner.on_reconnected = (None if callback is None
                                      else lambda inner: callback(self))

    @property
    def close_reason(self) -> Optional[ConnectionClosed]:
        """None while the session lasts or when the program closed it, else
        the ConnectionClosed that ended it."""
        return self._inner.close_reason

    @property
    def liveness(self) -> Optional[float]:
        """Seconds of silence from the router before a TestConn checks it
        is alive (None: no check); see ``elvin.aio.connect``."""
        return self._inner.liveness

    @liveness.setter
    def liveness(self, seconds: Optional[float]) -> None:
        liveness_seconds(seconds)             # a bad value raises here, on this thread
        _run(_call(setattr, self._inner, "liveness", seconds))

    @property
    def timeout(self) -> Optional[float]:
        """Seconds each request waits for the router's reply (then it
        raises RequestTimeout; the connection stays open); see
        ``elvin.aio.Connection.timeout``."""
        return self._inner.timeout

    @timeout.setter
    def timeout(self, seconds: Optional[float]) -> None:
        liveness_seconds(seconds, "timeout")  # a bad value raises here, on this thread
        _run(_call(setattr, self._inner, "timeout", seconds))

    @property
    def reconnects(self) -> int:
        return self._inner.reconnects

    @property
    def on_redirect(self) -> Optional[Callable[[Any], Any]]:
        """Called (on the client's thread) with the new router's URI when a
        drained router redirects us and we follow (docs/client.md)."""
        return self._inner.on_redirect

    @on_redirect.setter
    def on_redirect(self, callback: Optional[Callable[[Any], Any]]) -> None:
        self._inner.on_redirect = callback

    @property
    def on_disconnect(self) -> Optional[Callable[[int, str], Any]]:
        """Called (on the client's thread) with the reason and text of the
        router's Disconn (1: shutting down, 2: redirect, with the URI)."""
        return self._inner.on_disconnect

    @on_disconnect.setter
    def on_disconnect(self, callback: Optional[Callable[[int, str], Any]]) -> None:
        self._inner.on_disconnect = callback

    @property
    def on_dropwarn(self) -> Optional[Callable[[], Any]]:
        """Called (on the client's thread) when the router says it dropped
        notifications for this connection (DropWarn); ``dropwarns`` counts."""
        return self._inner.on_dropwarn

    @on_dropwarn.setter
    def on_dropwarn(self, callback: Optional[Callable[[], Any]]) -> None:
        self._inner.on_dropwarn = callback

    @property
    def dropwarns(self) -> int:
        return self._inner.dropwarns

    @property
    def follow_redirects(self) -> bool:
        """Follow a drained router's redirection (default) or end the session."""
        return self._inner.follow_redirects

    @follow_redirects.setter
    def follow_redirects(self, value: bool) -> None:
        self._inner.follow_redirects = value

    @property
    def on_notification(self) -> Optional[Callable[[Notification], Any]]:
        """Called (on the client's thread) once per delivered notification,
        whichever subscriptions it matched: through a proxy session, also
        those stored while nobody was connected."""
        return self._inner.on_notification

    @on_notification.setter
    def on_notification(self, callback: Optional[Callable[[Notification], Any]]) -> None:
        self._inner.on_notification = callback

    @property
    def sessions(self) -> Dict[str, Any]:
        """Through an Elvin proxy: the sessions joined (docs/proxy.md)."""
        return self._inner.sessions

    @property
    def session_subscriptions(self) -> Dict[int, Any]:
        """Through an Elvin proxy: the joined sessions' subscriptions."""
        return self._inner.session_subscriptions

    def notify(self, attributes: Mapping[str, Any], deliver_insecure: bool = True,
               keys: Optional[Keys] = None) -> None:
        """Emit a notification. It is checked here (ValueError, TypeError,
        ConnectionClosed) and sent in order with everything else asked of
        this connection; nothing comes back from the router."""
        inner = self._inner
        if inner.is_closed:
            raise inner.lifecycle.closed_error()    # the router's Disconn, if it ended so
        packet = inner.notify_emit(attributes, deliver_insecure, keys)
        if inner.lifecycle.phase is Phase.UP:
            _private_loop().call_soon_threadsafe(self._emit, packet)
            return

        async def emit() -> None:       # reconnecting: the buffer may refuse it
            inner.post(packet, None)
        _run(emit())

    def _emit(self, packet: Any) -> None:
        try:
            self._inner.post(packet, None)
        except PublishBufferFull as e:
            _log.error("notification not sent: %s", e)
        except ConnectionClosed:
            pass    # closed after notify() looked: as if sent just before

    def subscribe(self, expression: str, timeout: Optional[float] = None,
                  callback: Optional[Callable[[Notification], Any]] = None,
                  accept_insecure: bool = True, keys: Optional[Keys] = None, *,
                  ttl: Optional[int] = None, max_count: Optional[int] = None) -> Subscription:
        """Register ``expression``; iterate the Subscription (waiting at
        most ``timeout`` seconds for each notification), or have
        ``callback(note)`` called on the client's thread (a coroutine
        function is refused with TypeError: nothing here would await it).
        A bad expression raises NackError (code 2101-2112). Through an
        Elvin proxy session, ``ttl`` (seconds) and ``max_count`` bound what
        the proxy keeps for it (``set_limits``)."""
        refuse_coroutine(callback, "elvin.sync")
        inner_conn = self._inner
        inbox = None if callback is not None else _Inbox(inner_conn)
        inner = _run(inner_conn.subscribe(expression,
                                          callback if inbox is None else inbox.put,
                                          accept_insecure, keys, ttl=ttl,
                                          max_count=max_count))
        sub = Subscription(self, inner, timeout, inbox)
        if inbox is not None:
            # On the loop: no delivery can slip between; set after the end
            # (the session lost meanwhile), it is called at once.
            _run(_call(inbox.watch, inner))
        return sub

    def quench(self, names: Iterable[str],
               on_add: Optional[Callable[[int, Any, bool], Any]] = None,
               on_modify: Optional[Callable[[int, Any, bool], Any]] = None,
               on_delete: Optional[Callable[[int], Any]] = None,
               deliver_insecure: bool = True, keys: Optional[Keys] = None) -> Quench:
        """Be told of subscriptions on ``names`` (handlers as in
        ``elvin.aio.Quench``, called on the client's thread); returns the
        Quench (its ``modify`` and ``remove`` block)."""
        return Quench(_run(self._inner.quench(names, on_add, on_modify, on_delete,
                                              deliver_insecure, keys)))

    def auto_quench(self, names: Iterable[str] = (), deliver_insecure: bool = True,
                    keys: Optional[Keys] = None) -> AutoQuench:
        """An AutoQuench for this connection, registered for ``names``."""
        async def made() -> aio.AutoQuench:
            return await aio.AutoQuench(self._inner, names, deliver_insecure, keys).ready()
        return AutoQuench(_run(made()))

    def remove_quench(self, quench: Union[Quench, aio.Quench]) -> None:
        """The same as ``quench.remove()``."""
        _run((quench._inner if isinstance(quench, Quench) else quench).remove())

    def ack_hold(self, note: Notification) -> None:
        """Through a proxy session: ``note`` is not handled yet (call it in
        the callback); it and what follows are not acknowledged until
        ``ack_release(note)``."""
        self._on_loop(self._inner.ack_hold, note)

    def ack_release(self, note: Notification) -> None:
        """The program is done with a note it held (any thread)."""
        self._on_loop(self._inner.ack_release, note)

    def _on_loop(self, call: Callable[[Notification], None], note: Notification) -> None:
        if threading.current_thread().name == "elvin.sync":
            call(note)                    # in a callback: at once
        else:
            self._inner.loop.call_soon_threadsafe(call, note)

    def retry_now(self) -> bool:
        """Dial at once if the connection is waiting out a back-off delay
        (the program knows its router is back); True if a dial started.
        Any thread, callbacks included."""
        if threading.current_thread().name == "elvin.sync":
            return self._inner.retry_now()     # in a callback: on the loop already
        async def now() -> bool:
            return self._inner.retry_now()
        return _run(now())

    def set_options(self, options: Mapping[str, Any]) -> Dict[str, Any]:
        """Renegotiate connection options; returns the router's answer."""
        return _run(self._inner.set_options(options))

    def set_limits(self, sub_id: int, ttl: Optional[int] = None,
                   max_count: Optional[int] = None) -> Dict[str, Any]:
        """Through a proxy session: bound what is kept for ``sub_id``
        (``elvin.aio.Connection.set_limits``)."""
        return _run(self._inner.set_limits(sub_id, ttl, max_count))

    def delete_session(self, name: str) -> Dict[str, Any]:
        """Through a proxy: delete session ``name`` (administrative password)."""
        return _run(self._inner.delete_session(name))

    def set_keys(self, add_nfn_keys: Optional[Keys] = None, del_nfn_keys: Optional[Keys] = None,
                 add_sub_keys: Optional[Keys] = None,
                 del_sub_keys: Optional[Keys] = None) -> None:
        """Change the connection's keys (SecRqst)."""
        _run(self._inner.set_keys(add_nfn_keys, del_nfn_keys, add_sub_keys, del_sub_keys))

    def test_connection(self, timeout: float = 10.0) -> bool:
        """True once the router answers TestConn (TimeoutError otherwise)."""
        return _run(self._inner.test_connection(timeout))

    def close(self) -> None:
        """Disconnect politely: waits for the router's DisconnRply (at
        most 5 s), which says everything notified before has reached it;
        raises CloseUnconfirmed when it did not come and something sent is
        unconfirmed (``elvin.aio.Connection.close``)."""
        _run(self._inner.close())

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except CloseUnconfirmed:
            if exc[0] is None:
                raise
            # The block's own error goes on; this one was logged.


def connect(uri: aio.URIs = None, options: Optional[Mapping[str, Any]] = None,
            nfn_keys: Optional[Keys] = None, sub_keys: Optional[Keys] = None, *,
            tls: Optional[ssl.SSLContext] = None, tls_ca: Union[str, bytes, None] = None,
            tls_certificate: Optional[str] = None, tls_key: Optional[str] = None,
            tls_hostname: Optional[str] = None,
            timeout: Optional[float] = aio.DEFAULT_CONNECT_TIMEOUT,
            reconnect: Union[bool, Reconnect] = False, retry_connect: bool = False,
            pending_size: int = DEFAULT_PENDING_SIZE,
            receive_queue: int = DEFAULT_RECEIVE_QUEUE,
            follow_redirects: bool = True,
            on_disconnect: Optional[Callable[[int, str], Any]] = None,
            on_dropwarn: Optional[Callable[[], Any]] = None,
            scope: Optional[str] = None, discover: bool = False, discoverer: Any = None,
            discovery_timeout: float = 10.0, discovery_interface: Optional[str] = None,
            session: SessionArg = None, password: Optional[str] = None,
            admin_password: Optional[str] = None, receipt: Optional[str] = None,
            client: Optional[str] = None, ttl: Optional[int] = None,
            max_count: Optional[int] = None,
            on_notification: Optional[Callable[[Notification], Any]] = None,
            ack_window: Optional[int] = None,
            liveness: Optional[float] = aio.DEFAULT_LIVENESS) -> Connection:
    """Connect to the router at ``uri`` (default elvin://localhost:2917, or
    a list of URIs to fail over between); the arguments are
    ``elvin.aio.connect``'s (TLS, ``timeout``, ``reconnect``,
    ``retry_connect``, ``pending_size``, ``receive_queue``, discovery,
    proxy sessions, ``ack_window``, ``liveness``). Hooks are called on the client's
    thread. Through a proxy session a notification is handled, and
    acknowledged, once its callback has returned or the program has taken
    it from an iterator (``get``). Raises ConnectFailed or NackError."""
    return Connection(_run(aio.connect(
        uri, options, nfn_keys, sub_keys, tls=tls, tls_ca=tls_ca,
        tls_certificate=tls_certificate, tls_key=tls_key, tls_hostname=tls_hostname,
        timeout=timeout, reconnect=reconnect, retry_connect=retry_connect,
        pending_size=pending_size, receive_queue=receive_queue,
        follow_redirects=follow_redirects, on_disconnect=on_disconnect,
        on_dropwarn=on_dropwarn, scope=scope, discover=discover, discoverer=discoverer,
        discovery_timeout=discovery_timeout, discovery_interface=discovery_interface,
        session=session, password=password, admin_password=admin_password,
        receipt=receipt, client=client, ttl=ttl, max_count=max_count,
        on_notification=on_notification, ack_window=ack_window, liveness=liveness)))


def notify(uri: aio.URIs, attributes: Mapping[str, Any], deliver_insecure: bool = True,
           keys: Optional[Keys] = None, *, options: Optional[Mapping[str, Any]] = None,
           nfn_keys: Optional[Keys] = None, tls: Optional[ssl.SSLContext] = None,
           tls_ca: Union[str, bytes, None] = None, tls_certificate: Optional[str] = None,
           tls_key: Optional[str] = None, tls_hostname: Optional[str] = None,
           timeout: Optional[float] = aio.DEFAULT_CONNECT_TIMEOUT) -> None:
    """Connect, emit one notification, and disconnect once the router has
    it (its DisconnRply comes after the notification)."""
    with connect(uri, options, nfn_keys, tls=tls, tls_ca=tls_ca,
                 tls_certificate=tls_certificate, tls_key=tls_key,
                 tls_hostname=tls_hostname, timeout=timeout) as conn:
        conn.notify(attributes, deliver_insecure, keys)


def subscribe(uri: aio.URIs, expression: str, count: int = 1,
              timeout: Optional[float] = None, *, accept_insecure: bool = True,
              options: Optional[Mapping[str, Any]] = None, sub_keys: Optional[Keys] = None,
              tls: Optional[ssl.SSLContext] = None, tls_ca: Union[str, bytes, None] = None,
              tls_certificate: Optional[str] = None, tls_key: Optional[str] = None,
              tls_hostname: Optional[str] = None,
              connect_timeout: Optional[float] = aio.DEFAULT_CONNECT_TIMEOUT
              ) -> List[Notification]:
    """Connect, collect ``count`` notifications matching ``expression``
    (fewer if ``timeout`` seconds pass between two), disconnect, and
    return them as a list."""
    notes: List[Notification] = []
    with connect(uri, options, None, sub_keys, tls=tls, tls_ca=tls_ca,
                 tls_certificate=tls_certificate, tls_key=tls_key,
                 tls_hostname=tls_hostname, timeout=connect_timeout) as conn:
        with conn.subscribe(expression, timeout=timeout,
                            accept_insecure=accept_insecure) as sub:
            for note in sub:
                notes.append(note)
                if len(notes) >= count:
                    break
    return notes


def unotify(uri: Union[str, ElvinURI], attributes: Mapping[str, Any],
            deliver_insecure: bool = True, keys: Optional[Keys] = None, *,
            tls: Optional[ssl.SSLContext] = None, tls_ca: Union[str, bytes, None] = None,
            tls_certificate: Optional[str] = None, tls_key: Optional[str] = None,
            tls_hostname: Optional[str] = None,
            timeout: Optional[float] = aio.DEFAULT_CONNECT_TIMEOUT) -> None:
    """Send one session-less notification (UNotify; over UDP unconfirmed);
    ``elvin.aio.unotify``'s errors and ``timeout``."""
    _run(aio.unotify(uri, attributes, deliver_insecure, keys, tls=tls, tls_ca=tls_ca,
                     tls_certificate=tls_certificate, tls_key=tls_key,
                     tls_hostname=tls_hostname, timeout=timeout))
