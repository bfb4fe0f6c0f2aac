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

from elvin import aio
from elvin.client.state import ConnectFailed, ConnectionClosed, NackError, Notification
from elvin.values import normalise

__all__ = ["connect", "notify", "subscribe", "unotify", "Connection", "Subscription",
           "NackError", "ConnectionClosed", "ConnectFailed", "Notification"]

_END = object()
_loop = None
_loop_lock = threading.Lock()


def _private_loop():
    """The process's private event loop, running in its daemon thread."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run():
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()
            threading.Thread(target=run, name="elvin.sync", daemon=True).start()
            started.wait()
            _loop = loop
        return _loop


async def _awaited(awaitable):
    return await awaitable


def _run(awaitable, timeout=None):
    """Run ``awaitable`` on the private loop; its result (or exception)."""
    loop = _private_loop()
    coroutine = _awaited(awaitable)
    if threading.current_thread().name == "elvin.sync":
        coroutine.close()
        awaitable.close() if hasattr(awaitable, "close") else None
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

    def __init__(self, connection, inner, timeout, queue_):
        self.connection = connection
        self._inner = inner
        self.timeout = timeout
        self._queue = queue_

    @property
    def id(self):
        return self._inner.id

    @property
    def expression(self):
        return self._inner.expression

    def get(self, timeout=None):
        """The next notification, or None after ``timeout`` seconds."""
        if self._queue is None:
            raise TypeError("a subscription with a callback has no queue")
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END or isinstance(item, Exception):
            self._queue.put(item)        # later calls see the end too
            if isinstance(item, Exception):
                raise item
            return None
        return item

    def __iter__(self):
        while True:
            note = self.get(self.timeout)
            if note is None:
                return
            yield note

    def modify(self, expression=None, accept_insecure=None, add_keys=None, del_keys=None):
        """Change the expression, insecure flag or keys; returns self."""
        _run(self._inner.modify(expression, accept_insecure, add_keys, del_keys))
        return self

    def remove(self):
        """Delete the subscription (iteration then ends)."""
        _run(self._inner.remove())       # ends the iteration (see subscribe)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._inner._ended is None and not self.connection._inner.is_closed:
            self.remove()

    def __repr__(self):
        return f"<elvin.sync.Subscription {self.id} {self.expression!r}>"


class Connection:
    """A session with an Elvin router (made by ``connect``); a context
    manager that closes it on exit."""

    def __init__(self, inner):
        self._inner = inner
        self._subscriptions = []

    @property
    def options(self):
        """The connection options the router granted."""
        return self._inner.options

    @property
    def uri(self):
        return self._inner.uri

    @property
    def is_closed(self):
        return self._inner.is_closed

    # With connect(..., reconnect=...): called on the client's thread.
    @property
    def on_connection_lost(self):
        return self._inner.on_connection_lost

    @on_connection_lost.setter
    def on_connection_lost(self, callback):
        self._inner.on_connection_lost = callback

    @property
    def on_reconnected(self):
        return self._inner.on_reconnected

    @on_reconnected.setter
    def on_reconnected(self, callback):
        self._inner.on_reconnected = lambda inner: callback(self)

    @property
    def reconnects(self):
        return self._inner.reconnects

    def notify(self, attributes, deliver_insecure=True, keys=None):
        """Emit a notification. It is checked here (ValueError, TypeError,
        ConnectionClosed) and sent in order with everything else asked of
        this connection; nothing comes back from the router."""
        if self._inner.is_closed:
            raise ConnectionClosed("connection is closed")
        attributes = normalise(attributes)
        if not attributes:
            raise ValueError("a notification needs at least one attribute")
        _private_loop().call_soon_threadsafe(self._emit, attributes, deliver_insecure, keys)

    def _emit(self, attributes, deliver_insecure, keys):
        try:
            self._inner.emit(attributes, deliver_insecure, keys)
        except ConnectionClosed:
            pass    # closed after notify() looked: as if sent just before

    def subscribe(self, expression, timeout=None, callback=None, accept_insecure=True,
                  keys=None):
        """Register ``expression``; iterate the Subscription (waiting at
        most ``timeout`` seconds for each notification), or have
        ``callback(note)`` called on the client's thread. A bad expression
        raises NackError (code 2101-2112)."""
        inbox = None if callback is not None else queue.SimpleQueue()
        if inbox is not None:
            callback = inbox.put
        inner = _run(self._inner.subscribe(expression, callback, accept_insecure, keys))
        sub = Subscription(self, inner, timeout, inbox)
        if inbox is not None:
            original_end = inner._end

            def end(error=None):
                original_end(error)
                inbox.put(error if error is not None else _END)
            inner._end = end
        return sub

    def quench(self, names, on_add=None, on_modify=None, on_delete=None,
               deliver_insecure=True, keys=None):
        """Be told of subscriptions on ``names`` (handlers as in
        ``elvin.aio.Quench``, called on the client's thread); returns the
        quench (its ``modify``/``remove`` are coroutines: use
        ``remove_quench``)."""
        return _run(self._inner.quench(names, on_add, on_modify, on_delete,
                                       deliver_insecure, keys))

    def remove_quench(self, quench):
        _run(quench.remove())

    def set_options(self, options):
        """Renegotiate connection options; returns the router's answer."""
        return _run(self._inner.set_options(options))

    def set_keys(self, add_nfn_keys=None, del_nfn_keys=None, add_sub_keys=None,
                 del_sub_keys=None):
        """Change the connection's keys (SecRqst)."""
        _run(self._inner.set_keys(add_nfn_keys, del_nfn_keys, add_sub_keys, del_sub_keys))

    def test_connection(self, timeout=10.0):
        """True once the router answers TestConn (TimeoutError otherwise)."""
        return _run(self._inner.test_connection(timeout))

    def close(self):
        """Disconnect politely (waits for the router's DisconnRply)."""
        _run(self._inner.close())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(uri=None, options=None, nfn_keys=None, sub_keys=None, **kwargs):
    """Connect to the router at ``uri`` (default elvin://localhost:2917);
    arguments as ``elvin.aio.connect`` (TLS, ``timeout``, ``reconnect``).
    Raises ConnectFailed or NackError."""
    return Connection(_run(aio.connect(uri, options, nfn_keys, sub_keys, **kwargs)))


def notify(uri, attributes, deliver_insecure=True, keys=None, **kwargs):
    """Connect, emit one notification, and disconnect once the router has
    it (its DisconnRply comes after the notification)."""
    with connect(uri, **kwargs) as conn:
        conn.notify(attributes, deliver_insecure, keys)


def subscribe(uri, expression, count=1, timeout=None, **kwargs):
    """Connect, collect ``count`` notifications matching ``expression``
    (fewer if ``timeout`` seconds pass between two), disconnect, and
    return them as a list."""
    notes = []
    with connect(uri, **kwargs) as conn:
        with conn.subscribe(expression, timeout=timeout) as sub:
            for note in sub:
                notes.append(note)
                if len(notes) >= count:
                    break
    return notes


def unotify(uri, attributes, deliver_insecure=True, keys=None, **kwargs):
    """Send one session-less notification (UNotify; over UDP unconfirmed)."""
    _run(aio.unotify(uri, attributes, deliver_insecure, keys, **kwargs))
