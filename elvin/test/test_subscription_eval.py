"""Evaluation semantics of subscriptions: three-valued logic, comparisons,
numeric promotion and wrapping, functions, Unicode, value typing.

Expected values are taken from the Elvin client protocol 4.0 draft
(section 6: the
Lukasiewicz table of 6.1.1, 6.1.6-6.1.12 and 6.2), the subscription language
reference and the
project's recorded decisions where those are silent.  They are written out
by hand, never computed with the implementation.

T, F and B stand for true, false and bottom (``None`` from ``evaluate``).
"""


from twisted.trial import unittest

from elvin import Int32, Int64, Subscription, SubscriptionError

T, F, B = True, False, None

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
NAN = float("nan")
INF = float("inf")


class _Base(unittest.TestCase):

    def check(self, expression, attributes, expected):
        sub = Subscription(expression)
        result = sub.evaluate(attributes)
        self.assertIs(result, expected,
                      f"{expression!r} with {attributes!r}: got {result!r}, "
                      f"expected {expected!r}")
        self.assertIs(sub.matches(attributes), expected is True)

    def check_rows(self, rows):
        """Check every (expression, attributes, expected) row; report all
        the rows that disagree in one failure."""
        wrong = []
        for expression, attributes, expected in rows:
            try:
                sub = Subscription(expression)
                result = sub.evaluate(attributes)
                matched = sub.matches(attributes)
            except Exception as e:  # report, and go on with the other rows
                result = matched = e
            if result is not expected or matched is not (expected is True):
                wrong.append(f"  {expression!r} with {attributes!r}: got "
                             f"{result!r}, expected {expected!r}")
        if wrong:
            self.fail(f"{len(wrong)} of {len(rows)} rows wrong:\n" + "\n".join(wrong))


def _rows_test(labels, rows):
    def test(self):
        self.check_rows(rows)
    test.__doc__ = "; ".join(f"{e} with {a!r} is {x}" for e, a, x in rows)
    return test


#: rows per generated test: related rows are checked together and every
#: wrong row is listed in the failure
CHUNK = 4


def _add_cases(cls, cases, chunk=CHUNK):
    """Add test methods for (label, expression, attributes, expected) rows,
    ``chunk`` consecutive rows to a method named after the first row."""
    for start in range(0, len(cases), chunk):
        group = cases[start:start + chunk]
        labels = [c[0] for c in group]
        method = f"test_{labels[0]}" + (f"_etc{len(group)}" if len(group) > 1 else "")
        assert not hasattr(cls, method), method
        setattr(cls, method, _rows_test(labels, [c[1:] for c in group]))


# ---------------------------------------------------------------------------
# Three-valued logic: the full table of section 6.1.1, written out as printed
# ---------------------------------------------------------------------------

# A, B -> (!A, A && B, A || B, A ^^ B)   (client protocol 6.1.1 table)
LUKASIEWICZ = {
    (T, T): (F, T, T, F),
    (T, B): (F, B, T, B),
    (T, F): (F, F, T, T),
    (B, T): (B, B, T, B),
    (B, B): (B, B, B, B),
    (B, F): (B, F, B, B),
    (F, T): (T, F, T, T),
    (F, B): (T, F, B, B),
    (F, F): (T, F, F, F),
}

_NAME = {T: "t", F: "f", B: "b"}

# Atom flavours: an expression over one attribute, and the attribute value
# (or absence) that makes it true, false or bottom.
ATOMS = {
    # equality: 1 -> true, 0 -> false, absent -> bottom
    "eq": ("{v} == 1", {T: 1, F: 0, B: None}),
    # type test: string -> true, int -> false, absent -> bottom
    "type": ("string({v})", {T: "s", F: 7, B: None}),
    # string predicate: matching string, other string, absent
    "pred": ('begins-with({v}, "y")', {T: "yes", F: "no", B: None}),
}


def _notification(pairs):
    attributes = {}
    for attr, value in pairs:
        if value is not None:
            attributes[attr] = value
    return attributes


_TableBase = _Base


class LogicTableTests(_TableBase):
    """Every row of the Lukasiewicz table for !, &&, || and ^^, for each atom
    flavour (one test per operator and flavour, checking all rows)."""


def _logic_rows(flavour, operator):
    template, values = ATOMS[flavour]
    a = template.format(v="a")
    b = template.format(v="b")
    column = {"!": 0, "&&": 1, "||": 2, "^^": 3}[operator]
    rows = []
    for (va, vb), results in LUKASIEWICZ.items():
        attrs = _notification([("a", values[va]), ("b", values[vb])])
        if operator == "!":
            if vb is not T:  # !A depends only on A: once per A
                continue
            rows.append((f"! {a}", _notification([("a", values[va])]), results[0]))
        else:
            rows.append((f"{a} {operator} {b}", attrs, results[column]))
    return rows


def _table_test(rows):
    def test(self):
        self.check_rows(rows)
    return test


for _flavour in ATOMS:
    for _op, _label in (("!", "not"), ("&&", "and"), ("||", "or"), ("^^", "xor")):
        setattr(LogicTableTests, f"test_{_label}_{_flavour}",
                _table_test(_logic_rows(_flavour, _op)))


class RequireLogicTests(_Base):
    """require() is true or bottom (6.1.6), combined with a predicate that is
    false whenever its attribute is present."""

    # A = require(a): true when present, bottom when absent.
    # Q = int32(q) with q a string: false when present, bottom when absent.

    def test_require_and_false(self):
        self.check("require(a) && int32(q)", {"a": 1, "q": "s"}, F)

    def test_bottom_require_and_false(self):
        # && is false as soon as one side is false, even if the other is bottom.
        self.check("require(a) && int32(q)", {"q": "s"}, F)

    def test_false_and_bottom_require(self):
        self.check("int32(q) && require(a)", {"q": "s"}, F)

    def test_require_or_bottom(self):
        # || is true as soon as one side is true, even if the other is bottom.
        self.check("require(a) || int32(q)", {"a": 1}, T)

    def test_bottom_or_require(self):
        self.check("int32(q) || require(a)", {"a": 1}, T)

    def test_bottom_or_false(self):
        self.check("require(a) || int32(q)", {"q": "s"}, B)

    def test_require_xor_bottom(self):
        self.check("require(a) ^^ int32(q)", {"a": 1}, B)

    def test_require_xor_false(self):
        self.check("require(a) ^^ int32(q)", {"a": 1, "q": "s"}, T)

    def test_not_require_present(self):
        self.check("!require(a)", {"a": 1}, F)

    def test_not_require_absent(self):
        self.check("!require(a)", {}, B)

    def test_not_not_bottom(self):
        self.check("!!require(a)", {}, B)

    def test_not_not_true(self):
        self.check("!!require(a)", {"a": 1}, T)


class NaryLogicTests(_TableBase):
    """Unparenthesised chains of three operands: all 27 combinations."""


def _and3(x, y, z):
    vals = (x, y, z)
    if F in vals:
        return F
    if B in vals:
        return B
    return T


def _or3(x, y, z):
    vals = (x, y, z)
    if T in vals:
        return T
    if B in vals:
        return B
    return F


def _xor3(x, y, z):
    vals = (x, y, z)
    if B in vals:
        return B
    return (vals.count(T) % 2) == 1


def _nary_rows(operator, reference):
    states = (T, F, B)
    values = {T: 1, F: 0, B: None}
    rows = []
    for x in states:
        for y in states:
            for z in states:
                attrs = _notification([("a", values[x]), ("b", values[y]),
                                       ("c", values[z])])
                rows.append((f"a == 1 {operator} b == 1 {operator} c == 1",
                             attrs, reference(x, y, z)))
    return rows


NaryLogicTests.test_and3 = _table_test(_nary_rows("&&", _and3))
NaryLogicTests.test_or3 = _table_test(_nary_rows("||", _or3))
NaryLogicTests.test_xor3 = _table_test(_nary_rows("^^", _xor3))


class XorParityTests(_Base):

    def test_four_true_is_false(self):
        self.check("a == 1 ^^ b == 1 ^^ c == 1 ^^ d == 1",
                   {"a": 1, "b": 1, "c": 1, "d": 1}, F)

    def test_five_operands_three_true(self):
        self.check("a == 1 ^^ b == 1 ^^ c == 1 ^^ d == 1 ^^ e == 1",
                   {"a": 1, "b": 1, "c": 1, "d": 0, "e": 0}, T)

    def test_one_bottom_among_many(self):
        self.check("a == 1 ^^ b == 1 ^^ c == 1 ^^ d == 1",
                   {"a": 1, "b": 0, "c": 0}, B)

    def test_parenthesised_xor_same_parity(self):
        self.check("(a == 1 ^^ b == 1) ^^ c == 1", {"a": 1, "b": 1, "c": 1}, T)


class PrecedenceEvaluationTests(_Base):
    """Operator precedence as decided: ||, ^^, &&, !, comparisons, + -,
    * / %, << >> >>>, |, ^, &, unary - + ~ (loosest to tightest)."""


_add_cases(PrecedenceEvaluationTests, [
    # && binds tighter than ||: a || (b && c)
    ("and_over_or", "a == 1 || b == 1 && c == 1", {"a": 1, "b": 0, "c": 0}, T),
    ("and_over_or_2", "a == 1 && b == 1 || c == 1", {"a": 0, "b": 0, "c": 1}, T),
    # ^^ binds tighter than ||: a || (b ^^ c)
    ("xor_over_or", "a == 1 || b == 1 ^^ c == 1", {"a": 1, "b": 1, "c": 1}, T),
    # && binds tighter than ^^: a ^^ (b && c)
    ("and_over_xor", "a == 1 ^^ b == 1 && c == 1", {"a": 1, "b": 1, "c": 0}, T),
    ("and_over_xor_2", "a == 1 && b == 1 ^^ c == 1", {"a": 0, "b": 1, "c": 1}, T),
    # ! binds tighter than &&, looser than ==
    ("not_over_and", "! a == 1 && b == 1", {"a": 0, "b": 1}, T),
    ("not_over_and_2", "! a == 1 && b == 1", {"a": 1, "b": 0}, F),
    ("not_of_comparison", "! x == 1", {"x": 2}, T),
    ("not_of_comparison_bottom", "! x == 1", {}, B),
    ("not_over_or", "! a == 1 || b == 1", {"a": 1, "b": 1}, T),
    # + - looser than * / %
    ("mul_over_add", "x == 1 + 2 * 3", {"x": 7}, T),
    ("mul_over_add_not_9", "x == 1 + 2 * 3", {"x": 9}, F),
    ("div_over_sub", "x == 10 - 6 / 2", {"x": 7}, T),
    ("mod_over_add", "x == 1 + 7 % 4", {"x": 4}, T),
    # * / % looser than shifts: (1 << 2) * 3 = 12, not 1 << 6 = 64
    ("shift_over_mul", "x == 1 << 2 * 3", {"x": 12}, T),
    ("shift_over_mul_not_64", "x == 1 << 2 * 3", {"x": 64}, F),
    # + looser than shifts: 1 + (1 << 2) = 5
    ("shift_over_add", "x == 1 + 1 << 2", {"x": 5}, T),
    # shifts looser than |: (1 | 2) << 1 = 6
    ("bitor_over_shift", "x == 1 | 2 << 1", {"x": 6}, T),
    # * looser than |: 2 * (3 | 1) = 6
    ("bitor_over_mul", "x == 2 * 3 | 1", {"x": 6}, T),
    # + looser than &: 1 + (3 & 1) = 2
    ("bitand_over_add", "x == 1 + 3 & 1", {"x": 2}, T),
    # | looser than ^ looser than &: 6 | (1 ^ (3 & 2)) = 7
    ("bit_chain", "x == 6 | 1 ^ 3 & 2", {"x": 7}, T),
    # ^ looser than &: 1 ^ (3 & 2) = 3 ; (1 ^ 3) & 2 would be 2
    ("bitand_over_bitxor", "x == 1 ^ 3 & 2", {"x": 3}, T),
    # | looser than ^: 4 | (5 ^ 1) = 4 ; (4 | 5) ^ 1 would be 4 too, use 1 | 3 ^ 1
    ("bitxor_over_bitor", "x == 1 | 3 ^ 1", {"x": 3}, T),
    # unary binds tightest
    ("unary_minus_over_mul", "x == - y * 2", {"x": -6, "y": 3}, T),
    ("bitnot_over_bitand", "x == ~ 1 & 3", {"x": 2}, T),
    # (-y) >>> 28 = 15 for y = 1, whereas -(y >>> 28) would be 0
    ("unary_minus_over_ushr", "x == - y >>> 28", {"x": 15, "y": 1}, T),
    # left associativity
    ("sub_left_assoc", "x == 10 - 3 - 2", {"x": 5}, T),
    ("sub_add_left_assoc", "x == 10 - 3 + 2", {"x": 9}, T),
    ("div_left_assoc", "x == 100 / 10 / 5", {"x": 2}, T),
    ("mul_mod_left_assoc", "x == 2 * 3 % 4", {"x": 2}, T),
    ("mod_mul_left_assoc", "x == 7 % 4 * 2", {"x": 6}, T),
    ("shl_left_assoc", "x == 1 << 2 << 3", {"x": 32}, T),
    ("shr_left_assoc", "x == 256 >> 2 >> 1", {"x": 32}, T),
    # parentheses override
    ("parens_add_mul", "x == (1 + 2) * 3", {"x": 9}, T),
    ("parens_or_and", "(a == 1 || b == 1) && c == 1", {"a": 1, "b": 0, "c": 0}, F),
    ("comparison_both_sides_arith", "x + 1 == y - 1", {"x": 1, "y": 3}, T),
    ("literal_on_left", "1 == x", {"x": 1}, T),
    ("literal_on_left_lt", "5 < x", {"x": 6}, T),
])


# ---------------------------------------------------------------------------
# Equality and ordering (6.1.7, 6.1.11, language reference "Operators")
# ---------------------------------------------------------------------------

class EqualityTests(_Base):
    pass


_add_cases(EqualityTests, [
    ("int_equal", "x == 1", {"x": 1}, T),
    ("int_unequal", "x == 1", {"x": 2}, F),
    ("missing_is_bottom", "x == 1", {}, B),
    ("missing_other_attr", "x == 1", {"y": 1}, B),
    ("int32_vs_int64_value", "x == 1", {"x": Int64(1)}, T),
    ("int64_literal_vs_int32", "x == 1L", {"x": 1}, T),
    ("int_vs_real_equal", "x == 1", {"x": 1.0}, T),
    ("real_literal_vs_int", "x == 1.0", {"x": 1}, T),
    ("real_literal_vs_int_unequal", "x == 1.5", {"x": 1}, F),
    ("big_int64_vs_literal", "x == 9223372036854775807L", {"x": INT64_MAX}, T),
    ("int64_vs_int32_attribute", "x == y", {"x": 5, "y": Int64(5)}, T),
    ("string_equal", 'x == "abc"', {"x": "abc"}, T),
    ("string_unequal", 'x == "abc"', {"x": "abd"}, F),
    ("string_case_sensitive", 'x == "abc"', {"x": "ABC"}, F),
    ("string_literal_vs_int", 'x == "1"', {"x": 1}, B),
    ("int_literal_vs_string", "x == 1", {"x": "1"}, B),
    ("string_vs_real", "x == 1.0", {"x": "1.0"}, B),
    ("string_attrs_equal", "x == y", {"x": "a", "y": "a"}, T),
    ("string_attr_vs_int_attr", "x == y", {"x": "1", "y": 1}, B),
    ("opaque_vs_string_literal", 'x == "a"', {"x": b"a"}, B),
    ("opaque_vs_int_literal", "x == 97", {"x": b"a"}, B),
    ("opaque_vs_opaque", "x == y", {"x": b"a", "y": b"a"}, B),
    ("two_missing", "x == y", {}, B),
    ("one_missing", "x == y", {"x": 1}, B),
    ("empty_string", 'x == ""', {"x": ""}, T),
    ("string_literal_on_left", '"a" == x', {"x": "a"}, T),
    ("string_literal_on_left_vs_int", '"a" == x', {"x": 1}, B),
    ("string_literal_on_left_ne", '"a" != x', {"x": 1}, B),
    ("unicode_string", 'x == "\u65e5\u672c"', {"x": "\u65e5\u672c"}, T),
    ("composed_vs_decomposed_differ", 'x == "\u00e0"', {"x": "a\u0300"}, F),
    # != is !(==): bottom stays bottom
    ("ne_true", "x != 1", {"x": 2}, T),
    ("ne_false", "x != 1", {"x": 1}, F),
    ("ne_missing", "x != 1", {}, B),
    ("ne_string_vs_int", "x != 1", {"x": "a"}, B),
    ("ne_strings", 'x != "a"', {"x": "b"}, T),
    ("ne_strings_same", 'x != "a"', {"x": "a"}, F),
    ("ne_string_missing", 'x != "a"', {}, B),
    ("ne_opaque", "x != 1", {"x": b"\x01"}, B),
    ("ne_mixed_numeric", "x != 2.0", {"x": Int64(2)}, F),
])


class OrderingTests(_Base):
    pass


_add_cases(OrderingTests, [
    ("lt_true", "x < 2", {"x": 1}, T),
    ("lt_false_equal", "x < 2", {"x": 2}, F),
    ("le_equal", "x <= 2", {"x": 2}, T),
    ("le_false", "x <= 2", {"x": 3}, F),
    ("gt_true", "x > 2", {"x": 3}, T),
    ("gt_false", "x > 2", {"x": 2}, F),
    ("ge_equal", "x >= 2", {"x": 2}, T),
    ("ge_false", "x >= 2", {"x": 1}, F),
    ("lt_missing", "x < 2", {}, B),
    ("gt_string_attr", "x > 2", {"x": "3"}, B),
    ("lt_opaque_attr", "x < 2", {"x": b"\x00"}, B),
    ("lt_two_strings", "x < y", {"x": "a", "y": "b"}, B),
    ("ge_two_strings", "x >= y", {"x": "a", "y": "a"}, B),
    ("negative_values", "x < -5", {"x": -6}, T),
    ("int_vs_real_lt", "x < 2.5", {"x": 2}, T),
    ("real_vs_int_gt", "x > 2", {"x": 2.5}, T),
    ("int64_vs_int32", "x > 2147483647", {"x": 2147483648}, T),
    ("int64_min_lt", "x < -2147483648", {"x": Int64(INT64_MIN)}, T),
    ("int64_max_gt_real", "x > 1.0e18", {"x": INT64_MAX}, T),
    ("attr_vs_attr", "x <= y", {"x": 3, "y": Int64(3)}, T),
    ("real_vs_real", "x < y", {"x": 1.25, "y": 1.5}, T),
    ("the_a_le_b_or_a_gt_b_anomaly", "a <= b || a > b", {}, B),
    ("a_le_b_or_a_gt_b_defined", "a <= b || a > b", {"a": 1, "b": 2}, T),
    ("infinity_above_max", "x > 1.7976931348623157e308", {"x": INF}, T),
    ("minus_infinity", "x < -1.7976931348623157e308", {"x": -INF}, T),
])


class RealSpecialValueTests(_Base):
    """real64 equality is equality of sign, mantissa and exponent (6.1.11);
    ordering follows Java's Double.compare: NaN == NaN, NaN above everything,
    -0.0 below 0.0."""


_add_cases(RealSpecialValueTests, [
    ("nan_equals_nan", "x == y", {"x": NAN, "y": NAN}, T),
    ("nan_ne_nan", "x != y", {"x": NAN, "y": NAN}, F),
    ("nan_not_equal_number", "x == 1.0", {"x": NAN}, F),
    ("nan_ne_number", "x != 1.0", {"x": NAN}, T),
    ("nan_equals_itself", "x == x", {"x": NAN}, T),
    ("nan_greater_than_number", "x > 1.0", {"x": NAN}, T),
    ("nan_greater_than_int", "x > 5", {"x": NAN}, T),
    ("nan_not_less_than_number", "x < 1.0", {"x": NAN}, F),
    ("nan_greater_than_infinity", "x > y", {"x": NAN, "y": INF}, T),
    ("infinity_less_than_nan", "x < y", {"x": INF, "y": NAN}, T),
    ("nan_ge_nan", "x >= y", {"x": NAN, "y": NAN}, T),
    ("nan_le_nan", "x <= y", {"x": NAN, "y": NAN}, T),
    ("nan_lt_nan", "x < y", {"x": NAN, "y": NAN}, F),
    ("neg_zero_not_equal_zero", "x == 0.0", {"x": -0.0}, F),
    ("neg_zero_ne_zero", "x != 0.0", {"x": -0.0}, T),
    ("neg_zero_less_than_zero", "x < 0.0", {"x": -0.0}, T),
    ("zero_greater_than_neg_zero", "x > y", {"x": 0.0, "y": -0.0}, T),
    ("zero_not_le_neg_zero", "x <= -0.0", {"x": 0.0}, F),
    ("neg_zero_equals_neg_zero", "x == -0.0", {"x": -0.0}, T),
    ("neg_zero_vs_int_zero", "x == 0", {"x": -0.0}, F),
    ("int_zero_vs_real_zero", "x == 0.0", {"x": 0}, T),
    ("infinity_equals_infinity", "x == y", {"x": INF, "y": INF}, T),
    ("int_converted_to_real", "x == 9007199254740992.0",
     {"x": Int64((1 << 53) + 1)}, T),
])


# ---------------------------------------------------------------------------
# Arithmetic, promotion (6.2) and wrapping
# ---------------------------------------------------------------------------

class ArithmeticTests(_Base):
    pass


_add_cases(ArithmeticTests, [
    ("add", "x + 1 == 3", {"x": 2}, T),
    ("sub", "x - 1 == 1", {"x": 2}, T),
    ("mul", "x * 3 == 6", {"x": 2}, T),
    ("div_exact", "x / 2 == 3", {"x": 6}, T),
    ("div_truncates", "x / 2 == 3", {"x": 7}, T),
    ("div_truncates_toward_zero_negative", "x / 2 == -3", {"x": -7}, T),
    ("div_negative_divisor", "x / -2 == -3", {"x": 7}, T),
    ("div_both_negative", "x / -2 == 3", {"x": -7}, T),
    ("mod_positive", "x % 3 == 1", {"x": 7}, T),
    ("mod_takes_dividend_sign", "x % 3 == -1", {"x": -7}, T),
    ("mod_negative_divisor", "x % -3 == 1", {"x": 7}, T),
    ("mod_both_negative", "x % -3 == -1", {"x": -7}, T),
    ("int_div_by_zero_bottom", "x / 0 == 1", {"x": 5}, B),
    ("int_mod_by_zero_bottom", "x % 0 == 1", {"x": 5}, B),
    ("int_div_by_zero_attr", "x / y == 1", {"x": 5, "y": 0}, B),
    ("int64_div_by_zero", "x / y == 1", {"x": Int64(5), "y": Int64(0)}, B),
    ("not_of_div_by_zero", "!(x / 0 == 1)", {"x": 5}, B),
    ("div_by_zero_or_true", "x / 0 == 1 || require(x)", {"x": 5}, T),
    ("div_by_zero_and_false", "x / 0 == 1 && x == 4", {"x": 5}, F),
    ("zero_div_by_zero_bottom", "x / y == 0", {"x": 0, "y": 0}, B),
    ("unary_minus", "-x == -3", {"x": 3}, T),
    ("unary_minus_real", "-x == -2.5", {"x": 2.5}, T),
    ("unary_plus", "+x == 3", {"x": 3}, T),
    ("unary_plus_string_bottom", "+x == 3", {"x": "3"}, B),
    ("unary_minus_string_bottom", "-x == 3", {"x": "3"}, B),
    ("double_unary_minus_literal", "x == --1", {"x": 1}, T),
    ("separated_unary_minus_literal", "x == - 1", {"x": -1}, T),
    ("subtract_after_literal", "x == 2 -1", {"x": 1}, T),
    ("subtract_after_name", "x -1 == 0", {"x": 1}, T),
    ("subtract_negative_literal", "x - -1 == 3", {"x": 2}, T),
    ("add_missing_bottom", "x + y == 3", {"x": 1}, B),
    ("add_string_bottom", "x + 1 == 2", {"x": "1"}, B),
    ("add_opaque_bottom", "x + 1 == 2", {"x": b"\x01"}, B),
    ("mul_string_bottom", "x * 2 == 2", {"x": "1"}, B),
    ("sizes_add", "size(a) + size(b) == 5", {"a": "ab", "b": "cde"}, T),
    ("prev_temp_example", "temp > prev-temp + 5", {"temp": 30, "prev-temp": 20}, T),
    ("prev_temp_example_false", "temp > prev-temp + 5", {"temp": 24, "prev-temp": 20}, F),
])


class PromotionTests(_Base):
    """int32 -> int64 -> real64 (6.2); the result has the promoted type."""


_add_cases(PromotionTests, [
    ("int_plus_real", "x + 0.5 == 2.5", {"x": 2}, T),
    ("real_plus_int", "x + 1 == 3.5", {"x": 2.5}, T),
    ("int_attr_plus_real_attr", "x + y == 3.5", {"x": 1, "y": 2.5}, T),
    ("int_div_real_is_real", "x / 2.0 == 3.5", {"x": 7}, T),
    ("real_div_int_is_real", "x / 2 == 2.5", {"x": 5.0}, T),
    ("int_div_int_truncates", "x / 2 == 2", {"x": 5}, T),
    ("int64_div_int_truncates", "x / 2 == 2", {"x": Int64(5)}, T),
    ("int64_plus_real", "x + 0.5 == 1.5", {"x": Int64(1)}, T),
    ("int32_plus_int64_no_32bit_wrap", "x + 1L == 2147483648L", {"x": INT32_MAX}, T),
    ("int32_attr_plus_int64_attr", "x + y == 2147483648L", {"x": INT32_MAX, "y": Int64(1)}, T),
    ("int64_attr_plus_int32_literal", "x + 1 == 2147483648L", {"x": Int64(INT32_MAX)}, T),
    ("int32_mul_int64_literal", "x * 2L == 4294967294L", {"x": INT32_MAX}, T),
    ("real_mod_fmod", "x % 2.5 == 1.0", {"x": 6.0}, T),
    ("real_mod_dividend_sign", "x % 2.0 == -1.0", {"x": -7.0}, T),
    ("int_mod_real", "x % 2.5 == 2.0", {"x": 7}, T),
    ("real_div_by_zero_positive_infinity", "x / 0.0 > 1.7976931348623157e308", {"x": 1.0}, T),
    ("real_div_by_zero_negative_infinity", "x / 0.0 < -1.7976931348623157e308", {"x": -1.0}, T),
    ("int_div_by_real_zero_is_infinity", "x / 0.0 > 1.7976931348623157e308", {"x": 1}, T),
    ("real_div_by_int_zero_is_infinity", "x / 0 > 1.7976931348623157e308", {"x": 1.0}, T),
    ("real_div_by_negative_zero", "x / y < -1.7976931348623157e308", {"x": 1.0, "y": -0.0}, T),
    ("real_zero_div_zero_is_nan", "x / 0.0 == y", {"x": 0.0, "y": NAN}, T),
    ("real_overflow_to_infinity", "x * x == y", {"x": 1e200, "y": INF}, T),
    ("real_mul", "x * 2.0 == 5.0", {"x": 2.5}, T),
    ("real_sub", "x - 0.5 == 0.5", {"x": 1}, T),
    ("real_unary_minus_of_zero", "-x == -0.0", {"x": 0.0}, T),
])


class WrappingTests(_Base):
    """int32 and int64 arithmetic wraps (two's complement) at the promoted
    width."""


_add_cases(WrappingTests, [
    ("int32_add_wraps", "x + 1 == -2147483648", {"x": INT32_MAX}, T),
    ("int32_add_wrap_not_greater", "x + 1 > x", {"x": INT32_MAX}, F),
    ("int32_sub_wraps", "x - 1 == 2147483647", {"x": INT32_MIN}, T),
    ("int32_mul_wraps", "x * 2 == -2", {"x": INT32_MAX}, T),
    ("int32_square_wraps_to_zero", "x * x == 0", {"x": 65536}, T),
    ("int32_negate_min_wraps", "-x == x", {"x": INT32_MIN}, T),
    ("int32_min_div_minus_one_wraps", "x / -1 == -2147483648", {"x": INT32_MIN}, T),
    ("int32_min_mod_minus_one", "x % -1 == 0", {"x": INT32_MIN}, T),
    ("int64_add_wraps", "x + 1 == -9223372036854775808L", {"x": Int64(INT64_MAX)}, T),
    ("int64_sub_wraps", "x - 1 == 9223372036854775807L", {"x": Int64(INT64_MIN)}, T),
    ("int64_mul_wraps", "x * 2 == -2", {"x": Int64(INT64_MAX)}, T),
    ("int64_negate_min_wraps", "-x == x", {"x": Int64(INT64_MIN)}, T),
    ("int64_min_div_minus_one", "x / -1 == x", {"x": Int64(INT64_MIN)}, T),
    ("plain_big_int_is_int64", "x + 1 == -9223372036854775808L", {"x": INT64_MAX}, T),
    ("int64_value_small_does_not_wrap_at_32", "x + 1 == 2147483648L", {"x": Int64(INT32_MAX)}, T),
    ("int32_sum_of_attrs_wraps", "x + y == -2147483647", {"x": INT32_MAX, "y": 2}, T),
    ("int32_sum_of_attrs_wraps_exact", "x + y == -2147483647", {"x": INT32_MAX, "y": INT32_MAX}, F),
    ("int32_sum_of_maxes", "x + y == -2", {"x": INT32_MAX, "y": INT32_MAX}, T),
    ("size_plus_int_is_int32", "size(s) + 2147483647 < 0", {"s": "a"}, T),
])


class ShiftTests(_Base):
    """Shifts mask the count (& 31 for int32, & 63 for int64) after promoting
    both operands; >>> shifts in zeros."""


_add_cases(ShiftTests, [
    ("shl", "x << 1 == 4", {"x": 2}, T),
    ("shl_to_sign_bit", "x << 31 == -2147483648", {"x": 1}, T),
    ("shl_32_masked", "x << 32 == 1", {"x": 1}, T),
    ("shl_33_masked", "x << 33 == 2", {"x": 1}, T),
    ("shl_negative_count", "x << -1 == -2147483648", {"x": 1}, T),
    ("shl_overflow_drops_bits", "x << 1 == -2", {"x": INT32_MAX}, T),
    ("shl_int64", "x << 32 == 4294967296L", {"x": Int64(1)}, T),
    ("shl_int64_64_masked", "x << 64 == 1", {"x": Int64(1)}, T),
    ("shl_int64_count_promotes", "x << 33L == 8589934592L", {"x": 1}, T),
    ("shl_int64_attr_count_promotes", "x << y == 8589934592L", {"x": 1, "y": Int64(33)}, T),
    ("shr_positive", "x >> 2 == 4", {"x": 16}, T),
    ("shr_negative_sign_extends", "x >> 1 == -4", {"x": -8}, T),
    ("shr_minus_one_stays", "x >> 31 == -1", {"x": -1}, T),
    ("shr_32_masked", "x >> 32 == -8", {"x": -8}, T),
    ("shr_negative_count", "x >> -1 == -1", {"x": -8}, T),
    ("shr_int64", "x >> 62 == -2", {"x": Int64(INT64_MIN)}, T),
    ("ushr_minus_one_int32", "x >>> 28 == 15", {"x": -1}, T),
    ("ushr_zero_count", "x >>> 0 == -1", {"x": -1}, T),
    ("ushr_one_int32", "x >>> 1 == 2147483647", {"x": -1}, T),
    ("ushr_32_masked", "x >>> 32 == -1", {"x": -1}, T),
    ("ushr_int64", "x >>> 60 == 15", {"x": Int64(-1)}, T),
    ("ushr_int64_one", "x >>> 1 == 9223372036854775807L", {"x": Int64(-1)}, T),
    ("ushr_int32_promoted_by_count", "x >>> 1L == 9223372036854775807L", {"x": -1}, T),
    ("ushr_positive", "x >>> 2 == 4", {"x": 16}, T),
    ("shift_real_bottom", "x << 1 == 2", {"x": 1.0}, B),
    ("shift_by_real_bottom", "x << y == 2", {"x": 1, "y": 1.0}, B),
    ("shift_string_bottom", "x >> 1 == 2", {"x": "4"}, B),
    ("ushr_real_bottom", "x >>> 1 == 2", {"x": 4.0}, B),
    ("shift_missing_bottom", "x << 1 == 2", {}, B),
])


class BitwiseTests(_Base):
    pass


_add_cases(BitwiseTests, [
    ("and", "x & 6 == 2", {"x": 3}, T),
    ("or", "x | 4 == 7", {"x": 3}, T),
    ("xor", "x ^ 1 == 2", {"x": 3}, T),
    ("xor_minus_one", "x ^ -1 == -6", {"x": 5}, T),
    ("not", "~x == -4", {"x": 3}, T),
    ("not_minus_one", "~x == 0", {"x": -1}, T),
    ("not_int64", "~x == -1", {"x": Int64(0)}, T),
    ("not_int64_max", "~x == -9223372036854775808L", {"x": Int64(INT64_MAX)}, T),
    ("and_int64_mask", "x & 255 == 255", {"x": Int64(-1)}, T),
    ("and_int64_hex_literal", "x & 0xff00000000L == 0x1200000000L", {"x": 0x1234567890}, T),
    ("or_int64_literal", "x | 1L == 1", {"x": 0}, T),
    ("and_real_bottom", "x & 1 == 1", {"x": 1.0}, B),
    ("or_real_bottom", "x | 1 == 1", {"x": 1.0}, B),
    ("xor_real_attr_bottom", "x ^ y == 1", {"x": 1, "y": 0.0}, B),
    ("not_real_bottom", "~x == -2", {"x": 1.5}, B),
    ("not_string_bottom", "~x == -2", {"x": "1"}, B),
    ("and_missing_bottom", "x & 1 == 1", {}, B),
    ("and_opaque_bottom", "x & 1 == 1", {"x": b"\x01"}, B),
])


# ---------------------------------------------------------------------------
# Type tests and require (6.1.6; language reference "Type Tests")
# ---------------------------------------------------------------------------

class TypeTestTests(_Base):
    pass


_add_cases(TypeTestTests, [
    ("int32_plain_small", "int32(x)", {"x": 5}, T),
    ("int32_Int32", "int32(x)", {"x": Int32(5)}, T),
    ("int32_min", "int32(x)", {"x": INT32_MIN}, T),
    ("int32_Int64", "int32(x)", {"x": Int64(5)}, F),
    ("int32_big_plain", "int32(x)", {"x": 2 ** 40}, F),
    ("int32_just_beyond", "int32(x)", {"x": 2 ** 31}, F),
    ("int32_real", "int32(x)", {"x": 5.0}, F),
    ("int32_string", "int32(x)", {"x": "5"}, F),
    ("int32_opaque", "int32(x)", {"x": b"5"}, F),
    ("int32_missing", "int32(x)", {}, B),
    ("int64_Int64", "int64(x)", {"x": Int64(5)}, T),
    ("int64_big_plain", "int64(x)", {"x": 2 ** 40}, T),
    ("int64_just_beyond_int32", "int64(x)", {"x": 2 ** 31}, T),
    ("int64_just_below_int32", "int64(x)", {"x": -(2 ** 31) - 1}, T),
    ("int64_plain_small", "int64(x)", {"x": 5}, F),
    ("int64_Int32", "int64(x)", {"x": Int32(5)}, F),
    ("int64_real", "int64(x)", {"x": 5.0}, F),
    ("int64_missing", "int64(x)", {}, B),
    ("real64_real", "real64(x)", {"x": 5.0}, T),
    ("real64_nan", "real64(x)", {"x": NAN}, T),
    ("real64_inf", "real64(x)", {"x": INF}, T),
    ("real64_int", "real64(x)", {"x": 5}, F),
    ("real64_string", "real64(x)", {"x": "5.0"}, F),
    ("real64_missing", "real64(x)", {}, B),
    ("string_string", "string(x)", {"x": "a"}, T),
    ("string_empty", "string(x)", {"x": ""}, T),
    ("string_opaque", "string(x)", {"x": b"a"}, F),
    ("string_int", "string(x)", {"x": 1}, F),
    ("string_missing", "string(x)", {}, B),
    ("opaque_bytes", "opaque(x)", {"x": b"a"}, T),
    ("opaque_empty", "opaque(x)", {"x": b""}, T),
    ("opaque_bytearray", "opaque(x)", {"x": bytearray(b"ab")}, T),
    ("opaque_string", "opaque(x)", {"x": "a"}, F),
    ("opaque_int", "opaque(x)", {"x": 0}, F),
    ("opaque_missing", "opaque(x)", {}, B),
    ("nan_nan", "nan(x)", {"x": NAN}, T),
    ("nan_number", "nan(x)", {"x": 1.0}, F),
    ("nan_infinity", "nan(x)", {"x": INF}, F),
    ("nan_int_bottom", "nan(x)", {"x": 5}, B),
    ("nan_string_bottom", "nan(x)", {"x": "NaN"}, B),
    ("nan_missing", "nan(x)", {}, B),
    ("require_present", "require(x)", {"x": 1}, T),
    ("require_empty_string", "require(x)", {"x": ""}, T),
    ("require_empty_opaque", "require(x)", {"x": b""}, T),
    ("require_zero", "require(x)", {"x": 0}, T),
    ("require_absent", "require(x)", {"y": 1}, B),
    ("require_escaped_name", r"require(a\ b)", {"a b": 1}, T),
    ("type_test_with_space", "int32 (x)", {"x": 1}, T),
    ("not_type_test_false", "!int32(x)", {"x": "a"}, T),
])


# ---------------------------------------------------------------------------
# equals() (6.1.7)
# ---------------------------------------------------------------------------

class EqualsFunctionTests(_Base):
    pass


_add_cases(EqualsFunctionTests, [
    ("first_of_many", "equals(x, 1, 2, 3)", {"x": 1}, T),
    ("last_of_many", "equals(x, 1, 2, 3)", {"x": 3}, T),
    ("none_match", "equals(x, 1, 2, 3)", {"x": 4}, F),
    ("single_value", "equals(x, 7)", {"x": 7}, T),
    ("missing", "equals(x, 1, 2)", {}, B),
    ("strings_match", 'equals(x, "a", "b")', {"x": "b"}, T),
    ("strings_no_match", 'equals(x, "a", "b")', {"x": "c"}, F),
    ("strings_vs_int_value", 'equals(x, "a", "b")', {"x": 1}, B),
    ("numbers_vs_string_value", "equals(x, 1, 2)", {"x": "1"}, B),
    ("promotion_real", "equals(x, 1, 2.5, 3L)", {"x": 2.5}, T),
    ("promotion_int64", "equals(x, 1, 2.5, 3L)", {"x": Int64(3)}, T),
    ("promotion_int_to_real", "equals(x, 1, 2.5, 3L)", {"x": 3.0}, T),
    ("promotion_int32_vs_int64_literal", "equals(x, 3L)", {"x": 3}, T),
    ("mixed_types_match_string", 'equals(x, 1, "a")', {"x": "a"}, T),
    ("mixed_types_match_int", 'equals(x, 1, "a")', {"x": 1}, T),
    ("mixed_types_no_match_is_bottom", 'equals(x, 1, "a")', {"x": "b"}, B),
    ("attribute_value", "equals(x, y, 1)", {"x": 2, "y": 2}, T),
    ("missing_value_attr_but_literal_matches", "equals(x, y, 1)", {"x": 1}, T),
    ("missing_value_attr_no_match", "equals(x, y, 1)", {"x": 2}, B),
    ("opaque_subject", "equals(x, 1)", {"x": b"\x01"}, B),
    ("nan_equals_nan_attr", "equals(x, y)", {"x": NAN, "y": NAN}, T),
    ("neg_zero_not_zero", "equals(x, 0.0)", {"x": -0.0}, F),
    ("not_equals_function", "!equals(x, 1, 2)", {"x": 3}, T),
    # the first argument may be a string function of a name (section 6's
    # string comparisons; Avis evaluates each comparison as ==)
    ("fold_case_subject", 'equals(fold-case(User), "ann@home")', {"User": "Ann@Home"}, T),
    ("fold_case_subject_upper", 'equals(fold-case(User), "ann@home")', {"User": "ANN@HOME"}, T),
    ("fold_case_subject_other", 'equals(fold-case(User), "ann@home")', {"User": "bob@work"}, F),
    ("fold_case_subject_many", 'equals(fold-case(User), "ann@home", "bob@work")',
     {"User": "Bob@Work"}, T),
    ("fold_case_subject_literal_not_folded", 'equals(fold-case(User), "Ann@Home")',
     {"User": "Ann@Home"}, F),
    ("fold_case_subject_missing", 'equals(fold-case(User), "a")', {}, B),
    ("fold_case_subject_int", 'equals(fold-case(User), "42")', {"User": 42}, B),
    ("fold_case_subject_opaque", 'equals(fold-case(User), "a")', {"User": b"a"}, B),
    ("fold_case_subject_attribute_value", "equals(fold-case(x), y)", {"x": "AB", "y": "ab"}, T),
    ("fold_case_subject_attribute_value_missing", 'equals(fold-case(x), y, "z")',
     {"x": "AB"}, B),
    ("fold_case_subject_folded_value", 'equals(fold-case(x), fold-case(y))',
     {"x": "AB", "y": "aB"}, T),
    ("decompose_subject", 'equals(decompose(Name), "e\u0301")', {"Name": "\u00e9"}, T),
    ("decompose_subject_not_composed", 'equals(decompose(Name), "\u00e9")',
     {"Name": "\u00e9"}, F),
    ("decompose_compat_subject", 'equals(decompose-compat(x), "fi")', {"x": "\ufb01"}, T),
    ("nested_subject", 'equals(fold-case(decompose-compat(x)), "fi")', {"x": "\ufb01"}, T),
    ("not_fold_case_subject", '!equals(fold-case(User), "ann@home")', {"User": "Bob"}, T),
])


class PresenceClientTests(_Base):
    """Expressions of the shape tickertape and presence clients send:
    type tests, equals over a name and over fold-case, and contains over
    fold-case, under && and ||."""

    EXPR = ("Presence-Protocol < 2000 && string(Groups)"
            " && equals(Presence-Info, 'initial', 'update')"
            ' && (contains(fold-case(Groups), "|elvin|", "|dev|")'
            ' || equals(fold-case(User), "ann@home"))')
    BASE = {"Presence-Protocol": 1000, "Presence-Info": "update",
            "Groups": "|Sales|", "User": "someone"}


_add_cases(PresenceClientTests, [
    ("group_by_folded_contains", PresenceClientTests.EXPR,
     {**PresenceClientTests.BASE, "Groups": "|Elvin|Ops|"}, T),
    ("user_by_folded_equals", PresenceClientTests.EXPR,
     {**PresenceClientTests.BASE, "User": "Ann@HOME"}, T),
    ("neither", PresenceClientTests.EXPR, PresenceClientTests.BASE, F),
    ("newer_protocol", PresenceClientTests.EXPR,
     {**PresenceClientTests.BASE, "Presence-Protocol": 3000, "User": "ann@home"}, F),
    ("other_info", PresenceClientTests.EXPR,
     {**PresenceClientTests.BASE, "Presence-Info": "final", "User": "ann@home"}, F),
    ("groups_not_string", PresenceClientTests.EXPR,
     {**PresenceClientTests.BASE, "Groups": 7, "User": "ann@home"}, F),
    ("user_missing_group_matches", PresenceClientTests.EXPR,
     {k: v for k, v in {**PresenceClientTests.BASE, "Groups": "|DEV|"}.items() if k != "User"},
     T),
    ("user_missing_no_group", PresenceClientTests.EXPR,
     {k: v for k, v in PresenceClientTests.BASE.items() if k != "User"}, B),
    ("long_disjunction_of_users",
     " || ".join(f'equals(fold-case(User), "user{i}@example.com", "alias{i}")'
                 for i in range(200)) + ' && require(Presence-Info)',
     {"User": "USER137@Example.COM", "Presence-Info": "initial"}, T),
])


# ---------------------------------------------------------------------------
# String predicates (6.1.8; language reference "String Comparisons")
# ---------------------------------------------------------------------------

class StringPredicateTests(_Base):
    pass


_add_cases(StringPredicateTests, [
    ("begins_with_true", 'begins-with(x, "foo")', {"x": "foobar"}, T),
    ("begins_with_false", 'begins-with(x, "foo")', {"x": "barfoo"}, F),
    ("begins_with_itself", 'begins-with(x, "foo")', {"x": "foo"}, T),
    ("begins_with_empty", 'begins-with(x, "")', {"x": "anything"}, T),
    ("begins_with_empty_of_empty", 'begins-with(x, "")', {"x": ""}, T),
    ("begins_with_longer", 'begins-with(x, "foobar")', {"x": "foo"}, F),
    ("begins_with_any", 'begins-with(x, "a", "b", "c")', {"x": "cat"}, T),
    ("begins_with_none", 'begins-with(x, "a", "b")', {"x": "cat"}, F),
    ("begins_with_missing", 'begins-with(x, "a")', {}, B),
    ("begins_with_int", 'begins-with(x, "1")', {"x": 12}, B),
    ("begins_with_opaque", 'begins-with(x, "a")', {"x": b"abc"}, B),
    ("begins_with_case_sensitive", 'begins-with(x, "foo")', {"x": "Foobar"}, F),
    ("ends_with_true", 'ends-with(x, "bar")', {"x": "foobar"}, T),
    ("ends_with_false", 'ends-with(x, "foo")', {"x": "foobar"}, F),
    ("ends_with_empty", 'ends-with(x, "")', {"x": "x"}, T),
    ("ends_with_any", 'ends-with(x, ".c", ".h")', {"x": "main.h"}, T),
    ("ends_with_missing", 'ends-with(x, "a")', {}, B),
    ("ends_with_real", 'ends-with(x, "0")', {"x": 1.0}, B),
    ("contains_true", 'contains(x, "oba")', {"x": "foobar"}, T),
    ("contains_false", 'contains(x, "baz")', {"x": "foobar"}, F),
    ("contains_empty", 'contains(x, "")', {"x": ""}, T),
    ("contains_itself", 'contains(x, "foobar")', {"x": "foobar"}, T),
    ("contains_any", 'contains(x, "zz", "ob")', {"x": "foobar"}, T),
    ("contains_missing", 'contains(x, "a")', {}, B),
    ("contains_int", 'contains(x, "1")', {"x": 1}, B),
    ("contains_unicode", 'contains(x, "\u20ac")', {"x": "cost 5\u20ac"}, T),
    ("contains_with_space_before_paren", 'contains (x, "a")', {"x": "cat"}, T),
    # wildcard: * any run, ? one character, [...] / [!...] classes,
    # backslash escapes, matched against the whole string
    ("wildcard_reference_example", 'wildcard(Message, "*[Hh]ello*")',
     {"Message": "hello sailor"}, T),
    ("wildcard_star_any_run", 'wildcard(x, "a*c")', {"x": "abbbc"}, T),
    ("wildcard_star_empty_run", 'wildcard(x, "a*c")', {"x": "ac"}, T),
    ("wildcard_whole_string", 'wildcard(x, "abc")', {"x": "abcd"}, F),
    ("wildcard_whole_string_prefix", 'wildcard(x, "bcd")', {"x": "abcd"}, F),
    ("wildcard_star_alone_matches_empty", 'wildcard(x, "*")', {"x": ""}, T),
    ("wildcard_question_one_char", 'wildcard(x, "a?c")', {"x": "abc"}, T),
    ("wildcard_question_not_zero", 'wildcard(x, "a?c")', {"x": "ac"}, F),
    ("wildcard_question_not_two", 'wildcard(x, "a?c")', {"x": "abbc"}, F),
    ("wildcard_question_multibyte_char", 'wildcard(x, "a?c")', {"x": "a\u20acc"}, T),
    ("wildcard_class", 'wildcard(x, "[abc]x")', {"x": "bx"}, T),
    ("wildcard_class_miss", 'wildcard(x, "[abc]x")', {"x": "dx"}, F),
    ("wildcard_class_range", 'wildcard(x, "[a-c]x")', {"x": "bx"}, T),
    ("wildcard_class_range_miss", 'wildcard(x, "[a-c]x")', {"x": "dx"}, F),
    ("wildcard_negated_class", 'wildcard(x, "[!a]bc")', {"x": "xbc"}, T),
    ("wildcard_negated_class_miss", 'wildcard(x, "[!a]bc")', {"x": "abc"}, F),
    ("wildcard_dot_literal", 'wildcard(x, "a.c")', {"x": "abc"}, F),
    ("wildcard_dot_literal_match", 'wildcard(x, "a.c")', {"x": "a.c"}, T),
    ("wildcard_regex_chars_literal", 'wildcard(x, "a+(b)")', {"x": "a+(b)"}, T),
    ("wildcard_escaped_star", r'wildcard(x, "a\\*")', {"x": "a*"}, T),
    ("wildcard_escaped_star_not_wild", r'wildcard(x, "a\\*")', {"x": "ab"}, F),
    ("wildcard_escaped_question", r'wildcard(x, "a\\?")', {"x": "ab"}, F),
    ("wildcard_star_spans_newline", 'wildcard(x, "a*b")', {"x": "a\nb"}, T),
    ("wildcard_any", 'wildcard(x, "*.c", "*.h")', {"x": "x.h"}, T),
    ("wildcard_any_none", 'wildcard(x, "*.c", "*.h")', {"x": "x.o"}, F),
    ("wildcard_case_sensitive", 'wildcard(x, "A*")', {"x": "abc"}, F),
    ("wildcard_missing", 'wildcard(x, "*")', {}, B),
    ("wildcard_int", 'wildcard(x, "*")', {"x": 3}, B),
    # regex: unanchored search, DOTALL
    ("regex_reference_example", 'regex(User, "[Ss]egall?")', {"User": "bill@segall.net"}, T),
    ("regex_no_match", 'regex(User, "[Ss]egall?")', {"User": "alice"}, F),
    ("regex_unanchored", 'regex(x, "b")', {"x": "abc"}, T),
    ("regex_anchor_start", 'regex(x, "^b")', {"x": "abc"}, F),
    ("regex_anchor_both", 'regex(x, "^abc$")', {"x": "abc"}, T),
    ("regex_anchor_both_miss", 'regex(x, "^abc$")', {"x": "abcd"}, F),
    ("regex_alternation", 'regex(x, "^(cat|dog)$")', {"x": "dog"}, T),
    ("regex_dot_matches_newline", 'regex(x, "a.b")', {"x": "a\nb"}, T),
    ("regex_case_sensitive", 'regex(x, "abc")', {"x": "ABC"}, F),
    ("regex_repetition", 'regex(x, "^a{2,3}$")', {"x": "aaa"}, T),
    ("regex_repetition_miss", 'regex(x, "^a{2,3}$")', {"x": "aaaa"}, F),
    ("regex_escaped_dot", r'regex(x, "a\\.c")', {"x": "abc"}, F),
    ("regex_escaped_dot_match", r'regex(x, "a\\.c")', {"x": "a.c"}, T),
    ("regex_several_patterns", 'regex(x, "^a", "^b")', {"x": "bcd"}, T),
    ("regex_several_patterns_none", 'regex(x, "^a", "^b")', {"x": "cd"}, F),
    ("regex_empty_pattern", 'regex(x, "")', {"x": "any"}, T),
    ("regex_unicode", 'regex(x, "^\u00e9+$")', {"x": "\u00e9\u00e9"}, T),
    ("regex_missing", 'regex(x, "a")', {}, B),
    ("regex_int", 'regex(x, "1")', {"x": 1}, B),
    ("regex_opaque", 'regex(x, "a")', {"x": b"a"}, B),
    ("regex_with_space_before_paren", 'regex (x, "a")', {"x": "a"}, T),
    ("not_regex", '!regex(x, "a")', {"x": "b"}, T),
    ("not_regex_missing", '!regex(x, "a")', {}, B),
])


class ReferenceExampleTests(_Base):
    """The worked examples of the subscription language reference."""

    EXPR = '(Group == "elvin" || Group == "Chat") && ! regex (User, "[Ss]egall?")'
    FIRST = {"Group": "Chat", "User": "alice", "Message": "hello sailor",
             "Timeout": 10, "Message-Id": "07cf0b15003409-5i3N7XDKbPVaQ-28cf-22"}
    SECOND = {"Group": "elvin", "User": "bill@segall.net",
              "Message": "release early", "Timeout": 10,
              "Message-Id": "7c0b1f00540039-i357XNKbDPaQV-8c2f-22"}

    def test_first_matches(self):
        self.check(self.EXPR, self.FIRST, T)

    def test_second_does_not_match(self):
        self.check(self.EXPR, self.SECOND, F)

    def test_wildcard_example_first(self):
        self.check('wildcard (Message, "*[Hh]ello*") && Timeout > 5', self.FIRST, T)

    def test_wildcard_example_second(self):
        self.check('wildcard (Message, "*[Hh]ello*") && Timeout > 5', self.SECOND, F)

    def test_fold_case_example(self):
        sub = Subscription('begins-with (fold-case (name), "foo")')
        for value in ("Foobar", "FOOBAR", "fOoBaR"):
            self.assertTrue(sub.matches({"name": value}), value)
        self.assertFalse(sub.matches({"name": "bar"}))

    def test_explicit_numeric_truth(self):
        self.check("(Example != 0)", {"Example": 3}, T)

    def test_api_docstring_example(self):
        self.check('Group == "chat" && size(Message) < 140',
                   {"Group": "chat", "Message": "hi"}, T)


# ---------------------------------------------------------------------------
# String functions, size() and Unicode (6.1.9, 6.1.10)
# ---------------------------------------------------------------------------

class UnicodeFunctionTests(_Base):
    pass


_add_cases(UnicodeFunctionTests, [
    ("fold_case_lower", 'fold-case(x) == "hello"', {"x": "HeLLo"}, T),
    # Lower case as Avis (Java toLowerCase), not Unicode case folding.
    ("fold_case_sharp_s_kept", 'fold-case(x) == "stra\u00dfe"', {"x": "Stra\u00dfe"}, T),
    ("fold_case_sharp_s_not_folded", 'fold-case(x) == "strasse"', {"x": "Stra\u00dfe"}, F),
    ("fold_case_greek_sigma", 'fold-case(x) == "\u03c3"', {"x": "\u03a3"}, T),
    ("fold_case_final_sigma_by_context", 'fold-case(x) == "\u03bf\u03b4\u03bf\u03c2"',
     {"x": "\u039f\u0394\u039f\u03a3"}, T),
    ("fold_case_small_final_sigma_kept", 'fold-case(x) == "\u03c3"', {"x": "\u03c2"}, F),
    ("fold_case_dotted_capital_i", 'fold-case(x) == "i\u0307stanbul"', {"x": "\u0130stanbul"}, T),
    ("fold_case_non_string", 'fold-case(x) == "1"', {"x": 1}, B),
    ("fold_case_missing", 'fold-case(x) == "a"', {}, B),
    ("fold_case_in_contains", 'contains(fold-case(x), "hello")', {"x": "Say HELLO"}, T),
    ("fold_case_ne", 'fold-case(x) != "a"', {"x": "A"}, F),
    ("decompose_a_grave", 'decompose(x) == "a\u0300"', {"x": "\u00e0"}, T),
    ("decompose_keeps_decomposed", 'decompose(x) == "a\u0300"', {"x": "a\u0300"}, T),
    ("decompose_not_composed", 'decompose(x) == "\u00e0"', {"x": "\u00e0"}, F),
    ("decompose_keeps_compat_ligature", 'decompose(x) == "fi"', {"x": "\ufb01"}, F),
    ("decompose_compat_ligature", 'decompose-compat(x) == "fi"', {"x": "\ufb01"}, T),
    ("decompose_compat_also_canonical", 'decompose-compat(x) == "e\u0301"', {"x": "\u00e9"}, T),
    ("decompose_compat_superscript", 'decompose-compat(x) == "2"', {"x": "\u00b2"}, T),
    ("decompose_begins_with_base", 'begins-with(decompose(x), "e")', {"x": "\u00e9t\u00e9"}, T),
    ("decompose_non_string", 'decompose(x) == "a"', {"x": b"a"}, B),
    ("decompose_compat_non_string", 'decompose-compat(x) == "1"', {"x": 1}, B),
    ("fold_of_decompose", 'fold-case(decompose(x)) == "e\u0301"', {"x": "\u00c9"}, T),
    ("decompose_of_fold", 'decompose(fold-case(x)) == "e\u0301"', {"x": "\u00c9"}, T),
    ("string_function_vs_attr", "fold-case(x) == y", {"x": "AB", "y": "ab"}, T),
    ("regex_on_fold_case", 'regex(fold-case(x), "^abc$")', {"x": "ABC"}, T),
    ("wildcard_on_decompose_compat", 'wildcard(decompose-compat(x), "f*")', {"x": "\ufb01x"}, T),
    ("ends_with_on_fold_case", 'ends-with(fold-case(x), "z")', {"x": "XYZ"}, T),
    # size(): bytes of the UTF-8 encoding (6.1.9), bytes of an opaque
    ("size_ascii", "size(x) == 5", {"x": "hello"}, T),
    ("size_empty_string", "size(x) == 0", {"x": ""}, T),
    ("size_two_byte_char", "size(x) == 2", {"x": "\u00e9"}, T),
    ("size_three_byte_char", "size(x) == 3", {"x": "\u20ac"}, T),
    ("size_four_byte_char", "size(x) == 4", {"x": "\U0001F600"}, T),
    ("size_mixed", "size(x) == 10", {"x": "a\u00e9\u20ac\U0001F600"}, T),
    ("size_counts_bytes_not_chars", "size(x) == 1", {"x": "\u00e9"}, F),
    ("size_opaque", "size(x) == 3", {"x": b"\x00\x01\xff"}, T),
    ("size_empty_opaque", "size(x) == 0", {"x": b""}, T),
    ("size_int_bottom", "size(x) == 4", {"x": 1234}, B),
    ("size_real_bottom", "size(x) == 1", {"x": 1.0}, B),
    ("size_int64_bottom", "size(x) == 8", {"x": Int64(1)}, B),
    ("size_missing_bottom", "size(x) == 0", {}, B),
    ("size_compare", "size(Message) < 140", {"Message": "x" * 139}, T),
    ("size_compare_limit", "size(Message) < 140", {"Message": "x" * 140}, F),
    ("size_arith", "size(x) * 2 == 6", {"x": "abc"}, T),
    ("size_with_space", "size (x) == 1", {"x": "a"}, T),
])


# ---------------------------------------------------------------------------
# Constant folding must keep meaning (decisions on EXP_IS_TRIVIAL)
# ---------------------------------------------------------------------------

class ConstantPartTests(_Base):

    def test_or_false_constant_is_identity(self):
        sub = Subscription("x == 1 || 1 == 2")
        self.assertIs(sub.evaluate({"x": 1}), T)
        self.assertIs(sub.evaluate({"x": 2}), F)
        self.assertIs(sub.evaluate({}), B)

    def test_and_true_constant_is_identity(self):
        sub = Subscription("x == 1 && 1 == 1")
        self.assertIs(sub.evaluate({"x": 1}), T)
        self.assertIs(sub.evaluate({"x": 2}), F)
        self.assertIs(sub.evaluate({}), B)

    def test_or_constant_bottom(self):
        # true || bottom is true; false || bottom is bottom
        sub = Subscription("x == 1 || 1 / 0 == 1")
        self.assertIs(sub.evaluate({"x": 1}), T)
        self.assertIs(sub.evaluate({"x": 2}), B)

    def test_and_constant_bottom(self):
        # false && bottom is false; true && bottom is bottom
        sub = Subscription("x == 1 && 1 / 0 == 1")
        self.assertIs(sub.evaluate({"x": 2}), F)
        self.assertIs(sub.evaluate({"x": 1}), B)

    def test_xor_constant_true(self):
        sub = Subscription("x == 1 ^^ 1 == 1")
        self.assertIs(sub.evaluate({"x": 1}), F)
        self.assertIs(sub.evaluate({"x": 2}), T)
        self.assertIs(sub.evaluate({}), B)

    def test_constant_arithmetic_operand(self):
        self.check("x == 2 * 3 + 1", {"x": 7}, T)

    def test_constant_real_arithmetic(self):
        self.check("x == 1.0 / 4", {"x": 0.25}, T)

    def test_constant_wraps(self):
        self.check("x == 2147483647 + 1", {"x": INT32_MIN}, T)

    def test_constant_int64_wraps(self):
        self.check("x == 9223372036854775807L + 1", {"x": Int64(INT64_MIN)}, T)


# ---------------------------------------------------------------------------
# The API: matches, evaluate, value typing
# ---------------------------------------------------------------------------

class ApiTests(_Base):

    def test_matches_only_true(self):
        sub = Subscription("x == 1")
        self.assertIs(sub.matches({"x": 1}), True)
        self.assertIs(sub.matches({"x": 2}), False)
        self.assertIs(sub.matches({}), False)

    def test_evaluate_three_values(self):
        sub = Subscription("x == 1")
        self.assertIs(sub.evaluate({"x": 1}), True)
        self.assertIs(sub.evaluate({"x": 2}), False)
        self.assertIsNone(sub.evaluate({}))

    def test_evaluate_does_not_modify_input(self):
        attrs = {"x": 1, "y": bytearray(b"a")}
        Subscription("x == 1 && opaque(y)").evaluate(attrs)
        self.assertEqual(attrs, {"x": 1, "y": bytearray(b"a")})

    def test_reusable(self):
        sub = Subscription("x > 1")
        results = [sub.evaluate({"x": i}) for i in range(4)]
        self.assertEqual(results, [False, False, True, True])

    def test_extra_attributes_ignored(self):
        self.check("x == 1", {"x": 1, "y": "z", "w": b"", "v": 1.5}, T)

    def test_int32_and_int64_are_ints(self):
        self.assertEqual(Int32(5), 5)
        self.assertEqual(Int64(5), 5)
        self.assertIsInstance(Int32(5), int)
        self.assertIsInstance(Int64(5), int)

    def test_int32_min_plain_is_int32(self):
        self.check("int32(x)", {"x": -(2 ** 31)}, T)

    def test_int64_value_compares_with_int32_value(self):
        self.check("x == y", {"x": Int32(7), "y": Int64(7)}, T)

    def test_subscription_error_is_raised(self):
        self.assertRaises(SubscriptionError, Subscription, "x ==")

    def test_real_attribute_from_int_literal_compare(self):
        self.check("x > 0", {"x": 1e-300}, T)


class NaNArithmeticTests(_Base):

    def test_nan_plus_one_is_nan(self):
        self.check("x + 1 == y", {"x": NAN, "y": NAN}, T)

    def test_infinity_minus_infinity_is_nan(self):
        self.check("x - x == y", {"x": INF, "y": NAN}, T)

    def test_nan_mod(self):
        self.check("x % 0.0 == y", {"x": 1.0, "y": NAN}, T)

    def test_real_mod_of_infinity(self):
        self.check("x % 2.0 == y", {"x": INF, "y": NAN}, T)

    def test_nan_function_after_arithmetic_not_allowed_so_compare(self):
        self.check("x / y > 1.0", {"x": 0.0, "y": 0.0}, T)


class UnicodeRegexClassTests(_Base):
    """``regex`` is POSIX with UTR #18 Level 1 extensions: a POSIX bracket
    class has its Unicode meaning (Annex C), not RE2's ASCII one; ``\\d``,
    ``\\w`` and ``\\s`` stay ASCII (docs/subscription-language.md)."""

    def classes(self, rows):
        self.check_rows([(f'regex(s, "{pattern}")', {"s": subject}, T if hit else F)
                         for pattern, subject, hit in rows])

    def test_each_class_on_ascii_and_beyond(self):
        self.classes([
            ("^[[:alpha:]]+$", "abc", True), ("^[[:alpha:]]+$", "\u00e9", True),
            ("^[[:alpha:]]+$", "\u03a3\u0391\u03a3", True), ("^[[:alpha:]]+$", "\u0416", True),
            ("^[[:alpha:]]+$", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", True),  # Thai, vowel marks
            ("^[[:alpha:]]+$", "\u216b", True),          # Roman numeral (Nl)
            ("^[[:alpha:]]+$", "a1", False), ("^[[:alpha:]]+$", "\u0663", False),
            ("^[[:upper:]]+$", "\u03a3\u0391\u03a3", True), ("^[[:upper:]]+$", "\u0416\u00c9", True),
            ("^[[:upper:]]+$", "\u24b6", True),          # circled A: Other_Uppercase
            ("^[[:upper:]]+$", "\u0436", False), ("^[[:upper:]]+$", "A\u01c5", False),  # Lt
            ("^[[:lower:]]+$", "\u0436\u00e9", True), ("^[[:lower:]]+$", "\u02b0\u00aa", True),
            ("^[[:lower:]]+$", "\u0416", False),
            ("^[[:digit:]]+$", "123", True), ("^[[:digit:]]+$", "\u0663\u0967", True),
            ("^[[:digit:]]+$", "\u00bd", False), ("^[[:digit:]]+$", "\u2160", False),
            ("^[[:alnum:]]+$", "\u00e9\u0663x9", True), ("^[[:alnum:]]+$", "a-1", False),
            ("^[[:xdigit:]]+$", "09afAF", True), ("^[[:xdigit:]]+$", "\u0663", False),
            ("^[[:xdigit:]]+$", "\uff21", False),        # fullwidth A stays out
            ("^[[:space:]]+$", " \t\n\r\x0b\x0c", True),
            ("^[[:space:]]+$", "\u00a0\u2003\u3000\u2028\x85", True),
            ("^[[:space:]]+$", "\u200b", False),        # zero width space: Cf
            ("^[[:blank:]]+$", " \t\u3000", True), ("^[[:blank:]]+$", "\n", False),
            ("^[[:cntrl:]]+$", "\x01\x7f\x9f", True), ("^[[:cntrl:]]+$", "\u200b", False),
            ("^[[:punct:]]+$", "!$+<=>^`|~", True), ("^[[:punct:]]+$", "\u00bf\u00ab\u20ac", True),
            ("^[[:punct:]]+$", "a", False),
            ("^[[:graph:]]+$", "a\u00e9\u20ac\u200b", True), ("^[[:graph:]]+$", "a b", False),
            ("^[[:print:]]+$", "a \u3000\u00e9", True), ("^[[:print:]]+$", "a\tb", False),
            ("^[[:word:]]+$", "a_\u00e9e\u0301\u0663", True), ("^[[:word:]]+$", "a-b", False),
        ])

    def test_negated_and_mixed_with_ranges(self):
        self.classes([
            ("^[^[:alpha:]]+$", "12 !", True), ("^[^[:alpha:]]+$", "1\u00e9", False),
            ("^[^[:alpha:]]+$", "\u0416", False),
            ("^[[:^alpha:]]+$", "12 !", True), ("^[[:^alpha:]]+$", "\u00e9", False),
            ("^[^[:^digit:]]+$", "\u0663", True), ("^[^[:^digit:]]+$", "a", False),
            ("^[[:alpha:]0-9_]+$", "\u00e9_09", True), ("^[[:alpha:]0-9_]+$", "\u00e9-0", False),
            ("^[[:alpha:]0-9_]+$", "\u0663", False),
            ("^[^[:space:][:digit:]]+$", "ab", True), ("^[^[:space:][:digit:]]+$", "a\u3000", False),
            ("^[^[:space:][:digit:]]+$", "a\u0663", False),
            ("^[]x[:digit:]]+$", "]x\u0663", True),
            ("(?i)^[[:upper:]]+$", "\u0436", True),
        ])

    def test_perl_classes_stay_ascii(self):
        self.classes([
            (r"^\\d+$", "123", True), (r"^\\d+$", "\u0663", False),
            (r"^\\w+$", "a_1", True), (r"^\\w+$", "\u00e9", False),
            (r"^\\s+$", " \t", True), (r"^\\s+$", "\u3000", False),
            (r"^\\pL+$", "\u00e9\u0416", True),
        ])

    def test_escaped_and_quoted_brackets_are_left_alone(self):
        self.classes([
            # a literal [, then the set of ':', 'a', 'l', 'p', 'h', then ]
            (r"^\\[[:alpha:]]$", "[\u00e9]", False), (r"^\\[[:alpha:]]$", "[:]", True),
            (r"^\\Q[[:alpha:]]\\E$", "[[:alpha:]]", True),
        ])

    def test_refused_forms(self):
        from elvin import errors
        for pattern in ("[[:^alpha:]x]", "[[:foo:]]", "[[:alpha:]"):
            with self.assertRaises(SubscriptionError) as cm:
                Subscription(f'regex(s, "{pattern}")')
            self.assertEqual(cm.exception.code, errors.INVALID_REGEXP, pattern)
            self.assertEqual(cm.exception.offset, 9, pattern)

    def test_a_class_weighs_about_1400_instructions(self):
        # max-pattern-work charges a test its weight times the string's
        # length: a Unicode class is a large RE2 program.
        from elvin.subscription import patterns
        for pattern, most in (("[[:alpha:]]", 1400), ("[[:word:]]", 1500), ("[[:digit:]]", 100),
                              ("[[:space:]]", 30), ("[[:xdigit:]]", 10)):
            self.assertLess(patterns.weighed_regexes([pattern])[1], most, pattern)
