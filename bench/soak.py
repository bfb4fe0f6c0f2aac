"""Soak test: a router under mixed, partly hostile load for a long time.

    python bench/soak.py                    # 10 minutes
    python bench/soak.py --seconds 60       # a quick look

Starts a router as a subprocess (``twistd -n elvin`` run by ``python -c``
from the repository root, so it is this working tree's code) and drives
it, from this process, with:

* publishers emitting ``--rate`` notifications/s in all, spread over
  ``--groups`` groups, each carrying the publisher's sequence number;
* subscribers, two per group, that check every notification of their group
  arrives exactly once and in order (``lost`` / ``dup`` count violations);
* slow consumers that subscribe to everything with a 64 KiB send queue and
  never read (the router must drop for them and warn with DropWarn), each
  recycled -- resumed to collect its DropWarn, then dropped and replaced --
  every 60 s;
* connection churn: ``--churn`` clients/s connect, subscribe, quench,
  notify, and close politely or abort;
* a fuzzing client opening connections that send hostile frames
  (test/test_fuzz.py's FrameFuzzer), and UNotify senders.

Every 10 s it prints the router's RSS (from /proc), throughput and counts;
at the end an RSS summary (after a warm-up) with its linear trend, the
router log's error count, and whether every good client got Disconn when
the router was stopped with SIGTERM. Exit status 0 when nothing was lost,
duplicated or logged as an error.
"""

import argparse
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from twisted.internet import defer, error, protocol, reactor, task  # noqa: E402

from elvin import client  # noqa: E402
from elvin.protocols import packets  # noqa: E402
from elvin.test.test_fuzz import FrameFuzzer, framed  # noqa: E402


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start_router(port, workdir, settings=()):
    conf = os.path.join(workdir, "soak.conf")
    with open(conf, "w") as f:
        f.write(f"listen = elvin://127.0.0.1:{port}\n")
        for line in settings:
            f.write(line + "\n")
    code = ("import sys; sys.argv = ['twistd', '-n', '--pidfile=', 'elvin', '-c', %r]; "
            "from twisted.scripts.twistd import run; run()" % conf)
    log = open(os.path.join(workdir, "router.log"), "w")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, log.name
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"router exited: see {log.name}")
            time.sleep(0.1)
    raise SystemExit("router did not start")


ERROR_LINE = re.compile(r"#(error|critical)\]|Unhandled Error|Traceback")


def router_log_errors(path):
    count = 0
    with open(path, errors="replace") as f:
        for line in f:
            if ERROR_LINE.search(line):
                count += 1
    return count


class _Fuzz(protocol.Protocol):
    def __init__(self, payload, done):
        self.payload, self.done = payload, done

    def connectionMade(self):
        self.transport.write(self.payload)
        self.timer = reactor.callLater(0.5, self.transport.abortConnection)

    def connectionLost(self, reason):
        if self.timer.active():
            self.timer.cancel()
        self.done.callback(None)


class Soak:
    def __init__(self, args, uri, port):
        self.args = args
        self.uri = uri
        self.port = port
        self.rng = random.Random(args.seed)
        self.counts = dict(sent=0, delivered=0, lost=0, dup=0, churn=0, churn_failed=0,
                           fuzz_connections=0, fuzz_frames=0, unotify=0,
                           slow_recycled=0, slow_dropwarns=0, good_dropwarns=0,
                           client_errors=0)
        self.publishers = []
        self.subscribers = []
        self.slow = []
        self.last_seen = {}          # (subscriber index, publisher) -> last seq
        self.fuzzer = FrameFuzzer(args.seed)
        self.stopping = False
        self.loops = []

    # -- good traffic ----------------------------------------------------------

    @defer.inlineCallbacks
    def start_good(self):
        for g in range(self.args.groups):
            for _ in range(2):
                index = len(self.subscribers)
                conn = yield client.connect(self.uri)
                conn.on_dropwarn = self._good_dropwarn
                yield conn.subscribe(f'group == "g{g}" && require(seq)',
                                     lambda n, i=index: self._delivered(i, n))
                self.subscribers.append(conn)
        for _ in range(self.args.publishers):
            conn = yield client.connect(self.uri)
            self.publishers.append([conn, 0])
        per_tick = self.args.rate / len(self.publishers) / 100.0
        self._carry = [0.0] * len(self.publishers)

        def tick():
            for i, pub in enumerate(self.publishers):
                self._carry[i] += per_tick
                while self._carry[i] >= 1:
                    self._carry[i] -= 1
                    conn, seq = pub
                    conn.notify({"group": f"g{seq % self.args.groups}", "pub": i, "seq": seq,
                                 "payload": "x" * (32 + seq % 200)})
                    pub[1] = seq + 1
                    self.counts["sent"] += 1
        self.loop(tick, 0.01)

    def _good_dropwarn(self):
        self.counts["good_dropwarns"] += 1

    def _delivered(self, index, note):
        self.counts["delivered"] += 1
        key = (index, note["pub"])
        last = self.last_seen.get(key)
        seq = note["seq"]
        if last is not None:
            expected = last + self.args.groups
            if seq < expected:
                self.counts["dup"] += 1
            elif seq > expected:
                self.counts["lost"] += (seq - expected) // self.args.groups
        self.last_seen[key] = seq

    # -- slow consumers -----------------------------------------------------------

    @defer.inlineCallbacks
    def add_slow(self):
        conn = yield client.connect(self.uri, options={"Send-Queue.Max-Length": 65536})
        yield conn.subscribe("require(seq)", lambda n: None)
        conn.protocol.transport.pauseProducing()   # never read again
        self.slow.append(conn)

    @defer.inlineCallbacks
    def recycle_slow(self):
        if not self.slow:
            return
        conn = self.slow.pop(0)
        conn.protocol.transport.resumeProducing()
        yield task.deferLater(reactor, 1.0, lambda: None)
        self.counts["slow_dropwarns"] += conn.dropwarns
        conn.protocol.transport.abortConnection()
        self.counts["slow_recycled"] += 1
        yield self.add_slow()

    # -- churn, fuzz, unotify --------------------------------------------------------

    @defer.inlineCallbacks
    def churn_one(self):
        rng = self.rng
        try:
            conn = yield client.connect(self.uri)
            yield conn.subscribe(rng.choice(['require(x)', 'group == "g1" && seq > 10',
                                             'begins-with(payload, "xx")',
                                             f'n == {rng.randrange(1000)}']),
                                 lambda n: None)
            if rng.random() < 0.3:
                yield conn.quench(["x", "n"])
            conn.notify({"n": rng.randrange(1000), "churn": 1})
            if rng.random() < 0.5:
                yield conn.close()
            else:
                conn.protocol.transport.abortConnection()
            self.counts["churn"] += 1
        except Exception:
            self.counts["churn_failed"] += 1

    @defer.inlineCallbacks
    def fuzz_one(self):
        rng = self.fuzzer.rng
        parts = []
        if rng.random() < 0.9:
            parts.append(framed(packets.encode(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY))))
        n = rng.randint(1, 30)
        mutate = rng.random() >= 0.4
        for _ in range(n):
            parts.append(framed(self.fuzzer.client_frame(mutate), rng if mutate else None))
        parts.append(framed(packets.encode(packets.DisconnRqst(7))))
        done = defer.Deferred()
        try:
            yield protocol.ClientCreator(reactor, _Fuzz, b"".join(parts), done).connectTCP(
                "127.0.0.1", self.port)
            yield done
        except error.ConnectError:
            pass
        self.counts["fuzz_connections"] += 1
        self.counts["fuzz_frames"] += n

    @defer.inlineCallbacks
    def unotify_one(self):
        try:
            yield client.unotify(self.uri, {"n": self.rng.randrange(1000), "u": 1})
            self.counts["unotify"] += 1
        except Exception:
            self.counts["client_errors"] += 1

    def loop(self, fn, interval):
        call = task.LoopingCall(fn)
        call.start(interval, now=False).addErrback(self._loop_failed)
        self.loops.append(call)

    def _loop_failed(self, failure):
        self.counts["client_errors"] += 1
        print("load loop failed:", failure.getErrorMessage(), flush=True)

    def start_worker(self, one, concurrency):
        @defer.inlineCallbacks
        def worker():
            while not self.stopping:
                yield one()
        for _ in range(concurrency):
            worker().addErrback(self._loop_failed)

    @defer.inlineCallbacks
    def run(self):
        yield self.start_good()
        for _ in range(self.args.slow):
            yield self.add_slow()
        self.loop(lambda: self.churn_one(), 1.0 / self.args.churn)
        self.loop(lambda: self.unotify_one(), 0.2)
        self.loop(lambda: self.recycle_slow(), 60.0 / max(1, self.args.slow))
        self.start_worker(self.fuzz_one, self.args.fuzzers)

    @defer.inlineCallbacks
    def stop(self):
        self.stopping = True
        for call in self.loops:
            if call.running:
                call.stop()
        yield task.deferLater(reactor, 1.0, lambda: None)
        for conn, _ in self.publishers:
            yield conn.test_connection()
        for conn in self.subscribers:
            yield conn.test_connection()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=float, default=2000, help="notifications/s in all")
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--slow", type=int, default=4, help="slow consumers")
    parser.add_argument("--churn", type=float, default=20, help="churn clients/s")
    parser.add_argument("--fuzzers", type=int, default=2, help="concurrent fuzz connections")
    parser.add_argument("--warmup", type=float, default=60, help="seconds before RSS is judged")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="elvin-soak-")
    port = free_port()
    proc, log_path = start_router(port, workdir, ["max-connections = 20000"])
    uri = f"elvin://127.0.0.1:{port}"
    print(f"soak: {platform.node()} {platform.platform()} python {platform.python_version()}, "
          f"{os.cpu_count()} cpus; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", flush=True)
    print(f"router pid {proc.pid} on {uri}; log {log_path}; {args.seconds:.0f} s; "
          f"rate {args.rate:.0f}/s, {args.publishers} publishers, {args.groups * 2} "
          f"subscribers, {args.slow} slow consumers, churn {args.churn:.0f}/s, "
          f"{args.fuzzers} fuzzers", flush=True)
    soak = Soak(args, uri, port)
    samples = []
    result = {}

    def report(start, last):
        now = time.time()
        elapsed = now - start
        rss = rss_kib(proc.pid)
        samples.append((elapsed, rss))
        c = soak.counts
        prev = last[0]
        dt = max(now - last[1], 1e-9)
        print(f"t={elapsed:5.0f}s rss={rss / 1024:7.1f} MiB "
              f"sent={c['sent']:8d} ({(c['sent'] - prev['sent']) / dt:6.0f}/s) "
              f"delivered={c['delivered']:8d} ({(c['delivered'] - prev['delivered']) / dt:6.0f}/s) "
              f"lost={c['lost']} dup={c['dup']} churn={c['churn']} "
              f"fuzz={c['fuzz_connections']}/{c['fuzz_frames']} unotify={c['unotify']} "
              f"slow_recycled={c['slow_recycled']} errors={c['client_errors'] + c['churn_failed']} "
              f"router_errors={router_log_errors(log_path)}", flush=True)
        last[0] = dict(c)
        last[1] = now

    @defer.inlineCallbacks
    def drive():
        try:
            yield soak.run()
            start = time.time()
            last = [dict(soak.counts), start]
            ticker = task.LoopingCall(report, start, last)
            ticker.start(10.0, now=True)
            yield task.deferLater(reactor, args.seconds, lambda: None)
            ticker.stop()
            yield soak.stop()
            report(start, last)
            # SIGTERM: every good client must be told (Disconn 1) and the
            # router must exit.
            reasons = []
            goods = [c for c, _ in soak.publishers] + soak.subscribers
            for conn in goods:
                conn.on_disconnect = lambda reason, a: reasons.append(reason)
            proc.send_signal(signal.SIGTERM)
            yield defer.DeferredList([c.disconnected for c in goods])
            result["disconn"] = (reasons.count(1), len(goods))
        except Exception as e:
            result["failure"] = repr(e)
            import traceback
            traceback.print_exc()
        finally:
            reactor.stop()

    reactor.callWhenRunning(drive)
    reactor.run()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        result["failure"] = "router did not exit within 30 s of SIGTERM"
    c = soak.counts
    judged = [(t, r) for t, r in samples if t >= args.warmup] or samples
    n = len(judged)
    mean_t = sum(t for t, _ in judged) / n
    mean_r = sum(r for _, r in judged) / n
    var = sum((t - mean_t) ** 2 for t, _ in judged)
    slope = (sum((t - mean_t) * (r - mean_r) for t, r in judged) / var) if var else 0.0
    errors = router_log_errors(log_path)
    print(f"summary: {args.seconds:.0f} s, sent {c['sent']} ({c['sent'] / args.seconds:.0f}/s), "
          f"delivered {c['delivered']} ({c['delivered'] / args.seconds:.0f}/s), lost "
          f"{c['lost']}, dup {c['dup']}, good-client DropWarns {c['good_dropwarns']}, "
          f"churned {c['churn']} (failed {c['churn_failed']}), fuzz connections "
          f"{c['fuzz_connections']} ({c['fuzz_frames']} frames), UNotify {c['unotify']}, "
          f"slow consumers recycled {c['slow_recycled']} (DropWarns seen "
          f"{c['slow_dropwarns']}), client errors {c['client_errors']}")
    print(f"router RSS after {args.warmup:.0f} s warm-up: first {judged[0][1] / 1024:.1f} MiB, "
          f"min {min(r for _, r in judged) / 1024:.1f}, max {max(r for _, r in judged) / 1024:.1f}, "
          f"last {judged[-1][1] / 1024:.1f} MiB; trend {slope * 60 / 1024:+.3f} MiB/min "
          f"over {n} samples")
    print(f"router log errors: {errors}; exit status {proc.returncode}; Disconn on SIGTERM: "
          f"{result.get('disconn')}; {result.get('failure', 'ok')}")
    bad = (c["lost"] or c["dup"] or c["good_dropwarns"] or errors or "failure" in result
           or c["client_errors"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
