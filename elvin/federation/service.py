"""The federation part of the ``twistd elvin`` service tree."""

from twisted.application import service
from twisted.application.internet import StreamServerEndpointService
from twisted.internet import defer
from twisted.logger import Logger

from elvin.endpoints import STACK_KINDS, TLS, check_supported, client_endpoint, server_endpoint
from elvin.federation import filters as F
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
        classes = [FederationClass(c.name, F.parse_filter(c.subscribe),
                                   F.parse_filter(c.provide), c.hosts,
                                   c.require_authenticated)
                   for c in fed.classes.values()]
        domain = fed.domain()
        trace = None
        if fed.trace_directory:
            trace = TraceWriter(fed.trace_directory, domain, fed.trace_max_bytes,
                                fed.trace_max_seconds)
        self.manager = FederationManager(
            router, domain, classes, fed.default_class, reactor, fed.max_filter_nodes,
            trace=trace, require_authenticated_hosts=fed.require_authenticated_hosts,
            mesh=fed.mesh, mesh_interval=fed.mesh_interval, mesh_grace=fed.mesh_grace)
        tls = None
        for uri in fed.listen:
            uri = check_supported(uri)
            if STACK_KINDS[uri.protocol] == TLS and tls is None:
                from elvin.protocols.tls import server_options_from_config
                tls = server_options_from_config(config)
            admission = getattr(router, "admission", None)
            gate = (None if admission is None
                    else lambda endpoint: admission.endpoint(endpoint, "federation"))
            listener = StreamServerEndpointService(
                server_endpoint(reactor, uri, tls=tls if STACK_KINDS[uri.protocol] == TLS else None,
                                gate=gate),
                AcceptorFactory(self.manager, fed.keepalive))
            listener._raiseSynchronously = True
            listener.setServiceParent(self)
        for fed_class in classes:
            for uri in fed.classes[fed_class.name].connect:
                endpoint = client_endpoint(reactor, uri, tls_ca=config.tls_ca,
                                           tls_certificate=config.tls_certificate,
                                           tls_key=config.tls_key)
                connector_service(reactor, endpoint,
                                  ConnectorFactory(self.manager, fed_class, fed.keepalive)
                                  ).setServiceParent(self)

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
