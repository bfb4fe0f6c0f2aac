"""How much memory do quenches cost the router, and does it come back?

    python bench/quench_memory.py                       # 4,000 quenches x 256 names
    python bench/quench_memory.py --shared              # every quench on the same 256 names
    python bench/quench_memory.py --max-quench-memory 0 # without the router-wide cap

A ``Router`` in this process (the sans-IO core, no reactor) takes one
client that negotiates ``Subscription.Max-Count`` 100,000 and sends
``-n`` QnchAddRqst packets of ``--names`` names each (decoded from their
wire form, as a transport would hand them over: every name a new string),
by default distinct names (``quench0000.attribute.0000`` ...). A second
client holds one subscription on a quenched name and one producer emits to
it at the end, to show the router still serves everyone. The client then
closes, and the process's RSS is printed before, while holding, after the
close, and after ``malloc_trim(0)``.

Freed Python objects go back to Python's allocator, which returns a 1 MiB
arena to the system only once all of it is free; bigger blocks (dict
tables, tuples of 256 names) come from the C library's malloc, which keeps
freed memory at the top of its heaps until ``malloc_trim`` asks it to give
it back. A long-running router reuses what it kept for the next clients;
the trimmed figure shows what is really still held. With ``--trace``,
``tracemalloc`` counts the live Python allocations too (slower, and its
own records inflate the RSS figures).
"""

import argparse
import ctypes
import ctypes.util
import gc
import os
import platform
import sys
import time
import tracemalloc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from elvin import errors  # noqa: E402
from elvin.core.quench import DEFAULT_MAX_QUENCH_MEMORY  # noqa: E402
from elvin.core.router import Router  # noqa: E402
from elvin.protocols import packets  # noqa: E402
from elvin.test.test_router import RecordingOutput  # noqa: E402


class CountingOutput(RecordingOutput):
    """Keeps only the last reply the session sent, and the last notification."""

    last = notified = None

    def send(self, packet):
        self.last = packet

    def send_encoded(self, data, droppable):
        self.notified = packets.decode(data)


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def trim():
    """Ask the C library to return its free memory (glibc only)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
        return True
    return False


def connect(router, options=None):
    out = CountingOutput()
    session = router.open_session(out, "bench")
    session.packet_received(packets.ConnRqst(1, 4, 0, options or {}, packets.Keys.EMPTY, packets.Keys.EMPTY))
    assert isinstance(out.last, packets.ConnRply), out.last
    return session, out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--quenches", type=int, default=4000)
    parser.add_argument("--names", type=int, default=256, help="names per quench")
    parser.add_argument("--shared", action="store_true",
                        help="every quench on the same names (else all names distinct)")
    parser.add_argument("--max-quench-memory", type=int, default=DEFAULT_MAX_QUENCH_MEMORY,
                        help="the router-wide cap in bytes (0: none); default %(default)s")
    parser.add_argument("--trace", action="store_true",
                        help="also count live allocations with tracemalloc")
    args = parser.parse_args()
    print(f"{platform.node()} {platform.platform()}, python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}")
    router = Router()
    router.quench.max_bytes = args.max_quench_memory
    subscriber, sub_out = connect(router)
    producer, _ = connect(router)
    first = "name0000" if args.shared else "quench0000.attribute.0000"
    subscriber.packet_received(packets.SubAddRqst(2, f"{first} > 1", True, packets.Keys.EMPTY))
    gc.collect()
    trim()
    before = rss_mib()
    if args.trace:
        tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    client, out = connect(router, {"Subscription.Max-Count": 100_000})
    started = time.perf_counter()
    accepted = refused = 0
    for i in range(args.quenches):
        names = tuple(f"name{j:04d}" if args.shared else f"quench{i:04d}.attribute.{j:04d}"
                      for j in range(args.names))
        wire = packets.encode(packets.QnchAddRqst(10 + i, names, True, packets.Keys.EMPTY))
        client.packet_received(packets.decode(wire))
        if isinstance(out.last, packets.QnchRply):
            accepted += 1
        else:
            assert isinstance(out.last, packets.Nack) and out.last.error == errors.IMPL_LIMIT
            refused += 1
            message = out.last.message
    took = time.perf_counter() - started
    gc.collect()
    traced_holding = tracemalloc.get_traced_memory()[0] - traced_before
    holding = rss_mib()
    print(f"{args.quenches} QnchAddRqst x {args.names} "
          f"{'shared' if args.shared else 'distinct'} names from one client in {took:.2f} s: "
          f"{accepted} accepted ({accepted * args.names:,} names), {refused} refused"
          + (f" (Nack 2006: {message})" if refused else ""))
    print(f"registry: {len(router.quench)} quenches, {router.quench.names():,} distinct names, "
          f"charged {router.quench.bytes / 2 ** 20:.1f} MiB of "
          f"{args.max_quench_memory / 2 ** 20:.0f} MiB"
          + (f"; tracemalloc: {traced_holding / 2 ** 20:.1f} MiB live, "
             f"{traced_holding / max(1, accepted * args.names):.0f} bytes a name"
             if args.trace else ""))
    producer.packet_received(packets.NotifyEmit({first: 5}, True, packets.Keys.EMPTY))
    assert isinstance(sub_out.notified, packets.NotifyDeliver), sub_out.notified
    print("bystanders still served: a producer's notification reached a subscriber")
    started = time.perf_counter()
    client.connection_lost()
    closed_in = time.perf_counter() - started
    del client, out
    gc.collect()
    traced_after = tracemalloc.get_traced_memory()[0] - traced_before
    tracemalloc.stop()
    after = rss_mib()
    trimmed = rss_mib() if trim() else after
    print(f"RSS before {before:.1f} MiB; holding {holding:.1f} MiB (+{holding - before:.1f}); "
          f"after close {after:.1f} MiB (+{after - before:.1f}); after malloc_trim "
          f"{trimmed:.1f} MiB (+{trimmed - before:.1f})"
          + (f"; tracemalloc after close: {traced_after / 1024:.0f} KiB live"
             if args.trace else ""))
    print(f"the close took {closed_in:.2f} s; registry after it: {len(router.quench)} quenches, "
          f"{router.quench.names()} names, {router.quench.bytes} bytes")


if __name__ == "__main__":
    main()
