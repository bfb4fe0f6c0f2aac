"""Discovery configuration: the config file settings, ``--discovery``, the
service tree, advertised addresses, and the command-line options (no
network here)."""

from twisted.python import usage
from twisted.trial import unittest

from elvin import client, tap
from elvin.config import ConfigError, RouterConfig, parse
from elvin.discovery.addresses import (
    advertisable_uris, is_loopback, is_unspecified, local_addresses, with_host)
from elvin.discovery.cache import RouterRecord
from elvin.discovery.service import DiscoveryService, new_router_name
from elvin.tools import common, discover
from elvin.uri import ElvinURI


class SettingsTests(unittest.TestCase):
    timeout = 30

    def test_defaults_off(self):
        config = RouterConfig()
        self.assertFalse(config.discovery)
        self.assertEqual(config.discovery_scope, "")
        self.assertTrue(config.discovery_default)
        self.assertEqual(config.discovery_advertise, [])
        self.assertIsNone(config.discovery_interface)
        self.assertEqual(config.discovery_ttl, 64)
        self.assertTrue(config.discovery_dns_sd)
        self.assertEqual(config.discovery_group, ("224.4.0.1", 2917))

    def test_every_setting(self):
        config = parse("discovery = yes\n"
                       "Discovery-Scope = chat\n"
                       "discovery-default = no\n"
                       "discovery-advertise = elvin://router.example.com:2917\n"
                       "discovery-advertise = elvin://0.0.0.0:2918\n"
                       "discovery-interface = 192.0.2.2\n"
                       "discovery-ttl = 1\n"
                       "discovery-dns-sd = off\n"
                       "discovery-group = 224.4.0.1:4000\n")
        self.assertTrue(config.discovery)
        self.assertEqual(config.discovery_scope, "chat")
        self.assertFalse(config.discovery_default)
        self.assertEqual(config.discovery_advertise,
                         [ElvinURI("elvin://router.example.com:2917"),
                          ElvinURI("elvin://0.0.0.0:2918")])
        self.assertEqual(config.discovery_interface, "192.0.2.2")
        self.assertEqual(config.discovery_ttl, 1)
        self.assertFalse(config.discovery_dns_sd)
        self.assertEqual(config.discovery_group, ("224.4.0.1", 4000))

    def test_empty_scope_can_be_written(self):
        self.assertEqual(parse('discovery-scope = ""\n').discovery_scope, "")
        self.assertEqual(parse('discovery-scope = "chat"\n').discovery_scope, "chat")
        self.assertEqual(parse("discovery-scope = 'chat'\n").discovery_scope, "chat")
        self.assertEqual(parse('discovery-scope = "chat\n').discovery_scope, '"chat')

    def test_errors_name_file_and_line(self):
        bad = ["discovery = maybe",
               "discovery-scope = a:b",
               "discovery-ttl = 256",
               "discovery-ttl = -1",
               "discovery-ttl = x",
               "discovery-interface = eth0",
               "discovery-group = 10.0.0.1",
               "discovery-group = 224.4.0.1:0",
               "discovery-advertise = http://x",
               "discovery-colour = red"]
        for line in bad:
            with self.assertRaises(ConfigError, msg=line) as cm:
                parse(f"# comment\n{line}\n", "elvind.conf")
            self.assertTrue(str(cm.exception).startswith("elvind.conf:2: "),
                            str(cm.exception))

    def test_unknown_setting_lists_discovery_settings(self):
        with self.assertRaises(ConfigError) as cm:
            parse("nonsense = 1\n")
        self.assertIn("discovery-scope", str(cm.exception))


class TapTests(unittest.TestCase):
    timeout = 30

    def options(self, *args):
        options = tap.Options()
        options.parseOptions(list(args))
        return options

    def test_flag(self):
        self.assertFalse(self.options().router_config.discovery)
        self.assertTrue(self.options("--discovery").router_config.discovery)

    def test_config_file_switches_it_on(self):
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("discovery = yes\ndiscovery-scope = s\n")
        config = self.options("-c", path).router_config
        self.assertTrue(config.discovery)
        self.assertEqual(config.discovery_scope, "s")

    def test_service_tree(self):
        from twisted.internet.testing import MemoryReactor
        top = tap.makeService(self.options(), MemoryReactor())
        with self.assertRaises(KeyError):
            top.getServiceNamed("discovery")
        top = tap.makeService(self.options("--discovery", "-l", "elvin://0.0.0.0:3000",
                                           "-l", "elvin://localhost:3001"),
                              MemoryReactor())
        svc = top.getServiceNamed("discovery")
        self.assertIsInstance(svc, DiscoveryService)
        self.assertIs(list(top)[-1], svc)          # last: stopped first
        self.assertEqual(svc.listen, [ElvinURI("elvin://0.0.0.0:3000"),
                                      ElvinURI("elvin://localhost:3001")])
        self.assertTrue(svc.dns_sd)
        self.assertEqual((svc.group, svc.port, svc.ttl_limit), ("224.4.0.1", 2917, 64))

    def test_from_config(self):
        config = parse("listen = elvin://localhost:5000\n"
                       "discovery-scope = x\ndiscovery-default = no\n"
                       "discovery-interface = 127.0.0.1\ndiscovery-ttl = 0\n"
                       "discovery-group = 224.4.0.1:4001\n")
        svc = DiscoveryService.from_config(config, reactor=object(), dns_sd=False)
        self.assertEqual((svc.scope, svc.default, svc.interface, svc.ttl_limit,
                          svc.port, svc.dns_sd, svc.dns_sd_interfaces),
                         ("x", False, "127.0.0.1", 0, 4001, False, ["127.0.0.1"]))
        self.assertEqual(svc.offered_uris(), ["elvin:4.0/tcp,none,xdr/127.0.0.1:5000"])

    def test_router_names_are_unique(self):
        names = {new_router_name() for _ in range(100)}
        self.assertEqual(len(names), 100)


class AddressTests(unittest.TestCase):
    timeout = 30

    ADDRESSES = ["127.0.0.1", "192.0.2.2", "::1", "fd00::2", "10.1.2.3"]

    def test_wildcard_expands_to_real_addresses_loopback_last(self):
        uris = advertisable_uris(["elvin://0.0.0.0:2917"], self.ADDRESSES)
        self.assertEqual([str(u) for u in uris],
                         ["elvin:4.0/tcp,none,xdr/192.0.2.2:2917",
                          "elvin:4.0/tcp,none,xdr/10.1.2.3:2917",
                          "elvin:4.0/tcp,none,xdr/127.0.0.1:2917"])
        for uri in uris:
            self.assertFalse(is_unspecified(uri.host))

    def test_ipv6_wildcard(self):
        uris = advertisable_uris(["elvin:4.0/tcp,none,xdr/[::]:2917"], self.ADDRESSES)
        self.assertEqual([str(u) for u in uris],
                         ["elvin:4.0/tcp,none,xdr/[fd00::2]:2917",
                          "elvin:4.0/tcp,none,xdr/[::1]:2917"])

    def test_localhost_named_hosts_and_duplicates(self):
        uris = advertisable_uris(["elvin://localhost:1", "elvin://router.example.com:2",
                                  "elvin://127.0.0.1:1",
                                  "elvin:4.0/ssl,none,xdr/0.0.0.0:3;opt=a%20b"],
                                 ["192.0.2.2"])
        self.assertEqual([str(u) for u in uris],
                         ["elvin:4.0/tcp,none,xdr/127.0.0.1:1",
                          "elvin:4.0/tcp,none,xdr/router.example.com:2",
                          "elvin:4.0/ssl,none,xdr/192.0.2.2:3;opt=a%20b"])

    def test_helpers(self):
        self.assertEqual(str(with_host(ElvinURI("elvin://h:5;a=b"), "::1")),
                         "elvin:4.0/tcp,none,xdr/[::1]:5;a=b")
        self.assertTrue(is_loopback("localhost"))
        self.assertTrue(is_loopback("127.0.0.2"))
        self.assertTrue(is_loopback("::1"))
        self.assertFalse(is_loopback("192.0.2.1"))
        self.assertTrue(is_unspecified("0.0.0.0"))
        self.assertTrue(is_unspecified("::"))
        self.assertFalse(is_unspecified("host"))

    def test_local_addresses(self):
        addresses = local_addresses()
        self.assertIn("127.0.0.1", addresses)
        self.assertFalse(any(a.lower().startswith("fe80") for a in addresses))


class ClientTests(unittest.TestCase):
    timeout = 30

    def test_connect_without_uri_keeps_the_old_default(self):
        seen = []

        def endpoint(reactor, uri, *args, **kwargs):
            seen.append(uri)
            raise RuntimeError("stop here")
        self.patch(client, "_endpoint", endpoint)
        d = client.connect(reactor=object())
        self.failureResultOf(d, RuntimeError)
        self.assertEqual(seen, [ElvinURI("elvin://localhost:2917")])
        d = client.connect("elvin://192.0.2.1:1", reactor=object())
        self.failureResultOf(d, RuntimeError)
        self.assertEqual(seen[-1], ElvinURI("elvin://192.0.2.1:1"))


class ToolOptionTests(unittest.TestCase):
    timeout = 30

    def test_e_defaults_to_discovery(self):
        options = common.ToolOptions()
        options.parseOptions([])
        self.assertIsNone(options["uri"])
        self.assertIsNone(options["scope"])
        self.assertEqual(options["discovery-time"], 1.5)
        options = common.ToolOptions()
        options.parseOptions(["-e", "elvin://h:1"])
        self.assertEqual(options["uri"], ElvinURI("elvin://h:1"))
        options = common.ToolOptions()
        with self.assertRaises(usage.UsageError):
            options.parseOptions(["-e", "nonsense"])

    def test_discover_options(self):
        options = discover.Options()
        options.parseOptions([])
        self.assertIsNone(options["time"])
        self.assertEqual(options["group_address"], ("224.4.0.1", 2917))
        for bad in (["--time", "-1"], ["--locality", "300"], ["--scope", "a:b"],
                    ["--group", "1.2.3.4"], ["--no-dns-sd", "--no-erdp"]):
            with self.assertRaises(usage.UsageError, msg=bad):
                discover.Options().parseOptions(bad)

    def test_discover_output_format(self):
        record = RouterRecord(name="r1", scope="chat", default=True, revision=2,
                              uris=("elvin://a:1", "elvin://b:2"), source="erdp",
                              address="192.0.2.5")
        self.assertEqual(discover.format_record("added", record),
                         "router r1\n"
                         '  scope: "chat"  default: yes  revision: 2  via: erdp from 192.0.2.5\n'
                         "  uri: elvin://a:1\n"
                         "  uri: elvin://b:2\n")
        self.assertEqual(discover.format_record("withdrawn", record), "withdrawn r1\n")
        line = discover.format_record("added", record, as_json=True)
        self.assertIn('"uris": ["elvin://a:1", "elvin://b:2"]', line)
        self.assertTrue(line.endswith("}\n"))


class DiscoveryReferenceTableTests(unittest.TestCase):
    """docs/discovery.md's settings table is the settings table."""

    def test_docs_show_the_generated_rows(self):
        import os
        from elvin.discovery.settings import reference_table
        from elvin.test.places import REPO
        with open(os.path.join(REPO, "docs", "discovery.md"), encoding="utf-8") as f:
            doc = f.read()
        self.assertIn(reference_table() + "\n", doc,
                      "regenerate the rows with: python -m elvin.discovery.settings")
