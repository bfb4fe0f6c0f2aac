"""Tests for spark_analysis: the trace format, the generator, and the Spark jobs.

The Spark tests share one local SparkSession (local[2], no UI, 2 shuffle
partitions), created the first time a test needs it and kept for the whole
run, and one run of the whole pipeline over a small hand-made federation
trace whose answers are worked out by hand below. They are skipped, with
the reason, when pyspark or Java is missing.
"""

import contextlib
import io
import json
import csv
import gzip
import os
import shutil
import subprocess
import sys
import tempfile

from twisted.trial import unittest

from elvin.values import Int64
from spark_analysis import synth
from spark_analysis import traceformat as tf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCHEMA_PATH = os.path.join(ROOT, "elvin", "federation", "trace_schema.json")

T0 = 1714564800 * 10**6            # 2024-05-01T12:00:00Z


def T(seconds, us=0):
    return T0 + int(seconds * 10**6) + us


# ---------------------------------------------------------------------------
# shared Spark session and pipeline run (module-level cache, lazy)

_spark = {"session": None, "skip": None}
_runs = {}


def spark_session():
    """The shared local session; raises SkipTest if Spark cannot run here."""
    if _spark["session"] is None and _spark["skip"] is None:
        from spark_analysis.session import local_test_session, pyspark_available
        reason = pyspark_available()
        if reason is None:
            try:
                _spark["session"] = local_test_session()
            except Exception as e:  # no JVM, port trouble, ...
                reason = f"cannot start a local Spark session: {e}"
        _spark["skip"] = reason
    if _spark["session"] is None:
        raise unittest.SkipTest(_spark["skip"])
    return _spark["session"]


def _tempdir(name):
    path = tempfile.mkdtemp(prefix=f"elvin-spark-{name}-")
    return path


# ---------------------------------------------------------------------------
# the hand-made federation: a - b - c (a dials b, c dials b)

N1 = {"Group": "chat", "n": 1}
N2 = {"Group": "chat", "n": 2}
N3 = {"Symbol": "ACME", "Price": 1.5}
HB = {"Heartbeat": 1}
N4 = {"Loop": Int64(1)}
N5 = {"Group": "chat", "n": 5}
N6 = {"Group": "chat", "n": 6}


def base_size(attrs):
    return 16 + len(tf.canonical_attributes(attrs))


def size(attrs, routing):
    return base_size(attrs) + sum(tf.routing_entry_size(d) for d in routing)


def recorder(out):
    """(rec, note): functions adding (ts, line) records to ``out[router]``,
    any record and a notify record (its size and digest from the attributes)."""
    def rec(router, ts, peer, event, direction, **kw):
        out[router].append((ts, tf.format_record(ts, router, peer, event, direction, **kw)))

    def note(router, ts, peer, event, direction, attrs, routing):
        rec(router, ts, peer, event, direction, routing=routing, size=size(attrs, routing),
            attrs=list(attrs), digest=tf.notification_digest(attrs))
    return rec, note


def handmade_records():
    """{router: [line]} of the scenario; the answers are in HandmadeTests."""
    out = {"a": [], "b": [], "c": []}
    rec, note = recorder(out)

    rec("a", T(0), "b", "link_up", "out")
    rec("b", T(0), "a", "link_up", "in")
    rec("c", T(0), "b", "link_up", "out")
    rec("b", T(0), "c", "link_up", "in")
    rec("b", T(0.1), "a", "subreplace_sent", "out", filter_nodes=3, filter_bytes=52)
    rec("a", T(0.1, 1000), "b", "subreplace_received", "in", filter_nodes=3, filter_bytes=52)
    rec("c", T(0.2), "b", "subreplace_sent", "out", filter_nodes=5, filter_bytes=80)
    rec("b", T(0.2, 2000), "c", "subreplace_received", "in", filter_nodes=5, filter_bytes=80)
    rec("b", T(120), "a", "subreplace_sent", "out", filter_nodes=7, filter_bytes=120)
    rec("a", T(120, 1000), "b", "subreplace_received", "in", filter_nodes=7, filter_bytes=120)
    # n1: a -> b -> c
    note("a", T(10), "b", "notify_forwarded", "out", N1, ["a"])
    note("b", T(10, 1000), "a", "notify_received", "in", N1, ["a"])
    note("b", T(10, 1100), "c", "notify_forwarded", "out", N1, ["a", "b"])
    note("c", T(10, 3100), "b", "notify_received", "in", N1, ["a", "b"])
    # n2: b does not want it
    note("a", T(20), "b", "notify_suppressed_filter", "out", N2, ["a"])
    # n3: c -> b, b's export filter keeps it from a
    note("c", T(30), "b", "notify_forwarded", "out", N3, ["c"])
    note("b", T(30, 2000), "c", "notify_received", "in", N3, ["c"])
    note("b", T(30, 2010), "a", "notify_suppressed_export", "out", N3, ["c", "b"])
    # the same heartbeat twice, 10 s apart: a -> b, c does not want it
    for s in (40, 50):
        note("a", T(s), "b", "notify_forwarded", "out", HB, ["a"])
        note("b", T(s, 1000), "a", "notify_received", "in", HB, ["a"])
        note("b", T(s, 1010), "c", "notify_suppressed_filter", "out", HB, ["a", "b"])
    # n4: a broken b sends back to a; a drops the loop
    note("b", T(60), "a", "notify_forwarded", "out", N4, ["a", "b"])
    note("a", T(60, 1500), "b", "notify_dropped_loop", "in", N4, ["a", "b"])
    # n5: published at b; to a; c's queue is full
    note("b", T(70), "a", "notify_forwarded", "out", N5, ["b"])
    note("b", T(70, 5), "c", "notify_dropped_overload", "out", N5, ["b"])
    note("a", T(70, 1500), "b", "notify_received", "in", N5, ["b"])
    # b - c down from 300 s to 360 s
    rec("b", T(300), "c", "link_down", "in", reason="liveness")
    rec("c", T(300, 500), "b", "link_down", "out", reason="connection lost")
    rec("c", T(360), "b", "link_up", "out")
    rec("b", T(360), "c", "link_up", "in")
    # n6: a -> b while b - c is down (no record for c)
    note("a", T(330), "b", "notify_forwarded", "out", N6, ["a"])
    note("b", T(330, 1000), "a", "notify_received", "in", N6, ["a"])
    return {router: [line for _, line in sorted(lines)] for router, lines in out.items()}


C_FILE = os.path.join("hosts", "c", "c-20240501T120000Z-000001.jsonl")


def write_handmade(directory):
    """Write the scenario; c's file (in a sub-directory) has two bad lines, 2 and 5."""
    records = handmade_records()
    for router in ("a", "b"):
        with open(os.path.join(directory, f"{router}-20240501T120000Z-000001.jsonl"), "w") as f:
            f.write("\n".join(records[router]) + "\n")
    lines = list(records["c"])
    lines.insert(1, "this is not json")
    lines.insert(4, json.dumps({"v": 1, "ts_us": T(5), "router": "c", "peer": "b",
                                "event": "bogus", "direction": "in"}))
    os.makedirs(os.path.join(directory, "hosts", "c"))
    with open(os.path.join(directory, C_FILE), "w") as f:
        f.write("\n".join(lines) + "\n\n")        # a trailing blank line is ignored
    with open(os.path.join(directory, "README.txt"), "w") as f:
        f.write("not a trace file\n")
    # A truncated .gz (one bad file never sinks a run) and an empty file.
    import gzip
    whole = gzip.compress(("\n".join(lines) + "\n").encode() * 50)
    with open(os.path.join(directory, "hosts", "c", "cut.jsonl.gz"), "wb") as f:
        f.write(whole[:len(whole) // 2])
    open(os.path.join(directory, "hosts", "c", "empty.jsonl"), "w").close()


def handmade_analysis():
    """Run the whole pipeline once over the hand-made traces (cached)."""
    if "handmade" not in _runs:
        spark = spark_session()
        from spark_analysis import pipeline
        traces = _tempdir("traces")
        write_handmade(traces)
        out = _tempdir("report")
        _runs["handmade"] = (traces, pipeline.run(spark, traces, out, T(0), T(600),
                                                  progress=None))
    return _runs["handmade"]


def by_key(rows, *keys):
    return {tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]: row for row in rows}


# ---------------------------------------------------------------------------
# format (no Spark)

class DigestTests(unittest.SynchronousTestCase):

    def test_vectors(self):
        """The digests docs/traces.md gives as test vectors."""
        self.assertEqual(tf.notification_digest({}), "9069ca78e7450a285173431b3e52c5c25299e473")
        self.assertEqual(tf.notification_digest({"Group": "chat", "n": 7}),
                         "c597f3b23a4564404c253d86bd3952930a0c0a82")
        self.assertEqual(tf.notification_digest(
            {"Group": "chat", "From": "alice", "Message": "hi", "Count": Int64(3),
             "Price": 1.5, "Blob": b"\x00\x01", "n": 7}),
            "34c28bf246c1b4c055b19704359d95f534cf4c5c")
        self.assertEqual(tf.canonical_attributes({"Group": "chat", "n": 7}).hex(),
                         "00000002" "00000005" "47726f7570000000" "00000004" "00000004"
                         "63686174" "00000001" "6e000000" "00000001" "00000007")

    def test_order_and_type(self):
        """Attribute order does not matter; the value's wire type does."""
        self.assertEqual(tf.notification_digest({"b": 1, "a": "x"}),
                         tf.notification_digest({"a": "x", "b": 1}))
        self.assertNotEqual(tf.notification_digest({"a": 5}), tf.notification_digest({"a": Int64(5)}))
        self.assertNotEqual(tf.notification_digest({"a": 5}), tf.notification_digest({"a": 5.0}))
        self.assertNotEqual(tf.notification_digest({"a": "x"}), tf.notification_digest({"a": b"x"}))

    def test_sort_is_by_utf8_bytes(self):
        """Names sort by UTF-8 bytes: 'Z' < 'a' < 'é'."""
        canonical = tf.canonical_attributes({"\u00e9": 1, "a": 1, "Z": 1})
        self.assertLess(canonical.index(b"Z"), canonical.index(b"a"))
        self.assertLess(canonical.index(b"a"), canonical.index("\u00e9".encode()))

    def test_routing_entry_size(self):
        self.assertEqual(tf.routing_entry_size("a"), 8)
        self.assertEqual(tf.routing_entry_size("abcd"), 8)
        self.assertEqual(tf.routing_entry_size("abcde"), 12)
        self.assertEqual(tf.routing_entry_size("\u00e9"), 8)


class FileNameTests(unittest.SynchronousTestCase):

    def test_round_trip(self):
        name = tf.trace_file_name("hub.example.org", T(3723, 999), 7)
        self.assertEqual(name, "hub.example.org-20240501T130203Z-000007.jsonl")
        self.assertEqual(tf.parse_trace_file_name(name), ("hub.example.org", T(3723), 7))
        self.assertEqual(tf.parse_trace_file_name(name + ".gz"), ("hub.example.org", T(3723), 7))
        self.assertIsNone(tf.parse_trace_file_name("notes.jsonl"))

    def test_unsafe_characters(self):
        name = tf.trace_file_name("r\u00fc/x y", T0, 1, gzip=True)
        self.assertEqual(name, "r%C3%BC%2Fx%20y-20240501T120000Z-000001.jsonl.gz")
        self.assertEqual(tf.parse_trace_file_name(name)[0], "r\u00fc/x y")

    def test_prune_by_name(self):
        from spark_analysis.ingest import prune_by_name
        files = [(f"/t/{tf.trace_file_name('a', T(h * 3600), h + 1)}", 1) for h in range(4)]
        files.append(("/t/other.jsonl", 1))
        kept = [p for p, _ in prune_by_name(files, T(2 * 3600 + 600), T(2 * 3600 + 700))]
        self.assertEqual(kept, ["/t/a-20240501T140000Z-000003.jsonl", "/t/other.jsonl"])
        self.assertEqual(len(prune_by_name(files)), 5)
        # files ending (or starting) within 5 minutes of the range are kept: clocks step
        kept = [p for p, _ in prune_by_name(files, T(2 * 3600 + 10), T(3 * 3600 - 10))]
        self.assertEqual(len(kept), 4)


class TimeTests(unittest.SynchronousTestCase):

    def test_parse_time(self):
        self.assertEqual(tf.parse_time("2024-05-01T12:00:00Z"), T0)
        self.assertEqual(tf.parse_time("2024-05-01 12:00"), T0)
        self.assertEqual(tf.parse_time("2024-05-01T14:00:00+02:00"), T0)
        self.assertEqual(tf.parse_time("1714564800.5"), T0 + 500000)
        self.assertEqual(tf.format_time(T0), "2024-05-01T12:00:00Z")
        self.assertRaises(ValueError, tf.parse_time, "yesterday")


GOOD = [
    {"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "link_up", "direction": "out"},
    {"v": 1, "ts_us": T0, "router": "a", "peer": None, "event": "link_down", "direction": "out",
     "reason": "connect_failed"},
    {"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "subreplace_sent",
     "direction": "out", "filter_nodes": 0, "filter_bytes": 4},
    {"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "notify_dropped_overload",
     "direction": "in", "routing": ["b"], "size": 60, "attrs": ["A", "b"], "digest": "0" * 40},
    {"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "link_up", "direction": "in",
     "future_field": [1, 2]},
    {"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "link_down", "direction": "out",
     "reason": "liveness", "unsent": 3},
]
BAD = [
    ({"v": 2, "ts_us": T0, "router": "a", "peer": "b", "event": "link_up", "direction": "out"},
     "unsupported format version"),
    ({"v": 1, "ts_us": T0 // 10**6, "router": "a", "peer": "b", "event": "link_up",
      "direction": "out"}, "ts_us out of range"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "link_sideways",
      "direction": "out"}, "unknown event"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "notify_forwarded",
      "direction": "in", "routing": ["a"], "size": 1, "attrs": [], "digest": "0" * 40},
     "direction 'in' not allowed"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": None, "event": "link_up", "direction": "out"},
     "'peer' may be null only"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "link_down", "direction": "out"},
     "missing field 'reason'"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "notify_received",
      "direction": "in", "routing": [], "size": 1, "attrs": [], "digest": "0" * 40},
     "'routing' must not be empty"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "notify_received",
      "direction": "in", "routing": ["b"], "size": 1, "attrs": [], "digest": "0" * 39},
     "'digest' must be"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "subreplace_received",
      "direction": "in", "filter_nodes": 1}, "missing field 'filter_bytes'"),
    ({"v": 1, "ts_us": str(T0), "router": "a", "peer": "b", "event": "link_up",
      "direction": "out"}, "wrong type"),
    ({"v": 1, "ts_us": T0, "router": "a", "event": "link_up", "direction": "out"},
     "missing field 'peer'"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "link_down", "direction": "out",
      "reason": "liveness", "unsent": 0}, "'unsent' must be at least 1"),
    ({"v": 1, "ts_us": T0, "router": "a", "peer": "b", "event": "link_down", "direction": "out",
      "reason": "liveness", "unsent": "2"}, "field 'unsent' has the wrong type"),
]


class ListingTests(unittest.SynchronousTestCase):
    """A file gone while the directory is listed (gzip rotation) or a
    dangling *.jsonl symbolic link is skipped with a warning, not a crash."""

    def test_vanished_and_dangling_files_are_skipped(self):
        from spark_analysis import ingest
        directory = _tempdir("listing")
        self.addCleanup(shutil.rmtree, directory, True)
        good = os.path.join(directory, "a.test-20240501T120000Z-000001.jsonl")
        with open(good, "w") as f:
            f.write("{}\n")
        os.symlink(os.path.join(directory, "nowhere"),
                   os.path.join(directory, "a.test-20240501T130000Z-000002.jsonl"))
        said = []
        files = ingest.list_trace_files(directory, warn=said.append)
        self.assertEqual(files, [(good, 3)])
        (line,) = said
        self.assertIn("000002.jsonl: a symbolic link to nothing; skipped", line)


class RecordTests(unittest.SynchronousTestCase):

    def test_format_record(self):
        line = tf.format_record(T0, "a", "b", "notify_forwarded", "out", routing=["a"],
                                size=68, attrs=["n", "Group"],
                                digest=tf.notification_digest({"Group": "chat", "n": 7}))
        obj = json.loads(line)
        self.assertEqual(obj["attrs"], ["Group", "n"])
        self.assertNotIn("reason", obj)
        self.assertIsNone(tf.check_record(obj))
        self.assertNotIn("\n", line)

    def test_good_and_bad(self):
        for obj in GOOD:
            self.assertIsNone(tf.check_record(obj), obj)
        for obj, reason in BAD:
            self.assertIn(reason, tf.check_record(obj) or "", obj)
        self.assertIn("not JSON", tf.check_line("{nope"))
        self.assertEqual(tf.check_line("[1]"), "not a JSON object")
        self.assertIsNone(tf.check_line("   \n"))

    def test_schema_agrees(self):
        """trace_schema.json accepts and rejects the same records."""
        try:
            import jsonschema
        except ImportError:
            raise unittest.SkipTest("jsonschema is not installed")
        with open(SCHEMA_PATH) as f:
            schema = json.load(f)
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema)
        for obj in GOOD:
            self.assertEqual(list(validator.iter_errors(obj)), [], obj)
        for obj, _ in BAD:
            self.assertNotEqual(list(validator.iter_errors(obj)), [], obj)
        for lines in handmade_records().values():
            for line in lines:
                self.assertEqual(list(validator.iter_errors(json.loads(line))), [], line)
        self.assertEqual(set(schema["properties"]["event"]["enum"]), set(tf.EVENTS))

    def test_doc_examples(self):
        """The example lines in docs/traces.md are valid records."""
        with open(os.path.join(ROOT, "docs", "traces.md"), encoding="utf-8") as f:
            examples = [line for line in f if line.startswith('{"v":')]
        self.assertGreaterEqual(len(examples), 6)
        for line in examples:
            self.assertIsNone(tf.check_line(line), line)
        forwarded = json.loads(examples[2])
        self.assertEqual(forwarded["size"], size({"Group": "chat", "n": 7}, ["a"]))

    def test_check_file(self):
        directory = _tempdir("check")
        self.addCleanup(shutil.rmtree, directory, True)
        write_handmade(directory)
        bad = tf.check_file(os.path.join(directory, C_FILE))
        self.assertEqual([n for n, _ in bad], [2, 5])
        self.assertIn("unknown event", bad[1][1])
        self.assertEqual(tf.check_file(os.path.join(directory, "a-20240501T120000Z-000001.jsonl")), [])


class SynthTests(unittest.SynchronousTestCase):
    """The generator writes valid, self-consistent traces."""

    def setUp(self):
        self.out = _tempdir("synth")
        self.addCleanup(shutil.rmtree, self.out, True)

    def load(self):
        records = []
        for name in sorted(os.listdir(self.out)):
            if tf.is_trace_file(name):
                path = os.path.join(self.out, name)
                self.assertEqual(tf.check_file(path), [], name)
                with open(path) as f:
                    records.extend(json.loads(line) for line in f)
        return records

    def test_consistent(self):
        stats = synth.generate(self.out, routers=5, clients=15, rate=40, seconds=70, seed=3,
                               rotate_bytes=200_000)
        records = self.load()
        self.assertEqual(len(records), stats["records"])
        self.assertGreater(stats["files"], 5)                  # rotated by size
        events = {r["event"] for r in records}
        for event in ("link_up", "link_down", "subreplace_sent", "subreplace_received",
                      "notify_forwarded", "notify_received", "notify_suppressed_filter",
                      "notify_dropped_overload"):
            self.assertIn(event, events)
        sent, received = {}, {}
        for r in records:
            if r["event"] not in tf.NOTIFY_EVENTS:
                continue
            if r["direction"] == "out":
                self.assertEqual(r["routing"][-1], r["router"])
            else:
                self.assertEqual(r["routing"][-1], r["peer"])
            # size = base + routing entries, so base is the same on every hop
            base = r["size"] - sum(tf.routing_entry_size(d) for d in r["routing"])
            key = (r["digest"], tuple(r["routing"]))
            if r["event"] == "notify_forwarded":
                sent[key + (r["router"], r["peer"])] = sent.get(key + (r["router"], r["peer"]), 0) + 1
            elif r["direction"] == "in":
                received[key + (r["peer"], r["router"])] = \
                    received.get(key + (r["peer"], r["router"]), 0) + 1
            self.assertGreater(base, 16)
        # every FedNotify sent was received, with the same digest and routing list
        self.assertEqual(sent, received)
        # routing lists grow by one domain per hop
        self.assertTrue(any(len(key[1]) >= 3 for key in sent))

    def test_loops_and_export(self):
        stats = synth.generate(self.out, routers=4, clients=12, rate=30, seconds=20, seed=5,
                               extra_links=1, flap=False, burst=False)
        self.assertGreater(stats["events"].get("notify_dropped_loop", 0), 0)
        for r in self.load():
            if r["event"] == "notify_dropped_loop":
                self.assertIn(r["router"], r["routing"])

    def test_deterministic(self):
        a = synth.generate(os.path.join(self.out, "1"), routers=3, clients=6, rate=20,
                           seconds=5, seed=9)
        b = synth.generate(os.path.join(self.out, "2"), routers=3, clients=6, rate=20,
                           seconds=5, seed=9)
        self.assertEqual(a, b)

    def test_command_line(self):
        with contextlib.redirect_stdout(io.StringIO()) as stdout:
            self.assertEqual(synth.main(["--out", self.out, "--routers", "3", "--clients", "5",
                                         "--rate", "10", "--seconds", "3", "--gzip"]), 0)
        self.assertIn("records", stdout.getvalue())
        self.assertTrue(any(n.endswith(".jsonl.gz") for n in os.listdir(self.out)))
        self.assertTrue(os.path.exists(os.path.join(self.out, "topology.json")))


class FloodModelTests(unittest.SynchronousTestCase):

    def test_chain(self):
        from spark_analysis.jobs import flood_model
        rows = flood_model([("a", "b"), ("b", "a"), ("c", "b")], ["a", "b", "c"])
        self.assertEqual(sorted(r for r in rows if r[0] == "a"),
                         [("a", "b", "a", "b", 0), ("a", "b", "b", "c", 8)])
        self.assertEqual(sorted(r for r in rows if r[0] == "b"),
                         [("b", "a", "b", "a", 0), ("b", "c", "b", "c", 0)])

    def test_cycle_uses_a_tree(self):
        from spark_analysis.jobs import flood_model
        rows = flood_model([("a", "b"), ("b", "c"), ("c", "a")], ["a"])
        self.assertEqual(len(rows), 2)                         # n - 1 links per origin


def run_cli(*argv):
    """(exit status, standard error) of ``python -m spark_analysis ARGV``, in-process."""
    from spark_analysis.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as e:
            status = e.code
    return status, err.getvalue()


class CommandLineTests(unittest.SynchronousTestCase):
    """Errors the command line reports before starting Spark."""

    def run_main(self, *argv):
        return run_cli(*argv)

    def test_missing_directory(self):
        status, err = self.run_main("/nonexistent/traces", "--out", "/tmp/x")
        self.assertEqual(status, 1)
        self.assertIn("/nonexistent/traces does not exist", err)

    def test_empty_directory(self):
        directory = _tempdir("empty")
        self.addCleanup(shutil.rmtree, directory, True)
        with open(os.path.join(directory, "notes.txt"), "w") as f:
            f.write("x")
        status, err = self.run_main(directory, "--out", os.path.join(directory, "out"))
        self.assertEqual(status, 1)
        self.assertIn("no trace files (*.jsonl, *.jsonl.gz) under", err)

    def test_out_that_cannot_be_made_is_one_line(self):
        from spark_analysis.session import pyspark_available
        if pyspark_available():
            raise unittest.SkipTest(pyspark_available())
        directory = _tempdir("badout")
        self.addCleanup(shutil.rmtree, directory, True)
        with open(os.path.join(directory, "a.jsonl"), "w") as f:
            f.write("\n")
        blocker = os.path.join(directory, "file")
        with open(blocker, "w") as f:
            f.write("x")
        status, err = self.run_main(directory, "--out", os.path.join(blocker, "out"))
        self.assertEqual(status, 1)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("--out", err)
        self.assertNotIn("Traceback", err)

    def test_bad_arguments(self):
        status, err = self.run_main("/tmp", "--out", "/tmp/x", "--since", "whenever")
        self.assertEqual(status, 2)
        self.assertIn("cannot read 'whenever' as a time", err)
        status, err = self.run_main("/tmp", "--out", "/tmp/x", "--since", "2024-05-02",
                                    "--until", "2024-05-01")
        self.assertEqual(status, 2)


# ---------------------------------------------------------------------------
# Spark

class HandmadeTests(unittest.SynchronousTestCase):
    """The whole pipeline over the hand-made traces: answers worked out by hand."""

    timeout = 600

    def setUp(self):
        self.traces, self.analysis = handmade_analysis()
        self.t = self.analysis.tables

    def test_ingest(self):
        a = self.analysis
        # README.txt is not read; the truncated .gz is skipped and named.
        self.assertEqual(len(a.files), 4)
        self.assertEqual([(os.path.basename(p), "gzip" in r) for p, r in a.unreadable],
                         [("cut.jsonl.gz", True)])
        with open(os.path.join(a.out_dir, "csv", "files.csv")) as f:
            rows = {os.path.basename(row["file"]): row for row in csv.DictReader(f)}
        self.assertEqual(rows["empty.jsonl"]["records"], "0")      # listed though empty
        self.assertIn("gzip", rows["cut.jsonl.gz"]["skipped"])
        with open(os.path.join(a.out_dir, "report.html"), encoding="utf-8") as f:
            self.assertIn("cut.jsonl.gz", f.read())
        self.assertEqual(a.bad_lines, 2)
        self.assertEqual(a.records, sum(len(v) for v in handmade_records().values()))
        self.assertEqual([(os.path.basename(f), n) for f, n, _, _ in a.bad_examples],
                         [(os.path.basename(C_FILE), 2), (os.path.basename(C_FILE), 5)])
        self.assertIn("unknown event 'bogus'", a.bad_examples[1][2])
        self.assertEqual((a.start_us, a.end_us), (T(0), T(600)))
        with open(os.path.join(a.out_dir, "csv", "bad_lines.csv")) as f:
            self.assertEqual(len(f.read().strip().splitlines()), 3)

    def test_window_from_per_minute_counts(self):
        """The window's span and size read from the per-minute counts (as the
        pipeline does) equal those read from the table itself."""
        from spark_analysis import jobs
        from spark_analysis.store import TraceStore
        events = TraceStore(spark_session(), self.analysis.tables_dir).events(T(0), T(600))
        alone = jobs.window_of(events, count=True)
        self.assertEqual(alone[2], self.analysis.records)
        self.assertEqual(jobs.window_of(events, count=True, per_minute=jobs.activity(events)),
                         alone)

    def test_attribute_sets_sort_no_records(self):
        """The attribute sets' names come from a hash aggregation: no
        sort-based aggregation over the records (the optimiser once merged
        a deduplication into one, a sort of every notify record)."""
        from spark_analysis import jobs
        from spark_analysis.store import TraceStore
        events = TraceStore(spark_session(), self.analysis.tables_dir).events(T(0), T(600))
        plan = jobs.interest(events, T(0), T(600))["attr_sets"]._jdf.queryExecution() \
            .executedPlan().toString()
        self.assertNotIn("SortAggregate", plan)

    def test_attribute_names_read_at_first_times(self):
        """The sets' names are read only at each set's first time (the
        time's statistics skip the rest), and are those every record
        gives, as they are past NAMES_BY_FIRST_TIME sets."""
        from spark_analysis import jobs
        from spark_analysis.store import TraceStore
        events = TraceStore(spark_session(), self.analysis.tables_dir).events(T(0), T(600))

        def names():
            df = jobs.interest(events, T(0), T(600))["attr_sets"]
            plan = df._jdf.queryExecution().executedPlan().toString()
            return sorted((r["attribute_names"], r["attributes"]) for r in df.collect()), plan
        import re
        at_first = re.compile(r"ts_us#\d+L IN \(")
        first, plan = names()
        self.assertTrue(at_first.search(plan), plan)
        self.patch(jobs, "NAMES_BY_FIRST_TIME", 0)
        every, plan = names()
        self.assertFalse(at_first.search(plan), plan)
        self.assertEqual(first, every)
        self.assertEqual([n for n, _ in first], ["Group,n", "Heartbeat", "Loop", "Price,Symbol"])

    def test_links(self):
        links = by_key(self.t["links"], "router", "peer", "direction")
        ab = links[("a", "b", "out")]
        self.assertEqual(ab["notifications"], 4)
        self.assertEqual(ab["bytes"], sum(size(n, ["a"]) for n in (N1, HB, HB, N6)))
        self.assertEqual(ab["peak_per_min"], 3)                # n1, two heartbeats
        self.assertEqual(ab["peak_per_s"], 1)
        self.assertAlmostEqual(ab["mean_per_min"], 0.4)        # 4 in 10 minutes
        self.assertEqual(links[("b", "a", "in")]["notifications"], 4)
        # in: the loop drop crossed the wire too
        self.assertEqual(links[("a", "b", "in")]["notifications"], 2)
        bc = links[("b", "c", "out")]
        self.assertEqual(bc["notifications"], 1)
        self.assertAlmostEqual(bc["mean_per_min"], 1 / 9, places=3)   # up 540 s
        uptime = by_key(self.t["link_uptime"], "router", "peer")
        self.assertAlmostEqual(uptime[("b", "c")]["uptime_s"], 540)
        self.assertEqual(uptime[("b", "c")]["uptime_pct"], 90)
        self.assertEqual(uptime[("b", "c")]["downs"], 1)
        self.assertEqual(uptime[("b", "c")]["last_down_reason"], "liveness")
        self.assertAlmostEqual(uptime[("c", "b")]["uptime_s"], 540.0005)
        self.assertEqual(uptime[("a", "b")]["uptime_pct"], 100)

    def test_filter_effect(self):
        effect = by_key(self.t["filter_effect"], "router", "peer")
        self.assertEqual(
            {k: tuple(v[c] for c in ("considered", "forwarded", "suppressed_filter",
                                     "suppressed_export", "dropped_overload"))
             for k, v in effect.items()},
            {("a", "b"): (5, 4, 1, 0, 0), ("b", "a"): (3, 2, 0, 1, 0),
             ("b", "c"): (4, 1, 2, 0, 1), ("c", "b"): (1, 1, 0, 0, 0)})
        self.assertEqual(effect[("b", "a")]["suppressed_export_bytes"], size(N3, ["c", "b"]))

    def test_flood(self):
        flood = by_key(self.t["flood"], "router", "peer")
        self.assertEqual({k: (v["flood_notifications"], v["forwarded"]) for k, v in flood.items()},
                         {("a", "b"): (5, 4), ("b", "c"): (6, 1), ("b", "a"): (2, 2),
                          ("c", "b"): (1, 1)})
        from_a = [N1, N2, HB, HB, N6]
        self.assertEqual(flood[("a", "b")]["flood_bytes"], sum(size(n, ["a"]) for n in from_a))
        self.assertEqual(flood[("b", "c")]["flood_bytes"],
                         sum(size(n, ["a", "b"]) for n in from_a) + size(N5, ["b"]))
        self.assertEqual(flood[("b", "a")]["flood_bytes"], size(N5, ["b"]) + size(N3, ["c", "b"]))
        self.assertEqual(flood[("a", "b")]["saved_bytes"], size(N2, ["a"]))

    def test_drops(self):
        drops = by_key(self.t["drops"], "router", "peer", "direction", "event")
        self.assertEqual({k: v["drops"] for k, v in drops.items()},
                         {("a", "b", "in", "notify_dropped_loop"): 1,
                          ("b", "c", "out", "notify_dropped_overload"): 1})
        # a's loop drop has a in its routing list: a loop
        self.assertEqual(drops[("a", "b", "in", "notify_dropped_loop")]["router_listed"], 1)
        self.assertIsNone(drops[("b", "c", "out", "notify_dropped_overload")]["router_listed"])
        # drawn at the second they happened
        self.assertEqual(self.analysis.series["fine_us"], 10**6)
        self.assertEqual({(r["event"], r["t_us"]) for r in self.analysis.series["drops"]},
                         {("notify_dropped_loop", T(60)), ("notify_dropped_overload", T(70))})

    def test_paths(self):
        hops = by_key(self.t["hops"], "hops")
        self.assertEqual({h: r["deliveries"] for h, r in hops.items()}, {1: 6, 2: 1})
        self.assertEqual(hops[1]["notifications"], 5)          # n1, n3, heartbeat, n5, n6
        routes = by_key(self.t["routes"], "route")
        self.assertEqual({r: v["deliveries"] for r, v in routes.items()},
                         {"a > b": 4, "a > b > c": 1, "c > b": 1, "b > a": 1})
        self.assertEqual(routes["a > b > c"]["hops"], 2)
        self.assertEqual(routes["a > b > c"]["destination"], "c")
        # the heartbeat recurs: each delivery is matched to its own publication
        for p in ("latency_p50_us", "latency_p99_us", "latency_max_us"):
            self.assertEqual(routes["a > b"][p], 1000)
        self.assertEqual(routes["a > b > c"]["latency_p50_us"], 3100)
        self.assertEqual(routes["c > b"]["latency_p50_us"], 2000)
        self.assertEqual(routes["b > a"]["latency_p50_us"], 1500)
        self.assertEqual(self.t["routes"][0]["route"], "a > b")

    def test_hop_latency(self):
        hop = by_key(self.t["hop_latency"], "sender", "receiver")
        self.assertEqual(hop[("a", "b")]["matched"], 4)
        self.assertEqual(hop[("a", "b")]["delay_p50_us"], 1000)
        self.assertEqual(hop[("b", "a")]["matched"], 2)        # n4 (loop drop) and n5
        self.assertEqual(hop[("b", "a")]["delay_p50_us"], 1500)
        # b's clock minus a's lies in [-1500, 1000] (the fastest crossing
        # each way): it cannot be told from zero, so no estimate is stated
        ab = hop[("a", "b")]
        self.assertEqual((ab["clock_offset_low_us"], ab["clock_offset_high_us"],
                          ab["clock_offset_pm_us"], ab["clock_offset_est_us"]),
                         (-1500, 1000, 1250, None))
        self.assertEqual(ab["one_way_est_us"], 1250)
        self.assertEqual(hop[("b", "c")]["delay_p50_us"], 2000)
        self.assertIsNone(hop[("c", "b")]["clock_offset_est_us"])
        # routes are corrected by offsets that could be told (none here),
        # within the bounds' half-widths; one-way links cannot be bounded
        routes = by_key(self.t["routes"], "route")
        self.assertEqual((routes["a > b"]["clock_correction_us"],
                          routes["a > b"]["clock_uncertainty_us"]), (0, 1250))
        self.assertEqual(routes["a > b > c"]["clock_uncertainty_us"], 1250 + 2000)

    def test_interest(self):
        sets = by_key(self.t["attr_sets"], "attribute_names")
        # published: n1 n2 n6 at a, n5 at b; the heartbeat twice; n4 has no origin record
        self.assertEqual({k: (v["published"], v["distinct"], v["crossings"])
                          for k, v in sets.items()},
                         {"Group,n": (4, 4, 4), "Heartbeat": (2, 1, 2),
                          "Price,Symbol": (1, 1, 1), "Loop": (0, 1, 1)})
        self.assertEqual(self.t["attr_sets"][0]["attribute_names"], "Group,n")
        churn = by_key(self.t["filter_churn"], "router", "peer", "direction")
        self.assertEqual({k: (v["replaces"], v["nodes_last"], v["nodes_min"]) for k, v in churn.items()},
                         {("b", "a", "out"): (2, 7, 3), ("a", "b", "in"): (2, 7, 3),
                          ("c", "b", "out"): (1, 5, 5), ("b", "c", "in"): (1, 5, 5)})
        self.assertEqual(churn[("b", "a", "out")]["bytes_last"], 120)
        # a rate per hour is not extrapolated from ten minutes
        self.assertIsNone(churn[("b", "a", "out")]["replaces_per_hour"])
        # of b's two filters for a, the first came with the link
        self.assertEqual(churn[("b", "a", "out")]["on_link_up"], 1)
        self.assertEqual(churn[("c", "b", "out")]["on_link_up"], 1)

    def test_outages(self):
        """Issue 22, item 5: when each link went down and came back."""
        rows = {(r["router"], r["peer"]): r for r in self.t["link_outages"]}
        self.assertEqual(set(rows), {("b", "c"), ("c", "b")})
        bc = rows[("b", "c")]
        self.assertEqual((bc["down_us"], bc["up_us"], bc["seconds"], bc["reason"]),
                         (T(300), T(360), 60.0, "liveness"))
        self.assertEqual(rows[("c", "b")]["reason"], "connection lost")
        with open(os.path.join(self.analysis.out_dir, "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertIn("Links went down 2 time(s)", page)
        self.assertIn("2024-05-01T12:05:00Z", page)

    def test_outputs(self):
        out = self.analysis.out_dir
        for table in ("events", "link_minute", "links", "link_uptime", "filter_effect", "flood",
                      "drops_minute", "drops", "hops", "routes", "hop_latency", "attr_sets",
                      "filter_changes", "filter_churn", "overview"):
            self.assertTrue(os.path.isdir(os.path.join(out, "parquet", table)), table)
        self.assertTrue(os.path.isdir(os.path.join(out, "parquet", "events", "status=bad")))
        for name in ("links", "flood", "routes", "hop_latency", "files", "bad_lines"):
            self.assertTrue(os.path.exists(os.path.join(out, "csv", name + ".csv")), name)
        with open(os.path.join(out, "csv", "links.csv")) as f:
            self.assertTrue(f.readline().startswith("router,peer,direction,notifications,bytes"))
        charts = sorted(os.listdir(os.path.join(out, "charts")))
        self.assertEqual(charts, sorted(["topology.png", "link_traffic.png", "filter_effect.png",
                                         "flood.png", "drops.png", "hops.png", "routes.png",
                                         "latency.png", "attr_sets.png", "filter_sizes.png"]))
        with open(os.path.join(out, "charts", "hops.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertEqual(page.count("data:image/png;base64,"), 10)   # self-contained
        for text in ("Links: what each link carries", "2 bad trace lines were skipped",
                     "line 5: unknown event", "saving of", "loop drops", 'href="csv/links.csv"'):
            self.assertIn(text, page)

    def test_remote_files_read_as_bytes(self):
        """Files Spark reads for the tasks (the path for hdfs://, s3a://, ...:
        binaryFile's bytes) give the same records and bad lines as files
        the tasks open themselves, named by their URI; an unreadable one
        names itself in the error."""
        from pyspark.sql import functions as F
        from spark_analysis import ingest
        spark = spark_session()
        files = ingest.list_trace_files(self.traces)
        unreadable = {path for path, _ in ingest.unreadable_files(files)}
        good = [(path, size) for path, size in files if path not in unreadable]

        def counts(frame):
            rows = (frame.mapInArrow(ingest._parse_task(False), ingest.events_schema())
                    .groupBy("file", "status").agg(F.count(F.lit(1)).alias("n")).collect())
            return {(ingest.display_path(r["file"]), r["status"]): r["n"] for r in rows}
        remote = counts(ingest._remote_frame(spark, [(ingest._file_uri(p), s) for p, s in good]))
        local = counts(ingest._file_frame(spark, good, None))
        self.assertEqual(remote, local)
        self.assertEqual(sum(n for (_, status), n in local.items() if status == "bad"), 2)
        (cut,) = unreadable
        frame = ingest._remote_frame(spark, [(ingest._file_uri(cut), 0)])
        with self.assertRaises(Exception) as caught:
            counts(frame)
        self.assertIn("unreadable trace file " + ingest._file_uri(cut), str(caught.exception))

    def test_since_until(self):
        """Only records in [since, until) are read; bad lines are still counted."""
        from pyspark.sql import functions as F
        from spark_analysis import ingest
        spark = spark_session()
        files = ingest.list_trace_files(self.traces)
        unreadable = {path for path, _ in ingest.unreadable_files(files)}
        files = [(path, size) for path, size in files if path not in unreadable]
        rows = (ingest.read_traces(spark, files, T(35), T(55))
                .groupBy("status").agg(F.count(F.lit(1)).alias("n")).collect())
        self.assertEqual({r["status"]: r["n"] for r in rows}, {"ok": 6, "bad": 2})


class ClockOffsetTests(unittest.SynchronousTestCase):
    """Issue 22, item 1: an offset is stated only when the data bound it
    away from zero, with its uncertainty, and route latencies are corrected."""

    def test_offset_bounded_away_from_zero(self):
        from spark_analysis import jobs
        spark = spark_session()
        # y's clock is 5 ms behind x's; the network takes 1 ms each way at
        # best, and queues make the medians uneven (2 ms there, 9 ms back)
        cols = ["sender", "receiver", "matched", "delay_p50_us", "delay_min_us"]
        hop = spark.createDataFrame([("x", "y", 10, 2000 - 5000, 1000 - 5000),
                                     ("y", "x", 10, 9000 + 5000, 1000 + 5000),
                                     ("y", "z", 10, 700, 500)], cols)
        rows = {(r["sender"], r["receiver"]): r for r in jobs.clock_offsets(hop).collect()}
        xy = rows[("x", "y")]
        self.assertEqual((xy["clock_offset_low_us"], xy["clock_offset_high_us"]), (-6000, -4000))
        self.assertEqual((xy["clock_offset_est_us"], xy["clock_offset_pm_us"]), (-5000, 1000))
        self.assertEqual(rows[("y", "x")]["clock_offset_est_us"], 5000)
        self.assertIsNone(rows[("y", "z")]["clock_offset_pm_us"])      # one way only
        corrections = jobs.route_clock_corrections(list(rows.values()))
        self.assertEqual(corrections[("x", "y")], (-5000, 1000))
        routes = spark.createDataFrame([("x > y",), ("x > y > z",)], ["route"])
        routes = jobs._with_corrections(
            routes.withColumn("_pairs", jobs._route_pairs(routes["route"])), corrections)
        got = {r["route"]: (r["clock_correction_us"], r["clock_uncertainty_us"])
               for r in routes.collect()}
        self.assertEqual(got, {"x > y": (-5000, 1000), "x > y > z": (None, None)})


class SyntheticReportTests(unittest.SynchronousTestCase):
    """A simulated federation of nine routers with a cycle and clock skew:
    every clock bound holds the generator's true offset, and no chart
    draws a label over another.

    One test makes every check (a failure's traceback names it): the run
    is the expensive part, and under ``trial -j`` the tests of one class
    go to different processes, each of which would run it again."""

    timeout = 600

    def test_synthetic_report(self):
        self.check_clock_bounds_hold_the_truth()
        self.check_flood_with_a_cycle()
        self.check_peak_per_second()
        self.check_no_label_overlaps()

    @classmethod
    def analysis(cls):
        if "synthetic" not in _runs:
            spark = spark_session()
            from spark_analysis import pipeline
            traces = _tempdir("synth9")
            synth.generate(traces, routers=9, clients=30, rate=40, seconds=90, seed=11,
                           extra_links=1)
            out = _tempdir("synth9-report")
            _runs["synthetic"] = (traces, pipeline.run(spark, traces, out, progress=None))
        return _runs["synthetic"]

    def check_clock_bounds_hold_the_truth(self):
        traces, a = self.analysis()
        with open(os.path.join(traces, "topology.json")) as f:
            truth = {r["domain"]: r["clock_offset_us"] for r in json.load(f)["routers"]}
        bounded = [r for r in a.tables["hop_latency"] if r["clock_offset_pm_us"] is not None]
        self.assertTrue(bounded)
        for r in bounded:
            theta = truth[r["receiver"]] - truth[r["sender"]]
            self.assertLessEqual(r["clock_offset_low_us"], theta + 1, r)
            self.assertGreaterEqual(r["clock_offset_high_us"], theta - 1, r)
            if r["clock_offset_est_us"] is not None:
                self.assertLessEqual(abs(r["clock_offset_est_us"] - theta),
                                     r["clock_offset_pm_us"] + 1)

    def check_flood_with_a_cycle(self):
        """Issue 22, item 5: no negative "saving" when a cycle carries traffic."""
        _, a = self.analysis()
        with open(os.path.join(a.out_dir, "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertNotIn("saving of -", page)
        extra = [r for r in a.tables["flood"] if not r["flood_notifications"] and r["forwarded"]]
        if extra:
            self.assertIn("close a cycle", page)
        # a link that carried more than its flood share is explained, not left
        # as an unexplained negative percentage
        over = [r for r in a.tables["flood"]
                if r["forwarded_bytes"] > r["flood_bytes"] > 0]
        if over:
            self.assertIn("is real, not an error", page)

    def check_peak_per_second(self):
        """Each link direction's busiest second, counted here in Python."""
        traces, a = self.analysis()
        per_second = {}
        for root, _, names in os.walk(traces):
            for name in names:
                if not name.endswith((".jsonl", ".jsonl.gz")):
                    continue
                path = os.path.join(root, name)
                opener = gzip.open if name.endswith(".gz") else open
                with opener(path, "rt", encoding="utf-8") as f:
                    for line in f:
                        r = json.loads(line)
                        if _is_wire(r):
                            key = (r["router"], r["peer"], r["direction"], r["ts_us"] // 10**6)
                            per_second[key] = per_second.get(key, 0) + 1
        peaks = {}
        for (router, peer, direction, _), n in per_second.items():
            peaks[(router, peer, direction)] = max(n, peaks.get((router, peer, direction), 0))
        got = {(r["router"], r["peer"], r["direction"]): r["peak_per_s"]
               for r in a.tables["links"]}
        self.assertEqual(got, peaks)
        self.assertGreater(max(peaks.values()), 1)

    def check_no_label_overlaps(self):
        _, a = self.analysis()
        self.assertIn("topology", a.chart_overlaps)
        self.assertEqual({name: pairs for name, pairs in a.chart_overlaps.items() if pairs}, {})


class FilterHealthTests(unittest.SynchronousTestCase):
    """Issue 20: does each filter work, and since when has it not?"""

    def test_stopped_since(self):
        from spark_analysis import jobs
        spark = spark_session()
        m = jobs.MINUTE_US
        rows = []
        for minute in range(30):
            # x -> y stops half of what it sees for ten minutes, then nothing
            rows.append(("x", "y", "out", "notify_forwarded", T0 + minute * m,
                         5 if minute < 10 else 10))
            if minute < 10:
                rows.append(("x", "y", "out", "notify_suppressed_filter", T0 + minute * m, 5))
            # z -> w keeps stopping some to the end
            rows.append(("z", "w", "out", "notify_forwarded", T0 + minute * m, 8))
            rows.append(("z", "w", "out", "notify_suppressed_filter", T0 + minute * m, 2))
        per_minute = spark.createDataFrame(
            rows, ["router", "peer", "direction", "event", "minute_us", "n"])
        got = {(r["router"], r["peer"]): r
               for r in jobs.filter_health(per_minute, T0 + 30 * m).collect()}
        xy = got[("x", "y")]
        self.assertEqual((xy["stopped_since_us"], xy["considered_since"], xy["suppressed_pct"]),
                         (T0 + 10 * m, 200, 16.67))     # 50 of 300 stopped
        self.assertIsNone(got[("z", "w")]["stopped_since_us"])


class ReportChangesTests(unittest.SynchronousTestCase):
    """Issue 20: the report says what changed since the previous one, per hour."""

    def test_changes(self):
        from types import SimpleNamespace
        from spark_analysis import report
        hour = 3600 * 10**6

        def analysis(start, hours, n, drops):
            return SimpleNamespace(
                start_us=start, end_us=start + hours * hour, records=n * 10, bad_lines=0,
                tables={"overview": [{"router": "a.x", "event": "link_up", "records": 1},
                                     {"router": "b.x", "event": "link_up", "records": 1}],
                        "links": [{"router": "a.x", "peer": "b.x", "direction": "out",
                                   "notifications": n, "bytes": n * 100}],
                        "filter_effect": [{"router": "a.x", "peer": "b.x",
                                           "forwarded_pct": 40.0}],
                        "hop_latency": [], "drops": [{"event": "notify_dropped_loop",
                                                      "drops": drops}]},
                previous=None)
        before = analysis(T0, 24, 24_000, 0)
        now = analysis(T0 + 24 * hour, 1, 2_000, 5)
        now.previous = report.summary(before)
        html = report.changes_since(now)
        self.assertIn("+100%", html)           # 1,000 an hour, now 2,000 an hour
        self.assertIn("loop drops: 5.0 an hour (was 0.0, new)", html)
        self.assertIn("a \u2192 b", html)
        self.assertEqual(report.changes_since(before), "")     # no previous report


class ReportWireTests(unittest.SynchronousTestCase):
    """The report's sentences count a link's traffic from whichever end is
    traced (receiver-side in records where the sender is not), and say
    per link traced at both ends how many sends have no receipt."""

    def analysis(self, traced, links):
        from types import SimpleNamespace
        return SimpleNamespace(
            start_us=T0, end_us=T0 + 3600 * 10**6, records=1, bad_lines=0, previous=None,
            tables={"overview": [{"router": r, "event": "link_up", "records": 1}
                                 for r in traced],
                    "links": [{"router": r, "peer": p, "direction": d, "notifications": n,
                               "bytes": n * 100} for r, p, d, n in links]})

    def test_untraced_sender_counted_from_the_receiver(self):
        from types import SimpleNamespace
        from spark_analysis import report
        a = self.analysis(["c"], [("c", "b", "in", 3049), ("c", "b", "out", 10)])
        wire = report.wire_traffic(a)
        self.assertEqual([(r["sender"], r["receiver"], r["notifications"], r["side"])
                          for r in wire], [("b", "c", 3049, "receiver"),
                                           ("c", "b", 10, "sender")])
        self.assertEqual(report.summary(a)["links"]["b > c"]["notifications"], 3049)
        figs = SimpleNamespace(a=a, s=lambda d: d)
        self.assertEqual(report.unreceived_reading(figs), "")   # b is not traced

    def test_sends_with_no_receipt(self):
        from types import SimpleNamespace
        from spark_analysis import report
        a = self.analysis(["b", "c"], [("b", "c", "out", 11793), ("c", "b", "in", 6494),
                                       ("c", "b", "out", 5), ("b", "c", "in", 5)])
        text = report.unreceived_reading(SimpleNamespace(a=a, s=lambda d: d))
        self.assertIn("b \u2192 c: 5,299 of the 11,793 notifications b forwarded", text)
        self.assertIn("which recorded 6,494 from it", text)
        self.assertIn("csv/links.csv", text)
        self.assertNotIn("c \u2192 b", text)


class BadInputTests(unittest.SynchronousTestCase):
    """A directory with nothing valid is an error naming the file and line."""

    timeout = 300

    def test_all_bad(self):
        spark_session()
        from spark_analysis.cli import main
        directory = _tempdir("bad")
        self.addCleanup(shutil.rmtree, directory, True)
        with open(os.path.join(directory, "x-20240501T120000Z-000001.jsonl"), "w") as f:
            f.write('{"v":1}\n\n[1,2,3]\n')
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = main([directory, "--out", os.path.join(directory, "out"), "--quiet"])
        self.assertEqual(status, 1)
        message = err.getvalue()
        self.assertIn("no valid trace records", message)
        self.assertIn("2 bad lines", message)
        self.assertIn("x-20240501T120000Z-000001.jsonl line 1: missing field 'event'", message)


class ExactDistinctTests(unittest.SynchronousTestCase):
    """"distinct" is exact, not estimated: the distinct digests of the
    hand-made traces per attribute-name set, counted here in Python."""

    timeout = 300

    def test_distinct_is_exact(self):
        traces, analysis = handmade_analysis()
        digests = {}
        for lines in handmade_records().values():
            for line in lines:
                record = json.loads(line)
                if record["event"].startswith("notify") and "digest" in record:
                    digests.setdefault(tuple(record["attrs"]), set()).add(record["digest"])
        rows = analysis.tables["attr_sets"]
        self.assertTrue(rows)
        for row in rows:
            names = tuple(row["attribute_names"].split(",")) if isinstance(
                row["attribute_names"], str) else tuple(row["attribute_names"])
            self.assertEqual(row["distinct"], len(digests[names]), names)


class TrafficPointsTests(unittest.SynchronousTestCase):
    """The traffic chart plots real counts, with zeros where there was no
    traffic: 128 real is drawn 128, an outage drops to 0."""

    def test_real_counts_and_zeros(self):
        from types import SimpleNamespace
        from spark_analysis.report import _rate_points
        minute = 60 * 10**6
        a = SimpleNamespace(series={"bucket_us": minute}, start_us=30 * 10**6,
                            end_us=4 * minute + 20 * 10**6)
        rows = [{"t_us": 0, "n": 128}, {"t_us": 3 * minute, "n": 7},
                {"t_us": 3 * minute, "n": 1}]
        xs, ys = _rate_points(a, rows, "n")
        self.assertEqual(ys, [128, 0, 0, 8, 0])      # partial first minute not scaled up
        self.assertEqual(len(xs), 5)

    def test_partial_buckets_are_marked(self):
        """A first or last bucket mostly outside the window is drawn apart
        (an open circle), so a last minute holding a second of data does not
        read as an outage; one nearly whole is not."""
        from types import SimpleNamespace
        from spark_analysis.report import _partial_points
        minute = 60 * 10**6
        a = SimpleNamespace(series={"bucket_us": minute}, start_us=30 * 10**6,
                            end_us=4 * minute + 20 * 10**6)
        self.assertEqual(_partial_points(a, 5), {0, 4})
        whole = SimpleNamespace(series={"bucket_us": minute}, start_us=0,
                                end_us=5 * minute - 1000)
        self.assertEqual(_partial_points(whole, 5), set())


class ByteUnitTests(unittest.SynchronousTestCase):
    def test_units_fit(self):
        from spark_analysis.report import _byte_unit
        self.assertEqual(_byte_unit(640), ("B", 1))
        self.assertEqual(_byte_unit(4_200), ("kB", 1000))
        self.assertEqual(_byte_unit(12_000_000), ("MB", 1_000_000))


class TightBoxTests(unittest.SynchronousTestCase):
    """A chart is saved with the box "tight" would find, taken from the draw
    already made (report._tight_box): the same PNG, byte for byte."""

    def figure(self, **kwargs):
        from spark_analysis import report
        plt = report._plt()
        fig, ax = plt.subplots(figsize=(6, 2.5), **kwargs)
        self.addCleanup(plt.close, fig)
        ax.plot([1, 2, 3], [10, 30000, 20])
        ax.set_title("a title that reaches past the axes on the right side")
        ax.set_ylabel("notifications/s")
        fig.canvas.draw()
        return fig

    def png(self, fig, box):
        out = io.BytesIO()
        fig.savefig(out, dpi=100, bbox_inches=box, format="png")
        return out.getvalue()

    def test_the_same_png_as_tight(self):
        from spark_analysis import report
        fig = self.figure()
        box = report._tight_box(fig, 100)
        self.assertNotEqual(box, "tight")
        self.assertEqual(self.png(fig, box), self.png(fig, "tight"))

    def test_tight_where_the_draw_would_differ(self):
        from spark_analysis import report
        self.assertEqual(report._tight_box(self.figure(dpi=72), 100), "tight")
        self.assertEqual(report._tight_box(self.figure(layout="constrained"), 100), "tight")


class ChartWorkerTests(unittest.SynchronousTestCase):
    """Some charts are drawn by a second process meanwhile: the report is
    the same, byte for byte, as one whose charts are all drawn in the
    report's own process; a worker that died is replaced, and its charts
    are drawn here in the meantime."""

    timeout = 600

    def setUp(self):
        from spark_analysis import report
        # (trial's main module runs nothing when imported)
        if report.start_chart_worker(any_main=True) is None:
            raise unittest.SkipTest("no chart worker here (a single core)")

    def test_only_for_the_command_line(self):
        """A process whose main module is not ``spark_analysis``'s (it
        might run the analysis when imported, as the worker would import
        it) draws every chart itself."""
        from spark_analysis import report
        saved = list(report._chart_worker)
        self.addCleanup(report._chart_worker.__setitem__, slice(None), saved)
        report._chart_worker.clear()
        self.assertIsNone(report.start_chart_worker())
        self.assertEqual(report._chart_worker, [])

    def copy_of_analysis(self):
        import copy
        _, analysis = handmade_analysis()
        a = copy.copy(analysis)
        a.out_dir = _tempdir("charts")
        self.addCleanup(shutil.rmtree, a.out_dir, True)
        shutil.copytree(os.path.join(analysis.out_dir, "csv"), os.path.join(a.out_dir, "csv"))
        a.charts, a.chart_overlaps = {}, {}
        return a

    def report_of(self, a):
        from spark_analysis import report
        with open(report.write_report(a), encoding="utf-8") as f:
            page = f.read()
        charts = {}
        for name, path in a.charts.items():
            with open(path, "rb") as f:
                charts[name] = f.read()
        return page, charts, dict(a.chart_overlaps)

    def test_same_report_apart_and_here(self):
        from spark_analysis import report
        apart = self.report_of(self.copy_of_analysis())
        saved = list(report._chart_worker)
        report._chart_worker[:] = [None]            # no worker: all drawn here
        self.addCleanup(report._chart_worker.__setitem__, slice(None), saved)
        here = self.report_of(self.copy_of_analysis())
        self.assertEqual(list(apart[1]), list(report.CHARTS))
        self.assertEqual(apart, here)

    def test_the_worker_ends_with_its_owner(self):
        """Killed (SIGKILL, out of memory), a report process leaves no chart
        worker, nor its forkserver, behind."""
        import signal
        import time
        code = ("import os, time\n"
                "from spark_analysis import report\n"
                "pool = report.start_chart_worker(any_main=True)\n"
                "print(pool.submit(os.getpid).result(), pool.submit(os.getppid).result(),"
                " flush=True)\n"
                "time.sleep(600)\n")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env,
                                 stderr=subprocess.DEVNULL,
                                 text=True)
        self.addCleanup(lambda: owner.poll() is None and owner.kill())
        pids = [int(x) for x in owner.stdout.readline().split()]
        self.assertEqual(len(pids), 2)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        left = set(pids)
        for _ in range(300):                        # at most 30 s
            for pid in list(left):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    left.discard(pid)
            if not left:
                break
            time.sleep(0.1)
        self.assertEqual(left, set())

    def test_a_dead_worker_is_replaced(self):
        import signal
        import time
        from spark_analysis import report
        pool = report.start_chart_worker()
        pid = pool.submit(os.getpid).result(timeout=60)
        os.kill(pid, signal.SIGKILL)
        for _ in range(300):                        # at most 30 s
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        page, charts, _ = self.report_of(self.copy_of_analysis())
        self.assertEqual(list(charts), list(report.CHARTS))
        replacement = report.start_chart_worker(any_main=True)
        self.assertIsNot(replacement, pool)
        self.assertNotEqual(replacement.submit(os.getpid).result(timeout=60), pid)


class LatencySampleTests(unittest.SynchronousTestCase):
    """Latencies timed on 1 in k notifications, chosen by digest, on big windows."""

    timeout = 600

    def test_sample_size(self):
        from spark_analysis import jobs
        self.assertEqual([jobs.latency_sample(n, 1000) for n in (0, 999, 1000, 1001, 2000,
                                                                 2001, 7999, 8001)],
                         [1, 1, 1, 2, 2, 4, 8, 16])
        self.assertEqual(jobs.latency_sample(jobs.LATENCY_SAMPLE_TARGET), 1)
        self.assertEqual(jobs.latency_sample(6 * jobs.LATENCY_SAMPLE_TARGET), 8)
        self.assertRaises(ValueError, jobs.latency_sample, 10, 0)

    def test_bad_sample(self):
        from spark_analysis import jobs
        for bad in (0, -2, 1.5, "4"):
            self.assertRaises(ValueError, jobs.paths, None, sample_1_in=bad)
        from spark_analysis import pipeline
        self.assertRaises(ValueError, pipeline.run, None, "/nonexistent", "/nonexistent",
                          latency_sample=0)

    def test_command_line(self):
        from spark_analysis.cli import build_parser
        parser = build_parser()
        self.assertIsNone(parser.parse_args(["t", "--out", "o"]).latency_sample)
        self.assertIsNone(parser.parse_args(["t", "--out", "o", "--latency-sample", "auto"])
                          .latency_sample)
        self.assertEqual(parser.parse_args(["t", "--out", "o", "--latency-sample", "8"])
                         .latency_sample, 8)
        status, err = run_cli("/tmp", "--out", "/tmp/x", "--latency-sample", "0")
        self.assertEqual(status, 2)
        self.assertIn("--latency-sample", err)

    def test_sample_is_the_same_notifications_at_both_ends(self):
        """Sampled latencies are exactly those of the sampled notifications
        matched alone; hop counts and routes still count every record."""
        from pyspark.sql import functions as F
        from spark_analysis import jobs
        from spark_analysis.store import TraceStore
        _, a = SyntheticReportTests.analysis()
        events = TraceStore(spark_session(), a.tables_dir).events(None, None)
        k = 4
        sampled = {name: _rows_of(df) for name, df in jobs.paths(events, sample_1_in=k).items()}
        alone = {name: _rows_of(df) for name, df in jobs.paths(
            events.where(F.pmod("dkey", F.lit(k)) == 0)).items()}
        hop = by_key(sampled["hop_latency"], "sender", "receiver")
        hop_alone = by_key(alone["hop_latency"], "sender", "receiver")
        self.assertEqual(set(hop), set(hop_alone))
        latency = ("matched", "delay_p50_us", "delay_p90_us", "delay_min_us", "delay_max_us",
                   "clock_offset_low_us", "clock_offset_high_us")
        for key, row in hop.items():
            self.assertEqual(row["sample_1_in"], k)
            self.assertEqual(hop_alone[key]["sample_1_in"], 1)
            self.assertEqual({c: row[c] for c in latency},
                             {c: hop_alone[key][c] for c in latency}, key)
        # about 1 in k of every link's crossings are timed
        full = by_key(a.tables["hop_latency"], "sender", "receiver")
        self.assertEqual(a.latency_sample, 1)
        self.assertEqual(set(full), set(hop))
        matched, of = sum(r["matched"] for r in hop.values()), sum(
            r["matched"] for r in full.values())
        self.assertLess(abs(matched * k / of - 1), 0.25, (matched, of))
        routes = by_key(sampled["routes"], "route")
        routes_alone = by_key(alone["routes"], "route")
        everything = by_key(a.tables["routes"], "route")
        for route, row in routes.items():
            self.assertEqual(row["deliveries"], everything[route]["deliveries"])
            if route in routes_alone:
                self.assertEqual(row["timed"], routes_alone[route]["timed"])
                self.assertEqual(row["latency_p50_us"], routes_alone[route]["latency_p50_us"])
        self.assertEqual(sorted(sampled["hops"], key=lambda r: r["hops"]),
                         sorted(_rows_of(jobs.paths(events)["hops"]), key=lambda r: r["hops"]))

    def test_pipeline_samples_a_big_window(self):
        """Past the target the pipeline samples, says so, and CSVs carry the rate."""
        from spark_analysis import jobs, pipeline
        spark = spark_session()
        traces, _ = handmade_analysis()
        out = _tempdir("sampled-report")
        self.addCleanup(shutil.rmtree, out, True)
        self.patch(jobs, "LATENCY_SAMPLE_TARGET", 4)
        a = pipeline.run(spark, traces, out, T(0), T(600), progress=None)
        self.assertGreater(a.wire_records, 4)
        self.assertEqual(a.latency_sample, jobs.latency_sample(a.wire_records, 4))
        self.assertGreater(a.latency_sample, 1)
        handmade = handmade_analysis()[1]
        self.assertEqual(handmade.latency_sample, 1)
        # crossings: forwarded at the sender, received or dropped at the receiver
        crossings = sum(1 for lines in handmade_records().values() for line in lines
                        if _is_wire(json.loads(line)))
        self.assertEqual(a.wire_records, crossings)
        with open(os.path.join(out, "csv", "hop_latency.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertTrue(all(r["sample_1_in"] == str(a.latency_sample) for r in rows))
        with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertIn(f"timed on 1 in {a.latency_sample} notifications", page)
        # counts other than latency's are those of every record
        self.assertEqual(a.tables["hops"], handmade.tables["hops"])
        self.assertEqual([r["deliveries"] for r in a.tables["routes"]],
                         [r["deliveries"] for r in handmade.tables["routes"]])


def _is_wire(record):
    from spark_analysis import jobs
    return record.get("event") == "notify_forwarded" or (
        record.get("direction") == "in" and record.get("event") in jobs.IN_WIRE)


def _rows_of(df):
    return [row.asDict(recursive=True) for row in df.collect()]


class SkewTests(unittest.SynchronousTestCase):
    """skew.judge: a router apart from the majority's bulk is skewed; no claim without one."""

    def rows(self, router, start_s, minutes, per_minute=10):
        return [(router, T(start_s + 60 * m), per_minute, T(start_s + 60 * m),
                 T(start_s + 60 * m + 59)) for m in range(minutes)]

    def test_two_hours_ahead_among_three(self):
        from spark_analysis import skew
        rows = (self.rows("a", 0, 10) + self.rows("b", 0, 10) + self.rows("c", 30, 10)
                + self.rows("d", 7200, 10))
        period, skewed = skew.judge(rows)
        self.assertEqual(period, (T(0), T(30 + 540 + 59)))
        self.assertEqual([(r.router, r.outside, r.first_us, r.last_us) for r in skewed],
                         [("d", 100, T(7200), T(7200 + 540 + 59))])

    def test_no_claim_without_a_majority_or_when_they_overlap(self):
        from spark_analysis import skew
        self.assertEqual(skew.judge(self.rows("a", 0, 10) + self.rows("d", 7200, 10)),
                         (None, []))
        self.assertEqual(skew.judge(self.rows("a", 0, 10) + self.rows("b", 0, 10)
                                    + self.rows("c", 7200, 10) + self.rows("d", 7200, 10)),
                         (None, []))
        # traced for longer than the others, or a few minutes off: kept
        self.assertEqual(skew.judge(self.rows("a", 0, 10) + self.rows("b", 0, 10)
                                    + self.rows("c", 0, 200) + self.rows("d", 300, 10)),
                         (None, []))
