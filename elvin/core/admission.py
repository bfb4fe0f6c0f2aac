"""How many connections of each kind the router may hold, and which new
ones to refuse or which idle ones to close: the policy that keeps the
router inside its open-file limit, with no I/O (the Twisted side is
``elvin.protocols.gate``).

Every socket a listener accepts is one open file. The router holds three
*pools* of them -- ``client`` (Elvin over TCP and TLS, and the HTTP
tunnel's connections), ``federation`` (incoming links) and ``status``
(the status listener) -- each with a cap. :func:`fit_caps` lowers the caps
at start so that their sum, plus files kept for everything else, fits the
open-file limit. :class:`ConnectionBudget` then decides, at accept time:

* below its cap a pool admits a new connection;
* at its cap, it closes its oldest *idle* connection (accepted but no
  ConnRqst yet; HTTP with no request in progress) to make room, and
  admits the new one; with none idle it refuses (the socket is closed at
  once). At most ``REAP_SLACK`` connections closed this way may still be
  on their way out, so the files in use never pass cap + ``REAP_SLACK``;
* once a pool holds ``CROWDED`` of its cap, its idle connections are
  closed after ``crowded_timeout`` seconds (2 by default) instead of the
  connect timeout (30) or the HTTP idle timeout, oldest first
  (:meth:`ConnectionBudget.expired`, :meth:`ConnectionBudget.next_expiry`).

So idle sockets, however many, cannot keep a client that speaks at once
from connecting and being served.

A TLS connection costs the router far more than a plain one before its
handshake ends (the TLS layer's buffers: 10-47 KB against about 4 KB),
so connections in a TLS handshake are bounded across all pools as well:

* at most ``max_handshakes`` at once (``max-tls-handshakes``): one more
  closes the oldest still in its handshake (a real handshake takes a few
  round trips, so the oldest is the likeliest to be stalled);
* each has ``handshake_timeout`` seconds (``tls-handshake-timeout``) to
  finish it, then is closed.
"""

import time

__all__ = ["ConnectionBudget", "Ticket", "Pool", "fit_caps", "CROWDED", "REAP_SLACK",
           "DEFAULT_MAX_HANDSHAKES", "DEFAULT_HANDSHAKE_TIMEOUT",
           "CLIENT", "FEDERATION", "STATUS", "SETTING"]

#: The pools, and the setting each one's cap comes from.
CLIENT, FEDERATION, STATUS = "client", "federation", "status"
SETTING = {CLIENT: "max-connections", FEDERATION: "max-federation-connections",
           STATUS: "status-max-connections"}

#: The share of its cap above which a pool closes idle connections quickly.
CROWDED = 0.9

#: Connections closed to make room that may still hold their file.
REAP_SLACK = 16

#: Connections in a TLS handshake at once (``max-tls-handshakes``) and the
#: seconds each has to finish it (``tls-handshake-timeout``).
DEFAULT_MAX_HANDSHAKES = 1024
DEFAULT_HANDSHAKE_TIMEOUT = 10.0


def fit_caps(open_files, wanted, reserved):
    """The caps that fit ``open_files`` (the soft open-file limit), keeping
    ``reserved`` files for everything else: ``(caps, lowered)``.

    ``wanted`` maps pool to configured cap. When the sum does not fit, the
    federation and status pools keep theirs up to an eighth of the room
    each, and clients get the rest; every cap stays at least 1. ``lowered``
    lists ``(pool, configured, fitted)`` for each cap that went down.
    """
    room = max(3, open_files - reserved)
    caps = dict(wanted)
    if sum(caps.values()) > room:
        share = max(1, room // 8)
        for pool in (FEDERATION, STATUS):
            if pool in caps:
                caps[pool] = max(1, min(caps[pool], share))
        others = sum(cap for pool, cap in caps.items() if pool != CLIENT)
        if CLIENT in caps:
            caps[CLIENT] = max(1, min(wanted[CLIENT], room - others))
    lowered = [(pool, wanted[pool], caps[pool]) for pool in wanted
               if caps[pool] < wanted[pool]]
    return caps, lowered


class Ticket:
    """One admitted connection. Its owner calls :meth:`busy` when the
    connection starts doing work (a ConnRqst arrived; an HTTP request is
    being served), :meth:`idle` when it stops, and :meth:`release` when it
    is gone. ``close`` (given by the owner) closes it at once."""

    __slots__ = ("pool", "close", "opened", "idle_since", "reaped", "released",
                 "handshake_since")

    def __init__(self, pool, close, now):
        self.pool = pool
        self.close = close
        self.opened = now
        self.idle_since = now
        self.reaped = False
        self.released = False
        #: When its TLS handshake began, while it is in one; else None.
        self.handshake_since = None

    @property
    def is_idle(self):
        return self in self.pool.idle

    def busy(self):
        self.pool.idle.pop(self, None)

    def handshake_done(self):
        """Its TLS handshake finished: no longer bounded as one."""
        if self.handshake_since is not None:
            self.handshake_since = None
            self.pool.handshakes.pop(self, None)

    def idle(self):
        if not (self.released or self.reaped):
            self.idle_since = self.pool.now()
            self.pool.idle.pop(self, None)   # to the end: oldest idle first
            self.pool.idle[self] = None

    def release(self):
        if self.released:
            return
        self.released = True
        pool = self.pool
        pool.idle.pop(self, None)
        if self.handshake_since is not None:
            self.handshake_since = None
            pool.handshakes.pop(self, None)
        pool.open -= 1
        if self.reaped:
            pool.closing -= 1


class Pool:
    """The connections of one kind: how many are open, which are idle
    (oldest first), and what was refused or closed."""

    def __init__(self, name, cap, now, handshakes=None):
        self.name = name
        self.cap = cap
        self.now = now
        self.open = 0
        self.closing = 0       # closed to make room, file not yet released
        self.idle = {}         # Ticket -> None, in the order they became idle
        self.refused = 0
        self.reaped = 0
        #: Connections in a TLS handshake, of every pool (shared), oldest first.
        self.handshakes = {} if handshakes is None else handshakes
        #: Closed in their TLS handshake: for a newer one, or out of time.
        self.handshakes_closed = 0
        #: HTTP connections closed with a request out of time.
        self.requests_timed_out = 0
        self._last_report = None
        self._refused_reported = 0
        self._reaped_reported = 0
        self._handshakes_reported = 0

    @property
    def crowded(self):
        """Holding ``CROWDED`` of the cap, not counting connections already
        being closed."""
        return self.open - self.closing >= self.cap * CROWDED

    def stats(self):
        return {"open": self.open, "cap": self.cap, "idle": len(self.idle),
                "refused": self.refused, "closed_idle": self.reaped,
                "closed_in_handshake": self.handshakes_closed,
                "closed_in_request": self.requests_timed_out}


class ConnectionBudget:
    """Caps per pool (``{pool: cap}``), decisions at accept time and the
    idle connections to close. ``now`` is the clock (seconds)."""

    def __init__(self, caps, crowded_timeout=2.0, now=time.monotonic,
                 report_interval=10.0, max_handshakes=DEFAULT_MAX_HANDSHAKES,
                 handshake_timeout=DEFAULT_HANDSHAKE_TIMEOUT):
        self.now = now
        self.crowded_timeout = crowded_timeout
        self.report_interval = report_interval
        #: Most connections in a TLS handshake at once (0: no cap), and the
        #: seconds each may take (0: no limit beyond the connect timeout).
        self.max_handshakes = max_handshakes
        self.handshake_timeout = handshake_timeout
        #: Connections in a TLS handshake (Ticket -> None), oldest first.
        self.handshakes = {}
        self.pools = {name: Pool(name, cap, now, self.handshakes)
                      for name, cap in caps.items()}

    def set_cap(self, name, cap):
        self.pools[name].cap = cap

    def admit(self, name):
        """May a connection for pool ``name`` be accepted now? ``(admitted,
        victim)``: ``victim`` is an idle Ticket the caller must close (with
        ``victim.close()``) to make room for it, or None."""
        pool = self.pools[name]
        if pool.open < pool.cap:
            return True, None
        if pool.idle and pool.closing < REAP_SLACK:
            victim = next(iter(pool.idle))
            self._reap(victim)
            return True, victim
        pool.refused += 1
        return False, None

    def opened(self, name, close):
        """An admitted connection is open; it starts idle."""
        pool = self.pools[name]
        ticket = Ticket(pool, close, self.now())
        pool.open += 1
        pool.idle[ticket] = None
        return ticket

    def handshaking(self, ticket):
        """``ticket``'s connection starts a TLS handshake: the Ticket of
        the oldest other one in a handshake, which the caller must close
        (``victim.close()``) when that makes more than ``max_handshakes``;
        else None."""
        ticket.handshake_since = self.now()
        handshakes = self.handshakes
        handshakes[ticket] = None
        if not self.max_handshakes or len(handshakes) <= self.max_handshakes:
            return None
        victim = next(iter(handshakes))
        self._end_handshake(victim)
        return victim

    def _end_handshake(self, ticket):
        """``ticket`` is to be closed in its handshake (no longer a
        candidate to close as idle either)."""
        del self.handshakes[ticket]
        ticket.handshake_since = None
        ticket.pool.idle.pop(ticket, None)
        ticket.pool.handshakes_closed += 1

    def _reap(self, ticket):
        pool = ticket.pool
        del pool.idle[ticket]
        ticket.reaped = True
        pool.closing += 1
        pool.reaped += 1

    def expired(self):
        """Connections to close now, oldest first: the caller closes each.
        Those out of time in their TLS handshake, then idle ones of
        crowded pools idle for ``crowded_timeout`` seconds or more."""
        out = []
        if self.handshake_timeout:
            late = self.now() - self.handshake_timeout
            handshakes = self.handshakes
            while handshakes:
                ticket = next(iter(handshakes))
                if ticket.handshake_since > late:
                    break
                self._end_handshake(ticket)
                out.append(ticket)
        deadline = self.now() - self.crowded_timeout
        for pool in self.pools.values():
            while pool.idle and pool.crowded:
                ticket = next(iter(pool.idle))
                if ticket.idle_since > deadline:
                    break
                self._reap(ticket)
                out.append(ticket)
        return out

    def next_expiry(self):
        """Seconds until :meth:`expired` has something, or None while no
        connection is in a TLS handshake (with a timeout) and no crowded
        pool has anything idle."""
        waits = [next(iter(pool.idle)).idle_since + self.crowded_timeout
                 for pool in self.pools.values() if pool.idle and pool.crowded]
        if self.handshakes and self.handshake_timeout:
            waits.append(next(iter(self.handshakes)).handshake_since
                         + self.handshake_timeout)
        return max(0.0, min(waits) - self.now()) if waits else None

    def report(self, name):
        """A line for the log about refusals and idle connections closed in
        pool ``name`` since the last line, at most once per
        ``report_interval`` seconds; None when there is nothing to say yet."""
        pool = self.pools[name]
        now = self.now()
        if pool._last_report is not None and now - pool._last_report < self.report_interval:
            return None
        refused = pool.refused - pool._refused_reported
        reaped = pool.reaped - pool._reaped_reported
        in_handshake = pool.handshakes_closed - pool._handshakes_reported
        if not (refused or reaped or in_handshake):
            return None
        since = ("" if pool._last_report is None
                 else f" in the last {now - pool._last_report:.0f} s")
        pool._last_report = now
        pool._refused_reported, pool._reaped_reported = pool.refused, pool.reaped
        pool._handshakes_reported = pool.handshakes_closed
        parts = []
        if refused or reaped:
            parts.append(f"{name} connections at their cap ({pool.open} open, "
                         f"{SETTING[name]} {pool.cap}){since}: {refused} refused when "
                         f"accepted, {reaped} idle one(s) closed to make room")
        if in_handshake:
            parts.append(f"{in_handshake} {name} connection(s) closed in their TLS "
                         f"handshake{since if not parts else ''}: more than "
                         f"max-tls-handshakes {self.max_handshakes} at once, or "
                         f"longer than tls-handshake-timeout {self.handshake_timeout:g} s")
        return "; ".join(parts)

    def stats(self):
        """``{pool: {open, cap, idle, refused, closed_idle,
        closed_in_handshake, closed_in_request}}``."""
        return {name: pool.stats() for name, pool in self.pools.items()}
