"""``twistd elvin-proxy``'s options and configuration file."""

import os
import tempfile

from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial import unittest

from elvin.configvalues import ConfigError
from elvin.proxy import tap
from elvin.proxy.config import DEFAULT_LISTEN, load_proxy_config, parse_proxy_config


class ProxyConfigTest(unittest.TestCase):

    def test_defaults(self):
        config = parse_proxy_config("")
        self.assertEqual(str(config.upstream), "elvin:4.0/tcp,none,xdr/localhost:2917")
        self.assertEqual(config.listen, [])
        self.assertEqual((config.max_stored, config.sweep_interval), (100_000, 60.0))

    def test_settings(self):
        config = parse_proxy_config(
            "listen = elvin://127.0.0.1:4000\nupstream = discover\nupstream-scope = lab\n"
            "max-sessions = 5\ndatabase = state/p.db\n", "/etc/elvin/proxy.conf")
        self.assertIsNone(config.upstream)
        self.assertEqual(config.upstream_scope, "lab")
        self.assertEqual(config.max_sessions, 5)
        self.assertEqual(config.database, "/etc/elvin/state/p.db")   # beside the file

    def test_errors_name_file_and_line(self):
        for text, expected in (("max-stored = 0", "p.conf:1: max-stored must be at least 1"),
                               ("\nbogus = 1", "p.conf:2: unknown setting 'bogus'"),
                               ("listen = elvin:/udp,none,xdr/127.0.0.1:5000",
                                "p.conf:1: the proxy keeps sessions, which UDP cannot carry"),
                               ("upstream-scope = x", "upstream-scope needs upstream = discover"),
                               ("upstream = elvin:/udp,none,xdr/127.0.0.1:5000",
                                "p.conf:1: upstream elvin:/udp,none,xdr/127.0.0.1:5000: the "
                                "proxy subscribes upstream, which UDP cannot carry"),
                               ("upstream = elvin:/sctp,none,xdr/h:1",
                                "p.conf:1: elvin:4.0/sctp,none,xdr/h:1: protocol stack "
                                "sctp,none,xdr is not supported"),
                               ("upstream = elvin://h:99999", "p.conf:1: bad upstream URI: ")):
            with self.assertRaises(ConfigError) as caught:
                parse_proxy_config(text, "p.conf")
            self.assertIn(expected, str(caught.exception))

    def test_load_reads_a_file(self):
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "proxy.conf")
        with open(path, "w") as f:
            f.write("max-backlog = 7\n")
        self.assertEqual(load_proxy_config(path).max_backlog, 7)


class ProxyOptionsTest(unittest.TestCase):

    def test_command_line_overrides_the_file(self):
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "proxy.conf")
        with open(path, "w") as f:
            f.write("listen = elvin://127.0.0.1:4001\ndatabase = a.db\n")
        options = tap.Options()
        options.parseOptions(["-c", path, "-l", "elvin://127.0.0.1:4002", "-d", "/tmp/b.db",
                              "-u", "elvin://10.0.0.1:2917"])
        config = options.proxy_config
        self.assertEqual([u.port for u in config.listen], [4002])
        self.assertEqual(config.database, "/tmp/b.db")
        self.assertEqual(config.upstream.host, "10.0.0.1")

    def test_default_listen(self):
        options = tap.Options()
        options.parseOptions(["-d", ":memory:"])
        self.assertEqual([str(u) for u in options.proxy_config.listen],
                         ["elvin:4.0/tcp,none,xdr/localhost:2916"])
        self.assertEqual(DEFAULT_LISTEN, "elvin://localhost:2916")

    def test_help_gives_every_option_a_line_and_its_default(self):
        """As ``twistd elvin --help``: each option with its help, and the
        defaults of those the configuration file may also set."""
        from elvin.proxy.config import DEFAULT_UPSTREAM
        text = " ".join(str(tap.Options()).split())
        for option in ("-c, --config=", "-d, --database=", "-l, --listen=",
                       "-u, --upstream=", "--help", "--version"):
            self.assertIn(option, text)
        self.assertIn("[default: the configuration's database, else elvin-proxy.db]", text)
        self.assertIn(f"[default: the configuration's upstream, else {DEFAULT_UPSTREAM}]",
                      text)
        self.assertIn(f"With no --listen it listens on {DEFAULT_LISTEN}", text)

    def test_a_bad_option_under_twistd_is_one_line(self):
        for args, expected in (
                (["--upstrem", "x"], "twistd elvin-proxy: unknown option --upstrem (did you "
                                     "mean --upstream?)"),
                (["-l", "elvin://127.0.0.1:4001", "-l", "elvin://127.0.0.1:4001"],
                 "twistd elvin-proxy: --listen elvin://127.0.0.1:4001 is given twice")):
            options = tap.Options()
            options.parent = {}
            with self.assertRaises(SystemExit) as raised:
                options.parseOptions(args)
            message = str(raised.exception.code)
            self.assertTrue(message.startswith(expected), message)
            self.assertTrue(message.endswith("\n(see 'twistd elvin-proxy --help'; settings: "
                                             "docs/proxy.md)"), message)

    def test_bad_listen_is_a_usage_error(self):
        with self.assertRaises(usage.UsageError):
            tap.Options().parseOptions(["-l", "elvin://127.0.0.1:99999"])

    def test_a_udp_upstream_is_a_usage_error(self):
        with self.assertRaises(usage.UsageError) as caught:
            tap.Options().parseOptions(["-u", "elvin:/udp,none,xdr/127.0.0.1:5000"])
        self.assertIn("--upstream: upstream elvin:/udp,none,xdr/127.0.0.1:5000: the proxy "
                      "subscribes upstream, which UDP cannot carry", str(caught.exception))

    def test_service_tree(self):
        options = tap.Options()
        options.parseOptions(["-d", ":memory:", "-l", "elvin://127.0.0.1:4003"])
        top = tap.makeService(options, Clock())
        self.assertIsInstance(top, tap.ProxyService)
        self.assertEqual(len(list(top)), 3)       # listener, sweep, upstream
        top.store.close()

    def with_config(self, text, *argv):
        """Options parsed from a configuration file holding ``text``."""
        path = os.path.join(tempfile.mkdtemp(), "p.conf")
        with open(path, "w") as f:
            f.write(text)
        options = tap.Options()
        options.parseOptions(["-c", path, "-d", ":memory:", *argv])
        return options

    def test_status_listener(self):
        options = self.with_config("status-listen = 9916\nstatus-token = t\n",
                                   "-l", "elvin://127.0.0.1:4003")
        top = tap.makeService(options, Clock())
        self.assertEqual(len(list(top)), 4)       # listener, status, sweep, upstream
        top.store.close()
        with self.assertRaises(usage.UsageError) as caught:
            self.with_config("# counters\nstatus-listen = https://127.0.0.1:9916\n")
        self.assertRegex(str(caught.exception), r"^/\S+/p\.conf:2: status-listen "
                         r"https://127\.0\.0\.1:9916: the proxy serves its counters over "
                         "http only")

    def test_listeners_are_gated_by_the_open_file_budget(self):
        """Idle sockets cannot lock devices out or fill the open-file limit:
        every listener's connections pass the router's gate (admitted,
        refused, or the oldest idle closed to make room)."""
        from twisted.internet.testing import MemoryReactorClock
        from elvin.core.admission import CLIENT, STATUS
        from elvin.protocols.gate import GateFactory
        options = self.with_config("status-listen = 9916\n", "-l", "elvin://127.0.0.1:3000",
                                   "-l", "elvin:/http,none,xdr/127.0.0.1:3001")
        options.parent = {"logfile": None}
        reactor_ = MemoryReactorClock()
        top = tap.makeService(options, reactor_)
        self.addCleanup(top.store.close)
        pools = {port: factory.pool for port, factory, *_ in reactor_.tcpServers
                 if isinstance(factory, GateFactory)}
        self.assertEqual(pools, {3000: CLIENT, 3001: CLIENT, 9916: STATUS})
        top.startService()
        self.addCleanup(top.stopService)
        self.assertLessEqual(top.core.max_connections, 10_000)
        self.assertEqual(top.core.admission.budget.pools[CLIENT].cap,
                         top.core.max_connections)

    def test_upstream_by_discovery(self):
        config = parse_proxy_config("upstream = discover\nupstream-scope = lab\n"
                                    "upstream-tls-ca = ca.pem\n", "/etc/p.conf")
        self.assertEqual(tap._upstream_args(config),
                         {"discover": True, "scope": "lab", "tls_ca": "/etc/ca.pem",
                          "options": {"Send-Queue.Max-Length": 256 * 1024 * 1024,
                                      "Subscription.Max-Count": 2 ** 31 - 1}})
        self.assertEqual(tap._upstream_args(parse_proxy_config(""))["uri"].port, 2917)

    def test_upstream_return_settings(self):
        from elvin.discovery.discoverer import Discoverer
        from elvin.proxy.upstream import Upstream

        def upstream_of(text):
            top = tap.makeService(self.with_config(text, "-l", "elvin://127.0.0.1:4003"),
                                  Clock())
            top.store.close()
            (upstream,) = [s for s in top if isinstance(s, Upstream)]
            return upstream
        plain = upstream_of("")
        self.assertEqual((plain.probe_interval, plain.discoverer), (0.2, None))
        tuned = upstream_of("upstream-probe = 0.5\nupstream-discovery = yes\n")
        self.assertEqual(tuned.probe_interval, 0.5)
        self.assertIsInstance(tuned.discoverer, Discoverer)
        self.assertIsInstance(upstream_of("upstream = discover\n").discoverer, Discoverer)
        self.assertEqual(upstream_of("upstream-probe = 0\n").probe_interval, 0)
        for text in ("upstream-probe = -1", "upstream-discovery = maybe"):
            with self.assertRaises(ConfigError) as caught:
                parse_proxy_config(text, "p.conf")
            self.assertIn("p.conf:1: " + text.split(" ")[0], str(caught.exception))

    def test_every_setting_is_declared(self):
        # ProxyConfig declares each setting's attribute for the type checker.
        from elvin.proxy.config import PROXY_SETTINGS, ProxyConfig
        declared = set(ProxyConfig.__annotations__) - {"SETTINGS"}
        self.assertEqual(declared, {setting.attr for setting in PROXY_SETTINGS})

    def test_docs_table_is_generated_from_the_settings(self):
        from elvin.proxy.config import reference_table
        from elvin.test.places import REPO
        with open(os.path.join(REPO, "docs", "proxy.md"), encoding="utf-8") as f:
            self.assertIn(reference_table() + "\n", f.read(),
                          "regenerate docs/proxy.md's table: python -m elvin.proxy.config")


class ExampleConfigTest(unittest.TestCase):
    """conf/elvin-proxy.conf, the commented example, ships in the package
    (``twistd elvin-proxy --print-config``), names every setting, and
    behaves as no file at all."""

    def example(self):
        from elvin.test.places import REPO
        path = os.path.join(REPO, "conf", "elvin-proxy.conf")
        with open(path, encoding="utf-8") as f:
            return path, f.read()

    def commented_settings(self, text):
        """(line number, ``name = value``) of the commented-out settings."""
        found = []
        for number, line in enumerate(text.splitlines(), 1):
            body = line.strip().lstrip("#").strip()
            name = body.split("=", 1)[0].strip()
            if line.lstrip().startswith("#") and "=" in body and name and " " not in name:
                found.append((number, body))
        return found

    def test_packaged_copy_is_the_documented_one(self):
        self.assertEqual(tap.example_text(), self.example()[1])

    def test_loads_as_no_file_at_all(self):
        from elvin.proxy.config import PROXY_SETTINGS, ProxyConfig
        path, _ = self.example()
        loaded, default = load_proxy_config(path), ProxyConfig()
        self.assertEqual([str(u) for u in loaded.listen], ["elvin:4.0/tcp,none,xdr/localhost:2916"])
        for setting in PROXY_SETTINGS:
            if setting.attr != "listen":
                self.assertEqual(getattr(loaded, setting.attr), getattr(default, setting.attr),
                                 setting.name)

    def test_names_every_setting(self):
        from elvin.proxy.config import PROXY_SETTINGS
        _, text = self.example()
        named = {body.split("=", 1)[0].strip() for _, body in self.commented_settings(text)}
        for setting in PROXY_SETTINGS:
            self.assertTrue(setting.name in named or f"\n{setting.name} = " in text,
                            f"{setting.name} is not in conf/elvin-proxy.conf")

    def test_every_commented_line_is_valid(self):
        """Uncommenting a line gives a working file: the values shown are
        real ones (``upstream-scope`` goes with ``upstream = discover``)."""
        _, text = self.example()
        for number, body in self.commented_settings(text):
            before = "upstream = discover\n" if body.startswith("upstream-scope") else ""
            try:
                parse_proxy_config(before + body, f"elvin-proxy.conf:{number}")
            except ConfigError as e:
                self.fail(f"line {number} {body!r}: {e}")

    def test_print_config(self):
        from io import StringIO
        import sys
        out = StringIO()
        self.patch(sys, "stdout", out)
        with self.assertRaises(SystemExit) as cm:
            tap.Options().parseOptions(["--print-config"])
        self.assertEqual(cm.exception.code, 0)
        self.assertEqual(out.getvalue(), self.example()[1])


class JsonLogTest(unittest.TestCase):
    """``--log-format json``, as the router's: the application's log
    observer writes one JSON object per event to twistd's --logfile."""

    def test_json_observer_on_the_application(self):
        import json
        from twisted.application import service
        from twisted.logger import ILogObserver
        log = self.mktemp()
        options = tap.Options()
        options.parent = {"logfile": log}
        options.parseOptions(["-d", ":memory:", "--log-format", "json",
                              "-l", "elvin://127.0.0.1:4004"])
        top = tap.makeService(options, MemoryReactorClock())
        self.addCleanup(top.store.close)
        application = service.Application("elvin-proxy")
        top.setServiceParent(application)
        observer = application.getComponent(ILogObserver)
        observer({"log_format": "session {name} joined", "name": "phone", "log_time": 0.0,
                  "log_namespace": "elvin.proxy", "log_level": None})
        with open(log, encoding="utf-8") as f:
            (event,) = [json.loads(line) for line in f if line.strip()]
        self.assertEqual((event["log_format"], event["name"]), ("session {name} joined", "phone"))

    def test_text_is_the_default_and_other_formats_are_refused(self):
        options = tap.Options()
        options.parseOptions(["-d", ":memory:"])
        self.assertEqual(options["log-format"], "text")
        options = tap.Options()
        options.parent = {}
        with self.assertRaises(SystemExit) as raised:
            options.parseOptions(["-d", ":memory:", "--log-format", "xml"])
        self.assertIn("twistd elvin-proxy: --log-format must be text or json, not 'xml'",
                      str(raised.exception.code))


class StartUpProblemTest(unittest.TestCase):
    """A listener that cannot bind stops the proxy with one line naming
    the setting and where it was given, before twistd daemonises."""

    def config_file(self, text):
        path = os.path.join(tempfile.mkdtemp(), "p.conf")
        with open(path, "w") as f:
            f.write(text)
        return path

    def cannot_start(self, text, busy, *argv):
        from elvin.test.test_tap import _BusyReactor
        path = self.config_file(text)
        options = tap.Options()
        options.parseOptions(["-c", path, "-d", ":memory:", *argv])
        top = tap.makeService(options, _BusyReactor(busy))
        self.addCleanup(top.store.close)
        with self.assertRaises(SystemExit) as raised:
            top.privilegedStartService()
        return path, str(raised.exception.code)

    def test_status_listener_in_use_names_its_setting_and_line(self):
        path, message = self.cannot_start(
            "listen = elvin://127.0.0.1:3000\nstatus-listen = 3001\n", {3001})
        self.assertEqual(message, f"twistd elvin-proxy: {path}:2: status-listen "
                         "http://127.0.0.1:3001: address already in use; is another proxy "
                         "running? change status-listen to another port")

    def test_listen_in_use_names_its_line_or_the_command_line(self):
        path, message = self.cannot_start("listen = elvin://127.0.0.1:3000\n", {3000})
        self.assertEqual(message, f"twistd elvin-proxy: {path}:1: listen "
                         "elvin://127.0.0.1:3000: address already in use; is another proxy "
                         "running? change listen to another port")
        _, message = self.cannot_start("listen = elvin://127.0.0.1:3000\n", {3002},
                                       "-l", "elvin://127.0.0.1:3002")
        self.assertEqual(message, "twistd elvin-proxy: elvin://127.0.0.1:3002: address "
                         "already in use; is another proxy running? use -l to choose "
                         "another port")

    def test_bound_once_under_twistd(self):
        from twisted.internet.testing import MemoryReactorClock
        options = tap.Options()
        options.parseOptions(["-d", ":memory:", "-l", "elvin://127.0.0.1:3000"])
        options.parent = {"logfile": None}
        reactor_ = MemoryReactorClock()
        top = tap.makeService(options, reactor_)
        self.addCleanup(top.store.close)
        self.assertEqual([s[0] for s in reactor_.tcpServers], [3000])
        top.privilegedStartService()
        self.assertEqual([s[0] for s in reactor_.tcpServers], [3000])

    def test_port_in_use_daemonised(self):
        """twistd without -n: the parent exits 1 at once with the line on
        its stderr, and leaves no pidfile (it waited for ever)."""
        import socket
        import subprocess
        import sys
        from elvin.test.places import REPO, free_port
        held = socket.socket()
        self.addCleanup(held.close)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        rundir = tempfile.mkdtemp()
        path = self.config_file(f"status-listen = {port}\n"
                                f"listen = elvin://127.0.0.1:{free_port()}\n"
                                f"database = {rundir}/p.db\n")
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        done = subprocess.run(
            [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
             "--pidfile=p.pid", "--logfile=p.log", "elvin-proxy", "-c", path],
            env=env, cwd=rundir, capture_output=True, timeout=30)
        self.assertEqual((done.stdout, done.returncode), (b"", 1))
        self.assertEqual(done.stderr.decode(), f"twistd elvin-proxy: {path}:1: status-listen "
                         f"http://127.0.0.1:{port}: address already in use; is another "
                         "proxy running? change status-listen to another port\n")
        self.assertFalse(os.path.exists(os.path.join(rundir, "p.pid")))
