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

    @settings(max_examples=300, deadline=None)
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
