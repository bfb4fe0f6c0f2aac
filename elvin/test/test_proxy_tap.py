"""``twistd elvin-proxy``'s options and configuration file."""

import os
import tempfile

from twisted.internet.task import Clock
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
                               ("upstream-scope = x", "upstream-scope needs upstream = discover")):
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

    def test_bad_listen_is_a_usage_error(self):
        with self.assertRaises(usage.UsageError):
            tap.Options().parseOptions(["-l", "elvin://127.0.0.1:99999"])

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
            self.with_config("status-listen = https://127.0.0.1:9916\n")
        self.assertIn("http only", str(caught.exception))

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
