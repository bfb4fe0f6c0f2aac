"""The proxy's side of a client channel: the router's stream protocol
(framing, decoding, the back-pressured send queue) serving a ProxyClient.

The only difference: when the channel drains, the client's replay of
stored notifications, which waits for a drained channel, goes on.
"""

from elvin.protocols.server import ElvinServerFactory, ElvinServerProtocol

__all__ = ["ProxyServerProtocol", "ProxyServerFactory"]


class ProxyServerProtocol(ElvinServerProtocol):

    def resumeProducing(self):
        super().resumeProducing()
        if self.session is not None and not self.paused and not self.queue:
            self.session.resumed()


class ProxyServerFactory(ElvinServerFactory):
    """A protocol per accepted channel, all sharing one ProxyCore
    (``self.router``: the name ElvinServerProtocol knows it by)."""

    protocol = ProxyServerProtocol
