"""Stage 1: find the trace files, parse and check every line, write ``events``.

The JSON is parsed once, by ``arrowparse`` in Spark's Python workers (a
task reads whole files); every later job reads the Parquet table this
stage writes. A line is *bad* when it is not a JSON object of the format's
types or breaks a rule of docs/traces.md; ``bad_reason`` says which, in
``traceformat.check_record``'s words. Bad lines are counted per file and
skipped; ``locate_bad_lines`` finds their line numbers afterwards (only for
the files that have some).
"""

import os
import re
import sys

from spark_analysis import traceformat as tf

__all__ = ["trace_schema", "events_schema", "TraceInputError", "list_trace_files", "prune_by_name",
           "unreadable_files",
           "read_traces", "write_events", "ingest_stats", "aside_stats", "locate_times",
           "locate_bad_lines",
           "display_path"]


class TraceInputError(Exception):
    """The trace directory cannot be analysed (missing, empty, nothing valid)."""


def _schema():
    from pyspark.sql import types as T
    L, S = T.LongType(), T.StringType()
    return T.StructType([
        T.StructField("v", L), T.StructField("ts_us", L), T.StructField("router", S),
        T.StructField("peer", S), T.StructField("event", S), T.StructField("direction", S),
        T.StructField("routing", T.ArrayType(S)), T.StructField("size", L),
        T.StructField("attrs", T.ArrayType(S)), T.StructField("digest", S),
        T.StructField("filter_nodes", L), T.StructField("filter_bytes", L),
        T.StructField("reason", S), T.StructField("unsent", L), T.StructField("_corrupt", S),
    ])


def trace_schema():
    """The explicit Spark schema of a trace record (plus ``_corrupt``)."""
    return _schema()


# ---------------------------------------------------------------------------
# files

_SCHEME = re.compile(r"\A[A-Za-z][A-Za-z0-9+.-]*:")


def _is_local(path):
    return not _SCHEME.match(path) or path.startswith("file:")


def _local(path):
    return path[5:] if path.startswith("file:") else path


def _warn_stderr(text):
    print(f"      warning: {text}", file=sys.stderr, flush=True)


def list_trace_files(path, spark=None, warn=_warn_stderr):
    """[(path, size)] of ``*.jsonl`` and ``*.jsonl.gz`` under ``path``, recursively.

    Local paths are listed with os; other URIs (hdfs://, s3a://, ...) with
    Hadoop's FileSystem through ``spark``. Raises TraceInputError if the
    path does not exist or holds no trace file. A file that vanishes while
    it is listed (a closed file being gzip-compressed) or a dangling
    symbolic link is skipped, with a warning (``warn``).
    """
    found = []
    if _is_local(path):
        root = _local(path)
        if not os.path.exists(root):
            raise TraceInputError(f"trace directory {path} does not exist")
        if os.path.isfile(root):
            found.append((os.path.abspath(root), os.path.getsize(root)))
        else:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
                for name in sorted(filenames):
                    if tf.is_trace_file(name):
                        full = os.path.abspath(os.path.join(dirpath, name))
                        try:
                            found.append((full, os.path.getsize(full)))
                        except OSError as e:
                            why = ("a symbolic link to nothing" if os.path.islink(full)
                                   else f"gone while listed ({e.strerror})")
                            warn(f"{full}: {why}; skipped")
    else:
        if spark is None:
            raise TraceInputError(f"{path}: listing a remote path needs Spark")
        jvm = spark.sparkContext._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        if not fs.exists(hpath):
            raise TraceInputError(f"trace directory {path} does not exist")
        files = fs.listFiles(hpath, True)
        while files.hasNext():
            status = files.next()
            name = status.getPath().getName()
            if tf.is_trace_file(name):
                found.append((status.getPath().toString(), status.getLen()))
        found.sort()
    if not found:
        raise TraceInputError(f"no trace files (*.jsonl, *.jsonl.gz) under {path}")
    return found


def unreadable_files(files):
    """[(path, reason)] of the local ``.gz`` files that do not decompress to
    the end (truncated, corrupt): one such file would otherwise stop
    Spark's whole read. Each is read through once, in bounded memory."""
    import gzip
    import zlib
    bad = []
    for path, _ in files:
        if not (path.endswith(".gz") and _is_local(path)):
            continue
        try:
            with gzip.open(_local(path), "rb") as f:
                while f.read(1 << 20):
                    pass
        except (EOFError, OSError, zlib.error) as e:
            bad.append((path, f"not a readable gzip file ({e or type(e).__name__})"))
    return bad


def prune_by_name(files, since_us=None, until_us=None, margin_us=300 * 10**6):
    """Drop files whose name shows they hold nothing in [since, until).

    A file named ``<domain>-<opened>-<seq>.jsonl`` holds records from when it
    was opened until the next file of the same domain was opened. Files
    with other names are always kept; ``margin_us`` allows for clock steps.
    """
    if since_us is None and until_us is None:
        return list(files)
    parsed, kept = {}, []
    for path, size in files:
        info = tf.parse_trace_file_name(os.path.basename(path))
        if info is None:
            kept.append((path, size))
        else:
            parsed.setdefault(info[0], []).append((info[1], info[2], path, size))
    for domain, items in parsed.items():
        items.sort()
        for i, (opened, _, path, size) in enumerate(items):
            ends = items[i + 1][0] if i + 1 < len(items) else None
            if until_us is not None and opened - margin_us >= until_us:
                continue
            if since_us is not None and ends is not None and ends + margin_us <= since_us:
                continue
            kept.append((path, size))
    kept.sort()
    return kept


# ---------------------------------------------------------------------------
# parsing and checking (arrowparse, in Spark's Python workers)

def _tables_of(row, ignore_corrupt):
    """Arrow tables of events from one file row of a task's input; an
    unreadable file raises naming it (or, ``ignore_corrupt``, ends early)."""
    import zlib
    from spark_analysis import arrowparse
    source = row["content"] if row.get("content") is not None else row["path"]
    try:
        yield from arrowparse.parse_file(source, row["name"], row["gz"])
    except (OSError, EOFError, zlib.error) as e:   # gzip.BadGzipFile is an OSError
        # (anything else is a fault of ours, not the file's: it is not
        # turned into "unreadable", which would skip the file)
        if not ignore_corrupt:
            raise OSError(f"unreadable trace file {row['name']}: "
                          f"{type(e).__name__}: {e}") from e


def _parse_task(ignore_corrupt):
    """The function each ingest task runs (``mapInArrow``) when Spark writes
    the table: rows naming trace files (``path`` to open, or ``content``;
    ``name`` to record; ``gz``) in, Arrow batches of events out, one file
    at a time in bounded memory."""
    def parse(batches):
        for batch in batches:
            for row in batch.to_pylist():
                for table in _file_tables(row, ignore_corrupt)[0]:
                    yield from table.to_batches(max_chunksize=1 << 16)
    return parse


def _file_tables(row, ignore_corrupt):
    """(tables, set aside, their first times) of one file row: its records,
    those dated far from the rest of the file set aside
    (``arrowparse.set_aside``; the whole file is held to judge that)."""
    from spark_analysis import arrowparse
    return arrowparse.set_aside(list(_tables_of(row, ignore_corrupt)), row["name"])


# what a writing task returns: a trace file's counts, or a Parquet file it wrote
_WRITTEN_FIELDS = [("kind", "string"), ("name", "string"), ("ok", "long"), ("bad", "long")]


def _write_task(root, ignore_corrupt, minutes_root=None):
    """The function each ingest task runs when it writes the table itself
    (``partwriter``, into ``root``): file rows in, one row per trace file
    (kind 'file': good and bad lines) and per Parquet file written ('part';
    'minutes' for the per-minute counts of its valid records, written into
    ``minutes_root`` when given, see ``minutes``) out."""
    def write(batches):
        import pyarrow as pa
        from spark_analysis import arrowparse, minutes, partwriter
        writer = partwriter.PartitionedWriter(root, arrowparse.EVENTS_SCHEMA,
                                              ["status", "day", "router"])
        counts, counted, aside = {}, [], []
        for batch in batches:
            for row in batch.to_pylist():
                ok, bad = counts.get(row["name"], (0, 0))
                tables, n_aside, first = _file_tables(row, ignore_corrupt)
                for table in tables:
                    status = table.column("status")[0].as_py()
                    if status == "ok":
                        ok += table.num_rows
                        if minutes_root is not None:
                            counted.append(minutes.partial(table))
                    elif status == "bad":
                        bad += table.num_rows
                    writer.write(table)
                writer.flush()
                counts[row["name"]] = (ok, bad)
                if n_aside:
                    aside.append(("aside", row["name"], n_aside, 0))
                    aside += [("aside_ts", row["name"], ts, 0) for ts in first]
                counted = [minutes.merge(counted)]      # one table of counts, kept small
        rows = [("file", name, ok, bad) for name, (ok, bad) in counts.items()] + aside
        rows += [("part", rel, 0, 0) for rel in writer.close()]
        if counted and counted[0].num_rows:
            per_minute = partwriter.PartitionedWriter(minutes_root, minutes.SCHEMA, ["day"],
                                                      attempt=writer.attempt)
            per_minute.write(counted[0])
            rows += [("minutes", rel, 0, 0) for rel in per_minute.close()]
        yield pa.RecordBatch.from_arrays(
            [pa.array([r[i] for r in rows], t) for i, t in
             enumerate((pa.string(), pa.string(), pa.int64(), pa.int64()))],
            names=[n for n, _ in _WRITTEN_FIELDS])
    return write


def _ingest_here(files, root, file_of, ignore_corrupt, minutes_root):
    """The rows the Spark tasks' ``_write_task`` would return, from the same
    function run over bins of local ``files`` by a pool of worker processes
    (one per core; in this process unless it is ``python -m
    spark_analysis``): a small batch without starting a JVM. A file that
    cannot be read raises as a task does (``unreadable trace file ...``)."""
    import concurrent.futures
    import multiprocessing
    workers = max(1, min(len(files), os.cpu_count() or 1))
    jobs = [(root, ignore_corrupt, minutes_root, group)
            for group in _entry_bins(files, file_of, 4 * workers)]
    from spark_analysis.report import _main_is_ours
    if len(jobs) == 1 or not _main_is_ours():
        # (a worker process imports the main module again: only ours is
        # known to run nothing when imported; any other caller's files are
        # read here, one bin after another)
        return [row for job in jobs for row in _write_here(job)]
    # forkserver: a clean process to fork from (kept by a watcher), not this
    # one with its threads; spawn where its socket cannot be made (a
    # temporary directory whose path is too long for a UNIX socket)
    for method in ("forkserver", "spawn"):
        try:
            context = multiprocessing.get_context(method)
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
                return [row for rows in pool.map(_write_here, jobs) for row in rows]
        except OSError as e:
            if method == "spawn" or "unreadable trace file" in str(e):
                raise


def _write_here(job):
    """One bin of ``_ingest_here``: ``_write_task`` over its files, its rows as dicts."""
    import pyarrow as pa
    root, ignore_corrupt, minutes_root, entries = job
    batch = pa.RecordBatch.from_pylist(
        [dict(e, content=None) for e in entries],
        schema=pa.schema([("path", pa.string()), ("name", pa.string()), ("gz", pa.bool_()),
                          ("content", pa.binary())]))
    out = _write_task(root, ignore_corrupt, minutes_root)(iter([batch]))
    return [row for written in out for row in written.to_pylist()]


def _entry_bins(files, file_of, count):
    """Local ``files`` ([(path, size)], a size 0 looked up) dealt into at most
    ``count`` bins of about equal bytes, each a list of ``_file_entry``: one
    task's (or one local worker's) input each."""
    sizes = {path: size for path, size in files}
    for path in sizes:
        if not sizes[path] and os.path.exists(_local(path)):
            sizes[path] = os.path.getsize(_local(path))
    bins = _bins(list(sizes.items()), max(1, min(len(files), count)))
    return [[_file_entry(p, file_of) for p in group] for group in bins]


def _file_entry(path, file_of):
    """(path to open, name to record, gz) of a local trace file, as Spark's
    tasks get it: the name is the file's URI unless ``file_of`` renames it."""
    name = file_of.get(_file_uri(path), _file_uri(path)) if file_of else _file_uri(path)
    return {"path": os.path.abspath(_local(path)), "name": name, "gz": path.endswith(".gz")}


def _bins(files, count):
    """``files`` ([(path, size)]) dealt into ``count`` lists of about equal
    bytes, biggest first: one Spark task each (a .gz is read whole by one task)."""
    bins = [[0, i, []] for i in range(count)]
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        least = min(bins)
        least[0] += size
        least[2].append(path)
    return [b[2] for b in bins if b[2]]


def _file_frame(spark, files, file_of):
    """A DataFrame (path, name, gz, content) of the local ``files``, one
    partition per bin of files: built from one JSON literal in the plan (a
    literal per file cost 8.8 s of py4j calls for 847 files), so no Python
    rows are shipped to make it."""
    import json
    from pyspark.sql import functions as F
    bins = _entry_bins(files, file_of, 4 * spark.sparkContext.defaultParallelism)
    table = F.from_json(F.lit(json.dumps(bins)),
                        "array<array<struct<path: string, name: string, gz: boolean>>>")
    return (spark.range(0, len(bins), 1, len(bins))
            .select(F.inline(F.element_at(table, (F.col("id") + 1).cast("int"))))
            .withColumn("content", F.lit(None).cast("binary")))


def _remote_frame(spark, files):
    """(path, name, gz, content) of remote files, read by Spark's binaryFile
    source (a file's bytes are one value: under 2 GB each)."""
    from pyspark.sql import functions as F
    return (spark.read.format("binaryFile").load([p for p, _ in files])
            .select(F.lit(None).cast("string").alias("path"), F.col("path").alias("name"),
                    F.col("path").endswith(".gz").alias("gz"), "content"))


def _file_uri(path):
    """How Spark names a local file (``file:/...``, percent-encoded)."""
    from urllib.parse import quote
    return "file:" + quote(os.path.abspath(_local(path)))


def _ship_code(spark):
    """Send this package, as the driver has it, to the Python workers (once
    per SparkContext): on a cluster the executors need only pyarrow, numpy
    and pandas beside it, and locally the workers run this code, not some
    other installed copy."""
    sc = spark.sparkContext
    if getattr(sc, "_elvin_shipped", False):
        return
    import atexit
    import shutil
    import tempfile
    package = os.path.dirname(os.path.abspath(__file__))
    where = tempfile.mkdtemp(prefix="elvin-spark-code-")
    # served to the executors from here for as long as the context lives;
    # removed when the process ends (it was left behind, one per run)
    atexit.register(shutil.rmtree, where, True)
    archive = shutil.make_archive(os.path.join(where, "spark_analysis"), "zip",
                                  os.path.dirname(package), os.path.basename(package))
    sc.addPyFile(archive)
    sc._elvin_shipped = True


def events_schema():
    """The schema of the ``events`` table as read back (partition columns last)."""
    from pyspark.sql import types as T
    L, S = T.LongType(), T.StringType()
    return T.StructType([
        T.StructField("ts_us", L), T.StructField("peer", S), T.StructField("event", S),
        T.StructField("direction", S), T.StructField("routing", T.ArrayType(S)),
        T.StructField("size", L), T.StructField("attrs", T.ArrayType(S)),
        T.StructField("digest", S), T.StructField("filter_nodes", L),
        T.StructField("filter_bytes", L), T.StructField("reason", S),
        T.StructField("unsent", L), T.StructField("origin", S),
        T.StructField("hops", T.IntegerType()),
        T.StructField("dkey", L), T.StructField("akey", L),
        T.StructField("file", S), T.StructField("bad_reason", S), T.StructField("raw", S),
        T.StructField("status", S), T.StructField("day", T.DateType()),
        T.StructField("router", S),
    ])


def _files(spark, files, file_of=None):
    """The task input: a DataFrame of file rows, local and remote."""
    _ship_code(spark)
    local = [(p, s) for p, s in files if _is_local(p)]
    remote = [(p, s) for p, s in files if not _is_local(p)]
    frames = []
    if local:
        frames.append(_file_frame(spark, local, file_of))
    if remote:
        frames.append(_remote_frame(spark, remote))
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])


def read_traces(spark, files, since_us=None, until_us=None, file_of=None,
                ignore_corrupt=False):
    """Parsed records of ``files`` ([(path, size)]), with status 'ok' or 'bad'.

    Each Spark task parses whole files with ``arrowparse`` (Arrow's JSON
    reader, the trace rules checked on columns; a chunk with a bad line is
    judged line by line by ``traceformat.check_record``). Records outside
    [since, until) are left out (they are not bad). Blank lines are
    ignored. ``file_of`` maps Spark's name of an input file (``file:/...``)
    to the name recorded in ``file`` (a copied tail is recorded as the file
    it came from). ``ignore_corrupt`` skips the rest of a file that cannot
    be decompressed instead of failing.
    """
    from pyspark.sql import functions as F
    parsed = _files(spark, files, file_of).mapInArrow(_parse_task(ignore_corrupt),
                                                      events_schema())
    ok = F.col("status") == "ok"
    keep = F.lit(True)
    if since_us is not None:
        keep = keep & (~ok | (F.col("ts_us") >= since_us))
    if until_us is not None:
        keep = keep & (~ok | (F.col("ts_us") < until_us))
    return parsed.where(keep) if since_us is not None or until_us is not None else parsed


def ingest_files(spark, files, out, file_of=None, ignore_corrupt=False, minutes_out=None):
    """Parse ``files`` and write them as the events table at ``out``:
    ({file: (good, bad)}, [Parquet files written, relative to ``out``] or
    None, [per-minute count files written, relative to ``minutes_out``] or
    None, {file: (records set aside for their time, [the first ones' ts_us])}).

    ``spark`` None: local files into a local ``out`` without Spark, by this
    process's own worker processes (``_ingest_here``).

    Where ``out`` is a directory this process (and so, on a cluster, a
    shared mount every executor) can write, the tasks write their own files
    (``partwriter``) and the lists say which to commit; elsewhere (hdfs://,
    s3a://, ...) Spark writes them (None: its committer keeps only what
    succeeded). ``minutes_out``: where the valid records' per-minute counts
    go (``minutes``; by the tasks, or by Spark from what it wrote).
    """
    if not _is_local(out):
        write_events(read_traces(spark, files, file_of=file_of,
                                 ignore_corrupt=ignore_corrupt), out)
        if minutes_out is not None:
            write_minutes(spark.read.parquet(out).where("status = 'ok'"), minutes_out)
        return ingest_stats(spark, out), None, None, aside_stats(spark, out)
    root = os.path.abspath(_local(out))
    minutes_root = os.path.abspath(_local(minutes_out)) if minutes_out is not None else None
    if spark is None:
        rows = _ingest_here(files, root, file_of, ignore_corrupt, minutes_root)
    else:
        from pyspark.sql import types as T
        schema = T.StructType([T.StructField(n, T.StringType() if t == "string"
                                             else T.LongType())
                               for n, t in _WRITTEN_FIELDS])
        rows = (_files(spark, files, file_of)
                .mapInArrow(_write_task(root, ignore_corrupt, minutes_root), schema)
                .collect())
    stats, parts, minute_parts, aside = {}, [], [], {}
    for row in rows:
        if row["kind"] == "part":
            parts.append(row["name"])
        elif row["kind"] == "minutes":
            minute_parts.append(row["name"])
        elif row["kind"] == "aside":
            n, first = aside.get(row["name"], (0, []))
            aside[row["name"]] = (n + row["ok"], first)
        elif row["kind"] == "aside_ts":
            aside.setdefault(row["name"], (0, []))[1].append(row["ok"])
        else:
            ok, bad = stats.get(row["name"], (0, 0))
            stats[row["name"]] = (ok + row["ok"], bad + row["bad"])
    return stats, sorted(parts), sorted(minute_parts), aside


def write_minutes(valid, path):
    """The per-minute counts of ``valid`` (records with their ``day``) as
    Parquet at ``path``, by Spark: what the tasks write where they write
    the events themselves (``minutes``)."""
    from spark_analysis import jobs
    jobs.activity(valid, by_day=True).write.mode("overwrite").partitionBy("day").parquet(path)


def write_events(parsed, path, mode="overwrite"):
    """Write the parsed records as Parquet partitioned by status (ok / bad),
    day (UTC) and router: a time window or one router reads only its own
    directories."""
    # One open file per partition a task meets, instead of sorting the
    # task's rows by partition first (a trace file is one router, a day or
    # two). zstd: half snappy's size, no slower to write or read. Row groups
    # of 16 MB in memory (some 50,000 records): their ts_us statistics let a
    # report on one hour skip the rest of the day (pushed-down time filter).
    parsed.sparkSession.conf.set("spark.sql.maxConcurrentOutputFileWriters", "64")
    (parsed.write.mode(mode).option("compression", "zstd")
     .option("parquet.block.size", str(16 << 20))
     .partitionBy("status", "day", "router").parquet(path))


def ingest_stats(spark, events_path):
    """{file: (good, bad)} from the written events table."""
    from pyspark.sql import functions as F
    rows = (spark.read.parquet(events_path)
            .groupBy("file").agg(F.sum(F.when(F.col("status") == "ok", 1).otherwise(0)).alias("ok"),
                                 F.sum(F.when(F.col("status") == "bad", 1).otherwise(0)).alias("bad"))
            .collect())
    return {row["file"]: (row["ok"], row["bad"]) for row in rows}


def aside_stats(spark, events_path):
    """{file: (records set aside, [the first ones' ts_us])} from the written table."""
    from pyspark.sql import functions as F
    rows = (spark.read.parquet(events_path).where(F.col("status") == "aside")
            .groupBy("file").agg(F.count(F.lit(1)).alias("n"),
                                 F.slice(F.sort_array(F.collect_list("ts_us")), 1,
                                         5).alias("first"))
            .collect())
    return {row["file"]: (row["n"], list(row["first"])) for row in rows}


def display_path(file):
    """A Spark file URI as people write it (file:/a%20b -> /a b); others unchanged."""
    if file.startswith("file:"):
        from urllib.parse import unquote
        path = unquote(file[5:])
        return "/" + path.lstrip("/") if path.startswith("//") else path
    return file


def locate_times(file, times, start_byte=0):
    """[(line_number, ts_us)] of the valid records of a local ``file`` at or
    after ``start_byte`` dated at ``times`` (``arrowparse.lines_at_times``):
    where the records set aside are. A remote file is not read again: []."""
    from spark_analysis import arrowparse
    if not times or not _is_local(file):
        return []
    path = display_path(file)
    return arrowparse.lines_at_times(path, path.endswith(".gz"), times, start_byte)


def locate_bad_lines(spark, file, limit=5, start_byte=0):
    """[(line_number, reason, text)] of the first bad lines of one file.

    The same judgement as the ingest (``arrowparse.line_reason``), line by
    line, stopping once ``limit`` bad lines are found; only lines starting
    at or after ``start_byte`` (of the uncompressed content) are checked,
    but lines are numbered from the file's start. A local file is read
    here; a remote one by one Spark task (its bytes never reach the driver).
    """
    from spark_analysis import arrowparse
    if _is_local(file):
        path = display_path(file)
        return arrowparse.bad_lines(path, path.endswith(".gz"), limit, start_byte)
    from pyspark.sql import types as T
    gz = file.endswith(".gz")

    def scan(batches):
        import pyarrow as pa
        from spark_analysis import arrowparse as ap
        for batch in batches:
            for content in batch.column("content").to_pylist():
                found = ap.bad_lines(content, gz, limit, start_byte)
                yield pa.RecordBatch.from_pylist(
                    [{"line": n, "reason": r, "text": t} for n, r, t in found],
                    schema=pa.schema([("line", pa.int64()), ("reason", pa.string()),
                                      ("text", pa.string())]))
    _ship_code(spark)
    schema = T.StructType([T.StructField("line", T.LongType()),
                           T.StructField("reason", T.StringType()),
                           T.StructField("text", T.StringType())])
    rows = (spark.read.format("binaryFile").load(file).select("content")
            .mapInArrow(scan, schema).collect())
    return sorted((row["line"], row["reason"], row["text"]) for row in rows)[:limit]
