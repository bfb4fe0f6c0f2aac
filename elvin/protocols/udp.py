"""The ``udp,none,xdr`` transport: session-less UNotify datagrams (7.4.1).

Framing: one XDR-encoded UNotify packet per datagram, starting with its
pkt_id (32), with *no* 4-byte length header. The TCP framing header
(8.2.1) exists only to restore packet boundaries on a byte stream; a
datagram already carries its length, which is what section 8.2.3.1
suggests a UDP transport use ("a UDP transport could use the fact that a
datagram contains the length of data in the packet"). A datagram that
starts with a length header is therefore malformed.

Router side, :class:`UNotifyDatagramProtocol`:

* a datagram longer than ``max_datagram`` (the router's default
  Packet.Max-Length, at most the largest UDP payload) is dropped and
  counted as ``oversize``; the socket reads one byte more than the limit,
  so a datagram the kernel truncated is recognised as oversize too;
* one that does not decode is dropped and counted as ``malformed``;
  one that decodes to any packet but UNotify is dropped and counted as
  ``unexpected``;
* a UNotify goes through a ``ClientSession`` in the UNOTIFY state, the
  code path a TCP UNotify takes, so version checks (incompatible versions
  are silently discarded), attribute limits and routing are the same;
  the router counts it in ``stats["unotify"]`` as for TCP and counts the
  ones its limits refuse in ``stats["rejected_notifications"]``; the
  listener counts it as ``accepted`` (routed), ``incompatible`` (another
  major version, discarded) or ``rejected`` (ignored: attribute limits,
  unusable keys);
* nothing is ever sent back (the spec forbids it, and replying to
  spoofable datagrams would make the router an amplifier).

Counters are in ``UNotifyDatagramProtocol.counters``.

Client side, :func:`send_unotify` sends one datagram and is what
``elvin.client.unotify`` uses for a udp URI.
"""

import ipaddress
import socket

from twisted.internet import defer, protocol
from twisted.logger import Logger

from elvin.protocols import packets
from elvin.protocols.xdr import DecodeError
from elvin.core.router import ClientSession, SessionOutput, UdpCounters

__all__ = ["UNotifyDatagramProtocol", "send_unotify", "MAX_UDP_PAYLOAD"]

#: The largest UDP payload over IPv4 (65535 - 8 UDP - 20 IP header bytes).
MAX_UDP_PAYLOAD = 65507


class _SilentOutput(SessionOutput):
    """The output of a datagram session: nothing ever goes back."""

    transport_kind = "udp"

    def __init__(self, counters):
        self.counters = counters

    def send(self, packet):  # pragma: no cover - UNotify never replies
        self.counters["suppressed"] += 1

    def send_encoded(self, data, droppable):  # pragma: no cover
        self.counters["suppressed"] += 1

    def is_idle(self):
        return True

    def configure(self, options):
        pass

    def close(self):
        pass

    def abort(self):
        pass


class UNotifyDatagramProtocol(protocol.DatagramProtocol):
    """Accepts UNotify datagrams for a Router (see the module docstring)."""

    log = Logger()
    noisy = False

    def __init__(self, router, max_datagram=None):
        self.router = router
        if max_datagram is None:
            max_datagram = router.option_specs["Packet.Max-Length"].default
        self.max_datagram = min(max_datagram, MAX_UDP_PAYLOAD)
        #: bytes read per datagram: one more than accepted, to see truncation
        self.read_size = self.max_datagram + 1
        self.counters = UdpCounters(datagrams=0, accepted=0, incompatible=0, rejected=0,
                                    oversize=0, malformed=0, unexpected=0, suppressed=0)
        # The router's status (elvin.ops) sums every UDP listener's counters.
        router.udp_counters.append(self.counters)
        self._output = _SilentOutput(self.counters)
        self._session = None

    def _unotify_session(self):
        session = self._session
        if session is None or session.state not in (session.NEW, session.UNOTIFY):
            # Not registered with router.sessions: it has no subscriptions,
            # receives nothing and must not be sent Disconn on shutdown.
            session = self._session = ClientSession(self.router, self._output, "udp")
        return session

    def datagramReceived(self, data, addr):
        counters = self.counters
        counters["datagrams"] += 1
        peer = f"udp:{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else "udp"
        if len(data) > self.max_datagram:
            counters["oversize"] += 1
            self.log.debug("dropped oversize datagram ({size} bytes) from {peer}",
                           size=len(data), peer=peer)
            return
        session = self._unotify_session()
        try:
            # Its arrays held to the session's limits (an UnreadArray over them).
            packet = packets.decode(data, None, session.options.count_limits)
        except DecodeError as e:
            counters["malformed"] += 1
            self.log.debug("dropped malformed datagram from {peer}: {why}", peer=peer,
                           why=str(e))
            return
        except Exception as e:  # a decoder bug must not let garbage through
            counters["malformed"] += 1
            self.log.warn("dropped malformed datagram from {peer}: decoder raised "
                          "{why}", peer=peer, why=repr(e))
            return
        if type(packet) is not packets.UNotify:
            counters["unexpected"] += 1
            self.log.debug("dropped {kind} datagram from {peer} (only UNotify is "
                           "accepted over UDP)", kind=type(packet).__name__, peer=peer)
            return
        session.peer = peer
        stats = self.router.stats
        routed, rejected = stats["unotify"], stats["rejected_notifications"]
        session.packet_received(packet)
        # What the session did with it, as the router counted it.
        if stats["unotify"] == routed:
            counters["incompatible"] += 1      # another major version: discarded
        elif stats["rejected_notifications"] != rejected:
            counters["rejected"] += 1          # ignored: attribute limits, keys
        else:
            counters["accepted"] += 1


def _resolve(reactor, host):
    """Deferred: (address, family) for a host name or literal."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return reactor.resolve(host).addCallback(lambda ip: (ip, socket.AF_INET))
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    return defer.succeed((host, family))


@defer.inlineCallbacks
def send_unotify(reactor, uri, packet):
    """Send ``packet`` (a P.UNotify, or its encoded bytes) as one datagram
    to the router at ``uri``; fires when it has been handed to the kernel.

    UDP is unreliable: nothing confirms that the router got it.
    """
    data = packet if isinstance(packet, bytes) else packets.encode(packet)
    if len(data) > MAX_UDP_PAYLOAD:
        raise ValueError(f"UNotify of {len(data)} bytes does not fit in a UDP "
                         f"datagram (at most {MAX_UDP_PAYLOAD})")
    address, family = yield _resolve(reactor, uri.host)
    interface = "::" if family == socket.AF_INET6 else ""
    port = reactor.listenUDP(0, protocol.DatagramProtocol(), interface=interface)
    try:
        port.write(data, (address, uri.port))
    finally:
        yield port.stopListening()
