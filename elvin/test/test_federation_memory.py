"""Federation in memory (elvin.test.fednet): duplicates and their trace
event, graceful stops, hung peers and their replacements, plain routers
in cycles, restarted routers. One fake clock, no sockets: deterministic."""

from twisted.trial import unittest

from elvin.federation import packets as FP
from elvin.federation.mesh import notification_id
from elvin.protocols import packets as P
from elvin.test.fednet import Net


class RecordingTrace:
    """What a TraceWriter would be asked to write: (router, peer, event)."""

    enabled = True

    def __init__(self, domain, events):
        self.domain = domain
        self.events = events

    def notify(self, link, event, direction, attributes, routing, size):
        self.events.append((self.domain, link.peer_domain, event))

    def link(self, link, event, reason=None):
        self.events.append((self.domain, link.peer_domain, event))

    def subreplace(self, link, direction, tree):
        pass

    def close(self):
        return None


def ring(net, *names, **kwargs):
    routers = net.routers_named(*names, **kwargs)
    for x, y in zip(routers, routers[1:] + routers[:1]):
        net.link(x, y)
    net.run(3.0)
    return routers


class DuplicateTraceTests(unittest.TestCase):

    def test_a_mesh_duplicate_is_traced_as_such_not_as_a_loop(self):
        net = Net()
        a, b = net.routers_named("a.test", "b.test")
        net.link(a, b)
        net.run(1.0)
        events = []
        b.manager.trace = RecordingTrace("b.test", events)
        consumer = b.client()
        consumer.subscribe("require(n)")
        link = b.link("a.test")
        ident = notification_id("x.test", 1, 7)
        packet = FP.FedNotify({"n": 1}, True, P.Keys.EMPTY, (ident, "x.test", "a.test"))
        link.packet_received(packet)
        link.packet_received(packet)
        self.assertEqual(len(consumer.deliveries()), 1)
        drops = [e for e in events if e[2].startswith("notify_dropped")]
        self.assertEqual(drops, [("b.test", "a.test", "notify_dropped_duplicate")])
        self.assertEqual((link.stats["duplicates"], link.stats["loops"]), (1, 0))
        # Our own domain in the routing list is still a loop.
        link.packet_received(FP.FedNotify({"n": 2}, True, P.Keys.EMPTY,
                                          ("b.test", "a.test")))
        self.assertEqual(events[-1], ("b.test", "a.test", "notify_dropped_loop"))
