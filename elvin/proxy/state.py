"""What the proxy's parts share, declared once: the state of a
``ProxyCore`` (``CoreState``) and of a ``ProxyClient`` (``ClientState``).

Each part (elvin.proxy.joining, requests, relay, delivery) builds on these,
so what a part reads is declared where it is made, and the type checker
holds every part to it, rather than each assuming the attributes of a class
put together elsewhere (elvin.proxy.core). The bookkeeping every part
relies on (sessions made and saved, events announced) is here too.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import (TYPE_CHECKING, Any, ClassVar, Callable, Deque, Dict, List, Optional,
                    Set, Tuple)

from twisted.internet import defer
from twisted.logger import Logger

from elvin.core.host import SessionHost
from elvin.core.keys import SUPPORTED_KEY_SCHEMES, KeyRing
from elvin.core.lograte import LogLimiter
from elvin.core.options import OPTIONS, ConnectionOptions
from elvin.core.router import MAX_PROTOCOL_ERRORS, PROTOCOL_ERROR_WINDOW, ClientSession
from elvin.proxy.counters import ProxyCounters
from elvin.proxy.guard import PasswordGate
from elvin.proxy.model import ProxySubscription, Session, keys_to_bytes, ring_from_bytes
from elvin.proxy.store import Store

if TYPE_CHECKING:
    from elvin.proxy.core import ProxyCore

__all__ = ["CoreState", "ClientState", "COUNT_LIMITED_FIELDS"]

_CONNECTION_KEYS = "Connection.Max-Keys"
_ATTRIBUTES = "Attribute.Max-Count"

#: The arrays a client sends that the proxy bounds as the router does
#: (elvin.core.router.COUNT_LIMITED_FIELDS), by the option its requests
#: check them against: every request's keys by Connection.Max-Keys; a
#: quench's fields by any (a quench is refused whatever it holds); a
#: notification's keys by Connection.Max-Keys, as the router holds them
#: (the proxy checks them before passing them upstream).
COUNT_LIMITED_FIELDS = {
    "NotifyEmit.attributes": _ATTRIBUTES,
    "UNotify.attributes": _ATTRIBUTES,
    "NotifyEmit.keys": _CONNECTION_KEYS,
    "UNotify.keys": _CONNECTION_KEYS,
    "QosRqst.options": (_ATTRIBUTES, ConnectionOptions.QOS_OPTIONS_FLOOR),
    "SecRqst.add_nfn_keys": _CONNECTION_KEYS,
    "SecRqst.del_nfn_keys": _CONNECTION_KEYS,
    "SecRqst.add_sub_keys": _CONNECTION_KEYS,
    "SecRqst.del_sub_keys": _CONNECTION_KEYS,
    "SubAddRqst.keys": _CONNECTION_KEYS,
    "SubModRqst.add_keys": _CONNECTION_KEYS,
    "SubModRqst.del_keys": _CONNECTION_KEYS,
    "QnchAddRqst.names": _ATTRIBUTES,
    "QnchAddRqst.keys": _CONNECTION_KEYS,
    "QnchModRqst.names_add": _ATTRIBUTES,
    "QnchModRqst.names_del": _ATTRIBUTES,
    "QnchModRqst.add_keys": _CONNECTION_KEYS,
    "QnchModRqst.del_keys": _CONNECTION_KEYS,
}


class CoreState(SessionHost):
    """A proxy's sessions, subscriptions, channels and limits, loaded from
    its store; the host of its clients' sessions (``SessionHost``)."""

    log = Logger()

    def __init__(self, store: Store, upstream: Any, *, option_specs=None,
                 clock: Callable[[], float] = time.time, call_later=None,
                 max_connections: int = 10_000, max_sessions: int = 10_000,
                 max_sessions_per_host: int = 1_000,
                 max_session_subscriptions: int = 1_000, max_backlog: int = 10_000,
                 page_size: int = 256, in_thread=None, max_inflight: int = 1024,
                 session_expiry: Optional[float] = None, sweep_step: int = 2000,
                 gate: Optional[PasswordGate] = None):
        self.store = store
        self.upstream = upstream
        #: What refusals are dated with (ClientSession.nack reads it).
        self.wall_clock = clock
        self.option_specs = dict(OPTIONS if option_specs is None else option_specs)
        self.clock = clock
        #: Upstream's refusals of subscriptions: one line per 10 s at most.
        self._refusal_log = LogLimiter(clock)
        #: Requests upstream did not answer within upstream-timeout: likewise.
        self._timeout_log = LogLimiter(clock)
        self.call_later = call_later
        self.max_connections = max_connections
        #: The open-file budget's Twisted side (elvin.protocols.gate), set by
        #: ``twistd elvin-proxy``; its listeners' connections pass its gate.
        self.admission: Any = None
        self.max_sessions = max_sessions
        #: Most sessions kept that the clients of one host created (0: no cap).
        self.max_sessions_per_host = max_sessions_per_host
        #: How many of the sessions kept each host's clients created.
        self.created_by: Dict[str, int] = collections.Counter()
        #: Refusals by max-sessions-per-host: one line per 10 s at most.
        self.host_cap_log = LogLimiter(clock)
        self.max_session_subscriptions = max_session_subscriptions
        self.max_backlog = max_backlog
        self.page_size = page_size
        #: Most notifications an acknowledging client may have unacknowledged.
        self.max_inflight = max_inflight
        #: Seconds a session may go without a client before it is deleted.
        self.session_expiry = session_expiry
        #: Most expired rows one sweep step deletes (the rest in later turns).
        self.sweep_step = sweep_step
        #: The open channels (ElvinServerProtocol counts them), and those
        #: of clients that acknowledge (what may be in flight: in_flight).
        self.sessions: set = set()
        self.acking: set = set()
        self.named: Dict[str, Session] = {}
        self.subscriptions: Dict[int, ProxySubscription] = {}
        self.by_upstream: Dict[int, ProxySubscription] = {}
        self.backlog: List[tuple] = []
        self.closing = False
        #: As the router's: 1xxx Nacks within the window that disconnect.
        self.max_protocol_errors = MAX_PROTOCOL_ERRORS
        #: Runs password hashing: in a thread under twistd
        #: (``threads.deferToThread``), at once (a Deferred that has fired)
        #: in tests; through ``gate``, which bounds and throttles it.
        self.in_thread = in_thread or defer.maybeDeferred
        self.gate = gate or PasswordGate(clock, run=lambda f: self.in_thread(f))
        self.protocol_error_window = PROTOCOL_ERROR_WINDOW
        #: What it has done (elvin.proxy.counters; shown by the status listener).
        self.counters = ProxyCounters()
        self._ignored_log = LogLimiter(clock)
        #: While the store cannot write (disk full): when to try again, and
        #: each session's drops not stored meanwhile (``unsaved_gaps`` of
        #: them gaps of unknown size).
        self.store_down_until: Optional[float] = None
        self.unsaved_drops: Dict[str, int] = collections.Counter()
        self.unsaved_gaps: Dict[str, int] = collections.Counter()
        #: Whether the upstream connection has been lost since it was last made
        #: (its next one announces the gap: elvin.proxy.relay).
        self.upstream_lost = False
        #: Subscriptions to ask upstream for again, and each one's timer
        #: (elvin.proxy.relay: a request making one went unanswered).
        self._place_retries: Dict[Any, Any] = {}
        self._sweeping = False
        #: What this turn's transaction stored (``keep`` of each), until it commits.
        self._turn: List[Dict[str, Any]] = []
        #: Drop counts written in this turn's transaction (session, drops,
        #: gaps): counted again in memory if it is rolled back.
        self._turn_drops: List[Tuple[str, int, int]] = []
        #: As the router's: Nacks by code and the latest refusals.
        self.nacks = collections.Counter()
        self.refusals = collections.deque(maxlen=50)
        self._client_numbers = itertools.count(1)
        self._holding = False
        self._held: List[tuple] = []
        #: The newest stored notification's id: where a gap reported now
        #: falls in the stream of a client fed from the store.
        self.newest_note = store.newest_notification()
        #: Notifications the caps dropped: one line per 10 s at most.
        self._cap_log = LogLimiter(clock)
        store.in_flight = self.in_flight
        self._load()
        self._ids = itertools.count(store.largest_subscription_id() + 1)

    def _load(self):
        """Every session in the store, as it was (a restart restores them)."""
        self.store.unseen_since(self.clock())
        for name in self.store.sessions():
            record = self.store.session(name)
            assert record is not None, name      # a name sessions() lists has its row
            session = Session(name, record.join_hash, record.admin_hash,
                              ring_from_bytes(record.keys, "nfn"),
                              ring_from_bytes(record.keys, "sub"), record.creator)
            if record.creator is not None:
                self.created_by[record.creator] += 1
            keys = self.store.subscription_keys(name)
            for sub_id, expression, insecure, ttl, max_count in self.store.subscriptions(name):
                sub = ProxySubscription(sub_id, session, expression, insecure,
                                        ring_from_bytes(keys.get(sub_id), "sub"), ttl, max_count)
                session.subscriptions[sub_id] = sub
                self.subscriptions[sub_id] = sub
            self.named[name] = session

    def in_flight(self, name: Optional[str]) -> List[Tuple[int, int]]:
        """What the store's caps must leave (``Store.in_flight``): none here;
        elvin.proxy.delivery knows."""
        return []

    def channel_count(self) -> int:
        return len(self.sessions)

    def new_options(self) -> ConnectionOptions:
        return ConnectionOptions(self.option_specs, SUPPORTED_KEY_SCHEMES, COUNT_LIMITED_FIELDS)

    def deliveries_lost(self, count: int) -> None:
        """Nothing here: the proxy adds a client's ``dropped`` to its
        counters when the channel ends (``ProxyCore.session_closed``)."""

    def slow_client_disconnected(self) -> None:
        """Nothing here: the proxy keeps no count of slow clients."""

    def notification_ignored(self, peer: Any, problem: str) -> None:
        """A client's notification was ignored (7.3.3): logged, rate-limited."""
        skipped = self._ignored_log.allow()
        if skipped is not None:
            self.log.info("ignored notification from {peer}: {problem}{more}", peer=peer,
                          problem=problem, more=self._ignored_log.more(skipped))

    def client_name(self) -> str:
        return f"connection-{next(self._client_numbers)}"

    def shutdown(self) -> None:
        self.closing = True
        for client in list(self.sessions):
            client.disconnect(1, "proxy is shutting down")

    def add_session(self, name, join_hash, admin_hash, creator=None) -> Session:
        """A new session, kept (StoreFailed if the store cannot write);
        ``creator``: the host of the client creating it."""
        record = self.store.add_session(name, join_hash, admin_hash, self.clock(), creator)
        session = Session(name, record.join_hash, record.admin_hash, creator=creator)
        self.named[name] = session
        if creator is not None:
            self.created_by[creator] += 1
        self.log.info("session {name!r} created", name=name)
        return session

    def host_may_create(self, host) -> bool:
        """May a client of ``host`` create one more session
        (``max-sessions-per-host``)?"""
        return not self.max_sessions_per_host or (
            self.created_by.get(host, 0) < self.max_sessions_per_host)

    def save_keys(self, session: Session) -> None:
        if session.persistent:
            self.store.set_keys(session.name, keys_to_bytes(session.nfn_keys,
                                                            session.sub_keys))

    def new_subscription(self, session, expression, accept_insecure, keys, ttl,
                         max_count) -> ProxySubscription:
        sub = ProxySubscription(next(self._ids), session, expression, accept_insecure,
                                keys, ttl, max_count)
        session.subscriptions[sub.id] = sub
        self.subscriptions[sub.id] = sub
        self.save(sub)
        return sub

    def save(self, sub: ProxySubscription) -> None:
        if sub.session.persistent:
            self.store.put_subscription(sub.session.name, sub.id, sub.expression,
                                        sub.accept_insecure, sub.ttl, sub.max_count,
                                        keys_to_bytes(KeyRing.EMPTY, sub.keys),
                                        now=self.clock())

    def announce(self, session: Session, event: Dict[str, Any], but=None) -> None:
        """Tell the session's connected clients (except ``but``) of a change."""
        for client in list(session.clients):
            if client is not but:
                client.send_event(event)


class ClientState(ClientSession):
    """A proxy client's state: the sessions it joined and its rights in
    them, how it receives (receipt, acknowledgements) and where its replay
    stands."""

    #: Packet class -> handler (elvin.proxy.core sets the proxy's).
    HANDLERS: ClassVar[Dict[type, Any]]

    def __init__(self, core: ProxyCore, output, peer=None):
        super().__init__(core, output, peer)
        self.core = core
        self.joined: List[Session] = []
        self.admin: set = set()
        self.destructive = True
        self.name = ""
        #: False while stored notifications are being replayed to it.
        self.live = True
        self.ttl: Optional[int] = None
        self.max_count: Optional[int] = None
        self._replay_waiting = False
        self._replay_call = None
        #: The last stored notification replayed (the replay's cursor).
        self._replayed_to = 0
        #: Packets received while ConnRqst's passwords are being checked.
        self._admitting: Optional[List[Any]] = None
        #: Packets received while a request waits for upstream's answer
        #: (elvin.proxy.requests): handled after it, so that replies keep
        #: the order of the requests, as a router's do.
        self._awaiting: Optional[List[Any]] = None
        #: An acknowledging client's window (Proxy.Ack-Window; 0: it does
        #: not acknowledge), how many notifications were written to it and
        #: acknowledged, how many live ones are on their way, and those
        #: written and not acknowledged: (count when written, stored id).
        self.ack_window = 0
        self._sent = 0
        self._acked = 0
        self._reserved = 0
        self._inflight: Deque[Tuple[int, Optional[int]]] = collections.deque()
        #: The stored ids of the live notifications on their way (reserved).
        self._reserved_notes: Deque[Optional[int]] = collections.deque()
        #: DropWarns owed, each before the first stored notification whose
        #: id is above it (sorted): gaps in what this client is being fed.
        self._gaps: List[int] = []
        #: Those of them the session's drop count does not have.
        self._uncounted_gaps: Set[int] = set()

    def address(self) -> Any:
        """The peer's host address without its port (``self.peer`` is log
        text, port included, and the port changes at every connect, so
        password failures are counted by this)."""
        transport = getattr(self.output, "transport", None)
        peer = transport.getPeer() if transport is not None else None
        host = getattr(peer, "host", None)
        return self.peer if host is None else host

    @property
    def primary(self) -> Session:
        return self.joined[0]
