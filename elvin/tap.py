"""``twistd elvin``: command-line options and the router's service tree."""

import errno
import sys
import threading

from twisted.application import service
from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.logger import Logger
from twisted.python import usage

from elvin.config import ConfigError, RouterConfig, load
from elvin.endpoints import (TLS, UnsupportedStackError, check_supported,
                             listener_service, stack_kind)
from elvin.protocols.server import ElvinServerFactory
from elvin.core.router import Router
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
        ["config", "c", None, "Configuration file (print a commented example with "
                              "--print-config or elvin-config-example)."],
    ]

    def opt_version(self):
        """Print elvin's version (and Twisted's) and exit."""
        import twisted
        from elvin import __version__
        print(f"twistd elvin (elvin) {__version__}, on Twisted {twisted.__version__}")
        sys.exit(0)

    def opt_print_config(self):
        """Print the commented example configuration file and exit."""
        from elvin.tools.config_example import example_text
        sys.stdout.write(example_text())
        sys.exit(0)

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

    def _refuse(self, message):
        """A configuration problem: under twistd, one line (file and line,
        and where to look) and exit 1, without twistd's page of usage;
        otherwise (called from code) a UsageError."""
        if getattr(self, "parent", None) is not None:
            raise SystemExit(f"twistd elvin: {message}\n"
                             "(see 'twistd elvin --help'; 'twistd elvin --print-config' "
                             "prints a commented example)")
        raise usage.UsageError(message)

    def postOptions(self):
        config = RouterConfig()
        if self["config"]:
            try:
                load(self["config"], config)
            except ConfigError as e:
                self._refuse(str(e))
        if self["listen"]:
            config.listen = list(self["listen"])
        if not config.listen:
            config.listen = [ElvinURI(DEFAULT_LISTEN)]
        if self["verbose"]:
            config.verbose = True
        if self["discovery"]:
            config.discovery = True
        try:
            check_listeners(config)
        except (ConfigError, UnsupportedStackError) as e:
            self._refuse(str(e))
        self.router_config = config


def check_listeners(config):
    """Refuse (ConfigError, UnsupportedStackError) a listener that could not
    work: an unsupported stack, or TLS with unusable certificate files --
    found before starting, to be reported as usage errors."""
    for uri in config.listen:
        check_supported(uri)
    if config.tls_certificate and any(stack_kind(u) == TLS for u in config.listen):
        from elvin.protocols.tls import server_options_from_config
        server_options_from_config(config)


def _short(uri):
    """``elvin://host:port`` for the default stack, else the canonical URI."""
    if uri.protocol == ("tcp", "none", "xdr") and uri.version == (4, 0) and not uri.options:
        host = f"[{uri.host}]" if ":" in uri.host else uri.host
        return f"elvin://{host}:{uri.port}"
    return str(uri)


class RouterService(service.MultiService):
    """The router and its listeners; tells clients goodbye on shutdown."""

    log = Logger()

    def __init__(self, router, config):
        super().__init__()
        self.router = router
        self.config = config

    def privilegedStartService(self):
        """Bind every listener; one that cannot listen stops the router
        with one line naming its URI, the cause and what to try."""
        try:
            super().privilegedStartService()
        except CannotListenError as e:
            raise SystemExit(f"twistd elvin: {self._cannot_listen(e)}") from None

    def _cannot_listen(self, e):
        uris = list(self.config.listen) + list(getattr(self.config.federation, "listen", ()))
        where = next((str(_short(u)) for u in uris if u.port == e.port),
                     f"{e.interface or '*'}:{e.port}")
        code = getattr(e.socketError, "errno", None)
        if code == errno.EADDRINUSE:
            return (f"{where}: address already in use; is another router running? "
                    "use -l to choose another port")
        if code == errno.EACCES:
            return (f"{where}: permission denied (ports below 1024 need privileges); "
                    "use -l with a port above 1023")
        if code == errno.EADDRNOTAVAIL:
            return (f"{where}: {e.interface} is not an address of this host; use -l "
                    "with one of its addresses, or 0.0.0.0 for all")
        return f"{where}: cannot listen: {e.socketError}"

    def startService(self):
        super().startService()
        listening = ", ".join(str(u) for u in self.config.listen)
        self.log.info("Elvin router listening on {uris}", uris=listening)
        if getattr(self.config, "drain", False):
            self.drain()
        self._install_drain_signal()

    def drain(self):
        """Hand every client over to ``redirect-to`` (SIGUSR1, ``drain``),
        or without it to another router of our discovery scope."""
        uri = getattr(self.config, "redirect_to", None)
        if uri is not None:
            return defer.succeed(self.router.drain(_short(uri)))
        if getattr(self.config, "discovery", False):
            return defer.ensureDeferred(self._drain_to_discovered())
        self.log.error("cannot drain: no redirect-to in the configuration and discovery "
                       "is off (where should clients go?)")
        return defer.succeed(0)

    async def _drain_to_discovered(self):
        """Find another router of our scope by discovery and drain to it."""
        from elvin.discovery.discoverer import Discoverer, NoRouterFound
        from twisted.internet import reactor
        config = self.config
        own = {str(u) for u in config.listen}
        service = next((s for s in self if getattr(s, "name", None) == "discovery"), None)
        if service is not None:
            own |= {str(ElvinURI(u)) for u in service.offered_uris()}
        finder = Discoverer(reactor, interface=config.discovery_interface,
                            ttl_limit=config.discovery_ttl, group=config.discovery_group[0],
                            port=config.discovery_group[1], dns_sd=config.discovery_dns_sd)
        await finder.start()
        ours = getattr(service, "router_name", None)
        tried = set()
        deadline = reactor.seconds() + 5.0
        try:
            while True:
                left = deadline - reactor.seconds()
                if left <= 0:
                    raise NoRouterFound("discovery found no other router")
                found = await finder.find(config.discovery_scope or None, left,
                                          exclude=tried)
                others = [uri for record, uri in found
                          if str(uri) not in own and record.name != ours]
                if others:
                    break
                tried |= {(record.name, record.revision, uri) for record, uri in found}
        except NoRouterFound as e:
            self.log.error("cannot drain: {e}", e=e)
            return 0
        finally:
            await finder.stop()
        return self.router.drain(_short(others[0]))

    def _install_drain_signal(self):
        import signal
        from twisted.internet import reactor
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            signal.signal(signal.SIGUSR1,
                          lambda *_: reactor.callFromThread(self.drain))  # noqa
        except (ValueError, AttributeError):   # not the main thread, or no SIGUSR1
            pass

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
    federation_service = None
    if federation is not None and federation.enabled:
        from elvin.federation.service import FederationService
        federation_service = FederationService(router, config, reactor)
        federation_service.setServiceParent(top)
    if getattr(config, "status_listen", None) is not None:
        status_service(reactor, config, router, federation_service).setServiceParent(top)
    if getattr(config, "discovery", False):
        # Added last, so stopped first: withdraw before the listeners close.
        from elvin.discovery.service import DiscoveryService
        DiscoveryService.from_config(config, reactor=reactor).setServiceParent(top)
    return top


def status_service(reactor, config, router, federation_service=None):
    """The operations listener (``status-listen``): page, JSON and metrics."""
    from twisted.application.internet import StreamServerEndpointService
    from twisted.internet import endpoints
    from elvin.ops.web import StatusSite, status_root
    scheme, host, port = config.status_listen
    manager = federation_service.manager if federation_service is not None else None
    domain = manager.domain if manager is not None else None
    site = StatusSite(status_root(router, manager, config.listen, domain,
                                  config.status_token))
    if scheme == "https":
        from elvin.protocols.tls import server_options_from_config
        options = server_options_from_config(config)
        if options is None:
            raise ConfigError("status-listen is https but tls-certificate is not set")
        endpoint = endpoints.SSL4ServerEndpoint(reactor, port, options, interface=host)
    else:
        endpoint = endpoints.TCP4ServerEndpoint(reactor, port, interface=host)
    listener = StreamServerEndpointService(endpoint, site)
    listener._raiseSynchronously = True
    return listener


def main(argv=None):  # pragma: no cover - convenience for python -m elvin.tap
    from twisted.scripts.twistd import run
    sys.argv = ["twistd", "-n", "elvin"] + list(argv or sys.argv[1:])
    run()
