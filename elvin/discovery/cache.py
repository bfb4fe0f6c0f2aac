"""The client's passive cache of routers seen, and choosing a URI from it.

Every advertisement observed (from ERDP multicast or DNS-SD) lands here,
keyed by the router's name.  Draft section 5.3: after the first SvrAdvt
from a router, later ones are dropped unless the revision changed; a
SvrAdvtClose removes the router.

Choosing (``candidates``), section 5.1:

* with a scope name, only routers advertising exactly that scope (compared
  as strings); without one (``scope=None``), only routers with the
  default flag set;
* only URIs that parse, that are Elvin 4.x, whose protocol stack this
  client can hold a session over (``elvin.endpoints.SUPPORTED_STACKS``
  less the datagram-only udp stack, read at call time so stacks added
  later count), and whose host is not a wildcard;
* loopback URIs (127.0.0.1, ::1, localhost) only from routers on this
  host: an ERDP advertisement whose source address is one of ours, or a
  DNS-SD record whose host name is ours.  A router elsewhere that
  advertises 127.0.0.1 would otherwise send us to our own loopback;
* routers in the order first seen (the expanding search finds near routers
  first), each router's URIs in its own order (the draft lets a router
  steer clients by ordering them).

Adverts are unauthenticated, so the cache is bounded: at most
``MAX_ROUTERS`` routers (past it the one not heard from longest goes,
routers on this host last) and the first ``MAX_URIS`` URIs of each (a
router's SvrAdvt fits one 1,472-byte datagram; each URI may cost a
connection attempt).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elvin.discovery.addresses import is_loopback, is_unspecified
from elvin.uri import ElvinURI, InvalidURIError, options_problem, version_problem

__all__ = ["RouterRecord", "RouterCache", "ERDP", "DNS_SD", "session_stacks",
           "MAX_ROUTERS", "MAX_URIS"]

#: Most routers one cache holds.
MAX_ROUTERS = 256
#: Most URIs kept of one router's advert.
MAX_URIS = 16

ERDP = "erdp"
DNS_SD = "dns-sd"


def session_stacks():
    """The protocol stacks this client can open a session over, read from
    ``elvin.endpoints`` now (other transports may have been added): every
    supported stack except datagram ones (udp carries only UNotify)."""
    from elvin import endpoints
    kinds = getattr(endpoints, "STACK_KINDS", {})
    return frozenset(stack for stack in endpoints.SUPPORTED_STACKS
                     if kinds.get(stack) != "udp" and stack[0] != "udp")


@dataclass
class RouterRecord:
    """What is known about one router."""

    name: str
    scope: str
    default: bool
    revision: int
    uris: tuple
    source: str = ERDP            # how it was learnt: "erdp" or "dns-sd"
    address: str = ""             # ERDP: sender's IP; DNS-SD: SRV host name
    local: bool = False           # the router runs on this host
    first_seen: float = 0.0
    last_seen: float = 0.0
    sources: set = field(default_factory=set)

    def usable_uris(self, stacks=None):
        """The ElvinURIs a client could connect to, in advertised order."""
        if stacks is None:
            stacks = session_stacks()
        result = []
        for text in self.uris:
            try:
                uri = ElvinURI(text)
            except InvalidURIError:
                continue
            if version_problem(uri) is not None or uri.protocol not in stacks:
                continue
            if options_problem(uri) is not None:
                continue     # an option we do not know: connecting would refuse it
            if is_unspecified(uri.host):
                continue
            if is_loopback(uri.host) and not self.local:
                continue
            if uri not in result:
                result.append(uri)
        return result

    def describe(self):
        flag = ", default" if self.default else ""
        return f"{self.name} (scope {self.scope!r}{flag}, revision {self.revision})"


class RouterCache:
    """Routers seen, by name, in the order first seen.

    ``listeners`` are called as ``listener(event, record)`` with event
    "added", "changed" or "withdrawn".
    """

    def __init__(self, clock=None, max_routers=MAX_ROUTERS):
        self.clock = clock
        self.routers = {}
        self.listeners = []
        self.duplicates = 0
        self.max_routers = max_routers
        #: Routers forgotten to make room (``max_routers``).
        self.evicted = 0

    def _now(self):
        return self.clock.seconds() if self.clock is not None else 0.0

    def __len__(self):
        return len(self.routers)

    def __iter__(self):
        return iter(list(self.routers.values()))

    def get(self, name):
        return self.routers.get(name)

    def _emit(self, event, record):
        for listener in list(self.listeners):
            listener(event, record)

    def learn(self, name, scope, default, revision, uris, source=ERDP,
              address="", local=False):
        """Record an advertisement; returns the record if it was new or
        changed, None if it repeated a known revision."""
        now = self._now()
        known = self.routers.get(name)
        if known is not None:
            known.last_seen = now
            known.sources.add(source)
            if known.revision == revision:
                self.duplicates += 1
                if local and not known.local:
                    known.local = True
                return None
        if known is None and len(self.routers) >= self.max_routers:
            self._evict()
        record = RouterRecord(name=name, scope=scope, default=bool(default),
                              revision=revision, uris=tuple(uris)[:MAX_URIS], source=source,
                              address=address, local=local, first_seen=now,
                              last_seen=now, sources={source})
        if known is not None:
            record.first_seen = known.first_seen
            record.sources |= known.sources
        self.routers[name] = record  # an update keeps the router's position
        self._emit("changed" if known is not None else "added", record)
        return record

    def _evict(self):
        """Forget the router not heard from longest (routers on this host
        last), to make room for a new one."""
        oldest = min(self.routers.values(), key=lambda r: (r.local, r.last_seen))
        del self.routers[oldest.name]
        self.evicted += 1
        self._emit("withdrawn", oldest)

    def advert(self, packet, address="", local=False, source=ERDP):
        """Record a SvrAdvt packet (see ``learn``)."""
        return self.learn(packet.server, packet.scope, packet.default,
                          packet.revision, packet.uris, source=source,
                          address=address, local=local)

    def withdraw(self, name, source=None):
        """Forget a router (SvrAdvtClose, or a DNS-SD removal when
        ``source`` is given: then only if no other source still has it)."""
        record = self.routers.get(name)
        if record is None:
            return None
        if source is not None:
            record.sources.discard(source)
            if record.sources:
                return None
        del self.routers[name]
        self._emit("withdrawn", record)
        return record

    def matching(self, scope=None):
        """Routers that a client with ``scope`` may use (section 5.1)."""
        if scope is None:
            return [r for r in self.routers.values() if r.default]
        return [r for r in self.routers.values() if r.scope == scope]

    def candidates(self, scope=None, exclude=(), stacks=None):
        """``[(record, ElvinURI), ...]`` to try, best first, leaving out the
        ``(name, revision, uri)`` triples in ``exclude``."""
        result = []
        for record in self.matching(scope):
            for uri in record.usable_uris(stacks):
                if (record.name, record.revision, uri) not in exclude:
                    result.append((record, uri))
        return result
