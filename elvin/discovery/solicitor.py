"""The client's active discovery (solicitation) as a state machine, free of I/O.

``Solicitor`` decides when a client sends SvrRqst and with which locality;
its owner supplies ``send(packet, locality)``, a clock (``seconds``,
``callLater``) and a ``random.Random``, and feeds it the packets other
parties send (``observed``).

Draft section 5.2.1, and how it is read here:

* Discovery is passive until the application asks for advertisements
  (``solicit``).  Each solicitation step has a locality from
  ``PRE_REQUEST`` (0, 1, 2, 4, 8, 16, 32, 64 -- up to ``max_locality``) and
  waits the step's pre-request interval first (0, 0.4 +/- 0.2, 2 +/- 1,
  ... 8 +/- 4 seconds; the random part drawn afresh for every wait,
  uniformly within the +/- range, so never less than the table allows).
* If during the wait a version-compatible SvrRqst from someone else with an
  equal or greater locality is observed, this step's SvrRqst is suppressed:
  the step ends without sending and the next (wider) step follows.
* If during the wait a version-compatible SvrAdvt is observed, the
  SvrRqst is postponed: the step is abandoned and solicitation stops until
  the application calls ``solicit`` again (``on_postponed`` tells it, so
  it can do that if what arrived was of no use to it).  The postponed step
  is the one that runs next.
* After a step (sent or suppressed) the next step starts at once -- its
  pre-request interval is also the time answers to the last SvrRqst have
  to arrive.  After the last step (the highest locality) solicitation
  stops (``on_exhausted``); a further ``solicit`` repeats the last step.
  A step never sends a locality already sent less than ``REPEAT_GAP`` (two)
  seconds before: the wait is stretched (longer than the table's minimum,
  which the draft allows), so a client at locality 0 -- whose interval is
  zero -- cannot spin.
* Five minutes (``PASSIVE_AFTER``) after the last SvrRqst was sent, if the
  application has not asked again in that time, discovery reverts to
  passive and the next solicitation starts again from locality 0.
"""

from __future__ import annotations

import random as _random

from elvin.discovery.packets import (
    MAX_LOCALITY, SvrAdvt, SvrRqst, compatible)

__all__ = ["Solicitor", "PRE_REQUEST", "PASSIVE_AFTER", "REPEAT_GAP", "steps_for"]

#: (locality, base interval, +/- variation) in seconds, section 5.2.1.
PRE_REQUEST = (
    (0, 0.0, 0.0),
    (1, 0.4, 0.2),
    (2, 2.0, 1.0),
    (4, 2.0, 1.0),
    (8, 2.0, 1.0),
    (16, 4.0, 2.0),
    (32, 4.0, 2.0),
    (64, 8.0, 4.0),
)

#: Seconds without further solicitation after which discovery is passive.
PASSIVE_AFTER = 300.0

#: Least gap before a SvrRqst repeats a locality already sent (the routers'
#: two-second answer rate limit: asking faster gains nothing).
REPEAT_GAP = 2.0

PASSIVE = "passive"
ACTIVE = "active"


def steps_for(max_locality):
    """The PRE_REQUEST steps whose locality is at most ``max_locality``."""
    if not 0 <= max_locality <= MAX_LOCALITY:
        raise ValueError(f"locality must be 0-{MAX_LOCALITY}, not {max_locality}")
    return tuple(step for step in PRE_REQUEST if step[0] <= max_locality)


class Solicitor:
    """Active ERDP discovery for one client."""

    def __init__(self, clock, send, max_locality=64, random=None,
                 on_postponed=None, on_exhausted=None):
        self.clock = clock
        self._send = send
        self.steps = steps_for(max_locality)
        self.random = random or _random.Random()
        self.on_postponed = on_postponed
        self.on_exhausted = on_exhausted
        self.mode = PASSIVE
        self.index = 0              # the next step to run
        self.waiting = False        # in a pre-request interval
        self._wait = None           # its DelayedCall
        self._suppressed = False
        self._passive_timer = None
        self.last_sent_at = None
        self.last_solicit_at = None
        #: (time, locality) of every SvrRqst sent, and of every suppressed
        #: one; (start, end, locality, outcome) of every pre-request wait,
        #: outcome "sent", "suppressed" or "postponed".  For diagnostics and
        #: tests; the most recent 1000 of each are kept.
        self.sent = []
        self.suppressed = []
        self.history = []
        self.postponed = 0
        self._wait_started = None

    @property
    def locality(self):
        """Locality of the step that runs next (or is running)."""
        return self.steps[self.index][0]

    # -- application ---------------------------------------------------------

    def solicit(self):
        """The application wants (further) advertisements."""
        self.last_solicit_at = self.clock.seconds()
        self._arm_passive_timer()
        if self.waiting:
            return
        if self.mode == PASSIVE:
            self.mode = ACTIVE
            self.index = 0
        self._start_wait()

    def stop(self):
        """Cancel everything (the client is going away)."""
        self._cancel_wait()
        if self._passive_timer is not None and self._passive_timer.active():
            self._passive_timer.cancel()
        self._passive_timer = None

    # -- network -------------------------------------------------------------

    def observed(self, packet):
        """A packet from someone else arrived on the discovery group."""
        if not self.waiting or not compatible(packet):
            return
        kind = type(packet)
        if kind is SvrRqst:
            if packet.locality >= self.locality:
                self._suppressed = True
        elif kind is SvrAdvt:
            _append(self.history, (self._wait_started, self.clock.seconds(),
                                   self.locality, "postponed"))
            self._cancel_wait()
            self.postponed += 1
            if self.on_postponed is not None:
                self.on_postponed()

    # -- internals -----------------------------------------------------------

    def _interval(self):
        _locality, base, spread = self.steps[self.index]
        if spread == 0:
            return base
        return self.random.uniform(base - spread, base + spread)

    def _start_wait(self):
        self.waiting = True
        self._suppressed = False
        interval = self._interval()
        if self.sent and self.sent[-1][1] >= self.locality:
            # Repeating a locality already used (the last step again, or a
            # step resumed after postponement): never ask more often than
            # routers may answer (the draft's table allows longer waits).
            interval = max(interval, self.sent[-1][0] + REPEAT_GAP - self.clock.seconds())
        self._wait_started = self.clock.seconds()
        self._wait = self.clock.callLater(interval, self._wait_over)

    def _cancel_wait(self):
        if self._wait is not None and self._wait.active():
            self._wait.cancel()
        self._wait = None
        self.waiting = False
        self._suppressed = False

    def _wait_over(self):
        self._wait = None
        self.waiting = False
        locality = self.locality
        now = self.clock.seconds()
        send = not self._suppressed
        self._suppressed = False
        if send:
            _append(self.sent, (now, locality))
            _append(self.history, (self._wait_started, now, locality, "sent"))
            self.last_sent_at = now
            self._arm_passive_timer()
        else:
            _append(self.suppressed, (now, locality))
            _append(self.history, (self._wait_started, now, locality, "suppressed"))
        # The next step's wait starts before the packet leaves, so that an
        # answer arriving at once (even re-entrantly) falls inside it.
        exhausted = self.index + 1 >= len(self.steps)
        if not exhausted:
            self.index += 1
            self._start_wait()
        if send:
            self._send(SvrRqst(locality=locality), locality)
        if exhausted and self.on_exhausted is not None:
            self.on_exhausted()

    def _arm_passive_timer(self):
        if self._passive_timer is not None and self._passive_timer.active():
            self._passive_timer.cancel()
        self._passive_timer = self.clock.callLater(PASSIVE_AFTER, self._maybe_passive)

    def _maybe_passive(self):
        self._passive_timer = None
        now = self.clock.seconds()
        latest = max(self.last_sent_at or 0, self.last_solicit_at or 0)
        if self.waiting:
            # Still soliciting (every step suppressed so far): look again later.
            self._passive_timer = self.clock.callLater(PASSIVE_AFTER, self._maybe_passive)
            return
        if now - latest < PASSIVE_AFTER:
            self._passive_timer = self.clock.callLater(
                latest + PASSIVE_AFTER - now, self._maybe_passive)
            return
        self.mode = PASSIVE
        self.index = 0


def _append(log, item, limit=1000):
    log.append(item)
    if len(log) > limit:
        del log[: len(log) - limit]
