"""The proxy's core, without I/O (the mobile-proxy paper, sections
4.2-4.7 and 5.1-5.2): ``ProxyCore`` and ``ProxyClient``, each assembled
from the parts the other modules hold.

The proxy is a client of one upstream router and a router to its own
clients. Every subscription a client makes is made upstream, once, on the
proxy's one upstream connection, with the client's (or its session's)
keys merged in; the upstream router matches and checks keys, and its
NotifyDeliver names the upstream subscriptions that matched. ``ProxyCore``
maps those back to the sessions and clients that own them, delivers one
copy to each connected client (however many of its sessions matched) and
stores one copy for the sessions that need it kept. Nothing here touches a
socket or the reactor: the upstream connection (``elvin.proxy.upstream``)
and the channels (``elvin.proxy.protocol``) call in, and a ``call_later``
is injected.

A *session* is a named, persistent group of subscriptions, keys and
passwords, joined by any number of clients at once. A client that names no
session gets an anonymous one, gone when it disconnects: plain router
behaviour. The wire-level description is in docs/proxy.md.

The parts, one job each:

* ``elvin.proxy.model``: sessions, subscriptions, the ``Proxy.*`` names;
* ``elvin.proxy.joining``: ConnRqst's options, passwords, admission;
* ``elvin.proxy.requests``: a joined client's requests;
* ``elvin.proxy.relay``: subscriptions and notifications upstream;
* ``elvin.proxy.delivery``: delivering, storing and replaying;
* this module: the state they share (sessions, channels, subscriptions
  and the store's copy of them), and the two classes put together.
  ``ProxyCore`` is the host of its clients' sessions (``SessionHost``),
  as the router is of its own; ``ProxyClient`` is the router's
  ``ClientSession`` state machine with the proxy's handlers.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from twisted.internet import defer
from twisted.logger import Logger

from elvin.core.host import SessionHost
from elvin.core.keys import SUPPORTED_KEY_SCHEMES, KeyRing
from elvin.core.options import OPTIONS, ConnectionOptions
from elvin.core.router import MAX_PROTOCOL_ERRORS, PROTOCOL_ERROR_WINDOW, ClientSession
from elvin.protocols import packets as P
from elvin.proxy.counters import ProxyCounters
from elvin.proxy.delivery import Keeping, Receiving
from elvin.proxy.guard import PasswordGate
from elvin.proxy.joining import Joining, PasswordChecks
from elvin.proxy.model import (ACK, ACK_WINDOW, ADMIN_PASSWORD, CLIENT, DELETE_SESSION,
                               DESTRUCTIVE, EVENT, MAX_COUNT, NON_DESTRUCTIVE, PASSWORD,
                               RECEIPT, SESSION, TTL, ProxySubscription, Session,
                               keys_to_bytes, ring_from_bytes)
from elvin.proxy.relay import UpstreamRelay
from elvin.proxy.requests import Requests
from elvin.proxy.store import Store

__all__ = ["ProxyCore", "ProxyClient", "Session", "ProxySubscription", "SESSION",
           "PASSWORD", "ADMIN_PASSWORD", "RECEIPT", "CLIENT", "TTL", "MAX_COUNT",
           "DELETE_SESSION", "EVENT", "DESTRUCTIVE", "NON_DESTRUCTIVE", "ACK", "ACK_WINDOW"]

class ProxyCore(PasswordChecks, UpstreamRelay, Keeping, SessionHost):
    """Sessions, subscriptions and clients of one proxy: to its clients'
    sessions, their host (``SessionHost``), as the router is to its own.

    ``upstream`` is what the proxy's upstream connection offers: ``is_up``,
    ``subscribe(expression, accept_insecure, keys) -> Deferred[id]``,
    ``modify(id, expression, accept_insecure, add_keys, del_keys) ->
    Deferred[id]``, ``unsubscribe(id)`` and ``notify(attributes,
    deliver_insecure, keys)``. It calls back ``upstream_up``,
    ``upstream_down`` and ``upstream_notification``.
    """

    log = Logger()

    def __init__(self, store: Store, upstream: Any, *, option_specs=None,
                 clock: Callable[[], float] = time.time, call_later=None,
                 max_connections: int = 10_000, max_sessions: int = 10_000,
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
        self.call_later = call_later
        self.max_connections = max_connections
        self.max_sessions = max_sessions
        self.max_session_subscriptions = max_session_subscriptions
        self.max_backlog = max_backlog
        self.page_size = page_size
        #: Most notifications an acknowledging client may have unacknowledged.
        self.max_inflight = max_inflight
        #: Seconds a session may go without a client before it is deleted.
        self.session_expiry = session_expiry
        #: Most expired rows one sweep step deletes (the rest in later turns).
        self.sweep_step = sweep_step
        #: The open channels (ElvinServerProtocol counts them).
        self.sessions: set = set()
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
        #: While the store cannot write (disk full): when to try again, and
        #: each session's notifications not stored meanwhile.
        self.store_down_until: Optional[float] = None
        self.unsaved_drops: Dict[str, int] = collections.Counter()
        self._sweeping = False
        #: What this turn's transaction stored (``keep`` of each), until it commits.
        self._turn: List[Dict[str, Any]] = []
        #: As the router's: Nacks by code and the latest refusals.
        self.nacks = collections.Counter()
        self.refusals = collections.deque(maxlen=50)
        self._client_numbers = itertools.count(1)
        self._holding = False
        self._held: List[tuple] = []
        self._load()
        self._ids = itertools.count(store.largest_subscription_id() + 1)

    def _load(self):
        """Every session in the store, as it was (a restart restores them)."""
        self.store.unseen_since(self.clock())
        for name in self.store.sessions():
            record = self.store.session(name)
            session = Session(name, record.join_hash, record.admin_hash,
                              ring_from_bytes(record.keys, "nfn"),
                              ring_from_bytes(record.keys, "sub"))
            keys = self.store.subscription_keys(name)
            for sub_id, expression, insecure, ttl, max_count in self.store.subscriptions(name):
                sub = ProxySubscription(sub_id, session, expression, insecure,
                                        ring_from_bytes(keys.get(sub_id), "sub"), ttl, max_count)
                session.subscriptions[sub_id] = sub
                self.subscriptions[sub_id] = sub
            self.named[name] = session

    # -- channels and sessions ------------------------------------------------

    def channel_count(self) -> int:
        return len(self.sessions)

    def open_session(self, output, peer=None) -> "ProxyClient":
        client = ProxyClient(self, output, peer)
        self.sessions.add(client)
        return client

    def new_options(self) -> ConnectionOptions:
        return ConnectionOptions(self.option_specs, SUPPORTED_KEY_SCHEMES)

    def client_name(self) -> str:
        return f"connection-{next(self._client_numbers)}"

    def session_closed(self, client: "ProxyClient") -> None:
        """A channel ended (ClientSession calls this by the router's name)."""
        self.sessions.discard(client)
        self.counters.client_queue_dropped += client.dropped
        left = []
        for session in client.joined:
            session.clients.discard(client)
            if not session.persistent:
                for sub in list(session.subscriptions.values()):
                    self.remove_subscription(sub)
            elif not session.clients and session.name in self.named:
                left.append(session.name)
        if left:
            self.write(self.store.seen, left, self.clock())

    def shutdown(self) -> None:
        self.closing = True
        for client in list(self.sessions):
            client.disconnect(1, "proxy is shutting down")

    def add_session(self, name, join_hash, admin_hash) -> Session:
        """A new session, kept (StoreFailed if the store cannot write)."""
        record = self.store.add_session(name, join_hash, admin_hash, self.clock())
        session = Session(name, record.join_hash, record.admin_hash)
        self.named[name] = session
        self.log.info("session {name!r} created", name=name)
        return session

    def delete_session(self, session: Session) -> None:
        for sub in list(session.subscriptions.values()):
            self.remove_subscription(sub)
        self.named.pop(session.name, None)
        self.store.delete_session(session.name)
        for client in list(session.clients):
            client.session_deleted(session)
        self.log.info("session {name!r} deleted", name=session.name)

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
                                        keys_to_bytes(KeyRing.EMPTY, sub.keys))

    def remove_subscription(self, sub: ProxySubscription) -> None:
        """Remove ``sub`` here, from the store and upstream."""
        sub.session.subscriptions.pop(sub.id, None)
        self.subscriptions.pop(sub.id, None)
        if sub.session.persistent and sub.session.name in self.named:
            self.store.remove_subscription(sub.session.name, sub.id)
        if sub.upstream_id is not None:
            self.by_upstream.pop(sub.upstream_id, None)
            self._unsubscribe(sub.upstream_id)
            sub.upstream_id = None

    def announce(self, session: Session, event: Dict[str, Any], but=None) -> None:
        """Tell the session's connected clients (except ``but``) of a change."""
        for client in list(session.clients):
            if client is not but:
                client.send_event(event)


class ProxyClient(Joining, Receiving, Requests, ClientSession):
    """One channel to the proxy: the router's client state machine
    (section 5.4: states, violations, Disconn, protocol-error accounting)
    with the proxy's handlers, for a client of sessions (docs/proxy.md)."""

    log = Logger()
    SERVER_NAME = "proxy"

    def __init__(self, core: ProxyCore, output, peer=None):
        super().__init__(core, output, peer)
        self.core = core
        self.joined: List[Session] = []
        self.admin: set = set()
        self.destructive = True
        self.name = ""
        #: False while stored notifications are being replayed to it.
        self.live = True
        self.ttl = None
        self.max_count = None
        self._replay_waiting = False
        self._replay_call = None
        #: The last stored notification replayed (the replay's cursor).
        self._replayed_to = 0
        #: Packets received while ConnRqst's passwords are being checked.
        self._admitting: Optional[List[Any]] = None
        #: An acknowledging client's window (Proxy.Ack-Window; 0: it does
        #: not acknowledge), how many notifications were written to it and
        #: acknowledged, how many live ones are on their way, and those
        #: written and not acknowledged: (count when written, stored id).
        self.ack_window = 0
        self._sent = 0
        self._acked = 0
        self._reserved = 0
        self._inflight: Deque[Tuple[int, Optional[int]]] = collections.deque()

    def __repr__(self):
        return f"<ProxyClient {self.peer} {self.name!r} state={self.state.name}>"

    @property
    def primary(self) -> Session:
        return self.joined[0]

    def notify_emit(self, attributes, deliver_insecure, wire_keys, size=None):
        self._emit(attributes, deliver_insecure, wire_keys, self._nfn_keys(), size)

    def packet_received(self, packet):
        if self._admitting is not None:
            self._admitting.append(packet)    # handled once admitted
            return
        super().packet_received(packet)

    def connection_lost(self, why="connection lost"):
        if self._replay_call is not None and self._replay_call.active():
            self._replay_call.cancel()
        super().connection_lost(why)

    def session_deleted(self, session):
        """Another client deleted a session this one had joined."""
        if session in self.joined:
            self.joined.remove(session)
            self.send_event({EVENT: "session-deleted", SESSION: session.name})
            if not self.joined:
                anonymous = Session()
                anonymous.clients.add(self)
                self.joined = [anonymous]
                self.admin.add(None)


_HANDLERS = {
    P.ConnRqst: None,
    P.UNotify: None,
    P.DisconnRqst: ClientSession._disconn_rqst,
    P.TestConn: ClientSession._test_conn,
    P.QosRqst: ProxyClient._qos_rqst,
    P.SecRqst: ProxyClient._sec_rqst,
    P.NotifyEmit: ProxyClient._notify_emit,
    P.SubAddRqst: ProxyClient._sub_add,
    P.SubModRqst: ProxyClient._sub_mod,
    P.SubDelRqst: ProxyClient._sub_del,
    P.QnchAddRqst: ProxyClient._quench,
    P.QnchModRqst: ProxyClient._quench,
    P.QnchDelRqst: ProxyClient._quench,
}
ProxyClient.HANDLERS = _HANDLERS
