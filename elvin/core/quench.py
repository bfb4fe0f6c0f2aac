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

Memory is in proportion to the names held: a quench keeps its names as a
tuple; the by-name index maps a name held by one quench straight to it,
and a name shared by several to one dict of them (whose string every later
quench on it reuses); nothing is kept for a name or quench once it is
gone, and the registry's dicts are rebuilt smaller when most of their
slots are empty (``compacted``). What quenches hold together is capped by
``max_bytes`` (the router's ``max-quench-memory``), estimated per quench
by ``quench_cost``.
"""

import sys

from elvin.protocols import packets

__all__ = ["QuenchEntry", "QuenchRegistry", "quench_cost", "DEFAULT_MAX_QUENCH_MEMORY"]

#: Default router-wide cap on what quenches may hold (``max-quench-memory``).
DEFAULT_MAX_QUENCH_MEMORY = 64 * 1024 * 1024

#: What one quench costs beyond its names (its entry, its names tuple, its
#: slots in the registry's and the session's dicts), in bytes, and what each
#: name costs beyond the string itself (its slot in the names tuple and in
#: the by-name index). Measured with tracemalloc (docs/quench.md); they err
#: high, so the estimate bounds the memory.
QUENCH_COST = 400
NAME_COST = 80


def quench_cost(names):
    """The bytes a quench on ``names`` is charged against the router's
    ``max-quench-memory``: an estimate of what it holds, counting each name
    in full even when another quench shares it."""
    return QUENCH_COST + sum(NAME_COST + sys.getsizeof(name) for name in names)


class QuenchEntry:
    """One quench: its names (a tuple, each name held once router-wide by
    the registry, see ``QuenchRegistry.add``), keys and owner."""

    __slots__ = ("id", "session", "names", "deliver_insecure", "keys", "cost")

    def __init__(self, quench_id, session, names, deliver_insecure, keys):
        self.id = quench_id
        self.session = session
        self.names = tuple(dict.fromkeys(names))
        self.deliver_insecure = deliver_insecure
        self.keys = keys
        self.cost = quench_cost(self.names)


class _Shared:
    """The quenches on one name when there is more than one (a name held by
    one quench maps straight to it), and the name's one string object."""

    __slots__ = ("name", "quenches")

    def __init__(self, name, quenches):
        self.name = name
        self.quenches = quenches


def compacted(table):
    """``table``, or a copy sized to what it holds when most of its slots
    are empty: a dict never gives back the table it grew to, so one that
    held a million entries keeps ~40 MB after they are all deleted."""
    if not table:
        return {}
    if sys.getsizeof(table) > 1024 + 256 * len(table):
        return {key: value for key, value in table.items()}
    return table


def visibility(quench, entry):
    """0 secure, 1 insecure, or None when ``quench`` may not see ``entry``.

    A federation term (a disjunct of a link's pull filter: what the far
    side wants) carries no keys, so every quench sees it: insecurely when
    the quench allows insecure delivery, else securely (the far routers
    check the keys when the notification gets there)."""
    if getattr(entry, "is_pull", False):
        return 1 if quench.deliver_insecure else 0
    for producer in (quench.keys, quench.session.nfn_keys):
        if producer and (producer.matches(entry.keys)
                         or producer.matches(entry.session.sub_keys)):
            return 0
    if quench.deliver_insecure and entry.accept_insecure:
        return 1
    return None


class QuenchRegistry:
    """Quenches by name, and subscriptions by name, for one router.

    ``max_bytes`` (0: no limit) caps the sum of the quenches' ``cost``
    (``quench_cost``), held in ``bytes``; ``affordable`` says whether a
    quench of some cost still fits.
    """

    def __init__(self, max_bytes=DEFAULT_MAX_QUENCH_MEMORY):
        self.quenches = {}
        #: name -> the one QuenchEntry on it, or a _Shared of several.
        self._quenches_by_name = {}
        #: Subscriptions (and pull terms) grouped by their set of names,
        #: and name -> the name sets holding it: a subscription is in one
        #: set, where filing it under each of its names cost a set slot
        #: per name (some 200 bytes a subscription of the benchmark's). A
        #: group of one is the entry itself, a name in one set that set.
        self._subs_by_names = {}
        self._name_sets = {}
        #: Federation terms that name no attribute (a pull of everything).
        self._pulls_everything = {}
        self.max_bytes = max_bytes
        self.bytes = 0
        #: Quench notifications given to quenching clients: deliveries,
        #: which their send queues may drop (operations add them to the
        #: router's ``deliveries``, as drops are in ``dropped_deliveries``).
        self.sent = 0

    def __len__(self):
        return len(self.quenches)

    def names(self):
        """How many distinct names the quenches hold."""
        return len(self._quenches_by_name)

    def affordable(self, cost, replacing=None):
        """Would a quench of ``cost`` bytes (instead of ``replacing``) fit?"""
        if not self.max_bytes:
            return True
        held = self.bytes - (replacing.cost if replacing is not None else 0)
        return held + cost <= self.max_bytes

    # -- subscriptions come and go ----------------------------------------

    def _interested(self, names):
        found = {}
        by_name = self._quenches_by_name
        for name in names:
            bucket = by_name.get(name)
            if bucket is None:
                continue
            if type(bucket) is _Shared:
                found.update(bucket.quenches)
            else:
                found[bucket.id] = bucket
        return found.values()

    def _file(self, entry, names):
        names = frozenset(names)
        by_names = self._subs_by_names
        group = by_names.get(names)
        if group is None:
            # One subscription on a set of names is held as itself, and a
            # name in one set as that set (no set object of one each: most
            # subscriptions on names of their own would pay some 430 bytes).
            by_names[names] = entry
            name_sets = self._name_sets
            for name in names:
                held = name_sets.get(name)
                if held is None:
                    name_sets[name] = names
                elif held.__class__ is set:
                    held.add(names)
                else:
                    name_sets[name] = {held, names}
        elif group.__class__ is set:
            group.add(entry)
        elif group is not entry:
            by_names[names] = {group, entry}

    def _unfile(self, entry, names):
        names = frozenset(names)
        by_names = self._subs_by_names
        group = by_names.get(names)
        if group is None:
            return
        if group.__class__ is set:
            group.discard(entry)
            if len(group) == 1:
                by_names[names] = next(iter(group))
            if group:
                return
        elif group is not entry:
            return
        del by_names[names]
        name_sets = self._name_sets
        for name in names:
            held = name_sets[name]
            if held.__class__ is set:
                held.discard(names)
                if len(held) == 1:
                    name_sets[name] = next(iter(held))
            else:
                del name_sets[name]

    def _groups(self, name):
        """The name sets holding ``name``."""
        held = self._name_sets.get(name)
        if held is None:
            return ()
        return held if held.__class__ is set else (held,)

    # -- federation terms: what the far side of a link wants ---------------

    def pull_added(self, entry):
        """A disjunct of a link's pull filter (``Router.set_pull_filter``)
        appeared: quenches on its names (every quench, for one that names
        none: it wants everything) hear of it as a term, so a producer
        quenching here learns what subscribers beyond the link want."""
        if entry.names:
            self._file(entry, entry.names)
            if self._quenches_by_name:
                self._notify_add(entry, self._interested(entry.names))
        else:
            self._pulls_everything[entry.id] = entry
            if self.quenches:
                self._notify_add(entry, list(self.quenches.values()))

    def pull_removed(self, entry):
        if entry.names:
            self._unfile(entry, entry.names)
            quenches = self._interested(entry.names) if self._quenches_by_name else ()
        else:
            self._pulls_everything.pop(entry.id, None)
            self._pulls_everything = compacted(self._pulls_everything)
            quenches = list(self.quenches.values())
        if quenches:
            self._notify_delete(entry, quenches)

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
            self._unfile(entry, old_names)
            self._file(entry, new_names)
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
        self._send_grouped(entry, kept, packets.SubModNotify)

    # -- quenches come and go ----------------------------------------------

    def _subscriptions_on(self, names):
        found = dict(self._pulls_everything)
        groups = set()
        for name in names:
            groups.update(self._groups(name))
        for group in groups:
            held = self._subs_by_names[group]
            for entry in held if held.__class__ is set else (held,):
                found[entry.id] = entry
        return found.values()

    def _index(self, quench, names):
        """File ``quench`` under ``names``; returns the names as the index
        holds them, so a name many quenches share is one string object."""
        by_name = self._quenches_by_name
        held = []
        for name in names:
            bucket = by_name.get(name)
            if bucket is None:
                by_name[name] = quench
            elif type(bucket) is _Shared:
                name = bucket.name
                bucket.quenches[quench.id] = quench
            else:
                by_name[name] = _Shared(name, {bucket.id: bucket, quench.id: quench})
            held.append(name)
        return tuple(held)

    def _unindex(self, quench):
        by_name = self._quenches_by_name
        for name in quench.names:
            bucket = by_name.get(name)
            if bucket is quench:
                del by_name[name]
            elif type(bucket) is _Shared:
                quenches = bucket.quenches
                quenches.pop(quench.id, None)
                if len(quenches) == 1:
                    by_name[name] = next(iter(quenches.values()))
                else:
                    bucket.quenches = compacted(quenches)
        self._quenches_by_name = compacted(by_name)

    def add(self, quench):
        self.quenches[quench.id] = quench
        self.bytes += quench.cost
        quench.names = self._index(quench, quench.names)
        for entry in sorted(self._subscriptions_on(quench.names), key=lambda e: e.id):
            self._send_grouped(entry, [quench], packets.SubAddNotify)

    def remove(self, quench):
        if self.quenches.pop(quench.id, None) is None:
            return
        self.bytes -= quench.cost
        self._unindex(quench)
        self.quenches = compacted(self.quenches)

    def modify(self, quench, names, deliver_insecure, keys):
        """Change ``quench``; tell it about subscriptions it gains or loses."""
        before = self._seen_by(quench)
        self.remove(quench)
        quench.names = tuple(dict.fromkeys(names))
        quench.cost = quench_cost(quench.names)
        quench.deliver_insecure = deliver_insecure
        quench.keys = keys
        self.quenches[quench.id] = quench
        self.bytes += quench.cost
        quench.names = self._index(quench, quench.names)
        self._tell_changes([(quench, entry, side) for entry, side in before],
                           [(quench, entry, visibility(quench, entry))
                            for entry in self._subscriptions_on(quench.names)])

    def _seen_by(self, quench):
        """(subscription, visibility) of each subscription on ``quench``'s names."""
        return [(e, visibility(quench, e)) for e in self._subscriptions_on(quench.names)]

    def keys_changing(self, session):
        """Call before ``session``'s connection keys change (SecRqst): its
        notification keys decide what its quenches see, its subscription
        keys who sees its subscriptions (``visibility``). Returns a token
        for ``keys_changed``, None when there is no quench to tell."""
        if not self._quenches_by_name:
            return None
        return self._pairs_of(session)

    def keys_changed(self, session, token):
        """Tell each quench what the key change made it gain (SubAddNotify),
        lose (SubDelNotify) or see on the other side, secure or insecure
        (SubModNotify): 7.4.9 has what follows a SecRply match the new keys."""
        if token is not None:
            self._tell_changes(token, self._pairs_of(session))

    def _pairs_of(self, session):
        """(quench, subscription, visibility) for the session's quenches and
        the subscriptions on their names, and the session's subscriptions
        and the quenches on theirs."""
        pairs = []
        for quench in getattr(session, "quenches", {}).values():
            pairs.extend((quench, entry, side) for entry, side in self._seen_by(quench))
        for entry in getattr(session, "subscriptions", {}).values():
            pairs.extend((quench, entry, visibility(quench, entry))
                         for quench in self._interested(entry.subscription.names))
        return pairs

    def _tell_changes(self, before, after):
        """Notify the differences between two lists of (quench, subscription,
        visibility), in subscription order: gained, lost, or changed side."""
        old = {(q.id, e.id): side for q, e, side in before}
        changes: dict = {}
        for quench, entry, side in after:
            was = old.pop((quench.id, entry.id), None)
            if side == was:
                continue
            kind = (packets.SubAddNotify if was is None else
                    None if side is None else packets.SubModNotify)
            changes.setdefault((entry.id, kind is None), (entry, kind, []))[2].append(quench)
        if old:
            entries = {e.id: e for _, e, _ in before}
            for (quench_id, entry_id), side in old.items():
                if side is not None and quench_id in self.quenches:
                    changes.setdefault((entry_id, True), (entries[entry_id], None, []))[2] \
                        .append(self.quenches[quench_id])
        for key in sorted(changes):
            entry, kind, quenches = changes[key]
            if kind is None:
                self._notify_delete(entry, quenches)
            else:
                self._send_grouped(entry, quenches, kind)

    def session_closed(self, session):
        """Forget every quench of ``session`` (its ``quenches`` dict, which
        is emptied, when it keeps one; else a scan of all quenches)."""
        own = getattr(session, "quenches", None)
        if own is None:
            own = {q.id: q for q in self.quenches.values() if q.session is session}
        for quench in list(own.values()):
            self.remove(quench)
        own.clear()

    # -- sending -------------------------------------------------------------

    def _notify_add(self, entry, quenches):
        self._send_grouped(entry, quenches, packets.SubAddNotify)

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
        tree = entry.tree if getattr(entry, "is_pull", False) else entry.subscription.ast
        for session, (secure, insecure) in per_session.items():
            session.send_droppable(packet_class(tuple(secure), tuple(insecure), entry.id, tree))
        self.sent += len(per_session)

    def _notify_delete(self, entry, quenches):
        per_session = {}
        for quench in quenches:
            per_session.setdefault(quench.session, []).append(quench.id)
        for session, ids in per_session.items():
            session.send_droppable(packets.SubDelNotify(tuple(ids), entry.id))
        self.sent += len(per_session)


