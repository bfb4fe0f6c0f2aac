"""Lexical structure of the Elvin subscription language: literals, names,
whitespace and operator tokens, checked through the public API.

Expected values come from the client protocol 4.0 draft
(the Elvin client protocol 4.0, section 6.1.4 "Literal
Syntax" and Appendix A), the subscription language reference
(the Elvin subscription language, "Names" and "Literals")
and the project's recorded decisions where those are silent.
"""

import math

from twisted.trial import unittest

from elvin import SubscriptionError, Subscription
from elvin.subscription import parse
from elvin.subscription.ast import Kind, Node

PARSE_ERROR = 2101
INVALID_TOKEN = 2102
UNTERM_STRING = 2103
UNKNOWN_FUNC = 2104
OVERFLOW = 2105


def literal(text):
    """The leaf parsed from ``text`` written as the right operand of ``==``."""
    tree = parse("x == " + text)
    assert tree.kind == Kind.EQUALS, tree
    return tree.children[1]


def first_name(text):
    """The NAME leaf on the left of ``text`` (which must be ``<name> == 1``)."""
    tree = parse(text)
    assert tree.kind == Kind.EQUALS, tree
    assert tree.children[0].kind == Kind.NAME, tree
    return tree.children[0].value


class _Base(unittest.TestCase):

    def assertLeaf(self, leaf, kind, value):
        self.assertEqual(leaf.kind, kind)
        self.assertEqual(type(leaf.value), type(value))
        self.assertEqual(leaf.value, value)

    def assertRejected(self, text, code=None, offset=None, codes=None):
        with self.assertRaises(SubscriptionError) as cm:
            Subscription(text)
        err = cm.exception
        if code is not None:
            self.assertEqual(err.code, code, f"{text!r}: {err!r}")
        if codes is not None:
            self.assertIn(err.code, codes, f"{text!r}: {err!r}")
        if offset is not None:
            self.assertEqual(err.offset, offset, f"{text!r}: {err!r}")
        return err


# ---------------------------------------------------------------------------
# Integer literals (6.1.4: decimal, 0x hex, 0 octal, leading minus, L suffix)
# ---------------------------------------------------------------------------

class Int32LiteralTests(_Base):

    def test_decimal(self):
        self.assertLeaf(literal("42"), Kind.INT32, 42)

    def test_zero(self):
        self.assertLeaf(literal("0"), Kind.INT32, 0)

    def test_octal(self):
        # "052" is one of the reference's legitimate int32 examples.
        self.assertLeaf(literal("052"), Kind.INT32, 42)

    def test_octal_010_is_eight(self):
        self.assertLeaf(literal("010"), Kind.INT32, 8)

    def test_octal_double_zero(self):
        self.assertLeaf(literal("00"), Kind.INT32, 0)

    def test_octal_seven(self):
        self.assertLeaf(literal("07"), Kind.INT32, 7)

    def test_hex_lower(self):
        self.assertLeaf(literal("0x2a"), Kind.INT32, 42)

    def test_hex_upper_prefix_and_digits(self):
        self.assertLeaf(literal("0X2A"), Kind.INT32, 42)

    def test_hex_mixed_case_digits(self):
        self.assertLeaf(literal("0xDeAd"), Kind.INT32, 0xDEAD)

    def test_negative_hex(self):
        # "-0x2a" is a legitimate int32 in the language reference.
        self.assertLeaf(literal("-0x2a"), Kind.INT32, -42)

    def test_negative_decimal(self):
        self.assertLeaf(literal("-17"), Kind.INT32, -17)

    def test_negative_octal(self):
        self.assertLeaf(literal("-052"), Kind.INT32, -42)

    def test_int32_max(self):
        self.assertLeaf(literal("2147483647"), Kind.INT32, 2147483647)

    def test_int32_min_with_sign_attached(self):
        self.assertLeaf(literal("-2147483648"), Kind.INT32, -2147483648)

    def test_int32_max_hex(self):
        self.assertLeaf(literal("0x7fffffff"), Kind.INT32, 0x7FFFFFFF)

    def test_int32_min_hex(self):
        self.assertLeaf(literal("-0x80000000"), Kind.INT32, -(1 << 31))

    def test_int32_max_octal(self):
        self.assertLeaf(literal("017777777777"), Kind.INT32, 2147483647)

    def test_leading_zeros_decimal_value_is_octal(self):
        self.assertLeaf(literal("0017"), Kind.INT32, 0o17)


class Int64LiteralTests(_Base):

    def test_lower_l(self):
        self.assertLeaf(literal("0l"), Kind.INT64, 0)

    def test_upper_l(self):
        self.assertLeaf(literal("42L"), Kind.INT64, 42)

    def test_small_value_is_still_int64(self):
        leaf = literal("1L")
        self.assertEqual(leaf.kind, Kind.INT64)

    def test_hex_l(self):
        self.assertLeaf(literal("0xDeadBeefL"), Kind.INT64, 0xDEADBEEF)

    def test_octal_l(self):
        self.assertLeaf(literal("052L"), Kind.INT64, 42)

    def test_negative_l(self):
        self.assertLeaf(literal("-1L"), Kind.INT64, -1)

    def test_beyond_int32_with_l(self):
        self.assertLeaf(literal("2147483648L"), Kind.INT64, 2147483648)

    def test_int64_max(self):
        self.assertLeaf(literal("9223372036854775807L"), Kind.INT64, (1 << 63) - 1)

    def test_int64_min(self):
        self.assertLeaf(literal("-9223372036854775808L"), Kind.INT64, -(1 << 63))

    def test_int64_max_hex(self):
        self.assertLeaf(literal("0x7fffffffffffffffL"), Kind.INT64, (1 << 63) - 1)

    def test_int64_min_hex(self):
        self.assertLeaf(literal("-0x8000000000000000L"), Kind.INT64, -(1 << 63))


class IntegerLiteralRejectTests(_Base):

    def test_int32_just_too_big(self):
        self.assertRejected("x == 2147483648", OVERFLOW, 5)

    def test_int32_just_too_small(self):
        self.assertRejected("x == -2147483649", OVERFLOW, 5)

    def test_hex_too_big_for_int32(self):
        self.assertRejected("x == 0x80000000", OVERFLOW, 5)

    def test_hex_all_ones_too_big_for_int32(self):
        self.assertRejected("x == 0xffffffff", OVERFLOW, 5)

    def test_octal_too_big_for_int32(self):
        self.assertRejected("x == 020000000000", OVERFLOW, 5)

    def test_int64_just_too_big(self):
        self.assertRejected("x == 9223372036854775808L", OVERFLOW, 5)

    def test_int64_just_too_small(self):
        self.assertRejected("x == -9223372036854775809L", OVERFLOW, 5)

    def test_int64_hex_too_big(self):
        self.assertRejected("x == 0x8000000000000000L", OVERFLOW, 5)

    def test_octal_with_8(self):
        self.assertRejected("x == 08", INVALID_TOKEN, 5)

    def test_octal_with_9(self):
        self.assertRejected("x == 0129", INVALID_TOKEN, 5)

    def test_octal_with_8_and_l(self):
        self.assertRejected("x == 08L", INVALID_TOKEN, 5)

    def test_separated_minus_does_not_rescue_overflow(self):
        # Only a '-' written directly before the digits is part of the literal.
        self.assertRejected("x == - 2147483648", OVERFLOW, 7)


# ---------------------------------------------------------------------------
# Real literals (6.1.4: decimal only, both whole and fractional parts,
# optional exponent; too large an exponent is OVERFLOW)
# ---------------------------------------------------------------------------

class RealLiteralTests(_Base):

    def test_simple(self):
        self.assertLeaf(literal("3.14"), Kind.REAL64, 3.14)

    def test_negative(self):
        self.assertLeaf(literal("-3.14"), Kind.REAL64, -3.14)

    def test_exponent(self):
        self.assertLeaf(literal("6.023e23"), Kind.REAL64, 6.023e23)

    def test_negative_exponent(self):
        self.assertLeaf(literal("6.67e-11"), Kind.REAL64, 6.67e-11)

    def test_upper_e(self):
        self.assertLeaf(literal("1.5E3"), Kind.REAL64, 1500.0)

    def test_plus_exponent(self):
        self.assertLeaf(literal("1.5e+3"), Kind.REAL64, 1500.0)

    def test_zero(self):
        self.assertLeaf(literal("0.0"), Kind.REAL64, 0.0)

    def test_negative_zero_keeps_sign(self):
        leaf = literal("-0.0")
        self.assertEqual(leaf.kind, Kind.REAL64)
        self.assertEqual(math.copysign(1.0, leaf.value), -1.0)

    def test_leading_zeros_in_whole_part(self):
        self.assertLeaf(literal("007.5"), Kind.REAL64, 7.5)

    def test_largest_double(self):
        self.assertLeaf(literal("1.7976931348623157e308"), Kind.REAL64,
                        1.7976931348623157e308)

    def test_superfluous_precision_discarded(self):
        self.assertLeaf(literal("0.1000000000000000000000000001"), Kind.REAL64, 0.1)

    def test_exponent_too_large(self):
        self.assertRejected("x == 1.0e400", OVERFLOW, 5)

    def test_exponent_just_too_large(self):
        self.assertRejected("x == 1.8e308", OVERFLOW, 5)

    def test_negative_exponent_too_large(self):
        self.assertRejected("x == -1.0e400", OVERFLOW, 5)

    def test_no_fraction_digits(self):
        self.assertRejected("x == 1.", codes=(PARSE_ERROR, INVALID_TOKEN))

    def test_no_whole_digits(self):
        self.assertRejected("x == .5", codes=(PARSE_ERROR, INVALID_TOKEN))

    def test_exponent_without_point(self):
        self.assertRejected("x == 1e5", codes=(PARSE_ERROR, INVALID_TOKEN))

    def test_point_then_exponent(self):
        self.assertRejected("x == 1.e5", codes=(PARSE_ERROR, INVALID_TOKEN))

    def test_empty_exponent(self):
        self.assertRejected("x == 1.5e", codes=(PARSE_ERROR, INVALID_TOKEN))

    def test_hex_real_not_allowed(self):
        self.assertRejected("x == 0x1.8", codes=(PARSE_ERROR, INVALID_TOKEN))

    def test_real_with_l_suffix_not_allowed(self):
        self.assertRejected("x == 1.5L", codes=(PARSE_ERROR, INVALID_TOKEN))


class MalformedNumberTests(_Base):
    """A number run straight into letters is one bad token, reported where
    it starts (INVALID_TOKEN, section 6.3)."""

    def test_digits_then_letters(self):
        self.assertRejected("x == 1abc", INVALID_TOKEN, 5)

    def test_exponent_without_point_is_invalid_token(self):
        self.assertRejected("x == 1e5", INVALID_TOKEN, 5)

    def test_bare_hex_prefix(self):
        self.assertRejected("x == 0x", INVALID_TOKEN, 5)

    def test_trailing_point(self):
        self.assertRejected("x == 12.", INVALID_TOKEN, 5)


# ---------------------------------------------------------------------------
# String literals (6.1.4 "Character Strings", Appendix A string-literal)
# ---------------------------------------------------------------------------

class StringLiteralTests(_Base):

    def test_double_quoted(self):
        self.assertLeaf(literal('"hello sailor"'), Kind.STRING, "hello sailor")

    def test_single_quoted(self):
        self.assertLeaf(literal("'hello sailor'"), Kind.STRING, "hello sailor")

    def test_empty_double(self):
        self.assertLeaf(literal('""'), Kind.STRING, "")

    def test_empty_single(self):
        self.assertLeaf(literal("''"), Kind.STRING, "")

    def test_escaped_double_quote(self):
        self.assertLeaf(literal(r'"this isn' + "'" + r't a \"number\""'),
                        Kind.STRING, 'this isn\'t a "number"')

    def test_escaped_single_quote(self):
        self.assertLeaf(literal(r"""'this isn\'t a "number"'"""),
                        Kind.STRING, 'this isn\'t a "number"')

    def test_other_quote_unescaped_inside_double(self):
        self.assertLeaf(literal('"it\'s"'), Kind.STRING, "it's")

    def test_other_quote_unescaped_inside_single(self):
        self.assertLeaf(literal("'say \"hi\"'"), Kind.STRING, 'say "hi"')

    def test_escaped_backslash(self):
        self.assertLeaf(literal(r'"a\\b"'), Kind.STRING, "a\\b")

    def test_backslash_n_is_letter_n(self):
        # "All escaped characters except the quotes represent themselves."
        self.assertLeaf(literal(r'"\n"'), Kind.STRING, "n")

    def test_backslash_t_is_letter_t(self):
        self.assertLeaf(literal(r'"a\tb"'), Kind.STRING, "atb")

    def test_escaped_ordinary_characters(self):
        self.assertLeaf(literal(r'"\a\b\c"'), Kind.STRING, "abc")

    def test_raw_newline_and_tab_kept(self):
        self.assertLeaf(literal('"a\nb\tc"'), Kind.STRING, "a\nb\tc")

    def test_operators_inside_string(self):
        self.assertLeaf(literal('"a && b || (c)"'), Kind.STRING, "a && b || (c)")

    def test_unicode_inside_string(self):
        self.assertLeaf(literal('"h\u00e9llo \u20ac \u65e5\u672c \U0001F600"'),
                        Kind.STRING, "h\u00e9llo \u20ac \u65e5\u672c \U0001F600")

    def test_string_on_left(self):
        tree = parse('"abc" == x')
        self.assertEqual(tree.children[0], Node(Kind.STRING, "abc"))

    def test_unterminated_double(self):
        self.assertRejected('x == "abc', UNTERM_STRING, 5)

    def test_unterminated_single(self):
        self.assertRejected("x == 'abc", UNTERM_STRING, 5)

    def test_escaped_closing_quote_leaves_string_open(self):
        self.assertRejected(r'x == "abc\"', UNTERM_STRING, 5)

    def test_mismatched_quotes(self):
        self.assertRejected("x == 'abc\"", UNTERM_STRING, 5)

    def test_nul_not_allowed_in_string(self):
        # strings have "no NUL (0x00) bytes"; safe-utf8-char starts at %x01
        self.assertRejected('x == "a\x00b"', codes=(PARSE_ERROR, INVALID_TOKEN))

    def test_string_is_not_a_name(self):
        # A quoted string is a value, not an attribute reference.
        self.assertFalse(Subscription('x == "y"').matches({"x": 1, "y": 1}))


# ---------------------------------------------------------------------------
# Names (language reference "Names"; Appendix A id-literal)
# ---------------------------------------------------------------------------

class NameTests(_Base):

    def test_plain(self):
        self.assertEqual(first_name("fnord == 1"), "fnord")

    def test_leading_underscore(self):
        self.assertEqual(first_name("_underscore == 1"), "_underscore")

    def test_escaped_spaces(self):
        self.assertEqual(first_name(r"\ we\ can\ have\ spaces == 1"),
                         " we can have spaces")

    def test_escaped_leading_digit(self):
        self.assertEqual(first_name(r"\1.0\ Contents == 1"), "1.0 Contents")

    def test_colons(self):
        self.assertEqual(first_name("this:is:a:test: == 1"), "this:is:a:test:")

    def test_pipe_equals_example(self):
        # "pipe= > 20" is valid: the '=' is the last character of the name.
        tree = parse("pipe= > 20")
        self.assertEqual(tree, Node(Kind.GREATER_THAN, None,
                                    (Node(Kind.NAME, "pipe="), Node(Kind.INT32, 20))))

    def test_pipe_equals_example_evaluates(self):
        sub = Subscription("pipe= > 20")
        self.assertTrue(sub.matches({"pipe=": 25}))
        self.assertIsNone(sub.evaluate({"pipe": 25}))

    def test_unseparated_operator_is_part_of_name(self):
        # "pipe=>20" is one name, so the expression is not a predicate.
        self.assertRejected("pipe=>20", PARSE_ERROR)

    def test_x_eq_eq_1_is_a_name(self):
        self.assertRejected("x==1", PARSE_ERROR, 0)

    def test_case_sensitive(self):
        sub = Subscription("Name == 1")
        self.assertTrue(sub.matches({"Name": 1}))
        self.assertIsNone(sub.evaluate({"name": 1}))

    def test_digits_inside(self):
        self.assertEqual(first_name("a1b2 == 1"), "a1b2")

    def test_escaped_backslash(self):
        self.assertEqual(first_name(r"a\\b == 1"), "a\\b")

    def test_escaped_parentheses(self):
        self.assertEqual(first_name(r"f\(x\) == 1"), "f(x)")

    def test_escaped_brackets(self):
        self.assertEqual(first_name(r"a\[0\] == 1"), "a[0]")

    def test_escaped_double_quote(self):
        self.assertEqual(first_name(r'say\"hi\" == 1'), 'say"hi"')

    def test_escaped_apostrophe(self):
        self.assertEqual(first_name(r"it\'s == 1"), "it's")

    def test_escaped_comma(self):
        self.assertEqual(first_name(r"a\,b == 1"), "a,b")

    def test_escaped_ordinary_letter(self):
        self.assertEqual(first_name(r"\abc == 1"), "abc")

    def test_escaped_first_operator_character(self):
        self.assertEqual(first_name(r"\!bang == 1"), "!bang")

    def test_escaped_first_underscore_digit(self):
        self.assertEqual(first_name(r"\9lives == 1"), "9lives")

    def test_latin1_characters_unescaped(self):
        self.assertEqual(first_name("caf\u00e9 == 1"), "caf\u00e9")

    def test_latin1_upper_range(self):
        self.assertEqual(first_name("a\u00ff\u00a9 == 1"), "a\u00ff\u00a9")

    def test_latin1_name_matches_attribute(self):
        self.assertTrue(Subscription("na\u00efve == 1").matches({"na\u00efve": 1}))

    def test_function_name_as_attribute(self):
        # Function names are recognised only before '('.
        tree = parse("size == 1")
        self.assertEqual(tree.children[0], Node(Kind.NAME, "size"))
        self.assertTrue(Subscription("size == 1").matches({"size": 1}))

    def test_other_function_names_as_attributes(self):
        for fn in ("require", "int32", "int64", "real64", "string", "opaque",
                   "nan", "regex", "wildcard", "equals", "contains",
                   "begins-with", "ends-with", "fold-case", "decompose",
                   "decompose-compat"):
            self.assertEqual(first_name(f"{fn} == 1"), fn)

    def test_function_name_before_paren_after_space(self):
        # The reference's own examples put a space before '('.
        tree = parse("size (x) == 1")
        self.assertEqual(tree.children[0].kind, Kind.FUNC_SIZE)

    def test_name_greedy_up_to_paren_makes_call(self):
        # "x==" is a name, and a name directly before "(" is a function call.
        self.assertRejected("x==(1)", UNKNOWN_FUNC, 0)

    def test_name_ends_at_close_paren(self):
        tree = parse("(x)==(1)")
        self.assertEqual(tree, Node(Kind.EQUALS, None,
                                    (Node(Kind.NAME, "x"), Node(Kind.INT32, 1))))

    def test_name_ends_at_comma(self):
        tree = parse('begins-with(x,"a")')
        self.assertEqual(tree.children[0], Node(Kind.NAME, "x"))

    def test_name_cannot_start_with_digit(self):
        self.assertRejected("1abc == 1", codes=(PARSE_ERROR, INVALID_TOKEN))

    def test_name_cannot_start_with_latin1(self):
        self.assertRejected("\u00e9t\u00e9 == 1", INVALID_TOKEN, 0)

    def test_name_cannot_contain_unescaped_non_latin1(self):
        self.assertRejected("a\u20acb == 1", INVALID_TOKEN, 1)

    def test_names_compare_two_attributes(self):
        sub = Subscription("a == b")
        self.assertTrue(sub.matches({"a": 3, "b": 3}))
        self.assertFalse(sub.matches({"a": 3, "b": 4}))


_ID_CHARS = "!#$%&*+-./0123456789:;<=>?@^_`{|}~"


class IdCharTests(_Base):
    """Characters the grammar's id-char allows unescaped inside a name."""

    def test_every_id_char_inside_a_name(self):
        wrong = []
        for char in _ID_CHARS:
            text = f"a{char}b == 1"
            try:
                got = first_name(text)
                ok = got == f"a{char}b" and Subscription(text).matches({f"a{char}b": 1})
            except SubscriptionError as e:
                got, ok = repr(e), False
            if not ok:
                wrong.append(f"{text!r}: {got!r}")
        self.assertEqual(wrong, [])

    def test_every_id_char_at_end_of_name(self):
        wrong = []
        for char in _ID_CHARS:
            text = f"a{char} == 1"
            try:
                ok = first_name(text) == f"a{char}"
            except SubscriptionError:
                ok = False
            if not ok:
                wrong.append(text)
        self.assertEqual(wrong, [])

    def test_escaped_every_printable_ascii(self):
        # A backslash makes any character part of a name.
        wrong = []
        for code in range(0x20, 0x7F):
            char = chr(code)
            text = f"a\\{char}b == 1"
            try:
                ok = first_name(text) == f"a{char}b"
            except SubscriptionError:
                ok = False
            if not ok:
                wrong.append(text)
        self.assertEqual(wrong, [])


# ---------------------------------------------------------------------------
# Whitespace and token separation
# ---------------------------------------------------------------------------

class WhitespaceTests(_Base):

    def test_tabs_and_newlines_separate(self):
        tree = parse("x\t==\n1\r\n&&\ty == 2")
        self.assertEqual(tree.kind, Kind.AND)

    def test_leading_and_trailing_whitespace(self):
        self.assertEqual(parse("   x == 1 \n\t"), parse("x == 1"))

    def test_no_space_needed_after_operator(self):
        self.assertEqual(parse("x ==1"), parse("x == 1"))

    def test_no_space_needed_before_negative_literal(self):
        self.assertEqual(parse("x >=-1"), Node(Kind.GREATER_THAN_EQUALS, None,
                                               (Node(Kind.NAME, "x"), Node(Kind.INT32, -1))))

    def test_parentheses_need_no_space(self):
        self.assertEqual(parse("(x == 1)&&(y == 2)"), parse("x == 1 && y == 2"))

    def test_string_needs_no_space(self):
        self.assertEqual(parse('x =="a"'), parse('x == "a"'))

    def test_form_feed_is_not_whitespace(self):
        self.assertRejected("x ==\f1", INVALID_TOKEN, 4)

    def test_space_inside_operator_splits_it(self):
        # "= =" is not "==": the first '=' cannot start any token.
        self.assertRejected("x = = 1", codes=(PARSE_ERROR, INVALID_TOKEN))


# ---------------------------------------------------------------------------
# Operator tokens: the longest operator is taken
# ---------------------------------------------------------------------------

def _op_kind_test(text, kind, path):
    def test(self):
        tree = parse(text)
        for index in path:
            tree = tree.children[index]
        self.assertEqual(tree.kind, kind)
    test.__doc__ = f"{text!r} contains a {kind.name} node."
    return test


class OperatorTokenTests(_Base):
    pass


_OPERATOR_CASES = [
    ("or", "a == 1 || b == 1", Kind.OR, ()),
    ("xor", "a == 1 ^^ b == 1", Kind.XOR, ()),
    ("and", "a == 1 && b == 1", Kind.AND, ()),
    ("not", "! a == 1", Kind.NOT, ()),
    ("eq", "a == 1", Kind.EQUALS, ()),
    ("ne", "a != 1", Kind.NOT_EQUALS, ()),
    ("lt", "a < 1", Kind.LESS_THAN, ()),
    ("le", "a <= 1", Kind.LESS_THAN_EQUALS, ()),
    ("gt", "a > 1", Kind.GREATER_THAN, ()),
    ("ge", "a >= 1", Kind.GREATER_THAN_EQUALS, ()),
    ("add", "a + 1 == 1", Kind.ADD, (0,)),
    ("sub", "a - 1 == 1", Kind.SUBTRACT, (0,)),
    ("mul", "a * 1 == 1", Kind.MULTIPLY, (0,)),
    ("div", "a / 1 == 1", Kind.DIVIDE, (0,)),
    ("mod", "a % 1 == 1", Kind.MODULO, (0,)),
    ("shl", "a << 1 == 1", Kind.SHIFT_LEFT, (0,)),
    ("shr", "a >> 1 == 1", Kind.SHIFT_RIGHT, (0,)),
    ("ushr", "a >>> 1 == 1", Kind.LOGICAL_SHIFT_RIGHT, (0,)),
    ("band", "a & 1 == 1", Kind.BIT_AND, (0,)),
    ("bxor", "a ^ 1 == 1", Kind.BIT_XOR, (0,)),
    ("bor", "a | 1 == 1", Kind.BIT_OR, (0,)),
    ("bnot", "~a == 1", Kind.BIT_NEGATE, (0,)),
    ("uminus", "-a == 1", Kind.UNARY_MINUS, (0,)),
    ("uplus", "+a == 1", Kind.UNARY_PLUS, (0,)),
    ("ushr_no_space_after", "a >>>1 == 1", Kind.LOGICAL_SHIFT_RIGHT, (0,)),
    ("not_no_space", "!(a == 1)", Kind.NOT, ()),
    ("not_before_name", "!a == 1", Kind.NOT, ()),
    ("double_not", "!!(a == 1)", Kind.NOT, (0,)),
]

for _label, _text, _kind, _path in _OPERATOR_CASES:
    setattr(OperatorTokenTests, f"test_{_label}", _op_kind_test(_text, _kind, _path))


class CharacterOffsetTests(_Base):
    """Offsets count characters of the expression, not UTF-8 bytes."""

    def test_offset_after_multibyte_string(self):
        text = 'y == "\u00e9\u20ac\U0001F600" && x == 08'
        self.assertRejected(text, INVALID_TOKEN, text.index("08"))

    def test_unterm_offset_after_multibyte(self):
        text = 'y == "\u00e9\u00e9" || x == "abc'
        self.assertRejected(text, UNTERM_STRING, text.rindex('"'))

    def test_overflow_offset_after_latin1_name(self):
        text = "caf\u00e9 == 1 || caf\u00e9 == 99999999999"
        self.assertRejected(text, OVERFLOW, text.index("999"))
