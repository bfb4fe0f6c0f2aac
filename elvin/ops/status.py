"""A router's status as plain data: what the status page shows, what
``elvin-stat`` prints and what the metrics are made of.

``snapshot`` only reads what the router, its sessions and its federation
already keep; nothing on the routing path counts anything for it.
"""

import collections
import heapq
import time
from typing import TYPE_CHECKING, Any, Iterable, Optional

from elvin import __version__
from elvin.errors import ERROR_NAMES
from elvin.federation.dial import link_counts
from elvin.federation.filters import FALSE, TRUE
from elvin.ops.logerrors import WRITE_ERRORS
from elvin.subscription.printer import to_text

if TYPE_CHECKING:
    from elvin.core.router import ClientSession, Router, UdpCounters
    from elvin.discovery.service import DiscoveryService
    from elvin.federation.dial import DialledPeer
    from elvin.federation.gone import GonePeer
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
             discovery: Optional["DiscoveryService"] = None,
             clients_limit: Optional[int] = None) -> dict[str, Any]:
    """The router's status now, as JSON-ready data: every figure read by
    its declared name (``RouterStats``, ``LinkStats``, the router's
    budgets), so that a rename fails the type check instead of reading 0.

    ``clients`` lists the client sessions with the largest send queues
    first, then those that had most deliveries dropped (then most
    subscriptions, then by address, so that a page's rows keep still);
    ``clients_limit``: at most that many of them, the rest counted in
    ``clients_omitted`` (the totals count every session either way)."""
    now = time.time()
    queue_bytes = 0
    stats = router.stats
    bytes_in = stats["bytes_in"]
    bytes_out = stats["bytes_out"]
    sessions: list["ClientSession"] = list(router.sessions)
    by_transport: dict[str, int] = {}
    ranked = []
    for session in sessions:
        output = session.output
        size = output.queued_bytes()
        queue_bytes += size
        bytes_in += output.bytes_in
        bytes_out += output.bytes_out
        if session.state.name == "CONNECTED":
            transport = transport_of(session)
            by_transport[transport] = by_transport.get(transport, 0) + 1
        ranked.append((-size, -session.dropped, -len(session.subscriptions),
                       str(session.peer), id(session), size, session))
    if clients_limit is None or clients_limit >= len(ranked):
        ranked.sort()
    else:
        ranked = heapq.nsmallest(max(0, clients_limit), ranked)
    clients = [{"peer": session.peer, "transport": transport_of(session),
                "state": session.state.name.lower(),
                "subscriptions": len(session.subscriptions),
                "quenches": len(session.quenches),
                "queue_bytes": size, "dropped": session.dropped}
               for *_, size, session in ranked]
    links = _links(federation) if federation is not None else []
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
            "send_queue_bytes": budget.bytes or queue_bytes,
            # Unfinished packets (max-receive-memory): bytes held now, and
            # connections reset because the budget ran out.
            "receive_buffered_bytes": receive.total if receive is not None else 0,
            "receive_budget_closes": receive.closes if receive is not None else 0,
            # Reading turns cut at max-turn-time (the rest handled later).
            "turns_sliced": router.turn_slice.cuts if router.turn_slice is not None else 0,
            "nacks": {str(code): n for code, n in sorted(router.nacks.items())},
            "bytes_in": bytes_in, "bytes_out": bytes_out,
            "discovery_packets_sent": discovery.sent if discovery is not None else 0,
            # Federation trace records written whole, and those lost: the
            # writer's queue was full (overflow), or writes failed (error).
            "trace_records": federation.trace.written if federation is not None else 0,
            "trace_dropped": {"overflow": federation.trace.dropped_overflow,
                              "error": federation.trace.dropped_error}
            if federation is not None else {"overflow": 0, "error": 0},
            # SubRplys held until the peers answered a covering pull filter,
            # and those sent after Federation.Filter.Wait without it.
            "federation_replies_waited":
                federation.wait_stats["waited"] if federation is not None else 0,
            "federation_replies_timed_out":
                federation.wait_stats["timed_out"] if federation is not None else 0,
            # Notifications lost on federation links by cause, the links
            # gone down included (the per-link figures go with the link).
            "federation_losses": dict(federation.losses()) if federation is not None else {},
            # Log lines an observer failed to write (a full disk, a
            # file-size limit): lost from the log file.
            "log_write_errors": WRITE_ERRORS.count,
            # DropWarns sent to local subscribers for what a link may have
            # lost (it went down without a closing handshake, or its peer
            # sent DropWarn).
            "federation_loss_dropwarns":
                federation.loss_dropwarns if federation is not None else 0,
            # Accepted sockets by pool (client, federation, status): open,
            # cap, idle, refused when accepted, idle ones closed (admission).
            "sockets": admission.budget.stats() if admission is not None else {},
            # UDP datagrams read by every udp,none,xdr listener, by outcome.
            "udp_datagrams": _udp_totals(router.udp_counters),
        },
        "clients": clients,
        "clients_omitted": len(sessions) - len(clients),
        "links": links,
        "refusals": [{"time": t, "peer": peer, "code": code,
                      "name": ERROR_NAMES.get(code, str(code)), "message": message}
                     for t, peer, code, message in list(router.refusals)],
    }


def _links(federation: "FederationManager") -> list[dict[str, Any]]:
    """A row for every configured link (``Federation.Connect``), up or not,
    in the order dialled, then one for every other link up (incoming),
    then one for each peer whose incoming link is down (as many as
    ``federation.incoming`` keeps). Every link's counters run across its
    reconnections."""
    now = federation.clock.seconds()
    up: list["FederationLink"] = list(federation.links)
    dialled: list["DialledPeer"] = list(federation.dialled)
    rows = []
    shown = set()
    for dial in dialled:
        link = dial.link
        if link is not None and link in up:
            rows.append(_link_row(federation, link, now, dial))
            shown.add(link)
        else:
            rows.append(_dial_row(dial, now))
    incoming = federation.incoming
    others = [link for link in up if link not in shown]
    for link in others:
        past = incoming.past(link.peer_domain) if not link.outgoing else None
        rows.append(_link_row(federation, link, now, past=past))
    rows.extend(_gone_row(peer, now) for peer in incoming.down(
        link.peer_domain for link in others if not link.outgoing))
    return rows


def _ago(now: float, then: Optional[float]) -> Optional[float]:
    return round(now - then, 3) if then is not None else None


def _counts(stats: Any, bytes_in: int, bytes_out: int) -> dict[str, int]:
    """A link's counters as status.json names them."""
    return {"in": stats["in"], "out": stats["out"], "loops": stats["loops"],
            "suppressed": stats["suppressed"], "duplicates": stats["duplicates"],
            "overload": stats["overload"], "unsent": stats["unsent"],
            "bytes_in": bytes_in, "bytes_out": bytes_out}


def _dial_facts(dial: Optional["DialledPeer"], now: float) -> dict[str, Any]:
    """What a configured link adds to its row (None for other links)."""
    if dial is None:
        return {"uri": None, "attempts": 0, "last_error": None, "last_error_s": None,
                "next_attempt_s": None}
    due = dial.next_attempt
    return {"uri": dial.uri, "attempts": dial.attempts, "last_error": dial.last_error,
            "last_error_s": _ago(now, dial.last_error_at),
            "next_attempt_s": round(max(0.0, due - now), 3)
            if due is not None and dial.state == "redialling" else None}


def _link_row(federation: "FederationManager", link: "FederationLink", now: float,
              dial: Optional["DialledPeer"] = None,
              past: Optional[collections.Counter] = None) -> dict[str, Any]:
    """A link up; ``past``: what the peer's incoming links gone counted."""
    if dial is not None:
        totals = dial.totals()
    else:
        totals = collections.Counter(past or ())
        totals.update(link_counts(link))
    counts = _counts(totals, totals["bytes_in"], totals["bytes_out"])
    return {
        "domain": link.peer_domain, "host": link.peer_host,
        "class": link.fed_class.name if link.fed_class else None,
        "outgoing": link.outgoing, "state": link.state.name.lower(),
        "mesh": link.mesh, "active": federation.active(link),
        **counts,
        "last_heard_s": _ago(now, link.last_heard),
        "filter_nodes": link.remote_filter.nodes,
        "pull_filter": filter_text(link.remote_filter.tree),
        "our_filter": filter_text(link.sent_filter)
        if link.sent_filter is not None else None,
        **_dial_facts(dial, now)}


def _dial_row(dial: "DialledPeer", now: float) -> dict[str, Any]:
    """A configured link that is not up: dialling, in its handshake
    (connecting) or waiting to dial again (redialling)."""
    totals = dial.totals()
    return {
        "domain": dial.domain, "host": dial.host, "class": dial.class_name,
        "outgoing": True, "state": dial.state, "mesh": None, "active": False,
        **_counts(totals, totals["bytes_in"], totals["bytes_out"]),
        "last_heard_s": _ago(now, dial.heard()),
        "filter_nodes": 0, "pull_filter": None, "our_filter": None,
        **_dial_facts(dial, now)}


def _gone_row(peer: "GonePeer", now: float) -> dict[str, Any]:
    """A peer whose link to us is down (``gone.IncomingPeers``)."""
    counts = peer.counts
    return {
        "domain": peer.domain, "host": peer.host, "class": peer.class_name,
        "outgoing": False, "state": "down", "mesh": None, "active": False,
        **_counts(counts, counts["bytes_in"], counts["bytes_out"]),
        "last_heard_s": _ago(now, peer.last_heard),
        "filter_nodes": 0, "pull_filter": None, "our_filter": None,
        **_dial_facts(None, now),
        "last_error": peer.reason, "last_error_s": _ago(now, peer.down_at)}


def _udp_totals(listeners: Iterable["UdpCounters"]) -> dict[str, int]:
    """Every UDP listener's datagram counters summed (docs/protocols.md)."""
    listeners = list(listeners)
    return {"accepted": sum(c["accepted"] for c in listeners),
            "incompatible": sum(c["incompatible"] for c in listeners),
            "rejected": sum(c["rejected"] for c in listeners),
            "oversize": sum(c["oversize"] for c in listeners),
            "malformed": sum(c["malformed"] for c in listeners),
            "unexpected": sum(c["unexpected"] for c in listeners)}
