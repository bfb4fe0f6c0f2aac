"""Federation over any connected graph, without I/O.

Routers that speak this ("mesh routers") agree on one spanning tree of the
links among them, from soft-state link adverts, and run plain EFP 1.0 over
the tree's links only: a link off the tree stays up but idle (each side
asks the other for nothing), ready to join the tree when another fails.
Two mechanisms, one for each guarantee:

* **Each link carries a notification at most once**: pull filters, and so
  notifications, flow only along the tree, which has no cycle.
* **No router delivers a notification twice**, even while routers briefly
  disagree about the tree after a failure: each notification entering the
  mesh gets an id, carried in the FedNotify routing list as one extra
  entry (``mesh:<domain>:<epoch>:<n>``, which plain routers carry along
  like a domain), and every mesh router drops one whose id it has seen
  (``DuplicateWindow``, bounded).

Adverts (``FedMeshAdvert``) go only to peers that announced themselves as
mesh routers, by one disjunct in their pull filter (``MARKER``: asking for
notifications with an attribute nobody sends), so a plain EFP 1.0 peer
(the Avis router) is never sent a new packet: its link is simply a tree
edge. docs/federation.md explains the guarantees and limits.
"""

from __future__ import annotations

import collections
import itertools
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

__all__ = ["MARKER_NAME", "ID_PREFIX", "PLAIN_PREFIX", "advert_domain", "MeshState", "Advert", "DuplicateWindow",
           "spanning_tree", "notification_id", "id_of"]

#: The attribute a mesh router's pull filters ask for, to say what it is.
MARKER_NAME = "Elvin-Federation.Mesh-1"
#: Routing-list entries that carry a notification's mesh id.
ID_PREFIX = "mesh:"
#: Advert entries naming a plain (EFP 1.0) neighbour rather than a mesh one.
PLAIN_PREFIX = "plain:"


def advert_domain(entry: str) -> str:
    """The router domain an advert's neighbour entry names."""
    return entry[len(PLAIN_PREFIX):] if entry.startswith(PLAIN_PREFIX) else entry


def notification_id(domain: str, epoch: int, number: int) -> str:
    return f"{ID_PREFIX}{domain}:{epoch}:{number}"


def id_of(routing: Iterable[str]) -> Optional[str]:
    """The mesh id in a routing list, if it has one."""
    for entry in routing:
        if entry.startswith(ID_PREFIX):
            return entry
    return None


class Advert:
    """What one router said of its mesh links: ``(epoch, sequence)``
    orders its adverts (a restarted router has a later epoch)."""

    __slots__ = ("origin", "epoch", "sequence", "neighbours", "plain", "expires")

    def __init__(self, origin: str, epoch: int, sequence: int,
                 neighbours: Iterable[str], expires: float) -> None:
        self.origin = origin
        self.epoch = epoch
        self.sequence = sequence
        entries = list(neighbours)
        self.neighbours: FrozenSet[str] = frozenset(
            e for e in entries if not e.startswith(PLAIN_PREFIX))
        #: Its plain neighbours (``PLAIN_PREFIX`` entries): routers that
        #: send no adverts, whose links only the mesh end can tell of.
        self.plain: FrozenSet[str] = frozenset(
            advert_domain(e) for e in entries if e.startswith(PLAIN_PREFIX))
        self.expires = expires

    @property
    def version(self) -> Tuple[int, int]:
        return (self.epoch, self.sequence)


def spanning_tree(nodes: Iterable[str], edges: Iterable[Tuple[str, str]],
                  later: Iterable[Tuple[str, str]] = ()) -> Set[Tuple[str, str]]:
    """The spanning forest every router computes alike: Kruskal's, taking
    edges in the order of their (smaller, larger) domain names, and the
    ``later`` edges (links to plain routers) after all the others, so a
    plain router linked to several mesh routers hangs off the tree by one
    link rather than carrying the mesh's traffic."""
    parent = {node: node for node in nodes}

    def root(node: str) -> str:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node
    tree = set()
    first = sorted({(e[0], e[1]) if e[0] <= e[1] else (e[1], e[0]) for e in edges})
    then = sorted({(e[0], e[1]) if e[0] <= e[1] else (e[1], e[0]) for e in later}
                  - set(first))
    for a, b in first + then:
        if a not in parent or b not in parent:
            continue
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
            tree.add((a, b))
    return tree


#: Most neighbours one advert may name (mesh and plain together); an advert
#: naming more is ignored: a router with this many mesh links is past
#: anything the tree is for, and a peer could otherwise have the router
#: hold and flood on any number (100,000 a advert grew one by 500 MB).
MAX_ADVERT_NEIGHBOURS = 64
#: Most other routers' adverts held; a new origin past it is ignored.
MAX_MESH_ROUTERS = 256


class MeshState:
    """This router's view of the mesh: its own mesh neighbours (links up
    to mesh routers), the adverts of the others (soft state: each expires
    ``lifetime`` seconds after it was last refreshed), and the tree."""

    def __init__(self, domain: str, epoch: int, lifetime: float) -> None:
        self.domain = domain
        self.epoch = epoch
        self.lifetime = lifetime
        self.sequence = 0
        self.neighbours: Set[str] = set()
        #: Our plain neighbours (links up to EFP 1.0 routers: the Avis
        #: router, ours with the mesh off), advertised so that a plain
        #: router linked to several mesh routers closes no cycle.
        self.plain: Set[str] = set()
        #: Leaving the mesh (a graceful stop): we advertise no links, so
        #: the others build their tree without us.
        self.leaving = False
        self.adverts: Dict[str, Advert] = {}
        self._numbers = itertools.count(1)

    def next_id(self) -> str:
        """An id for a notification entering the mesh here."""
        return notification_id(self.domain, self.epoch, next(self._numbers))

    def own_advert(self) -> Tuple[str, int, int, List[str]]:
        """A new advert of our own links: (origin, epoch, sequence, neighbours)."""
        self.sequence += 1
        if self.leaving:
            return (self.domain, self.epoch, self.sequence, [])
        return (self.domain, self.epoch, self.sequence,
                sorted(self.neighbours) + sorted(PLAIN_PREFIX + p for p in self.plain))

    def receive(self, origin: str, epoch: int, sequence: int, neighbours: Iterable[str],
                now: float) -> bool:
        """Take another router's advert; True if it was news (to be passed
        on, and the tree computed again)."""
        if origin == self.domain:
            return False
        known = self.adverts.get(origin)
        if known is None and len(self.adverts) >= MAX_MESH_ROUTERS:
            return False
        if known is not None and known.version >= (epoch, sequence):
            if known.version == (epoch, sequence):
                known.expires = max(known.expires, now + self.lifetime)
            return False
        self.adverts[origin] = Advert(origin, epoch, sequence, neighbours, now + self.lifetime)
        return True

    def expire(self, now: float) -> bool:
        """Forget adverts not refreshed in time; True if any went."""
        gone = [origin for origin, advert in self.adverts.items() if advert.expires <= now]
        for origin in gone:
            del self.adverts[origin]
        return bool(gone)

    def edges(self) -> Set[Tuple[str, str]]:
        """Links both ends advertise (our own side: the links up now)."""
        said: Dict[str, FrozenSet[str]] = {o: a.neighbours for o, a in self.adverts.items()}
        said[self.domain] = frozenset() if self.leaving else frozenset(self.neighbours)
        return {(a, b) for a, around in said.items() for b in around
                if a in said.get(b, ())}

    def plain_edges(self) -> Set[Tuple[str, str]]:
        """Links from mesh routers to plain ones (the mesh end's word:
        a plain router advertises nothing)."""
        said: Dict[str, FrozenSet[str]] = {o: a.plain for o, a in self.adverts.items()}
        said[self.domain] = frozenset() if self.leaving else frozenset(self.plain)
        mesh = set(self.adverts) | {self.domain}
        return {(a, p) for a, around in said.items() for p in around if p not in mesh}

    def tree_neighbours(self) -> Set[str]:
        """Our neighbours on the spanning tree (plain ones included)."""
        plain = self.plain_edges()
        nodes = set(self.adverts) | {self.domain} | {p for _, p in plain}
        tree = spanning_tree(nodes, self.edges(), plain)
        return ({b for a, b in tree if a == self.domain}
                | {a for a, b in tree if b == self.domain})


class DuplicateWindow:
    """The mesh ids of the last ``size`` notifications seen: one seen again
    within the window is a duplicate. Bounded memory; a duplicate arriving
    after ``size`` others would pass (docs/federation.md: the window)."""

    def __init__(self, size: int = 200_000) -> None:
        self.size = size
        self._seen: Set[str] = set()
        self._order: collections.deque = collections.deque()

    def seen(self, ident: str) -> bool:
        """True if ``ident`` was seen before; else remember it."""
        if ident in self._seen:
            return True
        self._seen.add(ident)
        self._order.append(ident)
        if len(self._order) > self.size:
            self._seen.discard(self._order.popleft())
        return False

    def __len__(self) -> int:
        return len(self._seen)
