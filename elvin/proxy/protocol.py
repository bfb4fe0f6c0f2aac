"""The proxy's side of a client channel: the router's stream protocol
(framing, decoding, the back-pressured send queue) serving a ProxyClient.

The only difference: when the channel drains, the client's replay of
stored notifications, which waits for a drained channel, goes on. The
same holds in an HTTP tunnel (``ProxyTunnelProtocol``), whose channel
drains when the client's GET takes what waited.
"""

from elvin.protocols.httptunnel import TunnelServerProtocol
from elvin.protocols.server import ElvinServerFactory, ElvinServerProtocol

__all__ = ["ProxyServerProtocol", "ProxyTunnelProtocol", "ProxyServerFactory"]


class ProxyServerProtocol(ElvinServerProtocol):

    def resumeProducing(self):
        super().resumeProducing()
        if self.session is not None and not self.paused and not self.queue:
            self.session.resumed()


class ProxyTunnelProtocol(TunnelServerProtocol, ProxyServerProtocol):
    """The proxy's protocol inside an HTTP tunnel: the tunnel's idleness,
    the proxy's replay on draining."""


class ProxyServerFactory(ElvinServerFactory):
    """A protocol per accepted channel, all sharing one ProxyCore
    (``self.router``: the name ElvinServerProtocol knows it by); the
    ``tunnel_protocol`` serves a channel of an HTTP tunnel listener."""

    protocol = ProxyServerProtocol
    tunnel_protocol = ProxyTunnelProtocol
