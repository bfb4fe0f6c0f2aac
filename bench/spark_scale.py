"""Spark analysis benchmark: records per second, peak memory, incremental runs.

    python bench/spark_scale.py [--sizes 1M,10M,50M] [--master local[*]]
                                [--driver-memory 2g] [--workdir DIR] [--keep]

For each size it makes a trace directory of about that many records and
times ``spark_analysis`` over it end to end (finding files, JSON ->
Parquet table, every job, charts and report), then adds one more hour of
traces and times the incremental run a daily (here: hourly) job makes:
read only the new files into the same table and report on that hour.
It prints, per size:

    records  files  MB(gz)  seconds  records/s  peak RSS  |  +1 hour: records  seconds  share

Traces: ``spark_analysis.synth`` simulates one hour of a federation (7
routers, 40 clients, 15 notifications/s: about 416,000 records), and
Spark replicates it hour after hour -- each copy later by one hour, with
its own digests -- into one gzip-compressed file per router and hour,
named as routers name them. 10M records is a day of that federation, 50M
five days (about 1.5 and 7.5 GB of JSON before compression). Generating
is not timed; the traces are deleted afterwards unless --keep.

Peak RSS is the driver's: in local mode the JVM that is also the
executor (its high-water mark is reset before each run) plus this Python
process. Not a test: the figures depend on the machine.
"""

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spark_analysis import synth  # noqa: E402
from spark_analysis import traceformat as tf  # noqa: E402

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


def jvm_pid(spark):
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def reset_peak(pid):
    """Reset the process's peak RSS (VmHWM); False where Linux does not allow it."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def dir_mb(path):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)) / 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,10M,50M",
                        help="comma-separated record counts, e.g. 100k,1M (default 1M,10M,50M)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--driver-memory", default="2g",
                        help="driver memory; in local mode also the executors' (default 2g)")
    parser.add_argument("--workdir", default=None,
                        help="where to put traces and tables (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the traces and reports")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]

    from spark_analysis import pipeline
    from spark_analysis.session import get_session, local_settings, is_local_master

    workdir = args.workdir or tempfile.mkdtemp(prefix="elvin-spark-bench-")
    os.makedirs(workdir, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = {"spark.driver.memory": args.driver_memory}
    if is_local_master(args.master):
        conf.update(local_settings())
    spark = get_session(args.master, "elvin-trace-analysis-bench", conf, log_level="ERROR")
    pid = jvm_pid(spark)
    print(f"Spark {spark.version}, master {spark.sparkContext.master}, "
          f"{spark.sparkContext.defaultParallelism} cores, driver memory {args.driver_memory}; "
          f"work directory {workdir}", flush=True)
    template = make_template(workdir)
    tmpl, per_hour, lo = load_template(spark, template)
    print(f"template: one hour, {per_hour:,} records", flush=True)
    header = (f"{'records':>12} {'files':>6} {'MB gz':>7} {'seconds':>8} {'records/s':>10} "
              f"{'peak RSS MB':>11}  | {'+1 hour':>9} {'seconds':>8} {'share':>6}")
    results = []
    try:
        for size in sizes:
            hours = max(1, round(size / per_hour))
            traces = os.path.join(workdir, f"traces-{size}")
            tables = os.path.join(workdir, f"tables-{size}")
            out = os.path.join(workdir, f"report-{size}")
            for path in (traces, tables, out):
                shutil.rmtree(path, ignore_errors=True)
            began = time.monotonic()
            files = write_hours(spark, tmpl, lo, 0, hours, traces)
            mb = dir_mb(traces)
            print(f"generated {hours} hours, {hours * per_hour:,} records, {files} files "
                  f"({mb:,.0f} MB gzip) in {time.monotonic() - began:.0f} s; analysing ...",
                  flush=True)
            reset_peak(pid)
            began = time.monotonic()
            analysis = pipeline.run(spark, traces, out, progress=None, tables_dir=tables)
            elapsed = time.monotonic() - began
            rss = peak_rss_mb(pid) + resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            stages = " ".join(f"{k}={v:.1f}" for k, v in analysis.stage_seconds.items())
            # one more hour: read just its files into the same table, report on it
            write_hours(spark, tmpl, lo, hours, 1, traces)
            since = lo - lo % HOUR_US + hours * HOUR_US
            began = time.monotonic()
            extra = pipeline.run(spark, traces, out + "-hour", since_us=since,
                                 until_us=since + HOUR_US, progress=None, tables_dir=tables)
            inc = time.monotonic() - began
            line = (f"{analysis.records:>12,} {files:>6} {mb:>7,.0f} {elapsed:>8.1f} "
                    f"{analysis.records / elapsed:>10,.0f} {rss:>11,.0f}  | "
                    f"{extra.batch.records:>9,} {inc:>8.1f} {inc / elapsed:>6.1%}")
            results.append((line, stages, extra.stage_seconds))
            print(header)
            print(line)
            print(f"    full run stages (s): {stages}")
            print("    +1 hour stages (s): "
                  + " ".join(f"{k}={v:.1f}" for k, v in extra.stage_seconds.items()), flush=True)
            if not args.keep:
                for path in (traces, tables, out, out + "-hour"):
                    shutil.rmtree(path, ignore_errors=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(header)
    for line, _, _ in results:
        print(line)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
