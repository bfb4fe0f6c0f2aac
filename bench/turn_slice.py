"""How long does a client sending costly requests make a bystander wait?

    python bench/turn_slice.py                      # max-turn-time 0, then 5
    python bench/turn_slice.py --turn-times 0 5 10 --seconds 10
    python bench/turn_slice.py --tls                # over TLS (elvin:/ssl,none,xdr/)
    python bench/turn_slice.py --federation         # a federation peer, 45 filters/s
    python bench/turn_slice.py --federation --rate 0   # ... as fast as it is read

For each ``max-turn-time`` given, starts a router (``twistd -n elvin`` on
127.0.0.1, this working tree's code, its defaults otherwise) and, from raw
sockets:

* an attacker that adds one subscription, then sends SubModRqsts for it
  alternating between two expressions of 300 terms (3.5 KB each: longer
  than the 2,048 characters the shape cache keeps, so each is parsed
  anew), 64 KiB of them per write, as fast as the router reads them (a
  thread reads its replies);
* a bystander that sends TestConn every 10 ms and times each Confirm.

With ``--federation`` the attacker is a federation peer instead (on the
router's ``Federation.Listen``): after its handshake it replaces its pull
filter with FedSubReplace, alternating between two 600-term filters,
``--rate`` times a second (0: 64 KiB writes of them, as fast as the router
reads them), acknowledging what the router sends it.

Prints the bystander's round trips (p50, p99, max), the attacker's
requests answered per second and the turns the router cut
(``turns_sliced`` in /status.json). ``max-turn-time 0`` is the router
without slices: a reading turn handles all 64 KiB of a read.
"""

import argparse
import json
import os
import shutil
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

from connections import frame, read_packet  # noqa: E402  (bench/connections.py)
from elvin.federation import packets as fed_packets  # noqa: E402
from elvin.protocols import packets  # noqa: E402
from elvin.subscription import parse  # noqa: E402
from elvin.test.places import free_port, start_twistd  # noqa: E402

TERMS = 300
CHUNK = 64 << 10


def expression(name):
    """300 comparisons of attributes ``name0``..``name39``, about 3.5 KB."""
    return " || ".join(f"{name}{i % 40} > {i}" for i in range(TERMS))


#: The client side's TLS context under ``--tls`` (None: plain TCP).
TLS = None


def connect(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if TLS is not None:
        sock = TLS.wrap_socket(sock, server_hostname="127.0.0.1")
    sock.sendall(frame(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY)))
    reply = read_packet(sock)
    assert isinstance(reply, packets.ConnRply), reply
    return sock


class _Sender:
    """A connection sending ``chunk`` (or, ``rate`` times a second, one of
    ``one``) on a thread while another reads and counts the answers."""

    decode = None     # read_packet's default: a client's packets
    rate = 0.0

    def __init__(self, sock, one):
        self.sock = sock
        self.lock = threading.Lock()
        self.one = one
        self.size = len(one[0])
        self.chunk = b"".join(one[i % 2] for i in range(max(2, CHUNK // self.size // 2 * 2)))
        self.running = True
        self.answered = 0
        self.nacked = 0

    def _send(self, packet):
        with self.lock:
            self.sock.sendall(frame(packet))

    def send(self):
        step, i = (1.0 / self.rate if self.rate else 0.0), 0
        next_at = time.perf_counter()
        while self.running:
            try:
                with self.lock:
                    self.sock.sendall(self.chunk if not step else self.one[i % 2])
            except OSError:
                return
            i += 1
            if step:
                next_at += step
                time.sleep(max(0.0, next_at - time.perf_counter()))

    def read(self):
        while self.running:
            try:
                packet = read_packet(self.sock, self.decode)
            except (OSError, ConnectionError, EOFError, AssertionError):
                return
            self.answer(packet)

    def answer(self, packet):
        """Count (or answer) ``packet``, read from the router."""

    def start(self):
        for target in (self.send, self.read):
            threading.Thread(target=target, daemon=True).start()


class Attacker(_Sender):
    """SubModRqsts, 64 KiB a write, alternating two expressions."""

    def __init__(self, port):
        sock = connect(port)
        sock.sendall(frame(packets.SubAddRqst(2, expression("a"), True, packets.Keys.EMPTY)))
        reply = read_packet(sock)
        assert isinstance(reply, packets.SubRply), reply
        super().__init__(sock, [frame(packets.SubModRqst(
            10 + i, reply.subscription_id, expression("ab"[i]), True, packets.Keys.EMPTY,
            packets.Keys.EMPTY)) for i in range(2)])

    def answer(self, packet):
        if isinstance(packet, packets.SubRply):
            self.answered += 1
        else:
            self.nacked += 1


class FederationPeer(_Sender):
    """A raw federation peer replacing its pull filter, ``rate`` times a
    second (0: 64 KiB writes of FedSubReplace, as fast as they are read);
    every FedSubReplace has xid 0: the Acks are only counted."""

    decode = staticmethod(fed_packets.decode)

    def __init__(self, port, rate):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(frame(fed_packets.FedConnRqst(1, 1, 0, "attacker.test")))
        while not isinstance(read_packet(sock, self.decode), fed_packets.FedConnRply):
            pass
        super().__init__(sock, [frame(fed_packets.FedSubReplace(0, parse(
            " || ".join(f"{name}{i % 40} > {i}" for i in range(600))))) for name in "ab"])
        self.rate = rate

    def answer(self, packet):
        if isinstance(packet, fed_packets.Ack):
            self.answered += 1
        elif isinstance(packet, packets.Nack):
            self.nacked += 1
        elif isinstance(packet, fed_packets.FedSubReplace):
            self._send(fed_packets.Ack(packet.xid))
        elif isinstance(packet, packets.TestConn):
            self._send(packets.ConfConn())


def bystander(port, seconds):
    """Round trips (s) of a TestConn every 10 ms for ``seconds``."""
    sock = connect(port)
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        sock.sendall(frame(packets.TestConn()))
        reply = read_packet(sock)
        assert isinstance(reply, packets.ConfConn), reply
        times.append(time.perf_counter() - start)
        time.sleep(0.01)
    sock.close()
    return times


def p99(ms):
    """The 99th percentile of sorted ``ms``."""
    return ms[min(len(ms) - 1, int(len(ms) * 0.99))]


def status(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=10) as f:
        return json.load(f)["totals"]


def run(turn_time, seconds, certificates=None, rate=None):
    """``rate`` not None: the attacker is a federation peer (FederationPeer)."""
    status_port = free_port()
    fed_port = free_port()
    stack = "ssl,none,xdr" if certificates else "tcp,none,xdr"
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as conf:
        conf.write(f"max-turn-time = {turn_time}\nstatus-listen = {status_port}\n")
        if certificates:
            conf.write(f"tls-certificate = {certificates.server_cert}\n"
                       f"tls-key = {certificates.server_key}\n")
        if rate is not None:
            conf.write("Federation.Activated = yes\nFederation.Router-Name = bench.test\n"
                       f"Federation.Listen = ewaf://127.0.0.1:{fed_port}\n"
                       "Federation.Apply-Class[Peers] = 127.0.0.1\n")
    try:
        port, proc = start_twistd("elvin", lambda p: ["-c", conf.name,
                                                      "-l", f"elvin:/{stack}/127.0.0.1:{p}"])
        try:
            quiet = sorted(t * 1000 for t in bystander(port, 2.0))
            attacker = Attacker(port) if rate is None else FederationPeer(fed_port, rate)
            attacker.start()
            time.sleep(0.5)
            answered = attacker.answered
            started = time.perf_counter()
            times = bystander(port, seconds)
            nacked = attacker.nacked
            answered = (attacker.answered - answered) / (time.perf_counter() - started)
            attacker.running = False
            cut = status(status_port)["turns_sliced"]
        finally:
            proc.terminate()
            proc.wait()
    finally:
        os.unlink(conf.name)
    ms = sorted(t * 1000 for t in times)
    what = "TLS" if certificates else "TCP"
    if rate is not None:
        what = f"federation peer, {rate or 'flooding'} filters/s,"
    print(f"{what} max-turn-time {turn_time:>3} ms: bystander p50 {statistics.median(ms):6.1f} ms, "
          f"p99 {p99(ms):6.1f} ms, max {ms[-1]:6.1f} ms ({len(ms)} round trips; alone: "
          f"p50 {statistics.median(quiet):.2f} ms, p99 {p99(quiet):.2f} ms, max "
          f"{quiet[-1]:.2f} ms); attacker "
          f"{answered:5.0f} answered/s ({attacker.size} B each, {nacked} refused); "
          f"turns cut {cut}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turn-times", type=int, nargs="+", default=[0, 5],
                        help="max-turn-time values to run, in ms (0: no slice)")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="how long the bystander measures, per value")
    parser.add_argument("--tls", action="store_true",
                        help="over TLS (a throwaway CA and certificate, made with trustme)")
    parser.add_argument("--federation", action="store_true",
                        help="the attacker is a federation peer replacing its filter")
    parser.add_argument("--rate", type=float, default=45.0,
                        help="--federation: filters a second (0: as fast as read)")
    args = parser.parse_args()
    certificates = None
    if args.tls:
        global TLS
        from elvin.test.transport_fixtures import Certificates
        certificates = Certificates(tempfile.mkdtemp(prefix="turn-slice-"))
        TLS = ssl.create_default_context(cafile=certificates.ca_path)
    try:
        for turn_time in args.turn_times:
            run(turn_time, args.seconds, certificates,
                args.rate if args.federation else None)
    finally:
        if certificates is not None:
            shutil.rmtree(certificates.directory, ignore_errors=True)


if __name__ == "__main__":
    main()
