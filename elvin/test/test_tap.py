"""Tests for elvin.tap: ``twistd elvin`` options, service tree and plugin."""

import errno
import os
import signal
import socket
import struct
import sys

from twisted.application import service
from twisted.application.service import IServiceMaker
from twisted.internet import defer, error, protocol, reactor, task
from twisted.internet.utils import getProcessOutputAndValue
from twisted.internet.testing import MemoryReactor, MemoryReactorClock, StringTransport
from twisted.plugin import getPlugins
from twisted.python import usage
from twisted.trial import unittest

from elvin import tap
from elvin.endpoints import SUPPORTED_STACKS
from elvin.protocols import packets as elvin_packets
from elvin.protocols.framing import frame
from elvin.protocols.gate import GateFactory
from elvin.protocols.server import ElvinServerFactory
from elvin.core.router import DISCONN_SHUTDOWN, Router
from elvin.uri import ElvinURI
from elvin.test.places import REPO
from elvin.test.places import free_port


#: A well-formed protocol stack no build speaks (UDP, TLS and HTTP may).
UNSUPPORTED_STACK = ("sctp", "none", "xdr")
assert UNSUPPORTED_STACK not in SUPPORTED_STACKS


def parse(*args):
    options = tap.Options()
    options.parseOptions(list(args))
    return options


def frames(data):
    """Decode every whole framed packet in ``data``."""
    packets = []
    while len(data) >= 4:
        (length,) = struct.unpack(">I", data[:4])
        packets.append(elvin_packets.decode(data[4:4 + length]))
        data = data[4 + length:]
    return packets


class OptionsTests(unittest.TestCase):

    def write_config(self, text):
        path = self.mktemp()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def test_default_listen(self):
        options = parse()
        self.assertEqual(tap.DEFAULT_LISTEN, "elvin://localhost:2917")
        self.assertEqual(options.router_config.listen,
                         [ElvinURI("elvin://localhost:2917")])
        self.assertFalse(options.router_config.verbose)

    def test_listen_repeated(self):
        options = parse("-l", "elvin://localhost:3000",
                        "--listen", "elvin:4.0/tcp,none,xdr/[::1]:3001",
                        "--listen=elvin://127.0.0.1:3002",
                        "-lelvin://0.0.0.0:3003")
        self.assertEqual([(u.host, u.port) for u in options.router_config.listen],
                         [("localhost", 3000), ("::1", 3001), ("127.0.0.1", 3002),
                          ("0.0.0.0", 3003)])

    def test_verbose(self):
        self.assertTrue(parse("--verbose").router_config.verbose)
        self.assertTrue(parse("-v").router_config.verbose)

    def test_bad_uri(self):
        with self.assertRaises(usage.UsageError) as cm:
            parse("-l", "http://localhost:2917")
        self.assertIn("http://localhost:2917", str(cm.exception))

    def test_bad_port(self):
        self.assertRaises(usage.UsageError, parse, "--listen", "elvin://localhost:70000")

    def test_unsupported_stack(self):
        stack = UNSUPPORTED_STACK
        uri = f"elvin:/{','.join(stack)}/localhost:2917"
        with self.assertRaises(usage.UsageError) as cm:
            parse("-l", uri)
        message = str(cm.exception)
        self.assertIn(",".join(stack), message)
        self.assertIn("not supported", message)

    def test_bad_option_under_twistd_is_one_line(self):
        """Under twistd (a parent), a bad -l value or a misspelt option is
        a line naming it, not twistd's page of usage."""
        for args, expected in (
                (["-l", "elvin://localhost:99999"], "twistd elvin: -l/--listen: invalid "
                 "Elvin URI 'elvin://localhost:99999'"),
                (["-l", "foo"], "twistd elvin: -l/--listen: invalid Elvin URI 'foo'"),
                (["--listn", "elvin://localhost:2917"],
                 "twistd elvin: unknown option --listn (did you mean --listen?)")):
            options = tap.Options()
            options.parent = {}
            with self.assertRaises(SystemExit) as raised:
                options.parseOptions(args)
            self.assertTrue(str(raised.exception.code).startswith(expected),
                            raised.exception.code)

    def test_supported_stacks_accepted(self):
        """Every supported stack is accepted; a TLS one then asks only for
        the router's certificate."""
        from elvin.endpoints import TLS, stack_kind
        for stack in SUPPORTED_STACKS:
            uri = f"elvin:/{','.join(stack)}/localhost:2917"
            if stack_kind(ElvinURI(uri)) == TLS:
                with self.assertRaises(usage.UsageError) as raised:
                    parse("-l", uri)
                self.assertIn("needs TLS, but tls-certificate is not set",
                              str(raised.exception))
                continue
            self.assertEqual(parse("-l", uri).router_config.listen[0].protocol, stack)

    def test_config_file(self):
        path = self.write_config("listen = elvin://localhost:4000\n"
                                 "listen = elvin://127.0.0.1:4001\n"
                                 "verbose = yes\nmax-connections = 5\n"
                                 "Send-Queue.Max-Length = 4096\n")
        config = parse("-c", path).router_config
        self.assertEqual([u.port for u in config.listen], [4000, 4001])
        self.assertTrue(config.verbose)
        self.assertEqual(config.max_connections, 5)
        self.assertEqual(config.option_specs["Send-Queue.Max-Length"].default, 4096)
        self.assertEqual(config.source, path)
        self.assertEqual(parse("--config", path).router_config.max_connections, 5)

    def test_command_line_listen_replaces_config(self):
        path = self.write_config("listen = elvin://localhost:4000\n")
        config = parse("-c", path, "-l", "elvin://localhost:5000").router_config
        self.assertEqual([u.port for u in config.listen], [5000])

    def test_config_without_listen_uses_default(self):
        path = self.write_config("verbose = no\n")
        config = parse("-c", path).router_config
        self.assertEqual(config.listen, [ElvinURI(tap.DEFAULT_LISTEN)])

    def test_impossible_reserved_files_is_refused_naming_its_line(self):
        """reserved-files that leaves no room under the open-file limit the
        router can reach is refused at start (and so at reload) with file
        and line; it started with every connection cap lowered to 1."""
        path = self.write_config("verbose = no\nreserved-files = 2000000000\n")
        with self.assertRaises(usage.UsageError) as cm:
            parse("-c", path)
        self.assertTrue(str(cm.exception).startswith(f"{path}:2: reserved-files 2000000000 "
                                                     "leaves no room"), str(cm.exception))
        config = parse("-c", self.write_config("reserved-files = 4090\n")).router_config
        hard = lambda which: (1024, 4096)     # noqa: E731
        from elvin.config import ConfigError
        with self.assertRaises(ConfigError) as cm:
            tap.check_reserved_files(config, getrlimit=hard)
        self.assertIn("(4096, its hard limit): at most ", str(cm.exception))
        config.reserved_files = 4000
        tap.check_reserved_files(config, getrlimit=hard)

    def test_verbose_flag_overrides_config(self):
        path = self.write_config("verbose = no\n")
        self.assertTrue(parse("-c", path, "--verbose").router_config.verbose)

    def test_config_error(self):
        path = self.write_config("listen = elvin://localhost:4000\n\nbogus = 1\n")
        with self.assertRaises(usage.UsageError) as cm:
            parse("-c", path)
        self.assertTrue(str(cm.exception).startswith(f"{path}:3: "), str(cm.exception))
        self.assertIn("bogus", str(cm.exception))

    def test_config_bad_value(self):
        path = self.write_config("Send-Queue.Drop-Policy = sometimes\n")
        with self.assertRaises(usage.UsageError) as cm:
            parse("-c", path)
        self.assertTrue(str(cm.exception).startswith(f"{path}:1: "))

    def test_config_missing(self):
        path = self.mktemp()
        with self.assertRaises(usage.UsageError) as cm:
            parse("-c", path)
        self.assertIn(path, str(cm.exception))

    def test_config_unsupported_stack(self):
        uri = f"elvin:/{','.join(UNSUPPORTED_STACK)}/localhost:2917"
        path = self.write_config(f"listen = {uri}\n")
        with self.assertRaises(usage.UsageError) as cm:
            parse("-c", path)
        self.assertIn("not supported", str(cm.exception))

    def test_example_config(self):
        config = parse("-c", os.path.join(REPO, "conf", "elvind.conf")).router_config
        self.assertEqual(config.listen, [ElvinURI("elvin://localhost:2917")])

    def test_unknown_option(self):
        self.assertRaises(usage.UsageError, parse, "--no-such-option")

    def test_usage_text(self):
        text = str(tap.Options())
        for word in ("--listen", "--config", "--verbose"):
            self.assertIn(word, text)


class MakeServiceTests(unittest.TestCase):

    def make(self, *args):
        # MemoryReactorClock is a MemoryReactor that also has callLater,
        # which the server protocol needs for its connect timeout.
        self.reactor = MemoryReactorClock()
        return tap.makeService(parse(*args), reactor=self.reactor)

    def test_service_tree(self):
        top = self.make("-l", "elvin://localhost:3000", "-l", "elvin://localhost:3001")
        self.assertIsInstance(top, service.MultiService)
        self.assertIsInstance(top.router, Router)
        self.assertEqual(len(list(top)), 2)
        self.assertEqual(self.reactor.tcpServers, [])  # nothing until started

    def test_one_listener_per_uri(self):
        top = self.make("-l", "elvin://localhost:3000",
                        "-l", "elvin:4.0/tcp,none,xdr/[::1]:3001",
                        "-l", "elvin://0.0.0.0:3002",
                        "-l", "elvin://192.0.2.7:3003")
        top.startService()
        self.addCleanup(top.stopService)
        servers = self.reactor.tcpServers
        self.assertEqual([(port, interface) for port, _, _, interface in servers],
                         [(3000, "127.0.0.1"), (3001, "::1"), (3002, ""),
                          (3003, "192.0.2.7")])
        # Each listener's gate (the connection budget) wraps one shared factory.
        self.assertTrue(all(isinstance(factory, GateFactory) for _, factory, _, _ in servers))
        factories = {factory.factory for _, factory, _, _ in servers}
        self.assertEqual(len(factories), 1)
        (factory,) = factories
        self.assertIsInstance(factory, ElvinServerFactory)
        self.assertIs(factory.router, top.router)
        self.assertIs(factory.clock, self.reactor)

    def test_protocol_error_rate_reaches_the_router(self):
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("max-protocol-errors = 3\nprotocol-error-window = 1.5\n")
        router = self.make("-c", path).router
        self.assertEqual((router.max_protocol_errors, router.protocol_error_window), (3, 1.5))

    def test_default_listener(self):
        top = self.make()
        top.startService()
        self.addCleanup(top.stopService)
        self.assertEqual([(s[0], s[3]) for s in self.reactor.tcpServers],
                         [(2917, "127.0.0.1")])

    def test_config_reaches_router(self):
        path = self.mktemp()
        with open(path, "w", encoding="utf-8") as f:
            f.write("verbose = yes\nmax-connections = 7\nmax-subscriptions = 9\n"
                    "connect-timeout = 4\nSend-Queue.Drop-Policy = newest\n")
        top = self.make("-c", path, "-l", "elvin://localhost:3000")
        router = top.router
        self.assertTrue(router.verbose)
        self.assertEqual(router.max_connections, 7)
        self.assertEqual(router.max_subscriptions, 9)
        self.assertEqual(router.option_specs["Send-Queue.Drop-Policy"].default, "newest")
        self.assertEqual(router.new_options()["Send-Queue.Drop-Policy"], "newest")
        top.startService()
        self.addCleanup(top.stopService)
        factory = self.reactor.tcpServers[0][1]
        self.assertEqual(factory.connect_timeout, 4.0)

    def test_make_service_parses_if_needed(self):
        """makeService works on Options whose postOptions has not run."""
        options = tap.Options()
        top = tap.makeService(options, reactor=MemoryReactor())
        self.assertEqual(top.config.listen, [ElvinURI(tap.DEFAULT_LISTEN)])

    def test_stop_shuts_router_down(self):
        top = self.make("-l", "elvin://localhost:3000")
        top.startService()
        factory = self.reactor.tcpServers[0][1]

        # A connected client, driven through the real server protocol.
        proto = factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0))))
        self.assertIsInstance(frames(transport.value())[0], elvin_packets.ConnRply)
        transport.clear()

        self.assertFalse(top.router.closing)
        d = top.stopService()
        self.assertTrue(top.router.closing)
        packets = frames(transport.value())
        self.assertEqual(len(packets), 1)
        self.assertIsInstance(packets[0], elvin_packets.Disconn)
        self.assertEqual(packets[0].reason, DISCONN_SHUTDOWN)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(top.router.sessions, set())
        self.assertNoResult(d)                  # until the client's channel closes
        proto.connectionLost(None)
        self.successResultOf(d)
        self.assertFalse(top.running)

    def stopping_with_a_client_behind(self, grace):
        """A started router with a connected subscriber whose transport
        paused with deliveries queued; then stopService."""
        from twisted.logger import globalLogPublisher
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        top = self.make("-l", "elvin://localhost:3000")
        top.config.shutdown_grace = grace
        top.startService()
        factory = self.reactor.tcpServers[0][1]
        clients = []
        for _ in range(2):
            proto = factory.buildProtocol(None)
            transport = StringTransport()
            proto.makeConnection(transport)
            proto.dataReceived(frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0)))
                               + frame(elvin_packets.encode(elvin_packets.SubAddRqst(
                                   2, "require(n)", True, elvin_packets.Keys.EMPTY))))
            transport.clear()
            clients.append((proto, transport))
        (proto, transport), (publisher, _) = clients
        proto.pauseProducing()
        for n in range(5):
            publisher.dataReceived(frame(elvin_packets.encode(elvin_packets.NotifyEmit(
                {"n": n}, True, elvin_packets.Keys.EMPTY))))
        self.assertEqual(len(proto.queue), 5)
        d = top.stopService()
        publisher.connectionLost(None)
        return top, proto, transport, d, events

    def test_stop_flushes_a_client_behind_then_disconn_1(self):
        """The queue of a client that is behind is written before Disconn 1
        (which is last, 7.4.7), and the router waits for it."""
        top, proto, transport, d, events = self.stopping_with_a_client_behind(10)
        self.assertEqual(transport.value(), b"")
        self.assertNoResult(d)
        self.reactor.advance(9)
        proto.resumeProducing()                       # the client reads again
        *delivered, last = frames(transport.value())
        self.assertEqual([p.attributes["n"] for p in delivered], list(range(5)))
        self.assertEqual(last.reason, DISCONN_SHUTDOWN)
        self.assertTrue(transport.disconnecting)
        self.assertFalse(transport.disconnected)
        proto.connectionLost(None)
        self.successResultOf(d)
        self.assertEqual(top.router.stats["dropped_deliveries"], 0)
        (line,) = [e for e in events if "router stopping" in e.get("log_format", "")]
        self.assertEqual((line["clients"], line["cut"], line["lost"]), (2, 0, 0))

    def test_stop_closes_a_client_that_does_not_read_after_the_grace(self):
        """After shutdown-grace a client still open is closed at once and
        what it did not get is counted, in the metric and the exit line."""
        top, proto, transport, d, events = self.stopping_with_a_client_behind(3)
        self.reactor.advance(2.9)
        self.assertFalse(transport.disconnected)
        self.reactor.advance(0.1)
        self.assertTrue(transport.disconnected)
        proto.connectionLost(None)
        self.successResultOf(d)
        self.assertFalse(top.running)
        self.assertEqual(top.router.stats["dropped_deliveries"], 5)
        (line,) = [e for e in events if "router stopping" in e.get("log_format", "")]
        self.assertEqual((line["clients"], line["cut"], line["lost"], line["dropped"]),
                         (2, 1, 5, 5))

    def test_new_connection_refused_while_closing(self):
        top = self.make("-l", "elvin://localhost:3000")
        top.startService()
        factory = self.reactor.tcpServers[0][1]
        d = top.stopService()
        proto = factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(frame(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0))))
        (nack,) = frames(transport.value())
        self.assertIsInstance(nack, elvin_packets.Nack)
        self.assertEqual(nack.error, 2006)
        return d


class _BusyReactor(MemoryReactorClock):
    """A MemoryReactor on which some TCP ports are taken; ``open`` holds
    the ports listened on and not closed since."""

    def __init__(self, busy):
        super().__init__()
        self.busy = set(busy)
        self.open = set()

    def listenTCP(self, port, factory, backlog=50, interface=""):
        if port in self.busy:
            raise error.CannotListenError(
                interface, port, OSError(errno.EADDRINUSE, "Address already in use"))
        super().listenTCP(port, factory, backlog, interface)
        self.open.add(port)
        return _Port(self, port)


class _Port:
    """A listening port of _BusyReactor."""

    def __init__(self, reactor, port):
        self.reactor, self.port = reactor, port

    def startListening(self):
        pass

    def stopListening(self):
        self.reactor.open.discard(self.port)

    def getHost(self):
        from twisted.internet.address import IPv4Address
        return IPv4Address("TCP", "127.0.0.1", self.port)


class StartUpProblemTests(unittest.TestCase):
    """A listener that cannot bind, or TLS without a certificate, is named
    by its setting and where it was given (in process)."""

    def config_file(self, text):
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write(text)
        return path

    def cannot_start(self, text, busy):
        path = self.config_file(text)
        top = tap.makeService(parse("-c", path), reactor=_BusyReactor(busy))
        with self.assertRaises(SystemExit) as raised:
            top.privilegedStartService()
        return path, str(raised.exception.code)

    def test_status_listener_in_use_names_its_setting(self):
        path, message = self.cannot_start(
            "listen = elvin://127.0.0.1:3000\nstatus-listen = http://127.0.0.1:3001\n",
            {3001})
        self.assertEqual(message, f"twistd elvin: {path}:2: status-listen "
                         "http://127.0.0.1:3001: address already in use; is another "
                         "router running? change status-listen to another port")

    def test_federation_listener_in_use_names_its_setting(self):
        path, message = self.cannot_start(
            "listen = elvin://127.0.0.1:3000\nFederation.Listen = ewaf://localhost:3002\n",
            {3002})
        self.assertIn(f"{path}:2: Federation.Listen ", message)
        self.assertIn("change Federation.Listen to another port", message)
        self.assertNotIn("-l", message)

    def test_listen_from_the_file_is_named_with_its_line(self):
        path, message = self.cannot_start("listen = elvin://127.0.0.1:3000\n", {3000})
        self.assertIn(f"{path}:1: listen elvin://127.0.0.1:3000: address already in use",
                      message)

    def test_bound_once_under_twistd(self):
        """Under twistd makeService binds (before daemonising); twistd's
        own privilegedStartService then binds nothing again."""
        options = parse("-l", "elvin://127.0.0.1:3000")
        options.parent = {"logfile": None}
        reactor_ = MemoryReactorClock()
        top = tap.makeService(options, reactor=reactor_)
        self.assertEqual([s[0] for s in reactor_.tcpServers], [3000])
        top.privilegedStartService()
        self.assertEqual([s[0] for s in reactor_.tcpServers], [3000])

    def test_tls_without_certificate_names_setting_and_line(self):
        for text, name in (
                ("Federation.Listen = ewaf:/secure/localhost:3003\n", "Federation.Listen"),
                ("status-listen = https://127.0.0.1:3004\n", "status-listen")):
            path = self.config_file("listen = elvin://127.0.0.1:3000\n" + text)
            with self.assertRaises(usage.UsageError) as raised:
                parse("-c", path)
            self.assertTrue(str(raised.exception).startswith(f"{path}:2: {name} "),
                            str(raised.exception))
            self.assertIn("tls-certificate is not set", str(raised.exception))


    def refused(self, text):
        """The one line ``parse -c`` refuses ``text`` with, and its path."""
        path = self.config_file(text)
        with self.assertRaises(usage.UsageError) as raised:
            parse("-c", path)
        return path, str(raised.exception)

    def test_tls_client_listener_without_certificate_names_its_line(self):
        path, message = self.refused("listen = elvin://127.0.0.1:3000\n# tls\n"
                                     "listen = elvin:/secure/127.0.0.1:3001\n")
        self.assertEqual(message, f"{path}:3: listen elvin:4.0/ssl,none,xdr/127.0.0.1:3001 "
                         "needs TLS, but tls-certificate is not set (the router's "
                         "certificate; and tls-key unless the key is in the same file)")

    def test_unreadable_tls_file_names_its_line(self):
        path, message = self.refused("listen = elvin:/secure/127.0.0.1:3001\n"
                                     "tls-certificate = /nonexistent/router.pem\n")
        self.assertEqual(message, f"{path}:2: tls-certificate: cannot read "
                         "/nonexistent/router.pem: No such file or directory")

    def test_trace_directory_that_cannot_be_made_names_its_line(self):
        blocker = self.config_file("a file, not a folder\n")
        path, message = self.refused("Federation.Listen = ewaf://127.0.0.1:3002\n"
                                     f"Federation.Trace-Directory = {blocker}/traces\n")
        self.assertEqual(message, f"{path}:2: Federation.Trace-Directory {blocker}/traces: "
                         "cannot make it: Not a directory")


class ListenerURITests(unittest.TestCase):
    """A listener named twice, or two on one address, is refused naming
    both and where each was given, rather than failing to bind; and a
    listener's URI names the protocol version the router speaks (in
    process)."""

    def write(self, text):
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write(text)
        return path

    def refused(self, *args, text=None):
        """(path, the line ``parse`` refuses ``args``, and ``text`` as
        the configuration file, with)."""
        path = None
        if text is not None:
            path = self.write(text)
            args += ("-c", path)
        with self.assertRaises(usage.UsageError) as raised:
            parse(*args)
        return path, str(raised.exception)

    def test_the_same_listener_twice(self):
        _, message = self.refused("-l", "elvin://127.0.0.1:3000", "-l",
                                  "elvin:4.0/tcp,none,xdr/127.0.0.1:3000")
        path, in_file = self.refused(text="listen = elvin://127.0.0.1:3000\n"
                                          "verbose = no\nlisten = elvin://127.0.0.1:3000\n")
        self.assertEqual([message, in_file], [
            "-l elvin://127.0.0.1:3000 is given twice: remove one (one listener per address)",
            f"{path}:3: listen elvin://127.0.0.1:3000 is given twice (first at {path}:1): "
            "remove one (one listener per address)"])

    def test_two_listeners_on_one_address(self):
        path, message = self.refused(text="listen = elvin://127.0.0.1:3000\n"
                                          "listen = elvin:/http,none,xdr/localhost:3000\n")
        self.assertEqual(message, f"{path}:2: listen elvin:4.0/http,none,xdr/localhost:3000 "
                                  f"and listen elvin://127.0.0.1:3000 ({path}:1) both listen "
                                  "on 127.0.0.1:3000 (TCP): give one of them another port "
                                  "(one listener per address)")
        path, message = self.refused(text="listen = elvin://127.0.0.1:3000\n"
                                          "Federation.Listen = ewaf://127.0.0.1:3000\n")
        self.assertTrue(message.startswith(
            f"{path}:2: Federation.Listen ewaf:1.0/tcp,none,xdr/127.0.0.1:3000 and listen "
            f"elvin://127.0.0.1:3000 ({path}:1) both listen on 127.0.0.1:3000 (TCP)"), message)

    def test_other_addresses_and_udp_beside_tcp_are_accepted(self):
        config = parse("-l", "elvin://127.0.0.1:3000", "-l", "elvin://127.0.0.2:3000",
                       "-l", "elvin:/udp,none,xdr/127.0.0.1:3000",
                       "-l", "elvin://127.0.0.1:3001").router_config
        self.assertEqual(len(config.listen), 4)

    def test_a_listener_of_another_protocol_version(self):
        for uri, words in (("elvin:5.0//127.0.0.1:3000", "protocol version 5.0 is not "
                            "supported (this implementation speaks the Elvin client "
                            "protocol 4.0"),
                           ("elvin:4.1//127.0.0.1:3000", "a listener's URI names the "
                            "protocol version spoken there, and is advertised so: 4.0, "
                            "not 4.1")):
            _, message = self.refused("-l", uri)
            self.assertIn(words, message)
            path, message = self.refused(text=f"listen = {uri}\n")
            self.assertTrue(message.startswith(f"{path}:1: "), message)
            self.assertIn(words, message)
        # A client's URI (redirect-to) may name a later minor version.
        self.assertEqual(parse("-c", self.write("redirect-to = elvin:4.1//h\n"))
                         .router_config.redirect_to.version, (4, 1))
        for text, words in (("Federation.Listen = ewaf:2.0//127.0.0.1:3002\n",
                             "Federation.Listen: ewaf:2.0/tcp,none,xdr/127.0.0.1:3002: "
                             "protocol version 2.0 is not supported"),
                            ("Federation.Listen = ewaf:1.1//127.0.0.1:3002\n",
                             "Federation.Listen: ewaf:1.1/tcp,none,xdr/127.0.0.1:3002: a "
                             "listener's URI names"),
                            ("Federation.Connect[A] = ewaf:2.0//127.0.0.1:3002\n",
                             "Federation.Connect[A]: ewaf:2.0/tcp,none,xdr/127.0.0.1:3002: "
                             "protocol version 2.0 is not supported")):
            path, message = self.refused(text=text)
            self.assertTrue(message.startswith(f"{path}:1: {words}"), message)


class ReloadMessageTests(unittest.TestCase):
    """What a reload says about settings it does not apply (in process)."""

    def log_events(self):
        """Every log event from now on, as a list."""
        from elvin.test.logjson import log_events
        return log_events(self)

    def started(self, text):
        """A router made from a file holding ``text``: (file's path, router)."""
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write(text)
        return path, tap.makeService(parse("-c", path), reactor=MemoryReactorClock())

    def test_status_listen_changed_needs_a_restart(self):
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write("listen = elvin://127.0.0.1:3000\nstatus-listen = http://127.0.0.1:3001\n")
        top = tap.makeService(parse("-c", path), reactor=MemoryReactorClock())
        with open(path, "w") as f:
            f.write("listen = elvin://127.0.0.1:3000\nstatus-listen = http://127.0.0.1:3002\n")
        applied, message = self.successResultOf(top.reload())
        self.assertTrue(applied)
        self.assertEqual(message, "reloaded: nothing changed; changed but applied only at "
                                  "restart: status-listen")

    def test_tls_client_settings_without_a_tls_listener_are_warned_of(self):
        """tls-ca / require-authenticated with no TLS listener would start
        a router that authenticates nobody: one warning line names them,
        where they were set and why, at start and at each reload."""
        from twisted.logger import formatEvent
        events = self.log_events()
        import trustme
        ca = os.path.abspath(self.mktemp())
        with open(ca, "wb") as f:
            f.write(trustme.CA().cert_pem.bytes())
        text = f"listen = elvin://127.0.0.1:3000\ntls-ca = {ca}\nrequire-authenticated = yes\n"
        path, top = self.started(text)

        def warnings():
            lines = [formatEvent(e) for e in events if "no effect" in e.get("log_format", "")]
            del events[:]
            return lines
        expected = (f"tls-ca ({path}:2) and require-authenticated ({path}:3) have no "
                    "effect: no listener uses TLS (listen, Federation.Listen, status-listen "
                    "https), so no client is asked for a certificate")
        self.assertEqual(warnings(), [expected])
        self.assertTrue(self.successResultOf(top.reload())[0])
        self.assertEqual(warnings(), [expected])
        with open(path, "w") as f:
            f.write(f"listen = elvin://127.0.0.1:3000\ntls-ca = {ca}\n"
                    "Federation.Activated = yes\nFederation.Router-Name = r.test\n"
                    "Federation.Subscribe[c] = TRUE\nFederation.Provide[c] = TRUE\n"
                    "Federation.Connect[c] = ewaf:/secure/127.0.0.1:3005\n")
        result = self.successResultOf(top.reload())
        self.assertTrue(result[0], result)
        self.assertEqual(warnings(), [])        # tls-ca checks the dialled peer's certificate
        with open(path, "w") as f:
            f.write("listen = elvin://127.0.0.1:3000\n")
        self.successResultOf(top.reload())
        self.assertEqual(warnings(), [])

    def test_every_router_setting_is_reloaded_or_restart_only(self):
        from elvin.config import ROUTER_SETTINGS
        names = {setting.name for setting in ROUTER_SETTINGS}
        self.assertEqual(names, set(tap.RELOADED) | set(tap.RESTART_ONLY) | {"listen"})
        self.assertFalse(set(tap.RELOADED) & set(tap.RESTART_ONLY))

    def test_the_reload_line_names_every_setting_it_applies(self):
        events = self.log_events()
        path, top = self.started("listen = elvin://127.0.0.1:3000\n")
        router = top.router
        changed = {"max-connections": "500", "max-federation-connections": "10",
                   "reserved-files": "32", "max-subscriptions": "7",
                   "max-subscription-tokens": "99", "max-client-subscription-bytes": "12345",
                   "max-pattern-work": "4096", "max-evaluation-bytes": "8192",
                   "max-heavy-evaluation-bytes": "16384", "max-client-quenches": "17",
                   "max-client-subscription-memory": "222222",
                   "max-subscription-memory": "3333333",
                   "max-protocol-errors": "9", "protocol-error-window": "3.5",
                   "verbose": "yes", "max-queue-memory": "1000000",
                   "max-quench-memory": "2000000", "max-receive-memory": "3000000",
                   "max-turn-time": "12", "redirect-to": "elvin://127.0.0.1:3999",
                   "max-tls-handshakes": "33", "tls-handshake-timeout": "4.5",
                   "shutdown-grace": "4"}
        self.assertEqual(set(changed), set(tap.RELOADED))
        with open(path, "w") as f:
            f.write("listen = elvin://127.0.0.1:3000\n"
                    + "".join(f"{name} = {value}\n" for name, value in changed.items())
                    + "Send-Queue.Max-Length = 4096\nSubscription.Max-Count.Ceiling = 50000\n")
        applied, message = self.successResultOf(top.reload())
        self.assertTrue(applied)
        phrases = message[len("reloaded: "):].split("; ")
        self.assertEqual(sorted(phrase.split(" ")[0] for phrase in phrases),
                         sorted(list(changed) + ["Send-Queue.Max-Length",
                                                 "Subscription.Max-Count.Ceiling"]))
        for phrase in ("max-client-subscription-bytes 12345", "max-pattern-work 4096",
                       "max-protocol-errors 9",
                       "protocol-error-window 3.5", "verbose True",
                       "Send-Queue.Max-Length 4096", "Subscription.Max-Count.Ceiling 50000"):
            self.assertIn(phrase, phrases)
        self.assertIn(message, [e.get("summary") for e in events])
        self.assertEqual((router.max_subscriptions, router.max_subscription_tokens,
                          router.max_client_subscription_bytes, router.max_protocol_errors,
                          router.protocol_error_window, router.verbose,
                          router.queue_budget.max_bytes, router.quench.max_bytes,
                          router.max_pattern_work, router.max_evaluation_bytes,
                          router.max_client_quenches, router.max_heavy_evaluation_bytes,
                          router.max_client_subscription_memory,
                          router.max_subscription_memory),
                         (7, 99, 12345, 9, 3.5, True, 1000000, 2000000, 4096, 8192, 17,
                          16384, 222222, 3333333))
        self.assertEqual(router.turn_slice.seconds, 0.012)
        self.assertEqual(router.new_options()["Send-Queue.Max-Length"], 4096)
        self.assertEqual((router.admission.budget.max_handshakes,
                          router.admission.budget.handshake_timeout), (33, 4.5))
        applied, message = self.successResultOf(top.reload())
        self.assertEqual(message, "reloaded: nothing changed")

    def test_live_sessions_are_held_to_what_a_reload_lowers(self):
        """A protocol-error limit lowered by a reload disconnects a session
        connected before it; a lowered ceiling bounds its next QosRqst."""
        from elvin.test.test_router import RecordingOutput
        path, top = self.started("listen = elvin://127.0.0.1:3000\n")
        router = top.router
        out = RecordingOutput()
        session = router.open_session(out, "live")
        session.packet_received(elvin_packets.ConnRqst(1, 4, 0, {}))
        with open(path, "w") as f:
            f.write("listen = elvin://127.0.0.1:3000\nmax-protocol-errors = 3\n"
                    "Subscription.Max-Count = 16\nSubscription.Max-Count.Ceiling = 20\n")
        self.assertTrue(self.successResultOf(top.reload())[0])
        session.packet_received(elvin_packets.QosRqst(2, {"Subscription.Max-Count": 100}))
        reply = out.sent[-1]
        self.assertIsInstance(reply, elvin_packets.QosRply)
        self.assertEqual(reply.options["Subscription.Max-Count"], 20)
        self.assertEqual(session.options["Subscription.Max-Count"], 20)
        for xid in (3, 4, 5):
            session.packet_received(elvin_packets.SubDelRqst(xid, 12345))   # no such id
        self.assertIsInstance(out.sent[-1], elvin_packets.Disconn)
        self.assertEqual(out.sent[-1].reason, 4)

    def test_refusal_keeps_its_reason_in_json_logs(self):
        """The refusal's reason is a text field: a JSON log keeps it."""
        import json
        from twisted.logger import eventAsJSON
        events = self.log_events()
        path, top = self.started("listen = elvin://127.0.0.1:3000\n")
        with open(path, "w") as f:
            f.write("listen = elvin://127.0.0.1:3000\nmax-subscriptions = lots\n")
        applied, message = self.successResultOf(top.reload())
        self.assertFalse(applied)
        (refusal,) = [json.loads(eventAsJSON(e)) for e in events
                      if "reload refused" in e.get("log_format", "")]
        fields = {k: v for k, v in refusal.items() if not k.startswith("log_")}
        self.assertNotIn({"unpersistable": True}, list(fields.values()))
        self.assertEqual(refusal["problem"], message[len("refused: "):])
        self.assertTrue(refusal["problem"].startswith(f"{path}:2: max-subscriptions"))

    def test_command_line_overrides_survive_a_reload(self):
        """--verbose, --discovery and -l win over the file at each reload,
        as at start: a reload for another change keeps them (it turned
        --verbose off, and reported discovery as needing a restart)."""
        path = os.path.abspath(self.mktemp())
        for text in ("", "verbose = no\ndiscovery = no\n"):
            with open(path, "w") as f:
                f.write("listen = elvin://127.0.0.1:3000\n" + text)
            top = tap.makeService(parse("-c", path, "--verbose", "--discovery",
                                        "-l", "elvin://127.0.0.1:3005"),
                                  reactor=MemoryReactorClock())
            self.assertTrue(top.router.verbose)
            with open(path, "a") as f:
                f.write("max-subscriptions = 7\n")
            applied, message = self.successResultOf(top.reload())
            self.assertEqual((applied, message), (True, "reloaded: max-subscriptions 7"))
            self.assertTrue(top.router.verbose)
            self.assertTrue(top.config.discovery)
            self.assertEqual([str(u) for u in top.config.listen],
                             ["elvin:4.0/tcp,none,xdr/127.0.0.1:3005"])

    def test_no_configuration_file_is_logged(self):
        events = self.log_events()
        top = tap.makeService(parse("-l", "elvin://127.0.0.1:3000"),
                              reactor=MemoryReactorClock())
        applied, message = self.successResultOf(top.reload())
        self.assertFalse(applied)
        self.assertIn("no configuration file to reload", message)
        self.assertIn(message, [e.get("problem") for e in events])


class ReloadRefusalTests(unittest.TestCase):
    """A reload whose file adds what cannot be bound or made is refused
    whole: said and logged with the setting and line, nothing of it
    applied, and the same file refused again (in process)."""

    BASE = ("listen = elvin://127.0.0.1:3000\nmax-subscriptions = 10\n"
            "Federation.Listen = ewaf://127.0.0.1:3002\n"
            "Federation.Router-Name = first.test\n")

    def setUp(self):
        self.path = os.path.abspath(self.mktemp())
        self.write(self.BASE)
        self.reactor = _BusyReactor({3009})
        self.top = tap.makeService(parse("-c", self.path), reactor=self.reactor)
        self.top._install_drain_signal = lambda: None    # no signal handlers in trial
        self.top.privilegedStartService()
        self.top.startService()
        self.addCleanup(self.top.stopService)
        self.events = ReloadMessageTests.log_events(self)
        self.federation = self.top.federation_service

    def write(self, text):
        with open(self.path, "w") as f:
            f.write(text)

    def assertRefused(self, extra, line, phrase):
        """Reloading BASE with ``extra`` (and max-subscriptions 5) is
        refused, twice, naming line ``line``; nothing changes."""
        self.write(self.BASE + "max-subscriptions = 5\n" + extra)
        config, listeners = self.top.config, dict(self.top.listeners)
        fed_listeners = dict(self.federation.listeners)
        for _ in range(2):
            applied, message = self.successResultOf(self.top.reload())
            self.assertFalse(applied)
            self.assertTrue(message.startswith(f"refused: {self.path}:{line}: {phrase}"),
                            message)
            self.assertIn(message[len("refused: "):],
                          [e.get("problem") for e in self.events])
        self.assertEqual(self.top.router.max_subscriptions, 10)
        self.assertIs(self.top.config, config)
        self.assertEqual(self.top.listeners, listeners)
        self.assertIs(self.top.federation_service, self.federation)
        self.assertEqual(self.federation.listeners, fed_listeners)
        self.assertTrue(self.federation.running)
        self.assertEqual(self.reactor.open, {3000, 3002})
        return message

    def test_client_listener_in_use(self):
        message = self.assertRefused("listen = elvin://127.0.0.1:3001\n"
                                     "listen = elvin://127.0.0.1:3009\n", 7,
                                     "listen elvin://127.0.0.1:3009: address already in use")
        self.assertIn("change listen to another port", message)

    def test_a_listener_named_twice(self):
        self.assertRefused("listen = elvin://127.0.0.1:3000\n", 6,
                           "listen elvin://127.0.0.1:3000 is given twice (first at "
                           f"{self.path}:1)")

    def test_tls_client_listener_without_certificate(self):
        self.assertRefused("listen = elvin:/secure/127.0.0.1:3001\n", 6,
                           "listen elvin:4.0/ssl,none,xdr/127.0.0.1:3001 needs TLS")

    def test_federation_listener_in_use(self):
        self.assertRefused("listen = elvin://127.0.0.1:3001\n"
                           "Federation.Listen = ewaf://127.0.0.1:3009\n", 7,
                           "Federation.Listen ewaf:1.0/tcp,none,xdr/127.0.0.1:3009: "
                           "address already in use")

    def test_federation_listener_in_use_when_federation_restarts(self):
        self.assertRefused("Federation.Router-Name = second.test\n"
                           "Federation.Listen = ewaf://127.0.0.1:3009\n", 7,
                           "Federation.Listen ewaf:1.0/tcp,none,xdr/127.0.0.1:3009: "
                           "address already in use")

    def test_trace_directory_that_cannot_be_made(self):
        blocker = os.path.abspath(self.mktemp())
        with open(blocker, "w") as f:
            f.write("a file, not a folder\n")
        self.assertRefused(f"Federation.Trace-Directory = {blocker}/traces\n", 6,
                           f"Federation.Trace-Directory {blocker}/traces: cannot make it")

    def test_a_file_that_binds_is_applied(self):
        """The same router, given a file whose listeners bind, applies it."""
        self.write(self.BASE + "max-subscriptions = 5\nlisten = elvin://127.0.0.1:3001\n"
                   "Federation.Listen = ewaf://127.0.0.1:3003\n")
        applied, message = self.successResultOf(self.top.reload())
        self.assertTrue(applied, message)
        self.assertEqual(self.top.router.max_subscriptions, 5)
        self.assertEqual(self.reactor.open, {3000, 3001, 3002, 3003})
        self.assertIs(self.top.federation_service, self.federation)

    def test_federation_restart_keeps_its_listening_port_open(self):
        """A restart hands the running listener to the new federation: the
        port is never closed, so nothing can take it meanwhile."""
        (listener,) = self.federation.listeners.values()
        bound = len(self.reactor.tcpServers)
        self.write(self.BASE.replace("first.test", "second.test"))
        applied, message = self.successResultOf(self.top.reload())
        self.assertTrue(applied, message)
        self.assertIn("federation restarted (Federation.router-name changed)", message)
        fresh = self.top.federation_service
        self.assertIsNot(fresh, self.federation)
        self.assertFalse(self.federation.running)
        self.assertEqual(list(fresh.listeners.values()), [listener])
        self.assertIs(listener.factory.manager, fresh.manager)
        self.assertTrue(listener.running)
        self.assertEqual(len(self.reactor.tcpServers), bound)    # not bound again
        self.assertEqual(self.reactor.open, {3000, 3002})

    def test_an_unforeseen_error_is_answered_and_logged(self):
        """Whatever goes wrong, the reload fires with a reason (POST
        /reload is answered) and the error is logged with its traceback."""
        def broken(old, new):
            raise RuntimeError("unforeseen")
        self.patch(tap, "reloaded_changes", broken)
        applied, message = self.successResultOf(self.top.reload())
        self.assertEqual((applied, message), (False, "reload failed: unforeseen"))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class LogRotationDocTests(unittest.TestCase):
    """docs/operations.md, "Rotating the log", holds for this Twisted."""

    def test_text_logs_rotate_at_the_size_the_docs_give(self):
        from twisted.python.logfile import LogFile
        with open(os.path.join(REPO, "docs", "operations.md"), encoding="utf-8") as f:
            text = f.read()
        log = LogFile.fromFullPath(os.path.abspath(self.mktemp()))   # as twistd makes it
        self.addCleanup(log.close)
        section = text.split("## Rotating the log", 1)[1].split("\n## ", 1)[0]
        self.assertIn(f"reaches {log.rotateLength:,} bytes", section.replace("\n", " "))
        self.assertIsNone(log.maxRotatedFiles)                      # "It deletes none"


class PluginTests(unittest.TestCase):

    def test_discoverable(self):
        makers = [p for p in getPlugins(IServiceMaker) if p.tapname == "elvin"]
        self.assertTrue(makers, "no IServiceMaker with tapname 'elvin'")
        maker = makers[0]
        self.assertIsInstance(maker.options(), tap.Options)
        self.assertIn("Elvin", maker.description)

    def test_maker_builds_service(self):
        (maker,) = {p.tapname: p for p in getPlugins(IServiceMaker)
                    if p.tapname == "elvin"}.values()
        options = maker.options()
        options.parseOptions(["-l", "elvin://localhost:3000"])
        self.assertIsInstance(maker.makeService(options), tap.RouterService)


class _Collect(protocol.ProcessProtocol):
    def __init__(self):
        self.out = []
        self.ended = defer.Deferred()

    def outReceived(self, data):
        self.out.append(data)

    errReceived = outReceived

    def processEnded(self, reason):
        self.ended.callback((b"".join(self.out), reason.value))


class TwistdTests(unittest.TestCase):
    """``twistd -n elvin`` end to end: start, serve a client, stop on SIGTERM."""

    timeout = 30

    @defer.inlineCallbacks
    def test_twistd_elvin(self):
        from elvin import client
        port = free_port()
        uri = f"elvin://127.0.0.1:{port}"
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        rundir = self.mktemp()
        os.mkdir(rundir)
        proc = _Collect()
        transport = reactor.spawnProcess(
            proc, sys.executable,
            [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
             "-n", "--pidfile=", "elvin", "-l", uri],
            env=env, path=rundir)
        self.addCleanup(lambda: transport.pid and transport.signalProcess("KILL"))

        conn = None
        for _ in range(100):
            try:
                conn = yield client.connect(uri, reactor=reactor)
                break
            except (error.ConnectError, OSError):
                yield task.deferLater(reactor, 0.1, lambda: None)
        self.assertIsNotNone(conn, "twistd elvin did not start listening")
        seen = []
        conn.on_disconnect = lambda reason, args: seen.append(reason)
        yield conn.test_connection()
        transport.signalProcess("TERM")
        yield conn.disconnected
        output, reason = yield proc.ended
        output = output.decode("utf-8", "replace")
        self.assertEqual(seen, [DISCONN_SHUTDOWN], output)
        # twistd re-raises the signal that stopped it once it has shut down
        # cleanly, so the process ends "by signal 15"; anything else (an
        # exit status, another signal) means it crashed.
        if not isinstance(reason, error.ProcessDone):
            self.assertIsInstance(reason, error.ProcessTerminated, output)
            self.assertEqual((reason.exitCode, reason.signal),
                             (None, signal.SIGTERM), output)
        self.assertIn("Server Shut Down", output)
        self.assertNotIn("Traceback", output)
        self.assertIn("Elvin router listening on", output)


class TwistdErrorTests(unittest.TestCase):
    """Start-up problems are one line naming what was wrong, not a traceback."""

    timeout = 30

    def twistd(self, *args):
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        rundir = self.mktemp()
        os.mkdir(rundir)
        proc = _Collect()
        reactor.spawnProcess(
            proc, sys.executable,
            [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
             "-n", "--pidfile=", "elvin"] + list(args), env=env, path=rundir)
        return proc.ended

    def held_port(self):
        held = socket.socket()
        self.addCleanup(held.close)
        held.bind(("127.0.0.1", 0))
        held.listen()
        return held.getsockname()[1]

    @defer.inlineCallbacks
    def test_port_in_use(self):
        port = self.held_port()
        out, reason = yield self.twistd("-l", f"elvin://127.0.0.1:{port}")
        self.assertEqual(reason.exitCode, 1)
        text = out.decode()
        self.assertIn(f"elvin://127.0.0.1:{port}: address already in use; is another "
                      "router running? use -l to choose another port", text)
        self.assertNotIn("Traceback", text)

    @defer.inlineCallbacks
    def test_port_in_use_daemonised(self):
        """twistd without -n: the parent exits 1 with the one line on its
        stderr (not a log line on stdout), and leaves no pidfile."""
        port = self.held_port()
        rundir = os.path.abspath(self.mktemp())
        os.mkdir(rundir)
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        out, err, code = yield getProcessOutputAndValue(
            sys.executable,
            ["-c", "from twisted.scripts.twistd import run; run()",
             "--pidfile=d.pid", "--logfile=d.log", "elvin",
             "-l", f"elvin://127.0.0.1:{port}"], env=env, path=rundir)
        self.assertEqual((out, code), (b"", 1))
        self.assertEqual(err.decode(), f"twistd elvin: elvin://127.0.0.1:{port}: address "
                         "already in use; is another router running? use -l to choose "
                         "another port\n")
        self.assertFalse(os.path.exists(os.path.join(rundir, "d.pid")))

    @defer.inlineCallbacks
    def test_trace_directory_that_is_a_file(self):
        """Federation.Trace-Directory naming a regular file: one line naming
        the setting, where it was set and why (not a FileExistsError traceback)."""
        blocker = os.path.abspath(self.mktemp())
        open(blocker, "w").close()
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write(f"listen = elvin://127.0.0.1:{free_port()}\nFederation.Activated = yes\n"
                    f"Federation.Router-Name = t.test\n"
                    f"Federation.Trace-Directory = {blocker}\n")
        out, reason = yield self.twistd("-c", path)
        text = out.decode()
        self.assertEqual(reason.exitCode, 1, text)
        self.assertIn(f"twistd elvin: {path}:4: Federation.Trace-Directory {blocker}: "
                      "it exists and is not a directory", text)
        self.assertNotIn("Traceback", text)

    @defer.inlineCallbacks
    def test_config_error_without_usage(self):
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write("listen = elvin://127.0.0.1:3000\nbogus = 1\n")
        out, reason = yield self.twistd("-c", path)
        self.assertEqual(reason.exitCode, 1)
        lines = out.decode().strip().splitlines()
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[0].startswith(f"twistd elvin: {path}:2: unknown setting "
                                            "'bogus'"), lines[0])
        self.assertIn("twistd elvin --help", lines[1])
        self.assertNotIn("--nodaemon", out.decode())


class ExampleConfigTests(unittest.TestCase):
    """The example configuration ships in the package, so an installed
    router can print it (``twistd elvin --print-config``)."""

    def test_packaged_example_is_the_documented_one(self):
        from elvin.tools.config_example import example_text
        with open(os.path.join(REPO, "conf", "elvind.conf"), encoding="utf-8") as f:
            self.assertEqual(example_text(), f.read())

    def test_print_config_and_version(self):
        from io import StringIO
        from elvin.tools.config_example import example_text
        import elvin
        for flag, expected in (("--print-config", example_text()),
                               ("--version", f"twistd elvin (elvin) {elvin.__version__}")):
            out = StringIO()
            self.patch(sys, "stdout", out)
            with self.assertRaises(SystemExit) as cm:
                tap.Options().parseOptions([flag])
            self.assertEqual(cm.exception.code, 0)
            self.assertTrue(out.getvalue().startswith(expected), flag)
