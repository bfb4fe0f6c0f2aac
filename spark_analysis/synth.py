"""Synthetic federation traces: ``python -m spark_analysis.synth``.

    python -m spark_analysis.synth --out DIR --routers N --clients M \\
        --rate R --seconds S [--seed SEED] [--extra-links K] [--start ISO]

Simulates N routers linked in a random tree (child dials parent), M
clients attached to random routers, and R notifications per second
published by those clients for S seconds, and writes the trace files each
router would write (docs/traces.md), rotated by size and time. It is a
model, not a router, but it keeps the format's invariants:

* each notification has one digest (the real recipe over its attributes)
  on every router it reaches, and its routing list grows by one domain per
  hop (origin first); sizes are real FedNotify encodings (empty keys);
* pull filters are what the far side's clients want (interest propagated
  across the tree): a router considers every link whose peer is not in
  the routing list and writes exactly one of forwarded / suppressed by
  pull filter / suppressed by export filter / dropped (overload);
* pull filters change as clients change subscriptions (FedSubReplace
  sent and received, after a debounce and the link's latency), and are
  generalised to "any notification of this kind" when they grow large, so
  some traffic crosses links only to be suppressed further on;
* some links have an export filter that keeps one kind of notification
  inside; a burst of traffic overloads the busiest links (overload drops);
  a link goes down for a while and comes back; every host's clock is off by
  a few milliseconds and every link has its own latency;
* ``--extra-links K`` adds K links that close cycles; the routers at their
  ends behave like a broken implementation that only avoids sending a
  notification back where it came from, so the next router drops it as a
  loop (notify_dropped_loop) -- what the analysis's loop chart is for.

A ``topology.json`` written next to the traces records the ground truth
(links, latencies, clock offsets); the analysis does not read it.
"""

import argparse
import gzip
import hashlib
import heapq
import json
import math
import os
import random
import sys
import time

from elvin.values import Int64
from spark_analysis import traceformat as tf

__all__ = ["generate", "main"]

PLACES = ["syd", "mel", "bne", "per", "adl", "hba", "drw", "cbr", "akl", "wlg",
          "sin", "hkg", "nrt", "lhr", "fra", "ams", "jfk", "sfo", "ord", "gru"]
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
         "ivan", "judy", "mallory", "niaj", "olivia", "peggy", "rupert", "sybil"]
GROUPS = ["elvin", "chat", "builds", "lunch", "ops", "security", "music", "dev"]
WORDS = ["hello", "deploy", "done", "coffee", "anyone", "release", "broken", "fixed",
         "meeting", "now", "later", "lunch", "build", "green", "red", "ok", "why"]
SYMBOLS = ["ACME", "INITECH", "GLOBEX", "HOOLI", "UMBRELLA", "STARK", "WAYNE", "TYRELL"]
EXCHANGES = ["ASX", "NYSE", "LSE"]
PROJECTS = ["elvin", "avis", "ticker", "sitter", "mantara"]
SITES = ["lab", "roof", "basement", "dc1", "dc2", "office"]
SEVERITIES = ["debug", "info", "warning", "error", "critical"]
SERVICES = ["db", "web", "mail", "dns", "ldap", "backup"]

# kind -> (producer weight, selector attribute or None)
KINDS = {
    "tickertape": (0.30, "Group"),
    "quote": (0.30, "Symbol"),
    "sensor": (0.18, "Site"),
    "build": (0.10, "Project"),
    "alert": (0.06, "Severity"),
    "heartbeat": (0.06, None),
}
SELECTOR_VALUES = {"Group": GROUPS, "Symbol": SYMBOLS, "Site": SITES,
                   "Project": PROJECTS, "Severity": ["error", "critical"]}

PROCESSING_US = 40          # per candidate link, on the sending router
DEBOUNCE_US = 50_000        # FedSubReplace debounce
GENERALISE_NODES = 150      # pull filters above this are generalised


class _Notification:
    __slots__ = ("kind", "attrs", "digest", "names", "base", "selector")


def _make_notification(rng, kind, producer, seq):
    if kind == "tickertape":
        group = producer["group"]
        attrs = {"Group": group, "From": producer["user"],
                 "Message": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))),
                 "Message-Id": f"{producer['id']:04x}-{seq:08x}", "Timeout": 10}
        selector = group
    elif kind == "quote":
        symbol = rng.choice(producer["symbols"])
        attrs = {"Exchange": producer["exchange"], "Symbol": symbol,
                 "Price": round(rng.uniform(5, 500), 2),
                 "Volume": Int64(rng.randint(100, 10**6)),
                 "Seq": seq}
        selector = symbol
    elif kind == "sensor":
        attrs = {"Site": producer["site"], "Sensor": f"{producer['site']}-{producer['id'] % 7}",
                 "Temperature": round(rng.gauss(21, 4), 2),
                 "Humidity": round(rng.uniform(20, 80), 1), "Seq": seq}
        selector = producer["site"]
    elif kind == "build":
        attrs = {"Project": producer["project"], "Build": seq,
                 "Status": rng.choice(["passed", "passed", "passed", "failed"]),
                 "Host": f"build{producer['id'] % 4}.example.net",
                 "Duration": round(rng.expovariate(1 / 90), 1)}
        selector = producer["project"]
    elif kind == "alert":
        severity = rng.choices(SEVERITIES, weights=[30, 30, 20, 15, 5])[0]
        attrs = {"Severity": severity, "Service": rng.choice(SERVICES),
                 "Host": f"{rng.choice(SERVICES)}{rng.randint(1, 9)}.example.net",
                 "Text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))}
        selector = severity
    else:  # heartbeat: the same attributes every time (same digest)
        attrs = {"Heartbeat": 1, "Service": producer["service"]}
        selector = None
    n = _Notification()
    n.kind = kind
    n.attrs = attrs
    canonical = tf.canonical_attributes(attrs)
    n.digest = hashlib.sha1(canonical).hexdigest()
    n.names = sorted(attrs, key=lambda a: a.encode("utf-8"))
    # pkt_id + attributes + deliver_insecure + empty keys + routing count
    n.base = 4 + len(canonical) + 4 + 4 + 4
    n.selector = selector
    return n


def _filter_size(interests, generalised):
    """(nodes, bytes) of a pull filter SubAST for a set of interests."""
    if not interests:
        return 0, 4                               # the empty SubAST
    nodes = nbytes = 0
    for kind, value in interests:
        if generalised or value is None:
            nodes += 2                            # require(Name)
            nbytes += 12 + 8 + 12
        else:
            nodes += 3 + 3                        # require(Kind) && Sel == "v"
            nbytes += 12 + 20 + 12 + 20 + 8 + 12 + len(value) + 8
    nodes += len(interests) - 1                   # the ORs joining them
    nbytes += 12 * (len(interests) - 1)
    return nodes, nbytes


class _Filter:
    """A pull filter: set of (kind, value or None), possibly generalised."""

    __slots__ = ("interests", "kinds", "generalised", "nodes", "nbytes")

    def __init__(self, interests):
        self.interests = frozenset(interests)
        nodes, _ = _filter_size(self.interests, False)
        self.generalised = nodes > GENERALISE_NODES
        if self.generalised:
            self.interests = frozenset((k, None) for k, _ in self.interests)
        self.kinds = {k for k, v in self.interests if v is None}
        self.nodes, self.nbytes = _filter_size(self.interests, self.generalised)

    def matches(self, n):
        return n.kind in self.kinds or (n.kind, n.selector) in self.interests

    def __eq__(self, other):
        return isinstance(other, _Filter) and self.interests == other.interests

    def __hash__(self):
        return hash(self.interests)


class _Writer:
    """Per-router trace files, rotated by size and (simulated) time."""

    def __init__(self, out, domain, rotate_bytes, rotate_us, use_gzip):
        self.out, self.domain = out, domain
        self.rotate_bytes, self.rotate_us, self.gzip = rotate_bytes, rotate_us, use_gzip
        self.file = None
        self.seq = 0
        self.files = []
        self.records = 0

    def _open(self, ts_us):
        self.close()
        self.seq += 1
        name = tf.trace_file_name(self.domain, ts_us, self.seq)
        path = os.path.join(self.out, name)
        self.files.append(name)
        self.file = open(path, "w", encoding="utf-8", newline="\n")
        self.opened, self.written = ts_us, 0

    def write(self, ts_us, line):
        if (self.file is None or self.written >= self.rotate_bytes
                or ts_us - self.opened >= self.rotate_us):
            self._open(ts_us)
        self.file.write(line)
        self.file.write("\n")
        self.written += len(line) + 1
        self.records += 1

    def close(self):
        if self.file is not None:
            self.file.close()
            if self.gzip:
                path = self.file.name
                with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
                    dst.write(src.read())
                os.remove(path)
                self.files[-1] += ".gz"
            self.file = None


def generate(out, routers=5, clients=20, rate=50.0, seconds=60.0, seed=1,
             extra_links=0, start_us=None, rotate_bytes=64 << 20, rotate_seconds=3600,
             use_gzip=False, flap=None, burst=None, churn_per_client_s=1 / 120):
    """Write a simulated federation's traces into ``out``; returns a stats dict.

    ``flap`` and ``burst`` default to "yes if the run is long enough"
    (at least 60 s and 30 s respectively).
    """
    if routers < 1 or clients < 1 or rate <= 0 or seconds <= 0:
        raise ValueError("routers and clients must be >= 1, rate and seconds > 0")
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    if start_us is None:
        start_us = 1714564800 * 10**6               # 2024-05-01T12:00:00Z
    end_us = start_us + int(seconds * 1e6)

    # -- routers and links -------------------------------------------------
    names = []
    for i in range(routers):
        place = PLACES[i % len(PLACES)] + (str(i // len(PLACES)) if i >= len(PLACES) else "")
        names.append(f"{place}.elvin.example.net")
    degree = [0] * routers
    edges = []                                    # (child, parent): child dialled
    for i in range(1, routers):
        parent = rng.choices(range(i), weights=[d + 1 for d in degree[:i]])[0]
        edges.append((i, parent))
        degree[i] += 1
        degree[parent] += 1
    legacy = set()
    existing = {frozenset(e) for e in edges}
    for _ in range(extra_links):
        candidates = [(a, b) for a in range(routers) for b in range(a)
                      if frozenset((a, b)) not in existing]
        if not candidates:
            break
        a, b = rng.choice(candidates)
        edges.append((a, b))
        existing.add(frozenset((a, b)))
        legacy.update((a, b))
    neighbours = {i: [] for i in range(routers)}
    latency = {}
    for a, b in edges:
        neighbours[a].append(b)
        neighbours[b].append(a)
        base = math.exp(rng.uniform(math.log(200), math.log(30_000)))   # 0.2 .. 30 ms
        latency[(a, b)] = latency[(b, a)] = base
    offset = [0.0] + [rng.gauss(0, 2000) for _ in range(routers - 1)]   # clock skew, us
    capacity = max(20, int(1.5 * rate))          # notifications/s per link before overload

    # -- clients -----------------------------------------------------------
    kinds = list(KINDS)
    weights = [KINDS[k][0] for k in kinds]
    producers = []
    interests = {i: {} for i in range(routers)}   # router -> {client: set(interest)}
    consumers = []
    for c in range(clients):
        home = rng.randrange(routers)
        roll = rng.random()
        producer = roll < 0.6
        consumer = roll >= 0.3
        if producer:
            producers.append({
                "id": c, "home": home, "kind": rng.choices(kinds, weights)[0],
                "user": rng.choice(USERS), "group": rng.choice(GROUPS),
                "symbols": rng.sample(SYMBOLS, 3), "exchange": rng.choice(EXCHANGES),
                "site": rng.choice(SITES), "project": rng.choice(PROJECTS),
                "service": rng.choice(SERVICES), "seq": 0})
        if consumer:
            consumers.append((c, home))
            interests[home][c] = {_random_interest(rng) for _ in range(rng.randint(1, 3))}
    if not producers:
        producers.append({"id": 0, "home": 0, "kind": "heartbeat", "service": "db", "seq": 0,
                          "user": "alice", "group": "chat", "symbols": SYMBOLS[:3],
                          "exchange": "ASX", "site": "lab", "project": "elvin"})
    pweights = [1.0 + rng.random() for _ in producers]
    # export filters: about a third of the directed links keep one kind of
    # notification produced on their side (not heartbeats) inside
    export_block = {}
    for a, b in edges:
        for x, y in ((a, b), (b, a)):
            side = _reachable(x, y, neighbours)
            produced = sorted({p["kind"] for p in producers
                               if p["home"] in side and p["kind"] != "heartbeat"})
            if produced and rng.random() < 0.35:
                export_block[(x, y)] = rng.choice(produced)

    # -- output --------------------------------------------------------------
    writers = [_Writer(out, names[i], rotate_bytes, int(rotate_seconds * 1e6), use_gzip)
               for i in range(routers)]
    pending = [[] for _ in range(routers)]      # heaps of (ts_us, n, line)
    counter = [0]
    counts = {}

    def emit(router, true_us, peer, event, direction, **fields):
        ts = int(true_us + offset[router])
        line = tf.format_record(ts, names[router], None if peer is None else names[peer],
                                event, direction, **fields)
        counter[0] += 1
        heapq.heappush(pending[router], (ts, counter[0], line))
        counts[event] = counts.get(event, 0) + 1

    def flush(before_true_us):
        for r in range(routers):
            heap = pending[r]
            limit = before_true_us + offset[r]
            while heap and heap[0][0] < limit:
                ts, _, line = heapq.heappop(heap)
                writers[r].write(ts, line)

    # -- filters -------------------------------------------------------------
    up = {}                                        # (x, y) directed -> bool
    pull = {}                                      # (x, y): y's filter for what x sends
    last_sent = {}                                 # (x, y): the filter y last sent x

    def side_interest(y, x):
        """Interests of everything reachable from y without passing x."""
        seen, stack, result = {y, x}, [y], set()
        while stack:
            r = stack.pop()
            for client_interests in interests[r].values():
                result |= client_interests
            for nb in neighbours[r]:
                if nb not in seen and up.get((r, nb)):
                    seen.add(nb)
                    stack.append(nb)
        return _Filter(result)

    events = []                                    # heap of (true_us, seq, kind, data)

    def schedule(at, kind, data):
        counter[0] += 1
        heapq.heappush(events, (at, counter[0], kind, data))

    def send_filters(now, origin=None):
        """Re-send every pull filter that changed (debounced, per-hop delay)."""
        depths = _depths(origin, neighbours, routers)
        for y in range(routers):
            for x in neighbours[y]:
                if not up.get((x, y)):
                    continue
                new = side_interest(y, x)
                if last_sent.get((x, y)) != new:
                    last_sent[(x, y)] = new
                    sent = now + DEBOUNCE_US * (1 + depths[y]) + rng.uniform(0, 2000)
                    emit(y, sent, x, "subreplace_sent", "out",
                         filter_nodes=new.nodes, filter_bytes=new.nbytes)
                    arrive = sent + latency[(y, x)]
                    emit(x, arrive, y, "subreplace_received", "in",
                         filter_nodes=new.nodes, filter_bytes=new.nbytes)
                    schedule(arrive, "filter", (x, y, new))

    def link_up(now, a, b):
        # a dialled b
        up[(a, b)] = up[(b, a)] = True
        emit(a, now, b, "link_up", "out")
        emit(b, now + latency[(a, b)], a, "link_up", "in")
        for key in ((a, b), (b, a)):
            pull.pop(key, None)
            last_sent.pop(key, None)

    for a, b in edges:
        link_up(start_us + rng.uniform(0, 50_000), a, b)
    send_filters(start_us + 60_000)

    # link flap, burst, subscription churn
    if flap is None:
        flap = seconds >= 60 and len(edges) > 0
    if flap and edges:
        a, b = rng.choice(edges)
        down_at = start_us + rng.uniform(0.3, 0.6) * (end_us - start_us)
        schedule(down_at, "down", (a, b))
        schedule(down_at + rng.uniform(3e6, min(20e6, 0.2 * (end_us - start_us))), "up", (a, b))
    if burst is None:
        burst = seconds >= 30
    burst_window = (0, 0)
    if burst:
        b0 = start_us + rng.uniform(0.1, 0.8) * (end_us - start_us)
        burst_window = (b0, b0 + rng.uniform(5e6, 15e6))
    churn_rate = churn_per_client_s * len(consumers)
    if churn_rate > 0:
        t = start_us
        while True:
            t += rng.expovariate(churn_rate) * 1e6
            if t >= end_us:
                break
            schedule(t, "churn", rng.choice(consumers))

    # notifications (Poisson, rate x 8 during the burst)
    t = start_us + 200_000
    peak = rate * 8
    while True:
        t += rng.expovariate(peak if burst_window[0] <= t < burst_window[1] else rate) * 1e6
        if t >= end_us:
            break
        schedule(t, "notify", None)

    sent_this_second = {}
    notifications = 0
    while events:
        now, _, kind, data = heapq.heappop(events)
        flush(now - 2_000_000)
        if kind == "filter":
            x, y, new = data
            if up.get((x, y)):
                pull[(x, y)] = new
        elif kind == "churn":
            c, home = data
            mine = interests[home].get(c, set())
            if mine and rng.random() < 0.5:
                mine.discard(rng.choice(sorted(mine, key=repr)))
            else:
                mine.add(_random_interest(rng))
            send_filters(now, home)
        elif kind == "down":
            a, b = data
            up[(a, b)] = up[(b, a)] = False
            for key in ((a, b), (b, a)):
                pull.pop(key, None)
                last_sent.pop(key, None)
            emit(a, now, b, "link_down", "out", reason="liveness")
            emit(b, now + latency[(a, b)] + 5e5, a, "link_down", "in", reason="connection lost")
            send_filters(now + 10_000)
        elif kind == "up":
            a, b = data
            link_up(now, a, b)
            send_filters(now + 20_000)
        else:
            notifications += 1
            producer = rng.choices(producers, pweights)[0]
            producer["seq"] += 1
            n = _make_notification(rng, producer["kind"], producer, producer["seq"])
            _propagate(n, producer["home"], now, names, neighbours, latency, legacy,
                       up, pull, export_block, capacity, sent_this_second, emit, rng)
    flush(float("inf"))
    for w in writers:
        w.close()

    topology = {
        "routers": [{"domain": names[i], "clock_offset_us": round(offset[i], 1),
                     "legacy_forwarding": i in legacy} for i in range(routers)],
        "links": [{"dialler": names[a], "listener": names[b],
                   "latency_us": round(latency[(a, b)], 1)} for a, b in edges],
        "export_blocks": [{"router": names[x], "peer": names[y], "kind": k}
                          for (x, y), k in sorted(export_block.items())],
        "start_us": start_us, "end_us": end_us, "seed": seed,
    }
    with open(os.path.join(out, "topology.json"), "w", encoding="utf-8") as f:
        json.dump(topology, f, indent=1)
    return {"records": sum(w.records for w in writers),
            "files": sum(len(w.files) for w in writers),
            "notifications": notifications, "events": dict(sorted(counts.items())),
            "routers": names, "start_us": start_us, "end_us": end_us}


def _random_interest(rng):
    kind = rng.choices(list(KINDS), [KINDS[k][0] for k in KINDS])[0]
    selector = KINDS[kind][1]
    if selector is None or rng.random() < 0.05:
        return (kind, None)
    return (kind, rng.choice(SELECTOR_VALUES[selector]))


def _reachable(x, y, neighbours):
    """Routers reachable from x without passing through y (x included)."""
    seen, stack = {x, y}, [x]
    while stack:
        for nb in neighbours[stack.pop()]:
            if nb not in seen:
                seen.add(nb)
                stack.append(nb)
    seen.discard(y)
    return seen


def _depths(origin, neighbours, routers):
    """Hops from ``origin`` to every router (capped at 3; all 0 without origin)."""
    depth = [0] * routers
    if origin is None:
        return depth
    seen, frontier, d = {origin}, [origin], 0
    while frontier:
        d += 1
        nxt = []
        for r in frontier:
            for nb in neighbours[r]:
                if nb not in seen:
                    seen.add(nb)
                    depth[nb] = min(d, 3)
                    nxt.append(nb)
        frontier = nxt
    return depth


def _propagate(n, origin, now, names, neighbours, latency, legacy, up, pull, export_block,
               capacity, sent_this_second, emit, rng):
    """Send one notification through the federation, writing every record."""
    fields = {"attrs": n.names, "digest": n.digest}
    entry = {}

    def size_of(routing):
        total = n.base
        for r in routing:
            if r not in entry:
                entry[r] = tf.routing_entry_size(names[r])
            total += entry[r]
        return total

    # (router, routing list received (indices), arrived from, true time)
    queue = [(origin, [], None, now)]
    while queue:
        x, routing, came_from, t = queue.pop(0)
        if came_from is not None:
            received = [names[r] for r in routing]
            size = size_of(routing)
            if x in routing:
                emit(x, t, came_from, "notify_dropped_loop", "in",
                     routing=received, size=size, **fields)
                continue
            emit(x, t, came_from, "notify_received", "in", routing=received, size=size, **fields)
        out_routing = routing + [x]
        out_names = [names[r] for r in out_routing]
        out_size = size_of(out_routing)
        step = 0
        for y in neighbours[x]:
            if not up.get((x, y)):
                continue
            if x in legacy:
                if y == came_from:
                    continue                      # split horizon only
            elif y in routing:
                continue
            step += 1
            ts = t + step * PROCESSING_US * (0.5 + rng.random())
            f = pull.get((x, y))
            if f is None or not f.matches(n):
                event = "notify_suppressed_filter"
            elif export_block.get((x, y)) == n.kind:
                event = "notify_suppressed_export"
            else:
                second = int(ts // 1_000_000)
                slot = sent_this_second.get((x, y))
                if slot is None or slot[0] != second:
                    slot = sent_this_second[(x, y)] = [second, 0]
                if slot[1] >= capacity:
                    event = "notify_dropped_overload"
                else:
                    slot[1] += 1
                    event = "notify_forwarded"
            emit(x, ts, y, event, "out", routing=out_names, size=out_size, **fields)
            if event == "notify_forwarded":
                base = latency[(x, y)]
                arrive = ts + base + rng.expovariate(1 / (0.1 * base + 50))
                queue.append((y, out_routing, x, arrive))


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m spark_analysis.synth",
        description="Write synthetic federation traces (docs/traces.md) for a simulated "
                    "federation of N routers in a tree.")
    parser.add_argument("--out", required=True, help="directory to write the trace files to")
    parser.add_argument("--routers", type=int, default=5, help="number of routers (default 5)")
    parser.add_argument("--clients", type=int, default=20, help="number of clients (default 20)")
    parser.add_argument("--rate", type=float, default=50.0,
                        help="notifications per second, whole federation (default 50)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="simulated duration in seconds (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--extra-links", type=int, default=0,
                        help="links closing cycles, handled by a broken router, to show "
                             "loop drops (default 0)")
    parser.add_argument("--start", default=None,
                        help="start time, ISO 8601 UTC or epoch seconds "
                             "(default 2024-05-01T12:00:00Z)")
    parser.add_argument("--rotate-mb", type=float, default=64.0,
                        help="rotate files at this size in MiB (default 64)")
    parser.add_argument("--rotate-seconds", type=float, default=3600.0,
                        help="rotate files at this age in seconds (default 3600)")
    parser.add_argument("--gzip", action="store_true", help="gzip the closed files")
    args = parser.parse_args(argv)
    try:
        start = None if args.start is None else tf.parse_time(args.start)
    except ValueError:
        parser.error(f"--start: cannot parse {args.start!r}")
    began = time.monotonic()
    try:
        stats = generate(args.out, args.routers, args.clients, args.rate, args.seconds,
                         args.seed, args.extra_links, start, int(args.rotate_mb * (1 << 20)),
                         args.rotate_seconds, args.gzip)
    except ValueError as e:
        parser.error(str(e))
    elapsed = time.monotonic() - began
    print(f"wrote {stats['records']} records in {stats['files']} files to {args.out} "
          f"({stats['notifications']} notifications, {len(stats['routers'])} routers, "
          f"{elapsed:.1f} s)")
    for event, count in stats["events"].items():
        print(f"  {event:26} {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
