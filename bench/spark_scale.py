"""Spark analysis benchmark: records per second of the whole trace analysis.

    python bench/spark_scale.py [--sizes 1M,10M,50M] [--master local[*]]
                                [--driver-memory 4g] [--workdir DIR] [--keep]

For each size it makes a synthetic trace directory of about that many
records, then times ``spark_analysis`` over it (every stage: JSON ->
Parquet, links, filters, drops, paths, interest, charts and report) and
prints

    records  files  MB  seconds  records/s  MB/s   (then seconds per stage)

The traces come from ``spark_analysis.synth`` (7 routers, 40 clients,
100 notifications/s for 2 minutes, about 170,000 records), replicated
inside Spark as many times as needed: each copy is shifted later in time by
the template's length and gets its own digests, so the result is one long,
consistent trace (50 million records is about 10 hours of that federation,
roughly 17 GB of JSON -- make sure --workdir has room for twice that).
Generating the data is not timed. Not a test: the figures depend on the
machine (cores, disks, memory).
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spark_analysis import synth  # noqa: E402
from spark_analysis import traceformat as tf  # noqa: E402

UNITS = {"k": 10**3, "K": 10**3, "m": 10**6, "M": 10**6}


def parse_size(text):
    text = text.strip()
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def make_template(workdir):
    path = os.path.join(workdir, "template")
    if not os.path.isdir(path):
        synth.generate(path, routers=7, clients=40, rate=100, seconds=120, seed=7)
    return path


def make_traces(spark, template, records, out):
    """Replicate the template to about ``records`` records of JSON lines in ``out``."""
    from pyspark.sql import functions as F
    from spark_analysis.ingest import trace_schema
    schema = trace_schema()
    fields = [f.name for f in schema.fields if f.name != "_corrupt"]
    files = [os.path.join(template, n) for n in sorted(os.listdir(template))
             if tf.is_trace_file(n)]
    tmpl = (spark.read.schema(schema).json(files).select(*fields)
            .coalesce(1).cache())
    n = tmpl.count()
    lo, hi = tmpl.agg(F.min("ts_us"), F.max("ts_us")).first()
    span = hi - lo + 10**6
    copies = max(1, round(records / n))
    parts = max(2, copies * n // 250_000)
    copy = F.col("copy")
    digest = (F.when(copy == 0, F.col("digest"))
              .otherwise(F.sha1(F.concat(F.col("digest"), copy.cast("string")))))
    # the copy numbers drive the partitioning (one output file per partition);
    # the template is broadcast to them
    big = (spark.range(0, copies, numPartitions=min(parts, copies))
           .withColumnRenamed("id", "copy").crossJoin(F.broadcast(tmpl))
           .select(*[(F.col("ts_us") + copy * span).alias("ts_us") if f == "ts_us"
                     else digest.alias("digest") if f == "digest" else F.col(f)
                     for f in fields]))
    if os.path.exists(out):
        shutil.rmtree(out)
    big.write.option("compression", "none").json(out)
    total = 0
    for i, name in enumerate(sorted(os.listdir(out))):
        full = os.path.join(out, name)
        if name.startswith("part-") and name.endswith(".json"):
            os.rename(full, os.path.join(out, tf.trace_file_name("bench", lo, i + 1)))
        elif not name.endswith(".jsonl"):
            os.remove(full)
    tmpl.unpersist()
    return copies * n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,10M,50M",
                        help="comma-separated record counts, e.g. 100k,1M (default 1M,10M,50M)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--driver-memory", default="4g",
                        help="driver memory; in local mode also the executors' (default 4g)")
    parser.add_argument("--workdir", default=None,
                        help="where to put traces and reports (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the traces and reports")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]

    from spark_analysis import pipeline
    from spark_analysis.session import get_session

    workdir = args.workdir or tempfile.mkdtemp(prefix="elvin-spark-bench-")
    os.makedirs(workdir, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = get_session(args.master, "elvin-trace-analysis-bench",
                        {"spark.driver.memory": args.driver_memory}, log_level="ERROR")
    print(f"Spark {spark.version}, master {spark.sparkContext.master}, "
          f"{spark.sparkContext.defaultParallelism} cores; work directory {workdir}", flush=True)
    template = make_template(workdir)
    header = (f"{'records':>12} {'files':>6} {'MB':>8} {'seconds':>8} {'records/s':>10} "
              f"{'MB/s':>6}  stages (s)")
    results = []
    try:
        for size in sizes:
            traces = os.path.join(workdir, f"traces-{size}")
            out = os.path.join(workdir, f"report-{size}")
            began = time.monotonic()
            records = make_traces(spark, template, size, traces)
            made = time.monotonic() - began
            files = [n for n in os.listdir(traces) if n.endswith(".jsonl")]
            mb = sum(os.path.getsize(os.path.join(traces, n)) for n in files) / 1e6
            print(f"generated {records:,} records ({mb:,.0f} MB) in {made:.0f} s; analysing ...",
                  flush=True)
            began = time.monotonic()
            analysis = pipeline.run(spark, traces, out, progress=None)
            elapsed = time.monotonic() - began
            stages = " ".join(f"{k}={v:.1f}" for k, v in analysis.stage_seconds.items())
            line = (f"{analysis.records:>12,} {len(files):>6} {mb:>8,.0f} {elapsed:>8.1f} "
                    f"{analysis.records / elapsed:>10,.0f} {mb / elapsed:>6.1f}  {stages}")
            results.append(line)
            print(header)
            print(line, flush=True)
            if not args.keep:
                shutil.rmtree(traces, ignore_errors=True)
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
