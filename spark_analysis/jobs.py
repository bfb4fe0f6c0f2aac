"""The analysis jobs: DataFrame in (the ``events`` table), DataFrames out.

Every function takes the valid, in-window records (``events``, columns as
written by ``ingest``: ts_us, router, peer, event, direction, routing,
size, attrs, digest, filter_nodes, filter_bytes, reason, origin, hops) and
returns named DataFrames. Only the DataFrame API and built-in functions
are used -- no Python UDFs -- so the work runs in the JVM, on a cluster as
on one machine. The only Python on the driver is the small flood model
(``flood_model``), built from the list of links.

Terms: a *link* is (router, peer) seen from ``router``; ``direction``
"out" is traffic router -> peer, "in" peer -> router. *Wire* traffic is
every FedNotify that crossed a link: notify_forwarded (out) at the sender,
and notify_received / notify_dropped_* (in) at the receiver.
"""

from spark_analysis import sharedsql
from spark_analysis import traceformat as tf

__all__ = ["CONSIDERED", "DROPS", "IN_WIRE", "fine_bucket_us", "drop_times", "MINUTE_US", "LATENCY_SAMPLE_TARGET", "window_of",
           "activity", "control_events", "wire_records", "latency_sample", "checked_sample",
           "considered_counts",
           "links", "filters", "filter_health", "link_outages",
           "flood_model", "drops", "paths", "interest", "overview"]

CONSIDERED = sharedsql.CONSIDERED
# every kind of drop; duplicates (a mesh's second path) are not loops
DROPS = sharedsql.DROPS
IN_WIRE = ("notify_received",) + DROPS
MINUTE_US = 60 * 10**6
SECOND_US = 10**6
LINK_UP_GRACE_US = 2 * SECOND_US
PERCENTILES = [0.5, 0.9, 0.99]
# Latencies are timed on at most about this many wire records (a sample of
# the notifications, the same ones on every router, when a window has more):
# matching each crossing to its send is most of a big run's work, and a
# million crossings pin a percentile down far closer than the clocks allow.
LATENCY_SAMPLE_TARGET = 1_000_000


def _F():
    from pyspark.sql import functions as F
    return F


def shared(spark, query, **relations):
    """A ``sharedsql.Query`` run by Spark over the given DataFrames, its
    columns rounded as the query says."""
    F = _F()
    df = spark.sql(query.sql, **relations)
    if not query.rounding:
        return df
    return df.select(*[F.round(c, query.rounding[c]).alias(c) if c in query.rounding
                       else F.col(c) for c in df.columns])


def _floor(col, unit_us):
    return col - col % unit_us


def _ratio(num, den):
    """num / den as double, null when den is 0 or null (safe under ANSI mode)."""
    F = _F()
    return F.when(den > 0, num.cast("double") / den)


def _count_if(cond):
    F = _F()
    return F.sum(F.when(cond, 1).otherwise(0))


def _sum_if(cond, col):
    F = _F()
    return F.sum(F.when(cond, col).otherwise(0))


def window_of(events, since_us=None, until_us=None, count=False, per_minute=None):
    """(start_us, end_us) of the analysis: --since/--until, else the data's span
    (and the number of records, with ``count``).

    Given the (cached) per-minute counts of ``events`` it reads them instead
    of the table: the pass over the table that makes them is needed anyway.
    """
    F = _F()
    if per_minute is not None:
        row = per_minute.agg(F.min("first_us").alias("lo"), F.max("last_us").alias("hi"),
                             F.coalesce(F.sum("n"), F.lit(0)).alias("n")).collect()[0]
    else:
        row = events.agg(F.min("ts_us").alias("lo"), F.max("ts_us").alias("hi"),
                         F.count(F.lit(1)).alias("n")).collect()[0]
    start = since_us if since_us is not None else row["lo"]
    end = until_us if until_us is not None else row["hi"]
    if start is None or end is None:
        return (None, None, row["n"]) if count else (None, None)
    window = (start, max(end, start + 1))
    return (*window, row["n"]) if count else window


def wire_records(per_minute):
    """How many wire records (FedNotify crossings, counted at either end)
    the per-minute counts hold: what timing every one of them would match."""
    F = _F()
    row = _wire(per_minute).agg(F.coalesce(F.sum("n"), F.lit(0)).alias("n")).collect()[0]
    return row["n"]


def latency_sample(wire, target=None):
    """1 in how many notifications to time so that about ``target`` (by
    default LATENCY_SAMPLE_TARGET) of ``wire`` records are matched: 1 (all)
    up to ``target``, else the smallest power of two that brings them under
    it (powers of two, so a smaller sample is always part of a bigger one)."""
    target = LATENCY_SAMPLE_TARGET if target is None else target
    if target < 1:
        raise ValueError("target must be at least 1")
    k = 1
    while wire > target * k:
        k *= 2
    return k


def checked_sample(sample_1_in):
    """``sample_1_in`` as an int, or ValueError if it is not a whole number >= 1."""
    import operator
    try:
        value = operator.index(sample_1_in)
    except TypeError:
        value = 0
    if value < 1:
        raise ValueError(f"a latency sample must be a whole number >= 1, not {sample_1_in!r}")
    return value


def activity(events, by_day=False):
    """Every record counted once, per router, peer, direction, event and minute.

    One pass over the table that the overview, link, filter and drop
    tables are then all derived from (it is small: a row per active
    minute of each kind of record on each link). Columns: router, peer,
    direction, event, minute_us, n, bytes, first_us, last_us (and the
    records' ``day`` with ``by_day``: how the ingest stores them, see
    ``minutes``; the table's own per-minute counts are
    ``TraceStore.per_minute``).
    """
    F = _F()
    day = ["day"] if by_day else []
    return events.groupBy("router", "peer", "direction", "event",
                          _floor(F.col("ts_us"), MINUTE_US).alias("minute_us"), *day).agg(
        F.count(F.lit(1)).alias("n"), F.sum("size").alias("bytes"),
        F.min("ts_us").alias("first_us"), F.max("ts_us").alias("last_us"))


def control_events(events):
    """The link and FedSubReplace records (few: a link's ups and downs and
    its filter changes), to be cached once for the jobs that need them."""
    F = _F()
    return events.where(F.col("event").isin(*tf.LINK_EVENTS, *tf.SUBREPLACE_EVENTS)).select(
        "router", "peer", "direction", "event", "ts_us", "filter_nodes", "filter_bytes", "reason")


def considered_counts(events):
    """Every out notify record (a notification considered for a link) counted
    per router, peer, event, origin and attribute set, and whether it is the
    origin's first hop (``at_origin``: router = origin, one routing entry).

    One pass that the flood model, the forwarded totals and the attribute
    sets' counts are all sums over (it is small: origins x links x sets x
    the four outcomes). Columns: router, peer, event, origin, akey,
    at_origin, n, bytes.
    """
    F = _F()
    out = events.where((F.col("direction") == "out") & F.col("event").isin(*CONSIDERED))
    return out.groupBy("router", "peer", "event", "origin", "akey",
                       ((F.col("hops") == 1) & (F.col("router") == F.col("origin")))
                       .alias("at_origin")).agg(
        F.count(F.lit(1)).alias("n"), F.sum("size").alias("bytes"))


def overview(events, per_minute=None):
    """Records per router and event, with first and last timestamps."""
    if per_minute is None:
        per_minute = activity(events)
    return {"overview": shared(events.sparkSession, sharedsql.overview(),
                               per_minute=per_minute)}


# ---------------------------------------------------------------------------
# links

def _wire(events):
    F = _F()
    return events.where((F.col("event") == "notify_forwarded")
                        | ((F.col("direction") == "in") & F.col("event").isin(*IN_WIRE)))


# a router whose records stop this long before the window's end, with a
# link still up, stopped without writing link_down (killed)
TRACE_END_GRACE_US = 60 * SECOND_US


def link_uptime(events, start_us, end_us, per_minute=None):
    """Per link (router, peer): seconds up in the window, ups, downs, last reason.

    Sessions run from link_up to the next link event of the link (normally
    its link_down) or the window's end; a link whose first event in the
    window is a link_down was up from the window's start; a link with
    records but no link event was up all the window. A session still open
    at the router's last record, when that is more than
    ``TRACE_END_GRACE_US`` before the window's last record (any router's),
    ends there: the router's traces stop without a link_down, as a killed
    router's do (``traced_until_us``: that last record; null for other
    links).
    """
    F = _F()
    from pyspark.sql import Window
    link_events = (events.where(F.col("event").isin("link_up", "link_down")
                                & F.col("peer").isNotNull())
                   .select("router", "peer", "ts_us", "event", "reason"))
    w = Window.partitionBy("router", "peer").orderBy("ts_us", "event")
    marked = (link_events
              .withColumn("next_ts", F.lead("ts_us").over(w))
              .withColumn("prev_event", F.lag("event").over(w)))
    last = (per_minute.groupBy("router").agg(F.max("last_us").alias("last_us"))
            if per_minute is not None else
            events.groupBy("router").agg(F.max("ts_us").alias("last_us")))
    # (against the window's last record, not its end: --until may lie past the data)
    last = last.crossJoin(last.agg(F.max("last_us").alias("data_end_us")))
    stopped = F.col("next_ts").isNull() & (F.col("last_us")
                                           < F.col("data_end_us") - TRACE_END_GRACE_US)
    up_sessions = (marked.where(F.col("event") == "link_up")
                   .join(last, ["router"], "left")
                   .select("router", "peer", F.col("ts_us").alias("s"),
                           F.when(stopped, F.col("last_us"))
                           .otherwise(F.coalesce("next_ts", F.lit(end_us))).alias("e"),
                           F.when(stopped, F.col("last_us")).alias("traced_until_us")))
    open_at_start = (marked.where((F.col("event") == "link_down") & F.col("prev_event").isNull())
                     .select("router", "peer", F.lit(start_us).cast("long").alias("s"),
                             F.col("ts_us").alias("e"),
                             F.lit(None).cast("long").alias("traced_until_us")))
    sessions = up_sessions.unionByName(open_at_start).select(
        "router", "peer", "traced_until_us",
        F.greatest(F.least("e", F.lit(end_us)) - F.greatest("s", F.lit(start_us)),
                   F.lit(0)).alias("up_us"))
    up = sessions.groupBy("router", "peer").agg(F.sum("up_us").alias("up_us"),
                                                F.max("traced_until_us").alias("traced_until_us"))
    counts = link_events.groupBy("router", "peer").agg(
        _count_if(F.col("event") == "link_up").alias("ups"),
        _count_if(F.col("event") == "link_down").alias("downs"),
        F.max_by(F.when(F.col("event") == "link_down", F.col("reason")),
                 F.when(F.col("event") == "link_down", F.col("ts_us"))).alias("last_down_reason"))
    pairs = (per_minute if per_minute is not None else events).where(
        F.col("peer").isNotNull()).select("router", "peer").distinct()
    length = end_us - start_us
    return (pairs.join(up, ["router", "peer"], "left").join(counts, ["router", "peer"], "left")
            .select("router", "peer",
                    (F.coalesce(F.col("up_us"), F.when(F.col("ups").isNull(), F.lit(length)),
                                F.lit(0)) / 1e6).alias("uptime_s"),
                    F.coalesce("ups", F.lit(0)).alias("ups"),
                    F.coalesce("downs", F.lit(0)).alias("downs"),
                    "last_down_reason", "traced_until_us")
            .withColumn("uptime_pct", F.round(F.col("uptime_s") * 1e8 / length, 2)))


def links(events, start_us, end_us, per_minute=None, control=None):
    """Per link and direction: notifications and bytes per minute; rates; uptime.

    Tables: ``link_minute`` (router, peer, direction, minute_us, minute,
    notifications, bytes), ``links`` (totals, peak per second and per
    minute, mean per minute over the link's uptime, uptime),
    ``link_uptime``.
    """
    F = _F()
    wire = _wire(events).select("router", "peer", "direction", "ts_us", "size")
    if per_minute is None:
        per_minute = activity(events)
    minute = (_wire(per_minute).groupBy("router", "peer", "direction", "minute_us")
              .agg(F.sum("n").alias("notifications"), F.sum("bytes").alias("bytes"))
              .withColumn("minute", F.timestamp_micros("minute_us")))
    # per second, keyed by a 64-bit hash of the link direction: a hash
    # aggregation over every wire record by two longs instead of three
    # strings and a long (at 10M records 4.0 task-seconds instead of 7.7);
    # the names come back from the (small) per-minute totals
    link_key = F.xxhash64("router", "peer", "direction")
    peak_s = (wire.groupBy(link_key.alias("link_key"),
                           _floor(F.col("ts_us"), SECOND_US).alias("second_us"))
              .agg(F.count(F.lit(1)).alias("n"))
              .groupBy("link_key").agg(F.max("n").alias("peak_per_s")))
    uptime = link_uptime(control if control is not None else events, start_us, end_us,
                         per_minute)
    totals = minute.groupBy("router", "peer", "direction").agg(
        F.sum("notifications").alias("notifications"), F.sum("bytes").alias("bytes"),
        F.max("notifications").alias("peak_per_min"),
        F.max("bytes").alias("peak_bytes_per_min"),
        F.count(F.lit(1)).alias("active_minutes"))
    summary = (totals.withColumn("link_key", link_key).join(peak_s, ["link_key"], "left")
               .join(uptime.select("router", "peer", "uptime_s", "uptime_pct", "downs"),
                     ["router", "peer"], "left")
               .withColumn("mean_per_min", F.round(_ratio(F.col("notifications") * 60,
                                                          F.col("uptime_s")), 3))
               .withColumn("mean_bytes_per_s", F.round(_ratio(F.col("bytes"),
                                                              F.col("uptime_s")), 1))
               .select("router", "peer", "direction", "notifications", "bytes",
                       "peak_per_s", "peak_per_min", "mean_per_min", "peak_bytes_per_min",
                       "mean_bytes_per_s", "active_minutes", "uptime_s", "uptime_pct",
                       "downs"))
    return {"link_minute": minute, "links": summary, "link_uptime": uptime}


# ---------------------------------------------------------------------------
# filters

def filter_health(per_minute, end_us, min_minutes=10, min_after=100, min_share=5.0):
    """Per out link: did its pull filter keep working (``sharedsql.filter_health``)."""
    return shared(per_minute.sparkSession,
                  sharedsql.filter_health(end_us, min_minutes, min_after, min_share),
                  per_minute=per_minute)


def link_outages(events, start_us, end_us):
    """Every time a link went down, and when it came back: router, peer,
    down_us, up_us (null: still down at the end), seconds, reason. A link
    down at the start of the window (its first event a link_up) gets a row
    with a null down_us."""
    F = _F()
    from pyspark.sql import Window
    link_events = (events.where(F.col("event").isin("link_up", "link_down")
                                & F.col("peer").isNotNull())
                   .select("router", "peer", "ts_us", "event", "reason"))
    w = Window.partitionBy("router", "peer").orderBy("ts_us", "event")
    marked = (link_events.withColumn("next_ts", F.lead("ts_us").over(w))
              .withColumn("next_event", F.lead("event").over(w))
              .withColumn("prev_event", F.lag("event").over(w)))
    downs = (marked.where(F.col("event") == "link_down")
             .select("router", "peer", F.col("ts_us").alias("down_us"),
                     F.when(F.col("next_event") == "link_up", F.col("next_ts")).alias("up_us"),
                     "reason"))
    first_up = (marked.where((F.col("event") == "link_up") & F.col("prev_event").isNull()
                             & (F.col("ts_us") > start_us + 10 * SECOND_US))
                .select("router", "peer", F.lit(None).cast("long").alias("down_us"),
                        F.col("ts_us").alias("up_us"), F.lit(None).cast("string").alias("reason")))
    both = downs.unionByName(first_up)
    length = (F.coalesce("up_us", F.lit(end_us)) - F.coalesce("down_us", F.lit(start_us))) / 1e6
    return both.withColumn("seconds", F.round(length, 1))


def flood_model(edges, traced):
    """Rows (origin, first_hop, router, peer, extra_bytes) of a flood without filters.

    ``edges`` is an iterable of (router, peer) pairs (either direction;
    treated as undirected links), ``traced`` the routers that wrote traces.
    For each traced origin O the flood follows a breadth-first tree from O
    (the tree itself when the links form one; ties broken by name), and
    each directed tree edge router -> peer is listed with the first hop from
    O it lies behind and the routing-list bytes added between O and router
    (a notification of size s leaving O has size s + extra_bytes there).
    """
    graph = {}
    for a, b in edges:
        if a is None or b is None or a == b:
            continue
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set()).add(a)
    rows = []
    for origin in sorted(traced):
        if origin not in graph:
            continue
        extra = {origin: 0}
        first = {}
        frontier = [origin]
        while frontier:
            nxt = []
            for x in frontier:
                for z in sorted(graph[x]):
                    if z in extra:
                        continue
                    first[z] = z if x == origin else first[x]
                    extra[z] = extra[x] + tf.routing_entry_size(z)
                    rows.append((origin, first[z], x, z, extra[x]))
                    nxt.append(z)
            frontier = nxt
    return rows


# up to this many attribute sets, their names are read at their first times only
NAMES_BY_FIRST_TIME = 200


def _chunks(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]


def local_frame(spark, rows, schema):
    """A small DataFrame of driver-side rows, built as literals in the plan.

    ``spark.createDataFrame(list)`` ships pickled rows to Python workers on
    the executors; this keeps the whole analysis in the JVM (no Python
    worker starts, and executors need no Python for it).
    """
    F = _F()
    base = spark.range(1)
    if not rows:
        return base.select(*[F.lit(None).cast(f.dataType).alias(f.name)
                             for f in schema.fields]).limit(0)
    structs = [F.struct(*[F.lit(v).cast(f.dataType).alias(f.name)
                          for v, f in zip(row, schema.fields)]) for row in rows]
    return base.select(F.inline(F.array(*structs)))


def filters(events, spark, per_minute=None, considered=None, publications=None):
    """Filter effectiveness per link, and the flood a federation without filters sends.

    Tables: ``filter_effect`` (router, peer: considered / forwarded /
    suppressed by pull filter / by export filter / dropped for overload,
    counts and bytes), ``flood`` (router, peer: a flood's notifications and
    bytes vs. those actually forwarded, for notifications published at
    traced routers, and the saving).
    """
    F = _F()
    from pyspark.sql import types as T
    if considered is None:
        considered = considered_counts(events)
    if per_minute is None:
        per_minute = activity(events)
    if publications is None:
        publications = shared(spark, sharedsql.publications(), events=events)
    effect = shared(spark, sharedsql.filter_effect(), per_minute=per_minute)

    # (from the per-minute counts when given: a few thousand rows, not the table)
    pairs = (per_minute.select("router", "peer").distinct().collect()
             if per_minute is not None else
             events.select("router", "peer").distinct().collect())
    traced = sorted({row["router"] for row in pairs})
    edges = sorted({(row["router"], row["peer"]) for row in pairs if row["peer"] is not None})
    model_schema = T.StructType([
        T.StructField("origin", T.StringType()), T.StructField("first_hop", T.StringType()),
        T.StructField("router", T.StringType()), T.StructField("peer", T.StringType()),
        T.StructField("extra_bytes", T.LongType())])
    model = local_frame(spark, flood_model(edges, traced), model_schema)
    table = shared(spark, sharedsql.flood(traced), considered=considered,
                   publications=publications, flood_model=F.broadcast(model))
    return {"filter_effect": effect, "flood": table}


# ---------------------------------------------------------------------------
# drops

def fine_bucket_us(start_us, end_us, most=3600):
    """The finest of 1, 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15, 30, 60 minutes that cuts
    the window into at most ``most`` buckets: drops are drawn at this
    resolution (a burst of a second is a bar of a second, not a minute)."""
    for seconds in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if (end_us - start_us) <= most * seconds * SECOND_US:
            return seconds * SECOND_US
    return 3600 * SECOND_US


def drop_times(events, bucket_us):
    """Drops counted per kind, direction and ``bucket_us`` (``fine_bucket_us``):
    rows event, direction, t_us, drops, in time order."""
    return shared(events.sparkSession, sharedsql.drop_times(bucket_us), events=events)


def drops(events, per_minute=None):
    """Loop, duplicate, import and overload drops per link over time.

    Tables: ``drops_minute`` (router, peer, direction, event, minute_us,
    minute, drops, bytes), ``drops`` (totals, first and last, and
    ``router_listed``: of a link's loop and duplicate drops, how many
    records carry the receiving router in their routing list -- a loop is
    only that; null for the other kinds), ``unsent`` (the link_down
    records of links that went down with notifications still queued) and
    ``duplicate_deliveries`` (notifications received by more than one route).
    """
    F = _F()
    if per_minute is None:
        per_minute = activity(events)
    dropped = per_minute.where(F.col("event").isin(*DROPS))
    keys = ["router", "peer", "direction", "event"]
    minutes = dropped.select(*keys, "minute_us", F.col("n").alias("drops"), "bytes",
                             F.timestamp_micros("minute_us").alias("minute"))
    totals = shared(events.sparkSession, sharedsql.drops(), events=events,
                    per_minute=per_minute)
    spark = events.sparkSession
    duplicates = shared(spark, sharedsql.duplicate_deliveries(), events=events)
    return {"drops_minute": minutes, "drops": totals,
            "unsent": shared(spark, sharedsql.unsent(), events=events),
            "duplicate_deliveries": duplicates,
            "duplicate_delivery_totals": shared(spark, sharedsql.duplicate_delivery_totals(),
                                                duplicate_deliveries=duplicates)}


# ---------------------------------------------------------------------------
# paths

def _candidates(rows, partition, anchor_col, group=None, order_col="ts_us"):
    """For each target row, the anchor times around it: ``_before`` (the
    last anchor at or before it), ``_after`` (the first after it),
    ``_anchors`` (how many anchors its partition holds), ``_targets`` (how
    many targets of its ``group`` it holds: a column, e.g. the destination
    of a delivery; all of them without one) and ``_ranked`` (the anchor of
    the same rank in time: the k-th target of a group with the k-th
    anchor).

    ``rows`` holds anchor rows (``anchor_col`` set to their ``ts_us``) and
    target rows (``anchor_col`` null). One sort serves both neighbours: the
    running maximum gives the last anchor before, ``lead ... IGNORE NULLS``
    the first after; each is linear in the partition's size (a frame
    reaching to the partition's end would be quadratic, and one digest can
    recur thousands of times). Two more sorts of each partition (by group
    and time, then by rank) put each anchor just before the targets of its
    rank.
    """
    F = _F()
    from pyspark.sql import Window
    group = F.lit(0) if group is None else group
    rows = rows.withColumn("_group", group)
    order = Window.partitionBy(*partition).orderBy(order_col, "is_target")
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = Window.partitionBy(*partition)
    kind = Window.partitionBy(*partition, "is_target", "_group")
    by_rank = (Window.partitionBy(*partition).orderBy("_rank", "is_target")
               .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    after = F.expr(f"lead({anchor_col}, 1) IGNORE NULLS")
    return (rows.withColumn("_before", F.max(anchor_col).over(running))
            .withColumn("_after", after.over(order))
            .withColumn("_rank", F.row_number().over(kind.orderBy(order_col)))
            .withColumn("_anchors", F.sum(1 - F.col("is_target")).over(whole))
            .withColumn("_targets", F.count(F.lit(1)).over(kind))
            .withColumn("_ranked", F.last(anchor_col, ignorenulls=True).over(by_rank))
            .where(F.col("is_target") == 1)
            .drop("_group", "_rank"))


def _paired(targets, slack, ts="ts_us"):
    """``targets`` (from ``_candidates``) with ``anchor_us``, the copy each is
    paired with, and ``repeated`` (its partition held more than one copy).

    One copy: that one, whatever the clocks say. Repeated copies (identical
    notifications), as many arrived (at the target's destination) as were
    sent: the k-th to arrive with the k-th sent (a path delivers in order). Otherwise (some sent before the
    window, or lost): the last copy sent at or before the target's time
    plus ``slack`` (a column: how far the target's clock is estimated to
    be behind the anchor's, ``hop_slack``; 0 when unknown), i.e. the
    latest copy that gives no negative delay on clocks as estimated. None
    fits: unpaired.
    """
    F = _F()
    ts = F.col(ts)
    one = F.coalesce(F.col("_before"), F.col("_after"))
    late = F.col("_after").isNotNull() & (F.col("_after") - ts <= slack)
    balanced = F.col("_anchors") == F.col("_targets")
    return (targets.withColumn("repeated", F.col("_anchors") > 1)
            .withColumn("anchor_us", F.when(F.col("_anchors") == 1, one)
                        .when(balanced, F.col("_ranked"))
                        .when(late, F.col("_after")).otherwise(F.col("_before"))))


def _pairing_counts(prefix):
    """Aggregates of ``_paired`` rows: repeated copies paired, and the unpaired by why."""
    F = _F()
    paired = F.col("anchor_us").isNotNull()
    return [_count_if(paired & F.col("repeated")).cast("long").alias("repeated"),
            _count_if(F.col("_anchors") == 0).cast("long").alias(f"unpaired_no_{prefix}"),
            _count_if(~paired & (F.col("_anchors") > 0)).cast("long")
            .alias("unpaired_repeated")]


def clock_offsets(hop):
    """Add, per directed link, what the two directions' delays say about the clocks.

    A crossing sender -> receiver is stamped on two clocks: its measured
    delay is the true delay (never negative) plus the offset theta of the
    receiver's clock from the sender's; the way back measures its true
    delay minus theta. So theta lies in [-fastest way back, fastest way
    there] -- a bound, however uneven the traffic or the queues. Columns:
    ``clock_offset_low_us`` / ``clock_offset_high_us`` (the bound, where
    both directions are seen), ``clock_offset_pm_us`` (its half-width) and
    ``clock_offset_est_us``, its middle (NTP's estimate, exact when the
    fastest crossings took as long each way), given only when the bound
    excludes zero: otherwise the offset cannot be told from none.
    ``one_way_est_us`` is half the sum of the two medians.
    """
    F = _F()
    back = hop.select(F.col("sender").alias("receiver"), F.col("receiver").alias("sender"),
                      F.col("delay_p50_us").alias("reverse_p50_us"),
                      F.col("delay_min_us").alias("reverse_min_us"))
    # a negative round trip (fastest there + fastest back < 0) can only come
    # from mismatched recurring notifications: then no bound is claimed
    consistent = (F.col("delay_min_us") + F.col("reverse_min_us")) >= 0
    low = F.when(consistent, -F.col("reverse_min_us"))
    high = F.when(consistent, F.col("delay_min_us"))
    return (hop.join(back, ["sender", "receiver"], "left")
            .withColumn("clock_offset_low_us", low)
            .withColumn("clock_offset_high_us", F.when(low.isNotNull(), high))
            .withColumn("clock_offset_pm_us", ((high - low) / 2).cast("long"))
            .withColumn("clock_offset_est_us",
                        F.when((high < 0) | (low > 0), ((high + low) / 2).cast("long")))
            .withColumn("one_way_est_us",
                        ((F.col("delay_p50_us") + F.col("reverse_p50_us")) / 2).cast("long")))


def route_clock_corrections(hop_rows):
    """{(sender, receiver): (offset to subtract, uncertainty)} per link with both directions.

    An offset that cannot be told from zero is corrected by 0, within its
    bound's half-width.
    """
    out = {}
    for r in hop_rows:
        r = r.asDict() if hasattr(r, "asDict") else r
        if r.get("clock_offset_pm_us") is None:
            continue
        est = r.get("clock_offset_est_us") or 0
        out[(r["sender"], r["receiver"])] = (est, r["clock_offset_pm_us"])
    return out


def _route_pairs(route):
    """Column: a route "a > b > c" as its hops ["a>b", "b>c"]."""
    F = _F()
    names = F.split(route, " > ")
    return F.transform(F.sequence(F.lit(1), F.size(names) - 1),
                       lambda i: F.concat(F.element_at(names, i), F.lit(">"),
                                          F.element_at(names, i + 1)))


def _with_corrections(routes, corrections):
    """Add ``clock_correction_us`` (the destination's clock offset from the
    origin's: subtract it from the route's latencies) and
    ``clock_uncertainty_us``; null when a hop's offset cannot be bounded
    (traffic one way only)."""
    F = _F()
    if not corrections:
        return (routes.withColumn("clock_correction_us", F.lit(None).cast("long"))
                .withColumn("clock_uncertainty_us", F.lit(None).cast("long")))
    est = F.create_map(*[x for (a, b), (e, _) in sorted(corrections.items())
                         for x in (F.lit(f"{a}>{b}"), F.lit(e))])
    pm = F.create_map(*[x for (a, b), (_, w) in sorted(corrections.items())
                        for x in (F.lit(f"{a}>{b}"), F.lit(w))])
    known = F.forall("_pairs", lambda p: F.element_at(est, p).isNotNull())

    def total(m):
        return F.aggregate(F.transform("_pairs", lambda p: F.element_at(m, p)),
                           F.lit(0).cast("long"), lambda acc, x: acc + x)
    return (routes.withColumn("clock_correction_us", F.when(known, total(est)))
            .withColumn("clock_uncertainty_us", F.when(known, total(pm))))


def _percentiles(col, prefix):
    F = _F()
    p = F.percentile_approx(col, PERCENTILES, 10000)
    return [p[i].alias(f"{prefix}p{int(q * 100)}_us") for i, q in enumerate(PERCENTILES)]


def _hop_pairs(path):
    """Column: a path (array of domains) as its hops ["a>b", "b>c"]."""
    F = _F()
    return F.transform(F.sequence(F.lit(1), F.size(path) - 1),
                       lambda i: F.concat(F.element_at(path, i), F.lit(">"),
                                          F.element_at(path, i + 1)))


def hop_slack(fastest):
    """{"sender>receiver": µs}: how far a receiver's clock is estimated to be
    behind its sender's, from ``fastest`` ({(sender, receiver): the fastest
    crossing of an unrepeated notification}): half the fastest crossing
    back minus the fastest crossing there (NTP's estimate of the offset,
    negated), where that is positive. A link without crossings both ways,
    or with the receiver's clock ahead: 0."""
    out = {}
    for (a, b), there in fastest.items():
        back = fastest.get((b, a))
        if there is not None and back is not None and back > there:
            out[f"{a}>{b}"] = int((back - there) // 2)
    return out


def _slack_of(pairs, slack):
    """Column: the sum of ``slack`` ({"a>b": µs}) over ``pairs`` (an array of "a>b")."""
    F = _F()
    if not slack:
        return F.lit(0).cast("long")
    table = F.create_map(*[x for key, value in sorted(slack.items())
                           for x in (F.lit(key), F.lit(value).cast("long"))])
    return F.aggregate(F.transform(pairs, lambda p: F.coalesce(F.element_at(table, p),
                                                                F.lit(0).cast("long"))),
                       F.lit(0).cast("long"), lambda acc, x: acc + x)


def paths(events, sample_1_in=1):
    """Hop counts, routes and latencies, joining each notification's digest across routers.

    Tables:

    * ``hops``: deliveries (notify_received) by hop count (routing list
      length as received = links crossed) and distinct notifications;
    * ``routes``: per route (origin > ... > destination) deliveries, bytes,
      and latency from publication at the origin router to arrival:
      p50/p90/p99/min/max in microseconds (difference of two hosts' clocks);
    * ``hop_latency``: per directed link, forwarded-to-received delay
      percentiles, and where both directions are seen an estimate of the
      clock offset between the two hosts and of the one-way delay.

    Matching: a delivery is paired with the origin's out record with the
    same digest and origin for the same first link (the second routing-list
    entry, or the receiving router after one hop), and a received record
    with the forwarded record of the same digest, routing list and link.
    Where there is one such record, that one. Where identical notifications
    repeat on a link, as many received as sent: in order (the k-th received
    with the k-th sent: a link delivers in order; a publication's copies
    with the deliveries at each destination). Otherwise the unrepeated
    notifications first estimate each link's clock offset (``hop_slack``),
    then each record is paired with the last copy sent no later than its
    own time, on the sender's clock as estimated (``_paired``): a copy sent
    after the record arrived is never taken. A delivery is paired with the
    last publication no later than its arrival less the fastest crossing
    of each hop on its way (as measured, clocks included). Both tables count the
    records paired among repeated copies (``repeated``) and those left
    unpaired: no copy at all in the window (``unpaired_no_send``,
    ``unpaired_no_publication``) or none that fits (``unpaired_repeated``).
    The published time is when the origin queued the notification on that
    first link.

    ``sample_1_in`` k > 1: latencies (``timed``, ``matched`` and their
    percentiles) from the notifications whose digest's first 64 bits are a
    multiple of k -- 1 in k of them, the same ones on every router, so both
    ends of every crossing are in the sample. Hop counts and routes' counts
    are always of every record. Both latency tables get a ``sample_1_in``
    column.
    """
    F = _F()
    sample_1_in = checked_sample(sample_1_in)
    received = events.where(F.col("event") == "notify_received")
    # both matchings read only the sampled notifications (all of them at k = 1)
    timed = (events.where(F.pmod(F.col("dkey"), F.lit(sample_1_in)) == 0)
             if sample_1_in > 1 else events)
    hops = (received.groupBy("hops")
            .agg(F.count(F.lit(1)).alias("deliveries"),
                 # 64-bit hashes of the digests: a fifth of the bytes to shuffle;
                 # at 10^7 notifications a collision has a 1 in 300,000 chance
                 F.countDistinct("dkey").alias("notifications")))

    # partition keys are 64-bit hashes: much cheaper to shuffle and sort than
    # the strings, and a collision (2^-64 per pair) would only mismatch a few
    sent = (timed.where(F.col("event") == "notify_forwarded")
            .select(F.xxhash64("dkey", "routing", "router", "peer").alias("pkey"),
                    F.col("router").alias("sender"), F.col("peer").alias("receiver"), "ts_us",
                    F.col("ts_us").alias("sent_us"), F.lit(0).alias("is_target")))
    arrived = (timed.where((F.col("direction") == "in") & F.col("event").isin(*IN_WIRE))
               .select(F.xxhash64("dkey", "routing", "peer", "router").alias("pkey"),
                       F.col("peer").alias("sender"), F.col("router").alias("receiver"), "ts_us",
                       F.lit(None).cast("long").alias("sent_us"), F.lit(1).alias("is_target")))
    # (materialised: read twice, for the clocks' bounds and for the pairing)
    crossings = (_candidates(sent.unionByName(arrived), ["pkey"], "sent_us")
                 .select("sender", "receiver", "ts_us", "_before", "_after", "_anchors",
                         "_targets", "_ranked")
                 .localCheckpoint())
    fastest = {(r["sender"], r["receiver"]): r["fastest"] for r in
               crossings.where((F.col("_anchors") == 1) & (F.col("_targets") == 1))
               .groupBy("sender", "receiver")
               .agg(F.min(F.col("ts_us") - F.coalesce("_before", "_after")).alias("fastest"))
               .collect()}
    slack = hop_slack(fastest)
    link = F.array(F.col("sender"), F.col("receiver"))
    hop = (_paired(crossings, _slack_of(_hop_pairs(link), slack))
           .withColumn("delay_us", F.col("ts_us") - F.col("anchor_us"))
           .groupBy("sender", "receiver")
           .agg(_count_if(F.col("anchor_us").isNotNull()).cast("long").alias("matched"),
                *_percentiles(F.col("delay_us"), "delay_"),
                F.min("delay_us").alias("delay_min_us"), F.max("delay_us").alias("delay_max_us"),
                *_pairing_counts("send")))
    # small; materialised once so that joining it with itself does not redo the work
    hop = hop.localCheckpoint()
    hop = clock_offsets(hop).withColumn("sample_1_in", F.lit(sample_1_in))

    # a delivery's publication: the origin sending it on the first link
    route_key = F.xxhash64("routing", "router")
    published = (timed.where((F.col("event") == "notify_forwarded")
                             & (F.col("hops") == 1) & (F.col("router") == F.col("origin")))
                 .select(F.xxhash64("dkey", "origin", "peer").alias("pkey"), "ts_us",
                         F.col("ts_us").alias("published_us"), F.col("ts_us").alias("sort_us"),
                         F.lit(None).cast("long").alias("route_key"),
                         F.lit(None).cast("array<string>").alias("path"),
                         F.lit(0).alias("is_target")))
    first_hop = F.coalesce(F.get(F.col("routing"), 1), F.col("router"))
    # a delivery cannot have been published later than its arrival less the
    # fastest crossing of each hop on its way (as measured: clocks included)
    lead = _slack_of(_hop_pairs(F.concat("routing", F.array("router"))),
                     {f"{a}>{b}": int(v) for (a, b), v in fastest.items() if v is not None})
    deliveries = timed.where(F.col("event") == "notify_received").select(
        F.xxhash64("dkey", "origin", first_hop).alias("pkey"), "ts_us",
        F.lit(None).cast("long").alias("published_us"), (F.col("ts_us") - lead).alias("sort_us"),
        route_key.alias("route_key"), F.concat("routing", F.array("router")).alias("path"),
        F.lit(1).alias("is_target"))
    matched = (_paired(_candidates(published.unionByName(deliveries), ["pkey"], "published_us",
                                   F.col("route_key"), order_col="sort_us"),
                       F.lit(0), ts="sort_us")
               .withColumn("latency_us", F.col("ts_us") - F.col("anchor_us")))
    latency = (matched.groupBy("route_key")
               .agg(_count_if(F.col("anchor_us").isNotNull()).cast("long").alias("timed"),
                    *_percentiles(F.col("latency_us"), "latency_"),
                    F.min("latency_us").alias("latency_min_us"),
                    F.max("latency_us").alias("latency_max_us"),
                    *_pairing_counts("publication")))
    # grouped by the route itself (hash aggregation: first("routing") would
    # need a sort-based one), hashed afterwards, per route, to join latencies
    routes = (received.groupBy("routing", F.col("router").alias("destination"))
              .agg(F.count(F.lit(1)).alias("deliveries"), F.sum("size").alias("bytes"))
              .withColumn("route_key", F.xxhash64("routing", "destination"))
              .select(F.concat_ws(" > ", F.concat("routing", F.array("destination"))).alias("route"),
                      F.get(F.col("routing"), 0).alias("origin"), "destination",
                      F.size("routing").alias("hops"), "deliveries", "bytes", "route_key")
              .join(latency, ["route_key"], "left")
              .drop("route_key")
              .withColumn("sample_1_in", F.lit(sample_1_in)))
    corrections = route_clock_corrections(hop.collect())
    routes = routes.withColumn("_pairs", _route_pairs(F.col("route")))
    routes = _with_corrections(routes, corrections).drop("_pairs")
    return {"hops": hops, "routes": routes, "hop_latency": hop}


# ---------------------------------------------------------------------------
# interest

def interest(events, start_us, end_us, control=None, considered=None, publications=None):
    """Attribute-name sets and pull-filter churn.

    Tables: ``attr_sets`` (per set of attribute names: publications at
    traced routers, distinct contents (digests), link crossings and bytes,
    considered, suppressed by each filter), ``filter_changes`` (every FedSubReplace: time, link,
    direction, nodes, bytes) and ``filter_churn`` (per link and direction:
    replaces, per hour, filter size min/mean/max/last, refused).
    Unlike the other jobs it runs one small query when called: each
    set's first time, which the names are then read at.
    """
    F = _F()
    notify = events.where(F.col("event").isin(*tf.NOTIFY_EVENTS))
    if considered is None:
        considered = considered_counts(events)
    e = F.col("event")
    # sets are keyed by ``akey``, a 64-bit hash of the (sorted) names made at
    # ingest; the names themselves are looked up once per set
    akey = F.col("akey")
    # each notification counted once at its origin (``sharedsql.publications``)
    if publications is None:
        publications = shared(events.sparkSession, sharedsql.publications(), events=events)
    published = publications.groupBy(akey).agg(F.sum("n").alias("published"))
    # the out records' outcomes are sums over the (small) considered counts
    counted = ["crossings", "crossing_bytes", "considered", "suppressed_filter",
               "suppressed_export"]
    outcomes = considered.groupBy(akey).agg(
        _sum_if(e == "notify_forwarded", F.col("n")).alias("crossings"),
        _sum_if(e == "notify_forwarded", F.col("bytes")).alias("crossing_bytes"),
        F.sum("n").alias("considered"),
        _sum_if(e == "notify_suppressed_filter", F.col("n")).alias("suppressed_filter"),
        _sum_if(e == "notify_suppressed_export", F.col("n")).alias("suppressed_export"))
    # the number of (set, digest) groups is the exact number of distinct
    # contents: the only per-record aggregation here, of two longs
    counts = (notify.select(akey, "dkey").distinct()
              .groupBy("akey").agg(F.count(F.lit(1)).alias("distinct"))
              .join(outcomes, ["akey"], "left")
              .na.fill(0, counted))
    # one row per (set, names) by a hash aggregation, the names joined into
    # a string only on its few result rows; one per set is then kept by a
    # window over those rows. (Deduplicating right after the aggregation
    # let the optimiser merge the two into one sort-based aggregation with
    # first(): a sort of every notify record, which spilled ~800 MB at 10M)
    from pyspark.sql import Window
    by_set = Window.partitionBy("akey").orderBy(F.col("count").desc(), "attribute_names")
    # Reading every record's list of names cost more than the rest of the
    # sets' counts (at 10M records, 3.7 of 13 task-seconds); a set's names
    # are the same in all its records (akey is a hash of them), so they
    # are read from its records at its first time only, the row groups
    # holding those times found by their ts_us statistics (IN lists of up
    # to 10 values reach Parquet as equalities; past NAMES_BY_FIRST_TIME
    # sets every record is read, as the filter would cost more)
    names_from = notify
    firsts = [(r["akey"], r["ts_us"]) for r in
              notify.groupBy(akey).agg(F.min("ts_us").alias("ts_us")).collect()]
    if len(firsts) <= NAMES_BY_FIRST_TIME:
        at_first = F.lit(False)
        for times in _chunks(sorted({t for _, t in firsts}), 10):
            at_first = at_first | F.col("ts_us").isin(*times)
        names_from = notify.where(at_first & F.col("akey").isin(*sorted({k for k, _ in firsts})))
    names = (names_from.groupBy(akey, "attrs").count()
             .select(akey, F.concat_ws(",", "attrs").alias("attribute_names"),
                     F.size("attrs").alias("attributes"), "count")
             .withColumn("_first", F.row_number().over(by_set))
             .where(F.col("_first") == 1).drop("_first", "count"))
    attr_sets = (counts.join(names, ["akey"], "left").join(published, ["akey"], "left")
                 .select("attribute_names", "attributes",
                         F.coalesce("published", F.lit(0)).alias("published"), "distinct",
                         *counted))
    # a filter sent (or received) within LINK_UP_GRACE of the link coming
    # up is the link's first exchange, not a change of subscriptions
    cols = ["router", "peer", "direction", "event", "ts_us", "filter_nodes", "filter_bytes",
            "reason"]
    control = control if control is not None else events
    sub = control.where(F.col("event").isin(*tf.SUBREPLACE_EVENTS)).select(
        *cols, F.lit(None).cast("long").alias("up_us"), F.lit(1).alias("is_change"))
    ups = control.where((F.col("event") == "link_up") & F.col("peer").isNotNull()).select(
        "router", "peer", "direction", "event", "ts_us",
        *[F.lit(None).cast(t).alias(c) for c, t in (("filter_nodes", "long"),
                                                    ("filter_bytes", "long"),
                                                    ("reason", "string"))],
        F.col("ts_us").alias("up_us"), F.lit(0).alias("is_change"))
    w = (Window.partitionBy("router", "peer").orderBy("ts_us", "is_change")
         .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    changes = (sub.unionByName(ups).withColumn("last_up_us", F.max("up_us").over(w))
               .where(F.col("is_change") == 1)
               .select("router", "peer", "direction", "event", "ts_us",
                       F.timestamp_micros("ts_us").alias("time"),
                       "filter_nodes", "filter_bytes", "reason",
                       F.coalesce(F.col("ts_us") - F.col("last_up_us") <= LINK_UP_GRACE_US,
                                  F.lit(False)).alias("on_link_up")))
    hours = (end_us - start_us) / 3.6e9
    churn = (changes.groupBy("router", "peer", "direction")
             .agg(F.count(F.lit(1)).alias("replaces"),
                  _count_if(F.col("on_link_up")).alias("on_link_up"),
                  F.min("filter_nodes").alias("nodes_min"),
                  F.round(F.avg("filter_nodes"), 1).alias("nodes_mean"),
                  F.max("filter_nodes").alias("nodes_max"),
                  F.max_by("filter_nodes", "ts_us").alias("nodes_last"),
                  F.max_by("filter_bytes", "ts_us").alias("bytes_last"),
                  F.max("filter_bytes").alias("bytes_max"),
                  _count_if(F.col("reason").isNotNull()).alias("refused"),
                  F.min("ts_us").alias("first_us"), F.max("ts_us").alias("last_us"))
             # a rate per hour only from at least an hour of data
             .withColumn("replaces_per_hour",
                         F.round(F.col("replaces") / F.lit(hours), 2) if hours >= 1
                         else F.lit(None).cast("double")))
    return {"attr_sets": attr_sets, "filter_changes": changes, "filter_churn": churn}
