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
    @settings(max_examples=400)
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

    def test_a_conjunction_tests_numbers_before_strings(self):
        # The index gives candidates whose string equalities hold already.
        class Reads(dict):
            def get(self, name, default=None):
                self.read.append(name)
                return dict.get(self, name, default)
        evaluate = compiler._generate(parse('s == "a" && n > 1 && t == "b"'))
        attrs = Reads(s="a", n=0, t="b")
        attrs.read = []
        self.assertIs(evaluate(attrs), False)
        self.assertEqual(attrs.read, ["n"])

    def test_a_range_reads_its_attribute_once(self):
        class Reads(dict):
            def get(self, name, default=None):
                self.read.append(name)
                return dict.get(self, name, default)
        for text, values, result in [
                ("n >= 1 && n < 5.5 && m > 0", dict(n=3, m=1), True),
                ("n >= 1 && n < 5.5 && m > 0", dict(n=9.0, m=1), False),
                ("n >= 1 && n < 5.5 && m > 0", dict(n="x", m=1), None),
                ("n < 1 || n > 5 || m == 0", dict(n=3, m=1), False),
                ("n < 1 || n > 5 || m == 0", dict(n=6, m=1), True)]:
            attrs = Reads(values)
            attrs.read = []
            self.assertIs(compiler._generate(parse(text))(attrs), result, text)
            self.assertEqual(attrs.read.count("n"), 1, text)

    def test_used_for_conjunctions(self):
        tree = parse("x == 1 && y > 2")
        self.assertIsNotNone(compiler._generate(tree))
        self.assertIsNone(compiler._generate(parse("require(x) && y + 1 > 2")))


class IntegerLiteralTests(unittest.TestCase):
    """An int32 literal is exactly its real64, so its evaluator keeps no
    real64 copy of it (one default less to copy at each call, and 8 bytes
    less per subscription); an int64 one keeps its copy."""

    def test_an_int32_literal_has_no_real_copy(self):
        evaluate = compiler._generate(parse("n >= 80 && n < 299 && r < 340.5"))
        self.assertEqual(sorted(evaluate.__defaults__), [80, 299, 340.5])
        self.assertEqual([type(v) for v in sorted(evaluate.__defaults__)], [int, int, float])

    def test_an_int64_literal_keeps_its_real_copy(self):
        evaluate = compiler._generate(parse("n < 9007199254740993L"))
        self.assertEqual(sorted(evaluate.__defaults__, key=repr),
                         [9007199254740992.0, 9007199254740993])
        self.assertIs(evaluate(normalise({"n": 9007199254740992.0})), False)

    @settings(max_examples=300)
    @given(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
           st.sampled_from([0, 1, -1, 7, 2147483647, -2147483648]),
           st.lists(st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 0.5, -0.5, 7.0, 6.999,
                                                            2147483647.5, -2147483648.5]),
                              st.integers(-2 ** 31, 2 ** 31 - 1)),
                    min_size=1, max_size=6))
    def test_same_result_as_the_closures(self, op, literal, values):
        tree = parse(f"x {op} {literal} && y > 0")
        generated = compiler._generate(tree)
        reference = compiler._compile(tree).fn
        for value in values:
            attrs = normalise({"x": value, "y": 1})
            self.assertIs(generated(attrs), reference(attrs), f"x {op} {literal}: {value!r}")


LITERALS = ["1", "0", "-1", "2.5", "0.0", "-0.0", "1L", "9007199254740993L",
            "9007199254740992.0", "'a'", "'b'", "'1'", "1.0e300"]


def _by_closures(joiner, comparisons):
    """The operands one closure each, as the compiler builds a short chain."""
    parts = [compiler._compile(parse(c)).fn for c in comparisons]
    stop = joiner == " || "

    def fn(attrs):
        result = not stop
        for part in parts:
            v = part(attrs)
            if v is stop:
                return stop
            if v is None:
                result = None
        return result
    return fn


class MembershipEquivalenceTests(unittest.TestCase):
    """A long chain of comparisons of one attribute becomes a set look-up
    (``compiler._membership``); it decides exactly as one closure per
    comparison would, NaN, signed zeros, large integers and strings
    against numbers included."""

    @settings(max_examples=300)
    @given(st.lists(st.sampled_from(LITERALS), min_size=compiler._SET_MIN, max_size=14),
           st.sampled_from([(" || ", "=="), (" && ", "!=")]),
           st.lists(st.sampled_from(["x == 'b'", "y == 1", "require(z)"]), max_size=2),
           st.lists(st.dictionaries(st.sampled_from(["x", "y", "z"]),
                                    st.sampled_from(VALUES)), min_size=1, max_size=8))
    def test_same_result(self, literals, chain, others, notifications):
        joiner, op = chain
        comparisons = [f"x {op} {literal}" for literal in literals] + others
        compiled = compiler._compile(parse(joiner.join(f"({c})" for c in comparisons))).fn
        reference = _by_closures(joiner, comparisons)
        for note in notifications:
            attrs = normalise(note)
            self.assertIs(compiled(attrs), reference(attrs), f"{comparisons} {note}")

    @settings(max_examples=200)
    @given(st.lists(st.sampled_from(LITERALS), min_size=1, max_size=12),
           st.lists(st.dictionaries(st.sampled_from(["x", "y"]),
                                    st.sampled_from(VALUES)), min_size=1, max_size=8))
    def test_equals_function_same_as_chain(self, literals, notifications):
        compiled = compiler._compile(parse(f"equals(x, {', '.join(literals)})")).fn
        reference = _by_closures(" || ", [f"x == {literal}" for literal in literals])
        for note in notifications:
            attrs = normalise(note)
            self.assertIs(compiled(attrs), reference(attrs), f"{literals} {note}")

    def test_long_chain_is_one_set_test(self):
        """5,000 ids cost one look-up: evaluating does not grow with them."""
        expression = " || ".join(f"id == {i}" for i in range(5000))
        fn = compiler.compile_tree(parse(expression)).fn
        self.assertIs(fn({"id": 4999}), True)
        self.assertIs(fn({"id": 5000}), False)
        self.assertIs(fn({"id": "4999"}), None)
        self.assertIsNone(fn({}))
        self.assertEqual(fn.__code__.co_name, "fn")
        self.assertIn("strings", fn.__code__.co_freevars)
