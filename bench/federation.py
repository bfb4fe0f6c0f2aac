"""Federated routers: throughput, per-hop latency, how fast a mesh heals,
quench across routers, graceful stops, hung peers and an Avis router in a ring.

    python bench/federation.py [--notifs 50000]
        [--scenarios chain3 mesh4 heal quench2 stop drain hung avis_ring]

Every router is a real ``twistd elvin`` process on 127.0.0.1 (client and
federation ports picked free; configurations and logs in a temporary
folder, removed afterwards unless ``--keep``). Domains are ``a.bench``,
``b.bench``, ...; each link is dialled by one side and accepted by the
other (``Federation.Apply-Class[Peers] = 127.0.0.1``), with
``Federation.Mesh.Interval`` and ``Federation.Keepalive-Interval`` of 1 s
in chain3, mesh4 and heal, and every default in the other scenarios.
Before measuring, the script waits (bounded) until every router logs the
expected links and the spanning tree predicted by Kruskal's algorithm over
the links in order of their sorted domain pairs, and then until a probe
published at the publisher's router reaches every subscriber. Clients use
the blocking client (``elvin.sync``), publishing as fast as it allows.
One line per scenario:

    scenario=chain3 notifs=… delivered=… duplicates=… notifs_per_s=…
        hop_latency_ms_p50=… hop_latency_ms_p99=… b_latency_ms_p50=…
        b_latency_ms_p99=… c_latency_ms_p50=… c_latency_ms_p99=…
        latency_notifs=COUNT@RATE/s
  a–b–c (a and c dial b), publisher on a, subscriber (``require(seq)``)
  on c: N notifications, ``notifs_per_s`` = N / time from the first
  publish until the last one arrived at c. Then a paced run (``--latency-notifs`` at ``--latency-rate``/s, each
  with ``t = time.time()``) with subscribers on b and c: one-way latencies
  (client legs included); ``hop_latency`` is the latency at c halved.

    scenario=mesh4 notifs=… tree=… expected=… delivered=… duplicates=…
        notifs_per_s=…
  Four routers, every pair linked once; publisher on d, subscribers on a, b
  and c (the tree is the star at a, so b and c are two hops away).
  ``delivered`` counts distinct (subscriber, seq) pairs (``expected`` =
  3N), ``duplicates`` the copies beyond the first; ``notifs_per_s`` = N /
  time until every subscriber had all N.

    scenario=heal rate=… sent=… received=… lost=… duplicates=… heal_s=…
        kill_to_resume_s=… tree_before=… tree_after=…
  A ring a–b–c–d–a (each dials the next; tree a–b, a–d, b–c; c–d idle), subscriber on c,
  publisher on a at ``--heal-rate``/s; after ``--heal-before`` s router b
  is SIGKILLed. ``heal_s`` is the longest gap between two consecutive
  arrivals at c from the last one before the kill on (the outage as c sees
  it); ``kill_to_resume_s`` is from the kill to the arrival of the first
  notification published after it; ``lost`` counts sequence numbers that
  never arrived. The stream stops ``--heal-after`` s after it resumed.
  ``tree_after`` is the tree the surviving routers last logged.

    scenario=quench2 rounds=… add_heard_ms_p50=… add_heard_ms_max=…
        del_heard_ms_p50=… del_heard_ms_max=… auto_quench_sent=…
        auto_quench_dropped=… delivered_at_c=…
  a–b–c (a and c dial b), a quench on ``seq`` on a: ``--quench-rounds``
  times a subscription on ``seq`` is made on c, then removed;
  ``add_heard`` is from the subscribe call until a's quencher hears of it
  (SubAddNotify), ``del_heard`` from the removal until SubDelNotify. Then
  an auto-quench producer on a sends one notification only a subscriber
  on c wants and one nobody wants (``sent``/``dropped``: 1 and 1).
  Checked: ``add_heard_ms_max`` under 1 s, c got the one it wanted.

    scenario=stop rate=… sent=… lost_c=… duplicates_c=… lost_d=…
        duplicates_d=… term_to_exit_s=… tree_before=… tree_after=…
  The ring of heal, subscribers on c (reached through b) and d, publisher
  on a at ``--stop-rate``/s; after ``--stop-before`` s router b gets
  SIGTERM (a graceful stop: it leaves the tree first); the stream goes on
  ``--stop-after`` s after b exited. Checked: nothing lost or duplicated.

    scenario=drain rate=… sent=… lost_c=… duplicates_c=… lost_d=…
        duplicates_d=… lost_b_client=… duplicates_b_client=…
        drained_after_s=… tree_before=… tree_after=…
  The same with SIGUSR1 instead (b has ``redirect-to`` a): b leaves the
  tree, then redirects its clients; a subscriber on b follows to a
  (``lost_b_client``: what it missed while it moved; not checked).
  ``drained_after_s`` is from the signal until b logs ``drained:``;
  the stream goes on ``--stop-after`` s after that; ``tree_after`` leaves
  b out (it stays up, off the tree). Checked: nothing lost or duplicated
  at c and d.

    scenario=hung keepalive=default idle_before_s=… detected_s=…
        detected_s_max=… replaced_s=…
  b dials a, default keepalive (5 s) and mesh interval (10 s); for each
  ``--hung-idle`` value the link idles that long, b gets SIGSTOP, and
  ``detected_s`` is the time until a logs the link down (then SIGCONT, b
  links again). Last, b is stopped again and a new router with b's name
  dials a: ``replaced_s`` is from the SIGSTOP until a logs it linked.
  Checked: every detection within 10 s (0.5 s of polling slack).

    scenario=avis_ring published=… a_received=… a_lost=… a_duplicates=…
        b_received=… … avis_duplicates=… tree_a=… tree_b=…
  The Avis router (``--avis``, its avis-router.jar; the scenario is
  skipped without it) in a ring with two of ours: a dials b, b dials Avis,
  Avis dials a (Avis's filters ``require(seq)``). Once our routers' tree
  reaches Avis by one link, and ``--avis-settle`` s later (the link that
  left the tree carries for ``Federation.Mesh.Grace``), each router's
  client publishes ``--avis-notifs`` at ``--avis-rate``/s in turn, and a
  subscriber on each router counts what arrives; duplicates are broken
  down by the router they were published at. Checked: none lost, none
  duplicated.

Exit status 1 (after printing every line) if a check failed: something
not delivered in chain3/mesh4, a duplicate anywhere, no heal, or a
target of quench2, stop, drain, hung or avis_ring missed.
"""

import argparse
import ast
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from throughput import free_port  # noqa: E402

from elvin.federation import mesh  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LINK_UP = re.compile(r"federation link up: (\S+) ")
LINK_DOWN = re.compile(r"federation link down: ([^:\s]+):")
TREE = re.compile(r"federation mesh: tree links now (\[.*?\])")


class Failed(Exception):
    """A wait ran out of time or a router died."""


def spanning_tree(edges):
    """The tree the routers compute (elvin.federation.mesh.spanning_tree)
    over ``edges``: the set of tree edges, each a sorted pair."""
    return mesh.spanning_tree({name for edge in edges for name in edge}, edges)


class Router:
    """One ``twistd elvin`` process with federation on loopback ports."""

    def __init__(self, folder, name, used_ports, fast=True):
        self.folder = folder
        self.name = name
        self.fast = fast           # 1 s mesh and keepalive intervals, else the defaults
        self.extra = []            # more lines for its configuration file
        self.domain = f"{name}.bench"
        self.port = self._port(used_ports)
        self.fed_port = self._port(used_ports)
        self.dials = []            # Routers this one dials
        self.proc = None
        self.log_path = os.path.join(folder, f"{name}.log")

    @staticmethod
    def _port(used):
        for _ in range(100):
            port = free_port()
            if port not in used:
                used.add(port)
                return port
        raise Failed("no free port")

    @property
    def uri(self):
        return f"elvin://127.0.0.1:{self.port}"

    def settings(self):
        """The lines of this router's configuration file."""
        lines = [f"listen = {self.uri}",
                 "Federation.Activated = yes",
                 f"Federation.Router-Name = {self.domain}",
                 f"Federation.Listen = ewaf://127.0.0.1:{self.fed_port}",
                 *(f"Federation.Connect[Peers] = ewaf://127.0.0.1:{peer.fed_port}"
                   for peer in self.dials),
                 "Federation.Apply-Class[Peers] = 127.0.0.1",
                 "Federation.Subscribe[Peers] = TRUE",
                 "Federation.Provide[Peers] = TRUE"]
        if self.fast:
            lines += ["Federation.Mesh.Interval = 1", "Federation.Keepalive-Interval = 1"]
        return lines + self.extra

    def command(self, conf):
        argv = ["twistd", "-n", "--pidfile=", "elvin", "-c", conf]
        return [sys.executable, "-c",
                f"import sys; from twisted.scripts.twistd import run; sys.argv={argv!r}; run()"]

    def start(self):
        conf = os.path.join(self.folder, f"{self.name}.conf")
        with open(conf, "w") as f:
            f.write("\n".join(self.settings()) + "\n")
        env = dict(os.environ, PYTHONUNBUFFERED="1")      # log lines as they come
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(conf), cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def links(self):
        """Peer domains whose links are up, by the log."""
        up = set()
        for line in self.log().splitlines():
            m = LINK_UP.search(line)
            if m:
                up.add(m.group(1))
            m = LINK_DOWN.search(line)
            if m:
                up.discard(m.group(1))
        return up

    def tree(self):
        """The peer domains of this router's tree links, by the last log line."""
        found = TREE.findall(self.log())
        return set(ast.literal_eval(found[-1])) if found else set()

    def kill(self):
        """SIGKILL: no goodbye to its peers (reaped by ``stop``)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is not None:
            self.proc.wait()
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def wait_for(what, predicate, timeout, routers=()):
    """Poll ``predicate`` until true; Failed after ``timeout`` seconds or if
    one of ``routers`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for r in routers:
            if not r.alive():
                raise Failed(f"router {r.name} exited while waiting for {what}:\n"
                             + r.log()[-2000:])
        time.sleep(0.05)
    raise Failed(f"timed out after {timeout} s waiting for {what}")


class Topology:
    """Routers named a, b, ... linked by ``edges`` (pairs of names; the
    first of each pair dials the second)."""

    def __init__(self, folder, names, edges, fast=True):
        used = set()
        self.routers = {n: Router(folder, n, used, fast) for n in names}
        self.edges = list(edges)
        for dialler, acceptor in self.edges:
            self.routers[dialler].dials.append(self.routers[acceptor])
        self.tree = spanning_tree(self.edges)

    def __getitem__(self, name):
        return self.routers[name]

    def start(self, timeout=30):
        for r in self.routers.values():
            r.start()
        every = list(self.routers.values())
        for r in every:
            for port in (r.port, r.fed_port):
                wait_for(f"{r.name} to listen on {port}",
                         lambda port=port: _accepts(port), timeout, every)
        want_links = {n: set() for n in self.routers}
        want_tree = {n: set() for n in self.routers}
        for x, y in self.edges:
            want_links[x].add(f"{y}.bench")
            want_links[y].add(f"{x}.bench")
        for x, y in self.tree:
            want_tree[x].add(f"{y}.bench")
            want_tree[y].add(f"{x}.bench")
        wait_for("every link up", lambda: all(
            self.routers[n].links() == want_links[n] for n in self.routers), timeout, every)
        wait_for("the predicted spanning tree " + self.describe_tree(), lambda: all(
            self.routers[n].tree() == want_tree[n] for n in self.routers), timeout, every)

    def describe_tree(self):
        return ",".join(f"{x}-{y}" for x, y in sorted(self.tree))

    def logged_tree(self, leaving=()):
        """The tree the running routers last logged, as ``describe_tree``
        (those named in ``leaving`` left it: the tree they last logged is
        the one they froze on leaving)."""
        edges = {tuple(sorted((r.name, peer.split(".")[0])))
                 for r in self.routers.values() if r.alive() and r.name not in leaving
                 for peer in r.tree()}
        return ",".join(f"{x}-{y}" for x, y in sorted(edges)) or "none"

    def stop(self):
        for r in self.routers.values():
            try:
                r.stop()
            except Exception as e:     # keep stopping the others
                print(f"could not stop router {r.name}: {e}", file=sys.stderr)


def _accepts(port):
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


class Collector:
    """A subscription callback: records (seq, arrival time, latency) of
    each notification, and the tokens of probes separately. Called on the
    client's thread; read from the main one (list appends are atomic)."""

    def __init__(self):
        self.probes = set()
        self.seqs = []
        self.arrivals = []           # time.perf_counter() at arrival
        self.latencies = []          # seconds, for notifications carrying t
        self.phase = None
        self.lock = threading.Lock()

    def reset(self, phase):
        with self.lock:
            self.phase = phase
            self.seqs = []
            self.arrivals = []
            self.latencies = []

    def __call__(self, note):
        now = time.perf_counter()
        wall = time.time()
        probe = note.get("probe")
        if probe is not None:
            self.probes.add(probe)
            return
        with self.lock:
            if note.get("phase") != self.phase:
                return              # a straggler of an earlier phase
            self.seqs.append(note["seq"])
            self.arrivals.append(now)
            t = note.get("t")
            if t is not None:
                self.latencies.append(wall - t)


_probe_count = [0]


def wait_subscribed(publisher, collectors, timeout=30):
    """Publish probes until one reaches every collector."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _probe_count[0] += 1
        token = f"probe-{_probe_count[0]}"
        publisher.notify({"seq": -1, "probe": token})
        inner = time.monotonic() + 0.5
        while time.monotonic() < inner:
            if all(token in c.probes for c in collectors):
                return
            time.sleep(0.01)
    raise Failed(f"no probe reached every subscriber in {timeout} s")


def subscribe(conn, collector):
    conn.subscribe("require(seq)", callback=collector)
    return collector


def flood(publisher, collectors, notifs, phase, timeout):
    """Publish ``notifs`` notifications as fast as the client allows and
    wait (bounded: ``timeout`` s without progress) until every collector
    has them all: (seconds until the last arrival, all arrived?)."""
    for c in collectors:
        c.reset(phase)
    start = time.perf_counter()
    for i in range(notifs):
        publisher.notify({"seq": i, "phase": phase, "body": "x" * 16})
    publisher.test_connection(timeout=60)
    last_progress = time.monotonic()
    seen = -1
    while True:
        counts = [len(set(c.seqs)) for c in collectors]
        if all(n >= notifs for n in counts):
            break
        total = sum(len(c.seqs) for c in collectors)
        if total != seen:
            seen, last_progress = total, time.monotonic()
        elif time.monotonic() - last_progress > timeout:
            return None, False
        time.sleep(0.01)
    time.sleep(0.3)                     # late copies would be duplicates
    end = max(_arrival_of_last_new(c) for c in collectors)
    return end - start, True


def _arrival_of_last_new(collector):
    """When ``collector`` first had every distinct seq it has."""
    seen = set()
    last = collector.arrivals[0] if collector.arrivals else time.perf_counter()
    for seq, at in zip(list(collector.seqs), list(collector.arrivals)):
        if seq not in seen:
            seen.add(seq)
            last = at
    return last


def duplicates(collector):
    return len(collector.seqs) - len(set(collector.seqs))


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def paced(publisher, count, rate, phase, extra=None, stop=None):
    """Publish ``count`` notifications (or until ``stop()``) at ``rate``/s;
    returns the number sent. ``extra(i)`` is called before each one."""
    interval = 1.0 / rate
    start = time.perf_counter()
    i = 0
    while (count is None or i < count) and not (stop is not None and stop(i)):
        if extra is not None:
            extra(i)
        publisher.notify({"seq": i, "phase": phase, "t": time.time()})
        i += 1
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    return i


def chain3(folder, args, sync):
    topo = Topology(folder, "abc", [("a", "b"), ("c", "b")])
    try:
        topo.start()
        with sync.connect(topo["a"].uri) as pub, sync.connect(topo["c"].uri) as sub_c:
            at_c = subscribe(sub_c, Collector())
            wait_subscribed(pub, [at_c])
            took, complete = flood(pub, [at_c], args.notifs, "flood", args.timeout)
            delivered = len(set(at_c.seqs))
            ok = complete and duplicates(at_c) == 0
            with sync.connect(topo["b"].uri) as sub_b:
                at_b = subscribe(sub_b, Collector())
                wait_subscribed(pub, [at_b, at_c])
                for c in (at_b, at_c):
                    c.reset("latency")
                sent = paced(pub, args.latency_notifs, args.latency_rate, "latency")
                pub.test_connection()
                try:
                    wait_for("the latency run", lambda: len(at_b.seqs) >= sent
                             and len(at_c.seqs) >= sent, args.timeout, topo.routers.values())
                except Failed as e:
                    print(f"chain3: {e}", file=sys.stderr)
                    ok = False
            ms = 1000.0
            lat_b, lat_c = at_b.latencies, at_c.latencies
            print(f"scenario=chain3 notifs={args.notifs} delivered={delivered} "
                  f"duplicates={duplicates(at_c)} "
                  f"notifs_per_s={args.notifs / took if took else float('nan'):.0f} "
                  f"hop_latency_ms_p50={percentile(lat_c, 0.5) * ms / 2:.2f} "
                  f"hop_latency_ms_p99={percentile(lat_c, 0.99) * ms / 2:.2f} "
                  f"b_latency_ms_p50={percentile(lat_b, 0.5) * ms:.2f} "
                  f"b_latency_ms_p99={percentile(lat_b, 0.99) * ms:.2f} "
                  f"c_latency_ms_p50={percentile(lat_c, 0.5) * ms:.2f} "
                  f"c_latency_ms_p99={percentile(lat_c, 0.99) * ms:.2f} "
                  f"latency_notifs={sent}@{args.latency_rate:g}/s", flush=True)
            return ok
    finally:
        topo.stop()


def mesh4(folder, args, sync):
    names = "abcd"
    edges = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]]
    topo = Topology(folder, names, edges)
    try:
        topo.start()
        with sync.connect(topo["d"].uri) as pub:
            conns = [sync.connect(topo[n].uri) for n in "abc"]
            try:
                collectors = [subscribe(conn, Collector()) for conn in conns]
                wait_subscribed(pub, collectors)
                took, complete = flood(pub, collectors, args.notifs, "flood", args.timeout)
            finally:
                for conn in conns:
                    conn.close()
        delivered = sum(len(set(c.seqs)) for c in collectors)
        dups = sum(duplicates(c) for c in collectors)
        print(f"scenario=mesh4 notifs={args.notifs} tree={topo.describe_tree()} "
              f"expected={3 * args.notifs} delivered={delivered} duplicates={dups} "
              f"notifs_per_s={args.notifs / took if took else float('nan'):.0f}", flush=True)
        return complete and dups == 0
    finally:
        topo.stop()


def heal(folder, args, sync):
    topo = Topology(folder, "abcd", [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    assert topo.tree == {("a", "b"), ("a", "d"), ("b", "c")}, topo.tree
    try:
        topo.start()
        with sync.connect(topo["a"].uri) as pub, sync.connect(topo["c"].uri) as sub:
            at_c = subscribe(sub, Collector())
            wait_subscribed(pub, [at_c])
            at_c.reset("heal")
            state = {"kill_at": None, "kill_seq": None, "resumed_at": None}
            first_kill = time.perf_counter() + args.heal_before
            give_up = first_kill + args.timeout

            def tick(i):
                now = time.perf_counter()
                if state["kill_at"] is None and now >= first_kill:
                    topo["b"].kill()
                    state["kill_at"] = time.perf_counter()
                    state["kill_seq"] = i

            def stop(i):
                now = time.perf_counter()
                if state["kill_at"] is None:
                    return False
                if state["resumed_at"] is None:
                    for seq, at in zip(list(at_c.seqs), list(at_c.arrivals)):
                        if seq >= state["kill_seq"]:
                            state["resumed_at"] = at
                            break
                if state["resumed_at"] is not None:
                    return now - state["resumed_at"] >= args.heal_after
                return now >= give_up

            sent = paced(pub, None, args.heal_rate, "heal", extra=tick, stop=stop)
            topo["b"].proc.wait(10)
            pub.test_connection()
            try:
                wait_for("the end of the stream at c",
                         lambda: at_c.seqs and at_c.seqs[-1] == sent - 1, args.timeout)
            except Failed:
                pass                                 # reported as lost
            time.sleep(0.3)
        seqs, arrivals = list(at_c.seqs), list(at_c.arrivals)
        kill_at = state["kill_at"]
        before = [i for i, at in enumerate(arrivals) if at <= kill_at]
        first = before[-1] if before else 0
        gaps = [arrivals[i + 1] - arrivals[i] for i in range(first, len(arrivals) - 1)]
        heal_s = max(gaps) if gaps and state["resumed_at"] is not None else float("nan")
        resumed = (state["resumed_at"] - kill_at if state["resumed_at"] is not None
                   else float("nan"))
        lost = len(set(range(sent)) - set(seqs))
        dups = len(seqs) - len(set(seqs))
        print(f"scenario=heal rate={args.heal_rate:g} sent={sent} received={len(seqs)} "
              f"lost={lost} duplicates={dups} heal_s={heal_s:.3f} "
              f"kill_to_resume_s={resumed:.3f} tree_before={topo.describe_tree()} "
              f"tree_after={topo.logged_tree()}", flush=True)
        return dups == 0 and state["resumed_at"] is not None
    finally:
        topo.stop()


def quench2(folder, args, sync):
    """Quench across two hops: a quencher on a, subscriptions made on c."""
    topo = Topology(folder, "abc", [("a", "b"), ("c", "b")], fast=False)
    try:
        topo.start()
        with sync.connect(topo["a"].uri) as qa, sync.connect(topo["c"].uri) as sc, \
                sync.connect(topo["a"].uri) as pa:
            heard = {}
            deleted = {}

            def on_add(term_id, ast, insecure):
                heard.setdefault(term_id, time.perf_counter())

            def on_delete(term_id):
                deleted.setdefault(term_id, time.perf_counter())

            qa.quench(["seq"], on_add=on_add, on_delete=on_delete)
            adds, dels = [], []
            for i in range(args.quench_rounds):
                before = set(heard)
                start = time.perf_counter()
                sub = sc.subscribe(f"require(seq) && seq > {i}", callback=lambda note: None)
                wait_for("the quencher on a to hear of a subscription on c",
                         lambda: set(heard) - before, args.timeout, topo.routers.values())
                (term,) = set(heard) - before
                adds.append(heard[term] - start)
                start = time.perf_counter()
                sub.remove()
                wait_for("the quencher on a to hear it removed", lambda: term in deleted,
                         args.timeout, topo.routers.values())
                dels.append(deleted[term] - start)
            # An auto-quench producer on a sends what only c's subscriber wants.
            got = []
            sc.subscribe("require(seq) && seq == 7", callback=got.append)
            producer = pa.auto_quench(["seq", "phase"])
            wait_for("the producer to hear of c's subscription",
                     lambda: producer.could_interest({"seq": 7}), args.timeout)
            sent = producer.notify({"seq": 7, "phase": "quench"})
            producer.notify({"seq": 8, "phase": "quench"})   # nobody wants it
            wait_for("c to get what the auto-quench producer sent", lambda: got,
                     args.timeout)
        ms = 1000.0
        print(f"scenario=quench2 rounds={args.quench_rounds} "
              f"add_heard_ms_p50={percentile(adds, 0.5) * ms:.1f} "
              f"add_heard_ms_max={max(adds) * ms:.1f} "
              f"del_heard_ms_p50={percentile(dels, 0.5) * ms:.1f} "
              f"del_heard_ms_max={max(dels) * ms:.1f} "
              f"auto_quench_sent={producer.sent} auto_quench_dropped={producer.dropped} "
              f"delivered_at_c={len(got)}", flush=True)
        return bool(sent) and max(adds) < 1.0 and len(got) == 1
    finally:
        topo.stop()


def stop(folder, args, sync):
    """Graceful stop (SIGTERM) of the router carrying a stream in a ring."""
    return _take_out(folder, args, sync, drain=False)


def drain(folder, args, sync):
    """SIGUSR1 (drain to a) of the router carrying a stream in a ring."""
    return _take_out(folder, args, sync, drain=True)


def _take_out(folder, args, sync, drain):
    """Router b of the ring a-b-c-d-a, carrying a's stream to c, is taken
    out of service (SIGTERM, or SIGUSR1 with ``redirect-to`` a) while a
    publishes; c and d count what they get, and with ``drain`` so does a
    client of b's, which follows the redirection to a."""
    name = "drain" if drain else "stop"
    topo = Topology(folder, "abcd", [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")],
                    fast=False)
    assert topo.tree == {("a", "b"), ("a", "d"), ("b", "c")}, topo.tree
    b = topo["b"]
    if drain:
        b.extra.append(f"redirect-to = {topo['a'].uri}")
    try:
        topo.start()
        with sync.connect(topo["a"].uri) as pub, sync.connect(topo["c"].uri) as sub_c, \
                sync.connect(topo["d"].uri) as sub_d, sync.connect(b.uri) as sub_b:
            collectors = {"c": subscribe(sub_c, Collector()),
                          "d": subscribe(sub_d, Collector())}
            local = subscribe(sub_b, Collector()) if drain else None
            wait_subscribed(pub, list(collectors.values()) + ([local] if drain else []))
            for c in [*collectors.values(), *([local] if drain else [])]:
                c.reset(name)
            state = {"signal_at": None, "done_at": None}
            signal_due = time.perf_counter() + args.stop_before

            def tick(i):
                if state["signal_at"] is None and time.perf_counter() >= signal_due:
                    # As users do it: SIGUSR1 to drain, SIGTERM to stop.
                    b.proc.send_signal(signal.SIGUSR1 if drain else signal.SIGTERM)
                    state["signal_at"] = time.perf_counter()
                if state["signal_at"] is not None and state["done_at"] is None and (
                        "drained: " in b.log() if drain else b.proc.poll() is not None):
                    state["done_at"] = time.perf_counter()

            def done(i):
                return (state["done_at"] is not None
                        and time.perf_counter() - state["done_at"] >= args.stop_after)

            sent = paced(pub, None, args.stop_rate, name, extra=tick, stop=done)
            pub.test_connection()
            try:
                wait_for("the end of the stream", lambda: all(
                    c.seqs and max(c.seqs) == sent - 1 for c in collectors.values()),
                    args.timeout)
            except Failed:
                pass                                 # reported as lost
            time.sleep(0.5)
        ok = True
        figures = []
        for where, c in [*collectors.items(), *([("b_client", local)] if drain else [])]:
            seqs = list(c.seqs)
            lost = len(set(range(sent)) - set(seqs))
            dups = len(seqs) - len(set(seqs))
            if where != "b_client":
                ok = ok and lost == 0 and dups == 0
            figures.append(f"lost_{where}={lost} duplicates_{where}={dups}")
        took = "drained_after_s" if drain else "term_to_exit_s"
        print(f"scenario={name} rate={args.stop_rate:g} sent={sent} {' '.join(figures)} "
              f"{took}={state['done_at'] - state['signal_at']:.2f} "
              f"tree_before={topo.describe_tree()} tree_after={topo.logged_tree('b')}",
              flush=True)
        return ok
    finally:
        topo.stop()


def hung(folder, args, sync):
    """A peer that hangs (SIGSTOP) on an idle link, default settings: how
    long until the other side closes the link, and until a replacement
    router with the same name is linked."""
    topo = Topology(folder, "ab", [("b", "a")], fast=False)
    replacement = None
    try:
        topo.start()
        a, b = topo["a"], topo["b"]
        detected = []
        for idle in args.hung_idle:
            if not b.alive():
                break
            time.sleep(idle)                     # the keepalive timer's phase
            downs = a.log().count("federation link down: b.bench")
            b.proc.send_signal(signal.SIGSTOP)
            stopped_at = time.perf_counter()
            wait_for("a to close the link to the hung b",
                     lambda: a.log().count("federation link down: b.bench") > downs,
                     args.timeout, [a])
            detected.append(time.perf_counter() - stopped_at)
            b.proc.send_signal(signal.SIGCONT)
            wait_for("b to link again", lambda: a.links() == {"b.bench"}, args.timeout, [a, b])
        # A replacement with b's name while b hangs.
        time.sleep(1.0)
        b.proc.send_signal(signal.SIGSTOP)
        stopped_at = time.perf_counter()
        replacement = Router(folder, "b2", set(), fast=False)
        replacement.domain = "b.bench"
        replacement.dials.append(a)
        replacement.start()
        ups = a.log().count("federation link up: b.bench")
        wait_for("the replacement b to be linked",
                 lambda: a.log().count("federation link up: b.bench") > ups,
                 args.timeout, [a, replacement])
        replaced = time.perf_counter() - stopped_at
        print(f"scenario=hung keepalive=default idle_before_s="
              f"{','.join(f'{i:g}' for i in args.hung_idle)} "
              f"detected_s={','.join(f'{d:.2f}' for d in detected)} "
              f"detected_s_max={max(detected):.2f} replaced_s={replaced:.2f}", flush=True)
        return max(detected) <= 10.5
    finally:
        if topo["b"].alive():
            topo["b"].proc.send_signal(signal.SIGCONT)
        if replacement is not None:
            replacement.stop()
        topo.stop()


class AvisRouter(Router):
    """The Avis router (``--avis``: its avis-router.jar), federated with
    ours through one class that takes anything with a ``seq``."""

    def __init__(self, folder, jar, used_ports):
        super().__init__(folder, "avis", used_ports)
        self.jar = jar

    def settings(self):
        return [f"Listen=elvin://127.0.0.1:{self.port}",
                "Federation.Activated=yes",
                f"Federation.Router-Name={self.domain}",
                f"Federation.Listen=ewaf://127.0.0.1:{self.fed_port}",
                *(f"Federation.Connect[Peer]=ewaf://127.0.0.1:{peer.fed_port}"
                  for peer in self.dials),
                # Avis refuses TRUE here ("not currently supported").
                "Federation.Subscribe[Peer]=require(seq)",
                "Federation.Provide[Peer]=require(seq)",
                "Federation.Apply-Class[Peer]=127.0.0.1 localhost"]

    def command(self, conf):
        return ["java", "-jar", self.jar, "-c", conf]


def avis_ring(folder, args, sync):
    """An Avis router in a ring with two of ours: a dials b, b dials
    Avis, Avis dials a. Every router publishes; every router subscribes."""
    if not os.path.exists(args.avis):
        print(f"scenario=avis_ring skipped: no Avis router at {args.avis} (--avis)",
              flush=True)
        return True
    used = set()
    a, b = Router(folder, "a", used, fast=False), Router(folder, "b", used, fast=False)
    avis = AvisRouter(folder, args.avis, used)
    a.dials.append(b)
    b.dials.append(avis)
    avis.dials.append(a)
    every = [a, b, avis]
    try:
        for r in every:
            r.start()
        for r in every:
            for port in (r.port, r.fed_port):
                wait_for(f"{r.name} to listen on {port}",
                         lambda port=port: _accepts(port), args.timeout, every)
        wait_for("every link up", lambda: a.links() == {"b.bench", "avis.bench"}
                 and b.links() == {"a.bench", "avis.bench"}, args.timeout, every)
        # Our two span Avis through one link (docs/federation.md).
        wait_for("a tree that reaches Avis once", lambda: len(
            [r for r in (a, b) if "avis.bench" in r.tree()]) == 1
            and "b.bench" in a.tree(), args.timeout, every)
        # The link that left the tree carries for Federation.Mesh.Grace (1 s)
        # more: meanwhile Avis may get a notification twice
        # (docs/federation.md, "Plain routers in cycles").
        time.sleep(args.avis_settle)
        conns = {r.name: sync.connect(r.uri) for r in every}
        try:
            collectors = {name: subscribe(conn, Collector()) for name, conn in conns.items()}
            for conn in conns.values():
                wait_subscribed(conn, list(collectors.values()))
            for c in collectors.values():
                c.reset("avis")
            n = args.avis_notifs
            for k, conn in enumerate(conns.values()):
                paced(_Offset(conn, k * n), n, args.avis_rate, "avis")
                conn.test_connection()
            total = n * len(conns)
            try:
                wait_for("every notification everywhere", lambda: all(
                    len(set(c.seqs)) >= total for c in collectors.values()), args.timeout)
            except Failed:
                pass                                 # reported as lost
            time.sleep(1.0)                          # late copies would be duplicates
        finally:
            for conn in conns.values():
                conn.close()
        figures, ok = [], True
        for name, c in collectors.items():
            seqs = list(c.seqs)
            lost = total - len(set(seqs))
            dups = len(seqs) - len(set(seqs))
            ok = ok and lost == 0 and dups == 0
            by_origin = collections.Counter(list(conns)[seq // n] for seq in seqs)
            extra = ",".join(f"{origin}:{count - n}" for origin, count in
                             sorted(by_origin.items()) if count > n)
            figures.append(f"{name}_received={len(seqs)} {name}_lost={lost} "
                           f"{name}_duplicates={dups}" + (f"({extra})" if extra else ""))
        print(f"scenario=avis_ring published={total} {' '.join(figures)} "
              f"tree_a={sorted(a.tree())} tree_b={sorted(b.tree())}", flush=True)
        return ok
    finally:
        for r in every:
            try:
                r.stop()
            except Exception as e:
                print(f"could not stop router {r.name}: {e}", file=sys.stderr)


class _Offset:
    """A publisher whose ``seq`` numbers start at ``offset``."""

    def __init__(self, conn, offset):
        self.conn = conn
        self.offset = offset

    def notify(self, attributes):
        self.conn.notify(dict(attributes, seq=attributes["seq"] + self.offset))


SCENARIOS = {"chain3": chain3, "mesh4": mesh4, "heal": heal, "quench2": quench2,
             "stop": stop, "drain": drain, "hung": hung, "avis_ring": avis_ring}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifs", type=int, default=50_000,
                        help="notifications of the chain3 and mesh4 floods")
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS),
                        choices=list(SCENARIOS))
    parser.add_argument("--latency-notifs", type=int, default=500)
    parser.add_argument("--latency-rate", type=float, default=200)
    parser.add_argument("--heal-rate", type=float, default=500)
    parser.add_argument("--heal-before", type=float, default=3,
                        help="seconds of stream before router b is killed")
    parser.add_argument("--heal-after", type=float, default=2,
                        help="seconds of stream after it resumed at c")
    parser.add_argument("--quench-rounds", type=int, default=20,
                        help="subscriptions made and removed on c (quench2)")
    parser.add_argument("--stop-rate", type=float, default=200)
    parser.add_argument("--stop-before", type=float, default=3,
                        help="seconds of stream before router b gets SIGTERM")
    parser.add_argument("--stop-after", type=float, default=3,
                        help="seconds of stream after router b exited")
    parser.add_argument("--hung-idle", type=float, nargs="+", default=[0.5, 2.5, 4.5],
                        help="seconds the link is idle before each SIGSTOP")
    parser.add_argument("--avis", default="/tmp/avis/lib/avis-router.jar",
                        help="the Avis router's jar (avis_ring; skipped without it)")
    parser.add_argument("--avis-notifs", type=int, default=2000,
                        help="notifications each router publishes (avis_ring)")
    parser.add_argument("--avis-rate", type=float, default=1000)
    parser.add_argument("--avis-settle", type=float, default=2.0,
                        help="seconds between the tree reaching Avis once and the "
                             "first publication (avis_ring)")
    parser.add_argument("--timeout", type=float, default=30,
                        help="longest wait for anything (s)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the folder of configurations and router logs")
    args = parser.parse_args()

    import elvin.sync

    # A plain SIGTERM unwinds too, so the routers are stopped (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    folder = tempfile.mkdtemp(prefix="elvin-federation-bench-")
    ok = True
    try:
        for name in args.scenarios:
            sub = os.path.join(folder, name)
            os.mkdir(sub)
            try:
                ok = SCENARIOS[name](sub, args, elvin.sync) and ok
            except Failed as e:
                print(f"scenario={name} failed: {e}", file=sys.stderr, flush=True)
                ok = False
            except Exception:              # its routers are stopped; go on
                print(f"scenario={name} failed:", file=sys.stderr, flush=True)
                traceback.print_exc()
                ok = False
    finally:
        if args.keep:
            print(f"logs in {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
