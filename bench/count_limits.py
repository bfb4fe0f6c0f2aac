"""What a packet of millions of tiny array items costs the router, with
and without its connection's count limits (``ConnectionOptions.count_limits``).

    python bench/count_limits.py [--size MIB ...] [--repeat N]

For each shape (quench names, keys, attributes: the cheapest items to send
and the dearest to decode) and packet size (default 2 MiB, the default
``Packet.Max-Length``, and 16 MiB, its ceiling), prints the median time of
``packets.decode`` (no limits: every item read), of ``packets.decode``
with the default connection's limits, and of the router's whole handling
of one such frame from a connected client (``ElvinServerProtocol`` over
StringTransport: decoding and the answer) with and without the limits:
the time a bystander waits behind each such packet.
"""

import argparse
import itertools
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from twisted.internet.task import Clock  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from elvin.core.keys import SHA1_CONSUMER, SHA1_PRODUCER  # noqa: E402
from elvin.core.options import ConnectionOptions  # noqa: E402
from elvin.core.router import Router  # noqa: E402
from elvin.protocols import packets as P  # noqa: E402
from elvin.protocols.server import ElvinServerFactory  # noqa: E402

MIB = 1 << 20


def u32(*values):
    return struct.pack(f">{len(values)}I", *values)


def opaque(data):
    return u32(len(data)) + data + b"\0" * (-len(data) & 3)


def names(count):
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    return map("".join, itertools.islice(itertools.product(digits, repeat=5), count))


def keys(scheme, count):
    return u32(1, scheme, 1, count) + opaque(b"k") * count


#: shape -> (bytes per item, build(count))
SHAPES = {
    "QnchAddRqst, empty names": (4, lambda n: u32(P.QnchAddRqst.ID, 7, n) + u32(0) * n
                                    + u32(1, 0)),
    "QnchAddRqst, distinct names": (12, lambda n: u32(P.QnchAddRqst.ID, 7, n) + b"".join(
        opaque(name.encode()) for name in names(n)) + u32(1, 0)),
    "SubAddRqst, 1-byte keys": (8, lambda n: u32(P.SubAddRqst.ID, 7) + opaque(b"require(a)")
                                + u32(1) + keys(SHA1_CONSUMER, n)),
    "SecRqst, 1-byte keys": (8, lambda n: u32(P.SecRqst.ID, 7) + keys(SHA1_PRODUCER, n)
                             + u32(0, 0, 0)),
    "NotifyEmit, attributes": (20, lambda n: u32(P.NotifyEmit.ID, n) + b"".join(
        opaque(name.encode()) + u32(1, 7) for name in names(n)) + u32(1, 0)),
    "NotifyEmit, 1-byte keys": (8, lambda n: u32(P.NotifyEmit.ID, 1) + opaque(b"a")
                                + u32(1, 7, 1) + keys(SHA1_PRODUCER, n)),
}


def median_ms(f, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def router_ms(data, limited, repeat):
    """The router's time for one ``data`` frame from a connected client."""
    router = Router()
    if not limited:
        router.new_options = lambda: ConnectionOptions(router.option_specs, router.key_schemes())
    factory = ElvinServerFactory(router, Clock(), connect_timeout=30)
    frame = u32(len(data)) + data
    times = []
    for _ in range(repeat):
        proto = factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        connect = P.encode(P.ConnRqst(1, 4, 0, {"Packet.Max-Length": 16 * MIB}))
        proto.dataReceived(u32(len(connect)) + connect)
        start = time.perf_counter()
        proto.dataReceived(frame)
        times.append(time.perf_counter() - start)
        transport.loseConnection()
        proto.connectionLost(None)
    return statistics.median(times) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, nargs="*", default=[2, 16], help="MiB")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    limits = Router().new_options().count_limits
    print(f"{'shape':32} {'MiB':>4} {'items':>9} {'decode':>9} {'limited':>9} "
          f"{'router':>9} {'limited':>9}  (ms, medians of {args.repeat})")
    for shape, (size, build) in SHAPES.items():
        for mib in args.size:
            count = (mib * MIB - 64) // size
            data = build(count)
            assert len(data) <= mib * MIB, (shape, len(data))
            whole = median_ms(lambda: P.decode(data), args.repeat)
            limited = median_ms(lambda: P.decode(data, limits=limits), args.repeat)
            old = router_ms(data, False, args.repeat)
            new = router_ms(data, True, args.repeat)
            print(f"{shape:32} {mib:4} {count:9} {whole:9.1f} {limited:9.3f} {old:9.1f} "
                  f"{new:9.3f}")


if __name__ == "__main__":
    main()
