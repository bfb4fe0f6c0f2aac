"""Acknowledging what a proxy delivered, by hand (docs/proxy.md,
"Acknowledgements").

The three client flavours acknowledge by themselves when they join a
session (``elvin.clientcore.acks``; ``connect(..., ack_window=N)``): what
follows is for a program that speaks to the proxy some other way, or
counts what it handled itself.

A client that asks for ``Proxy.Ack-Window`` at connect tells the proxy,
with QosRqst option ``Proxy.Ack``, how many notifications its application
has handled since ConnRply; the proxy forgets (destructive receipt) or
marks (non-destructive) only those, and sends again, at the next join,
what was never acknowledged. ``Acknowledger`` keeps that count for one
connection and sends it when a quarter of the window is waiting, and
``interval`` seconds after the last notification, through whatever the
client library offers for a QosRqst (``send(options)``, e.g. the Twisted
client's ``Connection.set_options``); ``call_later(delay, f)`` is the
reactor's or the event loop's.

    ack = Acknowledger(conn.set_options, reactor.callLater, window)
    def show(note):
        print(note)
        ack.handled()           # after the application is done with it
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from elvin.clientcore.acks import ACK, ACK_WINDOW, AckTracker
from elvin.values import Int64

__all__ = ["Acknowledger", "ACK", "ACK_WINDOW"]


class Acknowledger:
    """The acknowledgements of one connection (see the module docstring):
    the client flavours' ``AckTracker`` counts, this adds the timer and the
    sending."""

    def __init__(self, send: Callable[[Mapping[str, Any]], Any],
                 call_later: Callable[..., Any], window: int,
                 interval: float = 0.2) -> None:
        self.send = send
        self.call_later = call_later
        self.window = max(1, window)
        self.interval = interval
        self.tracker = AckTracker()
        self.tracker.start(self.window)
        self._timer: Optional[Any] = None

    @property
    def handled_count(self) -> int:
        return self.tracker.handled

    def handled(self) -> None:
        """One more notification is done with (call after its callback)."""
        self.tracker.release(self.tracker.delivered())
        if self.tracker.due():
            self.flush()
        elif self._timer is None:
            self._timer = self.call_later(self.interval, self._timed)

    def _timed(self) -> None:
        self._timer = None
        self.flush()

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def flush(self) -> Any:
        """Tell the proxy now; returns what ``send`` returned (None if there
        was nothing new to tell)."""
        self._cancel_timer()
        count = self.tracker.take()
        if count is None:
            return None
        return self.send({ACK: Int64(count)})

    def reset(self) -> None:
        """A new connection (counts start again from its ConnRply)."""
        self._cancel_timer()
        self.tracker.start(self.window)
