"""Rate-limited log lines, with no I/O: whoever logs asks ``LogLimiter``
whether to, with a clock it is given, so a peer that repeats a fault
cannot turn the log into a flood."""

__all__ = ["LogLimiter", "LOG_INTERVAL"]

#: Seconds between two lines of one kind.
LOG_INTERVAL = 10.0


class LogLimiter:
    """At most one line of a kind per ``interval`` seconds of ``clock``."""

    def __init__(self, clock, interval=LOG_INTERVAL):
        self.clock = clock
        self.interval = interval
        #: Events not logged since the last line.
        self.suppressed = 0
        self._next = None

    def allow(self):
        """None when this event is not to be logged; else how many were not
        logged since the last line (to be said in this one)."""
        now = self.clock()
        if self._next is not None and now < self._next:
            self.suppressed += 1
            return None
        self._next = now + self.interval
        skipped, self.suppressed = self.suppressed, 0
        return skipped

    def more(self, skipped):
        """The words a line adds for ``skipped`` events not logged."""
        if not skipped:
            return ""
        return f" ({skipped} more in the last {self.interval:g} s not logged)"
