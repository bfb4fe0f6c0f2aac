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
* ``elvin.proxy.state``: the state they share, declared once;
* this module: the two classes put together, and what ends sessions and
  subscriptions (a channel closing, deletion, expiry, the sweep).
  ``ProxyCore`` is the host of its clients' sessions (``SessionHost``),
  as the router is of its own; ``ProxyClient`` is the router's
  ``ClientSession`` state machine with the proxy's handlers.
"""

from __future__ import annotations

from twisted.logger import Logger

from elvin.core.router import ClientSession
from elvin.protocols import packets
from elvin.proxy.joining import Joining, PasswordChecks
from elvin.proxy.model import (ACK, ACK_WINDOW, ADMIN_PASSWORD, CLIENT, DELETE_SESSION,
                               DESTRUCTIVE, EVENT, MAX_COUNT, NON_DESTRUCTIVE, PASSWORD,
                               RECEIPT, SESSION, TTL, ProxySubscription, Session)
from elvin.proxy.relay import UpstreamRelay
from elvin.proxy.store import StoreFailed

__all__ = ["ProxyCore", "ProxyClient", "Session", "ProxySubscription", "SESSION",
           "PASSWORD", "ADMIN_PASSWORD", "RECEIPT", "CLIENT", "TTL", "MAX_COUNT",
           "DELETE_SESSION", "EVENT", "DESTRUCTIVE", "NON_DESTRUCTIVE", "ACK", "ACK_WINDOW"]


class ProxyCore(PasswordChecks, UpstreamRelay):
    """Sessions, subscriptions and clients of one proxy: to its clients'
    sessions, their host (``SessionHost``), as the router is to its own.

    ``upstream`` is what the proxy's upstream connection offers: ``is_up``,
    ``subscribe(expression, accept_insecure, keys, late) -> Deferred[id]``,
    ``modify(id, expression, accept_insecure, add_keys, del_keys, late) ->
    Deferred[id]``, ``unsubscribe(id)`` and ``notify(attributes,
    deliver_insecure, keys)``; a request not answered within
    upstream-timeout fails with RequestTimeout, and ``late(reply)`` takes
    the answer if it comes after all. It calls back ``upstream_up``,
    ``upstream_down`` and ``upstream_notification``.
    """

    log = Logger()

    def open_session(self, output, peer=None) -> "ProxyClient":
        client = ProxyClient(self, output, peer)
        self.sessions.add(client)
        return client

    def session_closed(self, client: "ProxyClient") -> None:
        """A channel ended (ClientSession calls this by the router's name;
        it may call it again as the connection is lost: once is counted)."""
        if client not in self.sessions:
            return
        self.sessions.discard(client)
        self.acking.discard(client)
        self.counters.client_queue_dropped += client.dropped
        untold = client.untold_gaps()
        left = []
        for session in client.joined:
            session.clients.discard(client)
            if untold and session.persistent and session.name in self.named:
                # Gaps it left before reaching: its session's next client is told.
                self.add_gaps([session.name], untold)
            if not session.persistent:
                for sub in list(session.subscriptions.values()):
                    self.remove_subscription(sub)
            elif not session.clients and session.name in self.named:
                left.append(session.name)
        if left:
            self.write(self.store.seen, left, self.clock())

    def delete_session(self, session: Session) -> None:
        for sub in list(session.subscriptions.values()):
            self.remove_subscription(sub)
        if self.named.pop(session.name, None) is not None and session.creator is not None:
            self.created_by[session.creator] -= 1
            if not self.created_by[session.creator]:
                del self.created_by[session.creator]
        self.store.delete_session(session.name)
        for client in list(session.clients):
            client.session_deleted(session)
        self.log.info("session {name!r} deleted", name=session.name)

    def remove_subscription(self, sub: ProxySubscription) -> None:
        """Remove ``sub`` here, from the store and upstream."""
        sub.session.subscriptions.pop(sub.id, None)
        self.subscriptions.pop(sub.id, None)
        if sub.session.persistent and sub.session.name in self.named:
            self.store.remove_subscription(sub.session.name, sub.id)
        if sub.upstream_id is not None:
            self.by_upstream.pop(sub.upstream_id, None)
            self._unsubscribe(sub.upstream_id, sub)
            sub.upstream_id = None

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


class ProxyClient(Joining):
    """One channel to the proxy: the router's client state machine
    (section 5.4: states, violations, Disconn, protocol-error accounting)
    with the proxy's handlers, for a client of sessions (docs/proxy.md)."""

    log = Logger()
    SERVER_NAME = "proxy"

    def __repr__(self):
        return f"<ProxyClient {self.peer} {self.name!r} state={self.state.name}>"

    def notify_emit(self, attributes, deliver_insecure, wire_keys, size=None,
                    connection_keys=None, connection_raw_keys=None,
                    emit_packet=None, attributes_end=0):
        """The transports' fast path for a NotifyEmit (``ClientSession``'s
        signature): published upstream with the keys of the sessions this
        client joined, unless ``connection_keys`` are given. The proxy's own
        connection upstream encodes the attributes, so the received bytes
        (``emit_packet``, ``attributes_end``) are not needed."""
        if connection_keys is None:
            connection_keys = self._nfn_keys()
        self._emit_upstream(attributes, deliver_insecure, wire_keys, connection_keys, size)

    #: Most packets held while a request waits for upstream (beyond it the
    #: client is cut off as a protocol violation: nothing a client needs).
    MAX_AWAITING = 4096

    def packet_received(self, packet):
        if self._admitting is not None:
            self._admitting.append(packet)    # handled once admitted
            return
        if self._awaiting is not None and self.state == self.CONNECTED:
            if type(packet) is packets.TestConn:
                # Answered at once, not behind the request waiting for
                # upstream (up to upstream-timeout): it asks whether
                # the proxy is alive, which it is, holding everything sent
                # before it; a client's liveness check would otherwise call
                # it dead. (Before ConnRply it waits: ConnRply comes first.)
                self.send(packets.ConfConn())
                return
            if len(self._awaiting) >= self.MAX_AWAITING:
                self._awaiting = None
                self.violation(f"more than {self.MAX_AWAITING} requests sent while one "
                               "waited for the upstream router")
                return
            self._awaiting.append(packet)     # after the request upstream answers
            return
        super().packet_received(packet)

    def connection_lost(self, why="connection lost"):
        self._awaiting = None
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
    packets.ConnRqst: None,
    packets.UNotify: None,
    packets.DisconnRqst: ClientSession._disconn_rqst,
    packets.TestConn: ClientSession._test_conn,
    packets.ConfConn: None,
    packets.QosRqst: ProxyClient._qos_rqst,
    packets.SecRqst: ProxyClient._sec_rqst,
    packets.NotifyEmit: ClientSession._notify_emit,   # through notify_emit
    packets.SubAddRqst: ProxyClient._sub_add,
    packets.SubModRqst: ProxyClient._sub_mod,
    packets.SubDelRqst: ProxyClient._sub_del,
    packets.QnchAddRqst: ProxyClient._quench,
    packets.QnchModRqst: ProxyClient._quench,
    packets.QnchDelRqst: ProxyClient._quench,
}
ProxyClient.HANDLERS = _HANDLERS
