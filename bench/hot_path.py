"""A notification's path through the router in one process, no sockets.

    python bench/hot_path.py --subs 10 1000 10000 [--profile]

The router's own server protocol (``ElvinServerFactory``) on in-memory
transports: min(50, S) subscriber connections hold S subscriptions shaped
as the Java load generator's (``match.java_subscription``), and one
publisher connection is fed NotifyEmit frames (the generator's six
attributes, one an int64) 50 to a read, under the default ``max-turn-time``
as in a router (the time read after each packet is part of the cost; a
turn cut is finished before the next read). Prints the CPU time per
notification from the frame's bytes to the NotifyDeliver bytes handed to
the subscribers' transports: framing, decoding, routing, the index, the
evaluators, encoding. What it leaves out is the kernel and the reactor
(``bench/cpu_budget.py`` measures those under the generator).

To compare two versions, run it from each checkout in turn, alternating
(``PYTHONPATH=/other/checkout python bench/hot_path.py``): single runs
move by 10% or more on a shared machine. Counts that do not move with
the machine's load: ``--feed R`` builds the router, feeds every
notification once and then R times more and prints nothing, with no time
slice (under valgrind everything is so slow that a slice would cut every
turn); run it under cachegrind with R = 0 and R = 5 and divide the
difference by 5 x 2,000 notifications::

    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=yes \
        --LL=4194304,16,64 --cachegrind-out-file=/dev/null \
        python3.11 bench/hot_path.py --subs 10000 --feed 5
"""

import argparse
import cProfile
import os
import pstats
import random
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from twisted.internet.task import Clock  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from elvin.core.router import Router  # noqa: E402
from elvin.protocols import packets  # noqa: E402
from elvin.protocols.server import ElvinServerFactory  # noqa: E402
from elvin.protocols.turns import DEFAULT_MAX_TURN_TIME, TurnSlice  # noqa: E402
from elvin.values import Int64  # noqa: E402
from match import java_subscription  # noqa: E402

NOTIFICATIONS = 2_000
PER_READ = 50


def _frame(packet):
    data = packets.encode(packet)
    return struct.pack(">I", len(data)) + data


class HotPath:
    """A router with ``subs`` subscriptions and the frames to feed it."""

    def __init__(self, subs, seed=4, slice_ms=DEFAULT_MAX_TURN_TIME):
        rng = random.Random(seed)
        self.router = Router(max_subscriptions=subs + 10)
        self.clock = Clock()
        # As the router service makes it; its time is the reactor's (time.time).
        self.router.turn_slice = TurnSlice(slice_ms / 1000, self.clock, time.time)
        self.factory = ElvinServerFactory(self.router, self.clock, connect_timeout=30)
        self.subscribers = [self._client() for _ in range(min(50, subs))]
        for i in range(subs):
            protocol, _ = self.subscribers[i % len(self.subscribers)]
            protocol.dataReceived(_frame(packets.SubAddRqst(
                i + 2, java_subscription(rng, subs), True, packets.Keys.EMPTY)))
        self._clear()
        self.publisher, _ = self._client()
        notes = [{"s1": f"sym-{rng.randrange(100):03d}", "s2": f"ex-{rng.randrange(10)}",
                  "i1": rng.randrange(1000), "i2": rng.randrange(1000),
                  "r1": rng.uniform(0, 1000), "ts": Int64(rng.randrange(1 << 40))}
                 for _ in range(NOTIFICATIONS)]
        self.reads = [b"".join(_frame(packets.NotifyEmit(n, True, packets.Keys.EMPTY))
                               for n in notes[k:k + PER_READ])
                      for k in range(0, NOTIFICATIONS, PER_READ)]

    def _client(self):
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(_frame(packets.ConnRqst(
            1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY)))
        transport.clear()
        return protocol, transport

    def _clear(self):
        for _, transport in self.subscribers:
            transport.clear()

    def run(self, rounds):
        """Feed every notification ``rounds`` times; returns how many."""
        clock = self.clock
        for _ in range(rounds):
            for data in self.reads:
                self.publisher.dataReceived(data)
                if clock.calls:
                    clock.advance(0)      # a cut turn's later turns
            self._clear()
        return rounds * NOTIFICATIONS


def measure(subs, rounds=10, repeats=5):
    """The best of ``repeats`` CPU times per notification (µs), and the
    deliveries per notification."""
    path = HotPath(subs)
    path.run(2)                                   # warm: shapes, caches
    before = path.router.stats["deliveries"]
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        count = path.run(rounds)
        best = min(best, (time.process_time() - start) / count * 1e6)
    delivered = (path.router.stats["deliveries"] - before) / (repeats * rounds * NOTIFICATIONS)
    return best, delivered


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subs", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--profile", action="store_true",
                        help="print cProfile's top functions instead of timing")
    parser.add_argument("--feed", type=int, metavar="R",
                        help="feed the notifications 1 + R times, untimed, with no "
                             "time slice, and print nothing (for cachegrind)")
    args = parser.parse_args(argv)
    for subs in args.subs:
        if args.feed is not None:
            path = HotPath(subs, slice_ms=1e12)
            path.run(1 + args.feed)
            continue
        if args.profile:
            path = HotPath(subs)
            path.run(2)
            profile = cProfile.Profile()
            profile.runcall(path.run, 5)
            print(f"subs={subs}")
            pstats.Stats(profile).sort_stats("tottime").print_stats(20)
            continue
        micros, delivered = measure(subs)
        print(f"subs={subs} us_per_notif={micros:.2f} deliveries_per_notif={delivered:.3f}")


if __name__ == "__main__":
    main()
