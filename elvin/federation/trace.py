"""Federation traces: one JSON object per event, per docs/traces.md.

``TraceWriter`` formats records on the reactor thread (cheap) and hands
lines to a background thread that writes and rotates files, so writing
never blocks the reactor; ``close()`` flushes everything and waits for the
thread. ``NullTrace`` is what a router without tracing uses.
"""

import collections
import datetime
import hashlib
import json
import os
import threading
import time

from twisted.internet import defer
from twisted.logger import Logger

from elvin.configvalues import ConfigError
from elvin.core.lograte import LogLimiter
from elvin.federation.mesh import ID_PREFIX
from elvin.protocols.xdr import Writer

__all__ = ["NullTrace", "TraceDirectoryError", "TraceWriter", "notification_digest", "trace_file_name"]

FORMAT_VERSION = 1


class TraceDirectoryError(ConfigError):
    """The trace directory cannot be made or is not a directory: one line
    naming the setting (``where`` it was set: 'file:line: '), the directory
    and why, as the other configuration errors."""

    def __init__(self, directory, error, where=""):
        self.directory = directory
        self.reason = f"cannot make it: {error.strerror or error}"
        if os.path.exists(directory) and not os.path.isdir(directory):
            self.reason = "it exists and is not a directory"
        super().__init__(f"{where}Federation.Trace-Directory {directory}: {self.reason}")


def notification_digest(attributes):
    """SHA-1 of the attributes' canonical XDR (sorted by UTF-8 name)."""
    ordered = dict(sorted(attributes.items(), key=lambda kv: kv[0].encode("utf-8")))
    return hashlib.sha1(Writer().name_values(ordered).getvalue()).hexdigest()


def _safe_domain(domain):
    out = []
    for c in domain:
        if c.isascii() and (c.isalnum() or c in "._-"):
            out.append(c)
        else:
            out.extend(f"%{b:02X}" for b in c.encode("utf-8"))
    return "".join(out)


def trace_file_name(domain, when, seq):
    stamp = datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{_safe_domain(domain)}-{stamp}-{seq:06d}.jsonl"


class NullTrace:
    """Tracing switched off: every call does nothing."""

    enabled = False
    #: Records accepted, written whole, and lost (operations read them of any trace).
    records = 0
    written = 0
    dropped_overflow = 0
    dropped_error = 0

    def link(self, link, event, reason=None, unsent=0):
        pass

    def subreplace(self, link, direction, tree):
        pass

    def notify(self, link, event, direction, attributes, routing, encoded=None):
        pass

    def close(self):
        return defer.succeed(None)


_log = Logger()


class TraceWriter:
    """Writes trace records for the router ``domain`` into ``directory``."""

    enabled = True

    #: Records waiting for the writer thread at most; past it new records are
    #: dropped and counted (``dropped_overflow``), so a disk that cannot keep
    #: up costs bounded memory, and close() waits for a bounded backlog.
    MAX_QUEUED = 100_000
    #: Seconds between two log lines of one kind (queue full, write failing).
    LOG_INTERVAL = 60.0

    def __init__(self, directory, domain, max_bytes=64 * 1024 * 1024,
                 max_seconds=3600.0, now=time.time, max_queued=MAX_QUEUED,
                 reactor=None, where=""):
        self.directory = directory
        self.domain = domain
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.now = now
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise TraceDirectoryError(directory, e, where) from None
        self._lines = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._closed = None          # Deferred once close() was called
        self._finish = None          # how the thread reports it is done
        self._reactor = reactor
        self._seq = 0
        self._file = None
        self._opened = 0.0
        self._written = 0
        #: Records accepted (queued for the writer thread).
        self.records = 0
        #: Records written whole to a file.
        self.written = 0
        self.dropped_after_close = 0
        self.max_queued = max_queued
        #: Records dropped because the queue was full.
        self.dropped_overflow = 0
        #: Records lost to failed writes (disk full, I/O error): the writer
        #: goes on, and writes again once the disk takes them.
        self.dropped_error = 0
        self._overflow_log = LogLimiter(time.monotonic, self.LOG_INTERVAL)
        self._error_log = LogLimiter(time.monotonic, self.LOG_INTERVAL)
        self._failing = None         # the error while writes fail, else None
        self._failed_since = 0       # records lost since writes began to fail
        self._thread = threading.Thread(target=self._run, name="elvin-trace", daemon=True)
        self._thread.start()
        self._digests = (None, None)

    # -- records -------------------------------------------------------------

    def _emit(self, record):
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False)
                + "\n").encode("utf-8")
        with self._cond:
            if self._closing:
                # After close() nothing is written: do not accept (count) it.
                self.dropped_after_close += 1
                return
            if len(self._lines) >= self.max_queued:
                self.dropped_overflow += 1
                skipped = self._overflow_log.allow()
                if skipped is not None:
                    _log.warn("trace writer for {domain}: {n} records wait to be written "
                              "(the limit); new records are dropped while it stays full: "
                              "{total} dropped so far{failing}", domain=self.domain,
                              n=len(self._lines), total=self.dropped_overflow,
                              failing=f" (writes fail: {self._failing})"
                              if self._failing else "")
                return
            self._lines.append(line)
            self.records += 1
            self._cond.notify()

    def _base(self, link, event, direction):
        return {"v": FORMAT_VERSION, "ts_us": int(self.now() * 1_000_000),
                "router": self.domain, "peer": link.peer_domain, "event": event,
                "direction": direction}

    def link(self, link, event, reason=None, unsent=0):
        record = self._base(link, event, "out" if link.outgoing else "in")
        if reason is not None:
            record["reason"] = reason
        if unsent:
            record["unsent"] = unsent
        self._emit(record)

    def subreplace(self, link, direction, tree):
        from elvin.federation.filters import node_count, to_wire
        record = self._base(link, "subreplace_sent" if direction == "out"
                            else "subreplace_received", direction)
        record["filter_nodes"] = node_count(tree)
        record["filter_bytes"] = len(Writer().ast(to_wire(tree)).getvalue())
        self._emit(record)

    def notify(self, link, event, direction, attributes, routing, encoded=None):
        record = self._base(link, event, direction)
        # The domains it crossed; not the mesh id (elvin.federation.mesh),
        # which names no router.
        record["routing"] = [r for r in routing if not r.startswith(ID_PREFIX)]
        if encoded is None:
            from elvin.federation import packets as fed_packets
            from elvin.protocols import packets
            size = len(packets.encode(fed_packets.FedNotify(attributes, False, packets.Keys.EMPTY, routing)))
        else:
            size = len(encoded() if callable(encoded) else encoded)
        record["size"] = size
        record["attrs"] = sorted(attributes, key=lambda n: n.encode("utf-8"))
        record["digest"] = self._digest(attributes)
        self._emit(record)

    def _digest(self, attributes):
        # The same notification is traced once per link: digest it once.
        cached, digest = self._digests
        if cached is attributes:
            return digest
        digest = notification_digest(attributes)
        self._digests = (attributes, digest)
        return digest

    # -- files (background thread) -------------------------------------------

    def _open(self):
        self._seq += 1
        self._opened = self.now()
        path = os.path.join(self.directory, trace_file_name(self.domain, self._opened, self._seq))
        # unbuffered: each batch is one write, and what reached the file is known
        self._file = open(path, "ab", buffering=0)
        self._written = 0

    def _close_file(self):
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass

    def _write(self, lines):
        """Write ``lines`` (encoded records) to the current file, rotating
        first when it is due. On an error (disk full, I/O error) the records
        not written whole are counted lost (``dropped_error``), the file is cut
        back to its last whole record, and the next batch tries again."""
        if not lines:
            return
        try:
            if (self._file is None or self._written >= self.max_bytes
                    or self.now() - self._opened >= self.max_seconds):
                self._close_file()
                self._open()
        except OSError as e:
            self._failed(len(lines), e)
            return
        data = b"".join(lines)
        done = 0
        try:
            view = memoryview(data)
            while done < len(data):
                n = self._file.write(view[done:])
                if not n:
                    raise OSError("nothing written")
                done += n
        except OSError as e:
            whole, kept = 0, 0
            for line in lines:
                if kept + len(line) > done:
                    break
                kept += len(line)
                whole += 1
            if kept < done:
                try:
                    os.ftruncate(self._file.fileno(), self._written + kept)
                except OSError:
                    # cannot cut the partial record off: start the next file
                    self._close_file()
            self._written += kept
            self.written += whole
            self._failed(len(lines) - whole, e)
            return
        self._written += len(data)
        self.written += len(lines)
        if self._failing is not None:
            lost, self._failing, self._failed_since = self._failed_since, None, 0
            self._say("trace writer for {domain}: writing again; {lost} records were "
                      "lost while writes failed ({total} in all)", domain=self.domain,
                      lost=lost, total=self.dropped_error)

    def _failed(self, lost, error):
        self.dropped_error += lost
        self._failed_since += lost
        reason = error.strerror or str(error)
        first = self._failing is None
        self._failing = reason
        skipped = self._error_log.allow()
        if first or skipped is not None:
            self._say("trace writer for {domain}: cannot write to {directory}: {reason}; "
                      "records are lost (counted: {total} so far) until writes succeed "
                      "again", domain=self.domain, directory=self.directory, reason=reason,
                      total=self.dropped_error)

    def _say(self, text, **fields):
        """Log from the writer thread (in the reactor thread)."""
        from twisted.internet import reactor as default_reactor
        reactor = self._reactor or default_reactor
        reactor.callFromThread(lambda: _log.warn(text, **fields))

    def _run(self):
        while True:
            with self._cond:
                while not self._lines and not self._closing:
                    self._cond.wait(1.0)
                batch = list(self._lines)
                self._lines.clear()
                closing = self._closing
            try:
                self._write(batch)
            except Exception as e:   # never end tracing: count, log, go on
                self._failed(len(batch), e if isinstance(e, OSError) else OSError(repr(e)))
            if closing:
                self._close_file()
                with self._cond:
                    finish = self._finish
                if finish is not None:
                    finish()
                return

    def flush(self):
        """Wait until every record so far is written (for tests)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self._cond:
                if self.written + self.dropped_error >= self.records:
                    break
            time.sleep(0.005)

    def _finished(self, closed):
        """In the reactor thread: the writer thread has closed the file and
        is returning; wait the instant it takes to end, so whoever waits on
        close() sees no thread left behind."""
        self._thread.join(timeout=5)
        closed.callback(None)

    def close(self):
        """Stop accepting records; the writer thread writes what is queued
        and closes the file. Returns a Deferred that fires (in the reactor
        thread) once it has, so a shutdown waits for the backlog without
        blocking the reactor."""
        from twisted.internet import reactor as default_reactor
        reactor = self._reactor or default_reactor
        with self._cond:
            if self._closed is None:
                self._closed = defer.Deferred()
                self._closing = True
                self._cond.notify()
                finished = self._closed
                self._finish = lambda: reactor.callFromThread(self._finished, finished)
                if not self._thread.is_alive():
                    self._finish()
            closed = self._closed
        waiter = defer.Deferred()
        closed.addBoth(lambda result: (waiter.callback(None), result)[1])
        return waiter
