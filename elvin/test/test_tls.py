"""TLS transport: ssl,none,xdr (alias secure) and tcp,ssl,xdr on 127.0.0.1,
with throwaway certificates from trustme."""

from twisted.internet import defer, reactor, ssl
from twisted.trial import unittest

from elvin import client, config
from elvin.protocols import tls
from elvin.uri import ElvinURI

from elvin.test.transport_fixtures import (Certificates, PubSubScenarios, RouterFixture,
                                          memory_handshake, wait_until)


class TLSFixture(RouterFixture):
    stack = "ssl,none,xdr"
    client_cert = False

    def setUp(self):
        super().setUp()
        self.certs = Certificates(self.mktemp())
        self.server_options = tls.server_options(self.certs.server_cert,
                                                 self.certs.server_key)
        self.uri = self.listen_tls(self.server_options, self.stack)
        self.client_args = {"tls_ca": self.certs.ca_path}


class SSLStackTests(TLSFixture, PubSubScenarios):
    """The secure stack as ssl,none,xdr."""


class TCPSSLStackTests(TLSFixture, PubSubScenarios):
    """The same stack written tcp,ssl,xdr."""

    stack = "tcp,ssl,xdr"


class SecureAliasTests(TLSFixture):
    stack = "secure"

    @defer.inlineCallbacks
    def test_alias(self):
        self.assertEqual(ElvinURI(self.uri).protocol, ("ssl", "none", "xdr"))
        conn = yield self.connect(**self.client_args)
        got = []
        yield conn.subscribe("require(a)", got.append)
        conn.notify({"a": 1})
        yield wait_until(lambda: got)

    @defer.inlineCallbacks
    def test_connection_is_tls_1_2_or_better(self):
        conn = yield self.connect(**self.client_args)
        version = conn.protocol.transport.getHandle().get_protocol_version_name()
        self.assertIn(version, ("TLSv1.2", "TLSv1.3"))

    @defer.inlineCallbacks
    def test_trust_root_object_and_hostname_override(self):
        ca = ssl.Certificate.loadPEM(open(self.certs.ca_path, "rb").read())
        uri = self.uri.replace("127.0.0.1", "localhost")
        # The certificate does not name "localhost", but we say which name
        # to expect.
        conn = yield client.connect(uri, tls_ca=ca, tls_hostname="router.test")
        self.connections.append(conn)
        yield conn.test_connection()


class HostnameVerificationTests(RouterFixture):
    """The client checks the router's certificate names the URI's host."""

    def setUp(self):
        super().setUp()
        self.certs = Certificates(self.mktemp(), server_names=("router.test",))
        self.uri = self.listen_tls(tls.server_options(self.certs.server_cert,
                                                      self.certs.server_key))

    @defer.inlineCallbacks
    def test_wrong_hostname_refused(self):
        with self.assertRaises(client.ConnectionClosed) as cm:
            yield client.connect(self.uri, tls_ca=self.certs.ca_path)
        self.assertIn("mismatch", str(cm.exception).lower())
        self.assertEqual(self.router.stats["notifications"], 0)
        yield wait_until(lambda: not self.router.sessions)

    @defer.inlineCallbacks
    def test_right_hostname_accepted(self):
        conn = yield client.connect(self.uri, tls_ca=self.certs.ca_path,
                                    tls_hostname="router.test")
        self.connections.append(conn)
        yield conn.test_connection()

    @defer.inlineCallbacks
    def test_untrusted_router_refused(self):
        with self.assertRaises(client.ConnectionClosed):
            yield client.connect(self.uri, tls_ca=self.certs.other_ca_path,
                                 tls_hostname="router.test")

    @defer.inlineCallbacks
    def test_unotify_to_untrusted_router_fails(self):
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.unotify(self.uri, {"u": 1}, tls_ca=self.certs.other_ca_path,
                                 tls_hostname="router.test")
        self.assertIn("TLS with elvin:4.0/ssl,none,xdr/127.0.0.1:", str(cm.exception))
        self.assertIn("certificate verify failed", str(cm.exception))
        self.assertEqual(self.router.stats["unotify"], 0)

    @defer.inlineCallbacks
    def test_unotify_wrong_hostname_fails(self):
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.unotify(self.uri, {"u": 1}, tls_ca=self.certs.ca_path)
        self.assertIn("does not name '127.0.0.1'", str(cm.exception))
        self.assertEqual(self.router.stats["unotify"], 0)

    @defer.inlineCallbacks
    def test_unotify_plain_to_tls_listener_fails(self):
        plain = self.uri.replace("elvin:/ssl,none,xdr/", "elvin://")
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.unotify(plain, {"u": 1})
        self.assertIn(f"{plain} closed the connection right after the UNotify",
                      str(cm.exception))
        self.assertIn("use elvin:/secure/", str(cm.exception))

    @defer.inlineCallbacks
    def test_unotify_tls_to_plain_listener_fails(self):
        uri = self.listen_tcp().replace("elvin://", "elvin:/secure/")
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.unotify(uri, {"u": 1}, tls_ca=self.certs.ca_path,
                                 tls_hostname="router.test")
        self.assertIn("TLS with", str(cm.exception))
        self.assertIn("if it is a plain listener", str(cm.exception))

    def test_aio_unotify_to_untrusted_router_fails(self):
        """``elvin.aio`` (and ``elvin.sync``) say the same, against an asyncio
        TLS listener."""
        import asyncio
        import ssl as stdssl
        from elvin import aio

        async def scenario():
            context = stdssl.SSLContext(stdssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.certs.server_cert, self.certs.server_key)
            server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0,
                                                ssl=context)
            port = server.sockets[0].getsockname()[1]
            try:
                with self.assertRaises(client.ConnectFailed) as cm:
                    await aio.unotify(f"elvin:/secure/127.0.0.1:{port}", {"u": 1},
                                      tls_ca=self.certs.other_ca_path,
                                      tls_hostname="router.test")
                self.assertIn("TLS with elvin:4.0/ssl,none,xdr/127.0.0.1", str(cm.exception))
            finally:
                server.close()
        asyncio.run(asyncio.wait_for(scenario(), 20))

    @defer.inlineCallbacks
    def test_unotify_times_out_on_a_silent_server(self):
        uri = f"elvin:/secure/127.0.0.1:{self.listen_silent()}"
        started = reactor.seconds()
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.unotify(uri, {"u": 1}, tls_ca=self.certs.ca_path, timeout=0.5)
        self.assertLess(reactor.seconds() - started, 5)
        self.assertIn("did not finish the TLS handshake within 0.5 s", str(cm.exception))

    def test_aio_unotify_times_out_on_a_silent_server(self):
        import asyncio
        from elvin import aio

        async def scenario():
            server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            try:
                with self.assertRaises(client.ConnectFailed) as cm:
                    await aio.unotify(f"elvin:/secure/127.0.0.1:{port}", {"u": 1},
                                      tls_ca=self.certs.ca_path, timeout=0.5)
                self.assertIn("did not finish the TLS handshake within 0.5 s",
                              str(cm.exception))
            finally:
                server.close()
        asyncio.run(asyncio.wait_for(scenario(), 5))

    @defer.inlineCallbacks
    def test_unotify_over_tls(self):
        conn = yield client.connect(self.uri, tls_ca=self.certs.ca_path,
                                    tls_hostname="router.test")
        self.connections.append(conn)
        got = []
        yield conn.subscribe("require(u)", got.append)
        yield client.unotify(self.uri, {"u": 1}, tls_ca=self.certs.ca_path,
                             tls_hostname="router.test")
        yield wait_until(lambda: got)


class ClientCertificateTests(RouterFixture):
    """tls-ca asks clients for certificates; require-authenticated demands one."""

    def make(self, require):
        self.certs = Certificates(self.mktemp())
        options = tls.server_options(self.certs.server_cert, self.certs.server_key,
                                     ca=self.certs.ca_path,
                                     require_authenticated=require)
        self.uri = self.listen_tls(options)

    @defer.inlineCallbacks
    def test_trusted_client_accepted(self):
        self.make(True)
        conn = yield client.connect(self.uri, tls_ca=self.certs.ca_path,
                                    tls_certificate=self.certs.client_pem)
        self.connections.append(conn)
        yield conn.test_connection()

    @defer.inlineCallbacks
    def test_untrusted_client_refused(self):
        self.make(True)
        with self.assertRaises(client.ConnectionClosed):
            yield client.connect(self.uri, tls_ca=self.certs.ca_path,
                                 tls_certificate=self.certs.stranger_pem)
        yield wait_until(lambda: not self.router.sessions)
        self.assertEqual(self.router.stats["notifications"], 0)

    @defer.inlineCallbacks
    def test_client_without_certificate_refused(self):
        self.make(True)
        with self.assertRaises(client.ConnectionClosed):
            yield client.connect(self.uri, tls_ca=self.certs.ca_path)
        yield wait_until(lambda: not self.router.sessions)

    @defer.inlineCallbacks
    def test_optional_verification(self):
        """Without require-authenticated, no certificate is fine, a bad one is not."""
        self.make(False)
        conn = yield client.connect(self.uri, tls_ca=self.certs.ca_path)
        self.connections.append(conn)
        yield conn.test_connection()
        with self.assertRaises(client.ConnectionClosed):
            yield client.connect(self.uri, tls_ca=self.certs.ca_path,
                                 tls_certificate=self.certs.stranger_pem)


class TLSConfigTests(unittest.TestCase):
    """Router TLS settings from the configuration file, and their errors."""

    def setUp(self):
        self.certs = Certificates(self.mktemp())

    def parse(self, text):
        path = self.certs._write("elvind.conf", text.encode("utf-8"))
        return config.load(path)

    def test_settings(self):
        cfg = self.parse("tls-certificate = server.pem\ntls-key = server.key\n"
                         "tls-ca = ca.pem\nrequire-authenticated = yes\n")
        # Relative paths are relative to the configuration file.
        self.assertEqual(cfg.tls_certificate, self.certs.server_cert)
        self.assertEqual(cfg.tls_key, self.certs.server_key)
        self.assertEqual(cfg.tls_ca, self.certs.ca_path)
        self.assertTrue(cfg.require_authenticated)
        options = tls.server_options_from_config(cfg)
        import ssl as stdssl
        self.assertEqual(options.context.verify_mode, stdssl.CERT_REQUIRED)

    def test_defaults(self):
        cfg = config.RouterConfig()
        self.assertIsNone(cfg.tls_certificate)
        self.assertFalse(cfg.require_authenticated)
        self.assertIsNone(tls.server_options_from_config(cfg))

    def test_combined_certificate_and_key_file(self):
        options = tls.server_options(self.certs.client_pem)
        self.assertIsNotNone(options.context)

    def test_missing_key(self):
        with self.assertRaises(tls.TLSConfigError) as cm:
            tls.server_options(self.certs.server_cert)
        self.assertIn("tls-key", str(cm.exception))

    def test_missing_file(self):
        with self.assertRaises(tls.TLSConfigError) as cm:
            tls.server_options(self.certs.server_cert + ".nope", self.certs.server_key)
        self.assertIn("tls-certificate", str(cm.exception))
        self.assertIn(".nope", str(cm.exception))

    def test_encrypted_key_refused_without_a_prompt(self):
        """Both PEM forms of an encrypted key: one line naming the setting
        and the file, never OpenSSL's "Enter PEM pass phrase:"."""
        from cryptography.hazmat.primitives import serialization
        with open(self.certs.server_key, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), None)
        for form in (serialization.PrivateFormat.PKCS8,
                     serialization.PrivateFormat.TraditionalOpenSSL):
            path = self.certs._write("encrypted.key", key.private_bytes(
                serialization.Encoding.PEM, form,
                serialization.BestAvailableEncryption(b"secret")))
            with self.assertRaises(tls.TLSConfigError) as cm:
                tls.server_options(self.certs.server_cert, path)
            self.assertEqual(str(cm.exception).count("\n"), 0)
            self.assertIn(f"tls-key: the private key in {path} is encrypted", str(cm.exception))

    def test_expired_certificate_warned_at_start(self):
        """It loads (the clock may be what is wrong), with a warning."""
        import datetime
        from twisted.logger import formatEvent, globalLogPublisher
        from elvin.tap import check_listeners
        ca = __import__("trustme").CA()
        old = ca.issue_cert("router.test", not_after=datetime.datetime(2020, 1, 1))
        path = self.certs._write("old.pem", old.private_key_and_cert_chain_pem.bytes())
        self.assertIn(f"the certificate in {path} expired on 2020-01-01",
                      tls.certificate_date_problem(path))
        self.assertIsNone(tls.certificate_date_problem(self.certs.server_cert))
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        cfg = self.parse("listen = elvin:/secure/127.0.0.1:29170\n"
                         "tls-certificate = old.pem\n")
        check_listeners(cfg)
        self.assertTrue(any("expired on 2020-01-01" in formatEvent(e) for e in events))

    def test_mismatched_key(self):
        other = Certificates(self.mktemp())
        with self.assertRaises(tls.TLSConfigError) as cm:
            tls.server_options(self.certs.server_cert, other.server_key)
        self.assertIn("does not match", str(cm.exception))

    def test_not_a_certificate(self):
        with self.assertRaises(tls.TLSConfigError) as cm:
            tls.server_options(self.certs.server_key, self.certs.server_key)
        self.assertIn("no PEM certificate", str(cm.exception))

    def test_require_authenticated_needs_ca(self):
        cfg = self.parse("tls-certificate = server.pem\ntls-key = server.key\n"
                         "require-authenticated = yes\n")
        with self.assertRaises(tls.TLSConfigError) as cm:
            tls.server_options_from_config(cfg)
        self.assertIn("tls-ca", str(cm.exception))

    def test_key_without_certificate(self):
        cfg = self.parse("tls-key = server.key\n")
        with self.assertRaises(tls.TLSConfigError) as cm:
            tls.server_options_from_config(cfg)
        self.assertIn("tls-certificate", str(cm.exception))

    def test_bad_boolean(self):
        with self.assertRaises(config.ConfigError):
            self.parse("require-authenticated = maybe\n")

    def test_minimum_version(self):
        self.assertEqual(tls.MINIMUM_VERSION, ssl.TLSVersion.TLSv1_2)
        options = tls.server_options(self.certs.server_cert, self.certs.server_key)
        import ssl as stdssl
        self.assertEqual(options.context.minimum_version, stdssl.TLSVersion.TLSv1_2)


class SessionTicketTests(unittest.TestCase):
    """Listeners send no TLS 1.3 session tickets: with OpenSSL's default two,
    the MINA SSL filter in Avis's Java client and router stalls
    (docs/interop.md)."""

    def handshake(self, options, client_context):
        """A listener's TLS layer on an in-memory transport, and a client
        (``ssl`` module) that has read all the listener sent."""
        import ssl as stdssl
        from twisted.internet import protocol
        from twisted.internet.address import IPv4Address
        from twisted.internet.testing import StringTransport
        from twisted.protocols.tls import TLSMemoryBIOFactory
        factory = TLSMemoryBIOFactory(options, False,
                                      protocol.Factory.forProtocol(protocol.Protocol))
        server = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
        wire = StringTransport()
        server.makeConnection(wire)
        peer = memory_handshake(server, wire, client_context, "router.test")
        try:
            peer.read(1)          # takes in what followed the handshake
        except stdssl.SSLWantReadError:
            pass
        return peer

    def test_no_tls13_session_tickets(self):
        import ssl as stdssl
        certs = Certificates(self.mktemp())
        for ca in (None, certs.ca_path):
            options = tls.server_options(certs.server_cert, certs.server_key, ca=ca)
            client_context = stdssl.SSLContext(stdssl.PROTOCOL_TLS_CLIENT)
            client_context.load_verify_locations(certs.ca_path)
            peer = self.handshake(options, client_context)
            self.assertEqual(peer.version(), "TLSv1.3")
            self.assertFalse(peer.session.has_ticket)

    def test_no_tls12_session_tickets(self):
        import ssl as stdssl
        certs = Certificates(self.mktemp())
        options = tls.server_options(certs.server_cert, certs.server_key)
        client_context = stdssl.SSLContext(stdssl.PROTOCOL_TLS_CLIENT)
        client_context.maximum_version = stdssl.TLSVersion.TLSv1_2
        client_context.load_verify_locations(certs.ca_path)
        peer = self.handshake(options, client_context)
        self.assertEqual(peer.version(), "TLSv1.2")
        self.assertFalse(peer.session.has_ticket)


class FirstPacketTests(unittest.TestCase):
    """The client's first packet over TLS (ConnRqst, UNotify) goes in a
    write of its own after the handshake, not with the client's Finished:
    Avis's router does not read a packet that comes in the same read as
    the Finished (docs/interop.md)."""

    def setUp(self):
        from twisted.internet import protocol
        from twisted.internet.interfaces import IHandshakeListener
        from twisted.internet.testing import MemoryReactorClock, StringTransport
        from twisted.protocols.tls import TLSMemoryBIOFactory
        from zope.interface import implementer
        certs = Certificates(self.mktemp())
        self.reactor = MemoryReactorClock()
        #: (what, number of the chunk of client bytes it came in)
        self.events = []
        self.chunks = 0
        events = self.events
        test = self

        @implementer(IHandshakeListener)
        class Recorder(protocol.Protocol):
            def handshakeCompleted(self):
                events.append(("handshake", test.chunks))

            def dataReceived(self, data):
                events.append((data, test.chunks))

        server_factory = TLSMemoryBIOFactory(
            tls.server_options(certs.server_cert, certs.server_key), False,
            protocol.Factory.forProtocol(Recorder), clock=self.reactor)
        self.server = server_factory.buildProtocol(None)
        self.server_wire = StringTransport()
        self.server.makeConnection(self.server_wire)

        class Endpoint:
            def connect(endpoint, factory):
                tls_factory = TLSMemoryBIOFactory(
                    tls.client_options("router.test", certs.ca_path), True, factory,
                    clock=test.reactor)
                test.client = tls_factory.buildProtocol(None)
                test.client_wire = StringTransport()
                test.client.makeConnection(test.client_wire)
                return defer.succeed(test.client.wrappedProtocol)
        self.patch(client, "_endpoint", lambda reactor, uri, tls=None: Endpoint())

    def pump(self, turns=20, step=0.005):
        for _ in range(turns):
            self.reactor.advance(step)
            out = self.client_wire.value()
            self.client_wire.clear()
            if out:
                self.chunks += 1
                self.server.dataReceived(out)
            back = self.server_wire.value()
            self.server_wire.clear()
            if back:
                self.client.dataReceived(back)
            if self.client_wire.disconnecting and self.client.connected:
                from twisted.internet.error import ConnectionDone
                from twisted.python.failure import Failure
                self.client.connectionLost(Failure(ConnectionDone()))

    def first_packet(self):
        handshake = [chunk for what, chunk in self.events if what == "handshake"]
        data = [(what, chunk) for what, chunk in self.events if what != "handshake"]
        self.assertEqual(len(handshake), 1)
        self.assertTrue(data, "no packet reached the router")
        first, chunk = data[0]
        self.assertGreater(chunk, handshake[0], "the first packet came with the Finished")
        return first

    def test_connrqst_after_the_handshake(self):
        d = client.connect("elvin:/secure/router.test:2917", reactor=self.reactor,
                           timeout=10)
        self.pump()
        first = self.first_packet()
        self.assertEqual(first[4:8], b"\x00\x00\x00\x31")        # ConnRqst
        d.cancel()
        self.failureResultOf(d)

    def test_unotify_after_the_handshake(self):
        d = client.unotify("elvin:/secure/router.test:2917", {"a": 1}, reactor=self.reactor)
        self.pump()
        first = self.first_packet()
        self.assertEqual(first[4:8], b"\x00\x00\x00\x20")        # UNotify
        self.pump(40)
        self.successResultOf(d)

    def test_aio_first_write_waits(self):
        """The asyncio flavour (and so the blocking one): asyncio calls
        ``connection_made`` once the handshake has ended; the first write
        comes TLS_FIRST_PACKET_DELAY later."""
        import asyncio
        from elvin import aio
        from elvin.clientcore.lifecycle import TLS_FIRST_PACKET_DELAY
        from elvin.protocols import packets
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        for secure in (True, False):
            conn = aio.Connection(ElvinURI("elvin:/secure/router.test:2917"), loop)
            writes = []

            class Transport(asyncio.Transport):
                def get_extra_info(self, name, default=None):
                    return object() if name == "ssl_object" and secure else default

                def write(self, data):
                    writes.append(data)

                def is_closing(self):
                    return False

            proto = aio._Protocol(conn, conn._generation)
            proto.connection_made(Transport())
            proto.send(packets.TestConn())
            loop.run_until_complete(asyncio.sleep(0))
            self.assertEqual(len(writes), 0 if secure else 1)
            loop.run_until_complete(asyncio.sleep(TLS_FIRST_PACKET_DELAY))
            self.assertEqual(len(writes), 1)
            proto.send(packets.TestConn())          # only the first waits
            loop.run_until_complete(asyncio.sleep(0))
            self.assertEqual(len(writes), 2)


class TapTLSTests(unittest.TestCase):
    """``twistd elvin`` with TLS listeners."""

    def setUp(self):
        self.certs = Certificates(self.mktemp())

    def make(self, *args):
        from twisted.internet.testing import MemoryReactorClock
        from elvin import tap
        options = tap.Options()
        options.parseOptions(list(args))
        self.reactor = MemoryReactorClock()
        return tap.makeService(options, reactor=self.reactor)

    def test_tls_listener_without_certificate(self):
        from twisted.python import usage
        with self.assertRaises(usage.UsageError) as cm:
            self.make("-l", "elvin:/secure/localhost:29170")
        self.assertTrue(str(cm.exception).startswith(
            "-l elvin:4.0/ssl,none,xdr/localhost:29170 needs TLS, but tls-certificate is "
            "not set"), str(cm.exception))

    def test_tls_listeners(self):
        path = self.certs._write("elvind.conf", b"tls-certificate = server.pem\n"
                                                b"tls-key = server.key\n")
        top = self.make("-c", path, "-l", "elvin:/secure/localhost:29170",
                        "-l", "elvin:/tcp,ssl,xdr/localhost:29171",
                        "-l", "elvin://localhost:2917")
        top.startService()
        self.addCleanup(top.stopService)
        servers = self.reactor.tcpServers
        self.assertEqual([s[0] for s in servers], [29170, 29171, 2917])
        # The TLS listeners wrap the Elvin factory in TLS; the TCP one does not.
        self.assertTrue(all(hasattr(s[1], "wrappedFactory") for s in servers[:2]))
        self.assertFalse(hasattr(servers[2][1], "wrappedFactory"))

    def test_bad_certificate_is_usage_error(self):
        from twisted.python import usage
        path = self.certs._write("elvind.conf", b"tls-certificate = missing.pem\n")
        from elvin import tap
        with self.assertRaises(usage.UsageError) as cm:
            tap.Options().parseOptions(["-c", path, "-l", "elvin:/secure/localhost:1"])
        self.assertIn("missing.pem", str(cm.exception))


class StackMismatchTests(TLSFixture):
    """A plain client on a TLS listener, and a TLS client on a plain one,
    are told which URI to use, instead of a bare protocol error."""

    @defer.inlineCallbacks
    def test_plain_client_on_tls_listener(self):
        port = ElvinURI(self.uri).port
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.connect(f"elvin://127.0.0.1:{port}", timeout=5)
        # OpenSSL answers non-TLS bytes with an alert or just closes: either
        # way the message names the TLS URI to use.
        text = str(cm.exception)
        self.assertTrue(text.startswith(f"elvin://127.0.0.1:{port} "), text)
        self.assertIn(f"use elvin:/secure/127.0.0.1:{port}", text)

    @defer.inlineCallbacks
    def test_tls_client_on_plain_listener(self):
        plain = self.listen_tcp()
        port = ElvinURI(plain).port
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.connect(f"elvin:/secure/127.0.0.1:{port}", timeout=5,
                                 tls_ca=self.certs.ca_path)
        text = str(cm.exception)
        self.assertIn("TLS with elvin:4.0/ssl,none,xdr/127.0.0.1", text)
        self.assertIn(f"if it is a plain listener, use elvin://127.0.0.1:{port}", text)
        yield wait_until(lambda: not self.router.sessions)
