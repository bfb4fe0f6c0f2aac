"""The first hour with the tools: they never hang, never lie, end
well on Ctrl-C and closed pipes, and say what to do. Each test runs the tool
against servers on loopback, with bounded waits: as a subprocess, or in this
process where the process is not the point (ToolTestCase.tool_here)."""

import importlib
import os
import sys

from twisted.internet import defer, protocol, reactor, task
from twisted.trial import unittest

from elvin.protocols import packets
from elvin.protocols.framing import FramedProtocol
from elvin.test.places import free_port
from elvin.test.polling import wait_until
from elvin.test.test_tools import REPO, ToolTestCase


class _Silent(protocol.Protocol):
    """Accepts and says nothing (a listener that is not an Elvin router)."""


class _Hangs(FramedProtocol):
    """An Elvin router that answers ConnRqst and the first ``answered``
    packets after it, then hangs (as a router stopped with SIGSTOP)."""

    answered = 1

    def connectionMade(self):
        self.seen = 0

    def frameReceived(self, data):
        packet = packets.decode(data)
        if type(packet) is packets.ConnRqst:
            self.sendFrame(packets.encode(packets.ConnRply(packet.xid, {})))
            return
        self.seen += 1
        if self.seen > self.answered:
            return
        if type(packet) is packets.TestConn:
            self.sendFrame(packets.encode(packets.ConfConn()))
        elif type(packet) is packets.SubAddRqst:
            self.sendFrame(packets.encode(packets.SubRply(packet.xid, 1)))


class _HangsAtOnce(_Hangs):
    answered = 0


class _HTTPish(protocol.Protocol):
    def dataReceived(self, data):
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


class _Tool(protocol.ProcessProtocol):
    """A running tool: stdin kept open, output collected as it comes."""

    def __init__(self):
        self.out = b""
        self.err = b""
        self.ended = defer.Deferred()
        self.code = None

    def outReceived(self, data):
        self.out += data

    def errReceived(self, data):
        self.err += data

    def processEnded(self, reason):
        self.code = reason.value.exitCode
        self.ended.callback((self.out, self.err, self.code))


class CLITestCase(ToolTestCase):

    def spawn(self, name, *args, env=None, stdout=None):
        """Run tool ``name``; ``stdout``, a file, takes its output instead
        of a pipe."""
        proc = _Tool()
        environment = dict(os.environ if env is None else env)
        fds = None if stdout is None else {0: "w", 1: stdout.fileno(), 2: "r"}
        reactor.spawnProcess(proc, sys.executable,
                             [sys.executable, "-m", f"elvin.tools.{name}"] + list(args),
                             env=environment, path=REPO, childFDs=fds)

        def stop():
            if proc.code is None:
                proc.transport.signalProcess("KILL")
                return proc.ended
        self.addCleanup(stop)
        return proc

    def listen(self, proto):
        factory = protocol.Factory.forProtocol(proto)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return f"elvin://127.0.0.1:{port.getHost().port}"

    @defer.inlineCallbacks
    def wait_ended(self, proc, timeout=15):
        yield wait_until(lambda: proc.code is not None, timeout=timeout)
        return (proc.out, proc.err, proc.code)


class HangTests(CLITestCase):
    """Item 1: a server that does not answer ends the tool with a message."""

    @defer.inlineCallbacks
    def test_silent_listener_times_out(self):
        uri = self.listen(_Silent)
        # Both at once: the listener never answers, so neither can be late.
        results = yield defer.gatherResults(
            [self.tool(tool, "-e", uri, "--timeout", "0.5", *args)
             for tool, args in (("notify", ["a: 1"]), ("subscribe", ["require(a)"]))])
        for out, err, code in results:
            self.assertEqual(code, 1, err)
            self.assertIn(f"no Elvin ConnRply from {uri} within 0.5 s: is this an Elvin "
                          "router?".encode(), err)
            self.assertNotIn(b"Traceback", err)

    @defer.inlineCallbacks
    def test_router_hanging_before_the_last_round_trip(self):
        # Connected, then the router hangs: the TestConn that confirms what
        # was sent gets no answer. The tool ends within --timeout, saying
        # what may be lost, instead of waiting for ever.
        uri = self.listen(_Hangs)
        started = reactor.seconds()
        out, err, code = yield self.tool_here("notify", "-e", uri, "--timeout", "0.5", "a: 1")
        self.assertEqual(code, 1, err)
        self.assertLess(reactor.seconds() - started, 8)
        self.assertEqual(err.count(b"\n"), 1, err)
        self.assertIn(f"elvin-notify: error: the router at {uri} did not answer within "
                      "0.5 s (the TestConn that confirms the notifications sent: they may "
                      "not have reached it)".encode(), err)

    @defer.inlineCallbacks
    def test_router_hanging_after_connrply(self):
        # Every request of every tool is bounded by --timeout, not just ConnRqst.
        uri = self.listen(_HangsAtOnce)
        for tool, args, what in (("notify", ["a: 1"], b"TestConn after connecting"),
                                 ("subscribe", ["require(a)"], b"SubAddRqst"),
                                 ("quench", ["a"], b"QnchAddRqst")):
            out, err, code = yield self.tool_here(tool, "-e", uri, "--timeout", "0.5", *args)
            self.assertEqual(code, 1, err)
            self.assertEqual(err.count(b"\n"), 1, err)
            self.assertIn(b"did not answer within 0.5 s (" + what, err)

    @defer.inlineCallbacks
    def test_http_server_is_named(self):
        uri = self.listen(_HTTPish)
        out, err, code = yield self.tool_here("notify", "-e", uri, "a: 1")
        self.assertEqual(code, 1)
        self.assertIn(f"{uri} answered with something that is not Elvin".encode(), err)
        self.assertIn(b"HTTP/1.1 400", err)

    def test_library_default_timeout(self):
        from elvin import client
        self.assertEqual(client.DEFAULT_CONNECT_TIMEOUT, 10.0)

    @defer.inlineCallbacks
    def test_connect_timeout_parameter(self):
        from elvin import client
        uri = self.listen(_Silent)
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.connect(uri, timeout=0.3)
        self.assertIn("no Elvin ConnRply", str(cm.exception))


class RelayTests(CLITestCase):
    """Item 2: notify sends each notification as soon as its '---' arrives."""

    @defer.inlineCallbacks
    def test_each_notification_leaves_before_stdin_closes(self):
        received = yield self.collect("require(n)")
        proc = self.spawn("notify", "-e", self.uri)
        proc.transport.write(b'n: 1\nwhat: "first"\n---\n')
        yield wait_until(lambda: len(received) == 1, timeout=15)
        proc.transport.write(b"n: 2\n---\n")
        yield wait_until(lambda: len(received) == 2, timeout=15)
        self.assertIsNone(proc.code)  # still reading
        proc.transport.closeStdin()
        out, err, code = yield self.wait_ended(proc)
        self.assertEqual((code, err), (0, b""))


class PipeTests(CLITestCase):
    """Item 3: a closed stdout ends elvin-subscribe quietly, exit 0."""

    @defer.inlineCallbacks
    def test_closed_stdout(self):
        proc = self.spawn("subscribe", "-e", self.uri, "--ready", "require(n)")
        yield wait_until(lambda: b"ready" in proc.err, timeout=15)
        proc.transport.closeChildFD(1)   # the reader went away (| head)
        conn = yield self.connect()
        for i in range(5):
            conn.notify({"n": i})
            yield task.deferLater(reactor, 0.05, lambda: None)
        out, err, code = yield self.wait_ended(proc)
        self.assertEqual(code, 0, err)
        self.assertNotIn(b"Traceback", err)
        self.assertNotIn(b"BrokenPipe", err)


class FullDiskTests(CLITestCase):
    """An error writing stdout other than a closed pipe (a full disk:
    /dev/full) ends every tool with one error line, exit 1: no traceback,
    no tool left running with its output lost."""

    FULL = b": error: cannot write to stdout: No space left on device\n"

    def full(self):
        full = open("/dev/full", "wb")
        self.addCleanup(full.close)
        return full

    @defer.inlineCallbacks
    def test_subscribe(self):
        proc = self.spawn("subscribe", "-e", self.uri, "-n", "2", "--ready", "require(n)",
                          stdout=self.full())
        yield wait_until(lambda: b"ready" in proc.err, timeout=15)
        conn = yield self.connect()
        conn.notify({"n": 1})
        out, err, code = yield self.wait_ended(proc)
        self.assertEqual((code, err), (1, b"ready\nelvin-subscribe" + self.FULL))

    @defer.inlineCallbacks
    def test_quench(self):
        proc = self.spawn("quench", "-e", self.uri, "price", stdout=self.full())
        conn = yield self.connect()
        for _ in range(100):      # each adds a subscription, once the quench is in place
            if proc.code is not None:
                break
            yield conn.subscribe("price > 1", lambda n: None)
            yield task.deferLater(reactor, 0.1, lambda: None)
        out, err, code = yield self.wait_ended(proc)
        self.assertEqual((code, err), (1, b"elvin-quench" + self.FULL))

    @defer.inlineCallbacks
    def test_help_version_and_the_example_configuration(self):
        for name, args in (("notify", ["--help"]), ("stat", ["--version"]),
                           ("config_example", []), ("config_example", ["--help"])):
            proc = self.spawn(name, *args, stdout=self.full())
            out, err, code = yield self.wait_ended(proc)
            tool = b"elvin-" + name.replace("_", "-").encode()
            self.assertEqual((code, err), (1, tool + self.FULL), name)


class InterruptTests(CLITestCase):
    """Item 4: Ctrl-C disconnects politely and exits 0; twice, no traceback."""

    @defer.inlineCallbacks
    def interrupted(self, tool, args, times):
        before = len(self.router.sessions)
        proc = self.spawn(tool, "-e", self.uri, *args)
        yield wait_until(lambda: sum(s.state == s.CONNECTED for s in self.router.sessions)
                         > before, timeout=15)
        yield task.deferLater(reactor, 0.3, lambda: None)
        for _ in range(times):
            if proc.code is None:   # a fast exit may beat the second press
                proc.transport.signalProcess("INT")
            yield task.deferLater(reactor, 0.01, lambda: None)
        result = yield self.wait_ended(proc)
        return result

    @defer.inlineCallbacks
    def test_ctrl_c_on_subscribe(self):
        disconn = []
        original = self.router.session_closed

        def closed(session):
            disconn.append(session.state)
            original(session)
        self.router.session_closed = closed
        out, err, code = yield self.interrupted("subscribe", ["require(n)"], 1)
        self.assertEqual(code, 0, err)
        self.assertEqual(err, b"")
        # DisconnRqst puts the session in CLOSING before it is closed.
        yield wait_until(lambda: disconn, timeout=5)
        self.assertEqual(disconn[0], 3)

    @defer.inlineCallbacks
    def test_ctrl_c_twice(self):
        for tool, args in (("subscribe", ["require(n)"]), ("quench", ["n"])):
            out, err, code = yield self.interrupted(tool, args, 2)
            self.assertEqual(code, 0, (tool, err))
            self.assertNotIn(b"Traceback", err)
            self.assertNotIn(b"ReactorNotRunning", err)


class UsageTests(CLITestCase):
    """Items 8, 9 and 12: usage errors, messages, help and versions."""

    def test_count_must_be_positive(self):
        for count in ("0", "-1"):
            err, code = self.usage_error("subscribe", "-e", self.uri, "-n", count,
                                         "require(a)")
            self.assertEqual(code, 2)
            self.assertIn(f"--count must be at least 1, not {count}".encode(), err)

    def in_process(self, tool, flag):
        """(stdout, exit code) of ``elvin-TOOL FLAG``, parsed in this
        process (the options are what answer --help and --version)."""
        import importlib
        import io
        from elvin.tools.common import parse_options
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        with self.assertRaises(SystemExit) as raised:
            parse_options(importlib.import_module(f"elvin.tools.{tool}").Options, [flag])
        return out.getvalue().encode(), raised.exception.code

    def test_version_is_elvins(self):
        import elvin
        for tool in ("notify", "subscribe", "quench", "discover"):
            out, code = self.in_process(tool, "--version")
            self.assertEqual(code, 0)
            self.assertEqual(out.decode().strip(),
                             f"elvin-{tool} (elvin) {elvin.__version__}")

    def test_help_names_the_program_and_says_what_it_does(self):
        for tool, words in (("notify", b"Emit"), ("subscribe", b"Subscribe to"),
                            ("quench", b"Quench on"), ("discover", b"List Elvin")):
            out, code = self.in_process(tool, "--help")
            self.assertEqual(code, 0)
            self.assertTrue(out.startswith(f"Usage: elvin-{tool} ".encode()), out[:60])
            self.assertIn(words, out)

    @defer.inlineCallbacks
    def test_entry_point_runs_as_a_program(self):
        """One tool through the interpreter, as installed scripts run it."""
        import elvin
        out, err, code = yield self.tool("quench", "--version")
        self.assertEqual((code, out.decode().strip()),
                         (0, f"elvin-quench (elvin) {elvin.__version__}"))

    def test_udp_uri_without_u(self):
        err, code = self.usage_error("notify", "-e", "elvin:/udp,none,xdr/127.0.0.1:9", "a: 1")
        self.assertEqual(code, 2)
        self.assertIn(b"add -u (--unreliable)", err)
        self.assertNotIn(b"elvin.client", err)

    def test_usage_errors_name_what_is_wrong(self):
        """A bad number names its option; elvin-stat's --count is at
        least 1; session options need --session; every tool but
        elvin-notify -u refuses a UDP URI as usage (exit 2)."""
        udp = "elvin:/udp,none,xdr/127.0.0.1:9"
        for (tool, *args), words in (
                (("subscribe", "-n", "x", "r"), "--count must be a whole number, not 'x'"),
                (("subscribe", "-t", "x", "r"), "--timeout must be a number, not 'x'"),
                (("notify", "--discovery-time=x", "a: 1"),
                 "--discovery-time must be a number, not 'x'"),
                (("stat", "-i", "x"), "--interval must be a number, not 'x'"),
                (("stat", "-n", "0"), "--count must be at least 1, not 0"),
                (("stat", "-n", "-1"), "--count must be at least 1, not -1"),
                (("subscribe", "--client=c", "--password=p", "r"),
                 "--password and --client only go with --session"),
                (("subscribe", "--password=p", "r"), "--password only goes with --session"),
                (("subscribe", "--receipt=non-destructive", "r"),
                 "--receipt non-destructive only goes with --session"),
                (("subscribe", "-e", udp, "r"), "elvin-subscribe needs a session"),
                (("quench", "-e", udp, "n"), "elvin-quench needs a session")):
            err, code = self.usage_error(tool, *args)
            self.assertEqual(code, 2, (tool, args))
            self.assertTrue(err.startswith(f"elvin-{tool}: error: ".encode()), err)
            self.assertIn(words.encode(), err)

    def test_a_bad_elvin_uri_variable_is_named(self):
        """$ELVIN_URI, used without -e, is checked as -e is, and a bad
        one is a usage error naming the variable; -e and --scope do not
        use it, so it is not checked then."""
        for value, words in (("localhost:2917", "invalid Elvin URI 'localhost:2917': "
                              "wrong scheme 'localhost', expected 'elvin' (did you mean "
                              "elvin://localhost:2917?)"),
                             ("elvin:5.0//h", "elvin:5.0/tcp,none,xdr/h:2917: protocol "
                              "version 5.0 is not supported"),
                             ("elvin:/tcp,krb5,xdr/h", "elvin:4.0/tcp,krb5,xdr/h:2917: "
                              "protocol stack tcp,krb5,xdr is not supported"),
                             ("elvin:/udp,none,xdr/h", "elvin:/udp,none,xdr/h is a UDP "
                              "URI")):
            self.patch(os, "environ", dict(os.environ, ELVIN_URI=value))
            err, code = self.usage_error("subscribe", "r")
            self.assertEqual(code, 2)
            self.assertTrue(err.decode().startswith(
                f"elvin-subscribe: error: $ELVIN_URI (in the environment): {words}"), err)
        self.patch(os, "environ", dict(os.environ, ELVIN_URI="nonsense"))
        from elvin.tools import subscribe
        from elvin.tools.common import parse_options
        for args in (["-e", "elvin://h", "r"], ["--scope", "s", "r"]):
            self.assertIsNotNone(parse_options(subscribe.Options, args))
        self.patch(os, "environ", dict(os.environ, ELVIN_URI="elvin:/udp,none,xdr/h"))
        self.assertIsNotNone(parse_options(importlib.import_module("elvin.tools.notify")
                                           .Options, ["-u", "a: 1"]))

    def test_another_protocol_version_is_a_usage_error(self):
        for tool, args in (("notify", ["a: 1"]), ("subscribe", ["r"]), ("quench", ["n"])):
            err, code = self.usage_error(tool, "-e", "elvin:5.0//127.0.0.1:9", *args)
            self.assertEqual(code, 2)
            self.assertIn(b"-e/--elvin: elvin:5.0/tcp,none,xdr/127.0.0.1:9: protocol version "
                          b"5.0 is not supported (this implementation speaks the Elvin "
                          b"client protocol 4.0", err)
        self.assertIsNotNone(self.parsed("notify", "-e", "elvin:4.1//127.0.0.1:9", "a: 1"))

    def test_long_bad_values_are_cut_in_messages(self):
        """A bad value is echoed cut to 80 characters and its size: a
        megabyte pasted by mistake makes one readable line."""
        big = "x" * 2**20
        for tool, args, words in (
                ("subscribe", ["-n", big, "r"], "--count must be a whole number, not "),
                ("subscribe", ["-t", big, "r"], "--timeout must be a number, not "),
                ("subscribe", ["-e", big, "r"], "-e/--elvin: invalid Elvin URI "),
                ("subscribe", ["-e", big + ":1", "r"], "(did you mean elvin://xxx"),
                ("stat", ["-i", big], "--interval must be a number, not ")):
            err, code = self.usage_error(tool, *args)
            self.assertEqual(code, 2)
            self.assertIn(words.encode(), err)
            self.assertIn(f"... ({len(big)} bytes)".encode(), err)
            self.assertLess(len(err), 600, err[:200])
        from elvin.textformat import FormatError
        from elvin.tools.notify import _from_arguments
        for arg in (big, "A: " + big, "A: 1" + big, 'A: "' + big, "A: [" + big,
                    "A: " + "9" * 5000):
            with self.assertRaises(FormatError) as raised:
                _from_arguments([arg])
            self.assertLess(len(str(raised.exception)), 600, str(raised.exception)[:200])

    def parsed(self, tool, *args):
        from elvin.tools.common import parse_options
        return parse_options(importlib.import_module(f"elvin.tools.{tool}").Options,
                             list(args))

    @defer.inlineCallbacks
    def test_integer_out_of_range(self):
        out, err, code = yield self.tool_here("notify", "-e", self.uri,
                                         "Big: 99999999999999999999999")
        self.assertEqual(code, 1)
        self.assertIn(b"out of range", err)
        self.assertNotIn(b"not a value", err)

    @defer.inlineCallbacks
    def test_refused_names_the_uri(self):
        port = free_port()
        uri = f"elvin://127.0.0.1:{port}"
        out, err, code = yield self.tool_here("notify", "-e", uri, "a: 1")
        self.assertEqual(code, 1)
        self.assertIn(f"{uri}: connection refused".encode(), err)

    @defer.inlineCallbacks
    def test_one_message_for_a_router_shutdown(self):
        proc = self.spawn("subscribe", "-e", self.uri, "--ready", "require(n)")
        yield wait_until(lambda: b"ready" in proc.err, timeout=15)
        self.router.shutdown()
        out, err, code = yield self.wait_ended(proc)
        self.assertEqual(code, 1)
        lines = [l for l in err.decode().splitlines() if l != "ready"]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("router closed the connection (Disconn reason 1", lines[0])

    @defer.inlineCallbacks
    def test_quench_says_the_routers_reason(self):
        proc = self.spawn("quench", "-e", self.uri, "n")
        yield wait_until(lambda: any(s.quenches for s in self.router.sessions), timeout=15)
        self.router.shutdown()
        out, err, code = yield self.wait_ended(proc)
        self.assertEqual(code, 1)
        self.assertIn(b"router closed the connection (Disconn reason 1", err)
        self.assertNotIn(b"was lost", err)


class DefaultRouterTests(CLITestCase):
    """Item 11: without -e the tools use $ELVIN_URI (or localhost:2917)
    when a router answers there, before any multicast."""

    @defer.inlineCallbacks
    def test_elvin_uri_variable(self):
        received = yield self.collect("require(via)")
        env = dict(os.environ, ELVIN_URI=self.uri)
        out, err, code = yield self.tool_env(env, "notify", 'via: "ELVIN_URI"')
        self.assertEqual((code, err), (0, b""))
        yield wait_until(lambda: received, timeout=10)

    def tool_env(self, env, name, *args):
        from twisted.internet.utils import getProcessOutputAndValue
        return getProcessOutputAndValue(sys.executable, ["-m", f"elvin.tools.{name}"]
                                        + list(args), env=env, path=REPO)


class GapReporterTests(unittest.TestCase):
    """elvin-subscribe's lines about lost notifications, without a router."""

    def setUp(self):
        import io
        from elvin.clientcore.state import JoinedSession
        from elvin.tools.subscribe import GapReporter
        self.JoinedSession = JoinedSession
        self.err = io.StringIO()
        self.reporter = GapReporter(out=self.err)
        self.conn = type("Conn", (), {"sessions": {}})()

    def lines(self):
        lines, _ = self.err.getvalue().splitlines(), self.err.truncate(0)
        self.err.seek(0)
        return lines

    def test_a_join_with_drops_is_one_line_with_its_dropwarn_early_or_late(self):
        for early in (True, False):
            self.reporter._told.clear()
            self.conn.sessions = {"s": self.JoinedSession("s", stored=4, dropped=3)}
            if early:
                self.reporter.dropwarn()          # before connect returned
            self.reporter.conn = self.conn
            self.reporter.joined()
            if not early:
                self.reporter.dropwarn()
            (line,) = self.lines()
            self.assertIn("the proxy reports 3 notifications lost from session 's'", line)

    def test_a_later_dropwarn_and_a_rejoin_are_told_too(self):
        self.conn.sessions = {"s": self.JoinedSession("s")}
        self.reporter.conn = self.conn
        self.reporter.joined()
        self.assertEqual(self.lines(), [])        # nothing lost: nothing said
        self.reporter.dropwarn()
        (line,) = self.lines()
        self.assertIn("reports notifications lost here (a DropWarn", line)
        self.conn.sessions = {"s": self.JoinedSession("s", dropped=1)}   # joined again
        self.reporter.dropwarn()
        (line,) = self.lines()
        self.assertIn("reports 1 notification lost from session 's'", line)

    def test_gaps_of_unknown_size_are_not_told_as_notifications(self):
        """Proxy.Gaps of Proxy.Dropped are gaps (a restart, an outage),
        each counted as one: told apart from the notifications counted."""
        told = {}
        for dropped, gaps in ((1, 1), (7, 2), (3, None)):
            self.reporter.conn = self.conn
            self.conn.sessions = {"s2": self.JoinedSession("s2", dropped=dropped, gaps=gaps)}
            self.reporter.joined()
            (told[dropped],) = self.lines()
        self.assertIn("the proxy reports notifications lost from session 's2' in 1 gap of "
                      "unknown size while no client of it was connected (the proxy "
                      "restarting", told[1])
        self.assertNotIn("1 notification lost", told[1])
        self.assertIn("the proxy reports 5 notifications lost from session 's2', and more in "
                      "2 gaps of unknown size, while", told[7])
        self.assertIn("(a limit or a full disk; the proxy restarting", told[7])
        # a proxy that does not send Proxy.Gaps: its count, not called notifications
        self.assertIn("the proxy reports 3 lost from session 's2'", told[3])
        self.assertIn("gaps of unknown size, each counted as one", told[3])


class NotifyProgressTests(unittest.TestCase):
    """elvin-notify's account of how far a relay from stdin got
    (``notify.Progress``), on a stand-in connection."""

    def test_only_a_channel_s_own_confirmations_count(self):
        from types import SimpleNamespace
        from elvin.tools.notify import Progress
        lifecycle = SimpleNamespace(writes=(1, 1, 1))         # (written, confirmed, channel)
        progress = Progress(SimpleNamespace(lifecycle=lifecycle))
        for written, last in ((2, 3), (3, 6)):                # lines 1-3 and 4-6 sent
            lifecycle.writes = (written, 1, 1)
            progress.emitted(last)
        lifecycle.writes = (4, 2, 1)                          # a TestConn after the first
        self.assertEqual(progress.confirmed(), 3)
        lifecycle.writes = (5, 5, 2)         # redirected: the new channel settles the old
        progress.emitted(9)
        lifecycle.writes = (6, 6, 2)
        progress.read = 10
        self.assertEqual(progress.confirmed(), 3)             # lines 4-6 went unconfirmed
        self.assertEqual(progress.told(),
                         "the router confirmed having the notifications of <stdin> up to "
                         "line 3; those sent after, to line 9, may not have reached it; read "
                         "to line 10: resume from line 4 to send again what is not confirmed "
                         "(some may arrive twice), or from line 10 to send nothing twice "
                         "(some may be lost)")

    def test_everything_confirmed_or_nothing_sent(self):
        from types import SimpleNamespace
        from elvin.tools.notify import Progress
        lifecycle = SimpleNamespace(writes=(1, 1, 1))
        progress = Progress(SimpleNamespace(lifecycle=lifecycle))
        progress.read = 2                                     # a notification not ended
        self.assertEqual(progress.told(), "the router confirmed none of the notifications "
                                          "of <stdin>; read to line 2: resume from line 1")
        lifecycle.writes = (2, 1, 1)
        progress.emitted(3)
        progress.read = 4
        lifecycle.writes = (3, 3, 1)
        self.assertEqual(progress.told(), "the router confirmed having the notifications of "
                                          "<stdin> up to line 3; read to line 4: resume from "
                                          "line 4")
