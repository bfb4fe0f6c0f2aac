"""The matching index never loses a match, and files subscriptions sensibly."""

import random

from hypothesis import given, settings, strategies as st
from twisted.trial import unittest

from elvin.core.index import SubscriptionIndex
from elvin.subscription import Subscription
from elvin.subscription.analysis import equality_constraints, required_names
from elvin.values import Int64, normalise


class Entry:
    def __init__(self, sub_id, expression):
        self.id = sub_id
        self.subscription = Subscription(expression)
        self.evaluate = self.subscription.evaluator


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
    if not parts:
        parts.append("n > 10")
    text = " && ".join(parts)
    if draw(st.integers(0, 9)) == 0:
        text = f"({text}) || m == 1"
    return text


_NUMBER_VALUES = st.one_of(st.integers(-60, 1060), st.integers(-60, 1060).map(Int64),
                           st.floats(-60, 1060), st.sampled_from(
                               [float("nan"), float("inf"), float("-inf"), -0.0, 0,
                                9223372036854775807, Int64(9223372036854775807), "5", b"5"]))


class GridTests(unittest.TestCase):
    """Buckets past GRID_FROM entries select by a numeric attribute's cell."""

    @settings(max_examples=120)
    @given(st.lists(_ranged_expression(), min_size=20, max_size=80),
           st.lists(st.fixed_dictionaries({"s": st.sampled_from(["a", "b"])},
                                          optional={"n": _NUMBER_VALUES, "m": _NUMBER_VALUES,
                                                    "x": st.just(1)}),
                    min_size=1, max_size=8),
           st.randoms(use_true_random=False))
    def test_never_loses_a_match(self, expressions, notifications, rng):
        index = SubscriptionIndex()
        entries = []
        for i, text in enumerate(expressions):
            try:
                entries.append(Entry(i + 1, text))
            except Exception:
                continue            # constant or refused: not a subscription
        for entry in entries:
            index.add(entry)
        removed = set(rng.sample(range(len(entries)), len(entries) // 3))
        for i in removed:
            index.remove(entries[i])
        live = [e for i, e in enumerate(entries) if i not in removed]
        for note in notifications:
            attrs = normalise(note)
            ids = [c.id for c in index.candidates(attrs)]
            self.assertEqual(len(ids), len(set(ids)), "a candidate was produced twice")
            expected = {e.id for e in live if e.evaluate(attrs) is True}
            self.assertTrue(expected <= set(ids), f"{note}: lost {expected - set(ids)}")
            self.assertFalse(set(ids) & {entries[i].id for i in removed})

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
