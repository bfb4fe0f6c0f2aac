"""Charts (matplotlib, Agg) and the one-file HTML report.

Works only from ``pipeline.Analysis`` (small tables already collected on
the driver); no Spark here. Each figure gets a short reading in plain
words, computed from the same numbers.
"""

import base64
import datetime
import html
import os
import sys

from spark_analysis import traceformat as tf

__all__ = ["write_report"]

COLOURS = {"forwarded": "#2b8a3e", "suppressed_filter": "#74c0fc",
           "suppressed_export": "#f59f00", "dropped_overload": "#e03131"}


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _tight_box(fig, dpi):
    """What ``savefig(bbox_inches="tight")`` saves of ``fig``, from the
    layout of the draw just made: "tight" draws the whole figure once more
    to find it (a fifth of drawing a report's charts). "tight" itself where
    that draw would differ (another dpi, a layout engine)."""
    import matplotlib
    if fig.dpi != dpi or fig.get_layout_engine() is not None:
        return "tight"
    pad = matplotlib.rcParams["savefig.pad_inches"]
    return fig.get_tightbbox(fig.canvas.get_renderer()).padded(pad, pad)


def _n(value):
    return f"{int(value or 0):,}"


def _bytes(value):
    value = float(value or 0)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def _byte_unit(largest):
    """(unit, divisor) that shows ``largest`` bytes as 1 to 999 of a unit:
    a chart of a few kilobytes reads in kB, not 0.00 MB."""
    scale = 1
    for unit in ("B", "kB", "MB", "GB"):
        if largest < 1000 * scale or unit == "GB":
            return unit, scale
        scale *= 1000
    return "GB", scale


def _pct(part, whole):
    return 100.0 * part / whole if whole else 0.0


def _ms(us):
    return "n/a" if us is None else f"{us / 1000:.2f} ms"


def _short(domain, routers):
    """Shortest unambiguous prefix of a domain's labels (syd.elvin.example.net -> syd)."""
    if domain is None:
        return "?"
    labels = domain.split(".")
    for k in range(1, len(labels) + 1):
        cand = ".".join(labels[:k])
        if sum(1 for r in routers if r is not None and ".".join(r.split(".")[:k]) == cand) <= 1:
            return cand
    return domain


def _when(ts_us):
    return datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=int(ts_us))


class _Figures:
    def __init__(self, analysis):
        self.a = analysis
        self.dir = os.path.join(analysis.out_dir, "charts")
        os.makedirs(self.dir, exist_ok=True)
        names = set()
        for row in analysis.tables.get("overview", []):
            names.add(row["router"])
        for row in analysis.tables.get("link_uptime", []):
            names.add(row["peer"])
        self.names = names

    def s(self, domain):
        return _short(domain, self.names)

    def save(self, fig, name):
        plt = _plt()
        path = os.path.join(self.dir, name + ".png")
        fig.canvas.draw()
        self.a.chart_overlaps[name] = overlapping_texts(fig)
        fig.savefig(path, dpi=100, bbox_inches=_tight_box(fig, 100))
        plt.close(fig)
        self.a.charts[name] = path
        return path


def _time_axis(ax):
    import matplotlib.dates as mdates
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlabel("time (UTC)")


def _rate_points(analysis, rows, value):
    """(time, count) per bucket for bucketed rows: the real counts, with a
    zero for every bucket of the analysed window that had none (so a line
    drops to zero through an outage instead of bridging it), never scaled
    up for a bucket only partly inside the window (that would invent
    traffic)."""
    bucket = analysis.series["bucket_us"]
    counts = {}
    for r in rows:
        counts[r["t_us"]] = counts.get(r["t_us"], 0) + r[value]
    first = (analysis.start_us // bucket) * bucket
    xs, ys = [], []
    t = first
    while t < analysis.end_us:
        xs.append(_when(t))
        ys.append(counts.get(t, 0))
        t += bucket
    return xs, ys


def _partial_points(analysis, count, inside=0.9):
    """Indices of the first and last of ``count`` buckets when less than
    ``inside`` of the bucket lies in the analysed window: their counts are
    real but cover a fraction of the time, so they are drawn apart."""
    bucket = analysis.series["bucket_us"]
    first = (analysis.start_us // bucket) * bucket
    partial = set()
    if count and (first + bucket - analysis.start_us) < inside * bucket:
        partial.add(0)
    last = first + (count - 1) * bucket
    if count and (analysis.end_us - last) < inside * bucket:
        partial.add(count - 1)
    return partial


def _plot_counts(ax, analysis, xs, ys, **style):
    """A count per bucket: a solid step over each whole bucket; a bucket only
    partly inside the window is dotted, with an open circle at its real
    count. Returns the line (for its colour and label)."""
    partial = _partial_points(analysis, len(xs))
    solid = [None if i in partial else y for i, y in enumerate(ys)]
    # a count per bucket is a step over the bucket, not a slope between buckets
    ends = xs + [xs[-1] + datetime.timedelta(microseconds=analysis.series["bucket_us"])] \
        if xs else xs
    line, = ax.plot(ends, [float("nan") if y is None else y for y in solid + solid[-1:]],
                    drawstyle="steps-post", **style)
    if partial:
        colour = line.get_color()
        ax.plot(ends, ys + ys[-1:], linestyle=":", linewidth=1, color=colour,
                drawstyle="steps-post")
        idx = sorted(partial)
        ax.plot([xs[i] for i in idx], [ys[i] for i in idx], linestyle="none", marker="o",
                markersize=4, markerfacecolor="white", markeredgecolor=colour)
    return line


def _partial_note(fig, analysis, count):
    if _partial_points(analysis, count):
        fig.text(0.01, 0.005, "○ a bucket only partly inside the period: its real count, "
                 "for the part inside", fontsize=7, color="#495057", va="bottom")


def _per_bucket(analysis):
    """How the y axis of a bucketed chart reads: "per minute", "per 5 minutes"."""
    minutes = analysis.series["bucket_us"] / 60e6
    return "per minute" if minutes == 1 else f"per {minutes:g} minutes"


def _legend_outside(ax):
    """The legend beside the plot, never over the data."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _empty(fig_name, figs, message):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="#555")
    return figs.save(fig, fig_name)


# ---------------------------------------------------------------------------
# figures, each returning (name, reading)

def _extent(fig, artist):
    """An artist's box on the canvas, in pixels (to keep labels apart); a
    text with a box around it counts with its box."""
    renderer = fig.canvas.get_renderer()
    box = artist.get_window_extent(renderer=renderer)
    patch = artist.get_bbox_patch() if hasattr(artist, "get_bbox_patch") else None
    if patch is not None:
        artist.update_bbox_position_size(renderer)
        box = patch.get_window_extent(renderer=renderer)
    return box


def overlapping_texts(fig):
    """Pairs of texts in ``fig`` whose boxes overlap (a test that labels never do)."""
    texts = [t for ax in fig.axes for t in ax.texts if t.get_visible() and t.get_text()]
    boxes = [(t.get_text(), _extent(fig, t)) for t in texts]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if ba.overlaps(bb)]


def _segment_hits_box(p, q, box):
    """Does the segment p-q (pixels) pass through ``box`` (a Bbox)?"""
    (x0, y0), (x1, y1) = p, q
    t0, t1 = 0.0, 1.0
    dx, dy = x1 - x0, y1 - y0
    for d, lo, hi, start in ((dx, box.x0, box.x1, x0), (dy, box.y0, box.y1, y0)):
        if d == 0:
            if not lo <= start <= hi:
                return False
            continue
        a, b = (lo - start) / d, (hi - start) / d
        t0, t1 = max(t0, min(a, b)), min(t1, max(a, b))
        if t0 > t1:
            return False
    return True


def fig_topology(figs):
    plt = _plt()
    a = figs.a
    volume = {}
    for row in wire_traffic(a):
        key = frozenset((row["sender"], row["receiver"]))
        volume[key] = volume.get(key, 0) + (row["bytes"] or 0)
    edges = {frozenset((r["router"], r["peer"])) for r in a.tables.get("link_uptime", [])}
    nodes = sorted({n for e in edges for n in e} | set(r["router"] for r in a.tables["overview"]))
    traced = {r["router"] for r in a.tables["overview"]}
    graph = {n: set() for n in nodes}
    for e in edges:
        if len(e) == 2:
            x, y = tuple(e)
            graph[x].add(y)
            graph[y].add(x)
    # layered layout from the best-connected router
    positions, layer_of = {}, {}
    remaining = set(nodes)
    layers = []
    while remaining:
        root = max(sorted(remaining), key=lambda n: len(graph[n]))
        frontier, seen = [root], {root}
        depth = 0
        while frontier:
            layers.append((depth, sorted(frontier)))
            nxt = []
            for x in frontier:
                for z in sorted(graph[x]):
                    if z not in seen and z in remaining:
                        seen.add(z)
                        nxt.append(z)
            frontier = nxt
            depth += 1
        remaining -= seen
    rows = {}
    for depth, members in layers:
        rows.setdefault(depth, []).extend(members)
    for depth in sorted(rows):
        members = rows[depth]
        if depth:
            # each router under the routers it links to above (fewer crossings)
            def under(n):
                above = [positions[z][0] for z in graph[n] if layer_of.get(z) == depth - 1]
                return (sum(above) / len(above) if above else 0.5, n)
            members = sorted(members, key=under)
        for i, n in enumerate(members):
            positions[n] = ((i + 1) / (len(members) + 1), -depth)
            layer_of[n] = depth
    widest = max((len(m) for m in rows.values()), default=1)
    fig, ax = plt.subplots(figsize=(max(8, 1.8 * widest), max(2.5, 1.4 * (len(rows) + 1))))
    ax.set_xlim(0, 1)
    ax.set_ylim(min(p[1] for p in positions.values()) - 0.5 if positions else -1, 0.5)
    ax.axis("off")
    top = max(volume.values()) if volume else 0
    for e in edges:
        if len(e) != 2:
            continue
        x, y = tuple(e)
        (x0, y0), (x1, y1) = positions[x], positions[y]
        width = 1 + 7 * (volume.get(e, 0) / top if top else 0)
        ax.plot([x0, x1], [y0, y1], color="#868e96", linewidth=width, zorder=1)
    # router names on their circles, then each link's figure where it
    # overlaps no name and no other figure (busiest links first)
    taken = []
    for n, (x, y) in positions.items():
        ax.scatter([x], [y], s=900, color="#1971c2" if n in traced else "#ced4da",
                   zorder=2, edgecolors="white")
        label = ax.text(x, y, figs.s(n), ha="center", va="center", fontsize=9, zorder=4,
                        bbox={"facecolor": "white", "edgecolor": "#adb5bd",
                              "boxstyle": "round,pad=0.25"})
        taken.append(_extent(fig, label))
    unlabelled = 0
    to_pixels = ax.transData.transform
    segments = {e: (to_pixels(positions[tuple(e)[0]]), to_pixels(positions[tuple(e)[1]]))
                for e in edges if len(e) == 2}
    for e, value in sorted(volume.items(), key=lambda kv: -kv[1]):
        if len(e) != 2 or not value:
            continue
        x, y = sorted(e)
        (x0, y0), (x1, y1) = positions[x], positions[y]
        for f in (0.5, 0.4, 0.6, 0.3, 0.7, 0.25, 0.75):
            text = ax.text(x0 + f * (x1 - x0), y0 + f * (y1 - y0), _bytes(value), fontsize=8,
                           ha="center", va="center", color="#343a40", zorder=3,
                           bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9})
            box = _extent(fig, text)
            # not over a name, another figure, or another link's line (a
            # figure at a crossing reads as either link's)
            crossed = any(_segment_hits_box(p, q, box) for other, (p, q) in segments.items()
                          if other != e)
            if not crossed and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                break
            text.remove()
        else:
            unlabelled += 1
    if unlabelled:
        ax.text(0, -0.02, f"{unlabelled} link figure(s) left out for lack of room: see the "
                f"links table", transform=ax.transAxes, fontsize=8, color="#868e96")
    ax.set_title("Federation links (line width: bytes forwarded, both directions)")
    figs.save(fig, "topology")
    busiest = max(volume.items(), key=lambda kv: kv[1]) if volume else None
    reading = (f"{len(traced)} router{'s' if len(traced) != 1 else ''} wrote traces; "
               f"{len(edges)} link{'s were' if len(edges) != 1 else ' was'} seen "
               f"(grey circles are peers without traces).")
    if busiest:
        x, y = sorted(busiest[0])
        reading += (f" The busiest link is {figs.s(x)} \u2013 {figs.s(y)}, "
                    f"with {_bytes(busiest[1])} of notifications in both directions.")
    return "topology", reading


def _shade_outages(ax, figs, router, peer):
    """The link's outages (either end's view) as red spans at their real times."""
    outages, _ = split_outages(figs.a)
    for r in outages:
        if {r["router"], r["peer"]} == {router, peer}:
            end = r["up_us"] if r.get("up_us") is not None else figs.a.end_us
            ax.axvspan(_when(r["down_us"]), _when(end), color="#e03131", alpha=0.18, lw=0)


def wire_traffic(a):
    """Per directed link (sender, receiver): what crossed it, from either end.

    ``sent``: the sender's notify_forwarded (None if the sender is not
    traced); ``received``: the receiver's in records, notify_received and
    notify_dropped_* (None if the receiver is not traced); ``notifications``
    and ``bytes``: the sender's figures where it is traced, else the
    receiver's (docs/traces.md: both describe the same wire traffic), and
    ``side``, which of the two they are. Every figure is a row of
    csv/links.csv: (sender, receiver, out) and (receiver, sender, in).
    ``unsent``: notifications lost still queued at the sender when the link
    went down, from its link_down records (``unsent_records``, csv/unsent.csv).
    """
    traced = {r["router"] for r in a.tables.get("overview", [])}
    out = {}
    for r in a.tables.get("links", []):
        key = ((r["router"], r["peer"]) if r["direction"] == "out"
               else (r["peer"], r["router"]))
        row = out.setdefault(key, {"sender": key[0], "receiver": key[1], "sent": None,
                                   "sent_bytes": None, "received": None,
                                   "received_bytes": None})
        if r["direction"] == "out":
            row["sent"], row["sent_bytes"] = r["notifications"] or 0, r["bytes"] or 0
        else:
            row["received"], row["received_bytes"] = r["notifications"] or 0, r["bytes"] or 0
    for r in a.tables.get("unsent", []):
        row = out.setdefault((r["router"], r["peer"]), {
            "sender": r["router"], "receiver": r["peer"], "sent": None, "sent_bytes": None,
            "received": None, "received_bytes": None})
        row["unsent"] = row.get("unsent", 0) + r["unsent"]
        row.setdefault("unsent_records", []).append(r)
    for (sender, receiver), row in out.items():
        row.setdefault("unsent", 0)
        row.setdefault("unsent_records", [])
        if row["sent"] is None and sender in traced:
            row["sent"], row["sent_bytes"] = 0, 0
        if row["received"] is None and receiver in traced:
            row["received"], row["received_bytes"] = 0, 0
        from_sender = row["sent"] is not None
        row["side"] = "sender" if from_sender else "receiver"
        row["notifications"] = row["sent"] if from_sender else row["received"]
        row["bytes"] = row["sent_bytes"] if from_sender else row["received_bytes"]
    return sorted(out.values(), key=lambda r: (-(r["notifications"] or 0),
                                               r["sender"], r["receiver"]))


def _unsent_records(rows, limit=3):
    """The link_down records that count unsent notifications, named."""
    named = [f"link_down at {tf.format_time(r['ts_us'])} ({r['reason']}): {_n(r['unsent'])}"
             for r in rows[:limit]]
    more = len(rows) - len(named)
    return "; ".join(named) + (f"; {more} more" if more > 0 else "")


def unsent_reading(figs):
    """Per directed link: notifications lost with it, still queued at the
    sender when the link went down (the sender's link_down ``unsent``)."""
    rows = [r for r in wire_traffic(figs.a) if r["unsent"]]
    if not rows:
        return ""
    parts = [f"{figs.s(r['sender'])} \u2192 {figs.s(r['receiver'])}: {_n(r['unsent'])} "
             f"({_unsent_records(r['unsent_records'])})" for r in rows]
    return (f"Lost with their link: {_n(sum(r['unsent'] for r in rows))} notifications "
            f"were traced notify_forwarded but still queued when the link went down, so "
            f"they were never written: " + "; ".join(parts)
            + " (the sender's link_down records, csv/unsent.csv).")


def unreceived_reading(figs):
    """Per link traced at both ends: notifications the sender forwarded
    that the receiver has no record of (sends with no receipt), and of
    those, how many the sender's link_down records count as never written."""
    a = figs.a
    parts = []
    for r in wire_traffic(a):
        if r["sent"] is None or r["received"] is None or r["sent"] <= r["received"]:
            continue
        missing = r["sent"] - r["received"]
        lost = min(r["unsent"], missing)
        why = (f"; {_n(lost)} of them were still queued at {figs.s(r['sender'])} when the "
               f"link went down ({_unsent_records(r['unsent_records'])}), "
               f"{_n(missing - lost)} are not accounted for by the traces"
               if lost else "; no link_down record of the sender counts any as unsent")
        parts.append(f"{figs.s(r['sender'])} \u2192 {figs.s(r['receiver'])}: "
                     f"{_n(missing)} of the {_n(r['sent'])} notifications "
                     f"{figs.s(r['sender'])} forwarded (notify_forwarded) have no record at "
                     f"{figs.s(r['receiver'])}, which recorded {_n(r['received'])} from it"
                     + why)
    if not parts:
        return ""
    return ("Sent but not received, on links traced at both ends: " + "; ".join(parts)
            + " (csv/links.csv: the sender's out row and the receiver's in row; "
            "csv/unsent.csv: the link_down records).")


def fig_link_traffic(figs):
    plt = _plt()
    a = figs.a
    series = a.series.get("link_traffic", [])
    links = a.tables.get("links", [])
    wire = [r for r in wire_traffic(a) if r["notifications"]]
    if not series and not wire:
        return "link_traffic", (_empty("link_traffic", figs, "no notification traffic crossed "
                                       "any link") and "No notification crossed any link.")
    if not series:
        top = wire[0]
        return "link_traffic", (_empty("link_traffic", figs, "no traced router forwarded "
                                       "a notification") and
                                f"No traced router forwarded a notification, but "
                                f"notifications crossed links toward traced routers: the "
                                f"busiest direction is {figs.s(top['sender'])} \u2192 "
                                f"{figs.s(top['receiver'])}, {_n(top['notifications'])} "
                                f"notifications ({_bytes(top['bytes'])}) recorded by "
                                f"{figs.s(top['receiver'])} (its in records, csv/links.csv).")
    per = {}
    for row in series:
        per.setdefault((row["router"], row["peer"]), []).append(row)
    # busiest first, as the links table orders them
    rank = {(r["router"], r["peer"]): i for i, r in
            enumerate(r for r in links if r["direction"] == "out")}
    per = dict(sorted(per.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))
    if len(per) <= 4:
        fig, ax = plt.subplots(figsize=(9, 4))
        for (router, peer), rows in per.items():
            xs, ys = _rate_points(a, rows, "notifications")
            _plot_counts(ax, a, xs, ys, label=f"{figs.s(router)} \u2192 {figs.s(peer)}",
                         linewidth=1.2)
            _shade_outages(ax, figs, router, peer)
        ax.set_ylabel(f"notifications {_per_bucket(a)}")
        ax.set_title(f"Notifications forwarded {_per_bucket(a)}, busiest links (red: link down)")
        ax.set_ylim(bottom=0)
        _legend_outside(ax)
        ax.grid(alpha=0.3)
        _time_axis(ax)
    else:
        # more lines than an eye can follow on one plot: a panel a link,
        # busiest first, each scaled to its own data (a shared scale clipped
        # or flattened some); the scale is on each panel's axis
        keys = list(per)
        nrows = (len(keys) + 1) // 2
        fig, axes = plt.subplots(nrows, 2, figsize=(9, 1.6 * nrows + 0.9), sharex=True,
                                 squeeze=False)
        flat = [x for row in axes for x in row]
        for i, ax in enumerate(flat):
            if i >= len(keys):
                ax.axis("off")
                continue
            router, peer = keys[i]
            xs, ys = _rate_points(a, per[keys[i]], "notifications")
            _plot_counts(ax, a, xs, ys, linewidth=1.2, color="#1971c2")
            _shade_outages(ax, figs, router, peer)
            ax.set_title(f"{i + 1}. {figs.s(router)} \u2192 {figs.s(peer)}", fontsize=9,
                         loc="left")
            ax.set_ylim(0, max(ys) * 1.08 if max(ys) else 1)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
            _time_axis(ax)
            if i < len(keys) - 2:
                ax.set_xlabel("")
        fig.suptitle(f"Notifications forwarded {_per_bucket(a)}, busiest links first "
                     f"(each panel on its own scale; red: link down)", fontsize=10)
        fig.tight_layout(rect=(0, 0.02, 1, 1))
    _partial_note(fig, a, len(xs))
    figs.save(fig, "link_traffic")
    out = [r for r in links if r["direction"] == "out"]
    reading = ""
    busiest = wire[0] if wire else None
    if busiest is not None and busiest["side"] == "receiver":
        reading = (f"The busiest direction is {figs.s(busiest['sender'])} \u2192 "
                   f"{figs.s(busiest['receiver'])}: {_n(busiest['notifications'])} "
                   f"notifications ({_bytes(busiest['bytes'])}) recorded by "
                   f"{figs.s(busiest['receiver'])} ({figs.s(busiest['sender'])} is not "
                   f"traced; its in records, csv/links.csv).")
    elif out:
        top = next(r for r in out if (r["router"], r["peer"])
                   == (busiest["sender"], busiest["receiver"])) if busiest else out[0]
        reading = (f"The busiest direction is {figs.s(top['router'])} \u2192 "
                   f"{figs.s(top['peer'])}: {_n(top['notifications'])} notifications "
                   f"({_bytes(top['bytes'])}), on average {top['mean_per_min'] or 0:.1f} a minute "
                   f"while the link was up, peaking at {_n(top['peak_per_min'])} in one minute "
                   f"and {_n(top['peak_per_s'])} in one second.")
        peaky = max(out, key=lambda r: (r["peak_per_min"] or 0) / max(r["mean_per_min"] or 1e-9, 1e-9))
        ratio = (peaky["peak_per_min"] or 0) / max(peaky["mean_per_min"] or 1e-9, 1e-9)
        if ratio >= 3:
            reading += (f" Traffic is bursty: {figs.s(peaky['router'])} \u2192 "
                        f"{figs.s(peaky['peer'])} peaked at {ratio:.0f}\u00d7 its mean rate.")
    if a.series["bucket_us"] > 60e6:
        reading += f" (Each point counts {a.series['bucket_us'] / 60e6:.0f} minutes.)"
    return "link_traffic", reading


def stopped_reading(figs):
    """Routers whose traces stop, well before the period ends, with links
    up and no link_down (as a killed router's do): their links' uptime
    ends at their last record (``link_uptime.traced_until_us``)."""
    a = figs.a
    data_end = max((r["last_us"] for r in a.tables.get("overview", [])), default=a.end_us)
    by_router = {}
    for r in a.tables.get("link_uptime", []):
        if r.get("traced_until_us") is not None:
            by_router.setdefault((r["router"], r["traced_until_us"]), []).append(r["peer"])
    parts = []
    for (router, last), peers in sorted(by_router.items()):
        parts.append(f"{figs.s(router)}'s records end at {tf.format_time(last)}, "
                     f"{_duration(data_end - last)} before the last record of the period, "
                     f"with its "
                     f"link{'s' if len(peers) > 1 else ''} to "
                     f"{', '.join(figs.s(p) for p in sorted(peers))} up and no link_down")
    if not parts:
        return ""
    return ("; ".join(parts) + ". A router that is killed writes no link_down, so the "
            "uptime of these links is counted only to the last record of the router "
            "that traced them (csv/link_uptime.csv, traced_until_us).")


def fig_uptime(figs):
    a = figs.a
    rows = a.tables.get("link_uptime", [])
    outages, _ = split_outages(a)
    down = {(r["router"], r["peer"]) for r in outages}
    flaky = [r for r in rows if (r["router"], r["peer"]) in down]
    if not rows:
        return None, ""
    stopped = stopped_reading(figs)
    if not flaky:
        return None, ("No link went down in the period, other than as a router's traces "
                      "ended." if any(r["downs"] for r in rows) or stopped else
                      "Every link stayed up for the whole period.") + (
                          " " + stopped if stopped else "")
    worst = min(flaky, key=lambda r: r["uptime_pct"] if r["uptime_pct"] is not None else 100)
    reasons = sorted({r.get("reason") for r in outages if r.get("reason")})
    return None, (f"{len(flaky)} of {len(rows)} link ends saw the link go down "
                  f"({len(outages)} times in all, not counting routers stopping; reasons: "
                  f"{', '.join(reasons) or 'not given'}). Lowest uptime: "
                  f"{figs.s(worst['router'])} \u2013 {figs.s(worst['peer'])}, "
                  f"{worst['uptime_pct'] or 0:.1f}% of the period."
                  + (" " + stopped if stopped else ""))


def fig_filter_effect(figs):
    plt = _plt()
    a = figs.a
    rows = sorted(a.tables.get("filter_effect", []), key=lambda r: r["considered"])[-16:]
    if not rows:
        return "filter_effect", (_empty("filter_effect", figs, "no notification was considered "
                                        "for any link") and "No notification was considered "
                                 "for forwarding on any link.")
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    labels = [f"{figs.s(r['router'])} \u2192 {figs.s(r['peer'])}" for r in rows]
    left = [0] * len(rows)
    for key, label in (("forwarded", "forwarded"), ("suppressed_filter", "stopped by pull filter"),
                       ("suppressed_export", "stopped by export filter"),
                       ("dropped_overload", "dropped: overload")):
        values = [r[key] or 0 for r in rows]
        ax.barh(labels, values, left=left, color=COLOURS[key], label=label)
        left = [x + v for x, v in zip(left, values)]
    ax.set_xlabel("notifications considered for the link")
    ax.set_title("What happened to the notifications each link could have carried")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    figs.save(fig, "filter_effect")
    every = a.tables["filter_effect"]
    considered = sum(r["considered"] for r in every)
    fwd = sum(r["forwarded"] for r in every)
    pull = sum(r["suppressed_filter"] for r in every)
    export = sum(r["suppressed_export"] for r in every)
    over = sum(r["dropped_overload"] for r in every)
    reading = (f"Of {_n(considered)} times a router had a notification it could send on a link, "
               f"it sent {_pct(fwd, considered):.0f}%. The pull filters (the far side did not ask "
               f"for it) stopped {_pct(pull, considered):.0f}%, the export filters (our policy "
               f"withheld what was asked for) {_pct(export, considered):.0f}%"
               + (f", and {_pct(over, considered):.1f}% was dropped because a send queue was full"
                  if over else "") + ".")
    return "filter_effect", reading


def fig_flood(figs):
    plt = _plt()
    a = figs.a
    rows = sorted(a.tables.get("flood", []), key=lambda r: r["flood_bytes"])[-16:]
    if not rows or not any(r["flood_bytes"] for r in rows):
        return "flood", (_empty("flood", figs, "no notification published at a traced router")
                         and "No notification was published at a traced router, so there is "
                         "no flood to compare with.")
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    labels = [f"{figs.s(r['router'])} \u2192 {figs.s(r['peer'])}" for r in rows]
    ys = range(len(rows))
    unit, scale = _byte_unit(max(r["flood_bytes"] for r in rows))
    ax.barh([y + 0.2 for y in ys], [r["flood_bytes"] / scale for r in rows], height=0.4,
            color="#ced4da", label="flood without filters")
    ax.barh([y - 0.2 for y in ys], [r["forwarded_bytes"] / scale for r in rows], height=0.4,
            color=COLOURS["forwarded"], label="actually forwarded")
    ax.set_yticks(list(ys))
    ax.set_yticklabels(labels)
    ax.set_xlabel(unit)
    ax.set_title("Bytes per link: flooding everything vs. what the filters let through")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    figs.save(fig, "flood")
    every = a.tables["flood"]
    # a flood follows a spanning tree: compare on its links, and say
    # separately what links that close cycles carried (a tree sends nothing there)
    tree = [r for r in every if r["flood_notifications"]]
    extra = [r for r in every if not r["flood_notifications"] and r["forwarded"]]
    flood_b = sum(r["flood_bytes"] for r in tree)
    fwd_b = sum(r["forwarded_bytes"] for r in tree)
    flood_n = sum(r["flood_notifications"] for r in tree)
    fwd_n = sum(r["forwarded"] for r in tree)
    reading = (f"Had every router sent every notification to every peer (a flood, which "
               f"follows a spanning tree of the links), the {len(tree)} link directions of the "
               f"tree would have carried {_n(flood_n)} notifications, {_bytes(flood_b)}. With the "
               f"filters they carried {_n(fwd_n)}, {_bytes(fwd_b)}")
    if fwd_b <= flood_b:
        reading += f": a saving of {_pct(flood_b - fwd_b, flood_b):.0f}% of the bytes."
    else:
        reading += (f": {_pct(fwd_b - flood_b, flood_b):.0f}% more than a flood, so "
                    f"notifications were sent more than once (see Loops and drops).")
    over = [r for r in tree if r["forwarded_bytes"] > r["flood_bytes"] > 0]
    if over:
        worst = max(over, key=lambda r: r["forwarded_bytes"] / r["flood_bytes"])
        reading += (f" On {len(over)} link direction(s) more was sent than a flood would send "
                    f"there (most: {figs.s(worst['router'])} \u2192 {figs.s(worst['peer'])}, "
                    f"{worst['forwarded_bytes'] / worst['flood_bytes']:.1f}\u00d7): their "
                    f"negative 'saved %' is real, not an error. A flood takes each origin's "
                    f"shortest tree; where links form a cycle, notifications travelled "
                    f"other ways, some more than once, so the totals are the fair comparison.")
    if extra:
        reading += (f" {len(extra)} more link direction(s) close a cycle: a flood sends "
                    f"nothing there, yet they carried {_n(sum(r['forwarded'] for r in extra))} "
                    f"notifications ({_bytes(sum(r['forwarded_bytes'] for r in extra))}), "
                    f"traffic a loop-free federation would not have.")
    return "flood", reading


DROP_WORDS = {"notify_dropped_loop": "loop drops",
              "notify_dropped_duplicate": "mesh duplicate drops",
              "notify_dropped_overload": "overload drops",
              "notify_dropped_import": "import-filter drops"}
DROP_LABELS = {"notify_dropped_loop": "loop (own domain in routing list)",
               "notify_dropped_duplicate": "mesh duplicate (came by another path)",
               "notify_dropped_import": "import filter"}
DROP_COLOURS = {"notify_dropped_loop": "#e03131", "notify_dropped_duplicate": "#7048e8",
                "notify_dropped_import": "#f59f00", "notify_dropped_overload": "#495057"}
# a link that goes down this close to the end of one of its routers'
# traces, and stays down, closed because the traces end (the router stopped)
END_GRACE_US = 60 * 10**6


def traces_end(a):
    """{router: its last record's time}."""
    last = {}
    for r in a.tables.get("overview", []):
        last[r["router"]] = max(last.get(r["router"], 0), r["last_us"] or 0)
    return last


def split_outages(a):
    """(outages, ends): the link_outages rows with a down time, apart from
    those that stayed down and began within END_GRACE_US of the end of the
    traces of either router of the link (a router stopping, not an outage)."""
    last = traces_end(a)
    outages, ends = [], []
    for r in a.tables.get("link_outages", []):
        if r.get("down_us") is None:
            continue
        stops = [last[x] for x in (r["router"], r["peer"]) if x in last]
        if r.get("up_us") is None and any(r["down_us"] >= t - END_GRACE_US for t in stops):
            ends.append(r)
        else:
            outages.append(r)
    return outages, ends


def fig_drops(figs):
    """Outages and drops as events on one time axis, each at its own resolution."""
    plt = _plt()
    import matplotlib.dates as mdates
    a = figs.a
    series = a.series.get("drops", [])
    totals = a.tables.get("drops", [])
    outages, ends = split_outages(a)
    fine = a.series.get("fine_us") or 10**6
    if not series and not outages and not ends:
        _empty("drops", figs, "no link went down and no notification was dropped")
        return "drops", ("No notification was dropped: no routing loop was stopped and no "
                         "send queue overflowed.")
    links = sorted({(r["router"], r["peer"]) for r in outages + ends})
    top_h = 0.35 * max(len(links), 1) + 0.8
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(9, top_h + 2.8), sharex=True,
                                   gridspec_kw={"height_ratios": [top_h, 2.6]})
    start, end = _when(a.start_us), _when(a.end_us)
    for i, (router, peer) in enumerate(links):
        for r in outages + ends:
            if (r["router"], r["peer"]) != (router, peer):
                continue
            ended = r in ends
            t0 = _when(r["down_us"])
            t1 = _when(r["up_us"]) if r.get("up_us") is not None else end
            colour = "#adb5bd" if ended else "#e03131"
            ax0.broken_barh([(mdates.date2num(t0), mdates.date2num(t1) - mdates.date2num(t0))],
                            (i - 0.3, 0.6), facecolors=colour, edgecolor=colour)
            # a tick at the down time: an outage of a second is seen too
            ax0.plot([t0], [i], marker="|", markersize=12, color=colour)
    ax0.set_yticks(range(len(links)))
    ax0.set_yticklabels([f"{figs.s(x)} \u2013 {figs.s(y)}" for x, y in links], fontsize=8)
    ax0.set_ylim(-0.7, max(len(links), 1) - 0.3)
    ax0.set_title("Link outages as seen from each end (red: down until up again; grey: "
                  "down as a router's traces end)" if links else "No link went down",
                  fontsize=9, loc="left")
    ax0.grid(axis="x", alpha=0.3)
    per = {}
    for row in series:
        per.setdefault((row["event"], row["direction"]), {})[row["t_us"]] = row["drops"]
    width = fine / 86400e6
    bottom = {}
    for (event, direction), counts in sorted(per.items()):
        ts = sorted(counts)
        label = DROP_LABELS.get(event, f"overload ({direction})")
        colour = DROP_COLOURS.get(event, "#495057") if direction == "in" or \
            event != "notify_dropped_overload" else "#868e96"
        xs = [mdates.date2num(_when(t)) for t in ts]
        base = [bottom.get(t, 0) for t in ts]
        ax1.bar(xs, [counts[t] for t in ts], width=width, bottom=base, align="edge",
                color=colour, edgecolor=colour, linewidth=0.8, label=label)
        for t in ts:
            bottom[t] = bottom.get(t, 0) + counts[t]
    step = _duration(fine) if fine >= 120e6 else f"{fine / 1e6:g} s"
    ax1.set_ylabel(f"drops per {step}")
    ax1.set_title(f"Notifications dropped, counted per {step}", fontsize=9, loc="left")
    ax1.set_xlim(start, end)
    ax1.set_ylim(bottom=0)
    if per:
        _legend_outside(ax1)
    else:
        ax1.set_yticks([])
        ax1.text(0.5, 0.5, "no notification was dropped", transform=ax1.transAxes,
                 ha="center", va="center", color="#555")
    ax1.grid(alpha=0.3)
    _time_axis(ax1)
    fig.tight_layout()
    figs.save(fig, "drops")
    parts = []
    for event, words in DROP_WORDS.items():
        rows = [r for r in totals if r["event"] == event]
        if rows:
            top = max(rows, key=lambda r: r["drops"])
            parts.append(f"{_n(sum(r['drops'] for r in rows))} {words} (most at "
                         f"{figs.s(top['router'])}, on the link with {figs.s(top['peer'])})")
    unsent = a.tables.get("unsent", [])
    if unsent:
        top = max(unsent, key=lambda r: r["unsent"])
        parts.append(f"{_n(sum(r['unsent'] for r in unsent))} notifications lost still "
                     f"queued when a link went down (most at {figs.s(top['router'])}, on the "
                     f"link with {figs.s(top['peer'])}: link_down at "
                     f"{tf.format_time(top['ts_us'])}, unsent {_n(top['unsent'])})")
    reading = ("There were " + "; ".join(parts) + ".") if parts else "No notification was dropped."
    if bottom:
        peak = max(bottom, key=lambda t: bottom[t])
        reading += (f" The most in one {step}: {_n(bottom[peak])}, from "
                    f"{tf.format_time(peak)}.")
    loops = [r for r in totals if r["event"] == "notify_dropped_loop"]
    if loops:
        n = sum(r["drops"] for r in loops)
        listed = sum(r.get("router_listed") or 0 for r in loops)
        if listed:
            senders = sorted({figs.s(r["peer"]) for r in loops if r.get("router_listed")})
            reading += (f" {_n(listed)} of the {_n(n)} loop drops carry the receiving router "
                        f"in their routing list: they came back to a router they had already "
                        f"passed, sent by {', '.join(senders)}, which forwarded them to a "
                        f"router already on the list (a router that checks the list does "
                        f"not). The routing lists stopped them, but the link carried them.")
        if listed < n:
            reading += (f" {_n(n - listed)} loop drop records do not have the receiving router "
                        f"in their routing list, so they are not loops: routers whose traces "
                        f"predate the separate mesh duplicate event wrote mesh duplicates "
                        f"this way.")
    dups = [r for r in totals if r["event"] == "notify_dropped_duplicate"]
    if dups:
        reading += (f" Mesh duplicate drops are notifications that reached a router by a "
                    f"second path while the mesh's tree was changing; no loop is implied "
                    f"({_n(sum(r['drops'] for r in dups))} records).")
    return "drops", reading


def fig_hops(figs):
    plt = _plt()
    rows = sorted(figs.a.tables.get("hops", []), key=lambda r: r["hops"])
    if not rows:
        return "hops", (_empty("hops", figs, "no notification was received from a peer")
                        and "No notification was received over a link.")
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar([str(r["hops"]) for r in rows], [r["deliveries"] for r in rows], color="#1971c2")
    ax.set_xlabel("links crossed to get there (hop count)")
    ax.set_ylabel("notifications received")
    ax.set_title("How far notifications travel")
    ax.grid(axis="y", alpha=0.3)
    figs.save(fig, "hops")
    total = sum(r["deliveries"] for r in rows)
    one = sum(r["deliveries"] for r in rows if r["hops"] == 1)
    far = max(rows, key=lambda r: r["hops"])
    mean = sum(r["hops"] * r["deliveries"] for r in rows) / total
    return "hops", (f"{_pct(one, total):.0f}% of the {_n(total)} notifications received over a "
                    f"link came straight from the router they were published at; on average "
                    f"they had crossed {mean:.2f} links, at most {far['hops']}.")


def fig_routes(figs):
    plt = _plt()
    rows = figs.a.tables.get("routes", [])[:12]
    if not rows:
        return "routes", ""
    rows = rows[::-1]
    labels = [" > ".join(figs.s(d) for d in r["route"].split(" > ")) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
    ax.barh(labels, [r["deliveries"] for r in rows], color="#5c940d")
    ax.set_xlabel("notifications delivered along the route")
    ax.set_title("Most frequent routes (origin > ... > receiving router)")
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    figs.save(fig, "routes")
    top = rows[-1]
    total = sum(r["deliveries"] for r in figs.a.tables["routes"])
    return "routes", (f"{len(figs.a.tables['routes'])} distinct routes were used. The most "
                      f"frequent, {labels[-1]}, carried {_pct(top['deliveries'], total):.0f}% "
                      f"of all deliveries between routers.")


def _corrected(r, key):
    """A route's latency with the clock offset that could be told removed."""
    value = r.get(key)
    if value is None:
        return None
    return value - (r.get("clock_correction_us") or 0)


# a route is "frequent" with at least this many timed deliveries
FREQUENT_MIN = 100


def _why_unbounded(figs, route):
    """Why a route's clocks could not be bounded, from the records: the first
    hop without a bound, and what its two directions show."""
    a = figs.a
    hops = {(r["sender"], r["receiver"]): r for r in a.tables.get("hop_latency", [])}
    carried = {(r["router"], r["peer"]): r["notifications"] for r in a.tables.get("links", [])
               if r["direction"] == "out"}
    names = route.split(" > ")
    for x, y in zip(names, names[1:]):
        there, back = hops.get((x, y)), hops.get((y, x))
        if there is not None and there.get("clock_offset_pm_us") is not None:
            continue
        link = f"{figs.s(x)} \u2192 {figs.s(y)}"
        n_back = carried.get((y, x), 0)
        if not n_back:
            return (f"{link} carried {_n(carried.get((x, y), 0))} notifications one way and "
                    f"none back (links table), so that hop's clock offset cannot be bounded")
        if back is None or not back.get("matched"):
            return (f"{figs.s(y)} sent {_n(n_back)} notifications back to {figs.s(x)}, but "
                    f"none of them was timed (no send and receipt paired), so that hop's "
                    f"clock offset cannot be bounded")
        if there is not None and there.get("delay_min_us") is not None and \
                back.get("delay_min_us") is not None:
            return (f"on {link} the fastest crossing there ({_ms(there['delay_min_us'])}) and "
                    f"back ({_ms(back['delay_min_us'])}) add up to less than zero, which only "
                    f"mispaired records can do, so no bound is claimed")
        return f"no crossing of {link} was timed"
    return "no hop's offset could be bounded"


def fig_latency(figs):
    plt = _plt()
    rows = [r for r in figs.a.tables.get("routes", []) if r.get("timed")][:12]
    if not rows:
        _empty("latency", figs, "no delivery could be matched to its publication")
        if not figs.a.tables.get("routes"):
            return "latency", ""
        return "latency", ("No delivery could be matched to its publication (the routers "
                           "where the notifications were published wrote no traces).")
    rows = rows[::-1]
    labels = [" > ".join(figs.s(d) for d in r["route"].split(" > ")) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
    ys = list(range(len(rows)))
    hidden = 0

    def ms(r, key):
        # (a log axis has no place for zero or less: counted, said below)
        value = _corrected(r, key)
        return value / 1000 if value is not None and value > 0 else None
    for key, colour, label in (("latency_p50_us", "#1971c2", "median"),
                               ("latency_p90_us", "#f59f00", "90th percentile"),
                               ("latency_p99_us", "#e03131", "99th percentile")):
        points = [(ms(r, key), y) for r, y in zip(rows, ys)]
        hidden += sum(1 for x, _ in points if x is None)
        ax.scatter([x for x, _ in points if x is not None],
                   [y for x, y in points if x is not None], color=colour, label=label,
                   zorder=2)
    for y, r in zip(ys, rows):
        lo, hi = ms(r, "latency_min_us"), ms(r, "latency_max_us")
        if lo is not None and hi is not None:
            ax.plot([lo, hi], [y, y], color="#ced4da", zorder=1)
    ax.set_xscale("log")
    import matplotlib.ticker as mticker
    plain = mticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    low, high = ax.get_xlim()
    if high / low < 30:
        # less than a decade or so: the in-between ticks need numbers too
        ax.xaxis.set_minor_formatter(plain)
        ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    corrected = [r for r in rows if r.get("clock_correction_us")]
    ax.set_xlabel("ms from publication to arrival, log scale (grey: fastest to slowest)"
                  + (f"; {hidden} value(s) of 0 or less not drawn" if hidden else ""))
    if corrected:
        ax.set_title(f"Latency per route ({len(corrected)} of {len(rows)} corrected for a clock "
                     f"offset the traces show; the rest raw clock differences)")
    else:
        ax.set_title("Latency per route: arrival minus publication, on two hosts' clocks "
                     "(no offset corrected)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3, which="both")
    figs.save(fig, "latency")
    every = [r for r in figs.a.tables.get("routes", []) if (r.get("timed") or 0) >= FREQUENT_MIN]
    if not every:
        reading = (f"No route had {FREQUENT_MIN} or more timed deliveries, so none is called "
                   f"frequent or slow here; the chart shows what was timed.")
    else:
        slow = max(every, key=lambda r: _corrected(r, "latency_p50_us"))
        name = " > ".join(figs.s(d) for d in slow["route"].split(" > "))
        reading = (f"The slowest of the {len(every)} routes with {FREQUENT_MIN} or more timed "
                   f"deliveries is {name} ({_n(slow['timed'])} timed): half arrived within "
                   f"{_ms(_corrected(slow, 'latency_p50_us'))}, 99% within "
                   f"{_ms(_corrected(slow, 'latency_p99_us'))}")
        if slow.get("clock_uncertainty_us") is not None:
            reading += (f", give or take {_ms(slow['clock_uncertainty_us'])} for the clocks "
                        f"of the hosts on it.")
        else:
            reading += (f". These are raw differences of two clocks: "
                        f"{_why_unbounded(figs, slow['route'])}.")
    if corrected:
        reading += (f" {len(corrected)} of the charted routes were corrected for a clock offset "
                    f"the traces show (see the per-link table).")
    negative = [r for r in figs.a.tables.get("routes", [])
                if r.get("timed") and (_corrected(r, "latency_min_us") or 0) < 0]
    if negative:
        worst = min(negative, key=lambda r: _corrected(r, "latency_min_us"))
        reading += (f" {len(negative)} route(s) have a fastest delivery below zero (lowest: "
                    f"{' > '.join(figs.s(d) for d in worst['route'].split(' > '))}, "
                    f"{_ms(_corrected(worst, 'latency_min_us'))}): their hosts' clocks "
                    f"differ by more than the traces could bound.")
    return "latency", reading


def latency_sample_reading(a):
    """Says when latencies are from a sample of the notifications, and which."""
    k = a.latency_sample
    if k == 1:
        return ""
    of = f" of the {_n(a.wire_records)} link crossings in the period" if a.wire_records else ""
    return (f"Latencies below are timed on 1 in {k} notifications{of}: those whose digest's "
            f"first 64 bits are a multiple of {k}, the same notifications on every router, "
            f"so both ends of each crossing are in the sample (\"matched\" and \"timed\" count "
            f"those). Hop counts, routes and every other figure count every record. "
            f"Run with --latency-sample 1 to time every notification.")


def duplicate_delivery_reading(figs):
    """Notifications a router received by more than one route, with an
    example per receiver (``duplicate_deliveries``)."""
    a = figs.a
    totals = a.tables.get("duplicate_delivery_totals", [])
    if not totals:
        return ""
    rows = a.tables.get("duplicate_deliveries", [])
    parts = []
    for t in sorted(totals, key=lambda r: (-r["extra"], r["router"])):
        example = next((r for r in rows if r["router"] == t["router"]), None)
        text = (f"at {figs.s(t['router'])}, {_n(t['notifications'])} "
                f"({_n(t['extra'])} extra)")
        if example is not None:
            digest = format(example["dkey"] & (2**64 - 1), "016x")
            text += (f", e.g. digest {digest}\u2026 from {figs.s(example['origin'])}, received "
                     f"by way of {example['route_a']} and of {example['route_b']} from "
                     f"{tf.format_time(example['first_us'], 'milliseconds')}")
        parts.append(text)
    n = sum(t["notifications"] for t in totals)
    extra = sum(t["extra"] for t in totals)
    return (f"Duplicate deliveries: {_n(n)} time(s) a router received one notification "
            f"(the same origin and digest) by more than one route, {_n(extra)} receipt(s) "
            f"more than one route would give: " + "; ".join(parts)
            + ". Each was received (notify_received), "
            "so delivered to the router's clients again. The routing list stops a "
            "notification only at a router already on it, so on a cycle of links it can "
            "arrive once per way round; routers in mesh mode drop such copies "
            "(notify_dropped_duplicate). Every such notification is in "
            "csv/duplicate_deliveries.csv (up to 5,000), the totals per router in "
            "csv/duplicate_delivery_totals.csv.")


def pairing_reading(figs):
    """How the sends and receipts were paired, and how many could not be, and why."""
    rows = figs.a.tables.get("hop_latency", [])
    if not rows:
        return ""
    matched = sum(r.get("matched") or 0 for r in rows)
    repeated = sum(r.get("repeated") or 0 for r in rows)
    no_send = sum(r.get("unpaired_no_send") or 0 for r in rows)
    unfit = sum(r.get("unpaired_repeated") or 0 for r in rows)
    text = f"{_n(matched)} link crossings were timed (a receipt paired with its send)."
    if repeated:
        text += (f" {_n(repeated)} of them were copies of identical notifications (the same "
                 f"digest and routing list on the same link), each paired with the last copy "
                 f"sent before it arrived, on the clocks as the unrepeated crossings show them.")
    if no_send or unfit:
        text += f" {_n(no_send + unfit)} receipts could not be paired:"
        if no_send:
            text += (f" {_n(no_send)} had no send record of theirs in the period (sent before "
                     f"it began, or by a router without traces)"
                     + (";" if unfit else "."))
        if unfit:
            text += (f" {_n(unfit)} were repeated copies with none sent before them.")
    return text


def hop_latency_reading(figs):
    rows = figs.a.tables.get("hop_latency", [])
    bounded = [r for r in rows if r.get("clock_offset_pm_us") is not None]
    if not bounded:
        return ("No link has timed crossings both ways, so the hosts' clock offsets cannot be "
                "bounded; every latency is a raw difference of two clocks.")
    told = [r for r in bounded if r.get("clock_offset_est_us") is not None]
    text = ("A crossing's delay is stamped on two clocks, so on a link with traffic both ways "
            "the fastest crossing each way bounds the offset between them (the network never "
            "takes negative time). ")
    if not told:
        widest = max(bounded, key=lambda r: r["clock_offset_pm_us"])
        return text + (f"On every such link the offset cannot be told apart from zero (the "
                       f"widest bound is ±{_ms(widest['clock_offset_pm_us'])}, "
                       f"{figs.s(widest['sender'])} – {figs.s(widest['receiver'])}), so none "
                       f"is stated and no latency is shifted.")
    worst = max(told, key=lambda r: abs(r["clock_offset_est_us"]))
    links = len({frozenset((r["sender"], r["receiver"])) for r in told})
    return text + (f"On {links} link{'s' if links != 1 else ''} it is clearly not zero; "
                   f"the largest: "
                   f"{figs.s(worst['receiver'])}'s clock is "
                   f"{_ms(abs(worst['clock_offset_est_us']))} ± "
                   f"{_ms(worst['clock_offset_pm_us'])} "
                   f"{'ahead of' if worst['clock_offset_est_us'] > 0 else 'behind'} "
                   f"{figs.s(worst['sender'])}'s (fastest crossings: "
                   f"{_ms(worst['delay_min_us'])} there, {_ms(worst['reverse_min_us'])} back). "
                   f"Route latencies above are corrected by it; NTP on both hosts would "
                   f"remove it.")


def fig_attr_sets(figs):
    plt = _plt()
    rows = figs.a.tables.get("attr_sets", [])[:12]
    if not rows:
        return "attr_sets", ""
    rows = rows[::-1]
    labels = [(r["attribute_names"][:60] + "\u2026") if len(r["attribute_names"]) > 61
              else r["attribute_names"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
    ys = list(range(len(rows)))
    ax.barh([y + 0.2 for y in ys], [r["published"] for r in rows], height=0.4,
            color="#1971c2", label="published (at traced routers, with a link up)")
    ax.barh([y - 0.2 for y in ys], [r["crossings"] for r in rows], height=0.4,
            color=COLOURS["forwarded"], label="link crossings")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_title("Most frequent kinds of notification (by attribute names)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    figs.save(fig, "attr_sets")
    every = figs.a.tables["attr_sets"]
    total = sum(r["published"] for r in every)
    top = rows[-1]
    reading = f"{len(every)} different sets of attribute names were seen."
    if total:
        reading += (f" The most common, {top['attribute_names']}, is "
                    f"{_pct(top['published'], total):.0f}% of the {_n(total)} notifications "
                    f"published at traced routers while they had a link up (a notification "
                    f"published with no link up is not traced, so it is not counted here).")
        spread = [r for r in every if r["published"]]
        widest = max(spread, key=lambda r: r["crossings"] / r["published"])
        reading += (f" The most widely spread is {widest['attribute_names']}: each crossed "
                    f"{widest['crossings'] / widest['published']:.1f} links on average.")
        same = [r for r in spread if r["distinct"] * 10 < r["published"]]
        if same:
            reading += (f" {same[0]['attribute_names']} repeats the same contents "
                        f"({_n(same[0]['distinct'])} distinct in {_n(same[0]['published'])}), "
                        f"like a heartbeat.")
    return "attr_sets", reading


def _duration(us):
    """A length of time in the unit that fits: 40 s, 12.5 minutes, 3.2 hours."""
    seconds = us / 1e6
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} minutes"
    return f"{seconds / 3600:.1f} hours"


def fig_filter_sizes(figs):
    plt = _plt()
    a = figs.a
    rows = a.series.get("filter_sizes", [])
    churn = a.tables.get("filter_churn", [])
    if not rows:
        _empty("filter_sizes", figs, "no FedSubReplace was traced")
        return "filter_sizes", "No pull filter (FedSubReplace) was sent in the period."
    per = {}
    for r in rows:
        per.setdefault((r["router"], r["peer"]), []).append(r)
    end = _when(a.end_us)
    # one small panel per link (shared time axis): eight lines on one plot
    # cannot be told apart
    keys = list(per)
    cols = 2 if len(keys) > 1 else 1
    nrows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(9, 1.6 * nrows + 0.9), sharex=True,
                             squeeze=False)
    for ax, (router, peer) in zip([x for row in axes for x in row], keys):
        items = per[(router, peer)]
        xs = [_when(r["ts_us"]) for r in items] + [end]
        ys = [r["filter_nodes"] for r in items] + [items[-1]["filter_nodes"]]
        ax.step(xs, ys, where="post", linewidth=1.4, color="#1971c2")
        ax.set_ylim(0, max(ys) * 1.15 + 1)
        ax.set_title(f"{figs.s(router)} asks {figs.s(peer)}", fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        _time_axis(ax)
    for i, ax in enumerate([x for row in axes for x in row]):
        if i >= len(keys):
            ax.axis("off")
        elif i < len(keys) - cols:
            ax.set_xlabel("")           # the bottom row says it
    fig.suptitle("Pull filters over time: size in SubAST nodes (what each router asks its peer "
                 "for)", fontsize=10)
    fig.tight_layout()
    figs.save(fig, "filter_sizes")
    sent = [r for r in churn if r["direction"] == "out"]
    if not sent:
        return "filter_sizes", ""
    busiest = max(sent, key=lambda r: r["replaces"])
    biggest = max(sent, key=lambda r: r["nodes_max"] or 0)
    refused = sum(r["refused"] for r in churn)
    on_up = busiest.get("on_link_up") or 0
    others = busiest["replaces"] - on_up
    length = a.end_us - a.start_us
    rate = (f"{busiest['replaces_per_hour']:.1f} an hour" if busiest.get("replaces_per_hour")
            is not None else f"in {_duration(length)}")
    text = (f"Routers sent {_n(sum(r['replaces'] for r in sent))} pull filters. "
            f"{figs.s(busiest['router'])} sent its filter to {figs.s(busiest['peer'])} most "
            f"often: {_n(busiest['replaces'])} times ({rate}); ")
    if on_up and others:
        text += (f"{_n(on_up)} when the link came up, {_n(others)} at other times (a change "
                 f"in what its side subscribes to; the trace does not say which). ")
    elif on_up:
        text += "every one when the link came up. "
    else:
        text += "none of them when the link came up (the trace does not say why). "
    text += (f"The largest filter, {_n(biggest['nodes_max'])} nodes, is the one "
             f"{figs.s(biggest['router'])} sends {figs.s(biggest['peer'])}."
             + (f" {refused} filters were refused." if refused else ""))
    return "filter_sizes", text


def summary(a):
    """The figures a later report compares itself with (``summary.json``)."""
    links = {}
    for r in wire_traffic(a):
        links[f"{r['sender']} > {r['receiver']}"] = {"notifications": r["notifications"],
                                                      "bytes": r["bytes"]}
    for r in a.tables.get("filter_effect", []):
        links.setdefault(f"{r['router']} > {r['peer']}", {})["forwarded_pct"] = r["forwarded_pct"]
    for r in a.tables.get("hop_latency", []):
        links.setdefault(f"{r['sender']} > {r['receiver']}", {})["delay_p50_us"] = r["delay_p50_us"]
    drops = {}
    for r in a.tables.get("drops", []):
        kind = r["event"].replace("notify_dropped_", "")
        drops[kind] = drops.get(kind, 0) + r["drops"]
    unsent = sum(r["unsent"] for r in a.tables.get("unsent", []))
    if unsent:
        drops["unsent"] = unsent
    return {"version": 1, "start_us": a.start_us, "end_us": a.end_us, "records": a.records,
            "bad_lines": a.bad_lines, "links": links, "drops": drops,
            "written": tf.format_time(a.end_us)}


def changes_since(a):
    """HTML: what changed against the previous report's summary, per hour."""
    before = getattr(a, "previous", None)
    if not before or not a.start_us:
        return ""
    now = summary(a)
    h_now = max((now["end_us"] - now["start_us"]) / 3.6e9, 1e-9)
    h_before = max((before["end_us"] - before["start_us"]) / 3.6e9, 1e-9)

    def rate(x, hours):
        return (x or 0) / hours
    items = [f"<li>Previous report: {html.escape(tf.format_time(before['start_us']))} to "
             f"{html.escape(tf.format_time(before['end_us']))} UTC. Figures below are per hour, "
             f"so periods of different length compare.</li>"]
    r0, r1 = rate(before["records"], h_before), rate(now["records"], h_now)
    items.append(f"<li>Trace records: {_n(round(r1))} an hour (was {_n(round(r0))}, "
                 f"{_change(r0, r1)}).</li>")
    new = sorted(set(now["links"]) - set(before["links"]))
    gone = sorted(set(before["links"]) - set(now["links"]))
    if new:
        items.append("<li>New link directions: " + ", ".join(html.escape(_short_link(k, a))
                                                             for k in new) + ".</li>")
    if gone:
        items.append("<li>No longer seen: " + ", ".join(html.escape(_short_link(k, a))
                                                        for k in gone) + ".</li>")
    for kind in sorted(set(now["drops"]) | set(before["drops"])):
        d0, d1 = rate(before["drops"].get(kind), h_before), rate(now["drops"].get(kind), h_now)
        if d0 or d1:
            items.append(f"<li>{kind} drops: {d1:,.1f} an hour (was {d0:,.1f}, "
                         f"{_change(d0, d1)}).</li>")
    rows = []
    for key in sorted(set(now["links"]) & set(before["links"])):
        x, y = before["links"][key], now["links"][key]
        n0, n1 = rate(x.get("notifications"), h_before), rate(y.get("notifications"), h_now)
        f0, f1 = x.get("forwarded_pct"), y.get("forwarded_pct")
        p0, p1 = x.get("delay_p50_us"), y.get("delay_p50_us")
        rows.append({"link": _short_link(key, a), "n0": n0, "n1": n1, "change": _change(n0, n1),
                     "score": abs(n1 - n0) / max(n0, 1),
                     "filter": "" if f0 is None or f1 is None else f"{f0:.0f}% → {f1:.0f}%",
                     "delay": "" if p0 is None or p1 is None else
                     f"{p0 / 1000:.2f} → {p1 / 1000:.2f}"})
    rows.sort(key=lambda r: -r["score"])
    table = ""
    if rows:
        table = ("<table><tr><th class=\"l\">link</th><th>notifications/h before</th>"
                 "<th>now</th><th>change</th><th>forwarded of considered</th>"
                 "<th>hop p50 ms</th></tr>"
                 + "".join(f'<tr><td class="l">{html.escape(r["link"])}</td><td>{r["n0"]:,.0f}'
                           f'</td><td>{r["n1"]:,.0f}</td><td>{r["change"]}</td>'
                           f'<td>{r["filter"]}</td><td>{r["delay"]}</td></tr>'
                           for r in rows[:15]) + "</table>")
    return "<ul>" + "".join(items) + "</ul>" + table


def _change(before, now):
    if not before:
        return "new" if now else "no change"
    pct = (now - before) * 100 / before
    return "no change" if abs(pct) < 0.5 else f"{pct:+.0f}%"


def _short_link(key, a):
    routers = sorted({r["router"] for r in a.tables.get("overview", [])}
                     | {p for k in [key] for p in k.split(" > ")})
    return " → ".join(_short(d, routers) for d in key.split(" > "))


def load_summary(out_dir):
    """The previous run's summary.json in ``out_dir``, or None."""
    import json
    path = os.path.join(out_dir, "summary.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if data.get("version") == 1 else None


def write_summary(a):
    import json
    path = os.path.join(a.out_dir, "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary(a), f, indent=1, sort_keys=True)
    return path


def filter_health_reading(figs):
    a = figs.a
    rows = a.tables.get("filter_health", [])
    if not rows:
        return ""
    stopped = [r for r in rows if r.get("stopped_since_us") is not None]
    if not stopped:
        never = [r for r in rows if not r["suppressed_filter"]]
        text = ("Every pull filter that stopped anything kept doing so until the end of the "
                "period.")
        if never:
            text += (f" {len(never)} link(s) stopped nothing at all: the far side asked for "
                     f"everything it was offered.")
        return text
    first = min(stopped, key=lambda r: r["stopped_since_us"])
    return (f"{len(stopped)} pull filter(s) stopped working. The first: {figs.s(first['router'])}"
            f" → {figs.s(first['peer'])} stopped nothing from {_when_text(first['stopped_since_us'])}"
            f" ({_duration(a.end_us - first['stopped_since_us'])} before the end), after stopping "
            f"{first['suppressed_pct']:.0f}% overall; {_n(first['considered_since'])} "
            f"notifications went through unfiltered since. A filter that lets everything "
            f"through usually means the peer asked for everything, or its filter grew past "
            f"the size limit and was generalised.")


def _when_text(ts_us):
    return tf.format_time(ts_us)


def outage_reading(figs):
    downs, ends = split_outages(figs.a)
    text = ""
    if not downs:
        text = "No link went down in the period."
    else:
        longest = max(downs, key=lambda r: r["seconds"] or 0)
        still = [r for r in downs if r.get("up_us") is None]
        text = (f"Links went down {len(downs)} time(s), seen from either end. The longest "
                f"outage: {figs.s(longest['router'])} – {figs.s(longest['peer'])} from "
                f"{_when_text(longest['down_us'])} for "
                f"{_duration(longest['seconds'] * 1e6)} "
                f"({longest.get('reason') or 'no reason given'})."
                + (f" {len(still)} were still down at the end." if still else ""))
    if ends:
        text += (f" {len(ends)} link end(s) closed within {END_GRACE_US // 10**6} s of the "
                 f"end of a router's traces and stayed closed (reasons: "
                 f"{', '.join(sorted({r.get('reason') or 'not given' for r in ends}))}): "
                 f"routers stopping, not counted as outages.")
    return text


# ---------------------------------------------------------------------------
# HTML

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1000px;margin:2em auto;
padding:0 1em;color:#212529;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:2em;border-bottom:2px solid #dee2e6;padding-bottom:.2em}
.meta{color:#495057}.reading{background:#f1f3f5;border-left:4px solid #1971c2;padding:.6em 1em;margin:.6em 0}
figure{margin:1em 0}img{max-width:100%;border:1px solid #e9ecef}figcaption{font-size:.85em;color:#6c757d}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0;width:100%}
th,td{border:1px solid #dee2e6;padding:.25em .5em;text-align:right}th{background:#f8f9fa}
td.l,th.l{text-align:left}.warn{background:#fff3bf;border-left:4px solid #f59f00;padding:.6em 1em}
nav a{margin-right:1em}code{background:#f1f3f5;padding:0 .2em}
"""


def _warn_box(headline, items, tail=""):
    """A warning box: a headline (HTML), a list of items (HTML), more after."""
    lis = "".join(f"<li>{item}</li>" for item in items)
    return f'<div class="warn"><b>{headline}</b><ul>{lis}</ul>{tail}</div>'


def _img(figs, name):
    path = figs.a.charts.get(name)
    if not path:
        return ""
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    rel = os.path.relpath(path, figs.a.out_dir)
    return (f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
            f'<figcaption><a href="{html.escape(rel)}">{html.escape(rel)}</a></figcaption></figure>')


def _table(rows, columns, figs, limit=15, csv_name=None):
    if not rows:
        return ""
    out = ["<table><tr>"]
    for key, title, _ in columns:
        out.append(f'<th class="{"l" if _ == "s" else ""}">{html.escape(title)}</th>')
    out.append("</tr>")
    for row in rows[:limit]:
        out.append("<tr>")
        for key, _, kind in columns:
            value = row.get(key)
            if kind == "s":
                text = figs.s(value) if key in ("router", "peer", "sender", "receiver") else \
                    ("" if value is None else str(value))
                out.append(f'<td class="l">{html.escape(text)}</td>')
            elif kind == "b":
                out.append(f"<td>{_bytes(value)}</td>")
            elif kind == "ms":
                out.append(f"<td>{'' if value is None else f'{value / 1000:.2f}'}</td>")
            elif kind == "f":
                out.append(f"<td>{'' if value is None else f'{value:,.1f}'}</td>")
            elif kind == "t":
                out.append(f"<td>{'' if value is None else html.escape(tf.format_time(value))}</td>")
            else:
                out.append(f"<td>{'' if value is None else _n(value)}</td>")
        out.append("</tr>")
    out.append("</table>")
    if csv_name:
        more = f" ({len(rows) - limit} more rows)" if len(rows) > limit else ""
        out.append(f'<p class="meta">All rows{more}: <a href="csv/{csv_name}.csv">csv/{csv_name}.csv</a>'
                   f' (and the Parquet table <code>{csv_name}</code>)</p>')
    return "".join(out)


def _section(title, anchor, body):
    return f'<h2 id="{anchor}">{html.escape(title)}</h2>{body}'


def _reading(text):
    return f'<p class="reading">{html.escape(text)}</p>' if text else ""


# The charts, in the order the report shows them, and those a second
# process draws meanwhile (about half the drawing time: matplotlib's layout
# of ticks and text is CPU-bound Python, and while the charts are drawn
# Spark's work is done and the other core idles).
CHARTS = ("topology", "link_traffic", "filter_effect", "flood", "drops", "hops", "routes",
          "latency", "attr_sets", "filter_sizes")
DRAWN_APART = ("link_traffic", "flood", "drops", "hops", "routes", "attr_sets")
_chart_worker = []


def _main_is_ours():
    """Is this process ``python -m spark_analysis`` (or spark-submit of its
    ``__main__.py``)? A process that multiprocessing starts imports the
    main module again; ours runs nothing on import, but a script that runs
    the analysis at import (no ``if __name__ == "__main__":``) would run
    it once more in the chart worker."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return spec.name == "spark_analysis.__main__"
    path = getattr(main, "__file__", None) or ""
    return os.path.abspath(path) == os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "__main__.py")


def start_chart_worker(any_main=False):
    """The process that draws some of the charts (started once per process,
    and early, so that it has imported matplotlib by the time it is asked).
    None on a single core, where no such process can be started, and
    unless this is the command line (``any_main``: the caller's main
    module runs nothing when imported)."""
    if _chart_worker:
        return _chart_worker[0]
    if not (any_main or _main_is_ours()):
        return None
    pool = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if (cores or 1) > 1:
        import concurrent.futures
        import multiprocessing
        try:
            # a fresh interpreter, not a fork of this one (with the JVM's
            # gateway threads and sockets)
            context = multiprocessing.get_context("forkserver")
            pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=context, initializer=_chart_worker_init, initargs=(os.getpid(),))
            pool.submit(int)
        except (ImportError, ValueError, OSError, RuntimeError):
            pool = None
    _chart_worker.append(pool)
    return pool


def _forget_chart_worker():
    if _chart_worker and _chart_worker[0] is not None:
        _chart_worker[0].shutdown(wait=False)
    _chart_worker.clear()


def _chart_worker_init(report_pid):
    # Ctrl-C in a terminal reaches the whole process group: the main
    # process stops (and with it this one), without a traceback from here
    import signal
    import threading
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(report_pid,), daemon=True).start()
    _plt()


def _exit_with(pid, every=1.0):
    """End this process once process ``pid`` has gone: a worker of a pool
    whose owner was killed (SIGKILL, out of memory) waits for work for
    ever otherwise, and keeps its forkserver alive too."""
    import time
    while True:
        time.sleep(every)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:
            pass


def _draw(figs, names):
    """[(chart, reading)] of the named charts, drawn here."""
    return [globals()["fig_" + name](figs) for name in names]


def _draw_apart(analysis, names):
    """In the chart worker: the named charts of (a copy of) ``analysis``,
    and the paths and label overlaps they recorded."""
    return _draw(_Figures(analysis), names), analysis.charts, analysis.chart_overlaps


def _draw_charts(figs):
    """{chart: reading} of every chart, some drawn by the chart worker."""
    import copy
    from concurrent.futures.process import BrokenProcessPool
    a = figs.a
    pool = start_chart_worker()
    apart = None
    if pool is not None:
        view = copy.copy(a)
        view.batch, view.cached, view.charts, view.chart_overlaps = None, [], {}, {}
        try:
            apart = pool.submit(_draw_apart, view, DRAWN_APART)
        except (BrokenProcessPool, RuntimeError):
            _forget_chart_worker()
            apart = None
    here = [name for name in CHARTS if apart is None or name not in DRAWN_APART]
    readings = dict(_draw(figs, here))
    if apart is not None:
        try:
            drawn, charts, overlaps = apart.result()
        except BrokenProcessPool:
            # the worker died (killed, out of memory): draw its charts here,
            # and start another next time
            _forget_chart_worker()
            drawn, charts, overlaps = _draw(figs, DRAWN_APART), {}, {}
        readings.update(drawn)
        a.charts.update(charts)
        a.chart_overlaps.update(overlaps)
    order = {name: i for i, name in enumerate(CHARTS)}
    a.charts = dict(sorted(a.charts.items(), key=lambda kv: order.get(kv[0], len(order))))
    return readings


def write_report(analysis):
    """Draw every chart and write ``report.html``; returns its path."""
    figs = _Figures(analysis)
    a = analysis
    readings = _draw_charts(figs)
    readings["uptime"] = fig_uptime(figs)[1]
    readings["hop_latency"] = hop_latency_reading(figs)
    readings["filter_health"] = filter_health_reading(figs)
    readings["outages"] = outage_reading(figs)

    routers = sorted({r["router"] for r in a.tables["overview"]})
    records_by_event = {}
    for r in a.tables["overview"]:
        records_by_event[r["event"]] = records_by_event.get(r["event"], 0) + r["records"]
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>Federation traffic report</title><style>{CSS}</style></head><body>",
             "<h1>Federation traffic report</h1>",
             f'<p class="meta">{html.escape(tf.format_time(a.start_us))} to '
             f'{html.escape(tf.format_time(a.end_us))} UTC '
             f'({(a.end_us - a.start_us) / 6e7:.1f} minutes) \u00b7 {len(routers)} routers traced '
             f'\u00b7 {_n(a.records)} trace records from {len(a.files)} files under '
             f'<code>{html.escape(str(a.trace_dir))}</code></p>',
             '<nav>' + ('<a href="#changes">Changes</a>' if changes_since(a) else '')
             + '<a href="#links">Links</a><a href="#filters">Filters</a>'
             '<a href="#drops">Loops and drops</a><a href="#paths">Paths</a>'
             '<a href="#interest">Interest</a><a href="#data">Data</a></nav>']
    if a.aside:
        items = "".join(
            f"<li>{html.escape(_display(f))}" + (f" line {n}" if n is not None else "")
            + f": dated {html.escape(tf.format_time(ts))}</li>"
            for f, n, ts in a.aside_examples[:20])
        parts.append(f'<div class="warn"><b>{_n(a.aside)} trace records were set aside: each '
                     f'is dated far from the rest of its file (more than an hour, or more '
                     f'than the file\'s own span, beyond its 1st to 99th percentile record), '
                     f'a clock that jumped or a damaged line.</b> They are kept in the table '
                     f'(<code>status=aside</code>) but not analysed, and the period above is '
                     f'that of the records kept.<ul>{items}</ul>Per file: '
                     f'<a href="csv/files.csv">csv/files.csv</a></div>')
    unreadable = getattr(a, "unreadable", [])
    if unreadable:
        parts.append(_warn_box(f"{len(unreadable)} trace files could not be read and were "
                               f"skipped.", [f"{html.escape(_display(f))}: {html.escape(r)}"
                                             for f, r in unreadable]))
    skewed = getattr(a, "skewed", [])
    if skewed:
        parts.append(_warn_box(
            f"{len(skewed)} routers' records lie far from the other routers' (more than an "
            f"hour apart, or the others' span if longer), as from a clock set wrong: the "
            f"period above is that of the other routers, and their records outside it are "
            f"not analysed.",
            [f"{html.escape(r.router)}: its records' bulk "
             f"{html.escape(tf.format_time(r.bulk_first_us))} to "
             f"{html.escape(tf.format_time(r.bulk_last_us))}; {_n(r.outside)} records from "
             f"{html.escape(tf.format_time(r.first_us))} to "
             f"{html.escape(tf.format_time(r.last_us))} left out" for r in skewed]))
    copies = getattr(a, "copies", [])
    if copies:
        parts.append(_warn_box(
            f"{len(copies)} trace files were copies of others (the same traces collected "
            f"twice) and were not read, so no record is counted twice.",
            [f"{html.escape(_display(f))}: {html.escape(how)} of {html.escape(_display(kept))}"
             for f, kept, how in copies[:20]],
            'All: <a href="csv/files.csv">csv/files.csv</a>'))
    if a.bad_lines:
        items = "".join(f"<li>{html.escape(_display(f))} line {n}: {html.escape(r)}</li>"
                        for f, n, r, _ in a.bad_examples[:20])
        from spark_analysis.store import BAD_LINES_LISTED
        named = len(a.bad_examples)
        parts.append(f'<div class="warn"><b>{_n(a.bad_lines)} bad trace lines were skipped.</b>'
                     f'<ul>{items}</ul>'
                     + ("All" if named == a.bad_lines else
                        f"{_n(named)} named (up to {_n(BAD_LINES_LISTED)} a file)")
                     + f': <a href="csv/bad_lines.csv">csv/bad_lines.csv</a>; '
                     f'each file\'s total: <a href="csv/files.csv">csv/files.csv</a></div>')
    changes = changes_since(a)
    if changes:
        parts.append(_section("Since the previous report", "changes", changes))
    parts.append(_img(figs, "topology") + _reading(readings["topology"]))
    parts.append(_table([{"router": r, **{e: sum(x["records"] for x in a.tables["overview"]
                                                if x["router"] == r and x["event"] == e)
                                          for e in tf.EVENTS}} for r in routers],
                        [("router", "router", "s")] + [(e, e.replace("notify_", "").replace("_", " "), "n")
                                                      for e in tf.EVENTS if records_by_event.get(e)],
                        figs, limit=50, csv_name="overview"))

    parts.append(_section("Links: what each link carries", "links",
                          _img(figs, "link_traffic") + _reading(readings["link_traffic"])
                          + _reading(unreceived_reading(figs))
                          + _reading(readings["uptime"])
                          + _reading(readings["outages"])
                          + _table([r for r in a.tables.get("link_outages", [])], [
                              ("router", "router", "s"), ("peer", "peer", "s"),
                              ("down_us", "down at (UTC)", "t"), ("up_us", "up again at", "t"),
                              ("seconds", "seconds", "f"), ("reason", "reason", "s")],
                              figs, 20, "link_outages")
                          + _table(a.tables["links"], [
                              ("router", "router", "s"), ("peer", "peer", "s"),
                              ("direction", "dir", "s"), ("notifications", "notifications", "n"),
                              ("bytes", "bytes", "b"), ("peak_per_s", "peak/s", "n"),
                              ("peak_per_min", "peak/min", "n"), ("mean_per_min", "mean/min", "f"),
                              ("mean_bytes_per_s", "mean B/s", "f"), ("uptime_pct", "uptime %", "f"),
                              ("downs", "downs", "n")], figs, 20, "links")))
    parts.append(_section("Filters: what the pull and export filters save", "filters",
                          _img(figs, "filter_effect") + _reading(readings["filter_effect"])
                          + _table(a.tables.get("filter_effect", []), [
                              ("router", "router", "s"), ("peer", "peer", "s"),
                              ("considered", "considered", "n"),
                              ("forwarded_pct", "forwarded %", "f"),
                              ("suppressed_filter_pct", "pull filter %", "f"),
                              ("suppressed_export_pct", "export filter %", "f"),
                              ("dropped_overload_pct", "overload %", "f"),
                              ("forwarded_bytes", "forwarded bytes", "b")],
                              figs, 20, "filter_effect")
                          + _reading(readings["filter_health"])
                          + _table([r for r in a.tables.get("filter_health", [])
                                    if r.get("stopped_since_us") is not None], [
                              ("router", "router", "s"), ("peer", "peer", "s"),
                              ("suppressed_pct", "stopped % overall", "f"),
                              ("stopped_since_us", "stopped nothing since", "t"),
                              ("considered_since", "let through since", "n")],
                              figs, 20, "filter_health")
                          + _img(figs, "flood") + _reading(readings["flood"])
                          + _table(a.tables["flood"], [
                              ("router", "router", "s"), ("peer", "peer", "s"),
                              ("flood_notifications", "flood notifications", "n"),
                              ("forwarded", "forwarded", "n"), ("flood_bytes", "flood bytes", "b"),
                              ("forwarded_bytes", "forwarded bytes", "b"),
                              ("saved_pct", "saved %", "f")], figs, 20, "flood")
                          + '<p class="meta">The flood assumes every link seen in the period '
                            'was up, and covers notifications published at traced routers.</p>'))
    parts.append(_section("Loops and drops", "drops",
                          _img(figs, "drops") + _reading(readings["drops"])
                          + _table(a.tables["drops"], [
                              ("router", "router", "s"), ("peer", "peer", "s"),
                              ("direction", "dir", "s"), ("event", "event", "s"),
                              ("drops", "drops", "n"), ("bytes", "bytes", "b")],
                              figs, 20, "drops")
                          + _reading(unsent_reading(figs))
                          + _table(a.tables.get("unsent", []), [
                              ("router", "router", "s"), ("peer", "peer", "s"),
                              ("ts_us", "link_down at", "t"), ("reason", "reason", "s"),
                              ("unsent", "unsent", "n")], figs, 20, "unsent")))
    parts.append(_section("Paths: how far and how fast", "paths",
                          _img(figs, "hops") + _reading(readings["hops"])
                          + _img(figs, "routes") + _reading(readings["routes"])
                          + _reading(latency_sample_reading(a))
                          + _img(figs, "latency") + _reading(readings["latency"])
                          + _reading(readings["hop_latency"])
                          + _reading(pairing_reading(figs))
                          + _reading(duplicate_delivery_reading(figs))
                          + _table(a.tables["hop_latency"], [
                              ("sender", "from", "s"), ("receiver", "to", "s"),
                              ("matched", "matched", "n"), ("delay_p50_us", "p50 ms", "ms"),
                              ("delay_p90_us", "p90 ms", "ms"), ("delay_p99_us", "p99 ms", "ms"),
                              ("delay_min_us", "min ms", "ms"),
                              ("clock_offset_low_us", "offset ≥ ms", "ms"),
                              ("clock_offset_high_us", "offset ≤ ms", "ms"),
                              ("clock_offset_est_us", "offset told ms", "ms"),
                              ("one_way_est_us", "one-way est. ms", "ms")],
                              figs, 30, "hop_latency")
                          + '<p class="meta">Clock offset: the receiver\'s clock minus the '
                            'sender\'s lies between "offset ≥" and "offset ≤" (the fastest '
                            'crossing each way); "offset told" is given only when that range '
                            'excludes zero.</p>'))
    parts.append(_section("Interest: what is published and asked for", "interest",
                          _img(figs, "attr_sets") + _reading(readings["attr_sets"])
                          + _img(figs, "filter_sizes") + _reading(readings["filter_sizes"])
                          + _table(a.tables["filter_churn"], [
                              ("router", "router", "s"), ("peer", "peer", "s"),
                              ("direction", "dir", "s"), ("replaces", "replaces", "n"),
                              ("replaces_per_hour", "per hour", "f"),
                              ("nodes_mean", "mean nodes", "f"), ("nodes_max", "max nodes", "n"),
                              ("nodes_last", "last nodes", "n"), ("bytes_last", "last bytes", "b")],
                              figs, 20, "filter_churn")))
    tables = a.table_names()
    where = os.path.relpath(a.tables_dir, a.out_dir) if "://" not in a.tables_dir and \
        not a.tables_dir.startswith("file:") else a.tables_dir
    csvs = sorted(f for f in os.listdir(os.path.join(a.out_dir, "csv")) if f.endswith(".csv"))
    parts.append(_section("Data", "data",
                          "<p>CSV summaries: " + ", ".join(
                              f'<a href="csv/{c}">{c}</a>' for c in csvs)
                          + f"</p><p>Parquet tables under <code>{html.escape(where)}/</code>: "
                          + ", ".join(f"<code>{t}</code>" for t in tables)
                          + " (<code>events</code> holds every record read so far, "
                            "partitioned by <code>status=ok|bad</code>, <code>day</code> and "
                            "<code>router</code>; a later run adds only what is new).</p>"
                          + "<p class=\"meta\">Stage times: " + ", ".join(
                              f"{k} {v:.1f} s" for k, v in a.stage_seconds.items()) + "</p>"))
    parts.append("</body></html>")
    path = os.path.join(a.out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path


def _display(path):
    from spark_analysis.ingest import display_path
    return display_path(path)
