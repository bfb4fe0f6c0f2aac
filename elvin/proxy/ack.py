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

from elvin.clientcore.acks import ACK, ACK_WINDOW
from elvin.values import Int64

__all__ = ["Acknowledger", "ACK", "ACK_WINDOW"]


class Acknowledger:
    """The acknowledgements of one connection (see the module docstring)."""

    def __init__(self, send: Callable[[Mapping[str, Any]], Any],
                 call_later: Callable[..., Any], window: int,
                 interval: float = 0.2) -> None:
        self.send = send
        self.call_later = call_later
        self.every = max(1, window // 4)
        self.interval = interval
        self.handled_count = 0
        self.told = 0
        self._timer: Optional[Any] = None

    def handled(self) -> None:
        """One more notification is done with (call after its callback)."""
        self.handled_count += 1
        if self.handled_count - self.told >= self.every:
            self.flush()
        elif self._timer is None:
            self._timer = self.call_later(self.interval, self._timed)

    def _timed(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> Any:
        """Tell the proxy now; returns what ``send`` returned (None if there
        was nothing new to tell)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self.handled_count <= self.told:
            return None
        self.told = self.handled_count
        return self.send({ACK: Int64(self.handled_count)})

    def reset(self) -> None:
        """A new connection (counts start again from its ConnRply)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self.handled_count = self.told = 0
