"""The blocking Elvin client (issue 16): for scripts, notebooks, Django and
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
thread and must not block it.
"""

import asyncio
import queue
import threading
from typing import (Any, Awaitable, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, TypeVar, Union)

from elvin import aio
from elvin.client.state import ConnectFailed, ConnectionClosed, NackError, Notification
from elvin.keys import Keys, consumer_keys, dual_keys, producer_keys
from elvin.uri import ElvinURI
from elvin.values import normalise

__all__ = ["connect", "notify", "subscribe", "unotify", "Connection", "Subscription",
           "AutoQuench",
           "NackError", "ConnectionClosed", "ConnectFailed", "Notification",
           "Keys", "producer_keys", "consumer_keys", "dual_keys"]

_END = object()
T = TypeVar("T")
_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_lock = threading.Lock()


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
            _loop = loop
        return _loop


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


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


class Subscription:
    """A subscription: iterate it for ``Notification``s (blocking), or give
    ``callback`` to ``Connection.subscribe`` instead.

    Iteration ends when the subscription is removed or the connection
    closed, or when ``timeout`` seconds pass without a notification (when
    ``subscribe`` was given one); it raises ConnectionClosed if the router
    ends the session. ``get(timeout)`` takes one notification (None on
    timeout). As a context manager it removes itself on exit.
    """

    def __init__(self, connection: "Connection", inner: aio.Subscription,
                 timeout: Optional[float], queue_: Optional["queue.SimpleQueue[Any]"]) -> None:
        self.connection = connection
        self._inner = inner
        self.timeout = timeout
        self._queue = queue_

    @property
    def id(self) -> int:
        return self._inner.id

    @property
    def expression(self) -> str:
        return self._inner.expression

    def get(self, timeout: Optional[float] = None) -> Optional[Notification]:
        """The next notification, or None after ``timeout`` seconds."""
        if self._queue is None:
            raise TypeError("a subscription with a callback has no queue")
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END or isinstance(item, BaseException):
            self._queue.put(item)        # later calls see the end too
            if isinstance(item, BaseException):
                raise item
            return None
        note: Notification = item
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

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._inner._ended is None and not self.connection._inner.is_closed:
            self.remove()

    def __repr__(self) -> str:
        return f"<elvin.sync.Subscription {self.id} {self.expression!r}>"


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
        if self._inner.is_closed:
            raise ConnectionClosed("connection is closed")
        attributes = normalise(attributes)
        if not attributes:
            raise ValueError("a notification needs at least one attribute")
        _private_loop().call_soon_threadsafe(self._emit, attributes, deliver_insecure, keys)

    def _emit(self, attributes: Mapping[str, Any], deliver_insecure: bool,
              keys: Optional[Keys]) -> None:
        try:
            self._inner.emit(attributes, deliver_insecure, keys)
        except ConnectionClosed:
            pass    # closed after notify() looked: as if sent just before

    def subscribe(self, expression: str, timeout: Optional[float] = None,
                  callback: Optional[Callable[[Notification], Any]] = None,
                  accept_insecure: bool = True, keys: Optional[Keys] = None) -> Subscription:
        """Register ``expression``; iterate the Subscription (waiting at
        most ``timeout`` seconds for each notification), or have
        ``callback(note)`` called on the client's thread. A bad expression
        raises NackError (code 2101-2112)."""
        inbox: Optional["queue.SimpleQueue[Any]"] = (None if callback is not None
                                                    else queue.SimpleQueue())
        if inbox is not None:
            callback = inbox.put
        inner = _run(self._inner.subscribe(expression, callback, accept_insecure, keys))
        sub = Subscription(self, inner, timeout, inbox)
        if inbox is not None:
            def end(error: Optional[Exception]) -> None:
                inbox.put(error if error is not None else _END)
            inner.on_end = end
            if inner._ended is not None:       # it ended before on_end was set
                ended = inner._ended
                end(ended if isinstance(ended, Exception) else None)
        return sub

    def quench(self, names: Iterable[str],
               on_add: Optional[Callable[[int, Any, bool], Any]] = None,
               on_modify: Optional[Callable[[int, Any, bool], Any]] = None,
               on_delete: Optional[Callable[[int], Any]] = None,
               deliver_insecure: bool = True, keys: Optional[Keys] = None) -> aio.Quench:
        """Be told of subscriptions on ``names`` (handlers as in
        ``elvin.aio.Quench``, called on the client's thread); returns the
        quench (its ``modify``/``remove`` are coroutines: use
        ``remove_quench``)."""
        return _run(self._inner.quench(names, on_add, on_modify, on_delete,
                                       deliver_insecure, keys))

    def auto_quench(self, names: Iterable[str] = (), deliver_insecure: bool = True,
                    keys: Optional[Keys] = None) -> AutoQuench:
        """An AutoQuench for this connection, registered for ``names``."""
        async def made() -> aio.AutoQuench:
            return await aio.AutoQuench(self._inner, names, deliver_insecure, keys).ready()
        return AutoQuench(_run(made()))

    def remove_quench(self, quench: aio.Quench) -> None:
        _run(quench.remove())

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
        """Disconnect politely (waits for the router's DisconnRply)."""
        _run(self._inner.close())

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect(uri: Union[str, ElvinURI, None] = None, options: Optional[Mapping[str, Any]] = None,
            nfn_keys: Optional[Keys] = None, sub_keys: Optional[Keys] = None,
            **kwargs: Any) -> Connection:
    """Connect to the router at ``uri`` (default elvin://localhost:2917);
    arguments as ``elvin.aio.connect`` (TLS, ``timeout``, ``reconnect``).
    Raises ConnectFailed or NackError."""
    return Connection(_run(aio.connect(uri, options, nfn_keys, sub_keys, **kwargs)))


def notify(uri: Union[str, ElvinURI, None], attributes: Mapping[str, Any],
           deliver_insecure: bool = True, keys: Optional[Keys] = None, **kwargs: Any) -> None:
    """Connect, emit one notification, and disconnect once the router has
    it (its DisconnRply comes after the notification)."""
    with connect(uri, **kwargs) as conn:
        conn.notify(attributes, deliver_insecure, keys)


def subscribe(uri: Union[str, ElvinURI, None], expression: str, count: int = 1,
              timeout: Optional[float] = None, **kwargs: Any) -> List[Notification]:
    """Connect, collect ``count`` notifications matching ``expression``
    (fewer if ``timeout`` seconds pass between two), disconnect, and
    return them as a list."""
    notes: List[Notification] = []
    with connect(uri, **kwargs) as conn:
        with conn.subscribe(expression, timeout=timeout) as sub:
            for note in sub:
                notes.append(note)
                if len(notes) >= count:
                    break
    return notes


def unotify(uri: Union[str, ElvinURI], attributes: Mapping[str, Any],
            deliver_insecure: bool = True, keys: Optional[Keys] = None, **kwargs: Any) -> None:
    """Send one session-less notification (UNotify; over UDP unconfirmed)."""
    _run(aio.unotify(uri, attributes, deliver_insecure, keys, **kwargs))
