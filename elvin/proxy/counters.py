"""What the proxy has done since it started, and how it is shown: its
counters (plain attributes, bumped where the work is done), a snapshot of
them with the gauges read at that moment (``snapshot``), Prometheus
metrics built from the snapshot when scraped (``ProxyCollector``: nothing
is paid per notification for metrics) and the operations listener's
resource tree (``status_root``: ``/status.json`` and ``/metrics``, with
the router's token check). docs/proxy.md, "Operations", lists them.
"""

import json
import time
from typing import Any, Dict, Iterable, Iterator, Optional

from elvin import __version__

__all__ = ["ProxyCounters", "GateCounters", "snapshot", "ProxyCollector", "status_root",
           "NO_RELOAD"]

#: What the proxy answers to SIGHUP (logged) and to ``POST /reload``.
NO_RELOAD = ("the proxy does not reload its configuration file; it keeps running as "
             "it started: restart it to apply a changed file")


class ProxyCounters:
    """The proxy core's counters (all start at 0)."""

    __slots__ = ("stored", "replayed", "delivered", "forwarded", "acknowledged",
                 "upstream_dropwarns", "not_stored", "backlog_dropped",
                 "client_queue_dropped", "store_failed", "sessions_expired",
                 "upstream_gaps", "restart_gaps", "upstream_timeouts")

    def __init__(self) -> None:
        #: notifications stored (one copy, however many sessions keep it),
        #: counted as their transaction commits: one rolled back (a full
        #: disk) counts in ``not_stored`` instead, never in both
        self.stored = 0
        #: stored notifications written to joining clients
        self.replayed = 0
        #: live deliveries written to connected clients
        self.delivered = 0
        #: clients' notifications sent upstream
        self.forwarded = 0
        #: stored notifications acknowledged, once per client acknowledging
        #: each (as ``replayed`` counts once per client written to)
        self.acknowledged = 0
        #: DropWarns from the upstream router (gaps: it says no count)
        self.upstream_dropwarns = 0
        #: notifications not stored because the database could not be written
        self.not_stored = 0
        #: clients' notifications dropped while upstream was down (max-backlog)
        self.backlog_dropped = 0
        #: deliveries dropped from non-acknowledging clients' send queues
        #: (of connections that have ended; open ones are added at snapshot)
        self.client_queue_dropped = 0
        #: writes the database refused (disk full, ...)
        self.store_failed = 0
        #: sessions deleted after session-expiry without a client
        self.sessions_expired = 0
        #: gaps (not notifications: how many were missed nobody knows), one
        #: per session with subscriptions for each upstream outage, and for
        #: each start of the proxy on a store holding it
        self.upstream_gaps = 0
        self.restart_gaps = 0
        #: requests to the upstream router given up after upstream-timeout
        self.upstream_timeouts = 0


class GateCounters:
    """The password gate's counters."""

    __slots__ = ("checks", "failures", "throttled", "busy")

    def __init__(self) -> None:
        #: password checks made (scrypt)
        self.checks = 0
        #: joins refused for a password (wrong, or refused unchecked)
        self.failures = 0
        #: checks refused unmade (too many failures from the address or for the session)
        self.throttled = 0
        #: checks refused because too many were waiting (Nack 2006)
        self.busy = 0


def snapshot(core: Any, listeners: Iterable[Any] = (), upstream_uri: Optional[str] = None,
             started: Optional[float] = None) -> Dict[str, Any]:
    """The counters and gauges of a ProxyCore, as plain data; its
    ``proxy`` section says what it is (what ``elvin-stat`` tells a proxy's
    status from a router's by), where it listens and its upstream."""
    counters, gate, store = core.counters, core.gate.counters, core.store
    clients = [c for c in core.sessions if c.state == c.CONNECTED]
    upstream = core.upstream
    return {
        "proxy": {"version": __version__, "started": started,
                  "uptime_s": round(time.time() - started, 3) if started else None,
                  "listeners": [str(uri) for uri in listeners],
                  "upstream": upstream_uri},
        "stored": counters.stored,
        "replayed": counters.replayed,
        "delivered": counters.delivered,
        "forwarded": counters.forwarded,
        "acknowledged": counters.acknowledged,
        "dropped": {
            "session_cap": store.dropped_session_cap,
            "total_cap": store.dropped_total_cap,
            "not_stored": counters.not_stored,
            "client_queue": counters.client_queue_dropped
            + sum(c.dropped for c in core.sessions),
            "backlog": counters.backlog_dropped,
            "upstream_gap": counters.upstream_gaps,
            "restart": counters.restart_gaps,
        },
        "upstream_dropwarns": counters.upstream_dropwarns,
        "upstream_timeouts": counters.upstream_timeouts,
        "store_failed": counters.store_failed,
        "sessions_expired": counters.sessions_expired,
        "password_checks": {"checked": gate.checks, "failed": gate.failures,
                            "throttled": gate.throttled, "busy": gate.busy},
        "sessions": len(core.named),
        "clients": len(clients),
        "stored_bytes": store.total_bytes(),
        "upstream_up": int(bool(getattr(upstream, "is_up", False))),
        "upstream_connects": getattr(upstream, "connects", 0),
        "upstream_early_retries": getattr(upstream, "early_retries", 0),
    }


class ProxyCollector:
    """Prometheus metrics from ``source()``, a function returning a snapshot."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def describe(self) -> list:
        return []     # built at scrape time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        status = self.source()
        for name, key, text in (
                ("elvin_proxy_stored", "stored",
                 "Notifications stored (one copy however many sessions keep it), "
                 "counted once committed: one the database could not take counts "
                 "as dropped (not_stored) instead."),
                ("elvin_proxy_replayed", "replayed",
                 "Stored notifications written to joining clients."),
                ("elvin_proxy_delivered", "delivered",
                 "Live deliveries written to connected clients."),
                ("elvin_proxy_forwarded", "forwarded", "Clients' notifications sent upstream."),
                ("elvin_proxy_acknowledged", "acknowledged",
                 "Stored notifications acknowledged by clients (Proxy.Ack), "
                 "once per client acknowledging each."),
                ("elvin_proxy_upstream_dropwarns", "upstream_dropwarns",
                 "DropWarns from the upstream router: gaps of unknown size, each "
                 "counted once in every session's drops."),
                ("elvin_proxy_upstream_timeouts", "upstream_timeouts",
                 "Requests to the upstream router given up unanswered after "
                 "upstream-timeout."),
                ("elvin_proxy_store_failures", "store_failed",
                 "Writes the database refused (disk full)."),
                ("elvin_proxy_sessions_expired", "sessions_expired",
                 "Sessions deleted after session-expiry without a client."),
                ("elvin_proxy_upstream_connects", "upstream_connects",
                 "Connections made to the upstream router."),
                ("elvin_proxy_upstream_early_retries", "upstream_early_retries",
                 "Connection attempts made at once because a probe of the upstream "
                 "router's port, or router discovery, said it was back.")):
            yield CounterMetricFamily(name, text, value=status[key])
        for name, text, label, values in (
                ("elvin_proxy_dropped", "Notifications dropped, by cause: session_cap "
                 "(max-stored, max-stored-bytes), total_cap (max-total-stored-bytes), "
                 "not_stored (the database could not be written), client_queue (a "
                 "non-acknowledging client's send queue), backlog (max-backlog while "
                 "upstream is down); and gaps of unknown size, one per session with "
                 "subscriptions: upstream_gap (an upstream outage), restart (the proxy "
                 "not running).", "cause", status["dropped"]),
                ("elvin_proxy_password_checks", "Password checks, by outcome: checked "
                 "(scrypt run), failed (a join refused for its password, throttled ones "
                 "included), throttled (refused unchecked after failures), busy "
                 "(refused: too many waiting).", "outcome", status["password_checks"])):
            family = CounterMetricFamily(name, text, labels=[label])
            for value, count in values.items():
                family.add_metric([value], count)
            yield family
        for name, key, text in (
                ("elvin_proxy_sessions", "sessions", "Sessions kept."),
                ("elvin_proxy_clients", "clients", "Clients connected now."),
                ("elvin_proxy_stored_bytes", "stored_bytes",
                 "Bytes of the notifications stored."),
                ("elvin_proxy_upstream_up", "upstream_up",
                 "1 while the upstream router is connected.")):
            yield GaugeMetricFamily(name, text, value=status[key])


def registry_for(source: Any) -> Any:
    """A registry holding only this proxy's collector."""
    from prometheus_client.core import CollectorRegistry
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProxyCollector(source))
    return registry


def status_root(core: Any, token: Any = None, listeners: Iterable[Any] = (),
                upstream_uri: Optional[str] = None, started: Optional[float] = None) -> Any:
    """``/status.json`` and ``/metrics`` for one proxy (``token``: needed
    as for the router's status listener; ``listeners``, ``upstream_uri``
    and ``started``: for the snapshot's ``proxy`` section), and ``POST
    /reload``, answered that the proxy does not reload (501, with the
    router's JSON form, so ``elvin-stat --reload`` says so)."""
    from prometheus_client.twisted import MetricsResource
    from twisted.web import resource
    from twisted.web.resource import IResource

    from elvin.ops.web import _Guarded, _Json
    started = time.time() if started is None else started
    listeners = list(listeners)

    def source() -> Dict[str, Any]:
        return snapshot(core, listeners, upstream_uri, started)

    class NoReload(resource.Resource):
        isLeaf = True

        def render_POST(self, request: Any) -> bytes:
            request.setResponseCode(501)
            request.setHeader(b"content-type", b"application/json")
            return json.dumps({"applied": False, "message": NO_RELOAD}).encode()
    root = resource.Resource()
    # IResource(...) checks (at run time: the type checker does not read
    # zope's declarations) that each child provides the interface.
    root.putChild(b"status.json", IResource(_Json(source)))
    root.putChild(b"metrics", IResource(MetricsResource(registry=registry_for(source))))
    root.putChild(b"reload", IResource(NoReload()))
    return _Guarded(root, token)
