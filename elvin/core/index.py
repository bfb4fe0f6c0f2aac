"""The subscription index: which subscriptions could match a notification.

Each subscription is filed under one *access key*, chosen from what it
needs to be true (``elvin.subscription.analysis``):

1. its equality constraints, e.g. ``s1 == "a" && s2 == "b" && i > 3`` is
   filed under the names ``(s1, s2)`` and values ``("a", "b")`` — a
   subscription with ``equals(s1, "a", "b")`` or ``s1 == "a" || s1 == "b"``
   is filed once per value combination;
2. otherwise, one attribute name it requires (``require(x)``, ``x > 3``);
3. otherwise, an OR whose disjuncts each have an access key of their own
   (``M == 1 || N == "s"``) is filed under each of them (and the
   candidates are then made unique);
4. otherwise (rare: e.g. ``!(x == 1) || y == 2``), the "always" list.

For a notification, the candidates are the buckets its own names and
values select — a few dictionary look-ups per distinct name signature —
plus the "always" list; only candidates are evaluated.

A bucket that grows to ``GRID_FROM`` entries also files them on a *grid*
(``analysis.range_constraints``: ``i1 >= 120 && i1 < 531`` needs i1 in
[120, 531]): over the numeric attribute most of them bound on both sides,
and over a second one too when at least half of them bound both
(``i1`` and ``i2`` in a cell of both). Cells are as wide as the median
interval (1.5 times that with two attributes); each entry is listed in the
cells its intervals cover (at most ``MAX_GRID_CELLS``), its bounds on the
grid's attributes beside it; one bound only on the first attribute (or
too wide on the second) in the cells of that attribute alone, its
*rows*; any other in the bucket's "loose" list. A notification then
takes from the bucket only the entries of its values' cell whose bounds
hold its values, its row and the loose entries; one without a number
there (or one past every cell number) takes only the loose ones. The
look-up from the buckets by values down to the cells is compiled when
``_elvin_xdr`` is built (``_select_by_values``, ``_select_bucket``,
``_cell_select``), else in Python (their ``..._in_python`` twins).
Every subscription is in exactly one
bucket a notification can select and there in one list it can take, so
no candidate is produced twice (an OR filed under several keys is the
exception: ``candidates`` removes its repeats). The index never changes what matches: it
only skips subscriptions that cannot be true.
"""

import itertools
import math
import struct

from elvin.protocols import xdr as _xdr
from elvin.subscription.analysis import (equality_constraints, index_key, or_parts,
                                         range_constraints, required_names)
from elvin.subscription.ast import Kind
from elvin.values import Int64

__all__ = ["SubscriptionIndex", "MAX_KEY_COMBINATIONS", "MAX_SPREAD", "GRID_FROM",
           "MAX_GRID_CELLS",
           "CELL_WIDTH", "CELL_WIDTH_2D"]

#: Most value combinations one subscription is filed under before the
#: index falls back to fewer constrained names.
MAX_KEY_COMBINATIONS = 64
#: Most buckets an OR is filed in, one or more per disjunct (past it, the
#: "always" list).
MAX_SPREAD = 64
#: A bucket this large gets a grid. Small buckets are common: equality on
#: two attributes of 100 and 10 values spreads 10,000 subscriptions ten to a
#: bucket, where a grid over two ranges leaves 2.5 candidates to evaluate
#: instead of 9.4 (planned from 16 entries, those buckets kept none).
GRID_FROM = 4
#: Most cells one entry is filed in; a wider interval goes in "loose".
MAX_GRID_CELLS = 8
#: A grid's cells are this many times as wide as its entries' median
#: interval: on one attribute, and on each of two (fewer, larger cells:
#: a cell and its key cost more than the candidates they would save).
CELL_WIDTH = 1.0
CELL_WIDTH_2D = 1.5
#: Two cell numbers x, y make the key x * _STRIDE + y.
_STRIDE = 1 << 32

_INF = math.inf
_floor = math.floor
_NUMBERS = (int, float, Int64)
_NAN = math.nan
_UNBOUNDED = (-_INF, _INF)


_F32_MAX = 3.4028234663852886e38
_f32 = struct.Struct("f")
_f32_bits = struct.Struct("<I")


def _f32_step(f, up):
    """The float32 next to the finite float32 ``f``, up or down."""
    bits = _f32_bits.unpack(_f32.pack(f))[0]
    if f == 0:
        bits = 1 if up else 0x80000001
    elif (f > 0) == up:
        bits += 1
    else:
        bits -= 1
    return _f32.unpack(_f32_bits.pack(bits))[0]


def _outward(lo, hi):
    """``lo`` and ``hi`` (floats, not NaN) rounded outward to float32s
    (as floats): [lo, hi] within them."""
    if lo < -_F32_MAX:
        lo = -_INF
    elif lo > _F32_MAX:
        lo = _F32_MAX if lo < _INF else _INF
    else:
        rounded = _f32.unpack(_f32.pack(lo))[0]
        lo = rounded if rounded <= lo else _f32_step(rounded, False)
    if hi > _F32_MAX:
        hi = _INF
    elif hi < -_F32_MAX:
        hi = -_F32_MAX if hi > -_INF else -_INF
    else:
        rounded = _f32.unpack(_f32.pack(hi))[0]
        hi = rounded if rounded >= hi else _f32_step(rounded, True)
    return lo, hi


def _pack_bounds_in_python(*bounds):
    """An entry's bounds in a cell, ``(lo, hi)`` on each attribute
    (``_Bucket._place``), as native float32s rounded outward: half the
    bytes of doubles, and a value within a bound is within it rounded so.
    The pure-Python ``_pack_bounds``, held equal to the compiled one
    (``_elvin_xdr.pack_bounds``) by test_xdr_accelerator."""
    rounded = []
    for i in range(0, len(bounds), 2):
        rounded.extend(_outward(bounds[i], bounds[i + 1]))
    return struct.pack(f"{len(rounded)}f", *rounded)


def _select_in_cell(cells, key, found, *values):
    """Append to ``found`` the entries of the cell ``cells[key]`` whose
    bounds do not exclude ``values`` (one to three: a NaN is excluded by
    none): the pure-Python ``_cell_select``, held equal to the compiled
    one (``_elvin_xdr.cell_select``) by test_xdr_accelerator. A cell is a
    tuple: its entries' bounds, (lo, hi) for each value, as one bytes
    object of native float32s, then the entries."""
    cell = cells.get(key)
    if cell is None:
        return
    bounds = memoryview(cell[0]).cast("f")
    per = 2 * len(values)
    for i in range(1, len(cell)):
        j = per * (i - 1)
        for v in values:
            if v < bounds[j] or v > bounds[j + 1]:
                break
            j += 2
        else:
            found.append(cell[i])


def _span(bounds, width):
    """The first and last cell of ``width`` an interval ``bounds`` covers,
    or None for an unbounded side, an empty interval or one past the
    cell numbers (a bound over the width not finite)."""
    if bounds is None:
        return None
    lo, hi = bounds
    if -_INF < lo <= hi < _INF:
        lo /= width
        hi /= width
        if -_INF < lo and hi < _INF:
            return _floor(lo), _floor(hi)
    return None


def _plan(ranges):
    """The grid for entries with these ``ranges`` (dicts), as ``(name,
    width, name2, width2, name3)``, or None: on the attribute most of them bound
    on both sides, and with it the one most of those also bound, if that
    is at least half of them; cells ``CELL_WIDTH`` (``CELL_WIDTH_2D``)
    times as wide as their median interval. ``name3``: another attribute
    at least half of them bound (on one side or both), whose bounds the
    cells keep too, or None."""
    counts: dict[str, int] = {}
    for bounds in ranges:
        for name, (lo, hi) in bounds.items():
            if -_INF < lo <= hi < _INF:
                counts[name] = counts.get(name, 0) + 1
    if not counts:
        return None
    name = max(sorted(counts), key=counts.__getitem__)
    if counts[name] * 2 < len(ranges):
        return None
    pairs: dict[str, int] = {}
    for bounds in ranges:
        if _span(bounds.get(name), 1.0) is not None:
            for other, (lo, hi) in bounds.items():
                if other != name and -_INF < lo <= hi < _INF:
                    pairs[other] = pairs.get(other, 0) + 1
    name2 = max(sorted(pairs), key=pairs.__getitem__) if pairs else None
    if name2 is not None and pairs[name2] * 2 < len(ranges):
        name2 = None
    others: dict[str, int] = {}
    for bounds in ranges:
        for other in bounds:
            if other != name and other != name2:
                others[other] = others.get(other, 0) + 1
    name3 = max(sorted(others), key=others.__getitem__) if others else None
    if name3 is not None and others[name3] * 2 < len(ranges):
        name3 = None
    if name2 is None:
        return name, _median_width(ranges, name, CELL_WIDTH), None, 1.0, name3
    return (name, _median_width(ranges, name, CELL_WIDTH_2D),
            name2, _median_width(ranges, name2, CELL_WIDTH_2D), name3)


def _drop(entry, keys, table, size):
    """Take ``entry`` out of the cells ``keys`` of ``table``: lists (rows),
    or cells (``_Bucket._file``) with ``size`` bytes of bounds an entry;
    whether it was in any."""
    dropped = False
    for key in keys:
        cell = table.get(key)
        if cell is None:
            continue
        first = 0 if cell.__class__ is list else 1
        for i in range(first, len(cell)):
            if cell[i] is entry:
                break
        else:
            continue
        dropped = True
        if len(cell) == first + 1:
            del table[key]
        elif first:
            bounds = cell[0]
            at = (i - 1) * size
            table[key] = (bounds[:at] + bounds[at + size:],) + cell[1:i] + cell[i + 1:]
        else:
            del cell[i]
    return dropped


def _median_width(ranges, name, factor):
    """``factor`` times the median width of the bounded intervals on ``name``
    (for an even count, the mean of the middle two, as statistics.median),
    held once for every grid of an equal width."""
    widths = sorted(hi - lo for lo, hi in (b[name] for b in ranges if name in b)
                    if -_INF < lo <= hi < _INF)
    middle = len(widths) // 2
    width = widths[middle] if len(widths) % 2 else (widths[middle - 1] + widths[middle]) / 2
    width = float(width * factor) if width > 0 else 1.0
    if len(_WIDTHS) >= MAX_SHARED_WIDTHS:
        _WIDTHS.clear()
    return _WIDTHS.setdefault(width, width)


#: Cell widths, each held once (see ``_Bucket``).
_WIDTHS: dict = {}
MAX_SHARED_WIDTHS = 4096


class _Bucket:
    """The entries filed under one key: by id until GRID_FROM of them,
    with their ranges to plan a grid with; once a grid fits, only in the
    grid (and a count).

    The grid is the bucket's own (one object fewer for a look-up to
    reach: ``grid`` is the bucket itself, or None while it has none).
    ``cells`` maps a cell's key to the entries filed in it, a tuple: the
    entries' bounds in cells (``_place``) on ``name`` and, in a grid of
    two attributes, on ``name2``, and on ``name3`` as they are, packed as
    float32s in one bytes object (a look-up reads them in a cache line or
    two, not a float object each), then the entries in the same order.
    The key is the cell number on ``name`` for a grid of one attribute;
    for two, that number times ``_STRIDE`` plus the cell number on
    ``name2``. Two cells may share a key (numbers past
    ``_STRIDE``): an entry is still filed once per key, and its bounds
    keep it from the other cell's look-ups. ``rows`` (two
    attributes only) holds, by cell on ``name``, lists of the entries
    bound on it but not on ``name2`` (or over more cells of it than
    ``MAX_GRID_CELLS`` allows). ``rows`` and ``loose`` are None while
    empty: a look-up then reads no object of theirs. Nothing per entry is
    kept besides the cells: removal works out its cells again from its
    ranges. Cell widths are shared between grids of equal widths, and the
    slots a look-up reads come first (the fewest cache lines): ``look``,
    all the compiled look-up reads (``_relook``), then those of the
    pure-Python one."""

    __slots__ = ("look", "cells", "loose", "name", "width", "name2", "rows", "width2", "name3",
                 "key", "signature", "entries", "ranges", "count", "next_plan")

    def __init__(self, key=None, signature=None):
        self.cells = None       # None while there is no grid
        self.loose = None
        self.rows = None
        self.key = key          # its key in the index's table
        # which table: a names tuple (by values), True (by name), None (always)
        self.signature = signature
        self.entries: dict = {}     # id -> entry (emptied once there is a grid)
        self.ranges: dict = {}      # id -> range_constraints (likewise)
        self.count = 0
        self.next_plan = GRID_FROM
        # What the compiled look-up reads (``_relook``).
        self.look = self.entries

    def _relook(self):
        """Keep ``look``, the fields of a look-up in one tuple for the
        compiled one (``_elvin_xdr.bucket_select``): ``entries`` while
        there is no grid, else ``(cells, loose, rows, name, width, name2,
        width2, name3)``; made again when the grid is planned and when
        ``loose`` or ``rows`` comes or goes."""
        self.look = (self.entries if self.cells is None else
                     (self.cells, self.loose, self.rows, self.name, self.width,
                      self.name2, self.width2, self.name3))

    def __len__(self):
        return self.count

    @property
    def grid(self):
        """The bucket itself once it has a grid, else None."""
        return None if self.cells is None else self

    def add(self, entry, ranges):
        self.count += 1
        if self.cells is not None:
            self._file(entry, ranges)
            return
        self.entries[entry.id] = entry
        if ranges:
            self.ranges[entry.id] = ranges
        if self.count >= self.next_plan:
            self.next_plan *= 2     # no grid fits yet: try again at twice the size
            plan = _plan([self.ranges.get(i, {}) for i in self.entries])
            if plan is not None:
                self.name, self.width, self.name2, self.width2, self.name3 = plan
                self.cells = {}
                for known in self.entries.values():
                    self._file(known, self.ranges.get(known.id))
                self.entries = {}   # the grid holds them now
                self.ranges = {}
                self._relook()

    def remove(self, entry, ranges):
        """Take out ``entry`` (filed here); ``ranges`` are its range
        constraints, needed only when the bucket has a grid."""
        if self.cells is not None:
            self._unfile(entry, ranges)
            self.count -= 1
        elif self.entries.pop(entry.id, None) is not None:
            self.ranges.pop(entry.id, None)
            self.count -= 1

    def all_entries(self):
        """Every entry filed (each once), by id."""
        if self.cells is None:
            return self.entries
        seen = dict(self.loose or ())
        for table, first in ((self.cells, 1), (self.rows or {}, 0)):
            for cell in table.values():
                for entry in cell[first:]:
                    seen[entry.id] = entry
        return seen

    # -- the grid ---------------------------------------------------------------

    def _place(self, ranges):
        """Where an entry with ``ranges`` is filed: None (loose), or the
        keys of its cells (each once), whether in ``rows``, and its bounds
        there, in cells: ``lo / width, hi / width`` on ``name`` (and on
        ``name2`` in ``cells`` of two attributes). A look-up compares a
        value's ``value / width`` with them: dividing by a positive width
        and rounding to a float never reverses an order, so a value an
        evaluator finds within [lo, hi] (exactly, as an int64, or as a
        real64, the bounds being the literals' real64 values) is within
        them too. Then, with a ``name3``, its bounds as they are (-inf,
        inf when it has none there)."""
        if not ranges:
            return None
        bounds = ranges.get(self.name)
        span = _span(bounds, self.width)
        if span is None:
            return None
        first, last = span
        width = self.width
        name2 = self.name2
        third = () if self.name3 is None else ranges.get(self.name3, _UNBOUNDED)
        if name2 is None:
            return (range(first, last + 1), False,
                    _pack_bounds(bounds[0] / width, bounds[1] / width, *third)) \
                if last - first < MAX_GRID_CELLS else None
        bounds2 = ranges.get(name2)
        span2 = _span(bounds2, self.width2)
        if span2 is not None and (last - first + 1) * (span2[1] - span2[0] + 1) \
                <= MAX_GRID_CELLS:
            first2, last2 = span2
            width2 = self.width2
            scaled = _pack_bounds(bounds[0] / width, bounds[1] / width,
                                  bounds2[0] / width2, bounds2[1] / width2, *third)
            if first == last and first2 == last2:
                return (first * _STRIDE + first2,), False, scaled
            return {x * _STRIDE + y for x in range(first, last + 1)
                    for y in range(first2, last2 + 1)}, False, scaled
        if last - first < MAX_GRID_CELLS:
            return range(first, last + 1), True, None
        return None

    def _file(self, entry, ranges):
        placed = self._place(ranges)
        if placed is None:
            if self.loose is None:
                self.loose = {}
                self._relook()
            self.loose[entry.id] = entry
            return
        keys, in_rows, scaled = placed
        if in_rows:
            rows = self.rows
            if rows is None:
                rows = self.rows = {}
                self._relook()
            for key in keys:
                cell = rows.get(key)
                if cell is None:
                    rows[key] = [entry]
                else:
                    cell.append(entry)
        else:
            cells = self.cells
            for key in keys:
                cell = cells.get(key)
                cells[key] = ((scaled, entry) if cell is None
                              else (cell[0] + scaled,) + cell[1:] + (entry,))

    def _unfile(self, entry, ranges):
        loose = self.loose
        if loose is not None and loose.pop(entry.id, None) is not None:
            if not loose:
                self.loose = None
                self._relook()
            return
        placed = self._place(ranges)
        # bytes of bounds an entry
        size = 8 * (1 + (self.name2 is not None) + (self.name3 is not None))
        if placed is None:
            dropped = False
        elif placed[1]:
            dropped = _drop(entry, placed[0], self.rows or {}, size)
        else:
            dropped = _drop(entry, placed[0], self.cells, size)
        if not dropped:
            # Not where its ranges file it (ranges other than when it was
            # added): look in every cell.
            _drop(entry, list(self.cells), self.cells, size)
            if self.rows is not None:
                _drop(entry, list(self.rows), self.rows, size)
        if not self.rows and self.rows is not None:
            self.rows = None
            self._relook()


def _key(signature, attributes):
    """The key of the bucket of ``signature`` that ``attributes`` select,
    or None when they lack one of its names or have a value no key holds."""
    key = []
    for name in signature:
        value = attributes.get(name)
        if value.__class__ is not str:      # a string is its own key
            if value is None:
                return None
            value = index_key(value)
            if value is None:
                return None
        key.append(value)
    return tuple(key)


def _select_bucket_in_python(bucket, attributes, found, numbers):
    """Add the entries of ``bucket`` that ``attributes`` may match to
    ``found``; ``numbers`` are the classes of a number (``_NUMBERS``). The
    pure-Python ``_select_bucket``, held equal to the compiled one
    (``_elvin_xdr.bucket_select``, which reads the bucket's ``look``) by
    test_xdr_accelerator."""
    if bucket.cells is None:
        found.extend(bucket.entries.values())
        return
    loose = bucket.loose
    if loose is not None:
        found.extend(loose.values())
    value = attributes.get(bucket.name)
    # Only a finite number can satisfy a bound; for ±inf and NaN,
    # value - value is NaN (one subtraction: comparing an int with
    # ±inf twice costs three times as much).
    if value.__class__ not in numbers or value - value != 0:
        return
    # The value in cells (float), compared with bounds in cells: see
    # ``_Bucket._place``. One too large for a cell number (the division
    # not finite: OverflowError) has no cell, nor any entry there
    # (``_span``).
    v = value / bucket.width
    try:
        x = _floor(v)
    except OverflowError:
        return
    name2 = bucket.name2
    name3 = bucket.name3
    if name3 is not None:
        # A real64 (rounding never reverses an order), compared with
        # the literals' real64 values; NaN for anything else, which
        # no bound excludes.
        value = attributes.get(name3)
        v3 = value / 1.0 if value.__class__ in numbers else _NAN
    if name2 is None:
        if name3 is None:
            _cell_select(bucket.cells, x, found, v)
        else:
            _cell_select(bucket.cells, x, found, v, v3)
        return
    rows = bucket.rows
    if rows is not None:
        cell = rows.get(x)
        if cell:
            found.extend(cell)
    value = attributes.get(name2)
    if value.__class__ not in numbers or value - value != 0:
        return
    v2 = value / bucket.width2
    try:
        key = x * _STRIDE + _floor(v2)
    except OverflowError:
        return
    if name3 is None:
        _cell_select(bucket.cells, key, found, v, v2)
    else:
        _cell_select(bucket.cells, key, found, v, v2, v3)


def _select_by_values_in_python(by_values, attributes, found, numbers, key_of):
    """Add to ``found`` the entries ``attributes`` may match of the buckets
    they select in ``by_values`` (``SubscriptionIndex._by_values``), a
    bucket's key made by ``key_of`` (``_key``). The pure-Python
    ``_select_by_values``, held equal to the compiled one
    (``_elvin_xdr.values_select``) by test_xdr_accelerator."""
    for signature, table in by_values.items():
        # A string is its own key (``_key`` for the others and for
        # more names).
        size = len(signature)
        if size == 2:
            value = attributes.get(signature[0])
            value2 = attributes.get(signature[1])
            key = ((value, value2) if value.__class__ is str and value2.__class__ is str
                   else key_of(signature, attributes))
        elif size == 1:
            value = attributes.get(signature[0])
            key = (value,) if value.__class__ is str else key_of(signature, attributes)
        else:
            key = key_of(signature, attributes)
        if key is not None:
            bucket = table.get(key)
            if bucket is not None:
                # (the bucket's first test, inline: every notification
                # comes here)
                if bucket.cells is None:
                    found.extend(bucket.entries.values())
                else:
                    _select_bucket_in_python(bucket, attributes, found, numbers)


#: A look-up's compiled functions (elvin/protocols/_elvin_xdr.c, ABI 5)
#: when built and ELVIN_PURE_PYTHON is not set (``xdr.accelerator``), else
#: their twins in Python: the bucket's look-up, the look-up of the buckets
#: by values, the cell filter, and the packing of an entry's bounds.
_select_bucket = _select_bucket_in_python
_select_by_values = _select_by_values_in_python
_cell_select = _select_in_cell
_pack_bounds = _pack_bounds_in_python
if getattr(_xdr.accelerator, "ABI", None) == 5:
    _select_bucket = _xdr.accelerator.bucket_select
    _select_by_values = _xdr.accelerator.values_select
    _cell_select = _xdr.accelerator.cell_select
    _pack_bounds = _xdr.accelerator.pack_bounds


class SubscriptionIndex:
    """Holds subscription entries (objects with ``id``, ``subscription``)."""

    def __init__(self):
        # signature (tuple of names) -> {tuple of keys: _Bucket}
        self._by_values = {}
        # name -> _Bucket
        self._by_name = {}
        self._always = _Bucket()
        self._where = {}
        # id -> range_constraints of the entries added with a tree of their
        # own (removal finds their grid cells by them; the others' come
        # from their subscription)
        self._tree_ranges = {}
        # ids of the ORs filed in several buckets (``_spread_out``): while
        # there are any, ``candidates`` removes repeats.
        self._spread = set()

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
            ranges = self._tree_ranges[entry.id] = range_constraints(tree)
        if kind == "always" and self._spread_out(entry, tree):
            return
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

    def _spread_out(self, entry, tree):
        """File an OR that has no access key as a whole (``M == 1 || N ==
        "s"``) under each disjunct's, so that it is a candidate only where
        one of them may be true, not for every notification. False (filed
        nowhere) when a disjunct has no access key of its own, or the OR
        would take more than ``MAX_SPREAD`` buckets."""
        if tree is None:
            tree = entry.subscription.ast
        if tree.kind != Kind.OR:
            return False
        accesses = []
        for part in or_parts(tree):
            kind, where, keys = self._access(equality_constraints(part),
                                             lambda part=part: required_names(part))
            if kind == "always":
                return False
            if kind == "values":
                accesses.extend((where, key) for key in keys)
            elif kind == "name":
                accesses.append((True, where))
            if len(accesses) > MAX_SPREAD:
                return False
        if not accesses:
            return False                   # no disjunct can be true: "always" as before
        buckets = []
        for where, key in accesses:
            bucket = self._bucket(where, key)
            if bucket not in buckets:
                bucket.add(entry, None)    # no ranges: loose in a grid
                buckets.append(bucket)
        self._where[entry.id] = tuple(buckets)
        self._spread.add(entry.id)
        return True

    def remove(self, entry):
        # Its bucket, or a tuple of its buckets: shared objects, no record
        # of its own.
        placed = self._where.pop(entry.id, None)
        if placed is None:
            return
        ranges = self._tree_ranges.pop(entry.id, None)
        buckets = (placed,) if placed.__class__ is _Bucket else placed
        if entry.id in self._spread:
            self._spread.discard(entry.id)
            ranges = {}                    # filed loose wherever there is a grid
        for bucket in buckets:
            if ranges is None and bucket.cells is not None:
                ranges = entry.subscription.index_facts()[2]
            bucket.remove(entry, ranges)
            if not bucket:
                self._forget(bucket)

    def move_to(self, entry, other):
        """Take ``entry`` out of this index and file it in ``other`` (a
        SubscriptionIndex) where it was filed here. When it sits in one
        bucket with no grid, that bucket's key and the range constraints
        it keeps say where, so nothing is worked out again from its
        expression (a subscription of a shape of its own would rebuild its
        tree: about 30 µs, against 2); else as ``remove`` then ``add``."""
        placed = self._where.get(entry.id)
        if (placed.__class__ is not _Bucket or placed.cells is not None
                or entry.id in self._spread or entry.id in self._tree_ranges):
            self.remove(entry)
            other.add(entry)
            return
        ranges = placed.ranges.get(entry.id)
        signature, key = placed.signature, placed.key
        self.remove(entry)
        bucket = other._always if signature is None else other._bucket(signature, key)
        bucket.add(entry, ranges)
        other._where[entry.id] = bucket

    def _bucket(self, signature, key):
        """The bucket of ``key`` by name (``signature`` True) or by the
        values of the names ``signature``, made if there is none."""
        if signature is True:
            bucket = self._by_name.get(key)
            if bucket is None:
                self._by_name[key] = bucket = _Bucket(key, True)
        else:
            table = self._by_values.setdefault(signature, {})
            bucket = table.get(key)
            if bucket is None:
                table[key] = bucket = _Bucket(key, signature)
        return bucket

    def _forget(self, bucket):
        """Take an emptied bucket out of its table (the "always" one stays)."""
        signature = bucket.signature
        if signature is True:
            del self._by_name[bucket.key]
        elif signature is not None:
            table = self._by_values[signature]
            del table[bucket.key]
            if not table:
                del self._by_values[signature]

    # -- lookup -----------------------------------------------------------------

    def candidates(self, attributes):
        """Entries that may match ``attributes`` (a normalised dict: the
        compiled look-up takes no other mapping)."""
        found: list = []
        if self._always.count:
            _select_bucket(self._always, attributes, found, _NUMBERS)
        by_name = self._by_name
        if by_name:
            if len(by_name) < len(attributes):
                for name, bucket in by_name.items():
                    if name in attributes:
                        _select_bucket(bucket, attributes, found, _NUMBERS)
            else:
                for name in attributes:
                    bucket = by_name.get(name)
                    if bucket is not None:
                        _select_bucket(bucket, attributes, found, _NUMBERS)
        if self._by_values:
            _select_by_values(self._by_values, attributes, found, _NUMBERS, _key)
        if self._spread and len(found) > 1:
            return list(dict.fromkeys(found))
        return found

    def all_entries(self):
        """Every filed entry (each once)."""
        seen = {}
        for bucket in self._always, *self._by_name.values():
            seen.update(bucket.all_entries())
        for table in self._by_values.values():
            for bucket in table.values():
                seen.update(bucket.all_entries())
        return seen.values()
