"""What a newcomer meets in the first hour: the tools' and the router's
messages say what was wrong and what helps, in one line, and the log says
where things listen and why a link could not be made. In process (the
tools' parse and message functions, a status site on loopback port 0)."""

import io
import sys

from twisted.internet import defer, error, reactor, threads
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.python import usage
from twisted.trial import unittest

from elvin import config
from elvin.configvalues import ConfigError, did_you_mean
from elvin.core.router import Router
from elvin.errors import SubscriptionError
from elvin.federation import protocol as fedproto
from elvin.ops.web import StatusSite, status_root
from elvin.protocols.server import ElvinServerFactory
from elvin.subscription import Subscription
from elvin.subscription.analysis import names_compared
from elvin.subscription.parser import parse
from elvin.tools import config_example, stat
from elvin.tools.common import parse_options
from elvin.tools.notify import Options as NotifyOptions
from elvin.tools.subscribe import bare_name_warnings


class _Captured:
    """``sys.stdout``/``sys.stderr`` replaced for one call."""

    def __init__(self, case):
        self.out, self.err = io.StringIO(), io.StringIO()
        case.patch(sys, "stdout", self.out)
        case.patch(sys, "stderr", self.err)


class ToolUsageTests(unittest.TestCase):

    def usage_error(self, options_class, argv):
        captured = _Captured(self)
        with self.assertRaises(SystemExit) as raised:
            parse_options(options_class, argv)
        self.assertEqual(raised.exception.code, 2)
        return captured.err.getvalue()

    def test_usage_error_is_one_line_with_the_prefix(self):
        err = self.usage_error(NotifyOptions, ["-e", "http://nowhere", "a: 1"])
        first, hint = err.splitlines()
        self.assertTrue(first.startswith("elvin-notify: error: -e/--elvin: "), first)
        self.assertIn("http://nowhere", first)
        self.assertEqual(hint, "(see elvin-notify --help)")
        self.assertNotIn("Options:", err)

    def test_host_and_port_suggests_an_elvin_uri(self):
        err = self.usage_error(NotifyOptions, ["-e", "localhost:3999", "a: 1"])
        self.assertIn("(did you mean elvin://localhost:3999?)", err)
        err = self.usage_error(NotifyOptions, ["-e", "3999", "a: 1"])
        self.assertIn("(did you mean elvin://localhost:3999?)", err)

    def test_help_into_a_closed_pipe_ends_quietly(self):
        """``elvin-notify --help | head -1``: no BrokenPipeError traceback."""
        class ClosedPipe(io.StringIO):
            def write(self, text):
                raise BrokenPipeError(32, "Broken pipe")

            def fileno(self):
                raise ValueError("no file")
        self.patch(sys, "stdout", ClosedPipe())
        for flag in ("--help", "--version"):
            with self.assertRaises(SystemExit) as raised:
                parse_options(NotifyOptions, [flag])
            self.assertEqual(raised.exception.code, 0)

    def test_config_example_version(self):
        import elvin
        captured = _Captured(self)
        config_example.main(["--version"])
        self.assertEqual(captured.out.getvalue().strip(),
                         f"elvin-config-example (elvin) {elvin.__version__}")


class ToolErrorTests(unittest.TestCase):

    def test_an_error_without_text_is_named_by_its_type(self):
        from elvin.tools.common import describe_error
        self.assertEqual(describe_error(AssertionError()), "AssertionError")
        self.assertEqual(describe_error(ValueError("bad")), "bad")

    def test_tls_trust_advice_is_the_tools(self):
        """The tools take no tls_ca: their advice is SSL_CERT_FILE."""
        from elvin import client
        from elvin.tools.common import describe_error
        closed = client.ConnectionClosed("connection to the router at x was lost: "
                                         "certificate verify failed")
        uri = client.ElvinURI("elvin:/secure/127.0.0.1:31643")
        message = client._handshake_lost(uri, client.Connection(uri, reactor=Clock()),
                                          closed)
        self.assertIn("tls_ca", message)
        shown = describe_error(client.ConnectFailed(message))
        self.assertNotIn("tls_ca", shown)
        self.assertIn("SSL_CERT_FILE=", shown)

    def test_no_http_response_is_a_sentence(self):
        """twisted.web's failures carry a list of Failures: said in words,
        not as their repr."""
        from twisted.python.failure import Failure
        from twisted.web._newclient import ResponseNeverReceived
        from elvin import client
        uri = client.ElvinURI("elvin:/http,none,xdr/127.0.0.1:31644")
        message = client._cannot_connect(
            uri, ResponseNeverReceived([Failure(error.ConnectionLost("lost"))]))
        self.assertNotIn("Failure", message)
        self.assertIn("no HTTP response (Connection to the other side was lost", message)
        self.assertIn("use elvin://127.0.0.1:31644", message)

    def test_json_is_named_as_not_the_format(self):
        from elvin.textformat import FormatError, parse_line
        with self.assertRaises(FormatError) as raised:
            parse_line('{"Group": "chat"}')
        self.assertIn("looks like JSON", str(raised.exception))
        self.assertIn("'Name: value' per line", str(raised.exception))
        self.assertNotIn("unterminated", str(raised.exception))

    def test_unsupported_stack_is_a_usage_error(self):
        err = ToolUsageTests.usage_error(self, NotifyOptions,
                                         ["-e", "elvin:/sctp,none,xdr/localhost:2917", "a: 1"])
        self.assertIn("protocol stack sctp,none,xdr is not supported", err)

    def test_status_line_without_a_domain(self):
        totals = dict(connections_open=0, connections_by_transport={}, nacks={},
                      deliveries=0, dropped_deliveries=0, notifications_received=0,
                      notifications_rejected=0, quenches=0, send_queue_bytes=0,
                      subscriptions=0)
        status = {"router": {"domain": None, "version": "0.1.0", "uptime_s": 5,
                             "listeners": ["elvin://localhost:2917"], "drained_to": None},
                  "totals": totals, "links": []}
        first = stat.format_status(status).splitlines()[0]
        self.assertTrue(first.startswith("router version 0.1.0, up 5 s"), first)

    def test_refused_by_an_http_proxy_names_the_proxy(self):
        from elvin import client
        uri = client.ElvinURI("elvin:/http,none,xdr/router.test:80;proxy-host=proxy.test;"
                              "proxy-port=3128")
        message = client._cannot_connect(uri, error.ConnectionRefusedError())
        self.assertIn("the HTTP proxy at proxy.test:3128 refused the connection", message)
        self.assertNotIn("router running", message)


class StatUsageTests(unittest.TestCase):

    def test_bare_port_and_host_port(self):
        self.assertEqual(stat.status_url("9913"), "http://127.0.0.1:9913")
        self.assertEqual(stat.status_url("example.com:9913/"), "http://example.com:9913")
        self.assertEqual(stat.status_url("https://h:1"), "https://h:1")

    def test_an_elvin_uri_is_named_as_the_wrong_kind(self):
        for text in ("elvin://localhost:2917", "elvin:/tcp,none,xdr/h:1"):
            with self.assertRaises(usage.UsageError) as raised:
                stat.status_url(text)
            self.assertIn("status listener", str(raised.exception))
            self.assertIn("not an elvin: URI", str(raised.exception))

    def test_port_out_of_range(self):
        for text in ("99999", "h:70000", "h:0"):
            with self.assertRaises(usage.UsageError) as raised:
                stat.status_url(text)
            self.assertIn("1 to 65535", str(raised.exception))

    def test_token_messages_say_what_helps(self):
        self.assertIn("give --token", stat.refused(401, None))
        wrong = stat.refused(401, "guess")
        self.assertIn("refused the token given", wrong)
        self.assertNotIn("give --token", wrong)


class StatAgainstAListenerTests(unittest.TestCase):
    """elvin-stat's --reload against a status listener on loopback."""

    def listen(self, token, reload=None):
        site = StatusSite(status_root(Router(), token=token, reload=reload))
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return f"http://127.0.0.1:{port.getHost().port}"

    @defer.inlineCallbacks
    def test_reload_without_a_status_token_says_none_can_help(self):
        base = self.listen(None)
        captured = _Captured(self)
        code = yield threads.deferToThread(stat.reload, base, "anything")
        self.assertEqual(code, 1)
        err = captured.err.getvalue()
        self.assertTrue(err.startswith("elvin-stat: error: HTTP 404"), err)
        self.assertIn("no status-token set", err)
        self.assertNotIn("give --token", err)

    @defer.inlineCallbacks
    def test_reload_with_a_wrong_token(self):
        base = self.listen("right", reload=lambda: defer.succeed("reloaded"))
        captured = _Captured(self)
        code = yield threads.deferToThread(stat.reload, base, "wrong")
        self.assertEqual(code, 1)
        self.assertIn("refused the token given", captured.err.getvalue())


class MessageTests(unittest.TestCase):

    def test_misspelt_setting(self):
        with self.assertRaises(ConfigError) as raised:
            config.parse("lisen = elvin://localhost:2917")
        self.assertIn("unknown setting 'lisen' (did you mean 'listen'?)", str(raised.exception))
        self.assertEqual(did_you_mean("zzz", ["listen"]), "")

    def test_misspelt_federation_discovery_and_proxy_settings(self):
        from elvin.proxy.config import parse_proxy_config
        for read, text, hint in (
                (config.parse, "Federation.Activatd = yes", "'Federation.Activated'"),
                (config.parse, "Federation.Conect[P] = ewaf://h:1", "'Federation.Connect[P]'"),
                (config.parse, "discovery-scop = x", "'discovery-scope'"),
                (parse_proxy_config, "upstrem = elvin://h:1", "'upstream'")):
            with self.assertRaises(ConfigError) as raised:
                read(text)
            self.assertIn(f"(did you mean {hint}?)", str(raised.exception))

    def test_listen_port_out_of_range(self):
        with self.assertRaises(ConfigError) as raised:
            config.parse("listen = elvin://localhost:99999")
        self.assertIn("must be 1-65535", str(raised.exception))

    def test_bad_redirect_to_names_its_setting(self):
        with self.assertRaises(ConfigError) as raised:
            config.parse("listen = elvin://localhost:2917\nredirect-to = nowhere", "t.conf")
        self.assertTrue(str(raised.exception).startswith("t.conf:2: bad redirect-to URI: "),
                        str(raised.exception))

    def test_federation_filter_error_says_the_offset_once(self):
        with self.assertRaises(ConfigError) as raised:
            config.parse("Federation.Subscribe[X] = require(", "t.conf")
        self.assertEqual(str(raised.exception).count("offset"), 1, str(raised.exception))
        self.assertTrue(str(raised.exception).startswith(
            "t.conf:1: bad Federation.Subscribe[X] filter"), str(raised.exception))

    def test_single_equals_hints_double(self):
        with self.assertRaises(SubscriptionError) as raised:
            Subscription('Group = "chat"')
        message = str(raised.exception)
        self.assertIn("(equality is '==')", message)
        self.assertEqual(message.count("offset 6"), 1, message)

    def test_two_bare_names_compared(self):
        tree = parse('Group == chat || (x != y && z == "z")').tree
        self.assertEqual(names_compared(tree), [("Group", "==", "chat"), ("x", "!=", "y")])
        (warning,) = bare_name_warnings("Group == chat")
        self.assertIn('quote it: Group == "chat"', warning)
        self.assertEqual(bare_name_warnings('Group == "chat"'), [])
        self.assertEqual(bare_name_warnings("Group ="), [])     # the router names that


class LogTests(unittest.TestCase):

    def test_factories_are_quiet(self):
        for factory in (ElvinServerFactory, StatusSite, fedproto.ConnectorFactory,
                        fedproto.AcceptorFactory):
            self.assertFalse(factory.noisy, factory)

    def test_status_page_logs_its_url(self):
        events = []
        site = StatusSite(status_root(Router()))
        site.events = Logger(observer=events.append)
        site.url = "http://127.0.0.1:9918/"
        site.doStart()
        self.addCleanup(site.doStop)
        self.assertEqual([e["url"] for e in events], ["http://127.0.0.1:9918/"])

    def test_failed_federation_dial_is_logged_with_its_reason(self):
        events = []
        self.patch(fedproto._ReasonLogged, "log", Logger(observer=events.append))
        clock = Clock()

        class Refusing:
            def connect(self, factory):
                return defer.fail(error.ConnectionRefusedError("no one home"))
        service = fedproto.connector_service(clock, Refusing(),
                                             fedproto.ConnectorFactory(None, None),
                                             name="ewaf://peer.test:2916")
        service.startService()
        self.addCleanup(service.stopService)
        (event,) = events
        self.assertEqual(event["peer"], "ewaf://peer.test:2916")
        self.assertIn("no one home", event["reason"])


class SuiteSettingsTests(unittest.TestCase):

    def test_property_tests_have_no_deadline(self):
        """elvin.test sets Hypothesis's settings once for every module: no
        property test fails because the machine was busy."""
        from hypothesis import HealthCheck, settings
        self.assertIsNone(settings.default.deadline)
        self.assertIn(HealthCheck.too_slow, settings.default.suppress_health_check)
        self.assertIsNone(settings(max_examples=3).deadline)
