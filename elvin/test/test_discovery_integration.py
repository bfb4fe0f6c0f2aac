"""Router discovery end to end, on loopback multicast only.

Every multicast socket here has its outgoing interface pinned to 127.0.0.1
and an IP TTL limit of 0, so no packet can leave the host; each test uses
the ERDP group 224.4.0.1 on a port of its own (so concurrent test runs do
not hear each other); DNS-SD is off (see test_discovery_dnssd).  Where the
locality *field* of a SvrRqst is above 0 (the expanding search), the IP
TTL is still 0.  If multicast does not loop back in this environment the
tests are skipped, saying so; the codec and state-machine tests
(test_discovery_packets, test_discovery_state) run regardless.
"""

import functools
import io
import socket
import uuid

from twisted.internet import defer, reactor, task
from twisted.logger import globalLogPublisher
from twisted.trial import unittest

from elvin import client, tap
from elvin.discovery import advertiser as advertiser_module
from elvin.discovery import discoverer as discoverer_module
from elvin.discovery import solicitor as solicitor_module
from elvin.discovery import packets as discovery_packets
from elvin.discovery.channel import MulticastChannel
from elvin.discovery.discoverer import Discoverer, NoRouterFound, resolve_uri
from elvin.discovery.service import DiscoveryService
from elvin.protocols.server import ElvinServerFactory
from elvin.core.router import Router
from elvin.tools import common, discover
from elvin.uri import ElvinURI
from elvin.test import places
from elvin.test.polling import wait_until

LOOPBACK = "127.0.0.1"



def sleep(seconds):
    return task.deferLater(reactor, seconds, lambda: None)


def free_port(kind=socket.SOCK_DGRAM):
    return places.free_port(kind)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


_probe = {}


@defer.inlineCallbacks
def multicast_skip_reason():
    """None if multicast loops back on 127.0.0.1 here, else why not
    (worked out once per test run)."""
    if "reason" in _probe:
        return _probe["reason"]
    got = defer.Deferred()

    def on_packet(packet, address, own):
        if not got.called:
            got.callback(packet)
    channel = MulticastChannel(reactor, on_packet, port=free_port(),
                               interface=LOOPBACK, ttl_limit=0)
    reason = None
    try:
        yield channel.start()
    except Exception as e:
        reason = f"multicast on the loopback interface is unavailable here: {e}"
    else:
        channel.send(discovery_packets.SvrRqst(), 0)
        timer = reactor.callLater(
            3, lambda: got.called or got.errback(TimeoutError("no packet")))
        try:
            yield got
        except TimeoutError:
            reason = ("multicast sent on 127.0.0.1 does not loop back in this "
                      "environment (nothing received in 3 s)")
        if timer.active():
            timer.cancel()
        yield channel.stop()
    _probe["reason"] = reason
    return reason


class LoopbackCase(unittest.TestCase):
    timeout = 30
    #: The draft's two-second gaps (between one router's adverts, between a
    #: client's requests at one locality) cut to 0.2 s: these tests check
    #: what crosses the sockets, not the gaps, which test_discovery_state
    #: checks against a Clock and StormTests at their real length.
    FAST_GAPS = True

    @defer.inlineCallbacks
    def setUp(self):
        reason = yield multicast_skip_reason()
        if reason:
            raise unittest.SkipTest(reason)
        self.group_port = free_port()
        if self.FAST_GAPS:
            self.patch(advertiser_module, "RATE_LIMIT", 0.2)
            self.patch(solicitor_module, "REPEAT_GAP", 0.2)

    @defer.inlineCallbacks
    def start_router(self, scope, default=False, **kwargs):
        """A real router on 127.0.0.1:<ephemeral> advertised by discovery."""
        router = Router()
        tcp = reactor.listenTCP(0, ElvinServerFactory(router, reactor),
                                interface=LOOPBACK)
        self.addCleanup(tcp.stopListening)
        uri = ElvinURI(f"elvin://{LOOPBACK}:{tcp.getHost().port}")
        svc = DiscoveryService([uri], reactor=reactor, scope=scope, default=default,
                               interface=LOOPBACK, ttl_limit=0, port=self.group_port,
                               dns_sd=False, **kwargs)
        svc.startService()
        self.addCleanup(lambda: svc.stopService() if svc.running else None)
        yield svc.ready
        self.assertIsNone(svc.erdp_error)
        svc.uri = uri
        svc.router = router
        svc.tcp = tcp
        return svc

    @defer.inlineCallbacks
    def discoverer(self, max_locality=0, **kwargs):
        d = Discoverer(reactor, interface=LOOPBACK, ttl_limit=0,
                       max_locality=max_locality, port=self.group_port,
                       dns_sd=False, **kwargs)
        yield d.start()
        self.addCleanup(d.stop)
        self.assertTrue(d.erdp_running)
        return d

    def loopback_discoverer_class(self):
        """Discoverer, pinned to this test's loopback group (for code that
        makes its own)."""
        return functools.partial(Discoverer, interface=LOOPBACK, ttl_limit=0,
                                 max_locality=0, port=self.group_port, dns_sd=False)

    @defer.inlineCallbacks
    def close(self, conn):
        yield conn.close()
        if not conn.disconnected.called:
            yield conn.disconnected


class TwoRouterTests(LoopbackCase):

    @defer.inlineCallbacks
    def test_client_finds_the_router_of_its_scope(self):
        red_scope, blue_scope = unique("red"), unique("blue")
        red = yield self.start_router(red_scope, default=True)
        blue = yield self.start_router(blue_scope)
        d = yield self.discoverer()
        conn = yield client.connect(scope=blue_scope, discoverer=d,
                                    discovery_timeout=10, reactor=reactor)
        self.addCleanup(self.close, conn)
        self.assertEqual(conn.uri, blue.uri)
        self.assertEqual(conn.router.name, blue.router_name)
        self.assertEqual(conn.router.scope, blue_scope)
        # A working session with the blue router.
        got = []
        yield conn.subscribe("require(Colour)", got.append)
        conn.notify({"Colour": "blue"})
        yield wait_until(lambda: got)
        self.assertEqual(got[0]["Colour"], "blue")
        # Both routers are in the cache now (they both answered).
        yield wait_until(lambda: d.cache.get(red.router_name) is not None)
        # Without a scope only the default router qualifies: red.
        found = yield d.find(None, timeout=10)
        self.assertEqual({record.name for record, _ in found}, {red.router_name})
        found = yield d.find(red_scope, timeout=10)
        self.assertEqual([uri for _, uri in found], [red.uri])

    @defer.inlineCallbacks
    def test_withdrawal_removes_router_from_cache(self):
        red_scope, blue_scope = unique("red"), unique("blue")
        red = yield self.start_router(red_scope)
        blue = yield self.start_router(blue_scope)
        d = yield self.discoverer()
        yield d.find(red_scope, timeout=10)
        yield d.find(blue_scope, timeout=10)
        events = []
        d.cache.listeners.append(lambda event, record: events.append((event, record.name)))
        yield blue.stopService()
        yield wait_until(lambda: d.cache.get(blue.router_name) is None)
        self.assertEqual(events, [("withdrawn", blue.router_name)])
        self.assertIsNotNone(d.cache.get(red.router_name))
        self.assertEqual(d.candidates(blue_scope), [])
        with self.assertRaises(NoRouterFound):
            yield d.find(blue_scope, timeout=0.5)

    @defer.inlineCallbacks
    def test_startup_advert_fills_passive_cache(self):
        scope = unique("passive")
        d = yield self.discoverer()
        svc = yield self.start_router(scope)
        yield wait_until(lambda: d.cache.get(svc.router_name) is not None)
        self.assertEqual(d.solicitor.sent, [])          # never solicited
        record = d.cache.get(svc.router_name)
        self.assertEqual((record.scope, record.revision, record.source),
                         (scope, 1, "erdp"))
        self.assertTrue(record.local)
        self.assertEqual(record.uris, (str(svc.uri),))

    @defer.inlineCallbacks
    def test_offer_change_is_readvertised_with_new_revision(self):
        scope, new_scope = unique("old"), unique("new")
        d = yield self.discoverer()
        svc = yield self.start_router(scope)
        yield wait_until(lambda: d.cache.get(svc.router_name) is not None)
        self.assertTrue(svc.update(scope=new_scope))
        self.assertFalse(svc.update(scope=new_scope))
        yield wait_until(lambda: d.cache.get(svc.router_name).revision == 2)
        self.assertEqual(d.cache.get(svc.router_name).scope, new_scope)
        found = yield d.find(new_scope, timeout=1)
        self.assertEqual(found[0][1], svc.uri)


class StormTests(LoopbackCase):

    N = 20
    FAST_GAPS = False           # the rate limit is what these check

    @defer.inlineCallbacks
    def test_many_clients_one_router(self):
        scope = unique("storm")
        svc = yield self.start_router(scope)
        adverts = []
        send = svc.advertiser._send

        def recording_send(packet, locality):
            adverts.append((reactor.seconds(), type(packet).__name__, locality))
            send(packet, locality)
        svc.advertiser._send = recording_send
        observer = yield self.discoverer()           # passive: never asks
        clients = []
        for _ in range(self.N):
            clients.append((yield self.discoverer(max_locality=2)))
        results = yield defer.gatherResults(
            [c.find(scope, timeout=15) for c in clients])
        self.assertEqual({found[0][1] for found in results}, {svc.uri})
        yield sleep(2.5)      # let any coalesced answer go out
        times = [t for t, kind, _ in adverts if kind == "SvrAdvt"]
        self.assertGreaterEqual(len(times), 1)
        gaps = [b - a for a, b in zip(times, times[1:])]
        if gaps:
            self.assertGreaterEqual(min(gaps), 2.0 - 1e-6, adverts)
        self.assertLessEqual(svc.advertiser.adverts_sent, 3, adverts)
        self.assertGreaterEqual(svc.advertiser.requests_seen, 1)
        self.assertEqual({loc for _, _, loc in adverts}, {0})    # TTL limit 0
        # Every client asked at most once per locality it reached, and the
        # router's answer stopped each of them from widening further.
        requests = [item for item in observer.heard if item[1] == "SvrRqst"]
        self.assertLessEqual(len(requests), 3 * self.N)
        for c in clients:
            self.assertLessEqual(len(c.solicitor.sent), 3)

    @defer.inlineCallbacks
    def test_suppression_when_nobody_answers(self):
        scope = unique("nobody")
        clients = []
        for _ in range(self.N):
            clients.append((yield self.discoverer(max_locality=2)))
        results = yield defer.DeferredList(
            [c.find(scope, timeout=4) for c in clients], consumeErrors=True)
        for ok, result in results:
            self.assertFalse(ok)
            result.trap(NoRouterFound)
        sent = [loc for c in clients for _, loc in c.solicitor.sent]
        # Locality 0 has no pre-request interval, so everyone asks once...
        self.assertEqual(sent.count(0), self.N)
        # ...but the wider requests are suppressed by each other's: far
        # fewer than one per client per step (2 * N or more without).
        wider = len(sent) - self.N
        self.assertGreaterEqual(wider, 1)
        self.assertLessEqual(wider, self.N, sent)
        # The rule itself, checked against what each client heard: no
        # equal-or-wider SvrRqst from anyone else arrived inside the wait
        # before any SvrRqst it sent.
        for c in clients:
            foreign = [(t, loc) for t, kind, loc, own in c.heard
                       if kind == "SvrRqst" and not own]
            for start, end, locality, outcome in c.solicitor.history:
                inside = [t for t, loc in foreign if loc >= locality and start < t < end]
                if outcome == "sent":
                    self.assertEqual(inside, [], (start, end, locality))


class ConnectTests(LoopbackCase):

    @defer.inlineCallbacks
    def test_tries_the_next_router_on_failure(self):
        scope = unique("failover")
        live = yield self.start_router(scope)
        d = yield self.discoverer()
        dead_port = free_port(socket.SOCK_STREAM)
        # A router that crashed without withdrawing: still in the cache, first.
        d.cache.learn("crashed-router", scope, False, 1,
                      [f"elvin://{LOOPBACK}:{dead_port}"], address=LOOPBACK, local=True)
        conn = yield client.connect(scope=scope, discoverer=d, discovery_timeout=10,
                                    reactor=reactor)
        self.addCleanup(self.close, conn)
        self.assertEqual(conn.router.name, live.router_name)
        self.assertEqual(conn.uri, live.uri)

    @defer.inlineCallbacks
    def test_vanished_router_fails_over_to_a_discovered_one(self):
        """connect(..., failover=True): when our router is gone the session
        moves to another of the scope, with its subscription."""
        scope = unique("vanish")
        first = yield self.start_router(scope)
        second = yield self.start_router(scope)
        d = yield self.discoverer()
        yield d.find(scope, 10)
        conn = yield client.connect(first.uri, reactor=reactor, scope=scope, discoverer=d,
                                    reconnect=client.Reconnect(initial=0.1, maximum=0.5),
                                    failover=True)
        self.addCleanup(self.close, conn)
        got, moved = [], []
        conn.on_redirect = moved.append
        yield conn.subscribe("require(n)", got.append)
        # The first router dies: its port closes, its clients are cut off.
        yield first.tcp.stopListening()
        for session in list(first.router.sessions):
            session.output.transport.abortConnection()
        yield first.stopService()
        yield wait_until(lambda: moved, timeout=20)
        self.assertEqual(str(conn.uri), str(second.uri))
        self.assertEqual(len(second.router.subscriptions), 1)
        publisher = yield client.connect(second.uri, reactor=reactor)
        self.addCleanup(self.close, publisher)
        publisher.notify({"n": 1})
        yield wait_until(lambda: got)

    @defer.inlineCallbacks
    def test_no_router_found(self):
        d = yield self.discoverer()
        with self.assertRaises(NoRouterFound) as cm:
            yield client.connect(scope=unique("absent"), discoverer=d,
                                 discovery_timeout=0.3, reactor=reactor)
        self.assertIn("scope", str(cm.exception))

    @defer.inlineCallbacks
    def test_discover_default_router(self):
        svc = yield self.start_router(unique("dflt"), default=True)
        yield self.start_router(unique("other"), default=False)
        d = yield self.discoverer()
        conn = yield client.connect(discover=True, discoverer=d, reactor=reactor)
        self.addCleanup(self.close, conn)
        self.assertEqual(conn.router.name, svc.router_name)

    @defer.inlineCallbacks
    def test_connect_makes_and_stops_its_own_discoverer(self):
        scope = unique("own")
        svc = yield self.start_router(scope)
        made = []

        def make(*args, **kwargs):
            instance = self.loopback_discoverer_class()(*args, **kwargs)
            made.append(instance)
            return instance
        self.patch(discoverer_module, "Discoverer", make)
        conn = yield client.connect(scope=scope, reactor=reactor)
        self.addCleanup(self.close, conn)
        self.assertEqual(conn.uri, svc.uri)
        self.assertEqual(len(made), 1)
        self.assertFalse(made[0].running)
        self.assertFalse(made[0].erdp_running)

    @defer.inlineCallbacks
    def test_resolve_uri(self):
        scope = unique("resolve")
        svc = yield self.start_router(scope)
        kwargs = dict(interface=LOOPBACK, ttl_limit=0, max_locality=0,
                      port=self.group_port, dns_sd=False)
        uri = yield resolve_uri(reactor, scope=scope, timeout=5, **kwargs)
        self.assertEqual(uri, svc.uri)
        # No default router here: the fallback.
        uri = yield resolve_uri(reactor, timeout=0.2, fallback="elvin://localhost:2917",
                                **kwargs)
        self.assertEqual(uri, ElvinURI("elvin://localhost:2917"))
        # With a scope there is no fallback.
        with self.assertRaises(NoRouterFound):
            yield resolve_uri(reactor, scope=unique("none"), timeout=0.2,
                              fallback="elvin://localhost:2917", **kwargs)


class TapTests(LoopbackCase):

    def discovery_config(self, scope):
        """A configuration file advertising on this test's loopback group."""
        path = self.mktemp()
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"discovery-scope = {scope}\n"
                    "discovery-default = no\n"
                    f"discovery-interface = {LOOPBACK}\n"
                    "discovery-ttl = 0\n"
                    "discovery-dns-sd = no\n"
                    f"discovery-group = 224.4.0.1:{self.group_port}\n")
        return path

    @defer.inlineCallbacks
    def test_twistd_elvin_with_discovery(self):
        scope = unique("tap")
        path = self.discovery_config(scope)
        listen = f"elvin://{LOOPBACK}:{free_port(socket.SOCK_STREAM)}"
        options = tap.Options()
        options.parseOptions(["--discovery", "-c", path, "-l", listen])
        top = tap.makeService(options, reactor)
        svc = top.getServiceNamed("discovery")
        d = yield self.discoverer()
        top.startService()
        stopped = []

        def stop():
            if not stopped:
                stopped.append(True)
                return top.stopService()
        self.addCleanup(stop)
        yield svc.ready
        conn = yield client.connect(scope=scope, discoverer=d, discovery_timeout=10,
                                    reactor=reactor)
        self.assertEqual(conn.uri, ElvinURI(listen))
        yield self.close(conn)
        yield stop()
        yield wait_until(lambda: d.cache.get(svc.router_name) is None)


    @defer.inlineCallbacks
    def two_routers_and_a_client(self, path):
        """Two ``twistd elvin`` services with discovery by ``path``, and a
        client of the first: ((service, uri), (service, uri), connection)."""
        tops = []
        for _ in range(2):
            listen = f"elvin://{LOOPBACK}:{free_port(socket.SOCK_STREAM)}"
            options = tap.Options()
            options.parseOptions(["--discovery", "-c", path, "-l", listen])
            top = tap.makeService(options, reactor)
            top.startService()
            self.addCleanup(top.stopService)
            yield top.getServiceNamed("discovery").ready
            tops.append((top, listen))
        conn = yield client.connect(tops[0][1], reactor=reactor)
        self.addCleanup(self.close, conn)
        return tops[0], tops[1], conn

    @defer.inlineCallbacks
    def test_drain_without_redirect_to_finds_another_router(self):
        """A drained router with discovery and no redirect-to sends its
        clients to another router of its scope."""
        scope = unique("drain")
        path = self.discovery_config(scope)
        (old, old_uri), (new, new_uri), conn = yield self.two_routers_and_a_client(path)
        got, moved = [], []
        conn.on_redirect = moved.append
        yield conn.subscribe("require(n)", got.append)
        count = yield old.drain()
        self.assertEqual(count, 1)
        yield wait_until(lambda: moved and len(new.router.subscriptions) == 1, timeout=20)
        self.assertEqual(conn.uri, ElvinURI(new_uri))


    @defer.inlineCallbacks
    def test_drain_skips_an_advertised_uri_where_nothing_answers(self):
        """Adverts are unauthenticated: one pointing where no router listens
        (seen first here) does not get the clients; the next router does."""
        scope = unique("forged")
        path = self.discovery_config(scope)
        dead = f"elvin://{LOOPBACK}:{free_port(socket.SOCK_STREAM)}"
        forged = DiscoveryService([ElvinURI(dead)], reactor=reactor, scope=scope,
                                  default=False, interface=LOOPBACK, ttl_limit=0,
                                  port=self.group_port, dns_sd=False)
        forged.startService()
        self.addCleanup(lambda: forged.stopService() if forged.running else None)
        yield forged.ready
        (old, old_uri), (new, new_uri), conn = yield self.two_routers_and_a_client(path)
        moved = []
        conn.on_redirect = moved.append
        logged = []
        globalLogPublisher.addObserver(logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, logged.append)
        count = yield old.drain()
        self.assertEqual(count, 1)
        yield wait_until(lambda: moved, timeout=20)
        self.assertEqual(conn.uri, ElvinURI(new_uri))
        self.assertTrue(any(e.get("uri") == tap._short(ElvinURI(dead)) for e in logged
                            if "does not answer" in e.get("log_format", "")))


class ToolTests(LoopbackCase):

    @defer.inlineCallbacks
    def test_elvin_discover_lists_routers_and_withdrawals(self):
        scope = unique("list")
        svc = yield self.start_router(scope, default=True)
        options = discover.Options()
        options.parseOptions(["--time", "1.5", "--interface", LOOPBACK, "--no-dns-sd",
                              "--group", f"224.4.0.1:{self.group_port}",
                              "--locality", "0", "--scope", scope])
        out = io.StringIO()
        listing = defer.ensureDeferred(discover.body(reactor, options, out))
        # Withdrawn once listed (the answer comes within the gap, 0.2 s).
        yield wait_until(lambda: f"router {svc.router_name}\n" in out.getvalue())
        yield svc.stopService()
        yield listing
        text = out.getvalue()
        self.assertIn(f"router {svc.router_name}\n", text)
        self.assertIn(f'scope: "{scope}"  default: yes  revision: 1  via: erdp '
                      f"from {LOOPBACK}", text)
        self.assertIn(f"  uri: {svc.uri}\n", text)
        self.assertTrue(text.endswith(f"withdrawn {svc.router_name}\n"), text)

    @defer.inlineCallbacks
    def test_elvin_discover_ends_when_its_output_fails(self):
        """A full disk (ENOSPC) ends the listing with StdoutFailed (the
        tool's one error line), not a traceback per router."""
        import errno
        from elvin.tools.output import StdoutFailed

        class Full(io.StringIO):
            def write(self, text):
                raise OSError(errno.ENOSPC, "No space left on device")
        scope = unique("full")
        yield self.start_router(scope, default=True)
        options = discover.Options()
        options.parseOptions(["--time", "5", "--interface", LOOPBACK, "--no-dns-sd",
                              "--group", f"224.4.0.1:{self.group_port}",
                              "--locality", "0", "--scope", scope])
        with self.assertRaises(StdoutFailed) as caught:
            yield defer.ensureDeferred(discover.body(reactor, options, Full()))
        self.assertEqual(str(caught.exception), "cannot write to stdout: No space left on device")

    @defer.inlineCallbacks
    def test_elvin_discover_fails_when_nothing_seen(self):
        options = discover.Options()
        options.parseOptions(["--time", "0.2", "--interface", LOOPBACK, "--no-dns-sd",
                              "--group", f"224.4.0.1:{self.group_port}",
                              "--locality", "0", "--scope", unique("none")])
        with self.assertRaises(NoRouterFound):
            yield defer.ensureDeferred(discover.body(reactor, options, io.StringIO()))

    @defer.inlineCallbacks
    def test_tools_without_e_discover_their_router(self):
        scope = unique("tool")
        svc = yield self.start_router(scope)
        self.patch(discoverer_module, "Discoverer", self.loopback_discoverer_class())

        class Options(common.ToolOptions):
            pass

        seen = []

        async def body(reactor, options):
            seen.append(options["uri"])

        options = Options()
        options.parseOptions(["--scope", scope, "--discovery-time", "5"])
        self.assertIsNone(options["uri"])
        yield defer.ensureDeferred(common._with_uri(reactor, options, body))
        self.assertEqual(seen, [svc.uri])
        # Nothing found and no scope: the old default.
        options = Options()
        options.parseOptions(["--discovery-time", "0.3"])
        yield defer.ensureDeferred(common._with_uri(reactor, options, body))
        self.assertEqual(seen[-1], ElvinURI(common.DEFAULT_URI))
        # An explicit -e is used as it is, without discovery.
        options = Options()
        options.parseOptions(["-e", "elvin://192.0.2.7:4000"])
        yield defer.ensureDeferred(common._with_uri(reactor, options, body))
        self.assertEqual(seen[-1], ElvinURI("elvin://192.0.2.7:4000"))

