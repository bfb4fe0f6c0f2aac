"""The subscription AST: node kinds (the SubAST typecodes), tree shapes,
n-ary flattening, printing, from_ast, and hypothesis properties.

Typecodes are those of the client protocol 4.0 draft
(the Elvin client protocol 4.0, section 8.2.3.4,
lines ~2920-2986); shapes follow the grammar of Appendix A and the
project's precedence/flattening decisions; the property tests use
reference models written from section 6.1.1 (logic), 6.1.11 (real64
equality) and the wrapping/truncation decisions.
"""

import math

from twisted.trial import unittest

from elvin import Int32, Int64, Subscription, SubscriptionError
from elvin.subscription import ast as sub_ast
from elvin.subscription import parse, to_text
from elvin.subscription.ast import Kind, Node

try:
    from hypothesis import HealthCheck, assume, given, settings, strategies as st
except ImportError:  # pragma: no cover
    given = None


# Shorthands for building expected trees.
def N(value):
    return Node(Kind.NAME, value)


def I(value):
    return Node(Kind.INT32, value)


def L(value):
    return Node(Kind.INT64, value)


def R(value):
    return Node(Kind.REAL64, value)


def S(value):
    return Node(Kind.STRING, value)


def op(kind, *children):
    return Node(kind, None, children)


def EQ(a, b):
    return op(Kind.EQUALS, a, b)


X1 = EQ(N("x"), I(1))
A1 = EQ(N("a"), I(1))
B1 = EQ(N("b"), I(1))
C1 = EQ(N("c"), I(1))
D1 = EQ(N("d"), I(1))


class KindTests(unittest.TestCase):
    """Node kinds are the subast_typecode values of section 8.2.3.4."""

    SPEC = {
        "EMPTY": 0, "NAME": 1, "INT32": 2, "INT64": 3, "REAL64": 4, "STRING": 5,
        "EQUALS": 8, "NOT_EQUALS": 9, "LESS_THAN": 10, "LESS_THAN_EQUALS": 11,
        "GREATER_THAN": 12, "GREATER_THAN_EQUALS": 13,
        "OR": 16, "XOR": 17, "AND": 18, "NOT": 19,
        "UNARY_PLUS": 20, "UNARY_MINUS": 21, "MULTIPLY": 22, "DIVIDE": 23,
        "MODULO": 24, "ADD": 25, "SUBTRACT": 26,
        "SHIFT_LEFT": 27, "SHIFT_RIGHT": 28, "LOGICAL_SHIFT_RIGHT": 29,
        "BIT_AND": 30, "BIT_XOR": 31, "BIT_OR": 32, "BIT_NEGATE": 33,
        "FUNC_INT32": 40, "FUNC_INT64": 41, "FUNC_REAL64": 42,
        "FUNC_STRING": 43, "FUNC_OPAQUE": 44, "FUNC_NAN": 45,
        "FUNC_BEGINS_WITH": 48, "FUNC_CONTAINS": 49, "FUNC_ENDS_WITH": 50,
        "FUNC_WILDCARD": 51, "FUNC_REGEX": 52,
        "FUNC_FOLD_CASE": 56, "FUNC_DECOMPOSE": 57, "FUNC_DECOMPOSE_COMPAT": 58,
        "FUNC_REQUIRE": 64, "FUNC_EQUALS": 65, "FUNC_SIZE": 66,
    }

    def test_typecodes(self):
        for name, code in self.SPEC.items():
            self.assertEqual(int(Kind[name]), code, name)

    def test_kind_is_int_enum(self):
        self.assertEqual(Kind(18), Kind.AND)
        self.assertEqual(Kind.AND, 18)


def _shape(text, expected):
    def test(self):
        self.assertEqual(parse(text), expected)
        self.assertEqual(Subscription(text).ast, expected)
    test.__doc__ = f"{text!r} parses to the expected tree"
    return test


class ShapeTests(unittest.TestCase):
    pass


_SHAPES = [
    # n-ary flattening of unparenthesised chains
    ("and_chain_is_nary", "a == 1 && b == 1 && c == 1", op(Kind.AND, A1, B1, C1)),
    ("or_chain_is_nary", "a == 1 || b == 1 || c == 1 || d == 1", op(Kind.OR, A1, B1, C1, D1)),
    ("xor_chain_is_nary", "a == 1 ^^ b == 1 ^^ c == 1", op(Kind.XOR, A1, B1, C1)),
    ("two_operand_and", "a == 1 && b == 1", op(Kind.AND, A1, B1)),
    ("left_group_kept", "(a == 1 && b == 1) && c == 1",
     op(Kind.AND, op(Kind.AND, A1, B1), C1)),
    ("right_group_kept", "a == 1 && (b == 1 && c == 1)",
     op(Kind.AND, A1, op(Kind.AND, B1, C1))),
    ("or_group_kept", "(a == 1 || b == 1) || c == 1",
     op(Kind.OR, op(Kind.OR, A1, B1), C1)),
    ("mixed_and_or", "a == 1 && b == 1 || c == 1 && d == 1",
     op(Kind.OR, op(Kind.AND, A1, B1), op(Kind.AND, C1, D1))),
    ("and_then_or_chain", "a == 1 && b == 1 || c == 1 || d == 1",
     op(Kind.OR, op(Kind.AND, A1, B1), C1, D1)),
    ("or_with_inner_and_chain", "a == 1 || b == 1 && c == 1 && d == 1",
     op(Kind.OR, A1, op(Kind.AND, B1, C1, D1))),
    ("xor_between_or_and", "a == 1 || b == 1 ^^ c == 1 && d == 1",
     op(Kind.OR, A1, op(Kind.XOR, B1, op(Kind.AND, C1, D1)))),
    ("chain_split_by_other_op", "a == 1 && b == 1 ^^ c == 1 && d == 1",
     op(Kind.XOR, op(Kind.AND, A1, B1), op(Kind.AND, C1, D1))),
    ("not_binds_tighter_than_and", "! a == 1 && b == 1",
     op(Kind.AND, op(Kind.NOT, A1), B1)),
    ("not_of_comparison", "! x == 1", op(Kind.NOT, X1)),
    ("not_not", "! ! x == 1", op(Kind.NOT, op(Kind.NOT, X1))),
    ("not_of_group", "!(a == 1 || b == 1)", op(Kind.NOT, op(Kind.OR, A1, B1))),
    ("redundant_parens", "((x == 1))", X1),
    ("parens_around_operands", "(x) == (1)", X1),
    # comparisons
    ("not_equals_kind", "x != 1", op(Kind.NOT_EQUALS, N("x"), I(1))),
    ("less_than", "x < 1", op(Kind.LESS_THAN, N("x"), I(1))),
    ("less_equal", "x <= 1", op(Kind.LESS_THAN_EQUALS, N("x"), I(1))),
    ("greater_than", "x > 1", op(Kind.GREATER_THAN, N("x"), I(1))),
    ("greater_equal", "x >= 1", op(Kind.GREATER_THAN_EQUALS, N("x"), I(1))),
    ("literal_left", "1 < x", op(Kind.LESS_THAN, I(1), N("x"))),
    ("two_names", "x == y", EQ(N("x"), N("y"))),
    # arithmetic: binary, left associative, precedence as decided
    ("add_left_assoc", "x == 1 + 2 + 3",
     EQ(N("x"), op(Kind.ADD, op(Kind.ADD, I(1), I(2)), I(3)))),
    ("sub_left_assoc", "x == 1 - 2 - 3",
     EQ(N("x"), op(Kind.SUBTRACT, op(Kind.SUBTRACT, I(1), I(2)), I(3)))),
    ("mul_over_add", "x == 1 + 2 * 3",
     EQ(N("x"), op(Kind.ADD, I(1), op(Kind.MULTIPLY, I(2), I(3))))),
    ("div_mod_left_assoc", "x == 8 / 4 % 3",
     EQ(N("x"), op(Kind.MODULO, op(Kind.DIVIDE, I(8), I(4)), I(3)))),
    ("shift_over_mul", "x == 1 << 2 * 3",
     EQ(N("x"), op(Kind.MULTIPLY, op(Kind.SHIFT_LEFT, I(1), I(2)), I(3)))),
    ("shift_kinds", "x == 1 >> 2 >>> 3",
     EQ(N("x"), op(Kind.LOGICAL_SHIFT_RIGHT, op(Kind.SHIFT_RIGHT, I(1), I(2)), I(3)))),
    ("bitor_over_shift", "x == 1 << 2 | 3",
     EQ(N("x"), op(Kind.SHIFT_LEFT, I(1), op(Kind.BIT_OR, I(2), I(3))))),
    ("bit_precedence", "x == 1 | 2 ^ 3 & 4",
     EQ(N("x"), op(Kind.BIT_OR, I(1), op(Kind.BIT_XOR, I(2), op(Kind.BIT_AND, I(3), I(4)))))),
    ("bitand_left_assoc", "x == 1 & 2 & 3",
     EQ(N("x"), op(Kind.BIT_AND, op(Kind.BIT_AND, I(1), I(2)), I(3)))),
    ("arith_both_sides", "x + 1 < y * 2",
     op(Kind.LESS_THAN, op(Kind.ADD, N("x"), I(1)), op(Kind.MULTIPLY, N("y"), I(2)))),
    ("parens_override", "x == (1 + 2) * 3",
     EQ(N("x"), op(Kind.MULTIPLY, op(Kind.ADD, I(1), I(2)), I(3)))),
    # unary operators and signed literals
    ("negative_literal", "x == -1", EQ(N("x"), I(-1))),
    ("negative_int64_literal", "x == -1L", EQ(N("x"), L(-1))),
    ("negative_real_literal", "x == -1.5", EQ(N("x"), R(-1.5))),
    ("separated_minus_is_unary", "x == - 1", EQ(N("x"), op(Kind.UNARY_MINUS, I(1)))),
    ("minus_name_is_unary", "x == -y", EQ(N("x"), op(Kind.UNARY_MINUS, N("y")))),
    ("minus_group_is_unary", "x == -(1)", EQ(N("x"), op(Kind.UNARY_MINUS, I(1)))),
    ("double_minus", "x == --1", EQ(N("x"), op(Kind.UNARY_MINUS, I(-1)))),
    ("unary_plus", "x == +1", EQ(N("x"), op(Kind.UNARY_PLUS, I(1)))),
    ("bit_negate", "x == ~1", EQ(N("x"), op(Kind.BIT_NEGATE, I(1)))),
    ("unary_binds_tightest", "x == -y * 2",
     EQ(N("x"), op(Kind.MULTIPLY, op(Kind.UNARY_MINUS, N("y")), I(2)))),
    ("bit_negate_binds_tighter_than_and", "x == ~y & 3",
     EQ(N("x"), op(Kind.BIT_AND, op(Kind.BIT_NEGATE, N("y")), I(3)))),
    ("minus_after_literal_is_binary", "x == 2 -1", EQ(N("x"), op(Kind.SUBTRACT, I(2), I(1)))),
    ("minus_after_name_is_binary", "x -1 == 0", EQ(op(Kind.SUBTRACT, N("x"), I(1)), I(0))),
    ("minus_after_paren_is_binary", "(x) -1 == 0", EQ(op(Kind.SUBTRACT, N("x"), I(1)), I(0))),
    ("minus_after_operator_is_literal", "x - -1 == 0",
     EQ(op(Kind.SUBTRACT, N("x"), I(-1)), I(0))),
    ("minus_after_open_paren", "x == (-1)", EQ(N("x"), I(-1))),
    ("minus_after_comma", "equals(x, -1)", op(Kind.FUNC_EQUALS, N("x"), I(-1))),
    # literal kinds
    ("int64_literal", "x == 1L", EQ(N("x"), L(1))),
    ("real_literal", "x == 1.5", EQ(N("x"), R(1.5))),
    ("string_literal", 'x == "a"', EQ(N("x"), S("a"))),
    ("single_quoted_literal", "x == 'a'", EQ(N("x"), S("a"))),
    # functions
    ("require", "require(x)", op(Kind.FUNC_REQUIRE, N("x"))),
    ("int32_test", "int32(x)", op(Kind.FUNC_INT32, N("x"))),
    ("int64_test", "int64(x)", op(Kind.FUNC_INT64, N("x"))),
    ("real64_test", "real64(x)", op(Kind.FUNC_REAL64, N("x"))),
    ("string_test", "string(x)", op(Kind.FUNC_STRING, N("x"))),
    ("opaque_test", "opaque(x)", op(Kind.FUNC_OPAQUE, N("x"))),
    ("nan_test", "nan(x)", op(Kind.FUNC_NAN, N("x"))),
    ("begins_with", 'begins-with(x, "a")', op(Kind.FUNC_BEGINS_WITH, N("x"), S("a"))),
    ("ends_with", 'ends-with(x, "a", "b")', op(Kind.FUNC_ENDS_WITH, N("x"), S("a"), S("b"))),
    ("contains", 'contains(x, "a")', op(Kind.FUNC_CONTAINS, N("x"), S("a"))),
    ("wildcard", 'wildcard(x, "a*")', op(Kind.FUNC_WILDCARD, N("x"), S("a*"))),
    ("regex", 'regex(x, "^a")', op(Kind.FUNC_REGEX, N("x"), S("^a"))),
    ("equals", 'equals(x, 1, 2L, 3.5, "s")',
     op(Kind.FUNC_EQUALS, N("x"), I(1), L(2), R(3.5), S("s"))),
    ("size", "size(x) > 1", op(Kind.GREATER_THAN, op(Kind.FUNC_SIZE, N("x")), I(1))),
    ("fold_case", 'fold-case(x) == "a"', EQ(op(Kind.FUNC_FOLD_CASE, N("x")), S("a"))),
    ("decompose", 'decompose(x) == "a"', EQ(op(Kind.FUNC_DECOMPOSE, N("x")), S("a"))),
    ("decompose_compat", 'decompose-compat(x) == "a"',
     EQ(op(Kind.FUNC_DECOMPOSE_COMPAT, N("x")), S("a"))),
    ("string_function_subject", 'begins-with(fold-case(decompose(x)), "a")',
     op(Kind.FUNC_BEGINS_WITH, op(Kind.FUNC_FOLD_CASE, op(Kind.FUNC_DECOMPOSE, N("x"))), S("a"))),
    ("function_with_space", "size (x) == 1", EQ(op(Kind.FUNC_SIZE, N("x")), I(1))),
    ("function_name_as_attribute", "size == 1", EQ(N("size"), I(1))),
    ("escaped_name", r"\ a\(b\) == 1", EQ(N(" a(b)"), I(1))),
]

for _label, _text, _tree in _SHAPES:
    setattr(ShapeTests, f"test_{_label}", _shape(_text, _tree))


class NodeTests(unittest.TestCase):

    def test_immutable(self):
        node = X1
        self.assertRaises(AttributeError, setattr, node, "kind", Kind.NOT)
        self.assertRaises(AttributeError, setattr, node, "value", 2)

    def test_subscription_ast_is_node(self):
        self.assertIsInstance(Subscription("x == 1").ast, Node)

    def test_equal_trees_equal_and_hash_equal(self):
        a, b = parse("x == 1 && y < 2.5"), parse("x == 1 && y < 2.5")
        self.assertEqual(a, b)
        self.assertEqual(hash(a), hash(b))
        self.assertEqual(len({a, b}), 1)

    def test_different_literal_kinds_differ(self):
        self.assertNotEqual(parse("x == 1"), parse("x == 1L"))
        self.assertNotEqual(parse("x == 1"), parse("x == 1.0"))

    def test_different_structure_differ(self):
        self.assertNotEqual(parse("a == 1 && b == 1 && c == 1"),
                            parse("(a == 1 && b == 1) && c == 1"))

    def test_real_zero_signs_differ(self):
        # 6.1.11: real64 values are equal when sign, mantissa and exponent are
        self.assertNotEqual(R(0.0), R(-0.0))

    def test_real_nan_equals_nan(self):
        self.assertEqual(R(float("nan")), R(float("nan")))

    def test_leaf_value_and_children(self):
        leaf = I(5)
        self.assertEqual(leaf.value, 5)
        self.assertEqual(tuple(leaf.children), ())
        self.assertEqual(len(X1.children), 2)

    def test_str_is_canonical_text(self):
        self.assertEqual(str(X1), to_text(X1))


# ---------------------------------------------------------------------------
# Printing: canonical text parses back to an equal tree
# ---------------------------------------------------------------------------

ROUND_TRIP = [
    "x == 1",
    "a == 1 && b == 1 && c == 1",
    "(a == 1 && b == 1) && c == 1",
    "a == 1 && (b == 1 && c == 1)",
    "a == 1 || b == 1 && c == 1",
    "(a == 1 || b == 1) && c == 1",
    "a == 1 ^^ b == 1 ^^ c == 1",
    "(a == 1 ^^ b == 1) ^^ c == 1",
    "! x == 1",
    "!!(x == 1)",
    "! (a == 1 && b == 1)",
    "x != 1",
    "x < 1 || x <= 2 || x > 3 || x >= 4",
    "x == 1 + 2 * 3 - 4 / 5 % 6",
    "x == (1 + 2) * 3",
    "x == 1 - (2 - 3)",
    "x == 1 << 2 >> 3 >>> 4",
    "x == 1 | 2 ^ 3 & 4",
    "x == ((1 | 2) ^ 3) & 4",
    "x == -1",
    "x == - 1",
    "x == --1",
    "x == -(-1)",
    "x == +1",
    "x == ~1",
    "x == ~~y",
    "x == -y",
    "x - -1 == 0",
    "x == -2147483648",
    "x == 2147483647",
    "x == -9223372036854775808L",
    "x == 9223372036854775807L",
    "x == 0x7fffffff",
    "x == 052",
    "x == 0L",
    "x == 0.0",
    "x == -0.0",
    "x == 3.14",
    "x == 6.023e23",
    "x == 6.67e-11",
    "x == 1.7976931348623157e308",
    "x == 4.9e-324",
    "x == 0.1",
    "x == 123456789.125",
    'x == ""',
    'x == "hello sailor"',
    'x == "with \\"quotes\\" and \\\\ backslash"',
    "x == 'single \"double\" inside'",
    'x == "\u00e9\u20ac\U0001F600 \u65e5\u672c"',
    'x == "tab\there\nnewline"',
    "require(x)",
    "int32(x) || int64(x) || real64(x) || string(x) || opaque(x) || nan(x)",
    'begins-with(x, "a", "b")',
    'ends-with(x, "a")',
    'contains(fold-case(x), "a")',
    'wildcard(decompose(x), "*[Hh]ello*", "a?c")',
    'regex(decompose-compat(x), "^[Ss]egall?$")',
    'regex(x, "a\\\\.b")',
    'equals(x, 1, 2L, 3.5, "s", y)',
    "size(x) < 140",
    'fold-case(x) == "a"',
    r"\ we\ can\ have\ spaces == 1",
    r"\1.0\ Contents == 1",
    "this:is:a:test: == 1",
    "pipe= > 20",
    r"a\\b == 1",
    r'a\"b\'c == 1',
    r"f\(x\)\[0\]\,y == 1",
    "caf\u00e9 == 1",
    r"a\u20acb == 1".replace("\\u20ac", "\\\u20ac"),
    "size == 1",
    "regex == \"x\"",
    "temp > prev-temp + 5",
    '(Group == "elvin" || Group == "Chat") && ! regex (User, "[Ss]egall?")',
    "x == 1 || 1 == 2",
    "x == 1 || 1 / 0 == 1",
    " && ".join(f"x{i} == {i}" for i in range(50)),
    "(" * 100 + "x == 1" + ")" * 100,
]


class PrintingTests(unittest.TestCase):

    def test_canonical_text_parses_to_equal_tree(self):
        wrong = []
        for text in ROUND_TRIP:
            tree = parse(text)
            printed = to_text(tree)
            try:
                again = parse(printed)
            except SubscriptionError as e:
                wrong.append(f"{text!r} -> {printed!r} -> {e!r}")
                continue
            if again != tree:
                wrong.append(f"{text!r} -> {printed!r} -> {again!r} != {tree!r}")
        self.assertEqual(wrong, [])

    def test_str_of_subscription_round_trips(self):
        wrong = []
        for text in ROUND_TRIP:
            sub = Subscription(text)
            again = Subscription(str(sub))
            if again != sub or again.ast != sub.ast:
                wrong.append(f"{text!r} -> {str(sub)!r}")
        self.assertEqual(wrong, [])

    def test_canonical_text_is_a_fixed_point(self):
        for text in ROUND_TRIP:
            printed = to_text(parse(text))
            self.assertEqual(to_text(parse(printed)), printed, text)

    def test_equal_meaning_equal_canonical_text(self):
        self.assertEqual(str(Subscription("x == (1)")),
                         str(Subscription("x == 1")))
        self.assertEqual(str(Subscription("  x\t==\n1  ")), str(Subscription("x == 1")))
        self.assertEqual(str(Subscription("x == 'a'")), str(Subscription('x == "a"')))
        self.assertEqual(str(Subscription("x == 0x10")), str(Subscription("x == 16")))

    def test_printed_text_evaluates_the_same(self):
        attrs = {"x": 1, "y": "a", "Group": "Chat", "User": "alice"}
        for text in ROUND_TRIP:
            sub = Subscription(text)
            self.assertIs(Subscription(str(sub)).evaluate(attrs), sub.evaluate(attrs), text)

    def test_printed_negative_zero_keeps_sign(self):
        tree = parse(to_text(parse("x == -0.0")))
        self.assertEqual(math.copysign(1.0, tree.children[1].value), -1.0)

    def test_printed_names_with_specials(self):
        for attribute in (" ", "a b", "(", ")", "[x]", "\"", "'", "\\", ",",
                          "1abc", "!x", "x==1", "caf\u00e9", "\u20ac", "\u65e5",
                          "a\tb", "a\nb", "size", "-", "_"):
            tree = EQ(N(attribute), I(1))
            self.assertEqual(parse(to_text(tree)), tree, attribute)
            self.assertTrue(Subscription.from_ast(tree).matches({attribute: 1}), attribute)

    def test_printed_strings_with_specials(self):
        for value in ("", "\"", "'", "\\", "\\\"", "a\"b'c\\d", "\n\t\r",
                      "\u00e9\u0301\U0001F600", "&& || ( )", "\\n"):
            tree = EQ(N("x"), S(value))
            self.assertEqual(parse(to_text(tree)), tree, repr(value))


# ---------------------------------------------------------------------------
# from_ast
# ---------------------------------------------------------------------------

class FromAstTests(unittest.TestCase):

    def test_from_parsed_tree(self):
        sub = Subscription('x == 1 && begins-with(y, "a")')
        again = Subscription.from_ast(sub.ast)
        self.assertEqual(again, sub)
        self.assertEqual(again.ast, sub.ast)
        self.assertIs(again.evaluate({"x": 1, "y": "abc"}), True)

    def test_from_built_tree(self):
        tree = op(Kind.AND, EQ(N("x"), I(1)), op(Kind.GREATER_THAN, N("y"), R(2.5)))
        sub = Subscription.from_ast(tree)
        self.assertIs(sub.evaluate({"x": 1, "y": 3}), True)
        self.assertIs(sub.evaluate({"x": 1, "y": 2}), False)
        self.assertIsNone(sub.evaluate({"x": 1}))

    def test_from_helper_functions(self):
        tree = sub_ast.node(Kind.OR, sub_ast.node(Kind.EQUALS, sub_ast.name("x"), sub_ast.int32(1)),
                      sub_ast.node(Kind.EQUALS, sub_ast.name("x"), sub_ast.int64(2)),
                      sub_ast.node(Kind.EQUALS, sub_ast.name("x"), sub_ast.real64(3.5)),
                      sub_ast.node(Kind.EQUALS, sub_ast.name("x"), sub_ast.string("s")))
        sub = Subscription.from_ast(tree)
        for value in (1, Int64(2), 3.5, "s"):
            self.assertIs(sub.evaluate({"x": value}), True, value)
        self.assertIs(sub.evaluate({"x": 4}), None)  # 4 vs "s" is bottom

    def test_from_ast_str_parses_back(self):
        tree = op(Kind.XOR, A1, B1, C1)
        sub = Subscription.from_ast(tree)
        self.assertEqual(parse(str(sub)), tree)

    def test_from_ast_nested_group_kept(self):
        tree = op(Kind.AND, op(Kind.AND, A1, B1), C1)
        sub = Subscription.from_ast(tree)
        self.assertEqual(Subscription(str(sub)).ast, tree)

    def test_from_ast_nary_with_many_children(self):
        tree = op(Kind.OR, *[EQ(N("x"), I(i)) for i in range(20)])
        sub = Subscription.from_ast(tree)
        self.assertIs(sub.evaluate({"x": 19}), True)
        self.assertIs(sub.evaluate({"x": 20}), False)

    def test_from_ast_unary_minus_of_literal(self):
        tree = EQ(N("x"), op(Kind.UNARY_MINUS, I(-2147483648)))
        # -(-2^31) wraps in int32
        self.assertIs(Subscription.from_ast(tree).evaluate({"x": -2147483648}), True)

    def test_subscriptions_equal_by_tree(self):
        self.assertEqual(Subscription("x == 1"), Subscription("x  ==  1"))
        self.assertNotEqual(Subscription("x == 1"), Subscription("x == 2"))
        self.assertEqual(hash(Subscription("x == 1")), hash(Subscription("(x == 1)")))


# ---------------------------------------------------------------------------
# Hypothesis: random well-typed trees and reference models
# ---------------------------------------------------------------------------

if given is not None:

    _NAME_CHARS = ("abcxyzXYZ_019 -.:!#$%&*+/<=>?@^`{|}~()[],'\"\\"
                   "\u00e9\u00ff\u00a0\u20ac\u65e5\t")
    _names = st.one_of(
        st.sampled_from(["x", "y", "z", "Group", "size", "regex", "a b", "pipe="]),
        st.text(st.sampled_from(_NAME_CHARS), min_size=1, max_size=6))
    _name_nodes = _names.map(sub_ast.name)

    _int32s = st.one_of(st.integers(-(1 << 31), (1 << 31) - 1),
                        st.sampled_from([0, -1, 1, (1 << 31) - 1, -(1 << 31)]))
    _int64s = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1),
                        st.sampled_from([0, -1, (1 << 63) - 1, -(1 << 63), 1 << 31]))
    _reals = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                       st.sampled_from([0.0, -0.0, 5e-324, 1.7976931348623157e308,
                                        -1.7976931348623157e308, 0.1, 1e22, 1e-7]))
    _texts = st.text(st.characters(blacklist_categories=("Cs",),
                                   blacklist_characters="\x00"), max_size=8)

    _int_lits = st.one_of(_int32s.map(sub_ast.int32), _int64s.map(sub_ast.int64))
    _num_lits = st.one_of(_int_lits, _reals.map(sub_ast.real64))
    _str_lits = _texts.map(sub_ast.string)

    _REGEXES = ["", "a", "^a", "b$", "[Ss]egall?", "a.b", "(cat|dog)+", "\\d{2,3}",
                "\u00e9+", "^$", "x*y?z", "[^abc]", "\\.", "(?:ab)|c"]
    _WILDCARDS = ["", "*", "?", "a*", "*[Hh]ello*", "a?c", "[!a]bc", "[a-c]x",
                  "\\*", "*.c", "\u00e9*"]
    _regex_lits = st.sampled_from(_REGEXES).map(sub_ast.string)
    _wildcard_lits = st.one_of(st.sampled_from(_WILDCARDS),
                               st.text(st.sampled_from("ab*?.+(){}^$|"), max_size=5)
                               ).map(sub_ast.string)

    _STRING_FUNCS = [Kind.FUNC_FOLD_CASE, Kind.FUNC_DECOMPOSE, Kind.FUNC_DECOMPOSE_COMPAT]
    _ARITH = [Kind.ADD, Kind.SUBTRACT, Kind.MULTIPLY, Kind.DIVIDE, Kind.MODULO]
    _BITWISE = [Kind.SHIFT_LEFT, Kind.SHIFT_RIGHT, Kind.LOGICAL_SHIFT_RIGHT,
                Kind.BIT_AND, Kind.BIT_XOR, Kind.BIT_OR]
    _COMPARE = [Kind.EQUALS, Kind.NOT_EQUALS, Kind.LESS_THAN, Kind.LESS_THAN_EQUALS,
                Kind.GREATER_THAN, Kind.GREATER_THAN_EQUALS]
    _TYPE_TESTS = [Kind.FUNC_INT32, Kind.FUNC_INT64, Kind.FUNC_REAL64,
                   Kind.FUNC_STRING, Kind.FUNC_OPAQUE, Kind.FUNC_NAN, Kind.FUNC_REQUIRE]
    _STRING_PREDS = [Kind.FUNC_BEGINS_WITH, Kind.FUNC_ENDS_WITH, Kind.FUNC_CONTAINS]

    def _unary(kinds, child):
        return st.builds(lambda k, c: sub_ast.node(k, c), st.sampled_from(kinds), child)

    def _binary(kinds, left, right):
        return st.builds(lambda k, a, b: sub_ast.node(k, a, b), st.sampled_from(kinds), left, right)

    _CACHE = {}

    def _memo(fn):
        def wrapper(depth):
            key = (fn.__name__, depth)
            if key not in _CACHE:
                _CACHE[key] = fn(depth)
            return _CACHE[key]
        return wrapper

    @_memo
    def string_subject(depth):
        """A name or string function: what a string predicate may test."""
        if depth <= 0:
            return _name_nodes
        return st.one_of(_name_nodes, _unary(_STRING_FUNCS, string_subject(depth - 1)))

    @_memo
    def string_value(depth):
        return st.one_of(_str_lits, string_subject(depth))

    @_memo
    def integer_value(depth):
        base = st.one_of(_name_nodes, _int_lits,
                         _name_nodes.map(lambda s: sub_ast.node(Kind.FUNC_SIZE, s)))
        if depth <= 0:
            return base
        sub = integer_value(depth - 1)
        return st.one_of(base,
                         _binary(_BITWISE + _ARITH, sub, sub),
                         _unary([Kind.BIT_NEGATE, Kind.UNARY_MINUS, Kind.UNARY_PLUS], sub))

    @_memo
    def numeric_value(depth):
        base = st.one_of(_name_nodes, _num_lits)
        if depth <= 0:
            return base
        sub = numeric_value(depth - 1)
        return st.one_of(base, integer_value(depth),
                         _binary(_ARITH, sub, sub),
                         _unary([Kind.UNARY_MINUS, Kind.UNARY_PLUS], sub))

    @_memo
    def predicate(depth):
        vd = 2
        leaves = st.one_of(
            _binary(_COMPARE, numeric_value(vd), numeric_value(vd)),
            _binary([Kind.EQUALS, Kind.NOT_EQUALS], string_value(1), string_value(1)),
            _unary(_TYPE_TESTS, _name_nodes),
            st.builds(lambda k, s, ps: sub_ast.node(k, s, *ps), st.sampled_from(_STRING_PREDS),
                      string_subject(2), st.lists(_str_lits, min_size=1, max_size=3)),
            st.builds(lambda s, ps: sub_ast.node(Kind.FUNC_REGEX, s, *ps),
                      string_subject(1), st.lists(_regex_lits, min_size=1, max_size=2)),
            st.builds(lambda s, ps: sub_ast.node(Kind.FUNC_WILDCARD, s, *ps),
                      string_subject(1), st.lists(_wildcard_lits, min_size=1, max_size=2)),
            st.builds(lambda s, vs: sub_ast.node(Kind.FUNC_EQUALS, s, *vs),
                      _name_nodes, st.lists(st.one_of(numeric_value(0), _str_lits),
                                            min_size=1, max_size=3)),
            st.builds(lambda s, vs: sub_ast.node(Kind.FUNC_EQUALS, s, *vs),
                      _name_nodes, st.lists(numeric_value(1), min_size=1, max_size=3)),
            st.builds(lambda s, vs: sub_ast.node(Kind.FUNC_EQUALS, s, *vs),
                      _name_nodes, st.lists(string_value(0), min_size=1, max_size=3)),
        )
        if depth <= 0:
            return leaves
        sub = predicate(depth - 1)
        return st.one_of(
            leaves,
            sub.map(lambda c: sub_ast.node(Kind.NOT, c)),
            st.builds(lambda k, cs: sub_ast.node(k, *cs),
                      st.sampled_from([Kind.AND, Kind.OR, Kind.XOR]),
                      st.lists(sub, min_size=2, max_size=4)))

    _trees = predicate(3)

    _values = st.one_of(
        st.none(),  # absent
        _int32s,
        _int64s.map(Int64),
        st.sampled_from([Int32(0), Int64(0), Int64(-1), 2 ** 40, -(2 ** 40)]),
        st.floats(),  # includes NaN and infinities
        st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 0.0]),
        _texts,
        st.sampled_from(["", "a", "Chat", "Stra\u00dfe", "\u00e0", "a\u0300", "\ufb01",
                         "hello sailor", "segall"]),
        st.binary(max_size=6),
    )

    def _notification(data, tree):
        attributes = {}
        for attribute in sorted(tree.names()):
            value = data.draw(_values, label=attribute)
            if value is not None:
                attributes[attribute] = value
        return attributes

    class PropertyTests(unittest.TestCase):

        @settings(max_examples=200, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(_trees)
        def test_canonical_text_parses_to_equal_tree(self, tree):
            text = to_text(tree)
            self.assertEqual(parse(text), tree, text)

        @settings(max_examples=200, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(_trees)
        def test_canonical_text_is_fixed_point(self, tree):
            text = to_text(tree)
            self.assertEqual(to_text(parse(text)), text)

        @settings(max_examples=200, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(_trees, st.data())
        def test_evaluation_never_raises(self, tree, data):
            try:
                sub = Subscription.from_ast(tree)
            except SubscriptionError as e:
                # a well-typed tree can only be rejected for being constant
                self.assertEqual(e.code, 2110, f"{to_text(tree)!r}: {e!r}")
                return
            attributes = _notification(data, tree)
            result = sub.evaluate(attributes)
            self.assertIn(result, (True, False, None))
            self.assertIs(sub.matches(attributes), result is True)
            # the printed form behaves identically
            self.assertIs(Subscription(str(sub)).evaluate(attributes), result)

    # -- arbitrary text: only SubscriptionError, with a sensible offset ------

    _PIECES = ["x", "y", "size", "regex", "fold-case", "begins-with", "equals",
               "int32", "require", "a\\ b", "(", ")", ",", "==", "!=", "<", "<=",
               ">", ">=", "&&", "||", "^^", "!", "+", "-", "*", "/", "%", "<<",
               ">>", ">>>", "&", "|", "^", "~", "1", "-1", "0x1f", "07", "08",
               "2147483648", "1L", "1.5", "1.0e400", "1e5", ".5", '"s"', "'t'",
               '"', "'", "\\", "$", "@", "[", "\u00e9", "\u20ac", "\t", "\n"]
    _garbage = st.lists(st.tuples(st.sampled_from(_PIECES), st.sampled_from(["", " ", "  "])),
                        max_size=14).map(lambda ps: "".join(p + sp for p, sp in ps))

    class RobustnessTests(unittest.TestCase):

        def check_text(self, text):
            try:
                sub = Subscription(text)
            except SubscriptionError as e:
                self.assertTrue(2101 <= e.code <= 2112 or e.code == 2005, repr(e))
                self.assertTrue(0 <= e.offset <= len(text), f"{text!r}: {e!r}")
                self.assertIsInstance(str(e), str)
                return
            result = sub.evaluate({"x": 1, "y": "s", "a b": 2.5})
            self.assertIn(result, (True, False, None))
            self.assertEqual(Subscription(str(sub)), sub)

        @settings(max_examples=200, deadline=None)
        @given(_garbage)
        def test_token_soup_only_raises_subscription_error(self, text):
            self.check_text(text)

        @settings(max_examples=200, deadline=None)
        @given(st.text(max_size=30))
        def test_any_text_only_raises_subscription_error(self, text):
            self.check_text(text)

        @settings(max_examples=200, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(_trees, st.data())
        def test_damaged_canonical_text(self, tree, data):
            text = to_text(tree)
            i = data.draw(st.integers(0, len(text) - 1))
            cut = data.draw(st.integers(1, 3))
            self.check_text(text[:i] + text[i + cut:])

    # -- reference model: Lukasiewicz logic (6.1.1) -------------------------

    # F < bottom < T; && is min, || is max, ! is 1 - v, ^^ is parity with
    # bottom absorbing.  This reproduces the table of 6.1.1 row for row.
    _RANK = {False: 0, None: 1, True: 2}
    _UNRANK = {0: False, 1: None, 2: True}

    def _ref_logic(tree, truth):
        kind = tree.kind
        if kind == Kind.EQUALS:
            return truth[tree.children[0].value]
        values = [_ref_logic(c, truth) for c in tree.children]
        if kind == Kind.NOT:
            return _UNRANK[2 - _RANK[values[0]]]
        if kind == Kind.AND:
            return _UNRANK[min(_RANK[v] for v in values)]
        if kind == Kind.OR:
            return _UNRANK[max(_RANK[v] for v in values)]
        if None in values:
            return None
        return values.count(True) % 2 == 1

    _ATOMS = ["a", "b", "c", "d"]

    _logic_trees = st.recursive(
        st.sampled_from(_ATOMS).map(lambda n: sub_ast.node(Kind.EQUALS, sub_ast.name(n), sub_ast.int32(1))),
        lambda sub: st.one_of(
            sub.map(lambda c: sub_ast.node(Kind.NOT, c)),
            st.builds(lambda k, cs: sub_ast.node(k, *cs),
                      st.sampled_from([Kind.AND, Kind.OR, Kind.XOR]),
                      st.lists(sub, min_size=2, max_size=4))),
        max_leaves=12)

    _truths = st.fixed_dictionaries({n: st.sampled_from([True, False, None]) for n in _ATOMS})

    # -- reference model: two's complement integer arithmetic ---------------

    def _wrap(value, bits):
        value &= (1 << bits) - 1
        return value - (1 << bits) if value >= 1 << (bits - 1) else value

    def _ref_int(symbol, a, b, bits):
        count = b & (bits - 1)
        if symbol == "+":
            return _wrap(a + b, bits)
        if symbol == "-":
            return _wrap(a - b, bits)
        if symbol == "*":
            return _wrap(a * b, bits)
        if symbol == "/":
            if b == 0:
                return None
            q = abs(a) // abs(b)
            return _wrap(q if (a < 0) == (b < 0) else -q, bits)
        if symbol == "%":
            if b == 0:
                return None
            r = abs(a) % abs(b)
            return _wrap(-r if a < 0 else r, bits)
        if symbol == "<<":
            return _wrap(a << count, bits)
        if symbol == ">>":
            return _wrap(a >> count, bits)
        if symbol == ">>>":
            return _wrap((a & ((1 << bits) - 1)) >> count, bits)
        if symbol == "&":
            return _wrap(a & b, bits)
        if symbol == "|":
            return _wrap(a | b, bits)
        if symbol == "^":
            return _wrap(a ^ b, bits)
        raise AssertionError(symbol)

    _INT_OPS = ["+", "-", "*", "/", "%", "<<", ">>", ">>>", "&", "|", "^"]
    _SMALL = st.one_of(st.integers(-40, 70), st.sampled_from([0, -1, 31, 32, 63, 64]))

    # -- reference model: real64 order (6.1.11, Java Double.compare) --------

    def _ref_compare(a, b):
        def key(v):
            v = float(v)
            if v != v:
                return (1, 0.0, 0.0)
            return (0, v, math.copysign(1.0, v))
        ka, kb = key(a), key(b)
        return (ka > kb) - (ka < kb)

    _CMP = {"==": lambda c: c == 0, "!=": lambda c: c != 0, "<": lambda c: c < 0,
            "<=": lambda c: c <= 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0}

    _mixed_numbers = st.one_of(
        st.floats(), st.sampled_from([float("nan"), 0.0, -0.0, float("inf"), float("-inf")]),
        st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1).map(Int64))

    class ReferenceModelTests(unittest.TestCase):

        @settings(max_examples=200, deadline=None)
        @given(_logic_trees, _truths)
        def test_logic_matches_lukasiewicz(self, tree, truth):
            assume(tree.kind != Kind.EQUALS)
            attributes = {n: 1 if v is True else 0 for n, v in truth.items() if v is not None}
            expected = _ref_logic(tree, truth)
            sub = Subscription.from_ast(tree)
            self.assertIs(sub.evaluate(attributes), expected, to_text(tree))
            self.assertIs(Subscription(to_text(tree)).evaluate(attributes), expected)

        @settings(max_examples=200, deadline=None)
        @given(st.sampled_from(_INT_OPS), _int32s, st.one_of(_int32s, _SMALL))
        def test_int32_arithmetic_wraps(self, symbol, a, b):
            expected = _ref_int(symbol, a, b, 32)
            sub = Subscription(f"x {symbol} y == z")
            attributes = {"x": a, "y": b, "z": expected if expected is not None else 0}
            self.assertIs(sub.evaluate(attributes), None if expected is None else True,
                          f"{a} {symbol} {b} -> {expected}")

        @settings(max_examples=200, deadline=None)
        @given(st.sampled_from(_INT_OPS), _int64s, st.one_of(_int64s, _SMALL),
               st.sampled_from(["both", "left", "right"]))
        def test_int64_arithmetic_wraps(self, symbol, a, b, which):
            # either operand being int64 promotes the operation to int64
            x = Int64(a) if which in ("both", "left") else a
            y = Int64(b) if which in ("both", "right") else b
            if which == "right" and not -(1 << 31) <= a < (1 << 31):
                x = Int64(a)
            if which == "left" and not -(1 << 31) <= b < (1 << 31):
                y = Int64(b)
            expected = _ref_int(symbol, a, b, 64)
            sub = Subscription(f"x {symbol} y == z")
            attributes = {"x": x, "y": y, "z": Int64(expected) if expected is not None else 0}
            self.assertIs(sub.evaluate(attributes), None if expected is None else True,
                          f"{x!r} {symbol} {y!r} -> {expected}")

        @settings(max_examples=200, deadline=None)
        @given(st.sampled_from(sorted(_CMP)), _mixed_numbers, _mixed_numbers)
        def test_numeric_comparison_order(self, symbol, a, b):
            if isinstance(a, float) or isinstance(b, float):
                expected = _CMP[symbol](_ref_compare(a, b))
            else:
                expected = _CMP[symbol]((a > b) - (a < b))
            self.assertIs(Subscription(f"x {symbol} y").evaluate({"x": a, "y": b}),
                          expected, f"{a!r} {symbol} {b!r}")


class LongChainTests(unittest.TestCase):
    """A chain of 20,000 || is one node with 20,000 children, built in
    linear time (each term is appended, not copied into a new tuple)."""

    def test_long_chain_is_one_node(self):
        from elvin.subscription.parser import parse as parse_text
        text = " || ".join(f"a == {i}" for i in range(20000))
        result = parse_text(text)
        self.assertEqual(result.tree.kind, Kind.OR)
        self.assertEqual(len(result.tree.children), 20000)
        self.assertIsInstance(result.tree.children, tuple)
        self.assertEqual(result.tree.children[-1].children[1].value, 19999)
        # The operator offset is the last ||'s, as for a short chain.
        self.assertEqual(result.op_offsets[id(result.tree)], text.rindex("||"))

    def test_grouped_chains_stay_apart(self):
        tree = parse("(a == 1 || a == 2) || (a == 3 || a == 4) || a == 5")
        self.assertEqual([c.kind for c in tree.children], [Kind.OR, Kind.OR, Kind.EQUALS])
        self.assertEqual([len(c.children) for c in tree.children[:2]], [2, 2])
