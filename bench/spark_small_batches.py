"""A table read a minute at a time, as a watcher (``--watch 1m``) reads it.

    python bench/spark_small_batches.py [--minutes 60] [--workdir DIR] [--keep]

Simulates one hour of a federation (``spark_analysis.synth``: 7 routers, 40
clients, 15 notifications/s), then reads it into a table three ways, each
in the same Spark session: the whole hour in one batch; one batch per
minute (the trace files growing a minute at a time) with small files left
as they are; and one batch per minute with each partition's small files
merged (``TraceStore.compact``, what ``update`` does). For each it prints
the ingest's time, the Parquet files in ``events`` and ``event_minutes``,
and the time of an analysis of the last hour (no charts), run three times:
the first pays for the JVM's warming up, the best of the other two is what
a watcher that has run a while takes.
"""

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spark_analysis import compaction, ingest, pipeline, session, synth  # noqa: E402
from spark_analysis.store import TraceStore                               # noqa: E402


def minute_chunks(trace_dir):
    """{minute: {file name: [lines]}} of the (plain) trace files."""
    chunks = {}
    for path in sorted(glob.glob(os.path.join(trace_dir, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                minute = json.loads(line)["ts_us"] // 60_000_000
                chunks.setdefault(minute, {}).setdefault(os.path.basename(path), []).append(line)
    return chunks


def files_in(tables, table):
    return len(glob.glob(os.path.join(tables, table, "**", "*.parquet"), recursive=True))


def one_way(spark, work, name, chunks, batches, merge):
    traces, tables = os.path.join(work, "traces-" + name), os.path.join(work, "tables-" + name)
    os.makedirs(traces)
    store = TraceStore(spark, tables)
    saved = compaction.MIN_FILES
    compaction.MIN_FILES = saved if merge else 10**9
    try:
        began = time.monotonic()
        for batch in batches:
            for minute in batch:
                for file, lines in chunks[minute].items():
                    with open(os.path.join(traces, file), "a", encoding="utf-8") as f:
                        f.writelines(lines)
            store.update(ingest.list_trace_files(traces))
        ingest_s = time.monotonic() - began
    finally:
        compaction.MIN_FILES = saved
    runs = []
    for _ in range(3):
        began = time.monotonic()
        # (Spark's analysis: what many small files slow down; a window this
        # small would otherwise go to DuckDB, docs/analysis.md)
        pipeline.run(spark, traces, os.path.join(work, "out-" + name), tables_dir=tables,
                     last_us=3600 * 10**6, progress=None, report=False, engine="spark")
        runs.append(time.monotonic() - began)
    return (ingest_s, files_in(tables, "events"), files_in(tables, "event_minutes"), runs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=60, help="minutes simulated (default 60)")
    parser.add_argument("--workdir", default=None, help="where to write (default: a temporary "
                                                        "directory, deleted afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the traces and tables")
    args = parser.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="elvin-small-batches-")
    os.makedirs(work, exist_ok=True)
    try:
        hour = os.path.join(work, "generated")
        stats = synth.generate(hour, routers=7, clients=40, rate=15.0,
                               seconds=60.0 * args.minutes, seed=3)
        chunks = minute_chunks(hour)
        minutes = sorted(chunks)
        print(f"{stats['records']:,} records, {len(minutes)} minutes", flush=True)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings = session.common_settings()
        settings.update(session.local_settings())
        spark = session.get_session(None, conf=settings)
        print(f"{'read as':<34} {'ingest s':>8} {'events files':>12} {'minutes files':>13}"
              f"  analysis s (first, then warm)", flush=True)
        for name, label, batches, merge in (
                ("one", "one batch", [minutes], True),
                ("not-merged", "a batch a minute, not merged", [[m] for m in minutes], False),
                ("merged", "a batch a minute, merged", [[m] for m in minutes], True)):
            ingest_s, events, counts, runs = one_way(spark, work, name, chunks, batches, merge)
            print(f"{label:<34} {ingest_s:>8.1f} {events:>12,} {counts:>13,}  "
                  f"{runs[0]:.1f}, then {min(runs[1:]):.1f}", flush=True)
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
