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

from elvin.federation.mesh import ID_PREFIX
from elvin.protocols.xdr import Writer

__all__ = ["NullTrace", "TraceWriter", "notification_digest", "trace_file_name"]

FORMAT_VERSION = 1


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
    #: Records written (operations read it of any trace).
    records = 0

    def link(self, link, event, reason=None):
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

    def __init__(self, directory, domain, max_bytes=64 * 1024 * 1024,
                 max_seconds=3600.0, now=time.time, max_queued=MAX_QUEUED,
                 reactor=None):
        self.directory = directory
        self.domain = domain
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.now = now
        os.makedirs(directory, exist_ok=True)
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
        self.records = 0
        self.dropped_after_close = 0
        self.max_queued = max_queued
        self.dropped_overflow = 0
        self._thread = threading.Thread(target=self._run, name="elvin-trace", daemon=True)
        self._thread.start()
        self._digests = (None, None)

    # -- records -------------------------------------------------------------

    def _emit(self, record):
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
        with self._cond:
            if self._closing:
                # After close() nothing is written: do not accept (count) it.
                self.dropped_after_close += 1
                return
            if len(self._lines) >= self.max_queued:
                if not self.dropped_overflow:
                    _log.warn("trace writer for {domain} is {n} records behind; "
                              "dropping records until it catches up (counted)",
                              domain=self.domain, n=len(self._lines))
                self.dropped_overflow += 1
                return
            self._lines.append(line)
            self.records += 1
            self._cond.notify()

    def _base(self, link, event, direction):
        return {"v": FORMAT_VERSION, "ts_us": int(self.now() * 1_000_000),
                "router": self.domain, "peer": link.peer_domain, "event": event,
                "direction": direction}

    def link(self, link, event, reason=None):
        record = self._base(link, event, "out" if link.outgoing else "in")
        if reason is not None:
            record["reason"] = reason
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
        self._file = open(path, "a", encoding="utf-8")
        self._written = 0

    def _run(self):
        while True:
            with self._cond:
                while not self._lines and not self._closing:
                    self._cond.wait(1.0)
                    if self._file is not None and not self._lines:
                        self._file.flush()
                batch = list(self._lines)
                self._lines.clear()
                closing = self._closing
            for line in batch:
                if (self._file is None or self._written >= self.max_bytes
                        or self.now() - self._opened >= self.max_seconds):
                    if self._file is not None:
                        self._file.close()
                    self._open()
                self._file.write(line)
                self._written += len(line.encode("utf-8"))
            if closing:
                if self._file is not None:
                    self._file.close()
                    self._file = None
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
                if not self._lines:
                    break
            time.sleep(0.005)
        if self._file is not None:
            self._file.flush()

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
