"""``twistd elvin``: command-line options and the router's service tree."""

import sys

from twisted.application import service
from twisted.logger import Logger
from twisted.python import usage

from elvin.config import ConfigError, RouterConfig, load
from elvin.endpoints import (TLS, UnsupportedStackError, check_supported,
                             listener_service, stack_kind)
from elvin.protocols.server import ElvinServerFactory
from elvin.router import Router
from elvin.uri import ElvinURI, InvalidURIError

__all__ = ["Options", "makeService", "RouterService", "DEFAULT_LISTEN"]

DEFAULT_LISTEN = "elvin://localhost:2917"


class Options(usage.Options):
    synopsis = "[-l URI ...] [-c FILE] [--verbose]"
    longdesc = ("Run an Elvin 4.0 content-based message router. With no "
                f"--listen it listens on {DEFAULT_LISTEN}.")

    optFlags = [
        ["verbose", "v", "Log every notification routed (names only, never keys)."],
        ["discovery", None, "Advertise this router by multicast discovery (ERDP) "
                            "and DNS-SD (see docs/discovery.md)."],
    ]
    optParameters = [
        ["config", "c", None, "Configuration file (see conf/elvind.conf)."],
    ]

    def __init__(self):
        super().__init__()
        self["listen"] = []

    def opt_listen(self, uri):
        """Listen on this elvin: URI (may be given several times)."""
        try:
            self["listen"].append(ElvinURI(uri))
        except InvalidURIError as e:
            raise usage.UsageError(str(e)) from None

    opt_l = opt_listen

    def postOptions(self):
        config = RouterConfig()
        if self["config"]:
            try:
                load(self["config"], config)
            except ConfigError as e:
                raise usage.UsageError(str(e)) from None
        if self["listen"]:
            config.listen = list(self["listen"])
        if not config.listen:
            config.listen = [ElvinURI(DEFAULT_LISTEN)]
        if self["verbose"]:
            config.verbose = True
        if self["discovery"]:
            config.discovery = True
        for uri in config.listen:
            try:
                check_supported(uri)
            except UnsupportedStackError as e:
                raise usage.UsageError(str(e)) from None
        if config.tls_certificate and any(stack_kind(u) == TLS for u in config.listen):
            # Check the certificate files now, to report them as usage errors.
            from elvin.tls import server_options_from_config
            try:
                server_options_from_config(config)
            except ConfigError as e:
                raise usage.UsageError(str(e)) from None
        self.router_config = config


class RouterService(service.MultiService):
    """The router and its listeners; tells clients goodbye on shutdown."""

    log = Logger()

    def __init__(self, router, config):
        super().__init__()
        self.router = router
        self.config = config

    def startService(self):
        super().startService()
        listening = ", ".join(str(u) for u in self.config.listen)
        self.log.info("Elvin router listening on {uris}", uris=listening)

    def stopService(self):
        self.router.shutdown()
        return super().stopService()


def makeService(options, reactor=None):
    """Build the service tree for ``twistd elvin``."""
    if reactor is None:
        from twisted.internet import reactor
    config = getattr(options, "router_config", None)
    if config is None:
        options.postOptions()
        config = options.router_config
    router = Router(config.option_specs, max_subscriptions=config.max_subscriptions,
                    max_connections=config.max_connections, verbose=config.verbose,
                    max_queue_memory=config.max_queue_memory,
                    max_protocol_errors=config.max_protocol_errors,
                    protocol_error_window=config.protocol_error_window)
    top = RouterService(router, config)
    factory = ElvinServerFactory(router, reactor, config.connect_timeout)
    for uri in config.listen:
        # The URI's stack picks the service: TCP, TLS, UDP or HTTP (a TLS
        # listener without tls-certificate raises a ConfigError naming it).
        try:
            listener = listener_service(reactor, uri, router, factory, config)
        except ConfigError as e:
            if getattr(options, "parent", None) is not None:
                raise SystemExit(f"twistd elvin: {e}") from None  # no traceback
            raise
        listener.setServiceParent(top)
    federation = getattr(config, "federation", None)
    if federation is not None and federation.enabled:
        from elvin.federation.service import FederationService
        FederationService(router, config, reactor).setServiceParent(top)
    if getattr(config, "discovery", False):
        # Added last, so stopped first: withdraw before the listeners close.
        from elvin.discovery.service import DiscoveryService
        DiscoveryService.from_config(config, reactor=reactor).setServiceParent(top)
    return top


def main(argv=None):  # pragma: no cover - convenience for python -m elvin.tap
    from twisted.scripts.twistd import run
    sys.argv = ["twistd", "-n", "elvin"] + list(argv or sys.argv[1:])
    run()
