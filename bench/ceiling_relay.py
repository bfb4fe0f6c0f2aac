"""The ceiling: how fast can a Twisted Elvin server pass notifications on at all?

    python bench/ceiling_relay.py --port 29930      # serve until interrupted

A benchmark-only relay on the router's own transport and framing
(Twisted TCP, ``elvin.protocols.framing.FramedProtocol``) that does the least
any router must do per notification: read a NotifyEmit's attribute block
(walking the lengths, building no values), pick one subscriber, and write a
NotifyDeliver holding the same attribute bytes. No matching, no index, no
keys, no queues. Driven by the same Java load generator as the router
(``Bench.java`` on the Avis Java client library, built outside this
repository: docs/performance.md), its rate is the ceiling for this design on this
machine; docs/performance.md reports the router's rate as a fraction of it.

What it answers so the load generator runs unchanged: ConnRqst (the options
asked for, granted), SubAddRqst/SubModRqst/SubDelRqst (SubRply), QosRqst,
SecRqst, TestConn, DisconnRqst. Where a notification goes:

* one carrying the generator's flow-control attribute ``BenchSync`` goes
  back to its sender, under the sender's ``BenchSync`` subscription, so the
  generator's window works;
* every other one goes to one fixed subscriber: the first subscription of
  the first connection that subscribed to anything else.

``--deliver-every K`` passes on only every K-th of those (the others are
read and dropped), so the generator's subscriber receives about as many
as from a router where 1 in K matches: the ceiling without the extra
receiving work that delivering all of them gives the generator.

So the generator's ``delivered`` is the number of notifications (or a
K-th of them), not its ``expected`` (it reports ``timed_out=1`` and exits
2 after ``--timeout``);
its ``notif_rate`` (notifications over the time to the last delivery) is the
figure to read.
"""

import argparse
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from twisted.internet import protocol  # noqa: E402

from elvin.protocols import packets  # noqa: E402
from elvin.protocols.framing import FramedProtocol, frame  # noqa: E402

NOTIFY_EMIT = 56
_int = struct.Struct(">I").unpack_from
#: XDR value sizes by type code (2 int64, 3 real64); 1 int32 = 4.
_FIXED = {1: 4, 2: 8, 3: 8}
_SYNC = b"BenchSync"


def attribute_block(data):
    """(end of the NameValue block in NotifyEmit ``data``, whether one of its
    names is BenchSync), walking lengths only."""
    pos = 4
    (count,) = _int(data, pos)
    pos += 4
    sync = False
    for _ in range(count):
        (length,) = _int(data, pos)
        if length == 9 and data[pos + 4:pos + 13] == _SYNC:
            sync = True
        pos += 4 + ((length + 3) & ~3)
        (kind,) = _int(data, pos)
        pos += 4
        size = _FIXED.get(kind)
        if size is None:               # 4 string, 5 opaque: length-prefixed
            (size,) = _int(data, pos)
            size = 4 + ((size + 3) & ~3)
        pos += size
    return pos, sync


class Relay(FramedProtocol):
    max_frame_length = 16 << 20

    def connectionMade(self):
        self.subscriptions = 0
        self.sync_id = None

    def frameReceived(self, data):
        if _int(data, 0)[0] == NOTIFY_EMIT:
            end, sync = attribute_block(data)
            if sync and self.sync_id is not None:
                target, sub_id = self, self.sync_id
            elif self.factory.fixed is not None:
                factory = self.factory
                factory.seen += 1
                if factory.seen % factory.every:
                    return
                target, sub_id = factory.fixed
            else:
                return
            target.transport.write(frame(packets.encode_notify_deliver_from(
                data[4:end], (), (sub_id,))))
            return
        packet = packets.decode(data)
        kind = type(packet)
        reply = None
        if kind is packets.ConnRqst:
            reply = packets.ConnRply(packet.xid, dict(packet.options))
        elif kind is packets.SubAddRqst:
            self.factory.next_id += 1
            sub_id = self.factory.next_id
            if packet.expression.startswith("BenchSync"):
                self.sync_id = sub_id
            elif self.factory.fixed is None:
                self.factory.fixed = (self, sub_id)
            reply = packets.SubRply(packet.xid, sub_id)
        elif kind in (packets.SubModRqst, packets.SubDelRqst):
            reply = packets.SubRply(packet.xid, packet.subscription_id)
        elif kind is packets.QosRqst:
            reply = packets.QosRply(packet.xid, dict(packet.options))
        elif kind is packets.SecRqst:
            reply = packets.SecRply(packet.xid)
        elif kind is packets.TestConn:
            reply = packets.ConfConn()
        elif kind is packets.DisconnRqst:
            self.transport.write(frame(packets.encode(packets.DisconnRply(packet.xid))))
            self.transport.loseConnection()
            return
        if reply is not None:
            self.transport.write(frame(packets.encode(reply)))

    def connectionLost(self, reason=None):
        fixed = self.factory.fixed
        if fixed is not None and fixed[0] is self:
            self.factory.fixed = None
        super().connectionLost(reason)


class RelayFactory(protocol.ServerFactory):
    protocol = Relay

    def __init__(self, every=1):
        self.fixed = None
        self.next_id = 0
        #: Pass on every ``every``-th notification (``seen`` counts them).
        self.every = every
        self.seen = 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=29930)
    parser.add_argument("--deliver-every", type=int, default=1, metavar="K",
                        help="pass on only every K-th notification (default: all)")
    args = parser.parse_args()
    if args.deliver_every < 1:
        parser.error(f"--deliver-every must be at least 1, not {args.deliver_every}")
    from twisted.internet import reactor
    reactor.listenTCP(args.port, RelayFactory(args.deliver_every), interface="127.0.0.1")
    print(f"ceiling relay on elvin://127.0.0.1:{args.port}", flush=True)
    reactor.run()


if __name__ == "__main__":
    main()
