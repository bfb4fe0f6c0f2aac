"""A router's status as plain data: what the status page shows, what
``elvin-stat`` prints and what the metrics are made of.

``snapshot`` only reads what the router, its sessions and its federation
already keep; nothing on the routing path counts anything for it.
"""

import time

from elvin import __version__
from elvin.errors import ERROR_NAMES
from elvin.federation import filters as F
from elvin.subscription.printer import to_text

__all__ = ["snapshot", "transport_of", "filter_text"]


def transport_of(session):
    """Which transport a client session came by: tcp, tls, http or udp."""
    output = session.output
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
    if tree is F.TRUE:
        return "TRUE"
    if tree is F.FALSE:
        return "FALSE"
    try:
        return to_text(tree)
    except Exception as e:                 # never let the page fail on one filter
        return f"<unprintable filter: {e}>"


def snapshot(router, federation=None, listeners=(), started=None, domain=None,
             discovery=None):
    """The router's status now, as JSON-ready data."""
    now = time.time()
    clients = []
    queue_bytes = 0
    dropped_now = 0
    bytes_in = router.stats.get("bytes_in", 0)
    bytes_out = router.stats.get("bytes_out", 0)
    for session in list(router.sessions):
        queue = getattr(session.output, "queue", None)
        size = getattr(queue, "bytes", None)
        if size is None:
            size = getattr(queue, "size", 0) if queue is not None else 0
        size = size if isinstance(size, int) else 0
        queue_bytes += size
        dropped_now += session.dropped
        bytes_in += getattr(session.output, "bytes_in", 0)
        bytes_out += getattr(session.output, "bytes_out", 0)
        clients.append({
            "peer": session.peer, "transport": transport_of(session),
            "state": session.state.name.lower(),
            "subscriptions": len(session.subscriptions),
            "quenches": len(getattr(session, "quenches", ())),
            "queue_bytes": size, "dropped": session.dropped})
    links = []
    if federation is not None:
        for link in list(federation.links):
            links.append({
                "domain": link.peer_domain, "host": link.peer_host,
                "class": link.fed_class.name if link.fed_class else None,
                "outgoing": link.outgoing, "state": link.state.name.lower(),
                "mesh": link.mesh, "active": federation.active(link),
                "in": link.stats["in"], "out": link.stats["out"],
                "loops": link.stats["loops"], "suppressed": link.stats["suppressed"],
                "duplicates": link.stats.get("duplicates", 0),
                "overload": link.stats.get("overload", 0),
                "bytes_in": getattr(link.output, "bytes_in", 0),
                "bytes_out": getattr(link.output, "bytes_out", 0),
                "last_heard_s": round(now - link.last_heard, 3)
                if getattr(link, "last_heard", None) else None,
                "filter_nodes": link.remote_filter.nodes,
                "pull_filter": filter_text(link.remote_filter.tree),
                "our_filter": filter_text(link.sent_filter)
                if link.sent_filter is not None else None})
    stats = router.stats
    by_transport = {}
    for client in clients:
        if client["state"] == "connected":
            by_transport[client["transport"]] = by_transport.get(client["transport"], 0) + 1
    budget = getattr(router, "queue_budget", None)
    receive = getattr(router, "receive_budget", None)
    admission = getattr(router, "admission", None)
    return {
        "router": {"version": __version__, "domain": domain,
                   "started": started, "uptime_s": round(now - started, 3) if started else None,
                   "listeners": [str(uri) for uri in listeners],
                   "drained_to": getattr(router, "redirect_uri", None)},
        "totals": {
            "connections_open": sum(by_transport.values()),
            "connections_by_transport": by_transport,
            "connections_total": stats.get("connections", 0),
            "subscriptions": len(router.subscriptions),
            "quenches": len(router.quench) if hasattr(router, "quench") else 0,
            "notifications_received": stats.get("notifications", 0),
            "unotify_received": stats.get("unotify", 0),
            "notifications_rejected": stats.get("rejected_notifications", 0),
            "deliveries": stats.get("deliveries", 0),
            "dropped_deliveries": stats.get("dropped_deliveries", 0) + dropped_now,
            "queue_evictions": getattr(budget, "evictions", 0),
            "send_queue_bytes": getattr(budget, "total", queue_bytes) or queue_bytes,
            # Unfinished packets (max-receive-memory): bytes held now, and
            # connections reset because the budget ran out.
            "receive_buffered_bytes": getattr(receive, "total", 0),
            "receive_budget_closes": getattr(receive, "closes", 0),
            "nacks": {str(code): n for code, n in sorted(router.nacks.items())},
            "bytes_in": bytes_in, "bytes_out": bytes_out,
            "discovery_packets_sent": getattr(discovery, "sent", 0),
            "trace_records": getattr(getattr(federation, "trace", None), "records", 0),
            # Accepted sockets by pool (client, federation, status): open,
            # cap, idle, refused when accepted, idle ones closed (admission).
            "sockets": admission.budget.stats() if admission is not None else {},
            # UDP datagrams read by every udp,none,xdr listener, by outcome.
            "udp_datagrams": _udp_totals(getattr(router, "udp_counters", ())),
        },
        "clients": clients,
        "links": links,
        "refusals": [{"time": t, "peer": peer, "code": code,
                      "name": ERROR_NAMES.get(code, str(code)), "message": message}
                     for t, peer, code, message in list(router.refusals)],
    }


def _udp_totals(listeners):
    """Every UDP listener's datagram counters summed (docs/protocols.md)."""
    totals = {"accepted": 0, "oversize": 0, "malformed": 0, "unexpected": 0}
    for counters in listeners:
        for key in totals:
            totals[key] += counters.get(key, 0)
    return totals
