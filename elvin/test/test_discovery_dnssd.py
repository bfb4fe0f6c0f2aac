"""DNS-SD (``_elvin._tcp.local.``) through zeroconf, bound to 127.0.0.1 only.

zeroconf is given ``interfaces=["127.0.0.1"]`` everywhere, so mDNS stays
on the loopback interface; registration skips conflict probing
(``probe=False``: the test timing), and every scope name is unique so
concurrent test runs on the same host cannot confuse each other.  The
TXT-record helpers are tested without any network.
"""

import socket
import uuid

from twisted.internet import defer, reactor, threads
from twisted.trial import unittest

from elvin import client
from elvin.discovery import dnssd
from elvin.discovery.discoverer import Discoverer
from elvin.discovery.dnssd import (
    SERVICE_TYPE, DnsSdBrowser, DnsSdPublisher, instance_name, parse_properties,
    txt_properties)
from elvin.discovery.service import DiscoveryService
from elvin.protocols.server import ElvinServerFactory
from elvin.core.router import Router
from elvin.uri import ElvinURI
from elvin.test.polling import wait_until

LOOPBACK = "127.0.0.1"



def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class TxtRecordTests(unittest.TestCase):
    timeout = 30

    def test_round_trip(self):
        props = txt_properties("r1", "chat", True, 3,
                               [ElvinURI("elvin://192.0.2.1:2917"), "elvin://h:1"])
        self.assertEqual(props, {"txtvers": "1", "name": "r1", "scope": "chat",
                                 "default": "yes", "rev": "3",
                                 "uri0": "elvin:4.0/tcp,none,xdr/192.0.2.1:2917",
                                 "uri1": "elvin://h:1"})
        wire = {k.encode(): v.encode() for k, v in props.items()}
        self.assertEqual(parse_properties(wire),
                         ("r1", "chat", True, 3,
                          ("elvin:4.0/tcp,none,xdr/192.0.2.1:2917", "elvin://h:1")))

    def test_limits(self):
        long_uri = "elvin://" + "h" * 300
        props = txt_properties("r", "", False, 1, ["elvin://a", long_uri, "elvin://b"])
        self.assertEqual([k for k in props if k.startswith("uri")], ["uri0"])
        many = [f"elvin://host-number-{i}.example.com:2917" for i in range(100)]
        props = txt_properties("r", "", False, 1, many)
        total = sum(len(k) + len(v) + 2 for k, v in props.items())
        self.assertLessEqual(total, 1300)
        self.assertLess(len([k for k in props if k.startswith("uri")]), 100)

    def test_parse_rejects_foreign_records(self):
        self.assertIsNone(parse_properties({}))
        self.assertIsNone(parse_properties({b"txtvers": b"2", b"uri0": b"elvin://h"}))
        self.assertEqual(parse_properties({b"uri0": b"elvin://h", b"rev": b"x",
                                           b"default": None}),
                         ("", "", False, 1, ("elvin://h",)))

    def test_instance_name_fits_a_label(self):
        self.assertLessEqual(len(instance_name("\u00e9" * 100).encode()), 63)
        self.assertTrue(instance_name().startswith("Elvin router"))


_probe = {}


@defer.inlineCallbacks
def zeroconf_skip_reason():
    if "reason" in _probe:
        return _probe["reason"]
    reason = None
    try:
        zc = yield threads.deferToThread(dnssd.make_zeroconf, [LOOPBACK])
        yield threads.deferToThread(zc.close)
    except Exception as e:
        reason = f"zeroconf cannot bind to {LOOPBACK} here: {e}"
    _probe["reason"] = reason
    return reason


class ZeroconfCase(unittest.TestCase):
    timeout = 30

    @defer.inlineCallbacks
    def setUp(self):
        reason = yield zeroconf_skip_reason()
        if reason:
            raise unittest.SkipTest(reason)


class PublishBrowseTests(ZeroconfCase):

    @defer.inlineCallbacks
    def test_register_update_unregister(self):
        name = unique("router")
        scope = unique("scope")
        found, removed = [], []
        browser = DnsSdBrowser(reactor, lambda *a: found.append(a), removed.append,
                               interfaces=[LOOPBACK], resolve_timeout=3)
        yield browser.start()
        self.addCleanup(browser.stop)
        publisher = DnsSdPublisher(reactor, name, scope, True, 1,
                                   ["elvin://127.0.0.1:4000"], interfaces=[LOOPBACK],
                                   instance=unique("Elvin test"), probe=False)
        registered = yield publisher.start()
        self.assertTrue(registered.endswith("." + SERVICE_TYPE))
        stopped = []

        def stop():
            if not stopped:
                stopped.append(True)
                return publisher.stop()
        self.addCleanup(stop)

        def ours():
            return [item for item in found if item[0][0] == name]
        yield wait_until(lambda: ours())
        (fields, host, local), = ours()[:1]
        self.assertEqual(fields, (name, scope, True, 1, ("elvin://127.0.0.1:4000",)))
        self.assertTrue(local)          # our own host name
        self.assertEqual(host, socket.gethostname().split(".")[0].lower())
        yield publisher.update(name, scope, False, 2,
                               ["elvin://127.0.0.1:4000", "elvin://127.0.0.1:4001"])
        yield wait_until(lambda: any(f[0][3] == 2 for f in ours()))
        latest = [f for f in ours() if f[0][3] == 2][-1][0]
        self.assertEqual(latest[2], False)
        self.assertEqual(len(latest[4]), 2)
        yield stop()
        yield wait_until(lambda: name in removed)


class DiscovererDnsSdTests(ZeroconfCase):

    @defer.inlineCallbacks
    def test_client_finds_router_by_dns_sd_alone(self):
        scope = unique("mdns")
        router = Router()
        tcp = reactor.listenTCP(0, ElvinServerFactory(router, reactor), interface=LOOPBACK)
        self.addCleanup(tcp.stopListening)
        uri = ElvinURI(f"elvin://{LOOPBACK}:{tcp.getHost().port}")
        # ERDP on a private loopback group too; the client only browses DNS-SD.
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((LOOPBACK, 0))
        group_port = s.getsockname()[1]
        s.close()
        svc = DiscoveryService([uri], reactor=reactor, scope=scope, interface=LOOPBACK,
                               ttl_limit=0, port=group_port, dns_sd=True,
                               dns_sd_probe=False)
        svc.startService()
        self.addCleanup(lambda: svc.stopService() if svc.running else None)
        yield svc.ready
        self.assertIsNone(svc.dns_sd_error)
        d = Discoverer(reactor, erdp=False, dns_sd=True, dns_sd_interfaces=[LOOPBACK])
        yield d.start()
        self.addCleanup(d.stop)
        conn = yield client.connect(scope=scope, discoverer=d, discovery_timeout=10,
                                    reactor=reactor)
        self.assertEqual(conn.uri, uri)
        self.assertEqual(conn.router.source, "dns-sd")
        self.assertEqual(conn.router.name, svc.router_name)
        yield conn.close()
        if not conn.disconnected.called:
            yield conn.disconnected
        # Unregistering (router shutdown) removes it from the cache.
        yield svc.stopService()
        yield wait_until(lambda: d.cache.get(svc.router_name) is None)
