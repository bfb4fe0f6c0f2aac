"""The proxy's upstream side: each session subscription made, changed and
removed upstream; made again on every new upstream connection; clients'
notifications sent up (or held, bounded, while upstream is down); and
upstream's DropWarn passed on to the sessions it may concern, and so are
the gaps nobody reports: an upstream outage (counted when the proxy
subscribes again) and the proxy's own absence (counted when it starts with
sessions that had subscriptions).

Apart from the rest because it is the only part that talks to
``elvin.proxy.upstream`` (``is_up``, ``subscribe``, ``modify``,
``unsubscribe``, ``notify``, described on ``ProxyCore``), and the only one
whose state (upstream subscription ids) is lost with a connection.

Every request it sends upstream is bounded (``upstream-timeout``, on the
upstream connection's own timer): one not answered in time fails with
RequestTimeout, is counted (``upstream_timeouts``) and logged naming the
request and the session (``upstream_timed_out``), and its late answer, if
one comes, is taken back into step: a subscription still wanted and not
yet placed takes it, any other is removed upstream (SubDelRqst); a
modification the client was refused is reversed (SubModRqst).
"""

from __future__ import annotations

from typing import Tuple

from elvin.client.state import ConnectionClosed, NackError, RequestTimeout
from elvin.core.keys import KeyRing
from elvin.protocols import packets
from elvin.proxy.model import ProxySubscription
from elvin.proxy.delivery import Keeping

__all__ = ["UpstreamRelay", "MAX_PLACE_RETRY"]

#: The longest wait, in seconds, between requests making a subscription
#: again upstream when they go unanswered (the first wait is
#: upstream-timeout, doubled at each try).
MAX_PLACE_RETRY = 60.0


class UpstreamRelay(Keeping):
    """The ``ProxyCore``'s dealings with upstream."""

    def subscribe_upstream(self, sub: ProxySubscription):
        """Make ``sub`` upstream; returns the Deferred of the request, or None
        when upstream is down (it is made when upstream comes back). Not
        answered within upstream-timeout, it fails with RequestTimeout; the
        caller says what follows (``upstream_timed_out``), and a late
        answer is ``_late_subscription``'s."""
        if not self.upstream.is_up or sub.in_flight:
            return None
        sub.in_flight = True
        d = self.upstream.subscribe(sub.expression, sub.accept_insecure,
                                    sub.upstream_keys().to_wire(),
                                    lambda reply: self._late_subscription(sub, reply))

        def added(upstream_id):
            sub.in_flight = False
            if self.subscriptions.get(sub.id) is not sub:
                self._unsubscribe(upstream_id, sub)      # removed while we waited
                return upstream_id
            sub.upstream_id = upstream_id
            self.by_upstream[upstream_id] = sub
            if sub.placing_failed:
                self._placed_late(sub)
            return upstream_id

        def failed(failure):
            sub.in_flight = False
            if failure.check(NackError):
                skipped = self._refusal_log.allow()
                if skipped is not None:
                    self.log.warn("upstream refused subscription {id} of {session!r} "
                                  "({expr!r}): {why}{more}", id=sub.id,
                                  session=sub.session.name, expr=sub.expression,
                                  why=failure.getErrorMessage(),
                                  more=self._refusal_log.more(skipped))
            return failure
        return d.addCallbacks(added, failed)

    def modify_upstream(self, sub: ProxySubscription, expression, accept_insecure,
                        keys: KeyRing):
        """Change ``sub`` upstream to these; Deferred, or None when it is not
        there (the new state is made when upstream comes back). The caller
        applies the change here once it succeeds; one that times out is not
        applied, and is reversed upstream if its answer comes late."""
        if sub.upstream_id is None or not self.upstream.is_up:
            return None
        old = sub.upstream_keys()
        new = keys.union(sub.session.sub_keys)
        added, removed = new.difference(old), old.difference(new)
        previous = sub.upstream_id

        def modified(upstream_id):
            if upstream_id != previous and self.by_upstream.get(previous) is sub:
                del self.by_upstream[previous]
                sub.upstream_id = upstream_id
                self.by_upstream[upstream_id] = sub
            return upstream_id

        def late(reply):
            """Upstream made the change after all, which the client was
            refused: put back what the proxy holds (its expression, and the
            keys the change added and removed, the other way round)."""
            if type(reply) is not packets.SubRply or self.by_upstream.get(previous) is not sub:
                return                              # refused, or gone (and removed)
            upstream_id = modified(reply.subscription_id)
            self.log.info("upstream answered the change to subscription {id} of {session} "
                          "late: changed back upstream", id=sub.id,
                          session=session_label(sub.session))
            d = self.upstream.modify(upstream_id, sub.expression, sub.accept_insecure,
                                     removed.to_wire(), added.to_wire())
            d.addCallback(modified)
            d.addErrback(self._remake, "SubModRqst (changing back)", sub, upstream_id)
        d = self.upstream.modify(sub.upstream_id, expression, accept_insecure,
                                 added.to_wire(), removed.to_wire(), late)
        return d.addCallback(modified)

    def _late_subscription(self, sub: ProxySubscription, reply) -> None:
        """Upstream answered ``sub``'s SubAddRqst after it had timed out: the
        subscription is placed if it is still wanted and not placed (nor
        being placed) since; else what upstream made is removed there (a
        client's subscription refused on the timeout is gone)."""
        if type(reply) is not packets.SubRply:
            return                                  # a late Nack: nothing was made
        upstream_id = reply.subscription_id
        if (self.subscriptions.get(sub.id) is sub and sub.upstream_id is None
                and not sub.in_flight and self.upstream.is_up):
            sub.upstream_id = upstream_id
            self.by_upstream[upstream_id] = sub
            self.log.info("upstream answered subscription {id} of {session} late: placed",
                          id=sub.id, session=session_label(sub.session))
            if sub.placing_failed:
                self._placed_late(sub)
            return
        self.log.info("upstream answered subscription {id} of {session} late, after it "
                      "was given up: removed upstream", id=sub.id,
                      session=session_label(sub.session))
        self._unsubscribe(upstream_id, sub)

    def upstream_timed_out(self, failure, request, sub, then):
        """An errback: a RequestTimeout (``request`` for ``sub`` not answered
        within upstream-timeout) is counted and logged with what follows
        (``then``), at most one line per 10 s; ConnectionClosed is
        ignored (what a new connection makes again); anything else is
        passed on."""
        if failure.check(ConnectionClosed):
            return None
        if not failure.check(RequestTimeout):
            return failure
        self.counters.upstream_timeouts += 1
        skipped = self._timeout_log.allow()
        if skipped is not None:
            self.log.warn("upstream did not answer {request} for subscription {id} of "
                          "{session} ({expr!r}) within {seconds:g} s (upstream-timeout): "
                          "{then}{more}", request=request, id=sub.id,
                          session=session_label(sub.session), expr=sub.expression,
                          seconds=failure.value.seconds, then=then,
                          more=self._timeout_log.more(skipped))
        return None

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
            d.addErrback(self._remake, "SubModRqst (the session's keys)", sub, sub.upstream_id)

    def _remake(self, failure, request, sub: ProxySubscription, previous):
        """An errback: ``request``, changing ``sub`` upstream (there
        ``previous``), went unanswered or was refused, so what upstream
        holds for it may differ from what the proxy holds (old keys: a key
        the session removed still letting notifications through; a change
        a client was refused). It is removed upstream and made afresh
        (``place``), its session told of the gap once it is placed.
        Nothing to do if it was removed or made again meanwhile, or the
        connection is gone (a new one makes every subscription again)."""
        if failure.check(ConnectionClosed) or self.by_upstream.get(previous) is not sub:
            return None
        then = "removed upstream and made again from what the proxy holds"
        if failure.check(RequestTimeout):
            self.upstream_timed_out(failure, request, sub, then)
        elif failure.check(NackError):
            self.log.warn("upstream refused {request} for subscription {id} of {session}: "
                          "{why}; {then}", request=request, id=sub.id,
                          session=session_label(sub.session), why=failure.getErrorMessage(),
                          then=then)
        else:
            return failure
        del self.by_upstream[previous]
        sub.upstream_id = None
        sub.placing_failed = True
        self._unsubscribe(previous, sub)
        self.place(sub)
        return None

    def _unsubscribe(self, upstream_id, sub: ProxySubscription):
        if self.upstream.is_up:
            d = self.upstream.unsubscribe(upstream_id)
            if d is not None:
                d.addErrback(self.upstream_timed_out, "SubDelRqst", sub,
                             "upstream may keep it; what it delivers for it is ignored")
                d.addErrback(lambda f: None)   # refused: it is gone already

    def upstream_up(self) -> None:
        """A new upstream connection: make every subscription there again
        and send what clients emitted while it was down."""
        self.log.info("upstream connected: subscribing {n} subscriptions",
                      n=len(self.subscriptions))
        if self.upstream_lost:
            self.upstream_lost = False
            sessions, clients, later = self.announce_gap()
            self.counters.upstream_gaps += sessions
            self.log.warn("upstream connection made again: what was published while it "
                          "was down is lost to the proxy's {sessions} sessions with "
                          "subscriptions; each counted one gap (cause upstream_gap), told "
                          "{clients} clients by DropWarn now and {later} sessions' next "
                          "clients", sessions=sessions, clients=clients, later=later)
        for sub in list(self.subscriptions.values()):
            self.place(sub)
        backlog, self.backlog = self.backlog, []
        for attributes, deliver_insecure, keys in backlog:
            self.upstream.notify(attributes, deliver_insecure, keys)

    def place(self, sub: ProxySubscription, tries: int = 0) -> None:
        """The proxy's own request: make ``sub`` upstream if it is not there
        (a refusal is logged by ``subscribe_upstream``). Given up on after
        upstream-timeout, it stays in its session and is asked for again
        (``_place_given_up``) until upstream answers one of the requests."""
        if sub.upstream_id is None:
            d = self.subscribe_upstream(sub)
            if d is not None:
                d.addErrback(self._place_given_up, sub, tries)
                d.addErrback(lambda f: None)   # a refusal: logged in subscribe_upstream

    def _place_given_up(self, failure, sub: ProxySubscription, tries: int):
        """An errback: the SubAddRqst making ``sub`` again went unanswered.
        It is asked for again after upstream-timeout, doubled at each try
        up to ``MAX_PLACE_RETRY`` s, on the same upstream connection (a new
        one makes every subscription again); whichever answer comes first
        places it, and a later one is removed upstream
        (``_late_subscription``). Its session is told of the gap when it
        is placed (``_placed_late``)."""
        if not failure.check(RequestTimeout) or self.call_later is None:
            return self.upstream_timed_out(failure, "SubAddRqst (made again)", sub,
                                           "kept in its session, not placed upstream until "
                                           "a late answer or the next upstream connection")
        delay = min(failure.value.seconds * 2 ** tries, MAX_PLACE_RETRY)
        sub.placing_failed = True
        self.upstream_timed_out(failure, "SubAddRqst (made again)", sub,
                                f"kept in its session, unplaced upstream (its session "
                                f"misses what is published meanwhile, told by DropWarn "
                                f"once placed); asked again in {delay:g} s")
        self._place_retries[sub] = self.call_later(delay, self._place_again, sub, tries + 1)
        return None

    def _place_again(self, sub: ProxySubscription, tries: int) -> None:
        """A retry's timer: cancelled when the connection goes
        (``upstream_down``; a new one makes every subscription again)."""
        self._place_retries.pop(sub, None)
        if self.subscriptions.get(sub.id) is sub and self.upstream.is_up:
            self.place(sub, tries)

    def _placed_late(self, sub: ProxySubscription) -> None:
        """``sub`` is placed after a request making it again went
        unanswered: what was published meanwhile is lost to its session,
        how much nobody knows; counted as one gap (``upstream_gap``) and
        told as for an outage (``announce_gap``)."""
        sub.placing_failed = False
        sessions, clients, later = self.announce_gap([sub.session])
        self.counters.upstream_gaps += sessions
        self.log.warn("subscription {id} of {session} placed upstream late: what was "
                      "published before is lost to its session; one gap (cause "
                      "upstream_gap), told {clients} clients by DropWarn now and {later} "
                      "sessions' next clients", id=sub.id, session=session_label(sub.session),
                      clients=clients, later=later)

    def upstream_down(self) -> None:
        """The upstream connection is gone: its subscription ids with it."""
        self.log.warn("upstream connection lost; sessions are kept, and "
                      "re-subscribed when it returns")
        self.upstream_lost = True
        self.by_upstream.clear()
        for retry in self._place_retries.values():     # a new connection places all
            if retry.active():
                retry.cancel()
        self._place_retries = {}
        for sub in self.subscriptions.values():
            sub.upstream_id = None
            sub.in_flight = False
            sub.placing_failed = False      # the outage's gap covers it

    def forward(self, attributes, deliver_insecure, keys: packets.Keys) -> None:
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

    def _load(self) -> None:
        """The sessions of the store, and the gap each one with subscriptions
        has had while the proxy was not running (cause ``restart``)."""
        super()._load()
        sessions, _, later = self.announce_gap()
        self.counters.restart_gaps += sessions
        if sessions:
            self.log.warn("proxy started with {sessions} sessions with subscriptions: "
                          "what was published while it was not running is lost to them; "
                          "each counted one gap (cause restart), its next client told by "
                          "DropWarn", sessions=sessions)

    def upstream_dropwarn(self) -> None:
        """Upstream dropped notifications meant for the proxy (its send queue
        to us overflowed): which, and for whom, nobody knows. Every session
        with subscriptions is told (``announce_gap``)."""
        self.counters.upstream_dropwarns += 1
        _, clients, later = self.announce_gap()
        self.log.warn("upstream router dropped notifications for the proxy (DropWarn: its "
                      "send queue to the proxy overflowed); told {clients} clients, and "
                      "{sessions} sessions' next clients", clients=clients, sessions=later)

    def announce_gap(self, only=None) -> Tuple[int, int, int]:
        """Notifications may have been lost to every session with
        subscriptions (or to those of ``only``), how many nobody knows: its
        connected clients are told by a DropWarn now, and a session without
        any by one drop more in ``Proxy.Dropped`` (and one gap more in
        ``Proxy.Gaps``) and a DropWarn to its next client. Returns the sessions concerned, the clients told now and
        the sessions whose next client will be."""
        told: set = set()
        unseen = []
        sessions = 0
        named = self.named.values() if only is None else [s for s in only if s.persistent]
        for session in named:
            if not session.subscriptions:
                continue
            sessions += 1
            if session.clients:
                told.update(session.clients)
            else:
                unseen.append(session.name)
        for client in list(self.sessions):
            if client.joined and not client.primary.persistent \
                    and client.primary.subscriptions \
                    and (only is None or client.primary in only):
                sessions += 1                  # its anonymous session
                told.add(client)
            if client in told:
                client.drop_warn()
        if unseen:
            self.add_gaps(unseen, 1)
        return sessions, len(told), len(unseen)


def session_label(session) -> str:
    """A session for the log: its name quoted, or its client's for an
    anonymous one (a client that named no session)."""
    if session.name is not None:
        return f"session {session.name!r}"
    peers = [str(client.peer) for client in session.clients]
    return f"the anonymous session of {', '.join(peers) or 'a client gone'}"
