"""A federation peer's router domain: a sane length and character set, and
peer-supplied text bounded and escaped wherever it is logged or labelled.
Sans-IO: links are driven with packets, no sockets."""

from twisted.internet.task import Clock
from twisted.trial import unittest

from elvin import errors
from elvin.config import ConfigError, parse
from elvin.core.router import Router
from elvin.federation import filters
from elvin.federation import packets as fed_packets
from elvin.federation.identity import MAX_DOMAIN_BYTES, domain_problem, shown
from elvin.federation.link import FederationLink
from elvin.federation.manager import FederationClass, FederationManager
from elvin.ops.metrics import RouterCollector
from elvin.protocols import packets
from elvin.test.test_federation import _LinkOutput, _Logged
from elvin.test.test_router import RecordingOutput

#: Domains real deployments use: DNS names, addresses, URIs, Avis's default.
GOOD = ["router.example.com", "hub", "10.1.2.3", "[2001:db8::1]:2916",
        "elvin://router.example.com:2917", "ewaf:1.0/tcp,none,xdr/hub.example.org:2916",
        "1b6d3586.4242@host.example.org", "routeur-été.exemple.fr", "ルーター.例え.jp",
        "Head Office Router", "a" * MAX_DOMAIN_BYTES, "é" * (MAX_DOMAIN_BYTES // 2)]

BAD = ["", "a" * (MAX_DOMAIN_BYTES + 1), "é" * (MAX_DOMAIN_BYTES // 2 + 1), "x" * 2 ** 20,
       "router\nINFO forged log line", "\x1b[31mred", "nul\x00", "tab\there",
       "\u202eevil.example.com", "zero\u200bwidth", "line\u2028sep", "nbsp\u00a0x",
       "surrogate\ud800", "private\ue000"]


class DomainRuleTests(unittest.TestCase):
    def test_real_domains_pass(self):
        for domain in GOOD:
            self.assertIsNone(domain_problem(domain), domain)

    def test_bad_domains_are_refused_without_being_quoted(self):
        for domain in BAD:
            problem = domain_problem(domain)
            self.assertIsNotNone(problem, repr(domain[:40]))
            self.assertLess(len(problem), 100)
            if domain:
                self.assertNotIn(domain, problem)

    def test_shown(self):
        self.assertIsNone(shown(None))
        self.assertEqual(shown("router.example.com"), "router.example.com")
        self.assertEqual(shown("a\nb\x1b\u202e"), "a\\nb\\x1b\\u202e")
        long = shown("x" * 2 ** 20)
        self.assertTrue(long.startswith("x" * 80))
        self.assertLess(len(long), 120)
        self.assertIn(f"{2 ** 20 - 80} more characters", long)
        self.assertTrue(shown("\n" * 1000).isprintable())
        self.assertLess(len(shown("\n" * 1000)), 120)


class LinkIdentityTests(unittest.TestCase):
    def setUp(self):
        self.router = Router()
        self.clock = Clock()
        self.fed_class = FederationClass("Peers", hosts=["*"])
        self.manager = FederationManager(self.router, "ours.example.com", [self.fed_class],
                                         None, self.clock, debounce=0)
        self.log = _Logged(self)

    def accepted_link(self, domain, host="10.0.0.7"):
        out = _LinkOutput()
        link = FederationLink(self.manager, out, False, self.fed_class, host)
        link.start()
        link.packet_received(fed_packets.FedConnRqst(1, 1, 0, domain))
        return link, out

    def dialled_link(self, reply_domain):
        out = _LinkOutput()
        link = FederationLink(self.manager, out, True, self.fed_class, "10.0.0.9")
        link.start()
        (request,) = out.sent
        link.packet_received(fed_packets.FedConnRply(request.xid, reply_domain))
        return link, out

    def assert_log_bounded(self):
        for line in self.log.lines:
            self.assertLess(len(line), 600, line[:200])
            self.assertNotIn("\x1b", line)
            self.assertNotIn("\u202e", line)
            self.assertNotIn("\n", line)

    def test_normal_domains_are_accepted_both_ways(self):
        for i, domain in enumerate(GOOD):
            link, out = self.accepted_link(domain)
            self.assertEqual(type(out.sent[0]), fed_packets.FedConnRply, domain)
            self.assertEqual((link.state, link.peer_domain), (link.UP, domain))
            link.connection_lost()
        for domain in GOOD:
            link, out = self.dialled_link(domain)
            self.assertEqual((link.state, link.peer_domain), (link.UP, domain))
            link.connection_lost()
        self.assertEqual(self.manager.links, [])

    def test_bad_domain_is_refused_with_a_nack_and_a_bounded_log_line(self):
        bystander, _ = self.accepted_link("router.example.com")
        for domain in BAD:
            link, out = self.accepted_link(domain)
            (nack,) = out.sent
            self.assertIsInstance(nack, packets.Nack)
            self.assertEqual(nack.error, errors.AUTHZ_FAIL)
            self.assertNotIn(domain or "\0", nack.message)
            self.assertTrue(out.closed)
            self.assertEqual(link.state, link.CLOSED)
            self.assertIsNone(link.peer_domain)
        self.assertEqual(self.manager.links, [bystander])
        refusals = [line for line in self.log.lines if "refused federation" in line]
        self.assertEqual(len(refusals), len(BAD))
        self.assert_log_bounded()
        self.assertTrue(any("x" * 80 + "…[" in line for line in refusals))
        self.assertTrue(any("router\\nINFO forged" in line for line in refusals))
        # The bystander link still carries notifications.
        bystander.packet_received(fed_packets.FedSubReplace(2, filters.to_wire(filters.TRUE)))
        self.clock.advance(1)
        out = bystander.output
        out.sent.clear()
        producer = self.router.open_session(RecordingOutput(), "producer")
        producer.packet_received(packets.ConnRqst(1, 4, 0, {}, packets.Keys.EMPTY, packets.Keys.EMPTY))
        producer.packet_received(packets.NotifyEmit({"x": 1}, True, packets.Keys.EMPTY))
        self.assertEqual([type(p) for p in out.sent], [fed_packets.FedNotify])

    def test_bad_domain_in_the_reply_closes_the_dialled_link(self):
        for domain in BAD:
            link, out = self.dialled_link(domain)
            self.assertEqual(link.state, link.CLOSED)
            self.assertTrue(out.closed)
            self.assertIsNone(link.peer_domain)
        self.assertEqual(self.manager.links, [])
        self.assertEqual(len([line for line in self.log.lines if "closing federation" in line]),
                         len(BAD))
        self.assert_log_bounded()

    def test_peer_messages_are_logged_bounded(self):
        link, out = self.dialled_link("router.example.com")
        link.send_filter(filters.TRUE)
        xid = max(link._pending)
        link.packet_received(packets.Nack(xid, errors.PROT_ERROR, "\x1b[2J" + "m" * 2 ** 20, ()))
        out = _LinkOutput()
        refused = FederationLink(self.manager, out, True, self.fed_class, "10.0.0.9")
        refused.start()
        refused.packet_received(packets.Nack(out.sent[0].xid, errors.AUTHZ_FAIL, "no\n" * 100000,
                                       ()))
        self.assertEqual(refused.state, refused.CLOSED)
        self.assertEqual(len([line for line in self.log.lines if "rejected our" in line
                              or "refused us" in line]), 2)
        self.assert_log_bounded()

    def test_mesh_advert_naming_a_bad_domain_is_ignored(self):
        link, _ = self.accepted_link("router.example.com")
        marked = filters.with_marker(filters.TRUE, self.manager.mesh_marker)
        link.packet_received(fed_packets.FedSubReplace(2, filters.to_wire(marked)))  # a mesh link
        link.packet_received(fed_packets.FedMeshAdvert("x" * 2 ** 20, 1, 1, ["router.example.com"]))
        link.packet_received(fed_packets.FedMeshAdvert("other.example.com", 1, 1, ["bad\ndomain"]))
        self.assertEqual(self.manager.mesh.adverts, {})
        link.packet_received(fed_packets.FedMeshAdvert("other.example.com", 1, 1,
                                              ["router.example.com"]))
        self.assertEqual(list(self.manager.mesh.adverts), ["other.example.com"])
        self.assert_log_bounded()

    def test_metrics_label_is_bounded(self):
        status = {"domain": None, "host": "h" * 10000, "state": "up", "active": True,
                  "filter_nodes": 1, "in": 0, "out": 0, "loops": 0, "suppressed": 0,
                  "duplicates": 0, "overload": 0, "unsent": 0, "bytes_in": 0, "bytes_out": 0,
                  "last_heard_s": None}
        normal = dict(status, domain="router.example.com")
        for family in RouterCollector._links([status, normal]):
            peers = {sample.labels["peer"] for sample in family.samples}
            if not peers:
                continue                # no last-heard figures here
            self.assertIn("router.example.com", peers)
            self.assertTrue(all(len(peer) <= MAX_DOMAIN_BYTES + 40 for peer in peers))


class RouterNameConfigTests(unittest.TestCase):
    def test_our_domain_is_held_to_the_same_rule(self):
        config = parse("Federation.Router-Name = elvin://hub.example.org:2917\n")
        self.assertEqual(config.federation.domain(), "elvin://hub.example.org:2917")
        with self.assertRaises(ConfigError) as caught:
            parse(f"Federation.Router-Name = {'a' * 300}\n", "router.conf")
        self.assertIn("router.conf", str(caught.exception))
        self.assertIn("at most 255", str(caught.exception))
