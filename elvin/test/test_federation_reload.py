"""Reload changes only what changed in federation: an unchanged file
touches no link, a new Connect is dialled and a removed one closed while
the others stay up (the router in this process, peers on 127.0.0.1)."""

import os

from twisted.internet import defer, reactor
from twisted.trial import unittest

from elvin import tap
from elvin.test.places import free_port
from elvin.test.polling import wait_until
from elvin.test.test_federation import FedRouter


class FederationReloadTests(unittest.TestCase):
    timeout = 30

    def write(self, *peers, extra=""):
        with open(self.conf, "w") as f:
            f.write(f"listen = elvin://127.0.0.1:{self.port}\n"
                    "Federation.Router-Name = reloaded.test\n"
                    "Federation.Apply-Class[Peer] = 127.0.0.1\n" + extra)
            for peer in peers:
                f.write("Federation.Connect[Peer] = ewaf://127.0.0.1:"
                        f"{peer.fed_port.getHost().port}\n")

    def linked(self, peer):
        manager = self.top.federation_service.manager
        return [l for l in manager.links if l.peer_domain == peer.domain]

    @defer.inlineCallbacks
    def test_reload_touches_only_what_changed(self):
        first = FedRouter(self, "first.test")
        second = FedRouter(self, "second.test")
        self.port = free_port()
        self.conf = os.path.join(os.path.abspath(self.mktemp()) + ".conf")
        self.write(first)
        options = tap.Options()
        options.parseOptions(["-c", self.conf])
        self.top = tap.makeService(options, reactor)
        self.top._install_drain_signal = lambda: None    # no signal handlers in trial
        self.top.privilegedStartService()
        self.top.startService()
        self.addCleanup(self.top.stopService)
        yield wait_until(lambda: self.linked(first), timeout=10)
        (link,) = self.linked(first)
        service = self.top.federation_service

        applied, message = yield self.top.reload()       # the same file
        self.assertEqual((applied, message), (True, "reloaded: nothing changed"))
        self.assertIs(self.top.federation_service, service)
        self.assertEqual(self.linked(first), [link])
        self.assertEqual(link.state, link.UP)

        self.write(first, second)                          # one more link
        applied, message = yield self.top.reload()
        self.assertIn("dialled", message)
        yield wait_until(lambda: self.linked(second), timeout=10)
        self.assertEqual(self.linked(first), [link])
        # status.json's configured links (docs/operations.md): both, in order
        dialled = service.manager.dialled
        self.assertEqual([d.uri.rsplit(":", 1)[1] for d in dialled],
                         [str(p.fed_port.getHost().port) for p in (first, second)])

        self.write(second, extra="Federation.Provide[Peer] = require(x)\n")
        applied, message = yield self.top.reload()
        self.assertIn("closed", message)
        self.assertIn("federation class Peer changed", message)
        yield wait_until(lambda: not self.linked(first), timeout=10)
        (kept,) = self.linked(second)
        self.assertEqual([d.link for d in service.manager.dialled], [kept])
        self.assertTrue(kept.fed_class.export_filter.matches({"x": 1}))
        self.assertFalse(kept.fed_class.export_filter.matches({"y": 1}))
        self.assertIs(self.top.federation_service, service)
