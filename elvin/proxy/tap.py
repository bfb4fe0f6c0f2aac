"""``twistd elvin-proxy``: command-line options and the proxy's services.

The proxy (docs/proxy.md) is a client of one upstream router and a router
to its own clients, keeping named sessions for clients that come and go.
"""

import signal
import sqlite3
import sys
import threading
import time
from importlib import resources
from typing import Any, Dict

from twisted.application import internet
from twisted.internet import threads
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from elvin.configvalues import ConfigError
from elvin.core.admission import CLIENT, STATUS
from elvin.endpoints import UnsupportedStackError, listener_service
from elvin.ops.stdlog import bridge_client_logging
from elvin.tap import BindingService, ServiceOptions, _origin, check_listeners
from elvin.proxy.config import (DEFAULT_LISTEN, DEFAULT_UPSTREAM, ProxyConfig,
                                load_proxy_config)
from elvin.core.options import HARD_CEILINGS
from elvin.proxy.core import ProxyCore
from elvin.proxy.counters import NO_RELOAD
from elvin.proxy.guard import PasswordGate
from elvin.protocols.gate import Admission
from elvin.proxy.protocol import ProxyServerFactory
from elvin.proxy.store import Store, StoreError
from elvin.proxy.upstream import Upstream
from elvin.uri import ElvinURI

__all__ = ["Options", "makeService", "ProxyService"]

_DEFAULT_DATABASE = ProxyConfig().database


def example_text():
    """The commented example configuration (conf/elvin-proxy.conf, shipped
    in the package so that ``pip install .`` has it too)."""
    return resources.files("elvin.data").joinpath("elvin-proxy.conf").read_text("utf-8")


class Options(ServiceOptions):
    program = "twistd elvin-proxy"
    see = "settings: docs/proxy.md"

    synopsis = "[-l URI ...] [-u URI] [-d FILE] [-c FILE]"
    longdesc = ("Run an Elvin proxy: it stays subscribed to an upstream router for "
                "its clients' sessions and keeps what matched while they were away. "
                f"With no --listen it listens on {DEFAULT_LISTEN}.")

    optParameters = [
        ["config", "c", None, "Configuration file (print a commented example with "
                              "--print-config; settings: docs/proxy.md)."],
        ["upstream", "u", None, "The upstream router's elvin: URI, or 'discover' "
                                "[default: the configuration's upstream, else "
                                f"{DEFAULT_UPSTREAM}]"],
        ["database", "d", None, "The SQLite file of sessions and what they stored "
                                "[default: the configuration's database, else "
                                f"{_DEFAULT_DATABASE}]"],
    ]

    def __init__(self):
        super().__init__()
        self["listen"] = []

    def opt_listen(self, uri):
        """Accept clients on this elvin: URI (may be given several times)."""
        self["listen"].append(uri)       # checked with the configuration's

    opt_l = opt_listen

    def opt_version(self):
        """Print elvin's version and exit."""
        from elvin import __version__
        print(f"twistd elvin-proxy (elvin) {__version__}")
        sys.exit(0)

    def opt_print_config(self):
        """Print the commented example configuration file and exit."""
        sys.stdout.write(example_text())
        sys.exit(0)

    def postOptions(self):
        self.check_log_format()
        config = ProxyConfig()
        try:
            if self["config"]:
                config = load_proxy_config(self["config"])
            if self["upstream"]:
                config.set("upstream", self["upstream"], "--upstream")
            if self["database"]:
                config.database = self["database"]
            if self["listen"]:
                config.listen = []        # the command line's replace the file's
                config.origins["listen"] = []
            for uri in self["listen"]:
                config.set("listen", uri, "--listen")
        except ConfigError as e:
            self._refuse(str(e))
        if not config.listen:
            config.listen = [ElvinURI(DEFAULT_LISTEN)]
        try:
            check_status_http(config)
            check_listeners(config)
        except (ConfigError, UnsupportedStackError) as e:
            self._refuse(str(e))
        self.proxy_config = config


class ProxyService(BindingService):
    """The proxy: its store, core, upstream connection, listeners and sweep.
    Its listeners are bound once, before twistd daemonises (as the
    router's: ``BindingService``)."""

    log = Logger()
    program = "twistd elvin-proxy"
    kind = "proxy"

    def __init__(self, core, config, store, password_pool=None):
        super().__init__()
        self.core = core
        self.config = config
        self.store = store
        #: The threads that check passwords (scrypt), apart from the reactor's.
        self.password_pool = password_pool

    def startService(self):
        if self.password_pool is not None:
            self.password_pool.start()
        admission = getattr(self.core, "admission", None)
        if admission is not None:
            caps = admission.fit(_connection_caps(self.config), RESERVED_FILES)
            self.core.max_connections = caps[CLIENT]
        super().startService()
        self.log.info("Elvin proxy listening on {uris}; upstream {upstream}; "
                      "{n} sessions in {db}",
                      uris=", ".join(str(u) for u in self.config.listen),
                      upstream=self.config.upstream or "by discovery",
                      n=len(self.core.named), db=self.config.database)
        self._install_hangup()

    #: SIGHUP's handler before ours (put back at stop), while ours is set.
    _hangup_before: Any = None

    def _install_hangup(self):
        """SIGHUP (the router's reload gesture) ends a process by default;
        the proxy does not reload, so it says so in one line and keeps
        running (docs/proxy.md, "Configuration")."""
        from twisted.internet import reactor
        if threading.current_thread() is not threading.main_thread() or not hasattr(
                signal, "SIGHUP"):
            return
        self._hangup_before = signal.signal(
            signal.SIGHUP, lambda *_: reactor.callFromThread(self.hangup))

    def hangup(self):
        self.log.info("SIGHUP: {why}", why=NO_RELOAD)

    def stopService(self):
        if self._hangup_before is not None:
            signal.signal(signal.SIGHUP, self._hangup_before)
            self._hangup_before = None
        self.core.shutdown()
        admission = getattr(self.core, "admission", None)
        if admission is not None:
            admission.stop()
        d = super().stopService()

        def closed(result):
            if self.password_pool is not None:
                self.password_pool.stop()
            self.store.close()
            return result
        return d.addBoth(closed) if d is not None else closed(None)


def _upstream_args(config):
    args: Dict[str, Any] = {}
    if config.upstream is None:
        args["discover"] = True
        if config.upstream_scope:
            args["scope"] = config.upstream_scope
    else:
        args["uri"] = config.upstream
    # As large a send queue as the router allows: it drops (with DropWarn)
    # only what it cannot hold while the proxy is busy. As many
    # subscriptions too: every session's are the proxy's one client's there.
    args["options"] = {option: HARD_CEILINGS[option]
                       for option in ("Send-Queue.Max-Length", "Subscription.Max-Count")}
    if config.upstream_tls_ca:
        args["tls_ca"] = config.upstream_tls_ca
    return args


def _upstream_discoverer(reactor, config):
    """The finder that hears the upstream router announced (and, with
    ``upstream = discover``, finds it), or None."""
    if config.upstream is not None and not config.upstream_discovery:
        return None
    from elvin.discovery.discoverer import Discoverer
    return Discoverer(reactor)


def check_status_http(config):
    """ConfigError for a ``status-listen`` that is not http: checked as the
    options are read, before the router's own TLS checks would speak of a
    certificate the proxy never uses."""
    status = getattr(config, "status_listen", None)
    if status is not None and status[0] != "http":
        scheme, host, port = status
        raise ConfigError(f"{_origin(config, 'status-listen')}status-listen "
                          f"{scheme}://{host}:{port}: the proxy serves its counters over "
                          "http only (on a loopback address, or behind a TLS front end)")


#: Most connections to the status listener at once (as the router's
#: ``status-max-connections`` default), and the open files kept for the
#: database, its journal, the key file, logs and outgoing connections.
STATUS_MAX_CONNECTIONS = 32
RESERVED_FILES = 64


def _connection_caps(config):
    return {CLIENT: config.max_connections, STATUS: STATUS_MAX_CONNECTIONS}


def status_service(reactor, config, core):
    """The operations listener (``status-listen``): the proxy's counters as
    ``/status.json`` and Prometheus ``/metrics``."""
    from twisted.application.internet import StreamServerEndpointService
    from twisted.internet import endpoints
    from elvin.ops.web import StatusSite
    from elvin.proxy.counters import status_root
    check_status_http(config)
    _, host, port = config.status_listen
    upstream = str(config.upstream) if config.upstream is not None else (
        f"discover (scope {config.upstream_scope})" if config.upstream_scope else "discover")
    site = StatusSite(status_root(core, config.status_token, config.listen, upstream),
                      reactor=reactor)
    endpoint = endpoints.TCP4ServerEndpoint(reactor, port, interface=host)
    admission = getattr(core, "admission", None)
    if admission is not None:
        endpoint = admission.endpoint(endpoint, STATUS)
    listener = StreamServerEndpointService(endpoint, site)
    listener._raiseSynchronously = True
    return listener


def makeService(options, reactor=None):
    """Build the service tree for ``twistd elvin-proxy``."""
    if reactor is None:
        from twisted.internet import reactor
    config = getattr(options, "proxy_config", None)
    if config is None:
        options.postOptions()
        config = options.proxy_config
    bridge_client_logging()          # the upstream connection's lines, in our log
    upstream = Upstream(reactor, connect_args=_upstream_args(config),
                        keepalive=config.upstream_keepalive,
                        request_timeout=config.upstream_timeout,
                        probe_interval=config.upstream_probe,
                        discoverer=_upstream_discoverer(reactor, config))
    pool = ThreadPool(0, 2, "elvin-proxy-passwords")
    run = lambda f: threads.deferToThreadPool(reactor, pool, f)  # noqa: E731
    try:
        store = Store(config.database, max_stored=config.max_stored,
                      max_stored_bytes=config.max_stored_bytes or None,
                      max_total_bytes=config.max_total_stored_bytes or None,
                      key_path=config.database_key)
        core = ProxyCore(store, upstream, option_specs=config.option_specs,
                         call_later=reactor.callLater,
                         max_connections=config.max_connections,
                         max_sessions=config.max_sessions,
                         max_sessions_per_host=config.max_sessions_per_host,
                         max_session_subscriptions=config.max_session_subscriptions,
                         max_backlog=config.max_backlog, in_thread=run,
                         max_inflight=config.max_inflight,
                         session_expiry=config.session_expiry or None,
                         gate=PasswordGate(time.time, run=run))
    except StoreError as e:
        raise SystemExit(f"twistd elvin-proxy: {e}") from None
    except sqlite3.DatabaseError as e:
        raise SystemExit(f"twistd elvin-proxy: {config.database}: not a usable proxy "
                         f"database ({e}); move it aside to start with an empty one, or "
                         "restore it from a backup") from None
    if store.sealed_at_open:
        ProxyService.log.info(
            "{path}: sealed {count} secure-only notifications an earlier version kept "
            "in clear", path=config.database, count=store.sealed_at_open)
    upstream.core = core
    # The router's open-file budget (elvin.protocols.gate): idle sockets
    # cannot lock devices out, nor fill the open-file limit.
    core.admission = Admission(_connection_caps(config), reactor)
    top = ProxyService(core, config, store, pool)
    parent = getattr(options, "parent", None)
    if hasattr(options, "get"):
        top.log_format = options.get("log-format", "text")
    if parent is not None:
        top.log_file = parent.get("logfile")
    factory = ProxyServerFactory(core, reactor, config.connect_timeout,
                                 config.client_keepalive)
    for uri in config.listen:
        try:
            listener = listener_service(reactor, uri, core, factory, config)
        except ConfigError as e:
            if getattr(options, "parent", None) is not None:
                raise SystemExit(f"twistd elvin-proxy: {e}") from None
            raise
        listener.setServiceParent(top)
    if config.status_listen is not None:
        try:
            top.status_listener = status_service(reactor, config, core)
            top.status_listener.setServiceParent(top)
        except ConfigError as e:
            raise SystemExit(f"twistd elvin-proxy: {e}") from None
    sweeper = internet.TimerService(config.sweep_interval, core.sweep)
    sweeper.clock = reactor
    sweeper.setServiceParent(top)
    upstream.setServiceParent(top)
    if getattr(options, "parent", None) is not None:
        # Under twistd: bind now, while stderr is the terminal and before
        # daemonising (whose parent would wait for word that never comes).
        try:
            top.privilegedStartService()
        except SystemExit:
            store.close()
            raise
    return top
