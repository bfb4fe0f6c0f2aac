"""Tests for elvin.protocols.xdr: XDR primitives, typed Values, NameValue
arrays and SubASTs. Byte vectors are worked out by hand from client
protocol 4.0 section 8.2.3 (and RFC 1832)."""

import math
import struct

from hypothesis import given, settings, strategies as st
from twisted.trial import unittest

from elvin.protocols import xdr
from elvin.protocols.xdr import (
    AVIS_AST_TYPECODES, BadUTF8Error, DecodeError, EncodeError, Reader,
    Writer, decode_ast, decode_name_values, decode_value, encode_ast,
    encode_name_values, encode_value)
from elvin.subscription import ast
from elvin.subscription.ast import Kind, Node
from elvin.values import Int32, Int64


def h(text):
    """Bytes from hex written in 4-byte groups, as the spec draws them."""
    return bytes.fromhex(text.replace(" ", "").replace("\n", ""))


class ValueVectorTests(unittest.TestCase):
    """Typed Values (8.2.3.2): value_typecode enum, then the XDR value."""

    def test_int64_example_from_spec(self):
        # 8.2.3.2: "an int64 of value 1024L ... four bytes for the type id
        # of 2 and eight bytes for the value".
        self.assertEqual(encode_value(Int64(1024)), h("00000002 00000000 00000400"))
        self.assertEqual(decode_value(h("00000002 00000000 00000400")), 1024)
        self.assertIs(type(decode_value(h("00000002 00000000 00000400"))), Int64)

    def test_int32(self):
        self.assertEqual(encode_value(1), h("00000001 00000001"))
        self.assertEqual(encode_value(-2), h("00000001 fffffffe"))
        self.assertEqual(encode_value(Int32(7)), h("00000001 00000007"))
        decoded = decode_value(h("00000001 fffffffe"))
        self.assertEqual(decoded, -2)
        self.assertIs(type(decoded), int)

    def test_plain_int_widens_to_int64(self):
        self.assertEqual(encode_value(1 << 31), h("00000002 00000000 80000000"))
        self.assertEqual(encode_value(-(1 << 63)), h("00000002 80000000 00000000"))
        self.assertEqual(encode_value(Int64(1)), h("00000002 00000000 00000001"))

    def test_real64(self):
        self.assertEqual(encode_value(1.0), h("00000003 3ff00000 00000000"))
        self.assertEqual(encode_value(-2.5), h("00000003 c0040000 00000000"))
        self.assertEqual(decode_value(h("00000003 3ff00000 00000000")), 1.0)
        nan = decode_value(h("00000003 7ff80000 00000000"))
        self.assertTrue(math.isnan(nan))

    def test_string(self):
        self.assertEqual(encode_value("hello"),
                         h("00000004 00000005 68656c6c 6f000000"))
        self.assertEqual(encode_value("abcd"), h("00000004 00000004 61626364"))
        self.assertEqual(encode_value(""), h("00000004 00000000"))
        # U+00E9 is two UTF-8 bytes; the length counts bytes
        self.assertEqual(encode_value("\u00e9"), h("00000004 00000002 c3a90000"))
        self.assertEqual(decode_value(h("00000004 00000002 c3a90000")), "\u00e9")

    def test_opaque(self):
        self.assertEqual(encode_value(b"\x01\x02"), h("00000005 00000002 01020000"))
        self.assertEqual(encode_value(bytearray(b"\xff")), h("00000005 00000001 ff000000"))
        self.assertEqual(encode_value(memoryview(b"abc")), h("00000005 00000003 61626300"))
        decoded = decode_value(h("00000005 00000002 01020000"))
        self.assertEqual(decoded, b"\x01\x02")
        self.assertIs(type(decoded), bytes)

    def test_unencodable(self):
        self.assertRaises(EncodeError, encode_value, 1 << 63)
        self.assertRaises(TypeError, encode_value, None)
        self.assertRaises(TypeError, encode_value, [1])
        self.assertRaises(EncodeError, encode_value, "\ud800")

    def test_unknown_value_typecode(self):
        for code in (0, 6, -1, 0x7fffffff):
            with self.assertRaises(DecodeError) as cm:
                decode_value(struct.pack(">ii", code, 0))
            self.assertIn(f"unknown value typecode {code}", str(cm.exception))
            self.assertEqual(cm.exception.offset, 0)

    def test_truncated_values(self):
        for data in (b"", h("00000001"), h("00000002 00000000"),
                     h("00000003 3ff00000"), h("00000004 00000005 68656c6c"),
                     h("00000004 00000005 68656c6c 6f"), h("00000005")):
            self.assertRaises(DecodeError, decode_value, data)

    def test_trailing_bytes(self):
        with self.assertRaises(DecodeError) as cm:
            decode_value(h("00000001 00000001 00000000"))
        self.assertEqual(cm.exception.offset, 8)


class PrimitiveTests(unittest.TestCase):

    def test_writer_primitives(self):
        w = Writer()
        w.int32(-1).uint32(0xFFFFFFFF).int64(-2).uint64(1 << 63).real64(0.5)
        w.boolean(True).boolean(False).string("ab").opaque(b"").strings(["x"])
        self.assertEqual(w.getvalue(), h(
            "ffffffff ffffffff ffffffff fffffffe 80000000 00000000"
            "3fe00000 00000000 00000001 00000000 00000002 61620000"
            "00000000 00000001 00000001 78000000"))
        self.assertEqual(len(w), 64)

    def test_writer_range_errors(self):
        self.assertRaises(EncodeError, Writer().int32, 1 << 31)
        self.assertRaises(EncodeError, Writer().uint32, -1)
        self.assertRaises(EncodeError, Writer().uint64, 1 << 64)
        self.assertRaises(EncodeError, Writer().uint64s, [1, -1])
        self.assertRaises(TypeError, Writer().int32, "1")
        self.assertRaises(TypeError, Writer().string, b"x")
        self.assertRaises(TypeError, Writer().opaque, "x")

    def test_reader_primitives(self):
        r = Reader(h("ffffffff ffffffff ffffffff fffffffe 80000000 00000000"
                     "3fe00000 00000000 00000001 00000000"))
        self.assertEqual(r.int32(), -1)
        self.assertEqual(r.uint32(), 0xFFFFFFFF)
        self.assertEqual(r.int64(), -2)
        self.assertEqual(r.uint64(), 1 << 63)
        self.assertEqual(r.real64(), 0.5)
        self.assertIs(r.boolean(), True)
        self.assertIs(r.boolean(), False)
        self.assertTrue(r.at_end())
        r.expect_end()

    def test_reader_over_memoryview_and_bytearray(self):
        data = h("00000004 00000002 c3a90000 00000005 00000001 41000000")
        for source in (memoryview(data), bytearray(data), memoryview(bytearray(data))):
            r = Reader(source)
            self.assertEqual(r.value(), "\u00e9")
            self.assertEqual(r.value(), b"A")
        self.assertRaises(TypeError, Reader, "text")

    def test_boolean_strict(self):
        for word in ("00000002", "ffffffff", "00000100", "01000000"):
            with self.assertRaises(DecodeError) as cm:
                Reader(h(word)).boolean()
            self.assertIn("must be 0 or 1", str(cm.exception))

    def test_truncated_primitives(self):
        for method, size in (("int32", 4), ("uint32", 4), ("int64", 8),
                             ("uint64", 8), ("real64", 8), ("boolean", 4)):
            with self.assertRaises(DecodeError) as cm:
                getattr(Reader(b"\0" * (size - 1)), method)()
            self.assertIn("truncated", str(cm.exception))
            self.assertEqual(cm.exception.offset, 0)

    def test_negative_count(self):
        with self.assertRaises(DecodeError) as cm:
            Reader(h("ffffffff")).strings()
        self.assertIn("negative", str(cm.exception))

    def test_impossible_count(self):
        # 0x7fffffff strings cannot fit in the 8 bytes that follow
        with self.assertRaises(DecodeError) as cm:
            Reader(h("7fffffff 00000000 00000000")).strings()
        self.assertIn("impossible", str(cm.exception))
        # 2 id64s need 16 bytes, only 12 follow
        self.assertRaises(DecodeError, Reader(h("00000002 00000000 00000000 00000000")).uint64s)
        self.assertEqual(Reader(h("00000001 00000000 00000009")).uint64s(), (9,))

    def test_string_overruns(self):
        # length says 0xfffffff0 bytes
        with self.assertRaises(DecodeError) as cm:
            Reader(h("fffffff0 61626364")).string()
        self.assertIn("overruns", str(cm.exception))
        # data present but padding missing
        with self.assertRaises(DecodeError) as cm:
            Reader(h("00000001 61")).string()
        self.assertIn("padding", str(cm.exception))

    def test_padding_contents_ignored(self):
        self.assertEqual(Reader(h("00000001 61ffffff")).string(), "a")

    def test_bad_utf8_offset(self):
        # "ab" then a lone continuation byte at packet offset 4 + 2 = 6
        with self.assertRaises(BadUTF8Error) as cm:
            Reader(h("00000003 6162 80 00")).string()
        self.assertEqual(cm.exception.offset, 6)
        self.assertIsInstance(cm.exception, DecodeError)
        self.assertIsInstance(cm.exception, ValueError)
        self.assertIn("offset 6", str(cm.exception))

    def test_bad_utf8_variants(self):
        for bad in (b"\xc0\xaf",            # overlong '/'
                    b"\xed\xa0\x80",        # UTF-16 surrogate
                    b"\xf4\x90\x80\x80",    # beyond U+10FFFF
                    b"\xe2\x82"):           # truncated sequence
            data = struct.pack(">I", len(bad)) + bad + b"\0" * (-len(bad) % 4)
            self.assertRaises(BadUTF8Error, Reader(data).string)


    def test_nul_byte_is_refused_at_its_offset(self):
        # Section 6.1.4: a string is UTF-8 "with no NUL (0x00) bytes".
        for data, offset in ((h("00000003 61006200"), 5),     # "a\0b"
                             (h("00000001 00000000"), 4),     # "\0"
                             (h("00000002 0080 0000"), 4),    # NUL, then bad UTF-8
                             (h("00000002 8000 0000"), 4)):   # bad UTF-8, then NUL
            with self.assertRaises(BadUTF8Error) as cm:
                Reader(data).string("s")
            self.assertEqual(cm.exception.offset, offset)
        with self.assertRaises(BadUTF8Error) as cm:
            Reader(h("00000003 61006200")).string("s")
        self.assertEqual(str(cm.exception), "NUL byte in s at offset 5")
        self.assertEqual(Reader(h("00000003 61c3a9 00")).string(), "a\u00e9")

    def test_nul_is_not_written(self):
        for write in (Writer().string, Writer().value, encode_value):
            with self.assertRaises(EncodeError) as cm:
                write("a\0b")
            self.assertIn("NUL (U+0000) at character 1", str(cm.exception))
        self.assertRaises(EncodeError, encode_ast, ast.string("\0"))
        self.assertRaises(EncodeError, encode_ast, ast.name("x\0"))
        self.assertRaises(EncodeError, Writer().strings, ["ok", "\0"])


class NameValueTests(unittest.TestCase):

    def test_vector(self):
        # NAME-TYPE-VALUE blocks of 8.2.3.5 behind an int32 count
        data = encode_name_values({"x": 1, "name": "v"})
        self.assertEqual(data, h(
            "00000002"
            "00000001 78000000 00000001 00000001"
            "00000004 6e616d65 00000004 00000001 76000000"))
        self.assertEqual(decode_name_values(data), {"x": 1, "name": "v"})

    def test_empty(self):
        self.assertEqual(encode_name_values({}), h("00000000"))
        self.assertEqual(decode_name_values(h("00000000")), {})

    def test_duplicate_name_rejected(self):
        data = h("00000002"
                 "00000001 78000000 00000001 00000001"
                 "00000001 78000000 00000001 00000002")
        with self.assertRaises(DecodeError) as cm:
            decode_name_values(data)
        self.assertIn("duplicate", str(cm.exception))
        self.assertEqual(cm.exception.offset, 20)
        self.assertIsInstance(cm.exception, xdr.RepeatedNameError)
        self.assertEqual(cm.exception.name, "x")

    def test_repeated_name_with_repeats_takes_the_last_value(self):
        """With a ``repeats`` list (whoever got RepeatedNameError decoding
        again) the last value is taken and the name recorded, in the fast
        path and the checked one (a float value) alike, with the C
        decoder or without."""
        for tail in ("00000001 00000002", "00000003 40000000 00000000"):
            data = h("00000003"
                     "00000001 78000000 00000001 00000001"
                     "00000001 79000000 00000001 00000005"
                     "00000001 78000000 " + tail)
            repeats = []
            reader = Reader(data, repeats=repeats)
            got = reader.name_values()
            self.assertEqual(got, {"x": 2 if tail.startswith("00000001") else 2.0, "y": 5})
            self.assertEqual((repeats, reader.pos), (["x"], len(data)))
            self.assertRaises(xdr.RepeatedNameError, Reader(data).name_values)

    def test_options_take_the_last_value_of_a_repeated_name(self):
        """A connection options table: a repeated name is no error, its last
        value counts (as Avis reads it)."""
        data = h("00000002"
                 "00000001 78000000 00000001 0000000a"
                 "00000001 78000000 00000001 00000014")
        reader = Reader(data)
        self.assertEqual(reader.options(), {"x": 20})
        self.assertIsNone(reader.repeats)

    def test_name_must_be_str(self):
        self.assertRaises(TypeError, encode_name_values, {1: 1})

    def test_nul_in_a_name_or_value_is_refused(self):
        # both the accelerated and the pure-Python path (the test runs
        # under each)
        good = encode_name_values({"v": "a", "w": 1})
        for old, new, offset in ((b"v\0\0\0", b"\0\0\0\0", 8),
                                 (b"\0\0\0\x01a\0\0\0", b"\0\0\0\x01\0\0\0\0", 20)):
            data = good.replace(old, new, 1)
            self.assertNotEqual(data, good)
            with self.assertRaises(BadUTF8Error) as cm:
                decode_name_values(data)
            self.assertEqual(cm.exception.offset, offset)
            self.assertIn("NUL byte in attribute", str(cm.exception))

    def test_nul_in_a_name_or_value_is_not_written_and_names_the_attribute(self):
        with self.assertRaises(EncodeError) as cm:
            encode_name_values({"ok": 1, "v": "a\0b"})
        self.assertEqual(str(cm.exception), "attribute 'v': string holds a NUL (U+0000) at "
                                            "character 1, which an Elvin string cannot "
                                            "(section 6.1.4)")
        with self.assertRaises(EncodeError) as cm:
            encode_name_values({"v\0": 1})
        self.assertIn("attribute 'v\\x00': name holds a NUL", str(cm.exception))

        class Text(str):
            pass
        with self.assertRaises(EncodeError) as cm:
            encode_name_values({"t": Text("\0")})
        self.assertIn("attribute 't': string holds a NUL", str(cm.exception))

    def test_huge_count(self):
        with self.assertRaises(DecodeError):
            decode_name_values(h("40000000 00000001 78000000 00000001 00000001"))


def x_equals_1():
    return ast.node(Kind.EQUALS, ast.name("x"), ast.int32(1))


class ASTVectorTests(unittest.TestCase):
    """SubAST: int32 typecode, int32 value typecode (0 for operators), then
    the leaf value or an array of children."""

    def test_x_equals_1(self):
        expected = h("00000008 00000000 00000002"      # equals, no value, 2 kids
                     "00000001 00000004 00000001 78000000"   # name "x"
                     "00000002 00000001 00000001")     # int32 1
        self.assertEqual(encode_ast(x_equals_1()), expected)
        self.assertEqual(decode_ast(expected), x_equals_1())

    def test_leaves(self):
        self.assertEqual(encode_ast(ast.int64(-1)),
                         h("00000003 00000002 ffffffff ffffffff"))
        self.assertEqual(encode_ast(ast.real64(1.0)),
                         h("00000004 00000003 3ff00000 00000000"))
        self.assertEqual(encode_ast(ast.string("ab")),
                         h("00000005 00000004 00000002 61620000"))
        self.assertEqual(encode_ast(Node(Kind.EMPTY)), h("00000000"))
        self.assertEqual(decode_ast(h("00000000")), Node(Kind.EMPTY))

    def test_function_node(self):
        tree = ast.node(Kind.FUNC_REQUIRE, ast.name("a"))
        self.assertEqual(encode_ast(tree), h(
            "00000040 00000000 00000001 00000001 00000004 00000001 61000000"))
        self.assertEqual(decode_ast(encode_ast(tree)), tree)

    def test_avis_typecodes(self):
        tree = ast.node(Kind.ADD, ast.name("a"), ast.int32(1))
        data = encode_ast(tree, AVIS_AST_TYPECODES)
        self.assertEqual(data[:4], h("0000001d"))  # Avis: ADD = 29
        self.assertEqual(decode_ast(data, AVIS_AST_TYPECODES), tree)
        self.assertEqual(encode_ast(tree)[:4], h("00000019"))  # spec: 25

    def test_wrong_leaf_value_typecode(self):
        with self.assertRaises(DecodeError) as cm:
            decode_ast(h("00000001 00000001 00000001"))  # name with int32
        self.assertEqual(cm.exception.offset, 4)
        self.assertRaises(DecodeError, decode_ast, h("00000002 00000002 00000000 00000001"))

    def test_operator_with_value_typecode(self):
        self.assertRaises(DecodeError, decode_ast, h("00000013 00000001 00000000"))

    def test_unknown_typecode(self):
        for code in ("00000006", "00000007", "00000043", "ffffffff"):
            with self.assertRaises(DecodeError) as cm:
                decode_ast(h(code + "00000000 00000000"))
            self.assertIn("unknown SubAST typecode", str(cm.exception))

    def test_negative_and_huge_child_counts(self):
        self.assertRaises(DecodeError, decode_ast, h("00000012 00000000 ffffffff"))
        self.assertRaises(DecodeError, decode_ast, h("00000012 00000000 00010000 00000000"))

    def _nested_nots(self, depth):
        tree = ast.name("x")
        for _ in range(depth - 1):
            tree = ast.node(Kind.NOT, tree)
        return tree

    def test_depth_limit(self):
        ok = self._nested_nots(xdr.MAX_AST_DEPTH)
        self.assertEqual(decode_ast(encode_ast(ok)), ok)
        deep = encode_ast(self._nested_nots(xdr.MAX_AST_DEPTH + 1))
        with self.assertRaises(DecodeError) as cm:
            decode_ast(deep)
        self.assertIn("deeper than 256", str(cm.exception))

    def test_very_deep_encode_does_not_recurse(self):
        tree = self._nested_nots(5000)
        self.assertEqual(len(encode_ast(tree)), 12 * 4999 + 16)

    def test_truncated_ast(self):
        data = encode_ast(x_equals_1())
        for n in range(len(data)):
            self.assertRaises(DecodeError, decode_ast, data[:n])


# -- property tests ---------------------------------------------------------

int32s = st.integers(-(1 << 31), (1 << 31) - 1)
int64s = st.integers(-(1 << 63), (1 << 63) - 1)
#: strings as section 6.1.4 defines them: any Unicode text but NUL
elvin_characters = st.characters(codec="utf-8", exclude_characters="\0")
texts = st.text(elvin_characters, max_size=20)
values = st.one_of(int32s, int64s.map(Int64), st.floats(allow_nan=False),
                   texts, st.binary(max_size=20))
attributes = st.dictionaries(texts, values, max_size=8)

leaves = st.one_of(texts.map(ast.name), int32s.map(ast.int32), int64s.map(ast.int64),
                   st.floats(allow_nan=False).map(ast.real64), texts.map(ast.string))
_OPERATORS = [k for k in Kind if k not in ast.LEAF_KINDS and k != Kind.EMPTY]
trees = st.recursive(
    leaves,
    lambda children: st.builds(lambda kind, kids: Node(kind, None, kids),
                               st.sampled_from(_OPERATORS),
                               st.lists(children, max_size=4)),
    max_leaves=25)


def same_value(a, b):
    return type(a) is type(b) and a == b


class PropertyTests(unittest.TestCase):

    @given(values)
    def test_value_round_trip(self, value):
        decoded = decode_value(encode_value(value))
        if type(value) is int and not -(1 << 31) <= value < (1 << 31):
            value = Int64(value)
        self.assertTrue(same_value(decoded, value), (decoded, value))
        self.assertEqual(len(encode_value(value)) % 4, 0)

    @given(attributes)
    def test_name_values_round_trip(self, attrs):
        self.assertEqual(decode_name_values(encode_name_values(attrs)), attrs)

    @given(trees)
    def test_ast_round_trip(self, tree):
        self.assertEqual(decode_ast(encode_ast(tree)), tree)
        self.assertEqual(decode_ast(encode_ast(tree, AVIS_AST_TYPECODES),
                                    AVIS_AST_TYPECODES), tree)

    @settings(max_examples=300)
    @given(st.binary(max_size=64))
    def test_garbage_only_raises_decode_error(self, data):
        for decode in (decode_value, decode_name_values, decode_ast):
            try:
                decode(data)
            except DecodeError:
                pass

    def test_nan_round_trip_keeps_bits(self):
        nan = struct.unpack(">d", h("7ff80000 00000001"))[0]
        self.assertEqual(encode_value(nan), h("00000003 7ff80000 00000001"))
        self.assertEqual(decode_ast(encode_ast(ast.real64(nan))), ast.real64(nan))


class WriterEdgeTests(unittest.TestCase):

    def test_unencodable_names_and_strings(self):
        self.assertRaises(EncodeError, encode_name_values, {"\udc80": 1})
        self.assertRaises(EncodeError, encode_name_values, {"a": "\udc80"})
        self.assertRaises(EncodeError, encode_ast, ast.name("\udc80"))

    def test_str_subclass_name(self):
        class Name(str):
            pass
        self.assertEqual(encode_name_values({Name("x"): 1}), encode_name_values({"x": 1}))

    def test_bool_values_are_int32(self):
        self.assertEqual(encode_value(True), h("00000001 00000001"))

    def test_avis_typecodes_cover_every_kind(self):
        self.assertEqual(set(AVIS_AST_TYPECODES), set(Kind))
        self.assertEqual(len(set(AVIS_AST_TYPECODES.values())), len(Kind))
