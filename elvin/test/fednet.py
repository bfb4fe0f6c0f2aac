"""An in-memory federation: routers, links and clients with no sockets.

Every router runs the real ``FederationManager`` and ``FederationProtocol``
over iosim transports, on one fake ``Clock``; clients are router sessions
fed packets directly. ``Net.run(seconds)`` advances the clock in small
steps and moves every byte after each, so whole topologies, failures and
stops play out deterministically in milliseconds of real time.
"""

from twisted.internet.task import Clock
from twisted.test.iosim import connect, makeFakeClient, makeFakeServer

from elvin.core.router import Router
from elvin.federation.manager import FederationClass, FederationManager
from elvin.federation.protocol import AcceptorFactory, ConnectorFactory
from elvin.protocols import packets as elvin_packets
from elvin.test.test_router import RecordingOutput

__all__ = ["Net", "MemRouter", "MemClient"]


class MemClient:
    """A client session of one router, driven by packets."""

    def __init__(self, router):
        self.output = RecordingOutput()
        self.session = router.open_session(self.output, "client")
        self._xid = 1
        self.request(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.received = []      # every packet but the replies
        self.output.take()

    def request(self, packet):
        self.session.packet_received(packet)

    def xid(self):
        self._xid += 1
        return self._xid

    def subscribe(self, expression):
        self.request(elvin_packets.SubAddRqst(self.xid(), expression, True, elvin_packets.Keys.EMPTY))
        reply = self.output.take()
        assert isinstance(reply[-1], elvin_packets.SubRply), reply
        return reply[-1].subscription_id

    def unsubscribe(self, sub_id):
        self.request(elvin_packets.SubDelRqst(self.xid(), sub_id))
        self.take()

    def quench(self, names, deliver_insecure=True):
        self.request(elvin_packets.QnchAddRqst(self.xid(), tuple(names), deliver_insecure, elvin_packets.Keys.EMPTY))
        packets = self.output.take()
        reply = next(p for p in packets if isinstance(p, elvin_packets.QnchRply))
        self.received += [p for p in packets if p is not reply]
        return reply.quench_id

    def notify(self, attributes):
        self.request(elvin_packets.NotifyEmit(attributes, True, elvin_packets.Keys.EMPTY))

    def take(self):
        self.received += self.output.take()
        got, self.received = self.received, []
        return got

    def deliveries(self):
        return [p.attributes for p in self.take() if isinstance(p, elvin_packets.NotifyDeliver)]


class MemRouter:
    """One router of a ``Net``: its core, federation manager and clients."""

    def __init__(self, net, domain, mesh=True, keepalive=0.0, mesh_interval=0.5,
                 mesh_grace=1.0, fed_class=None, filter_refresh=0.0):
        self.net = net
        self.domain = domain
        self.keepalive = keepalive
        self.router = Router()
        self.fed_class = fed_class or FederationClass("Peer", hosts=["*"])
        self.manager = FederationManager(self.router, domain, [self.fed_class], None,
                                         net.clock, debounce=0.05, mesh=mesh,
                                         mesh_interval=mesh_interval, mesh_grace=mesh_grace,
                                         filter_refresh=filter_refresh)
        self.clients = []

    def client(self):
        client = MemClient(self.router)
        self.clients.append(client)
        return client

    def link(self, domain):
        return next(l for l in self.manager.links if l.peer_domain == domain)

    def stop(self):
        """A graceful stop, as SIGTERM makes it: leave the tree, then close."""
        leaving = self.manager.leave()
        return leaving.addCallback(lambda _: self.router.shutdown())

    def kill(self):
        """Vanish at once, as a killed process does: every link reset."""
        for link in list(self.manager.links):
            link.output.transport.abortConnection()
        self.net.flush()


class Net:
    """Routers on one fake clock, linked by iosim pumps."""

    def __init__(self):
        self.clock = Clock()
        self.pumps = []
        self.routers = {}
        #: Pumps not pumped: a hung peer (SIGSTOP) holds its bytes.
        self.frozen = set()

    def router(self, domain, **kwargs):
        router = self.routers[domain] = MemRouter(self, domain, **kwargs)
        return router

    def routers_named(self, *domains, **kwargs):
        return [self.router(domain, **kwargs) for domain in domains]

    def link(self, dialler, acceptor):
        """``dialler`` dials ``acceptor``; returns the pump (the link's wire)."""
        server = AcceptorFactory(acceptor.manager, acceptor.keepalive).buildProtocol(None)
        client = ConnectorFactory(dialler.manager, dialler.fed_class,
                                  dialler.keepalive).buildProtocol(None)
        server_io, client_io = makeFakeServer(server), makeFakeClient(client)
        pump = connect(server, server_io, client, client_io, greet=False, clock=self.clock)
        self.pumps.append(pump)
        pump.flush()
        return pump

    def flush(self):
        """Move bytes until no link has any to move (bounded)."""
        for _ in range(10_000):
            moved = False
            for pump in self.pumps:
                if pump not in self.frozen and pump.pump():
                    moved = True
            if not moved:
                self.pumps = [p for p in self.pumps if not _gone(p)]
                return
        raise AssertionError("the federation never went quiet")

    def run(self, seconds, step=0.01):
        """Let ``seconds`` pass, moving every byte after each ``step``."""
        self.flush()
        steps = max(1, round(seconds / step))
        for _ in range(steps):
            self.clock.advance(step)
            self.flush()

    def trees(self):
        return {domain: set(r.manager._tree) for domain, r in self.routers.items()}


def _gone(pump):
    return (pump.client.transport is None or pump.clientIO.disconnected) and \
        (pump.server.transport is None or pump.serverIO.disconnected)
