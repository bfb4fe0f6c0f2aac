"""The attacks of bench/subscription_budget.py, bench/receive_budget.py and
bench/fd_exhaustion.py, sent through the TLS, HTTP-tunnel and UDP
listeners instead of plain TCP.

    python bench/transport_attacks.py                   # every attack
    python bench/transport_attacks.py subscription frames idle udp
    python bench/transport_attacks.py idle --limit 1024 --idle 1030

Starts a router (``twistd -n elvin`` from this working tree, 127.0.0.1
only) listening on TCP, TLS (``elvin:/secure/...``, a throwaway trustme
certificate), the HTTP tunnel (``elvin:/http,none,xdr/...``) and UDP
(``elvin:/udp,none,xdr/...``), with its status listener, its defaults and
a ``Packet.Max-Length`` ceiling of 64 MiB (as receive_budget.py). A
bystander, a plain TCP client, sends TestConn every 50 ms throughout and
times the ConfConn; the router's RSS and CPU are sampled. Attacks:

* ``subscription``: one costly subscription at the budgets' limits
  (subscription_budget.py's set) through TLS and through the tunnel.
* ``frames``: unfinished large frames. TLS: 200 connections that never
  send ConnRqst, each sending all but 12 bytes of a 2 MiB frame after the
  handshake; 20 TLS sessions negotiating 64 MiB packets doing the same
  with a 64 MiB frame. HTTP: 200 ``POST /elvin/session`` bodies of 2 MiB
  missing their last 12 bytes; 20 tunnel sessions negotiating 64 MiB
  packets, each POSTing a whole body that holds all but 12 bytes of a
  64 MiB frame; and a flood of tunnel sessions that never send ConnRqst.
* ``idle``: a second router under an open-file limit of ``--limit``
  (1,024): ``--idle`` (1,030) TLS sockets that never finish the handshake
  (half send nothing, half an unfinished ClientHello record), then as many
  HTTP connections sending no request (half nothing, half an unfinished
  request line); after each, new TCP, TLS and HTTP clients are timed.
* ``handshakes`` (only when named): ``--handshakes`` (4,000) TLS sockets
  that never finish the handshake under a high open-file limit, against a
  router with its defaults and then with the handshake bounds off
  (``max-tls-handshakes = 0``, ``tls-handshake-timeout = 0``).
* ``udp``: 5 s floods of datagrams: valid UNotify of the largest size,
  UNotify over the attribute limits, malformed (a decodable prefix,
  then garbage) and random bytes. Counted: datagrams sent, UNotify the
  router took or refused (``/status.json``), datagrams the kernel dropped
  at the router's socket (``/proc/net/udp``).

Targets (docs/reliability.md): bystander answered within 0.5 s, RSS growth at most
100 MiB, new clients served under the open-file limit.
"""

import argparse
import http.client
import json
import os
import platform
import random
import re
import resource
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path[:0] = [ROOT, HERE]

from connections import frame, read_packet, rss_kib  # noqa: E402
from fd_exhaustion import elvin_round_trip, free_port, closed_count  # noqa: E402
from receive_budget import Prober  # noqa: E402
from subscription_budget import costly_requests  # noqa: E402
from elvin.protocols import packets as elvin_packets  # noqa: E402

MiB = 1 << 20
RTT_TARGET_S = 0.5
RSS_TARGET_MIB = 100
CONNRQST = elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY)


# -- the router ----------------------------------------------------------------

class Router:
    """A ``twistd -n elvin`` subprocess listening on every transport."""

    def __init__(self, limit=None, workdir=None, settings=""):
        self.workdir = workdir or tempfile.mkdtemp(prefix="elvin-transports-")
        import trustme
        ca = trustme.CA()
        self.ca = os.path.join(self.workdir, "ca.pem")
        ca.cert_pem.write_to_path(self.ca)
        cert = ca.issue_cert("127.0.0.1")
        self.cert = os.path.join(self.workdir, "router.pem")
        self.key = os.path.join(self.workdir, "router.key")
        cert.cert_chain_pems[0].write_to_path(self.cert)
        cert.private_key_pem.write_to_path(self.key)
        self.tcp, self.tls, self.http, self.status = (free_port() for _ in range(4))
        self.udp = free_port()
        from elvin.core.options import HARD_CEILINGS
        conf = os.path.join(self.workdir, "router.conf")
        with open(conf, "w") as f:
            f.write(f"listen = elvin://127.0.0.1:{self.tcp}\n"
                    f"listen = elvin:/secure/127.0.0.1:{self.tls}\n"
                    f"listen = elvin:/http,none,xdr/127.0.0.1:{self.http}\n"
                    f"listen = elvin:/udp,none,xdr/127.0.0.1:{self.udp}\n"
                    f"status-listen = http://127.0.0.1:{self.status}\n"
                    f"tls-certificate = {self.cert}\ntls-key = {self.key}\n"
                    f"Packet.Max-Length.Ceiling = {HARD_CEILINGS['Packet.Max-Length']}\n"
                    + settings)
        code = ("import sys; sys.argv = ['twistd', '-n', '--pidfile=', 'elvin', '-c', %r]; "
                "from twisted.scripts.twistd import run; run()" % conf)
        self.log_path = os.path.join(self.workdir, "router.log")
        log = open(self.log_path, "w")

        def lower_limit():
            if limit:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT, preexec_fn=lower_limit)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        for port in (self.tcp, self.tls, self.http, self.status):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"router did not start; see {self.log_path}")
                    time.sleep(0.1)
        self.context = ssl.create_default_context(cafile=self.ca)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)

    def rss_mib(self):
        return rss_kib(self.pid) / 1024

    def cpu_s(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def open_files(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def status_json(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.status, timeout=10)
        conn.request("GET", "/status.json")
        body = conn.getresponse().read()
        conn.close()
        return json.loads(body)

    def totals(self):
        """``/status.json``'s totals."""
        return self.status_json()["totals"]

    def udp_drops(self):
        """Datagrams the kernel dropped at the router's UDP socket."""
        with open("/proc/net/udp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[1].split(":")[1], 16) == self.udp:
                    return int(fields[-1])
        return 0

    def log_lines(self, *words):
        with open(self.log_path) as f:
            return [line.rstrip() for line in f if any(w in line for w in words)]

    # -- clients ------------------------------------------------------------

    def tls_socket(self, handshake=True):
        raw = socket.create_connection(("127.0.0.1", self.tls), timeout=10)
        sock = self.context.wrap_socket(raw, server_hostname="127.0.0.1",
                                        do_handshake_on_connect=handshake)
        return sock

    def tls_session(self, options=None):
        sock = self.tls_socket()
        sock.sendall(frame(elvin_packets.ConnRqst(1, 4, 0, options or {}, elvin_packets.Keys.EMPTY,
                                      elvin_packets.Keys.EMPTY)))
        reply = read_packet(sock)
        if not isinstance(reply, elvin_packets.ConnRply):
            raise ConnectionError(f"ConnRqst over TLS answered with {reply!r}")
        return sock, dict(reply.options)

    def bystander(self):
        sock = socket.create_connection(("127.0.0.1", self.tcp))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(frame(CONNRQST))
        assert isinstance(read_packet(sock), elvin_packets.ConnRply)
        for _ in range(20):
            sock.sendall(frame(elvin_packets.TestConn()))
            read_packet(sock)
        return sock


class Tunnel:
    """A minimal client of the HTTP tunnel (docs/protocols.md), blocking."""

    def __init__(self, port, options=None, timeout=30):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        body = frame(elvin_packets.ConnRqst(1, 4, 0, options or {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        status, data = self.request("POST", "/elvin/session", body)
        if status != 201:
            raise ConnectionError(f"POST /elvin/session answered {status} {data[:60]!r}")
        self.path = "/elvin/session/" + data.decode("ascii")
        self.seq = 1
        replies = self.fetch()
        if not replies or not isinstance(replies[0], elvin_packets.ConnRply):
            raise ConnectionError(f"tunnel ConnRqst answered with {replies!r}")
        self.options = dict(replies[0].options)

    def request(self, method, path, body=None):
        self.conn.request(method, path, body=body,
                          headers={"Content-Type": "application/x-elvin-xdr"})
        response = self.conn.getresponse()
        return response.status, response.read()

    def post(self, data):
        status, _ = self.request("POST", f"{self.path}?seq={self.seq}", data)
        self.seq += 1
        return status

    def fetch(self):
        """The packets of one long poll."""
        status, data = self.request("GET", self.path + "?mode=poll")
        if status != 200:
            raise ConnectionError(f"GET answered {status}")
        packets, offset = [], 0
        while offset + 4 <= len(data):
            (length,) = struct.unpack(">I", data[offset:offset + 4])
            packets.append(elvin_packets.decode(data[offset + 4:offset + 4 + length]))
            offset += 4 + length
        return packets

    def close(self):
        try:
            self.request("DELETE", self.path)
        except (OSError, http.client.HTTPException):
            pass
        self.conn.close()


def new_client_round_trips(router, timeout=10.0):
    """A new TCP, TLS and HTTP client each: connect, ConnRqst, TestConn.
    {kind: seconds for the whole exchange, or the error}."""
    result = {}
    try:
        connect, test = elvin_round_trip(router.tcp, timeout)
        result["tcp"] = connect + test
    except (OSError, ConnectionError) as e:
        result["tcp"] = f"failed: {e}"
    start = time.perf_counter()
    try:
        sock, _ = router.tls_session()
        sock.sendall(frame(elvin_packets.TestConn()))
        assert isinstance(read_packet(sock), elvin_packets.ConfConn)
        sock.close()
        result["tls"] = time.perf_counter() - start
    except (OSError, ConnectionError, AssertionError) as e:
        result["tls"] = f"failed: {e!r}"
    start = time.perf_counter()
    try:
        tunnel = Tunnel(router.http, timeout=timeout)
        tunnel.post(frame(elvin_packets.TestConn()))
        replies = tunnel.fetch()
        assert any(isinstance(p, elvin_packets.ConfConn) for p in replies), replies
        tunnel.close()
        result["http"] = time.perf_counter() - start
    except (OSError, ConnectionError, AssertionError, http.client.HTTPException) as e:
        result["http"] = f"failed: {e!r}"
    return result


def show_round_trips(label, results):
    """One line: per kind, served n/N, median and max (ms)."""
    parts = []
    for kind in ("tcp", "tls", "http"):
        values = [r[kind] for r in results]
        good = [v for v in values if isinstance(v, float)]
        bad = [v for v in values if not isinstance(v, float)]
        text = f"{kind} {len(good)}/{len(values)}"
        if good:
            text += (f" (median {statistics.median(good) * 1000:.1f} ms, "
                     f"max {max(good) * 1000:.1f} ms)")
        if bad:
            text += f" [{bad[0]}]"
        parts.append(text)
    print(f"  {label}: new clients served: " + "; ".join(parts))
    return all(isinstance(r[k], float) for r in results for k in r)


class Watch:
    """A bystander prober (receive_budget.Prober) plus the router's CPU."""

    def __init__(self, router, bystander):
        self.router = router
        self.prober = Prober(bystander, router.pid)
        self.rss0 = router.rss_mib()
        self.cpu0 = router.cpu_s()
        self.t0 = time.perf_counter()
        self.prober.start()

    def stop(self):
        self.prober.stop.set()
        self.prober.join()
        seconds = time.perf_counter() - self.t0
        rss = self.router.rss_mib()
        rtts = self.prober.rtts or [float("nan")]
        peak = max([r / 1024 for r in self.prober.rss] + [rss])
        self.figures = {
            "rtt_max_ms": max(rtts) * 1000, "rtt_median_ms": statistics.median(rtts) * 1000,
            "probes": len(self.prober.rtts), "rss_peak_mib": peak - self.rss0,
            "rss_after_mib": rss - self.rss0,
            "cpu_pct": 100 * (self.router.cpu_s() - self.cpu0) / seconds,
            "failed": self.prober.failed}
        return self.figures

    def line(self):
        f = self.figures
        ok = (f["rtt_max_ms"] <= RTT_TARGET_S * 1000 and f["rss_peak_mib"] <= RSS_TARGET_MIB
              and not f["failed"])
        return (f"bystander TestConn max {f['rtt_max_ms']:.1f} ms, median "
                f"{f['rtt_median_ms']:.1f} ms ({f['probes']} probes); router RSS "
                f"+{f['rss_peak_mib']:.1f} MiB at peak, +{f['rss_after_mib']:.1f} MiB after; "
                f"router CPU {f['cpu_pct']:.0f}%"
                + (f"; {f['failed']}" if f["failed"] else "")
                + (" -> OK" if ok else " -> MISSED")), ok


def send_all(socks, payload, timeout=60.0):
    """Each socket sends ``payload`` (a thread each, blocking). Returns how
    many were reset or closed by the router while sending."""
    reset = []

    def one(sock):
        try:
            sock.settimeout(timeout)
            sock.sendall(payload)
        except (OSError, ssl.SSLError):
            reset.append(sock)
    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return len(reset)


def open_at_end(sock):
    """False when the router has closed or reset ``sock``."""
    sock.setblocking(False)
    try:
        if isinstance(sock, ssl.SSLSocket):
            return sock.recv(1) != b""
        return sock.recv(1, socket.MSG_PEEK) != b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return True
    except (OSError, ssl.SSLError):
        return False


# -- (a) one costly subscription ------------------------------------------------

def attack_subscription(router, bystander):
    print("-- (a) one costly subscription at the budgets' limits, through TLS and the "
          "HTTP tunnel --")
    ok = True
    tls, options = router.tls_session({"Subscription.Max-Length": 2 ** 31 - 1})
    tunnel = Tunnel(router.http, {"Subscription.Max-Length": 2 ** 31 - 1})
    max_length = options["Subscription.Max-Length"]
    print(f"  Subscription.Max-Length granted: {max_length} (TLS), "
          f"{tunnel.options['Subscription.Max-Length']} (HTTP)")
    xid = 10
    for label, expression in costly_requests(max_length, 16384):
        for kind in ("tls", "http"):
            watch = Watch(router, bystander)
            time.sleep(0.1)
            start = time.perf_counter()
            if kind == "http":   # other names: not a shared compiled expression
                expression = re.sub(r"\b(a|id)\b", r"\1x", expression)
            packet = frame(elvin_packets.SubAddRqst(xid, expression, True, elvin_packets.Keys.EMPTY))
            if kind == "tls":
                tls.sendall(packet)
                reply = read_packet(tls)
            else:
                tunnel.post(packet)
                replies = tunnel.fetch()
                reply = replies[0] if replies else None
            took = time.perf_counter() - start
            time.sleep(0.1)
            watch.stop()
            answer = type(reply).__name__
            if isinstance(reply, elvin_packets.Nack):
                answer += f" {reply.error}"
            line, met = watch.line()
            ok = ok and met
            print(f"  {kind:4} {label:24} {len(expression):6d} B answered in {took:.3f} s "
                  f"({answer}); {line}")
            xid += 1
    tls.close()
    tunnel.close()
    return ok


# -- (b) unfinished large frames -----------------------------------------------

def attack_frames(router, bystander, connections, sessions):
    print(f"-- (b) unfinished large frames: {connections} pre-login connections x 2 MiB, "
          f"{sessions} sessions x 64 MiB --")
    ok = True

    def report(name, watch, socks, reset_sending, extra=""):
        nonlocal ok
        time.sleep(1.0)
        figures = watch.stop()
        alive = sum(1 for s in socks if open_at_end(s))
        for s in socks:
            s.close()
        line, met = watch.line()
        ok = ok and met
        print(f"  {name}: {len(socks) - alive} of {len(socks)} reset by the router "
              f"({reset_sending} while sending){extra}; {line}")
        time.sleep(1.0)
        return figures

    # TLS, pre-login: handshake done, no ConnRqst.
    socks = [router.tls_socket() for _ in range(connections)]
    watch = Watch(router, bystander)
    payload = struct.pack(">I", 2 * MiB - 4) + bytes(2 * MiB - 4 - 12)
    reset = send_all(socks, payload, timeout=20)
    report("TLS pre-login (no ConnRqst), 2 MiB frames", watch, socks, reset)

    # TLS sessions with Packet.Max-Length 64 MiB.
    socks, granted = [], []
    for _ in range(sessions):
        sock, options = router.tls_session({"Packet.Max-Length": 64 * MiB})
        socks.append(sock)
        granted.append(options.get("Packet.Max-Length", 2 * MiB))
    length = min(granted) & ~3
    watch = Watch(router, bystander)
    payload = struct.pack(">I", length) + bytes(length - 12)
    reset = send_all(socks, payload, timeout=60)
    report(f"TLS sessions, {length / MiB:g} MiB frames", watch, socks, reset)

    # HTTP: POST bodies that never complete.
    files0 = router.open_files()
    socks = [socket.create_connection(("127.0.0.1", router.http)) for _ in range(connections)]
    watch = Watch(router, bystander)
    body = 2 * MiB
    head = (f"POST /elvin/session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"application/x-elvin-xdr\r\nContent-Length: {body}\r\n\r\n").encode()
    reset = send_all(socks, head + bytes(body - 12), timeout=20)
    time.sleep(1.0)
    files = router.open_files() - files0
    report("HTTP POST bodies of 2 MiB, unfinished", watch, socks, reset,
           f"; router open files +{files} while held")

    # HTTP: sessions with Packet.Max-Length 64 MiB, each POSTing a complete
    # body that holds an unfinished 64 MiB frame.
    tunnels = [Tunnel(router.http, {"Packet.Max-Length": 64 * MiB}, timeout=120)
               for _ in range(sessions)]
    length = min(t.options.get("Packet.Max-Length", 2 * MiB) for t in tunnels) & ~3
    watch = Watch(router, bystander)
    payload = struct.pack(">I", length) + bytes(length - 12)
    statuses, ended = [], 0

    def post(tunnel):
        try:
            statuses.append(tunnel.post(payload))
        except (OSError, http.client.HTTPException):
            statuses.append("reset")
    threads = [threading.Thread(target=post, args=(t,), daemon=True) for t in tunnels]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    time.sleep(1.0)
    for tunnel in tunnels:
        try:
            tunnel.fetch()
        except (OSError, ConnectionError, http.client.HTTPException):
            ended += 1
    figures = watch.stop()
    line, met = watch.line()
    ok = ok and met
    counts = {s: statuses.count(s) for s in set(statuses)}
    print(f"  HTTP tunnel sessions, bodies holding all but 12 bytes of a {length / MiB:g} "
          f"MiB frame: POST answers {counts}; {ended} of {len(tunnels)} sessions ended by "
          f"the router; {line}")
    for tunnel in tunnels:
        tunnel.conn.close()
    time.sleep(1.0)
    closes = router.totals().get("receive_budget_closes")
    print(f"  receive-budget closes so far (/status.json): {closes}")
    return ok, figures


def attack_sessions(router, bystander, count):
    """Tunnel sessions that never send ConnRqst, opened over one keep-alive
    HTTP connection: how many are granted, and are others still served?"""
    print(f"-- (b') {count} HTTP tunnel sessions that never send ConnRqst --")
    watch = Watch(router, bystander)
    conn = http.client.HTTPConnection("127.0.0.1", router.http, timeout=30)
    codes = {}
    start = time.perf_counter()
    for _ in range(count):
        conn.request("POST", "/elvin/session", body=b"")
        response = conn.getresponse()
        response.read()
        codes[response.status] = codes.get(response.status, 0) + 1
    took = time.perf_counter() - start
    channels = len(router.status_json()["clients"])
    rounds = [new_client_round_trips(router) for _ in range(5)]
    watch.stop()
    line, met = watch.line()
    print(f"  POST /elvin/session answers {codes} in {took:.1f} s; channels open in "
          f"the router (any state): {channels}; {line}")
    served = show_round_trips("while they are held", rounds)
    conn.close()
    return met and served


# -- (c) idle sockets under an open-file limit ---------------------------------

def open_stalled(port, count, junk, every=2):
    """``count`` sockets to ``port``, every ``every``-th sending ``junk``
    (an unfinished record or request) and nothing more: ``(sockets,
    seconds taken)``."""
    socks = []
    start = time.perf_counter()
    for i in range(count):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            if i % every == every - 1:
                s.sendall(junk)
        except OSError:
            pass
        socks.append(s)
    return socks, time.perf_counter() - start


def attack_idle(limit, idle, clients, sessions):
    print(f"-- (c) idle sockets, router under an open-file limit of {limit} --")
    router = Router(limit=limit)
    ok = True
    try:
        bystander = router.bystander()
        print("  " + "; ".join(line.split("] ", 1)[-1] for line in router.log_lines("lowered")))
        before = [new_client_round_trips(router) for _ in range(3)]
        show_round_trips("before", before)
        body_head = (b"POST /elvin/session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Length: 200000\r\n\r\n")
        for kind, port, junk, what in (
                ("TLS", router.tls, b"\x16\x03\x01\x02\x00\x01",
                 "no handshake; half send an unfinished ClientHello record"),
                ("HTTP", router.http, b"POST /elvin/sess",
                 "no request; half send an unfinished request line"),
                ("HTTP", router.http, body_head + bytes(150000),
                 "every one an unfinished 200 KB POST body (150 KB sent)"),
                ("HTTP", router.http, body_head,
                 "every one the headers of a 200 KB POST, no body yet")):
            watch = Watch(router, bystander)
            socks, opened = open_stalled(port, idle, junk, every=1 if len(junk) > 100 else 2)
            rounds = [new_client_round_trips(router) for _ in range(clients)]
            watch.stop()
            line, met = watch.line()
            closed = closed_count(socks)
            print(f"  {idle} idle {kind} sockets ({what}) opened in {opened:.1f} s; "
                  f"{closed} closed by the "
                  f"router by the end; router open files {router.open_files()}; {line}")
            ok = show_round_trips(f"with the idle {kind} sockets held", rounds) and ok and met
            for s in socks:
                s.close()
            time.sleep(1.0)
        sockets = router.totals().get("sockets", {})
        for pool, stats in sockets.items():
            print(f"    {pool}: {stats}")
        if sessions:
            ok = attack_sessions(router, bystander, sessions) and ok
        print("  router log: " + " | ".join(
            line.split("] ", 1)[-1][:160]
            for line in router.log_lines("at their cap", "refusing channel")[:4]))
    finally:
        router.stop()
    return ok


def attack_handshakes(count, clients, settings):
    """``count`` TLS sockets that never finish their handshake (half send
    nothing, half an unfinished ClientHello record, whose read buffer is
    the larger), opened at once under a high open-file limit, against a
    router with its defaults plus ``settings``."""
    label = settings.strip().replace("\n", ", ") or "defaults"
    print(f"-- (e) {count} stalled TLS handshakes, router with {label} --")
    router = Router(settings=settings)
    try:
        bystander = router.bystander()
        watch = Watch(router, bystander)
        socks, opened = open_stalled(router.tls, count, b"\x16\x03\x01\x02\x00\x01")
        time.sleep(1.0)
        rounds = [new_client_round_trips(router) for _ in range(clients)]
        held = router.open_files()
        watch.stop()
        line, met = watch.line()
        closed = closed_count(socks)
        sockets = router.totals().get("sockets", {}).get("client", {})
        print(f"  opened in {opened:.1f} s; {closed} closed by the router by the end; "
              f"router open files {held}; closed in handshake "
              f"{sockets.get('closed_in_handshake')}; {line}")
        ok = show_round_trips("with the stalled handshakes held", rounds) and met
        for s in socks:
            s.close()
    finally:
        router.stop()
    return ok


# -- (d) UDP floods -------------------------------------------------------------

def unotify(attributes):
    return elvin_packets.encode(elvin_packets.UNotify(4, 0, attributes, True, elvin_packets.Keys.EMPTY))


def datagrams(max_size=65507):
    """(label, datagram) for each flood."""
    # The largest valid UNotify: 256 attributes (Attribute.Max-Count) of strings.
    size = (max_size - 200) // 256 - 24
    big = {f"a{i:03d}": "x" * size for i in range(256)}
    data = unotify(big)
    while len(data) > max_size:
        size -= 1
        data = unotify({f"a{i:03d}": "x" * size for i in range(256)})
    yield "valid UNotify, 256 string attributes", data
    # Over the attribute limits: as many int32 attributes as fit (decoding
    # is the costliest per byte here), refused by Attribute.Max-Count.
    n = max_size // 16
    many = unotify({f"{i:x}"[:3] + str(i): i for i in range(n)})
    while len(many) > max_size:
        n -= 50
        many = unotify({f"{i:x}"[:3] + str(i): i for i in range(n)})
    yield f"UNotify over Attribute.Max-Count ({n} int32 attributes)", many
    # Malformed: the same, decodable until its last bytes.
    yield "malformed (decodable prefix, bad tail)", many[:-3] + b"\xff\xff\xff"
    rnd = random.Random(1)
    yield "random bytes", bytes(rnd.getrandbits(8) for _ in range(max_size))


def attack_udp(router, bystander, seconds, senders):
    print(f"-- (d) UDP floods, {seconds:g} s each, {senders} sending threads --")
    ok = True
    for label, data in datagrams():
        totals0 = router.totals()
        drops0 = router.udp_drops()
        watch = Watch(router, bystander)
        sent = [0] * senders
        deadline = time.monotonic() + seconds

        def flood(i):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            while time.monotonic() < deadline:
                try:
                    s.sendto(data, ("127.0.0.1", router.udp))
                    sent[i] += 1
                except OSError:
                    pass
            s.close()
        threads = [threading.Thread(target=flood, args=(i,), daemon=True)
                   for i in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(1.0)
        watch.stop()
        totals = router.totals()
        drops = router.udp_drops() - drops0
        took = totals.get("unotify_received", 0) - totals0.get("unotify_received", 0)
        refused = (totals.get("notifications_rejected", 0)
                   - totals0.get("notifications_rejected", 0))
        line, met = watch.line()
        ok = ok and met
        total = sum(sent)
        print(f"  {label}: {len(data)} B x {total} sent ({total / seconds:,.0f}/s); "
              f"kernel dropped {drops}; router read {total - drops}, UNotify taken {took}, "
              f"refused by limits {refused}, dropped as malformed/other "
              f"{total - drops - took}; {line}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("attacks", nargs="*",
                        default=["subscription", "frames", "sessions", "idle", "udp"],
                        help="subscription, frames, sessions, idle, udp, handshakes "
                             "(default: all but handshakes)")
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--tunnels", type=int, default=2000,
                        help="tunnel sessions without ConnRqst (sessions, idle)")
    parser.add_argument("--limit", type=int, default=1024)
    parser.add_argument("--idle", type=int, default=1030)
    parser.add_argument("--handshakes", type=int, default=4000,
                        help="stalled TLS handshakes (handshakes)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--senders", type=int, default=2)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * max(args.idle, args.handshakes) + args.connections + 200
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, needed * 2), hard))
    print(f"{platform.node()} {platform.platform()}, python {platform.python_version()}, "
          f"{os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    ok = True
    needs_router = [a for a in args.attacks if a not in ("idle", "handshakes")]
    if needs_router:
        router = Router()
        print(f"router pid {router.pid}: tcp {router.tcp}, tls {router.tls}, http "
              f"{router.http}, udp {router.udp}, status {router.status}; "
              f"RSS at rest {router.rss_mib():.1f} MiB; log {router.log_path}")
        try:
            bystander = router.bystander()
            if "subscription" in args.attacks:
                ok = attack_subscription(router, bystander) and ok
            if "frames" in args.attacks:
                ok = attack_frames(router, bystander, args.connections, args.sessions)[0] and ok
            if "sessions" in args.attacks:
                ok = attack_sessions(router, bystander, args.tunnels) and ok
            if "udp" in args.attacks:
                ok = attack_udp(router, bystander, args.seconds, args.senders) and ok
            print(f"router RSS at the end: {router.rss_mib():.1f} MiB")
        finally:
            router.stop()
    if "idle" in args.attacks:
        ok = attack_idle(args.limit, args.idle, args.clients, args.tunnels) and ok
    if "handshakes" in args.attacks:
        for settings in ("", "max-tls-handshakes = 0\ntls-handshake-timeout = 0\n"):
            ok = attack_handshakes(args.handshakes, args.clients, settings) and ok
    print(f"targets (bystander within {RTT_TARGET_S} s, RSS +{RSS_TARGET_MIB} MiB at most, "
          f"new clients served): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
