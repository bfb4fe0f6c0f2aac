"""A configured outgoing federation link (``Federation.Connect``) as the
status shows it, up or not (docs/operations.md).

A ``FederationLink`` lives for one connection and the manager knows it
only while it is up; a configured link lives as long as its ``ClientService``
(``protocol.connector_service``) keeps dialling. That service tells its
``DialledPeer`` of each dial, failed dial and scheduled redial, and the
manager tells it when its link comes up and goes down, so a peer that is
down still has a row, a state, its last error and when the next attempt
is. Its counters run on across reconnections: what the links that went
down counted is kept, and the current link's is added (``totals``).
"""

import collections
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from elvin.federation.link import FederationLink

__all__ = ["DialledPeer", "DIAL_STATES", "link_counts"]

#: What a configured link is doing: a connect under way (TCP, and TLS
#: for ewaf:/secure), connected with the handshake under way, up, or
#: waiting to dial again.
DIAL_STATES = ("dialling", "connecting", "up", "redialling")


def link_counts(link: "FederationLink") -> dict[str, int]:
    """A link's counters (``LinkStats``) and its bytes each way."""
    counts: dict[str, int] = dict(link.stats)
    counts["bytes_in"] = getattr(link.output, "bytes_in", 0)
    counts["bytes_out"] = getattr(link.output, "bytes_out", 0)
    return counts


class DialledPeer:
    """One ``Federation.Connect`` URI of one class."""

    def __init__(self, uri: str, host: Optional[str], class_name: Optional[str], clock: Any):
        self.uri = uri
        self.host = host
        self.class_name = class_name
        self.clock = clock
        self.state = "dialling"
        #: The link of the connection open now (up or in its handshake).
        self.link: Optional["FederationLink"] = None
        #: The peer's router domain, from the last link that came up.
        self.domain: Optional[str] = None
        #: Why the last dial failed or the last link went down, and when
        #: (the clock's seconds).
        self.last_error: Optional[str] = None
        self.last_error_at: Optional[float] = None
        #: When the next dial is due (the clock's seconds), while redialling.
        self.next_attempt: Optional[float] = None
        #: Attempts since a link was last up (or since the start).
        self.attempts = 0
        #: When a link last came up and last went down.
        self.up_at: Optional[float] = None
        self.down_at: Optional[float] = None
        #: When the last link's peer last sent anything.
        self.last_heard: Optional[float] = None
        #: What the links gone down counted (LinkStats, bytes_in, bytes_out).
        self.past: collections.Counter = collections.Counter()

    def __repr__(self) -> str:
        return f"<DialledPeer {self.uri} {self.state}>"

    # -- told by the ClientService (connector_service) -----------------------

    def dialling(self) -> None:
        self.state = "dialling"
        self.next_attempt = None

    def dial_failed(self, reason: str) -> None:
        self._failed(reason)
        self.state = "redialling"

    def redial_in(self, delay: float, attempts: int) -> None:
        """The next dial is in ``delay`` seconds, the ``attempts``-th since
        a link was up."""
        self.attempts = attempts
        if self.link is None:
            self.state = "redialling"
            self.next_attempt = self.clock.seconds() + delay

    # -- told by the protocol and the manager ---------------------------------

    def connected(self, link: "FederationLink") -> None:
        """A connection is open and ``link`` is doing its handshake."""
        self.link = link
        link.dial = self
        self.state = "connecting"
        self.next_attempt = None

    def came_up(self, link: "FederationLink") -> None:
        if link is not self.link:
            return
        self.state = "up"
        self.domain = link.peer_domain
        self.attempts = 0
        self.up_at = self.clock.seconds()

    def went_down(self, link: "FederationLink", reason: str) -> None:
        """``link`` is closed: keep what it counted."""
        if link is not self.link:
            return
        self.past.update(link_counts(link))
        self.link = None
        if link.last_heard is not None:
            self.last_heard = link.last_heard
        if self.state == "up":
            self.down_at = self.clock.seconds()
        self.state = "redialling"
        self._failed(reason)

    def _failed(self, reason: str) -> None:
        self.last_error = reason
        self.last_error_at = self.clock.seconds()

    # -- read by the status ------------------------------------------------------

    def totals(self) -> collections.Counter:
        """Every link's counts since the configured link was first dialled:
        the links gone down and the one open now."""
        totals = collections.Counter(self.past)
        if self.link is not None:
            totals.update(link_counts(self.link))
        return totals

    def heard(self) -> Optional[float]:
        """When the peer last sent anything over any of these links."""
        if self.link is not None and self.link.last_heard is not None:
            return self.link.last_heard
        return self.last_heard
