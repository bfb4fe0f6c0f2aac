"""The small-window engine (spark_analysis.smallwindow, DuckDB) against Spark.

Both engines run the whole pipeline over the same traces; every table
each writes, the summary rows the report is drawn from and the chart
series must be the same, column for column and type for type. The
traces: the hand-made federation of test_spark_analysis (answers worked
out by hand there, against Spark), a simulated nine-router federation
with a cycle and clock skew, and a window cut inside minutes (--since /
--until), where the per-minute counts come from two sources in Spark.
"""

import io
import math
import os

from twisted.trial import unittest

from elvin.test.test_spark_analysis import T, _tempdir, spark_session, write_handmade
from spark_analysis import smallwindow, synth


def _skip_without_duckdb():
    if not smallwindow.available():
        raise unittest.SkipTest("DuckDB is not installed")


# tables of what is rare (the truth traces have rows in each): empty is no warning
RARE = {"unsent", "duplicate_deliveries", "duplicate_delivery_totals"}
_traces = {}           # name -> the traces ``make`` wrote
_runs = {}             # (name, engine) -> its Analysis
_said = {}             # (name, engine) -> its run's progress output
_spark_starts = {}     # name -> times the Spark run of run_one called its start

#: Traces whose Spark run is the command line's for a window too big for
#: DuckDB (engine "auto", the window past SMALL_WINDOW_RECORDS): the new
#: lines are read here, then Spark is started for the analysis. One run is
#: then both HandmadeAgreementTests' and WithoutSparkTests' big window's
#: (a Spark run is most of either test's time). The DuckDB run still reads
#: the traces with Spark's tasks: the two runs agreeing holds the two
#: readers equal too (test_lines_read_here_equal_lines_read_by_spark holds
#: their tables equal on other traces).
READ_HERE_THEN_SPARK = {"sw-handmade"}


def run_one(name, make, engine, **kwargs):
    """One engine's Analysis over the traces ``make(dir)`` writes (each
    engine run once, when first asked for: a test needing only DuckDB's
    does not wait for Spark's).

    The Spark run is given a callable that starts Spark (as the command
    line gives one), its calls counted in ``_spark_starts``; the DuckDB run
    the session itself (so it reads the traces with Spark's tasks, as the
    Spark run does but for READ_HERE_THEN_SPARK)."""
    if (name, engine) not in _runs:
        spark = spark_session()
        _skip_without_duckdb()
        from spark_analysis import pipeline
        if name not in _traces:
            _traces[name] = _tempdir(name)
            make(_traces[name])
        _spark_starts.setdefault(name, 0)

        def start():
            _spark_starts[name] += 1
            return spark
        out = _tempdir(f"{name}-{engine}")
        said = io.StringIO()
        here = engine == "spark" and name in READ_HERE_THEN_SPARK
        small = smallwindow.SMALL_WINDOW_RECORDS
        if here:
            smallwindow.SMALL_WINDOW_RECORDS = 3
        try:
            _runs[(name, engine)] = pipeline.run(start if engine == "spark" else spark,
                                                 _traces[name], out, progress=said,
                                                 engine="auto" if here else engine,
                                                 report=False, **kwargs)
        finally:
            smallwindow.SMALL_WINDOW_RECORDS = small
        _said[(name, engine)] = said.getvalue()
    return _runs[(name, engine)]


def run_both(name, make, **kwargs):
    """(spark's Analysis, duckdb's Analysis) over the traces ``make(dir)`` writes."""
    return run_one(name, make, "spark", **kwargs), run_one(name, make, "duckdb", **kwargs)


def _rows(path):
    """A table's rows, sorted, as pyarrow reads them (a Spark job per table
    read was most of this check's time): timestamps as UTC instants in
    microseconds, the way Spark reads both Spark's INT96 columns and
    DuckDB's UTC timestamps (the types as Spark sees them are compared
    apart)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    table = ds.dataset(path, format="parquet", exclude_invalid_files=True).to_table()
    utc = pa.timestamp("us", tz="UTC")
    columns = [column.cast(utc, safe=False) if pa.types.is_timestamp(column.type) else column
               for column in table.columns]
    table = pa.table(columns, names=table.column_names)
    return sorted(repr(tuple(row.values())) for row in table.to_pylist())


def spark_dtypes(spark, path):
    """``spark.read.parquet(path).dtypes``, without its job.

    Spark infers a Parquet table's schema in a job of its own, which reads
    one file's footer and converts its schema (ParquetFileFormat
    .readSchemaFromFooter, with a converter made from the session's SQL
    settings): one job per table read was most of the agreement check's
    time (60 jobs, some 5 s of a loaded machine's). Here the driver makes
    the same calls itself for a table of Parquet files in one directory;
    a partitioned table (partition columns come from the directory names),
    or a Spark whose internals have moved, gets ``spark.read`` itself."""
    import glob
    from pyspark.sql.types import StructType
    files = sorted(glob.glob(os.path.join(path, "*.parquet")))
    if files and not any(os.path.isdir(os.path.join(path, n)) for n in os.listdir(path)):
        try:
            jvm = spark._jvm
            parquet = jvm.org.apache.spark.sql.execution.datasources.parquet
            file = jvm.org.apache.hadoop.fs.Path(files[0])
            footer = jvm.org.apache.parquet.hadoop.ParquetFileReader.readFooter(
                spark._jsc.hadoopConfiguration(), file)
            converter = parquet.ParquetToSparkSchemaConverter(
                spark._jsparkSession.sessionState().conf())
            schema = parquet.ParquetFileFormat.readSchemaFromFooter(
                jvm.org.apache.parquet.hadoop.Footer(file, footer), converter)
            import json
            return [(f.name, f.dataType.simpleString())
                    for f in StructType.fromJson(json.loads(schema.json())).fields]
        except Exception:         # (py4j: internals renamed) the public way, below
            pass
    return spark.read.parquet(path).dtypes


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


class _Agreement:
    """Every table, summary and series the same from both engines.

    One test makes every check (a failure's traceback names it): the two
    runs are the expensive part, and under ``trial -j`` the tests of one
    class go to different processes, each of which would run both engines
    again for a check of its own."""

    name = None
    kwargs: dict = {}

    def both(self):
        return run_both(self.name, self.make, **self.kwargs)

    def test_both_engines_agree(self):
        self.check_spark_is_started_when_the_engine_is_spark()
        self.check_the_same_tables_are_written()
        self.check_every_table_has_the_same_columns_and_types()
        self.check_every_table_has_the_same_rows()
        self.check_summary_rows_are_the_same_in_the_same_order()
        self.check_the_csv_files_are_the_same()
        self.check_window_and_series_are_the_same()

    def check_spark_is_started_when_the_engine_is_spark(self):
        # (run_one's Spark run is given a callable that starts Spark)
        self.both()
        self.assertEqual(_spark_starts[self.name], 1)

    def check_the_same_tables_are_written(self):
        a, b = self.both()
        self.assertEqual(sorted(a.written), sorted(b.written))

    def check_every_table_has_the_same_columns_and_types(self):
        spark = spark_session()
        a, b = self.both()
        # (spark_dtypes is what spark.read gives: held to it on a table with
        # timestamps, which Spark writes as INT96 and DuckDB as UTC instants)
        timed = next(name for name in a.written if name != "events" and
                     any(t.startswith("timestamp") for _, t in spark_dtypes(spark, a.parquet(name))))
        for run in (a, b):
            self.assertEqual(spark_dtypes(spark, run.parquet(timed)),
                             spark.read.parquet(run.parquet(timed)).dtypes, timed)
        for name in a.written:
            if name == "events":
                continue
            with self.subTest(table=name):
                self.assertEqual(spark_dtypes(spark, a.parquet(name)),
                                 spark_dtypes(spark, b.parquet(name)), name)

    def check_every_table_has_the_same_rows(self):
        a, b = self.both()
        empty = []
        for name in a.written:
            if name == "events":
                continue
            rows_a, rows_b = _rows(a.parquet(name)), _rows(b.parquet(name))
            if not rows_a and name not in RARE:
                empty.append(name)
            self.assertEqual(rows_a, rows_b, name)
        # (a window may hold no drops, say; not many empty tables)
        self.assertLessEqual(len(empty), 3, empty)

    def check_summary_rows_are_the_same_in_the_same_order(self):
        a, b = self.both()
        self.assertEqual(sorted(a.tables), sorted(b.tables))
        for name in a.tables:
            self.assertEqual(len(a.tables[name]), len(b.tables[name]), name)
            for ra, rb in zip(a.tables[name], b.tables[name]):
                self.assertEqual(list(ra), list(rb), name)
                for key in ra:
                    self.assertTrue(_same(ra[key], rb[key]), f"{name}.{key}: {ra} != {rb}")

    def check_the_csv_files_are_the_same(self):
        a, b = self.both()
        for name in sorted(os.listdir(os.path.join(a.out_dir, "csv"))):
            if name == "files.csv":
                continue
            with open(os.path.join(a.out_dir, "csv", name)) as fa, \
                    open(os.path.join(b.out_dir, "csv", name)) as fb:
                self.assertEqual(fa.read(), fb.read(), name)

    def check_window_and_series_are_the_same(self):
        a, b = self.both()
        self.assertEqual((a.records, a.start_us, a.end_us, a.latency_sample),
                         (b.records, b.start_us, b.end_us, b.latency_sample))
        self.assertEqual(sorted(a.series), sorted(b.series))
        for name in a.series:
            if name in ("bucket_us", "fine_us"):
                self.assertEqual(a.series[name], b.series[name])
                continue
            key = (lambda r: sorted(r.items()))
            self.assertEqual(sorted(a.series[name], key=key), sorted(b.series[name], key=key),
                             name)


class HandmadeAgreementTests(_Agreement, unittest.SynchronousTestCase):
    """(Spark's run reads the lines here, then analyses: READ_HERE_THEN_SPARK.)"""

    name = "sw-handmade"
    kwargs = {"since_us": T(0), "until_us": T(600)}
    timeout = 600

    def make(self, traces):
        write_handmade(traces)


class SyntheticAgreementTests(_Agreement, unittest.SynchronousTestCase):
    name = "sw-synth"
    timeout = 600

    def make(self, traces):
        # (12,700 records: every table has rows, as with five times as many)
        synth.generate(traces, routers=9, clients=30, rate=15, seconds=70, seed=11,
                       extra_links=1)


class CutWindowAgreementTests(_Agreement, unittest.SynchronousTestCase):
    """A window that starts and ends inside minutes, with latencies sampled."""
    name = "sw-cut"
    kwargs = {"since_us": T(20, 500_000), "until_us": T(130, 250_000), "latency_sample": 2}
    timeout = 600

    def make(self, traces):
        synth.generate(traces, routers=5, clients=20, rate=15, seconds=150, seed=7,
                       start_us=T(0))


class EngineChoiceTests(unittest.SynchronousTestCase):
    """auto picks DuckDB for a small local window and Spark otherwise (a
    window past SMALL_WINDOW_RECORDS: WithoutSparkTests'
    test_a_big_window_reads_here_then_starts_spark_for_the_analysis)."""

    timeout = 600

    def test_auto_uses_duckdb_for_a_small_window_given_a_local_session(self):
        spark = spark_session()
        _skip_without_duckdb()
        from spark_analysis import pipeline
        traces = _tempdir("sw-auto")
        synth.generate(traces, routers=3, clients=6, rate=20, seconds=30, seed=2)
        out = _tempdir("sw-auto-out")
        said = io.StringIO()
        pipeline.run(spark, traces, out, progress=said, report=False)
        self.assertIn("analysed in DuckDB", said.getvalue())
        self.assertNotIn("side by side", said.getvalue())

    def test_an_unknown_engine_is_refused(self):
        from spark_analysis import pipeline
        with self.assertRaises(ValueError) as caught:
            pipeline.run(None, "/nonexistent", _tempdir("sw-bad"), engine="pandas")
        self.assertIn("pandas", str(caught.exception))

    def test_duckdb_refuses_a_remote_table_by_name(self):
        from spark_analysis import pipeline
        self.patch(smallwindow, "available", lambda: True)
        with self.assertRaises(ValueError) as caught:
            pipeline._small_window_engine("duckdb", "s3a://bucket/tables")
        self.assertIn("s3a://bucket/tables", str(caught.exception))
        self.assertFalse(pipeline._small_window_engine("auto", "s3a://bucket/tables"))
        self.assertFalse(pipeline._small_window_engine("spark", "/tmp/tables"))
        # a cluster given: auto leaves the analysis to it; duckdb still asks for DuckDB
        self.assertFalse(pipeline._small_window_engine("auto", "/tmp/tables", False))
        self.assertTrue(pipeline._small_window_engine("duckdb", "/tmp/tables", False))
        self.assertTrue(pipeline._small_window_engine("auto", "/tmp/tables", True))


class EngineCommandLineTests(unittest.SynchronousTestCase):
    """--engine duckdb where DuckDB cannot serve is refused before anything runs."""

    def test_duckdb_on_a_remote_table_is_a_usage_error(self):
        from elvin.test.test_spark_analysis import run_cli
        self.patch(smallwindow, "available", lambda: True)
        status, err = run_cli("/tmp", "--out", "/tmp/x", "--engine", "duckdb",
                              "--tables", "s3a://bucket/tables")
        self.assertEqual(status, 2)
        self.assertIn("--engine duckdb: the tables are not on a local file system "
                      "(s3a://bucket/tables)", err)

    def test_an_unknown_engine_is_a_usage_error(self):
        from elvin.test.test_spark_analysis import run_cli
        status, err = run_cli("/tmp", "--out", "/tmp/x", "--engine", "pandas")
        self.assertEqual(status, 2)
        self.assertIn("invalid choice: 'pandas'", err)


class SparkRoundTests(unittest.SynchronousTestCase):
    """Rounding as Spark's F.round does it (no DuckDB, no Spark)."""

    def test_half_up_on_the_shortest_decimal_form(self):
        self.assertEqual(smallwindow.spark_round(2.675, 2), 2.68)   # binary 2.67499...
        self.assertEqual(smallwindow.spark_round(0.125, 2), 0.13)
        self.assertEqual(smallwindow.spark_round(-0.125, 2), -0.13)
        self.assertEqual(smallwindow.spark_round(1234.5, 0), 1235.0)
        self.assertIsNone(smallwindow.spark_round(None, 1))

    def test_no_negative_zero(self):
        self.assertEqual(repr(smallwindow.spark_round(-0.01, 1)), "0.0")


class SortedRowsTests(unittest.SynchronousTestCase):
    """Summary rows sorted as Spark's orderBy in pipeline._save sorts them."""

    def test_descending_nulls_last_then_strings_ascending_nulls_first(self):
        from spark_analysis.pipeline import _sorted_rows
        rows = [{"n": 1, "a": "x"}, {"n": None, "a": "a"}, {"n": 5, "a": "b"},
                {"n": 5, "a": None}, {"n": 5, "a": "a"}]
        got = _sorted_rows(rows, ["n"], True, ["n", "a"], {"n": "other", "a": "string"})
        self.assertEqual([(r["n"], r["a"]) for r in got],
                         [(5, None), (5, "a"), (5, "b"), (1, "x"), (None, "a")])

    def test_ascending_nulls_last(self):
        from spark_analysis.pipeline import _sorted_rows
        rows = [{"r": "b", "d": None}, {"r": "a", "d": 3}, {"r": "a", "d": None},
                {"r": "a", "d": 1}]
        got = _sorted_rows(rows, ["r", "d"], False, ["r", "d"], {"r": "string", "d": "other"})
        self.assertEqual([(r["r"], r["d"]) for r in got],
                         [("a", 1), ("a", 3), ("a", None), ("b", None)])


class WithoutSparkTests(unittest.SynchronousTestCase):
    """A small window of local traces needs no Spark: the new lines are read
    by this process's workers (ingest._ingest_here) and DuckDB analyses them."""

    timeout = 600

    def no_spark(self):
        raise AssertionError("Spark was started")

    def test_a_small_run_never_starts_spark(self):
        _skip_without_duckdb()
        from spark_analysis import pipeline
        traces = _tempdir("sw-nospark")
        write_handmade(traces)
        out = _tempdir("sw-nospark-out")
        a = pipeline.run(self.no_spark, traces, out, T(0), T(600), progress=None,
                         report=False)
        # the same answers as a run with Spark on the same traces (which read
        # them with Spark's tasks)
        b = run_one("sw-handmade", write_handmade, "duckdb", since_us=T(0), until_us=T(600))
        for name in b.tables:
            self.assertEqual(a.tables[name], b.tables[name], name)
        self.assertEqual((a.records, a.bad_lines), (b.records, b.bad_lines))
        self.assertEqual(sorted((os.path.basename(f), *rest) for f, *rest in a.bad_examples),
                         sorted((os.path.basename(f), *rest) for f, *rest in b.bad_examples))
        self.assertTrue(a.bad_examples)
        self.assertEqual([(os.path.basename(p), r) for p, r in a.unreadable],
                         [(os.path.basename(p), r) for p, r in b.unreadable])
        self.assertTrue(a.unreadable)

    def test_a_window_read_from_its_files_gives_the_same_tables(self):
        """A window too big to load into DuckDB's memory is read from its
        Parquet files by every query: the same tables and series."""
        _skip_without_duckdb()
        from spark_analysis import pipeline
        self.patch(smallwindow, "LOADED_RECORDS", 0)
        traces = _tempdir("sw-view")
        write_handmade(traces)
        a = pipeline.run(self.no_spark, traces, _tempdir("sw-view-out"), T(0), T(600),
                         progress=None, report=False)
        b = run_one("sw-handmade", write_handmade, "duckdb", since_us=T(0), until_us=T(600))
        self.assertEqual(sorted(a.tables), sorted(b.tables))
        for name in b.tables:
            self.assertEqual(a.tables[name], b.tables[name], name)
        self.assertEqual(sorted(a.series), sorted(b.series))
        key = (lambda r: sorted(r.items()))
        for name, rows in b.series.items():
            if isinstance(rows, list):      # (rows in any order, as the charts take them)
                self.assertEqual(sorted(a.series[name], key=key), sorted(rows, key=key), name)
            else:
                self.assertEqual(a.series[name], rows, name)

    def test_a_big_window_reads_here_then_starts_spark_for_the_analysis(self):
        """Spark is started once, after the lines are read here, and gives
        the same tables as DuckDB's run over the same traces. The run is
        HandmadeAgreementTests' Spark run (READ_HERE_THEN_SPARK), made once
        a test process; that class holds it equal to DuckDB's, table for
        table."""
        a = run_one("sw-handmade", write_handmade, "spark", since_us=T(0), until_us=T(600))
        self.assertEqual(_spark_starts["sw-handmade"], 1)
        said = _said[("sw-handmade", "spark")]
        self.assertIn("side by side", said)
        self.assertNotIn("analysed in DuckDB", said)
        b = run_one("sw-handmade", write_handmade, "duckdb", since_us=T(0), until_us=T(600))
        self.assertEqual(sorted(a.tables), sorted(b.tables))
        for name in b.tables:
            self.assertEqual(a.tables[name], b.tables[name], name)

    def test_lines_read_here_equal_lines_read_by_spark(self):
        spark = spark_session()
        from spark_analysis import ingest
        from spark_analysis.store import TraceStore
        traces = _tempdir("sw-ingest")
        synth.generate(traces, routers=4, clients=10, rate=30, seconds=70, seed=4,
                       use_gzip=True)
        synth.generate(os.path.join(traces, "plain"), routers=2, clients=4, rate=10,
                       seconds=20, seed=5)
        files = ingest.list_trace_files(traces)
        here, there = _tempdir("sw-ingest-here"), _tempdir("sw-ingest-spark")
        a = TraceStore(None, here).update(files)
        b = TraceStore(spark, there).update(files)
        self.assertEqual((a.records, a.bad, a.file_stats), (b.records, b.bad, b.file_stats))
        self.assertGreater(a.records, 1000)

        def table(root, name, order):
            df = spark.read.parquet(os.path.join(root, name))
            return sorted(map(repr, map(tuple, df.select(*order).collect())))
        columns = [c for c in spark.read.parquet(os.path.join(there, "events")).columns]
        self.assertEqual(table(here, "events", columns), table(there, "events", columns))
        minutes = spark.read.parquet(os.path.join(there, "event_minutes")).columns
        self.assertEqual(table(here, "event_minutes", minutes),
                         table(there, "event_minutes", minutes))

    def test_the_command_line_runs_a_small_window_without_spark(self):
        _skip_without_duckdb()
        import subprocess
        import sys
        traces = _tempdir("sw-cli")
        synth.generate(traces, routers=3, clients=6, rate=20, seconds=40, seed=6)
        out = _tempdir("sw-cli-out")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=root)
        done = subprocess.run([sys.executable, "-m", "spark_analysis", traces, "--out", out,
                               "--last", "1m"], capture_output=True, text=True, timeout=300,
                              env=env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("starting Spark", done.stderr)
        self.assertIn("analysed in DuckDB", done.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "report.html")))
        self.assertFalse(os.path.exists(os.path.join(out, "spark-jvm.log")))
