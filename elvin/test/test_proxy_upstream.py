"""The proxy's upstream connection (``elvin.proxy.upstream.Upstream``)
noticing its router's return: a probe of the router's port, and router
discovery's announcements, start a connection attempt at once instead of
when the back-off says. In memory: a fake clock, the real client
connection and lifecycle, and a real ``Router`` served over iosim, which
the tests "kill" (its channels aborted, its port refusing) and "restart"
(a new Router). Two open real sockets on 127.0.0.1: the TCP probe, and
a router's replacement announced by ERDP on loopback multicast (IP TTL 0,
skipped where multicast does not loop back).
"""

from twisted.internet import defer, protocol, reactor
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.test.iosim import connect as pump_between, makeFakeClient, makeFakeServer
from twisted.trial import unittest

from elvin.client import Connection
from elvin.clientcore.state import Reconnect, RequestTimeout
from elvin.core.router import Router
from elvin.discovery.cache import RouterCache
from elvin.protocols.server import ElvinServerFactory
from elvin.proxy.upstream import Upstream, announces, tcp_probe
from elvin.test.test_discovery_integration import LoopbackCase, unique
from elvin.uri import ElvinURI

URI = ElvinURI("elvin://localhost:2917")
STEP = 0.05                               # seconds of fake time per step


class Net:
    """Where the upstream router is: ``up`` or refusing; a dial while up
    gets an iosim channel to ``router``. Also the endpoint every
    connection dials through, and the probe (does the port accept?)."""

    def __init__(self, clock):
        self.clock = clock
        self.router = Router()
        self.up = True
        self.pumps = []
        self.dials = []                   # fake times of every dial
        self.probes = 0

    def connect(self, factory):
        self.dials.append(self.clock.seconds())
        if not self.up:
            return defer.fail(ConnectionRefusedError())
        server = ElvinServerFactory(self.router, self.clock).buildProtocol(None)
        client = factory.buildProtocol(None)
        self.pumps.append(pump_between(server, makeFakeServer(server), client,
                                       makeFakeClient(client), clock=self.clock))
        return defer.succeed(client)

    def probe(self, uri):
        self.probes += 1
        return defer.succeed(self.up)

    def kill(self):
        """The router process dies: its channels end, its port refuses."""
        self.up = False
        for pump in self.pumps:
            pump.server.transport.abortConnection()
        self.flush()
        self.pumps = []

    def restart(self):
        self.router = Router()
        self.up = True

    def flush(self):
        for _ in range(10):
            if not any([pump.flush() for pump in self.pumps]):
                return


class Core:
    """What the Upstream tells its core, as a list of events."""

    def __init__(self):
        self.events = []

    def upstream_up(self):
        self.events.append("up")

    def upstream_down(self):
        self.events.append("down")

    def upstream_dropwarn(self):
        self.events.append("dropwarn")

    def upstream_notification(self, note, secure, insecure):
        self.events.append("notification")


def start_upstream(test, net, clock, core, **kw):
    """An ``Upstream`` for ``core`` dialling through ``net`` (the real
    client connection and lifecycle, on ``clock``), started, and stopped
    when ``test`` ends. ``kw``: Upstream's arguments."""

    def connect(uri=None, reactor=None, reconnect=None, failover=False, pending_size=0,
                discover=False, scope=None, discoverer=None, options=None):
        target = uri or URI
        conn = Connection([target], clock, net, reconnect, timeout=None,
                          pending_size=pending_size)
        conn.lifecycle.start(options, None, None)
        net.flush()
        return conn._opened
    kw.setdefault("connect_args", {"uri": URI})
    kw.setdefault("reconnect", Reconnect(maximum=1.0, jitter=0))
    kw.setdefault("keepalive", 0)
    kw.setdefault("probe", net.probe)
    upstream = Upstream(clock, core, connect=connect, **kw)
    upstream.startService()
    test.addCleanup(stop_upstream, test, net, clock, upstream)
    net.flush()
    return upstream


def stop_upstream(test, net, clock, upstream):
    d = upstream.stopService()
    net.flush()
    clock.advance(5)
    if d is not None:
        test.successResultOf(d)


class Discoverer:
    """A started discoverer as the Upstream uses one: a cache it listens to."""

    def __init__(self, clock):
        self.cache = RouterCache(clock)
        self.running = False

    def start(self):
        self.running = True
        return defer.succeed(self)

    def stop(self):
        self.running = False
        return defer.succeed(None)


class UpstreamReturnTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.net = Net(self.clock)
        self.core = Core()

    def upstream(self, **kw):
        return start_upstream(self, self.net, self.clock, self.core, **kw)

    def wait(self, seconds):
        """``seconds`` of fake time, in steps (calls made meanwhile get
        their turn), with the channels' bytes moved at each."""
        for _ in range(round(seconds / STEP)):
            self.clock.advance(STEP)
            self.net.flush()

    def run_until_up(self, limit=5.0):
        """Steps of fake time until the upstream is up: the time taken."""
        start = self.clock.seconds()
        for _ in range(int(limit / STEP)):
            self.net.flush()
            if self.upstream_.is_up:
                return self.clock.seconds() - start
            self.clock.advance(STEP)
        self.fail(f"not back within {limit} s of fake time")

    def outage(self, down_for, **kw):
        """Up, the router killed, ``down_for`` seconds, restarted: the time
        from the restart to the upstream being up again."""
        self.upstream_ = self.upstream(**kw)
        self.assertTrue(self.upstream_.is_up)
        self.net.kill()
        self.assertEqual(self.core.events, ["up", "down"])
        self.wait(down_for)
        self.net.restart()
        return self.run_until_up()

    def test_requests_are_bounded_by_upstream_timeout(self):
        # A request upstream waits request_timeout (upstream-timeout) on the
        # client's own timer, whatever the connection's timeout, then fails
        # with RequestTimeout, the connection kept.
        upstream = self.upstream(request_timeout=2.0)
        self.assertTrue(upstream.is_up)
        upstream.connection.timeout = 30.0
        d = upstream.subscribe("require(x)", True, None)
        self.clock.advance(1.9)               # the bytes not moved: no answer yet
        self.assertNoResult(d)
        self.clock.advance(0.1)
        self.assertEqual(self.failureResultOf(d, RequestTimeout).value.seconds, 2.0)
        self.assertTrue(upstream.is_up)

    def test_an_upstream_timeout_of_0_waits_for_ever(self):
        upstream = self.upstream(request_timeout=0)
        upstream.connection.timeout = 1.0
        d = upstream.subscribe("require(x)", True, None)
        self.clock.advance(60)
        self.assertNoResult(d)
        self.net.flush()
        self.assertIsInstance(self.successResultOf(d), int)

    def test_back_off_alone_takes_longer(self):
        # The back-off's 1 s cap alone: 2.9 s of outage leaves the next try
        # 0.65 s after the restart (tries at 0.1, 0.3, 0.7, 1.5, 2.5, 3.5 s).
        without = self.outage(2.9, probe_interval=0)
        self.assertGreater(without, 0.5)
        self.assertEqual(self.upstream_.early_retries, 0)

    def test_probe_brings_it_back_within_an_interval(self):
        back = self.outage(2.9, probe_interval=0.2)
        self.assertLessEqual(back, 0.2 + STEP)
        self.assertEqual(self.upstream_.early_retries, 1)
        self.assertEqual(self.core.events, ["up", "down", "up"])
        # Up again: no more probes.
        probes = self.net.probes
        self.wait(3)
        self.assertEqual(self.net.probes, probes)

    def test_probes_stop_while_up_and_start_with_each_outage(self):
        upstream = self.upstream_ = self.upstream(probe_interval=0.2)
        self.wait(2)
        self.assertEqual(self.net.probes, 0)
        for outage in range(2):
            self.net.kill()
            self.wait(1)
            self.assertGreater(self.net.probes, 0)
            self.net.restart()
            self.run_until_up()
            self.net.probes = 0
        self.assertEqual(upstream.early_retries, 2)

    def test_a_router_that_accepts_but_refuses_is_tried_by_the_back_off(self):
        # The port accepts (the probe succeeds) but every session is
        # refused: one early try in the outage, then the back-off's pace.
        upstream = self.upstream_ = self.upstream(probe_interval=0.2)
        self.net.kill()
        self.net.restart()
        self.net.router.closing = True        # Nack: shutting down
        self.net.dials.clear()
        self.wait(10)
        self.assertFalse(upstream.is_up)
        self.assertEqual(upstream.early_retries, 1)
        # 10 s at most a second apart, plus the one early try.
        self.assertLessEqual(len(self.net.dials), 10 + 1 + 2)

    def test_first_connect_woken_by_the_probe(self):
        self.net.up = False
        upstream = self.upstream_ = self.upstream(probe_interval=0.2)
        self.assertFalse(upstream.is_up)
        self.wait(3)
        self.net.restart()
        self.assertLessEqual(self.run_until_up(), 0.2 + STEP)
        self.assertEqual(upstream.early_retries, 1)

    def announce(self, discoverer, name, uris, scope="", default=True):
        discoverer.cache.learn(name, scope, default, 1, uris, local=True)

    def test_announcement_brings_it_back_at_once(self):
        discoverer = Discoverer(self.clock)
        upstream = self.upstream_ = self.upstream(probe_interval=0, discoverer=discoverer)
        self.assertTrue(discoverer.running)
        self.net.kill()
        self.wait(2.9)
        self.net.restart()
        dials = len(self.net.dials)
        self.announce(discoverer, "elvin:other:1", ["elvin://127.0.0.1:2918"])
        self.assertEqual(len(self.net.dials), dials)       # another router's
        self.announce(discoverer, "elvin:ours:2", ["elvin:4.0/tcp,none,xdr/127.0.0.1:2917"])
        self.net.flush()
        self.assertTrue(upstream.is_up)                    # no time has passed
        self.assertEqual(upstream.early_retries, 1)

    def test_announcements_cannot_make_it_dial_faster_than_the_back_off(self):
        discoverer = Discoverer(self.clock)
        upstream = self.upstream_ = self.upstream(probe_interval=0, discoverer=discoverer)
        self.net.kill()
        self.wait(3)
        self.net.dials.clear()
        for i in range(100):                               # a flood, router still down
            self.announce(discoverer, f"elvin:ours:{i}", ["elvin://127.0.0.1:2917"])
            self.clock.advance(0.02)
        self.assertLessEqual(upstream.early_retries, 2)     # 2 s: one a second
        self.assertLessEqual(len(self.net.dials), 2 + 2)

    def test_discovery_stopped_with_the_service(self):
        discoverer = Discoverer(self.clock)
        upstream = self.upstream(discoverer=discoverer)
        self.assertIn(upstream._heard, discoverer.cache.listeners)
        stop_upstream(self, self.net, self.clock, upstream)
        self.assertFalse(discoverer.running)
        self.assertNotIn(upstream._heard, discoverer.cache.listeners)


class Record:
    def __init__(self, uris, scope="", default=True):
        self.scope, self.default, self._uris = scope, default, uris

    def usable_uris(self):
        return [ElvinURI(u) for u in self._uris]


class AnnouncesTests(unittest.SynchronousTestCase):

    def test_by_uri_compares_host_and_port(self):
        ours = ElvinURI("elvin://router.test:2917")
        self.assertTrue(announces(Record(["elvin://ROUTER.test:2917"]), ours, None))
        self.assertFalse(announces(Record(["elvin://router.test:2918"]), ours, None))
        self.assertFalse(announces(Record(["elvin://other.test:2917"]), ours, None))
        self.assertFalse(announces(Record([]), ours, None))

    def test_any_loopback_address_is_localhost(self):
        self.assertTrue(announces(Record(["elvin://127.0.0.1:2917"]), URI, None))
        self.assertTrue(announces(Record(["elvin://[::1]:2917"]), URI, None))

    def test_by_scope(self):
        self.assertTrue(announces(Record(["elvin://h:1"], scope="chat"), None, "chat"))
        self.assertFalse(announces(Record(["elvin://h:1"], scope="news"), None, "chat"))
        self.assertTrue(announces(Record(["elvin://h:1"], default=True), None, None))
        self.assertFalse(announces(Record(["elvin://h:1"], default=False), None, None))
        self.assertFalse(announces(Record([], scope="chat"), None, "chat"))


class TcpProbeTests(unittest.TestCase):
    """The default probe on real sockets (127.0.0.1, port 0)."""

    @defer.inlineCallbacks
    def test_accepting_and_refusing_ports(self):
        port = reactor.listenTCP(0, protocol.Factory.forProtocol(protocol.Protocol),
                                 interface="127.0.0.1")
        number = port.getHost().port
        uri = ElvinURI(f"elvin://127.0.0.1:{number}")
        probe = tcp_probe(reactor, timeout=5)
        self.assertIs((yield probe(uri)), True)
        yield port.stopListening()
        self.assertIs((yield probe(uri)), False)


class AnnouncedOnLoopbackTests(LoopbackCase):
    """With ``upstream = discover``: the router's replacement announces
    itself by ERDP (loopback multicast, IP TTL 0) and the proxy's upstream
    moves to it at once, not after its back-off (a minute here)."""

    @defer.inlineCallbacks
    def test_a_new_router_of_the_scope_is_joined_when_announced(self):
        from elvin.test.polling import wait_until
        scope = unique("upstream")
        first = yield self.start_router(scope)
        core = Core()
        upstream = Upstream(reactor, core, connect_args={"discover": True, "scope": scope},
                            reconnect=Reconnect(initial=60, maximum=60, jitter=0),
                            keepalive=0, probe_interval=0,
                            discoverer=self.loopback_discoverer_class()())
        upstream.startService()
        self.addCleanup(upstream.stopService)
        yield wait_until(lambda: upstream.is_up, timeout=20)
        # The router dies: its port closes, its sessions are cut.
        yield first.tcp.stopListening()
        for session in list(first.router.sessions):
            session.output.transport.abortConnection()
        yield wait_until(lambda: not upstream.is_up, timeout=20)
        self.assertEqual(upstream.early_retries, 0)
        second = yield self.start_router(scope)
        yield wait_until(lambda: upstream.is_up, timeout=20)
        self.assertEqual(str(upstream.connection.uri), str(second.uri))
        self.assertEqual(upstream.early_retries, 1)
        self.assertEqual(core.events, ["up", "down", "up"])
