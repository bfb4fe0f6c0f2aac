"""The compiled NameValue decoder and the pure-Python one agree, and so
do the index's compiled grid-cell filter and packing of bounds and their
pure-Python twins.

``_elvin_xdr`` is built by ``pip install .`` (setup.py, optional=True). It
returns None for anything not well formed, so the Python path raises the
error; on well-formed bytes both give equal dicts and end offsets. CI sets
ELVIN_REQUIRE_ACCEL so a build that silently lost the extension fails.
"""

import math
import os
import struct

from hypothesis import given, settings, strategies as st
from twisted.trial import unittest

from elvin.core import index
from elvin.protocols import xdr
from elvin.protocols.xdr import DecodeError, Reader, Writer
from elvin.values import Int64

from elvin.test.test_xdr import elvin_characters

try:
    import _elvin_xdr
except ImportError:
    _elvin_xdr = None

_names = st.text(elvin_characters, min_size=1, max_size=12)
_values = st.one_of(
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.integers(-(1 << 63), (1 << 63) - 1).map(Int64),
    st.floats(allow_nan=False),
    st.text(elvin_characters, max_size=40),
    st.binary(max_size=40))
_attributes = st.dictionaries(_names, _values, max_size=12)
#: Bounds and values in cells (a number over a cell width): edges,
#: signed zeros, infinities, NaN, past 2**53.
_cell_numbers = st.one_of(
    st.floats(-3, 3), st.floats(width=32), st.floats(), st.integers(-4, 4).map(float),
    st.sampled_from([-0.0, 0.0, math.inf, -math.inf, math.nan, 2.0 ** 53, 2.0 ** 53 + 2,
                     float(2 ** 63), 0.1 + 0.2, 0.3, 5e-324, 3.4028234663852886e38,
                     3.4028235677973366e38, -1e39]))
_cell_bounds = _cell_numbers.filter(lambda x: not math.isnan(x))


def _python(data, pos=0):
    reader = Reader(data, pos)
    try:
        result = reader._name_values("attribute")
    except DecodeError:
        return "error"
    return result, reader.pos


def _compiled(data, pos=0):
    return _elvin_xdr.name_values(data, pos, len(data), Int64)


def _same(a, b):
    """Dicts equal with each value's type too (Int64 is not int)."""
    return a.keys() == b.keys() and all(
        type(a[k]) is type(b[k]) and (a[k] == b[k] or (isinstance(a[k], float)
                                                       and math.isnan(a[k])
                                                       and math.isnan(b[k])))
        for k in a)


class AcceleratorTests(unittest.TestCase):

    def setUp(self):
        if _elvin_xdr is None:
            if os.environ.get("ELVIN_REQUIRE_ACCEL"):
                self.fail("_elvin_xdr was not built, but ELVIN_REQUIRE_ACCEL is set")
            raise unittest.SkipTest("_elvin_xdr is not built (pip install . builds it)")

    def test_the_codec_uses_it(self):
        if os.environ.get("ELVIN_PURE_PYTHON"):
            self.assertIsNone(xdr._accelerated_name_values)
        else:
            self.assertIs(xdr._accelerated_name_values, _elvin_xdr.name_values)

    def test_the_index_uses_its_cell_filter_and_packing(self):
        if os.environ.get("ELVIN_PURE_PYTHON"):
            self.assertIs(index._cell_select, index._select_in_cell)
            self.assertIs(index._pack_bounds, index._pack_bounds_in_python)
        else:
            self.assertIs(index._cell_select, _elvin_xdr.cell_select)
            self.assertIs(index._pack_bounds, _elvin_xdr.pack_bounds)

    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.tuples(_cell_bounds, _cell_bounds), min_size=1, max_size=3))
    def test_the_bounds_are_packed_the_same(self, pairs):
        # as float32s, each rounded outward (test_index checks how)
        bounds = [x for pair in pairs for x in pair]
        self.assertEqual(_elvin_xdr.pack_bounds(*bounds), index._pack_bounds_in_python(*bounds))

    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.lists(_cell_bounds, min_size=6, max_size=6), max_size=6),
           st.lists(_cell_numbers, min_size=1, max_size=3))
    def test_the_cell_filters_agree(self, bounds, values):
        # A cell is its entries' bounds as native float32s ((lo, hi) for
        # each of one to three values) in one bytes object, then the
        # entries; both filters append the same entries, in order: those
        # whose bounds no value is below or above (a NaN value: none).
        per = 2 * len(values)
        entries = [object() for _ in bounds]
        packed = b"".join(index._pack_bounds(*b[:per]) for b in bounds)
        bounds = list(struct.iter_unpack(f"{per}f", packed))
        cells = {7: (packed, *entries)} if entries else {}
        expected = [entry for entry, b in zip(entries, bounds)
                    if not any(v < b[2 * k] or v > b[2 * k + 1] for k, v in enumerate(values))]
        for select in index._select_in_cell, _elvin_xdr.cell_select:
            found = ["before"]
            self.assertIsNone(select(cells, 7, found, *values))
            self.assertEqual(found[1:], expected, select)
            self.assertTrue(all(a is b for a, b in zip(found[1:], expected)))
            found = []
            select(cells, 8, found, *values)
            self.assertEqual(found, [])

    def test_the_compiled_cell_functions_refuse_what_they_are_not_made_for(self):
        cells = {1: (b"\0" * 8, "a", "b"), 2: ("bounds", "a"), 3: [b"\0" * 8, "a"]}
        for key in 1, 2, 3:
            with self.assertRaises(TypeError):
                _elvin_xdr.cell_select(cells, key, [], 0.5)
        for args in ((cells, 1, []), ([], 1, [], 0.5), (cells, 1, (), 0.5),
                     (cells, 1, [], "0.5"), (cells, 1, [], 0.5, 0.5, 0.5, 0.5)):
            with self.assertRaises(TypeError):
                _elvin_xdr.cell_select(*args)
        with self.assertRaises(TypeError):
            _elvin_xdr.cell_select({[]: 1}, [], [], 0.5)     # an unhashable key
        for args in ((0.5,), ("0", 1.0), (0.0,) * 18):
            with self.assertRaises(TypeError):
                _elvin_xdr.pack_bounds(*args)
        with self.assertRaises(ValueError):
            _elvin_xdr.pack_bounds(0.0, math.nan)

    @settings(max_examples=300, deadline=None)
    @given(_attributes, st.binary(max_size=8).map(lambda b: b[: len(b) & ~3]))
    def test_well_formed_arrays_decode_the_same(self, attributes, prefix):
        data = prefix + Writer().name_values(attributes).getvalue() + b"\0\0\0\1"
        expected, end = _python(data, len(prefix))
        got, got_end = _compiled(data, len(prefix))
        self.assertEqual(got_end, end)
        self.assertTrue(_same(got, expected), (got, expected))
        self.assertTrue(_same(got, attributes))

    @settings(max_examples=500, deadline=None)
    @given(_attributes, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                 min_size=1, max_size=4),
           st.integers(0, 64))
    def test_damaged_arrays_never_disagree(self, attributes, flips, cut):
        data = bytearray(Writer().name_values(attributes).getvalue())
        for where, byte in flips:
            data[where % len(data)] = byte
        data = bytes(data[: max(0, len(data) - cut)]) if cut % 3 == 0 else bytes(data)
        expected = _python(data)
        got = _compiled(data)
        if expected == "error":
            self.assertIsNone(got)
        elif got is not None:
            self.assertEqual(got[1], expected[1])
            self.assertTrue(_same(got[0], expected[0]))

    def test_each_problem_falls_back(self):
        def array(*items):
            return struct.pack(">i", len(items)) + b"".join(items)

        def string(raw):
            return struct.pack(">I", len(raw)) + raw + b"\0" * (-len(raw) & 3)
        int32 = struct.pack(">ii", 1, 7)
        cases = {
            "negative count": struct.pack(">i", -1),
            "impossible count": struct.pack(">i", 1000) + b"\0" * 12,
            "bad UTF-8 name": array(string(b"\xff") + int32),
            "bad UTF-8 value": array(string(b"a") + struct.pack(">i", 4) + string(b"\xc3")),
            "repeated name": array(string(b"a") + int32, string(b"a") + int32),
            "unknown typecode": array(string(b"a") + struct.pack(">ii", 9, 0)),
            "truncated value": array(string(b"a") + struct.pack(">i", 2) + b"\0\0\0"),
            "string overruns": array(string(b"a") + struct.pack(">iI", 4, 1 << 31)),
            "NUL in a name": array(string(b"a\0") + int32),
            "NUL in a value": array(string(b"a") + struct.pack(">i", 4) + string(b"b\0c")),
            "NUL as a value": array(string(b"a") + struct.pack(">i", 4) + string(b"\0")),
        }
        for what, data in cases.items():
            self.assertEqual(_python(data), "error", what)
            self.assertIsNone(_compiled(data), what)

    def test_nan_and_int64_edges(self):
        attributes = {"n": float("nan"), "lo": Int64(-(1 << 63)), "hi": Int64((1 << 63) - 1),
                      "i": -(1 << 31)}
        data = Writer().name_values(attributes).getvalue()
        got, _ = _compiled(data)
        self.assertTrue(_same(got, _python(data)[0]))
        self.assertIs(type(got["lo"]), Int64)

    def test_int64_type_that_is_not_an_int_is_called(self):
        # values.Int64 is made by int.__new__ directly; anything else given
        # as the int64 type is called as before.
        data = Writer().name_values({"t": Int64(5)}).getvalue()
        got, _ = _elvin_xdr.name_values(data, 0, len(data), lambda n: ("made", n))
        self.assertEqual(got, {"t": ("made", 5)})

    def test_padding_that_is_not_zero_is_left_to_python(self):
        # What the compiled decoder reads is its own canonical encoding
        # (a router passes it on as it came); anything else is Python's.
        data = bytearray(Writer().name_values({"s": "ab", "o": b"\x01"}).getvalue())
        self.assertIsNotNone(_compiled(bytes(data)))
        string = data.index(b"ab") + 2
        opaque = data.index(b"\x00\x00\x00\x01\x01") + 5
        for at in (string, string + 1, opaque, opaque + 2):
            dirty = bytearray(data)
            dirty[at] = 9
            self.assertIsNone(_compiled(bytes(dirty)))
            self.assertEqual(_python(bytes(dirty))[0], {"s": "ab", "o": b"\x01"})
