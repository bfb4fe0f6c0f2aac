"""The matching index never loses a match, and files subscriptions sensibly."""

import math
import random
import struct

from hypothesis import given, settings, strategies as st
from twisted.trial import unittest

from elvin.core import index as index_module
from elvin.core.index import SubscriptionIndex
from elvin.subscription import Subscription
from elvin.subscription.analysis import equality_constraints, range_constraints, required_names
from elvin.values import Int64, normalise


_EDGES = st.sampled_from([-0.0, 0.0, 2.0 ** 53 + 2, 3.4028234663852886e38,
                          3.4028235677973366e38, -3.4028235677973366e38, 1e39, -1e39,
                          5e-324, -5e-324, 1e-46, -1e-46, 0.1, float("inf"), float("-inf")])


def _check_outward(test, lo, hi):
    f32 = struct.Struct("f")
    low, high = struct.unpack("2f", index_module._pack_bounds_in_python(lo, hi))
    test.assertLessEqual(low, lo)
    test.assertGreaterEqual(high, hi)
    for got, wanted, inward in ((low, lo, True), (high, hi, False)):
        if math.isinf(got):
            # only past the largest float32 on its own side (or inf)
            test.assertTrue(math.isinf(wanted) or abs(wanted) > 3.4028234663852886e38)
        elif got != wanted:
            step = index_module._f32_step(got, inward)     # the next float32 inward
            test.assertEqual(step, f32.unpack(f32.pack(step))[0])
            test.assertTrue(step > wanted if inward else step < wanted, (got, wanted, step))


class Entry:
    def __init__(self, sub_id, expression):
        self.id = sub_id
        self.subscription = Subscription(expression)
        self.evaluate = self.subscription.evaluator


class TreeEntry:
    """Filed with a tree of its own and no subscription (as the router's
    pull entries are)."""

    def __init__(self, sub_id, expression):
        self.id = sub_id
        self.tree = Subscription(expression).ast
        self.evaluate = Subscription(expression).evaluator


class BoundsTests(unittest.TestCase):

    @settings(max_examples=400, deadline=None)
    @given(st.one_of(st.floats(allow_nan=False), st.floats(-3, 3), _EDGES),
           st.floats(allow_nan=False))
    def test_bounds_are_rounded_outward_to_the_nearest_float32s(self, lo, hi):
        # A cell keeps its entries' bounds as float32s: each the nearest
        # one at or past the bound, outward, so a value within a bound is
        # within it rounded so.
        _check_outward(self, lo, hi)

    def test_rounding_outward_at_the_edges(self):
        for lo in _EDGES.elements:
            for hi in _EDGES.elements:
                _check_outward(self, lo, hi)


class AnalysisTests(unittest.TestCase):
    def names(self, text):
        return required_names(Subscription(text).ast)

    def eqs(self, text):
        return equality_constraints(Subscription(text).ast)

    def test_required_names(self):
        self.assertEqual(self.names("a == 1 && b > 2"), {"a", "b"})
        self.assertEqual(self.names("a == 1 || b > 2"), set())
        self.assertEqual(self.names("(a == 1 && c == 1) || (a == 2 && b == 1)"), {"a"})
        self.assertEqual(self.names("!(a == 1)"), {"a"})
        self.assertEqual(self.names("!(a == 1 || b == 1)"), {"a", "b"})
        self.assertEqual(self.names("!(a == 1 && b == 1)"), set())
        self.assertEqual(self.names("a == 1 ^^ b == 1"), {"a", "b"})
        self.assertEqual(self.names("equals(a, b, 1)"), {"a"})
        self.assertEqual(self.names("begins-with(fold-case(a), 'x')"), {"a"})
        self.assertEqual(self.names("a + b * c > 1"), {"a", "b", "c"})

    def test_equality_constraints(self):
        self.assertEqual(self.eqs('s == "a" && n == 3 && x > 1'), {"s": {"a"}, "n": {3.0}})
        self.assertEqual(self.eqs('s == "a" || s == "b"'), {"s": {"a", "b"}})
        self.assertEqual(self.eqs('s == "a" || t == "b"'), {})
        self.assertEqual(self.eqs("equals(n, 1, 2L, 3.5)"), {"n": {1.0, 2.0, 3.5}})
        self.assertEqual(self.eqs("s != 'a'"), {})
        self.assertEqual(self.eqs("s == 'a' && s == 'b'"), {"s": set()})
        self.assertEqual(self.eqs("!(s == 'a')"), {})


EXPRESSIONS = [
    's == "a"', 's == "b"', 's == "a" && n == 1', 's == "a" || s == "b"',
    "n == 1", "n == 1L", "n == 1.0", "n > 2", "n < 2 || s == 'b'",
    "equals(s, 'a', 'c')", "equals(n, 1, 2, 3)", "require(x)", "!require(x)",
    "!(s == 'a')", "s != 'a'", "n != 1", "x == 'a' ^^ n == 2",
    "begins-with(s, 'a')", "size(s) > 0", "int64(n)", "real64(n)",
    "s == 'a' && s == 'b'", "(s == 'a' && n == 1) || (s == 'b' && n == 2)",
    "!(n == 1 || x == 'a')", "n + 1 == 2", "nan(n)", "n == 2 && x == 'a'",
    "s == 'a' || x == 'b'", "require(x) || n == 2", "(s == 'a' && n == 1) || x == 'a' || n > 2",
    "s == 'a' || !require(n)", "equals(s, 'a', 'b') || n == 3 || require(x)",
]

VALUES = ["a", "b", "c", 1, 2, 3, Int64(1), 1.0, 2.5, float("nan"), b"a", -0.0, 0]


class IndexCompletenessTests(unittest.TestCase):
    def check(self, expressions, notifications):
        index = SubscriptionIndex()
        entries = [Entry(i + 1, e) for i, e in enumerate(expressions)]
        for entry in entries:
            index.add(entry)
        for note in notifications:
            attrs = normalise(note)
            expected = {e.id for e in entries if e.evaluate(attrs) is True}
            candidates = index.candidates(attrs)
            ids = [c.id for c in candidates]
            self.assertEqual(len(ids), len(set(ids)), "a candidate was produced twice")
            self.assertTrue(expected <= set(ids),
                            f"{note}: lost {expected - set(ids)}")

    @settings(max_examples=300)
    @given(st.lists(st.sampled_from(EXPRESSIONS), min_size=1, max_size=12),
           st.lists(st.dictionaries(st.sampled_from(["s", "n", "x"]),
                                    st.sampled_from(VALUES), min_size=1),
                    min_size=1, max_size=6))
    def test_never_loses_a_match(self, expressions, notifications):
        self.check(expressions, notifications)

    def test_remove(self):
        index = SubscriptionIndex()
        entries = [Entry(i + 1, e) for i, e in enumerate(EXPRESSIONS)]
        for entry in entries:
            index.add(entry)
        self.assertEqual(len(index), len(EXPRESSIONS))
        for entry in entries:
            index.remove(entry)
        self.assertEqual(len(index), 0)
        self.assertEqual(list(index.all_entries()), [])
        self.assertEqual(index.candidates({"s": "a", "n": 1, "x": "a"}), [])

    @settings(max_examples=200)
    @given(st.lists(st.sampled_from(EXPRESSIONS), min_size=1, max_size=40),
           st.lists(st.booleans(), min_size=40, max_size=40),
           st.lists(st.dictionaries(st.sampled_from(["s", "n", "x"]),
                                    st.sampled_from(VALUES), min_size=1),
                    min_size=1, max_size=6))
    def test_entries_moved_to_another_index_are_filed_there_as_here(self, expressions,
                                                                   moving, notifications):
        # What the router does with a heavy client's subscriptions: each
        # index then gives the candidates an index of its entries alone
        # would, and together they lose no match.
        here, there = SubscriptionIndex(), SubscriptionIndex()
        entries = [Entry(i + 1, e) for i, e in enumerate(expressions)]
        for entry in entries:
            here.add(entry)
        moved = [e for e, m in zip(entries, moving) if m]
        for entry in moved:
            here.move_to(entry, there)
        stayed = [e for e, m in zip(entries, moving) if not m]
        self.assertEqual((len(here), len(there)), (len(stayed), len(moved)))
        for held, index in ((stayed, here), (moved, there)):
            fresh = SubscriptionIndex()
            for entry in held:
                fresh.add(entry)
            for note in notifications:
                attrs = normalise(note)
                self.assertEqual(sorted(c.id for c in index.candidates(attrs)),
                                 sorted(c.id for c in fresh.candidates(attrs)), note)
        for entry in moved:
            there.remove(entry)
        self.assertEqual(len(there), 0)
        self.assertEqual(list(there.all_entries()), [])

    def test_an_or_of_different_names_is_a_candidate_only_where_a_disjunct_may_hold(self):
        """``M == 1 || N == "s"`` has no access key as a whole; filed under
        each disjunct's, a notification naming neither does not reach it."""
        index = SubscriptionIndex()
        entries = [Entry(i + 1, f'M == {i} || N == "s{i}"') for i in range(1000)]
        for entry in entries:
            index.add(entry)
        self.assertEqual(index.candidates(normalise({"BY": "probe"})), [])
        self.assertEqual([c.id for c in index.candidates(normalise({"M": 7}))], [8])
        both = index.candidates(normalise({"M": 7, "N": "s7"}))
        self.assertEqual([c.id for c in both], [8])           # once, not twice
        for entry in entries:
            index.remove(entry)
        self.assertEqual(len(index), 0)
        self.assertEqual((index._by_name, index._by_values, index._spread), ({}, {}, set()))

    def test_an_or_over_more_buckets_than_max_spread_stays_in_always(self):
        from elvin.core.index import MAX_SPREAD
        index = SubscriptionIndex()
        index.add(Entry(1, " || ".join(f"n{i} == {i}" for i in range(MAX_SPREAD + 1))))
        index.add(Entry(2, " || ".join(f"n{i} == {i}" for i in range(MAX_SPREAD))))
        self.assertEqual([c.id for c in index.candidates(normalise({"BY": 1}))], [1])

    def test_selective(self):
        index = SubscriptionIndex()
        rng = random.Random(1)
        for i in range(2000):
            index.add(Entry(i + 1, f's1 == "sym-{rng.randrange(100):03d}" && '
                                   f's2 == "ex-{rng.randrange(10)}" && i1 > {rng.randrange(1000)}'))
        candidates = index.candidates({"s1": "sym-007", "s2": "ex-3", "i1": 5})
        self.assertLess(len(candidates), 20)


def _bound_text(draw_op, name, literal, flip):
    return f"{literal} {draw_op} {name}" if flip else f"{name} {draw_op} {literal}"


_LITERALS = st.one_of(st.integers(-50, 1050).map(str), st.integers(-50, 1050).map(lambda i: f"{i}L"),
                      st.floats(-50, 1050, allow_nan=False).map(lambda f: f"{f:.2f}"),
                      st.sampled_from(["0", "-0.0", "9223372036854775807L", "2147483647"]))
_OPS = st.sampled_from([">", ">=", "<", "<=", "=="])


@st.composite
def _ranged_expression(draw):
    """Mostly conjunctions bounding n (sometimes twice, sometimes one side,
    literal on either side), some with other operands, a few unbounded."""
    parts = []
    if draw(st.booleans()):
        parts.append(f's == "{draw(st.sampled_from("ab"))}"')
    if draw(st.integers(0, 3)):
        low = draw(st.integers(-50, 1000))
        parts.append(f"n >= {low} && n < {low + draw(st.integers(0, 200))}")
    for _ in range(draw(st.integers(0, 2))):
        op = draw(_OPS)
        parts.append(_bound_text(op, draw(st.sampled_from(["n", "n", "m"])), draw(_LITERALS),
                                 draw(st.booleans())))
    if draw(st.integers(0, 4)) == 0:
        parts.append(draw(st.sampled_from(["require(x)", "n != 5", "!(n < 3)", "m + 1 > 2"])))
    return _conjunction(draw, parts, "n > 10", "m == 1")


def _conjunction(draw, parts, default, alternative):
    """``parts`` (or ``default``) joined by ``&&``; one time in ten, that
    or ``alternative`` (in parentheses, to be one operand of an ``&&``)."""
    text = " && ".join(parts or [default])
    if draw(st.integers(0, 9)) == 0:
        text = f"(({text}) || {alternative})"
    return text


_NUMBER_VALUES = st.one_of(st.integers(-60, 1060), st.integers(-60, 1060).map(Int64),
                           st.floats(-60, 1060), st.sampled_from(
                               [float("nan"), float("inf"), float("-inf"), -0.0, 0,
                                9223372036854775807, Int64(9223372036854775807), "5", b"5"]))


def _entries(expressions, make):
    """``make(id, text)`` for each expression that is a subscription."""
    entries = []
    for i, text in enumerate(expressions):
        try:
            entries.append(make(i + 1, text))
        except Exception:
            continue            # constant or refused: not a subscription
    return entries


def _file_remove_and_check(test, entries, notifications, rng):
    """File ``entries`` (by their own tree when they have one), remove a
    third, and check that the index holds the rest and gives each
    notification every live match as a candidate, once, and nothing
    removed. Returns the index and the live entries."""
    index = SubscriptionIndex()
    for entry in entries:
        index.add(entry, getattr(entry, "tree", None))
    removed = set(rng.sample(range(len(entries)), len(entries) // 3))
    for i in removed:
        index.remove(entries[i])
    live = [e for i, e in enumerate(entries) if i not in removed]
    test.assertEqual(len(index), len(live))
    # every entry filed (one never true, e.g. "m == 0 && m == 1", is not)
    filed = [e.id for e in index.all_entries()]
    test.assertEqual(len(filed), len(set(filed)))
    test.assertLessEqual(set(filed), {e.id for e in live})
    gone = {entries[i].id for i in removed}
    for note in notifications:
        attrs = normalise(note)
        ids = [c.id for c in index.candidates(attrs)]
        test.assertEqual(len(ids), len(set(ids)), "a candidate was produced twice")
        expected = {e.id for e in live if e.evaluate(attrs) is True}
        test.assertTrue(expected <= set(ids), f"{note}: lost {expected - set(ids)}")
        test.assertLessEqual(expected, set(filed))
        test.assertFalse(set(ids) & gone)
    return index, live


class GridTests(unittest.TestCase):
    """Buckets past GRID_FROM entries select by a numeric attribute's cell."""

    @settings(max_examples=120, deadline=None)
    @given(st.lists(_ranged_expression(), min_size=20, max_size=80),
           st.lists(st.fixed_dictionaries({"s": st.sampled_from(["a", "b"])},
                                          optional={"n": _NUMBER_VALUES, "m": _NUMBER_VALUES,
                                                    "x": st.just(1)}),
                    min_size=1, max_size=8),
           st.randoms(use_true_random=False))
    def test_never_loses_a_match(self, expressions, notifications, rng):
        _file_remove_and_check(self, _entries(expressions, lambda i, text: Entry(i, text)),
                               notifications, rng)

    def test_a_grid_is_selective(self):
        index = SubscriptionIndex()
        rng = random.Random(2)
        for i in range(1000):
            lo = rng.randrange(900)
            index.add(Entry(i + 1, f's1 == "x" && i1 >= {lo} && i1 < {lo + 100}'))
        for value in (5, 500, 999, 1.5):
            found = index.candidates({"s1": "x", "i1": value})
            self.assertLess(len(found), 250)
            self.assertGreater(len(found), 0)
        self.assertEqual(index.candidates({"s1": "x", "i1": "text"}), [])
        self.assertEqual(index.candidates({"s1": "x", "i1": float("nan")}), [])

    def test_a_small_bucket_is_selective(self):
        # Equality on two attributes spreads many subscriptions a few to a
        # bucket; those buckets too select by the ranges' cells.
        index = SubscriptionIndex()
        rng = random.Random(3)
        for i in range(10):
            lo1, lo2 = rng.randrange(780), rng.randrange(780)
            index.add(Entry(i + 1, f's1 == "x" && s2 == "y" && i1 >= {lo1} && i1 < {lo1 + 220}'
                                   f' && i2 >= {lo2} && i2 < {lo2 + 220}'))
        counts = [len(index.candidates({"s1": "x", "s2": "y", "i1": a, "i2": b}))
                  for a in range(0, 1000, 50) for b in range(0, 1000, 50)]
        self.assertLess(sum(counts) / len(counts), 5)

    def test_range_constraints(self):
        from elvin.subscription.analysis import range_constraints

        def ranges(text):
            return range_constraints(Subscription(text).ast)
        inf = float("inf")
        self.assertEqual(ranges("n >= 1 && n < 5 && m > 2.5"), {"n": (1.0, 5.0), "m": (2.5, inf)})
        self.assertEqual(ranges("3 < n"), {"n": (3.0, inf)})
        self.assertEqual(ranges("n == 7L"), {"n": (7.0, 7.0)})
        self.assertEqual(ranges("n > 5 && n < 1"), {"n": (5.0, 1.0)})
        self.assertEqual(ranges("n > 1 || n < 0"), {})
        self.assertEqual(ranges("!(n > 1)"), {})
        self.assertEqual(ranges("n != 1 && n + 1 > 2"), {})


@st.composite
def _two_range_expression(draw):
    """Mostly conjunctions bounding n and m on both sides (as the
    benchmark's i1 and i2: the grid's two attributes), some only n (filed
    in the grid's rows) or one side, a few never true or unbounded."""
    parts = []
    for name, both in (("n", 6), ("m", 5)):
        kind = draw(st.integers(0, 7))
        if kind <= both:
            low = draw(st.integers(-50, 1000))
            parts.append(f"{name} >= {low} && {name} <= {low + draw(st.integers(0, 150))}")
        elif kind == 6:
            parts.append(_bound_text(draw(_OPS), name, draw(_LITERALS), draw(st.booleans())))
    kind = draw(st.integers(0, 4))     # a third attribute, k: its bounds kept in the cells
    if kind <= 1:
        low = draw(_LITERALS)
        parts.append(f"k >= {low} && k < {draw(_LITERALS)}")
    elif kind <= 3:
        parts.append(_bound_text(draw(_OPS), "k", draw(_LITERALS), draw(st.booleans())))
    if draw(st.integers(0, 7)) == 0:
        parts.append(draw(st.sampled_from(["n > 5 && n < 1", "require(x)", "m != 5",
                                           "n >= 9223372036854775000L"])))
    return _conjunction(draw, parts, "m < 10", "x == 1")


def _real(x):
    """A real64 literal for ``x`` (the language has no exponents)."""
    return f"{x:.1f}"


def _in_python(test):
    """Have the index look up in pure Python for the rest of ``test``."""
    test.patch(index_module, "_select_bucket", index_module._select_bucket_in_python)
    test.patch(index_module, "_select_by_values", index_module._select_by_values_in_python)
    test.patch(index_module, "_cell_select", index_module._select_in_cell)


class TwoAttributeGridTests(unittest.TestCase):
    """A bucket whose entries bound two numeric attributes gets a grid
    over both; those bound on only the first are filed by it alone."""

    def grid_of(self, index, key):
        bucket = index._by_values[("s",)][(key,)]
        return bucket.grid

    @settings(max_examples=150, deadline=None)
    @given(st.lists(_two_range_expression(), min_size=20, max_size=90),
           st.lists(st.fixed_dictionaries({"s": st.just("a")},
                                          optional={"n": _NUMBER_VALUES, "m": _NUMBER_VALUES,
                                                    "k": _NUMBER_VALUES, "x": st.just(1)}),
                    min_size=1, max_size=8),
           st.randoms(use_true_random=False))
    def test_never_loses_a_match(self, expressions, notifications, rng):
        # Some filed by a tree given with them (as the pull index does),
        # whose ranges the index keeps for removal.
        def make(i, text):
            kind = TreeEntry if rng.random() < 0.25 else Entry
            return kind(i, f's == "a" && {text}')
        index, live = _file_remove_and_check(self, _entries(expressions, make),
                                             notifications, rng)
        for entry in live:
            index.remove(entry)
        self.assertEqual(len(index), 0)
        self.assertEqual(index.candidates({"s": "a", "n": 1, "m": 1}), [])

    def test_two_attributes_are_more_selective_than_one(self):
        index = SubscriptionIndex()
        rng = random.Random(3)
        entries = []
        for i in range(1000):
            lo1, lo2 = rng.randrange(900), rng.randrange(900)
            entries.append(Entry(i + 1, f's == "a" && i1 >= {lo1} && i1 < {lo1 + 100} && '
                                        f'i2 >= {lo2} && i2 < {lo2 + 100}'))
            index.add(entries[-1])
        grid = self.grid_of(index, "a")
        self.assertEqual({grid.name, grid.name2}, {"i1", "i2"})
        notes = [{"s": "a", "i1": rng.randrange(1000), "i2": rng.uniform(0, 1000)}
                 for _ in range(50)]
        found = sum(len(index.candidates(n)) for n in notes) / len(notes)
        # One attribute's cells (as wide as an interval) give about 200.
        self.assertLess(found, 120)
        for note in notes:
            ids = {c.id for c in index.candidates(note)}
            self.assertTrue({e.id for e in entries if e.evaluate(note) is True} <= ids)
        # Without a number for the second attribute: no cell, nothing loose.
        self.assertEqual(index.candidates({"s": "a", "i1": 5}), [])
        self.assertEqual(index.candidates({"s": "a", "i1": 5, "i2": float("nan")}), [])

    def test_cells_sharing_a_key_select_by_bounds(self):
        # Cells (0, 2**32) and (1, 0) share a key: each entry is filed in
        # it once, and its bounds there tell them apart.
        index = SubscriptionIndex()
        filler = [Entry(i + 1, f's == "a" && m >= {10 + 4 * i} && m <= {11 + 4 * i} && '
                               'n >= 0 && n <= 1') for i in range(20)]
        for entry in filler:
            index.add(entry)
        grid = self.grid_of(index, "a")
        self.assertEqual((grid.name, grid.name2), ("m", "n"))
        far_n = math.ceil(2 ** 32 * grid.width2)        # n's cell 2**32
        self.assertEqual(math.floor(far_n / grid.width2), 2 ** 32)
        near_m = grid.width * 1.25                       # m's cell 1
        far = Entry(100, f's == "a" && m >= 0 && m <= 0.5 && n >= {far_n}L && n <= {far_n}L')
        near = Entry(101, f's == "a" && m >= {near_m} && m <= {near_m} && n >= 0 && n <= 1')
        index.add(far)
        index.add(near)
        for note, match in (({"s": "a", "m": near_m, "n": 0}, near),
                            ({"s": "a", "m": 0, "n": far_n}, far)):
            self.assertEqual([c.id for c in index.candidates(note)], [match.id])
            self.assertIs(match.evaluate(normalise(note)), True)
        index.remove(far)
        self.assertEqual([c.id for c in index.candidates({"s": "a", "m": near_m, "n": 0})],
                         [101])

    def test_empty_rows_and_loose_are_none(self):
        # A look-up reads a grid's rows and loose entries only when there
        # are some: while empty they are None, not empty dicts.
        index = SubscriptionIndex()
        entries = [Entry(i + 1, f's == "a" && n >= {10 * i} && n <= {10 * i + 5} && '
                                f'm >= {10 * i} && m <= {10 * i + 5}') for i in range(8)]
        for entry in entries:
            index.add(entry)
        grid = self.grid_of(index, "a")
        self.assertEqual((grid.rows, grid.loose), (None, None))
        # (and so is the look-up's tuple of them)
        self.assertEqual(grid.look, (grid.cells, None, None, grid.name, grid.width,
                                     grid.name2, grid.width2, grid.name3))
        row = Entry(20, 's == "a" && m >= 0 && m <= 5')
        loose = Entry(21, 's == "a" && m >= 0')
        for entry in row, loose:
            index.add(entry)
        self.assertEqual((list(grid.rows.values()), list(grid.loose.values())),
                         ([[row]], [loose]))
        self.assertEqual(grid.look[:3], (grid.cells, grid.loose, grid.rows))
        self.assertEqual({e.id for e in index.candidates({"s": "a", "m": 1, "n": 1})},
                         {1, 20, 21})
        for entry in row, loose:
            index.remove(entry)
        self.assertEqual((grid.rows, grid.loose), (None, None))
        self.assertEqual(grid.look[:3], (grid.cells, None, None))
        self.assertEqual([e.id for e in index.candidates({"s": "a", "m": 1, "n": 1})], [1])
        self.assertEqual(len(index.all_entries()), 8)

    def test_a_look_up_reaches_few_objects(self):
        # The grid is its bucket's own (no second object to reach), a
        # cell is one tuple, and grids of equal cell widths share the
        # width objects; filing and removal keep the tuples exact.
        index = SubscriptionIndex()
        entries = {key: [Entry(i + 1 + (key == "b") * 100,
                               f's == "{key}" && n >= {7 * i} && n <= {7 * i + 219} && '
                               f'm >= {5 * i} && m <= {5 * i + 219}') for i in range(12)]
                   for key in ("a", "b")}
        for entry in entries["a"] + entries["b"]:
            index.add(entry)
        grids = [self.grid_of(index, key) for key in ("a", "b")]
        self.assertIs(grids[0], index._by_values[("s",)][("a",)])
        self.assertIs(grids[0].width, grids[1].width)
        self.assertIs(grids[0].width2, grids[1].width2)
        for entry in entries["a"][::3]:
            index.remove(entry)
        cells = list(grids[0].cells.values())
        self.assertTrue(cells)
        self.assertTrue(all(cell.__class__ is tuple and len(cell) > 1 for cell in cells))
        kept = {e.id for e in entries["a"]} - {e.id for e in entries["a"][::3]}
        # the entries' bounds on the two attributes in one bytes object (4
        # float32s an entry), then the entries
        self.assertTrue(all(cell[0].__class__ is bytes and len(cell[0]) == 16 * (len(cell) - 1)
                            for cell in cells))
        self.assertEqual({e.id for cell in cells for e in cell[1:]}, kept)
        self.assertEqual(sum(len(cell[1:]) for cell in cells),
                         sum(len(set(cell[1:])) for cell in cells))
        grid = grids[0]
        for cell in cells:
            bounds = struct.unpack(f"{4 * (len(cell) - 1)}f", cell[0])
            for i, entry in enumerate(cell[1:]):
                ranges = range_constraints(entry.subscription.ast)
                lo, hi = ranges[grid.name]
                lo2, hi2 = ranges[grid.name2]
                self.assertEqual(bounds[4 * i:4 * i + 4],
                                 (*index_module._outward(lo / grid.width, hi / grid.width),
                                  *index_module._outward(lo2 / grid.width2, hi2 / grid.width2)))

    def test_removal_finds_an_entry_its_ranges_no_longer_place(self):
        index = SubscriptionIndex()
        # entries 1-40 in cells of m and n, 41-45 in the rows of m
        entries = [Entry(i + 1, f's == "a" && n >= {10 * i} && n <= {10 * i + 5} && '
                                f'm >= {10 * i} && m <= {10 * i + 5}') for i in range(40)]
        entries += [Entry(41 + i, f's == "a" && m >= {10 * i} && m <= {10 * i + 5}')
                    for i in range(5)]
        for entry in entries:
            index.add(entry)
        grid = self.grid_of(index, "a")
        self.assertEqual((grid.name, grid.name2), ("m", "n"))
        self.assertTrue(grid.rows)
        for moved, note in ((entries[7], {"s": "a", "n": 72, "m": 72}),
                            (entries[42], {"s": "a", "n": 1, "m": 22})):
            self.assertIn(moved, index.candidates(note))
            moved.subscription = Subscription('s == "a" && n >= 900 && n <= 905 && '
                                              'm >= 0 && m <= 5')
            index.remove(moved)
            self.assertNotIn(moved, index.candidates(note))
            self.assertNotIn(moved, list(index.all_entries()))
        self.assertEqual(len(index), 43)

    def test_a_third_attribute_is_filtered_by_its_bounds(self):
        # Most entries bound k besides the grid's n and m: a cell keeps
        # their bounds on k (as they are) and gives only the entries whose
        # bounds hold the notification's k, and those with none on k; a
        # k that is not a number, NaN or missing excludes none.
        big = 2 ** 53 + 1
        # (planned at the first four: n and m bound by all, k by half)
        ks = ["", "", "k >= 0.5", "k < -0.0"]
        ks += [f"k >= {lo} && k < {lo + 10}" for lo in range(0, 100, 10)]
        ks += [f"k > {big - 2}L && k <= {big}L"]
        entries = [Entry(i + 1, f's == "a" && n >= 0 && n <= 3 && m >= 0 && m <= 3'
                                + (f" && {k}" if k else "")) for i, k in enumerate(ks)]
        index = SubscriptionIndex()
        for entry in entries:
            index.add(entry)
        grid = self.grid_of(index, "a")
        self.assertEqual(({grid.name, grid.name2}, grid.name3), ({"n", "m"}, "k"))
        unbounded = {1, 2}
        # (bounds are closed: k == 20 is a candidate of k < 20, not a match)
        for k, matches, more in ((15, {3, 6}, ()), (20, {3, 7}, {6}), (19.99, {3, 6}, ()),
                                 (0.5, {3, 5}, ()), (-0.0, set(), {4, 5}), (0, {5}, {4}),
                                 (-1, {4}, ()), (Int64(big), {3, 15}, ()),
                                 (Int64(big + 1), {3}, ()), (float(big), {3, 15}, ()),
                                 (float("inf"), {3}, ()), (float("-inf"), {4}, ())):
            note = {"s": "a", "n": 1, "m": 2, "k": k}
            ids = {c.id for c in index.candidates(note)}
            self.assertEqual(ids, matches | unbounded | set(more), k)
            self.assertEqual({e.id for e in entries if e.evaluate(normalise(note)) is True},
                             matches | unbounded, k)
        for k in (float("nan"), "15", None):
            note = {"s": "a", "n": 1, "m": 2, **({} if k is None else {"k": k})}
            self.assertEqual(len(index.candidates(note)), len(entries), k)
        index.remove(entries[6])
        self.assertEqual({c.id for c in index.candidates({"s": "a", "n": 1, "m": 2, "k": 20})},
                         {3, 6} | unbounded)

    def test_bounds_in_cells_lose_no_match_at_their_edges(self):
        # A cell's bounds are the literals' real64 values over the cell
        # width: an int64 past 2**53, a value of the other numeric type,
        # -0.0 against 0.0, a value on a bound or a cell's edge still
        # gives every match, and a value past an entry's bounds in its
        # cell does not give that entry; with the compiled look-up
        # (when built) and the pure-Python one.
        self.check_bounds_at_their_edges()
        _in_python(self)
        self.check_bounds_at_their_edges()

    def test_a_value_past_every_cell_number(self):
        # Cells a thousandth wide: a value whose number of cells is not a
        # finite real64 (1e306 / 0.0015) lies in no cell and takes only
        # the loose entries, and an entry bound so far is filed loose,
        # with the compiled look-up (when built) and the pure-Python one.
        self.check_a_value_past_every_cell_number()
        _in_python(self)
        self.check_a_value_past_every_cell_number()

    def check_a_value_past_every_cell_number(self):
        # (m before n: the grid's first attribute, then its second)
        texts = [f"m >= {i / 1000} && m <= {(i + 1) / 1000} && n >= 0 && n <= 0.001"
                 for i in range(8)]
        far, farther = _real(1e306), _real(1.1e306)
        texts += [f"m >= {far} && m <= {far} && n >= 0 && n <= 0.001",
                  f"m >= {far} && m <= {far}", "m >= 0 && m <= 0.001 && n >= 0",
                  f"m >= 0 && m <= 0.001 && n >= {far} && n <= {farther}"]
        entries = [Entry(i + 1, f's == "a" && {text}') for i, text in enumerate(texts)]
        index = SubscriptionIndex()
        for entry in entries:
            index.add(entry)
        grid = self.grid_of(index, "a")
        self.assertEqual((grid.name, grid.name2), ("m", "n"))
        # 9 and 10 loose, 11 and 12 in the rows of m
        self.assertEqual(set(grid.loose), {9, 10})
        self.assertEqual({e.id for row in grid.rows.values() for e in row}, {11, 12})
        for m, n, ids in ((1e306, 0.0005, {9, 10}), (0.0005, 1e306, {9, 10, 11, 12}),
                          (0.0005, 1.05e306, {9, 10, 11, 12}), (-1e306, 0.0, {9, 10}),
                          (1.7e308, 1.7e308, {9, 10}), (0.0005, 0.0005, None)):
            note = {"s": "a", "m": m, "n": n}
            found = {c.id for c in index.candidates(note)}
            matches = {e.id for e in entries if e.evaluate(normalise(note)) is True}
            self.assertLessEqual(matches, found, note)
            if ids is not None:
                self.assertEqual(found, ids, note)
        for entry in entries:
            index.remove(entry)
        self.assertEqual(len(index), 0)

    def check_bounds_at_their_edges(self):
        big = 2 ** 53 + 1
        texts = [f"n >= {lo} && n <= {lo + 3} && m >= {lo} && m <= {lo + 3}"
                 for lo in range(0, 40, 4)]
        texts += [f"n >= {big}L && n <= {big}L && m >= 0 && m <= 1",
                  f"n > {big - 2}L && n < {big + 2}L && m >= -0.0 && m <= 0.0",
                  f"n >= {big + 1}L && n <= {big + 3}L && m > 0 && m < 1",
                  "n >= 0.1 && n <= 0.30000000000000004 && m >= -0.0 && m <= -0.0",
                  "n > 2.5 && n < 3 && m >= 1L && m <= 2L",
                  "n == 7 && m == 7.0"]
        entries = [Entry(i + 1, f's == "a" && {text}') for i, text in enumerate(texts)]
        index = SubscriptionIndex()
        for entry in entries:
            index.add(entry)
        grid = self.grid_of(index, "a")
        self.assertEqual({grid.name, grid.name2}, {"n", "m"})
        edges = [k * w for w in (grid.width, grid.width2) for k in range(-1, 12)]
        values = [0, -0.0, 0.0, 1, 1.0, 2.5, 3, 3.0, 7, Int64(7), 0.1 + 0.2, 0.3,
                  big, Int64(big), Int64(big - 1), Int64(big + 1), Int64(big + 2),
                  float(big), float(big + 3), 2.0 ** 53, *edges]
        tight = 0
        for n in values:
            for m in values[:12] + edges:
                note = {"s": "a", "n": n, "m": m}
                ids = [c.id for c in index.candidates(note)]
                matches = [e.id for e in entries if e.evaluate(normalise(note)) is True]
                self.assertLessEqual(set(matches), set(ids), note)
                tight += len(ids) == len(matches)
        self.assertEqual(index.candidates({"s": "a", "n": 1, "m": 3.5}), [])
        self.assertEqual([c.id for c in index.candidates({"s": "a", "n": 1, "m": 3})], [1])
        self.assertGreater(tight, 0)
