"""Delivering, storing and replaying (the paper's 5.1.2; docs/proxy.md,
"Delivering and storing").

Upstream's NotifyDeliver goes to every live client of the sessions it
matched, once each, and one copy is stored for the sessions that need it
kept; what a reactor turn stores commits as one transaction before any of
that turn's deliveries is written. A joining client is replayed what was
stored, page by page as its channel drains (or as it acknowledges), then
goes live. A store that cannot write is survived: what it could not keep
is counted as dropped and told by DropWarn.

Apart from the rest because this is where a notification's one promise is
kept (written or stored, never both lost), and the parts that keep it
(``Keeping`` for the ``ProxyCore``, ``Receiving`` for a ``ProxyClient``)
read best side by side.
"""

from __future__ import annotations

import bisect
import collections
from typing import Dict, List, Tuple

from elvin.protocols import packets
from elvin.proxy.model import Session
from elvin.proxy.state import ClientState, CoreState
from elvin.proxy.store import StoreFailed

__all__ = ["Keeping", "Receiving"]


class Keeping(CoreState):
    """The ``ProxyCore``'s part: deliver, store, survive the store failing."""

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
                           db=self.store.path, why=str(error))
        self.store_down_until = self.clock() + 1.0
        if self._holding:
            self._abandon_turn()

    def store_writable(self) -> bool:
        """``_store_up`` for the parts that create rows the proxy must not
        lose (a new session): False while the store cannot write."""
        return self._store_up()

    def _store_up(self) -> bool:
        """May the store be written to (not in the second after a failure)?"""
        if self.store_down_until is None:
            return True
        if self.clock() < self.store_down_until:
            return False
        drops, self.unsaved_drops = self.unsaved_drops, collections.Counter()
        gaps, self.unsaved_gaps = self.unsaved_gaps, collections.Counter()
        try:
            self._add_dropped([(name, count, gaps[name]) for name, count in drops.items()
                               if name in self.named])
        except StoreFailed as e:
            self.unsaved_drops.update(drops)
            self.unsaved_gaps.update(gaps)
            self.store_failed(e)
            return False
        self.store_down_until = None
        self.log.info("proxy database {db}: writing again", db=self.store.path)
        return True

    def add_gaps(self, names, count: int) -> None:
        """The sessions named missed notifications in ``count`` gaps of
        unknown size each: each gap counted as one drop, and as a gap, for
        the session's next client (in one transaction, however many
        sessions; kept in memory while the store cannot write)."""
        if self.store_down_until is None:
            try:
                self._add_dropped([(name, count, count) for name in names])
                return
            except StoreFailed as e:
                self.store_failed(e)
        self._unsaved([(name, count, count) for name in names])

    def _add_dropped(self, counts) -> None:
        """Add ``(session, drops, gaps)`` to the sessions' counts, in one
        transaction; in a turn's, kept to count again should it roll back."""
        with self.store.batch():
            for name, count, gaps in counts:
                self.store.add_dropped(name, count, gaps)
        if self._holding:
            self._turn_drops.extend(counts)

    def _unsaved(self, counts) -> None:
        for name, count, gaps in counts:
            self.unsaved_drops[name] += count
            self.unsaved_gaps[name] += gaps

    def take_dropped(self, name: str) -> Tuple[int, int]:
        """Drops to tell the session's next client of (and forget), and how
        many of them are gaps of unknown size."""
        unsaved = self.unsaved_drops.pop(name, 0), self.unsaved_gaps.pop(name, 0)
        try:
            dropped, gaps = self.store.take_dropped(name)
        except StoreFailed as e:
            self.store_failed(e)
            row = self.store.session(name)
            dropped, gaps = (row.dropped, row.gaps) if row else (0, 0)
        return dropped + unsaved[0], gaps + unsaved[1]

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
        deliveries: Dict[Receiving, tuple] = {}
        keep: Dict[str, Dict[int, bool]] = {}
        marks: List[Tuple[str, str]] = []
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
        body = packets.encode_attributes(attributes)
        note = None
        if keep:
            note = self._keep(body, keep, marks)
        for client, (secure, insecure) in deliveries.items():
            data = packets.encode_notify_deliver_from(body, secure, insecure)
            client.reserve(note)
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
            self.newest_note = note
            if self._holding:
                self._turn.append(keep)     # counted as stored once committed
            else:
                self.counters.stored += 1
        dropped = store.take_cap_dropped()
        if dropped:
            self._cap_gaps(dropped)
        return note

    def in_flight(self, name):
        """``Store.in_flight``: the ranges of stored ids in flight to the
        connected acknowledging clients of session ``name`` (None: of all)."""
        session = self.named.get(name) if name is not None else None
        if name is None:
            clients = self.acking
        else:
            clients = session.clients if session is not None else set()
        spans = []
        for client in clients:
            if client.ack_window:
                span = client.in_flight_span()
                if span is not None:
                    spans.append(span)
        return spans

    def _cap_gaps(self, dropped) -> None:
        """The caps dropped these (``{session: [ids]}``): logged, and each
        connected client still to be fed any of them is owed a DropWarn
        where they were (the session's count tells its next client)."""
        skipped = self._cap_log.allow()
        if skipped is not None:
            self.log.warn("dropped the oldest notifications kept for {sessions} to stay under "
                          "max-stored, max-stored-bytes or max-total-stored-bytes "
                          "(counted in each session's Proxy.Dropped; connected clients told "
                          "by DropWarn at the gap){more}",
                          sessions=", ".join(f"{name!r}: {len(ids)}" for name, ids in
                                             sorted(dropped.items())[:5]),
                          more=self._cap_log.more(skipped))
        for name, ids in dropped.items():
            session = self.named.get(name)
            if session is None:
                continue
            for client in session.clients:
                if client.live:
                    continue            # it had every one of them already
                later = [i for i in ids if i > client._replayed_to]
                if later:
                    client.owe_drop_warn(min(later) - 1)

    def _not_kept(self, keep) -> None:
        """Not stored for the sessions in ``keep``: counted as dropped, and
        their connected clients fed from the store told where."""
        self.counters.not_stored += 1
        self.store.take_cap_dropped()       # rolled back with the rest
        for name in keep:
            self.unsaved_drops[name] += 1
            session = self.named.get(name)
            for client in session.clients if session is not None else ():
                if not client.live:
                    client.owe_drop_warn(self.newest_note)

    def _abandon_turn(self) -> None:
        """The turn's transaction failed: what it stored is gone (counted as
        dropped), and its live deliveries go out as not stored."""
        self.store.abandon()
        self._holding = False
        self.newest_note = self.store.newest_notification()   # its ids are free again
        for earlier in self._turn:
            self._not_kept(earlier)
        self._turn = []
        self._unsaved(self._turn_drops)     # rolled back with the turn
        self._turn_drops = []
        self._held = [(client, data, None) for client, data, _ in self._held]
        # (a DropWarn held among them, data None, stays in its place)

    def _release(self) -> None:
        if self._holding:
            try:
                self.store.release()
                self.counters.stored += len(self._turn)
            except StoreFailed as e:
                self.store_failed(e)          # abandons the turn
            self._holding = False
            self._turn = []
            self._turn_drops = []
        held, self._held = self._held, []
        for client, data, note in held:
            if data is None:
                client.write_drop_warn()
            else:
                client.deliver(data, note)


class Receiving(ClientState):
    """A ``ProxyClient``'s part: live deliveries, acknowledgements and the
    replay of what was stored."""

    def resumed(self):
        """The channel drained: go on replaying, if that was waiting."""
        if self._replay_waiting:
            self._replay_waiting = False
            self._schedule_replay()

    def reserve(self, note=None):
        """A live notification (``note``: its stored id, if stored) is on its
        way to this client (held until the turn commits, or written at
        once): an acknowledging client whose window it fills stops being
        live, so what follows is kept for it and replayed as it
        acknowledges."""
        if self.ack_window:
            self._reserved += 1
            self._reserved_notes.append(note)
            if self._sent + self._reserved - self._acked >= self.ack_window:
                self.live = False

    def in_flight_span(self):
        """``(first, last)`` stored ids written or on their way to this
        acknowledging client and not acknowledged (None: none): every row of
        its sessions between them is in flight to it, since it is fed each
        session's rows in order."""
        first = last = None
        for _, note in self._inflight:
            if note is not None:
                first = note
                break
        if first is None:
            for note in self._reserved_notes:
                if note is not None:
                    first = note
                    break
        if first is None:
            return None
        for note in reversed(self._reserved_notes):
            if note is not None:
                last = note
                break
        if last is None:
            last = self._replayed_to
        return first, max(first, last)

    def deliver(self, data, note=None):
        """Write a live notification (``note``: its stored id, if stored)."""
        if self.ack_window:
            self._reserved = max(0, self._reserved - 1)
            if self._reserved_notes:
                self._reserved_notes.popleft()
        if note is not None and self._gaps:
            self._warn_gaps(note)
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
        """Notifications were lost upstream, now: tell the client by a
        DropWarn at that place in its stream. One fed from the store (not
        live) gets it after what is stored now; a live one after this
        turn's deliveries (held until the turn commits)."""
        if self.state != self.CONNECTED:
            return
        core = self.core
        if not self.live:
            self.owe_drop_warn(core.newest_note, counted=False)
        elif core._holding or core._held:
            core._held.append((self, None, None))
        else:
            self.write_drop_warn()

    def write_drop_warn(self):
        if self.state == self.CONNECTED:
            self.output.send(packets.DropWarn())

    #: Most DropWarns owed at once (more are merged into the last).
    MAX_GAPS = 256

    def owe_drop_warn(self, after, counted=True):
        """A DropWarn is owed before the first stored notification with an
        id above ``after`` (or when the replay ends, if none comes).
        ``counted``: the session's drop count has it already; if not (an
        upstream gap, told to connected clients only) and this client
        leaves before it is told, the session counts it for its next
        client (``untold_gaps``)."""
        gaps = self._gaps
        if not counted:
            self._uncounted_gaps.add(after)
        if after in gaps:
            return
        if len(gaps) >= self.MAX_GAPS:
            gaps[-1] = max(gaps[-1], after)     # told once, at the later gap
            return
        bisect.insort(gaps, after)

    def untold_gaps(self):
        """Gaps not counted by the session that this client was never told
        of (it left first)."""
        if not self._gaps:
            return 0
        return len(self._uncounted_gaps)

    def _warn_gaps(self, note):
        """Before writing stored notification ``note``: the DropWarn for
        every gap before it, as one."""
        gaps = self._gaps
        if gaps and note > gaps[0]:
            del gaps[:bisect.bisect_left(gaps, note)]
            self._uncounted_gaps = {g for g in self._uncounted_gaps if g >= note}
            self.write_drop_warn()

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
            self.output.send(packets.NotifyDeliver(attributes, (), ()))

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
            if self._gaps:                # gaps after the last it was sent
                self._gaps = []
                self._uncounted_gaps = set()
                self.write_drop_warn()
            self.live = True
            return
        encode = packets.encode_notify_deliver_from
        send = self.output.send_encoded
        if self.ack_window:
            for note in page:
                if self._gaps:
                    self._warn_gaps(note.id)
                send(encode(note.body, note.secure, note.insecure), False)
                self._sent_one(note.id)
        else:
            for note in page:
                if self._gaps:
                    self._warn_gaps(note.id)
                send(encode(note.body, note.secure, note.insecure), False)
            self._replayed_to = page[-1].id
            core.write(core.store.acknowledge_many, names, self.name,
                       [note.id for note in page], self.destructive)
        core.counters.replayed += len(page)
        if self.state == self.CONNECTED:
            self._schedule_replay()
