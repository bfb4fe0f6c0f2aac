"""Host names with underscores are accepted everywhere a URI is read.

Container runtimes and internal DNS zones hand out names such as
``elvin_host`` or ``router_1``; resolvers look them up and the Avis router
and client accept them, so every entry point that takes an ``elvin:`` or
``ewaf:`` URI must too. Hosts that no resolver could look
up are still refused.
"""

from twisted.trial import unittest

from elvin import config
from elvin.config import ConfigError
from elvin.discovery.cache import RouterRecord
from elvin.federation.protocol import parse_ewaf
from elvin.tap import Options
from elvin.tools.common import ToolOptions
from elvin.uri import InvalidURIError

NAMES = ["elvin_host", "router_1", "my_app-1.internal_zone.local"]
BAD = ["ho st", "h$st", "h]", "[h", "h,1"]


class EntryPointTests(unittest.TestCase):

    def test_config_listen(self):
        for host in NAMES:
            c = config.parse(f"listen = elvin://{host}:2917\n")
            self.assertEqual([u.host for u in c.listen], [host])
        for host in BAD:
            self.assertRaises(ConfigError, config.parse, f"listen = elvin://{host}:2917\n")

    def test_federation_config_and_ewaf(self):
        for host in NAMES:
            self.assertEqual(parse_ewaf(f"ewaf://{host}").host, host)
            self.assertEqual(parse_ewaf(f"ewaf://{host}:3000").port, 3000)
            c = config.parse(f"Federation.Connect[Peer] = ewaf://{host}:2916\n"
                             f"Federation.Listen = ewaf://{host}:2916\n")
            self.assertEqual([u.host for u in c.federation.listen], [host])
        for host in BAD:
            self.assertRaises(InvalidURIError, parse_ewaf, f"ewaf://{host}")

    def test_twistd_listen_option(self):
        options = Options()
        options.parseOptions(["-l", "elvin://elvin_host:3000"])
        self.assertEqual([u.host for u in options.router_config.listen], ["elvin_host"])

    def test_tool_option(self):
        options = ToolOptions()
        options.parseOptions(["-e", "elvin://router_1:2917"])
        self.assertEqual(options["uri"].host, "router_1")

    def test_discovered_uris(self):
        record = RouterRecord("r", "", False, 1,
                              ("elvin://router_1:2917", "elvin://ho st:2917"))
        self.assertEqual([u.host for u in record.usable_uris()], ["router_1"])
