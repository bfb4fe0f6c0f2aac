"""The subscription index: which subscriptions could match a notification.

Each subscription is filed under one *access key*, chosen from what it
needs to be true (``elvin.subscription.analysis``):

1. its equality constraints, e.g. ``s1 == "a" && s2 == "b" && i > 3`` is
   filed under the names ``(s1, s2)`` and values ``("a", "b")`` — a
   subscription with ``equals(s1, "a", "b")`` or ``s1 == "a" || s1 == "b"``
   is filed once per value combination;
2. otherwise, one attribute name it requires (``require(x)``, ``x > 3``);
3. otherwise (rare: e.g. ``!(x == 1) || y == 2``), the "always" list.

For a notification, the candidates are the buckets its own names and
values select — a few dictionary look-ups per distinct name signature —
plus the "always" list; only candidates are evaluated. Every subscription
is in exactly one bucket a notification can select, so no candidate is
produced twice. The index never changes what matches: it only skips
subscriptions that cannot be true.
"""

import itertools

from elvin.subscription.analysis import (equality_constraints, index_key,
                                         required_names)

__all__ = ["SubscriptionIndex", "MAX_KEY_COMBINATIONS"]

#: Most value combinations one subscription is filed under before the
#: index falls back to fewer constrained names.
MAX_KEY_COMBINATIONS = 64


class SubscriptionIndex:
    """Holds subscription entries (objects with ``id``, ``subscription``)."""

    def __init__(self):
        # signature (tuple of names) -> {tuple of keys: {id: entry}}
        self._by_values = {}
        # name -> {id: entry}
        self._by_name = {}
        self._always = {}
        self._where = {}

    def __len__(self):
        return len(self._where)

    # -- filing ---------------------------------------------------------------

    def _access(self, constraints, required):
        """Where to file: from the equality constraints, else a required
        name (``required()`` gives them; asked only when needed)."""
        if constraints:
            if any(not keys for keys in constraints.values()):
                return ("never", None, None)
            names = sorted(constraints, key=lambda n: (len(constraints[n]), n))
            # Keep the most selective names whose combinations stay small.
            chosen = []
            combos = 1
            for name in names:
                width = len(constraints[name])
                if combos * width > MAX_KEY_COMBINATIONS:
                    break
                chosen.append(name)
                combos *= width
            if chosen:
                signature = tuple(sorted(chosen))
                keys = list(itertools.product(*(sorted(constraints[n], key=repr)
                                                for n in signature)))
                return ("values", signature, keys)
        names = required()
        if names:
            return ("name", min(names), None)
        return ("always", None, None)

    def add(self, entry, tree=None):
        """File ``entry`` by ``tree`` (default: its subscription's)."""
        if tree is None:
            constraints, required = entry.subscription.index_facts()
            kind, where, keys = self._access(constraints, lambda: required)
        else:
            kind, where, keys = self._access(equality_constraints(tree),
                                             lambda: required_names(tree))
        if kind == "values":
            table = self._by_values.setdefault(where, {})
            for key in keys:
                table.setdefault(key, {})[entry.id] = entry
        elif kind == "name":
            self._by_name.setdefault(where, {})[entry.id] = entry
        elif kind == "always":
            self._always[entry.id] = entry
        self._where[entry.id] = (kind, where, keys)

    def remove(self, entry):
        placed = self._where.pop(entry.id, None)
        if placed is None:
            return
        kind, where, keys = placed
        if kind == "values":
            table = self._by_values[where]
            for key in keys:
                bucket = table[key]
                bucket.pop(entry.id, None)
                if not bucket:
                    del table[key]
            if not table:
                del self._by_values[where]
        elif kind == "name":
            bucket = self._by_name[where]
            bucket.pop(entry.id, None)
            if not bucket:
                del self._by_name[where]
        elif kind == "always":
            self._always.pop(entry.id, None)

    # -- lookup -----------------------------------------------------------------

    def candidates(self, attributes):
        """Entries that may match ``attributes`` (a normalised dict)."""
        found = []
        if self._always:
            found.extend(self._always.values())
        by_name = self._by_name
        if by_name:
            if len(by_name) < len(attributes):
                for name, bucket in by_name.items():
                    if name in attributes:
                        found.extend(bucket.values())
            else:
                for name in attributes:
                    bucket = by_name.get(name)
                    if bucket is not None:
                        found.extend(bucket.values())
        for signature, table in self._by_values.items():
            key = []
            for name in signature:
                value = attributes.get(name)
                if value is None:
                    break
                k = index_key(value)
                if k is None:
                    break
                key.append(k)
            else:
                bucket = table.get(tuple(key))
                if bucket is not None:
                    found.extend(bucket.values())
        return found

    def all_entries(self):
        """Every filed entry (each once)."""
        seen = {}
        for bucket in self._always, *self._by_name.values():
            seen.update(bucket)
        for table in self._by_values.values():
            for bucket in table.values():
                seen.update(bucket)
        return seen.values()
