"""The generated fast evaluator agrees with the closure compiler everywhere."""

from hypothesis import given, settings, strategies as st
from twisted.trial import unittest

from elvin.subscription import compiler, parse
from elvin.values import Int64, normalise

ATOMS = ["x == 1", "x != 1", "x < 2", "x <= 2.5", "x > -1L", "x >= 0.0",
         "x == -0.0", "0.0 < x", "x == 'a'", "x != 'a'", "y == 'b'", "y > 3",
         "require(z)", "x + 1 > 2", "!(y == 'a')", "begins-with(y, 'a')",
         "x == 9007199254740993L", "x < 1.0e300"]
VALUES = [0, 1, 2, -1, Int64(1), Int64(9007199254740993), 0.0, -0.0, 2.5,
          float("nan"), float("inf"), 9007199254740992.0, "a", "b", b"a"]


class CodegenEquivalenceTests(unittest.TestCase):
    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.sampled_from(ATOMS), min_size=1, max_size=5),
           st.sampled_from([" && ", " || "]),
           st.lists(st.dictionaries(st.sampled_from(["x", "y", "z"]),
                                    st.sampled_from(VALUES)), min_size=1, max_size=8))
    def test_same_result(self, atoms, joiner, notifications):
        tree = parse(joiner.join(f"({a})" for a in atoms))
        generated = compiler._generate(tree)
        reference = compiler._compile(tree).fn
        if generated is None:
            return
        for note in notifications:
            attrs = normalise(note)
            self.assertIs(generated(attrs), reference(attrs), f"{atoms} {note}")

    def test_used_for_conjunctions(self):
        tree = parse("x == 1 && y > 2")
        self.assertIsNotNone(compiler._generate(tree))
        self.assertIsNone(compiler._generate(parse("require(x) && y + 1 > 2")))
