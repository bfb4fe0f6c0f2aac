"""What heavy clients cost everyone else's notifications, in-process.

K clients each place N subscriptions that every notification carrying
``By`` makes a candidate (``require(By) && Seq < -i`` by default: never
true), and a bystander subscribes to its own notifications; the bench
prints the router's CPU time per notification the bystander publishes,
after the first (which sets the heavy clients apart), and what the
heavy clients were told (DropWarns counted in ``evaluation_refusals``).

    python bench/heavy_clients.py --clients 5 --subs 10000
    python bench/heavy_clients.py --clients 5 --subs 10000 --template 'require(By) && Seq != {i}'

No sockets: the router's protocol over StringTransports, as
bench/hot_path.py does.
"""

import argparse
import struct
import time

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from elvin.core.router import Router
from elvin.protocols import packets
from elvin.protocols.server import ElvinServerFactory


def _frame(packet):
    data = packets.encode(packet)
    return struct.pack(">I", len(data)) + data


class HeavyClients:
    """A router with ``clients`` heavy clients and a bystander."""

    def __init__(self, clients, subs, template):
        self.router = Router(max_subscriptions=clients * subs + 10)
        self.factory = ElvinServerFactory(self.router, Clock(), connect_timeout=30)
        for k in range(clients):
            protocol, transport = self._client({"Subscription.Max-Count": max(subs, 16)})
            protocol.dataReceived(b"".join(
                _frame(packets.SubAddRqst(j + 2, template.format(i=-j - 1 - k * subs), True,
                                          packets.Keys.EMPTY))
                for j in range(subs)))
            transport.clear()
        self.bystander, self.bystander_out = self._client({})
        self.bystander.dataReceived(_frame(packets.SubAddRqst(
            2, "By == 'me'", True, packets.Keys.EMPTY)))
        self.bystander_out.clear()
        self.frame = _frame(packets.NotifyEmit({"By": "me", "Seq": 5}, True,
                                               packets.Keys.EMPTY))

    def _client(self, options):
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(_frame(packets.ConnRqst(1, 4, 0, options, packets.Keys.EMPTY,
                                                      packets.Keys.EMPTY)))
        transport.clear()
        return protocol, transport

    def publish(self, count):
        """CPU seconds for ``count`` of the bystander's notifications; each
        must reach it."""
        start = time.process_time()
        for _ in range(count):
            self.bystander.dataReceived(self.frame)
        spent = time.process_time() - start
        delivered = self.bystander_out.value()
        self.bystander_out.clear()
        if delivered.count(b"me") != count:
            raise SystemExit("the bystander did not get every notification")
        return spent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--subs", type=int, default=10_000, help="subscriptions per client")
    parser.add_argument("--template", default="require(By) && Seq < {i}")
    parser.add_argument("--notifications", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    bench = HeavyClients(args.clients, args.subs, args.template)
    bench.publish(1)                      # past the budgets: the heavy set apart
    best = min(bench.publish(args.notifications) for _ in range(args.repeats))
    stats = bench.router.stats
    print(f"clients={args.clients} subs={args.subs} template={args.template!r} "
          f"ms_per_notification={best / args.notifications * 1e3:.2f} "
          f"heavy={len(getattr(bench.router, '_heavy', ()))} "
          f"refusals_per_notification="
          f"{stats['evaluation_refusals'] / (1 + args.notifications * args.repeats):.1f}")


if __name__ == "__main__":
    main()
