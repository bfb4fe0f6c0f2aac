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
resident memory (VmHWM). Targets (2-core machine): stored ≥ 10,000/s,
replayed ≥ 20,000/s, RSS < 150 MB.
"""

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from throughput import rss_mb, start_router  # noqa: E402


def committed(database):
    """The highest notification id the proxy has committed (0: none)."""
    db = sqlite3.connect(database)
    try:
        return db.execute("SELECT coalesce(max(id), 0) FROM notifications").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifs", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--max-count", type=int, default=0)
    args = parser.parse_args()

    import elvin.sync

    folder = tempfile.mkdtemp(prefix="elvin-proxy-bench-")
    database = os.path.join(folder, "proxy.db")
    router, router_uri = start_router()
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
        with elvin.sync.connect(router_uri) as publisher:
            start = time.perf_counter()
            sent = 0
            while sent < args.notifs:
                chunk = min(args.batch, args.notifs - sent)
                for i in range(sent, sent + chunk):
                    publisher.notify({"seq": i, "shard": i % count, "body": "x" * 40,
                                      "Group": "bench"})
                sent += chunk
                while sent - committed(database) > args.batch:
                    time.sleep(0.01)
            deadline = time.time() + 600
            while committed(database) < args.notifs and time.time() < deadline:
                time.sleep(0.02)
            stored_s = time.perf_counter() - start
        if committed(database) < args.notifs:
            raise SystemExit(f"only {committed(database)} of {args.notifs} were stored")
        if args.sessions > 16 or args.max_count:
            print(f"notifs={args.notifs} sessions={args.sessions} "
                  f"max_count={args.max_count} stored_per_s={args.notifs / stored_s:.0f} "
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
