"""A router's status as plain data: what the status page shows, what
``elvin-stat`` prints and what the metrics are made of.

``snapshot`` only reads what the router, its sessions and its federation
already keep; nothing on the routing path counts anything for it.
"""

import time
from typing import TYPE_CHECKING, Any, Iterable, Optional

from elvin import __version__
from elvin.errors import ERROR_NAMES
from elvin.federation.filters import FALSE, TRUE
from elvin.subscription.printer import to_text

if TYPE_CHECKING:
    from elvin.core.router import ClientSession, Router, UdpCounters
    from elvin.discovery.service import DiscoveryService
    from elvin.federation.link import FederationLink
    from elvin.federation.manager import FederationManager

__all__ = ["snapshot", "transport_of", "filter_text"]


def transport_of(session: "ClientSession") -> str:
    """Which transport a client session came by: tcp, tls, http or udp
    (an output may say so itself, as ``transport_kind``)."""
    output = session.output
    said = getattr(output, "transport_kind", None)
    if isinstance(said, str):
        return said
    kind = type(output).__name__.lower()
    if "http" in kind:
        return "http"
    transport = getattr(output, "transport", None)
    if transport is not None and (getattr(transport, "TLS", False)
                                  or type(transport).__name__.startswith("TLS")
                                  or hasattr(transport, "getPeerCertificate")):
        return "tls"
    if "udp" in kind or "datagram" in kind:
        return "udp"
    return "tcp"


def filter_text(tree):
    """A pull filter as expression text."""
    if tree is TRUE:
        return "TRUE"
    if tree is FALSE:
        return "FALSE"
    try:
        return to_text(tree)
    except Exception as e:                 # never let the page fail on one filter
        return f"<unprintable filter: {e}>"


def snapshot(router: "Router", federation: Optional["FederationManager"] = None,
             listeners: Iterable[Any] = (), started: Optional[float] = None,
             domain: Optional[str] = None,
             discovery: Optional["DiscoveryService"] = None) -> dict[str, Any]:
    """The router's status now, as JSON-ready data: every figure read by
    its declared name (``RouterStats``, ``LinkStats``, the router's
    budgets), so that a rename fails the type check instead of reading 0."""
    now = time.time()
    clients = []
    queue_bytes = 0
    stats = router.stats
    bytes_in = stats["bytes_in"]
    bytes_out = stats["bytes_out"]
    sessions: list["ClientSession"] = list(router.sessions)
    for session in sessions:
        output = session.output
        size = output.queued_bytes()
        queue_bytes += size
        bytes_in += output.bytes_in
        bytes_out += output.bytes_out
        clients.append({
            "peer": session.peer, "transport": transport_of(session),
            "state": session.state.name.lower(),
            "subscriptions": len(session.subscriptions),
            "quenches": len(session.quenches),
            "queue_bytes": size, "dropped": session.dropped})
    links = []
    if federation is not None:
        heard_now = federation.clock.seconds()
        federation_links: list["FederationLink"] = list(federation.links)
        for link in federation_links:
            links.append({
                "domain": link.peer_domain, "host": link.peer_host,
                "class": link.fed_class.name if link.fed_class else None,
                "outgoing": link.outgoing, "state": link.state.name.lower(),
                "mesh": link.mesh, "active": federation.active(link),
                "in": link.stats["in"], "out": link.stats["out"],
                "loops": link.stats["loops"], "suppressed": link.stats["suppressed"],
                "duplicates": link.stats["duplicates"],
                "overload": link.stats["overload"], "unsent": link.stats["unsent"],
                "bytes_in": link.output.bytes_in,
                "bytes_out": link.output.bytes_out,
                "last_heard_s": round(heard_now - link.last_heard, 3)
                if link.last_heard is not None else None,
                "filter_nodes": link.remote_filter.nodes,
                "pull_filter": filter_text(link.remote_filter.tree),
                "our_filter": filter_text(link.sent_filter)
                if link.sent_filter is not None else None})
    by_transport: dict[str, int] = {}
    for client in clients:
        if client["state"] == "connected":
            by_transport[client["transport"]] = by_transport.get(client["transport"], 0) + 1
    budget = router.queue_budget
    receive = router.receive_budget
    admission = router.admission
    return {
        "router": {"version": __version__, "domain": domain,
                   "started": started, "uptime_s": round(now - started, 3) if started else None,
                   "listeners": [str(uri) for uri in listeners],
                   "drained_to": router.redirect_uri},
        "totals": {
            "connections_open": sum(by_transport.values()),
            "connections_by_transport": by_transport,
            "connections_total": stats["connections"],
            "subscriptions": len(router.subscriptions),
            "quenches": len(router.quench),
            "notifications_received": stats["notifications"],
            "unotify_received": stats["unotify"],
            "notifications_rejected": stats["rejected_notifications"],
            # Deliveries made (NotifyDeliver, and quench notifications),
            # and of those, the ones dropped or never written: the written
            # ones are the difference.
            "deliveries": stats["deliveries"] + router.quench.sent,
            "dropped_deliveries": stats["dropped_deliveries"],
            "slow_client_disconnections": stats["slow_client_disconnections"],
            "pattern_work_refusals": stats["pattern_work_refusals"],
            "evaluation_refusals": stats["evaluation_refusals"],
            "queue_evictions": budget.evictions,
            "send_queue_bytes": budget.total or queue_bytes,
            # Unfinished packets (max-receive-memory): bytes held now, and
            # connections reset because the budget ran out.
            "receive_buffered_bytes": receive.total if receive is not None else 0,
            "receive_budget_closes": receive.closes if receive is not None else 0,
            "nacks": {str(code): n for code, n in sorted(router.nacks.items())},
            "bytes_in": bytes_in, "bytes_out": bytes_out,
            "discovery_packets_sent": discovery.sent if discovery is not None else 0,
            "trace_records": federation.trace.records if federation is not None else 0,
            # SubRplys held until the peers answered a covering pull filter,
            # and those sent after Federation.Filter.Wait without it.
            "federation_replies_waited":
                federation.wait_stats["waited"] if federation is not None else 0,
            "federation_replies_timed_out":
                federation.wait_stats["timed_out"] if federation is not None else 0,
            # Notifications lost on federation links by cause, the links
            # gone down included (the per-link figures go with the link).
            "federation_losses": dict(federation.losses()) if federation is not None else {},
            # Accepted sockets by pool (client, federation, status): open,
            # cap, idle, refused when accepted, idle ones closed (admission).
            "sockets": admission.budget.stats() if admission is not None else {},
            # UDP datagrams read by every udp,none,xdr listener, by outcome.
            "udp_datagrams": _udp_totals(router.udp_counters),
        },
        "clients": clients,
        "links": links,
        "refusals": [{"time": t, "peer": peer, "code": code,
                      "name": ERROR_NAMES.get(code, str(code)), "message": message}
                     for t, peer, code, message in list(router.refusals)],
    }


def _udp_totals(listeners: Iterable["UdpCounters"]) -> dict[str, int]:
    """Every UDP listener's datagram counters summed (docs/protocols.md)."""
    listeners = list(listeners)
    return {"accepted": sum(c["accepted"] for c in listeners),
            "incompatible": sum(c["incompatible"] for c in listeners),
            "rejected": sum(c["rejected"] for c in listeners),
            "oversize": sum(c["oversize"] for c in listeners),
            "malformed": sum(c["malformed"] for c in listeners),
            "unexpected": sum(c["unexpected"] for c in listeners)}
