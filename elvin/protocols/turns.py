"""A time slice per connection and reading turn (a router's ``max-turn-time``).

The reactor reads at most 64 KiB from a socket per turn, and the framing
layer handles every whole packet of it before the next socket is served.
Most packets cost microseconds, but 64 KiB of costly requests (SubModRqsts
of 3.5 KB expressions, each parsed anew) cost 250 ms, every other client
waiting. A ``TurnSlice`` is the router-wide time one connection's packets
may take in one turn: past it, ``FramedProtocol`` keeps the rest of that
connection's input, pauses reading its transport, and goes on in a later
reactor turn (``later``), so other connections' input and timers are
served in between (docs/reliability.md, "Fair reading").

Time is the clock's (``clock.seconds``): the reactor's own, which is what
its timers use, and a ``Clock`` that only a test moves, so tests are exact.
"""

import time

__all__ = ["TurnSlice", "DEFAULT_MAX_TURN_TIME"]

#: Default ``max-turn-time``, in milliseconds.
DEFAULT_MAX_TURN_TIME = 5


class TurnSlice:
    """How long one connection's packets may take in one reading turn.

    ``seconds`` (0: turns are never cut) may change at any time (a
    reload); each turn reads it as it starts. ``clock`` gives the time
    and runs the continuations. ``cuts`` counts the turns cut (for
    metrics: ``elvin_turns_sliced_total``).
    """

    def __init__(self, seconds, clock, now=None):
        self.seconds = seconds
        self.clock = clock
        #: The time now, in seconds (the clock's unless told otherwise).
        self.now = now or getattr(clock, "seconds", None) or time.monotonic
        self.cuts = 0

    def deadline(self):
        """When a turn starting now is over, or None: never."""
        seconds = self.seconds
        return self.now() + seconds if seconds > 0 else None

    def later(self, f):
        """Call ``f`` in a later reactor turn: an IDelayedCall."""
        self.cuts += 1
        return self.clock.callLater(0, f)
