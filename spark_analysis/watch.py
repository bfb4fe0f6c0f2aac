"""Keep analysing as traces arrive (``--watch``): one Spark session for every run.

A cron job of ``python -m spark_analysis`` pays for a new JVM each time,
and for a cold one: its few hundred small queries are compiled and warmed
up again on every run. A process that stays up pays that once. ``watch``
runs the analysis, then looks at the trace directory every ``interval``
seconds and runs it again when a trace file appeared, grew, shrank or was
rotated since the last run; each run reads only what is new into the
table and rewrites the report, which then says what changed since the
one before.

No Spark here: the run and the listing are passed in, so the loop is
tested without a JVM.
"""

import sys
import threading
import time

__all__ = ["watch", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text):
    """Seconds (float) from ``90``, ``90s``, ``15m``, ``1h``, ``1.5h`` or ``2d``.

    Raises ValueError naming the text when it is none of these or not positive.
    """
    value = text.strip().lower()
    unit = 1
    if value and value[-1] in _UNITS:
        value, unit = value[:-1], _UNITS[value[-1]]
    try:
        seconds = float(value) * unit
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 15m, 1h, 2d)") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{text!r}: a duration must be positive")
    return seconds


def watch(analyse, listing, interval, progress=sys.stderr, sleep=None,
          clock=time.monotonic, max_runs=None, recoverable=(), describe="the traces",
          stop=None):
    """Run ``analyse(files)`` now and whenever ``listing()`` changes; returns the runs made.

    ``listing()`` returns [(path, size)], and is looked at every
    ``interval`` seconds (from the start of one look to the next; at once
    after a run that took longer): a run starts when it differs from the
    listing the last run was given. Routers' current files grow all the
    time, so under steady traffic a run starts every ``interval``, and
    never more often. An exception in ``recoverable`` (a directory with
    nothing to read yet, a file gone while listed) is printed and the loop
    goes on; anything else ends it. ``max_runs`` (tests, benchmarks) stops
    after that many runs. ``stop`` (a threading.Event, set by a signal
    handler) ends the loop at its next look, and cuts a wait short.
    """
    stop = stop or threading.Event()
    sleep = sleep or stop.wait
    seen = None
    runs = 0
    waiting = False
    said = None                 # the listing's error, said once until it changes
    while (max_runs is None or runs < max_runs) and not stop.is_set():
        began = clock()
        try:
            current = sorted(listing())
            said = None
        except recoverable as e:
            if str(e) != said:
                _say(progress, f"error: {e}")
                said = str(e)
                waiting = False
            current = seen
        if current is not None and current != seen:
            seen = current
            waiting = False
            runs += 1
            try:
                analyse(current)
            except recoverable as e:
                _say(progress, f"error: {e}")
            if max_runs is not None and runs >= max_runs:
                break
        elif not waiting:
            _say(progress, f"watching {describe} every {interval:g} s for new trace data "
                           f"(Ctrl-C to stop) ...")
            waiting = True
        left = began + interval - clock()
        if left > 0:
            sleep(left)
    return runs


def _say(progress, text):
    if progress:
        print(text, file=progress, flush=True)
