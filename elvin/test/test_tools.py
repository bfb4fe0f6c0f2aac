"""Integration tests of elvin-notify and elvin-subscribe.

A real router (elvin.core.router.Router behind ElvinServerFactory) listens on
loopback in the test's reactor; the tools run as subprocesses
(``python -m elvin.tools.notify`` / ``elvin.tools.subscribe`` from the
repository root, so they use the working tree) or, where the process is not
the point, on the test's reactor with their standard streams in memory
(``ToolTestCase.tool_here``), and talk to it over TCP.
"""

import math
import os
import sys

from twisted.internet import defer, protocol, reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest

from elvin import client
from elvin.protocols.server import ElvinServerFactory, ElvinServerProtocol
from elvin.core.router import Router
from elvin.textformat import format_notification, read_notifications
from elvin.values import INT32, INT64, OPAQUE, REAL64, STRING, Int64, type_of
from elvin.test.polling import wait_until
from elvin.test.places import REPO
from elvin.test.test_proxy_core import ProxyCoreCase



class _TrackedServerProtocol(ElvinServerProtocol):
    """Server protocol whose end the test can wait for (no dirty reactor)."""

    def connectionMade(self):
        self.lost = defer.Deferred()
        self.factory.protocols.append(self)
        super().connectionMade()

    def connectionLost(self, reason=None):
        super().connectionLost(reason)
        if not self.lost.called:
            self.lost.callback(None)


class _TrackingFactory(ElvinServerFactory):
    protocol = _TrackedServerProtocol

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.protocols = []


class _ToolProcess(protocol.ProcessProtocol):
    """Runs a tool with ``stdin`` written to it; ``ended`` fires with
    (stdout, stderr, exit code)."""

    def __init__(self, stdin=b""):
        self.stdin = stdin
        self.out = []
        self.err = []
        self.ended = defer.Deferred()

    def connectionMade(self):
        if self.stdin:
            self.transport.write(self.stdin)
        self.transport.closeStdin()

    def outReceived(self, data):
        self.out.append(data)

    def errReceived(self, data):
        self.err.append(data)

    def processEnded(self, reason):
        self.ended.callback((b"".join(self.out), b"".join(self.err),
                             reason.value.exitCode))



class ToolTestCase(unittest.TestCase):
    timeout = 30

    def setUp(self):
        self.router = Router()
        self.factory = _TrackingFactory(self.router, reactor)
        self.port = reactor.listenTCP(0, self.factory, interface="127.0.0.1")
        self.uri = f"elvin://127.0.0.1:{self.port.getHost().port}"
        self.connections = []

    @defer.inlineCallbacks
    def tearDown(self):
        for conn in self.connections:
            yield conn.close()
        self.router.shutdown()
        yield defer.DeferredList([p.lost for p in self.factory.protocols])
        yield self.port.stopListening()

    # -- helpers ------------------------------------------------------------

    def tool(self, name, *args):
        """Run ``python -m elvin.tools.NAME ARGS``; fires (out, err, code)."""
        return getProcessOutputAndValue(
            sys.executable, ["-m", f"elvin.tools.{name}"] + list(args),
            env=os.environ, path=REPO)

    def usage_error(self, name, *args):
        """(stderr, exit code) of a tool whose arguments do not parse,
        in this process (a usage error ends before any reactor runs)."""
        import importlib
        import io
        from elvin.tools.common import parse_options
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        with self.assertRaises(SystemExit) as raised:
            parse_options(importlib.import_module(f"elvin.tools.{name}").Options, list(args))
        return err.getvalue().encode(), raised.exception.code

    @defer.inlineCallbacks
    def tool_here(self, name, *args, stdin=b""):
        """(out, err, code) of ``elvin.tools.NAME ARGS`` run as its main runs
        it (``common.outcome``) but on this process's reactor, its standard
        streams in memory: for tests of what the tool does, where the
        process is not the point (starting one is most of such a test's
        time). The process tests above stay for what only a process shows."""
        import importlib
        import io
        import logging
        from elvin.tools import common
        tool = importlib.import_module(f"elvin.tools.{name}")
        out, err = io.BytesIO(), io.BytesIO()
        self.patch(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8", write_through=True))
        self.patch(sys, "stderr", io.TextIOWrapper(err, encoding="utf-8", write_through=True))
        self.patch(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        try:
            options = common.parse_options(tool.Options, list(args))
        except SystemExit as e:
            return out.getvalue(), err.getvalue(), e.code
        # What the tool's own reactor would close as it stops (common.closing)
        left = []
        self.patch(tool, "closing", lambda reactor, conn: left.append(conn))
        handler = common.quiet_library_warnings(options.name)
        try:
            code = yield common.outcome(reactor, options, tool.body)
            for conn in left:
                yield common.close_politely(reactor, conn)
        finally:
            logging.getLogger("elvin").removeHandler(handler)
        return out.getvalue(), err.getvalue(), code

    def tool_with_stdin(self, name, stdin, *args):
        proc = _ToolProcess(stdin)
        reactor.spawnProcess(proc, sys.executable,
                             [sys.executable, "-m", f"elvin.tools.{name}"] + list(args),
                             env=os.environ, path=REPO)
        return proc.ended

    @defer.inlineCallbacks
    def connect(self):
        conn = yield client.connect(self.uri, reactor=reactor)
        self.connections.append(conn)
        return conn

    @defer.inlineCallbacks
    def collect(self, expression):
        """Subscribe through the client library; returns the list it fills."""
        conn = yield self.connect()
        received = []
        yield conn.subscribe(expression, received.append)
        return received

    def wait_for_subscriptions(self, count):
        return wait_until(lambda: len(self.router.subscriptions) >= count)

    def assertSucceeded(self, result):
        out, err, code = result
        self.assertEqual(code, 0, f"exit {code}; stderr: {err!r}")
        self.assertEqual(err, b"")
        return out

    def unused_uri(self):
        """A loopback URI nobody listens on."""
        port = reactor.listenTCP(0, protocol.Factory(), interface="127.0.0.1")
        number = port.getHost().port
        return port.stopListening().addCallback(
            lambda _: f"elvin://127.0.0.1:{number}")


class NotifyTests(ToolTestCase):

    @defer.inlineCallbacks
    def test_arguments(self):
        received = yield self.collect('Group == "chat"')
        result = yield self.tool(
            "notify", "-e", self.uri, 'Group: "chat"', "Num: 42", "Big: 12L",
            "Huge: 3000000000", "R: 2.5", "E: 1e3", "Blob: [de ad]",
            r'Text: "line\n\"quoted\""', "Single: 'it\\'s'", "urn:x:y: 1")
        self.assertSucceeded(result)
        yield wait_until(lambda: received)
        (note,) = received
        self.assertEqual(note, {"Group": "chat", "Num": 42, "Big": 12, "Huge": 3000000000,
                                "R": 2.5, "E": 1000.0, "Blob": b"\xde\xad",
                                "Text": 'line\n"quoted"', "Single": "it's",
                                "urn:x:y": 1})
        self.assertEqual(type_of(note["Num"]), INT32)
        self.assertEqual(type_of(note["Big"]), INT64)
        self.assertIsInstance(note["Big"], Int64)
        self.assertEqual(type_of(note["Huge"]), INT64)
        self.assertEqual(type_of(note["R"]), REAL64)
        self.assertEqual(type_of(note["Blob"]), OPAQUE)
        self.assertEqual(type_of(note["Text"]), STRING)

    @defer.inlineCallbacks
    def test_arguments_not_matching(self):
        received = yield self.collect('Group == "chat"')
        result = yield self.tool_here("notify", "-e", self.uri, 'Group: "news"')
        self.assertSucceeded(result)
        self.assertEqual(self.router.stats["notifications"], 1)
        self.assertEqual(received, [])

    @defer.inlineCallbacks
    def test_stdin(self):
        received = yield self.collect("require(N)")
        text = ('N: 1\nS: "one"\n---\n'
                "N: 2\nR: inf\n\n"
                "\n---\n"              # extra separators are not notifications
                "N: 3\nB: [00 ff]\n"   # the last needs no separator
                ).encode()
        result = yield self.tool_with_stdin("notify", text, "-e", self.uri)
        self.assertSucceeded(result)
        yield wait_until(lambda: len(received) >= 3)
        self.assertEqual([dict(n) for n in received],
                         [{"N": 1, "S": "one"}, {"N": 2, "R": math.inf},
                          {"N": 3, "B": b"\x00\xff"}])

    @defer.inlineCallbacks
    def test_stdin_through_shell_pipe(self):
        received = yield self.collect("require(N)")
        command = (f"printf 'N: 1\\n---\\nN: 2\\n---\\n' | "
                   f"'{sys.executable}' -m elvin.tools.notify -e '{self.uri}'")
        result = yield getProcessOutputAndValue("/bin/sh", ["-c", command],
                                                env=os.environ, path=REPO)
        self.assertSucceeded(result)
        yield wait_until(lambda: len(received) >= 2)
        self.assertEqual([n["N"] for n in received], [1, 2])

    @defer.inlineCallbacks
    def test_empty_stdin(self):
        result = yield self.tool_here("notify", "-e", self.uri, stdin=b"")
        self.assertSucceeded(result)
        self.assertEqual(self.router.stats["notifications"], 0)

    @defer.inlineCallbacks
    def test_unreliable(self):
        received = yield self.collect('Kind == "udp-ish"')
        result = yield self.tool_here("notify", "-e", self.uri, "--unreliable",
                                 'Kind: "udp-ish"', "N: 7L")
        self.assertSucceeded(result)
        yield wait_until(lambda: received)
        self.assertEqual(received, [{"Kind": "udp-ish", "N": 7}])
        self.assertEqual(type_of(received[0]["N"]), INT64)
        self.assertEqual(self.router.stats["unotify"], 1)

    @defer.inlineCallbacks
    def test_unreliable_stdin_short_option(self):
        received = yield self.collect("require(N)")
        result = yield self.tool_here("notify", "-u", "-e", self.uri,
                                      stdin=b"N: 1\n---\nN: 2\n")
        self.assertSucceeded(result)
        yield wait_until(lambda: len(received) >= 2)
        self.assertEqual(sorted(n["N"] for n in received), [1, 2])
        self.assertEqual(self.router.stats["unotify"], 2)

    @defer.inlineCallbacks
    def test_bad_argument(self):
        out, err, code = yield self.tool_here("notify", "-e", self.uri, "Num 42")
        self.assertEqual(code, 1)
        self.assertIn(b"error:", err)
        self.assertIn(b"Num 42", err)
        self.assertIn(b"Name: value", err)
        self.assertEqual(self.router.stats["notifications"], 0)

    @defer.inlineCallbacks
    def test_bad_value_argument(self):
        out, err, code = yield self.tool_here("notify", "-e", self.uri, "Group: chat")
        self.assertEqual(code, 1)
        self.assertIn(b"quotes", err)
        self.assertEqual(self.router.stats["notifications"], 0)

    @defer.inlineCallbacks
    def test_an_attribute_given_twice(self):
        """A notification holds each name once: a name given twice is
        refused naming it and its lines (Avis's ep keeps the last value
        without a word), exit 1; those read before it were sent."""
        received = yield self.collect("require(A)")
        out, err, code = yield self.tool_here(
            "notify", "-e", self.uri, stdin=b"A: 1\n---\nA: 2\nB: 1\nA: 3\n---\nA: 4\n")
        self.assertEqual((code, err), (1, b"elvin-notify: error: <stdin>:5: attribute A is "
                                          b"given twice in one notification (first at line "
                                          b"3): a notification holds each name once\n"))
        yield wait_until(lambda: received)
        self.assertEqual(received, [{"A": 1}])

    def test_an_attribute_given_twice_as_arguments(self):
        from elvin.textformat import FormatError
        from elvin.tools.notify import _from_arguments
        with self.assertRaises(FormatError) as raised:
            _from_arguments(["A: 1", "B: 2", 'A: "x"'])
        self.assertEqual(str(raised.exception), "argument 'A: \"x\"': attribute A is given "
                         "twice in one notification: a notification holds each name once")

    @defer.inlineCallbacks
    def test_bad_stdin_line(self):
        """A bad line stops elvin-notify with the line number; notifications
        read before it have been emitted (stdin is streamed, not slurped)."""
        received = yield self.collect("require(A) || require(B)")
        out, err, code = yield self.tool_here(
            "notify", "-e", self.uri, stdin=b"A: 1\n---\nB: 2\nC: nonsense\n")
        self.assertEqual(code, 1)
        self.assertIn(b"error: <stdin>:4:", err)
        self.assertIn(b"nonsense", err)
        self.assertNotIn(b"Traceback", err)
        yield wait_until(lambda: received)
        self.assertEqual(received, [{"A": 1}])

    @defer.inlineCallbacks
    def test_over_the_routers_limits(self):
        """A notification the router would ignore without a word (over an
        attribute limit it reports) is refused naming its first line, exit
        1; those before it were sent."""
        received = yield self.collect("require(T)")
        too_many = "".join(f"a{i}: {i}\n" for i in range(300))   # Attribute.Max-Count 256
        cases = [("T: 2\n" + too_many, b"Attribute.Max-Count (256)"),
                 ('T: 2\nN' + "n" * 3000 + ": 1\n", b"Attribute.Name.Max-Length (2048)"),
                 ('T: 2\nS: "' + "x" * 1_100_000 + '"\n', b"Attribute.String.Max-Length"),
                 ("T: 2\nO: [" + "ab" * 1_100_000 + "]\n", b"Attribute.Opaque.Max-Length")]
        for body, named in cases:
            out, err, code = yield self.tool_here(
                "notify", "-e", self.uri, stdin=("T: 1\n---\n" + body + "---\nT: 3\n").encode())
            self.assertEqual(code, 1, err[:300])
            self.assertTrue(err.startswith(b"elvin-notify: error: <stdin>:3: "), err[:300])
            self.assertIn(named, err)
        yield wait_until(lambda: len(received) >= 4)
        self.assertEqual(received, [{"T": 1}] * 4)

    @defer.inlineCallbacks
    def test_stdin_not_utf8_names_the_line(self):
        out, err, code = yield self.tool_here(
            "notify", "-e", self.uri, stdin=b'A: 1\n---\nB: "caf\xe9"\n')
        self.assertEqual((code, err), (1, b"elvin-notify: error: <stdin>:3: not UTF-8 text "
                                          b"(byte 0xe9 at column 8)\n"))

    @defer.inlineCallbacks
    def test_over_the_limits_as_arguments(self):
        out, err, code = yield self.tool_here(
            "notify", "-e", self.uri, *[f"a{i}: 1" for i in range(300)])
        self.assertEqual(code, 1)
        self.assertIn(b"error: the arguments: 300 attributes", err)
        self.assertEqual(self.router.stats["notifications"], 0)

    @defer.inlineCallbacks
    def test_unreachable_router(self):
        uri = yield self.unused_uri()
        out, err, code = yield self.tool_here("notify", "-e", uri, "A: 1")
        self.assertNotEqual(code, 0)
        self.assertIn(b"error:", err)
        self.assertIn(b"refused", err.lower())
        self.assertNotIn(b"Traceback", err)

    @defer.inlineCallbacks
    def test_unreachable_router_unreliable(self):
        uri = yield self.unused_uri()
        out, err, code = yield self.tool_here("notify", "-e", uri, "-u", "A: 1")
        self.assertNotEqual(code, 0)
        self.assertIn(b"refused", err.lower())
        self.assertIn(uri.encode(), err)
        self.assertNotIn(b"Traceback", err)

    @defer.inlineCallbacks
    def test_unreliable_tls_handshake_failure(self):
        """-u to a TLS listener whose certificate is not trusted: one line,
        exit 1, nothing delivered."""
        from twisted.internet import endpoints
        from elvin.protocols import tls
        from elvin.test.transport_fixtures import Certificates
        certs = Certificates(self.mktemp())
        port = yield endpoints.wrapServerTLS(
            tls.server_options(certs.server_cert, certs.server_key),
            endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")).listen(
            self.factory)
        self.addCleanup(port.stopListening)
        uri = f"elvin:/secure/127.0.0.1:{port.getHost().port}"
        env = dict(os.environ, SSL_CERT_FILE=certs.other_ca_path)
        out, err, code = yield getProcessOutputAndValue(
            sys.executable, ["-m", "elvin.tools.notify", "-e", uri, "-u", "A: 1"],
            env=env, path=REPO)
        self.assertEqual(code, 1, err)
        self.assertEqual(err.count(b"\n"), 1, err)
        self.assertIn(b"elvin-notify: error: TLS with elvin:4.0/ssl,none,xdr/127.0.0.1:", err)
        self.assertEqual(self.router.stats["unotify"], 0)

    @defer.inlineCallbacks
    def test_unreliable_timeout(self):
        """-t bounds -u too: a server that accepts and never finishes the
        TLS handshake ends the tool in about -t seconds."""
        silent = reactor.listenTCP(0, protocol.Factory.forProtocol(protocol.Protocol),
                                   interface="127.0.0.1")
        self.addCleanup(silent.stopListening)
        uri = f"elvin:/secure/127.0.0.1:{silent.getHost().port}"
        started = reactor.seconds()
        out, err, code = yield self.tool_here("notify", "-e", uri, "-u", "-t", "1", "A: 1")
        self.assertEqual(code, 1, err)
        self.assertIn(b"did not finish the TLS handshake within 1 s", err)
        self.assertLess(reactor.seconds() - started, 8)

    @defer.inlineCallbacks
    def test_follows_a_drained_routers_redirection(self):
        """A drained router answers ConnRqst, then redirects: elvin-notify
        goes with it and the notification reaches the other router (in
        process: the tool's body on this reactor)."""
        from elvin.tools import notify
        other = Router()
        other_factory = _TrackingFactory(other, reactor)
        other_port = reactor.listenTCP(0, other_factory, interface="127.0.0.1")
        other_uri = f"elvin://127.0.0.1:{other_port.getHost().port}"

        @defer.inlineCallbacks
        def stop_other():
            other.shutdown()
            yield defer.DeferredList([p.lost for p in other_factory.protocols])
            yield other_port.stopListening()
        self.addCleanup(stop_other)
        conn = yield client.connect(other_uri, reactor=reactor)
        self.connections.append(conn)
        received = []
        yield conn.subscribe("D == 11", received.append)
        self.router.drain(other_uri)
        options = notify.Options()
        options.parseOptions(["-e", self.uri, "D: 11"])
        yield defer.ensureDeferred(notify.body(reactor, options))
        yield wait_until(lambda: received)
        self.assertEqual(received, [{"D": 11}])
        self.assertEqual(self.router.stats["notifications"], 0)

    @defer.inlineCallbacks
    def test_a_lost_connection_says_how_far_the_router_got(self):
        """The router goes away mid-relay: the error says the last line of
        what the router confirmed having, of what was sent, and of what
        was read, and where to resume (in process: the tool's body on this
        reactor, its stdin a pipe)."""
        from elvin.tools import notify
        conn = yield client.connect(self.uri, reactor=reactor)
        self.connections.append(conn)
        received = []
        yield conn.subscribe("require(n)", lambda n: received.append(n["n"]))
        read_end, write_end = os.pipe()
        stdin, feed = os.fdopen(read_end, "r"), os.fdopen(write_end, "w")
        self.addCleanup(feed.close)               # (the reading thread then ends)
        self.patch(sys, "stdin", stdin)
        options = notify.Options()
        options.parseOptions(["-e", self.uri])
        relay = defer.ensureDeferred(notify.body(reactor, options))
        feed.write("n: 1\n---\nn: 2\n---\n")    # lines 1-4
        feed.flush()
        yield wait_until(lambda: "_progress" in options and options["_progress"].confirmed() == 4)
        self.assertEqual(received, [1, 2])
        subscriber_side, tool_side = self.factory.protocols
        tool_side.transport.pauseProducing()     # the router reads no more ...
        feed.write("n: 3\n---\nn: 4\n")         # lines 5-6 sent, 7 read
        feed.flush()
        yield wait_until(lambda: options["_progress"].sent == 6 and options["_progress"].read == 7)
        tool_side.transport.abortConnection()    # ... and goes away
        with self.assertRaises(client.ConnectionClosed) as raised:
            yield relay
        self.assertEqual(received, [1, 2])
        told = str(raised.exception)
        self.assertIn("was lost; the router confirmed having the notifications of <stdin> up "
                      "to line 4; those sent after, to line 6, may not have reached it; "
                      "read to line 7: resume from line 5 to send again what is not "
                      "confirmed (some may arrive twice), or from line 7 to send nothing "
                      "twice (some may be lost)", told)

    def test_bad_uri_is_usage_error(self):
        err, code = self.usage_error("notify", "-e", "http://nowhere", "A: 1")
        self.assertEqual(code, 2)
        self.assertIn(b"http://nowhere", err)
        self.assertIn(b"--elvin", err)


class SubscribeTests(ToolTestCase):

    def start_subscriber(self, *args):
        return self.tool_here("subscribe", "-e", self.uri, *args)

    @defer.inlineCallbacks
    def test_count(self):
        # (the tool as a process: the others run it in this one)
        running = self.tool("subscribe", "-e", self.uri, "-n", "2", 'Group == "chat"')
        yield self.wait_for_subscriptions(1)
        conn = yield self.connect()
        conn.notify({"Group": "chat", "Num": 1})
        conn.notify({"Group": "news", "Num": 99})        # does not match
        conn.notify({"Group": "chat", "Text": 'a "b"\n', "Big": Int64(5),
                     "R": 0.5, "Blob": b"\x01\xab"})
        conn.notify({"Group": "chat", "Num": 3})         # after the count
        out = self.assertSucceeded((yield running))
        text = out.decode("utf-8")
        self.assertTrue(text.startswith('Group: "chat"\nNum: 1\n---\n'), text)
        notes = list(read_notifications(text.splitlines(True), "<output>"))
        self.assertEqual(notes, [{"Group": "chat", "Num": 1},
                                 {"Group": "chat", "Text": 'a "b"\n', "Big": 5,
                                  "R": 0.5, "Blob": b"\x01\xab"}])
        self.assertEqual(type_of(notes[1]["Big"]), INT64)
        self.assertEqual(text.count("---\n"), 2)

    @defer.inlineCallbacks
    def test_output_is_text_format(self):
        note = {"S": "x\ty", "I": -4, "L": Int64(2**40), "F": 1e-3, "O": b"\xde\xad"}
        running = self.start_subscriber("--count=1", "require(S)")
        yield self.wait_for_subscriptions(1)
        conn = yield self.connect()
        conn.notify(note)
        out = self.assertSucceeded((yield running))
        self.assertEqual(out.decode("utf-8"), format_notification(note))

    @defer.inlineCallbacks
    def test_output_feeds_notify(self):
        """What elvin-subscribe prints, elvin-notify reads back unchanged."""
        first = {"Topic": "relay", "I": 1, "L": Int64(-2), "F": 2.25,
                 "S": "tab\there 'q' \"dq\" back\\slash \x1b[2J", "O": b"\x00\x10",
                 # Names that would forge lines, or stop the relay, unescaped.
                 'Tag: "x"\nAdmin: "forged"\n---\nZ': 0, "a: b": 2, "": 3}
        second = {"Topic": "relay", "I": 2}
        running = self.start_subscriber("-n", "2", 'Topic == "relay"')
        yield self.wait_for_subscriptions(1)
        conn = yield self.connect()
        conn.notify(first)
        conn.notify(second)
        out = self.assertSucceeded((yield running))

        received = yield self.collect('Topic == "relay"')
        result = yield self.tool_here("notify", "-e", self.uri, stdin=out)
        self.assertSucceeded(result)
        yield wait_until(lambda: len(received) >= 2)
        self.assertEqual(received, [first, second])
        self.assertEqual([{k: type_of(v) for k, v in n.items()} for n in received],
                         [{k: type_of(v) for k, v in n.items()} for n in (first, second)])

    @defer.inlineCallbacks
    def test_notify_to_subscribe(self):
        """The two-terminal walkthrough: both tools, no library in between
        (two processes)."""
        running = self.tool("subscribe", "-e", self.uri, "-n", "1", 'Group == "chat"')
        yield self.wait_for_subscriptions(1)
        result = yield self.tool("notify", "-e", self.uri, 'Group: "chat"',
                                 'Message: "hello"')
        self.assertSucceeded(result)
        out = self.assertSucceeded((yield running))
        self.assertEqual(out, b'Group: "chat"\nMessage: "hello"\n---\n')

    @defer.inlineCallbacks
    def test_large_notification(self):
        """A notification within the router's default limits (two opaques
        just under Attribute.Opaque.Max-Length, a packet of 1.8 MB under
        Packet.Max-Length) reaches the tool."""
        big = {"A": b"\xaa" * 900_000, "B": b"\xbb" * 900_000}
        running = self.start_subscriber("-n", "1", "require(A)")
        yield self.wait_for_subscriptions(1)
        conn = yield self.connect()
        conn.notify(big)
        out, err, code = yield running
        notes = list(read_notifications(out.decode().splitlines(True)))
        # Compare without printing megabytes on failure.
        self.assertEqual((code, err, len(notes)), (0, b"", 1))
        self.assertTrue(notes[0] == big, "large notification arrived changed")

    @defer.inlineCallbacks
    def test_bad_expression(self):
        out, err, code = yield self.start_subscriber("Group ==")
        self.assertEqual(code, 1)
        self.assertEqual(out, b"")
        self.assertIn(b"error:", err)
        self.assertIn(b"Nack 2101", err)
        self.assertNotIn(b"Traceback", err)
        self.assertEqual(self.router.subscriptions, {})

    @defer.inlineCallbacks
    def test_unknown_function(self):
        out, err, code = yield self.start_subscriber("nosuchfunction(x)")
        self.assertEqual(code, 1)
        self.assertIn(b"Nack 2104", err)

    @defer.inlineCallbacks
    def test_unreachable_router(self):
        uri = yield self.unused_uri()
        out, err, code = yield self.tool_here("subscribe", "-e", uri, "require(A)")
        self.assertNotEqual(code, 0)
        self.assertEqual(out, b"")
        self.assertIn(b"error:", err)
        self.assertIn(b"refused", err.lower())
        self.assertNotIn(b"Traceback", err)

    def test_missing_expression_is_usage_error(self):
        err, code = self.usage_error("subscribe", "-e", self.uri)
        self.assertEqual(code, 2)
        self.assertTrue(err)

    def test_bad_count_is_usage_error(self):
        err, code = self.usage_error("subscribe", "-e", self.uri, "-n", "two", "require(A)")
        self.assertEqual(code, 2)

    @defer.inlineCallbacks
    def test_router_shutdown_ends_subscriber(self):
        """A Disconn from the router ends elvin-subscribe (it does not hang)."""
        running = self.start_subscriber("require(A)")
        yield self.wait_for_subscriptions(1)
        self.router.shutdown()
        out, err, code = yield running
        self.assertEqual(out, b"")
        self.assertNotIn(b"Traceback", err)
        # It stopped before --count (none given), so it is an error, and
        # the router's Disconn reason is reported.
        self.assertEqual(code, 1, err)
        self.assertIn(b"router is shutting down", err)


class SubscribeSessionCountTests(ProxyCoreCase):
    """``elvin-subscribe --session -n N`` acknowledges all N it printed,
    the N-th too (a proxy core in this process on loopback, the tool a
    subprocess): the next run starts after them."""

    timeout = 60

    def setUp(self):
        super().setUp(call_later=reactor.callLater)
        self.uri, _ = self.serve()

    @defer.inlineCallbacks
    def test_count_acknowledges_the_last_one_printed(self):
        phone, out = self.join("tab")
        self.subscribe(phone, out, "require(Seq)")
        phone.connection_lost()
        for seq in (1, 2, 3):
            self.publish({"Seq": seq})
        printed = []
        for count in (1, 2):
            out, err, code = yield getProcessOutputAndValue(
                sys.executable, ["-m", "elvin.tools.subscribe", "-e", self.uri,
                                 "--session", "tab", "-n", str(count)],
                env=os.environ, path=REPO)
            self.assertEqual(code, 0, err)
            printed.append([n["Seq"] for n in read_notifications(out.decode().splitlines())])
            yield wait_until(lambda: not self.core.sessions)     # its channel closed
        self.assertEqual(printed, [[1], [2, 3]])
        self.assertEqual(self.core.counters.acknowledged, 3)
        self.assertEqual(self.store.counts()["notifications"], 0)
