"""Per-minute counts of the valid records, made at ingest.

The analysis starts from ``jobs.activity``: every record counted per
router, peer, direction, event and minute. Counting it with Spark is a
pass over the whole window (at 10M records, 4-6 s of a run); each ingest
task already holds its records as Arrow tables, and counting them there
costs about 0.07 us a record. So each task writes its partial counts
next to the events (``event_minutes``, partitioned by day), and
``TraceStore.per_minute`` sums them for a window, counting only the
window's cut minutes at its edges from the records themselves.

The counts are sums, minima and maxima, so partial counts of the same
minute (a file read in two batches, two files of a router meeting at a
rotation) add up to the exact count.
"""

import numpy as np
import pyarrow as pa

from spark_analysis.jobs import MINUTE_US      # the minutes jobs.activity counts by

__all__ = ["MINUTE_US", "KEYS", "SCHEMA", "partial", "merge", "summed"]

KEYS = ["router", "peer", "direction", "event", "minute_us"]
_S = pa.string()
# jobs.activity's columns, and the day (the table's partition column)
SCHEMA = pa.schema([("router", _S), ("peer", _S), ("direction", _S), ("event", _S),
                    ("minute_us", pa.int64()), ("n", pa.int64()), ("bytes", pa.int64()),
                    ("first_us", pa.int64()), ("last_us", pa.int64()),
                    ("day", pa.date32())])


def partial(table):
    """Per-minute counts (``SCHEMA``) of an Arrow table of valid records
    (``arrowparse.EVENTS_SCHEMA``)."""
    ts = table.column("ts_us").to_numpy()
    # minute as Spark's jobs._floor makes it: ts - ts % unit, the remainder
    # taking the sign of ts (Java's), so the same minute either way
    minute = ts - np.fmod(ts, MINUTE_US)
    keyed = pa.table({
        "router": table.column("router"), "peer": table.column("peer"),
        "direction": table.column("direction"), "event": table.column("event"),
        "minute_us": pa.array(minute, pa.int64()), "day": table.column("day"),
        "size": table.column("size"), "ts_us": table.column("ts_us")})
    counted = keyed.group_by(KEYS + ["day"], use_threads=False).aggregate(
        [([], "count_all"), ("size", "sum"), ("ts_us", "min"), ("ts_us", "max")])
    return _as_schema(counted, {"count_all": "n", "size_sum": "bytes",
                                "ts_us_min": "first_us", "ts_us_max": "last_us"})


def merge(tables):
    """Partial counts (``SCHEMA``) added up: one row per key and day."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return SCHEMA.empty_table()
    if len(tables) == 1:
        return tables[0]
    return summed(pa.concat_tables(tables))


def summed(table):
    """Counts (``SCHEMA``) with one row per key and day: rows of one minute
    added up (a table merged from several files' counts)."""
    counted = table.group_by(KEYS + ["day"], use_threads=False).aggregate(
        [("n", "sum"), ("bytes", "sum"), ("first_us", "min"), ("last_us", "max")])
    return _as_schema(counted, {"n_sum": "n", "bytes_sum": "bytes",
                                "first_us_min": "first_us", "last_us_max": "last_us"})


def _as_schema(table, renames):
    table = table.rename_columns([renames.get(n, n) for n in table.column_names])
    return table.select(SCHEMA.names).cast(SCHEMA)
