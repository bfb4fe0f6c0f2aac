"""Stage 1: find the trace files, parse and check every line, write ``events``.

The JSON is parsed once, with an explicit schema (``trace_schema()``), by
Spark's JSON data source; every later job reads the Parquet table this
stage writes. A line is *bad* when it is not a JSON object of the schema's types
or breaks a rule of docs/traces.md; ``bad_reason`` says which, in the same
words as ``traceformat.check_record``. Bad lines are counted per file and
skipped; ``locate_bad_lines`` finds their line numbers afterwards (only for
the files that have some).
"""

import os
import re

from spark_analysis import traceformat as tf

__all__ = ["trace_schema", "events_schema", "TraceInputError", "list_trace_files", "prune_by_name",
           "unreadable_files",
           "read_traces", "write_events", "ingest_stats", "locate_bad_lines",
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
        T.StructField("reason", S), T.StructField("_corrupt", S),
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


def list_trace_files(path, spark=None):
    """[(path, size)] of ``*.jsonl`` and ``*.jsonl.gz`` under ``path``, recursively.

    Local paths are listed with os; other URIs (hdfs://, s3a://, ...) with
    Hadoop's FileSystem through ``spark``. Raises TraceInputError if the
    path does not exist or holds no trace file.
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
                        found.append((full, os.path.getsize(full)))
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
# parsing and checking

def _bad_reason():
    """Column: why a parsed line is bad, or null (traceformat.check_record's rules).

    Written for speed, as it runs on every line: one hash lookup for the
    event, one for the (event, direction) pair, and no lambdas or regular
    expressions (those are evaluated row by row outside generated code).
    """
    from pyspark.sql import functions as F
    r = lambda name: F.col("r." + name)  # noqa: E731
    event = r("event")
    notify = event.isin(*tf.NOTIFY_EVENTS)
    subreplace = event.isin(*tf.SUBREPLACE_EVENTS)
    pairs = [f"{name}/{d}" for name, directions in tf.DIRECTIONS.items() for d in directions]
    digest = r("digest")
    # a marker no domain holds: arrays_overlap(list, [marker]) is null
    # exactly when the (non-empty) list holds a null
    marker = F.array(F.lit("\u0000"))
    checks = [
        (F.col("r").isNull(), F.lit("not a JSON object")),
        (r("_corrupt").isNotNull(), F.lit("not a JSON object with fields of the right types")),
        (r("v").isNull(), F.lit("missing field 'v'")),
        (r("v") != tf.FORMAT_VERSION,
         F.concat(F.lit("unsupported format version "), r("v").cast("string"))),
        (r("ts_us").isNull(), F.lit("missing field 'ts_us'")),
        ((r("ts_us") < tf.MIN_TS_US) | (r("ts_us") > tf.MAX_TS_US),
         F.lit("ts_us out of range (microseconds since 1970 expected)")),
        (r("router").isNull(), F.lit("missing field 'router'")),
        (r("router") == "", F.lit("empty 'router'")),
        (event.isNull(), F.lit("missing field 'event'")),
        (~event.isin(*tf.EVENTS), F.concat(F.lit("unknown event '"), event, F.lit("'"))),
        (r("direction").isNull(), F.lit("missing field 'direction'")),
        (~F.concat(event, F.lit("/"), r("direction")).isin(*pairs),
         F.concat(F.lit("direction '"), r("direction"), F.lit("' not allowed for "), event)),
        (r("peer").isNull() & (event != "link_down"),
         F.lit("'peer' may be null only for link_down")),
    ]
    for name in tf.NOTIFY_FIELDS:
        checks.append((notify & r(name).isNull(), F.lit(f"missing field {name!r}")))
    checks += [
        (notify & (F.size(r("routing")) == 0), F.lit("'routing' must not be empty")),
        (notify & F.arrays_overlap(r("routing"), marker).isNull(),
         F.lit("'routing' must be a list of strings")),
        (notify & (F.size(r("attrs")) > 0) & F.arrays_overlap(r("attrs"), marker).isNull(),
         F.lit("'attrs' must be a list of strings")),
        (notify & (r("size") < 0), F.lit("negative 'size'")),
        # 40 characters, hexadecimal (unhex is null otherwise), lower case
        (notify & ((F.length(digest) != 40) | F.unhex(digest).isNull()
                   | (F.lower(digest) != digest)),
         F.lit("'digest' must be 40 lowercase hex digits")),
    ]
    for name in ("filter_nodes", "filter_bytes"):
        checks.append((subreplace & r(name).isNull(), F.lit(f"missing field {name!r}")))
    checks += [
        (subreplace & ((r("filter_nodes") < 0) | (r("filter_bytes") < 0)),
         F.lit("negative filter size")),
        ((event == "link_down") & r("reason").isNull(), F.lit("missing field 'reason'")),
    ]
    expr = None
    for cond, reason in checks:
        expr = F.when(cond, reason) if expr is None else expr.when(cond, reason)
    return expr


def _checked(lines):
    """Columns ``r`` (parsed struct), ``file``, ``value`` -> record columns + bad_reason."""
    from pyspark.sql import functions as F
    parsed = lines.withColumn("bad_reason", _bad_reason())
    r = lambda name: F.col("r." + name)  # noqa: E731
    return parsed.select(
        r("ts_us").alias("ts_us"), r("router").alias("router"), r("peer").alias("peer"),
        r("event").alias("event"), r("direction").alias("direction"),
        r("routing").alias("routing"), r("size").alias("size"),
        F.sort_array(r("attrs")).alias("attrs"), r("digest").alias("digest"),
        r("filter_nodes").alias("filter_nodes"), r("filter_bytes").alias("filter_bytes"),
        r("reason").alias("reason"),
        F.get(r("routing"), 0).alias("origin"),
        F.size(r("routing")).alias("hops"),
        # 64-bit hashes of the digest and of the attribute-name set, made
        # once here: the jobs group, join and count distinct on these
        # instead of hashing 40-character strings and arrays in every pass
        F.when(r("digest").isNotNull(), F.xxhash64(r("digest"))).alias("dkey"),
        F.when(r("attrs").isNotNull(), F.xxhash64(F.sort_array(r("attrs")))).alias("akey"),
        "file", "bad_reason",
        F.when(F.col("bad_reason").isNotNull(), F.substring("value", 1, 300)).alias("raw"))


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
        T.StructField("origin", S), T.StructField("hops", T.IntegerType()),
        T.StructField("dkey", L), T.StructField("akey", L),
        T.StructField("file", S), T.StructField("bad_reason", S), T.StructField("raw", S),
        T.StructField("status", S), T.StructField("day", S), T.StructField("router", S),
    ])


def read_traces(spark, files, since_us=None, until_us=None, file_of=None,
                ignore_corrupt=False):
    """Parsed records of ``files`` ([(path, size)]), with status 'ok' or 'bad'.

    Spark's JSON data source with the explicit schema, in PERMISSIVE mode
    (a line that is not a JSON object of the schema's types keeps its text
    in ``_corrupt``). Records outside [since, until) are left out (they
    are not bad). Blank lines are ignored. ``file_of`` maps Spark's name of
    an input file (``file:/...``) to the name recorded in ``file`` (a
    copied tail is recorded as the file it came from). ``ignore_corrupt``
    lets Spark skip a file it cannot decompress instead of failing.
    """
    from pyspark.sql import functions as F
    raw = (spark.read.schema(_schema())
           .option("mode", "PERMISSIVE")
           .option("ignoreCorruptFiles", "true" if ignore_corrupt else "false")
           .option("columnNameOfCorruptRecord", "_corrupt")
           .json([p for p, _ in files]))
    file = F.col("_metadata.file_path")
    if file_of:
        mapping = F.create_map(*[F.lit(x) for kv in sorted(file_of.items()) for x in kv])
        file = F.coalesce(F.element_at(mapping, file), file)
    lines = raw.select(F.struct(*[F.col(c) for c in raw.columns]).alias("r"),
                       file.alias("file"),
                       F.col("_corrupt").alias("value"))
    parsed = _checked(lines)
    ok = F.col("bad_reason").isNull()
    keep = F.lit(True)
    if since_us is not None:
        keep = keep & (~ok | (F.col("ts_us") >= since_us))
    if until_us is not None:
        keep = keep & (~ok | (F.col("ts_us") < until_us))
    return (parsed.where(keep)
            .withColumn("status", F.when(ok, F.lit("ok")).otherwise(F.lit("bad")))
            .withColumn("day", F.to_date(F.timestamp_micros("ts_us"))))


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


def display_path(file):
    """A Spark file URI as people write it (file:/a%20b -> /a b); others unchanged."""
    if file.startswith("file:"):
        from urllib.parse import unquote
        path = unquote(file[5:])
        return "/" + path.lstrip("/") if path.startswith("//") else path
    return file


def _check_lines(spark, lines, limit):
    """lines: DataFrame (idx, value) -> first ``limit`` bad ones as (idx, reason, text)."""
    from pyspark.sql import functions as F
    parsed = (lines.where(F.trim("value") != "")
              .select("idx", "value", F.from_json("value", _schema(),
                                                  {"mode": "PERMISSIVE",
                                                   "columnNameOfCorruptRecord": "_corrupt"}
                                                  ).alias("r")))
    bad = (parsed.withColumn("bad_reason", _bad_reason())
           .where(F.col("bad_reason").isNotNull())
           .orderBy("idx").limit(limit)
           .select("idx", "bad_reason", F.substring("value", 1, 120).alias("text"))
           .collect())
    return [(row["idx"] + 1, row["bad_reason"], row["text"]) for row in bad]


def locate_bad_lines(spark, file, limit=5, chunk=50000, start_byte=0):
    """[(line_number, reason, text)] of the first bad lines of one file.

    The same checks as the ingest, applied to numbered lines, plus one the
    JSON reader cannot make: a line that is not valid UTF-8 (Spark reads it
    with replacement characters, and it may parse) is named here. A local
    file is read here, ``chunk`` lines at a time, stopping once ``limit``
    bad lines are found; only lines starting at or after ``start_byte``
    (of the uncompressed content) are checked, but lines are numbered from
    the file's start. A remote one is numbered with zipWithIndex (no code
    of ours runs on the executors).
    """
    from pyspark.sql import types as T
    schema = T.StructType([T.StructField("idx", T.LongType()),
                           T.StructField("value", T.StringType())])
    if _is_local(file):
        import gzip
        path = display_path(file)
        opener = gzip.open if path.endswith(".gz") else open
        found, number, position = [], 0, 0
        with opener(path, "rb") as f:
            while len(found) < limit:
                batch = []
                for raw in f:
                    number += 1
                    at, position = position, position + len(raw)
                    if at < start_byte:
                        continue
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        found.append((number, f"not valid UTF-8 (byte {e.start + 1} of the line)",
                                      raw[:120].decode("utf-8", "replace").rstrip("\r\n")))
                        if len(found) >= limit:
                            break
                        continue
                    batch.append((number - 1, text.rstrip("\r\n")))
                    if len(batch) >= chunk:
                        break
                if not batch:
                    break
                found += _check_lines(spark, spark.createDataFrame(batch, schema),
                                      limit - len(found))
        found.sort()
        return found[:limit]
    from pyspark.sql import functions as F
    indexed = spark.read.text(file).rdd.zipWithIndex()
    rows = T.StructType([
        T.StructField("row", T.StructType([T.StructField("value", T.StringType())])),
        T.StructField("idx", T.LongType())])
    lines = spark.createDataFrame(indexed, rows).select(
        "idx", F.col("row.value").alias("value"))
    return _check_lines(spark, lines, limit)
