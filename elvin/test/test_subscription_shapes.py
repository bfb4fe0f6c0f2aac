"""Parsing once per shape gives what parsing every time gives.

``elvin.subscription.shapes`` builds a new expression's tree from an earlier
one of the same shape. These tests hold it to the full path (PLY parse +
checker) on random expressions, valid and not: same tree, or the same
error code, offset and message; and a subscription placed by a shape's
recipe to the compiled tree.
"""

from hypothesis import given, settings, strategies as st
from twisted.trial import unittest

from elvin.errors import SubscriptionError
from elvin.subscription import Subscription, analysis, checker, compiler, parser, shapes
from elvin.values import Int64

_values = st.one_of(st.integers(-3, 3000), st.integers(-5, 5).map(Int64),
                    st.sampled_from([0.0, -0.0, 1.5, 2.0, float("nan"), 1e300, 7.0]),
                    st.text(alphabet="abc*?[]().+ ", max_size=4))
_notifications = st.dictionaries(st.sampled_from(["a", "b", "s1", "i1", "r_1", "x.y"]),
                                 _values, max_size=6)

# Fragments: (token text, literal kind or None). A literal's text is drawn
# again for the second expression of the same shape.
_OPERATORS = ["==", "!=", "<", "<=", ">", ">=", "&&", "||", "^^", "!", "+", "-", "*",
              "/", "%", "<<", ">>", ">>>", "&", "|", "^", "~", "(", ")", ",", "(", ")"]
_NAMES = ["a", "b", "s1", "i1", "r_1", "x.y", "size", "regex", "wildcard",
          "begins-with", "equals", "require", "int32", "fold-case", "nan"]
_LITERALS = {
    "int": st.one_of(st.integers(0, 3000).map(str), st.integers(-5, 5).map(str),
                     st.sampled_from(["0x1F", "017", "019", "2147483648", "7L", "-0",
                                      "9223372036854775808L", "00"])),
    "real": st.one_of(st.floats(0, 1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
                      st.sampled_from(["1.5e3", "2.0E-2", "1.0e400", "-0.0"])),
    "string": st.one_of(st.text(alphabet="abc*?[]().+ ", max_size=6)
                        .map(lambda t: f'"{t}"'),
                        st.sampled_from(["'x'", '"a\\"b"', '""', "'*['"])),
}
_fragment = st.one_of(
    st.sampled_from(_OPERATORS).map(lambda t: (t, None)),
    st.sampled_from(_NAMES).map(lambda t: (t, None)),
    st.sampled_from(sorted(_LITERALS)).map(lambda k: (None, k)),
)


@st.composite
def _same_shape_pair(draw, well_formed=False):
    """Two texts with the same tokens but (maybe) different literals."""
    if well_formed:
        fragments = draw(st.lists(st.sampled_from([
            [("s1", None), ("==", None), (None, "string")],
            [("i1", None), (">=", None), (None, "int")],
            [("r_1", None), ("<", None), (None, "real")],
            [("size", None), ("(", None), ("s1", None), (")", None), (">", None),
             (None, "int")],
            [("regex", None), ("(", None), ("s1", None), (",", None), (None, "string"),
             (")", None)],
            [("!", None), ("a", None), ("!=", None), (None, "int")],
            [("i1", None), ("+", None), (None, "int"), ("<", None), (None, "real")],
        ]), min_size=1, max_size=5))
        joined = []
        for i, part in enumerate(fragments):
            if i:
                joined.append((draw(st.sampled_from(["&&", "||"])), None))
            joined.extend(part)
        fragments = joined
    else:
        fragments = draw(st.lists(_fragment, min_size=1, max_size=12))
    texts = []
    for _ in range(2):
        pieces = []
        for text, kind in fragments:
            pieces.append(text if kind is None else draw(_LITERALS[kind]))
            pieces.append(draw(st.sampled_from([" ", " ", "", "  "])))
        texts.append("".join(pieces))
    return texts


def _full(text):
    """What the full path gives: the tree, or the error as a tuple."""
    try:
        result = parser.parse(text)
        checker.check(result.tree, result.offsets, result.op_offsets)
        return result.tree
    except SubscriptionError as e:
        return ("error", e.code, e.offset, str(e))


def _cached(text):
    try:
        checked = shapes.checked_tree(text)
        if checked.tree is None:       # placed by the shape's recipe
            return shapes.rebuild(checked.template, checked.kinds, checked.values)
        return checked.tree
    except SubscriptionError as e:
        return ("error", e.code, e.offset, str(e))


class ShapeCacheTests(unittest.TestCase):

    def setUp(self):
        shapes.clear()
        self.addCleanup(shapes.clear)

    @settings(max_examples=400, deadline=None)
    @given(_same_shape_pair())
    def test_any_text_same_result_as_the_full_path(self, pair):
        first, second = pair
        self.assertEqual(_cached(first), _full(first))
        self.assertEqual(_cached(second), _full(second))   # a template hit, often

    @settings(max_examples=300, deadline=None)
    @given(_same_shape_pair(well_formed=True))
    def test_well_formed_shapes_same_result_as_the_full_path(self, pair):
        first, second = pair
        self.assertEqual(_cached(first), _full(first))
        self.assertEqual(_cached(second), _full(second))

    @settings(max_examples=300, deadline=None)
    @given(_same_shape_pair(well_formed=True), st.lists(_notifications, max_size=8))
    def test_recipes_place_as_the_tree_does(self, pair, notifications):
        """A subscription placed by its shape's recipe (no tree) evaluates
        every notification as the compiled full-path tree does, and gives
        the index the facts the tree gives."""
        for text in pair + pair:
            tree = _full(text)
            if isinstance(tree, tuple):       # an error: tested above
                continue
            try:
                placed = Subscription(text)
            except SubscriptionError:         # constant: refused either way
                continue
            compiled = compiler.compile_tree(tree)
            for attributes in notifications:
                self.assertEqual(placed.evaluate(attributes), compiled.fn(attributes),
                                 (text, attributes))
            self.assertEqual(placed.index_facts(), (analysis.equality_constraints(tree),
                                                    analysis.required_names(tree),
                                                    analysis.range_constraints(tree)))
            self.assertEqual(placed.ast, tree)

    def test_the_recipe_path_builds_no_tree(self):
        Subscription('s1 == "x" && i1 >= 10 && r_1 < 2.5')     # parsed: a new shape
        second = Subscription('s1 == "y" && i1 >= 11 && r_1 < 3.5')   # the recipe is made
        self.assertIsNotNone(second._recipe)
        third = Subscription('s1 == "z" && i1 >= 12 && r_1 < 4.5')    # and used: no tree
        self.assertIsNone(third._tree)
        self.assertIsNotNone(third._recipe)
        self.assertTrue(third.matches({"s1": "z", "i1": 12, "r_1": 4.0}))
        self.assertEqual(third.ast, parser.parse('s1 == "z" && i1 >= 12 && r_1 < 4.5').tree)
        self.assertTrue(second.matches({"s1": "y", "i1": 11, "r_1": 3.0}))
        self.assertFalse(second.matches({"s1": "y", "i1": 11, "r_1": 3.5}))
        zero = Subscription('s1 == "y" && i1 >= 0 && r_1 < 3.5')   # other code for 0
        self.assertIsNone(zero._recipe)
        self.assertTrue(zero.matches({"s1": "y", "i1": 0, "r_1": -0.5}))

    def test_a_template_is_used_and_its_tree_is_fresh(self):
        a = Subscription('s1 == "x" && i1 >= 10 && r_1 < 2.5')
        self.assertEqual(len(shapes._shapes), 1)
        b = Subscription('s1 == "y" && i1 >= 3 && r_1 < 7.0')
        self.assertEqual(len(shapes._shapes), 1)
        self.assertTrue(b.matches({"s1": "y", "i1": 3, "r_1": 1.0}))
        self.assertFalse(b.matches({"s1": "x", "i1": 10, "r_1": 1.0}))
        self.assertTrue(a.matches({"s1": "x", "i1": 10, "r_1": 1.0}))
        self.assertEqual(b.ast, parser.parse('s1 == "y" && i1 >= 3 && r_1 < 7.0').tree)
        self.assertIs(a.names, b.names)

    def test_signs_are_part_of_the_shape(self):
        """A '-' before a number is in the key: merged into the literal in
        prefix position, an operator after an operand, and a text without
        it is another shape (``a -5 > 1`` is a subtraction; ``a 5 > 1`` is
        a syntax error, never a subtraction)."""
        pairs = [("a == -5", "a == -7.5"), ("a -5 > 1", "a -7 > 2"), ("a - 5 > 1", "a - 7 > 2"),
                 ("(-5) < a", "(-6.5) < a"), ("a == -5", 'a == -"x"'), ("a -5 > 1", "a 5 > 1"),
                 ("a == -5", "a == 5"), ("x ==5", "x ==6"), ("-1 - -2 < a", "-3 - -4 < a")]
        for first, second in pairs:
            for text in (first, second):
                self.assertEqual(_cached(text), _full(text), text)
                self.assertEqual(_cached(text), _full(text), text)   # now from the shape

    def test_errors_on_a_known_shape_are_exact(self):
        Subscription('regex(s1, "a+") && i1 > 1')
        for text in ('regex(s1, "(") && i1 > 1', 'regex(s1, "a+") && i1 > 99999999999',
                     'regex(s1, "a+") && i1 > 1.0e999'):
            with self.assertRaises(SubscriptionError) as cached:
                Subscription(text)
            self.assertEqual(("error", cached.exception.code, cached.exception.offset,
                              str(cached.exception)), _full(text))

    def test_new_literal_kinds_are_checked(self):
        from elvin.subscription.ast import Kind
        Subscription("i1 == 1 && s1 == 2")
        (shape,) = shapes._shapes.values()
        checks = []
        real_check = checker.check
        self.patch(checker, "check", lambda *a: (checks.append(a), real_check(*a))[1])
        Subscription("i1 == 5 && s1 == 6")            # kinds seen: not checked again
        self.assertEqual(checks, [])
        Subscription("i1 == 5L && s1 == 6")           # int64: a new kind, checked
        self.assertEqual(len(checks), 1)
        self.assertIn((Kind.INT64, Kind.INT32), shape.checked_kinds)

    def test_compacted_subscriptions_rebuild_their_tree(self):
        for text in ('s1 == "x" && i1 >= 10 && r_1 < 2.5', 's1 == "y" && i1 >= -3 && r_1 < 7.0',
                     "a == 1 || b + 2 > 3L", "a == 2 || b + 5 > 6L", "a\\-b == 1 && y == 2"):
            sub = Subscription(text)
            tree = sub.ast
            self.assertIs(sub.compact(), sub)
            self.assertEqual(sub.ast, tree, text)
            self.assertEqual(sub.ast, parser.parse(text).tree, text)
        self.assertIsNone(sub._template)        # escaped: no shape, packed as XDR
        self.assertIsNotNone(sub._packed)

    def test_the_cache_is_bounded(self):
        for i in range(shapes.MAX_SHAPES + 10):
            shapes.checked_tree(f"a{i} == 1")
        self.assertEqual(len(shapes._shapes), shapes.MAX_SHAPES)

    def test_the_cache_is_bounded_by_text(self):
        """Shapes of long texts hold large trees: the cache keeps at most
        MAX_SHAPE_TEXT characters' worth, forgetting the oldest, and never a
        text longer than MAX_REMEMBERED_LENGTH."""
        self.patch(shapes, "MAX_SHAPE_TEXT", 4000)
        texts = [" && ".join(f"a{i}_{j} == 1" for j in range(60)) for i in range(10)]
        for text in texts:
            shapes.checked_tree(text)
            self.assertLessEqual(shapes._shape_text, 4000)
        self.assertEqual(shapes._shape_text, sum(s.length for s in shapes._shapes.values()))
        self.assertGreater(len(shapes._shapes), 1)
        self.assertEqual(len(shapes._shapes), 4000 // len(texts[0]))
        long_text = " || ".join(f"b == {i}" for i in range(400))
        self.assertGreater(len(long_text), shapes.MAX_REMEMBERED_LENGTH)
        before = dict(shapes._shapes)
        self.assertIsNotNone(shapes.checked_tree(long_text).tree)
        self.assertEqual(shapes._shapes, before)
        shapes.clear()
        self.assertEqual(shapes._shape_text, 0)

    @settings(max_examples=300, deadline=None)
    @given(st.text(alphabet="ab x_-.0123456789eExXlL\"'()=<>!&|+\\\x00\u00e9", max_size=40))
    def test_key_split_is_the_plain_pattern(self, text):
        """The key's split, with its lookahead prefilter, cuts every text
        where the pattern without it does (the prefilter only skips
        positions where no literal can start)."""
        import re
        plain = re.compile(
            "(\"[^\"]*\"|'[^']*')"
            f"|(?<![{shapes._ID_CHAR_CLASS}])(-?)"
            r"([0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|0[xX][0-9A-Fa-f]+[lL]?|[0-9]+[lL]?)").split
        self.assertEqual(shapes._SPLIT(text), plain(text))


class ShippedTablesTests(unittest.TestCase):
    """The LALR tables ship as elvin/subscription/parsetab.py, so a router
    does not build them at start-up."""

    def test_the_shipped_tables_match_the_grammar(self):
        self.assertTrue(parser.tables_are_current(),
                        "regenerate with: python -m elvin.subscription.parser")

    def test_a_changed_grammar_is_noticed(self):
        changed = parser._Grammar.precedence[:-1]
        self.patch(parser._Grammar, "precedence", changed)
        self.assertFalse(parser.tables_are_current())
