"""Quench: tell registered clients about subscriptions on attribute names.

A quench is a set of attribute names registered by a client (often a
producer). Whenever a subscription that refers to any of those names is
added, changed or removed, the client gets a SubAddNotify, SubModNotify or
SubDelNotify carrying the subscription's AST, so it can emit only what
somebody wants (client protocol 5.3.3, 5.4.4, 7.4.21-7.4.27).

Visibility follows the keys, as for notifications: a quench sees a
subscription *securely* when the quench's keys (or its connection's
notification keys) match the subscription's keys (or its connection's
subscription keys), and *insecurely* when both the quench's
``deliver_insecure`` and the subscription's ``accept_insecure`` are set;
otherwise it does not see it at all. A change of keys or expression that
makes a subscription start or stop being visible and relevant becomes an
add or a delete notification.

Both directions are indexed by name, so registering a subscription costs
O(quenches on its names) and registering a quench O(subscriptions on its
names).
"""

from elvin.protocols import packets as P

__all__ = ["QuenchEntry", "QuenchRegistry"]


class QuenchEntry:
    __slots__ = ("id", "session", "names", "deliver_insecure", "keys")

    def __init__(self, quench_id, session, names, deliver_insecure, keys):
        self.id = quench_id
        self.session = session
        self.names = frozenset(names)
        self.deliver_insecure = deliver_insecure
        self.keys = keys


def visibility(quench, entry):
    """0 secure, 1 insecure, or None when ``quench`` may not see ``entry``."""
    for producer in (quench.keys, quench.session.nfn_keys):
        if producer and (producer.matches(entry.keys)
                         or producer.matches(entry.session.sub_keys)):
            return 0
    if quench.deliver_insecure and entry.accept_insecure:
        return 1
    return None


class QuenchRegistry:
    """Quenches by name, and subscriptions by name, for one router."""

    def __init__(self):
        self.quenches = {}
        self._quenches_by_name = {}
        self._subs_by_name = {}

    def __len__(self):
        return len(self.quenches)

    # -- subscriptions come and go ----------------------------------------

    def _interested(self, names):
        found = {}
        by_name = self._quenches_by_name
        for name in names:
            for quench in by_name.get(name, ()):
                found[quench.id] = quench
        return found.values()

    def _file(self, entry, names):
        for name in names:
            self._subs_by_name.setdefault(name, set()).add(entry)

    def _unfile(self, entry, names):
        for name in names:
            bucket = self._subs_by_name.get(name)
            if bucket is not None:
                bucket.discard(entry)
                if not bucket:
                    del self._subs_by_name[name]

    def subscription_added(self, entry):
        names = entry.subscription.names
        self._file(entry, names)
        if self._quenches_by_name:
            self._notify_add(entry, self._interested(names))

    def subscription_removed(self, entry, names=None):
        names = entry.subscription.names if names is None else names
        self._unfile(entry, names)
        if self._quenches_by_name:
            self._notify_delete(entry, [q for q in self._interested(names)
                                        if visibility(q, entry) is not None])

    def subscription_changing(self, entry):
        """Call before changing ``entry``; returns a token for ``changed``."""
        names = entry.subscription.names
        before = {q.id: visibility(q, entry) for q in self._interested(names)}
        return names, {k: v for k, v in before.items() if v is not None}

    def subscription_changed(self, entry, token):
        old_names, before = token
        new_names = entry.subscription.names
        if old_names != new_names:
            self._unfile(entry, old_names - new_names)
            self._file(entry, new_names - old_names)
        if not self._quenches_by_name:
            return
        after = {}
        quenches = {}
        for q in self._interested(new_names):
            v = visibility(q, entry)
            if v is not None:
                after[q.id] = v
                quenches[q.id] = q
        gone = [self.quenches[i] for i in before if i not in after and i in self.quenches]
        added = [quenches[i] for i in after if i not in before]
        kept = [quenches[i] for i in after if i in before]
        self._notify_delete(entry, gone)
        self._notify_add(entry, added)
        self._send_grouped(entry, kept, P.SubModNotify)

    # -- quenches come and go ----------------------------------------------

    def _subscriptions_on(self, names):
        found = {}
        for name in names:
            for entry in self._subs_by_name.get(name, ()):
                found[entry.id] = entry
        return found.values()

    def add(self, quench):
        self.quenches[quench.id] = quench
        for name in quench.names:
            self._quenches_by_name.setdefault(name, []).append(quench)
        for entry in sorted(self._subscriptions_on(quench.names), key=lambda e: e.id):
            self._send_grouped(entry, [quench], P.SubAddNotify)

    def remove(self, quench):
        self.quenches.pop(quench.id, None)
        for name in quench.names:
            bucket = self._quenches_by_name.get(name)
            if bucket is not None:
                bucket[:] = [q for q in bucket if q.id != quench.id]
                if not bucket:
                    del self._quenches_by_name[name]

    def modify(self, quench, names, deliver_insecure, keys):
        """Change ``quench``; tell it about subscriptions it gains or loses."""
        before = {e.id: e for e in self._subscriptions_on(quench.names)
                  if visibility(quench, e) is not None}
        self.remove(quench)
        quench.names = frozenset(names)
        quench.deliver_insecure = deliver_insecure
        quench.keys = keys
        self.quenches[quench.id] = quench
        for name in quench.names:
            self._quenches_by_name.setdefault(name, []).append(quench)
        after = {e.id: e for e in self._subscriptions_on(quench.names)
                 if visibility(quench, e) is not None}
        for sub_id in sorted(before.keys() - after.keys()):
            self._notify_delete(before[sub_id], [quench])
        for sub_id in sorted(after.keys() - before.keys()):
            self._send_grouped(after[sub_id], [quench], P.SubAddNotify)

    def session_closed(self, session):
        for quench in [q for q in self.quenches.values() if q.session is session]:
            self.remove(quench)

    # -- sending -------------------------------------------------------------

    def _notify_add(self, entry, quenches):
        self._send_grouped(entry, quenches, P.SubAddNotify)

    def _send_grouped(self, entry, quenches, packet_class):
        """One packet per quenching session, with its secure/insecure ids."""
        per_session = {}
        for quench in quenches:
            v = visibility(quench, entry)
            if v is None:
                continue
            ids = per_session.get(quench.session)
            if ids is None:
                per_session[quench.session] = ids = ([], [])
            ids[v].append(quench.id)
        if not per_session:
            return
        tree = entry.subscription.ast
        for session, (secure, insecure) in per_session.items():
            session.send_droppable(packet_class(tuple(secure), tuple(insecure), entry.id, tree))

    def _notify_delete(self, entry, quenches):
        per_session = {}
        for quench in quenches:
            per_session.setdefault(quench.session, []).append(quench.id)
        for session, ids in per_session.items():
            session.send_droppable(P.SubDelNotify(tuple(ids), entry.id))


