"""Rejected subscriptions: every error code of section 6.3 with its offset.

Codes are the Nack codes of the client protocol 4.0 draft
(the Elvin client protocol 4.0, section 7.4.2 table,
lines ~1704-1725), their meaning is section 6.3; offsets are 0-based
character offsets of the token where the problem is found, as the project
decided (the table gives each of these errors an "offset" argument).
"""

from twisted.trial import unittest

from elvin import SubscriptionError, Subscription
from elvin.errors import ElvinError
from elvin.subscription import parse
from elvin.subscription.ast import Kind, Node

PARSE_ERROR = 2101
INVALID_TOKEN = 2102
UNTERM_STRING = 2103
UNKNOWN_FUNC = 2104
OVERFLOW = 2105
TYPE_MISMATCH = 2106
TOO_FEW_ARGS = 2107
TOO_MANY_ARGS = 2108
INVALID_REGEXP = 2109
EXP_IS_TRIVIAL = 2110
NESTING_TOO_DEEP = 2112


class _Base(unittest.TestCase):

    def assertRejected(self, text, code, offset=None):
        with self.assertRaises(SubscriptionError) as cm:
            Subscription(text)
        err = cm.exception
        self.assertEqual(err.code, code, f"{text!r}: {err!r}")
        if offset is not None:
            self.assertEqual(err.offset, offset, f"{text!r}: {err!r}")
        self.assertTrue(str(err), "the error has a message")
        return err


    def check_rejects(self, code, rows):
        """Check every (text, offset) row; list all wrong rows in one failure."""
        wrong = []
        for text, offset in rows:
            try:
                Subscription(text)
            except SubscriptionError as err:
                if err.code != code or (offset is not None and err.offset != offset):
                    wrong.append(f"  {text!r}: got {err.code} at {err.offset}, "
                                 f"expected {code} at {offset} ({err})")
            except Exception as e:
                wrong.append(f"  {text!r}: raised {e!r}, expected {code} at {offset}")
            else:
                wrong.append(f"  {text!r}: accepted, expected {code} at {offset}")
        if wrong:
            self.fail(f"{len(wrong)} of {len(rows)} rows wrong:\n" + "\n".join(wrong))

    def check_accepts(self, texts):
        wrong = []
        for text in texts:
            try:
                Subscription(text)
            except Exception as e:
                wrong.append(f"  {text!r}: {e!r}")
        if wrong:
            self.fail(f"{len(wrong)} of {len(texts)} rejected:\n" + "\n".join(wrong))


#: rows per generated test: related rows are checked together and every
#: wrong row is listed in the failure
CHUNK = 3


def _method_name(cls, labels):
    method = f"test_{labels[0]}" + (f"_etc{len(labels)}" if len(labels) > 1 else "")
    assert not hasattr(cls, method), method
    return method


def _reject_test(code, rows):
    def test(self):
        self.check_rejects(code, rows)
    test.__doc__ = "; ".join(f"{t!r} is rejected with {code} at {o}" for t, o in rows)
    return test


def _add_rejects(cls, code, cases, chunk=CHUNK):
    for start in range(0, len(cases), chunk):
        group = cases[start:start + chunk]
        setattr(cls, _method_name(cls, [c[0] for c in group]),
                _reject_test(code, [c[1:] for c in group]))


def _accept_test(texts):
    def test(self):
        self.check_accepts(texts)
    test.__doc__ = "; ".join(f"{t!r} is accepted" for t in texts)
    return test


def _add_accepts(cls, cases, chunk=CHUNK):
    for start in range(0, len(cases), chunk):
        group = cases[start:start + chunk]
        setattr(cls, _method_name(cls, [c[0] for c in group]),
                _accept_test([c[1] for c in group]))


# ---------------------------------------------------------------------------

class ParseErrorTests(_Base):
    """PARSE_ERROR (2101): syntax errors, empty expressions, and a value
    where a predicate is needed or the reverse (Appendix A separates
    sub-exp/bool-exp from value)."""


_add_rejects(ParseErrorTests, PARSE_ERROR, [
    ("empty", "", 0),
    ("only_whitespace", "   ", None),
    ("missing_right_operand", "x ==", 4),
    ("missing_right_operand_trailing_space", "x == ", 5),
    ("missing_left_operand", "== 1", 0),
    ("doubled_operator", "x == == 1", 5),
    ("stray_close_paren", "x == 1 )", 7),
    ("unclosed_paren", "(x == 1", 7),
    ("empty_parens", "()", 1),
    ("empty_parens_operand", "x == ()", 6),
    ("juxtaposed_predicates", "x == 1 y == 2", 7),
    ("dangling_and", "x == 1 &&", 9),
    ("doubled_and", "x == 1 && && y == 1", 10),
    ("dangling_not", "!", 1),
    ("trailing_comma_in_call", "size(x,) == 1", 7),
    ("leading_comma_in_call", "size(,x) == 1", 5),
    ("top_level_comma", "x == 1, y == 2", 6),
    ("lone_comma", ",", 0),
    ("chained_less_than", "a < b < c", 6),
    ("chained_equality", "a == b == c", 7),
    ("mixed_comparison_chain", "a < b == c", 6),
    ("chained_ge", "a >= 1 >= 0", 7),
    ("name_and_name", "x && y", 0),
    ("predicate_and_name", "x == 1 && y", 10),
    ("name_or_predicate", "x || y == 1", 0),
    ("xor_name", "x == 1 ^^ y", 10),
    ("not_name", "!x", None),
    ("not_value", "!(x + 1)", None),
    ("bare_name", "x", 0),
    ("bare_int", "1", 0),
    ("bare_string", '"a"', 0),
    ("bare_real", "1.5", 0),
    ("bare_arithmetic", "x + 1", None),
    ("bare_size", "size(x)", 0),
    ("bare_fold_case", "fold-case(x)", 0),
    ("compare_predicates", "(a == 1) == (b == 2)", None),
    ("predicate_in_arithmetic", "x == 1 + (y == 2)", None),
    ("require_compared", "require(x) == 1", None),
    ("negated_predicate_value", "-require(x) == 1", None),
    ("bit_negated_predicate", "~(x == 1) == 1", None),
    ("string_predicate_compared", 'begins-with(x, "a") == 1', None),
    ("predicate_as_function_arg", "size(x == 1) == 1", None),
    ("name_is_greedy", "x==1", 0),
    ("name_is_greedy_pipe", "pipe=>20", 0),
    ("name_is_greedy_and", "a==1&&b==2", 0),
    ("name_pattern_arg", 'begins-with(x, y)', 15),
    ("name_second_pattern_arg", 'regex(x, "a", y)', 14),
    ("function_pattern_arg", 'begins-with(x, fold-case(y))', 15),
    ("type_test_of_expression", "int32(x + 1)", 6),
    ("type_test_of_function", "int32(size(x))", 6),
    ("require_of_expression", "require(x + 1)", 8),
    ("nan_of_function", "nan(fold-case(x))", 4),
    ("predicate_in_equals_args", "equals(x, y == 1)", None),
])


class InvalidTokenTests(_Base):
    """INVALID_TOKEN (2102): characters that cannot start any token, and
    octal literals with 8 or 9."""


_add_rejects(InvalidTokenTests, INVALID_TOKEN, [
    ("dollar_after_expression", "x == 1 $", 7),
    ("at_sign_before_name", "@x == 1", 0),
    ("hash_start", "#x == 1", 0),
    ("octal_with_8", "x == 08", 5),
    ("octal_with_9_later", "x == 0779", 5),
    ("negative_octal_with_8", "x == -08", 5),
    ("bracket_start", "[x] == 1", 0),
    ("bracket_operand", "x == [1]", 5),
    ("brace_start", "{x} == 1", 0),
    ("semicolon", "x == 1 ; y == 1", 7),
    ("dot_start", ".x == 1", 0),
    ("point_five", "x == .5", 5),
    ("colon_start", ":x == 1", 0),
    ("question_start", "?x == 1", 0),
    ("backquote_start", "`x == 1", 0),
    ("lone_equals", "x = 1", 2),
    ("trailing_backslash", "x == 1 \\", 7),
    ("latin1_start", "\u00e9 == 1", 0),
    ("euro_sign", "x == 1 \u20ac", 7),
    ("form_feed", "x ==\f1", 4),
    ("vertical_tab", "x\v== 1", 1),
    ("nul_character", "x == 1\x00", 6),
    ("second_clause", "x == 1 && $y == 2", 10),
])


class UntermStringTests(_Base):
    """UNTERM_STRING (2103), reported at the opening quote."""


_add_rejects(UntermStringTests, UNTERM_STRING, [
    ("double", 'x == "abc', 5),
    ("single", "x == 'abc", 5),
    ("escaped_close", 'x == "abc\\"', 5),
    ("escaped_close_single", "x == 'abc\\'", 5),
    ("other_quote_does_not_close", "x == 'abc\"", 5),
    ("at_start", '"abc == x', 0),
    ("second_string", 'x == "a" || y == "b', 17),
    ("only_quote", '"', 0),
    ("backslash_only", 'x == "\\', 5),
    ("after_multibyte", 'y == "\u00e9\u20ac" || x == "abc', 18),
    ("in_function_args", 'begins-with(x, "abc', 15),
])


class UnknownFuncTests(_Base):
    """UNKNOWN_FUNC (2104), at the function name."""


_add_rejects(UnknownFuncTests, UNKNOWN_FUNC, [
    ("foo", "foo(x) == 1", 0),
    ("in_second_clause", "x == 1 && bar(y)", 10),
    ("as_operand", "x == sizes(y)", 5),
    ("case_sensitive", "Size(x) == 1", 0),
    ("underscore_spelling", 'begins_with(x, "a")', 0),
    ("int", "int(x)", 0),
    ("no_args", "now() > 1", 0),
    ("lowercase_variant", "foldcase(x) == \"a\"", 0),
    ("nested", "size(foo(x)) == 1", 5),
    ("unknown_before_arity", "foo(a, b, c, d)", 0),
])


class OverflowTests(_Base):
    """OVERFLOW (2105): numeric literals too large for their type (6.1.4)."""


_add_rejects(OverflowTests, OVERFLOW, [
    ("int32_max_plus_one", "x == 2147483648", 5),
    ("int32_min_minus_one", "x == -2147483649", 5),
    ("int32_huge", "x == 99999999999999999999", 5),
    ("hex_int32", "x == 0x80000000", 5),
    ("octal_int32", "x == 020000000000", 5),
    ("int64_max_plus_one", "x == 9223372036854775808L", 5),
    ("int64_min_minus_one", "x == -9223372036854775809L", 5),
    ("int64_hex", "x == 0x10000000000000000L", 5),
    ("real_huge", "x == 1.0e400", 5),
    ("real_just_too_big", "x == 1.8e308", 5),
    ("real_negative_huge", "x == -1.0e400", 5),
    ("separated_minus", "x == - 2147483648", 7),
    ("in_second_clause", "x == 1 || y == 4294967296", 15),
    ("in_function_args", "equals(x, 1, 2147483648)", 13),
    ("left_operand", "2147483648 < x", 0),
])


class OverflowBoundaryTests(_Base):
    pass


_add_accepts(OverflowBoundaryTests, [
    ("int32_max", "x == 2147483647"),
    ("int32_min", "x == -2147483648"),
    ("int64_max", "x == 9223372036854775807L"),
    ("int64_min", "x == -9223372036854775808L"),
    ("real_max", "x == 1.7976931348623157e308"),
    ("real_tiny", "x == 4.9e-324"),
])


class TypeMismatchTests(_Base):
    """TYPE_MISMATCH (2106): a literal whose type does not fit its use."""


_add_rejects(TypeMismatchTests, TYPE_MISMATCH, [
    ("string_in_addition", 'x + "a" > 1', 4),
    ("string_left_of_addition", 'x == "a" + 1', 5),
    ("bit_negate_real", "~1.5 == x", 1),
    ("bit_negate_real_constant", "~1.5 == 1", 1),
    ("bitand_real", "x & 1.5 == 1", 4),
    ("shift_by_real", "x << 1.0 == 1", 5),
    ("bitor_real_left", "1.0 | x == 1", 0),
    ("modulo_string", 'x % "a" == 1', 4),
    ("unary_minus_string", '-"a" == x', 1),
    ("unary_plus_string", '+"a" == x', 1),
    ("less_than_string", 'x < "a"', 4),
    ("string_less_than", '"a" > x', 0),
    ("le_string", 'x <= "abc"', 5),
    ("number_expression_equals_string", 'x + 1 == "a"', 9),
    ("size_equals_string", 'size(x) == "a"', 11),
    ("string_function_equals_number", 'fold-case(x) == 1', 16),
    ("literals_of_different_types", '1 == "a"', None),
    ("begins_with_int_pattern", "begins-with(x, 1)", 15),
    ("begins_with_second_pattern_real", 'begins-with(x, "a", 2.5)', 20),
    ("ends_with_int64_pattern", "ends-with(x, 1L)", 13),
    ("contains_int_pattern", "contains(x, 0)", 12),
    ("wildcard_int_pattern", "wildcard(x, 1)", 12),
    ("regex_int_pattern", "regex(x, 1)", 9),
    ("begins_with_int_subject", 'begins-with(1, "a")', 12),
    ("int32_of_literal", "int32(1)", 6),
    ("int64_of_literal", "int64(1L)", 6),
    ("real64_of_literal", "real64(1.5)", 7),
    ("string_of_literal", 'string("a")', 7),
    ("opaque_of_literal", 'opaque("a")', 7),
    ("nan_of_literal", "nan(1.5)", 4),
    ("require_of_literal", 'require("x")', 8),
    ("size_of_int", "size(1) == 1", 5),
    ("fold_case_of_int", 'fold-case(1) == "a"', 10),
    ("decompose_of_real", 'decompose(1.0) == "a"', 10),
    ("decompose_compat_of_int", 'decompose-compat(7) == "a"', 17),
    ("in_second_clause", 'x == 1 && y < "z"', 14),
])


class GrammarArgumentTests(_Base):
    """Arguments the grammar restricts: a name where the language says
    ``name`` (type tests, require, size); a name or string function as the
    first argument of equals and the subject of a string predicate (as
    section 6's string comparisons allow, and Avis accepts); a name, string
    literal or string function inside a string function. Refused at parse time, at the argument: a literal
    with TYPE_MISMATCH, any other expression with PARSE_ERROR."""


_add_rejects(GrammarArgumentTests, PARSE_ERROR, [
    ("size_of_string_function", "size(fold-case(x)) == 1", 5),
    ("size_of_arithmetic", "size(x + 1) == 1", 5),
    ("size_of_grouped_name", "size((x)) == 1", 6),
    ("size_of_size", "size(size(x)) == 1", 5),
    ("equals_of_function", 'equals(size(x), 1)', 7),
    ("equals_of_type_test", 'equals(string(x), 1)', 7),
    ("equals_of_predicate", 'equals(x == 1, 1)', 7),
    ("equals_of_grouped_string_function", 'equals((fold-case(x)), "a")', 8),
    ("equals_of_unary_minus", 'equals(-x, 1)', 7),
    ("equals_of_arithmetic", "equals(x * 2, 4)", 7),
    ("equals_of_grouped_name", "equals((x), 4)", 8),
    ("begins_with_arithmetic_subject", 'begins-with(x + 1, "a")', 12),
    ("ends_with_size_subject", 'ends-with(size(x), "a")', 10),
    ("contains_grouped_subject", 'contains((x), "a")', 10),
    ("regex_subject_unary", 'regex(-x, "a")', 6),
    ("wildcard_subject_arithmetic", 'wildcard(x & 1, "a*")', 9),
    ("fold_case_of_size", 'fold-case(size(x)) == "a"', 10),
    ("decompose_of_arithmetic", 'decompose(x + y) == "a"', 10),
    ("require_of_string_function", "require(fold-case(x))", 8),
    ("nan_of_grouped_name", "nan((x))", 5),
    ("in_second_clause", 'x == 1 && size(fold-case(y)) > 2', 15),
])

_add_rejects(GrammarArgumentTests, TYPE_MISMATCH, [
    ("size_of_string_literal", 'size("abc") == 3', 5),
    ("size_of_real_literal", "size(1.5) == 3", 5),
    ("equals_of_string_literal", 'equals("a", x)', 7),
    ("equals_of_int_literal", "equals(1, x)", 7),
    ("equals_of_real_literal", "equals(1.5, x)", 7),
    ("equals_of_int64_literal", "equals(1L, x)", 7),
    ("equals_of_literal_in_long_expression",
     'Presence-Protocol < 2000 && equals(fold-case(User), "a") && equals("b", User)', 67),
    ("equals_of_string_function_with_number", 'equals(fold-case(x), 1)', 21),
    ("begins_with_string_subject", 'begins-with("abc", "a")', 12),
    ("regex_string_subject", "regex('x', 'y')", 6),
])

_add_accepts(GrammarArgumentTests, [
    ("begins_with_fold_case", 'begins-with(fold-case(x), "foo")'),
    ("ends_with_decompose", 'ends-with(decompose(x), "e")'),
    ("contains_nested_string_functions", 'contains(fold-case(decompose-compat(x)), "a")'),
    ("fold_case_of_name", 'fold-case(x) == "a"'),
    ("fold_case_of_string_function", 'fold-case(decompose(x)) == "a"'),
    ("fold_case_compared_to_literal_fold", 'x == fold-case("ABC")'),
    ("equals_values", 'equals(x, 1, 2L, 3.5, "s", y, z + 1)'),
    ("equals_fold_case", 'equals(fold-case(x), "a", "b")'),
    ("equals_decompose", 'equals(decompose(x), "e")'),
    ("equals_decompose_compat", "equals(decompose-compat(x), 'fi')"),
    ("equals_nested_string_functions", 'equals(fold-case(decompose(fold-case(x))), "a")'),
    ("equals_fold_case_of_literal_value", 'equals(fold-case(x), fold-case("A"), y)'),
    ("presence_client",
     "Presence-Protocol < 2000 && string(Groups) && equals(Presence-Info, 'initial', 'update')"
     ' && (contains(fold-case(Groups), "|elvin|", "|dev|")'
     ' || equals(fold-case(User), "ann@home"))'),
    ("size_of_name", "size(x) > 3"),
    ("type_tests", "int32(a) || int64(b) || real64(c) || string(d) || opaque(e) || nan(f)"),
])


class GrammarArgumentNackTests(unittest.TestCase):
    """The router Nacks such a SubAddRqst with the code and (offset, token)."""

    def test_nack_carries_code_offset_and_token(self):
        from elvin.protocols import packets
        from elvin.core.router import Router
        from elvin.test.test_router import RecordingOutput
        out = RecordingOutput()
        session = Router().open_session(out, "test")
        session.packet_received(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY))
        out.take()
        session.packet_received(packets.SubAddRqst(2, "size(fold-case(x)) > 1", True, packets.Keys.EMPTY))
        session.packet_received(packets.SubAddRqst(3, 'equals("a", x)', True, packets.Keys.EMPTY))
        first, second = out.take()
        self.assertEqual((first.xid, first.error, first.args), (2, PARSE_ERROR, (5, "fold-case")))
        self.assertEqual((second.xid, second.error, second.args),
                         (3, TYPE_MISMATCH, (7, '"a"', "string")))

    def test_type_mismatch_nack_carries_offset_expression_and_type(self):
        """7.4.2's table: TYPE_MISMATCH's args are offset, expr, type: the
        expression whose type does not fit (printed canonically) and that
        type, whether the checker or the parser found it."""
        from elvin.protocols import packets
        from elvin.core.router import Router
        from elvin.test.test_router import RecordingOutput
        out = RecordingOutput()
        session = Router().open_session(out, "test")
        session.packet_received(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY))
        out.take()
        cases = [("x == 'a' + 1", (5, '"a"', "string")),
                 ("int32(1)", (6, "1", "int32")),
                 ('1 == "a"', (5, '"a"', "string")),
                 ("~1.5 == 1", (1, "1.5", "real64")),
                 ("begins-with(x, 3)", (15, "3", "int32")),
                 ("x + (y + 2.5) < (z + 'a')", (21, '"a"', "string"))]
        for xid, (expression, args) in enumerate(cases, 2):
            session.packet_received(packets.SubAddRqst(xid, expression, True, packets.Keys.EMPTY))
            (nack,) = out.take()
            self.assertEqual((nack.xid, nack.error, nack.args), (xid, TYPE_MISMATCH, args),
                             expression)


class TooFewArgsTests(_Base):
    """TOO_FEW_ARGS (2107), at the function name."""


_add_rejects(TooFewArgsTests, TOO_FEW_ARGS, [
    ("size", "size() == 1", 0),
    ("size_alone", "size()", 0),
    ("begins_with", "begins-with(x)", 0),
    ("ends_with", "ends-with(x)", 0),
    ("contains", "contains(x)", 0),
    ("wildcard", "wildcard(x)", 0),
    ("regex", "regex(x)", 0),
    ("equals", "equals(x)", 0),
    ("equals_none", "equals()", 0),
    ("require", "require()", 0),
    ("int32", "int32()", 0),
    ("int64", "int64()", 0),
    ("real64", "real64()", 0),
    ("string", "string()", 0),
    ("opaque", "opaque()", 0),
    ("nan", "nan()", 0),
    ("fold_case", 'fold-case() == "a"', 0),
    ("decompose", 'decompose() == "a"', 0),
    ("decompose_compat", 'decompose-compat() == "a"', 0),
    ("in_second_clause", "x == 1 || size() == 2", 10),
    ("as_right_operand", "x == size()", 5),
    ("space_before_paren", "size () == 1", 0),
])


class TooManyArgsTests(_Base):
    """TOO_MANY_ARGS (2108), at the function name."""


_add_rejects(TooManyArgsTests, TOO_MANY_ARGS, [
    ("size", "size(a, b) == 1", 0),
    ("require", "require(a, b)", 0),
    ("int32", "int32(a, b)", 0),
    ("int64", "int64(a, b)", 0),
    ("real64", "real64(a, b)", 0),
    ("string", "string(a, b)", 0),
    ("opaque", "opaque(a, b)", 0),
    ("nan", "nan(a, b)", 0),
    ("fold_case", 'fold-case(a, b) == "x"', 0),
    ("decompose", 'decompose(a, b) == "x"', 0),
    ("decompose_compat", 'decompose-compat(a, b) == "x"', 0),
    ("in_second_clause", "x == 1 && string(a, b)", 10),
    ("nested", 'begins-with(fold-case(a, b), "x")', 12),
])


class ArityAcceptTests(_Base):
    """Variadic functions take any number of further arguments."""


_add_accepts(ArityAcceptTests, [
    ("begins_with_many", 'begins-with(x, "a", "b", "c", "d", "e")'),
    ("equals_many", "equals(x, 1, 2, 3, 4, 5, 6, 7, 8, 9)"),
    ("regex_two", 'regex(x, "a", "b")'),
    ("wildcard_two", 'wildcard(x, "a*", "b?")'),
    ("contains_two", 'contains(x, "a", "b")'),
    ("ends_with_two", 'ends-with(x, "a", "b")'),
])


class InvalidRegexpTests(_Base):
    """INVALID_REGEXP (2109), at the pattern literal."""


_add_rejects(InvalidRegexpTests, INVALID_REGEXP, [
    ("open_group", 'regex(x, "(")', 9),
    ("close_group", 'regex(x, "a)")', 9),
    ("open_class", 'regex(x, "[abc")', 9),
    ("nothing_to_repeat", 'regex(x, "*a")', 9),
    ("reversed_range", 'regex(x, "[z-a]")', 9),
    ("bad_repeat_bounds", 'regex(x, "a{3,1}")', 9),
    ("second_pattern", 'regex(x, "a", "(")', 14),
    ("in_second_clause", 'x == 1 && regex(y, "(")', 19),
    ("single_quoted", "regex(x, '(')", 9),
    ("wildcard_open_class", 'wildcard(x, "[a")', 12),
])


class TrivialTests(_Base):
    """EXP_IS_TRIVIAL (2110): the expression folds to a constant."""


_add_rejects(TrivialTests, EXP_IS_TRIVIAL, [
    ("one_equals_one", "1 == 1", None),
    ("one_equals_two", "1 == 2", None),
    ("less_than", "1 < 2", None),
    ("strings", '"a" == "a"', None),
    ("strings_ne", '"a" != "b"', None),
    ("mixed_numeric", "1.0 == 1", None),
    ("arithmetic", "1 + 1 == 2", None),
    ("not_constant", "!(1 == 1)", None),
    ("or_true_constant", "x == 1 || 1 == 1", None),
    ("and_false_constant", "x == 1 && 1 == 2", None),
    ("constant_bottom", "1 / 0 == 1", None),
    ("constant_and", "(1 == 1) && (2 == 2)", None),
    ("or_not_false_constant", "x == 1 || !(1 == 2)", None),
    ("constant_xor", "1 == 1 ^^ 1 == 2", None),
    ("xor_with_constant_bottom", "x == 1 ^^ 1 / 0 == 1", None),
    ("and_false_first", "1 == 2 && x == 1", None),
    ("or_true_first", "1 == 1 || x == 1", None),
    ("nested_or_true", "(x == 1 || 2 > 1) && (y == 1 || 3 > 2)", None),
    ("constant_int64", "1L < 2L", None),
    ("constant_shift", "1 << 3 == 8", None),
])


class NonTrivialTests(_Base):
    """Expressions with a constant part that still depend on the
    notification are accepted."""


_add_accepts(NonTrivialTests, [
    ("or_false_constant", "x == 1 || 1 == 2"),
    ("and_true_constant", "x == 1 && 1 == 1"),
    ("or_bottom_constant", "x == 1 || 1 / 0 == 1"),
    ("constant_arithmetic_operand", "x == 1 + 2"),
    ("compare_two_attributes", "x == y"),
    ("compare_attribute_with_itself", "x == x"),
    ("require", "require(x)"),
    ("xor_true_constant", "x == 1 ^^ 1 == 1"),
])


class NestingTests(_Base):
    """NESTING_TOO_DEEP (2112): more than 128 nested parentheses, or a tree
    higher than 128."""

    def test_128_parentheses_accepted(self):
        Subscription("(" * 128 + "x == 1" + ")" * 128)

    def test_129_parentheses_rejected(self):
        self.assertRejected("(" * 129 + "x == 1" + ")" * 129, NESTING_TOO_DEEP, 128)

    def test_129_parentheses_after_prefix(self):
        text = "y == 2 && " + "(" * 129 + "x == 1" + ")" * 129
        self.assertRejected(text, NESTING_TOO_DEEP, 10 + 128)

    def test_deep_value_parentheses_rejected(self):
        self.assertRejected("x == " + "(" * 200 + "1" + ")" * 200, NESTING_TOO_DEEP, 5 + 128)

    def test_unbalanced_deep_parentheses_rejected(self):
        # too deep is found before the missing close parentheses
        self.assertRejected("(" * 300 + "x == 1", NESTING_TOO_DEEP, 128)

    def test_sequential_parentheses_are_not_nested(self):
        Subscription(" && ".join(["(x == 1)"] * 200))

    def test_many_nots_shallow_accepted(self):
        Subscription("!" * 100 + "(x == 1)")

    def test_many_nots_rejected(self):
        self.assertRejected("!" * 200 + "(x == 1)", NESTING_TOO_DEEP)

    def test_long_left_assoc_arithmetic_rejected(self):
        self.assertRejected("x" + " + 1" * 200 + " == 5", NESTING_TOO_DEEP)

    def test_moderate_arithmetic_accepted(self):
        Subscription("x" + " + 1" * 100 + " == 5")

    def test_long_flat_and_chain_accepted(self):
        # an unparenthesised chain is one n-ary node: not deep
        Subscription(" && ".join(f"x{i} == {i}" for i in range(1000)))

    def test_long_flat_or_chain_accepted(self):
        Subscription(" || ".join(f"x == {i}" for i in range(1000)))

    def test_deep_parenthesised_logic_rejected(self):
        text = "x == 0"
        for i in range(1, 200):
            text = f"(x == {i} || {text})"
        self.assertRejected(text, NESTING_TOO_DEEP)

    def test_deep_unary_minus_rejected(self):
        self.assertRejected("x == " + "-" * 200 + "y", NESTING_TOO_DEEP)

    def test_deep_from_ast_rejected(self):
        tree = Node(Kind.EQUALS, None, (Node(Kind.NAME, "x"), Node(Kind.INT32, 1)))
        for _ in range(200):
            tree = Node(Kind.NOT, None, (tree,))
        with self.assertRaises(SubscriptionError) as cm:
            Subscription.from_ast(tree)
        self.assertEqual(cm.exception.code, NESTING_TOO_DEEP)


class PriorityTests(_Base):
    """Which error is reported when an expression has more than one."""

    def test_type_error_before_triviality(self):
        self.assertRejected('1 == "a"', TYPE_MISMATCH)

    def test_type_error_in_constant_bit_negate(self):
        self.assertRejected("~1.5 == 1", TYPE_MISMATCH, 1)

    def test_earliest_of_two_type_errors(self):
        self.assertRejected('x < "a" || y < "b"', TYPE_MISMATCH, 4)

    def test_unknown_function_before_type_error(self):
        self.assertRejected('foo(1) < "a"', UNKNOWN_FUNC, 0)

    def test_arity_before_type(self):
        self.assertRejected("int32(1, 2)", TOO_MANY_ARGS, 0)

    def test_overflow_before_trivial(self):
        self.assertRejected("2147483648 == 1", OVERFLOW, 0)

    def test_regexp_before_trivial(self):
        self.assertRejected('regex(x, "(") || 1 == 1', INVALID_REGEXP, 9)


class ErrorObjectTests(_Base):

    def test_is_elvin_error(self):
        err = self.assertRejected("x ==", PARSE_ERROR)
        self.assertIsInstance(err, ElvinError)
        self.assertIsInstance(err, Exception)

    def test_has_code_offset_and_message(self):
        err = self.assertRejected("x == 08", INVALID_TOKEN, 5)
        self.assertIsInstance(err.code, int)
        self.assertIsInstance(err.offset, int)
        self.assertIsInstance(str(err), str)
        self.assertNotEqual(str(err), "")

    def test_parse_raises_too(self):
        self.assertRaises(SubscriptionError, parse, "x ==")

    def test_parse_checks_types(self):
        with self.assertRaises(SubscriptionError) as cm:
            parse('x < "a"')
        self.assertEqual(cm.exception.code, TYPE_MISMATCH)

    def test_elvin_module_exports_error(self):
        import elvin
        self.assertIs(elvin.SubscriptionError, SubscriptionError)

    def test_non_string_expression_not_accepted(self):
        self.assertRaises((TypeError, SubscriptionError), Subscription, b"x == 1")


class FromAstRejectTests(_Base):
    """Trees built directly (e.g. decoded from the wire) are checked too."""

    def reject(self, tree, code):
        with self.assertRaises(SubscriptionError) as cm:
            Subscription.from_ast(tree)
        self.assertEqual(cm.exception.code, code)

    def test_value_at_top(self):
        self.reject(Node(Kind.NAME, "x"), PARSE_ERROR)

    def test_and_of_names(self):
        self.reject(Node(Kind.AND, None, (Node(Kind.NAME, "x"), Node(Kind.NAME, "y"))),
                    PARSE_ERROR)

    def test_trivial(self):
        self.reject(Node(Kind.EQUALS, None, (Node(Kind.INT32, 1), Node(Kind.INT32, 1))),
                    EXP_IS_TRIVIAL)

    def test_type_mismatch(self):
        self.reject(Node(Kind.LESS_THAN, None, (Node(Kind.NAME, "x"), Node(Kind.STRING, "a"))),
                    TYPE_MISMATCH)

    def test_bad_regex(self):
        self.reject(Node(Kind.FUNC_REGEX, None, (Node(Kind.NAME, "x"), Node(Kind.STRING, "("))),
                    INVALID_REGEXP)

    def test_not_a_node(self):
        self.assertRaises(TypeError, Subscription.from_ast, "x == 1")

    def test_empty_node(self):
        self.reject(Node(Kind.EMPTY), PARSE_ERROR)

    # Malformed arities cannot come from text, but can come off the wire;
    # from_ast "checks it first", and str() of what it accepts must parse.

    def reject_any(self, tree):
        with self.assertRaises(SubscriptionError):
            Subscription.from_ast(tree)

    def test_equals_with_one_child(self):
        self.reject_any(Node(Kind.EQUALS, None, (Node(Kind.NAME, "x"),)))

    def test_equals_with_three_children(self):
        self.reject_any(Node(Kind.EQUALS, None, (Node(Kind.NAME, "x"), Node(Kind.INT32, 1),
                                                 Node(Kind.INT32, 2))))

    def test_not_with_two_children(self):
        x1 = Node(Kind.EQUALS, None, (Node(Kind.NAME, "x"), Node(Kind.INT32, 1)))
        self.reject_any(Node(Kind.NOT, None, (x1, x1)))

    def test_unary_minus_with_two_children(self):
        neg = Node(Kind.UNARY_MINUS, None, (Node(Kind.NAME, "x"), Node(Kind.NAME, "y")))
        self.reject_any(Node(Kind.EQUALS, None, (neg, Node(Kind.INT32, 1))))

    def test_and_with_one_child(self):
        # "a conjunction of two or more expressions"
        x1 = Node(Kind.EQUALS, None, (Node(Kind.NAME, "x"), Node(Kind.INT32, 1)))
        self.reject_any(Node(Kind.AND, None, (x1,)))

    def test_size_without_argument(self):
        size = Node(Kind.FUNC_SIZE, None, ())
        self.reject_any(Node(Kind.GREATER_THAN, None, (size, Node(Kind.INT32, 1))))

    def test_require_with_two_arguments(self):
        self.reject_any(Node(Kind.FUNC_REQUIRE, None, (Node(Kind.NAME, "x"), Node(Kind.NAME, "y"))))

    def test_begins_with_without_pattern(self):
        self.reject_any(Node(Kind.FUNC_BEGINS_WITH, None, (Node(Kind.NAME, "x"),)))


class LongValueTests(_Base):
    """What an error echoes of the expression (a name, a literal, a
    pattern) is cut to 80 characters and its size, so that a long
    expression makes a readable Nack and log line; and a number too long
    for Python's int() is out of range, not an unexpected ValueError."""

    def test_echoed_parts_are_cut(self):
        from elvin import errors
        long = "x" * 3000
        for text, code in ((f"f{long}(a)", errors.UNKNOWN_FUNC),
                           (f"a == 0{'7' * 400}9", errors.INVALID_TOKEN),
                           (f"a == 1{'1' * 3000}", errors.OVERFLOW),
                           (f"a == 1{'1' * 3000}L", errors.OVERFLOW),
                           (f"a == 1{'1' * 400}.0", errors.OVERFLOW),
                           (f"{long}==1", errors.PARSE_ERROR),
                           (f"regex(a, \"{'(' * 3000}\")", errors.INVALID_REGEXP),
                           (f"wildcard(a, \"[{long}\")", errors.INVALID_REGEXP)):
            err = self.assertRejected(text, code)
            self.assertLess(len(str(err)), 400, str(err)[:300])
            self.assertIn(" bytes)", str(err))

    def test_a_number_past_int_digit_limit_is_out_of_range(self):
        from elvin import errors
        Subscription("a == 1")       # its shape is known: the shortcut reads the literal
        self.assertRejected("a == " + "1" * 5000, errors.OVERFLOW, 5)
        self.assertRejected("a == -" + "1" * 5000 + "L", errors.OVERFLOW)
        self.assertRejected("a == 0x" + "f" * 5000, errors.OVERFLOW)
        # Leading zeros are no size: this is 7.
        self.assertTrue(Subscription("a == 0" + "0" * 5000 + "7").matches({"a": 7}))
