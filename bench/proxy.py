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
join); the client acknowledges, so the proxy removes what it replayed,
and ``life_per_cpu_s`` is notifications per second of the proxy's CPU
from the first stored to the last removed (their whole life in the
store). ``--max-count N`` gives every subscription a maximum count, so once
N are kept each store also drops the oldest (max-count at its cap), and
the replay is of what the caps kept (``replayed``). Also printed: the database's size and the proxy's peak
resident memory (VmHWM), and ``stored_per_cpu_s``: notifications stored
per second of the proxy's own CPU time (what to compare on a loaded
machine). Targets (2-core machine): stored ≥ 10,000/s,
replayed ≥ 20,000/s, RSS < 150 MB.

``--store-alone`` measures ``Store.store`` alone, in this process, with
no router or proxy: the same sessions, subscriptions and notifications
(matched without keys), 400 stored per transaction (about what the proxy
commits a reactor turn), in a fresh database file; prints
``store_alone_per_cpu_s`` (CPU time of the loop). With ``--max-count``
it shows what the cap adds to a store without the rest of the proxy.

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

``--kill-proxy replay`` kills the proxy itself (SIGKILL) in the middle
of a replay to a slow acknowledging device and starts it again on the
same database: N notifications are stored for one session, a device
process (this script with ``--device``: ``elvin.sync`` with the default
acknowledgement window of 256, ``--device-delay`` seconds per
notification, each one's ``seq`` written to a file before its callback
returns, rejoining whenever its connection ends) joins, the proxy is
killed once the device has handled ``--kill-at`` of them, restarted,
and the device rejoins; when the session owes nothing more, every
``seq`` is accounted for: ``lost`` (the proxy had it, the device never
handled it), ``duplicates`` (handled twice; at most the window is
promised). ``--kill-proxy storing`` kills it instead while a publisher
is sending N at ``--rate`` per second with the device joined, once
``--kill-at`` of them are sent: the proxy's are the notifications it
held at the kill (the rows left in the database, read once it is dead,
and those the device had handled); what the router received while the
proxy was down, or before it had subscribed again, is counted apart
(``not_the_proxys``). ``--kills K`` kills it K times, every ``--kill-at``
of N (the proxy's are then what it held at any kill).
``--receipt non-destructive`` gives the device
that receipt (it always names itself, ``client=bench-device``).
"""

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from throughput import cpu_seconds, free_port, rss_mb, start_router  # noqa: E402


def _count(database, sql):
    """One number from the proxy's database as committed (0: no table yet)."""
    db = sqlite3.connect(database)
    try:
        return db.execute(sql).fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def committed(database):
    """The highest notification id the proxy has committed (0: none)."""
    return _count(database, "SELECT coalesce(max(id), 0) FROM notifications")


def owed_rows(database):
    """Rows the proxy's sessions are still owed (committed)."""
    return _count(database, "SELECT count(*) FROM pending")


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


def device(args):
    """``--device URI``: a slow acknowledging client of session ``s0``
    (see ``--kill-proxy``), run as its own process until terminated."""
    import elvin.sync
    from elvin.clientcore.state import ElvinError
    out = os.open(args.device_out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def handled(note):
        time.sleep(args.device_delay)
        os.write(out, b"%d\n" % note["seq"])     # before the callback returns,
        # so before it is counted as handled and acknowledged
    while True:
        try:
            conn = elvin.sync.connect(args.device, session="s0", client="bench-device",
                                      receipt=args.receipt, on_notification=handled,
                                      timeout=2)
        except (OSError, ElvinError):
            time.sleep(0.1)
            continue
        joined = conn.sessions["s0"]
        os.write(out, f"# joined stored={joined.stored} dropped={joined.dropped}\n".encode())
        while not conn.is_closed:
            time.sleep(0.05)


def session_seqs(database, session="s0"):
    """The ``seq`` of every notification the database still owes ``session``."""
    from elvin.protocols.xdr import Reader
    db = sqlite3.connect(database)
    try:
        rows = db.execute("SELECT n.body, n.sealed FROM notifications n WHERE n.id IN "
                          "(SELECT notification FROM pending WHERE session = ?)",
                          (session,)).fetchall()
    finally:
        db.close()
    if any(sealed for _, sealed in rows):
        raise SystemExit("sealed notifications: the bench publishes none")
    return {Reader(body).name_values()["seq"] for body, _ in rows}


def owed(database, session="s0", client="bench-device"):
    """How many notifications ``session`` still owes the device (not had
    by it: marked, with non-destructive receipt, once acknowledged)."""
    db = sqlite3.connect(database)
    try:
        return db.execute(
            "SELECT count(DISTINCT notification) FROM pending p WHERE session = ? AND NOT "
            "EXISTS (SELECT 1 FROM delivered d WHERE d.session = p.session AND d.client = ? "
            "AND d.notification = p.notification)", (session, client)).fetchone()[0]
    finally:
        db.close()


def read_device(path):
    """(every seq handled, in order; the device's lines for its joins)."""
    seqs, joins = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                joins.append(line[2:].strip())
            elif line.strip():
                seqs.append(int(line))
    return seqs, joins


def until(condition, limit, step=0.05):
    deadline = time.time() + limit
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(step)
    return False


def kill_proxy(args, procs, router_uri, database, restart_proxy, folder):
    """``--kill-proxy replay|storing`` (module docstring)."""
    import elvin.sync
    total = args.notifs
    window = 256                        # the device's (elvin.sync's default)
    out = os.path.join(folder, "device.out")
    open(out, "w").close()

    def lines():
        with open(out, "rb") as f:
            return sum(1 for line in f if not line.startswith(b"#"))
    proxy_uri = procs["proxy_uri"]
    published = [0]
    publisher_thread = None
    if args.kill_proxy == "replay":
        with elvin.sync.connect(router_uri) as publisher:
            publish_throttled(publisher, database, args, 0, total)
        if owed(database) != total:
            raise SystemExit(f"{owed(database)} of {total} stored before the replay")
    else:
        def publish():
            with elvin.sync.connect(router_uri) as publisher:
                start = time.perf_counter()
                for i in range(total):
                    publisher.notify(note(i, 1))
                    published[0] = i + 1
                    ahead = (i + 1) / args.rate - (time.perf_counter() - start)
                    if ahead > 0:
                        time.sleep(ahead)
        publisher_thread = threading.Thread(target=publish, daemon=True)
    procs["device"] = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--device", proxy_uri,
         "--device-out", out, "--device-delay", str(args.device_delay),
         "--receipt", args.receipt])
    if publisher_thread is not None:
        if not until(lambda: read_device(out)[1], 60):
            raise SystemExit("the device did not join")
        publisher_thread.start()
    proxys = set()                      # what the proxy had accepted at a kill
    for k in range(1, args.kills + 1):
        if publisher_thread is not None:
            if not until(lambda: published[0] >= k * args.kill_at * total, 600):
                raise SystemExit("the publisher never sent enough to kill the proxy")
        elif not until(lambda: lines() >= k * args.kill_at * total, 600):
            raise SystemExit("the device never handled enough to kill the proxy mid-replay")
        procs["proxy"].send_signal(signal.SIGKILL)
        procs["proxy"].wait(10)
        kill = {"published": published[0], "before": len(read_device(out)[0])}
        held = session_seqs(database)
        proxys |= held | set(read_device(out)[0])
        kill.update(held=len(held), proxys=len(proxys))
        if k == 1:
            first_kill = kill
        time.sleep(args.down)
        restart_proxy()
    if publisher_thread is not None:
        publisher_thread.join(600)
    # Done when the session owes nothing and the device has been idle 2 s.
    seen = [-1, time.time()]

    def settled():
        n = lines()
        if n != seen[0]:
            seen[:] = [n, time.time()]
        return owed(database) == 0 and time.time() - seen[1] > 2
    until(settled, 600, 0.2)
    procs["device"].terminate()
    procs["device"].wait(10)
    seqs, joins = read_device(out)
    got = set(seqs)
    lost = sorted(proxys - got)
    duplicates = len(seqs) - len(got)
    # In order within each join: seq goes back only where the device rejoined.
    backs = sum(1 for a, b in zip(seqs, seqs[1:]) if b <= a)
    in_order = backs <= len(joins) - 1
    fields = [f"kill_proxy={args.kill_proxy}", f"receipt={args.receipt}", f"notifs={total}",
              f"device_delay_ms={args.device_delay * 1000:g}", f"window={window}",
              f"kills={args.kills}",
              f"handled_before_kill={first_kill['before']}",
              f"left_in_db_at_kill={first_kill['held']}",
              f"proxys_at_kill={first_kill['proxys']}"]
    if args.kills > 1:
        fields.append(f"proxys_at_any_kill={len(proxys)}")
    if args.kill_proxy == "storing":
        missing = sorted(set(range(total)) - got - proxys)
        fields += [f"published_at_kill={first_kill['published']}",
                   f"not_the_proxys={len(missing)}" +
                   (f"(seq {missing[0]}..{missing[-1]})" if missing else "")]
    fields += [f"handled={len(seqs)}", f"distinct={len(got)}",
               f"joins={len(joins)}", f"in_order_per_join={in_order}",
               f"duplicates={duplicates}", f"lost={len(lost)}"]
    print(" ".join(fields), flush=True)
    if lost:
        print(f"lost seqs: {lost[:20]}{' ...' if len(lost) > 20 else ''}", flush=True)
    for line in joins:
        print(f"  join: {line}", flush=True)


def store_alone(args):
    """``--store-alone``: ``Store.store`` in a loop, timed by CPU."""
    from elvin.protocols import packets
    from elvin.proxy.store import Store

    folder = tempfile.mkdtemp(prefix="elvin-store-bench-")
    try:
        store = Store(os.path.join(folder, "proxy.db"))
        count = args.sessions
        for i in range(count):
            store.create_session(f"s{i}")
            store.put_subscription(f"s{i}", i + 1, f"shard == {i} || shard == {(i + 1) % count}",
                                   max_count=args.max_count or None)
        bodies = [packets.encode_attributes(note(i, count)) for i in range(args.notifs)]
        start = time.process_time()
        for first in range(0, args.notifs, 400):
            with store.batch():
                for i in range(first, min(args.notifs, first + 400)):
                    a, b = i % count, (i - 1) % count
                    store.store(bodies[i], {f"s{a}": {a + 1: False}, f"s{b}": {b + 1: False}},
                                1000.0 + i)
        cpu = time.process_time() - start
        store.close()
        print(f"notifs={args.notifs} sessions={count} max_count={args.max_count or None} "
              f"store_alone_per_cpu_s={args.notifs / cpu:.0f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifs", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--max-count", type=int, default=0)
    parser.add_argument("--store-alone", action="store_true",
                        help="time Store.store alone in this process (no router, no proxy)")
    parser.add_argument("--profile", default=None,
                        help="record the proxy with py-spy while it stores (raw "
                             "collapsed stacks to this file)")
    parser.add_argument("--restart", default=None,
                        help="outages in seconds, e.g. 2,20,2,20: how soon after the "
                             "upstream router's return the proxy delivers again")
    parser.add_argument("--upstream-probe", type=float, default=None,
                        help="the proxy's upstream-probe setting (seconds; 0: none, the "
                             "back-off alone)")
    parser.add_argument("--overload", type=float, default=0,
                        help="publish at this many times the store rate (accounting)")
    parser.add_argument("--router-queue", type=int, default=0,
                        help="with --overload: the router's Send-Queue.Max-Length ceiling")
    parser.add_argument("--kill-proxy", choices=["replay", "storing"], default=None,
                        help="SIGKILL the proxy mid-replay to a slow acknowledging device, "
                             "or while a publisher is storing; restart it on the same "
                             "database and count lost and duplicated (one session)")
    for flag, kind, default, text in (
            ("--kill-at", float, 0.25, "kill once this fraction of N is handled (replay) "
                                       "or published (storing)"),
            ("--down", float, 1.0, "seconds the proxy stays down"),
            ("--kills", int, 1, "kill it this many times, every --kill-at of N"),
            ("--rate", float, 2000, "storing: notifications published per second"),
            ("--device-delay", float, 0.002, "the device's seconds per notification"),
            ("--receipt", str, "destructive", "the device's receipt: destructive or "
                                              "non-destructive")):
        parser.add_argument(flag, type=kind, default=default, help="with --kill-proxy: " + text)
    parser.add_argument("--device", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--device-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device:
        device(args)
        return
    if args.store_alone:
        store_alone(args)
        return
    if args.kill_proxy:
        args.sessions = 1
        if args.kills < 1 or args.kills * args.kill_at > 1:
            parser.error("--kills must be at least 1, and --kills times --kill-at at most 1")

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
        # Every session is made from this one host.
        f.write("max-sessions-per-host = 0\n")
        if args.upstream_probe is not None:
            f.write(f"upstream-probe = {args.upstream_probe:g}\n")
    proxy_argv = ["-c", config, "-u", router_uri, "-d", database]
    proxy, proxy_uri = start_router("elvin-proxy", proxy_argv)
    procs = {"proxy": proxy, "proxy_uri": proxy_uri}

    def restart_proxy():
        port = int(proxy_uri.rsplit(":", 1)[1])
        procs["proxy"] = start_router("elvin-proxy", proxy_argv, port=port)[0]
    try:
        names = [f"s{i}" for i in range(args.sessions)]
        count = args.sessions
        for i, name in enumerate(names):
            with elvin.sync.connect(proxy_uri, session=name,
                                    max_count=args.max_count or None) as conn:
                conn.subscribe(f"shard == {i} || shard == {(i + 1) % count}",
                               callback=lambda note: None)
        if args.kill_proxy:
            kill_proxy(args, procs, router_uri, database, restart_proxy, folder)
            return
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
        if args.sessions > 16:
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
            while time.time() < deadline and (
                    received[0] < args.notifs if not args.max_count
                    else owed_rows(database) or received[0] < args.max_count):
                time.sleep(0.02)
            replay_s = time.perf_counter() - start
            # Acknowledged rows are removed: the notifications' life in the
            # store ends when no session is owed any.
            while owed_rows(database) and time.time() < deadline:
                time.sleep(0.02)
        life_cpu_s = cpu_seconds(proxy.pid) - cpu_before
        peak = rss_mb(proxy.pid, "VmHWM")
        # Uncapped, every notification comes back; capped, what the caps kept.
        missing = not args.max_count and received[0] != args.notifs
        if missing or not in_order[0] or owed_rows(database):
            raise SystemExit(f"replayed {received[0]} of {args.notifs} (in order: "
                             f"{in_order[0]}; rows still owed: {owed_rows(database)})")
        print(f"notifs={args.notifs} sessions={args.sessions} "
              f"max_count={args.max_count or None} "
              f"stored_per_s={args.notifs / stored_s:.0f} "
              f"stored_per_cpu_s={per_cpu_s:.0f} "
              f"replayed={received[0]} replayed_per_s={received[0] / replay_s:.0f} "
              f"life_per_cpu_s={args.notifs / life_cpu_s:.0f} "
              f"db_mb={size_mb:.0f} proxy_peak_rss_mb={peak:.0f}", flush=True)
    finally:
        for proc in (procs.get("device"), procs["proxy"], router):
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
