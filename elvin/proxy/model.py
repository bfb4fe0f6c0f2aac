"""What the proxy keeps: sessions, their subscriptions, and the names of
the proxy's options (docs/proxy.md).

Kept apart from what acts on them (joining, relaying upstream, delivering
and storing, answering requests: the other modules of elvin.proxy) so that
those parts share one definition, and the store's encoding of keys sits
beside the classes whose keys it stores.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

from elvin.core.keys import KeyRing
from elvin.protocols import packets
from elvin.protocols.xdr import Writer
from elvin.values import Int64

__all__ = ["Session", "ProxySubscription", "SESSION", "PASSWORD", "ADMIN_PASSWORD",
           "RECEIPT", "CLIENT", "TTL", "MAX_COUNT", "DELETE_SESSION", "EVENT",
           "DESTRUCTIVE", "NON_DESTRUCTIVE", "ACK", "ACK_WINDOW", "MAX_JOINED",
           "keys_to_bytes", "ring_from_bytes", "raw_ring"]

# ConnRqst / QosRqst options of the proxy's extension (docs/proxy.md).
SESSION = "Proxy.Session"
PASSWORD = "Proxy.Password"
ADMIN_PASSWORD = "Proxy.Admin-Password"
RECEIPT = "Proxy.Receipt"
CLIENT = "Proxy.Client"
TTL = "Proxy.TTL"
MAX_COUNT = "Proxy.Max-Count"
DELETE_SESSION = "Proxy.Delete-Session"
#: ConnRqst: this client acknowledges; at most this many unacknowledged.
ACK_WINDOW = "Proxy.Ack-Window"
#: QosRqst: how many notifications the client's application has handled
#: since ConnRply (cumulative).
ACK = "Proxy.Ack"
#: The attribute naming a session event (a NotifyDeliver matching nothing).
EVENT = "Proxy.Event"
DESTRUCTIVE = "destructive"
NON_DESTRUCTIVE = "non-destructive"
#: Most sessions one connection may join.
MAX_JOINED = 16

def keys_to_bytes(nfn: KeyRing, sub: KeyRing) -> Optional[bytes]:
    """A session's raw keys as stored (JSON: scheme -> key sets, in hex)."""
    if not nfn and not sub:
        return None

    def entries(ring):
        return [[scheme, [[k.hex() for k in ks] for ks in sets]]
                for scheme, sets in ring.to_wire().entries()]
    return json.dumps({"nfn": entries(nfn), "sub": entries(sub)}).encode()


def ring_from_bytes(data: Optional[bytes], part: str) -> KeyRing:
    if not data:
        return KeyRing.EMPTY
    entries = json.loads(data)[part]
    return KeyRing.from_prepared_wire(packets.Keys(
        [(scheme, [[bytes.fromhex(k) for k in ks] for ks in sets]) for scheme, sets in entries]))


def _keys_bytes(ring: KeyRing) -> bytes:
    """Raw keys as the protocol encodes a Keys (an opaque attribute)."""
    writer = Writer()
    packets.KEYS.write(writer, ring.to_wire())
    return writer.getvalue()


def raw_ring(wire_keys: packets.Keys) -> KeyRing:
    """Keys as a client sent them, unprepared (``from_wire`` checked them)."""
    return KeyRing.from_prepared_wire(wire_keys) if wire_keys else KeyRing.EMPTY


class ProxySubscription:
    """One subscription of a session, and the upstream subscription that
    stands for it (``upstream_id``; None while upstream is down or has not
    answered)."""

    __slots__ = ("id", "session", "expression", "accept_insecure", "keys", "ttl",
                 "max_count", "upstream_id", "in_flight", "placing_failed")

    def __init__(self, sub_id, session, expression, accept_insecure, keys=KeyRing.EMPTY,
                 ttl=None, max_count=None):
        self.id = sub_id
        self.session = session
        self.expression = expression
        self.accept_insecure = accept_insecure
        self.keys = keys
        self.ttl = ttl
        self.max_count = max_count
        self.upstream_id = None
        self.in_flight = False
        #: A request making it again upstream went unanswered: its session
        #: is told of the gap once it is placed.
        self.placing_failed = False

    def upstream_keys(self) -> KeyRing:
        return self.keys.union(self.session.sub_keys)

    def event(self) -> Dict[str, Any]:
        """The "subscription" event telling clients of its session about it."""
        return {EVENT: "subscription", SESSION: self.session.name,
                "Proxy.Subscription": Int64(self.id), "Proxy.Expression": self.expression,
                "Proxy.Accept-Insecure": int(self.accept_insecure),
                TTL: int(self.ttl or 0), MAX_COUNT: int(self.max_count or 0)}

    def __repr__(self):
        return f"<ProxySubscription {self.id} of {self.session.name!r}: {self.expression!r}>"


class Session:
    """A session: named and kept in the store, or anonymous (``name`` None)
    for one plain client and gone with it."""

    def __init__(self, name=None, join_hash=None, admin_hash=None, nfn_keys=KeyRing.EMPTY,
                 sub_keys=KeyRing.EMPTY, creator=None):
        self.name = name
        self.join_hash = join_hash
        self.admin_hash = admin_hash
        self.nfn_keys = nfn_keys
        self.sub_keys = sub_keys
        #: The host whose client created it (``max-sessions-per-host``), if known.
        self.creator = creator
        self.subscriptions: Dict[int, ProxySubscription] = {}
        self.clients: set = set()

    @property
    def persistent(self) -> bool:
        return self.name is not None

    def keys_event(self) -> Optional[Dict[str, Any]]:
        """The "keys" event: the session's keys and its subscriptions' own,
        each encoded as the protocol's Keys (None: it has none)."""
        event: Dict[str, Any] = {}
        for attribute, ring in (("Proxy.Notification-Keys", self.nfn_keys),
                                ("Proxy.Subscription-Keys", self.sub_keys)):
            if ring:
                event[attribute] = _keys_bytes(ring)
        for sub in self.subscriptions.values():
            if sub.keys:
                event[f"Proxy.Subscription-Keys.{sub.id}"] = _keys_bytes(sub.keys)
        if not event:
            return None
        return {EVENT: "keys", SESSION: self.name, **event}

    def __repr__(self):
        return f"<Session {self.name!r}: {len(self.subscriptions)} subscriptions>"
