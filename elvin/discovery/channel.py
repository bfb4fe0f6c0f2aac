"""ERDP over IPv4 multicast on Twisted (draft section 6.1).

A ``MulticastChannel`` owns two UDP sockets:

* the receiver, bound to the group address and port (224.4.0.1:2917 by
  default) with address reuse, so every router and client on the host
  hears every discovery packet, and joined to the group on the configured
  interface;
* the sender, on an ephemeral port, with the outgoing multicast interface
  pinned when one is configured, multicast loopback on (so routers and
  clients on the same host hear each other) and the IP TTL set from the
  packet's locality (the direct mapping section 6.1.1 requires), never
  above ``ttl_limit``.

Sending from a port of our own lets a receiver recognise its own packets
(``is_own``): a client must not suppress its own solicitation because it
heard it come back.
"""

from __future__ import annotations

import socket

from twisted.internet import defer, protocol
from twisted.logger import Logger

from elvin.discovery import packets as discovery_packets
from elvin.discovery.addresses import local_addresses

__all__ = ["MulticastChannel", "DiscoveryUnavailable"]

#: Largest datagram accepted (the UDP maximum); decoding bounds the rest.
MAX_DATAGRAM = 65535


class DiscoveryUnavailable(OSError):
    """Multicast discovery cannot run here (no socket, no group)."""


class _Receiver(protocol.DatagramProtocol):
    noisy = False

    def __init__(self, channel):
        self.channel = channel

    def datagramReceived(self, data, addr):
        self.channel._datagram(data, addr)


class _Sender(protocol.DatagramProtocol):
    noisy = False

    def datagramReceived(self, data, addr):  # pragma: no cover - unicast noise
        pass


class MulticastChannel:
    """Send and receive ERDP packets on the multicast group.

    ``on_packet(packet, address, own)`` is called for every packet that
    decodes; ``address`` is the sender's IP and ``own`` is True for this
    channel's own packets coming back through multicast loopback.
    """

    log = Logger()

    def __init__(self, reactor, on_packet, group=discovery_packets.GROUP, port=discovery_packets.PORT,
                 interface=None, ttl_limit=discovery_packets.MAX_LOCALITY, local=None):
        self.reactor = reactor
        self.on_packet = on_packet
        self.group = group
        self.port = port
        self.interface = interface or ""
        self.ttl_limit = ttl_limit
        self._local = set(local) if local is not None else None
        self._receiver = None
        self._sender = None
        self.sent = 0
        self.received = 0
        self.malformed = 0
        self.send_errors = 0

    @property
    def local_addresses(self):
        if self._local is None:
            self._local = set(local_addresses()) | {"127.0.0.1"}
        return self._local

    def is_local(self, address):
        """True if ``address`` (a datagram's source) belongs to this host."""
        return address in self.local_addresses or address.startswith("127.")

    def start(self):
        """Bind, join the group and configure; fires when joined.  Raises
        (or fails with) DiscoveryUnavailable."""
        try:
            try:
                self._receiver = self.reactor.listenMulticast(
                    self.port, _Receiver(self), interface=self.group,
                    listenMultiple=True, maxPacketSize=MAX_DATAGRAM)
            except Exception:
                # Some systems cannot bind a multicast address: bind all.
                self._receiver = self.reactor.listenMulticast(
                    self.port, _Receiver(self), listenMultiple=True,
                    maxPacketSize=MAX_DATAGRAM)
            self._receiver.setLoopbackMode(True)
            self._sender = self.reactor.listenMulticast(0, _Sender())
            self._sender.setLoopbackMode(True)
            self._sender.setTTL(0)
            if self.interface:
                self._sender.setOutgoingInterface(self.interface)
        except Exception as e:
            self._close_sockets()
            raise DiscoveryUnavailable(
                f"cannot open the discovery socket on {self.group}:{self.port}: {e}") from e
        d = self._receiver.joinGroup(self.group, self.interface)

        def failed(failure):
            self._close_sockets()
            raise DiscoveryUnavailable(
                f"cannot join multicast group {self.group} on interface "
                f"{self.interface or 'default'}: {failure.value}")
        return d.addCallbacks(lambda _: self, failed)

    @property
    def running(self):
        return self._sender is not None

    def send(self, packet, locality):
        """Multicast ``packet`` with IP TTL ``min(locality, ttl_limit)``."""
        if self._sender is None:
            return False
        data = discovery_packets.encode(packet)
        ttl = max(0, min(locality, self.ttl_limit))
        try:
            self._sender.setTTL(ttl)
            self._sender.write(data, (self.group, self.port))
        except (OSError, socket.error) as e:
            self.send_errors += 1
            self.log.warn("discovery: cannot send {kind} to {group}:{port}: {why}",
                          kind=type(packet).__name__, group=self.group,
                          port=self.port, why=str(e))
            return False
        self.sent += 1
        return True

    def is_own(self, addr):
        """True if a datagram from ``addr`` was sent by this channel."""
        if self._sender is None:
            return False
        return addr[1] == self._sender.getHost().port and self.is_local(addr[0])

    def _datagram(self, data, addr):
        self.received += 1
        try:
            packet = discovery_packets.decode(data)
        except discovery_packets.UnknownPacketError:
            return
        except discovery_packets.DecodeError as e:
            self.malformed += 1
            self.log.debug("discovery: malformed packet from {addr}: {why}",
                           addr=addr[0], why=str(e))
            return
        try:
            self.on_packet(packet, addr[0], self.is_own(addr))
        except Exception:
            self.log.failure("discovery: handling a packet from {addr} failed",
                             addr=addr[0])

    def _close_sockets(self):
        ds = []
        for port in (self._receiver, self._sender):
            if port is not None:
                ds.append(defer.maybeDeferred(port.stopListening))
        self._receiver = self._sender = None
        return defer.DeferredList(ds)

    def stop(self):
        """Close both sockets; fires when closed."""
        return self._close_sockets().addCallback(lambda _: None)
