"""Password checks, bounded and throttled (docs/proxy.md, "Passwords").

A salted scrypt check costs about 40 ms of CPU, so password guessing is
both an attack on the sessions and on the proxy's CPU. ``PasswordGate``
runs every scrypt (checks, and the hashes of a new session's passwords)
with these rules, and no I/O of its own (the runner and the clock are
given):

* **Bounded work.** At most ``workers`` checks run at once (a small
  thread pool of their own under twistd), and at most ``queue_limit``
  wait; one more is refused at once (``Busy``) rather than queued.
* **Clean first.** A check from an address with no recent failure goes
  ahead of every check from one with failures, and may take the place of
  the newest of those when the queue is full: a flood from a few
  addresses does not delay a device that gets its password right.
* **Throttled failures, per address and per session.** Each address and
  each session has a bucket of failures (``peer_burst`` / ``session_burst``,
  one more back every ``peer_period`` / ``session_period`` seconds). An
  address whose bucket is empty is refused without a check; a session
  whose bucket is empty is checked only for addresses with no recent
  failure (so guessing from many addresses cannot lock its owner out, and
  is slowed to the rate at which fresh addresses appear).

Refusals look like a wrong password (the caller sends the same Nack), so
they tell nothing about whether a session exists or what its password is.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from twisted.internet import defer
from twisted.python.failure import Failure

from elvin.proxy.counters import GateCounters

__all__ = ["PasswordGate", "Busy"]


class Busy(Exception):
    """The queue of password checks is full."""


class _Buckets:
    """Failure buckets by key (token buckets that start full), bounded in
    number: a full bucket is forgotten, and the oldest go first beyond
    ``most``."""

    def __init__(self, burst: int, period: float, most: int = 100_000) -> None:
        self.burst = burst
        self.period = period
        self.most = most
        self._used: Dict[Any, Tuple[float, float]] = {}    # key -> (used, at)

    def used(self, key: Any, now: float) -> float:
        entry = self._used.get(key)
        if entry is None:
            return 0.0
        used = max(0.0, entry[0] - (now - entry[1]) / self.period)
        if used == 0.0:
            del self._used[key]
        return used

    def empty(self, key: Any, now: float) -> bool:
        """Not a whole failure left (one a moment after the burst is not
        one: the next comes back a full period later)."""
        return self.used(key, now) > self.burst - 1

    def clean(self, key: Any, now: float) -> bool:
        return self.used(key, now) == 0.0

    def take(self, key: Any, now: float) -> None:
        used = self.used(key, now) + 1
        self._used.pop(key, None)
        self._used[key] = (min(used, self.burst + 1), now)
        while len(self._used) > self.most:
            del self._used[next(iter(self._used))]


class PasswordGate:
    """See the module docstring. ``run(f)``: a Deferred of ``f()`` run off
    the reactor thread (default: at once, for tests); ``clock()``: seconds."""

    def __init__(self, clock: Callable[[], float],
                 run: Optional[Callable[[Callable[[], Any]], Any]] = None,
                 workers: int = 2, queue_limit: int = 32, peer_burst: int = 5,
                 peer_period: float = 12.0, session_burst: int = 10,
                 session_period: float = 6.0) -> None:
        self.clock = clock
        self.run = run or defer.maybeDeferred
        self.workers = workers
        self.queue_limit = queue_limit
        self.peers = _Buckets(peer_burst, peer_period)
        self.sessions = _Buckets(session_burst, session_period)
        self._clean: Deque[Tuple[defer.Deferred, Callable[[], Any]]] = collections.deque()
        self._suspect: Deque[Tuple[defer.Deferred, Callable[[], Any]]] = collections.deque()
        self.running = 0
        self.counters = GateCounters()

    @staticmethod
    def host(peer: Any) -> Any:
        """The address part of a peer (its port changes at every connect),
        an IPv4-mapped IPv6 address as its IPv4 one (one host, one bucket)."""
        host = getattr(peer, "host", peer)
        if isinstance(host, str) and host.lower().startswith("::ffff:") and "." in host:
            return host[7:]
        return host

    def refuses(self, peer: Any, session: str) -> bool:
        """Is a check of ``session``'s password from ``peer`` refused
        without being made (too many failures)?"""
        now, host = self.clock(), self.host(peer)
        if self.peers.empty(host, now) or (
                self.sessions.empty(session, now) and not self.peers.clean(host, now)):
            self.counters.throttled += 1
            return True
        return False

    def failed(self, peer: Any, session: str) -> None:
        now = self.clock()
        self.counters.failures += 1
        self.peers.take(self.host(peer), now)
        self.sessions.take(session, now)

    def submit(self, peer: Any, work: Callable[[], Any]) -> defer.Deferred:
        """A Deferred of ``work()`` (a scrypt), run when a worker is free,
        clean addresses first; fails with Busy if the queue is full."""
        d: defer.Deferred = defer.Deferred()
        clean = self.peers.clean(self.host(peer), self.clock())
        if len(self._clean) + len(self._suspect) >= self.queue_limit:
            if not (clean and self._suspect):
                self.counters.busy += 1
                return defer.fail(Busy("too many password checks waiting"))
            bumped, _ = self._suspect.pop()
            self.counters.busy += 1
            bumped.errback(Busy("too many password checks waiting"))
        (self._clean if clean else self._suspect).append((d, work))
        self._pump()
        return d

    def waiting(self) -> int:
        return len(self._clean) + len(self._suspect)

    def _pump(self) -> None:
        while self.running < self.workers and (self._clean or self._suspect):
            d, work = (self._clean or self._suspect).popleft()
            self.running += 1
            self.counters.checks += 1
            ran = self.run(work)

            def done(result: Any, d: defer.Deferred = d) -> None:
                self.running -= 1
                if isinstance(result, Failure):
                    d.errback(result)
                else:
                    d.callback(result)
                self._pump()
            ran.addBoth(done)

