"""Merging a partition's small Parquet files into one (local tables).

Every batch the ingest commits adds a file per router (and day) to
``events`` and one per task to ``event_minutes``. A watcher reading a
minute at a time (``--watch 1m``) adds some ten thousand a day, and every
query over a day then opens every one of them: an hour's analysis over
a table read in sixty one-minute batches took 11.7-13.1 s against 7.2-8.9 s
over the same hour read at once. So after a batch, a partition holding
``MIN_FILES`` or more files smaller than ``SMALL_BYTES`` has those files
merged into one: the events sorted by time (a window then finds its rows
in few row groups), the per-minute counts summed per minute.

This module only plans and writes; ``TraceStore.compact`` decides when,
commits the merged files crash-safely and keeps readers out while the
files change.
"""

import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark_analysis import minutes, partwriter

__all__ = ["MIN_FILES", "SMALL_BYTES", "plan", "merge"]

MIN_FILES = 16             # small files in one partition before they are merged
SMALL_BYTES = 16 << 20     # a file this big or bigger is left as it is


def plan(root, min_files=MIN_FILES, small_bytes=SMALL_BYTES):
    """[(partition directory relative to ``root``, [file names])]: the
    partitions (leaf directories) under ``root`` with at least ``min_files``
    Parquet files under ``small_bytes``, and those files, sorted."""
    found = []
    if not os.path.isdir(root):
        return found
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        small = sorted(n for n in names
                       if n.endswith(".parquet") and not n.startswith((".", "_"))
                       and os.path.getsize(os.path.join(dirpath, n)) < small_bytes)
        if len(small) >= min_files:
            found.append((os.path.relpath(dirpath, root), small))
    return found


def merge(paths, target, counts=False):
    """Write the rows of the Parquet files ``paths`` to one file ``target``.

    Events (``counts`` false) are sorted by ``ts_us`` (a stable sort, so
    records of one time keep their order); per-minute counts (``counts``)
    are summed per router, peer, direction, event and minute. Returns the
    number of rows written. ValueError if the files' columns differ.
    """
    # ParquetFile, not read_table: a path in a key=value directory would
    # gain the partition columns, which the files do not hold
    tables = [pq.ParquetFile(p).read() for p in paths]
    if any(not t.schema.equals(tables[0].schema) for t in tables[1:]):
        # (files written by different versions of this package)
        raise ValueError("the files' columns differ")
    table = pa.concat_tables(tables)
    if counts:
        # (the day is the partition's: the same for every row, so left out)
        day = pa.nulls(table.num_rows, pa.date32())
        table = minutes.summed(table.append_column("day", day)).drop_columns(["day"])
        table = table.take(pc.sort_indices(table, [(k, "ascending") for k in minutes.KEYS]))
    elif "ts_us" in table.column_names:
        # (nulls -- bad lines without a time -- last, Arrow's default)
        table = table.take(pc.sort_indices(table, [("ts_us", "ascending")]))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    pq.write_table(table, target, compression="zstd", row_group_size=partwriter.ROW_GROUP)
    return table.num_rows
