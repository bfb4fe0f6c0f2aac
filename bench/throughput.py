"""Routing throughput and latency benchmark (the workload below).

    python bench/throughput.py                       # starts its own router
    python bench/throughput.py --subs 1000 --notifs 20000
    python bench/throughput.py --url elvin://host:2917   # any Elvin router
    python bench/throughput.py --placement shared --subs 10000 100000

For each subscription count S it connects min(50, S) subscriber
connections holding S subscriptions in all and one publisher, emits M
notifications of the workload below with a bounded number in flight, waits
for every expected delivery (computed exactly with elvin.Subscription: one
NotifyDeliver per connection with at least one matching subscription), and
prints one line:

    subs=… notifs=… delivered=… expected=… notif_rate=… deliver_rate=…
    p50_ms=… p99_ms=… router_rss_mb=… router_peak_rss_mib=… placement_rate=…

``--placement shared`` (or ``new``) only places the subscriptions, all
distinct, and prints the placement rate, the router's CPU time per
subscription and its peak RSS: ``shared`` uses the workload's expressions
(one shape, different literals), ``new`` gives every subscription names of
its own, so each is a new shape and goes through the full PLY parse.

Workload: s1 from 100 symbols, s2 from 10, i1/i2 int32 in [0, 1000),
r1 real64 in [0, 1000), ts int64. Subscriptions are conjunctions of a range
on i1, i2 and r1, preceded by equality tests on s2, s1, or both once a
single subscription must be that selective: the least selective equality
for which the three ranges stay at least 10% of their domain, with range
widths set so that about 10% of notifications match some subscription.

Only the public client library is used. ``--latency-rate R`` instead offers
R notifications/s for --notifs notifications and reports the latency.
"""

import argparse
import math
import os
import random
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from twisted.internet import defer, reactor, task  # noqa: E402

from elvin import client  # noqa: E402
from elvin.core.index import SubscriptionIndex  # noqa: E402
from elvin.subscription import Subscription  # noqa: E402
from elvin.values import Int64  # noqa: E402

TARGET_MATCH = 0.10
MIN_WIDTH = 0.10


def workload_shape(subs):
    """(equality selectivity, range width fraction) for ``subs`` subscriptions."""
    p = -math.log(1 - TARGET_MATCH) / subs
    for e in (1.0, 0.1, 0.01, 0.001):
        if e <= p / MIN_WIDTH ** 3:
            return e, (p / e) ** (1 / 3)
    return 0.001, (p / 0.001) ** (1 / 3)


def make_subscription(rng, subs):
    e, w = workload_shape(subs)
    parts = []
    if e <= 0.01:
        parts.append(f's1 == "sym-{rng.randrange(100):03d}"')
    if e in (0.1, 0.001):
        parts.append(f's2 == "ex-{rng.randrange(10)}"')
    width = int(round(w * 1000))
    lo1 = rng.randrange(0, 1000 - width + 1)
    lo2 = rng.randrange(0, 1000 - width + 1)
    lo3 = rng.uniform(0, 1000 - w * 1000)
    parts.append(f"i1 >= {lo1} && i1 < {lo1 + width}")
    parts.append(f"i2 >= {lo2} && i2 < {lo2 + width}")
    parts.append(f"r1 >= {lo3:.2f} && r1 < {lo3 + w * 1000:.2f}")
    return " && ".join(parts)


def make_notification(rng):
    return {"s1": f"sym-{rng.randrange(100):03d}", "s2": f"ex-{rng.randrange(10)}",
            "i1": rng.randrange(1000), "i2": rng.randrange(1000),
            "r1": rng.uniform(0, 1000), "ts": Int64(0)}


class Entry:
    __slots__ = ("id", "subscription", "evaluate", "conn")

    def __init__(self, sub_id, subscription, conn):
        self.id = sub_id
        self.subscription = subscription
        self.evaluate = subscription.evaluator
        self.conn = conn


def expected_deliveries(expressions, conn_of, notes):
    """Per notification, how many connections should receive it."""
    index = SubscriptionIndex()
    for i, text in enumerate(expressions):
        index.add(Entry(i + 1, Subscription(text), conn_of[i]))
    result = []
    for note in notes:
        conns = {c.conn for c in index.candidates(note) if c.evaluate(note) is True}
        result.append(len(conns))
    return result


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_router(plugin="elvin", extra=(), port=None):
    """A ``twistd`` process of ``plugin`` (with ``extra`` arguments)
    listening on ``port`` (default a free one) on loopback: (process, its URI)."""
    port = port or free_port()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    argv = ["twistd", "-n", "--pidfile=", plugin, "-l", f"elvin://127.0.0.1:{port}", *extra]
    proc = subprocess.Popen(
        [sys.executable, "-c",
         f"import sys; from twisted.scripts.twistd import run; sys.argv={argv!r}; run()"],
        cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"elvin://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{plugin} did not start")


def cpu_seconds(pid):
    """User+system CPU seconds the process has used (nan if unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def rss_mb(pid, field="VmRSS"):
    """The router's resident set now (VmRSS) or at its peak (VmHWM), MiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def new_shape(expression, i):
    """``expression`` with its attribute names made unique to ``i``, so no
    two subscriptions share a shape (placement's worst case: every one is
    parsed by PLY)."""
    for name in ("s1", "s2", "i1", "i2", "r1"):
        expression = expression.replace(f"{name} ", f"{name}_{i} ")
    return expression


@defer.inlineCallbacks
def place_only(url, subs, seed, router_pid, shapes):
    """Place ``subs`` distinct subscriptions (pipelined over min(50, subs)
    connections) and print the rate, the router's CPU per subscription and
    its peak RSS; no notifications."""
    rng = random.Random(seed)
    n_conns = max(1, min(50, subs))
    consumers = []
    for _ in range(n_conns):
        conn = yield client.connect(url, options={"Subscription.Max-Count": subs + 16})
        consumers.append(conn)
    expressions = [make_subscription(rng, subs) for _ in range(subs)]
    if shapes == "new":
        expressions = [new_shape(text, i) for i, text in enumerate(expressions)]
    start = time.perf_counter()
    cpu0 = cpu_seconds(router_pid) if router_pid else float("nan")
    pending = []
    for i, text in enumerate(expressions):
        pending.append(consumers[i % n_conns].subscribe(text, _ignore))
        if len(pending) >= 2000:
            yield defer.gatherResults(pending, consumeErrors=True)
            pending = []
    yield defer.gatherResults(pending, consumeErrors=True)
    elapsed = time.perf_counter() - start
    cpu = (cpu_seconds(router_pid) if router_pid else float("nan")) - cpu0
    peak = rss_mb(router_pid, "VmHWM") if router_pid else float("nan")
    print(f"subs={subs} shapes={shapes} placement_rate={subs / elapsed:.0f} "
          f"router_cpu_us_per_sub={cpu / subs * 1e6:.1f} router_peak_rss_mib={peak:.1f}",
          flush=True)
    for conn in consumers:
        yield conn.close()


@defer.inlineCallbacks
def run_one(url, subs, notifs, window, seed, router_pid, latency_rate):
    rng = random.Random(seed)
    n_conns = max(1, min(50, subs))
    consumers = []
    received = {"n": 0}
    latencies = []

    def on_note(note):
        received["n"] += 1
        latencies.append(time.perf_counter_ns() - note["ts"])

    for _ in range(n_conns):
        conn = yield client.connect(url, options={"Subscription.Max-Count": subs + 16})
        consumers.append(conn)
    expressions = [make_subscription(rng, subs) for _ in range(subs)]
    conn_of = [i % n_conns for i in range(subs)]
    start = time.perf_counter()
    cpu0 = cpu_seconds(router_pid) if router_pid else float("nan")
    pending = []
    for i, text in enumerate(expressions):
        conn = consumers[conn_of[i]]
        # One callback per connection: a delivery is counted once per connection.
        pending.append(conn.subscribe(text, _ignore))
        if len(pending) >= 2000:
            yield defer.gatherResults(pending, consumeErrors=True)
            pending = []
    yield defer.gatherResults(pending, consumeErrors=True)
    placement = subs / (time.perf_counter() - start)
    placement_cpu = (cpu_seconds(router_pid) if router_pid else float("nan")) - cpu0
    for conn in consumers:
        conn.on_notification = on_note  # once per delivered packet

    producer = yield client.connect(url)
    notes = [make_notification(rng) for _ in range(notifs)]
    expected_per = expected_deliveries(expressions, conn_of, notes)
    expected = sum(expected_per)
    latencies.clear()
    received["n"] = 0
    start = time.perf_counter()
    cpu0 = cpu_seconds(router_pid) if router_pid else float("nan")
    sent_expected = 0
    interval = 1.0 / latency_rate if latency_rate else 0
    for i, note in enumerate(notes):
        note["ts"] = Int64(time.perf_counter_ns())
        producer.notify(note)
        sent_expected += expected_per[i]
        if latency_rate:
            target = start + (i + 1) * interval
            delay = target - time.perf_counter()
            if delay > 0:
                yield task.deferLater(reactor, delay, lambda: None)
        elif (i + 1) % window == 0:
            yield producer.test_connection()
            deadline = time.perf_counter() + 30
            while received["n"] < sent_expected - window and time.perf_counter() < deadline:
                yield task.deferLater(reactor, 0.001, lambda: None)
    yield producer.test_connection()
    deadline = time.perf_counter() + 60
    while received["n"] < expected and time.perf_counter() < deadline:
        yield task.deferLater(reactor, 0.005, lambda: None)
    elapsed = time.perf_counter() - start
    router_cpu = (cpu_seconds(router_pid) if router_pid else float("nan")) - cpu0
    rss = rss_mb(router_pid) if router_pid else float("nan")
    peak = rss_mb(router_pid, "VmHWM") if router_pid else float("nan")
    latencies.sort()

    def pct(q):
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1e6

    print(f"subs={subs} notifs={notifs} delivered={received['n']} expected={expected} "
          f"notif_rate={notifs / elapsed:.0f} deliver_rate={received['n'] / elapsed:.0f} "
          f"p50_ms={pct(0.50):.2f} p99_ms={pct(0.99):.2f} router_rss_mb={rss:.1f} "
          f"router_peak_rss_mib={peak:.1f} "
          f"placement_rate={placement:.0f} router_cpu={router_cpu / elapsed:.0%} "
          f"placement_router_cpu_s={placement_cpu:.2f}", flush=True)
    for conn in consumers + [producer]:
        yield conn.close()


def _ignore(note):
    pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="router to use (default: start one)")
    parser.add_argument("--subs", type=int, nargs="*", default=[10, 1000, 10000, 100000])
    parser.add_argument("--notifs", type=int, default=20000)
    parser.add_argument("--window", type=int, default=500,
                        help="notifications in flight at most")
    parser.add_argument("--latency-rate", type=float, default=0,
                        help="offer this many notifications/s instead of flat out")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--placement", choices=["shared", "new"],
                        help="only place the subscriptions and print the placement rate: "
                             "'shared' shapes (the workload's, literals differ) or a 'new' "
                             "shape for every subscription")
    parser.add_argument("--status", action="store_true",
                        help="run the router with its status listener on (status-listen) "
                             "and scrape /metrics and /status.json every second meanwhile, "
                             "as Prometheus and the status page would")
    args = parser.parse_args()

    @defer.inlineCallbacks
    def body(_reactor):
        for subs in args.subs:
            proc = None
            url = args.url
            scraper = None
            if url is None:
                extra = []
                if args.status:
                    import tempfile
                    status_port = free_port()
                    conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
                    conf.write(f"status-listen = http://127.0.0.1:{status_port}\n")
                    conf.close()
                    extra = ["-c", conf.name]
                    scraper = task.LoopingCall(_scrape, f"http://127.0.0.1:{status_port}")
                proc, url = start_router(extra=extra)
                if scraper is not None:
                    scraper.start(1.0, now=False)
            try:
                if args.placement:
                    yield place_only(url, subs, args.seed, proc.pid if proc else None,
                                     args.placement)
                else:
                    yield run_one(url, subs, args.notifs, args.window, args.seed,
                                  proc.pid if proc else None, args.latency_rate)
            finally:
                if scraper is not None and scraper.running:
                    scraper.stop()
                if proc is not None:
                    proc.terminate()
                    proc.wait(10)
    task.react(lambda r: body(r))


def _scrape(base):
    """One scrape of /metrics and /status.json, by another process (curl),
    so the load generator's own CPU is not what is measured."""
    subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-o", "/dev/null",
                      base + "/metrics", base + "/status.json"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
