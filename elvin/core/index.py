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
plus the "always" list; only candidates are evaluated.

A bucket that grows to ``GRID_FROM`` entries also files them on a *grid*
over one numeric attribute most of them bound (``i1 >= 120 && i1 < 531``
needs i1 in [120, 531]: ``analysis.range_constraints``): cells of one
width, each entry in the cells its interval covers (at most
``MAX_GRID_CELLS``, else in the bucket's "loose" list). A notification then
takes from the bucket only the cell its value falls in, plus the loose
entries; one without a number there takes only the loose ones. Every subscription
is in exactly one bucket a notification can select, so no candidate is
produced twice. The index never changes what matches: it only skips
subscriptions that cannot be true.
"""

import itertools
import math
import statistics

from elvin.subscription.analysis import (equality_constraints, index_key,
                                         range_constraints, required_names)
from elvin.values import Int64

__all__ = ["SubscriptionIndex", "MAX_KEY_COMBINATIONS", "GRID_FROM", "MAX_GRID_CELLS"]

#: Most value combinations one subscription is filed under before the
#: index falls back to fewer constrained names.
MAX_KEY_COMBINATIONS = 64
#: A bucket this large gets a grid (smaller ones are cheaper to scan).
GRID_FROM = 16
#: Most cells one entry is filed in; a wider interval goes in "loose".
MAX_GRID_CELLS = 8

_INF = math.inf
_floor = math.floor
_NUMBERS = (int, float, Int64)


class _Grid:
    """A bucket's entries by cell of one attribute's value (see above)."""

    __slots__ = ("name", "width", "cells", "loose", "spans")

    def __init__(self, name, width):
        self.name = name
        self.width = width
        self.cells = {}
        self.loose = {}
        self.spans = {}         # id -> its cells (see add), for removal

    def add(self, entry, ranges):
        bounds = ranges.get(self.name) if ranges else None
        if bounds is not None:
            lo, hi = bounds
            if -_INF < lo and hi < _INF:
                if lo > hi:
                    return          # can never be true: no cell needs it
                first, last = _floor(lo / self.width), _floor(hi / self.width)
                if last - first < MAX_GRID_CELLS:
                    # one int, not a tuple: first cell and how many more
                    self.spans[entry.id] = first * MAX_GRID_CELLS + (last - first)
                    cells = self.cells
                    for cell in range(first, last + 1):
                        bucket = cells.get(cell)
                        if bucket is None:
                            cells[cell] = bucket = {}
                        bucket[entry.id] = entry
                    return
        self.loose[entry.id] = entry

    def remove(self, entry):
        span = self.spans.pop(entry.id, None)
        if span is None:
            self.loose.pop(entry.id, None)
            return
        cells = self.cells
        first, more = divmod(span, MAX_GRID_CELLS)
        for cell in range(first, first + more + 1):
            bucket = cells.get(cell)
            if bucket is not None:
                bucket.pop(entry.id, None)
                if not bucket:
                    del cells[cell]

    def select(self, attributes, found):
        if self.loose:
            found.extend(self.loose.values())
        value = attributes.get(self.name)
        # Only a finite number can satisfy a bound (NaN fails -inf < value).
        if value.__class__ in _NUMBERS and -_INF < value < _INF:
            bucket = self.cells.get(_floor(value / self.width))
            if bucket:
                found.extend(bucket.values())

    @classmethod
    def plan(cls, ranges):
        """A grid for entries with these ``ranges`` (dicts), or None: on the
        attribute most of them bound on both sides, cells as wide as their
        median interval."""
        counts = {}
        for bounds in ranges:
            for name, (lo, hi) in bounds.items():
                if -_INF < lo <= hi < _INF:
                    counts[name] = counts.get(name, 0) + 1
        if not counts:
            return None
        name = max(sorted(counts), key=counts.get)
        if counts[name] * 2 < len(ranges):
            return None
        width = statistics.median(
            b[name][1] - b[name][0] for b in ranges
            if name in b and -_INF < b[name][0] <= b[name][1] < _INF)
        return cls(name, width if width > 0 else 1.0)


class _Bucket:
    """The entries filed under one key, and past GRID_FROM their grid.
    Until it has a grid it keeps its entries' ranges, to plan one with;
    a grid keeps only each entry's cells."""

    __slots__ = ("key", "signature", "entries", "ranges", "grid", "next_plan")

    def __init__(self, key=None, signature=None):
        self.key = key          # its key in the index's table
        # which table: a names tuple (by values), True (by name), None (always)
        self.signature = signature
        self.entries = {}
        self.ranges = {}        # id -> range_constraints (until there is a grid)
        self.grid = None
        self.next_plan = GRID_FROM

    def __len__(self):
        return len(self.entries)

    def add(self, entry, ranges):
        self.entries[entry.id] = entry
        grid = self.grid
        if grid is not None:
            grid.add(entry, ranges)
            return
        if ranges:
            self.ranges[entry.id] = ranges
        if len(self.entries) >= self.next_plan:
            self.next_plan *= 2     # no grid fits yet: try again at twice the size
            grid = _Grid.plan([self.ranges.get(i, {}) for i in self.entries])
            if grid is not None:
                for known in self.entries.values():
                    grid.add(known, self.ranges.get(known.id))
                self.grid = grid
                self.ranges = None

    def remove(self, entry):
        if self.entries.pop(entry.id, None) is None:
            return
        if self.grid is not None:
            self.grid.remove(entry)
        else:
            self.ranges.pop(entry.id, None)

    def select(self, attributes, found):
        grid = self.grid
        if grid is None:
            found.extend(self.entries.values())
        else:
            grid.select(attributes, found)


class SubscriptionIndex:
    """Holds subscription entries (objects with ``id``, ``subscription``)."""

    def __init__(self):
        # signature (tuple of names) -> {tuple of keys: _Bucket}
        self._by_values = {}
        # name -> _Bucket
        self._by_name = {}
        self._always = _Bucket()
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
            constraints, required, ranges = entry.subscription.index_facts()
            kind, where, keys = self._access(constraints, lambda: required)
        else:
            kind, where, keys = self._access(equality_constraints(tree),
                                             lambda: required_names(tree))
            ranges = range_constraints(tree)
        # Where it is filed, as shared objects (the buckets), not as keys
        # of its own: this is per subscription.
        if kind == "values":
            table = self._by_values.setdefault(where, {})
            buckets = []
            for key in keys:
                bucket = table.get(key)
                if bucket is None:
                    table[key] = bucket = _Bucket(key, where)
                bucket.add(entry, ranges)
                buckets.append(bucket)
            self._where[entry.id] = buckets[0] if len(buckets) == 1 else tuple(buckets)
        elif kind == "name":
            bucket = self._by_name.get(where)
            if bucket is None:
                self._by_name[where] = bucket = _Bucket(where, True)
            bucket.add(entry, ranges)
            self._where[entry.id] = bucket
        elif kind == "always":
            self._always.add(entry, ranges)
            self._where[entry.id] = self._always
        else:
            self._where[entry.id] = ()     # "never": filed nowhere

    def remove(self, entry):
        # Its bucket, or a tuple of its buckets (all of one table): shared
        # objects, no record of its own.
        placed = self._where.pop(entry.id, None)
        if placed is None:
            return
        buckets = (placed,) if placed.__class__ is _Bucket else placed
        if not buckets:
            return
        signature = buckets[0].signature
        if signature is True:
            table = self._by_name
        elif signature is not None:
            table = self._by_values[signature]
        else:
            table = None
        for bucket in buckets:
            bucket.remove(entry)
            if not bucket and table is not None:
                del table[bucket.key]
        if table is not None and not table and signature is not True:
            del self._by_values[signature]

    # -- lookup -----------------------------------------------------------------

    def candidates(self, attributes):
        """Entries that may match ``attributes`` (a normalised dict)."""
        found = []
        if self._always:
            self._always.select(attributes, found)
        by_name = self._by_name
        if by_name:
            if len(by_name) < len(attributes):
                for name, bucket in by_name.items():
                    if name in attributes:
                        bucket.select(attributes, found)
            else:
                for name in attributes:
                    bucket = by_name.get(name)
                    if bucket is not None:
                        bucket.select(attributes, found)
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
                    bucket.select(attributes, found)
        return found

    def all_entries(self):
        """Every filed entry (each once)."""
        seen = {}
        for bucket in self._always, *self._by_name.values():
            seen.update(bucket.entries)
        for table in self._by_values.values():
            for bucket in table.values():
                seen.update(bucket.entries)
        return seen.values()
