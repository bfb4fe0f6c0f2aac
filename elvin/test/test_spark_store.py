"""Tests for spark_analysis.store: the durable table, read incrementally.

Each test writes a few trace files, updates a TraceStore, changes the files
the way a running router and its log rotation do (a file grows, a partial
last line is completed, a file is gzipped, a file is replaced), updates
again, and checks the table holds every line exactly once. Skipped when
pyspark or Java is missing (the shared session of test_spark_analysis).
"""

import gzip
import os
import shutil
import tempfile

from twisted.trial import unittest

from spark_analysis import traceformat as tf
from elvin.test.test_spark_analysis import T, spark_session


def _line(router, seconds, n):
    attrs = {"n": n}
    return tf.format_record(T(seconds), router, "peer", "notify_forwarded", "out",
                            routing=[router], size=20, attrs=["n"],
                            digest=tf.notification_digest(attrs))


class StoreTests(unittest.SynchronousTestCase):

    timeout = 300

    def setUp(self):
        self.spark = spark_session()
        self.dir = tempfile.mkdtemp(prefix="elvin-store-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.traces = os.path.join(self.dir, "traces")
        os.makedirs(self.traces)
        self.tables = os.path.join(self.dir, "tables")

    def store(self):
        from spark_analysis.store import TraceStore
        return TraceStore(self.spark, self.tables)

    def update(self):
        from spark_analysis import ingest
        return self.store().update(ingest.list_trace_files(self.traces))

    def path(self, name):
        return os.path.join(self.traces, name)

    def write(self, name, text, mode="w"):
        with open(self.path(name), mode, encoding="utf-8") as f:
            f.write(text)

    def numbers(self):
        """Sorted digests' n values in the table: every line once?"""
        rows = self.store().events().select("ts_us").collect()
        return sorted((r["ts_us"] - T(0)) // 10**6 for r in rows)

    def test_new_files_then_nothing(self):
        name = tf.trace_file_name("a", T(0), 1)
        self.write(name, "".join(_line("a", i, i) + "\n" for i in range(5)))
        first = self.update()
        self.assertEqual(first.records, 5)
        self.assertEqual(self.numbers(), [0, 1, 2, 3, 4])
        again = self.update()
        self.assertEqual((again.records, again.parts, again.unchanged), (0, [], 1))
        self.assertEqual(self.numbers(), [0, 1, 2, 3, 4])
        # partitioned by day and router
        self.assertTrue(os.path.isdir(os.path.join(self.tables, "events", "status=ok",
                                                   "day=2024-05-01", "router=a")))

    def test_growing_file_and_partial_line(self):
        """The current file grows; a partial last line waits for its end."""
        name = tf.trace_file_name("a", T(0), 1)
        self.write(name, _line("a", 0, 0) + "\n" + _line("a", 1, 1)[:30])
        self.assertEqual(self.update().records, 1)
        rest = _line("a", 1, 1)[30:] + "\n" + _line("a", 2, 2) + "\n"
        self.write(name, rest, "a")
        grown = self.update()
        self.assertEqual(grown.records, 2)
        self.assertEqual([kind for _, kind in grown.parts], ["tail"])
        self.assertEqual(self.numbers(), [0, 1, 2])

    def test_rotated_to_gz(self):
        """Part read as .jsonl, the rest after it was closed and gzipped."""
        name = tf.trace_file_name("a", T(0), 1)
        self.write(name, "".join(_line("a", i, i) + "\n" for i in range(3)))
        self.assertEqual(self.update().records, 3)
        self.write(name, "".join(_line("a", i, i) + "\n" for i in range(3, 6)), "a")
        with open(self.path(name), "rb") as src, gzip.open(self.path(name) + ".gz", "wb") as dst:
            dst.write(src.read())
        os.remove(self.path(name))
        newer = tf.trace_file_name("a", T(6), 2)
        self.write(newer, _line("a", 6, 6) + "\n")
        result = self.update()
        self.assertEqual(result.records, 4)
        self.assertEqual(self.numbers(), list(range(7)))
        self.assertEqual(self.update().records, 0)

    def test_gz_and_plain_at_once(self):
        """While a file is being compressed both copies exist: read once."""
        name = tf.trace_file_name("a", T(0), 1)
        text = "".join(_line("a", i, i) + "\n" for i in range(3))
        self.write(name, text)
        with gzip.open(self.path(name) + ".gz", "wt", encoding="utf-8") as f:
            f.write(text)
        self.assertEqual(self.update().records, 3)
        self.assertEqual(self.numbers(), [0, 1, 2])

    def test_replaced_file_is_new(self):
        name = tf.trace_file_name("a", T(0), 1)
        self.write(name, _line("a", 0, 0) + "\n")
        self.update()
        self.write(name, _line("a", 9, 9) + "\n" + _line("a", 10, 10) + "\n")
        self.assertEqual(self.update().records, 2)
        self.assertEqual(self.numbers(), [0, 9, 10])

    def test_shorter_file_warns(self):
        name = tf.trace_file_name("a", T(0), 1)
        self.write(name, "".join(_line("a", i, i) + "\n" for i in range(3)))
        self.update()
        head = _line("a", 0, 0) + "\n"
        self.write(name, head)
        result = self.update()
        self.assertEqual(result.records, 0)
        self.assertTrue(any("shorter" in w for w in result.warnings), result.warnings)
        self.assertEqual(self.numbers(), [0, 1, 2])

    def test_crash_after_pending_is_completed(self):
        """Killed between recording a batch and moving its files: the next
        run finishes the move; nothing lost, nothing twice."""
        from spark_analysis import store as store_module
        name = tf.trace_file_name("a", T(0), 1)
        self.write(name, "".join(_line("a", i, i) + "\n" for i in range(4)))
        original = store_module.TraceStore._move_parts
        calls = []

        def crash(self_, batch, *parts):
            calls.append(batch)
            raise KeyboardInterrupt("killed")
        store_module.TraceStore._move_parts = crash
        try:
            self.assertRaises(KeyboardInterrupt, self.update)
        finally:
            store_module.TraceStore._move_parts = original
        self.assertTrue(calls)
        again = self.update()
        self.assertEqual(again.records, 0)       # recovered, not re-read
        self.assertEqual(self.numbers(), [0, 1, 2, 3])
        # the batch's per-minute counts were moved in with its events
        self.assertTrue(self.store().manifest()["minutes"])
        self.assertEqual(_minute_rows(self.store().per_minute()),
                         [("a", "peer", "out", "notify_forwarded", T(0) // 60_000_000 * 60_000_000,
                           4, 80, T(0), T(3))])

    def test_crash_before_pending_reads_again(self):
        """Killed while Spark was writing: staging is dropped, the file read again."""
        from spark_analysis import store as store_module
        name = tf.trace_file_name("a", T(0), 1)
        self.write(name, "".join(_line("a", i, i) + "\n" for i in range(4)))
        original = store_module.TraceStore._write_batch

        def crash(self_, batch, inputs, file_of, result):
            original(self_, batch, inputs, file_of, result)
            raise KeyboardInterrupt("killed")
        store_module.TraceStore._write_batch = crash
        try:
            self.assertRaises(KeyboardInterrupt, self.update)
        finally:
            store_module.TraceStore._write_batch = original
        self.assertEqual(self.update().records, 4)
        self.assertEqual(self.numbers(), [0, 1, 2, 3])
        self.assertFalse(os.path.exists(os.path.join(self.tables, "_ingest", "staging")))

    def test_window(self):
        name = tf.trace_file_name("a", T(0), 1)
        lines = [_line("a", i * 3600, i) for i in range(30)]     # 30 hours, two days
        self.write(name, "\n".join(lines) + "\n")
        self.update()
        from spark_analysis.store import TraceStore
        events = TraceStore(self.spark, self.tables).events(T(5 * 3600), T(7 * 3600))
        self.assertEqual(sorted(r["ts_us"] for r in events.collect()),
                         [T(5 * 3600), T(6 * 3600)])
        days = sorted(os.listdir(os.path.join(self.tables, "events", "status=ok")))
        self.assertEqual(days, ["day=2024-05-01", "day=2024-05-02"])

    def test_invalid_utf8_is_named(self):
        """Issue 22, item 6: a line of invalid UTF-8 is named with its number."""
        name = tf.trace_file_name("a", T(0), 1)
        with open(self.path(name), "wb") as f:
            f.write((_line("a", 0, 0) + "\n").encode())
            f.write(b'{"v":1,"ts_us":\xff\xfe}\n')
            f.write((_line("a", 1, 1) + "\n").encode())
        result = self.update()
        self.assertEqual((result.records, result.bad), (2, 1))
        self.assertEqual([(n, "UTF-8" in r) for _, n, r, _ in result.bad_examples], [(2, True)])


def _minute_rows(df):
    return sorted(tuple(r) for r in df.select(
        "router", "peer", "direction", "event", "minute_us", "n", "bytes", "first_us",
        "last_us").collect())


class PerMinuteTests(unittest.SynchronousTestCase):
    """``TraceStore.per_minute``: the per-minute counts the ingest made,
    summed, equal counting the window's records (``jobs.activity``), for
    any window, whole minutes or not, and over several batches."""

    timeout = 300

    def setUp(self):
        StoreTests.setUp(self)

    store = StoreTests.store
    update = StoreTests.update
    path = StoreTests.path
    write = StoreTests.write

    def lines(self, router, seconds, size=20, event="notify_forwarded", direction="out"):
        return "".join(tf.format_record(T(s), router, "peer", event, direction,
                                        routing=[router], size=size, attrs=["n"],
                                        digest=tf.notification_digest({"n": i})) + "\n"
                       for i, s in enumerate(seconds))

    def assertSameCounts(self, since_us=None, until_us=None):
        from spark_analysis import jobs
        store = self.store()
        made = _minute_rows(store.per_minute(since_us, until_us))
        counted = _minute_rows(jobs.activity(store.events(since_us, until_us)))
        self.assertEqual(made, counted, (since_us, until_us))
        return made

    def test_windows(self):
        # two routers over five minutes (T(0) is not on a minute), one of
        # them in two batches (a file that grows: two counts of a minute)
        a = tf.trace_file_name("a", T(0), 1)
        b = tf.trace_file_name("b", T(0), 1)
        self.write(a, self.lines("a", range(0, 300, 7)))
        self.write(b, self.lines("b", range(3, 200, 11), size=None, event="link_up",
                                 direction="in") + "not json\n")
        self.update()
        self.write(a, self.lines("a", range(300, 330, 3)), mode="a")
        self.update()
        self.assertTrue(self.store().manifest()["minutes"])
        made = os.listdir(os.path.join(self.tables, "event_minutes"))
        self.assertTrue(made and all(d.startswith("day=") for d in made), made)
        whole = self.assertSameCounts()
        self.assertEqual(sum(r[5] for r in whole), 43 + 18 + 10)
        minute = 60 * 10**6
        first = T(0) - T(0) % minute
        for since, until in [(first + minute, first + 3 * minute),      # whole minutes
                             (T(5), T(250, 17)),                          # both edges cut
                             (T(20), T(40)),                              # inside one minute
                             (first + minute - 10**6, first + minute + 10**6),  # one boundary
                             (T(100), None), (None, T(100)),
                             (T(10**6), T(10**6 + 1))]:                   # no records
            self.assertSameCounts(since, until)

    def test_whole_minutes_are_read_from_the_counts(self):
        """A window of whole minutes reads the per-minute counts only."""
        self.write(tf.trace_file_name("a", T(0), 1), self.lines("a", range(0, 300, 5)))
        self.update()
        minute = 60 * 10**6
        first = T(0) - T(0) % minute
        files = self.store().per_minute(first + minute, first + 3 * minute).inputFiles()
        self.assertTrue(files and all("/event_minutes/" in f for f in files), files)

    def test_older_table_counts_its_records(self):
        """A table begun before the counts were made (no ``minutes`` in
        its manifest) counts the records: its counts would miss batches."""
        import json
        self.write(tf.trace_file_name("a", T(0), 1), self.lines("a", range(0, 200, 5)))
        self.update()
        manifest = os.path.join(self.tables, "_ingest", "manifest.json")
        with open(manifest) as f:
            data = json.load(f)
        del data["minutes"]
        with open(manifest, "w") as f:
            json.dump(data, f)
        self.write(tf.trace_file_name("a", T(0), 1), self.lines("a", range(200, 260, 5)),
                   mode="a")
        self.update()
        files = self.store().per_minute().inputFiles()
        self.assertTrue(files and not any("/event_minutes/" in f for f in files), files)
        self.assertEqual(sum(r[5] for r in self.assertSameCounts()), 52)
        # --rebuild: read again from scratch, with the counts
        from spark_analysis import ingest
        self.store().update(ingest.list_trace_files(self.traces), rebuild=True)
        self.assertTrue(self.store().manifest()["minutes"])
        files = self.store().per_minute().inputFiles()
        self.assertTrue(files and all("/event_minutes/" in f for f in files), files)
        self.assertEqual(sum(r[5] for r in self.assertSameCounts()), 52)

    def test_spark_written_counts_equal_the_tasks(self):
        """Where Spark writes the batch (remote tables), it writes the same counts."""
        from spark_analysis import ingest
        self.write(tf.trace_file_name("a", T(0), 1), self.lines("a", range(0, 300, 7)))
        self.update()
        out = os.path.join(self.dir, "spark-minutes")
        ingest.write_minutes(self.spark.read.parquet(os.path.join(self.tables, "events"))
                             .where("status = 'ok'"), out)
        by_spark = sorted(tuple(r) for r in self.spark.read.parquet(out).collect())
        by_tasks = sorted(tuple(r) for r in self.spark.read.parquet(
            os.path.join(self.tables, "event_minutes")).select(*(
                self.spark.read.parquet(out).columns)).collect())
        self.assertEqual(by_spark, by_tasks)


class CompactionTests(unittest.SynchronousTestCase):
    """A table read in many small batches (a watcher's minutes) has each
    partition's small files merged into one after a batch: the same rows
    and per-minute counts, far fewer files; never while a run reads the
    table; a merge cut short by a crash is finished or dropped."""

    timeout = 300

    def setUp(self):
        StoreTests.setUp(self)
        from spark_analysis import compaction
        self.patch(compaction, "MIN_FILES", 4)
        self.name = tf.trace_file_name("a", T(0), 1)
        self.minute = 0

    store = StoreTests.store
    update = StoreTests.update
    path = StoreTests.path
    write = StoreTests.write
    numbers = StoreTests.numbers

    def add_minute(self):
        """One more minute of the growing file, read as one batch."""
        m = self.minute
        self.minute += 1
        self.write(self.name, "".join(_line("a", m * 60 + s, s) + "\n" for s in (5, 30, 1)),
                   mode="a")
        return self.update()

    def files(self, table="events"):
        found = []
        for dirpath, _, names in os.walk(os.path.join(self.tables, table)):
            found += [os.path.join(dirpath, n) for n in names if n.endswith(".parquet")]
        return sorted(found)

    def expected(self):
        return sorted(m * 60 + s for m in range(self.minute) for s in (5, 30, 1))

    def test_small_batches_are_merged(self):
        import pyarrow.parquet as pq
        from spark_analysis import jobs
        for _ in range(3):
            self.add_minute()
        self.assertEqual(len(self.files()), 3)                  # not yet: under 4
        self.add_minute()
        (merged,) = self.files()
        self.assertIn("part-compact-", merged)
        self.assertEqual(len(self.files("event_minutes")), 1)
        # the rows once each, sorted by time; the counts summed per minute
        rows = pq.ParquetFile(merged).read().column("ts_us").to_pylist()
        self.assertEqual(rows, sorted(rows))
        self.assertEqual(self.numbers(), self.expected())
        counts = pq.ParquetFile(self.files("event_minutes")[0]).read()
        self.assertEqual(counts.column("n").to_pylist(), [3, 3, 3, 3])
        store = self.store()
        self.assertEqual(_minute_rows(store.per_minute()),
                         _minute_rows(jobs.activity(store.events())))
        # nothing left aside
        self.assertEqual([n for n in os.listdir(os.path.join(self.tables, "_ingest"))
                          if n.startswith("compact")], [])
        # the merged file counts among the small ones: the next merge takes it in
        for _ in range(3):
            self.add_minute()
        self.assertEqual(len(self.files()), 1)
        self.assertEqual(self.numbers(), self.expected())

    def test_not_while_a_run_reads(self):
        reader = self.store()
        reader.start_reading()
        for _ in range(5):
            self.add_minute()
        self.assertEqual(len(self.files()), 5)                  # left alone
        reader.stop_reading()
        self.add_minute()
        self.assertEqual(len(self.files()), 1)
        self.assertEqual(self.numbers(), self.expected())

    def test_a_run_holds_the_table_until_it_ends(self):
        from spark_analysis import pipeline
        from spark_analysis import store as store_module
        for _ in range(2):
            self.add_minute()
        from spark_analysis import smallwindow
        held = []

        def holding(original):
            def reading(*args, **kwargs):
                with self.store()._no_readers() as free:    # another process's merge
                    held.append(not free)
                return original(*args, **kwargs)
            return reading
        # where each engine starts reading the window
        self.patch(store_module.TraceStore, "per_minute",
                   holding(store_module.TraceStore.per_minute))
        self.patch(smallwindow, "open_window", holding(smallwindow.open_window))
        engines = ["spark"] + (["duckdb"] if smallwindow.available() else [])
        for engine in engines:
            pipeline.run(self.spark, self.traces, os.path.join(self.dir, "out"),
                         tables_dir=self.tables, progress=None, report=False, engine=engine)
        # (Spark reads the per-minute counts twice: skewed clocks, then the window)
        self.assertEqual(held, [True] * (len(engines) + 1))
        with self.store()._no_readers() as free:
            self.assertTrue(free)

    def test_crash_after_the_record_is_finished(self):
        """Killed after the merged file was moved in, before the files it
        replaces were deleted (the rows are in the table twice): the next
        update finishes the merge; every row once."""
        from spark_analysis import store as store_module
        for _ in range(3):
            self.add_minute()
        original = store_module._LocalFS.delete

        def crash(fs, path):
            if path.endswith(".parquet"):
                raise KeyboardInterrupt("killed")
            return original(fs, path)
        self.patch(store_module._LocalFS, "delete", crash)
        self.assertRaises(KeyboardInterrupt, self.add_minute)
        self.assertEqual(len(self.files()), 5)      # 4 and their merge
        self.patch(store_module._LocalFS, "delete", original)
        self.assertEqual(self.update().records, 0)   # the batch was committed
        self.add_minute()
        self.assertEqual(self.numbers(), self.expected())
        self.assertEqual(len([f for f in self.files() if "part-compact-" in f]), 1)

    def test_a_failed_merge_is_a_warning(self):
        from spark_analysis import compaction
        for _ in range(3):
            self.add_minute()

        def full(paths, target, counts=False):
            raise OSError(28, "No space left on device")
        self.patch(compaction, "merge", full)
        result = self.add_minute()
        self.assertEqual(result.records, 3)                     # the batch is in
        self.assertEqual(len(result.warnings), 1)
        self.assertIn("not merged: [Errno 28] No space left on device", result.warnings[0])
        self.assertEqual(self.numbers(), self.expected())

    def test_crash_before_the_record_drops_the_merge(self):
        from spark_analysis import compaction
        for _ in range(3):
            self.add_minute()
        original = compaction.merge

        def crash(paths, target, counts=False):
            original(paths, target, counts)
            raise KeyboardInterrupt("killed")
        self.patch(compaction, "merge", crash)
        self.assertRaises(KeyboardInterrupt, self.add_minute)
        self.patch(compaction, "merge", original)
        self.assertEqual(len(self.files()), 4)
        self.add_minute()                            # recovers, then merges
        self.assertEqual(len(self.files()), 1)
        self.assertEqual(self.numbers(), self.expected())
        self.assertFalse(os.path.exists(os.path.join(self.tables, "_ingest", "compacting")))


class CompactionPlanTests(unittest.SynchronousTestCase):
    """``compaction.plan`` and ``merge`` without Spark."""

    def test_plan_and_merge(self):
        import pyarrow as pa
        import pyarrow.parquet as pq
        from spark_analysis import compaction, minutes
        root = tempfile.mkdtemp(prefix="elvin-compact-")
        self.addCleanup(shutil.rmtree, root, True)
        part = os.path.join(root, "day=2024-05-01")
        os.makedirs(part)
        schema = pa.schema([f for f in minutes.SCHEMA if f.name != "day"])
        for i, (minute, n) in enumerate([(120, 2), (60, 1), (120, 3)]):
            pq.write_table(pa.table({"router": ["a"], "peer": ["b"], "direction": ["out"],
                                     "event": ["e"], "minute_us": [minute], "n": [n],
                                     "bytes": [10 * n], "first_us": [minute + i],
                                     "last_us": [minute + 10 + i]}, schema=schema),
                           os.path.join(part, f"part-{i}.parquet"))
        open(os.path.join(part, "_SUCCESS"), "w").close()
        self.assertEqual(compaction.plan(root, min_files=4), [])
        self.assertEqual(compaction.plan(root, min_files=3),
                         [("day=2024-05-01", ["part-0.parquet", "part-1.parquet",
                                              "part-2.parquet"])])
        self.assertEqual(compaction.plan(root, min_files=3, small_bytes=10), [])
        target = os.path.join(root, "merged", "one.parquet")
        self.assertEqual(compaction.merge(
            [os.path.join(part, f"part-{i}.parquet") for i in range(3)], target,
            counts=True), 2)
        merged = pq.ParquetFile(target).read().to_pylist()
        self.assertEqual([(r["minute_us"], r["n"], r["bytes"], r["first_us"], r["last_us"])
                          for r in merged], [(60, 1, 10, 61, 71), (120, 5, 50, 120, 132)])
        # files whose columns differ (written by different versions) are refused
        pq.write_table(pa.table({"minute_us": [1]}), os.path.join(part, "part-3.parquet"))
        self.assertRaises(ValueError, compaction.merge,
                          [os.path.join(part, f"part-{i}.parquet") for i in (0, 3)], target)


class MinutesTests(unittest.SynchronousTestCase):
    """``minutes.partial``/``merge`` without Spark."""

    def table(self, ts, sizes):
        import pyarrow as pa
        from spark_analysis import arrowparse
        n = len(ts)
        columns = {f.name: pa.nulls(n, f.type) for f in arrowparse.EVENTS_SCHEMA}
        columns.update(ts_us=pa.array(ts, pa.int64()), size=pa.array(sizes, pa.int64()),
                       router=pa.array(["a"] * n), peer=pa.array(["p"] * n),
                       direction=pa.array(["out"] * n), event=pa.array(["x"] * n))
        return pa.table(columns, schema=arrowparse.EVENTS_SCHEMA)

    def test_partial_and_merge(self):
        from spark_analysis import minutes
        m = minutes.MINUTE_US
        one = minutes.partial(self.table([m, m + 5, 2 * m + 1], [10, None, None]))
        two = minutes.partial(self.table([m + 7, -m - 1], [1, 3]))
        rows = sorted((r["minute_us"], r["n"], r["bytes"], r["first_us"], r["last_us"])
                      for r in minutes.merge([one, two]).to_pylist())
        # a minute as Spark's ts - ts % unit makes it (toward zero below 0);
        # sizes summed over those given, None where none is
        self.assertEqual(rows, [(-m, 1, 3, -m - 1, -m - 1), (m, 3, 11, m, m + 7),
                                (2 * m, 1, None, 2 * m + 1, 2 * m + 1)])
        self.assertEqual(minutes.merge([]).num_rows, 0)
        self.assertEqual(minutes.merge([one]).schema, minutes.SCHEMA)


class EventLogTests(unittest.SynchronousTestCase):
    """eventlog.summarise adds up jobs by description and ranks stages."""

    def test_summary(self):
        import json
        from spark_analysis import eventlog
        path = os.path.join(tempfile.mkdtemp(prefix="elvin-evlog-"), "app")
        self.addCleanup(shutil.rmtree, os.path.dirname(path), True)
        events = [
            {"Event": "SparkListenerJobStart", "Job ID": 0, "Submission Time": 1000,
             "Stage IDs": [0, 1], "Properties": {"spark.job.description": "[2] ingest"}},
            {"Event": "SparkListenerTaskEnd", "Stage ID": 0,
             "Task Metrics": {"Executor Run Time": 1500, "JVM GC Time": 100,
                              "Input Metrics": {"Bytes Read": 2_000_000}}},
            {"Event": "SparkListenerTaskEnd", "Stage ID": 0,
             "Task Metrics": {"Executor Run Time": 1500, "JVM GC Time": 0}},
            {"Event": "SparkListenerStageCompleted", "Stage Info": {
                "Stage ID": 0, "Stage Name": "parquet at x", "Number of Tasks": 2,
                "Submission Time": 1000, "Completion Time": 2600}},
            {"Event": "SparkListenerTaskEnd", "Stage ID": 1,
             "Task Metrics": {"Executor Run Time": 200,
                              "Shuffle Write Metrics": {"Shuffle Bytes Written": 5_000_000}}},
            {"Event": "SparkListenerStageCompleted", "Stage Info": {
                "Stage ID": 1, "Stage Name": "count at y", "Number of Tasks": 1,
                "Submission Time": 2600, "Completion Time": 2900}},
            {"Event": "SparkListenerJobEnd", "Job ID": 0, "Completion Time": 3000},
        ]
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(e) for e in events) + "\n")
        summary = eventlog.summarise(path)
        [job] = summary["by_description"]
        self.assertEqual((job["description"], job["jobs"], job["stages"]), ("[2] ingest", 1, 2))
        self.assertAlmostEqual(job["wall_s"], 2.0)
        self.assertAlmostEqual(job["task_s"], 3.2)
        first, second = summary["stages"]
        self.assertEqual((first["name"], first["task_s"], first["gc_s"], first["input_mb"]),
                         ("parquet at x", 3.0, 0.1, 2.0))
        self.assertEqual(second["shuffle_write_mb"], 5.0)
        self.assertIn("[2] ingest", eventlog.format_summary(summary))


class StageDescriptionTests(unittest.SynchronousTestCase):
    """Stages run side by side each name their own jobs (the event log's
    "where the time went" groups by it): once, every job carried the name
    of the stage that set its name last."""

    timeout = 120

    def test_each_stage_keeps_its_description(self):
        import threading
        from spark_analysis import pipeline
        spark = spark_session()
        out = tempfile.mkdtemp(prefix="elvin-stages-")
        self.addCleanup(shutil.rmtree, out, True)
        barrier = threading.Barrier(3, timeout=60)
        seen = {}

        def stage(name):
            def run(context):
                barrier.wait()          # every stage has named itself by now
                seen[name] = spark.sparkContext.getLocalProperty("spark.job.description")
                return ""
            return run
        pipeline._run_side_by_side(spark, pipeline._Progress(3, None),
                                   {"analysis": pipeline.Analysis(out)},
                                   [(k, f"stage {k}", stage(k)) for k in "abc"])
        self.assertEqual(seen, {"a": "[1] stage a", "b": "[2] stage b", "c": "[3] stage c"})


class LocalModeTests(unittest.SynchronousTestCase):
    """Local mode stays local: loopback driver, no UI unless asked, quiet logs."""

    def test_settings(self):
        from spark_analysis.session import is_local_master, local_settings
        settings = local_settings()
        self.assertEqual((settings["spark.driver.host"], settings["spark.driver.bindAddress"],
                          settings["spark.ui.enabled"]), ("127.0.0.1", "127.0.0.1", "false"))
        self.assertIn("log4j2-quiet.properties", settings["spark.driver.extraJavaOptions"])
        self.assertEqual(local_settings(ui=True)["spark.ui.enabled"], "true")
        # a watching process reuses the compiled queries of its earlier runs
        self.assertEqual(settings["spark.sql.codegen.cache.maxEntries"], "1000")
        self.assertTrue(is_local_master("local[4]"))
        self.assertFalse(is_local_master("spark://127.0.0.1:7077"))
        self.assertFalse(is_local_master("yarn"))

    def test_shuffle_partitions_follow_the_cores(self):
        from spark_analysis.session import local_cores, local_settings
        self.assertEqual(local_cores("local[3]"), 3)
        self.assertEqual(local_cores("local"), 1)
        self.assertEqual(local_cores("local[*]"), os.cpu_count())
        self.assertEqual(local_settings(master="local[3]")["spark.sql.shuffle.partitions"], "12")


class QuickJitTests(unittest.SynchronousTestCase):
    """A run expected to touch few records starts the JVM with its quick
    JIT tier only; the guess comes from the manifest, or from file sizes."""

    def test_expected_records(self):
        import json
        from spark_analysis.store import expected_records
        tables = tempfile.mkdtemp(prefix="elvin-quick-jit-")
        self.addCleanup(shutil.rmtree, tables, True)
        os.makedirs(os.path.join(tables, "_ingest"))
        with open(os.path.join(tables, "_ingest", "manifest.json"), "w") as f:
            json.dump({"version": 3, "batches": [], "files": {
                "a#1": {"path": "/t/a.jsonl", "records": 1000, "bad": 2},
                "b#1": {"path": "/t/b.jsonl.gz", "records": 50, "bad": 0}}}, f)
        files = [("/t/a.jsonl", 10**9), ("/t/b.jsonl.gz", 10**9),
                 ("/t/c.jsonl.gz", 2000), ("/t/d.jsonl", 3000)]
        # known: counted; new: about 20 bytes a record gzip'd, 300 plain
        self.assertEqual(expected_records(tables, files), 1002 + 50 + 100 + 10)
        self.assertEqual(expected_records(os.path.join(tables, "none"), files[2:]), 110)
        self.assertIsNone(expected_records("hdfs://nn/tables", files))

    def test_small_runs_use_the_quick_tier(self):
        from spark_analysis.cli import _small_run, build_parser
        from spark_analysis.session import QUICK_JIT_RECORDS, local_settings
        self.assertIn("-XX:TieredStopAtLevel=1",
                      local_settings(quick_jit=True)["spark.driver.extraJavaOptions"])
        self.assertNotIn("TieredStopAtLevel", local_settings()["spark.driver.extraJavaOptions"])
        args = build_parser().parse_args(["/t", "--out", "/nonexistent-out"])
        small = [("/t/a.jsonl.gz", 20 * (QUICK_JIT_RECORDS - 1))]
        big = [("/t/a.jsonl.gz", 20 * QUICK_JIT_RECORDS)]
        self.assertTrue(_small_run(args, small, None, None))
        self.assertFalse(_small_run(args, big, None, None))


class NoVerifyTests(unittest.SynchronousTestCase):
    """The tests' JVMs skip bytecode verification where the JVM takes the
    option (session.no_verify_options), and start without it where not."""

    def fake_java(self, refuses):
        """A JAVA_HOME whose java exits 1 when given ``refuses``, else 0,
        writing each call's arguments to a file (returned)."""
        home = tempfile.mkdtemp(prefix="elvin-fake-java-")
        self.addCleanup(shutil.rmtree, home, True)
        os.makedirs(os.path.join(home, "bin"))
        calls = os.path.join(home, "calls")
        java = os.path.join(home, "bin", "java")
        with open(java, "w") as f:
            f.write(f'#!/bin/sh\necho "$*" >> {calls}\n'
                    f'case " $* " in *" {refuses} "*) exit 1;; esac\nexit 0\n')
        os.chmod(java, 0o755)
        from spark_analysis import session
        self.patch(os, "environ", dict(os.environ, JAVA_HOME=home))
        self.patch(session, "_accepted", {})
        return calls

    def test_asked_once_of_the_jvm(self):
        from spark_analysis import session
        calls = self.fake_java("-XX:-BytecodeVerificationRemote")
        self.assertFalse(session.java_accepts(session.NO_VERIFY_OPTIONS))
        self.assertFalse(session.java_accepts(session.NO_VERIFY_OPTIONS))
        self.assertTrue(session.java_accepts("-XX:+UseSerialGC"))
        with open(calls) as f:
            self.assertEqual(f.read().splitlines(),
                             [f"{session.NO_VERIFY_OPTIONS} -version", "-XX:+UseSerialGC -version"])
        self.assertEqual(session.no_verify_options(), "")
        self.assertNotIn("Verification", session.test_jvm_options())

    def test_given_where_the_jvm_takes_it(self):
        from spark_analysis import session
        self.fake_java("-XX:-NoSuchOption")
        self.assertEqual(session.no_verify_options(), session.NO_VERIFY_OPTIONS)
        self.assertIn(session.NO_VERIFY_OPTIONS, session.test_jvm_options())

    def test_no_java(self):
        from spark_analysis import session
        empty = tempfile.mkdtemp(prefix="elvin-no-java-")
        self.addCleanup(shutil.rmtree, empty, True)
        self.patch(os, "environ", {**{k: v for k, v in os.environ.items() if k != "JAVA_HOME"},
                                   "PATH": empty})
        self.patch(session, "_accepted", {})
        self.assertFalse(session.java_accepts(session.NO_VERIFY_OPTIONS))

    def test_the_test_session_runs_without(self):
        from spark_analysis import session
        spark = spark_session()
        if not session.java_accepts(session.NO_VERIFY_OPTIONS):
            raise unittest.SkipTest("this JVM does not take " + session.NO_VERIFY_OPTIONS)
        arguments = list(spark._jvm.java.lang.management.ManagementFactory
                         .getRuntimeMXBean().getInputArguments())
        self.assertIn("-XX:-BytecodeVerificationRemote", arguments)


class ClassArchiveTests(unittest.SynchronousTestCase):
    """The test sessions' class-data-sharing archive (session.ClassArchive):
    written by the first JVM at its end, renamed into place once that JVM
    has exited well, mapped by later ones; never in the way."""

    def setUp(self):
        from spark_analysis.session import pyspark_available
        reason = pyspark_available()
        if reason:
            raise unittest.SkipTest(reason)
        self.dir = tempfile.mkdtemp(prefix="elvin-cds-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.environ("ELVIN_SPARK_CDS_DIR", os.path.join(self.dir, "cache"))
        self.environ("ELVIN_SPARK_CDS", "1")

    def environ(self, name, value):
        old = os.environ.get(name)
        self.addCleanup(lambda: os.environ.__setitem__(name, old) if old is not None
                        else os.environ.pop(name, None))
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    def test_written_first_then_mapped(self):
        from spark_analysis.session import ClassArchive
        archive = ClassArchive("-XX:+UseSerialGC")
        self.assertTrue(archive.path.startswith(os.path.join(self.dir, "cache", "spark-")))
        self.assertEqual(archive.map_options(), "")
        self.assertEqual(archive.java_options(),
                         f"-XX:ArchiveClassesAtExit={archive.path}.{os.getpid()}.tmp "
                         "-Xlog:cds=off -Xlog:cds+dynamic=off")
        open(archive.path, "wb").close()
        again = ClassArchive("-XX:+UseSerialGC")
        self.assertEqual(again.java_options(), f"-XX:SharedArchiveFile={archive.path} "
                                               "-Xlog:cds=off -Xlog:cds+dynamic=off")
        self.assertIsNone(again.writing)
        # other JVM options, another archive
        self.assertNotEqual(ClassArchive("-XX:+UseParallelGC").path, archive.path)

    def test_off_or_nowhere_to_write_is_no_archive(self):
        from spark_analysis.session import ClassArchive
        for setting in ("0", None):           # off unless asked for
            self.environ("ELVIN_SPARK_CDS", setting)
            self.assertEqual(ClassArchive("").java_options(), "")
        self.environ("ELVIN_SPARK_CDS", "1")
        blocker = os.path.join(self.dir, "a-file")
        open(blocker, "w").close()
        self.environ("ELVIN_SPARK_CDS_DIR", os.path.join(blocker, "cache"))
        self.assertEqual(ClassArchive("").java_options(), "")

    def jvm(self, status):
        """A stand-in for the JVM's process: at the end of its input it
        writes the archive it was told to (as -XX:ArchiveClassesAtExit does)
        and exits with ``status``."""
        import subprocess
        import sys
        from spark_analysis.session import ClassArchive
        archive = ClassArchive("")
        archive.java_options()
        code = ("import sys; sys.stdin.read(); "
                f"open({archive.writing!r}, 'wb').write(b'archive'); sys.exit({status})")
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
        self.addCleanup(proc.wait)
        stopped = []
        spark = type("Spark", (), {"stop": lambda self: stopped.append(1)})()
        return archive, spark, proc, stopped

    def test_renamed_into_place_once_the_jvm_has_written_it(self):
        archive, spark, proc, stopped = self.jvm(0)
        old = os.path.join(os.path.dirname(archive.path), "spark-0123456789abcdef.jsa")
        open(old, "wb").close()
        archive._finish(spark, proc)
        self.assertEqual(stopped, [1])
        with open(archive.path, "rb") as f:
            self.assertEqual(f.read(), b"archive")
        self.assertFalse(os.path.exists(archive.writing))
        self.assertFalse(os.path.exists(old))          # another key's: removed

    def test_a_jvm_that_failed_leaves_no_archive(self):
        archive, spark, proc, _ = self.jvm(1)
        archive._finish(spark, proc)
        self.assertFalse(os.path.exists(archive.path))
        self.assertFalse(os.path.exists(archive.writing))

    def test_only_a_writing_session_is_stopped_at_exit(self):
        import atexit
        from spark_analysis.session import ClassArchive
        registered = []
        self.patch(atexit, "register", lambda *a: registered.append(a))
        gateway = type("Gateway", (), {"proc": object()})()
        spark = type("Spark", (), {"sparkContext": type("SC", (), {"_gateway": gateway})()})()
        archive = ClassArchive("")
        archive.started(spark)
        self.assertEqual(registered, [])               # not asked for options yet
        archive.java_options()
        archive.started(spark)
        self.assertEqual(registered, [(archive._finish, spark, gateway.proc)])


class ManifestVersionTests(unittest.SynchronousTestCase):
    """A table written before dkey/akey existed is refused, saying what to do
    (reading it would give null keys and wrong counts)."""

    def test_old_manifest_is_refused(self):
        import json
        from spark_analysis.ingest import TraceInputError
        from spark_analysis.store import MANIFEST_VERSION, TraceStore
        tables = tempfile.mkdtemp(prefix="elvin-old-tables-")
        self.addCleanup(shutil.rmtree, tables, True)
        os.makedirs(os.path.join(tables, "_ingest"))
        with open(os.path.join(tables, "_ingest", "manifest.json"), "w") as f:
            json.dump({"version": MANIFEST_VERSION - 1, "files": {}, "batches": []}, f)
        store = TraceStore(None, tables)          # local tables: no Spark needed to read it
        with self.assertRaises(TraceInputError) as caught:
            store.manifest()
        self.assertIn("--rebuild", str(caught.exception))
        store.clear()                             # what --rebuild does: then it is new
        self.assertEqual(store.manifest()["version"], MANIFEST_VERSION)


class OneWriterTests(unittest.SynchronousTestCase):
    """Two runs on one local table: the second waits for the first's update
    (it would otherwise take the first's batch in progress for a crashed
    one and undo it), and says whom it waits for. No Spark needed."""

    def test_waits_for_the_other_writer(self):
        import fcntl
        import threading
        from spark_analysis.store import TraceStore
        tables = tempfile.mkdtemp(prefix="elvin-store-lock-")
        self.addCleanup(shutil.rmtree, tables, True)
        store = TraceStore(None, tables)
        said, entered = [], threading.Event()

        def second():
            with store._one_writer(said.append):
                entered.set()

        with open(os.path.join(tables, "_writer.lock"), "a+") as other:
            fcntl.flock(other, fcntl.LOCK_EX)
            other.write("process 4242 on elsewhere\n")
            other.flush()
            thread = threading.Thread(target=second, daemon=True)
            thread.start()
            for _ in range(200):                       # up to 10 s
                if said:
                    break
                thread.join(0.05)
            self.assertEqual(said, [f"waiting for process 4242 on elsewhere to finish "
                                    f"updating {tables}"])
            self.assertFalse(entered.is_set())
            fcntl.flock(other, fcntl.LOCK_UN)
        thread.join(10)
        self.assertTrue(entered.is_set())
        # free again: a third writer goes straight in, and nothing is said
        with store._one_writer(said.append):
            pass
        self.assertEqual(len(said), 1)


class CopiesTests(unittest.SynchronousTestCase):
    """The same traces collected twice are recognised by content (no Spark)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="elvin-copies-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def write(self, rel, lines, gz=False):
        path = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = "".join(line + "\n" for line in lines).encode()
        with open(path, "wb") as f:
            f.write(gzip.compress(data) if gz else data)
        return path, os.path.getsize(path)

    def test_same_content_first_part_and_different(self):
        from spark_analysis.store import _copies
        name = tf.trace_file_name("a", T(0), 1)
        lines = [_line("a", i, i) for i in range(200)]
        whole = self.write(name, lines)
        again = self.write(os.path.join("h2", name + ".gz"), lines, gz=True)
        early = self.write(os.path.join("h3", name), lines[:50])
        other = self.write(tf.trace_file_name("b", T(0), 1), [_line("b", i, i) for i in range(9)])
        renamed_differs = self.write(os.path.join("h4", name), lines[:199] + [_line("a", 1, 7)])
        found = _copies([whole, again, early, other, renamed_differs])
        self.assertEqual(sorted((os.path.relpath(p, self.dir), os.path.relpath(k, self.dir), how)
                                for p, k, how in found),
                         [(os.path.join("h2", name + ".gz"), name, "same content"),
                          (os.path.join("h3", name), name,
                           f"first {early[1]:,} bytes")])

    def test_a_longer_copy_of_a_file_read_before_takes_over(self):
        from spark_analysis.store import _copies
        name = tf.trace_file_name("a", T(0), 1)
        lines = [_line("a", i, i) for i in range(100)]
        short = self.write(name, lines[:60])
        longer = self.write(os.path.join("h2", name), lines)
        # the longer copy of the same name takes over (the store reads its tail)
        self.assertEqual([(os.path.relpath(p, self.dir), how) for p, _, how in
                          _copies([short, longer], known={short[0]})],
                         [(name, f"first {short[1]:,} bytes")])

    def test_remote_files_by_name_and_size(self):
        from spark_analysis.store import _copies
        name = tf.trace_file_name("a", T(0), 1)
        self.assertEqual(_copies([(f"hdfs://x/1/{name}", 10), (f"hdfs://x/2/{name}", 10),
                                  (f"hdfs://x/3/{name}", 11)]),
                         [(f"hdfs://x/2/{name}", f"hdfs://x/1/{name}", "same name and size")])


class CutShortTests(unittest.SynchronousTestCase):
    """A finished file's partial last line is a bad line, with why (read here, no Spark)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="elvin-cut-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.traces = os.path.join(self.dir, "traces")
        os.makedirs(self.traces)

    def update(self):
        from spark_analysis import ingest
        from spark_analysis.store import TraceStore
        return TraceStore(None, os.path.join(self.dir, "tables")).update(
            ingest.list_trace_files(self.traces))

    def write(self, name, data, gz=False):
        path = os.path.join(self.traces, name)
        with open(path, "wb") as f:
            f.write(gzip.compress(data.encode()) if gz else data.encode())
        return path

    def test_closed_rotated_and_stopped_files(self):
        from spark_analysis.arrowparse import CUT_SHORT
        whole = "".join(_line("a", i, i) + "\n" for i in range(3))
        closed = self.write(tf.trace_file_name("a", T(0), 1), whole + _line("a", 3, 3)[:25])
        rotated = self.write(tf.trace_file_name("b", T(0), 1) + ".gz",
                             whole.replace('"a"', '"b"') + _line("b", 3, 3)[:40], gz=True)
        current = self.write(tf.trace_file_name("a", T(10), 2),
                             _line("a", 10, 10) + "\n" + _line("a", 11, 11)[:30])
        first = self.update()
        self.assertEqual(first.records, 3 + 3 + 1)
        self.assertEqual({os.path.basename(p): (line, reason.startswith(CUT_SHORT + ": not JSON"))
                          for p, line, reason, _ in first.bad_examples},
                         {os.path.basename(closed): (4, True),
                          os.path.basename(rotated): (4, True)})
        # the current file may still be written: its partial line waits, said
        self.assertEqual(first.file_stats[current], (1, 0))
        self.assertTrue(any(w.startswith(f"{current}: last line incomplete (")
                            for w in first.warnings), first.warnings)
        # not grown by the next run: the writer stopped, the line is judged
        second = self.update()
        self.assertEqual(second.file_stats[current], (0, 1))
        self.assertEqual([(line, reason.split(":")[0]) for _, line, reason, _ in
                          second.bad_examples], [(2, CUT_SHORT.split(":")[0])])
        self.assertEqual(self.update().parts, [])

    def test_a_last_line_without_newline_that_is_whole_is_a_record(self):
        self.write(tf.trace_file_name("a", T(0), 1), _line("a", 0, 0))
        self.write(tf.trace_file_name("a", T(10), 2), _line("a", 10, 10) + "\n")
        result = self.update()
        self.assertEqual((result.records, result.bad), (2, 0))


class BadLinesListTests(unittest.SynchronousTestCase):
    """csv/bad_lines.csv names every bad line up to the cap, with each file's total."""

    def run_with_bad_lines(self, bad):
        import csv
        from elvin.test.test_spark_smallwindow import _skip_without_duckdb
        from spark_analysis import pipeline
        _skip_without_duckdb()
        base = tempfile.mkdtemp(prefix="elvin-badlines-")
        self.addCleanup(shutil.rmtree, base, True)
        traces, out = os.path.join(base, "traces"), os.path.join(base, "out")
        os.makedirs(traces)
        lines = [_line("a", i, i) for i in range(3)] + [f"bad {i}" for i in range(bad)]
        with open(os.path.join(traces, tf.trace_file_name("a", T(0), 1)), "w") as f:
            f.write("".join(line + "\n" for line in lines))

        def no_spark():
            raise AssertionError("a small local window must not start Spark")
        analysis = pipeline.run(no_spark, traces, out, progress=None, engine="duckdb")
        with open(os.path.join(out, "csv", "bad_lines.csv")) as f:
            rows = list(csv.DictReader(f))
        with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
            return analysis, rows, f.read()

    def test_every_bad_line_is_listed(self):
        a, rows, _ = self.run_with_bad_lines(7)
        self.assertEqual(a.bad_lines, 7)
        self.assertEqual([(r["line"], r["file_bad_lines"]) for r in rows],
                         [(str(n), "7") for n in range(4, 11)])

    def test_past_the_cap_the_total_is_stated(self):
        from spark_analysis import store
        self.patch(store, "BAD_LINES_LISTED", 3)
        a, rows, text = self.run_with_bad_lines(7)
        self.assertEqual([(r["line"], r["file_bad_lines"]) for r in rows],
                         [("4", "7"), ("5", "7"), ("6", "7")])
        self.assertIn("7 bad trace lines were skipped.</b>", text)
        self.assertIn("3 named (up to 3 a file)", text)


class UnreadableNamedTests(unittest.TestCase):
    """A truncated .gz read by Spark's workers is named and skipped: the
    error's text quotes the raising source line before the message."""

    def test_the_message_not_the_quoted_source_line(self):
        from spark_analysis.store import unreadable_named
        name = "file:/t/broken.jsonl.gz"
        text = ("PythonException: An exception was thrown from the Python worker:\n"
                "  File \"ingest.py\", line 176, in _tables_of\n"
                "    raise OSError(f\"unreadable trace file {row['name']}: \"\n"
                f"OSError: unreadable trace file {name}: EOFError: Compressed file ended\n")
        found = unreadable_named(text, {name: "/t/broken.jsonl.gz"})
        self.assertEqual((found.group(1), found.group(2)),
                         (name, "EOFError: Compressed file ended"))
        self.assertIsNone(unreadable_named(text, {"file:/t/other.gz": "/t/other.gz"}))
