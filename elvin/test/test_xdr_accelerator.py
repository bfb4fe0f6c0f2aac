"""The compiled NameValue decoder and the pure-Python one agree, and so
do the index's compiled look-up (its buckets', their grid cells') and
packing of bounds and their pure-Python twins.

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

from elvin.test.test_index import (_NUMBER_VALUES, Entry, TreeEntry, _entries,
                                   _ranged_expression, _real, _two_range_expression)
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


@st.composite
def _look_up_expression(draw):
    """Subscriptions filed by strings (one to three names), numbers, a
    name or nothing, with ranges on n, m and k, some in cells narrow
    enough that a large value is past every cell number."""
    filed = draw(st.sampled_from(['s == "a" && '] * 6 + ['s == "a" && t == "b" && ',
                                  't == "b" && s == "a" && u == "c" && ', 'x == 1 && ',
                                  's == "b" && ', '']))
    ranges = draw(st.one_of(_two_range_expression(), _ranged_expression(), st.sampled_from(
        ["n >= 0.001 && n <= 0.0015 && m >= 0 && m <= 0.001",
         f"n >= {_real(1e300)} && n <= {_real(1e301)}",
         "n >= 0.5 && n <= 0.5 && m >= 0.25 && m <= 0.5 && k > 0.125",
         f"n >= -0.001 && n <= 0 && m >= {_real(1e290)} && m <= {_real(2e290)}"])))
    return filed + ranges


_LOOK_UP_VALUES = st.one_of(_NUMBER_VALUES, st.sampled_from(
    [1e308, -1e308, 1.7e308, 5e-324, True, False, Int64(-(1 << 63)), 2 ** 53 + 1, "a", "b"]))


def _same_entries(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


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

    def test_the_index_uses_its_look_up_and_packing(self):
        if os.environ.get("ELVIN_PURE_PYTHON"):
            self.assertIs(index._select_bucket, index._select_bucket_in_python)
            self.assertIs(index._select_by_values, index._select_by_values_in_python)
            self.assertIs(index._cell_select, index._select_in_cell)
            self.assertIs(index._pack_bounds, index._pack_bounds_in_python)
        else:
            self.assertIs(index._select_bucket, _elvin_xdr.bucket_select)
            self.assertIs(index._select_by_values, _elvin_xdr.values_select)
            self.assertIs(index._cell_select, _elvin_xdr.cell_select)
            self.assertIs(index._pack_bounds, _elvin_xdr.pack_bounds)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(_look_up_expression(), min_size=12, max_size=40),
           st.lists(st.dictionaries(st.sampled_from("stunmkx"), _LOOK_UP_VALUES, max_size=7),
                    min_size=1, max_size=8),
           st.randoms(use_true_random=False))
    def test_the_bucket_look_ups_agree(self, expressions, notifications, rng):
        # The compiled look-up (from a bucket's look, of the buckets by
        # values) gives the entries the pure-Python one gives, in the same
        # order, for any bucket (grid or none, rows, loose, cells sharing
        # a key) and any notification: NaN, infinities, -0.0, bools, int64
        # extremes and past 2**53, a value past every cell number, one
        # missing or not a number, keys of strings or of numbers (made by
        # the key function), after removals (its look kept up to date).
        def make(i, text):
            return (TreeEntry if rng.random() < 0.2 else Entry)(i, text)
        entries = _entries(expressions, make)
        subscriptions = index.SubscriptionIndex()
        for entry in entries:
            subscriptions.add(entry, getattr(entry, "tree", None))
        for entry in rng.sample(entries, len(entries) // 3):
            subscriptions.remove(entry)
        buckets = [subscriptions._always, *subscriptions._by_name.values(),
                   *(b for table in subscriptions._by_values.values() for b in table.values())]
        numbers = index._NUMBERS
        for note in notifications:
            expected, found = [], []
            index._select_by_values_in_python(subscriptions._by_values, note, expected,
                                              numbers, index._key)
            _elvin_xdr.values_select(subscriptions._by_values, note, found, numbers, index._key)
            self.assertTrue(_same_entries(found, expected), (note, found, expected))
            for bucket in buckets:
                expected, found = ["before"], ["before"]
                index._select_bucket_in_python(bucket, note, expected, numbers)
                self.assertIsNone(_elvin_xdr.bucket_select(bucket, note, found, numbers))
                self.assertTrue(_same_entries(found, expected), (note, found, expected))

    def test_the_compiled_look_up_refuses_what_it_is_not_made_for(self):
        bucket = index._Bucket()
        numbers = index._NUMBERS
        for args in ((bucket, [], [], numbers), (bucket, {}, (), numbers),
                     (bucket, {}, [], [int]), (bucket, {}, []), (object(), {}, [], numbers)):
            with self.assertRaises((TypeError, AttributeError)):
                _elvin_xdr.bucket_select(*args)
        bucket.look = ({}, None, None, "n", 1, None, 1.0, None)     # a width not a float
        with self.assertRaises(TypeError):
            _elvin_xdr.bucket_select(bucket, {"n": 1}, [], numbers)
        for by_values in ([], {("s",): []}, {"s": {}}):
            with self.assertRaises(TypeError):
                _elvin_xdr.values_select(by_values, {"s": "a"}, [], numbers, index._key)
        with self.assertRaises(ZeroDivisionError):      # the key function's error
            _elvin_xdr.values_select({("s",): {}}, {"s": 1}, [], numbers, lambda *a: 1 / 0)

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

    @settings(max_examples=300, deadline=None)
    @given(_attributes, st.integers(0, 13), st.integers(0, 64),
           st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=2))
    def test_a_count_over_its_limit_is_refused_alike(self, attributes, limit, cut, flips):
        # The compiled decoder reads its own count: Reader.name_values checks
        # the limit ahead of it, as the pure-Python count does.
        data = bytearray(Writer().name_values(attributes).getvalue())
        for where, byte in flips:
            data[where % len(data)] = byte
        data = bytes(data[: max(0, len(data) - cut)]) if cut % 3 == 0 else bytes(data)

        def read():
            try:
                got = Reader(data, limits={"attribute": limit}).name_values("attribute")
            except xdr.CountOverLimit as e:
                return ("over", e.count, e.limit, e.offset)
            except DecodeError as e:
                return ("error", type(e), str(e))
            return ("read", sorted(got.items(), key=repr), len(got))

        compiled = read()
        self.patch(xdr, "_accelerated_name_values", None)
        self.assertEqual(compiled, read())
        if len(attributes) > limit and not flips and cut % 3:
            self.assertEqual(compiled[0], "over")

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
