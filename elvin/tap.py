"""``twistd elvin``: command-line options and the router's service tree."""

import errno
import os
import sys
import threading
from typing import Any, Optional

from twisted.application import service
from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.logger import Logger
from twisted.python import usage

from elvin.config import ConfigError, RouterConfig, load
from elvin.configvalues import did_you_mean
from elvin.endpoints import (TLS, UDP, StreamListenerService, UnsupportedStackError, bind_new,
                             check_supported, close_unused, listen_host, listener_service,
                             stack_kind)
from elvin.errors import echoed
from elvin.core.admission import CLIENT, FEDERATION, STATUS
from elvin.protocols.gate import Admission
from elvin.ops.logerrors import WRITE_ERRORS
from elvin.protocols.framing import receive_budget_of
from elvin.protocols.turns import TurnSlice
from elvin.protocols.server import ElvinServerFactory
from elvin.core.options import CEILING_SUFFIX
from elvin.core.router import Router
from elvin.uri import ElvinURI, InvalidURIError

__all__ = ["Options", "ServiceOptions", "makeService", "RouterService", "DEFAULT_LISTEN"]

DEFAULT_LISTEN = "elvin://localhost:2917"
#: Seconds a drain without redirect-to looks for another router by
#: discovery, and waits for each one found to answer.
DRAIN_SEARCH_TIME = 5.0
DRAIN_PROBE_TIMEOUT = 2.0


class ServiceOptions(usage.Options):
    """Options of a twistd plugin (``program``) whose usage errors and
    configuration problems are one line, naming what is wrong, where it
    was given and where to look (``see``), rather than twistd's page of
    usage."""

    program = "twistd elvin"
    see = ""

    optParameters = [
        ["log-format", None, "text", "text (twistd's lines) or json (one JSON object "
                                     "per event, with its fields, for log shippers)."],
    ]

    def check_log_format(self):
        if self["log-format"] not in ("text", "json"):
            self._refuse(f"--log-format must be text or json, not {echoed(self['log-format'])}")

    def parseOptions(self, options=None):
        """As usage.Options; under twistd a bad option or value is one line
        naming it (``_refuse``) rather than twistd's page of usage."""
        try:
            super().parseOptions(options)
        except usage.UsageError as e:
            if getattr(self, "parent", None) is None:
                raise
            self._refuse(self._unknown_option(str(e)))

    def _unknown_option(self, message):
        """getopt's "option --listn not recognized", with the option it
        was probably meant to be."""
        import re
        match = re.fullmatch(r"option (-{1,2})([\w-]+) not recognized", message)
        if match is None:
            return message
        dashes, name = match.groups()
        known = [o.rstrip("=") for o in self.longOpt]
        hint = did_you_mean(name, known) if dashes == "--" else ""
        hint = hint.replace(" (did you mean '", " (did you mean --").replace("'?)", "?)")
        return f"unknown option {dashes}{name}{hint}"

    def _refuse(self, message):
        """A configuration problem: under twistd, one line (file and line,
        and where to look) and exit 1, without twistd's page of usage;
        otherwise (called from code) a UsageError."""
        if getattr(self, "parent", None) is not None:
            see = f"; {self.see}" if self.see else ""
            raise SystemExit(f"{self.program}: {message}\n"
                             f"(see '{self.program} --help'{see})")
        raise usage.UsageError(message)


class Options(ServiceOptions):
    program = "twistd elvin"
    see = "'twistd elvin --print-config' prints a commented example"

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
            raise usage.UsageError(f"-l/--listen: {e}") from None

    opt_l = opt_listen

    def postOptions(self):
        self.check_log_format()
        config = RouterConfig()
        if self["config"]:
            try:
                load(self["config"], config)
            except ConfigError as e:
                self._refuse(str(e))
        apply_overrides(config, command_line_overrides(self))
        try:
            check_startable(config)
        except (ConfigError, UnsupportedStackError) as e:
            self._refuse(str(e))
        self.router_config = config


def command_line_overrides(options):
    """What the command line sets over the file (``-l``, ``--verbose``,
    ``--discovery``), as ``apply_overrides`` takes it: kept by the running
    router so that every reload applies it again (the file does not say
    it, so reading the file alone would turn it off)."""
    overrides = {}
    if options.get("listen"):
        overrides["listen"] = list(options["listen"])
    for flag in ("verbose", "discovery"):
        if options.get(flag):
            overrides[flag] = True
    return overrides


def apply_overrides(config, overrides):
    """Set ``config`` (just read from the file) as the command line says,
    at start and at each reload; no listen at all is DEFAULT_LISTEN."""
    if overrides.get("listen"):
        config.listen = list(overrides["listen"])
        config.origins["listen"] = [("-l", str(uri)) for uri in config.listen]
    if not config.listen:
        config.listen = [ElvinURI(DEFAULT_LISTEN)]
    for flag in ("verbose", "discovery"):
        if overrides.get(flag):
            setattr(config, flag, True)


def check_listeners(config):
    """Refuse (ConfigError, UnsupportedStackError) a listener that could not
    work: an unsupported stack, or TLS (a client or federation listener,
    https status) without a certificate or with unusable certificate files
    -- found before starting (or before a reload changes anything), to be
    reported in one line naming the setting and where it was given."""
    for uri in config.listen:
        check_supported(uri, listening=True)
    federation = getattr(config, "federation", None)
    fed_listen = list(federation.listen) if federation is not None and federation.enabled \
        else []
    check_one_listener_per_address(config, fed_listen)
    tls_users = [("listen", str(u), u.port) for u in config.listen if stack_kind(u) == TLS]
    tls_users += [("Federation.Listen", str(u), u.port) for u in fed_listen
                  if stack_kind(u) == TLS]
    status = getattr(config, "status_listen", None)
    if status is not None and status[0] == "https":
        tls_users.append(("status-listen", f"https://{status[1]}:{status[2]}", None))
    if not tls_users:
        _warn_unused_tls_settings(config, federation)
        return
    if not config.tls_certificate:
        name, value, port = tls_users[0]
        where = _origin(config, name, port)
        if where == "-l: ":
            where, name = "", "-l"
        raise ConfigError(f"{where}{name} {value} needs TLS, but tls-certificate is not "
                          "set (the router's certificate; and tls-key unless the key is "
                          "in the same file)")
    from elvin.protocols.tls import (TLSConfigError, certificate_date_problem,
                                     server_options_from_config)
    try:
        server_options_from_config(config)
    except TLSConfigError as e:
        where = _origin(config, e.setting) if e.setting else ""
        raise TLSConfigError(f"{where}{e}", e.setting) from None
    problem = certificate_date_problem(config.tls_certificate)
    if problem is not None:
        _log.warn("{problem}", problem=problem)     # it starts: the dates may be wrong


def check_one_listener_per_address(config, fed_listen=()):
    """Refuse (ConfigError) two listeners on one address (host as bound,
    port, and TCP or UDP): the same URI given twice, or two URIs that
    bind alike (``elvin://h:2917`` and ``elvin:/secure/h:2917``; client
    and federation listeners). The second could only fail to bind, with
    a message that blames another program; this one names both, and
    where each was given."""
    listeners = [("listen", uri, where) for uri, where
                 in zip(config.listen, _places(config, "listen", config.listen))]
    listeners += [("Federation.Listen", uri, where) for uri, where
                  in zip(fed_listen, _places(config, "Federation.Listen", fed_listen))]
    seen = {}
    for setting, uri, where in listeners:
        kind = "UDP" if stack_kind(uri) == UDP else "TCP"
        address = (listen_host(uri.host), uri.port, kind)
        if address not in seen:
            seen[address] = (setting, uri, where)
            continue
        first_setting, first, first_where = seen[address]
        prefix = f"{where}: " if where and not where.startswith("-") else ""
        also = (f" ({first_where})" if first_where and first_where != where
                and not first_where.startswith("-") else "")
        if (first_setting, first) == (setting, uri):
            also = also.replace(" (", " (first at ")
            raise ConfigError(f"{prefix}{_named(setting, uri, where)} is given twice{also}: "
                              "remove one (one listener per address)")
        raise ConfigError(f"{prefix}{_named(setting, uri, where)} and "
                          f"{_named(first_setting, first, first_where)}{also} both listen on "
                          f"{address[0] or '*'}:{uri.port} ({kind}): give one of them another "
                          "port (one listener per address)")


def _named(setting, uri, where):
    """A listener as the line names it: by its option if the command
    line gave it (``-l``), else by its setting."""
    return f"{where if where.startswith('-') else setting} {_short(uri)}"


def _places(config, setting, uris):
    """Where each of ``uris`` (the values of ``setting``, in order) was
    given: 'file:line', an option ('-l'), or "" when not known."""
    origins = [where for where, _ in getattr(config, "origins", {}).get(setting.lower(), [])]
    if len(origins) == len(uris):
        return origins
    return [_origin(config, setting, uri.port)[:-2] for uri in uris]


_log = Logger()


def _warn_unused_tls_settings(config, federation):
    """Log one line when ``tls-ca`` or ``require-authenticated`` is set but
    nothing uses it (no listener is TLS), so a router an operator believes
    to authenticate its clients does not start silently without."""
    unused = []
    if getattr(config, "require_authenticated", False):
        unused.append("require-authenticated")
    dials_tls = federation is not None and federation.enabled and (
        federation.requires_authentication() or any(
            stack_kind(uri) == TLS for c in federation.classes.values() for uri in c.connect))
    if getattr(config, "tls_ca", None) is not None and not dials_tls:
        unused.insert(0, "tls-ca")
    if not unused:
        return
    def named(name):
        where = _origin(config, name)[:-2]      # "file:line", without ": "
        return f"{name} ({where})" if where else name
    _log.warn("{settings} {verb} no effect: no listener uses TLS (listen, Federation.Listen, "
              "status-listen https), so no client is asked for a certificate",
              settings=" and ".join(named(name) for name in unused),
              verb="has" if len(unused) == 1 else "have")


def check_trace_directory(config):
    """Make ``Federation.Trace-Directory`` now, as the trace writer would:
    one that cannot be made or written to is a configuration error naming
    its line, found before starting (or before a reload changes anything)."""
    federation = getattr(config, "federation", None)
    if federation is None or not federation.enabled or not federation.trace_directory:
        return
    from elvin.federation.trace import TraceDirectoryError
    path = federation.trace_directory
    where = _origin(config, "Federation.Trace-Directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise TraceDirectoryError(path, e, where) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}Federation.Trace-Directory {path}: cannot write in it "
                          "(permission denied)")


def check_startable(config):
    """Everything about ``config`` that can be checked before it is used:
    at start-up and at each reload."""
    check_listeners(config)
    check_trace_directory(config)
    check_reserved_files(config)


def check_reserved_files(config, getrlimit=None):
    """Refuse a ``reserved-files`` that leaves no room for connections
    under the most open files the router can have: it would start with
    every connection cap lowered to 1, which is no working router."""
    from elvin.protocols.gate import REAP_SLACK, reachable_open_files
    limit = reachable_open_files(getrlimit)
    if limit is None:
        return
    others = reserved_files(config) - config.reserved_files + REAP_SLACK
    pools = 3                    # clients, federation, status: one each at least
    if config.reserved_files + others + pools > limit:
        raise ConfigError(
            f"{_origin(config, 'reserved-files')}reserved-files {config.reserved_files} "
            f"leaves no room for connections under the open-file limit the router can "
            f"reach ({limit}, its hard limit): at most {max(0, limit - others - pools)}")


def _origin(config, name, port=None):
    """``'file:line: '`` (or ``'-l: '``) where ``name`` was set, else ""."""
    origin = getattr(config, "origin", None)
    where = origin(name, port) if origin is not None else None
    return f"{where}: " if where else ""


def _short(uri):
    """``elvin://host:port`` for the default stack, else the canonical URI."""
    if uri.protocol == ("tcp", "none", "xdr") and uri.version == (4, 0) and not uri.options:
        host = f"[{uri.host}]" if ":" in uri.host else uri.host
        return f"elvin://{host}:{uri.port}"
    return str(uri)


class BindingService(service.MultiService):
    """A service tree whose listeners are bound once, by the first
    ``privilegedStartService`` (``makeService`` calls it under twistd,
    before it daemonises and redirects stderr to the log, so a port in use
    is told on the terminal and no pidfile is left); one that cannot listen
    stops the program with one line naming its URI, the setting that chose
    it (and where it was given), the cause and what to try."""

    #: How the program names itself in that line, and what else might hold
    #: its port.
    program = "twistd elvin"
    kind = "router"
    config: Any = None
    #: The status listener (``status-listen``), if any, named so in that line.
    status_listener: Any = None
    _bound = False
    #: ``--log-format`` and twistd's ``--logfile``: with "json", the
    #: application's log observer writes one JSON object per event there.
    log_format = "text"
    log_file: Optional[str] = None

    def setServiceParent(self, parent):
        super().setServiceParent(parent)
        if self.log_format == "json" and hasattr(parent, "setComponent"):
            # twistd's AppLogger uses an ILogObserver set on the application.
            from twisted.logger import ILogObserver, jsonFileLogObserver
            out = (sys.stdout if self.log_file in (None, "-")
                   else open(self.log_file, "a", encoding="utf-8"))
            parent.setComponent(ILogObserver, jsonFileLogObserver(out, recordSeparator=""))

    def privilegedStartService(self):
        if self._bound:
            return
        self._bound = True
        service.Service.privilegedStartService(self)
        for child in self:
            try:
                child.privilegedStartService()
            except CannotListenError as e:
                raise SystemExit(f"{self.program}: {self._cannot_listen(e, child)}") from None

    def _listener_setting(self, child, config):
        """(setting, its URIs in ``config``, where) for the listener
        ``child`` (or the name of the setting that made one not yet in the
        tree: a reload's): where is how the line names it when no URI of
        the setting has its port."""
        if child is not None and child is self.status_listener:
            scheme, host, port = config.status_listen
            return "status-listen", [], f"{scheme}://{host}:{port}"
        return "listen", list(config.listen), None

    def _cannot_listen(self, e, child=None, config=None):
        """The line for a listener that could not bind: its URI, the
        setting that chose it (where ``config``, by default the running
        configuration, gave it) and what to change."""
        config = config or self.config
        setting, uris, where = self._listener_setting(child, config)
        if uris:
            where = next((str(_short(u)) for u in uris if u.port == e.port),
                         f"{e.interface or '*'}:{e.port}")
        origin = config.origin(setting, e.port) if hasattr(config, "origin") else None
        if origin in ("-l", "--listen") or (setting == "listen" and origin is None):
            change = "use -l to choose another"
        else:
            where = f"{origin + ': ' if origin else ''}{setting} {where}"
            change = f"change {setting} to another"
        code = getattr(e.socketError, "errno", None)
        if code == errno.EADDRINUSE:
            return (f"{where}: address already in use; is another {self.kind} running? "
                    f"{change} port")
        if code == errno.EACCES:
            return (f"{where}: permission denied (ports below 1024 need privileges); "
                    f"{change} port, above 1023")
        if code == errno.EADDRNOTAVAIL:
            return (f"{where}: {e.interface} is not an address of this host; {change} "
                    "address: one of this host's, or 0.0.0.0 for all")
        return f"{where}: cannot listen: {e.socketError}"


class RouterService(BindingService):
    """The router and its listeners; tells clients goodbye on shutdown."""

    log = Logger()

    def __init__(self, router, config, log_format="text", log_file=None):
        super().__init__()
        self.router = router
        self.config = config
        self.log_format = log_format
        self.log_file = log_file
        #: Client listeners by URI text; the federation service, if any.
        self.listeners = {}
        self.federation_service = None
        self.reactor = None
        self.factory = None
        self.config_path = None
        self.overrides = {}
        #: The configuration the router started with: what reload does not
        #: apply (``_needing_restart``) is compared with it.
        self.started_config = config

    def _listener_setting(self, child, config):
        if child == "Federation.Listen" or (child is not None
                                            and child is self.federation_service):
            return "Federation.Listen", list(config.federation.listen), None
        return super()._listener_setting(child, config)

    def fit_connections(self, config):
        """Raise the soft open-file limit to the hard one, and fit the
        connection caps into it (logging each one lowered); the router's
        max-connections is the client cap then."""
        admission = getattr(self.router, "admission", None)
        if admission is None:
            return
        caps = admission.fit(connection_caps(config), reserved_files(config))
        self.router.max_connections = caps[CLIENT]

    def startService(self):
        self.fit_connections(self.config)
        WRITE_ERRORS.install()          # counts log lines lost to failing writes
        super().startService()
        listening = ", ".join(str(u) for u in self.config.listen)
        self.log.info("Elvin router listening on {uris}", uris=listening)
        if getattr(self.config, "drain", False):
            self.drain()
        self._install_drain_signal()

    def drain(self):
        """Hand every client over to ``redirect-to`` (SIGUSR1, ``drain``),
        or without it to another router of our discovery scope: first
        leave the federation's tree (``_leave_federation``), then redirect
        clients. Fires with how many were redirected."""
        uri = getattr(self.config, "redirect_to", None)
        if uri is not None:
            return self._leave_then_drain(_short(uri))
        if getattr(self.config, "discovery", False):
            return defer.ensureDeferred(self._drain_to_discovered())
        self.log.error("cannot drain: no redirect-to in the configuration and discovery "
                       "is off (where should clients go?)")
        return defer.succeed(0)

    async def _drain_to_discovered(self):
        """Find another router of our scope by discovery and drain to it.

        Adverts are unauthenticated, so a URI found is tried first
        (``_answers``): clients are sent only where an Elvin router
        answers, not wherever one forged advert points."""
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
        deadline = reactor.seconds() + DRAIN_SEARCH_TIME
        chosen = None
        try:
            while chosen is None:
                left = deadline - reactor.seconds()
                if left <= 0:
                    raise NoRouterFound("discovery found no other router that answers")
                found = await finder.find(config.discovery_scope or None, left,
                                          exclude=tried)
                for record, uri in found:
                    tried.add((record.name, record.revision, uri))
                    if str(uri) in own or record.name == ours:
                        continue
                    if await self._answers(uri, record, reactor):
                        chosen = uri
                        break
        except NoRouterFound as e:
            self.log.error("cannot drain: {problem}", problem=str(e))
            return 0
        finally:
            await finder.stop()
        return await self._leave_then_drain(_short(chosen))

    async def _answers(self, uri, record, reactor):
        """Does an Elvin router answer at ``uri`` (a ConnRqst answered, then
        closed)? A TLS URI is checked for a listener only: its certificate
        is for the clients to judge."""
        from elvin import client
        from twisted.internet.endpoints import connectProtocol
        from twisted.internet.protocol import Protocol
        from elvin.endpoints import hostname_endpoint
        try:
            if uri.is_secure:
                endpoint = hostname_endpoint(reactor, uri.host, uri.port,
                                             timeout=DRAIN_PROBE_TIMEOUT)
                probe = await connectProtocol(endpoint, Protocol())
                probe.transport.loseConnection()
            else:
                conn = await client.connect(str(uri), reactor=reactor,
                                            timeout=DRAIN_PROBE_TIMEOUT,
                                            follow_redirects=False)
                await conn.close()
        except Exception as e:
            self.log.warn("drain: {uri}, advertised by {name}, does not answer ({why}); "
                          "not sending clients there", uri=_short(uri), name=record.name,
                          why=str(e) or type(e).__name__)
            return False
        return True

    def _leave_federation(self):
        """Take this router off the federation's tree, make before break
        (``FederationManager.leave``: bounded); fires once its mesh peers
        have rerouted. It stays off (a drained router carries no one
        else's traffic)."""
        fed = self.federation_service
        return fed.manager.leave() if fed is not None else defer.succeed(None)

    def _leave_then_drain(self, uri):
        return self._leave_federation().addCallback(lambda _: self.router.drain(uri))

    def reload(self):
        """Read the configuration file again and apply it (SIGHUP, or POST
        /reload): limits, listeners added or removed, federation changed;
        clients keep their sessions. A file with an error, or a listener
        it adds that cannot bind, is refused whole (logged with file and
        line) and the running configuration stays. Always fires with
        (applied, message), so POST /reload is always answered."""
        return defer.ensureDeferred(self._reload()).addErrback(self._reload_failed)

    def _reload_failed(self, failure):
        """An error no check foresaw: logged with its traceback, and said."""
        self.log.failure("reload failed", failure)
        return False, f"reload failed: {failure.getErrorMessage()}"

    def _refuse_reload(self, problem):
        # Text, not the exception: a JSON log could not keep that.
        self.log.error("reload refused, running configuration kept: {problem}",
                       problem=problem)
        return False, f"refused: {problem}"

    async def _reload(self):
        if not self.config_path:
            message = "no configuration file to reload (start with -c FILE)"
            self.log.warn("reload: {problem}", problem=message)
            return False, message
        try:
            new = load(self.config_path, RouterConfig())
            apply_overrides(new, self.overrides)
            check_startable(new)
        except (ConfigError, UnsupportedStackError) as e:
            return self._refuse_reload(str(e))
        # Everything that can fail first: bind what the file adds and make
        # its federation. Only then change anything.
        added, setting = {}, "listen"
        try:
            added = self._bind_listeners(new)
            setting = "Federation.Listen"
            federation = self._prepare_federation(new)
        except CannotListenError as e:
            await close_unused(added.values())
            return self._refuse_reload(self._cannot_listen(e, setting, new))
        except (ConfigError, UnsupportedStackError, OSError) as e:
            await close_unused(added.values())
            return self._refuse_reload(str(e))
        changes = reloaded_changes(self.config, new)
        self._apply_limits(new)
        wanted = {str(uri) for uri in new.listen}
        for text in [t for t in self.listeners if t not in wanted]:
            listener = self.listeners.pop(text)
            await defer.maybeDeferred(listener.stopService)
            listener.disownServiceParent()
            changes.append(f"stopped listening on {text}")
        for text, listener in added.items():
            listener.setServiceParent(self)        # bound already: starts it
            self.listeners[text] = listener
            changes.append(f"listening on {text}")
        changes += await self._apply_federation(new, federation)
        self.config = new
        message = "reloaded: " + ("; ".join(changes) if changes else "nothing changed")
        restart = _needing_restart(self.started_config, new)
        if restart:
            message += f"; changed but applied only at restart: {', '.join(restart)}"
        self.log.info("{summary}", summary=message)   # ("message" is legacy logging's key)
        return True, message

    def _bind_listeners(self, config):
        """Bind the client listeners ``config`` adds (``bind_new``), not
        yet serving the router."""
        return bind_new(config.listen, self.listeners, lambda uri: listener_service(
            self.reactor, uri, self.router, self.factory, config))

    def _prepare_federation(self, config):
        """What ``_apply_federation`` needs, made and bound before anything
        changes: ``("reconfigure", listeners bound)`` to change the running
        federation in place, ``("restart", service or None, why)`` to
        replace it (None: federation off), or None for no federation."""
        running, fed = self.federation_service, config.federation
        if running is not None and fed.enabled:
            why = running.restart_needed(config)
            if why is None:
                return ("reconfigure", running.bind(config, held=running.listeners))
        elif running is None and not fed.enabled:
            return None
        else:
            why = None
        fresh = None
        if fed.enabled:
            from elvin.federation.service import FederationService
            fresh = FederationService(self.router, config, self.reactor)
            try:
                fresh.bind(config, held=running.listeners if running is not None else ())
            except BaseException:
                fresh.discard()
                raise
        return ("restart", fresh, why)

    async def _apply_federation(self, config, prepared):
        """Change federation as ``_prepare_federation`` made ready; returns
        what changed, as phrases for the reload line."""
        if prepared is None:
            return []
        if prepared[0] == "reconfigure":
            return await self.federation_service.reconfigure(config, prepared[1])
        _, fresh, why = prepared
        running = self.federation_service
        if running is not None:
            if fresh is not None:
                fresh.take_listeners(running)       # their ports stay open
            await defer.maybeDeferred(running.stopService)
            running.disownServiceParent()
            self.federation_service = None
        if fresh is None:
            return ["federation stopped"]
        self.federation_service = fresh
        fresh.setServiceParent(self)                # bound already: starts it
        return ["federation restarted" + (f" ({why})" if why else "")]

    def _apply_limits(self, config):
        """Set the router's limits, and connection option ranges, to ``config``'s."""
        router = self.router
        router.max_connections = config.max_connections
        self.fit_connections(config)
        for apply in RELOADED.values():
            if apply is not None:
                apply(router, config)
        router.option_specs = dict(config.option_specs)   # sessions' ranges from now on

    def _install_drain_signal(self):
        import signal
        from twisted.internet import reactor
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            signal.signal(signal.SIGUSR1,
                          lambda *_: reactor.callFromThread(self.drain))  # noqa
            signal.signal(signal.SIGHUP,
                          lambda *_: reactor.callFromThread(self.reload))  # noqa
        except (ValueError, AttributeError):   # not the main thread, or no SIGUSR1
            pass

    def stopService(self):
        """Leave the federation's tree first (make before break: bounded,
        see FederationManager.leave), then say goodbye to clients and
        close everything."""
        return self._leave_federation().addCallback(lambda _: self._stop())

    def _stop(self):
        router = self.router
        outputs = [s.output for s in router.sessions if hasattr(s.output, "whenClosed")]
        before = router.stats["dropped_deliveries"]
        router.shutdown()
        admission = getattr(router, "admission", None)
        if admission is not None:
            admission.stop()
        done = self._let_clients_finish(outputs)
        done.addCallback(self._log_stopped, len(outputs), before)
        done.addCallback(lambda _: super(RouterService, self).stopService())
        done.addBoth(self._stopped)
        return done

    def _stopped(self, result):
        WRITE_ERRORS.uninstall()
        return result

    def _let_clients_finish(self, outputs):
        """Wait until every client channel has closed (each had its queue
        flushed and Disconn 1 written last), or ``shutdown-grace`` seconds:
        then close those still open at once, counting what they did not
        get. Fires with how many were closed so."""
        if self.reactor is None:
            from twisted.internet import reactor as clock
        else:
            clock = self.reactor
        grace = getattr(self.config, "shutdown_grace", 10.0)
        cut = []

        def over():
            cut.extend(output for output in outputs if output.cutOff())

        timer = clock.callLater(grace, over)

        def finished(_):
            if timer.active():
                timer.cancel()
            return len(cut)

        done = defer.DeferredList([output.whenClosed() for output in outputs])
        return done.addCallback(finished)

    def _log_stopped(self, cut, clients, before):
        """One line with the totals, since metrics die with the process."""
        stats = self.router.stats
        grace = getattr(self.config, "shutdown_grace", 10.0)
        self.log.info("router stopping: {clients} client channels closed ({cut} of them "
                      "at once, still open after shutdown-grace {grace:g} s); {lost} "
                      "deliveries dropped while stopping; since start {deliveries} "
                      "deliveries, {dropped} dropped (dropped_deliveries), {slow} slow "
                      "clients disconnected", clients=clients, cut=cut, grace=grace,
                      lost=stats["dropped_deliveries"] - before,
                      deliveries=stats["deliveries"], dropped=stats["dropped_deliveries"],
                      slow=stats["slow_client_disconnections"])

def _router_attribute(attr):
    """Apply a setting by setting the router's ``attr`` to its new value."""
    def apply(router, new):
        setattr(router, attr, getattr(new, attr))
    return apply


def _set_turn_time(router, milliseconds):
    """Apply ``max-turn-time``: each reading turn from now on."""
    router.turn_slice.seconds = milliseconds / 1000


def _memory_cap(setting, owner):
    """Apply a memory cap ``setting`` to ``owner(router).max_bytes``."""
    def apply(router, new):
        owner(router).max_bytes = getattr(new, setting)
    return apply


def _handshake_limit(attr, setting):
    """Apply a TLS handshake bound ``setting`` to the connection budget."""
    def apply(router, new):
        admission = getattr(router, "admission", None)
        if admission is not None:
            setattr(admission.budget, attr, getattr(new, setting))
            admission.watch()
    return apply


#: The router settings a reload applies, each with how (None: through
#: ``fit_connections``, or read from the configuration when next needed);
#: the reload line names every one that changed (``reloaded_changes``).
#: Each router setting is here, in RESTART_ONLY, or is ``listen``
#: (which reload handles listener by listener): test_tap checks.
RELOADED = {
    "max-connections": None,                 # refitted to the open-file limit
    "max-federation-connections": None,      # likewise
    "reserved-files": None,                  # likewise
    "max-subscriptions": _router_attribute("max_subscriptions"),
    "max-subscription-tokens": _router_attribute("max_subscription_tokens"),
    "max-client-subscription-bytes": _router_attribute("max_client_subscription_bytes"),
    "max-client-subscription-memory": _router_attribute("max_client_subscription_memory"),
    "max-subscription-memory": _router_attribute("max_subscription_memory"),
    "max-pattern-work": _router_attribute("max_pattern_work"),
    "max-evaluation-bytes": _router_attribute("max_evaluation_bytes"),
    "max-heavy-evaluation-bytes": _router_attribute("max_heavy_evaluation_bytes"),
    "max-client-quenches": _router_attribute("max_client_quenches"),
    "max-protocol-errors": _router_attribute("max_protocol_errors"),
    "protocol-error-window": _router_attribute("protocol_error_window"),
    "verbose": _router_attribute("verbose"),
    "max-queue-memory": _memory_cap("max_queue_memory", lambda r: r.queue_budget),
    "max-quench-memory": _memory_cap("max_quench_memory", lambda r: r.quench),
    "max-receive-memory": _memory_cap("max_receive_memory", receive_budget_of),
    "max-turn-time": lambda router, new: _set_turn_time(router, new.max_turn_time),
    "redirect-to": None,                     # read by the next drain
    "shutdown-grace": None,                  # read when the router stops
    "max-tls-handshakes": _handshake_limit("max_handshakes", "max_tls_handshakes"),
    "tls-handshake-timeout": _handshake_limit("handshake_timeout", "tls_handshake_timeout"),
}

#: Settings a reload does not apply (docs/operations.md): the status
#: listener, the TLS files of running listeners, what listeners and
#: channels were made with (timeouts), starting drained, discovery.
RESTART_ONLY = ("status-listen", "status-token", "status-max-connections",
                "status-idle-timeout", "tls-certificate", "tls-key", "tls-ca",
                "require-authenticated", "connect-timeout", "client-keepalive",
                "crowded-idle-timeout",
                "http-session-timeout", "http-poll-timeout", "drain")


def reloaded_changes(old, new):
    """A phrase for each setting of RELOADED, and each connection option
    default or ceiling, that differs from ``old`` to ``new`` (the reload
    line)."""
    changes = []
    for name in RELOADED:
        attr = name.replace("-", "_")
        value = getattr(new, attr)
        if getattr(old, attr) != value:
            changes.append(f"{name} {'none' if value is None else value}")
    for option, spec in new.option_specs.items():
        before = old.option_specs.get(option)
        if before is None or before.default != spec.default:
            changes.append(f"{option} {spec.default}")
        if before is None or before.high != spec.high:
            changes.append(f"{option}{CEILING_SUFFIX} {spec.high}")
    return changes


def _needing_restart(running, new):
    """The settings changed from ``running`` to ``new`` that a reload
    does not apply, so the reply can say a restart is needed."""
    from elvin.discovery.settings import DISCOVERY_SETTINGS
    names = [(name, name.replace("-", "_")) for name in RESTART_ONLY]
    names += [(setting.name, setting.attr) for setting in DISCOVERY_SETTINGS]
    return [name for name, attr in names
            if getattr(running, attr, None) != getattr(new, attr, None)]


def connection_caps(config):
    """The configured cap of each connection pool (elvin.core.admission)."""
    return {CLIENT: config.max_connections, FEDERATION: config.max_federation_connections,
            STATUS: config.status_max_connections}


def reserved_files(config):
    """Open files the router needs besides accepted connections:
    ``reserved-files``, one per listener and outgoing federation link, and
    a few for discovery's sockets."""
    federation = getattr(config, "federation", None)
    count = config.reserved_files + len(config.listen)
    count += config.status_listen is not None
    if federation is not None and federation.enabled:
        count += len(federation.listen)
        count += sum(len(c.connect) for c in federation.classes.values())
    if getattr(config, "discovery", False):
        count += 4
    return count


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
                    protocol_error_window=config.protocol_error_window,
                    max_subscription_tokens=config.max_subscription_tokens,
                    max_client_subscription_bytes=config.max_client_subscription_bytes,
                    max_pattern_work=config.max_pattern_work,
                    max_evaluation_bytes=config.max_evaluation_bytes,
                    max_client_quenches=config.max_client_quenches,
                    max_heavy_evaluation_bytes=config.max_heavy_evaluation_bytes,
                    max_subscription_memory=config.max_subscription_memory,
                    max_client_subscription_memory=config.max_client_subscription_memory)
    router.admission = Admission(connection_caps(config), reactor,
                                 config.crowded_idle_timeout,
                                 max_handshakes=config.max_tls_handshakes,
                                 handshake_timeout=config.tls_handshake_timeout)
    receive_budget_of(router).max_bytes = config.max_receive_memory
    router.turn_slice = TurnSlice(config.max_turn_time / 1000, reactor)
    router.quench.max_bytes = config.max_quench_memory
    parent = getattr(options, "parent", None)
    top = RouterService(router, config, options.get("log-format", "text") if hasattr(
        options, "get") else "text", parent.get("logfile") if parent is not None else None)
    factory = ElvinServerFactory(router, reactor, config.connect_timeout,
                                 config.client_keepalive)
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
        top.listeners[str(uri)] = listener
    top.reactor, top.factory = reactor, factory
    top.config_path = options.get("config") if hasattr(options, "get") else None
    top.overrides = command_line_overrides(options) if hasattr(options, "get") else {}
    federation = getattr(config, "federation", None)
    if federation is not None and federation.enabled:
        from elvin.federation.service import FederationService
        try:
            top.federation_service = FederationService(router, config, reactor)
        except ConfigError as e:   # e.g. a Trace-Directory that is a file
            if parent is not None:
                raise SystemExit(f"twistd elvin: {e}") from None  # no traceback
            raise
        top.federation_service.setServiceParent(top)
    if getattr(config, "status_listen", None) is not None:
        status = status_service(reactor, config, router, top)
        top.status_listener = status
        status.setServiceParent(top)
    if getattr(config, "discovery", False):
        # Added last, so stopped first: withdraw before the listeners close.
        from elvin.discovery.service import DiscoveryService
        DiscoveryService.from_config(config, reactor=reactor).setServiceParent(top)
    if parent is not None:
        # Under twistd: bind now, while stderr is the terminal and before
        # daemonising (whose parent would wait for word that never comes).
        top.privilegedStartService()
    return top


def status_service(reactor, config, router, top=None):
    """The operations listener (``status-listen``): page, JSON, metrics and
    (with a token) ``POST /reload``."""
    from twisted.internet import endpoints
    from elvin.ops.web import StatusSite, status_root
    scheme, host, port = config.status_listen

    # Read at each request: a reload changes listeners and federation.
    def manager():
        service_ = getattr(top, "federation_service", None)
        return service_.manager if service_ is not None else None

    def domain():
        return manager().domain if manager() is not None else None

    def listeners():
        return top.config.listen if top is not None else config.listen

    def discovery():
        return next((s for s in (top or ()) if getattr(s, "name", None) == "discovery"), None)
    site = StatusSite(status_root(router, manager, listeners, domain, config.status_token,
                                  reload=getattr(top, "reload", None), discovery=discovery),
                      timeout=getattr(config, "status_idle_timeout", 10.0), reactor=reactor)
    site.url = f"{scheme}://{host or '0.0.0.0'}:{port}/"
    endpoint = endpoints.TCP4ServerEndpoint(reactor, port, interface=host)
    admission = getattr(router, "admission", None)
    if admission is not None:
        # Admitted (or refused) before any TLS, like the client listeners.
        endpoint = admission.endpoint(endpoint, STATUS)
    if scheme == "https":
        from elvin.protocols.tls import server_options_from_config
        options = server_options_from_config(config)
        if options is None:
            raise ConfigError("status-listen is https but tls-certificate is not set")
        endpoint = endpoints.wrapServerTLS(options, endpoint)
    return StreamListenerService(endpoint, site)


def main(argv=None):  # pragma: no cover - convenience for python -m elvin.tap
    from twisted.scripts.twistd import run
    sys.argv = ["twistd", "-n", "elvin"] + list(argv or sys.argv[1:])
    run()
