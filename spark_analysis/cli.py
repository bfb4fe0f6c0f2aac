"""``python -m spark_analysis TRACE_DIR --out REPORT_DIR [--since T] [--until T] [--master M]``.

The same module runs under ``spark-submit`` (the master then comes from
spark-submit; ``--master`` here is only for plain ``python -m``).
Exit status: 0 done, 1 the traces cannot be analysed (message on stderr),
2 bad command line.
"""

import argparse
import os
import sys
import time

from spark_analysis import traceformat as tf

__all__ = ["main", "build_parser", "parse_conf"]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m spark_analysis",
        description="Analyse Elvin federation traces (docs/traces.md) with Spark and write "
                    "Parquet tables, CSV summaries, PNG charts and an HTML report.")
    parser.add_argument("trace_dir", metavar="TRACE_DIR",
                        help="directory holding *.jsonl / *.jsonl.gz trace files (searched "
                             "recursively); any Hadoop URI (hdfs://, s3a://) on a cluster")
    parser.add_argument("--out", required=True, metavar="REPORT_DIR",
                        help="directory for report.html, charts/, csv/ and parquet/")
    parser.add_argument("--since", metavar="TIME",
                        help="only records at or after TIME (ISO 8601, UTC unless an offset "
                             "is given, or seconds since 1970)")
    parser.add_argument("--until", metavar="TIME", help="only records before TIME")
    parser.add_argument("--last", metavar="DURATION",
                        help="only the last DURATION of traces, up to the newest record "
                             "(e.g. 1h, 90m, 2d; instead of --since/--until)")
    parser.add_argument("--watch", metavar="INTERVAL",
                        help="keep running: after the first run, look for new trace data "
                             "every INTERVAL (e.g. 30s, 5m) and run again when there is some, "
                             "in the same Spark session (Ctrl-C or SIGTERM to stop)")
    parser.add_argument("--tables", metavar="URI",
                        help="where to write the Parquet tables (default REPORT_DIR/parquet); "
                             "on a cluster, a path every executor can write, e.g. hdfs:///...")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (e.g. local[4], spark://host:7077, yarn); default: "
                             "whatever spark-submit or Spark's configuration says, else local[*]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting (repeatable)")
    parser.add_argument("--rebuild", action="store_true",
                        help="forget the table under --tables and read every trace file again "
                             "(by default only what was not read before is read)")
    parser.add_argument("--ui", action="store_true",
                        help="local mode: keep Spark's web UI on (http://127.0.0.1:4040); "
                             "off by default")
    parser.add_argument("--event-log", metavar="DIR",
                        help="write Spark's event log to DIR (uncompressed), and print where "
                             "the time went, stage by stage, at the end")
    parser.add_argument("--latency-sample", metavar="N|auto", type=_latency_sample,
                        default=None,
                        help="time latencies on 1 in N notifications, chosen by digest (the "
                             "same ones on every router); 1: every one. Default auto: every "
                             "one up to a million crossings in the window, about a million "
                             "beyond (counts other than latency's are always exact)")
    from spark_analysis.pipeline import ENGINES
    parser.add_argument("--engine", choices=ENGINES, default="auto",
                        help="what analyses the window once it is in the table: spark, or "
                             "duckdb (in this process; a local table only); default auto: "
                             "DuckDB for a window of up to 12 million records of a local "
                             "table, else Spark")
    parser.add_argument("--no-report", action="store_true",
                        help="only write the tables (no charts, no HTML)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def _latency_sample(text):
    """``--latency-sample``: "auto" (None) or a whole number >= 1."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected auto or a whole number >= 1, not {text!r}")
    return value


def parse_conf(items, error):
    """{key: value} from repeated ``--conf KEY=VALUE``; ``error(message)`` otherwise."""
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            error(f"--conf {item!r}: expected KEY=VALUE")
        conf[key] = value
    return conf


def _small_run(args, files, since, until):
    """True when the run should touch few records (session.QUICK_JIT_RECORDS):
    its window's files, from the table's manifest or by their size."""
    from spark_analysis import ingest
    from spark_analysis.session import QUICK_JIT_RECORDS
    from spark_analysis.store import expected_records
    if files is None or args.rebuild:
        return False
    tables = args.tables or os.path.join(args.out, "parquet")
    expected = expected_records(tables, ingest.prune_by_name(files, since, until))
    return expected is not None and expected < QUICK_JIT_RECORDS


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        since = tf.parse_time(args.since) if args.since else None
        until = tf.parse_time(args.until) if args.until else None
    except ValueError as e:
        parser.error(str(e))
    if since is not None and until is not None and until <= since:
        parser.error("--until must be later than --since")
    from spark_analysis.watch import parse_duration
    last = interval = None
    try:
        last = round(parse_duration(args.last) * 1e6) if args.last else None
    except ValueError as e:
        parser.error(f"--last: {e}")
    try:
        interval = parse_duration(args.watch) if args.watch else None
    except ValueError as e:
        parser.error(f"--watch: {e}")
    if last is not None and (since is not None or until is not None):
        parser.error("--last cannot be combined with --since or --until")
    conf = parse_conf(args.conf, parser.error)
    if args.engine == "duckdb":
        # (said now, not after Spark has started and the traces are read)
        from spark_analysis.pipeline import _small_window_engine
        try:
            _small_window_engine("duckdb", args.tables or os.path.join(args.out, "parquet"))
        except ValueError as e:
            parser.error(str(e))
    progress = None if args.quiet else sys.stderr

    from spark_analysis import ingest, pipeline
    from spark_analysis.session import (common_settings, get_session, is_local_master,
                                        jvm_stderr_to, local_settings, pyspark_available)

    files = None
    if ingest._is_local(args.trace_dir) and interval is None:
        # fail fast, before starting a JVM, if there is nothing to read
        # (a watcher waits for its traces instead)
        try:
            files = ingest.list_trace_files(args.trace_dir)
        except ingest.TraceInputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    missing = pyspark_available()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 1
    local = is_local_master(args.master)
    settings = common_settings()
    jvm_log = None
    if local:
        # we start a local Spark ourselves: its Python workers use this
        # Python; it stays on loopback and keeps its notices to a log file
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings.update(local_settings(ui=args.ui, master=args.master,
                                       driver_memory=conf.get("spark.driver.memory", "1g"),
                                       quick_jit=not args.watch
                                       and _small_run(args, files, since, until)))
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as e:
            print(f"error: --out {args.out}: cannot make it: {e.strerror or e}",
                  file=sys.stderr)
            return 1
        jvm_log = os.path.join(os.path.abspath(args.out), "spark-jvm.log")
    if args.event_log:
        os.makedirs(args.event_log, exist_ok=True)
        settings.update({"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
                         "spark.eventLog.rolling.enabled": "false",
                         "spark.eventLog.dir": "file://" + os.path.abspath(args.event_log)})
    settings.update(conf)            # the user's --conf wins
    began = time.monotonic()
    started = []

    def start_spark():
        """The session: started on the first call (and said so), then kept."""
        if not started:
            at = time.monotonic()
            if progress:
                print("starting Spark ...", file=progress, flush=True)
            if jvm_log:
                with jvm_stderr_to(jvm_log):
                    started.append(get_session(args.master, conf=settings))
            else:
                started.append(get_session(args.master, conf=settings))
            if progress:
                print(f"      Spark {started[0].version}, master {started[0].sparkContext.master} "
                      f"({time.monotonic() - at:.1f} s)"
                      + (f"; JVM log {jvm_log}" if jvm_log else ""), file=progress, flush=True)
        return started[0]

    # Local traces into a local table: Spark is started only if a run needs
    # it (a window too big for DuckDB), after its new lines are read
    if not _without_spark(args, local):
        start_spark()

    def analyse(listed, began, rebuild):
        spark = started[0] if started else start_spark
        analysis = pipeline.run(spark, args.trace_dir, args.out, since, until,
                                progress=progress, files=listed, report=not args.no_report,
                                tables_dir=args.tables, rebuild=rebuild, last_us=last,
                                latency_sample=args.latency_sample, engine=args.engine)
        if progress:
            where = os.path.join(args.out, "report.html") if not args.no_report else args.out
            print(f"wrote {where} ({analysis.records:,} records, {analysis.bad_lines:,} bad "
                  f"lines skipped, {time.monotonic() - began:.1f} s)", file=progress, flush=True)
        return analysis

    status = 0
    if interval is None:
        try:
            analyse(files, began, args.rebuild)
        except ingest.TraceInputError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 1
    else:
        status = _watch(started, args, interval, analyse, progress)
    if args.event_log:
        from spark_analysis import eventlog
        spark = start_spark()
        log = os.path.join(args.event_log, spark.sparkContext.applicationId)
        spark.stop()
        if progress and os.path.exists(log):
            print(f"where the time went (event log {log}):", file=progress)
            print(eventlog.format_summary(eventlog.summarise(log)), file=progress, flush=True)
    return status


def _without_spark(args, local):
    """True when Spark may be started later, only if a run needs it: the
    traces and tables are local, Spark would be local too, and no event log
    or web UI is asked for. Such a run reads its new trace lines with its
    own worker processes (faster than Spark's tasks: 10M records in 20 s
    against 26 s, and the JVM is not started yet), and a small window is
    then analysed by DuckDB without Spark at all."""
    from spark_analysis import ingest
    tables = args.tables or os.path.join(args.out, "parquet")
    return (args.engine != "spark" and local and not args.event_log and not args.ui
            and ingest._is_local(args.trace_dir) and ingest._is_local(tables))


def _watch(started, args, interval, analyse, progress):
    """``--watch``: run now and whenever the trace directory changes, until
    Ctrl-C or SIGTERM (exit status 0). A run that finds nothing to analyse
    says why and the watch goes on."""
    import signal
    import threading
    from spark_analysis import ingest
    from spark_analysis.watch import watch

    stopping = threading.Event()

    def stop(signum, frame):
        # Nothing is raised here: the main thread may be inside a py4j call,
        # which an exception would leave broken. The loop ends at its next
        # look; a run in progress has its Spark jobs cancelled (from another
        # thread, on a connection of its own) and ends with their error. The
        # table is left as a killed run leaves it: the next run finishes or
        # undoes the batch.
        if not stopping.is_set():
            stopping.set()
            if started:            # (Spark, if this watcher has started it)
                threading.Thread(target=started[0].sparkContext.cancelAllJobs,
                                 daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    first = [True]

    def run(listed):
        rebuild, first[0] = args.rebuild and first[0], False
        analyse(listed, time.monotonic(), rebuild)

    try:
        watch(run, lambda: ingest.list_trace_files(args.trace_dir, started[0] if started
                                                   else None), interval,
              progress=progress, recoverable=(ingest.TraceInputError, OSError),
              describe=args.trace_dir, stop=stopping)
    except Exception:
        if not stopping.is_set():
            raise
        # the run the stop cancelled
    if progress:
        print("stopped watching", file=progress, flush=True)
    return 0
