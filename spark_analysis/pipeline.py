"""The whole analysis: trace directory in, report directory out.

``run(spark, trace_dir, out_dir, ...)`` runs the stages in order, printing
one progress line per stage, and returns an ``Analysis`` holding the
small result tables (as lists of dicts) the report and the tests use.

Output layout (``out_dir``)::

    report.html            the report (self-contained: charts embedded)
    charts/*.png           the charts
    csv/*.csv              summary tables
    parquet/<table>/       every table, Parquet (events: status=ok|bad);
                           elsewhere if tables_dir is given
"""

import csv
import dataclasses
import datetime
import os
import sys
import time
from typing import IO, Optional

from spark_analysis import ingest, jobs, sharedsql, skew, smallwindow
from spark_analysis.store import TraceStore
from spark_analysis import traceformat as tf

__all__ = ["Analysis", "Request", "run", "CSV_TABLES"]

# table -> (sort columns, descending?, row limit for CSV and report)
CSV_TABLES = {
    "overview": (["router", "event"], False, None),
    "links": (["notifications"], True, None),
    "link_uptime": (["router", "peer"], False, None),
    "filter_effect": (["considered"], True, None),
    "flood": (["flood_bytes"], True, None),
    "drops": (["drops"], True, None),
    "unsent": (["router", "peer", "ts_us"], False, None),
    "duplicate_deliveries": (["router", "first_us", "dkey"], False, 5000),
    "duplicate_delivery_totals": (["router"], False, None),
    "hops": (["hops"], False, None),
    "routes": (["deliveries"], True, 5000),
    "hop_latency": (["sender", "receiver"], False, None),
    "attr_sets": (["published", "distinct"], True, 5000),
    "filter_churn": (["replaces"], True, None),
    "filter_health": (["considered"], True, None),
    "link_outages": (["router", "peer", "down_us"], False, 5000),
}


class Analysis:
    """What a run produced: paths, counts, and the small tables as dicts."""

    def __init__(self, out_dir, tables_dir=None):
        self.out_dir = out_dir
        self.tables_dir = tables_dir or os.path.join(out_dir, "parquet")
        self.tables = {}          # name -> [dict] (CSV tables, sorted, limited)
        self.series = {}          # chart data -> [dict]
        self.files = []           # [(path, size)] read
        self.unreadable = []      # [(path, reason)] skipped: not readable gzip
        self.copies = []          # [(path, kept path, how)] skipped: a copy of another file
        self.skewed = []          # [skew.Skewed]: routers far off, records left out
        self.file_stats = {}      # path -> (ok, bad)
        self.bad_examples = []    # [(file, line, reason, text)]
        self.aside = 0            # valid records set aside: dated far from their file's
        self.aside_examples = []  # [(file, line or None, ts_us)]
        self.records = 0
        self.bad_lines = 0
        self.start_us = self.end_us = None
        self.since_us = self.until_us = None
        self.trace_dir = None
        self.stage_seconds = {}
        self.charts = {}          # name -> path of PNG
        self.chart_overlaps = {}  # name -> [(text, text)] labels drawn over each other
        self.written = []         # Parquet tables written
        self.batch = None         # store.BatchResult: what this run read
        self.cached = []          # DataFrames cached during the run
        self.previous = None      # the previous report's summary.json, if any
        self.wire_records = None  # FedNotify crossings in the window (either end), when counted
        self.latency_sample = 1   # latencies timed on 1 in this many notifications

    def parquet(self, name):
        return self.tables_dir.rstrip("/") + "/" + name

    def table_names(self):
        return sorted(self.written)


class _Progress:
    def __init__(self, stages, stream, spark=None):
        self.stages, self.stream, self.n, self.spark = stages, stream, 0, spark

    def start(self, text):
        self.n += 1
        self.t0 = time.monotonic()
        self.text = text
        if self.spark is not None:
            # names the Spark jobs of this stage in the UI and the event log
            self.spark.sparkContext.setJobDescription(f"[{self.n}] {text}")
        if self.stream:
            print(f"[{self.n}/{self.stages}] {text} ...", file=self.stream, flush=True)

    def done(self, detail=""):
        elapsed = time.monotonic() - self.t0
        if self.stream:
            extra = f": {detail}" if detail else ""
            print(f"      done in {elapsed:.1f} s{extra}", file=self.stream, flush=True)
        return elapsed


def _rows(df):
    return [row.asDict(recursive=True) for row in df.collect()]


def _write_csv(path, rows, columns=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if columns is None:
        columns = list(rows[0].keys()) if rows else []
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_value(row.get(c)) for c in columns])


def _csv_value(value):
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    return value


def _save(spark, analysis, name, df):
    """Write ``df`` as Parquet and return it; summary tables also go to CSV.

    A summary table (CSV_TABLES) is small: it is computed once, sorted, by
    the one query that collects it, and where the tables live on a local
    file system its Parquet copy is written here from those rows (a Spark
    write costs a job and its floor of tenths of a second, each table).
    Bigger tables, and any table on remote storage, are computed once by
    Spark's write into the cache, which later uses read.
    """
    from pyspark.sql import functions as F
    path = analysis.parquet(name)
    if name in CSV_TABLES:
        order, descending, limit = CSV_TABLES[name]
        cols = [F.col(c).desc_nulls_last() if descending else F.col(c).asc_nulls_last()
                for c in order]
        # deterministic tie-break on the remaining key-like string columns
        ties = [c for c, t in df.dtypes if t == "string" and c not in order]
        cap = limit or 10**6
        if ingest._is_local(path) and _arrow_writable(df.schema):
            # (a limit makes it one top-k job rather than a sampled range sort)
            rows = _rows(df.orderBy(*cols, *ties).limit(cap + 1))
            if len(rows) <= cap:
                _write_parquet_rows(ingest._local(path), df.schema, rows)
                analysis.written.append(name)
                return _summary(analysis, name, df, rows)
    df = df.cache()
    analysis.cached.append(df)
    df.write.mode("overwrite").parquet(path)
    analysis.written.append(name)
    if name not in CSV_TABLES:
        return df
    return _summary(analysis, name, df, _rows(df.orderBy(*cols, *ties).limit(cap)))


def _summary(analysis, name, df, rows):
    """Keep a summary table's (sorted, limited) rows for the report, and its CSV."""
    analysis.tables[name] = rows
    _write_csv(os.path.join(analysis.out_dir, "csv", name + ".csv"), rows, df.columns)
    return df


def _arrow_writable(schema):
    """True when every column maps to Arrow without a time zone question."""
    from pyspark.sql import types as T
    plain = (T.StringType, T.LongType, T.IntegerType, T.DoubleType, T.BooleanType)
    return all(isinstance(f.dataType, plain) for f in schema.fields)


def _write_parquet_rows(path, schema, rows):
    """A Parquet table directory, as Spark would leave it, from collected rows."""
    import shutil
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    table = pa.Table.from_pylist(rows, schema=to_arrow_schema(schema))
    pq.write_table(table, os.path.join(path, "part-00000.zstd.parquet"), compression="zstd")
    open(os.path.join(path, "_SUCCESS"), "w").close()


def _bucket_us(start_us, end_us, points=360):
    """A chart bucket: whole minutes, at most ~``points`` buckets in the window."""
    minutes = max(1, (end_us - start_us) // (jobs.MINUTE_US * points) + 1)
    for nice in (1, 2, 5, 10, 15, 30, 60, 120, 240, 360, 720, 1440):
        if nice >= minutes:
            return nice * jobs.MINUTE_US
    return minutes * jobs.MINUTE_US


@dataclasses.dataclass
class Request:
    """What a run is asked to do (``run``'s arguments but the session)."""
    trace_dir: str
    out_dir: str
    since_us: Optional[int] = None
    until_us: Optional[int] = None
    progress: Optional[IO[str]] = None
    files: Optional[list] = None          # [(path, size)]; None: list TRACE_DIR
    report: bool = True
    max_bad_files: int = 10
    tables_dir: Optional[str] = None
    rebuild: bool = False
    last_us: Optional[int] = None
    latency_sample: Optional[int] = None
    engine: str = "auto"

    def check(self):
        """Refuse contradictory or unknown settings before anything is read."""
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, "
                             f"not {self.engine!r}")
        if self.latency_sample is not None:
            self.latency_sample = jobs.checked_sample(self.latency_sample)
        if self.last_us is not None and (self.since_us is not None
                                         or self.until_us is not None):
            raise ValueError("last_us excludes since_us and until_us")


def run(spark, trace_dir, out_dir, since_us=None, until_us=None, progress=sys.stderr,
        files=None, report=True, max_bad_files=10, tables_dir=None, rebuild=False,
        last_us=None, latency_sample=None, engine="auto"):
    """Run every stage; returns the Analysis. Raises ingest.TraceInputError.

    ``out_dir`` is a local directory (the driver writes the report, charts
    and CSV there); the Parquet tables go to ``tables_dir``, by default
    ``out_dir/parquet`` -- on a cluster, a URI every executor can write to.
    ``last_us`` (instead of ``since_us``/``until_us``): the window is the
    last ``last_us`` microseconds of the table, up to its newest record.
    ``latency_sample``: time latencies on 1 in this many notifications
    (1: every one); by default (None) all of them up to
    ``jobs.LATENCY_SAMPLE_TARGET`` wire records in the window, a sample
    of about that many beyond (``jobs.latency_sample``).
    ``spark``: a SparkSession, or a callable that starts one, called only
    if the run needs Spark (a small window of local traces and tables, with
    DuckDB to analyse it, does not: the new lines are read into the table by
    this process's own workers, ``ingest._ingest_here``).
    ``engine``: what runs the analysis stages over the window -- "spark",
    "duckdb" (``smallwindow``: a local table only), or "auto": DuckDB for
    a window of up to ``smallwindow.SMALL_WINDOW_RECORDS`` records of a
    local table when DuckDB is installed and Spark is local (a session on
    a cluster keeps the analysis), else Spark.
    """
    request = Request(trace_dir, out_dir, since_us, until_us, progress, files, report,
                      max_bad_files, tables_dir, rebuild, last_us, latency_sample, engine)
    request.check()
    return _Run(spark, request).execute()


class _Run:
    """One run: its request, the Spark session (started on first need), the
    Analysis it fills in, and the table store it reads. ``execute`` runs the
    steps in order; each method is one of them."""

    def __init__(self, spark, request):
        self.request = request
        self.lazy = _LazySpark(spark)
        self.analysis = Analysis(request.out_dir, request.tables_dir)
        self.analysis.trace_dir = request.trace_dir
        self.analysis.since_us, self.analysis.until_us = request.since_us, request.until_us
        self.since_us, self.until_us = request.since_us, request.until_us
        self.steps = _Progress(8 if request.report else 7, request.progress,
                               self.lazy.get() if self.lazy.started else None)
        self.store = None
        self.batch = None
        self.listed_files = []

    def execute(self):
        try:
            return self._execute()
        finally:
            if self.store is not None:
                self.store.stop_reading()

    def _execute(self):
        os.makedirs(self.request.out_dir, exist_ok=True)
        if self.request.report:
            from spark_analysis import report as report_module
            # (it imports matplotlib while Spark works)
            report_module.start_chart_worker()
        self.find_files()
        self.read_new_lines()
        self.account_for_files()
        self.check_has_events()
        small = self.choose_window()
        if small:
            return _run_small(self.analysis, self.steps, self.batch, self.request.trace_dir,
                              self.since_us, self.until_us, self.request.latency_sample,
                              self.request.report)
        return self.analyse_in_spark()

    def find_files(self):
        """Stage 1: the trace files, less those whose names rule them out."""
        request, steps = self.request, self.steps
        steps.start(f"finding trace files under {request.trace_dir}")
        files = request.files
        if files is None:
            files = ingest.list_trace_files(
                request.trace_dir,
                None if ingest._is_local(request.trace_dir) else self.lazy.get())
        listed = len(files)
        files = ingest.prune_by_name(files, self.since_us, self.until_us)
        if not files:
            raise ingest.TraceInputError(
                f"none of the {listed} trace files under {request.trace_dir} can hold "
                f"records in the requested time range")
        self.listed_files = list(files)
        self.analysis.files = files
        total = sum(size for _, size in files)
        self.analysis.stage_seconds["files"] = steps.done(
            f"{len(files)} files, {total / 1e6:.1f} MB"
            + (f" ({listed - len(files)} skipped by name)" if listed > len(files) else ""))

    def read_new_lines(self):
        """Stage 2, first half: what is new in the files goes into the table."""
        request, analysis = self.request, self.analysis
        self.steps.start("reading new trace lines into the table (JSON -> Parquet)")
        # new lines of local files into a local table: read here, unless Spark is
        # up anyway (or may be needed: not an engine that can do without it)
        here = (not self.lazy.started and request.engine != "spark"
                and ingest._is_local(analysis.tables_dir)
                and all(ingest._is_local(path) for path, _ in self.listed_files))
        store = TraceStore(None if here else self.lazy.get(), analysis.tables_dir)
        batch = store.update(self.listed_files, waiting=lambda text: _warn(request.progress, text),
                             rebuild=request.rebuild)
        # from here on the table is read: no merge of its small files may
        # replace them under the queries (``TraceStore.compact``)
        self.store = store
        store.start_reading()
        self.batch = analysis.batch = batch
        analysis.written.append("events")
        for text in batch.warnings:
            _warn(request.progress, text)
        # A truncated or corrupt .gz is named and skipped, never fatal: one bad
        # file must not lose the analysis of the others.
        analysis.unreadable = batch.unreadable
        gone = {path for path, _ in batch.unreadable}
        analysis.files = [(path, size) for path, size in analysis.files if path not in gone]
        for path, reason in batch.unreadable:
            _warn(request.progress, f"{_display(path)}: {reason}; skipped")
        # The same traces collected twice are read once (TraceStore: _copies).
        analysis.copies = batch.copies
        gone = {path for path, _, _ in batch.copies}
        analysis.files = [(path, size) for path, size in analysis.files if path not in gone]
        for path, kept, how in batch.copies:
            _warn(request.progress, f"{_display(path)}: {how} of {_display(kept)}; "
                                    f"not read")

    def account_for_files(self):
        """Every file listed with its records, bad lines and records set aside
        (warnings, ``csv/files.csv``, ``csv/bad_lines.csv``)."""
        request, analysis, batch = self.request, self.analysis, self.batch
        progress, listed_files = request.progress, self.listed_files
        known = {}
        for entry in self.store.entries():
            known[_same_file(entry["path"])] = entry
        stats, examples = {}, []
        for path, _ in listed_files:
            entry = known.get(_same_file(path))
            if entry is not None:
                stats[path] = (entry.get("records", 0), entry.get("bad", 0))
                examples += [(path, n, r, t) for n, r, t in entry.get("examples", [])]
        analysis.file_stats = stats
        # valid records dated far from the rest of their file: set aside (kept in
        # the table, out of the analysis), named with their file and line
        aside = {}
        for path, _ in listed_files:
            entry = known.get(_same_file(path))
            if entry is not None and entry.get("aside"):
                aside[path] = entry["aside"]
                analysis.aside_examples += [(path, line, ts)
                                            for line, ts in entry.get("aside_examples", [])]
        analysis.aside = sum(aside.values())
        for file, line, ts in batch.aside_examples:
            where = f" line {line}" if line is not None else ""
            _warn(progress, f"{_display(file)}{where}: dated {tf.format_time(ts)}, far from "
                            f"the rest of its file; set aside")
        if batch.aside and progress:
            _warn(progress, f"{batch.aside} records dated far from the rest of their files "
                            f"set aside (not analysed; see csv/files.csv)")
        analysis.bad_lines = sum(bad for _, bad in stats.values())
        bad_files = sorted(f for f, (_, bad) in stats.items() if bad)
        # every bad line named (up to store.BAD_LINES_LISTED a file) goes to
        # csv/bad_lines.csv; the progress output names five a file, of the
        # first max_bad_files files with new ones
        analysis.bad_examples = examples
        bad_now = {f for f, (_, bad) in batch.file_stats.items() if bad}
        warned = set(sorted(f for f in bad_files if f in bad_now)[:request.max_bad_files])
        shown = {}
        for file, line, reason, text in analysis.bad_examples:
            if file in warned and shown.get(file, 0) < 5:
                shown[file] = shown.get(file, 0) + 1
                _warn(progress, f"{_display(file)} line {line}: {reason}; skipped")
        if analysis.bad_lines and progress:
            _warn(progress, f"{analysis.bad_lines} bad lines in {len(bad_files)} files "
                            f"counted and skipped ({len(analysis.bad_examples)} named in "
                            f"csv/bad_lines.csv)")
        # Every file read is listed (an empty one with 0 records), and every
        # file skipped as unreadable, with why.
        unreadable = {path for path, _ in batch.unreadable}
        unreadable |= {path for path, _, _ in batch.copies}
        named = {}
        for path, line, ts in analysis.aside_examples:
            named.setdefault(path, []).append(
                (f"line {line}: " if line is not None else "") + tf.format_time(ts))
        rows = [{"file": path, "records": stats.get(path, (0, 0))[0],
                 "bad_lines": stats.get(path, (0, 0))[1], "set_aside": aside.get(path, 0),
                 "set_aside_first": "; ".join(named.get(path, [])), "skipped": ""}
                for path, _ in listed_files if path not in unreadable]
        rows += [{"file": path, "records": 0, "bad_lines": 0, "set_aside": 0,
                  "set_aside_first": "", "skipped": reason}
                 for path, reason in batch.unreadable]
        rows += [{"file": path, "records": 0, "bad_lines": 0, "set_aside": 0,
                  "set_aside_first": "", "skipped": f"{how} of {kept}"}
                 for path, kept, how in batch.copies]
        out_dir = request.out_dir
        _write_csv(os.path.join(out_dir, "csv", "files.csv"),
                   sorted(rows, key=lambda r: r["file"]),
                   ["file", "records", "bad_lines", "set_aside", "set_aside_first", "skipped"])
        _write_csv(os.path.join(out_dir, "csv", "bad_lines.csv"),
                   [{"file": f, "file_bad_lines": stats.get(f, (0, 0))[1], "line": n,
                     "reason": r, "text": t}
                    for f, n, r, t in analysis.bad_examples],
                   ["file", "file_bad_lines", "line", "reason", "text"])

    def check_has_events(self):
        """A table with no valid record: say why (unreadable, bad or empty files)."""
        analysis, batch, trace_dir = self.analysis, self.batch, self.request.trace_dir
        if self.store.has_events():
            return
        if len(batch.unreadable) == len(self.listed_files):
            raise ingest.TraceInputError(
                f"no readable trace files under {trace_dir}: "
                + "; ".join(f"{_display(p)}: {r}" for p, r in batch.unreadable))
        if analysis.bad_lines:
            first = analysis.bad_examples[0] if analysis.bad_examples else None
            where = (f"; first: {_display(first[0])} line {first[1]}: {first[2]}"
                     if first else "")
            raise ingest.TraceInputError(
                f"no valid trace records under {trace_dir}: {analysis.bad_lines} bad lines"
                + where)
        raise ingest.TraceInputError(f"no trace records under {trace_dir} (the files are empty)")

    def choose_window(self):
        """The window (``--last`` is known only now, after the ingest) and
        the engine: True for DuckDB, False for Spark."""
        request, analysis = self.request, self.analysis
        local_tables = ingest._local(analysis.tables_dir)
        small = _small_window_engine(request.engine, analysis.tables_dir, self.lazy.local())
        if request.last_us is not None:
            # the newest record ends the window
            if small:
                newest = smallwindow.newest_us(local_tables)
            else:
                self.store.spark = self.lazy.get()
                newest = self.store.newest_us()
            self.until_us = newest + 1
            self.since_us = self.until_us - request.last_us
            analysis.since_us, analysis.until_us = self.since_us, self.until_us
        if self.since_us is None and self.until_us is None:
            self.leave_out_skewed_routers(small)
        if small and request.engine == "auto":
            small = (smallwindow.count(local_tables, self.since_us, self.until_us)
                     <= smallwindow.SMALL_WINDOW_RECORDS)
        return small

    def leave_out_skewed_routers(self, small):
        """Without a window asked for, the period is that of the routers whose
        clocks agree (``skew``): the records of a router far off, outside it,
        are left out and named."""
        analysis = self.analysis
        if small:
            import pyarrow.dataset as ds
            path = os.path.join(ingest._local(analysis.tables_dir), "event_minutes")
            if not os.path.isdir(path):
                return
            table = ds.dataset(path, format="parquet", partitioning="hive",
                               exclude_invalid_files=True).to_table(
                columns=["router", "minute_us", "n", "first_us", "last_us"])
            grouped = table.group_by(["router", "minute_us"]).aggregate(
                [("n", "sum"), ("first_us", "min"), ("last_us", "max")])
            rows = zip(*(grouped.column(c).to_pylist() for c in
                         ("router", "minute_us", "n_sum", "first_us_min", "last_us_max")))
        else:
            from pyspark.sql import functions as F
            self.store.spark = self.lazy.get()
            rows = [tuple(r) for r in self.store.per_minute().groupBy("router", "minute_us").agg(
                F.sum("n"), F.min("first_us"), F.max("last_us")).collect()]
        period, analysis.skewed = skew.judge(rows)
        if period is None:
            return
        self.since_us, self.until_us = period[0], period[1] + 1
        for r in analysis.skewed:
            _warn(self.request.progress,
                  f"router {r.router}: its records lie far from the other routers' (its bulk "
                  f"{tf.format_time(r.bulk_first_us)} .. {tf.format_time(r.bulk_last_us)}, a "
                  f"clock set wrong?); {r.outside:,} of them, {tf.format_time(r.first_us)} .. "
                  f"{tf.format_time(r.last_us)}, are outside the period and left out")

    def analyse_in_spark(self):
        """Stages 3-7 side by side in Spark, then the report."""
        analysis, steps, store = self.analysis, self.steps, self.store
        since_us, until_us = self.since_us, self.until_us
        spark = store.spark = steps.spark = self.lazy.get()
        events = store.events(since_us, until_us)
        # every record counted per link, event and minute (summed from the counts
        # the ingest made): the window's span and size, the overview, link,
        # filter and drop tables are sums over it
        per_minute = store.per_minute(since_us, until_us).cache()
        start, end, analysis.records = jobs.window_of(events, since_us, until_us, count=True,
                                                      per_minute=per_minute)
        if not analysis.records:
            per_minute.unpersist()
            raise _no_records(self.request.trace_dir, since_us, until_us)
        analysis.start_us, analysis.end_us = start, end
        _ingest_done(steps, analysis, self.batch)
        control = jobs.control_events(events).cache()
        # one more pass counts the out records (the notifications considered for
        # each link) per origin and attribute set: the flood model's, the
        # forwarded totals' and the attribute sets' counts are sums over it
        considered = jobs.considered_counts(events).cache()
        # and the notifications published at traced routers, once each
        publications = jobs.shared(spark, sharedsql.publications(), events=events).cache()
        bucket = _bucket_us(start, end)
        analysis.series["bucket_us"] = bucket
        context = {"spark": spark, "analysis": analysis, "events": events, "start": start,
                   "end": end, "per_minute": per_minute, "control": control,
                   "considered": considered, "publications": publications,
                   "bucket": bucket,
                   "latency_sample": self.request.latency_sample}
        try:
            _run_side_by_side(spark, steps, context, [
                ("links", STAGES["links"], _links_stage),
                ("filters", STAGES["filters"], _filters_stage),
                ("drops", STAGES["drops"], _drops_stage),
                ("paths", STAGES["paths"], _paths_stage),
                ("interest", STAGES["interest"], _interest_stage),
            ])
            if self.request.report:
                _report_stage(analysis, steps)
        finally:
            per_minute.unpersist()
            control.unpersist()
            considered.unpersist()
            publications.unpersist()
            for df in analysis.cached:
                df.unpersist()
            analysis.cached = []
        return analysis


ENGINES = ("auto", "spark", "duckdb")
# the analysis stages, as their progress lines name them (either engine)
STAGES = {
    "links": "overview and links: traffic per link and direction, rates, uptime",
    "filters": "filters: considered, forwarded, suppressed; flood without filters",
    "drops": "loops and drops over time",
    "paths": "paths: hop counts, routes, latency (joining digests across routers)",
    "interest": "interest: attribute-name sets, pull-filter churn",
}


class _LazySpark:
    """The run's SparkSession: given, or started on first need (``spark`` a
    callable), and set up for the analysis once."""

    def __init__(self, spark):
        self._spark, self._ready = spark, None
        self.started = spark is not None and not callable(spark)

    def local(self):
        """True unless the session given is a cluster's (one started later
        is local: the command line starts none lazily otherwise)."""
        if self._spark is None or callable(self._spark):
            return True
        return self._spark.sparkContext.master.startswith("local")

    def get(self):
        if self._ready is None:
            spark = self._spark() if callable(self._spark) else self._spark
            if spark is None:
                raise ValueError("this run needs Spark, and none was given")
            # cached tables keep adaptive execution's coalesced partitions (else
            # every later pass over a small cached table would run 200 tiny tasks)
            spark.conf.set("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "true")
            # trace files are gzip (one task each, whatever their size): without
            # this, Spark packs them into as few tasks as there are cores,
            # unevenly, and one core idles while the other finishes the bigger pack
            spark.conf.set("spark.sql.files.minPartitionNum",
                           str(4 * spark.sparkContext.defaultParallelism))
            self._ready, self.started = spark, True
        return self._ready


def _small_window_engine(engine, tables_dir, spark_local=True):
    """Whether the window may go to DuckDB (``smallwindow``): "duckdb" asks
    for it (and fails clearly where it cannot be), "auto" where it can and
    Spark is (or would be) local: a run given a cluster uses it."""
    if engine == "spark" or (engine == "auto" and not spark_local):
        return False
    reason = None
    if not smallwindow.available():
        reason = "DuckDB is not installed (pip install duckdb)"
    elif not ingest._is_local(tables_dir):
        reason = f"the tables are not on a local file system ({tables_dir})"
    if reason and engine == "duckdb":
        raise ValueError(f"--engine duckdb: {reason}")
    return reason is None


def _run_small(analysis, steps, batch, trace_dir, since_us, until_us, latency_sample,
               report):
    """The analysis stages over a small window in DuckDB (``smallwindow``),
    one after the other, then the report: the same tables, CSVs and charts
    as the Spark stages make."""
    window = smallwindow.open_window(ingest._local(analysis.tables_dir), since_us, until_us,
                                     temp_dir=os.path.join(analysis.out_dir, ".duckdb-tmp"))
    try:
        if not window.records:
            raise _no_records(trace_dir, since_us, until_us)
        start, end = window.start, window.end
        analysis.records, analysis.start_us, analysis.end_us = window.records, start, end
        _ingest_done(steps, analysis, batch, " (analysed in DuckDB: a small window)")
        bucket = _bucket_us(start, end)
        analysis.series["bucket_us"] = bucket

        def save(name, table):
            _save_arrow(analysis, name, table)

        if steps.stream:
            print(f"      analysing: stages {steps.n + 1}-{steps.n + 5} in DuckDB, "
                  f"one after the other ...", file=steps.stream, flush=True)

        steps.start(STAGES["links"])
        minute = smallwindow.links_stage(window, save)
        top = _busiest_out(analysis.tables["links"], ("router", "peer", "direction"))
        analysis.series["link_traffic"] = _series_small(window, minute, top, bucket)
        analysis.stage_seconds["links"] = steps.done(
            f"{len(analysis.tables['links'])} link directions")

        steps.start(STAGES["filters"])
        smallwindow.filters_stage(window, save)
        analysis.stage_seconds["filters"] = steps.done()

        steps.start(STAGES["drops"])
        fine = analysis.series["fine_us"] = jobs.fine_bucket_us(start, end)
        analysis.series["drops"] = smallwindow.drops_stage(window, save, fine)
        analysis.stage_seconds["drops"] = steps.done(
            f"{sum(r['drops'] for r in analysis.tables['drops']):,} drops")

        steps.start(STAGES["paths"])
        k = smallwindow.paths_stage(window, save, analysis, latency_sample)
        sampled = f"; latency timed on 1 in {k} notifications" if k > 1 else ""
        analysis.stage_seconds["paths"] = steps.done(
            f"{len(analysis.tables['routes'])} routes{sampled}")

        steps.start(STAGES["interest"])
        changes = smallwindow.interest_stage(window, save)
        wanted = set(_busiest_out(analysis.tables["filter_churn"], ("router", "peer")))
        sizes = [{"router": r["router"], "peer": r["peer"], "ts_us": r["ts_us"],
                  "filter_nodes": r["filter_nodes"]}
                 for r in changes.select(["router", "peer", "direction", "ts_us",
                                          "filter_nodes"]).to_pylist()
                 if r["direction"] == "out" and (r["router"], r["peer"]) in wanted]
        analysis.series["filter_sizes"] = sorted(sizes, key=lambda r: r["ts_us"])[:20000]
        analysis.stage_seconds["interest"] = steps.done(
            f"{len(analysis.tables['attr_sets'])} attribute sets")
    finally:
        window.close()
        import shutil
        shutil.rmtree(os.path.join(analysis.out_dir, ".duckdb-tmp"), ignore_errors=True)
    if report:
        _report_stage(analysis, steps)
    return analysis


def _no_records(trace_dir, since_us, until_us):
    return ingest.TraceInputError(f"no trace records under {trace_dir}"
                                  + (" in the requested time range"
                                     if since_us or until_us else ""))


def _ingest_done(steps, analysis, batch, note=""):
    """The ingest stage's line: what was read, and the window."""
    analysis.stage_seconds["ingest"] = steps.done(
        f"{batch.records:,} new records from {len(batch.parts)} files or parts "
        f"({batch.unchanged} files already read); {analysis.records:,} records in "
        f"{tf.format_time(analysis.start_us)} .. {tf.format_time(analysis.end_us)}{note}")


def _report_stage(analysis, steps):
    from spark_analysis import report as report_module
    steps.start("charts and HTML report")
    # what the last report in this directory said, to say what changed
    analysis.previous = report_module.load_summary(analysis.out_dir)
    path = report_module.write_report(analysis)
    report_module.write_summary(analysis)
    analysis.stage_seconds["report"] = steps.done(path)


def _busiest_out(rows, keys, n=8):
    """The first ``n`` "out" rows of a (sorted) summary table, as key tuples."""
    return [tuple(r[k] for k in keys) for r in rows if r["direction"] == "out"][:n]


def _series_small(window, minute, links, bucket):
    """``_series`` of the link_minute Arrow table, in DuckDB."""
    if not links:
        return []
    window.con.register("series_minute", minute)
    try:
        cond = " OR ".join(
            "(router = ? AND peer = ? AND direction = ?)" for _ in links)
        return window.con.sql(
            f"""SELECT router, peer, direction, minute_us - minute_us % {bucket} AS t_us,
                       sum(notifications)::BIGINT AS notifications, sum(bytes)::BIGINT AS bytes
                FROM series_minute WHERE {cond} GROUP BY ALL ORDER BY t_us""",
            params=[v for key in links for v in key]).to_arrow_table().to_pylist()
    finally:
        window.con.unregister("series_minute")


def _sorted_rows(rows, order, descending, columns, types):
    """Rows in ``_save``'s order: ``order`` (nulls last), then the other
    string columns ascending (nulls first), as Spark's orderBy sorts them."""
    ties = [c for c in columns if types[c] == "string" and c not in order]
    for c in reversed(ties):
        rows.sort(key=lambda r: (r[c] is not None, r[c] if r[c] is not None else ""))
    for c in reversed(order):
        if descending:
            rows.sort(key=lambda r: (r[c] is not None, r[c] if r[c] is not None else 0),
                      reverse=True)
        else:
            rows.sort(key=lambda r: (r[c] is None, r[c] if r[c] is not None else 0))
    return rows


def _save_arrow(analysis, name, table):
    """``_save`` for an Arrow table made by ``smallwindow``: Parquet (a local
    table directory, as Spark leaves one), and a summary table's sorted,
    limited rows and CSV."""
    import shutil
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = ingest._local(analysis.parquet(name))
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    if name in CSV_TABLES:
        order, descending, limit = CSV_TABLES[name]
        types = {f.name: ("string" if pa.types.is_string(f.type) else "other")
                 for f in table.schema}
        rows = _sorted_rows(table.to_pylist(), order, descending, table.column_names, types)
        table = pa.Table.from_pylist(rows, schema=table.schema)
    pq.write_table(table, os.path.join(path, "part-00000.zstd.parquet"), compression="zstd")
    open(os.path.join(path, "_SUCCESS"), "w").close()
    analysis.written.append(name)
    if name in CSV_TABLES:
        analysis.tables[name] = rows[:limit] if limit else rows
        _write_csv(os.path.join(analysis.out_dir, "csv", name + ".csv"), analysis.tables[name],
                   table.column_names)


# Stages 3-7 read the events table (and the cached per-minute counts) and
# write their own tables: they are independent, and all run side by side
# (over 10M records: 78 s instead of 84 s; one more hour: 30 s instead of 33 s).
ANALYSIS_THREADS = 5


def _run_side_by_side(spark, steps, context, stages):
    """Run the analysis stages in ANALYSIS_THREADS driver threads at once.

    On small inputs each stage is a string of small Spark jobs, each
    waiting on the driver (planning, code generation, a cold JIT) more than
    on the cores: side by side, one stage's waits are another's work. On
    big ones the cores are busy either way, and Spark shares them (and its
    memory) between the tasks of all jobs as it would within one. Progress
    is printed in stage order as stages finish, each with its own time.
    """
    import concurrent.futures
    from pyspark.util import inheritable_thread_target

    def run(number, text, stage):
        # job descriptions are per thread (pinned threads): the UI and the
        # event log still name each job's stage
        spark.sparkContext.setJobDescription(f"[{number}] {text}")
        began = time.monotonic()
        detail = stage(context)
        return time.monotonic() - began, detail

    first = steps.n + 1
    if steps.stream:
        print(f"      analysing: stages {first}-{first + len(stages) - 1} side by side ...",
              file=steps.stream, flush=True)
    import pyspark

    def target():
        # One wrapping per stage: each clones the local properties once, and
        # the thread it runs in gets that very object; threads sharing one
        # would share their job descriptions too (the last one set won, and
        # the event log put every job under the last stage).
        # (pyspark 4 wants the session, to carry its tags into the thread too)
        if int(pyspark.__version__.split(".")[0]) >= 4:
            return inheritable_thread_target(spark)(run)
        return inheritable_thread_target(run)
    with concurrent.futures.ThreadPoolExecutor(ANALYSIS_THREADS) as pool:
        futures = [pool.submit(target(), first + i, text, stage)
                   for i, (_, text, stage) in enumerate(stages)]
        for (key, text, _), future in zip(stages, futures):
            elapsed, detail = future.result()
            steps.n += 1
            analysis = context["analysis"]
            analysis.stage_seconds[key] = elapsed
            if steps.stream:
                extra = f": {detail}" if detail else ""
                print(f"[{steps.n}/{steps.stages}] {text}\n      done in {elapsed:.1f} s{extra}",
                      file=steps.stream, flush=True)


def _links_stage(c):
    spark, analysis, events = c["spark"], c["analysis"], c["events"]
    for name, df in jobs.overview(events, c["per_minute"]).items():
        _save(spark, analysis, name, df)
    tables = jobs.links(events, c["start"], c["end"], c["per_minute"], c["control"])
    minute = _save(spark, analysis, "link_minute", tables["link_minute"])
    _save(spark, analysis, "links", tables["links"])
    _save(spark, analysis, "link_uptime", tables["link_uptime"])
    _save(spark, analysis, "link_outages", jobs.link_outages(c["control"], c["start"], c["end"]))
    top = _busiest_out(analysis.tables["links"], ("router", "peer", "direction"))
    analysis.series["link_traffic"] = _series(minute, top, c["bucket"], "notifications", "bytes")
    return f"{len(analysis.tables['links'])} link directions"


def _filters_stage(c):
    spark, analysis = c["spark"], c["analysis"]
    for name, df in jobs.filters(c["events"], spark, c["per_minute"],
                                  c["considered"], c["publications"]).items():
        _save(spark, analysis, name, df)
    _save(spark, analysis, "filter_health", jobs.filter_health(c["per_minute"], c["end"]))
    return ""


def _drops_stage(c):
    spark, analysis = c["spark"], c["analysis"]
    tables = jobs.drops(c["events"], c["per_minute"])
    _save(spark, analysis, "drops_minute", tables["drops_minute"])
    _save(spark, analysis, "drops", tables["drops"])
    _save(spark, analysis, "unsent", tables["unsent"])
    _save(spark, analysis, "duplicate_deliveries", tables["duplicate_deliveries"])
    _save(spark, analysis, "duplicate_delivery_totals", tables["duplicate_delivery_totals"])
    fine = analysis.series["fine_us"] = jobs.fine_bucket_us(c["start"], c["end"])
    analysis.series["drops"] = _rows(jobs.drop_times(c["events"], fine))
    return f"{sum(r['drops'] for r in analysis.tables['drops']):,} drops"


def _paths_stage(c):
    analysis = c["analysis"]
    k = c["latency_sample"]
    if k is None and analysis.records <= jobs.LATENCY_SAMPLE_TARGET:
        k = 1          # (no more crossings than records: no need to count them)
    elif k is None:
        analysis.wire_records = jobs.wire_records(c["per_minute"])
        k = jobs.latency_sample(analysis.wire_records)
    analysis.latency_sample = k
    for name, df in jobs.paths(c["events"], sample_1_in=k).items():
        _save(c["spark"], analysis, name, df)
    sampled = f"; latency timed on 1 in {k} notifications" if k > 1 else ""
    return f"{len(analysis.tables['routes'])} routes{sampled}"


def _interest_stage(c):
    from pyspark.sql import functions as F
    spark, analysis = c["spark"], c["analysis"]
    tables = jobs.interest(c["events"], c["start"], c["end"], c["control"],
                           c["considered"], c["publications"])
    _save(spark, analysis, "attr_sets", tables["attr_sets"])
    changes = _save(spark, analysis, "filter_changes", tables["filter_changes"])
    _save(spark, analysis, "filter_churn", tables["filter_churn"])
    busiest = _busiest_out(analysis.tables["filter_churn"], ("router", "peer"))
    analysis.series["filter_sizes"] = _rows(
        changes.where((F.col("direction") == "out") & _pairs(busiest))
        .select("router", "peer", "ts_us", "filter_nodes").orderBy("ts_us").limit(20000))
    return f"{len(analysis.tables['attr_sets'])} attribute sets"


def _pairs(keys, names=("router", "peer", "direction")):
    """Column: (router, peer[, direction]) is one of ``keys``."""
    from pyspark.sql import functions as F
    cond = F.lit(False)
    for key in keys:
        c = F.lit(True)
        for name, value in zip(names, key):
            c = c & (F.col(name) == value)
        cond = cond | c
    return cond


def _series(minute, links, bucket, *values):
    """Per-bucket sums of ``values`` for the given (router, peer, direction) links."""
    from pyspark.sql import functions as F
    if not links:
        return []
    return _rows(minute.where(_pairs(links))
                 .groupBy("router", "peer", "direction",
                          (F.col("minute_us") - F.col("minute_us") % bucket).alias("t_us"))
                 .agg(*[F.sum(v).alias(v) for v in values]).orderBy("t_us"))


def _warn(progress, text):
    if progress:
        print(f"      warning: {text}", file=progress, flush=True)


def _same_file(path):
    """A file's path as Spark and os both name it (file:/x and /x alike)."""
    from urllib.parse import unquote
    if path.startswith("file:"):
        path = unquote(path[len("file:"):])
        while path.startswith("//"):
            path = path[1:]
    return os.path.abspath(path) if path.startswith("/") else path


def _display(path):
    from spark_analysis.ingest import display_path
    return display_path(path)
