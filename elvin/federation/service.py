"""The federation part of the ``twistd elvin`` service tree."""

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger

from elvin.endpoints import (STACK_KINDS, TLS, StreamListenerService, bind_new,
                             check_supported, client_endpoint, close_unused, server_endpoint)
from elvin.federation import filters
from elvin.federation.manager import FederationClass, FederationManager
from elvin.federation.protocol import AcceptorFactory, ConnectorFactory, connector_service
from elvin.federation.trace import TraceWriter

__all__ = ["FederationService"]


class FederationService(service.MultiService):
    """Federation listeners and outgoing links, the manager and the trace."""

    log = Logger()

    def __init__(self, router, config, reactor):
        super().__init__()
        fed = config.federation
        self.config = fed
        self.router_config = config
        self.reactor = reactor
        classes = [_federation_class(c) for c in fed.classes.values()]
        domain = fed.domain()
        trace = None
        if fed.trace_directory:
            origin = getattr(config, "origin", None)
            where = origin("Federation.Trace-Directory") if origin is not None else None
            trace = TraceWriter(fed.trace_directory, domain, fed.trace_max_bytes,
                                fed.trace_max_seconds, where=f"{where}: " if where else "")
        self.manager = FederationManager(
            router, domain, classes, fed.default_class, reactor, fed.max_filter_nodes,
            trace=trace, require_authenticated_hosts=fed.require_authenticated_hosts,
            mesh=fed.mesh, mesh_interval=fed.mesh_interval, mesh_grace=fed.mesh_grace,
            filter_refresh=fed.filter_refresh, subscribe_wait=fed.subscribe_wait)
        self.keepalive = fed.keepalive
        self._tls = None
        #: Listener services by URI text; link keepers by (class, URI text).
        self.listeners = {}
        self.connectors = {}
        for uri in fed.listen:
            self._listen(uri)
        for fed_class in classes:
            for uri in fed.classes[fed_class.name].connect:
                self._dial(fed_class, uri)

    def _listener(self, uri):
        """A listener for links on ``uri``, not yet bound."""
        uri = check_supported(uri, listening=True)
        tls = None
        if STACK_KINDS[uri.protocol] == TLS:
            if self._tls is None:
                from elvin.protocols.tls import server_options_from_config
                self._tls = server_options_from_config(self.router_config)
            tls = self._tls
        admission = getattr(self.manager.router, "admission", None)
        gate = (None if admission is None
                else lambda endpoint: admission.endpoint(endpoint, "federation"))
        return StreamListenerService(server_endpoint(self.reactor, uri, tls=tls, gate=gate),
                                     AcceptorFactory(self.manager, self.keepalive))

    def _listen(self, uri, listener=None):
        """Add a listener on ``uri`` (``listener`` if bound already); it
        binds now if we are running."""
        listener = listener or self._listener(uri)
        listener.setServiceParent(self)
        self.listeners[str(check_supported(uri))] = listener
        return listener

    def bind(self, config, held=()):
        """Bind the listeners ``config`` adds to ours (all of them for a
        service not started), except those on URIs in ``held`` (a running
        service's, that ``take_listeners`` hands over): a reload binds
        before it changes anything (``bind_new``)."""
        def make(uri):
            return self.listeners.get(str(check_supported(uri))) or self._listener(uri)
        return bind_new(config.federation.listen, held, make)

    def take_listeners(self, running):
        """Take over the listeners of ``running`` (the service this one
        replaces) on the URIs both listen on, still bound: its peers
        reconnect to this one's manager on the same port, which is never
        closed, so nothing else can take it meanwhile. Call before
        ``running`` stops."""
        for text, listener in list(running.listeners.items()):
            mine = self.listeners.get(text)
            if mine is None:
                continue
            self.removeService(mine)             # never bound: we are not running
            del running.listeners[text]
            running.services.remove(listener)    # not removeService: that would stop it
            listener.parent = None
            listener.factory.manager = self.manager
            listener.factory.keepalive = self.keepalive
            listener.setServiceParent(self)
            self.listeners[text] = listener

    def discard(self):
        """Undo a service made for a reload that was refused: close what
        it bound and its trace; nothing was started."""
        close_unused(self.listeners.values())
        return self.manager.shutdown()

    def _dial(self, fed_class, uri):
        config = self.router_config
        endpoint = client_endpoint(self.reactor, uri, tls_ca=config.tls_ca,
                                   tls_certificate=config.tls_certificate,
                                   tls_key=config.tls_key)
        factory = ConnectorFactory(self.manager, fed_class, self.keepalive)
        keeper = connector_service(self.reactor, endpoint, factory, name=str(uri),
                                   host=getattr(uri, "host", None))
        keeper.setServiceParent(self)
        self.connectors[(fed_class.name, str(uri))] = keeper
        return keeper

    def restart_needed(self, config):
        """Why ``config`` cannot be applied to the running federation, or
        None: a new router domain, mesh switched on or off, or new trace
        settings need a new manager (and so new links)."""
        old, new = self.config, config.federation
        for name in ("router_name", "mesh", "trace_directory", "trace_max_bytes",
                     "trace_max_seconds"):
            if getattr(old, name) != getattr(new, name):
                return f"Federation.{name.replace('_', '-')} changed"
        return None

    async def reconfigure(self, config, bound=None):
        """Apply ``config`` (a reload) changing only what changed: links
        and listeners are added and removed one by one, classes' filters
        and patterns change in place (the links of a class that goes are
        closed), the rest takes effect for what comes next. ``bound``: the
        new listeners, bound already (``bind``). Returns what changed, as
        phrases for the log (``restart_needed`` first)."""
        bound = dict(bound or {})
        old, new = self.config, config.federation
        manager, changes = self.manager, []
        self.router_config = config
        if old.keepalive != new.keepalive:
            self.keepalive = new.keepalive
            for listener in self.listeners.values():
                listener.factory.keepalive = new.keepalive
            for keeper in self.connectors.values():
                keeper.factory.keepalive = new.keepalive
            changes.append(f"federation keepalive {new.keepalive:g} s for new links")
        for name in ("default_class", "max_filter_nodes", "mesh_interval", "mesh_grace",
                     "filter_refresh", "subscribe_wait"):
            if getattr(old, name) != getattr(new, name):
                setattr(manager, name, getattr(new, name))
                changes.append(f"Federation.{name.replace('_', '-')} {getattr(new, name)}")
        if old.require_authenticated_hosts != new.require_authenticated_hosts:
            manager.require_authenticated_hosts = tuple(new.require_authenticated_hosts)
            changes.append("Federation.Require-Authenticated patterns")
        filters_changed = False
        for name in list(manager.classes):
            if name not in new.classes:
                del manager.classes[name]
                for link in [l for l in manager.links if l.fed_class is not None
                             and l.fed_class.name == name]:
                    link.close("federation class removed")
                changes.append(f"federation class {name} removed")
        for name, wanted in new.classes.items():
            current = manager.classes.get(name)
            if current is None:
                manager.classes[name] = _federation_class(wanted)
                changes.append(f"federation class {name} added")
            elif _class_settings(old.classes[name]) != _class_settings(wanted):
                fresh = _federation_class(wanted)
                filters_changed |= (current.import_tree != fresh.import_tree)
                current.__dict__.update(fresh.__dict__)   # links keep their object
                changes.append(f"federation class {name} changed")
        if filters_changed:
            manager.schedule_update()
        wanted_listen = {str(check_supported(uri)): uri for uri in new.listen}
        for text in [t for t in self.listeners if t not in wanted_listen]:
            listener = self.listeners.pop(text)
            await defer.maybeDeferred(listener.disownServiceParent)   # stops it
            changes.append(f"stopped federation listener {text}")
        for text, uri in wanted_listen.items():
            if text not in self.listeners:
                self._listen(uri, bound.pop(text, None))    # bound now if not before
                changes.append(f"federation listener {text}")
        wanted_links = {(name, str(uri)): uri for name, c in new.classes.items()
                        for uri in c.connect}
        for key in [k for k in self.connectors if k not in wanted_links]:
            keeper = self.connectors.pop(key)
            await defer.maybeDeferred(keeper.disownServiceParent)   # stops it
            changes.append(f"federation link to {key[1]} closed")
        for key, uri in wanted_links.items():
            if key not in self.connectors:
                self._dial(manager.classes[key[0]], uri)
                changes.append(f"federation link to {key[1]} ({key[0]}) dialled")
        self.config = new
        return changes

    def startService(self):
        super().startService()
        fed = self.config
        self.log.info("federation: router domain {domain}; listening on {listen}; "
                      "links to {links}; classes {classes}",
                      domain=self.manager.domain,
                      listen=", ".join(str(u) for u in fed.listen) or "nothing",
                      links=", ".join(f"{u} ({c.name})" for c in fed.classes.values()
                                      for u in c.connect) or "nobody",
                      classes=", ".join(f"{c.name} (subscribe {c.subscribe}; provide "
                                        f"{c.provide}; hosts {' '.join(c.hosts) or '-'})"
                                        for c in fed.classes.values()) or "none")

    def stopService(self):
        """Fires once links are closed and the trace is on disk."""
        trace_closed = self.manager.shutdown()
        return defer.gatherResults([defer.maybeDeferred(super().stopService), trace_closed])


def _federation_class(config):
    """The manager's FederationClass for one class's settings."""
    return FederationClass(config.name, filters.parse_filter(config.subscribe),
                           filters.parse_filter(config.provide), config.hosts,
                           config.require_authenticated)


def _class_settings(config):
    """What a class is configured to be (not where it was written)."""
    return (config.subscribe, config.provide, tuple(config.hosts),
            config.require_authenticated)
