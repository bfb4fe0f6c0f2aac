"""Analysis tables defined once, as SQL that both engines run.

Spark (``jobs``) and DuckDB (``smallwindow``) must make the same tables,
column for column. A table whose definition is plain SQL over the run's
small per-minute counts (or the window's records) is written here, once:
``jobs.shared`` runs it with ``spark.sql`` and ``smallwindow.shared`` with
DuckDB. Each ``Query`` names the relations it reads as ``{per_minute}``,
``{considered}``, ``{events}``, ``{publications}`` or ``{flood_model}`` (each engine puts its
own relation there) and the columns to round: the engines round
differently (Spark half up on the decimal form), so each applies Spark's
rounding itself after the query.

The SQL keeps to what both dialects read the same: ``CAST(... AS
BIGINT)`` (DuckDB's sums are 128-bit otherwise), ``count(*) FILTER
(WHERE ...)``, ``array_contains``, ``CASE``, explicit ``GROUP BY``
columns, and ``/`` on a ``DOUBLE`` numerator. Relations (see
``jobs.activity``, ``jobs.considered_counts``):

- ``per_minute``: router, peer, direction, event, minute_us, n, bytes,
  first_us, last_us (every record of the window counted);
- ``considered``: router, peer, event, origin, akey, at_origin, n, bytes
  (out notify records);
- ``events``: the window's records;
- ``flood_model``: origin, first_hop, router, peer, extra_bytes
  (``jobs.flood_model``);
- ``publications``: origin, akey, n, bytes (``publications``, made once
  per run from the events).

A new question that is SQL over these goes here, with its case in
``test_spark_smallwindow`` (both engines, every table compared).
"""

from dataclasses import dataclass, field
from typing import Dict

MINUTE_US = 60 * 10**6
CONSIDERED = ("notify_forwarded", "notify_suppressed_filter", "notify_suppressed_export",
              "notify_dropped_overload")
DROPS = ("notify_dropped_loop", "notify_dropped_duplicate", "notify_dropped_import",
         "notify_dropped_overload")
# (event, column) of the four outcomes of a notification considered for a link
OUTCOMES = (("notify_forwarded", "forwarded"),
            ("notify_suppressed_filter", "suppressed_filter"),
            ("notify_suppressed_export", "suppressed_export"),
            ("notify_dropped_overload", "dropped_overload"))


@dataclass(frozen=True)
class Query:
    """A table's SQL (relations as ``{name}``) and its rounded columns."""
    sql: str
    rounding: Dict[str, int] = field(default_factory=dict)


def sql_list(values):
    """A SQL list of string literals."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def _ratio(num, den):
    return f"CASE WHEN {den} > 0 THEN CAST({num} AS DOUBLE) / {den} END"


def overview():
    """Records per router and event, with first and last timestamps."""
    return Query("""
        SELECT router, event, CAST(sum(n) AS BIGINT) AS records, min(first_us) AS first_us,
               max(last_us) AS last_us
        FROM {per_minute} GROUP BY router, event""")


def filter_effect():
    """Per out link: considered, and each outcome's count, bytes and share."""
    aggs = ["CAST(sum(n) AS BIGINT) AS considered",
            "CAST(sum(bytes) AS BIGINT) AS considered_bytes"]
    for event, label in OUTCOMES:
        aggs += [f"CAST(sum(CASE WHEN event = '{event}' THEN n ELSE 0 END) AS BIGINT) "
                 f"AS {label}",
                 f"CAST(sum(CASE WHEN event = '{event}' THEN bytes ELSE 0 END) AS BIGINT) "
                 f"AS {label}_bytes"]
    pcts = [f"{_ratio(f'{label} * 100', 'considered')} AS {label}_pct"
            for _, label in OUTCOMES]
    return Query(f"""
        SELECT *, {", ".join(pcts)} FROM (
            SELECT router, peer, {", ".join(aggs)} FROM {{per_minute}}
            WHERE direction = 'out' AND event IN ({sql_list(CONSIDERED)})
            GROUP BY router, peer) effect""",
                 {f"{label}_pct": 2 for _, label in OUTCOMES})


def publications():
    """Notifications published at each traced router, counted once each at
    their origin, per origin and attribute set: origin, akey, n, bytes.

    A notification published by a local client gets one out record per
    candidate link at its origin (routing = [origin]), written one after
    another (docs/traces.md). So the origin's out records, in time order,
    fall into runs of one digest, and a run holds as many notifications as
    its most frequent link has records in it (identical contents published
    in a row share a run). Counting per link instead undercounts wherever
    the links a notification is considered for change: in a mesh, whose
    tree changes, or with a link down part of the time. ``bytes``: the
    notifications' size as they left the origin (each run's link with the
    most bytes)."""
    return Query(f"""
        WITH at_origin AS (
            SELECT router AS origin, akey, dkey, peer, ts_us, size,
                   CASE WHEN dkey = lag(dkey) OVER (PARTITION BY router
                            ORDER BY ts_us, dkey, peer) THEN 0 ELSE 1 END AS starts
            FROM {{events}}
            WHERE direction = 'out' AND event IN ({sql_list(CONSIDERED)})
                AND hops = 1 AND router = origin),
        runs AS (
            SELECT origin, akey, dkey, peer, size,
                   sum(starts) OVER (PARTITION BY origin ORDER BY ts_us, dkey, peer
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS run
            FROM at_origin),
        per_link AS (
            SELECT origin, akey, run, peer, count(*) AS n, sum(size) AS bytes
            FROM runs GROUP BY origin, akey, run, peer),
        per_run AS (
            SELECT origin, akey, run, max(n) AS n, max(bytes) AS bytes
            FROM per_link GROUP BY origin, akey, run)
        SELECT origin, akey, CAST(sum(n) AS BIGINT) AS n, CAST(sum(bytes) AS BIGINT) AS bytes
        FROM per_run GROUP BY origin, akey""")


def flood(traced):
    """Per out link of the flood model: what a flood without filters sends
    (every notification published at the ``traced`` routers, counted once
    at its origin by ``publications``, crosses every link of its origin's
    tree) against what was forwarded, and the saving."""
    traced_cond = f"origin IN ({sql_list(traced)})" if traced else "false"
    return Query(f"""
        WITH at_origin AS (
            SELECT origin, CAST(sum(n) AS BIGINT) AS n, CAST(sum(bytes) AS BIGINT) AS bytes
            FROM {{publications}} GROUP BY origin),
        flood AS (
            SELECT m.router, m.peer, CAST(sum(a.n) AS BIGINT) AS flood_notifications,
                   CAST(sum(a.bytes + a.n * m.extra_bytes) AS BIGINT) AS flood_bytes
            FROM at_origin a JOIN {{flood_model}} m ON a.origin = m.origin
            GROUP BY m.router, m.peer),
        actual AS (
            SELECT router, peer, CAST(sum(n) AS BIGINT) AS forwarded,
                   CAST(sum(bytes) AS BIGINT) AS forwarded_bytes
            FROM {{considered}} WHERE event = 'notify_forwarded' AND {traced_cond}
            GROUP BY router, peer),
        joined AS (
            SELECT coalesce(f.router, a.router) AS router, coalesce(f.peer, a.peer) AS peer,
                   CAST(coalesce(f.flood_notifications, 0) AS BIGINT) AS flood_notifications,
                   CAST(coalesce(f.flood_bytes, 0) AS BIGINT) AS flood_bytes,
                   CAST(coalesce(a.forwarded, 0) AS BIGINT) AS forwarded,
                   CAST(coalesce(a.forwarded_bytes, 0) AS BIGINT) AS forwarded_bytes
            FROM flood f FULL OUTER JOIN actual a ON f.router = a.router AND f.peer = a.peer)
        SELECT router, peer, flood_notifications, flood_bytes, forwarded, forwarded_bytes,
               flood_notifications - forwarded AS saved_notifications,
               flood_bytes - forwarded_bytes AS saved_bytes,
               {_ratio('(flood_bytes - forwarded_bytes) * 100', 'flood_bytes')} AS saved_pct
        FROM joined""", {"saved_pct": 2})


def filter_health(end_us, min_minutes=10, min_after=100, min_share=5.0):
    """Per out link: did its pull filter keep working, and since when has it not?

    From the per-minute counts: the share the pull filter stopped, the last
    minute it stopped anything, and what was considered after that. A
    filter *stopped working* at that minute when before it stopped at least
    ``min_share`` % of what it saw, and since then, for at least
    ``min_minutes`` minutes and ``min_after`` notifications, it stopped
    nothing (typically a filter generalised to "everything", or a peer that
    subscribed to everything). Columns: router, peer, considered,
    suppressed_filter, suppressed_pct, last_suppressed_us,
    considered_since, minutes_since, stopped_since_us (null: working).
    """
    unit = MINUTE_US
    since = f"(CAST({int(end_us)} - last_suppressed_us - {unit} AS DOUBLE) / {unit})"
    share_before = _ratio("suppressed_filter * 100", "(considered - considered_since)")
    return Query(f"""
        WITH minute AS (
            SELECT router, peer, minute_us, sum(n) AS c,
                   sum(CASE WHEN event = 'notify_suppressed_filter' THEN n ELSE 0 END) AS s
            FROM {{per_minute}}
            WHERE direction = 'out' AND event IN ({sql_list(CONSIDERED)})
            GROUP BY router, peer, minute_us),
        last AS (SELECT router, peer, max(minute_us) AS last_suppressed_us
                 FROM minute WHERE s > 0 GROUP BY router, peer),
        totals AS (SELECT router, peer, CAST(sum(c) AS BIGINT) AS considered,
                          CAST(sum(s) AS BIGINT) AS suppressed_filter
                   FROM minute GROUP BY router, peer),
        after AS (SELECT m.router, m.peer, CAST(sum(m.c) AS BIGINT) AS considered_since
                  FROM minute m JOIN last l ON m.router = l.router AND m.peer = l.peer
                  WHERE m.minute_us > l.last_suppressed_us GROUP BY m.router, m.peer),
        joined AS (
            SELECT t.router, t.peer, t.considered, t.suppressed_filter, l.last_suppressed_us,
                   CAST(coalesce(a.considered_since, 0) AS BIGINT) AS considered_since
            FROM totals t
            LEFT JOIN last l ON l.router = t.router AND l.peer = t.peer
            LEFT JOIN after a ON a.router = t.router AND a.peer = t.peer)
        SELECT router, peer, considered, suppressed_filter,
               {_ratio('suppressed_filter * 100', 'considered')} AS suppressed_pct,
               last_suppressed_us, considered_since, {since} AS minutes_since,
               CASE WHEN considered_since >= {min_after} AND {since} >= {min_minutes}
                         AND {share_before} >= {min_share}
                    THEN last_suppressed_us + {unit} END AS stopped_since_us
        FROM joined""", {"suppressed_pct": 2, "minutes_since": 1})


def drops():
    """Per link, direction and kind of drop: totals, first and last, and
    ``router_listed``: of the loop and duplicate drops, how many records
    carry the receiving router in their routing list (a loop is only that;
    null for the other kinds)."""
    return Query(f"""
        WITH listed AS (
            SELECT router, peer, direction, event,
                   CAST(count(*) FILTER (WHERE array_contains(routing, router)) AS BIGINT)
                       AS router_listed
            FROM {{events}}
            WHERE event IN ('notify_dropped_loop', 'notify_dropped_duplicate')
            GROUP BY router, peer, direction, event),
        totals AS (
            SELECT router, peer, direction, event, CAST(sum(n) AS BIGINT) AS drops,
                   CAST(sum(bytes) AS BIGINT) AS bytes, min(first_us) AS first_us,
                   max(last_us) AS last_us
            FROM {{per_minute}} WHERE event IN ({sql_list(DROPS)})
            GROUP BY router, peer, direction, event)
        SELECT t.router, t.peer, t.direction, t.event, t.drops, t.bytes, t.first_us,
               t.last_us, l.router_listed
        FROM totals t LEFT JOIN listed l
            ON l.router = t.router AND l.peer = t.peer
            AND l.direction = t.direction AND l.event = t.event""")


def unsent():
    """One row per ``link_down`` whose ``unsent`` says notifications were
    still queued on the link (traced ``notify_forwarded``, never written):
    lost with the link. router, peer, direction, ts_us, reason, unsent."""
    return Query("""
        SELECT router, peer, direction, ts_us, reason, CAST(unsent AS BIGINT) AS unsent
        FROM {events} WHERE event = 'link_down' AND unsent > 0""")


def duplicate_deliveries():
    """Notifications a router received (``notify_received``) by more than
    one route: one row per receiver, origin and digest (``dkey``) that
    arrived with two or more routing lists, as in a ring of routers that
    are not in mesh mode (the routing list stops a notification only at a
    router already on it). receipts: all of its receipts there; extra:
    those beyond the most frequent route's; routes: how many; first_us,
    last_us; route_a, route_b: the least and greatest routing list, as
    ``a > b``."""
    # (the routing lists compared as lists first: only the few notifications
    # with two of them have their receipts counted per route, by name)
    return Query("""
        WITH apart AS (
            SELECT router, origin, dkey FROM {events} WHERE event = 'notify_received'
            GROUP BY router, origin, dkey HAVING min(routing) <> max(routing)),
        per_route AS (
            SELECT e.router, e.origin, e.dkey, concat_ws(' > ', e.routing) AS route,
                   count(*) AS n, min(e.ts_us) AS first_us, max(e.ts_us) AS last_us
            FROM {events} e JOIN apart a
                ON e.router = a.router AND e.origin = a.origin AND e.dkey = a.dkey
            WHERE e.event = 'notify_received'
            GROUP BY e.router, e.origin, e.dkey, concat_ws(' > ', e.routing))
        SELECT router, origin, dkey, CAST(sum(n) AS BIGINT) AS receipts,
               CAST(sum(n) - max(n) AS BIGINT) AS extra, CAST(count(*) AS BIGINT) AS routes,
               min(first_us) AS first_us, max(last_us) AS last_us,
               min(route) AS route_a, max(route) AS route_b
        FROM per_route GROUP BY router, origin, dkey HAVING count(*) > 1""")


def duplicate_delivery_totals():
    """``duplicate_deliveries`` (the relation of that name) per receiving
    router: notifications, receipts, extra, first_us, last_us."""
    return Query(f"""
        SELECT router, CAST(count(*) AS BIGINT) AS notifications,
               CAST(sum(receipts) AS BIGINT) AS receipts, CAST(sum(extra) AS BIGINT) AS extra,
               min(first_us) AS first_us, max(last_us) AS last_us
        FROM {{duplicate_deliveries}} GROUP BY router""")


def drop_times(bucket_us):
    """Drops counted per kind, direction and ``bucket_us``: event, direction,
    t_us, drops (in time order)."""
    bucket = int(bucket_us)
    return Query(f"""
        SELECT event, direction, ts_us - ts_us % {bucket} AS t_us,
               CAST(count(*) AS BIGINT) AS drops
        FROM {{events}} WHERE event IN ({sql_list(DROPS)})
        GROUP BY event, direction, ts_us - ts_us % {bucket}
        ORDER BY t_us, event, direction""")
