"""The proxy's store and replay rates: notifications stored for
disconnected sessions, then replayed to a client that comes back.

    python bench/proxy.py [--notifs 1000000] [--sessions 10] [--batch 5000]

Starts a router and a proxy (``twistd elvin-proxy``, a fresh SQLite file in
a temporary folder) on free loopback ports. ``--sessions`` sessions each
subscribe and disconnect: session i to ``shard == i || shard == i+1``
(modulo the count), so each notification, published with ``shard = seq %
sessions``, matches two sessions and is stored once for both. A publisher
connected to the router then sends N notifications, keeping at most ``--batch`` ahead of
what the proxy has committed (the router would otherwise queue, and drop
by its Send-Queue policy, what the proxy has not read yet); the time until
the last is committed gives ``stored_per_s``. Then one client joins every
session at once and receives everything (one copy each, in order):
``replayed_per_s`` (only with at most 16 sessions, the most one client may
join). ``--max-count N`` gives every subscription a maximum count, so once
N are kept each store also drops the oldest (max-count at its cap). Also printed: the database's size and the proxy's peak
resident memory (VmHWM), and ``stored_per_cpu_s``: notifications stored
per second of the proxy's own CPU time (what to compare on a loaded
machine). Targets (2-core machine): stored ≥ 10,000/s,
replayed ≥ 20,000/s, RSS < 150 MB.

``--overload F`` measures instead what happens to a publisher faster
than the proxy can store: it first finds the store rate as above (N/5
notifications), then publishes N more at F times that rate, unthrottled
by the proxy, waits until the router's queues are empty and the store
still, and accounts for every notification each session was owed:
``stored`` (rows kept), ``counted`` (the session's drop count, which
its next client is told as ``Proxy.Dropped`` with a DropWarn) and
``unaccounted`` (owed, neither stored nor counted), beside what the
router says it dropped from its queue to the proxy (its status page's
``dropped_deliveries``). ``--router-queue BYTES`` lowers the router's
ceiling on a send queue (default: the router's own, 256 MiB), to see
the router drop.
"""

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from throughput import cpu_seconds, free_port, rss_mb, start_router  # noqa: E402


def committed(database):
    """The highest notification id the proxy has committed (0: none)."""
    db = sqlite3.connect(database)
    try:
        return db.execute("SELECT coalesce(max(id), 0) FROM notifications").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def note(i, count):
    return {"seq": i, "shard": i % count, "body": "x" * 40, "Group": "bench"}


def publish_throttled(publisher, database, args, first, last):
    """Publish ``first``..``last - 1`` at most ``--batch`` ahead of what the
    proxy has committed; seconds until the last is committed."""
    start = time.perf_counter()
    sent = first
    while sent < last:
        chunk = min(args.batch, last - sent)
        for i in range(sent, sent + chunk):
            publisher.notify(note(i, args.sessions))
        sent += chunk
        while sent - committed(database) > args.batch:
            time.sleep(0.01)
    deadline = time.time() + 600
    while committed(database) < last and time.time() < deadline:
        time.sleep(0.02)
    return time.perf_counter() - start


def router_status(port):
    from urllib.request import urlopen
    with urlopen(f"http://127.0.0.1:{port}/status.json", timeout=10) as reply:
        return json.load(reply)["totals"]


def overload(args, router_uri, database, status_port, names):
    """``--overload``: the store rate, then a publisher F times faster;
    every owed notification stored, counted as dropped, or neither."""
    import elvin.sync
    count = args.sessions
    calibration = max(1000, args.notifs // 5)
    with elvin.sync.connect(router_uri) as publisher:
        rate = calibration / publish_throttled(publisher, database, args, 0, calibration)
        target = rate * args.overload
        start = time.perf_counter()
        total = calibration + args.notifs
        for first in range(calibration, total, 500):       # paced in steps of 500
            for i in range(first, min(first + 500, total)):
                publisher.notify(note(i, count))
            ahead = (first + 500 - calibration) / target - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
        published_s = time.perf_counter() - start
    # Quiet: the router's queues empty and nothing stored for 2 s.
    deadline = time.time() + 600
    last, still = -1, 0.0
    while time.time() < deadline and still < 2.0:
        time.sleep(0.25)
        now = committed(database)
        queued = router_status(status_port)["send_queue_bytes"]
        still = still + 0.25 if (now == last and not queued) else 0.0
        last = now
    owed = dict.fromkeys(names, 0)
    for i in range(total):
        shard = i % count
        for name in {names[shard], names[(shard - 1) % count]}:
            owed[name] += 1
    db = sqlite3.connect(database)
    try:
        stored = dict(db.execute("SELECT session, count(*) FROM pending GROUP BY session"))
        counted = dict(db.execute("SELECT name, dropped FROM sessions"))
    finally:
        db.close()
    totals = router_status(status_port)
    owed_all = sum(owed.values())
    stored_all = sum(stored.get(n, 0) for n in names)
    counted_all = sum(counted.get(n, 0) for n in names)
    unaccounted = sum(max(0, owed[n] - stored.get(n, 0) - counted.get(n, 0)) for n in names)
    print(f"overload={args.overload:g} sessions={count} store_rate={rate:.0f}/s "
          f"publish_rate={args.notifs / published_s:.0f}/s published={total} "
          f"router_received={totals['notifications_received']} "
          f"router_dropped_to_proxy={totals['dropped_deliveries']} "
          f"owed={owed_all} stored={stored_all} counted_dropped={counted_all} "
          f"unaccounted={unaccounted}", flush=True)


def restarts(args, routers, router_uri, router_config, proxy_uri):
    """``--restart``: for each outage, the router is killed (SIGKILL), kept
    down that long and started again on its port; probes are published to
    it every 10 ms from the moment it listens, and the first that reaches a
    client of a proxy session says when the proxy was back (from when the
    router's port accepts, polled every 0.1 s). ``routers[-1]`` is the
    router process running."""
    import elvin.sync
    port = int(router_uri.rsplit(":", 1)[1])
    got = []
    with elvin.sync.connect(proxy_uri, session="restart",
                            on_notification=lambda note: got.append(
                                (time.monotonic(), note["probe"]))) as conn:
        conn.subscribe("require(probe)", callback=lambda note: None)
        for outage in [float(o) for o in args.restart.split(",")]:
            routers[-1].kill()
            routers[-1].wait(10)
            time.sleep(outage)
            routers.append(start_router("elvin", ["-c", router_config], port=port)[0])
            back = time.monotonic()
            del got[:]
            sent = 0
            with elvin.sync.connect(router_uri) as publisher:
                deadline = back + 30
                while time.monotonic() < deadline and not got:
                    publisher.notify({"probe": sent})
                    sent += 1
                    time.sleep(0.01)
                first = got[0] if got else None
            if first is None:
                raise SystemExit(f"nothing through the proxy 30 s after a {outage:g} s outage")
            print(f"outage_s={outage:g} back_after_s={first[0] - back:.2f} "
                  f"probes_lost={first[1]} of {sent}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifs", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--max-count", type=int, default=0)
    parser.add_argument("--profile", default=None,
                        help="record the proxy with py-spy while it stores (raw "
                             "collapsed stacks to this file)")
    parser.add_argument("--restart", default=None,
                        help="outages in seconds, e.g. 2,20,2,20: how soon after the "
                             "upstream router's return the proxy delivers again")
    parser.add_argument("--overload", type=float, default=0,
                        help="publish at this many times the store rate (accounting)")
    parser.add_argument("--router-queue", type=int, default=0,
                        help="with --overload: the router's Send-Queue.Max-Length ceiling")
    args = parser.parse_args()

    import elvin.sync

    folder = tempfile.mkdtemp(prefix="elvin-proxy-bench-")
    database = os.path.join(folder, "proxy.db")
    status_port = free_port()
    router_config = os.path.join(folder, "router.conf")
    with open(router_config, "w") as f:
        f.write(f"status-listen = {status_port}\n")
        if args.router_queue:
            f.write(f"Send-Queue.Max-Length.Ceiling = {args.router_queue}\n")
    router, router_uri = start_router("elvin", ["-c", router_config])
    config = os.path.join(folder, "proxy.conf")
    with open(config, "w") as f:
        # Every notification is kept (each session is owed 2N/sessions).
        f.write(f"max-stored = {2 * args.notifs}\n")
    proxy, proxy_uri = start_router("elvin-proxy",
                                    ["-c", config, "-u", router_uri, "-d", database])
    try:
        names = [f"s{i}" for i in range(args.sessions)]
        count = args.sessions
        for i, name in enumerate(names):
            with elvin.sync.connect(proxy_uri, session=name,
                                    max_count=args.max_count or None) as conn:
                conn.subscribe(f"shard == {i} || shard == {(i + 1) % count}",
                               callback=lambda note: None)
        if args.overload:
            overload(args, router_uri, database, status_port, names)
            return
        if args.restart:
            routers = [router]
            try:
                restarts(args, routers, router_uri, router_config, proxy_uri)
            finally:
                router = routers[-1]
            return
        spy = None
        if args.profile:
            spy = subprocess.Popen(["py-spy", "record", "-p", str(proxy.pid), "-o",
                                    args.profile, "--format", "raw", "-r", "200"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        cpu_before = cpu_seconds(proxy.pid)
        with elvin.sync.connect(router_uri) as publisher:
            stored_s = publish_throttled(publisher, database, args, 0, args.notifs)
        # The proxy's own CPU per notification stored: much less sensitive
        # than the wall-clock rate to a loaded machine.
        per_cpu_s = args.notifs / (cpu_seconds(proxy.pid) - cpu_before)
        if spy is not None:
            spy.send_signal(2)       # SIGINT: py-spy writes what it has
            spy.wait(60)
        if committed(database) < args.notifs:
            raise SystemExit(f"only {committed(database)} of {args.notifs} were stored")
        if args.sessions > 16 or args.max_count:
            print(f"notifs={args.notifs} sessions={args.sessions} "
                  f"max_count={args.max_count} stored_per_s={args.notifs / stored_s:.0f} "
                  f"stored_per_cpu_s={per_cpu_s:.0f} "
                  f"proxy_peak_rss_mb={rss_mb(proxy.pid, 'VmHWM'):.0f}", flush=True)
            return
        size_mb = sum(os.path.getsize(os.path.join(folder, f))
                      for f in os.listdir(folder)) / 1e6

        received = [0]
        last = [-1]
        in_order = [True]

        def arrived(note):
            received[0] += 1
            if note["seq"] <= last[0]:
                in_order[0] = False
            last[0] = note["seq"]
        start = time.perf_counter()
        with elvin.sync.connect(proxy_uri, session=names, on_notification=arrived):
            deadline = time.time() + 600
            while received[0] < args.notifs and time.time() < deadline:
                time.sleep(0.02)
            replay_s = time.perf_counter() - start
        peak = rss_mb(proxy.pid, "VmHWM")
        if received[0] != args.notifs or not in_order[0]:
            raise SystemExit(f"replayed {received[0]} of {args.notifs} "
                             f"(in order: {in_order[0]})")
        print(f"notifs={args.notifs} sessions={args.sessions} "
              f"stored_per_s={args.notifs / stored_s:.0f} "
              f"stored_per_cpu_s={per_cpu_s:.0f} "
              f"replayed_per_s={args.notifs / replay_s:.0f} "
              f"db_mb={size_mb:.0f} proxy_peak_rss_mb={peak:.0f}", flush=True)
    finally:
        for proc in (proxy, router):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
