"""The router's figures as Prometheus metrics (``prometheus_client``).

A custom collector builds every metric from ``status.snapshot`` when
Prometheus scrapes, so routing a notification costs nothing for metrics:
the router only keeps the counters it keeps anyway. Names follow
Prometheus's conventions (``elvin_`` prefix, base units, ``_total`` for
counters); labels are bounded (transport, Nack code, configured peers).
The list is in docs/operations.md.
"""

from prometheus_client.core import (CollectorRegistry, CounterMetricFamily,
                                    GaugeMetricFamily, InfoMetricFamily)

from elvin.federation.identity import MAX_DOMAIN_BYTES, shown
from elvin.federation.link import LOSS_CAUSES

__all__ = ["RouterCollector", "registry_for"]


class RouterCollector:
    """Collects from ``source()``, a function returning a status snapshot."""

    def __init__(self, source):
        self.source = source

    def describe(self):
        return []     # built at scrape time: no fixed description to check

    def collect(self):
        status = self.source()
        totals = status["totals"]
        router = status["router"]
        info = InfoMetricFamily("elvin_router", "The router's version and domain.")
        info.add_metric([], {"version": router["version"], "domain": router["domain"] or ""})
        yield info
        if router["uptime_s"] is not None:
            yield GaugeMetricFamily("elvin_uptime_seconds", "Seconds since the router started.",
                                    value=router["uptime_s"])
        connections = GaugeMetricFamily("elvin_connections",
                                        "Client sessions open now, by transport.",
                                        labels=["transport"])
        for transport in ("tcp", "tls", "http", "udp"):
            connections.add_metric([transport],
                                   totals["connections_by_transport"].get(transport, 0))
        yield connections
        for name, key, text in (
                ("elvin_connections_opened", "connections_total", "Client sessions opened."),
                ("elvin_notifications_received", "notifications_received",
                 "Notifications routed (from clients, UNotify and federation)."),
                ("elvin_unotify_received", "unotify_received",
                 "Session-less notifications (UNotify) received."),
                ("elvin_notifications_rejected", "notifications_rejected",
                 "Notifications refused by the router's limits."),
                ("elvin_deliveries", "deliveries",
                 "Deliveries made to clients (a NotifyDeliver per client a notification "
                 "reached, and quench notifications), before any was dropped: written = "
                 "deliveries - dropped deliveries."),
                ("elvin_dropped_deliveries", "dropped_deliveries",
                 "Deliveries dropped from slow clients' send queues (DropWarn), or "
                 "still queued when a client's connection was reset or lost."),
                ("elvin_slow_client_disconnections", "slow_client_disconnections",
                 "Clients disconnected for not reading what they were sent (send queue "
                 "full under drop policy none, replies unread, max-queue-memory)."),
                ("elvin_pattern_work_refusals", "pattern_work_refusals",
                 "Notifications some of a client's string tests (regex, wildcard, "
                 "contains) were not run for, past max-pattern-work (the client got a "
                 "DropWarn), or a federation link's (passed on unfiltered)."),
                ("elvin_evaluation_refusals", "evaluation_refusals",
                 "Notifications for which some of a client's subscriptions were not "
                 "evaluated, past max-evaluation-bytes or max-heavy-evaluation-bytes (the "
                 "client got a DropWarn)."),
                ("elvin_queue_evictions", "queue_evictions",
                 "Clients disconnected because the router-wide queue memory ran out."),
                ("elvin_receive_budget_closes", "receive_budget_closes",
                 "Connections reset because the bytes held in unfinished packets "
                 "passed max-receive-memory."),
                ("elvin_turns_sliced", "turns_sliced",
                 "Reading turns cut because one connection's packets took more than "
                 "max-turn-time: the rest of its input was handled in later turns."),
                ("elvin_received_bytes", "bytes_in", "Bytes read from clients."),
                ("elvin_sent_bytes", "bytes_out", "Bytes written to clients."),
                ("elvin_discovery_packets_sent", "discovery_packets_sent",
                 "Router discovery packets sent (adverts and withdrawals)."),
                ("elvin_trace_records", "trace_records",
                 "Federation trace records written whole to a file (docs/traces.md)."),
                ("elvin_federation_replies_waited", "federation_replies_waited",
                 "SubRplys held until the linked peers answered a pull filter covering "
                 "the subscription."),
                ("elvin_federation_replies_timed_out", "federation_replies_timed_out",
                 "SubRplys sent after Federation.Filter.Wait without the peers' answer."),
                ("elvin_log_write_errors", "log_write_errors",
                 "Log lines lost because writing them failed (a full disk, a file-size "
                 "limit)."),
                ("elvin_federation_loss_dropwarns", "federation_loss_dropwarns",
                 "DropWarns sent to local subscribers because a federation link may have "
                 "lost notifications for them (it went down without a closing handshake, "
                 "or its peer sent DropWarn).")):
            yield CounterMetricFamily(name, text, value=totals[key])
        yield GaugeMetricFamily("elvin_subscriptions", "Subscriptions registered.",
                                value=totals["subscriptions"])
        yield GaugeMetricFamily("elvin_quenches", "Quenches registered.",
                                value=totals["quenches"])
        yield GaugeMetricFamily("elvin_send_queue_bytes",
                                "Bytes waiting in clients' send queues.",
                                value=totals["send_queue_bytes"])
        yield GaugeMetricFamily("elvin_receive_buffered_bytes",
                                "Bytes held in unfinished packets (max-receive-memory).",
                                value=totals["receive_buffered_bytes"])
        yield from self._sockets(totals.get("sockets", {}))
        datagrams = CounterMetricFamily(
            "elvin_udp_datagrams", "UDP datagrams read, by outcome: accepted (UNotify "
            "routed), incompatible (UNotify of another major version, discarded), "
            "rejected (UNotify ignored: attribute limits, keys), oversize, malformed, "
            "unexpected (a packet other than UNotify).",
            labels=["outcome"])
        for outcome, count in totals.get("udp_datagrams", {}).items():
            datagrams.add_metric([outcome], count)
        yield datagrams
        losses = CounterMetricFamily(
            "elvin_federation_dropped_all", "Notifications not carried over any "
            "federation link, the links gone down included, by cause (as "
            "elvin_federation_dropped).", labels=["cause"])
        for cause, _ in LOSS_CAUSES:
            losses.add_metric([cause], totals.get("federation_losses", {}).get(cause, 0))
        yield losses
        trace_lost = CounterMetricFamily(
            "elvin_trace_records_dropped", "Federation trace records lost, by cause: "
            "overflow (the writer's queue was full), error (a write failed: disk "
            "full, I/O error).", labels=["cause"])
        for cause, count in totals.get("trace_dropped", {}).items():
            trace_lost.add_metric([cause], count)
        yield trace_lost
        nacks = CounterMetricFamily("elvin_nacks", "Nacks sent, by error code.",
                                    labels=["code"])
        for code, count in totals["nacks"].items():
            nacks.add_metric([code], count)
        yield nacks
        yield from self._links(status["links"])

    @staticmethod
    def _sockets(pools):
        """Accepted connections by pool (client, federation, status)."""
        families = (
            (GaugeMetricFamily, "elvin_sockets_open", "open",
             "Accepted connections open now (files held), by pool."),
            (GaugeMetricFamily, "elvin_sockets_cap", "cap",
             "The most accepted connections each pool may hold."),
            (CounterMetricFamily, "elvin_sockets_refused", "refused",
             "Connections closed as they were accepted: their pool was at its cap "
             "with nothing idle to close."),
            (CounterMetricFamily, "elvin_sockets_closed_idle", "closed_idle",
             "Idle connections (no ConnRqst yet; HTTP between requests) closed to "
             "make room, or after crowded-idle-timeout in a crowded pool."),
            (CounterMetricFamily, "elvin_sockets_closed_in_handshake", "closed_in_handshake",
             "TLS connections closed before their handshake ended: beyond "
             "max-tls-handshakes at once, or longer than tls-handshake-timeout."),
            (CounterMetricFamily, "elvin_sockets_closed_in_request", "closed_in_request",
             "HTTP connections closed with a request not complete in time (the first "
             "request's headers within connect-timeout; any request within 60 s, "
             "plus 1 s per KiB of it)."))
        for kind, name, key, text in families:
            family = kind(name, text, labels=["pool"])
            for pool, stats in pools.items():
                family.add_metric([pool], stats.get(key, 0))
            yield family

    @staticmethod
    def _links(links):
        up = GaugeMetricFamily("elvin_federation_link_up",
                               "1 for each federation link that is up; 0 for a "
                               "configured one (Federation.Connect) that is not, and "
                               "for a peer's link to us gone down (the last 256 kept).",
                               labels=["peer"])
        active = GaugeMetricFamily("elvin_federation_link_active",
                                   "1 if the link carries notifications (on the mesh's "
                                   "tree, or a plain link).", labels=["peer"])
        nodes = GaugeMetricFamily("elvin_federation_pull_filter_nodes",
                                  "Nodes in the pull filter the peer sent.", labels=["peer"])
        carried = CounterMetricFamily("elvin_federation_notifications",
                                      "FedNotify over the link, by direction: in: received "
                                      "from the peer; out: queued for the peer (those "
                                      "still queued when the link went down are counted "
                                      "again as dropped, cause unsent: out - unsent were "
                                      "written to the socket).",
                                      labels=["peer", "direction"])
        dropped = CounterMetricFamily("elvin_federation_dropped",
                                      "Notifications not carried, by cause: from the peer "
                                      "(loop, import, duplicate) or to it (overload; unsent: "
                                      "queued when the link was lost).",
                                      labels=["peer", "cause"])
        sizes = CounterMetricFamily("elvin_federation_bytes",
                                    "Bytes over the link, by direction.",
                                    labels=["peer", "direction"])
        heard = GaugeMetricFamily("elvin_federation_last_heard_seconds",
                                  "Seconds since the peer last sent anything "
                                  "(keepalives included).", labels=["peer"])
        for peer, link in _by_peer(links).items():
            up.add_metric([peer], 1 if link["state"] == "up" else 0)
            active.add_metric([peer], 1 if link["active"] else 0)
            nodes.add_metric([peer], link["filter_nodes"])
            carried.add_metric([peer, "in"], link["in"])
            carried.add_metric([peer, "out"], link["out"])
            for cause, key in LOSS_CAUSES:
                dropped.add_metric([peer, cause], link[key])
            sizes.add_metric([peer, "in"], link["bytes_in"])
            sizes.add_metric([peer, "out"], link["bytes_out"])
            if link["last_heard_s"] is not None:
                heard.add_metric([peer], link["last_heard_s"])
        yield from (up, active, nodes, carried, dropped, sizes, heard)


#: The figures of status.json's link rows that are counters.
_SUMMED = ("in", "out", "bytes_in", "bytes_out", *(key for _, key in LOSS_CAUSES))


def _by_peer(links):
    """The link rows by their ``peer`` label: the peer's domain, or for a
    configured link whose peer never came up, its URI. Rows with the same
    label (a configured link redialling while its peer's own link to us
    is up) make one series each: up and active if any is, counters
    summed, the filter of the one up, the latest heard."""
    peers = {}
    for link in links:
        # Domains are checked when a link comes up; a label is bounded anyway.
        peer = shown(link["domain"] or link.get("uri") or link["host"] or "?",
                     MAX_DOMAIN_BYTES)
        seen = peers.get(peer)
        if seen is None:
            peers[peer] = dict(link)
            continue
        for key in _SUMMED:
            seen[key] += link[key]
        if link["state"] == "up" and seen["state"] != "up":
            seen["state"], seen["filter_nodes"] = "up", link["filter_nodes"]
        seen["active"] = seen["active"] or link["active"]
        heard = [s for s in (seen["last_heard_s"], link["last_heard_s"]) if s is not None]
        seen["last_heard_s"] = min(heard) if heard else None
    return peers


def registry_for(source):
    """A registry holding only the router's collector (not the process-wide
    default one, so tests and several routers in a process stay apart)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RouterCollector(source))
    return registry
