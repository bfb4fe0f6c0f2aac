"""Spark analysis benchmark: records per second, peak memory, incremental runs.

    python bench/spark_scale.py [--sizes 1M,10M,50M] [--master local[*]]
                                [--driver-memory 1g] [--workdir DIR] [--runs N] [--keep]

For each size it makes a trace directory of about that many records and
runs ``python -m spark_analysis`` over it as a user would (a new process:
JVM start, finding files, JSON -> Parquet table, every job, charts and
report), then adds one more hour of traces and runs it again the way a
daily (here: hourly) job does -- a new process, the same ``--tables``, so
only the new hour's files are read, and ``--since``/``--until`` for that
hour. It prints, per size:

    records  files  MB gz  seconds  records/s  RSS MB py  JVM  all  |  +1 hour  seconds  share
             |  watching  seconds  share

Then the same in a process that stays up, as a service runs it
(``--watch 1s --last 1h`` on the same table): its first run reads nothing
new and reports on the last hour; then two more hours are added, one at a
time, and each run's own time (from seeing the new files to the report
written, as the process prints it) is taken; the table shows the second.
``--watch-hours N`` adds N hours instead (the table shows the last): a
service's runs keep getting faster for a while as its JVM compiles more
of Spark, and this shows how far.

Peak RSS is sampled every 0.2 s: ``py`` is the Python driver process,
``JVM`` the Java process pyspark starts (in local mode the driver's JVM
and the executor in one), ``workers`` the other Python processes: the
workers that JVM starts (the ingest's tasks) and the process that draws
half the charts (with the forkserver it is started from), ``all`` the
whole tree at its peak.

Traces: ``spark_analysis.synth`` simulates one hour of a federation (7
routers, 40 clients, 15 notifications/s: about 414,000 records), and
Spark replicates it hour after hour -- each copy later by one hour, with
its own digests -- into gzip-compressed files per router and hour,
named as routers name them. 10M records is a day of that federation, 50M
five days (about 3 and 15 GB of JSON before compression). Generating
is not timed; the traces are deleted afterwards unless --keep.
``--runs N`` repeats each size's full run N times (a new table each
time) and prints each run's records/s with the load average before and
after: the figure that matters on a shared machine is a ratio of
alternating runs, or the best of several on a quiet one.
Not a test: the figures depend on the machine.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from spark_analysis import synth  # noqa: E402
from spark_analysis import traceformat as tf  # noqa: E402
from spark_analysis.session import jvm_stderr_to  # noqa: E402
from spark_cluster import _proc_table  # noqa: E402  (the same /proc reading)

UNITS = {"k": 10**3, "K": 10**3, "m": 10**6, "M": 10**6}
HOUR_US = 3600 * 10**6
RATE = 15


def parse_size(text):
    text = text.strip()
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def make_template(workdir):
    path = os.path.join(workdir, "template")
    if not os.path.isdir(path):
        synth.generate(path, routers=7, clients=40, rate=RATE, seconds=3600, seed=7)
    return path


def load_template(spark, template):
    from pyspark.sql import functions as F
    from spark_analysis.ingest import trace_schema
    schema = trace_schema()
    files = [os.path.join(template, n) for n in sorted(os.listdir(template))
             if tf.is_trace_file(n)]
    tmpl = spark.read.schema(schema).json(files).drop("_corrupt").cache()
    n = tmpl.count()
    lo = tmpl.agg(F.min("ts_us")).first()[0]
    return tmpl, n, lo


def write_hours(spark, tmpl, lo, first, count, out):
    """Copies ``first`` .. ``first+count-1`` of the template hour, one .gz per router and hour."""
    from pyspark.sql import functions as F
    copy = F.col("copy")
    digest = (F.when(copy == 0, F.col("digest"))
              .otherwise(F.sha1(F.concat(F.col("digest"), copy.cast("string")))))
    fields = [(F.col("ts_us") + copy * HOUR_US).alias("ts_us") if c == "ts_us"
              else digest.alias("digest") if c == "digest" else F.col(c) for c in tmpl.columns]
    big = (spark.range(first, first + count, numPartitions=max(1, min(count, 64)))
           .withColumnRenamed("id", "copy").crossJoin(F.broadcast(tmpl))
           .select(copy, F.col("router").alias("domain"), F.to_json(F.struct(*fields)).alias("value"))
           .repartition("copy", "domain"))
    staging = out + ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    big.write.partitionBy("copy", "domain").option("compression", "gzip").text(staging)
    os.makedirs(out, exist_ok=True)
    written = 0
    for dirpath, _, names in os.walk(staging):
        parts = [n for n in names if n.startswith("part-") and n.endswith(".gz")]
        if not parts:
            continue
        keys = dict(p.split("=", 1) for p in os.path.relpath(dirpath, staging).split(os.sep))
        k, domain = int(keys["copy"]), keys["domain"]
        from urllib.parse import unquote
        domain = unquote(domain)
        for i, name in enumerate(sorted(parts)):
            target = tf.trace_file_name(domain, lo + k * HOUR_US, k * 100 + i + 1, gzip=True)
            os.rename(os.path.join(dirpath, name), os.path.join(out, target))
            written += 1
    shutil.rmtree(staging, ignore_errors=True)
    return written


def load_average():
    """The 1-minute load average, as uptime prints it (the machine is shared)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def dir_mb(path):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)) / 1e6


class TreeRSS:
    """Samples, every ``interval`` seconds, the resident memory of a process
    and of its descendants (the JVM that pyspark starts, the Python workers
    the JVM starts for the ingest, the chart worker), keeping the peaks: of
    the Python driver alone, of the JVMs, of the other Python processes, and
    of the whole tree."""

    def __init__(self, pid, interval=0.2):
        self.pid, self.interval = pid, interval
        self.python = self.jvm = self.workers = self.total = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _children(self):
        kids = {}
        for pid, (_, _, _, ppid) in (_proc_table() or {}).items():
            kids.setdefault(ppid, []).append(pid)
        return kids

    def _rss_mb(self, pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def _comm(self, pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                return f.read().strip()
        except OSError:
            return ""

    def _run(self):
        while not self._stop.is_set():
            kids = self._children()
            tree, todo = [], [self.pid]
            while todo:
                p = todo.pop()
                tree.append(p)
                todo += kids.get(p, [])
            python = self._rss_mb(self.pid)
            jvm = workers = 0.0
            for p in tree[1:]:
                if self._comm(p) == "java":
                    jvm += self._rss_mb(p)
                else:                       # pyspark's daemon and its workers
                    workers += self._rss_mb(p)
            self.python = max(self.python, python)
            self.jvm = max(self.jvm, jvm)
            self.workers = max(self.workers, workers)
            self.total = max(self.total, python + jvm + workers)
            self._stop.wait(self.interval)

    def stop(self):
        self._stop.set()
        self._thread.join()


STAGE = re.compile(r"^\[(\d+)/\d+\] (\S+)")
DONE = re.compile(r"^\s+done in ([0-9.]+) s")
# a run's last line: "wrote REPORT (N records, B bad lines skipped, S s)"
WROTE = re.compile(r"^wrote \S+ \(([0-9,]+) records, .* ([0-9.]+) s\)", re.M)


def analyse(traces, out, tables, args, since=None, until=None):
    """One ``python -m spark_analysis`` run, as a user starts it: (seconds,
    TreeRSS, {stage: seconds}, records in the report)."""
    cmd = [sys.executable, "-m", "spark_analysis", traces, "--out", out, "--tables", tables,
           "--master", args.master, "--conf", f"spark.driver.memory={args.driver_memory}"]
    if since is not None:
        cmd += ["--since", tf.format_time(since), "--until", tf.format_time(until)]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    rss = TreeRSS(proc.pid)
    output = proc.communicate()[0]
    elapsed = time.monotonic() - began
    rss.stop()
    if proc.returncode != 0:
        sys.stdout.write(output)
        raise SystemExit(f"the analysis failed (exit status {proc.returncode})")
    wrote = WROTE.search(output)
    return (elapsed, rss, stage_times(output.splitlines()),
            int(wrote.group(1).replace(",", "")) if wrote else 0)


def stage_times(lines):
    """{stage: seconds} from a run's progress lines."""
    stages, current = {}, None
    for line in lines:
        m = STAGE.match(line)
        if m:
            current = {"finding": "files", "reading": "ingest", "overview": "links",
                       "filters:": "filters", "loops": "drops", "paths:": "paths",
                       "interest:": "interest", "charts": "report"}.get(m.group(2), m.group(2))
            continue
        m = DONE.match(line)
        if m and current:
            stages[current] = float(m.group(1))
            current = None
    return stages


class Watcher:
    """``python -m spark_analysis --watch`` kept running over a trace
    directory, as a service would run it: its runs' times are read from its
    progress lines ("wrote ... (N records, ..., S s)")."""

    def __init__(self, traces, out, tables, args):
        cmd = [sys.executable, "-m", "spark_analysis", traces, "--out", out, "--tables", tables,
               "--master", args.master, "--conf", f"spark.driver.memory={args.driver_memory}",
               "--watch", "1s", "--last", "1h"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.rss = TreeRSS(self.proc.pid)
        self.lines = []
        self.runs = []            # (records in the report, seconds, new records read)
        self.stages = []          # {stage: seconds} of each run
        self._began = 0
        self._new = 0
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line)
                m = re.search(r"done in [0-9.]+ s: ([0-9,]+) new records", line)
                if m:
                    self._new = int(m.group(1).replace(",", ""))
                m = WROTE.search(line)
                if m:
                    self.runs.append((int(m.group(1).replace(",", "")), float(m.group(2)),
                                      self._new))
                    self.stages.append(stage_times(self.lines[self._began:]))
                    self._began = len(self.lines)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_runs(self, n, timeout=1800):
        """Wait until ``n`` runs have finished; the n-th run."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.runs) < n:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    sys.stdout.write("".join(self.lines))
                    raise SystemExit("the watching analysis stopped or took too long")
                self._changed.wait(min(left, 1.0))
            return self.runs[n - 1]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.rss.stop()


def add_hour(spark, tmpl, lo, hour, traces, staging):
    """Write one more hour aside, then move its files into ``traces`` at once
    (a watcher must not see half of them)."""
    shutil.rmtree(staging, ignore_errors=True)
    write_hours(spark, tmpl, lo, hour, 1, staging)
    for name in sorted(os.listdir(staging)):
        os.rename(os.path.join(staging, name), os.path.join(traces, name))
    shutil.rmtree(staging, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,10M,50M",
                        help="comma-separated record counts, e.g. 100k,1M (default 1M,10M,50M)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--driver-memory", default="1g",
                        help="spark.driver.memory of the analysis; in local mode also the "
                             "executors' (default 1g, Spark's own default)")
    parser.add_argument("--workdir", default=None,
                        help="where to put traces and tables (default: a temporary directory)")
    parser.add_argument("--watch-hours", type=int, default=2,
                        help="hours added one at a time for the watching process (default 2)")
    parser.add_argument("--runs", type=int, default=1,
                        help="full runs per size, each on a new table (default 1); each "
                             "prints its records/s and the machine's load")
    parser.add_argument("--keep", action="store_true", help="keep the traces and reports")
    args = parser.parse_args(argv)
    if args.watch_hours < 1:
        parser.error("--watch-hours must be at least 1")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]

    from spark_analysis.session import get_session, local_settings

    workdir = args.workdir or tempfile.mkdtemp(prefix="elvin-spark-bench-")
    os.makedirs(workdir, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # the generator's own Spark (not measured): local, quiet, 2 GB
    conf = {"spark.driver.memory": "2g"}
    conf.update(local_settings())
    with jvm_stderr_to(os.path.join(workdir, "generator-jvm.log")):
        spark = get_session("local[*]", "elvin-trace-bench-generator", conf, log_level="ERROR")
    print(f"Spark {spark.version}; analysis: master {args.master}, driver memory "
          f"{args.driver_memory}, {os.cpu_count()} CPUs; work directory {workdir}", flush=True)
    template = make_template(workdir)
    tmpl, per_hour, lo = load_template(spark, template)
    print(f"template: one hour, {per_hour:,} records", flush=True)
    header = (f"{'records':>12} {'files':>6} {'MB gz':>7} {'seconds':>8} {'records/s':>10} "
              f"{'RSS MB py':>9} {'JVM':>6} {'workers':>7} {'all':>6}  | {'+1 hour':>9} "
              f"{'seconds':>8} {'share':>6}  | {'watching':>9} {'seconds':>7} {'share':>6}")
    results = []
    try:
        for size in sizes:
            hours = max(1, round(size / per_hour))
            traces = os.path.join(workdir, f"traces-{size}")
            tables = os.path.join(workdir, f"tables-{size}")
            out = os.path.join(workdir, f"report-{size}")
            made = (traces, tables, out, out + "-hour", out + "-watch")
            for path in made:
                shutil.rmtree(path, ignore_errors=True)
            began = time.monotonic()
            files = write_hours(spark, tmpl, lo, 0, hours, traces)
            mb = dir_mb(traces)
            print(f"generated {hours} hours, {hours * per_hour:,} records, {files} files "
                  f"({mb:,.0f} MB gzip) in {time.monotonic() - began:.0f} s; analysing ...",
                  flush=True)
            speeds = []
            for n in range(1, args.runs + 1):
                # each run a new process on a new table: the whole first run
                shutil.rmtree(tables, ignore_errors=True)
                shutil.rmtree(out, ignore_errors=True)
                before = load_average()
                elapsed, rss, stages, records = analyse(traces, out, tables, args)
                speeds.append(records / elapsed)
                print(f"full run {n}/{args.runs}: {records:,} records in {elapsed:.1f} s = "
                      f"{records / elapsed:,.0f} records/s (load average {before} before, "
                      f"{load_average()} after)", flush=True)
            if args.runs > 1:
                print(f"records/s over {args.runs} runs: "
                      + ", ".join(f"{v:,.0f}" for v in speeds)
                      + f" (best {max(speeds):,.0f}, median {sorted(speeds)[len(speeds) // 2]:,.0f})",
                      flush=True)
            # one more hour: only its files are read into the same table, and
            # the report is on that hour
            write_hours(spark, tmpl, lo, hours, 1, traces)
            since = lo - lo % HOUR_US + hours * HOUR_US
            inc, inc_rss, inc_stages, inc_records = analyse(
                traces, out + "-hour", tables, args, since, since + HOUR_US)
            # the same, in a process that stays up (--watch): it starts on the
            # table as it is now (its first run reads nothing new and reports on
            # the last hour), then gets two more hours, one after the other
            watcher = Watcher(traces, out + "-watch", tables, args)
            warm = []
            try:
                watcher.wait_runs(1)
                for extra in range(1, args.watch_hours + 1):
                    add_hour(spark, tmpl, lo, hours + extra, traces, traces + ".new")
                    run = watcher.wait_runs(1 + extra)
                    if run[2] != per_hour:
                        print(f"    (watch run {extra} read {run[2]:,} new records, "
                              f"not {per_hour:,})", flush=True)
                    warm.append(run)
            finally:
                watcher.stop()
            line = (f"{records:>12,} {files:>6} {mb:>7,.0f} {elapsed:>8.1f} "
                    f"{records / elapsed:>10,.0f} {rss.python:>9,.0f} {rss.jvm:>6,.0f} "
                    f"{rss.workers:>7,.0f} {rss.total:>6,.0f}  | {inc_records:>9,} {inc:>8.1f} "
                    f"{inc / elapsed:>6.1%}  | {warm[-1][0]:>9,} {warm[-1][1]:>7.1f} "
                    f"{warm[-1][1] / elapsed:>6.1%}")
            results.append(line)
            print(header)
            print(line)
            print("    full run stages (s): " + " ".join(f"{k}={v:.1f}" for k, v in stages.items()))
            print("    watching (--watch 1s --last 1h): first run "
                  f"{watcher.runs[0][1]:.1f} s (no new records; the last hour), then one more "
                  "hour each: " + ", ".join(f"{s:.1f} s ({n:,} new records, {r:,} in the report)"
                                           for r, s, n in warm)
                  + f"; peak RSS python {watcher.rss.python:,.0f} MB, JVM "
                  f"{watcher.rss.jvm:,.0f} MB, workers {watcher.rss.workers:,.0f} MB",
                  flush=True)
            print("    watching, last run's stages (s): "
                  + " ".join(f"{k}={v:.1f}" for k, v in watcher.stages[-1].items()), flush=True)
            print("    +1 hour stages (s): "
                  + " ".join(f"{k}={v:.1f}" for k, v in inc_stages.items())
                  + f"; peak RSS python {inc_rss.python:,.0f} MB, JVM {inc_rss.jvm:,.0f} MB, "
                  + f"workers {inc_rss.workers:,.0f} MB",
                  flush=True)
            if not args.keep:
                for path in made:
                    shutil.rmtree(path, ignore_errors=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(header)
    for line in results:
        print(line)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
