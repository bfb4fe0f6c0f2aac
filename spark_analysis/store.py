"""The durable trace table: every trace line read once, kept as Parquet.

``TraceStore(spark, tables_dir)`` keeps, under ``tables_dir``::

    events/status=ok/day=YYYY-MM-DD/router=<domain>/part-*.parquet
    events/status=bad/...                 lines that broke a rule (bad_reason, raw)
    event_minutes/day=YYYY-MM-DD/*.parquet  the valid records counted per minute
                                          (``minutes``), written with the events
    _ingest/manifest.json                 what has been read, file by file
    _ingest/pending-<batch>.json          a batch being committed (see below)
    _ingest/staging/<batch>/              a batch's copied tails and Spark output
    _ingest/compact-<id>.json             a merge of small files being committed
    _ingest/compacting/<id>/              the merged files before they are moved in

``update(files)`` reads only what the manifest does not hold yet and
appends it; ``events(since, until)`` is the table, for a window (whole days
are pruned by the ``day`` partition), and ``per_minute(since, until)`` its
per-minute counts. A daily job therefore reads one day
of JSON, not the month before it.

What counts as "the same file": its name without ``.gz`` (trace file names
carry the domain, when the file was opened and a sequence number, so they
stay the same when traces are copied elsewhere) together with a SHA-1 of
its first bytes, as far as they were read. Hence:

* a file that **grew** (the router's current file) gets only its new
  complete lines read -- from the byte where the last run stopped, which is
  always the end of a line (a partial last line waits for the next run);
* a file **rotated** to ``.jsonl.gz`` after part of it was read gets the
  rest read from the decompressed stream;
* a file **replaced** by another of the same name (different first bytes)
  is a new file;
* a file **shorter** than what was read from it is named in a warning and
  left alone (what was read stays in the table).

Only local files are followed this way. Files on other file systems
(``hdfs://``, ``s3a://``, ...) are read whole, once, by name and size; one
that changed size after it was read is named in a warning and not re-read.

A batch commits in three steps so that a crash at any point neither loses
nor doubles records: Spark writes the batch under ``staging``; a
``pending`` file records the batch's manifest entries; the part files are
renamed into ``events`` (and the per-minute counts into ``event_minutes``)
and the manifest is replaced (write + rename).
``recover()`` (called by ``update``) completes a pending batch and removes
staging left by a batch that never got as far as its pending file.

After a batch, ``compact()`` merges each partition's small files into one
(``compaction``; local tables only), the same way: the merged files are
written aside, a ``compact-<id>.json`` names them and the files they
replace, then they are moved in and the others deleted; ``recover()``
finishes a merge that got as far as its record and drops one that did not.
A merge changes files that a query may be reading, so it waits for no
one: it is skipped while any ``pipeline.run`` holds the table for reading
(``start_reading``), and tried again after the next batch.
"""

import contextlib
import datetime
import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import uuid
import zlib

from spark_analysis import compaction, ingest
from spark_analysis import traceformat as tf

__all__ = ["TraceStore", "BatchResult", "HEAD_BYTES", "BAD_LINES_LISTED", "BAD_FILES_LISTED",
           "MANIFEST_VERSION", "MINUTES_TABLE", "expected_records"]

HEAD_BYTES = 4096          # bytes hashed to recognise a file
# bad lines named (line, reason, text) per file, in the manifest and
# csv/bad_lines.csv, and files whose bad lines are named, per batch: the
# rest are counted (csv/files.csv), not named
BAD_LINES_LISTED = 1000
BAD_FILES_LISTED = 100
MINUTES_TABLE = "event_minutes"   # per-minute counts made at ingest (``minutes``)
MANIFEST_VERSION = 4          # 2: events carry dkey and akey; 3: keys made by arrowparse;
                              # 4: events carry link_down's unsent
_COPY_CHUNK = 1 << 20


class BatchResult:
    """What one ``update`` read: counts, per-file figures, warnings."""

    def __init__(self):
        self.batch = None
        self.records = 0            # good records added
        self.bad = 0                # bad lines added
        self.parts = []             # [(path, kind)] read: kind whole | tail | prefix
        self.unchanged = 0          # files already in the table
        self.unreadable = []        # [(path, reason)]
        self.warnings = []          # [text]
        self.file_stats = {}        # path -> (ok, bad) of this batch
        self.bad_examples = []      # [(path, line, reason, text)]
        self.aside = 0              # valid records set aside: dated far from their file's
        self.aside_examples = []    # [(path, line or None, ts_us)]
        self.copies = []            # [(path, kept path, how)]: copies not read (_copies)


def _now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stem(path):
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name[:-3] if name.endswith(".gz") else name


def _open_uncompressed(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _head_hash(path, length):
    """SHA-1 of the first ``length`` uncompressed bytes, or None if shorter."""
    with _open_uncompressed(path) as f:
        data = f.read(length)
    if len(data) < length:
        return None
    return hashlib.sha1(data).hexdigest()


class _LocalFS:
    """The few file operations the store needs, on the local disk."""

    def __init__(self, root):
        self.root = root

    def join(self, *parts):
        return os.path.join(self.root, *parts)

    def exists(self, path):
        return os.path.exists(path)

    def read_text(self, path):
        with open(path, encoding="utf-8") as f:
            return f.read()

    def write_text(self, path, text):
        """Atomically: a reader sees the old file or the new one."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def delete(self, path):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)

    def list_files(self, path):
        """Relative paths of the files under ``path``."""
        found = []
        for dirpath, _, names in os.walk(path):
            for name in names:
                found.append(os.path.relpath(os.path.join(dirpath, name), path))
        return sorted(found)

    def rename(self, src, dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)

    def uri(self, path):
        return path


class _HadoopFS:
    """The same operations through Hadoop's FileSystem (hdfs://, s3a://, ...)."""

    def __init__(self, spark, root):
        self.spark, self.root = spark, root.rstrip("/")
        jvm = spark.sparkContext._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        self.fs = self._Path(self.root).getFileSystem(
            spark.sparkContext._jsc.hadoopConfiguration())
        self.jvm = jvm

    def join(self, *parts):
        return "/".join([self.root, *parts])

    def exists(self, path):
        return self.fs.exists(self._Path(path))

    def read_text(self, path):
        stream = self.fs.open(self._Path(path))
        try:
            reader = self.jvm.java.io.BufferedReader(
                self.jvm.java.io.InputStreamReader(stream, "UTF-8"))
            lines = []
            while True:
                line = reader.readLine()
                if line is None:
                    break
                lines.append(line)
            return "\n".join(lines)
        finally:
            stream.close()

    def write_text(self, path, text):
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        out = self.fs.create(self._Path(tmp), True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        self.fs.delete(self._Path(path), False)
        self.fs.rename(self._Path(tmp), self._Path(path))

    def delete(self, path):
        self.fs.delete(self._Path(path), True)

    def list_files(self, path):
        base = self._Path(path)
        if not self.fs.exists(base):
            return []
        prefix = self.fs.makeQualified(base).toString().rstrip("/") + "/"
        found = []
        it = self.fs.listFiles(base, True)
        while it.hasNext():
            full = it.next().getPath().toString()
            found.append(full[len(prefix):] if full.startswith(prefix) else full)
        return sorted(found)

    def rename(self, src, dst):
        parent = self._Path(dst).getParent()
        self.fs.mkdirs(parent)
        if not self.fs.rename(self._Path(src), self._Path(dst)):
            raise OSError(f"could not rename {src} to {dst}")

    def uri(self, path):
        return path


def unreadable_named(text, named):
    """The ``unreadable trace file NAME: WHY`` match in a Spark error's
    ``text`` whose NAME is one of ``named``, or None. The Python worker's
    traceback quotes the raising line first, with its ``{row['name']}``
    placeholder: only a match naming one of ours counts."""
    return next((m for m in re.finditer(r"unreadable trace file (\S+?): ([^\n]*)", text)
                 if m.group(1) in named), None)


class TraceStore:
    """The events table under ``tables_dir`` and the record of what is in it."""

    def __init__(self, spark, tables_dir, local_staging=None):
        self.spark = spark
        self.tables_dir = tables_dir.rstrip("/") or "/"
        local = ingest._is_local(tables_dir)
        self.fs = (_LocalFS(ingest._local(self.tables_dir)) if local
                   else _HadoopFS(spark, self.tables_dir))
        self.events_path = self.fs.join("events")
        self.minutes_path = self.fs.join(MINUTES_TABLE)
        self.meta = self.fs.join("_ingest")
        # tails of local files are copied to local disk (the driver's);
        # Spark's batch output goes next to the table (same file system)
        # (with remote tables, a local temporary directory: on a cluster the
        # traces, and so their tails, must be on storage every node reads)
        self.local_staging = local_staging or (
            os.path.join(self.fs.root, "_ingest", "staging") if local
            else os.path.join(tempfile.gettempdir(), "elvin-trace-staging"))
        self._manifest = None
        self._reading = None          # the open lock file while reading (start_reading)

    # -- the manifest ------------------------------------------------------

    def manifest(self):
        if self._manifest is None:
            path = self.fs.join("_ingest", "manifest.json")
            if self.fs.exists(path):
                data = json.loads(self.fs.read_text(path))
                if data.get("version") != MANIFEST_VERSION:
                    raise ingest.TraceInputError(
                        f"{path}: manifest version {data.get('version')} is not "
                        f"{MANIFEST_VERSION} (written by an older version); use --rebuild "
                        f"or a new --tables directory")
                self._manifest = data
            else:
                # a table begun by this version has every batch's per-minute
                # counts ("minutes"); one begun before does not, and its
                # counts are made from the events (``per_minute``)
                self._manifest = {"version": MANIFEST_VERSION, "files": {}, "batches": [],
                                  "minutes": not self.has_events()}
        return self._manifest

    def _save_manifest(self):
        self.fs.write_text(self.fs.join("_ingest", "manifest.json"),
                           json.dumps(self._manifest, indent=1, sort_keys=True))

    def entries(self):
        """[entry] for every file read so far (path, records, bad, ...)."""
        return list(self.manifest()["files"].values())

    def clear(self):
        """Forget everything: the next update reads every file again."""
        self.fs.delete(self.events_path)
        self.fs.delete(self.minutes_path)
        self.fs.delete(self.meta)
        self._manifest = None

    def has_events(self):
        return self.fs.exists(self.fs.join("events", "status=ok"))

    # -- crash recovery ----------------------------------------------------

    def recover(self):
        """Finish a batch that was pending; drop staging of batches that were not."""
        manifest = self.manifest()
        staging = self.fs.join("_ingest", "staging")
        pending = [p for p in self.fs.list_files(self.meta)
                   if "/" not in p and p.startswith("pending-") and p.endswith(".json")]
        for name in pending:
            batch = json.loads(self.fs.read_text(self.fs.join("_ingest", name)))
            self._move_parts(batch["batch"], batch.get("parts"), batch.get("minute_parts"))
            self._apply(manifest, batch)
            self._save_manifest()
            self.fs.delete(self.fs.join("_ingest", name))
        self.fs.delete(staging)
        if isinstance(self.fs, _LocalFS):
            # a merge recorded before a crash is finished (until then the
            # table may hold its rows twice); one that was not is dropped
            for name in sorted(os.listdir(self.meta)) if os.path.isdir(self.meta) else []:
                if name.startswith("compact-") and name.endswith(".json"):
                    self._commit_compaction(json.loads(self.fs.read_text(
                        self.fs.join("_ingest", name))))
            self.fs.delete(self.fs.join("_ingest", "compacting"))
        if os.path.isdir(self.local_staging):
            shutil.rmtree(self.local_staging, ignore_errors=True)

    def _apply(self, manifest, batch):
        if batch["batch"] in manifest["batches"]:
            return
        for key, entry in batch["entries"].items():
            manifest["files"][key] = entry
        manifest["batches"].append(batch["batch"])
        if "minute_parts" not in batch:
            manifest["minutes"] = False       # a batch pending from an older version

    def _move_parts(self, batch, parts=None, minute_parts=None):
        """Rename the batch's Parquet files from staging into ``events``:
        ``parts`` (those the ingest's finished tasks wrote), or, when Spark
        wrote them (None), every one its committer left; and its per-minute
        counts into ``event_minutes`` (``minute_parts`` likewise)."""
        for staged, table, names in (("out", "events", parts),
                                     ("minutes", MINUTES_TABLE, minute_parts)):
            out = self.fs.join("_ingest", "staging", batch, staged)
            if names is None:
                names = [rel for rel in self.fs.list_files(out)
                         if rel.rsplit("/", 1)[-1].endswith(".parquet")]
            for rel in names:
                if not self.fs.exists(self.fs.join("_ingest", "staging", batch, staged, rel)):
                    continue        # moved already (a recovery after a crash mid-move)
                self.fs.rename(self.fs.join("_ingest", "staging", batch, staged, rel),
                               self.fs.join(table, rel))

    # -- planning what to read ---------------------------------------------

    def plan(self, files):
        """(parts, entries, unchanged, warnings).

        ``parts``: [(path_for_spark, source_path, kind, first_byte)] to read;
        ``entries``: manifest entries as they will be once they are read.
        """
        known = self.manifest()["files"]
        by_stem = {}
        for key, entry in known.items():
            by_stem.setdefault(entry["stem"], []).append((key, entry))
        newest = _newest_plain_per_domain(files)
        plain = {_stem(p) for p, _ in files if not p.endswith(".gz")}
        parts, entries, warnings = [], {}, []
        unchanged = 0
        for path, size in files:
            local = ingest._is_local(path)
            stem = _stem(path)
            if path.endswith(".gz") and stem in plain:
                continue        # being compressed: the plain file is read until it is gone
            fpath = ingest._local(path) if local else path
            if not local:
                match = [(k, e) for k, e in by_stem.get(stem, ()) if e.get("remote")]
                if match:
                    if match[0][1]["size"] != size:
                        warnings.append(f"{path}: size changed since it was read "
                                        f"({match[0][1]['size']} -> {size} bytes); not re-read")
                    unchanged += 1
                    continue
                key = f"{stem}#{size}"
                entries[key] = {"stem": stem, "path": path, "remote": True, "size": size,
                                "offset": size, "records": 0, "bad": 0, "gz": path.endswith(".gz"),
                                "read_at": _now_iso()}
                parts.append((path, path, "whole", 0))
                continue
            stat = os.stat(fpath)
            match = None
            for key, entry in by_stem.get(stem, ()):
                if entry.get("remote"):
                    continue
                try:
                    same = _head_hash(fpath, entry["head_len"]) == entry["head"]
                except (OSError, EOFError, zlib.error):
                    same = False
                if same:
                    match = (key, entry)
                    break
            if match is not None:
                key, entry = match
                same = (entry["path"] == path and entry["size"] == stat.st_size
                        and entry["mtime_ns"] == stat.st_mtime_ns)
                if same and not entry["gz"] and entry["offset"] < stat.st_size:
                    # a partial last line that has not grown since the last run:
                    # the writer stopped (killed); it is read, and judged, now
                    entries[key] = dict(entry, read_at=_now_iso(), finished=True)
                    parts.append((path, path, "tail", entry["offset"]))
                    continue
                if same:
                    unchanged += 1
                    continue
                if entry.get("complete") and path.endswith(".gz") == entry["gz"]:
                    unchanged += 1       # a closed .gz read to its end: nothing new
                    continue
                new = dict(entry, path=path, size=stat.st_size, mtime_ns=stat.st_mtime_ns,
                           gz=path.endswith(".gz"), read_at=_now_iso())
                if not new["gz"] and stat.st_size < entry["offset"]:
                    warnings.append(f"{path}: now {stat.st_size} bytes, shorter than the "
                                    f"{entry['offset']} already read; left as it was")
                    continue
                new["complete"] = new["gz"]
                # a newer file of the router exists: this one is closed, its
                # partial last line (if any) is read and judged
                new["finished"] = new["gz"] or path not in newest
                entries[key] = new
                parts.append((path, path, "tail", entry["offset"]))
                continue
            shorter = [e for _, e in by_stem.get(stem, ())
                       if not e.get("remote") and not e["gz"] and e["offset"] > stat.st_size]
            if shorter and not path.endswith(".gz"):
                warnings.append(f"{path}: now {stat.st_size} bytes, shorter than the "
                                f"{shorter[0]['offset']} already read; left as it was")
                continue
            # a file not seen before
            head_len = min(HEAD_BYTES, stat.st_size) if not path.endswith(".gz") else None
            entry = {"stem": stem, "path": path, "size": stat.st_size,
                     "mtime_ns": stat.st_mtime_ns, "gz": path.endswith(".gz"),
                     "offset": 0, "head_len": head_len, "head": None,
                     "records": 0, "bad": 0, "complete": path.endswith(".gz"),
                     "read_at": _now_iso(), "examples": []}
            key = f"{stem}#{uuid.uuid4().hex[:12]}"
            entries[key] = entry
            if entry["gz"] or path not in newest:
                # closed: read as it is (a partial last line is judged: a bad line)
                parts.append((path, path, "whole", 0))
            else:
                parts.append((path, path, "prefix", 0))     # may be growing: copy what is whole
        return parts, entries, unchanged, warnings

    # -- reading -----------------------------------------------------------

    def update(self, files, waiting=None, rebuild=False):
        """Read what is new in ``files`` ([(path, size)]) into the table; a BatchResult.
        ``rebuild``: forget the table first (``clear``).

        One writer at a time: on a local table, a run that finds another
        updating it (an hourly job that overran, a watcher on the same
        table) calls ``waiting(text)`` and waits for it to finish, rather
        than taking the other's batch for a crashed one and undoing it.
        """
        with self._one_writer(waiting):
            if rebuild:
                self.clear()
            result = self._update(files)
            if result.batch is not None:
                try:
                    self.compact()
                except OSError as e:
                    # (the batch is in; merging is only for speed: the next
                    # update finishes or drops what this one left)
                    result.warnings.append(f"small files of {self.tables_dir} not merged: {e}")
            return result

    # -- merging small files -----------------------------------------------

    def compact(self):
        """Merge every partition's small files into one (``compaction``);
        the number of files merged away. Local tables only (0 otherwise),
        and only while no ``pipeline.run`` reads the table (0 then too: the
        next batch tries again). ``update`` calls it after each batch."""
        if not isinstance(self.fs, _LocalFS):
            return 0
        with self._no_readers() as free:
            if not free:
                return 0
            # (the thresholds read now, not bound as defaults: tests lower them)
            work = [(table, table == MINUTES_TABLE, rel_dir, names)
                    for table in ("events", MINUTES_TABLE)
                    for rel_dir, names in compaction.plan(self.fs.join(table),
                                                          compaction.MIN_FILES,
                                                          compaction.SMALL_BYTES)]
            if not work:
                return 0
            ident = uuid.uuid4().hex[:12]
            aside = self.fs.join("_ingest", "compacting", ident)
            record = {"id": ident, "merged": [], "replaced": []}
            for table, counts, rel_dir, names in work:
                rel = os.path.join(table, rel_dir, f"part-compact-{ident}.zstd.parquet")
                try:
                    compaction.merge([self.fs.join(table, rel_dir, n) for n in names],
                                     os.path.join(aside, rel), counts=counts)
                except ValueError:
                    continue        # files of different versions: left as they are
                record["merged"].append(rel)
                record["replaced"] += [os.path.join(table, rel_dir, n) for n in names]
            if not record["merged"]:
                self.fs.delete(self.fs.join("_ingest", "compacting"))
                return 0
            self.fs.write_text(self.fs.join("_ingest", f"compact-{ident}.json"),
                               json.dumps(record))
            self._commit_compaction(record)
            return len(record["replaced"])

    def _commit_compaction(self, record):
        """Move a merge's files in and delete those they replace (again
        after a crash: each step is skipped once done)."""
        aside = self.fs.join("_ingest", "compacting", record["id"])
        for rel in record["merged"]:
            if os.path.exists(os.path.join(aside, rel)):
                self.fs.rename(os.path.join(aside, rel), self.fs.join(rel))
        for rel in record["replaced"]:
            self.fs.delete(self.fs.join(rel))
        self.fs.delete(self.fs.join("_ingest", f"compact-{record['id']}.json"))
        # (one merge at a time, under the writer's lock: nothing else is aside)
        self.fs.delete(self.fs.join("_ingest", "compacting"))

    @contextlib.contextmanager
    def _no_readers(self):
        """True while no process holds the table for reading (then none can
        start until the block ends); False at once when one does."""
        import fcntl
        with self._readers_lock() as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def start_reading(self):
        """Hold the table's files as they are (no merge replaces them) until
        ``stop_reading``: Spark lists a table's files when a query is made
        and reads them later. Waits for a merge under way to finish. Local
        tables only (a no-op otherwise, as they are never merged)."""
        if not isinstance(self.fs, _LocalFS) or self._reading is not None:
            return
        import fcntl
        lock = self._readers_lock()
        fcntl.flock(lock, fcntl.LOCK_SH)
        self._reading = lock

    def _readers_lock(self):
        """The open file that readers and merges lock (beside ``_writer.lock``)."""
        os.makedirs(self.fs.root, exist_ok=True)
        return open(os.path.join(self.fs.root, "_readers.lock"), "a+")

    def stop_reading(self):
        if self._reading is not None:
            self._reading.close()          # (closing releases the lock)
            self._reading = None

    @contextlib.contextmanager
    def _one_writer(self, waiting):
        if not isinstance(self.fs, _LocalFS):
            yield              # remote tables: not locked (docs/analysis.md)
            return
        import fcntl
        # beside the table's directories, not in them: clear() removes those
        os.makedirs(self.fs.root, exist_ok=True)
        path = os.path.join(self.fs.root, "_writer.lock")
        with open(path, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                holder = lock.read().strip() or "another process"
                if waiting:
                    waiting(f"waiting for {holder} to finish updating {self.tables_dir}")
                fcntl.flock(lock, fcntl.LOCK_EX)
            lock.seek(0)
            lock.truncate()
            lock.write(f"process {os.getpid()} on {socket.gethostname()}\n")
            lock.flush()
            try:
                yield
            finally:
                lock.seek(0)
                lock.truncate()
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _update(self, files):
        self.recover()
        result = BatchResult()
        known = {e["path"] for e in self.manifest()["files"].values()}
        result.copies = _copies(files, known)
        copied = {path for path, _, _ in result.copies}
        files = [(path, size) for path, size in files if path not in copied]
        parts, entries, result.unchanged, result.warnings = self.plan(files)
        if not parts:
            return result
        batch = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S") \
            + "-" + uuid.uuid4().hex[:8]
        result.batch = batch
        staging_local = os.path.join(self.local_staging, batch)
        spark_inputs, file_of, line_base = [], {}, {}
        by_path = {e["path"]: (k, e) for k, e in entries.items()}
        for path, source, kind, first in parts:
            key, entry = by_path[source]
            if kind == "whole":
                if ingest._is_local(path) and not entry.get("remote"):
                    try:
                        entry["offset"] = _finish_whole(ingest._local(path), entry)
                    except (OSError, EOFError, zlib.error) as e:
                        result.unreadable.append(
                            (path, f"not a readable gzip file ({e or type(e).__name__})"
                             if entry["gz"] else f"not readable ({e})"))
                        entries.pop(key, None)
                        continue
                spark_inputs.append(path)
                continue
            fpath = ingest._local(path)
            os.makedirs(staging_local, exist_ok=True)
            target = os.path.join(staging_local, f"{len(spark_inputs):06d}-{_stem(path)}")
            try:
                end, head = _copy_complete_lines(fpath, first, target, entry,
                                                 entry.get("finished", False))
            except (OSError, EOFError, zlib.error) as e:
                result.unreadable.append((path, f"not readable ({e or type(e).__name__})"))
                entries.pop(key, None)
                continue
            entry["offset"] = end
            entry.pop("finished", None)
            if head is not None:
                entry["head"], entry["head_len"] = head
            if end < entry["size"] and not entry["gz"]:
                result.warnings.append(
                    f"{path}: last line incomplete ({entry['size'] - end} bytes, no newline): "
                    f"not read yet, as the file may still be written; if it has not grown "
                    f"by the next run it is read then (a bad line if it is not a record)")
            if end > first:
                spark_inputs.append(target)
                file_of[ingest._file_uri(target)] = path
                line_base[path] = first
        for path, source, kind, first in parts:
            result.parts.append((path, kind))
        stats, written, minute_parts, aside = {}, [], [], {}
        if spark_inputs:
            stats, written, minute_parts, aside = self._write_batch(batch, spark_inputs,
                                                                    file_of, result)
        for key, entry in entries.items():
            ok, bad = stats.get(entry["path"], (0, 0))
            entry["records"] = entry.get("records", 0) + ok
            entry["bad"] = entry.get("bad", 0) + bad
            result.file_stats[entry["path"]] = (ok, bad)
        # records set aside for their time: where they are in their files
        for path in sorted(aside):
            n, first = aside[path]
            key, entry = by_path.get(path, (None, None))
            found = dict((ts, line) for line, ts in ingest.locate_times(
                path, first, start_byte=line_base.get(path, 0)))
            named = [(found.get(ts), ts) for ts in first]
            result.aside += n
            result.aside_examples += [(path, line, ts) for line, ts in named]
            if entry is not None:
                entry["aside"] = entry.get("aside", 0) + n
                entry["aside_examples"] = (entry.get("aside_examples", [])
                                           + [list(x) for x in named])[:5]
        result.records = sum(ok for ok, _ in stats.values())
        result.bad = sum(bad for _, bad in stats.values())
        # the bad lines' numbers, for the first files that have some
        for path in sorted(p for p, (_, bad) in stats.items() if bad)[:BAD_FILES_LISTED]:
            key, entry = by_path.get(path, (None, None))
            start = line_base.get(path, 0)
            had = len(entry.get("examples", [])) if entry is not None else 0
            if had >= BAD_LINES_LISTED:
                continue
            found = ingest.locate_bad_lines(self.spark, path, limit=BAD_LINES_LISTED - had,
                                            start_byte=start)
            result.bad_examples += [(path, n, r, t) for n, r, t in found]
            if entry is not None:
                entry["examples"] = entry.get("examples", []) + [[n, r, t] for n, r, t in found]
        pending = {"batch": batch, "entries": entries, "parts": written,
                   "minute_parts": minute_parts}
        pending_path = self.fs.join("_ingest", f"pending-{batch}.json")
        self.fs.write_text(pending_path, json.dumps(pending))
        self._move_parts(batch, written, minute_parts)
        self._apply(self.manifest(), pending)
        self._save_manifest()
        self.fs.delete(pending_path)
        self.fs.delete(self.fs.join("_ingest", "staging"))
        if staging_local:
            shutil.rmtree(staging_local, ignore_errors=True)
        return result

    def _write_batch(self, batch, inputs, file_of, result):
        """Parse and check ``inputs`` into staging: ({path: (ok, bad)}, the
        Parquet files to commit, relative to staging, or None for all, and
        the same for the per-minute counts)."""
        out = self.fs.join("_ingest", "staging", batch, "out")
        minutes_out = self.fs.join("_ingest", "staging", batch, "minutes")
        files = [(p, 0) for p in inputs]
        named = {}
        for p in inputs:
            uri = ingest._file_uri(p) if ingest._is_local(p) else p
            named[file_of.get(uri, uri)] = p
        stats, parts, minute_parts, aside = {}, [], [], {}
        for attempt in range(len(inputs) + 1):
            try:
                stats, parts, minute_parts, aside = ingest.ingest_files(
                    self.spark, files, out, file_of, minutes_out=minutes_out)
                break
            except Exception as e:  # noqa: BLE001 - Py4J wraps the worker's error
                found = unreadable_named(str(e), named)
                if found is None:
                    raise
                self.fs.delete(out)
                self.fs.delete(minutes_out)
                # a file that cannot be read: skip it, name it, read the rest
                # (local .gz files are all checked at the first one; a remote
                # file is named by the task that failed on it)
                bad = ingest.unreadable_files(files) if attempt == 0 else []
                if not bad:
                    bad = [(named[found.group(1)], f"not readable ({found.group(2)})")]
                result.unreadable += [(file_of.get(ingest._file_uri(p), p)
                                       if ingest._is_local(p) else p, r) for p, r in bad]
                skipped = {p for p, _ in bad}
                files = [(p, size) for p, size in files if p not in skipped]
                if not files:
                    return {}, [], [], {}

        def shown(f):
            return ingest.display_path(f) if ingest._is_local(f) else f
        return ({shown(f): v for f, v in stats.items()}, parts, minute_parts,
                {shown(f): v for f, v in aside.items()})

    # -- reading the table back ---------------------------------------------

    def events(self, since_us=None, until_us=None):
        """The valid records, for [since, until) if given (days pruned by partition)."""
        from pyspark.sql import functions as F
        df = (self.spark.read.schema(ingest.events_schema())
              .option("basePath", self.events_path)
              .parquet(self.fs.join("events", "status=ok")))
        if since_us is not None:
            df = df.where((F.col("day") >= _day(since_us)) & (F.col("ts_us") >= since_us))
        if until_us is not None:
            df = df.where((F.col("day") <= _day(until_us)) & (F.col("ts_us") < until_us))
        return df.drop("status", "bad_reason", "raw")

    def per_minute(self, since_us=None, until_us=None):
        """``jobs.activity`` of ``events(since_us, until_us)``: the valid
        records counted per router, peer, direction, event and minute.

        Summed from the counts the ingest made (``minutes``) for the whole
        minutes in the window; a minute the window cuts is counted from
        its records. A table begun by an older version has no such counts:
        its records are counted (a pass over the window).
        """
        from pyspark.sql import functions as F
        from spark_analysis import jobs
        if not self.manifest().get("minutes") or not self.fs.exists(self.minutes_path):
            return jobs.activity(self.events(since_us, until_us))
        unit = jobs.MINUTE_US
        # the whole minutes inside the window: [lo, hi)
        lo = None if since_us is None else -(-since_us // unit) * unit
        hi = None if until_us is None else until_us // unit * unit
        if lo is not None and hi is not None and lo >= hi:
            return jobs.activity(self.events(since_us, until_us))
        counts = self.spark.read.parquet(self.minutes_path)
        if lo is not None:
            counts = counts.where((F.col("day") >= _day(lo)) & (F.col("minute_us") >= lo))
        if hi is not None:
            counts = counts.where((F.col("day") <= _day(hi - 1)) & (F.col("minute_us") < hi))
        whole = counts.groupBy("router", "peer", "direction", "event", "minute_us").agg(
            F.sum("n").alias("n"), F.sum("bytes").alias("bytes"),
            F.min("first_us").alias("first_us"), F.max("last_us").alias("last_us"))
        for a, b in ((since_us, lo), (hi, until_us)):
            if a is not None and b is not None and a < b:
                whole = whole.unionByName(jobs.activity(self.events(a, b)))
        return whole

    def newest_us(self):
        """The time of the newest valid record (None if there is none).

        Only the newest day is scanned: the day comes from the names of the
        table's files (``day=`` partitions), without a Spark job.
        """
        from pyspark.sql import functions as F
        df = self.events()
        days = {m.group(1) for m in (re.search(r"/day=(\d{4}-\d{2}-\d{2})/", p)
                                     for p in df.inputFiles()) if m}
        if not days:
            return None
        return df.where(F.col("day") == max(days)).agg(F.max("ts_us")).first()[0]


GZ_BYTES_PER_RECORD = 20         # a trace line compresses to about this
PLAIN_BYTES_PER_RECORD = 300     # and is about this long


def expected_records(tables_dir, files):
    """A cheap guess, before Spark starts, of the records a run will touch:
    ``files`` ([(path, size)], already pruned to the run's window by name)
    counted from the manifest where they were read before, by their size
    where not. Only local tables are looked at (None otherwise)."""
    if not ingest._is_local(tables_dir):
        return None
    known = {}
    try:
        with open(os.path.join(ingest._local(tables_dir), "_ingest", "manifest.json"),
                  encoding="utf-8") as f:
            for entry in json.load(f).get("files", {}).values():
                path = entry.get("path")
                known[path] = known.get(path, 0) + entry.get("records", 0) + entry.get("bad", 0)
    except (OSError, ValueError, AttributeError):
        pass
    total = 0
    for path, size in files:
        if path in known:
            total += known[path]
        else:
            total += size // (GZ_BYTES_PER_RECORD if path.endswith(".gz")
                              else PLAIN_BYTES_PER_RECORD)
    return total


def _day(ts_us):
    return datetime.datetime.fromtimestamp(ts_us / 1e6, datetime.timezone.utc).strftime("%Y-%m-%d")



def _newest_plain_per_domain(files):
    """Local plain files that are the newest of their router: perhaps still written."""
    newest = {}
    for path, _ in files:
        if path.endswith(".gz"):
            continue
        info = tf.parse_trace_file_name(path.rstrip("/").rsplit("/", 1)[-1])
        if info is None:
            continue
        key = info[0]
        if key not in newest or (info[1], info[2]) > newest[key][0]:
            newest[key] = ((info[1], info[2]), path)
    return {path for _, path in newest.values()}


def _copies(files, known=()):
    """[(path, kept, how)]: files of ``files`` ([(path, size)]) that hold
    nothing another one does not, so are not read: the same content
    (``how`` "same content") or its first part (``how`` "first N bytes"),
    as when one host's traces are collected twice, or once while still
    being written. Files are grouped by their first HEAD_BYTES
    (uncompressed) and compared whole within a group. A file already read
    (in ``known``) is kept over its copies, then the longest, then the
    one nearest the top, then by path. Local files only; remote ones are
    told by name and size."""
    copies, groups, seen = [], {}, {}
    # (a .gz beside its plain file is being compressed: ``plan`` reads the plain one)
    plain = {(os.path.dirname(p), _stem(p)) for p, _ in files if not p.endswith(".gz")}
    for path, size in files:
        if path.endswith(".gz") and (os.path.dirname(path), _stem(path)) in plain:
            continue
        if not ingest._is_local(path):
            key = (_stem(path), size)
            if key in seen:
                copies.append((path, seen[key], "same name and size"))
            else:
                seen[key] = path
            continue
        try:
            with _open_uncompressed(ingest._local(path)) as f:
                head = f.read(HEAD_BYTES)
        except (OSError, EOFError, zlib.error):
            continue
        if head:
            groups.setdefault(hashlib.sha1(head).hexdigest(), []).append((path, size))
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda m: (m[0] not in known, -m[1], m[0].count("/"), m[0]))
        kept = []
        for path, _ in members:
            for i, other in enumerate(kept):
                relation = _relation(path, other)
                if relation is None:
                    continue
                if relation[0] == "other":      # the other is this one's first part
                    if other in known and _stem(other) != _stem(path):
                        continue    # (read already: this one is matched to it by name only)
                    copies.append((other, path, relation[1]))
                    kept[i] = path
                else:
                    copies.append((path, other, relation[1]))
                break
            else:
                kept.append(path)
    return copies


def _relation(a, b):
    """How local file ``a``'s uncompressed content relates to ``b``'s:
    ("this", how) if ``a`` holds nothing more than ``b`` (the same, or its
    first part), ("other", how) if ``b`` is ``a``'s first part, None if they
    differ (or either cannot be read)."""
    try:
        with _open_uncompressed(ingest._local(a)) as fa, \
                _open_uncompressed(ingest._local(b)) as fb:
            length = 0
            while True:
                # (buffered and gzip reads return the size asked for until the end)
                x, y = fa.read(_COPY_CHUNK), fb.read(_COPY_CHUNK)
                n = min(len(x), len(y))
                if x[:n] != y[:n]:
                    return None
                length += n
                if len(x) > len(y):
                    return ("other", f"first {length:,} bytes")
                if len(x) < len(y):
                    return ("this", f"first {length:,} bytes")
                if not x:
                    return ("this", "same content")
    except (OSError, EOFError, zlib.error):
        return None


def _finish_whole(path, entry):
    """For a file Spark reads whole: its uncompressed length is unknown
    for .gz (read to the end: complete), else its size; and its head hash."""
    length = HEAD_BYTES if entry["gz"] else entry["head_len"]
    with _open_uncompressed(path) as f:
        head = f.read(length)
    entry["head_len"], entry["head"] = len(head), hashlib.sha1(head).hexdigest()
    return entry["size"] if not entry["gz"] else -1


def _copy_complete_lines(path, first, target, entry, finished=False):
    """Copy the uncompressed bytes from ``first`` up to the last newline into
    ``target`` (to the end, a partial last line included, if the file is
    ``finished`` or gzipped: no more is written to it). Returns (end offset,
    (head hash, head length) or None)."""
    end = first
    head = None
    with _open_uncompressed(path) as src, open(target, "wb") as dst:
        # skip what was read before (decompressing, for a rotated .gz)
        skip = first
        head_data = b""
        while skip > 0:
            chunk = src.read(min(skip, _COPY_CHUNK))
            if not chunk:
                break
            if len(head_data) < HEAD_BYTES:
                head_data += chunk[:HEAD_BYTES - len(head_data)]
            skip -= len(chunk)
        if skip > 0:
            raise EOFError(f"shorter than the {first} bytes already read")
        carry = b""
        while True:
            chunk = src.read(_COPY_CHUNK)
            if not chunk:
                break
            if len(head_data) < HEAD_BYTES:
                head_data += chunk[:HEAD_BYTES - len(head_data)]
            data = carry + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
                continue
            dst.write(data[:cut + 1])
            end += cut + 1
            carry = data[cut + 1:]
        if carry and (entry.get("gz") or finished):
            # a closed file ends with an unterminated line: it is all there
            # will be of it (``arrowparse.parse_file`` judges it)
            dst.write(carry)
            end += len(carry)
    if entry.get("head") is None:
        head = (hashlib.sha1(head_data).hexdigest(), len(head_data))
    return end, head
