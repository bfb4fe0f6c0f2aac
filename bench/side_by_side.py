"""Two Elvin routers under one external load generator, side by side.

    python bench/side_by_side.py --bench /path/to/peer-bench/bench \\
        --a elvin://127.0.0.1:29171 --b elvin://127.0.0.1:29170 \\
        --subs 10 1000 10000 100000 --runs 3

For each row it runs the load generator once against each router as a
discarded warm-up, then ``--runs`` times against A and B alternately
(A B A B ...), and prints the median ``notif_rate`` of each router, their
ratio, and the median placement rate (the generator's "placed N
subscriptions" line). Every run must report ``delivered == expected``;
a run that does not is printed and fails the row.

The load generator is any program taking ``URL SUB_CONNS TOTAL_SUBS
NOTIFS PUBLISHERS [options]`` and printing ``key=value`` figures, as the
Java generator (``Bench.java`` on the Avis Java client library,
docs/performance.md) does; build it outside this repository. This script only runs it; both routers must
already be listening. ``--pid-a`` / ``--pid-b`` add each router's peak RSS
(VmHWM) and the CPU time it used per run (Linux /proc) to the output: a
router that is not the bottleneck shows it there.

``--ceiling URL`` adds a third server to the alternation, normally
``bench/ceiling_relay.py``: it delivers every notification to one
subscriber, so its runs are not held to ``delivered == expected``; the generator waits
out its ``--timeout`` on them (``--ceiling-timeout``, 10 s, given to those
runs only), and the row adds ``c_notif_rate`` and ``ratio_a_over_c``.

The rows are those of the project's performance table: each row's
notification rates and ratio, the placement rate of its subscriptions (the
10,000 row's is the "placement of 10,000 distinct subscriptions" figure),
and with ``--pid-a``/``--pid-b`` each router's peak RSS so far (after the
100,000 row, on routers started fresh: the "peak RSS at 100,000
subscriptions" figure).

Absolute figures move with whatever else the machine runs; the ratio,
taken in one alternating run, is what to quote.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

_PLACED = re.compile(r"# placed (\d+) subscriptions in ([0-9.]+) s")


def notifications_for(subs):
    """A notification count giving each run a few seconds on both routers."""
    if subs <= 10:
        return 100_000
    if subs <= 1_000:
        return 50_000
    if subs <= 10_000:
        return 20_000
    return 2_000


def run_once(bench, url, subs, notifs, extra, timeout):
    """One generator run: its figures as a dict (placement rate included)."""
    command = [bench, url, str(min(50, subs)), str(subs), str(notifs), "1", *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    figures = {}
    for line in done.stdout.splitlines():
        if line.startswith("subs="):
            figures.update(pair.split("=", 1) for pair in line.split() if "=" in pair)
    placed = _PLACED.search(done.stderr)
    if placed:
        figures["placement_rate"] = int(placed.group(1)) / float(placed.group(2))
    if not figures:
        raise RuntimeError(f"no figures from {' '.join(command)}:\n{done.stderr[-2000:]}")
    return figures


def cpu_seconds(pid):
    """User + system CPU seconds process ``pid`` has used, or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def peak_rss_mib(pid):
    """The process's peak resident set (VmHWM) in MiB, or None."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, help="the load generator's command")
    parser.add_argument("--a", required=True, help="first router's elvin: URI")
    parser.add_argument("--b", required=True, help="second router's elvin: URI")
    parser.add_argument("--subs", type=int, nargs="+", default=[10, 1000, 10000, 100000])
    parser.add_argument("--notifs", type=int, help="notifications per run (default: by row)")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per router")
    parser.add_argument("--extra", default="", help="more generator options, e.g. "
                        "'--rate 1000 --nodelay'")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--ceiling", help="a relay's elvin: URI (bench/ceiling_relay.py), "
                        "run third in each alternation")
    parser.add_argument("--ceiling-timeout", type=float, default=10,
                        help="the generator's --timeout on the relay's runs (seconds)")
    parser.add_argument("--pid-a", type=int)
    parser.add_argument("--pid-b", type=int)
    args = parser.parse_args(argv)
    extra = args.extra.split()
    failed = False
    for subs in args.subs:
        notifs = args.notifs or notifications_for(subs)
        results = {"a": [], "b": [], "c": []}
        order = [("a", args.a), ("b", args.b)]
        if args.ceiling:
            order.append(("c", args.ceiling))
        extras = {"a": extra, "b": extra,
                  "c": [*extra, "--timeout", f"{args.ceiling_timeout:g}"]}
        for which, url in order:                       # warm-up, discarded
            run_once(args.bench, url, subs, notifs, extras[which], args.timeout)
        for _ in range(args.runs):
            for which, url in order:
                pid = getattr(args, f"pid_{which}", None)
                before = cpu_seconds(pid) if pid else None
                figures = run_once(args.bench, url, subs, notifs, extras[which], args.timeout)
                after = cpu_seconds(pid) if pid else None
                if before is not None and after is not None:
                    figures["router_cpu_s"] = after - before
                if which != "c" and figures.get("delivered") != figures.get("expected"):
                    print(f"# {which} subs={subs}: delivered {figures.get('delivered')} "
                          f"!= expected {figures.get('expected')}", flush=True)
                    failed = True
                results[which].append(figures)
        line = [f"subs={subs} notifs={notifs}"]
        medians = {}
        for which in ("a", "b", "c"):
            runs = results[which]
            if not runs:
                continue
            rate = statistics.median(float(r["notif_rate"]) for r in runs)
            p99 = statistics.median(float(r["p99_ms"]) for r in runs)
            placing = [r["placement_rate"] for r in runs if "placement_rate" in r]
            cpu = [r["router_cpu_s"] for r in runs if "router_cpu_s" in r]
            if cpu:
                # the router's CPU time for the whole run (placing included)
                line.append(f"{which}_router_cpu_s={statistics.median(cpu):.2f}")
            medians[which] = rate
            line.append(f"{which}_notif_rate={rate:.0f} {which}_p99_ms={p99:.2f}")
            if placing:
                line.append(f"{which}_placement_rate={statistics.median(placing):.0f}")
            pid = getattr(args, f"pid_{which}", None)
            rss = peak_rss_mib(pid) if pid else None
            if rss is not None:
                line.append(f"{which}_peak_rss_mib={rss:.0f}")
        if medians["b"]:
            line.append(f"ratio_a_over_b={medians['a'] / medians['b']:.2f}")
        if medians.get("c"):
            line.append(f"ratio_a_over_c={medians['a'] / medians['c']:.2f}")
        print(" ".join(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
