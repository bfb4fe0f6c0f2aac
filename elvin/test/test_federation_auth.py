"""Federation.Require-Authenticated: links that must be TLS with a peer
certificate that tls-ca verifies (throwaway certificates from trustme)."""


from twisted.internet import defer, reactor, task
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest

from elvin.config import ConfigError, parse
from elvin.federation.service import FederationService
from elvin.core.router import Router
from elvin.test.polling import wait_until
from elvin.test.transport_fixtures import Certificates
from elvin.test.places import free_port


class RequireAuthenticatedTests(unittest.TestCase):
    timeout = 30

    def setUp(self):
        self.certs = Certificates(self.mktemp())
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def logged(self, fragment):
        return any(fragment in formatEvent(e) for e in self.events)

    def start(self, text):
        config = parse(text, "fed.conf")
        config.federation.check("fed.conf", config.tls_ca)
        service = FederationService(Router(), config, reactor)
        service.startService()
        self.addCleanup(service.stopService)
        return service

    def acceptor(self, require="yes", secure=True, ca=True):
        port = free_port()
        scheme = "ewaf:/secure" if secure else "ewaf:/"
        text = ("Federation.Router-Name = acceptor.test\n"
                f"Federation.Listen = {scheme}/127.0.0.1:{port}\n"
                "Federation.Apply-Class[Peer] = 127.0.0.1\n"
                f"Federation.Require-Authenticated[Peer] = {require}\n"
                f"tls-certificate = {self.certs.server_cert}\n"
                f"tls-key = {self.certs.server_key}\n")
        if ca:
            text += f"tls-ca = {self.certs.ca_path}\n"
        return self.start(text), port

    def dialler(self, port, certificate=None, ca=None, secure=True, require="no"):
        scheme = "ewaf:/secure" if secure else "ewaf:/"
        text = ("Federation.Router-Name = dialler.test\n"
                f"Federation.Connect[Peer] = {scheme}/127.0.0.1:{port}\n"
                f"Federation.Require-Authenticated[Peer] = {require}\n"
                f"tls-ca = {ca or self.certs.ca_path}\n")
        if certificate:
            text += f"tls-certificate = {certificate}\n"
        return self.start(text)

    @defer.inlineCallbacks
    def test_verified_peer_certificate_links(self):
        acceptor, port = self.acceptor()
        dialler = self.dialler(port, certificate=self.certs.client_pem, require="yes")
        yield wait_until(lambda: acceptor.manager.links and dialler.manager.links)
        self.assertEqual(acceptor.manager.links[0].peer_domain, "dialler.test")

    @defer.inlineCallbacks
    def test_accepted_link_without_certificate_is_refused(self):
        acceptor, port = self.acceptor()
        dialler = self.dialler(port)
        # (the dialler logs its refusal once it has read the Nack: a turn later)
        yield wait_until(lambda: self.logged("refused federation from 127.0.0.1")
                         and self.logged("refused us"))
        self.assertTrue(self.logged("requires an authenticated peer, and 127.0.0.1 "
                                    "presented no certificate"))
        self.assertEqual(acceptor.manager.links, [])
        self.assertEqual(dialler.manager.links, [])

    @defer.inlineCallbacks
    def test_accepted_link_with_stranger_certificate_is_refused(self):
        acceptor, port = self.acceptor()
        dialler = self.dialler(port, certificate=self.certs.stranger_pem)
        # The handshake itself fails (the certificate does not chain to
        # tls-ca); the dialler keeps redialling and never links. Each side
        # logs why.
        yield wait_until(lambda: self.logged(
            "link from 127.0.0.1 failed before the link came up: TLS failed: certificate "
            "verify failed") and self.logged(
            f"link to ewaf:1.0/ssl,none,xdr/127.0.0.1:{port} failed before the link came "
            "up: TLS failed: tlsv1 alert unknown ca"))
        self.assertEqual(acceptor.manager.links, [])
        self.assertEqual(dialler.manager.links, [])

    @defer.inlineCallbacks
    def test_accepted_plain_tcp_link_is_refused(self):
        acceptor, port = self.acceptor(secure=False)
        self.dialler(port, secure=False)
        yield wait_until(lambda: self.logged("refused federation from 127.0.0.1"))
        self.assertTrue(self.logged("is not over TLS"))
        self.assertEqual(acceptor.manager.links, [])

    @defer.inlineCallbacks
    def test_dialled_link_to_unverifiable_peer_is_refused(self):
        # The acceptor requires nothing; the dialler does, and its tls-ca
        # does not verify the acceptor's certificate.
        acceptor, port = self.acceptor(require="no")
        dialler = self.dialler(port, certificate=self.certs.client_pem,
                               ca=self.certs.other_ca_path, require="yes")
        yield wait_until(lambda: self.logged(
            "link to ewaf:1.0/ssl,none,xdr/127.0.0.1:") and self.logged(
            "TLS failed: certificate verify failed") and self.logged(
            "link from 127.0.0.1 failed before the link came up: TLS failed: "))
        self.assertEqual(dialler.manager.links, [])
        self.assertEqual(acceptor.manager.links, [])

    @defer.inlineCallbacks
    def test_plain_dialler_to_tls_listener_logged(self):
        acceptor, port = self.acceptor(require="no")
        self.dialler(port, secure=False)
        yield wait_until(lambda: self.logged(
            "link from 127.0.0.1 failed before the link came up: TLS failed: wrong version "
            "number") and self.logged(
            "the peer closed the connection before answering FedConnRqst (if it is a TLS "
            "listener, use an ewaf:/secure/ URI)"))
        self.assertEqual(acceptor.manager.links, [])

    @defer.inlineCallbacks
    def test_tls_dialler_to_plain_listener_logged(self):
        acceptor, port = self.acceptor(require="no", secure=False)
        self.dialler(port)
        yield wait_until(lambda: self.logged(
            "link from 127.0.0.1 failed before the link came up: the peer speaks TLS, but "
            "this link is plain") and self.logged(
            f"link to ewaf:1.0/ssl,none,xdr/127.0.0.1:{port} failed before the link came "
            "up: TLS failed:"))
        self.assertEqual(acceptor.manager.links, [])

    def test_failures_logged_at_most_once_per_interval(self):
        from twisted.internet.task import Clock
        from elvin.federation.manager import FederationManager
        clock = Clock()
        manager = FederationManager(Router(), "m.test", [], None, clock)
        for _ in range(5):
            manager.link_failed_to_start("192.0.2.1", False, "TLS failed: x")
        manager.link_failed_to_start("192.0.2.1", False, "TLS failed: y")
        clock.advance(10)
        manager.link_failed_to_start("192.0.2.1", False, "TLS failed: x")
        lines = [formatEvent(e) for e in self.events if "failed before" in formatEvent(e)]
        self.assertEqual(lines, [
            "federation: link from 192.0.2.1 failed before the link came up: TLS failed: x",
            "federation: link from 192.0.2.1 failed before the link came up: TLS failed: y",
            "federation: link from 192.0.2.1 failed before the link came up: TLS failed: x "
            "(4 more in the last 10 s not logged)"])

    @defer.inlineCallbacks
    def test_dialled_plain_tcp_link_is_refused_before_sending(self):
        acceptor, port = self.acceptor(require="no", secure=False)
        dialler = self.dialler(port, secure=False, require="yes")
        yield wait_until(lambda: self.logged("not federating with 127.0.0.1"))
        self.assertTrue(self.logged("the link is not over TLS"))
        self.assertEqual(dialler.manager.links, [])
        self.assertEqual(acceptor.manager.links, [])

    @defer.inlineCallbacks
    def test_avis_global_form_names_hosts(self):
        port = free_port()
        acceptor = self.start(
            "Federation.Router-Name = acceptor.test\n"
            f"Federation.Listen = ewaf://127.0.0.1:{port}\n"
            "Federation.Apply-Class[Peer] = 127.0.0.1\n"
            "Federation.Require-Authenticated = 127.0.0.*\n"
            f"tls-ca = {self.certs.ca_path}\n")
        self.dialler(port, secure=False)
        yield wait_until(lambda: self.logged("refused federation from 127.0.0.1"))
        self.assertTrue(self.logged("Federation.Require-Authenticated requires"))
        self.assertEqual(acceptor.manager.links, [])

    def test_requirement_needs_tls_ca(self):
        with self.assertRaises(ConfigError) as cm:
            parse("Federation.Listen = ewaf://127.0.0.1:2916\n"
                  "Federation.Require-Authenticated[Peer] = yes\n", "fed.conf")
        self.assertIn("fed.conf", str(cm.exception))
        self.assertIn("needs tls-ca", str(cm.exception))
