"""How much memory does a router spend per connected client?

    python bench/connections.py                  # 5,000 connections
    python bench/connections.py -n 10000 --subscribe

Raises this process's file-descriptor limit to its hard limit (the router
subprocess inherits it), starts a router (``twistd -n elvin`` run by
``python -c`` from the repository root, so it is this working tree's
code), opens N client connections on loopback, each completing the
ConnRqst/ConnRply handshake, holds them, and prints the router's RSS
before and after, and per connection. With ``--subscribe`` each connection
then registers one subscription and the RSS is measured again. Before
letting go it checks the router still routes (a fresh client publishes to
one of the held connections), then closes everything and measures once
more, and repeats the whole load ``--rounds`` times in all: after the first
round the RSS must stay put (freed memory is reused, nothing leaks).
"""

import argparse
import os
import platform
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from elvin.protocols import packets  # noqa: E402


def frame(packet):
    data = packets.encode(packet)
    return struct.pack(">I", len(data)) + data


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def read_packet(sock, decode=None):
    """One whole packet from a blocking socket (``decode``: a federation
    link's, say; default a client's)."""
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("router closed the connection")
            data += chunk
        return data
    (length,) = struct.unpack(">I", exactly(4))
    return (decode or packets.decode)(exactly(length))


def raise_fd_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"file descriptor limit: soft {soft}, hard {hard} (need about {needed})")
    if soft < needed:
        raise SystemExit(f"cannot hold {needed} descriptors; raise the hard limit "
                         "(ulimit -Hn) or use a smaller -n")


def start_router(port, max_connections):
    workdir = tempfile.mkdtemp(prefix="elvin-connections-")
    conf = os.path.join(workdir, "router.conf")
    with open(conf, "w") as f:
        f.write(f"listen = elvin://127.0.0.1:{port}\nmax-connections = {max_connections}\n")
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
                raise SystemExit(f"router exited; see {log.name}")
            time.sleep(0.1)
    raise SystemExit("router did not start")


def settle(pid, seconds=1.0):
    time.sleep(seconds)
    return rss_kib(pid)


def handshake_all(socks, packet_for, expect):
    """Send each socket its packet, then read every reply (pipelined)."""
    for i, sock in enumerate(socks):
        sock.sendall(frame(packet_for(i)))
    for sock in socks:
        reply = read_packet(sock)
        if not isinstance(reply, expect):
            raise SystemExit(f"unexpected reply {reply!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--connections", type=int, default=5000)
    parser.add_argument("--subscribe", action="store_true",
                        help="also give each connection one subscription")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times to open and close the N connections (RSS must not "
                             "grow after the first)")
    args = parser.parse_args()
    n = args.connections
    raise_fd_limit(n + 100)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, log_path = start_router(port, max(n + 10, 10_000))
    print(f"{platform.node()} {platform.platform()}, python {platform.python_version()}, "
          f"{os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"router pid {proc.pid} on elvin://127.0.0.1:{port}; log {log_path}")
    try:
        # Warm the code paths with one client first, so the baseline is the
        # router at rest rather than before its first import of anything.
        warm = socket.create_connection(("127.0.0.1", port))
        handshake_all([warm], lambda i: packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY),
                      packets.ConnRply)
        handshake_all([warm], lambda i: packets.SubAddRqst(2, "warm == 1", True, packets.Keys.EMPTY),
                      packets.SubRply)
        before = settle(proc.pid)
        print(f"router RSS at rest: {before / 1024:.1f} MiB")

        started = time.time()
        socks = []
        # In batches of 100, each finishing its handshakes before the next
        # is opened: a faster burst only overflows the router's accept
        # queue (backlog 128) and measures the kernel's 1 s SYN retry.
        for first in range(0, n, 100):
            batch = []
            for _ in range(min(100, n - first)):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                batch.append(sock)
            handshake_all(batch, lambda i: packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY,
                                                      packets.Keys.EMPTY), packets.ConnRply)
            socks.extend(batch)
        took = time.time() - started
        held = settle(proc.pid, 2.0)
        print(f"{n} connections opened and past ConnRqst/ConnRply in {took:.1f} s "
              f"({n / took:,.0f}/s)")
        print(f"router RSS holding {n}: {held / 1024:.1f} MiB; "
              f"{(held - before) / 1024:.1f} MiB more, {(held - before) * 1024 / n:,.0f} "
              f"bytes per connection")
        subscribed = held
        if args.subscribe:
            handshake_all(socks, lambda i: packets.SubAddRqst(2, f"n == {i}", True, packets.Keys.EMPTY),
                          packets.SubRply)
            subscribed = settle(proc.pid, 2.0)
            print(f"router RSS with one subscription each: {subscribed / 1024:.1f} MiB; "
                  f"{(subscribed - before) * 1024 / n:,.0f} bytes per connection in all")
        # Still routing: a new client publishes to the last held connection.
        probe = socket.create_connection(("127.0.0.1", port))
        handshake_all([probe], lambda i: packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY),
                      packets.ConnRply)
        target = socks[-1]
        if not args.subscribe:
            handshake_all([target], lambda i: packets.SubAddRqst(2, f"n == {n - 1}", True,
                                                           packets.Keys.EMPTY), packets.SubRply)
        t0 = time.time()
        probe.sendall(frame(packets.NotifyEmit({"n": n - 1}, True, packets.Keys.EMPTY)))
        delivered = read_packet(target)
        assert isinstance(delivered, packets.NotifyDeliver), delivered
        print(f"still routing: delivered to connection {n} in "
              f"{(time.time() - t0) * 1000:.1f} ms")
        for sock in socks + [probe]:
            sock.close()
        after = settle(proc.pid, 3.0)
        print(f"router RSS after closing them all: {after / 1024:.1f} MiB (Python keeps "
              "freed memory for reuse rather than returning it)")
        # Reuse, not a leak: further rounds of the same load must not grow it.
        again = []
        for round_ in range(args.rounds - 1):
            socks = []
            for first in range(0, n, 100):
                batch = [socket.create_connection(("127.0.0.1", port))
                         for _ in range(min(100, n - first))]
                handshake_all(batch, lambda i: packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY,
                                                          packets.Keys.EMPTY), packets.ConnRply)
                if args.subscribe:
                    handshake_all(batch, lambda i, f=first: packets.SubAddRqst(
                        2, f"n == {f + i}", True, packets.Keys.EMPTY), packets.SubRply)
                socks.extend(batch)
            peak = settle(proc.pid, 2.0)
            for sock in socks:
                sock.close()
            again.append((peak, settle(proc.pid, 3.0)))
            print(f"round {round_ + 2}: router RSS holding {n}: {peak / 1024:.1f} MiB, "
                  f"after closing: {again[-1][1] / 1024:.1f} MiB")
        warm.close()
        print(f"RESULT connections={n} rest_mib={before / 1024:.1f} held_mib={held / 1024:.1f} "
              f"per_connection_bytes={(held - before) * 1024 / n:.0f}"
              + (f" with_subscription_bytes={(subscribed - before) * 1024 / n:.0f}"
                 if args.subscribe else "")
              + f" after_close_mib={after / 1024:.1f}"
              + "".join(f" round{i + 2}_after_close_mib={a / 1024:.1f}"
                        for i, (_, a) in enumerate(again)))
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
