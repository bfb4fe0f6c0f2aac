"""Can idle sockets lock clients out of a router with few open files?

    python bench/fd_exhaustion.py                 # ulimit -n 1024, 1,030 idle sockets
    python bench/fd_exhaustion.py --limit 256 --idle 300

Starts a router (``twistd -n elvin`` run by ``python -c`` from the
repository root, so it is this working tree's code) under an open-file
limit of ``--limit`` (soft and hard, set with ``resource.setrlimit`` in
the child before it starts), with its status listener on. An "attacker"
then opens ``--idle`` loopback sockets to the Elvin port and as many to the
status port and sends nothing on them. Then, ``--clients`` times, a new
client connects, sends ConnRqst, waits for ConnRply, sends TestConn and
waits for ConfConn; and a status request (``GET /status.json``) is made.
It prints each round trip's figures, how many of the idle sockets the
router had closed by the end, and the router's log lines about its caps.
"""

import argparse
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from connections import frame, read_packet  # noqa: E402  (bench/connections.py)
from elvin.protocols import packets  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_router(limit, port, status_port, workdir):
    conf = os.path.join(workdir, "router.conf")
    with open(conf, "w") as f:
        f.write(f"listen = elvin://127.0.0.1:{port}\n"
                f"status-listen = http://127.0.0.1:{status_port}\n")
    code = ("import sys; sys.argv = ['twistd', '-n', '--pidfile=', 'elvin', '-c', %r]; "
            "from twisted.scripts.twistd import run; run()" % conf)
    log_path = os.path.join(workdir, "router.log")
    log = open(log_path, "w")

    def lower_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=lower_limit)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            socket.create_connection(("127.0.0.1", status_port), timeout=1).close()
            return proc, log_path
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"router exited; see {log_path}")
            time.sleep(0.1)
    raise SystemExit("router did not start")


def open_idle(port, count):
    """``count`` connected sockets that send nothing (connect() succeeds
    once the kernel has the connection queued, accepted or not)."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


def closed_count(socks):
    """How many of ``socks`` the router has closed (EOF or reset)."""
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


def elvin_round_trip(port, timeout):
    """Seconds for connect + ConnRqst/ConnRply, and for TestConn/ConfConn."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(frame(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY)))
        reply = read_packet(s)
        if not isinstance(reply, packets.ConnRply):
            raise ConnectionError(f"ConnRqst answered with {reply!r}")
        connected = time.perf_counter()
        s.sendall(frame(packets.TestConn()))
        reply = read_packet(s)
        if not isinstance(reply, packets.ConfConn):
            raise ConnectionError(f"TestConn answered with {reply!r}")
        done = time.perf_counter()
        s.sendall(frame(packets.DisconnRqst(2)))
    return connected - start, done - connected


def status_round_trip(port, timeout):
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(b"GET /status.json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(f"status answered {data[:40]!r}")
    return time.perf_counter() - start, data


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=1024,
                        help="the router's open-file limit (soft and hard)")
    parser.add_argument("--idle", type=int, default=1030,
                        help="idle sockets to each of the Elvin and status ports")
    parser.add_argument("--clients", type=int, default=20,
                        help="new clients to time while the idle sockets are held")
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * args.idle + 100
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SystemExit(f"this process needs {needed} open files; hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    port, status_port = free_port(), free_port()
    workdir = tempfile.mkdtemp(prefix="elvin-fd-")
    proc, log_path = start_router(args.limit, port, status_port, workdir)
    print(f"{platform.node()} {platform.platform()}, python {platform.python_version()}, "
          f"{os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"router pid {proc.pid}, open-file limit {args.limit}; elvin://127.0.0.1:{port}, "
          f"status http://127.0.0.1:{status_port}; log {log_path}")
    idle = []
    try:
        t0 = time.perf_counter()
        idle += open_idle(port, args.idle)
        idle += open_idle(status_port, args.idle)
        print(f"opened {len(idle)} idle sockets ({args.idle} to each port) in "
              f"{time.perf_counter() - t0:.2f} s")
        connects, tests, statuses, failures = [], [], [], []
        for _ in range(args.clients):
            try:
                connect, test = elvin_round_trip(port, args.timeout)
                connects.append(connect)
                tests.append(test)
            except (OSError, ConnectionError) as e:
                failures.append(f"elvin: {e}")
            try:
                seconds, data = status_round_trip(status_port, args.timeout)
                statuses.append(seconds)
            except (OSError, ConnectionError) as e:
                failures.append(f"status: {e}")
        def figures(values):
            if not values:
                return "none"
            return (f"median {statistics.median(values) * 1000:.1f} ms, "
                    f"max {max(values) * 1000:.1f} ms")
        print(f"new clients served: {len(tests)}/{args.clients}; connect + ConnRply "
              f"{figures(connects)}; TestConn round trip {figures(tests)}")
        print(f"status requests served: {len(statuses)}/{args.clients}; "
              f"{figures(statuses)}")
        for failure in failures[:5]:
            print(f"  failed: {failure}")
        elvin_idle, status_idle = idle[:args.idle], idle[args.idle:]
        print(f"idle sockets closed by the router by now: {closed_count(elvin_idle)} of "
              f"{args.idle} (Elvin), {closed_count(status_idle)} of {args.idle} (status)")
        time.sleep(3)
        print(f"3 s later: {closed_count(elvin_idle)} (Elvin), "
              f"{closed_count(status_idle)} (status)")
        try:
            _, data = status_round_trip(status_port, args.timeout)
            import json
            body = data.split(b"\r\n\r\n", 1)[1]
            if b"transfer-encoding: chunked" in data.split(b"\r\n\r\n", 1)[0].lower():
                body = b"".join(body.split(b"\r\n")[1::2])
            sockets = json.loads(body)["totals"].get("sockets", {})
            for pool, stats in sockets.items():
                print(f"  {pool}: {stats}")
        except (OSError, ConnectionError, ValueError) as e:
            print(f"  status figures unavailable: {e}")
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(10)
    with open(log_path) as f:
        lines = [line.rstrip() for line in f if "lowered" in line or "at their cap" in line]
    print("router log:")
    for line in lines[:6]:
        print("  " + line.split("] ", 1)[-1])
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
