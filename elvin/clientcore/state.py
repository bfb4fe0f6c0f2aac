"""The client side of an Elvin session, without I/O.

The request/delivery half of every client flavour: the Twisted
``Connection`` (``elvin.client``), the asyncio one (``elvin.aio``) and,
through it, the blocking one (``elvin.sync``). ``ClientState`` numbers
requests, matches replies and Nacks to them, hands deliveries to
subscriptions and quench events to quenches and answers the router's
TestConn. It never blocks and never touches a socket. Whether a packet may
be sent now, must wait, or is refused is the connection's lifecycle
(``elvin.clientcore.lifecycle.Lifecycle``), which feeds it the packets
read and decides everything about connecting, losing, reconnecting and
closing. What a flavour waits with (a Deferred, an asyncio Future) is its
own business: requests take plain ``on_reply``/``on_error`` callables.

Nothing here imports Twisted (``elvin.aio`` and ``elvin.sync`` import
this package, never ``elvin.client``).
"""

import inspect
import itertools
import logging
import random
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

from elvin.clientcore.acks import ACK, ACK_INTERVAL, ACK_WINDOW, DEFAULT_ACK_WINDOW, AckTracker
from elvin.errors import NO_SUCH_QUENCH, NO_SUCH_SUB, ElvinError, echoed
from elvin.protocols import packets
from elvin.values import Int64, normalise

__all__ = ["ClientState", "NackError", "ConnectionClosed", "ConnectFailed", "CloseUnconfirmed",
           "PublishBufferFull", "RequestTimeout", "describe_request", "Targeted", "describe_disconn", "refuse_coroutine",
           "coroutine_result_refused", "EndHook",
           "Notification", "Deframer", "QuenchHandlers", "QuenchState", "Reconnect",
           "AutoQuenchBase", "SessionSubscription", "JoinedSession", "proxy_options"]

_log = logging.getLogger("elvin.client")

#: Builds a request packet for a transaction id.
MakePacket = Callable[[int], Any]
#: A quench's add/modify handler: (term id, subscription tree, secure).
QuenchCallback = Callable[[int, Any, bool], Any]
#: One step of ``ClientState.replay``.
ReplayStep = Tuple[MakePacket, Optional[Callable[[Any], None]], Optional[Tuple[Dict[int, Any], Any]]]


#: The Nack code of a router that does not implement a request (client
#: protocol 7.4.2, "not implemented"): Avis answers QnchAddRqst with it.
QUENCH_NOT_SUPPORTED = 2007

#: What a router takes when it did not say (Packet.Max-Length's default,
#: ours and Avis's): a notification larger than this is refused locally.
DEFAULT_PACKET_MAX_LENGTH = 2 * 1024 * 1024
#: The legacy names (client protocol 7.5.3) a router may report limits by.
_LEGACY_NAMES = {
    "Packet.Max-Length": "router.packet.max-length",
    "Attribute.Max-Count": "router.attribute.max-count",
    "Attribute.Name.Max-Length": "router.attribute.name.max-length",
    "Attribute.String.Max-Length": "router.attribute.string.max-length",
    "Attribute.Opaque.Max-Length": "router.attribute.opaque.max-length",
}
#: Connection options that ask the router to report, without changing
#: them, the limits ``notify`` checks: an integer option asked for with a
#: value of the wrong type is answered with the router's default (ours and
#: Avis's). Pass as ``connect(options=ASK_LIMITS)``: a router may ignore a
#: notification over its attribute limits without a word (7.3.3), and
#: ``notify`` can refuse only what it knows the limits of.
ASK_LIMITS: Mapping[str, Any] = {name: "" for name in _LEGACY_NAMES}


class NackError(ElvinError):
    """The router refused a request: ``code``, ``message``, ``nack_args``."""

    def __init__(self, code: int, message: str, args: Sequence[Any] = ()) -> None:
        super().__init__(code, f"{message} (Nack {code})" if message else f"Nack {code}", args)
        self.router_message = message


class ConnectionClosed(ElvinError):
    """The connection ended before a reply arrived (``reason`` says how)."""

    def __init__(self, message: str, reason: Optional[int] = None, args: str = "") -> None:
        super().__init__(0, message)
        self.reason = reason
        self.disconn_args = args


class CloseUnconfirmed(ConnectionClosed):
    """The program closed the connection, but the router did not confirm
    what was sent (no DisconnRply within the close timeout, or the channel
    ended first), or notifications waiting to be sent while reconnecting
    were dropped: those may not have reached the router. ``unconfirmed``
    and ``unconfirmed_bytes`` count what was written since the router last
    confirmed receipt (by answering a request sent after it); ``unsent`` and
    ``unsent_bytes`` what the reconnection buffer held."""

    def __init__(self, message: str, unconfirmed: int = 0, unconfirmed_bytes: int = 0,
                 unsent: int = 0, unsent_bytes: int = 0) -> None:
        super().__init__(message)
        self.unconfirmed = unconfirmed
        self.unconfirmed_bytes = unconfirmed_bytes
        self.unsent = unsent
        self.unsent_bytes = unsent_bytes


class PublishBufferFull(ConnectionClosed):
    """While reconnecting, what the program sends waits in a buffer of
    ``pending_size`` bytes; this is raised when it would overflow (the
    notification is not sent)."""


class RequestTimeout(ElvinError, TimeoutError):
    """The router did not answer a request within the connection's
    ``timeout``: the request (``request``, its packet's name, e.g.
    ``"SubAddRqst"``) gave up after ``seconds``. The connection stays open
    (a router that stopped answering altogether is the liveness check's
    to find). Also a ``TimeoutError``."""

    def __init__(self, message: str, request: str = "", seconds: float = 0.0) -> None:
        super().__init__(0, message)
        self.request = request
        self.seconds = seconds


def describe_request(packet: Any) -> str:
    """``packet`` (a request) for people: its name and what it asks, e.g.
    ``SubAddRqst (subscribe 'x == 1')``."""
    kind = type(packet).__name__
    what = {
        "SubAddRqst": lambda: f"subscribe {echoed(packet.expression)}",
        "SubModRqst": lambda: f"modify subscription {packet.subscription_id}",
        "SubDelRqst": lambda: f"remove subscription {packet.subscription_id}",
        "QnchAddRqst": lambda: f"quench {echoed(', '.join(packet.names), quote=False)}",
        "QnchModRqst": lambda: f"modify quench {packet.quench_id}",
        "QnchDelRqst": lambda: f"remove quench {packet.quench_id}",
        "SecRqst": lambda: "set_keys",
        "QosRqst": lambda: f"set_options {echoed(', '.join(sorted(packet.options)), quote=False)}",
    }.get(kind)
    return f"{kind} ({what()})" if what is not None else kind


#: What Disconn's reason codes (client protocol 7.4.4) mean, for messages.
#: Reason 4 ends one connection for what the client did; the router's text
#: says what (protocol errors, a violation, not reading what it was sent).
DISCONN_REASONS = {1: "is shutting down", 2: "redirected us", 4: "closed our connection"}


def describe_disconn(uri: Any, reason: int, args: str) -> str:
    """A sentence for the router's Disconn: reason 1 says the router is
    shutting down, not that the connection was lost."""
    what = DISCONN_REASONS.get(reason, f"disconnected us (reason {reason})")
    if reason == 2:
        return f"the router at {uri} redirected us to {args}"
    text = f"the router at {uri} {what}"
    return f"{text}: {args}" if args else text


def refuse_coroutine(callback: Any, flavour: str) -> None:
    """The Twisted and blocking flavours call a subscription's callback and
    do not await it: a coroutine function is refused at once."""
    if callback is not None and inspect.iscoroutinefunction(callback):
        raise TypeError(f"{flavour} calls a subscription's callback without awaiting it, "
                        f"so {callback!r} would never run: pass a plain function (or use "
                        f"elvin.aio, which awaits coroutine callbacks)")


def coroutine_result_refused(result: Any, sub: Any) -> None:
    """A callback returned a coroutine where nothing awaits it: close it
    and say so (rather than Python's 'never awaited' warning)."""
    if inspect.iscoroutine(result):
        result.close()
        _log.error("the callback of %r returned a coroutine, which this flavour does not "
                   "await (use elvin.aio)", sub)


class ConnectFailed(ConnectionClosed, ConnectionError):
    """``connect`` could not open a session; the message names the URI,
    what went wrong and what to try. Also a ``ConnectionError`` (so an
    ``OSError``), as the socket errors it replaces were."""


class Notification(Dict[str, Any]):
    """A delivered notification: the attributes, plus which subscriptions
    matched securely (``secure``) or insecurely (``insecure``)."""

    #: Through a proxy session that takes acknowledgements: which
    #: notification of the channel this is (``elvin.clientcore.acks``).
    ack_token: Optional[Tuple[int, int]] = None

    def __init__(self, attributes: Mapping[str, Any], secure: Iterable[int] = (),
                 insecure: Iterable[int] = ()) -> None:
        super().__init__(attributes)
        self.secure = tuple(secure)
        self.insecure = tuple(insecure)


#: The attribute of a proxy's session event (docs/proxy.md).
PROXY_EVENT = "Proxy.Event"

#: ``session=`` as ``connect`` takes it: a name, or names, or
#: ``(name, password[, admin password])`` tuples.
SessionArg = Union[str, Sequence[Union[str, Tuple[Any, ...]]], None]


def proxy_options(session: SessionArg = None, password: Optional[str] = None,
                  admin_password: Optional[str] = None, receipt: Optional[str] = None,
                  client: Optional[str] = None, ttl: Optional[int] = None,
                  max_count: Optional[int] = None,
                  ack_window: Optional[int] = None) -> Tuple[Dict[str, Any], List[str]]:
    """The ConnRqst options asking an Elvin proxy for sessions
    (docs/proxy.md), and the session names joined. ``password`` and
    ``admin_password`` go with a session given by name alone.
    ``ack_window`` (default ``DEFAULT_ACK_WINDOW``; 0: do not acknowledge)
    asks the proxy to keep what it sends until the program has handled it
    (``Proxy.Ack-Window``). Nothing is asked without a session: a router
    never sees these options."""
    if session is None:
        if any(v is not None for v in (password, admin_password, receipt, client,
                                       ack_window)):
            raise ValueError("password, admin_password, receipt and client need a session")
        return {}, []
    entries = [session] if isinstance(session, str) else list(session)
    options: Dict[str, Any] = {}
    names: List[str] = []
    for index, entry in enumerate(entries, 1):
        suffix = "" if index == 1 else f".{index}"
        if isinstance(entry, str):
            name, pw, admin = entry, password, admin_password
        else:
            name, pw, admin = (tuple(entry) + (None, None))[:3]
        if not isinstance(name, str) or not name:
            raise ValueError("a session name must be a non-empty string")
        options["Proxy.Session" + suffix] = name
        if pw is not None:
            options["Proxy.Password" + suffix] = pw
        if admin is not None:
            options["Proxy.Admin-Password" + suffix] = admin
        names.append(name)
    if receipt is not None:
        if receipt not in ("destructive", "non-destructive"):
            raise ValueError("receipt must be 'destructive' or 'non-destructive'")
        if receipt == "non-destructive" and not client:
            raise ValueError("non-destructive receipt needs client= (a name for this "
                             "device, the same each time it connects)")
        options["Proxy.Receipt"] = receipt
    if client is not None:
        options["Proxy.Client"] = client
    if ttl is not None:
        options["Proxy.TTL"] = int(ttl)
    if max_count is not None:
        options["Proxy.Max-Count"] = int(max_count)
    window = DEFAULT_ACK_WINDOW if ack_window is None else int(ack_window)
    if window < 0:
        raise ValueError("ack_window must be 0 (do not acknowledge) or more")
    if window:
        options[ACK_WINDOW] = window
    return options, names


class SessionSubscription:
    """A subscription of a proxy session, as the proxy told us of it (made
    by this or another client of the session). Set ``callback`` to be
    called with each notification it matches."""

    def __init__(self, sub_id: int, session: str, expression: str,
                 accept_insecure: bool = True, ttl: int = 0, max_count: int = 0) -> None:
        self.id = sub_id
        self.session = session
        self.expression = expression
        self.accept_insecure = accept_insecure
        #: seconds the proxy keeps what it matched (0: no limit)
        self.ttl = ttl
        #: most notifications kept for it (0: no limit)
        self.max_count = max_count
        self.callback: Optional[Callable[["Notification"], Any]] = None

    def _deliver_note(self, note: "Notification") -> None:
        if self.callback is not None:
            self.callback(note)

    def __repr__(self) -> str:
        return f"<SessionSubscription {self.id} of {self.session!r}: {self.expression!r}>"


class JoinedSession:
    """A proxy session this connection joined: what the proxy said when we
    joined (``stored``: notifications kept for it, ``dropped``: lost since
    its last client, ``gaps``: how many of ``dropped`` are gaps of unknown
    size, each counted as one, None from a proxy that does not say,
    ``lost``: the notifications counted, the rest, ``admin``: may we
    change it)."""

    def __init__(self, name: str, stored: int = 0, dropped: int = 0,
                 admin: bool = False, gaps: Optional[int] = 0) -> None:
        self.name = name
        self.stored = stored
        self.dropped = dropped
        self.admin = admin
        self.gaps = gaps

    @property
    def lost(self) -> int:
        """Notifications the proxy counted as lost (``dropped`` without
        the gaps of unknown size)."""
        return max(0, self.dropped - (self.gaps or 0))

    def __repr__(self) -> str:
        return (f"<JoinedSession {self.name!r} stored={self.stored} dropped={self.dropped} "
                f"gaps={self.gaps}>")


class Reconnect:
    """When to try again after a lost connection: the first try after
    ``initial`` seconds, each later one ``factor`` times as long (at most
    ``maximum``), each delay spread by up to ``jitter`` of itself so that
    many clients of one router do not all come back at once; give up after
    ``attempts`` tries (None: never). The defaults (0.1 s doubling to
    1.5 s, +-25%) bring a client back within 2 s of its router's return.
    Pass ``reconnect=Reconnect(...)`` (or ``reconnect=True`` for these
    defaults) to a flavour's ``connect``."""

    def __init__(self, initial: float = 0.1, factor: float = 2.0, maximum: float = 1.5,
                 jitter: float = 0.25, attempts: Optional[int] = None) -> None:
        if initial <= 0 or factor < 1 or maximum < initial:
            raise ValueError("Reconnect needs 0 < initial <= maximum and factor >= 1")
        self.initial = initial
        self.factor = factor
        self.maximum = maximum
        self.jitter = jitter
        self.attempts = attempts

    @classmethod
    def from_argument(cls, value: Union[bool, "Reconnect", None]) -> Optional["Reconnect"]:
        """``connect``'s ``reconnect`` argument as a policy, or None."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        raise TypeError("reconnect must be a bool or an elvin.client.state.Reconnect")

    def delays(self, rng: Callable[[], float] = random.random) -> Iterator[float]:
        """The delays before each try, in order (finite if ``attempts``)."""
        delay = self.initial
        tries = itertools.count() if self.attempts is None else range(self.attempts)
        for _ in tries:
            yield delay * (1 + self.jitter * (2 * rng() - 1))
            delay = min(delay * self.factor, self.maximum)


class EndHook:
    """A subscription's ``on_end(error)`` hook, the same in every flavour:
    called once when the subscription ends, with None when it was removed
    or the program closed the connection, else the error that ended it
    (the ConnectionClosed of a lost session, the NackError of a router that
    would not take it back after a reconnection). Set after the end, it is
    called at once, so a callback-only subscriber cannot miss it. What the
    hook raises is logged."""

    _on_end: Optional[Callable[[Optional[BaseException]], Any]] = None
    _end_told = False
    _end_cause: Optional[BaseException] = None

    @property
    def on_end(self) -> Optional[Callable[[Optional[BaseException]], Any]]:
        return self._on_end

    @on_end.setter
    def on_end(self, hook: Optional[Callable[[Optional[BaseException]], Any]]) -> None:
        self._on_end = hook
        if hook is not None and self._end_told:
            self._tell_end(hook)

    def _ended_with(self, error: Optional[BaseException]) -> bool:
        """The subscription ended (``error`` or None): tell the hook; False
        if it had ended already."""
        if self._end_told:
            return False
        self._end_told = True
        self._end_cause = error
        if self._on_end is not None:
            self._tell_end(self._on_end)
        return True

    def _tell_end(self, hook: Callable[[Optional[BaseException]], Any]) -> None:
        try:
            hook(self._end_cause)
        except Exception:
            _log.exception("on_end of %r raised", self)


class QuenchHandlers:
    """A quench as a flavour holds it: ``on_add(term_id, tree, secure)``,
    ``on_modify(term_id, tree, secure)`` and ``on_delete(term_id)`` are
    called as subscriptions referring to the quench's names come, change
    and go; ``tree`` is the subscription's ``elvin.subscription.ast.Node``."""

    def __init__(self, connection: Any, quench_id: int, names: Iterable[str],
                 on_add: Optional[QuenchCallback], on_modify: Optional[QuenchCallback],
                 on_delete: Optional[Callable[[int], Any]], deliver_insecure: bool) -> None:
        self.connection = connection
        self.id = quench_id
        self.names = frozenset(names)
        self.on_add = on_add
        self.on_modify = on_modify
        self.on_delete = on_delete
        self.deliver_insecure = deliver_insecure
        #: the keys it was registered with (registered again with them)
        self.keys: Optional[packets.Keys] = None

    def _event(self, kind: str, term_id: int, tree: Any = None, secure: bool = False) -> None:
        handler: Any = {"add": self.on_add, "modify": self.on_modify,
                   "delete": self.on_delete}[kind]
        if handler is None:
            return
        if kind == "delete":
            handler(term_id)
        else:
            handler(term_id, tree, secure)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {sorted(self.names)}>"


class QuenchState:
    """What subscriptions exist on some names, as told by quench notifications.

    Pass its ``add``/``modify``/``delete`` methods as the quench callbacks
    (``state.callbacks()`` gives them as keyword arguments).
    ``could_interest(attrs, unknown)`` answers whether a notification with
    ``attrs`` could match any known subscription, evaluating the received
    ASTs with three-valued logic; names in ``unknown`` are attributes whose
    value the producer does not know yet (they could be anything).
    """

    def __init__(self) -> None:
        from elvin.subscription.partial import PartialEvaluator
        self._make = PartialEvaluator
        self.terms: Dict[int, Any] = {}

    def callbacks(self) -> Dict[str, Callable[..., None]]:
        return {"on_add": self.add, "on_modify": self.modify, "on_delete": self.delete}

    def add(self, term_id: int, tree: Any, secure: bool = False) -> None:
        try:
            self.terms[term_id] = self._make(tree)
        except Exception:
            # A tree this library cannot evaluate: assume it wants everything.
            self.terms[term_id] = None

    modify = add

    def delete(self, term_id: int) -> None:
        self.terms.pop(term_id, None)

    def __bool__(self) -> bool:
        return bool(self.terms)

    def could_interest(self, attributes: Mapping[str, Any], unknown: Iterable[str] = ()) -> bool:
        attrs = normalise(attributes)
        for evaluator in self.terms.values():
            if evaluator is None or evaluator.could_match(attrs, unknown):
                return True
        return False


class AutoQuenchBase:
    """What every flavour's AutoQuench decides: send a notification when a
    subscription the router told of could match it, or while a
    registration is under way (a subscription on a name not yet quenched
    is not known: sending lets the router's matching decide, where
    dropping could lose what a subscriber wants); a new attribute name
    widens the quench (``_sync``, the flavour's). Subclasses set ``connection``, ``names``, ``state``
    (a QuenchState), ``sent``, ``dropped`` and ``_pending``."""

    connection: Any
    names: set
    state: "QuenchState"
    sent: int
    dropped: int
    _pending: Any

    #: The router does not do quench (Nack 2007, as Avis): everything is
    #: sent, and the router's own matching decides.
    unsupported = False

    def _sync(self) -> None:
        raise NotImplementedError

    def _registration_failed(self, error: BaseException, log: Callable[[str], Any]) -> None:
        """The quench request failed: on a router without quench (Nack
        2007) fall back to sending everything, and say so once."""
        if isinstance(error, NackError) and error.code == QUENCH_NOT_SUPPORTED:
            if not self.unsupported:
                self.unsupported = True
                log(f"the router does not support quench ({error}): auto-quench sends "
                    f"every notification")
            return
        log(f"auto-quench registration failed: {error}")

    def notify(self, attributes: Mapping[str, Any], deliver_insecure: bool = True,
               keys: Optional[packets.Keys] = None) -> bool:
        """Emit ``attributes`` if any subscription could want it; returns
        True when sent."""
        if self.unsupported:
            self.connection.notify(attributes, deliver_insecure, keys)
            self.sent += 1
            return True
        if not set(attributes) <= self.names:
            self.names |= set(attributes)
            self._sync()
        if self._pending is not None or self.state.could_interest(attributes):
            self.connection.notify(attributes, deliver_insecure, keys)
            self.sent += 1
            return True
        self.dropped += 1
        return False


def changed_keys(keys: Optional[packets.Keys], add: Optional[packets.Keys],
                 delete: Optional[packets.Keys]) -> packets.Keys:
    """``keys`` with ``add``'s added and ``delete``'s taken out, key set by
    key set within each scheme, as a router applies a SubModRqst or
    QnchModRqst (adding a present key or deleting an absent one changes
    nothing): what a reconnection must register again."""
    table: Dict[int, List[List[bytes]]] = {}
    for source, adding in ((keys, True), (add, True), (delete, False)):
        for scheme, key_sets in source or packets.Keys.EMPTY:
            sets = table.setdefault(scheme, [])
            for index, key_set in enumerate(key_sets):
                while len(sets) <= index:
                    sets.append([])
                for key in key_set:
                    if adding and key not in sets[index]:
                        sets[index].append(key)
                    elif not adding and key in sets[index]:
                        sets[index].remove(key)
    return packets.Keys({scheme: sets for scheme, sets in table.items()
                         if any(sets)})


class Deframer:
    """Bytes in, whole packets' bytes out (the 4-byte length framing of
    client protocol 8.1), for flavours whose transport gives a stream."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self._buffer = bytearray()

    def feed(self, data: bytes) -> List[bytes]:
        """The complete frames ``data`` finishes; raises ValueError on a
        length no Elvin peer would send."""
        buffer = self._buffer
        buffer += data
        frames = []
        pos = 0
        while len(buffer) - pos >= 4:
            length = int.from_bytes(buffer[pos:pos + 4], "big")
            if length == 0 or length & 3 or length > self.max_length:
                raise ValueError(f"bad frame length {length}")
            end = pos + 4 + length
            if end > len(buffer):
                break
            frames.append(bytes(buffer[pos + 4:end]))
            pos = end
        if pos:
            del buffer[:pos]
        return frames


class Targeted:
    """A request naming a subscription or quench (``item``, registered in
    ``table``) by the object, not by its id: ``build(xid, item.id)`` makes
    the packet as it is sent, so one that waited out a reconnection names
    the id the replay gave (the old one may be another's by then).
    ``removes``: a remove, which is done already if the item is no longer
    registered; ``missing``: the Nack code for anything else then."""

    __slots__ = ("table", "item", "build", "removes", "missing")

    def __init__(self, table: Dict[int, Any], item: Any, build: Callable[[int, int], Any],
                 removes: bool, missing: int) -> None:
        self.table = table
        self.item = item
        self.build = build
        self.removes = removes
        self.missing = missing

    def __call__(self, xid: int) -> Any:
        return self.build(xid, self.item.id)

    def registered(self) -> bool:
        return self.table.get(self.item.id) is self.item

    def settle_here(self, on_reply: Callable[[Any], Any],
                    on_error: Callable[[Exception], Any]) -> None:
        """The item is gone (the replay could not register it again): a
        remove succeeds without the router, anything else fails."""
        if self.removes:
            on_reply(None)
        else:
            on_error(NackError(self.missing, f"{self.item!r} is no longer registered "
                                             f"with the router"))


class ClientState:
    """Requests, replies, deliveries and quench events of one session.

    ``send(packet)`` is how the flavour writes a packet. Subscriptions and
    quenches the flavour registers in ``subscriptions`` / ``quenches`` (by
    id) get ``_deliver_note(notification)`` and ``_event(kind, term_id,
    tree, secure)`` calls. ``on_notification(note)`` (once per delivered
    packet), ``on_dropwarn()`` and ``on_disconnect(reason, args)`` are
    optional hooks.
    """

    def __init__(self, send: Optional[Callable[[Any], Optional[int]]] = None) -> None:
        #: Writes a packet to the current channel (set by the lifecycle);
        #: returns the bytes written (frame and header), if the driver knows.
        self.send = send
        #: Where the program's packets go: ``post(packet, xid, target=None)``
        #: sends, buffers or raises ConnectionClosed (the lifecycle sets it;
        #: alone, a ClientState sends whenever it has a channel). ``target``:
        #: the Targeted that built ``packet``, to build it again if it waits.
        self.post: Callable[..., None] = self._post_direct
        self.options: Dict[str, Any] = {}
        self.subscriptions: Dict[int, Any] = {}
        self.quenches: Dict[int, Any] = {}
        # xid -> (on_reply, on_error)
        self._pending: Dict[int, Tuple[Callable[[Any], Any], Callable[[Exception], Any]]] = {}
        self._liveness_waiters: List[Tuple[Callable[[bool], Any],
                                           Callable[[Exception], Any]]] = []
        self._xids = itertools.count(1)
        #: What takes a request's reply if it comes after the program
        #: stopped waiting (``request(on_late=)``), by xid.
        self._late: Dict[int, Callable[[Any], Any]] = {}
        #: Requests that timed out on this channel (``time_out``), by xid:
        #: (the request, its on_late); their replies are no one's.
        self._timed_out: Dict[int, Tuple[Any, Optional[Callable[[Any], Any]]]] = {}
        self.on_disconnect: Optional[Callable[[int, str], Any]] = None
        self.on_dropwarn: Optional[Callable[[], Any]] = None
        #: Called once per delivered notification, however many of this
        #: connection's subscriptions it matched (before their callbacks).
        self.on_notification: Optional[Callable[[Notification], Any]] = None
        self.dropwarns = 0
        #: The SecRqsts that succeeded, in order: a reconnected session
        #: replays them (after ConnRqst with the keys it connected with).
        self.key_changes: List[MakePacket] = []
        #: Through an Elvin proxy (docs/proxy.md): the sessions joined, and
        #: their subscriptions (by id), kept up to date by the proxy.
        self.sessions: Dict[str, JoinedSession] = {}
        self.session_subscriptions: Dict[int, SessionSubscription] = {}
        #: Called with each session event's attributes (after the tables
        #: above are updated).
        self.on_session_event: Optional[Callable[[Dict[str, Any]], Any]] = None
        self._awaiting_joins: set = set()
        #: Called with the new URI when the session moves to another router
        #: (a redirection it follows, or a failover).
        self.on_redirect: Optional[Callable[[Any], Any]] = None
        #: Follow a router's redirection (Disconn 2) rather than end.
        self.follow_redirects = True
        #: With reconnection: called with the ConnectionClosed when the
        #: channel is lost, and with the connection once it is back.
        self.on_connection_lost: Optional[Callable[[Any], Any]] = None
        self.on_reconnected: Optional[Callable[[Any], Any]] = None
        self._redirect_times: List[float] = []
        self._joins_done: Optional[Callable[[], Any]] = None
        #: Through a proxy session that granted ``Proxy.Ack-Window``: what
        #: the program has handled, told to the proxy (``channel_started``).
        self.acks = AckTracker()
        #: The flavour's timer: ``call_later(delay, f)`` returning a handle
        #: with ``cancel()`` (acknowledgements go at most ACK_INTERVAL late).
        self.call_later: Optional[Callable[[float, Callable[[], Any]], Any]] = None
        self._ack_timer: Any = None

    def _post_direct(self, packet: Any, xid: Optional[int],
                     target: Optional[Targeted] = None) -> None:
        if self.send is None:
            raise ConnectionClosed("connection is closed")
        self.send(packet)

    # -- what the program asks ------------------------------------------------

    def request(self, make_packet: MakePacket, on_reply: Callable[[Any], Any],
                on_error: Callable[[Exception], Any],
                on_late: Optional[Callable[[Any], Any]] = None) -> int:
        """Send ``make_packet(xid)``; ``on_reply(packet)`` or
        ``on_error(exception)`` follows. Raises ConnectionClosed at once
        when the session is over (and PublishBufferFull when it is
        reconnecting with a full buffer). If the request times out
        (``time_out``: on_error gets a RequestTimeout) and its reply comes
        after all, ``on_late(reply)`` takes it (without one, a late SubRply
        or QnchRply to an add is undone at the router: nobody holds it)."""
        xid = next(self._xids)
        self._pending[xid] = (on_reply, on_error)
        if on_late is not None:
            self._late[xid] = on_late
        try:
            self.post(make_packet(xid), xid,
                      make_packet if isinstance(make_packet, Targeted) else None)
        except BaseException:
            del self._pending[xid]
            self._late.pop(xid, None)
            raise
        return xid

    def send_request(self, make_packet: MakePacket, on_reply: Callable[[Any], Any],
                     on_error: Callable[[Exception], Any]) -> int:
        """As ``request``, straight to the channel (the lifecycle's own
        handshake, replay and DisconnRqst)."""
        assert self.send is not None
        xid = next(self._xids)
        self._pending[xid] = (on_reply, on_error)
        self.send(make_packet(xid))
        return xid

    def abandon(self, xid: int, on_late_reply: Optional[Callable[[Any], Any]] = None) -> bool:
        """The program stopped waiting for request ``xid`` (it was
        cancelled): ``on_late_reply(reply)`` takes the router's answer if
        one still comes. False if the request is no longer pending."""
        if xid not in self._pending:
            return False
        self._pending[xid] = (on_late_reply or _ignore, _ignore)
        return True

    def time_out(self, xid: int, request: Any, error: Exception) -> bool:
        """Request ``xid`` (the packet ``request``) was not answered in
        time: fail it with ``error`` (a RequestTimeout) and take a reply
        that still comes as a late one (``_late_reply``). False if nobody
        waits for it any more (answered, failed, or abandoned by a
        cancelled caller, whose late handler then stays)."""
        waiting = self._pending.get(xid)
        if waiting is None or waiting[1] is _ignore:
            return False
        del self._pending[xid]
        timed_out = self._timed_out
        if len(timed_out) >= _TIMED_OUT_KEPT:     # a router that never answers: bounded
            del timed_out[next(iter(timed_out))]
        timed_out[xid] = (request, self._late.pop(xid, None))
        waiting[1](error)
        return True

    def channel_changed(self) -> None:
        """A new channel: replies to what timed out on the old one never come."""
        self._timed_out.clear()

    def _late_reply(self, xid: int, packet: Any) -> None:
        """``packet`` answers request ``xid``, which timed out: the late
        handler takes it, else an add nobody holds is undone at the router;
        a Nack is dropped. Logged."""
        request, late = self._timed_out.pop(xid)
        what = describe_request(request) if request is not None else f"request {xid}"
        if type(packet) is packets.Nack:
            _log.info("dropped the router's late Nack to %s (it had timed out): %s",
                      what, NackError(packet.error, packet.message, packet.args))
            return
        try:
            if late is not None:
                _log.info("the router answered %s after it had timed out", what)
                late(packet)
            elif type(request) is packets.SubAddRqst and type(packet) is packets.SubRply:
                _log.info("the router answered %s after it had timed out: removing "
                          "subscription %d", what, packet.subscription_id)
                self.request(self.sub_del_rqst(packet.subscription_id), _ignore, _ignore)
            elif type(request) is packets.QnchAddRqst and type(packet) is packets.QnchRply:
                _log.info("the router answered %s after it had timed out: removing "
                          "quench %d", what, packet.quench_id)
                self.request(self.qnch_del_rqst(packet.quench_id), _ignore, _ignore)
            else:
                _log.info("the router answered %s after it had timed out: ignored", what)
        except ConnectionClosed:
            pass                          # the session is gone, and what it held
        except Exception:
            self._callback_failed(f"the late answer to {what}")

    def ping(self, on_alive: Callable[[bool], Any], on_error: Callable[[Exception], Any]) -> None:
        """TestConn: ``on_alive(True)`` when the router shows it is alive.
        Raises ConnectionClosed unless the session is up."""
        self.post(packets.TestConn(), -1)
        self._liveness_waiters.append((on_alive, on_error))

    def emit(self, attributes: Mapping[str, Any], deliver_insecure: bool = True,
             keys: Optional[packets.Keys] = None) -> None:
        """Send a NotifyEmit (no reply comes back; errors are local)."""
        self.post(self.notify_emit(attributes, deliver_insecure, keys), None)

    def notify_emit(self, attributes: Mapping[str, Any], deliver_insecure: bool = True,
                    keys: Optional[packets.Keys] = None) -> Any:
        """The NotifyEmit for ``attributes``, checked as the router would
        check it: TypeError for a value of no Elvin type, ValueError for no
        attribute, for a name or string holding a NUL (an EncodeError
        naming the attribute: a string has no NUL bytes, 6.1.4, and a
        router ignores such a notification) or for what the router would
        refuse by ending the session (larger than its Packet.Max-Length, or
        past the attribute limits it reported)."""
        attributes = normalise(attributes)
        if not attributes:
            raise ValueError("a notification needs at least one attribute")
        packet = packets.NotifyEmit(attributes, deliver_insecure, keys or packets.Keys.EMPTY)
        self._check_limits(packet, attributes, keys)
        return packet

    def option_value(self, name: str) -> Optional[int]:
        """The router's value of integer option ``name`` (under its standard
        or legacy name), if it reported one."""
        options = self.options
        value = options.get(name)
        if value is None:
            legacy = _LEGACY_NAMES.get(name)
            value = options.get(legacy) if legacy is not None else None
        return int(value) if isinstance(value, int) else None

    def _check_limits(self, packet: Any, attributes: Mapping[str, Any],
                      keys: Optional[packets.Keys]) -> None:
        limit = self.option_value("Packet.Max-Length") or DEFAULT_PACKET_MAX_LENGTH
        # An upper bound of the encoded size: a usual notification is not
        # encoded twice (its channel encodes it).
        bound = 64
        for name, value in attributes.items():
            bound += 4 * len(name) + 24
            kind = type(value)
            if kind is str:
                bound += 4 * len(value)
                if "\0" in value:
                    packets.encode_attributes({name: value})  # the EncodeError naming it
            elif kind is bytes:
                bound += len(value)
            if "\0" in name:
                packets.encode_attributes({name: value})
        if keys or bound > limit:
            size = len(packets.encode(packet))
            if size > limit:
                reported = self.option_value("Packet.Max-Length") is not None
                raise ValueError(
                    f"the notification is {size} bytes encoded, more than the router's "
                    f"Packet.Max-Length ({limit}"
                    + ("" if reported else ", the default; ask for more with "
                       "connect(options={'Packet.Max-Length': N})")
                    + "): the router would end the session; not sent")
        count = self.option_value("Attribute.Max-Count")
        if count is not None and len(attributes) > count:
            raise ValueError(f"{len(attributes)} attributes, more than the router's "
                             f"Attribute.Max-Count ({count}); not sent")
        name_max = self.option_value("Attribute.Name.Max-Length")
        string_max = self.option_value("Attribute.String.Max-Length")
        opaque_max = self.option_value("Attribute.Opaque.Max-Length")
        if name_max is None and string_max is None and opaque_max is None:
            return
        for name, value in attributes.items():
            if name_max is not None and len(name.encode("utf-8")) > name_max:
                raise ValueError(f"attribute name {name[:40]!r}... longer than the router's "
                                 f"Attribute.Name.Max-Length ({name_max}); not sent")
            kind = type(value)
            if kind is str and string_max is not None and len(value) > string_max // 4 \
                    and len(value.encode("utf-8")) > string_max:
                raise ValueError(f"string attribute {name!r} longer than the router's "
                                 f"Attribute.String.Max-Length ({string_max}); not sent")
            if kind is bytes and opaque_max is not None and len(value) > opaque_max:
                raise ValueError(f"opaque attribute {name!r} longer than the router's "
                                 f"Attribute.Opaque.Max-Length ({opaque_max}); not sent")

    # Packet builders for the requests every flavour makes.

    @staticmethod
    def conn_rqst(options: Optional[Mapping[str, Any]], nfn_keys: Optional[packets.Keys],
                  sub_keys: Optional[packets.Keys]) -> MakePacket:
        return lambda xid: packets.ConnRqst(xid, 4, 0, dict(options or {}),
                                      nfn_keys or packets.Keys.EMPTY, sub_keys or packets.Keys.EMPTY)

    @staticmethod
    def sub_add_rqst(expression: str, accept_insecure: bool,
                     keys: Optional[packets.Keys]) -> MakePacket:
        return lambda xid: packets.SubAddRqst(xid, expression, accept_insecure,
                                        keys or packets.Keys.EMPTY)

    # The builders of changes take a registered subscription or quench (a
    # Targeted request: its id is read as it is sent) or a bare id.

    def sub_mod_rqst(self, sub: Union[int, Any], expression: Optional[str],
                     accept_insecure: bool, add_keys: Optional[packets.Keys],
                     del_keys: Optional[packets.Keys]) -> MakePacket:
        def build(xid: int, sub_id: int) -> Any:
            return packets.SubModRqst(xid, sub_id, expression or "", accept_insecure,
                                      add_keys or packets.Keys.EMPTY,
                                      del_keys or packets.Keys.EMPTY)
        return self._targeted(self.subscriptions, sub, build, False, NO_SUCH_SUB)

    def sub_del_rqst(self, sub: Union[int, Any]) -> MakePacket:
        return self._targeted(self.subscriptions, sub, packets.SubDelRqst, True, NO_SUCH_SUB)

    @staticmethod
    def qnch_add_rqst(names: Iterable[str], deliver_insecure: bool,
                      keys: Optional[packets.Keys]) -> MakePacket:
        return lambda xid: packets.QnchAddRqst(xid, tuple(names), deliver_insecure,
                                         keys or packets.Keys.EMPTY)

    def qnch_mod_rqst(self, quench: Union[int, Any], add_names: Iterable[str],
                      del_names: Iterable[str], deliver_insecure: bool,
                      add_keys: Optional[packets.Keys],
                      del_keys: Optional[packets.Keys]) -> MakePacket:
        add, delete = tuple(add_names), tuple(del_names)

        def build(xid: int, quench_id: int) -> Any:
            return packets.QnchModRqst(xid, quench_id, add, delete, deliver_insecure,
                                       add_keys or packets.Keys.EMPTY,
                                       del_keys or packets.Keys.EMPTY)
        return self._targeted(self.quenches, quench, build, False, NO_SUCH_QUENCH)

    def qnch_del_rqst(self, quench: Union[int, Any]) -> MakePacket:
        return self._targeted(self.quenches, quench, packets.QnchDelRqst, True, NO_SUCH_QUENCH)

    @staticmethod
    def _targeted(table: Dict[int, Any], item: Union[int, Any],
                  build: Callable[[int, int], Any], removes: bool, missing: int) -> MakePacket:
        if isinstance(item, int):
            return lambda xid: build(xid, item)
        return Targeted(table, item, build, removes, missing)

    @staticmethod
    def qos_rqst(options: Mapping[str, Any]) -> MakePacket:
        return lambda xid: packets.QosRqst(xid, dict(options))

    @staticmethod
    def sec_rqst(add_nfn_keys: Optional[packets.Keys], del_nfn_keys: Optional[packets.Keys],
                 add_sub_keys: Optional[packets.Keys], del_sub_keys: Optional[packets.Keys]) -> MakePacket:
        empty = packets.Keys.EMPTY
        return lambda xid: packets.SecRqst(xid, add_nfn_keys or empty, del_nfn_keys or empty,
                                     add_sub_keys or empty, del_sub_keys or empty)

    @staticmethod
    def disconn_rqst() -> MakePacket:
        return lambda xid: packets.DisconnRqst(xid)

    def subscription_modified(self, sub: Any, expression: Optional[str], accept_insecure: bool,
                              reply: Any, add_keys: Optional[packets.Keys] = None,
                              del_keys: Optional[packets.Keys] = None) -> Any:
        """Apply a SubModRqst's SubRply to ``sub`` (a router may give the
        subscription a new id; its keys are what a reconnection registers
        again); returns ``sub``."""
        if expression:
            sub.expression = expression
        sub.accept_insecure = accept_insecure
        if add_keys or del_keys:
            sub.keys = changed_keys(sub.keys, add_keys, del_keys)
        if reply.subscription_id != sub.id:
            self.subscriptions.pop(sub.id, None)
            sub.id = reply.subscription_id
            self.subscriptions[sub.id] = sub
        return sub

    def expect_joins(self, names: Iterable[str], done: Optional[Callable[[], Any]] = None) -> None:
        """A proxy will report joining these sessions: ``done()`` once all have."""
        self._awaiting_joins = set(names)
        self._joins_done = done

    @property
    def joins_pending(self) -> bool:
        return bool(self._awaiting_joins)

    def subscribed_in_session(self, sub_id: int, expression: str,
                              accept_insecure: bool) -> None:
        """Through a proxy session, a subscription we made joins the
        session's (the proxy tells only the session's other clients)."""
        if self.sessions:
            self.session_subscriptions[sub_id] = SessionSubscription(
                sub_id, next(iter(self.sessions)), expression, accept_insecure)

    def redirected(self, uri: Any) -> None:
        """The session moved to ``uri`` (a redirection or a failover): tell
        the program (``on_redirect``); a callback that raises is logged."""
        if self.on_redirect is not None:
            try:
                self.on_redirect(uri)
            except Exception:
                self._callback_failed("on_redirect")

    def redirect_allowed(self, now: float) -> bool:
        """May we follow one more redirection at time ``now``? Not a sixth
        within ten seconds: routers redirecting to each other (a loop)."""
        self._redirect_times = [t for t in self._redirect_times if now - t < 10] + [now]
        return len(self._redirect_times) <= 5

    @staticmethod
    def limit_options(sub_id: int, ttl: Optional[int], max_count: Optional[int]) -> Dict[str, int]:
        """The QosRqst options asking a proxy to keep what subscription
        ``sub_id`` matches for at most ``ttl`` seconds and ``max_count``
        notifications (0: no limit; None: unchanged). docs/proxy.md."""
        options = {}
        if ttl is not None:
            options[f"Proxy.TTL.{sub_id}"] = int(ttl)
        if max_count is not None:
            options[f"Proxy.Max-Count.{sub_id}"] = int(max_count)
        return options

    def limits_set(self, sub_id: int, ttl: Optional[int], max_count: Optional[int]) -> None:
        """The proxy accepted ``limit_options``: note them."""
        known = self.session_subscriptions.get(sub_id)
        if known is not None:
            known.ttl = ttl if ttl is not None else known.ttl
            known.max_count = max_count if max_count is not None else known.max_count

    def keys_changed(self, make_packet: MakePacket) -> None:
        """Remember a SecRqst the router accepted (for ``replay``)."""
        self.key_changes.append(make_packet)

    def replay(self) -> List[ReplayStep]:
        """The requests that re-create this session's state on a new
        channel, in order: key changes, then every subscription and quench
        (each gets the id the router now gives it). Each step is
        ``(make_packet, apply(reply) or None, (table, item) or None)``;
        a flavour whose step is refused calls ``drop(table, item)``.

        Through a proxy session there is nothing to replay: the session
        keeps its keys and subscriptions (with their ids) for us."""
        if self.sessions or self._awaiting_joins:
            return []
        steps: List[ReplayStep] = [(change, None, None) for change in self.key_changes]
        for sub in list(self.subscriptions.values()):
            steps.append((self.sub_add_rqst(sub.expression, sub.accept_insecure,
                                            getattr(sub, "keys", None)),
                          self._readded(self.subscriptions, sub, "subscription_id"),
                          (self.subscriptions, sub)))
        for quench in list(self.quenches.values()):
            steps.append((self.qnch_add_rqst(sorted(quench.names), quench.deliver_insecure,
                                             getattr(quench, "keys", None)),
                          self._readded(self.quenches, quench, "quench_id"),
                          (self.quenches, quench)))
        return steps

    @staticmethod
    def drop(table: Dict[int, Any], item: Any) -> None:
        """Forget ``item`` (the router would not take it back)."""
        key: int = item.id
        if table.get(key) is item:
            del table[key]

    @staticmethod
    def _readded(table: Dict[int, Any], item: Any, field: str) -> Callable[[Any], None]:
        old = item.id

        def apply(reply: Any) -> None:
            if table.get(old) is item:
                del table[old]
            item.id = getattr(reply, field)
            table[item.id] = item
        return apply

    # -- acknowledging to a proxy (elvin.clientcore.acks) -----------------------

    def channel_started(self) -> None:
        """ConnRply arrived on a new channel (``options`` set): acknowledge
        on it if the proxy granted a window, counting from here."""
        self._cancel_ack_timer()
        window = self.options.get(ACK_WINDOW, 0)
        self.acks.start(int(window) if isinstance(window, int) and window > 0 else 0)

    def ack_hold(self, note: Notification) -> None:
        """Something keeps ``note`` for the program (an iterator's queue, a
        running coroutine): it is not handled until ``ack_release``."""
        if note.ack_token is not None:
            self.acks.hold(note.ack_token)

    def ack_release(self, note: Notification) -> None:
        """The program is done with ``note`` (as far as one holder goes)."""
        token = note.ack_token
        if token is None:
            return
        acks = self.acks
        acks.release(token)
        if acks.due():
            self.flush_acks()
        elif acks.waiting and self._ack_timer is None and self.call_later is not None:
            self._ack_timer = self.call_later(ACK_INTERVAL, self._ack_timed)

    def _ack_timed(self) -> None:
        self._ack_timer = None
        self.flush_acks()

    def _cancel_ack_timer(self) -> None:
        timer, self._ack_timer = self._ack_timer, None
        if timer is not None:
            timer.cancel()

    def flush_acks(self) -> bool:
        """Tell the proxy now what the program has handled (QosRqst
        ``Proxy.Ack``); False if there was nothing new or no channel."""
        self._cancel_ack_timer()
        if self.send is None or not self.acks.waiting:
            return False
        count = self.acks.take()
        if count is None:
            return False
        self.send_request(self.qos_rqst({ACK: Int64(count)}), _ignore, self._ack_refused)
        return True

    def stop_acks(self) -> None:
        """Closing: tell the proxy what was handled, then no more."""
        self.flush_acks()
        self.acks.stop()

    @staticmethod
    def _ack_refused(error: Exception) -> None:
        if not isinstance(error, ConnectionClosed):
            _log.warning("the proxy refused an acknowledgement: %s (what was not "
                         "acknowledged is delivered again at the next join)", error)

    # -- what the router says -------------------------------------------------

    def packet_received(self, packet: Any) -> None:
        kind = type(packet)
        if self._liveness_waiters and kind not in (packets.TestConn, packets.Disconn):
            # Any packet from the router proves it is alive: a router with
            # packets queued for us may skip ConfConn (ours does, in
            # ClientSession._test_conn; so does Avis).
            waiters, self._liveness_waiters = self._liveness_waiters, []
            for on_alive, _ in waiters:
                on_alive(True)
        if kind is packets.NotifyDeliver:
            self._deliver(packet)
        elif kind is packets.Nack:
            xid = packet.xid
            waiting = self._pending.pop(xid, None)
            if waiting is not None:
                if self._late:
                    self._late.pop(xid, None)
                waiting[1](NackError(packet.error, packet.message, packet.args))
            elif xid in self._timed_out:
                self._late_reply(xid, packet)
        elif kind is packets.Disconn:
            pass  # the lifecycle's (Lifecycle.packet): it ends or moves the session
        elif kind is packets.SubAddNotify or kind is packets.SubModNotify:
            event = "add" if kind is packets.SubAddNotify else "modify"
            for secure, ids in ((True, packet.secure_quench_ids),
                                (False, packet.insecure_quench_ids)):
                for quench_id in ids:
                    self._quench_event(quench_id, event, packet.term_id,
                                       packet.sub_expr, secure)
        elif kind is packets.SubDelNotify:
            for quench_id in packet.quench_ids:
                self._quench_event(quench_id, "delete", packet.term_id)
        elif kind is packets.DropWarn:
            self.dropwarns += 1
            if self.on_dropwarn is not None:
                self.on_dropwarn()
        elif kind is packets.TestConn:
            if self.send is not None:
                self.send(packets.ConfConn())
        elif kind is packets.ConfConn:
            pass  # answered ping above, like any other packet
        else:
            xid = getattr(packet, "xid", None)
            if xid is None:
                return
            answered = self._pending.pop(xid, None)
            if answered is not None:
                if self._late:
                    self._late.pop(xid, None)
                answered[0](packet)
            elif xid in self._timed_out:
                self._late_reply(xid, packet)

    # -- internals ------------------------------------------------------------

    def _deliver(self, packet: Any) -> None:
        if (PROXY_EVENT in packet.attributes and not packet.secure_matches
                and not packet.insecure_matches):
            self._session_event(dict(packet.attributes))
            return
        note = Notification(packet.attributes, packet.secure_matches,
                            packet.insecure_matches)
        if self.acks.window:
            note.ack_token = self.acks.delivered()
        if self.on_notification is not None:
            try:
                self.on_notification(note)
            except Exception:
                self._callback_failed("on_notification")
        seen = set()
        for sub_id in itertools.chain(packet.secure_matches, packet.insecure_matches):
            sub = self.subscriptions.get(sub_id) or self.session_subscriptions.get(sub_id)
            if sub is None or sub_id in seen:
                continue
            seen.add(sub_id)
            try:
                sub._deliver_note(note)
            except Exception:
                self._callback_failed(f"subscription callback for {sub!r}")
        if note.ack_token is not None:
            self.ack_release(note)

    def _session_event(self, event: Dict[str, Any]) -> None:
        """A proxy told us of our sessions (docs/proxy.md, "Session events")."""
        kind = event.get(PROXY_EVENT)
        session = event.get("Proxy.Session")
        sub_id = event.get("Proxy.Subscription")
        if isinstance(sub_id, int):
            sub_id = int(sub_id)
        if kind == "subscription" and isinstance(sub_id, int):
            sub = self.session_subscriptions.get(sub_id)
            if sub is None:
                sub = self.session_subscriptions[sub_id] = SessionSubscription(
                    sub_id, str(session), "")
            sub.expression = str(event.get("Proxy.Expression", sub.expression))
            sub.accept_insecure = bool(event.get("Proxy.Accept-Insecure", 1))
            sub.ttl = int(event.get("Proxy.TTL", 0))
            sub.max_count = int(event.get("Proxy.Max-Count", 0))
        elif kind == "subscription-removed" and isinstance(sub_id, int):
            self.session_subscriptions.pop(sub_id, None)
        elif kind == "joined" and isinstance(session, str):
            gaps = event.get("Proxy.Gaps")    # (a proxy that does not say: None)
            self.sessions[session] = JoinedSession(
                session, int(event.get("Proxy.Stored", 0)), int(event.get("Proxy.Dropped", 0)),
                bool(event.get("Proxy.Admin", 0)),
                None if gaps is None else int(gaps))
            self._awaiting_joins.discard(session)
            if not self._awaiting_joins and self._joins_done is not None:
                done, self._joins_done = self._joins_done, None
                done()
        elif kind == "session-deleted" and isinstance(session, str):
            self.sessions.pop(session, None)
            for key, sub in list(self.session_subscriptions.items()):
                if sub.session == session:
                    del self.session_subscriptions[key]
        if self.on_session_event is not None:
            try:
                self.on_session_event(event)
            except Exception:
                self._callback_failed("on_session_event")

    def _quench_event(self, quench_id: int, event: str, term_id: int, tree: Any = None,
                      secure: bool = False) -> None:
        quench = self.quenches.get(quench_id)
        if quench is None:
            return
        try:
            quench._event(event, term_id, tree, secure)
        except Exception:
            self._callback_failed(f"quench callback for {quench!r}")

    def _callback_failed(self, what: str) -> None:
        """A program's callback raised (called inside the ``except``): log
        it and go on; the session is not the program's callback."""
        _log.exception("%s raised", what)

    def _fail_pending(self, error: Exception, keep: Iterable[int] = ()) -> None:
        """Fail every waiting request (but those in ``keep``: not sent yet)
        and liveness check with ``error``."""
        for on_error in self._take_pending(keep):
            on_error(error)

    def _take_pending(self, keep: Iterable[int] = ()) -> List[Callable[[Exception], Any]]:
        """Forget every waiting request (but those in ``keep``) and
        liveness check; their ``on_error``s, for the caller to fail."""
        pending, self._pending = self._pending, {}
        for xid in keep:
            if xid in pending:
                self._pending[xid] = pending.pop(xid)
        if self._late:
            self._late = {xid: late for xid, late in self._late.items() if xid in self._pending}
        waiters, self._liveness_waiters = self._liveness_waiters, []
        return [on_error for _, on_error in list(pending.values()) + waiters]


def _ignore(_: Any) -> None:
    pass


#: Timed-out requests remembered per channel for their late replies.
_TIMED_OUT_KEPT = 1024
