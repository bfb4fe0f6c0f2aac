"""The client libraries' standard-library log lines reach Twisted's log
(``elvin.ops.stdlog``) inside a twistd service."""

import logging

from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial import unittest

from elvin.ops.stdlog import TwistedHandler, bridge_client_logging


class BridgeTests(unittest.SynchronousTestCase):

    def setUp(self):
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        logger = logging.getLogger("elvin")
        saved = (list(logger.handlers), logger.level)
        self.addCleanup(lambda: (setattr(logger, "handlers", saved[0]),
                                 logger.setLevel(saved[1])))

    def test_a_client_warning_is_a_twisted_warning_in_its_namespace(self):
        handler = bridge_client_logging()
        self.assertIs(bridge_client_logging(), handler)       # once
        self.assertEqual(sum(isinstance(h, TwistedHandler)
                             for h in logging.getLogger("elvin").handlers), 1)
        logging.getLogger("elvin.client").warning("lost %s; reconnecting", "it")
        logging.getLogger("elvin.client").debug("not shown")
        (event,) = [e for e in self.events if e.get("log_namespace") == "elvin.client"]
        self.assertEqual(event["log_level"], LogLevel.warn)
        self.assertEqual(event["text"], "lost it; reconnecting")

    def test_a_bad_format_is_written_not_raised(self):
        bridge_client_logging()
        logging.getLogger("elvin.client").error("%d", "x")
        (event,) = [e for e in self.events if e.get("log_namespace") == "elvin.client"]
        self.assertEqual(event["log_level"], LogLevel.error)
        self.assertIn("'%d'", event["text"])

    def test_the_proxy_service_bridges(self):
        from twisted.internet.task import Clock
        from elvin.proxy import tap
        options = tap.Options()
        options.parseOptions(["-d", ":memory:", "-l", "elvin://127.0.0.1:4003"])
        top = tap.makeService(options, Clock())
        top.store.close()
        self.assertTrue(any(isinstance(h, TwistedHandler)
                            for h in logging.getLogger("elvin").handlers))
