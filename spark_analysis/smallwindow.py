"""The analysis stages over a small window of a local table, in DuckDB.

Why: Spark runs the analysis as some hundred small jobs, and each costs
its planning, scheduling and code generation whatever the data. Over an
hour of a federation (about 400,000 records) that is 10-13 s of a warm
watching process, most of it not the data; DuckDB, an embedded columnar
engine reading the same Parquet files in this process, does the same
work in about a second. So a window of up to ``SMALL_WINDOW_RECORDS``
records of a table on a local file system is analysed here (``--engine
auto``, the default); anything bigger, or a table on remote storage,
stays with Spark, which spreads over a cluster.

Every table is the one ``jobs`` makes, column for column and type for
type, computed the same way (the tests run both engines over the same
traces and compare every table). Two differences, written down in
docs/analysis.md: percentiles are exact (``sorted[ceil(p * n) - 1]``;
Spark's ``percentile_approx`` at accuracy 10,000 gives the same for
groups under 10,000 values and may differ by a rank in 10,000 beyond),
and rounding is Spark's (half up on the shortest decimal form), done
in Python on the result rows.
"""

import decimal
import glob
import os

from spark_analysis import jobs, sharedsql
from spark_analysis import traceformat as tf
from spark_analysis.store import _day          # (the table's day partitions)

__all__ = ["SMALL_WINDOW_RECORDS", "MEMORY_LIMIT", "available", "Window", "open_window",
           "newest_us", "count", "spark_round", "links_stage", "filters_stage", "drops_stage",
           "paths_stage", "interest_stage"]

# windows up to this many records are analysed here (auto engine). On the
# 2-core benchmark machine a whole 10M-record run took 0.70 of the time
# with DuckDB's stages as with Spark's (alternated runs, the machine
# loaded): no JVM to start, no queries to compile. Bigger windows go to
# Spark, which spreads over a cluster.
SMALL_WINDOW_RECORDS = 12_000_000
# DuckDB's memory for a window (it spills to disk beyond): keeps the driver under 1 GB
MEMORY_LIMIT = "512MB"
# windows up to this many records are loaded into DuckDB's memory; bigger
# ones are read from the table's Parquet files by each query
LOADED_RECORDS = 3_000_000

# every column of the events table the jobs read
_COLUMNS = ("ts_us", "router", "peer", "event", "direction", "routing", "size", "attrs",
            "filter_nodes", "filter_bytes", "reason", "unsent", "origin", "hops", "dkey",
            "akey")


def available():
    """True when DuckDB can be imported."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


def spark_round(value, digits):
    """``F.round``: half up, on the double's shortest decimal form (2.675 -> 2.68)."""
    if value is None:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return value
    q = decimal.Decimal(1).scaleb(-digits)
    rounded = decimal.Decimal(repr(value)).quantize(q, rounding=decimal.ROUND_HALF_UP)
    return float(rounded) + 0.0         # (no -0.0: Spark's decimal has no sign for zero)


def _sql_list(values):
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def _files(tables_dir, since_us=None, until_us=None):
    """The valid records' Parquet files, their days pruned by name."""
    root = os.path.join(tables_dir, "events", "status=ok")
    lo = _day(since_us) if since_us is not None else None
    hi = _day(until_us) if until_us is not None else None
    out = []
    for path in sorted(glob.glob(os.path.join(glob.escape(root), "day=*", "router=*",
                                              "*.parquet"))):
        day = os.path.basename(os.path.dirname(os.path.dirname(path)))[len("day="):]
        if (lo is None or day >= lo) and (hi is None or day <= hi):
            out.append(path)
    return out


class Window:
    """A DuckDB connection holding one window of the table (``w``) and its
    per-minute counts (``per_minute``): what every stage reads."""

    def __init__(self, con, start, end, records):
        self.con, self.start, self.end, self.records = con, start, end, records

    def arrow(self, sql):
        return self.con.sql(sql).to_arrow_table()

    def rows(self, sql):
        return self.arrow(sql).to_pylist()

    def one(self, sql):
        """The first row of ``sql``, as a tuple."""
        return self.con.sql(sql).fetchall()[0]

    def close(self):
        self.con.close()


def newest_us(tables_dir):
    """The newest valid record's time, reading the newest day's files only."""
    import duckdb
    files = _files(tables_dir)
    if not files:
        return None
    newest = max(os.path.basename(os.path.dirname(os.path.dirname(p))) for p in files)
    files = [p for p in files if f"/{newest}/" in p]
    con = duckdb.connect()
    try:
        return con.sql("SELECT max(ts_us) FROM read_parquet(?, union_by_name=true)",
                       params=[files]).fetchall()[0][0]
    finally:
        con.close()


def count(tables_dir, since_us=None, until_us=None):
    """The number of valid records in [since, until): to choose the engine."""
    import duckdb
    files = _files(tables_dir, since_us, until_us)
    if not files:
        return 0
    con = duckdb.connect()
    try:
        return con.sql(f"SELECT count(*) FROM read_parquet(?, union_by_name=true) "
                       f"WHERE {_between(since_us, until_us)}", params=[files]).fetchall()[0][0]
    finally:
        con.close()


def _between(since_us, until_us):
    cond = ["true"]
    if since_us is not None:
        cond.append(f"ts_us >= {int(since_us)}")
    if until_us is not None:
        cond.append(f"ts_us < {int(until_us)}")
    return " AND ".join(cond)


def open_window(tables_dir, since_us=None, until_us=None, threads=None, temp_dir=None):
    """Load [since, until) of the table into a new in-memory DuckDB: a Window
    (records 0 and start/end None when it holds none)."""
    import duckdb
    config = {"memory_limit": MEMORY_LIMIT}
    if threads:
        config["threads"] = threads
    if temp_dir:
        config["temp_directory"] = temp_dir
    con = duckdb.connect(config=config)
    files = _files(tables_dir, since_us, until_us)
    if not files:
        return Window(con, None, None, 0)
    # the partition columns (router from the path) and the file's own; a file
    # from an older version lacking a column reads it as null
    have = set(con.sql("SELECT * FROM read_parquet(?, hive_partitioning=true, "
                       "hive_types_autocast=false, union_by_name=true) LIMIT 0",
                       params=[files]).columns)
    cols = ", ".join(c if c in have else f"NULL AS {c}" for c in _COLUMNS)
    listed = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
    con.execute(f"CREATE VIEW window_files AS SELECT {cols} FROM read_parquet({listed}, "
                f"hive_partitioning=true, hive_types_autocast=false, union_by_name=true) "
                f"WHERE {_between(since_us, until_us)}")
    lo, hi, n = con.sql("SELECT min(ts_us), max(ts_us), count(*) FROM window_files"
                        ).fetchall()[0]
    # A window that fits in memory is loaded once; a bigger one is read from
    # its Parquet files by each query (only the columns it needs): loading
    # 10M records spilled most of them through the memory limit (58 s against
    # 5 s to open, and the stages no faster)
    kind = "TEMP TABLE" if n <= LOADED_RECORDS else "VIEW"
    con.execute(f"CREATE {kind} w AS SELECT * FROM window_files")
    start = since_us if since_us is not None else lo
    end = until_us if until_us is not None else hi
    if start is None or end is None or not n:
        return Window(con, None, None, n)
    end = max(end, start + 1)
    unit = jobs.MINUTE_US
    # jobs.activity: every record counted per link, event and minute (the
    # minute as Java's % makes it: DuckDB's % also keeps the dividend's sign)
    con.execute(f"""CREATE TEMP TABLE per_minute AS
        SELECT router, peer, direction, event, ts_us - ts_us % {unit} AS minute_us,
               count(*)::BIGINT AS n, sum(size)::BIGINT AS bytes,
               min(ts_us) AS first_us, max(ts_us) AS last_us
        FROM w GROUP BY ALL""")
    control = _sql_list(tf.LINK_EVENTS + tf.SUBREPLACE_EVENTS)
    con.execute(f"""CREATE TEMP TABLE control AS
        SELECT router, peer, direction, event, ts_us, filter_nodes, filter_bytes, reason
        FROM w WHERE event IN ({control})""")
    considered = _sql_list(jobs.CONSIDERED)
    con.execute(f"""CREATE TEMP TABLE considered AS
        SELECT router, peer, event, origin, akey,
               (hops = 1 AND router = origin) AS at_origin,
               count(*)::BIGINT AS n, sum(size)::BIGINT AS bytes
        FROM w WHERE direction = 'out' AND event IN ({considered}) GROUP BY ALL""")
    con.execute("CREATE TEMP TABLE publications AS "
                + sharedsql.publications().sql.format(events="w"))
    return Window(con, start, end, n)


# ---------------------------------------------------------------------------
# the stages: each returns {table: Arrow table}, plus rounding to apply

_WIRE = (f"(event = 'notify_forwarded' OR (direction = 'in' AND event IN "
         f"({_sql_list(jobs.IN_WIRE)})))")


def _rounded(table, digits):
    """``table`` (Arrow) with the columns of ``digits`` ({column: n}) rounded as Spark rounds."""
    import pyarrow as pa
    for name, n in digits.items():
        i = table.column_names.index(name)
        values = [spark_round(v, n) for v in table.column(i).to_pylist()]
        table = table.set_column(i, name, pa.array(values, pa.float64()))
    return table


def _timestamps(table, *names):
    """Microsecond timestamps as Spark writes them (UTC)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    for name in names:
        i = table.column_names.index(name)
        table = table.set_column(i, name, pc.cast(table.column(i), pa.timestamp("us", "UTC")))
    return table


def shared(w, query, **relations):
    """A ``sharedsql.Query`` run by DuckDB over the window's relations
    (``events`` is the window's table ``w``), rounded as Spark rounds."""
    names = {"per_minute": "per_minute", "considered": "considered", "events": "w",
             "publications": "publications"}
    names.update(relations)
    return _rounded(w.arrow(query.sql.format(**names)), query.rounding)


def overview(w):
    return {"overview": shared(w, sharedsql.overview())}


# a link's ups and downs, in the order both link tables walk them
_LINK_EVENTS = ("SELECT router, peer, ts_us, event, reason FROM control "
                "WHERE event IN ('link_up', 'link_down') AND peer IS NOT NULL")


def link_uptime(w):
    s, e = w.start, w.end
    length = e - s
    table = w.arrow(f"""
        WITH le AS ({_LINK_EVENTS}),
        marked AS (
            SELECT *, lead(ts_us) OVER o AS next_ts, lag(event) OVER o AS prev_event
            FROM le WINDOW o AS (PARTITION BY router, peer ORDER BY ts_us, event)),
        last AS (SELECT router, max(last_us) AS last_us FROM per_minute GROUP BY router),
        stopped AS (
            SELECT m.*, l.last_us,
                   (m.next_ts IS NULL AND l.last_us
                        < (SELECT max(last_us) FROM last) - {jobs.TRACE_END_GRACE_US})
                       AS stopped
            FROM marked m LEFT JOIN last l USING (router)),
        sessions AS (
            SELECT router, peer, ts_us AS s,
                   CASE WHEN stopped THEN last_us ELSE coalesce(next_ts, {e}) END AS e,
                   CASE WHEN stopped THEN last_us END AS traced_until_us
            FROM stopped WHERE event = 'link_up'
            UNION ALL
            SELECT router, peer, {s}::BIGINT, ts_us, NULL::BIGINT
            FROM marked WHERE event = 'link_down' AND prev_event IS NULL),
        up AS (
            SELECT router, peer,
                   sum(greatest(least(e, {e}) - greatest(s, {s}), 0))::BIGINT AS up_us,
                   max(traced_until_us) AS traced_until_us
            FROM sessions GROUP BY ALL),
        counts AS (
            SELECT router, peer,
                   count(*) FILTER (WHERE event = 'link_up')::BIGINT AS ups,
                   count(*) FILTER (WHERE event = 'link_down')::BIGINT AS downs,
                   arg_max_null(CASE WHEN event = 'link_down' THEN reason END,
                                CASE WHEN event = 'link_down' THEN ts_us END)
                       AS last_down_reason
            FROM le GROUP BY ALL),
        pairs AS (SELECT DISTINCT router, peer FROM per_minute WHERE peer IS NOT NULL)
        SELECT p.router, p.peer,
               coalesce(up.up_us, CASE WHEN c.ups IS NULL THEN {length} END, 0) / 1e6
                   AS uptime_s,
               coalesce(c.ups, 0)::BIGINT AS ups, coalesce(c.downs, 0)::BIGINT AS downs,
               c.last_down_reason, up.traced_until_us,
               coalesce(up.up_us, CASE WHEN c.ups IS NULL THEN {length} END, 0) / 1e6
                   * 1e8 / {length} AS uptime_pct
        FROM pairs p LEFT JOIN up USING (router, peer) LEFT JOIN counts c USING (router, peer)
        """)
    return _rounded(table, {"uptime_pct": 2})


def links(w, uptime):
    w.con.register("uptime_rows", uptime)
    try:
        minute = _timestamps(w.arrow(f"""
            SELECT router, peer, direction, minute_us, sum(n)::BIGINT AS notifications,
                   sum(bytes)::BIGINT AS bytes, make_timestamp(minute_us) AS minute
            FROM per_minute WHERE {_WIRE} GROUP BY router, peer, direction, minute_us"""),
            "minute")
        w.con.register("minute_rows", minute)
        table = w.arrow(f"""
            WITH per_s AS (
                SELECT router, peer, direction, count(*) AS n FROM w WHERE {_WIRE}
                GROUP BY router, peer, direction, ts_us - ts_us % {jobs.SECOND_US}),
            peak AS (SELECT router, peer, direction, max(n)::BIGINT AS peak_per_s
                     FROM per_s GROUP BY ALL),
            totals AS (
                SELECT router, peer, direction, sum(notifications)::BIGINT AS notifications,
                       sum(bytes)::BIGINT AS bytes, max(notifications) AS peak_per_min,
                       max(bytes) AS peak_bytes_per_min, count(*)::BIGINT AS active_minutes
                FROM minute_rows GROUP BY ALL)
            SELECT t.router, t.peer, t.direction, t.notifications, t.bytes, p.peak_per_s,
                   t.peak_per_min,
                   CASE WHEN u.uptime_s > 0 THEN (t.notifications * 60)::DOUBLE / u.uptime_s END
                       AS mean_per_min,
                   t.peak_bytes_per_min,
                   CASE WHEN u.uptime_s > 0 THEN t.bytes::DOUBLE / u.uptime_s END
                       AS mean_bytes_per_s,
                   t.active_minutes, u.uptime_s, u.uptime_pct, u.downs
            FROM totals t
            LEFT JOIN peak p ON p.router IS NOT DISTINCT FROM t.router
                AND p.peer IS NOT DISTINCT FROM t.peer
                AND p.direction IS NOT DISTINCT FROM t.direction
            LEFT JOIN uptime_rows u ON u.router = t.router AND u.peer = t.peer""")
    finally:
        w.con.unregister("uptime_rows")
    return minute, _rounded(table, {"mean_per_min": 3, "mean_bytes_per_s": 1})


def link_outages(w):
    s, e = w.start, w.end
    table = w.arrow(f"""
        WITH le AS ({_LINK_EVENTS}),
        marked AS (
            SELECT *, lead(ts_us) OVER o AS next_ts, lead(event) OVER o AS next_event,
                   lag(event) OVER o AS prev_event
            FROM le WINDOW o AS (PARTITION BY router, peer ORDER BY ts_us, event)),
        both_ AS (
            SELECT router, peer, ts_us AS down_us,
                   CASE WHEN next_event = 'link_up' THEN next_ts END AS up_us, reason
            FROM marked WHERE event = 'link_down'
            UNION ALL
            SELECT router, peer, NULL::BIGINT, ts_us, NULL::VARCHAR
            FROM marked WHERE event = 'link_up' AND prev_event IS NULL
                AND ts_us > {s + 10 * jobs.SECOND_US})
        SELECT *, (coalesce(up_us, {e}) - coalesce(down_us, {s})) / 1e6 AS seconds
        FROM both_""")
    return _rounded(table, {"seconds": 1})


def links_stage(w, save):
    for name, table in overview(w).items():
        save(name, table)
    uptime = link_uptime(w)
    minute, summary = links(w, uptime)
    save("link_minute", minute)
    save("links", summary)
    save("link_uptime", uptime)
    save("link_outages", link_outages(w))
    return minute


def filters(w):
    effect = shared(w, sharedsql.filter_effect())
    pairs = w.rows("SELECT DISTINCT router, peer FROM per_minute")
    traced = sorted({r["router"] for r in pairs})
    edges = sorted({(r["router"], r["peer"]) for r in pairs if r["peer"] is not None})
    import pyarrow as pa
    model = jobs.flood_model(edges, traced)
    model_table = pa.table({
        "origin": pa.array([r[0] for r in model], pa.string()),
        "first_hop": pa.array([r[1] for r in model], pa.string()),
        "router": pa.array([r[2] for r in model], pa.string()),
        "peer": pa.array([r[3] for r in model], pa.string()),
        "extra_bytes": pa.array([r[4] for r in model], pa.int64())})
    w.con.register("flood_model", model_table)
    try:
        flood = shared(w, sharedsql.flood(traced), flood_model="flood_model")
    finally:
        w.con.unregister("flood_model")
    return {"filter_effect": effect, "flood": flood}


def filter_health(w, min_minutes=10, min_after=100, min_share=5.0):
    return shared(w, sharedsql.filter_health(w.end, min_minutes, min_after, min_share))


def filters_stage(w, save):
    for name, table in filters(w).items():
        save(name, table)
    save("filter_health", filter_health(w))


def drops_stage(w, save, fine_us):
    """The drop tables; returns the drops per ``fine_us`` (``jobs.drop_times``)."""
    events = _sql_list(jobs.DROPS)
    minutes = _timestamps(w.arrow(f"""
        SELECT router, peer, direction, event, minute_us, n AS drops, bytes,
               make_timestamp(minute_us) AS minute
        FROM per_minute WHERE event IN ({events})"""), "minute")
    save("drops_minute", minutes)
    save("drops", shared(w, sharedsql.drops()))
    save("unsent", shared(w, sharedsql.unsent()))
    duplicates = shared(w, sharedsql.duplicate_deliveries())
    save("duplicate_deliveries", duplicates)
    w.con.register("duplicate_deliveries", duplicates)
    try:
        save("duplicate_delivery_totals",
             shared(w, sharedsql.duplicate_delivery_totals(),
                    duplicate_deliveries="duplicate_deliveries"))
    finally:
        w.con.unregister("duplicate_deliveries")
    return shared(w, sharedsql.drop_times(fine_us)).to_pylist()


def _percentile_columns(value, prefix):
    """Exact percentiles: the value at rank ceil(p * n) (Spark's, below 10,000 values)."""
    return ", ".join(
        f"list_sort(list({value}) FILTER (WHERE {value} IS NOT NULL))"
        f"[greatest(1, ceil({q}::DOUBLE * count({value}))::BIGINT)] "
        f"AS {prefix}p{int(q * 100)}_us" for q in jobs.PERCENTILES)


def _candidates(rows, partition, anchor, group="0", order="ts_us"):
    """jobs._candidates in SQL: each target row's anchor times around it."""
    running = (f"PARTITION BY {partition} ORDER BY {order}, is_target "
               f"ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW")
    kind = f"PARTITION BY {partition}, is_target, _group"
    return f"""
        SELECT * EXCLUDE (_rank, _group) FROM (
            SELECT *, last_value({anchor} IGNORE NULLS) OVER (
                       PARTITION BY {partition} ORDER BY _rank, is_target
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS _ranked
            FROM (SELECT *,
                     max({anchor}) OVER ({running}) AS _before,
                     lead({anchor} IGNORE NULLS) OVER (PARTITION BY {partition}
                         ORDER BY {order}, is_target) AS _after,
                     row_number() OVER ({kind} ORDER BY {order}) AS _rank,
                     sum(1 - is_target) OVER (PARTITION BY {partition}) AS _anchors,
                     count(*) OVER ({kind}) AS _targets
                  FROM (SELECT *, {group} AS _group FROM ({rows}))))
        WHERE is_target = 1"""


def _slack_sql(path, slack):
    """jobs._slack_of in SQL: the clocks' slack summed over a path's hops."""
    if not slack:
        return "0::BIGINT"
    keys = "[" + ", ".join("'" + k.replace("'", "''") + "'" for k in sorted(slack)) + "]"
    values = "[" + ", ".join(str(slack[k]) for k in sorted(slack)) + "]"
    return (f"coalesce(list_sum(list_transform(range(1, len({path})), "
            f"lambda i: coalesce(map({keys}, {values})[{path}[i] || '>' || {path}[i + 1]], 0))), "
            f"0)::BIGINT")


def _paired(slack, ts="ts_us"):
    """jobs._paired in SQL (over a relation with ts_us, _before, _after, _anchors)."""
    return (f"CASE WHEN _anchors = 1 THEN coalesce(_before, _after) "
            f"WHEN _anchors = _targets THEN _ranked "
            f"WHEN _after IS NOT NULL AND _after - {ts} <= {slack} THEN _after "
            f"ELSE _before END")


def _pairing_counts(prefix):
    return (f"count(*) FILTER (WHERE anchor_us IS NOT NULL AND _anchors > 1)::BIGINT AS repeated, "
            f"count(*) FILTER (WHERE _anchors = 0)::BIGINT AS unpaired_no_{prefix}, "
            f"count(*) FILTER (WHERE anchor_us IS NULL AND _anchors > 0)::BIGINT "
            f"AS unpaired_repeated")


def paths(w, sample_1_in=1):
    k = jobs.checked_sample(sample_1_in)
    timed = f"(SELECT * FROM w WHERE ((dkey % {k}) + {k}) % {k} = 0)" if k > 1 else "w"
    hops = w.arrow("""
        SELECT hops, count(*)::BIGINT AS deliveries, count(DISTINCT dkey)::BIGINT AS notifications
        FROM w WHERE event = 'notify_received' GROUP BY hops""")
    in_wire = _sql_list(jobs.IN_WIRE)
    w.con.execute(f"""CREATE OR REPLACE TEMP TABLE crossings AS {_candidates(f'''
            SELECT dkey, routing, router AS sender, peer AS receiver, ts_us, ts_us AS sent_us,
                   0 AS is_target
            FROM {timed} WHERE event = 'notify_forwarded'
            UNION ALL
            SELECT dkey, routing, peer, router, ts_us, NULL, 1
            FROM {timed} WHERE direction = 'in' AND event IN ({in_wire}) ''',
            "dkey, routing, sender, receiver", "sent_us")}""")
    fastest = {(r["sender"], r["receiver"]): r["fastest"] for r in w.rows("""
        SELECT sender, receiver, min(ts_us - coalesce(_before, _after)) AS fastest
        FROM crossings WHERE _anchors = 1 AND _targets = 1 GROUP BY ALL""")}
    slack = jobs.hop_slack(fastest)
    lead = _slack_sql("list_append(routing, router)",
                      {f"{a}>{b}": int(v) for (a, b), v in fastest.items() if v is not None})
    hop = w.arrow(f"""
        WITH anchored AS (
            SELECT *, {_paired(_slack_sql("[sender, receiver]", slack))} AS anchor_us
            FROM crossings),
        hop AS (
            SELECT sender, receiver, count(anchor_us)::BIGINT AS matched,
                   {_percentile_columns("ts_us - anchor_us", "delay_")},
                   min(ts_us - anchor_us) AS delay_min_us, max(ts_us - anchor_us) AS delay_max_us,
                   {_pairing_counts("send")}
            FROM anchored GROUP BY sender, receiver),
        offs AS (
            SELECT h.*, b.delay_p50_us AS reverse_p50_us, b.delay_min_us AS reverse_min_us,
                   CASE WHEN h.delay_min_us + b.delay_min_us >= 0 THEN -b.delay_min_us END AS low,
                   CASE WHEN h.delay_min_us + b.delay_min_us >= 0 THEN h.delay_min_us END AS high
            FROM hop h LEFT JOIN hop b ON b.sender = h.receiver AND b.receiver = h.sender)
        SELECT * EXCLUDE (low, high),
               low AS clock_offset_low_us,
               CASE WHEN low IS NOT NULL THEN high END AS clock_offset_high_us,
               trunc((high - low) / 2)::BIGINT AS clock_offset_pm_us,
               CASE WHEN high < 0 OR low > 0 THEN trunc((high + low) / 2)::BIGINT END
                   AS clock_offset_est_us,
               trunc((delay_p50_us + reverse_p50_us) / 2)::BIGINT AS one_way_est_us,
               {k}::INTEGER AS sample_1_in
        FROM offs""")
    w.con.execute("DROP TABLE crossings")
    routes_rows = w.rows(f"""
        WITH anchored AS (
            SELECT *, {_paired(0, "sort_us")} AS anchor_us
            FROM ({_candidates(f'''
            SELECT dkey, origin, peer AS first_hop, ts_us, ts_us AS published_us,
                   ts_us AS sort_us,
                   NULL::VARCHAR[] AS routing, NULL::VARCHAR AS destination, 0 AS is_target
            FROM {timed} WHERE event = 'notify_forwarded' AND hops = 1 AND router = origin
            UNION ALL
            SELECT dkey, origin, coalesce(routing[2], router), ts_us, NULL,
                   ts_us - {lead}, routing, router, 1
            FROM {timed} WHERE event = 'notify_received' ''', "dkey, origin, first_hop",
            "published_us", "hash(routing, destination)", "sort_us")})),
        latency AS (
            SELECT routing, destination, count(anchor_us)::BIGINT AS timed,
                   {_percentile_columns("ts_us - anchor_us", "latency_")},
                   min(ts_us - anchor_us) AS latency_min_us,
                   max(ts_us - anchor_us) AS latency_max_us,
                   {_pairing_counts("publication")}
            FROM anchored GROUP BY routing, destination),
        routes AS (
            SELECT routing, router AS destination, count(*)::BIGINT AS deliveries,
                   sum(size)::BIGINT AS bytes
            FROM w WHERE event = 'notify_received' GROUP BY routing, router)
        SELECT array_to_string(list_append(r.routing, r.destination), ' > ') AS route,
               r.routing[1] AS origin, r.destination,
               len(r.routing)::INTEGER AS hops, r.deliveries, r.bytes, l.timed,
               l.latency_p50_us, l.latency_p90_us, l.latency_p99_us, l.latency_min_us,
               l.latency_max_us, l.repeated, l.unpaired_no_publication, l.unpaired_repeated,
               {k}::INTEGER AS sample_1_in
        FROM routes r LEFT JOIN latency l
            ON l.routing IS NOT DISTINCT FROM r.routing
            AND l.destination IS NOT DISTINCT FROM r.destination""")
    corrections = jobs.route_clock_corrections(hop.to_pylist())
    import pyarrow as pa
    est = {f"{a}>{b}": v for (a, b), v in corrections.items()}
    correction, uncertainty = [], []
    for row in routes_rows:
        names = row["route"].split(" > ") if row["route"] is not None else []
        pairs = [f"{a}>{b}" for a, b in zip(names, names[1:])]
        if corrections and all(p in est for p in pairs):
            correction.append(sum(est[p][0] for p in pairs))
            uncertainty.append(sum(est[p][1] for p in pairs))
        else:
            correction.append(None)
            uncertainty.append(None)
    types = {"route": pa.string(), "origin": pa.string(), "destination": pa.string(),
             "hops": pa.int32(), "sample_1_in": pa.int32()}
    names = ["route", "origin", "destination", "hops", "deliveries", "bytes", "timed",
             "latency_p50_us", "latency_p90_us", "latency_p99_us", "latency_min_us",
             "latency_max_us", "repeated", "unpaired_no_publication", "unpaired_repeated",
             "sample_1_in"]
    routes = pa.table({n: pa.array([r[n] for r in routes_rows], types.get(n, pa.int64()))
                       for n in names})
    routes = routes.append_column("clock_correction_us", pa.array(correction, pa.int64()))
    routes = routes.append_column("clock_uncertainty_us", pa.array(uncertainty, pa.int64()))
    return {"hops": hops, "routes": routes, "hop_latency": hop}


def paths_stage(w, save, analysis, latency_sample):
    k = latency_sample
    if k is None and analysis.records <= jobs.LATENCY_SAMPLE_TARGET:
        k = 1
    elif k is None:
        analysis.wire_records = w.one(
            f"SELECT coalesce(sum(n), 0)::BIGINT FROM per_minute WHERE {_WIRE}")[0]
        k = jobs.latency_sample(analysis.wire_records)
    analysis.latency_sample = k
    for name, table in paths(w, k).items():
        save(name, table)
    return k


def interest(w):
    notify = _sql_list(tf.NOTIFY_EVENTS)
    subreplace = _sql_list(tf.SUBREPLACE_EVENTS)
    attr_sets = w.arrow(f"""
        WITH published AS (
            SELECT akey, sum(n)::BIGINT AS published FROM publications GROUP BY akey),
        outcomes AS (
            SELECT akey,
                   sum(CASE WHEN event = 'notify_forwarded' THEN n ELSE 0 END)::BIGINT
                       AS crossings,
                   sum(CASE WHEN event = 'notify_forwarded' THEN bytes ELSE 0 END)::BIGINT
                       AS crossing_bytes,
                   sum(n)::BIGINT AS considered,
                   sum(CASE WHEN event = 'notify_suppressed_filter' THEN n ELSE 0 END)::BIGINT
                       AS suppressed_filter,
                   sum(CASE WHEN event = 'notify_suppressed_export' THEN n ELSE 0 END)::BIGINT
                       AS suppressed_export
            FROM considered GROUP BY akey),
        counts AS (
            SELECT akey, count(*)::BIGINT AS distinct_ FROM (
                SELECT DISTINCT akey, dkey FROM w WHERE event IN ({notify})) GROUP BY akey),
        names AS (
            SELECT akey, attribute_names, attributes FROM (
                SELECT akey, array_to_string(attrs, ',') AS attribute_names,
                       len(attrs)::INTEGER AS attributes,
                       row_number() OVER (PARTITION BY akey
                           ORDER BY count(*) DESC, array_to_string(attrs, ',')) AS _first
                FROM w WHERE event IN ({notify}) GROUP BY akey, attrs)
            WHERE _first = 1)
        SELECT n.attribute_names, n.attributes, coalesce(p.published, 0)::BIGINT AS published,
               c.distinct_ AS "distinct",
               coalesce(o.crossings, 0)::BIGINT AS crossings,
               coalesce(o.crossing_bytes, 0)::BIGINT AS crossing_bytes,
               coalesce(o.considered, 0)::BIGINT AS considered,
               coalesce(o.suppressed_filter, 0)::BIGINT AS suppressed_filter,
               coalesce(o.suppressed_export, 0)::BIGINT AS suppressed_export
        FROM counts c
        LEFT JOIN outcomes o ON o.akey = c.akey
        LEFT JOIN names n ON n.akey = c.akey
        LEFT JOIN published p ON p.akey = c.akey""")
    changes = _timestamps(w.arrow(f"""
        WITH both_ AS (
            SELECT router, peer, direction, event, ts_us, filter_nodes, filter_bytes, reason,
                   NULL::BIGINT AS up_us, 1 AS is_change
            FROM control WHERE event IN ({subreplace})
            UNION ALL
            SELECT router, peer, direction, event, ts_us, NULL, NULL, NULL, ts_us, 0
            FROM control WHERE event = 'link_up' AND peer IS NOT NULL),
        marked AS (
            SELECT *, max(up_us) OVER (PARTITION BY router, peer ORDER BY ts_us, is_change
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                       AS last_up_us
            FROM both_)
        SELECT router, peer, direction, event, ts_us, make_timestamp(ts_us) AS time,
               filter_nodes, filter_bytes, reason,
               coalesce(ts_us - last_up_us <= {jobs.LINK_UP_GRACE_US}, false) AS on_link_up
        FROM marked WHERE is_change = 1"""), "time")
    hours = (w.end - w.start) / 3.6e9
    w.con.register("changes_rows", changes)
    try:
        churn = w.arrow(f"""
            SELECT router, peer, direction, count(*)::BIGINT AS replaces,
                   count(*) FILTER (WHERE on_link_up)::BIGINT AS on_link_up,
                   min(filter_nodes) AS nodes_min, avg(filter_nodes) AS nodes_mean,
                   max(filter_nodes) AS nodes_max,
                   arg_max_null(filter_nodes, ts_us) AS nodes_last,
                   arg_max_null(filter_bytes, ts_us) AS bytes_last,
                   max(filter_bytes) AS bytes_max,
                   count(*) FILTER (WHERE reason IS NOT NULL)::BIGINT AS refused,
                   min(ts_us) AS first_us, max(ts_us) AS last_us,
                   {f"count(*) / {hours!r}" if hours >= 1 else "NULL::DOUBLE"}
                       AS replaces_per_hour
            FROM changes_rows GROUP BY router, peer, direction""")
    finally:
        w.con.unregister("changes_rows")
    churn = _rounded(churn, {"nodes_mean": 1, "replaces_per_hour": 2})
    return {"attr_sets": attr_sets, "filter_changes": changes, "filter_churn": churn}


def interest_stage(w, save):
    tables = interest(w)
    save("attr_sets", tables["attr_sets"])
    save("filter_changes", tables["filter_changes"])
    save("filter_churn", tables["filter_churn"])
    return tables["filter_changes"]

