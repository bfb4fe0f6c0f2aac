"""Tests for spark_analysis.arrowparse and partwriter: the ingest's parsing,
checking and writing, without Spark (pyarrow only).

The property that matters: whatever path a chunk takes (Arrow's reader and
column checks, or line by line), a line is good exactly when
traceformat.check_record says so (with the two documented allowances), and
a good line's columns are what the record says.
"""

import gzip
import json
import os
import shutil
import tempfile

from hypothesis import given, settings, strategies as st
from twisted.trial import unittest

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from spark_analysis import arrowparse as ap
    from spark_analysis import partwriter
except ImportError as e:      # pragma: no cover - pyarrow is a test dependency
    ap = None
    SKIP = f"pyarrow is not installed: {e}"
else:
    SKIP = None

from spark_analysis import traceformat as tf
from elvin.test.test_spark_analysis import BAD, GOOD, T0


def _lines(objs):
    return "".join(json.dumps(o) + "\n" for o in objs).encode("utf-8")


def _rows(tables):
    return [row for t in tables for row in t.to_pylist()]


def _expected(obj):
    """check_record's verdict with the ingest's allowances."""
    return tf.check_record(ap._normalise(obj) if type(obj) is dict else obj)


class ParseTests(unittest.SynchronousTestCase):
    skip = SKIP

    def test_good_records_take_the_fast_path(self):
        notify = dict(GOOD[3], attrs=["b", "A", "c"])      # unsorted: stored sorted
        data = _lines([GOOD[0], GOOD[2], notify, GOOD[4]])
        self.assertIsNotNone(ap._fast(data))
        rows = _rows(ap.parse_chunk(data, "file:/x"))
        self.assertEqual([r["status"] for r in rows], ["ok"] * 4)
        n = rows[2]
        self.assertEqual(n["attrs"], ["A", "b", "c"])
        self.assertEqual((n["origin"], n["hops"], n["router"]), ("b", 1, "a"))
        self.assertEqual(n["dkey"], 0)                      # first 64 bits of "000..."
        self.assertEqual(str(n["day"]), "2024-05-01")
        self.assertEqual(rows[0]["hops"], None)
        self.assertEqual(rows[0]["file"], "file:/x")

    def test_dkey_is_the_digests_first_64_bits(self):
        digest = "ffeeddccbbaa99887766554433221100aabbccdd"
        obj = dict(GOOD[3], digest=digest)
        (row,) = _rows(ap.parse_chunk(_lines([obj]), "f"))
        self.assertEqual(row["dkey"], int(digest[:16], 16) - 2**64)

    def test_same_set_same_key(self):
        a = dict(GOOD[3], attrs=["x", "y"])
        b = dict(GOOD[3], attrs=["y", "x"])
        c = dict(GOOD[3], attrs=["x", "z"])
        rows = _rows(ap.parse_chunk(_lines([a, b, c]), "f"))
        self.assertEqual(rows[0]["akey"], rows[1]["akey"])
        self.assertNotEqual(rows[0]["akey"], rows[2]["akey"])
        # the line-by-line path gives the same keys
        slow = _rows(ap._slow(_lines([a, b, c]), "f"))
        self.assertEqual([r["akey"] for r in slow], [r["akey"] for r in rows])
        self.assertEqual([r["dkey"] for r in slow], [r["dkey"] for r in rows])

    def test_bad_lines_named_good_lines_kept(self):
        objs = [obj for obj, _ in BAD]
        data = _lines(GOOD + objs) + b"{nope\n\n[1]\n\xff\xfe\n"
        rows = _rows(ap.parse_chunk(data, "f"))
        good = [r for r in rows if r["status"] == "ok"]
        bad = [r for r in rows if r["status"] == "bad"]
        self.assertEqual(len(good), len(GOOD))
        self.assertEqual(len(bad), len(BAD) + 3)
        for (_, reason), row in zip(BAD, bad):
            self.assertIn(reason, row["bad_reason"])
            self.assertIsNotNone(row["raw"])
        self.assertIn("not JSON", bad[-3]["bad_reason"])
        self.assertEqual(bad[-2]["bad_reason"], "not a JSON object")
        self.assertIn("not valid UTF-8", bad[-1]["bad_reason"])

    def test_two_objects_on_a_line_are_one_bad_line(self):
        line = json.dumps(GOOD[0]) + " " + json.dumps(GOOD[0]) + "\n"
        rows = _rows(ap.parse_chunk(line.encode(), "f"))
        self.assertEqual([r["status"] for r in rows], ["bad"])
        self.assertIn("not JSON", rows[0]["bad_reason"])

    def test_integers_out_of_range_and_floats(self):
        big = dict(GOOD[2], filter_bytes=2**64)
        real = dict(GOOD[2], filter_bytes=4.0)
        rows = _rows(ap.parse_chunk(_lines([big, real]), "f"))
        self.assertIn("out of range", rows[0]["bad_reason"])
        self.assertIn("wrong type", rows[1]["bad_reason"])

    def test_duplicate_names_are_bad(self):
        rows = _rows(ap.parse_chunk(_lines([dict(GOOD[3], attrs=["a", "a"])]), "f"))
        self.assertIn("without duplicates", rows[0]["bad_reason"])

    def test_files_and_chunks(self):
        """A gzip file read in small chunks gives the same rows as one chunk,
        and bad_lines numbers lines from the file's start."""
        directory = tempfile.mkdtemp(prefix="elvin-arrowparse-")
        self.addCleanup(shutil.rmtree, directory, True)
        objs = [dict(GOOD[3], ts_us=T0 + i, digest=f"{i:040x}") for i in range(500)]
        objs[123] = BAD[0][0]
        path = os.path.join(directory, "a.jsonl.gz")
        with gzip.open(path, "wb") as f:
            f.write(_lines(objs))
        whole = _rows(ap.parse_file(path, "f", True))
        small = _rows(ap.parse_file(path, "f", True, chunk=1000))
        key = lambda r: (r["status"], r["ts_us"] or 0)  # noqa: E731
        self.assertEqual(sorted(whole, key=key), sorted(small, key=key))
        self.assertEqual(sum(r["status"] == "bad" for r in whole), 1)
        self.assertEqual([(n, r) for n, r, _ in ap.bad_lines(path, True)],
                         [(124, "unsupported format version 2")])
        self.assertEqual(ap.bad_lines(path, True, start_byte=10**9), [])

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(GOOD + [o for o, _ in BAD]),
                              st.sampled_from(["v", "ts_us", "router", "peer", "event",
                                               "direction", "routing", "size", "attrs",
                                               "digest", "filter_nodes", "filter_bytes",
                                               "reason", None]),
                              st.one_of(st.none(), st.integers(-2**65, 2**65), st.text(max_size=3),
                                        st.booleans(), st.floats(allow_nan=False),
                                        st.lists(st.one_of(st.text(max_size=2), st.none(),
                                                           st.integers()), max_size=3))),
                    min_size=1, max_size=12))
    def test_verdict_is_check_records(self, mutations):
        """Records with one field replaced by anything: each line's verdict
        (and reason) is check_record's, whichever path its chunk took."""
        objs = []
        for base, field, value in mutations:
            obj = dict(base)
            if field is not None:
                obj[field] = value
            objs.append(obj)
        rows = _rows(ap.parse_chunk(_lines(objs), "f"))
        good = [r for r in rows if r["status"] == "ok"]
        bad = [r["bad_reason"] for r in rows if r["status"] == "bad"]
        expected_bad = []
        expected_good = 0
        for obj in objs:
            reason = _expected(obj)
            for name in ap._INT_FIELDS:
                value = obj.get(name)
                if reason is None and type(value) is int and not -2**63 <= value < 2**63:
                    reason = f"field {name!r} out of range (64-bit integers)"
            if reason is None:
                expected_good += 1
            else:
                expected_bad.append(reason)
        self.assertEqual(len(good), expected_good)
        self.assertEqual(sorted(bad), sorted(expected_bad))


class WriterTests(unittest.SynchronousTestCase):
    skip = SKIP

    def test_layout_and_escaping(self):
        self.assertEqual(partwriter.escape_path_name("a/b:c d%"), "a%2Fb%3Ac d%25")
        root = tempfile.mkdtemp(prefix="elvin-partwriter-")
        self.addCleanup(shutil.rmtree, root, True)
        objs = [dict(GOOD[0], router="r/1", ts_us=T0 + i * 3600 * 10**6) for i in range(30)]
        tables = list(ap.parse_chunk(_lines(objs) + b"[1]\n", "f"))
        writer = partwriter.PartitionedWriter(root, ap.EVENTS_SCHEMA,
                                              ["status", "day", "router"], attempt="t1")
        for table in tables:
            writer.write(table)
        written = sorted(writer.close())
        self.assertEqual(written, [
            "status=bad/day=__HIVE_DEFAULT_PARTITION__/router=__HIVE_DEFAULT_PARTITION__/"
            "part-t1-00002.zstd.parquet",
            "status=ok/day=2024-05-01/router=r%2F1/part-t1-00000.zstd.parquet",
            "status=ok/day=2024-05-02/router=r%2F1/part-t1-00001.zstd.parquet"])
        first = pq.read_table(os.path.join(root, written[1]))
        self.assertEqual(first.num_rows, 12)                # 12:00 .. 23:00
        self.assertNotIn("router", first.column_names)      # in the path only
        self.assertEqual(first.schema.field("hops").type, pa.int32())


class TimeSanityTests(unittest.SynchronousTestCase):
    """Records dated far from the rest of their file are set aside (status aside)."""

    skip = SKIP

    def test_plausible_range(self):
        hour = tf.TIME_SLACK_US
        ten_minutes = [T0 + i * 10**6 for i in range(600)]
        lo, hi = tf.plausible_range(ten_minutes, T0)
        self.assertEqual((lo, hi), (T0 - hour, T0 + 593 * 10**6 + hour))
        # a file whose bulk spans three hours allows three hours either side
        long = [T0 + i * 36 * 10**6 for i in range(300)]
        lo, hi = tf.plausible_range(long)
        self.assertEqual(hi - lo, 3 * (long[296] - long[2]))
        # few records: their median, and the file's name time
        self.assertEqual(tf.plausible_range([T0 + 5, T0 + 9, T0 + 10**15], T0),
                         (T0 - hour, T0 + 9 + hour))

    def test_a_far_record_is_set_aside_with_its_line(self):
        future = 4102444800 * 10**6
        objs = [dict(GOOD[0], ts_us=T0 + i * 10**6) for i in range(200)]
        objs.insert(120, dict(GOOD[0], ts_us=future))
        data = _lines(objs)
        name = "file:/x/a-20240501T120000Z-000001.jsonl"
        tables, n, first = ap.set_aside(ap.parse_chunk(data, name), name)
        rows = _rows(tables)
        self.assertEqual((n, first), (1, [future]))
        aside = [r for r in rows if r["status"] == "aside"]
        self.assertEqual([r["ts_us"] for r in aside], [future])
        self.assertIn("dated 2100-01-01T00:00:00Z", aside[0]["bad_reason"])
        self.assertEqual(sum(1 for r in rows if r["status"] == "ok"), 200)
        path = os.path.join(tempfile.mkdtemp(), "a.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        self.assertEqual(ap.lines_at_times(path, False, [future]), [(121, future)])

    def test_nothing_is_set_aside_from_a_plausible_file(self):
        objs = [dict(GOOD[0], ts_us=T0 + i * 10**6) for i in range(200)]
        tables = ap.parse_chunk(_lines(objs), "f")
        self.assertEqual(ap.set_aside(tables, "f"), (tables, 0, []))
