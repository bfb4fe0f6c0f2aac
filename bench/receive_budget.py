"""How much memory can clients make the router hold in unfinished packets,
and does everyone else stay served meanwhile?

    python bench/receive_budget.py                        # both attacks, default settings
    python bench/receive_budget.py --max-receive-memory 0 # the budget switched off

Starts a router (``twistd -n elvin`` from this working tree, on a free
loopback port, with its defaults but for ``--max-receive-memory``, and a
``Packet.Max-Length`` ceiling of 64 MiB where the router has such a
setting), connects a bystander client, and then runs two attacks, one
after the other, each on loopback:

* **pre-login**: ``--connections`` (200) connections that never send
  ConnRqst, each sending all but 12 bytes of a 2 MiB frame;
* **sessions**: ``--sessions`` (20) connections that negotiate
  ``Packet.Max-Length`` 64 MiB (or whatever is granted) and send all but 12
  bytes of a frame that long.

During each, a thread sends the bystander a TestConn every 50 ms and times
the ConfConn, and samples the router's RSS (``VmRSS`` of
``/proc/<pid>/status``). Printed per attack: the RSS growth over the
router at rest (the peak while sending, and once everything has been
sent), the bystander's slowest and median round trips, and how many attack
connections the router reset. Targets: growth at most 100 MiB, every
bystander round trip within 0.5 s.
"""

import argparse
import os
import platform
import resource
import selectors
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

from connections import frame, read_packet, rss_kib  # noqa: E402  (bench/connections.py)
from elvin.protocols import packets  # noqa: E402
from elvin.test.places import start_twistd  # noqa: E402

MiB = 1 << 20
RSS_TARGET_MIB = 100
RTT_TARGET_S = 0.5


def connect(port, options=None):
    """A connected session: (socket, the options the router granted)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(frame(packets.ConnRqst(1, 4, 0, options or {}, packets.Keys.EMPTY, packets.Keys.EMPTY)))
    reply = read_packet(sock)
    if not isinstance(reply, packets.ConnRply):
        raise SystemExit(f"ConnRqst answered with {reply!r}")
    return sock, dict(reply.options)


def start_router(max_receive_memory):
    workdir = tempfile.mkdtemp(prefix="elvin-receive-budget-")
    conf = os.path.join(workdir, "router.conf")
    lines = []
    if max_receive_memory is not None:
        lines.append(f"max-receive-memory = {max_receive_memory}")
    try:
        from elvin.core.options import HARD_CEILINGS
    except ImportError:
        pass                       # a router without ceilings grants up to 64 MiB
    else:
        lines.append(f"Packet.Max-Length.Ceiling = {HARD_CEILINGS['Packet.Max-Length']}")
    with open(conf, "w") as f:
        f.write("\n".join(lines) + "\n")
    return start_twistd("elvin", lambda port: ["-l", f"elvin://127.0.0.1:{port}", "-c", conf])


class Prober(threading.Thread):
    """Times a TestConn round trip every 50 ms and samples the router's RSS."""

    def __init__(self, sock, pid):
        super().__init__(daemon=True)
        self.sock, self.pid = sock, pid
        self.rtts, self.rss = [], []
        self.stop = threading.Event()
        self.failed = None

    def run(self):
        self.sock.settimeout(10)
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                self.sock.sendall(frame(packets.TestConn()))
                reply = read_packet(self.sock)
            except OSError as e:
                self.failed = f"bystander lost: {e}"
                return
            if not isinstance(reply, packets.ConfConn):
                self.failed = f"bystander got {reply!r}"
                return
            self.rtts.append(time.perf_counter() - started)
            self.rss.append(rss_kib(self.pid))
            self.stop.wait(0.05)


def attack(socks, length, sent):
    """Send each socket a header announcing ``length`` and ``sent`` bytes of
    payload, all at once (non-blocking). Returns how many the router reset."""
    payload = memoryview(struct.pack(">I", length) + bytes(sent))
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_WRITE, [0])
    reset = 0
    while selector.get_map():
        for key, _ in selector.select(timeout=1.0):
            sock, offset = key.fileobj, key.data
            try:
                offset[0] += sock.send(payload[offset[0]:offset[0] + (1 << 20)])
            except BlockingIOError:
                continue
            except OSError:
                reset += 1
                selector.unregister(sock)
                continue
            if offset[0] == len(payload):
                selector.unregister(sock)
    selector.close()
    return reset


def still_open(sock):
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def run(name, pid, bystander, make_socks, frame_length, at_rest):
    """One attack: the figures as a dict (printed by the caller)."""
    socks, length = make_socks()
    prober = Prober(bystander, pid)
    prober.start()
    started = time.perf_counter()
    reset_while_sending = attack(socks, length, length - 12)
    took = time.perf_counter() - started
    time.sleep(1.0)                         # the router reads what is in flight
    held = rss_kib(pid)
    prober.stop.set()
    prober.join()
    alive = sum(1 for sock in socks if still_open(sock))
    for sock in socks:
        sock.close()
    if prober.failed:
        raise SystemExit(f"{name}: {prober.failed}")
    peak = max(prober.rss + [held])
    return {"name": name, "connections": len(socks), "frame": frame_length,
            "sent_s": took, "peak_growth_mib": (peak - at_rest) / 1024,
            "held_growth_mib": (held - at_rest) / 1024,
            "rtt_max_s": max(prober.rtts), "rtt_median_s": statistics.median(prober.rtts),
            "probes": len(prober.rtts), "reset": len(socks) - alive,
            "reset_while_sending": reset_while_sending}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=200,
                        help="pre-login connections (default 200)")
    parser.add_argument("--sessions", type=int, default=20,
                        help="sessions negotiating Packet.Max-Length 64 MiB (default 20)")
    parser.add_argument("--max-receive-memory", type=int, default=None,
                        help="the router's max-receive-memory (default: its default)")
    args = parser.parse_args()
    needed = args.connections + args.sessions + 100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, needed * 2), hard))
    port, proc = start_router(args.max_receive_memory)
    print(f"{platform.node()} {platform.platform()}, python {platform.python_version()}, "
          f"{os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"router pid {proc.pid} on elvin://127.0.0.1:{port}, max-receive-memory "
          f"{'default' if args.max_receive_memory is None else args.max_receive_memory}")
    results = []
    try:
        bystander, _ = connect(port)
        for _ in range(20):                   # warm the code paths
            bystander.sendall(frame(packets.TestConn()))
            read_packet(bystander)
        time.sleep(1.0)
        at_rest = rss_kib(proc.pid)
        print(f"router RSS at rest: {at_rest / 1024:.1f} MiB")

        def pre_login():
            socks = [socket.create_connection(("127.0.0.1", port))
                     for _ in range(args.connections)]
            return socks, 2 * MiB - 4

        results.append(run("pre-login", proc.pid, bystander, pre_login, 2 * MiB, at_rest))

        granted = []

        def sessions():
            socks = []
            for _ in range(args.sessions):
                sock, options = connect(port, {"Packet.Max-Length": 64 * MiB})
                granted.append(options.get("Packet.Max-Length", 2 * MiB))
                socks.append(sock)
            return socks, min(granted) & ~3

        time.sleep(1.0)
        at_rest2 = rss_kib(proc.pid)
        results.append(run("sessions", proc.pid, bystander, sessions, None, at_rest2))
        results[-1]["frame"] = min(granted)
        results[-1]["at_rest_mib"] = at_rest2 / 1024
    finally:
        proc.terminate()
        proc.wait()
    ok = True
    for r in results:
        met = r["peak_growth_mib"] <= RSS_TARGET_MIB and r["rtt_max_s"] <= RTT_TARGET_S
        ok = ok and met
        print(f"{r['name']}: {r['connections']} connections x all but 12 bytes of a "
              f"{r['frame'] / MiB:g} MiB frame, sent in {r['sent_s']:.1f} s; "
              f"router RSS +{r['peak_growth_mib']:.1f} MiB at peak, "
              f"+{r['held_growth_mib']:.1f} MiB after; "
              f"{r['reset']} of {r['connections']} connections reset; bystander TestConn "
              f"max {r['rtt_max_s'] * 1000:.1f} ms, median {r['rtt_median_s'] * 1000:.1f} ms "
              f"({r['probes']} probes) -> {'OK' if met else 'MISSED'}")
    print(f"targets: RSS growth <= {RSS_TARGET_MIB} MiB, bystander within "
          f"{RTT_TARGET_S} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
