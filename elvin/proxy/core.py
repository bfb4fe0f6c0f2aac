"""The proxy's sessions, clients and routing, without I/O (the mobile-proxy
paper, sections 4.2-4.7 and 5.1-5.2).

The proxy is a client of one upstream router and a router to its own
clients. Every subscription a client makes is made upstream, once, on the
proxy's one upstream connection, with the client's (or its session's)
keys merged in; the upstream router matches and checks keys, and its
NotifyDeliver names the upstream subscriptions that matched. ``ProxyCore``
maps those back to the sessions and clients that own them
(``upstream_notification``), delivers one copy to each connected client
(however many of its sessions matched) and stores one copy for the
sessions that need it kept. Nothing here touches a socket or the reactor:
the upstream connection (``elvin.proxy.upstream``) and the channels
(``elvin.proxy.protocol``) call in, and a ``call_later`` is injected.

A *session* is a named, persistent group of subscriptions, keys and
passwords, joined by any number of clients at once. A client that names no
session gets an anonymous one, gone when it disconnects: plain router
behaviour. The wire-level description is in docs/proxy.md.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from twisted.internet import defer
from twisted.logger import Logger

from elvin import errors
from elvin.client.state import ConnectionClosed, NackError
from elvin.core.keys import CONSUMER, PRODUCER, SUPPORTED_KEY_SCHEMES, KeyRing
from elvin.core.host import SessionHost
from elvin.core.options import OPTIONS, ConnectionOptions
from elvin.core.router import (MAX_PROTOCOL_ERRORS, PROTOCOL_ERROR_WINDOW, PROTOCOL_MAJOR,
                               ClientSession, compile_expression,
                               notification_problem, subscription_nack_args)
from elvin.errors import ElvinError, SubscriptionError
from elvin.protocols import packets as P
from elvin.protocols.xdr import Writer
from elvin.proxy.counters import ProxyCounters
from elvin.proxy.guard import Busy, PasswordGate
from elvin.proxy.store import Store, StoreFailed, check_password, hash_password
from elvin.values import Int64

__all__ = ["ProxyCore", "ProxyClient", "Session", "ProxySubscription", "SESSION",
           "PASSWORD", "ADMIN_PASSWORD", "RECEIPT", "CLIENT", "TTL", "MAX_COUNT",
           "DELETE_SESSION", "EVENT", "DESTRUCTIVE", "NON_DESTRUCTIVE", "ACK", "ACK_WINDOW"]

# ConnRqst / QosRqst options of the proxy's extension (docs/proxy.md).
SESSION = "Proxy.Session"
PASSWORD = "Proxy.Password"
ADMIN_PASSWORD = "Proxy.Admin-Password"
RECEIPT = "Proxy.Receipt"
CLIENT = "Proxy.Client"
TTL = "Proxy.TTL"
MAX_COUNT = "Proxy.Max-Count"
DELETE_SESSION = "Proxy.Delete-Session"
#: ConnRqst: this client acknowledges; at most this many unacknowledged.
ACK_WINDOW = "Proxy.Ack-Window"
#: QosRqst: how many notifications the client's application has handled
#: since ConnRply (cumulative).
ACK = "Proxy.Ack"
#: The attribute naming a session event (a NotifyDeliver matching nothing).
EVENT = "Proxy.Event"
DESTRUCTIVE = "destructive"
NON_DESTRUCTIVE = "non-destructive"
#: Most sessions one connection may join.
MAX_JOINED = 16

def keys_to_bytes(nfn: KeyRing, sub: KeyRing) -> Optional[bytes]:
    """A session's raw keys as stored (JSON: scheme -> key sets, in hex)."""
    if not nfn and not sub:
        return None

    def entries(ring):
        return [[scheme, [[k.hex() for k in ks] for ks in sets]]
                for scheme, sets in ring.to_wire().entries()]
    return json.dumps({"nfn": entries(nfn), "sub": entries(sub)}).encode()


def ring_from_bytes(data: Optional[bytes], part: str) -> KeyRing:
    if not data:
        return KeyRing.EMPTY
    entries = json.loads(data)[part]
    return KeyRing.from_prepared_wire(P.Keys(
        [(scheme, [[bytes.fromhex(k) for k in ks] for ks in sets]) for scheme, sets in entries]))


def _keys_bytes(ring: KeyRing) -> bytes:
    """Raw keys as the protocol encodes a Keys (an opaque attribute)."""
    writer = Writer()
    P.KEYS.write(writer, ring.to_wire())
    return writer.getvalue()


def raw_ring(wire_keys: P.Keys) -> KeyRing:
    """Keys as a client sent them, unprepared (``from_wire`` checked them)."""
    return KeyRing.from_prepared_wire(wire_keys) if wire_keys else KeyRing.EMPTY


class ProxySubscription:
    """One subscription of a session, and the upstream subscription that
    stands for it (``upstream_id``; None while upstream is down or has not
    answered)."""

    __slots__ = ("id", "session", "expression", "accept_insecure", "keys", "ttl",
                 "max_count", "upstream_id", "in_flight")

    def __init__(self, sub_id, session, expression, accept_insecure, keys=KeyRing.EMPTY,
                 ttl=None, max_count=None):
        self.id = sub_id
        self.session = session
        self.expression = expression
        self.accept_insecure = accept_insecure
        self.keys = keys
        self.ttl = ttl
        self.max_count = max_count
        self.upstream_id = None
        self.in_flight = False

    def upstream_keys(self) -> KeyRing:
        return self.keys.union(self.session.sub_keys)

    def event(self) -> Dict[str, Any]:
        """The "subscription" event telling clients of its session about it."""
        return {EVENT: "subscription", SESSION: self.session.name,
                "Proxy.Subscription": Int64(self.id), "Proxy.Expression": self.expression,
                "Proxy.Accept-Insecure": int(self.accept_insecure),
                TTL: int(self.ttl or 0), MAX_COUNT: int(self.max_count or 0)}

    def __repr__(self):
        return f"<ProxySubscription {self.id} of {self.session.name!r}: {self.expression!r}>"


class Session:
    """A session: named and kept in the store, or anonymous (``name`` None)
    for one plain client and gone with it."""

    def __init__(self, name=None, join_hash=None, admin_hash=None, nfn_keys=KeyRing.EMPTY,
                 sub_keys=KeyRing.EMPTY):
        self.name = name
        self.join_hash = join_hash
        self.admin_hash = admin_hash
        self.nfn_keys = nfn_keys
        self.sub_keys = sub_keys
        self.subscriptions: Dict[int, ProxySubscription] = {}
        self.clients: set = set()

    @property
    def persistent(self) -> bool:
        return self.name is not None

    def keys_event(self) -> Optional[Dict[str, Any]]:
        """The "keys" event: the session's keys and its subscriptions' own,
        each encoded as the protocol's Keys (None: it has none)."""
        event: Dict[str, Any] = {}
        for attribute, ring in (("Proxy.Notification-Keys", self.nfn_keys),
                                ("Proxy.Subscription-Keys", self.sub_keys)):
            if ring:
                event[attribute] = _keys_bytes(ring)
        for sub in self.subscriptions.values():
            if sub.keys:
                event[f"Proxy.Subscription-Keys.{sub.id}"] = _keys_bytes(sub.keys)
        if not event:
            return None
        return {EVENT: "keys", SESSION: self.name, **event}

    def __repr__(self):
        return f"<Session {self.name!r}: {len(self.subscriptions)} subscriptions>"


class ProxyCore(SessionHost):
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

    # -- channels -------------------------------------------------------------

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

    # -- the store's failures ------------------------------------------------------

    def write(self, method, *args):
        """``method(*args)`` on the store; a write the disk cannot take is
        logged (once while it lasts) and None returned: what it would have
        removed stays (delivered again later), what it would have kept is
        counted as dropped by the caller."""
        try:
            return method(*args)
        except StoreFailed as e:
            self.store_failed(e)
            return None

    def store_failed(self, error) -> None:
        self.counters.store_failed += 1
        if self.store_down_until is None:
            self.log.error("proxy database {db}: cannot write ({why}); notifications for "
                           "sessions without a client are not being kept (each is counted "
                           "as dropped, and the session's next client told by DropWarn) "
                           "until space is freed; joins and replays go on",
                           db=self.store.path, why=error)
        self.store_down_until = self.clock() + 1.0
        if self._holding:
            self._abandon_turn()

    def _store_up(self) -> bool:
        """May the store be written to (not in the second after a failure)?"""
        if self.store_down_until is None:
            return True
        if self.clock() < self.store_down_until:
            return False
        drops, self.unsaved_drops = self.unsaved_drops, collections.Counter()
        try:
            for name, count in drops.items():
                if name in self.named:
                    self.store.add_dropped(name, count)
        except StoreFailed as e:
            self.unsaved_drops.update(drops)
            self.store_failed(e)
            return False
        self.store_down_until = None
        self.log.info("proxy database {db}: writing again", db=self.store.path)
        return True

    def take_dropped(self, name: str) -> int:
        """Drops to tell the session's next client of (and forget)."""
        unsaved = self.unsaved_drops.pop(name, 0)
        try:
            return self.store.take_dropped(name) + unsaved
        except StoreFailed as e:
            self.store_failed(e)
            row = self.store.session(name)
            return (row.dropped if row else 0) + unsaved

    def shutdown(self) -> None:
        self.closing = True
        for client in list(self.sessions):
            client.disconnect(1, "proxy is shutting down")

    # -- sessions -------------------------------------------------------------

    def check_passwords(self, wanted, peer=None):
        """Deferred ``[(name, rights, hashes)]`` for ConnRqst's ``[(name,
        password, admin password)]``: an existing session's rights (None:
        refused, False: join, True: change), or for a new one "new" and the
        hashes of its passwords. Every scrypt goes through ``gate`` (bounded,
        clean addresses first, failures throttled), one at a time, and the
        checks stop at the first refusal. Fails with Busy when the gate's
        queue is full."""
        return defer.ensureDeferred(self._check_passwords(wanted, peer))

    async def _check_passwords(self, wanted, peer):
        gate = self.gate
        checked: List[Tuple[str, Any, Any]] = []
        for name, password, admin_password in wanted:
            session = self.named.get(name)
            if session is None:
                hashes = []
                for given in (password, admin_password):
                    hashes.append(None if given is None else await gate.submit(
                        peer, functools.partial(hash_password, given)))
                checked.append((name, "new", tuple(hashes)))
                continue
            if not _needs_check(session, password, admin_password):
                rights = _rights(session, password, admin_password)
            elif gate.refuses(peer, name):
                rights = None
            else:
                rights = await gate.submit(
                    peer, functools.partial(_rights, session, password, admin_password))
            if rights is None:
                if _needs_check(session, password, admin_password):
                    gate.failed(peer, name)
                checked.append((name, None, None))
                break
            checked.append((name, rights, None))
        return checked

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

    # -- upstream -------------------------------------------------------------

    def subscribe_upstream(self, sub: ProxySubscription):
        """Make ``sub`` upstream; returns the Deferred of the request, or None
        when upstream is down (it is made when upstream comes back)."""
        if not self.upstream.is_up or sub.in_flight:
            return None
        sub.in_flight = True
        d = self.upstream.subscribe(sub.expression, sub.accept_insecure,
                                    sub.upstream_keys().to_wire())

        def added(upstream_id):
            sub.in_flight = False
            if self.subscriptions.get(sub.id) is not sub:
                self._unsubscribe(upstream_id)      # removed while we waited
                return upstream_id
            sub.upstream_id = upstream_id
            self.by_upstream[upstream_id] = sub
            return upstream_id

        def failed(failure):
            sub.in_flight = False
            if failure.check(NackError):
                self.log.warn("upstream refused subscription {id} of {session!r} "
                              "({expr!r}): {why}", id=sub.id, session=sub.session.name,
                              expr=sub.expression, why=failure.value)
            return failure
        return d.addCallbacks(added, failed)

    def modify_upstream(self, sub, expression, accept_insecure, keys: KeyRing):
        """Change ``sub`` upstream to these; Deferred, or None when it is not
        there (the new state is made when upstream comes back)."""
        if sub.upstream_id is None or not self.upstream.is_up:
            return None
        old = sub.upstream_keys()
        new = keys.union(sub.session.sub_keys)
        d = self.upstream.modify(sub.upstream_id, expression, accept_insecure,
                                 new.difference(old).to_wire(), old.difference(new).to_wire())
        previous = sub.upstream_id

        def modified(upstream_id):
            if upstream_id != previous and self.by_upstream.get(previous) is sub:
                del self.by_upstream[previous]
                sub.upstream_id = upstream_id
                self.by_upstream[upstream_id] = sub
            return upstream_id
        return d.addCallback(modified)

    def session_keys_changed(self, session, old_sub_keys: KeyRing) -> None:
        """The session's subscription keys changed: change them upstream."""
        for sub in session.subscriptions.values():
            if sub.upstream_id is None or not self.upstream.is_up:
                continue
            old = sub.keys.union(old_sub_keys)
            new = sub.upstream_keys()
            d = self.upstream.modify(sub.upstream_id, sub.expression, sub.accept_insecure,
                                     new.difference(old).to_wire(),
                                     old.difference(new).to_wire())
            d.addErrback(self._upstream_failed, "changing the keys of", sub)

    def _unsubscribe(self, upstream_id):
        if self.upstream.is_up:
            d = self.upstream.unsubscribe(upstream_id)
            if d is not None:
                d.addErrback(lambda f: None)   # gone with the connection: fine

    def _upstream_failed(self, failure, what, sub):
        if not failure.check(ConnectionClosed):
            self.log.warn("upstream failed {what} subscription {id}: {why}", what=what,
                          id=sub.id, why=failure.value)

    def upstream_up(self) -> None:
        """A new upstream connection: make every subscription there again
        and send what clients emitted while it was down."""
        self.log.info("upstream connected: subscribing {n} subscriptions",
                      n=len(self.subscriptions))
        for sub in list(self.subscriptions.values()):
            if sub.upstream_id is None:
                d = self.subscribe_upstream(sub)
                if d is not None:
                    d.addErrback(lambda f: None)   # logged in subscribe_upstream
        backlog, self.backlog = self.backlog, []
        for attributes, deliver_insecure, keys in backlog:
            self.upstream.notify(attributes, deliver_insecure, keys)

    def upstream_down(self) -> None:
        """The upstream connection is gone: its subscription ids with it."""
        self.log.warn("upstream connection lost; sessions are kept, and "
                      "re-subscribed when it returns")
        self.by_upstream.clear()
        for sub in self.subscriptions.values():
            sub.upstream_id = None
            sub.in_flight = False

    def forward(self, attributes, deliver_insecure, keys: P.Keys) -> None:
        """A client's notification, to upstream (or kept until it is back)."""
        if self.upstream.is_up:
            self.upstream.notify(attributes, deliver_insecure, keys)
            self.counters.forwarded += 1
            return
        if len(self.backlog) >= self.max_backlog:
            self.backlog.pop(0)
            self.counters.backlog_dropped += 1
            if self.counters.backlog_dropped % 1000 == 1:
                self.log.warn("upstream down: dropped the oldest of {n} waiting "
                              "notifications (max-backlog)", n=len(self.backlog))
        self.backlog.append((attributes, deliver_insecure, keys))

    def upstream_dropwarn(self) -> None:
        """Upstream dropped notifications meant for the proxy (its send queue
        to us overflowed): which, and for whom, nobody knows. Every session
        with subscriptions is told: its connected clients by a DropWarn now,
        and a session without any by one drop more in ``Proxy.Dropped`` and a
        DropWarn to its next client."""
        self.counters.upstream_dropwarns += 1
        told = set()
        unseen = []
        for session in self.named.values():
            if not session.subscriptions:
                continue
            if session.clients:
                told.update(session.clients)
            else:
                unseen.append(session.name)
        for client in list(self.sessions):
            if client in told or (client.joined and not client.primary.persistent
                                  and client.primary.subscriptions):
                client.drop_warn()
        for name in unseen:
            if self.store_down_until is None:
                try:
                    self.store.add_dropped(name, 1)
                    continue
                except StoreFailed as e:
                    self.store_failed(e)
            self.unsaved_drops[name] += 1
        self.log.warn("upstream router dropped notifications for the proxy (DropWarn: its "
                      "send queue to the proxy overflowed); told {clients} clients, and "
                      "{sessions} sessions' next clients", clients=len(told),
                      sessions=len(unseen))

    def upstream_notification(self, attributes, secure_ids, insecure_ids) -> None:
        """A NotifyDeliver from upstream: deliver one copy to each connected
        client, and store one copy for the sessions that must keep it
        (section 5.1.2)."""
        matched: Dict[Session, Dict[int, bool]] = {}
        by_upstream = self.by_upstream
        for ids, secure in ((secure_ids, True), (insecure_ids, False)):
            for upstream_id in ids:
                sub = by_upstream.get(upstream_id)
                if sub is not None:
                    matched.setdefault(sub.session, {}).setdefault(sub.id, secure)
        if not matched:
            return
        deliveries: Dict[ProxyClient, tuple] = {}
        keep: Dict[str, Dict[int, bool]] = {}
        marks = []
        for session, subs in matched.items():
            live = [c for c in session.clients if c.live]
            if session.persistent and (len(live) < len(session.clients) or not any(
                    c.destructive and not c.ack_window for c in live)):
                # Nobody has consumed it by having it written: keep it for
                # the others, and for acknowledging clients until they
                # acknowledge it (and remember who had it, so nobody gets
                # it twice).
                keep[session.name] = subs
                marks.extend((session.name, c.name) for c in live if not c.ack_window)
            for client in live:
                secure, insecure = deliveries.setdefault(client, ([], []))
                for sub_id, is_secure in subs.items():
                    (secure if is_secure else insecure).append(sub_id)
        body = P.encode_attributes(attributes)
        note = None
        if keep:
            note = self._keep(body, keep, marks)
        for client, (secure, insecure) in deliveries.items():
            data = P.encode_notify_deliver_from(body, secure, insecure)
            client.reserve()
            if self._holding or self._held:
                # Delivered once this turn's transaction has committed: no
                # client has a notification the store could still lose.
                self._held.append((client, data, note))
            else:
                client.deliver(data, note)
        self.counters.delivered += len(deliveries)

    def _keep(self, body, keep, marks):
        """Store one copy for the sessions in ``keep``; its id, or None if it
        could not be stored (then counted as dropped by those sessions)."""
        if not self._store_up():
            self._not_kept(keep)
            return None
        store = self.store
        try:
            if not self._holding and self.call_later is not None:
                # One commit for everything stored in this reactor turn.
                store.hold()
                self._holding = True
                self._turn = []
                self.call_later(0, self._release)
            with store.batch():
                note = store.store(body, keep, self.clock())
                if note is not None:
                    for name, client_name in marks:
                        store.acknowledge(name, client_name, [note], destructive=False)
        except StoreFailed as e:
            self.store_failed(e)
            self._not_kept(keep)
            return None
        if note is not None:
            self.counters.stored += 1
            if self._holding:
                self._turn.append(keep)
        return note

    def _not_kept(self, keep) -> None:
        self.counters.not_stored += 1
        for name in keep:
            self.unsaved_drops[name] += 1

    def _abandon_turn(self) -> None:
        """The turn's transaction failed: what it stored is gone (counted as
        dropped), and its live deliveries go out as not stored."""
        self.store.abandon()
        self._holding = False
        for earlier in self._turn:
            self._not_kept(earlier)
        self._turn = []
        self._held = [(client, data, None) for client, data, _ in self._held]

    def _release(self) -> None:
        if self._holding:
            try:
                self.store.release()
            except StoreFailed as e:
                self.store_failed(e)          # abandons the turn
            self._holding = False
            self._turn = []
        held, self._held = self._held, []
        for client, data, note in held:
            client.deliver(data, note)

    def sweep(self) -> int:
        """The paper's periodic sweep: expired notifications deleted in
        steps of ``sweep_step`` rows, one step per reactor turn (never a
        long stall), then sessions idle for ``session_expiry``."""
        if self._sweeping:
            return 0
        self._sweeping = True
        return self._sweep_step()

    def _sweep_step(self) -> int:
        try:
            gone, more = self.store.sweep(self.clock(), self.sweep_step)
        except StoreFailed as e:
            self.store_failed(e)
            gone, more = 0, False
        if more and self.call_later is not None:
            self.call_later(0, self._sweep_step)
            return gone
        self._sweeping = False
        self.expire_sessions()
        return gone

    def expire_sessions(self) -> int:
        """Delete sessions that have had no client for ``session_expiry``
        seconds (at most 100 a call); their upstream subscriptions go."""
        if not self.session_expiry:
            return 0
        expired = 0
        for name in self.store.idle_sessions(self.clock() - self.session_expiry):
            session = self.named.get(name)
            if session is None or session.clients:
                continue
            self.log.info("session {name!r} expired: no client for {s:g} s (session-expiry)",
                          name=name, s=self.session_expiry)
            self.write(self.delete_session, session)
            if self.store_down_until is not None:
                break
            expired += 1
        self.counters.sessions_expired += expired
        return expired


class ProxyClient(ClientSession):
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

    def resumed(self):
        """The channel drained: go on replaying, if that was waiting."""
        if self._replay_waiting:
            self._replay_waiting = False
            self._schedule_replay()

    def reserve(self):
        """A live notification is on its way to this client (held until the
        turn commits, or written at once): an acknowledging client whose
        window it fills stops being live, so what follows is kept for it
        and replayed as it acknowledges."""
        if self.ack_window:
            self._reserved += 1
            if self._sent + self._reserved - self._acked >= self.ack_window:
                self.live = False

    def deliver(self, data, note=None):
        """Write a live notification (``note``: its stored id, if stored)."""
        if self.ack_window:
            self._reserved = max(0, self._reserved - 1)
        if self.state == self.CONNECTED:
            # Never droppable for an acknowledging client: its count of
            # what it handled must match what was written (a full queue
            # disconnects it instead, and its next join replays).
            self.output.send_encoded(data, not self.ack_window)
            if self.ack_window:
                self._sent_one(note)

    def _sent_one(self, note):
        self._sent += 1
        self._inflight.append((self._sent, note))
        if note is not None and note > self._replayed_to:
            self._replayed_to = note

    def drop_warn(self):
        """Tell the client notifications were lost (DropWarn)."""
        if self.state == self.CONNECTED:
            self.output.send(P.DropWarn())

    def acknowledged(self, count):
        """The client's application has handled ``count`` notifications
        since ConnRply: what they were is no longer owed (destructive
        receipt) or not to be sent to this client again (non-destructive)."""
        notes = []
        inflight = self._inflight
        while inflight and inflight[0][0] <= count:
            note = inflight.popleft()[1]
            if note is not None:
                notes.append(note)
        self._acked = max(self._acked, count)
        names = [s.name for s in self.joined if s.persistent]
        if notes and names:
            core = self.core
            try:
                core.store.acknowledge_many(names, self.name, notes, self.destructive)
                core.counters.acknowledged += len(notes)
            except StoreFailed as e:
                core.store_failed(e)      # still kept: sent again at the next join
        self._kick()

    def _kick(self):
        """Go on replaying, if the client is not live and nothing else will."""
        if self.live or self.state != self.CONNECTED or self._replay_waiting:
            return
        if self._replay_call is not None and self._replay_call.active():
            return
        self._schedule_replay()

    def send_event(self, attributes):
        if self.state == self.CONNECTED:
            self.output.send(P.NotifyDeliver(attributes, (), ()))

    # -- connecting --------------------------------------------------------------

    def _connect(self, packet):
        if not self._admissible(packet):
            return
        core = self.core
        xid = packet.xid
        standard, proxy = _split_options(packet.options)
        for wire, role in ((packet.nfn_keys, PRODUCER), (packet.sub_keys, CONSUMER)):
            if not self._valid_keys(xid, wire, role):
                return
        try:
            wanted = _sessions_asked(proxy)
        except ValueError as e:
            self.nack(xid, errors.PROT_ERROR, str(e))
            return
        receipt = proxy.get(RECEIPT, DESTRUCTIVE)
        if receipt not in (DESTRUCTIVE, NON_DESTRUCTIVE):
            self.nack(xid, errors.PROT_ERROR,
                      f"{RECEIPT} must be {DESTRUCTIVE!r} or {NON_DESTRUCTIVE!r}, "
                      f"not {receipt!r}")
            return
        client = proxy.get(CLIENT)
        if client is not None and (not isinstance(client, str) or not client):
            self.nack(xid, errors.PROT_ERROR, f"{CLIENT} must be a non-empty string")
            return
        if receipt == NON_DESTRUCTIVE and wanted and client is None:
            self.nack(xid, errors.PROT_ERROR,
                      f"non-destructive receipt needs {CLIENT} (a name for this device, "
                      "the same at every connection), so that it never gets a "
                      "notification twice")
            return
        window = proxy.get(ACK_WINDOW, 0)
        if not isinstance(window, int) or window < 0:
            self.nack(xid, errors.PROT_ERROR, f"{ACK_WINDOW} must be a non-negative integer")
            return
        limits = {ACK_WINDOW: min(window, core.max_inflight)}
        for option in (TTL, MAX_COUNT):
            if option in proxy:
                value = proxy[option]
                if not isinstance(value, int) or value < 0:
                    self.nack(xid, errors.PROT_ERROR,
                              f"{option} must be a non-negative integer")
                    return
                limits[option] = value or None
        # Passwords are checked (scrypt: about 40 ms each) off the reactor
        # thread; what the client sends meanwhile waits (_admitting).
        self._admitting = []
        d = core.check_passwords(wanted, self.peer)
        d.addCallback(self._admit, wanted, packet, standard, receipt, client, limits)
        d.addErrback(self._admission_failed, xid)

    def _admission_failed(self, failure, xid):
        waiting, self._admitting = self._admitting, None
        if self.state != self.NEW:
            return
        if failure.check(Busy):
            self.nack(xid, errors.IMPL_LIMIT, "the proxy is busy checking passwords; "
                                              "try again shortly")
            return
        if failure.check(StoreFailed):
            self.core.store_failed(failure.value)
            self.nack(xid, errors.IMPL_LIMIT, "the proxy cannot create a session now "
                                              "(its database cannot be written)")
            return
        self.log.failure("admitting {peer} failed", failure, peer=self.peer)
        self.violation("the proxy could not admit the client")

    def _admit(self, checked, wanted, packet, standard, receipt, client, limits):
        """The passwords are checked: join the sessions (or refuse), then
        handle what the client sent meanwhile."""
        waiting, self._admitting = self._admitting, None
        if self.state != self.NEW:
            return                        # gone while we checked
        core, xid = self.core, packet.xid
        sessions, admin = [], set()
        for (name, password, admin_password), (_, rights, hashes) in zip(wanted, checked):
            session = core.named.get(name)
            if session is None:
                if len(core.named) >= core.max_sessions:
                    self.nack(xid, errors.IMPL_LIMIT,
                              f"the proxy holds its maximum number of sessions "
                              f"({core.max_sessions})")
                    return
                session = core.add_session(name, *hashes)
                rights = True
            elif rights == "new":         # made by another client meanwhile
                rights = _rights(session, password, admin_password)
            if rights is None:
                self.log.info("refused {peer}: wrong password for session {name!r}",
                              peer=self.peer, name=name)
                self.nack(xid, errors.AUTHZ_FAIL, "authorisation failed")
                return
            if rights:
                admin.add(name)
            sessions.append(session)
        if not sessions:
            sessions.append(Session())
            admin.add(None)
        nfn_keys, sub_keys = raw_ring(packet.nfn_keys), raw_ring(packet.sub_keys)
        primary = sessions[0]
        if (nfn_keys or sub_keys) and primary.name not in admin:
            self.nack(xid, errors.AUTHZ_FAIL,
                      "only the session's administrative password may change its keys")
            return
        reply = self.options.negotiate(standard)
        self.output.configure(self.options)
        if nfn_keys or sub_keys:
            old = primary.sub_keys
            primary.nfn_keys = primary.nfn_keys.union(nfn_keys)
            primary.sub_keys = primary.sub_keys.union(sub_keys)
            core.save_keys(primary)
            if sub_keys:
                core.session_keys_changed(primary, old)
        self.joined, self.admin = sessions, admin
        self.destructive = receipt == DESTRUCTIVE
        self.name = client or core.client_name()
        self.ttl, self.max_count = limits.get(TTL), limits.get(MAX_COUNT)
        self.ack_window = limits[ACK_WINDOW]
        for session in sessions:
            session.clients.add(self)
        self.state = self.CONNECTED
        self._announced = True
        if primary.persistent:
            reply.update({RECEIPT: receipt, CLIENT: self.name})
            if self.ack_window:
                reply[ACK_WINDOW] = self.ack_window
            core.write(core.store.seen, [s.name for s in sessions], core.clock())
            self.log.info("client {name!r} at {peer} joined {sessions}", name=self.name,
                          peer=self.peer, sessions=[s.name for s in sessions])
        else:
            self.log.info("client connected from {peer}", peer=self.peer)
        self.send(P.ConnRply(xid, reply))
        if primary.persistent:
            self._joined()
        for waiting_packet in waiting:
            self.packet_received(waiting_packet)

    def _joined(self):
        """Tell the client its sessions (4.5), their keys if it may change
        them (5.2.3), what it missed, and replay."""
        core = self.core
        store = core.store
        dropped = 0
        for session in self.joined:
            for sub in sorted(session.subscriptions.values(), key=lambda s: s.id):
                self.send_event(sub.event())
            if session.name in self.admin:
                keys = session.keys_event()
                if keys is not None:
                    self.send_event(keys)
            lost = core.take_dropped(session.name)
            dropped += lost
            self.send_event({EVENT: "joined", SESSION: session.name,
                             "Proxy.Subscriptions": len(session.subscriptions),
                             "Proxy.Stored": store.stored_count(session.name),
                             "Proxy.Dropped": lost,
                             "Proxy.Admin": int(session.name in self.admin)})
        if dropped:
            self.send(P.DropWarn())
        self.live = False
        self._replay()

    def _schedule_replay(self):
        call_later = self.core.call_later
        if call_later is None:
            self._replay()
        else:
            self._replay_call = call_later(0, self._replay)

    def _replay(self):
        """Send a page of what the sessions stored, in arrival order; the
        client goes live when nothing is left (new arrivals meanwhile are
        stored, so they follow in order). An acknowledging client is sent
        no more than its window allows unacknowledged; others have each page
        counted as received as it is written."""
        self._replay_call = None
        if self.state != self.CONNECTED:
            return
        if not self.output.is_idle():
            self._replay_waiting = True
            return
        core = self.core
        limit = core.page_size
        if self.ack_window:
            limit = min(limit, self.ack_window - (self._sent + self._reserved - self._acked))
            if limit <= 0:
                return                    # acknowledgements go on (_kick)
        names = [s.name for s in self.joined if s.persistent]
        page = core.store.pending_many(names, self.name, core.clock(), limit,
                                       self._replayed_to)
        if not page:
            self.live = True
            return
        encode = P.encode_notify_deliver_from
        send = self.output.send_encoded
        if self.ack_window:
            for note in page:
                send(encode(note.body, note.secure, note.insecure), False)
                self._sent_one(note.id)
        else:
            for note in page:
                send(encode(note.body, note.secure, note.insecure), False)
            self._replayed_to = page[-1].id
            core.write(core.store.acknowledge_many, names, self.name,
                       [note.id for note in page], self.destructive)
        core.counters.replayed += len(page)
        if self.state == self.CONNECTED:
            self._schedule_replay()

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

    # -- requests ---------------------------------------------------------------

    def _valid_keys(self, xid, wire, role):
        if not wire:
            return True
        if wire.key_count() > self.options["Connection.Max-Keys"]:
            self.protocol_error(xid, errors.QOS_LIMIT, "more keys than Connection.Max-Keys",
                      ("Connection.Max-Keys",))
            return False
        try:
            KeyRing.from_wire(wire, role)
        except ElvinError as e:
            self.protocol_error(xid, e.code, str(e), e.nack_args)
            return False
        return True

    def _may_change(self, xid, session) -> bool:
        if session.name in self.admin:
            return True
        self.protocol_error(xid, errors.AUTHZ_FAIL,
                  "changing the session needs its administrative password")
        return False

    def _own(self, xid, sub_id) -> Optional[ProxySubscription]:
        sub = self.core.subscriptions.get(sub_id)
        if sub is None or sub.session not in self.joined:
            self.protocol_error(xid, errors.NO_SUCH_SUB, f"no such subscription: {sub_id}",
                      (Int64(sub_id if sub_id < (1 << 63) else sub_id - (1 << 64)),))
            return None
        return sub

    def _compiles(self, xid, expression) -> bool:
        max_length = self.options["Subscription.Max-Length"]
        if len(expression.encode("utf-8")) > max_length:
            self.protocol_error(xid, errors.QOS_LIMIT, f"subscription longer than "
                      f"Subscription.Max-Length ({max_length} bytes)",
                      ("Subscription.Max-Length",))
            return False
        try:
            compile_expression(expression)
        except SubscriptionError as e:
            self.protocol_error(xid, e.code, str(e), subscription_nack_args(e))
            return False
        return True

    def _relay_nack(self, failure, xid):
        """An upstream refusal, to the client (same code, message, args)."""
        error = failure.value
        self.protocol_error(xid, error.code, error.router_message or str(error), error.nack_args)

    def _sub_add(self, packet):
        xid = packet.xid
        session = self.primary
        if not self._may_change(xid, session):
            return
        limit = (self.core.max_session_subscriptions if session.persistent
                 else self.options["Subscription.Max-Count"])
        if len(session.subscriptions) >= limit:
            self.protocol_error(xid, errors.IMPL_LIMIT if session.persistent else errors.QOS_LIMIT,
                      f"the session already has {limit} subscriptions, its maximum",
                      () if session.persistent else ("Subscription.Max-Count",))
            return
        if not self._valid_keys(xid, packet.keys, CONSUMER):
            return
        if not self._compiles(xid, packet.expression):
            return
        core = self.core
        sub = core.new_subscription(session, packet.expression, packet.accept_insecure,
                                    raw_ring(packet.keys), self.ttl, self.max_count)
        d = core.subscribe_upstream(sub)

        def added(_=None):
            self.send(P.SubRply(xid, sub.id))
            core.announce(session, sub.event(), but=self)

        if d is None:
            added()
            return

        def failed(failure):
            if failure.check(NackError):
                core.remove_subscription(sub)
                self._relay_nack(failure, xid)
            else:
                added()       # upstream went away: made again when it is back
        d.addCallbacks(added, failed)

    def _sub_mod(self, packet):
        xid = packet.xid
        sub = self._own(xid, packet.subscription_id)
        if sub is None or not self._may_change(xid, sub.session):
            return
        for wire in (packet.add_keys, packet.del_keys):
            if not self._valid_keys(xid, wire, CONSUMER):
                return
        expression = packet.expression or sub.expression
        if packet.expression and not self._compiles(xid, packet.expression):
            return
        keys = sub.keys.union(raw_ring(packet.add_keys)).difference(
            raw_ring(packet.del_keys))
        core = self.core

        def apply(_=None):
            sub.expression, sub.accept_insecure, sub.keys = (
                expression, packet.accept_insecure, keys)
            core.save(sub)
            if sub.upstream_id is None and sub.id in core.subscriptions:
                d = core.subscribe_upstream(sub)
                if d is not None:
                    d.addErrback(lambda f: None)
            self.send(P.SubRply(xid, sub.id))
            core.announce(sub.session, sub.event(), but=self)

        d = core.modify_upstream(sub, expression, packet.accept_insecure, keys)
        if d is None:
            apply()
            return

        def failed(failure):
            if failure.check(NackError):
                self._relay_nack(failure, xid)
            else:
                apply()
        d.addCallbacks(apply, failed)

    def _sub_del(self, packet):
        xid = packet.xid
        sub = self._own(xid, packet.subscription_id)
        if sub is None or not self._may_change(xid, sub.session):
            return
        self.core.remove_subscription(sub)
        self.send(P.SubRply(xid, sub.id))
        self.core.announce(sub.session, {EVENT: "subscription-removed",
                                         SESSION: sub.session.name,
                                         "Proxy.Subscription": Int64(sub.id)}, but=self)

    def _qos_rqst(self, packet):
        xid = packet.xid
        standard, proxy = _split_options(packet.options)
        changes = []
        for option, value in proxy.items():
            base, _, number = option.rpartition(".") if option.count(".") == 2 else (
                option, "", "")
            if option == ACK:
                if not self.ack_window:
                    self.protocol_error(xid, errors.PROT_ERROR,
                                        f"{ACK} needs {ACK_WINDOW} at connect")
                    return
                if not isinstance(value, int) or not 0 <= value <= self._sent:
                    self.protocol_error(xid, errors.PROT_ERROR,
                                        f"{ACK} must count notifications sent on this "
                                        f"connection (0 to {self._sent}), not {value!r}")
                    return
                changes.append((ACK, None, value))
            elif option == DELETE_SESSION:
                session = self.core.named.get(value) if isinstance(value, str) else None
                if session is None or session not in self.joined:
                    self.protocol_error(xid, errors.PROT_ERROR,
                              f"{DELETE_SESSION}: not a session this client has joined")
                    return
                if not self._may_change(xid, session):
                    return
                changes.append((DELETE_SESSION, session, None))
            elif base in (TTL, MAX_COUNT):
                if not isinstance(value, int) or value < 0:
                    self.protocol_error(xid, errors.PROT_ERROR,
                              f"{option} must be a non-negative integer")
                    return
                if number:
                    sub = self._own(xid, int(number)) if number.isdigit() else None
                    if sub is None:
                        if not number.isdigit():
                            self.protocol_error(xid, errors.PROT_ERROR, f"bad option {option!r}")
                        return
                    if not self._may_change(xid, sub.session):
                        return
                    changes.append((base, sub, value or None))
                else:
                    changes.append((base, None, value or None))
            else:
                self.protocol_error(xid, errors.PROT_ERROR, f"unknown proxy option {option!r}")
                return
        reply = self.options.negotiate(standard)
        self.output.configure(self.options)
        changed = set()
        for what, target, value in changes:
            if what == DELETE_SESSION:
                continue
            if what == ACK:
                reply[ACK] = Int64(value)
                continue
            if target is None:
                if what == TTL:
                    self.ttl = value
                else:
                    self.max_count = value
            else:
                if what == TTL:
                    target.ttl = value
                else:
                    target.max_count = value
                changed.add(target)
            reply[what if target is None else f"{what}.{target.id}"] = value or 0
        for sub in changed:
            self.core.save(sub)
            self.core.announce(sub.session, sub.event(), but=self)
        self.send(P.QosRply(xid, reply))
        for what, target, value in changes:
            if what == DELETE_SESSION:
                self.core.delete_session(target)
            elif what == ACK:
                self.acknowledged(value)

    def _sec_rqst(self, packet):
        xid = packet.xid
        session = self.primary
        if not self._may_change(xid, session):
            return
        for wire, role in ((packet.add_nfn_keys, PRODUCER), (packet.del_nfn_keys, PRODUCER),
                           (packet.add_sub_keys, CONSUMER), (packet.del_sub_keys, CONSUMER)):
            if not self._valid_keys(xid, wire, role):
                return
        add_nfn, del_nfn = raw_ring(packet.add_nfn_keys), raw_ring(packet.del_nfn_keys)
        add_sub, del_sub = raw_ring(packet.add_sub_keys), raw_ring(packet.del_sub_keys)
        if session.nfn_keys.intersects(add_nfn) or session.sub_keys.intersects(add_sub):
            self.protocol_error(xid, errors.KEY_EXISTS, "key already registered")
            return
        if not (session.nfn_keys.contains_all(del_nfn)
                and session.sub_keys.contains_all(del_sub)):
            self.protocol_error(xid, errors.NO_SUCH_KEY, "no such key to remove")
            return
        old = session.sub_keys
        session.nfn_keys = session.nfn_keys.union(add_nfn).difference(del_nfn)
        session.sub_keys = session.sub_keys.union(add_sub).difference(del_sub)
        self.core.save_keys(session)
        if add_sub or del_sub:
            self.core.session_keys_changed(session, old)
        self.send(P.SecRply(xid))

    def _nfn_keys(self) -> KeyRing:
        keys = KeyRing.EMPTY
        for session in self.joined:
            if session.nfn_keys:
                keys = keys.union(session.nfn_keys)
        return keys

    def _notify_emit(self, packet):
        self._emit(packet.attributes, packet.deliver_insecure, packet.keys, self._nfn_keys())

    def _unotify(self, packet):
        if packet.client_major_version != PROTOCOL_MAJOR:
            return
        self._emit(packet.attributes, packet.deliver_insecure, packet.keys, KeyRing.EMPTY)

    def _emit(self, attributes, deliver_insecure, wire_keys, connection_keys, size=None):
        problem = notification_problem(self.options, attributes, size)
        if problem is None and wire_keys:
            try:
                KeyRing.from_wire(wire_keys, PRODUCER)
            except ElvinError as e:
                problem = str(e)
        if problem is not None:
            self.log.info("ignored notification from {peer}: {problem}", peer=self.peer,
                          problem=problem)
            return
        keys = connection_keys.union(raw_ring(wire_keys)) if wire_keys else connection_keys
        self.core.forward(attributes, deliver_insecure, keys.to_wire() if keys else P.Keys.EMPTY)

    def _quench(self, packet):
        self.protocol_error(packet.xid, errors.NOT_IMPL,
                            "the proxy does not relay quench requests (docs/proxy.md)")


def _split_options(options):
    """(the standard connection options, the proxy's ``Proxy.*`` ones)."""
    standard, proxy = {}, {}
    for name, value in options.items():
        (proxy if name.startswith("Proxy.") else standard)[name] = value
    return standard, proxy


def _sessions_asked(proxy):
    """``[(name, password, admin password)]`` from ConnRqst's options:
    ``Proxy.Session`` (with ``Proxy.Password``, ``Proxy.Admin-Password``),
    then ``Proxy.Session.2`` (``Proxy.Password.2``, ...) and so on."""
    wanted = []
    known = {RECEIPT, CLIENT, TTL, MAX_COUNT, ACK_WINDOW}
    for index in range(1, MAX_JOINED + 1):
        suffix = "" if index == 1 else f".{index}"
        name = proxy.get(SESSION + suffix)
        if name is None:
            continue
        if not isinstance(name, str) or not name:
            raise ValueError(f"{SESSION + suffix} must be a non-empty string")
        password, admin = proxy.get(PASSWORD + suffix), proxy.get(ADMIN_PASSWORD + suffix)
        for option, value in ((PASSWORD, password), (ADMIN_PASSWORD, admin)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{option + suffix} must be a string")
        if any(name == n for n, _, _ in wanted):
            raise ValueError(f"session {name!r} named twice")
        wanted.append((name, password, admin))
        known |= {SESSION + suffix, PASSWORD + suffix, ADMIN_PASSWORD + suffix}
    unknown = sorted(set(proxy) - known)
    if unknown:
        raise ValueError(f"unknown proxy option(s) {', '.join(unknown)} "
                         "(see docs/proxy.md)")
    return wanted


def _rights(session, password, admin_password):
    """None: refused; False: may join and receive; True: may also change
    the session (the paper's two-level scheme, 5.2.1; docs/proxy.md,
    "Passwords"):

    * no password: anyone may join and change it;
    * a join password only: it joins, and changes;
    * an administrative password only: it joins, and changes; nothing
      else joins;
    * both: the join password joins and receives, the administrative one
      joins and changes.
    """
    if admin_password is not None and session.admin_hash is not None:
        if check_password(session.admin_hash, admin_password):
            return True
        return None
    if session.join_hash is not None:
        if password is None or not check_password(session.join_hash, password):
            return None
        return session.admin_hash is None
    if session.admin_hash is not None:
        return None
    return True


def _needs_check(session, password, admin_password):
    """Would ``_rights`` compute a scrypt hash?"""
    return ((admin_password is not None and session.admin_hash is not None)
            or (session.join_hash is not None and password is not None))


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
