"""Hive-partitioned Parquet files written from a Python task, as Spark lays them out.

The ingest's tasks parse traces with Arrow (``arrowparse``); handing the
rows back to the JVM to write costs as much again as parsing them, so
where the table lives on a file system this process can reach (a local or
shared directory) each task writes its own files here, with pyarrow, in
Spark's layout: ``status=ok/day=2024-05-01/router=<escaped>/part-....parquet``
(partition columns in the path only, zstd, row groups of up to 64k rows,
one or more per trace file, whose ts_us statistics let a time window skip
the rest). Each file is named by the
task attempt that wrote it, and the writer returns the names: only the
files of the attempts whose results reached the driver are committed.
"""

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["PartitionedWriter", "escape_path_name", "DEFAULT_PARTITION", "ROW_GROUP"]

ROW_GROUP = 1 << 16
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# the characters Spark's ExternalCatalogUtils.escapePathName writes as %XX
_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(1, 32)}


def escape_path_name(value):
    """A partition value as Spark writes it in a directory name."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def _partition_dir(keys, values):
    parts = []
    for key, value in zip(keys, values):
        text = DEFAULT_PARTITION if value is None else escape_path_name(str(value))
        parts.append(f"{key}={text}")
    return "/".join(parts)


class PartitionedWriter:
    """Rows of one schema in, Parquet files under ``root`` out, one open
    file per partition met (a task meets a router or two, a day or two)."""

    def __init__(self, root, schema, partition_by, attempt=None, compression="zstd"):
        self.root, self.keys = root, list(partition_by)
        self.data_schema = pa.schema([f for f in schema if f.name not in self.keys])
        self.attempt = attempt or uuid.uuid4().hex
        self.compression = compression
        self._open = {}          # partition values -> (relative path, ParquetWriter)
        self._pending = {}       # partition values -> [pa.Table] not yet a row group
        self._rows = {}
        self.written = []        # relative paths of the files closed

    def write(self, table):
        """Add ``table`` (the full schema, partition columns included)."""
        if not table.num_rows:
            return
        groups = table.group_by(self.keys, use_threads=False).aggregate([])
        if groups.num_rows == 1:
            self._add(tuple(groups.column(k)[0].as_py() for k in self.keys), table)
            return
        import pyarrow.compute as pc
        for i in range(groups.num_rows):
            values = tuple(groups.column(k)[i].as_py() for k in self.keys)
            mask = None
            for key, value in zip(self.keys, values):
                cond = pc.is_null(table.column(key)) if value is None else \
                    pc.equal(table.column(key), pa.scalar(value, table.schema.field(key).type))
                mask = cond if mask is None else pc.and_(mask, cond)
            self._add(values, table.filter(mask))

    def _add(self, values, table):
        self._pending.setdefault(values, []).append(table.select(self.data_schema.names))
        self._rows[values] = self._rows.get(values, 0) + table.num_rows
        if self._rows[values] >= ROW_GROUP:
            self._flush(values)

    def _flush(self, values):
        tables = self._pending.pop(values, [])
        self._rows.pop(values, None)
        if not tables:
            return
        if values not in self._open:
            rel = (f"{_partition_dir(self.keys, values)}/"
                   f"part-{self.attempt}-{len(self._open):05d}.{self.compression}.parquet")
            path = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            writer = pq.ParquetWriter(path, self.data_schema, compression=self.compression)
            self._open[values] = (rel, writer)
        self._open[values][1].write_table(pa.concat_tables(tables), row_group_size=ROW_GROUP)

    def flush(self):
        """Write what is pending as row groups (a task calls it after each
        trace file: its memory then holds one file's rows at most)."""
        for values in list(self._pending):
            self._flush(values)

    def close(self):
        """Write what is pending, close every file; the relative paths written."""
        self.flush()
        for rel, writer in self._open.values():
            writer.close()
            self.written.append(rel)
        self._open.clear()
        return self.written
