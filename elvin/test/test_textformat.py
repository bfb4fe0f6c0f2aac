"""Tests for elvin.textformat: the notification text of the command-line tools."""

import io
import math
import unicodedata

from hypothesis import given, strategies as st
from twisted.trial import unittest

from elvin import textformat as tf
from elvin.textformat import (FormatError, format_notification, format_value,
                              parse_line, parse_value, read_notifications)
from elvin.values import INT32, INT64, OPAQUE, REAL64, STRING, Int32, Int64, type_of


class FormatValueTests(unittest.TestCase):

    def test_int32(self):
        self.assertEqual(format_value(42), "42")
        self.assertEqual(format_value(-7), "-7")
        self.assertEqual(format_value(0), "0")
        self.assertEqual(format_value(Int32(5)), "5")
        self.assertEqual(format_value(2**31 - 1), "2147483647")
        self.assertEqual(format_value(-2**31), "-2147483648")

    def test_int64(self):
        self.assertEqual(format_value(Int64(12)), "12L")
        self.assertEqual(format_value(Int64(-1)), "-1L")
        # A plain int too big for int32 is int64.
        self.assertEqual(format_value(2**31), "2147483648L")
        self.assertEqual(format_value(-2**31 - 1), "-2147483649L")
        self.assertEqual(format_value(2**63 - 1), "9223372036854775807L")

    def test_real64(self):
        self.assertEqual(format_value(3.25), "3.25")
        self.assertEqual(format_value(2.0), "2.0")
        self.assertEqual(format_value(-0.5), "-0.5")
        self.assertEqual(format_value(1e300), "1e+300")
        self.assertEqual(format_value(float("inf")), "inf")
        self.assertEqual(format_value(float("-inf")), "-inf")
        self.assertEqual(format_value(float("nan")), "nan")

    def test_real64_always_looks_real(self):
        """A real never prints like an integer, so it reads back as a real."""
        for value in (1.0, 1e16, -3.0, 0.0):
            text = format_value(value)
            self.assertTrue("." in text or "e" in text, text)
            self.assertEqual(type_of(parse_value(text)), REAL64)

    def test_string(self):
        self.assertEqual(format_value("hi"), '"hi"')
        self.assertEqual(format_value(""), '""')
        self.assertEqual(format_value('a"b'), r'"a\"b"')
        self.assertEqual(format_value("a'b"), '"a\'b"')
        self.assertEqual(format_value("a\\b"), r'"a\\b"')
        self.assertEqual(format_value("l1\nl2\tx\r\0"), r'"l1\nl2\tx\r\0"')
        self.assertEqual(format_value("caf\u00e9 \u2603"), '"caf\u00e9 \u2603"')

    def test_string_is_one_line(self):
        self.assertNotIn("\n", format_value("a\nb\r\nc"))

    def test_opaque(self):
        self.assertEqual(format_value(b"\xde\xad\xbe\xef"), "[de ad be ef]")
        self.assertEqual(format_value(b""), "[]")
        self.assertEqual(format_value(b"\x00\x0f"), "[00 0f]")
        self.assertEqual(format_value(bytearray(b"\x01")), "[01]")


class ParseValueTests(unittest.TestCase):

    def assertTyped(self, text, value, kind):
        parsed = parse_value(text)
        self.assertEqual(parsed, value, text)
        self.assertEqual(type_of(parsed), kind, text)
        return parsed

    def test_int32(self):
        self.assertTyped("42", 42, INT32)
        self.assertTyped("-7", -7, INT32)
        self.assertTyped("+7", 7, INT32)
        self.assertTyped("0", 0, INT32)
        self.assertTyped("2147483647", 2**31 - 1, INT32)
        self.assertTyped("-2147483648", -2**31, INT32)
        self.assertTyped("0x2a", 42, INT32)
        self.assertTyped("0X2A", 42, INT32)
        self.assertTyped("  42  ", 42, INT32)

    def test_int64(self):
        self.assertIsInstance(self.assertTyped("12L", 12, INT64), Int64)
        self.assertTyped("12l", 12, INT64)
        self.assertTyped("-5L", -5, INT64)
        self.assertTyped("0x10L", 16, INT64)
        self.assertTyped("9223372036854775807L", 2**63 - 1, INT64)

    def test_int_too_large_for_int32_is_int64(self):
        self.assertTyped("2147483648", 2**31, INT64)
        self.assertTyped("-2147483649", -2**31 - 1, INT64)
        self.assertTyped("9223372036854775807", 2**63 - 1, INT64)

    def test_int_too_large_for_int64(self):
        self.assertRaises(FormatError, parse_value, "9223372036854775808")
        self.assertRaises(FormatError, parse_value, "9223372036854775808L")

    def test_real64(self):
        self.assertTyped("3.25", 3.25, REAL64)
        self.assertTyped("-0.5", -0.5, REAL64)
        self.assertTyped("1e10", 1e10, REAL64)
        self.assertTyped("1E10", 1e10, REAL64)
        self.assertTyped("6.02e23", 6.02e23, REAL64)
        self.assertTyped("1.5e-3", 1.5e-3, REAL64)
        self.assertTyped(".5", 0.5, REAL64)
        self.assertTyped("2.", 2.0, REAL64)

    def test_inf_nan(self):
        self.assertTyped("inf", math.inf, REAL64)
        self.assertTyped("-inf", -math.inf, REAL64)
        self.assertTyped("+inf", math.inf, REAL64)
        self.assertTyped("Infinity", math.inf, REAL64)
        self.assertTyped("INF", math.inf, REAL64)
        nan = parse_value("nan")
        self.assertEqual(type_of(nan), REAL64)
        self.assertTrue(math.isnan(nan))
        self.assertTrue(math.isnan(parse_value("NaN")))

    def test_string_double_quotes(self):
        self.assertTyped('"hi"', "hi", STRING)
        self.assertTyped('""', "", STRING)
        self.assertTyped('"a b  c"', "a b  c", STRING)
        self.assertTyped('"it\'s"', "it's", STRING)
        self.assertTyped('"42"', "42", STRING)

    def test_string_single_quotes(self):
        self.assertTyped("'hi'", "hi", STRING)
        self.assertTyped("''", "", STRING)
        self.assertTyped("'say \"x\"'", 'say "x"', STRING)
        self.assertTyped(r"'it\'s'", "it's", STRING)

    def test_string_escapes(self):
        self.assertTyped(r'"a\nb\tc\rd\\e\"f\'g\0h"', "a\nb\tc\rd\\e\"f'g\0h", STRING)
        # Any other escape is an error (test_unknown_escape_...): "\u00e9"
        # silently read as "u00e9" would hide the mistake.
        self.assertRaises(FormatError, parse_value, r'"\q\:"')

    def test_string_keeps_inner_space(self):
        self.assertTyped('"  padded  "', "  padded  ", STRING)

    def test_string_errors(self):
        for text in ('"open', "'open", '"', "'", '"mixed\'', '"ends with \\"'):
            self.assertRaises(FormatError, parse_value, text)

    def test_opaque(self):
        self.assertTyped("[de ad]", b"\xde\xad", OPAQUE)
        self.assertTyped("[dead]", b"\xde\xad", OPAQUE)
        self.assertTyped("[DE AD be ef]", b"\xde\xad\xbe\xef", OPAQUE)
        self.assertTyped("[ de  ad ]", b"\xde\xad", OPAQUE)
        self.assertTyped("[]", b"", OPAQUE)

    def test_opaque_errors(self):
        for text in ("[de ad", "[xyz]", "[d]", "[de a]", "[0x de]"):
            self.assertRaises(FormatError, parse_value, text)

    def test_not_a_value(self):
        for text in ("", "   ", "hello", "12x", "1.2.3", "L", "--1", "true"):
            with self.assertRaises(FormatError) as cm:
                parse_value(text)
            self.assertTrue(str(cm.exception), text)

    def test_bare_word_hint(self):
        """An unquoted word suggests quoting it."""
        with self.assertRaises(FormatError) as cm:
            parse_value("chat")
        self.assertIn("'chat'", str(cm.exception))
        self.assertIn("quotes", str(cm.exception))

    def test_unknown_escape_is_an_error_naming_line_and_escape(self):
        for text, escape in (('"\\u00e9"', "\\u"), ('"a\\qb"', "\\q"), ("'\\x'", "\\x")):
            with self.assertRaises(FormatError) as cm:
                parse_value(text)
            self.assertIn(f"unknown escape {escape}", str(cm.exception))
        with self.assertRaises(FormatError) as cm:
            list(read_notifications(["a: 1", 'b: "a\\qb"'], "notes.txt"))
        self.assertIn("notes.txt:2: unknown escape \\q", str(cm.exception))
        self.assertEqual(parse_value('"\\n\\t\\r\\\\\\"\\\'\\0"'), "\n\t\r\\\"'\0")

    def test_format_error_is_value_error(self):
        self.assertTrue(issubclass(FormatError, ValueError))


class RoundTripTests(unittest.TestCase):
    """parse_value(format_value(v)) gives back v with the same Elvin type."""

    VALUES = [
        0, 1, -1, 42, 2**31 - 1, -2**31,
        Int64(0), Int64(12), Int64(-12), Int64(2**63 - 1), Int64(-2**63),
        2**31, -2**31 - 1, 2**40,
        0.0, -0.0, 3.25, -1.5, 1e10, 1e-300, 1.7976931348623157e308, 5e-324,
        0.1, 1 / 3, math.inf, -math.inf,
        "", "hi", 'double " quote', "single ' quote", "both \" and '",
        "back\\slash", "new\nline", "tab\there", "cr\rlf\n", "nul\0byte",
        "trailing backslash\\", "\\", "\"", "'", "unicode caf\u00e9 \u2603 \U0001f600",
        "  spaces  ", "a: b", "---", "[de ad]", "12L",
        b"", b"\x00", b"\xde\xad\xbe\xef", bytes(range(256)),
    ]

    def test_round_trip(self):
        for value in self.VALUES:
            text = format_value(value)
            back = parse_value(text)
            self.assertEqual(back, value, f"{value!r} -> {text!r} -> {back!r}")
            self.assertEqual(type_of(back), type_of(value), f"{value!r} -> {text!r}")

    def test_negative_zero(self):
        back = parse_value(format_value(-0.0))
        self.assertEqual(math.copysign(1, back), -1.0)

    def test_nan_round_trip(self):
        back = parse_value(format_value(math.nan))
        self.assertEqual(type_of(back), REAL64)
        self.assertTrue(math.isnan(back))

    def test_notification_round_trip(self):
        note = {"Group": "chat", "Num": 42, "Big": Int64(7), "R": 2.5,
                "Blob": b"\x01\x02", "Text": 'x\n"y"', "a:b": "colon name"}
        text = format_notification(note)
        (back,) = list(read_notifications(io.StringIO(text)))
        self.assertEqual(back, note)
        self.assertEqual({k: type_of(v) for k, v in back.items()},
                         {k: type_of(v) for k, v in note.items()})


class FormatNotificationTests(unittest.TestCase):

    def test_format(self):
        text = format_notification({"Group": "chat", "Num": 42, "Big": Int64(3)})
        self.assertEqual(text, 'Group: "chat"\nNum: 42\nBig: 3L\n---\n')

    def test_separator(self):
        self.assertEqual(tf.SEPARATOR, "---")
        self.assertTrue(format_notification({"A": 1}).endswith("\n---\n"))


class ParseLineTests(unittest.TestCase):

    def test_simple(self):
        self.assertEqual(parse_line('Group: "chat"'), ("Group", "chat"))
        self.assertEqual(parse_line("Num: 42"), ("Num", 42))

    def test_no_space_after_colon(self):
        self.assertEqual(parse_line("Num:42"), ("Num", 42))

    def test_extra_space(self):
        self.assertEqual(parse_line("Num:    42   "), ("Num", 42))

    def test_name_with_colons(self):
        """The name runs to the first ': ', so it may contain colons."""
        self.assertEqual(parse_line("a:b:c: 5"), ("a:b:c", 5))
        self.assertEqual(parse_line('urn:x:y: "v"'), ("urn:x:y", "v"))
        self.assertEqual(parse_line("http://host: 1"), ("http://host", 1))

    def test_value_with_colons(self):
        self.assertEqual(parse_line('Time: "12:30: noon"'), ("Time", "12:30: noon"))

    def test_without_space_first_colon_splits(self):
        self.assertEqual(parse_line('a:"b:c"'), ("a", "b:c"))

    def test_name_keeps_spaces(self):
        """Names are taken as written: Elvin names may contain spaces."""
        self.assertEqual(parse_line("my name: 1"), ("my name", 1))

    def test_errors(self):
        for line in ("no colon here", "", "Name:", "Name: ", "Name: bare",
                     "Name\\", "a\\: 1"):
            self.assertRaises(FormatError, parse_line, line)

    def test_error_message(self):
        with self.assertRaises(FormatError) as cm:
            parse_line("Num 42")
        self.assertIn("Name: value", str(cm.exception))
        self.assertIn("Num 42", str(cm.exception))


class NameEscapeTests(unittest.TestCase):
    """Names are printed so that any name reads back as itself and none
    can end its line: as Avis's ec prints them (a backslash before a
    space or a colon), and with backslashes and control characters
    escaped too."""

    def test_as_avis_prints_them(self):
        """Byte for byte what Avis's ec writes for names with spaces and
        colons."""
        text = format_notification({"Key with space": 1, "urn:x:id": 2, "a: b": 3})
        self.assertEqual(text, "Key\\ with\\ space: 1\nurn\\:x\\:id: 2\na\\:\\ b: 3\n---\n")

    def test_forged_lines_stay_in_their_name(self):
        """A name holding a line break, ': ' and '---' is one attribute of
        one notification when read back, not forged attributes."""
        name = 'Tag: "x"\nRelayed: 1\nAdmin: "forged"\n---\nRelayed: 2\nZ'
        text = format_notification({"Src": 1, name: 0})
        self.assertEqual(text.count("\n"), 3)
        self.assertEqual(list(read_notifications(io.StringIO(text))),
                         [{"Src": 1, name: 0}])

    def test_awkward_names(self):
        for name in ("", " ", " lead", "trail ", "tab\there", "back\\slash", "\\",
                     "\\:", "---", "{json", "[x", "nul\0", "\x1b[2J", "\x85\u2028",
                     "caf\u00e9 \u2603", "a:", ":", "x\\ny"):
            note = {name: 5}
            text = format_notification(note)
            self.assertEqual(text.count("\n"), 2, repr(text))
            self.assertEqual(list(read_notifications(io.StringIO(text))), [note], repr(text))

    def test_avis_escapes_read(self):
        """What Avis's ec writes reads back as Avis means it."""
        self.assertEqual(parse_line("Key\\ with\\ space: 1"), ("Key with space", 1))
        self.assertEqual(parse_line("urn\\:x\\:id: 7"), ("urn:x:id", 7))

    def test_empty_name(self):
        """Avis reads ': 5' as the empty name, and prints it so."""
        self.assertEqual(parse_line(": 5"), ("", 5))
        self.assertEqual(format_notification({"": 5}), ": 5\n---\n")


class ControlCharacterTests(unittest.TestCase):
    """No control character reaches the reader's terminal raw."""

    def test_escape_sequences_in_strings(self):
        text = format_value("a\x1b[2Jb\x07\x7f\x9b")
        self.assertEqual(text, '"a\\x1b[2Jb\\x07\\x7f\\x9b"')
        self.assertEqual(parse_value(text), "a\x1b[2Jb\x07\x7f\x9b")

    def test_no_control_character_printed(self):
        every = "".join(chr(c) for c in range(0xa0))
        text = format_notification({every: every})
        self.assertFalse([c for c in text[:-1] if unicodedata.category(c) == "Cc"
                          and c != "\n"])
        self.assertEqual(list(read_notifications(io.StringIO(text))), [{every: every}])

    def test_hex_escape_errors(self):
        for text in ('"\\x1"', '"\\xg0"', '"\\x"'):
            self.assertRaises(FormatError, parse_value, text)


#: Any Elvin value: int32, int64, real64 (not nan: it equals nothing),
#: string (no lone surrogates: not UTF-8), opaque.
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)))
_VALUES = st.one_of(
    st.integers(-2**31, 2**31 - 1),
    st.integers(-2**63, 2**63 - 1).map(Int64),
    st.floats(allow_nan=False),
    _TEXT,
    st.binary())


class PropertyTests(unittest.TestCase):

    @given(st.dictionaries(_TEXT, _VALUES, min_size=1, max_size=8))
    def test_any_notification_round_trips(self, note):
        """Any notification, printed then read, is itself, typed alike."""
        text = format_notification(note)
        (back,) = list(read_notifications(io.StringIO(text)))
        self.assertEqual(back, note)
        self.assertEqual({k: type_of(v) for k, v in back.items()},
                         {k: type_of(v) for k, v in note.items()})
        self.assertEqual(text.count("\n"), len(note) + 1)


class ReadNotificationsTests(unittest.TestCase):

    def read(self, text, **kwargs):
        return list(read_notifications(io.StringIO(text), **kwargs))

    def test_dash_separator(self):
        self.assertEqual(self.read("A: 1\nB: 2\n---\nA: 3\n---\n"),
                         [{"A": 1, "B": 2}, {"A": 3}])

    def test_blank_line_separator(self):
        self.assertEqual(self.read("A: 1\n\nA: 2\n\n"), [{"A": 1}, {"A": 2}])

    def test_last_notification_without_separator(self):
        self.assertEqual(self.read("A: 1\n---\nA: 2"), [{"A": 1}, {"A": 2}])
        self.assertEqual(self.read("A: 1\nB: 2\n"), [{"A": 1, "B": 2}])

    def test_repeated_separators_are_not_empty_notifications(self):
        self.assertEqual(self.read("\n\n---\nA: 1\n---\n\n---\n   \nA: 2\n---\n---\n"),
                         [{"A": 1}, {"A": 2}])

    def test_empty_input(self):
        self.assertEqual(self.read(""), [])
        self.assertEqual(self.read("\n---\n\n"), [])

    def test_separator_with_spaces(self):
        self.assertEqual(self.read("A: 1\n  ---  \nA: 2\n"), [{"A": 1}, {"A": 2}])

    def test_crlf(self):
        self.assertEqual(self.read("A: 1\r\nS: \"x\"\r\n---\r\nA: 2\r\n"),
                         [{"A": 1, "S": "x"}, {"A": 2}])

    def test_list_of_lines(self):
        self.assertEqual(list(read_notifications(["A: 1\n", "---\n", "B: [00]"])),
                         [{"A": 1}, {"B": b"\x00"}])

    def test_repeated_name_is_refused(self):
        """A notification holds each name once: a second value for a name
        is an error naming its line and the first's, not a silent loss
        of one of them (names compare as read: ``A\\ b`` is ``A b``)."""
        for text, line, first, name in (("A: 1\nA: 2\n", 2, 1, "A"),
                                         ("X: 1\n---\nB: 2\nA: 1\nB: 3\n", 5, 3, "B"),
                                         ('A\\ b: 1\nA b: "x"\n', 2, 1, "A\\ b")):
            with self.assertRaises(FormatError) as cm:
                self.read(text)
            self.assertEqual(str(cm.exception),
                             f"<stdin>:{line}: attribute {name} is given twice in one "
                             f"notification (first at line {first}): a notification "
                             "holds each name once")
        # The same name in two notifications is two notifications.
        self.assertEqual(self.read("A: 1\n---\nA: 2\n"), [{"A": 1}, {"A": 2}])

    def test_long_bad_values_are_cut(self):
        """A bad line or value is echoed cut to 80 characters and its size."""
        big = "x" * 2**20
        for line in (big, "A: " + big, 'A: "' + big, "A: [" + big, "A: [" + big + "]",
                     "A: 1" + big, 'A: "\\q' + big + '"', "\\x" * 2**19,
                     "A: " + "9" * 4000, "{" + big):
            with self.assertRaises(FormatError) as cm:
                self.read(line + "\n")
            message = str(cm.exception)
            self.assertTrue(message.startswith("<stdin>:1: "), message[:200])
            self.assertLess(len(message), 600, message[:300])

    def test_error_names_stdin_and_line(self):
        with self.assertRaises(FormatError) as cm:
            self.read("A: 1\n---\n\nB: 2\nC: oops\n")
        message = str(cm.exception)
        self.assertTrue(message.startswith("<stdin>:5: "), message)
        self.assertIn("oops", message)

    def test_error_line_one(self):
        with self.assertRaises(FormatError) as cm:
            self.read("no colon\n")
        self.assertTrue(str(cm.exception).startswith("<stdin>:1: "), str(cm.exception))

    def test_error_other_source(self):
        with self.assertRaises(FormatError) as cm:
            self.read("A: 1\nB: [zz]\n", where="notes.txt")
        self.assertTrue(str(cm.exception).startswith("notes.txt:2: "))

    def test_lazy(self):
        """Notifications before a bad line are yielded before the error."""
        reader = read_notifications(io.StringIO("A: 1\n---\nB: bad\n"))
        self.assertEqual(next(reader), {"A": 1})
        self.assertRaises(FormatError, next, reader)
