"""Tests for elvin.config: the router's configuration file."""

import os

from twisted.trial import unittest

from elvin import config
from elvin.config import ConfigError, RouterConfig
from elvin.core.options import OPTIONS
from elvin.uri import ElvinURI
from elvin.test.places import REPO

EXAMPLE = os.path.join(REPO, "conf", "elvind.conf")


def known_settings():
    """The setting names the configuration understands, from the list its
    'unknown setting' error gives."""
    try:
        config.parse("no-such-setting = 1")
    except ConfigError as e:
        listed = str(e).split("(known: ", 1)[1].split("; also ", 1)[0]
        return [name.strip() for name in listed.split(",")]
    raise AssertionError("an unknown setting was accepted")


class DefaultsTests(unittest.TestCase):

    def test_defaults(self):
        c = RouterConfig()
        self.assertEqual(c.listen, [])
        self.assertFalse(c.verbose)
        self.assertEqual(c.max_connections, 10_000)
        self.assertEqual(c.max_subscriptions, 1_000_000)
        self.assertEqual(c.connect_timeout, 30.0)
        self.assertIsNone(c.source)
        for name, spec in OPTIONS.items():
            self.assertEqual(c.option_specs[name].default, spec.default, name)

    def test_empty_text(self):
        c = config.parse("")
        self.assertEqual(c.listen, [])
        self.assertEqual(c.source, "<config>")

    def test_option_specs_are_a_copy(self):
        """Changing a default in one config leaves OPTIONS and others alone."""
        before = OPTIONS["Send-Queue.Max-Length"].default
        c = config.parse("Send-Queue.Max-Length = 4096\n")
        self.assertEqual(c.option_specs["Send-Queue.Max-Length"].default, 4096)
        self.assertEqual(OPTIONS["Send-Queue.Max-Length"].default, before)
        self.assertEqual(RouterConfig().option_specs["Send-Queue.Max-Length"].default,
                         before)


class ParseTests(unittest.TestCase):

    def test_comments_and_blank_lines(self):
        text = ("# a comment\n"
                "\n"
                "   \n"
                "   # an indented comment\n"
                "verbose = yes   # trailing comment\n"
                "\t\n")
        c = config.parse(text, "x.conf")
        self.assertTrue(c.verbose)
        self.assertEqual(c.listen, [])
        self.assertEqual(c.source, "x.conf")

    def test_repeated_listen(self):
        c = config.parse("listen = elvin://localhost:2917\n"
                         "listen = elvin:4.0/tcp,none,xdr/[::1]:2918\n"
                         "listen=elvin:/tcp,none,xdr/0.0.0.0:2919\n")
        self.assertEqual(c.listen, [ElvinURI("elvin://localhost:2917"),
                                    ElvinURI("elvin:4.0/tcp,none,xdr/[::1]:2918"),
                                    ElvinURI("elvin:/tcp,none,xdr/0.0.0.0:2919")])
        self.assertEqual([(u.host, u.port) for u in c.listen],
                         [("localhost", 2917), ("::1", 2918), ("0.0.0.0", 2919)])

    def test_every_router_setting(self):
        c = config.parse("verbose = on\n"
                         "max-connections = 12\n"
                         "max-subscriptions = 0x100\n"
                         "connect-timeout = 2.5\n")
        self.assertTrue(c.verbose)
        self.assertEqual(c.max_connections, 12)
        self.assertEqual(c.max_subscriptions, 256)
        self.assertEqual(c.connect_timeout, 2.5)

    def test_setting_names_case_insensitive(self):
        c = config.parse("Verbose = yes\nMAX-CONNECTIONS = 3\nListen = elvin://h\n")
        self.assertTrue(c.verbose)
        self.assertEqual(c.max_connections, 3)
        self.assertEqual(c.listen, [ElvinURI("elvin://h")])

    def test_connect_timeout_zero(self):
        """Zero disables the timeout for silent channels."""
        self.assertEqual(config.parse("connect-timeout = 0").connect_timeout, 0.0)

    def test_booleans(self):
        for word in ("yes", "true", "on", "1", "YES", "True"):
            self.assertTrue(config.parse(f"verbose = {word}").verbose, word)
        for word in ("no", "false", "off", "0", "No"):
            self.assertFalse(config.parse(f"verbose = {word}").verbose, word)

    def test_later_setting_wins(self):
        c = config.parse("max-connections = 5\nmax-connections = 7\n")
        self.assertEqual(c.max_connections, 7)

    def test_connection_options(self):
        c = config.parse("Send-Queue.Max-Length = 4096\n"
                         "Send-Queue.Drop-Policy = newest\n"
                         "Receive-Queue.Drop-Policy = largest\n"
                         "Subscription.Max-Count = 16\n"
                         "TCP.Send-Immediately = 1\n")
        specs = c.option_specs
        self.assertEqual(specs["Send-Queue.Max-Length"].default, 4096)
        self.assertEqual(specs["Send-Queue.Drop-Policy"].default, "newest")
        self.assertEqual(specs["Receive-Queue.Drop-Policy"].default, "largest")
        self.assertEqual(specs["Subscription.Max-Count"].default, 16)
        self.assertEqual(specs["TCP.Send-Immediately"].default, 1)
        # The range a client may negotiate within is unchanged.
        for name in ("Send-Queue.Max-Length", "Subscription.Max-Count"):
            self.assertEqual((specs[name].low, specs[name].high),
                             (OPTIONS[name].low, OPTIONS[name].high))
        # Options not mentioned keep their defaults.
        self.assertEqual(specs["Packet.Max-Length"].default,
                         OPTIONS["Packet.Max-Length"].default)

    def test_every_connection_option_at_its_bounds(self):
        for name, spec in OPTIONS.items():
            if spec.kind is int:
                for value in (spec.low, spec.high):
                    c = config.parse(f"{name} = {value}")
                    self.assertEqual(c.option_specs[name].default, value, name)
            else:
                for value in spec.choices:
                    c = config.parse(f"{name} = {value}")
                    self.assertEqual(c.option_specs[name].default, value, name)

    def test_ceilings(self):
        """``<option>.Ceiling`` sets the most a client may negotiate, up to
        what the router can hold; the default must lie below it."""
        from elvin.core.options import ConnectionOptions, HARD_CEILINGS
        c = config.parse("Subscription.Max-Length.Ceiling = 1048576\n"
                         "Packet.Max-Length = 0x8000\n"
                         "Packet.Max-Length.Ceiling = 0x10000\n")
        options = ConnectionOptions(c.option_specs)
        reply = options.negotiate({"Subscription.Max-Length": 2 ** 30,
                                   "Packet.Max-Length": 2 ** 30})
        self.assertEqual(reply["Subscription.Max-Length"], 1048576)
        self.assertEqual(reply["Packet.Max-Length"], 0x10000)
        for line, message in (
                ("Packet.Max-Length.Ceiling = 67108865",
                 "<config>:1: Packet.Max-Length.Ceiling must be at most 67108864, "
                 "not 67108865"),
                ("Packet.Max-Length.Ceiling = 4096",
                 "<config>:1: Packet.Max-Length.Ceiling (4096) is below "
                 "Packet.Max-Length's default (2097152)"),
                ("Packet.Max-Length.Ceiling = lots",
                 "<config>:1: Packet.Max-Length.Ceiling must be an integer, not 'lots'"),
                ("Send-Queue.Drop-Policy.Ceiling = 3",
                 "<config>:1: unknown setting 'Send-Queue.Drop-Policy.Ceiling'")):
            with self.assertRaises(ConfigError) as cm:
                config.parse(line)
            self.assertTrue(str(cm.exception).startswith(message), str(cm.exception))
        with self.assertRaises(ConfigError) as cm:
            config.parse("Packet.Max-Length = 4096\nPacket.Max-Length.Ceiling = 65536\n"
                         "Packet.Max-Length = 70000\n")
        self.assertIn("<config>:3: Packet.Max-Length must be at most 65536", str(cm.exception))
        for name, hard in HARD_CEILINGS.items():
            self.assertLessEqual(OPTIONS[name].high, hard, name)

    def test_built_in_ceilings(self):
        """What one client may ask for by default: enough for real use,
        not enough to hold the router (docs/router.md)."""
        self.assertEqual(OPTIONS["Subscription.Max-Length"].high, 65536)
        self.assertEqual(OPTIONS["Subscription.Max-Count"].high, 100_000)
        self.assertEqual(OPTIONS["Packet.Max-Length"].high, 16 * 1024 * 1024)

    def test_subscription_budgets(self):
        c = config.parse("max-subscription-tokens = 100\n"
                         "max-client-subscription-bytes = 0\n")
        self.assertEqual((c.max_subscription_tokens, c.max_client_subscription_bytes),
                         (100, 0))

    def test_connection_options_reach_sessions(self):
        """A configured default is what a new connection starts with."""
        from elvin.core.options import ConnectionOptions
        c = config.parse("Send-Queue.Max-Length = 4096\nSend-Queue.Drop-Policy = newest\n")
        options = ConnectionOptions(c.option_specs)
        self.assertEqual(options["Send-Queue.Max-Length"], 4096)
        self.assertEqual(options["Send-Queue.Drop-Policy"], "newest")

    def test_whitespace_around_name_and_value(self):
        c = config.parse("   max-connections   =    9   \n")
        self.assertEqual(c.max_connections, 9)

    def test_value_with_equals(self):
        """Only the first '=' separates name from value (URI options use '=')."""
        c = config.parse("listen = elvin:/http,none,xdr/localhost:8080;mode=poll\n")
        self.assertEqual(c.listen[0].options, {"mode": "poll"})

    def test_parse_into_existing_config(self):
        c = RouterConfig()
        c.max_connections = 3
        result = config.parse("verbose = yes", "f", c)
        self.assertIs(result, c)
        self.assertTrue(c.verbose)
        self.assertEqual(c.max_connections, 3)

    def test_crlf_line_endings(self):
        c = config.parse("verbose = yes\r\nmax-connections = 4\r\n")
        self.assertTrue(c.verbose)
        self.assertEqual(c.max_connections, 4)


class TransportSettingsTests(unittest.TestCase):
    """Settings for the TLS listeners and the HTTP tunnel."""

    def test_defaults(self):
        c = RouterConfig()
        self.assertIsNone(c.tls_certificate)
        self.assertIsNone(c.tls_key)
        self.assertIsNone(c.tls_ca)
        self.assertFalse(c.require_authenticated)
        self.assertEqual(c.http_session_timeout, 60.0)
        self.assertEqual(c.http_poll_timeout, 20.0)

    def test_parse(self):
        c = config.parse("tls-certificate = /etc/elvin/router.pem\n"
                         "tls-key = /etc/elvin/router.key\n"
                         "TLS-CA = /etc/elvin/clients-ca.pem\n"
                         "require-authenticated = yes\n"
                         "http-session-timeout = 90\n"
                         "http-poll-timeout = 2.5\n")
        self.assertEqual(c.tls_certificate, "/etc/elvin/router.pem")
        self.assertEqual(c.tls_key, "/etc/elvin/router.key")
        self.assertEqual(c.tls_ca, "/etc/elvin/clients-ca.pem")
        self.assertTrue(c.require_authenticated)
        self.assertEqual(c.http_session_timeout, 90.0)
        self.assertEqual(c.http_poll_timeout, 2.5)

    def test_relative_paths_follow_the_file(self):
        """A relative TLS path in a file is relative to that file's folder."""
        folder = self.mktemp()
        os.mkdir(folder)
        path = os.path.join(folder, "router.conf")
        with open(path, "w", encoding="utf-8") as f:
            f.write("tls-certificate = router.pem\ntls-ca = /abs/ca.pem\n")
        c = config.load(path)
        self.assertEqual(c.tls_certificate, os.path.join(folder, "router.pem"))
        self.assertEqual(c.tls_ca, "/abs/ca.pem")

    def test_relative_path_from_text(self):
        self.assertEqual(config.parse("tls-key = k.pem").tls_key, "k.pem")

    def test_errors(self):
        for text, fragment in [("require-authenticated = sometimes", "yes or no"),
                               ("http-session-timeout = soon", "number of seconds"),
                               ("http-poll-timeout = 0", "more than 0"),
                               ("http-poll-timeout = -1", "more than 0")]:
            with self.assertRaises(ConfigError) as cm:
                config.parse("# tunnel\n" + text, "t.conf")
            self.assertTrue(str(cm.exception).startswith("t.conf:2: "), text)
            self.assertIn(fragment, str(cm.exception))


class ErrorTests(unittest.TestCase):
    """Every error is a ConfigError naming the file and line."""

    def assertConfigError(self, text, line, *fragments, filename="router.conf"):
        with self.assertRaises(ConfigError) as cm:
            config.parse(text, filename)
        message = str(cm.exception)
        self.assertTrue(message.startswith(f"{filename}:{line}: "), message)
        for fragment in fragments:
            self.assertIn(fragment, message)
        return message

    def test_long_values_are_cut(self):
        """A bad value, name or line is echoed cut to 80 characters and
        its size: a megabyte pasted by mistake makes one readable line."""
        big = "x" * 2**20
        for text in (f"max-connections = {big}", f"verbose = {big}",
                     f"max-turn-time = {big}", f"listen = {big}", f"redirect-to = {big}",
                     f"{big} = 1", f"Federation.{big} = 1", f"Federation.X[{big}] = 1",
                     f"discovery-{big} = 1", f"discovery-group = {big}", f"status-listen = {big}",
                     f"Federation.Listen = ewaf://{big}:1:2", big,
                     f"max-connections = -{'9' * 5000}"):
            with self.assertRaises(ConfigError) as cm:
                config.parse(text, "router.conf")
            message = str(cm.exception)
            self.assertTrue(message.startswith("router.conf:1: "), message[:200])
            self.assertLess(len(message), 3000, message[:300])   # lists of names aside
            self.assertIn(" bytes)", message)

    def test_is_value_error(self):
        self.assertTrue(issubclass(ConfigError, ValueError))

    def test_unknown_setting(self):
        message = self.assertConfigError("# ok\n\nlisen = elvin://h\n", 3,
                                         "unknown setting", "'lisen'")
        # The message lists what is known.
        self.assertIn("listen", message)
        self.assertIn("Send-Queue.Max-Length", message)

    def test_connection_option_names_are_exact(self):
        self.assertConfigError("send-queue.max-length = 4096", 1, "unknown setting")

    def test_missing_equals(self):
        self.assertConfigError("verbose = yes\nmax-connections 5\n", 2,
                               "expected 'name = value'", "max-connections 5")

    def test_missing_name(self):
        self.assertConfigError("= 5", 1, "missing setting name")

    def test_missing_value(self):
        self.assertConfigError("verbose = yes\n\nmax-connections =\n", 3,
                               "missing value", "max-connections")

    def test_value_is_only_a_comment(self):
        self.assertConfigError("max-connections = # none\n", 1, "missing value")

    def test_bad_uri(self):
        self.assertConfigError("listen = elvin://localhost:2917\nlisten = http://x\n", 2,
                               "bad listen URI", "http://x")

    def test_bad_port(self):
        self.assertConfigError("listen = elvin://localhost:99999", 1, "bad listen URI")

    def test_bad_integer(self):
        self.assertConfigError("max-connections = lots", 1,
                               "max-connections", "must be an integer", "'lots'")

    def test_bad_integer_connection_option(self):
        self.assertConfigError("\nSend-Queue.Max-Length = 4k\n", 2,
                               "Send-Queue.Max-Length", "must be an integer")

    def test_float_is_not_an_integer(self):
        self.assertConfigError("max-subscriptions = 1.5", 1, "must be an integer")

    def test_below_minimum(self):
        self.assertConfigError("max-connections = 0", 1, "at least 1", "not 0")
        self.assertConfigError("max-subscriptions = -3", 1, "at least 1")

    def test_option_below_minimum(self):
        low = OPTIONS["Send-Queue.Max-Length"].low
        self.assertConfigError(f"Send-Queue.Max-Length = {low - 1}", 1,
                               "Send-Queue.Max-Length", f"at least {low}")

    def test_option_above_maximum(self):
        high = OPTIONS["Send-Queue.Max-Length"].high
        self.assertConfigError(f"#\nSend-Queue.Max-Length = {high + 1}", 2,
                               "Send-Queue.Max-Length", f"at most {high}",
                               f"not {high + 1}")

    def test_every_integer_option_range_checked(self):
        for name, spec in OPTIONS.items():
            if spec.kind is not int:
                continue
            self.assertConfigError(f"{name} = {spec.low - 1}", 1, name, "at least")
            self.assertConfigError(f"{name} = {spec.high + 1}", 1, name, "at most")

    def test_bad_drop_policy(self):
        self.assertConfigError("Send-Queue.Drop-Policy = random", 1,
                               "Send-Queue.Drop-Policy", "oldest", "newest",
                               "largest", "none", "'random'")
        self.assertConfigError("\n\nReceive-Queue.Drop-Policy = 1", 3,
                               "Receive-Queue.Drop-Policy")

    def test_drop_policy_is_case_sensitive(self):
        self.assertConfigError("Send-Queue.Drop-Policy = Newest", 1,
                               "Send-Queue.Drop-Policy")

    def test_bad_boolean(self):
        self.assertConfigError("verbose = maybe", 1, "verbose", "yes or no", "'maybe'")

    def test_protocol_error_rate(self):
        parsed = config.parse("max-protocol-errors = 7\nprotocol-error-window = 2.5\n")
        self.assertEqual((parsed.max_protocol_errors, parsed.protocol_error_window), (7, 2.5))
        self.assertEqual(config.parse("max-protocol-errors = 0").max_protocol_errors, 0)
        default = RouterConfig()
        self.assertEqual((default.max_protocol_errors, default.protocol_error_window),
                         (50, 10.0))
        self.assertConfigError("max-protocol-errors = -1", 1, "max-protocol-errors",
                               "at least 0")
        self.assertConfigError("protocol-error-window = 0", 1, "protocol-error-window",
                               "more than 0")
        self.assertConfigError("protocol-error-window = inf", 1, "protocol-error-window",
                               "more than 0")

    def test_bad_connect_timeout(self):
        self.assertConfigError("connect-timeout = soon", 1, "connect-timeout",
                               "number of seconds")
        self.assertConfigError("connect-timeout = -1", 1, "connect-timeout",
                               "negative")

    def test_settings_that_need_another_name_their_line(self):
        """A setting refused for want of another is named with its line."""
        self.assertConfigError("listen = elvin://h:1\n# a comment\ndrain = yes\n", 3,
                               "drain = yes needs redirect-to")
        self.assertConfigError("Federation.Connect[K] = ewaf://h:1\n"
                               "Federation.Default-Class = L\n", 2,
                               "Federation.Default-Class names unknown class 'L'")
        self.assertConfigError("verbose = yes\nFederation.Connect[K] = ewaf://h:1\n"
                               "Federation.Require-Authenticated[K] = yes\n", 3,
                               "Federation.Require-Authenticated needs tls-ca")

    def test_first_error_stops(self):
        """A bad line stops parsing: nothing after it is applied."""
        c = RouterConfig()
        self.assertRaises(ConfigError, config.parse,
                          "max-connections = 5\nbogus = 1\nverbose = yes\n", "f", c)
        self.assertFalse(c.verbose)


class LoadTests(unittest.TestCase):

    def write(self, data, mode="w"):
        path = self.mktemp()
        kwargs = {} if "b" in mode else {"encoding": "utf-8"}
        with open(path, mode, **kwargs) as f:
            f.write(data)
        return path

    def test_load(self):
        path = self.write("# router\nlisten = elvin://localhost:3917\n"
                          "listen = elvin://127.0.0.1:3918\nverbose = yes\n"
                          "Send-Queue.Drop-Policy = newest\n")
        c = config.load(path)
        self.assertEqual(c.source, path)
        self.assertEqual([u.port for u in c.listen], [3917, 3918])
        self.assertTrue(c.verbose)
        self.assertEqual(c.option_specs["Send-Queue.Drop-Policy"].default, "newest")

    def test_load_utf8(self):
        path = self.write("# réglages du routeur — ok\nmax-connections = 2\n")
        self.assertEqual(config.load(path).max_connections, 2)

    def test_byte_order_mark_is_accepted(self):
        """A UTF-8 byte order mark (Notepad writes one) is not part of the
        first setting's name, for the router and the proxy alike."""
        from elvin.proxy.config import load_proxy_config
        path = self.write("\ufeffmax-connections = 2\n".encode("utf-8"), mode="wb")
        self.assertEqual(config.load(path).max_connections, 2)
        path = self.write("\ufeffmax-sessions = 3\n".encode("utf-8"), mode="wb")
        self.assertEqual(load_proxy_config(path).max_sessions, 3)

    def test_load_into_config(self):
        c = RouterConfig()
        path = self.write("max-subscriptions = 10\n")
        self.assertIs(config.load(path, c), c)
        self.assertEqual(c.max_subscriptions, 10)

    def test_error_names_file_and_line(self):
        path = self.write("verbose = yes\n\n# x\nmax-connections = none\n")
        with self.assertRaises(ConfigError) as cm:
            config.load(path)
        self.assertTrue(str(cm.exception).startswith(f"{path}:4: "), str(cm.exception))

    def test_missing_file(self):
        path = self.mktemp()
        with self.assertRaises(ConfigError) as cm:
            config.load(path)
        message = str(cm.exception)
        self.assertTrue(message.startswith(f"{path}: "), message)
        self.assertIn("cannot read", message)
        self.assertIn("No such file", message)

    def test_directory(self):
        path = self.mktemp()
        os.mkdir(path)
        with self.assertRaises(ConfigError) as cm:
            config.load(path)
        self.assertTrue(str(cm.exception).startswith(f"{path}: cannot read"))

    def test_path_through_a_file(self):
        parent = self.write("verbose = yes\n")
        path = os.path.join(parent, "child.conf")
        with self.assertRaises(ConfigError) as cm:
            config.load(path)
        message = str(cm.exception)
        self.assertTrue(message.startswith(f"{path}: cannot read"), message)
        self.assertIn("Not a directory", message)

    def test_unreadable_file(self):
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            raise unittest.SkipTest("root can read a file with mode 000")
        path = self.write("verbose = yes\n")
        os.chmod(path, 0)
        self.addCleanup(os.chmod, path, 0o600)
        with self.assertRaises(ConfigError) as cm:
            config.load(path)
        message = str(cm.exception)
        self.assertTrue(message.startswith(f"{path}: cannot read"), message)
        self.assertIn("Permission denied", message)

    def test_not_utf8(self):
        path = self.write(b"verbose = yes\n# caf\xe9\n", mode="wb")
        with self.assertRaises(ConfigError) as cm:
            config.load(path)
        message = str(cm.exception)
        self.assertTrue(message.startswith(f"{path}: "), message)
        self.assertIn("not UTF-8", message)


class ExampleFileTests(unittest.TestCase):
    """conf/elvind.conf, the documented example, loads as shipped."""

    def test_example_loads(self):
        c = config.load(EXAMPLE)
        self.assertEqual(c.listen, [ElvinURI("elvin://localhost:2917")])
        # Everything else is commented out, so defaults hold.
        default = RouterConfig()
        self.assertEqual(c.verbose, default.verbose)
        self.assertEqual(c.max_connections, default.max_connections)
        self.assertEqual(c.max_subscriptions, default.max_subscriptions)
        self.assertEqual(c.connect_timeout, default.connect_timeout)
        for name, value in vars(default).items():
            simple = value is None or isinstance(value, (bool, int, float, str, list, tuple))
            if simple and name not in ("listen", "source"):
                self.assertEqual(getattr(c, name), value, name)
        for name, spec in OPTIONS.items():
            self.assertEqual(c.option_specs[name].default, spec.default, name)

    def example_settings(self):
        """The commented-out ``# name = value`` lines of the example."""
        settings = []
        with open(EXAMPLE, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                stripped = line.strip()
                if stripped.startswith("#") and "=" in stripped:
                    body = stripped.lstrip("#").strip()
                    name = body.split("=", 1)[0].strip()
                    if name and " " not in name:
                        settings.append((number, body))
        return settings

    def test_example_mentions_every_setting(self):
        """Every setting the router knows (as its 'unknown setting' error
        lists them) appears in the example, so a new setting needs a line
        there too."""
        names = {body.split("=", 1)[0].strip().lower()
                 for _, body in self.example_settings()}
        names.add("listen")
        known = known_settings()
        for name in ["listen", "verbose", "max-connections", "max-subscriptions",
                     "connect-timeout"] + list(OPTIONS):
            self.assertIn(name, known)
        for name in known:
            self.assertIn(name.lower(), names, f"{name} is not in {EXAMPLE}")

    def test_example_commented_settings_are_valid(self):
        """Uncommenting any example line gives a valid configuration, so
        the documented defaults are real values, not placeholders."""
        for number, body in self.example_settings():
            try:
                config.parse(body, f"{EXAMPLE}:{number}")
            except ConfigError as e:
                self.fail(f"example line {number} {body!r}: {e}")

    def test_example_documents_option_defaults(self):
        """Each connection option appears with its real default."""
        found = {}
        for _, body in self.example_settings():
            name, value = (part.strip() for part in body.split("=", 1))
            value = value.split("#", 1)[0].strip()
            if name in OPTIONS:
                found[name] = value
        for name, spec in OPTIONS.items():
            self.assertIn(name, found)
            self.assertEqual(found[name], str(spec.default), name)


class ReferenceTableTests(unittest.TestCase):
    """docs/router.md's table of router settings is the settings table."""

    def test_docs_show_the_generated_rows(self):
        with open(os.path.join(REPO, "docs", "router.md"), encoding="utf-8") as f:
            doc = f.read()
        self.assertIn(config.reference_table() + "\n", doc,
                      "regenerate the rows with: python -m elvin.config")

    def test_every_setting_is_known_and_has_its_default(self):
        fresh = RouterConfig()
        for setting in config.ROUTER_SETTINGS:
            self.assertEqual(getattr(fresh, setting.attr), setting.default, setting.name)
        with self.assertRaises(ConfigError) as cm:
            config.parse("nonsense = 1")
        for setting in config.ROUTER_SETTINGS:
            self.assertIn(setting.name, str(cm.exception))


class FederationReferenceTableTests(unittest.TestCase):
    """docs/federation.md's rows are the federation settings tables, and
    every setting in them is read, with its default."""

    def test_docs_show_the_generated_rows(self):
        from elvin.federation import config as fed_config
        with open(os.path.join(REPO, "docs", "federation.md"), encoding="utf-8") as f:
            doc = f.read()
        self.assertIn(fed_config.reference_table() + "\n", doc,
                      "regenerate the rows with: python -m elvin.federation.config")

    def test_defaults_and_every_setting_read(self):
        from elvin.federation import config as fed_config
        fresh = RouterConfig().federation
        for setting in fed_config.FEDERATION_SETTINGS:
            self.assertEqual(getattr(fresh, setting.attr), setting.default, setting.name)
        c = config.parse("\n".join([
            "Federation.Activated = no", "Federation.Router-Name = a.test",
            "Federation.Listen = ewaf://127.0.0.1:1 ewaf://127.0.0.1:2",
            "Federation.Default-Class = K", "Federation.Require-Authenticated = 10.*",
            "Federation.Keepalive = 5", "Federation.Filter.Max-Nodes = 9",
            "Federation.Trace-Directory = /tmp/t", "Federation.Trace.Max-Bytes = 2048",
            "Federation.Trace.Max-Seconds = 60", "tls-ca = ca.pem",
            "Federation.Connect[K] = ewaf://127.0.0.1:3",
            "Federation.Subscribe[K] = require(a)", "Federation.Provide[K] = FALSE",
            "Federation.Apply-Class[K] = *.test", "Federation.Apply-Class[K] = 10.*",
            "Federation.Require-Authenticated[K] = yes"]))
        fed = c.federation
        self.assertEqual((fed.activated, fed.router_name, len(fed.listen), fed.default_class,
                          fed.require_authenticated_hosts, fed.keepalive,
                          fed.max_filter_nodes, fed.trace_directory, fed.trace_max_bytes,
                          fed.trace_max_seconds),
                         (False, "a.test", 2, "K", ["10.*"], 5.0, 9, "/tmp/t", 2048, 60.0))
        k = fed.classes["K"]
        self.assertEqual((len(k.connect), k.subscribe, k.provide, k.hosts,
                          k.require_authenticated),
                         (1, "require(a)", "FALSE", ["*.test", "10.*"], True))

    def test_unknown_and_bad_values_name_the_line(self):
        for text, words in (("Federation.Nonsense = 1", "unknown federation setting"),
                            ("Federation.Nonsense[K] = 1", "known for a class C"),
                            ("Federation.Keepalive-Interval = -1", "non-negative"),
                            ("Federation.Trace.Max-Seconds = 0", "more than 0"),
                            ("Federation.Listen = http://x", "bad federation URI")):
            with self.assertRaises(ConfigError) as cm:
                config.parse(text, "f.conf")
            self.assertIn("f.conf:1", str(cm.exception))
            self.assertIn(words, str(cm.exception))
