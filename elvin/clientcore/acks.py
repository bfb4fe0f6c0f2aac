"""Acknowledging to an Elvin proxy what the program has handled, without I/O.

A proxy session joined with ``Proxy.Ack-Window`` W (docs/proxy.md,
"Acknowledgements") forgets (destructive receipt) or marks
(non-destructive) only what the client says its program has handled, and
sends the rest again at the next join. The client says so with QosRqst
option ``Proxy.Ack``: a count of notifications since ConnRply, every one
up to it handled. ``AckTracker`` keeps that count for one connection:

* ``delivered()`` numbers the next notification of the channel and
  returns its token, held once (by the delivery itself);
* ``hold(token)`` / ``release(token)``: something else holds it (an
  iterator's queue, a running coroutine callback, a blocking program's
  queue) until it is released;
* the handled count is the longest run 1..n all released, so a
  notification held back (a slow iterator) holds back the count, never
  lets a later one be acknowledged in its place;
* ``due()`` says whether to tell the proxy now (a quarter of the window
  waiting); otherwise the flavour tells it ``interval`` seconds after the
  first handled notification not yet told (``ClientState``'s timer).

``start(window)`` begins a channel (its ConnRply): tokens of earlier
channels are ignored from then on, as the proxy counts from ConnRply too.
Nothing here imports Twisted or asyncio.
"""

from typing import Dict, Optional, Set, Tuple

__all__ = ["AckTracker", "ACK", "ACK_WINDOW", "DEFAULT_ACK_WINDOW", "ACK_INTERVAL"]

#: QosRqst option: notifications handled since ConnRply (docs/proxy.md).
ACK = "Proxy.Ack"
#: ConnRqst option: how many notifications the client lets the proxy have
#: unacknowledged; the proxy's ConnRply says what it granted.
ACK_WINDOW = "Proxy.Ack-Window"
#: The window the client flavours ask for when they join a session.
DEFAULT_ACK_WINDOW = 256
#: Seconds after which handled notifications are acknowledged even when
#: fewer than a quarter of the window are waiting.
ACK_INTERVAL = 0.1

#: (channel generation, number of the notification on that channel)
Token = Tuple[int, int]


class AckTracker:
    """The handled count of one connection's current channel (see the
    module docstring)."""

    def __init__(self) -> None:
        self.window = 0
        self.generation = 0
        #: notifications delivered on this channel
        self.received = 0
        #: every notification up to this one is handled
        self.handled = 0
        #: the count last sent to the proxy
        self.told = 0
        self._holds: Dict[int, int] = {}
        self._done: Set[int] = set()

    @property
    def active(self) -> bool:
        """The proxy granted a window on this channel."""
        return self.window > 0

    def start(self, window: int) -> None:
        """A new channel's ConnRply granted ``window`` (0: no acknowledging)."""
        self.window = max(0, int(window))
        self.generation += 1
        self.received = self.handled = self.told = 0
        self._holds.clear()
        self._done.clear()

    def stop(self) -> None:
        """No more acknowledgements on this channel (closing, or lost)."""
        self.start(0)

    def delivered(self) -> Optional[Token]:
        """The next notification of the channel arrived: its token, held
        once (release it when the delivery's callbacks have returned)."""
        if not self.window:
            return None
        self.received += 1
        self._holds[self.received] = 1
        return (self.generation, self.received)

    def hold(self, token: Optional[Token]) -> None:
        if token is None or token[0] != self.generation:
            return
        number = token[1]
        if number in self._holds:
            self._holds[number] += 1

    def release(self, token: Optional[Token]) -> None:
        """One holder is done with the notification; when none is left it
        is handled, and the count moves over every handled one in a row."""
        if token is None or token[0] != self.generation:
            return
        number = token[1]
        left = self._holds.get(number)
        if left is None:
            return
        if left > 1:
            self._holds[number] = left - 1
            return
        del self._holds[number]
        if number != self.handled + 1:
            self._done.add(number)
            return
        handled = number
        done = self._done
        while handled + 1 in done:
            handled += 1
            done.discard(handled)
        self.handled = handled

    @property
    def waiting(self) -> int:
        """Handled and not yet told."""
        return self.handled - self.told

    def due(self) -> bool:
        """Tell the proxy now: a quarter of the window is handled and untold."""
        return self.window > 0 and self.waiting >= max(1, self.window // 4)

    def take(self) -> Optional[int]:
        """The count to send now (None: nothing new), marked as told."""
        if not self.window or self.handled <= self.told:
            return None
        self.told = self.handled
        return self.handled
