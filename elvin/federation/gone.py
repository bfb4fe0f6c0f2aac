"""What links peers dialled to us counted, kept after they go down
(docs/operations.md, "Federation links, up or down").

A configured link's counters run across its reconnections
(``dial.DialledPeer``); a link a peer dials to us is known to the manager
only while it is up, so its metric series would vanish when it went down
and start again from 0 when it came back. ``IncomingPeers`` keeps its
counts by the peer's router domain (checked when the link came up), so
the peer keeps a row, state ``down``, and its counters go on when it
returns. It keeps the ``MAX_PEERS`` peers whose links went down last: the
peers of a router listening for federation choose their own domains, and
one that comes back under ever new names must not grow the table (or the
metrics) without bound. A peer forgotten so starts from 0 if it returns.
"""

import collections
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

from elvin.federation.dial import link_counts

if TYPE_CHECKING:
    from elvin.federation.link import FederationLink

__all__ = ["IncomingPeers", "GonePeer", "MAX_PEERS"]

#: Peers whose gone links' counts are kept (the latest to go down).
MAX_PEERS = 256


class GonePeer:
    """The links one peer dialled to us that went down, summed."""

    __slots__ = ("domain", "host", "class_name", "counts", "last_heard", "down_at",
                 "reason")

    def __init__(self, domain: str):
        self.domain = domain
        self.host: Optional[str] = None
        self.class_name: Optional[str] = None
        self.counts: collections.Counter = collections.Counter()
        self.last_heard: Optional[float] = None
        self.down_at: Optional[float] = None
        self.reason: Optional[str] = None


class IncomingPeers:
    """The gone incoming links' counts, by peer domain, at most ``limit``."""

    def __init__(self, clock: Any, limit: int = MAX_PEERS):
        self.clock = clock
        self.limit = limit
        self._peers: "collections.OrderedDict[str, GonePeer]" = collections.OrderedDict()
        #: Peers forgotten to stay within ``limit``.
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._peers)

    def went_down(self, link: "FederationLink", reason: str) -> None:
        """``link``, which came up (it has a domain), is closed: add what
        it counted to its peer's, which becomes the latest gone."""
        domain = link.peer_domain
        if domain is None:
            return
        peer = self._peers.pop(domain, None) or GonePeer(domain)
        peer.counts.update(link_counts(link))
        peer.host = link.peer_host
        peer.class_name = link.fed_class.name if link.fed_class else None
        if link.last_heard is not None:
            peer.last_heard = link.last_heard
        peer.down_at = self.clock.seconds()
        peer.reason = reason
        self._peers[domain] = peer
        while len(self._peers) > self.limit:
            self._peers.popitem(last=False)
            self.forgotten += 1

    def past(self, domain: Optional[str]) -> collections.Counter:
        """What ``domain``'s gone links counted (empty if none are kept)."""
        peer = self._peers.get(domain) if domain is not None else None
        return peer.counts if peer is not None else collections.Counter()

    def down(self, up: Iterable[Optional[str]]) -> Iterator[GonePeer]:
        """The peers kept whose domain is not in ``up`` (the domains of the
        incoming links up now), the earliest gone first."""
        up = set(up)
        return (peer for domain, peer in self._peers.items() if domain not in up)
