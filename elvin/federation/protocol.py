"""Federation links over stream transports (``ewaf:`` URIs: elvin.uri).

``FederationProtocol`` frames and decodes federation packets for one
``FederationLink`` and implements its output with the same bounded send
queue as client channels (a stalled peer costs only its own queue; what
does not fit is dropped and traced as overload). Idle links are probed
with TestConn (from the moment the connection opens); a link that stays
silent, or whose handshake is not done within ``HANDSHAKE_TIMEOUT``, is
closed, its peer's filter is forgotten at once, and an outgoing link is
redialled by a ``ClientService`` with jittered exponential backoff that
starts again from its first step only once a link came up.
"""

import random
import socket
import struct

from twisted.application.internet import ClientService
from twisted.internet import defer, error, protocol, task
from twisted.internet.interfaces import IHandshakeListener
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from zope.interface import implementer

from elvin.federation import packets as fed_packets
from elvin.federation.dial import DialledPeer
from elvin.federation.link import FederationLink, LinkState
from elvin.protocols import packets
from elvin.protocols.output import (CLOSE_LINGER, CLOSING_MAX_DISCARD, QueuedFramedProtocol,
                                    unsent_bytes, unsent_frames)
from elvin.protocols.xdr import DecodeError
from elvin.core.sendqueue import SendQueue
from elvin.uri import EwafURI, parse_ewaf

__all__ = ["FederationProtocol", "AcceptorFactory", "ConnectorFactory", "Backoff",
           "parse_ewaf", "DEFAULT_FEDERATION_PORT", "HANDSHAKE_TIMEOUT", "connector_service"]

DEFAULT_FEDERATION_PORT = EwafURI.DEFAULT_PORT
#: Seconds between probes of a quiet link: a hung peer is found within two.
DEFAULT_KEEPALIVE = 5.0
#: Seconds a connection has to finish its handshake (FedConnRqst answered
#: by a FedConnRply that is accepted) before it is closed, whatever else
#: the peer sends meanwhile: the Avis router's Federation.Request-Timeout.
HANDSHAKE_TIMEOUT = 20.0
_DROPWARN = packets.encode(packets.DropWarn())
_packet_id = struct.Struct(">I").unpack_from
#: Linux's TCP_QUICKACK (None elsewhere): see FederationProtocol.dataReceived.
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def _tcp_socket(transport):
    """The TCP socket under ``transport`` (through TLS), or None."""
    while transport is not None:
        handle = getattr(transport, "getHandle", None)
        sock = handle() if handle is not None else None
        if isinstance(sock, socket.socket):
            return sock
        transport = getattr(transport, "transport", None)
    return None


@implementer(IHandshakeListener)
class FederationProtocol(QueuedFramedProtocol):
    log = Logger()
    #: The configured link this connection was dialled for, if any.
    dial = None

    #: A graceful close over plain TCP lingers, as a client channel's: the
    #: peer's input is read and thrown away, our side is shut once
    #: everything is written, and the socket closed when the peer closes
    #: its end; so the peer reads all we wrote, where a reset made its
    #: kernel throw away what it had not read. Bounded (``close``).
    lingering_close = True

    #: The TLS handshake has ended (TLS links only).
    _tls_done = False
    #: Deferreds fired when the connection is lost (``when_lost``).
    _lost_waiters: tuple = ()
    #: Frames Twisted held unwritten when the link was closed at once
    #: (estimated; counted as unsent by ``drop_unsent``).
    _held_unwritten = 0
    #: The first bytes the peer sent, for saying what it is if the link
    #: fails before it comes up.
    _first_bytes = b""

    def __init__(self, manager, outgoing, fed_class=None, keepalive=DEFAULT_KEEPALIVE,
                 send_queue_bytes=8 * 1024 * 1024, clock=None,
                 handshake_timeout=HANDSHAKE_TIMEOUT):
        super().__init__()
        self.manager = manager
        self.outgoing = outgoing
        self.fed_class = fed_class
        self.keepalive = keepalive
        self.handshake_timeout = handshake_timeout
        #: Called (no arguments) once, when the link comes up.
        self.on_up = None
        self._awaiting_up = False
        self._handshake = None
        self.clock = clock or manager.clock
        self.queue = SendQueue(send_queue_bytes, "newest", _DROPWARN)
        self.link = None
        #: When the peer last sent anything (the clock's seconds).
        self.last_heard = None
        #: When we last sent TestConn (a probe answered once anything is heard after it).
        self._probed_at = None
        self._liveness = None
        # Until the handshake is done (``_came_up``): see MAX_HANDSHAKE_LENGTH.
        self.max_frame_length = fed_packets.MAX_HANDSHAKE_LENGTH

    # -- lifecycle -------------------------------------------------------------

    def connectionMade(self):
        set_nodelay = getattr(self.transport, "setTcpNoDelay", None)
        if set_nodelay is not None:
            try:
                # A FedNotify goes out at once: without this, Nagle's
                # algorithm held a quiet link's packets up to 40 ms
                # (bench/federation.py: p99 per hop 38 ms -> 4-5 ms).
                set_nodelay(True)
            except OSError:
                pass
        self._socket = _tcp_socket(self.transport) if _QUICKACK is not None else None
        peer = self.transport.getPeer()
        host = getattr(peer, "host", str(peer))
        fed_class = self.fed_class
        if fed_class is None:
            fed_class = self.manager.class_for(host)
        self.link = FederationLink(self.manager, self, self.outgoing, fed_class, host)
        if self.dial is not None:
            self.dial.connected(self.link)
        if (self.outgoing and not self.is_tls()
                and self.manager.requires_authentication(fed_class, host)):
            # Nothing, not even our domain, goes to a peer we cannot verify.
            self.link.refuse_unauthenticated("the link is not over TLS (use an "
                                             "ewaf:/secure/... URI)")
            return
        self.registerAsProducer()
        self.last_heard = self.clock.seconds()
        if self.keepalive:
            self._liveness = self.clock.callLater(self.keepalive, self._check_liveness)
        self._awaiting_up = True
        if self.handshake_timeout:
            self._handshake = self.clock.callLater(self.handshake_timeout,
                                                   self._handshake_expired)
        self.link.start()

    def _handshake_expired(self):
        self._handshake = None
        if self._awaiting_up:
            self.link.handshake_timed_out(self.handshake_timeout)

    def _came_up(self):
        """The link is up (its handshake is done): stop the handshake
        timer and tell ``on_up`` (the redial backoff starts again)."""
        self._awaiting_up = False
        self.max_frame_length = fed_packets.MAX_PACKET_LENGTH
        if self._handshake is not None and self._handshake.active():
            self._handshake.cancel()
        self._handshake = None
        ticket = getattr(self, "admission", None)
        if ticket is not None and ticket.is_idle:
            # An accepted link is in use now: the connection budget closes
            # idle sockets first when its pool is crowded, never a link.
            ticket.busy()
        on_up, self.on_up = self.on_up, None
        if on_up is not None:
            on_up()

    def silent_for(self):
        """Seconds since the peer last sent anything."""
        return self.clock.seconds() - self.last_heard if self.last_heard is not None else 0.0

    def _check_liveness(self):
        """The rule (docs/federation.md, "Liveness"): a link silent for one
        keepalive interval is sent TestConn; one silent for two is closed,
        at that moment, whatever the phase of any timer."""
        interval = self.keepalive
        silent = self.silent_for()
        if silent >= 2 * interval:
            self._liveness = None
            self.log.warn("federation link to {peer} is silent; closing",
                          peer=self.link.peer_domain or self.link.peer_host)
            self.drop_unsent()      # counted before the link_down says how many
            self.link.connection_lost("liveness")
            self.transport.abortConnection()
            return
        if silent >= interval:
            if self._probed_at is None or self._probed_at <= self.last_heard:
                self._probed_at = self.clock.seconds()
                self.send(packets.TestConn())
            wake = 2 * interval - silent
        else:
            wake = interval - silent
        self._liveness = self.clock.callLater(wake, self._check_liveness)

    def handshakeCompleted(self):
        self._tls_done = True

    def _failed_to_start(self, reason):
        """The channel ended before the link came up: say why (the TLS
        reason, or what the peer seems to be)."""
        link = self.link
        if self.outgoing:
            backoff = getattr(getattr(self, "factory", None), "backoff", None)
            peer = getattr(backoff, "name", None) or link.peer_host
        else:
            peer = link.peer_host
        from elvin.protocols.tls import failure_text, looks_like_tls
        from OpenSSL import SSL
        clean = reason is None or reason.check(error.ConnectionDone)
        detail = "" if clean else failure_text(reason.value)
        tls_error = not clean and isinstance(reason.value, SSL.Error) \
            and not isinstance(reason.value, SSL.SysCallError)
        if self.is_tls() and (not self._tls_done or tls_error):
            # A TLS 1.3 client ends its handshake before the router has
            # checked the client's certificate: a refusal comes after.
            why = f"TLS failed: {detail or 'the peer closed the connection'}"
            if self.outgoing:
                why += (" (is it a TLS listener? does our tls-ca trust its certificate, "
                        "its certificate name the URI's host, and its tls-ca trust our "
                        "tls-certificate?)")
            else:
                why += (" (does the peer dial an ewaf:/secure/ URI, trust our "
                        "tls-certificate, and present a certificate our tls-ca trusts?)")
        elif looks_like_tls(self._first_bytes):
            why = ("the peer speaks TLS, but this link is plain: "
                   + ("use an ewaf:/secure/ URI to reach it" if self.outgoing else
                      "it dialled an ewaf:/secure/ URI; give it this listener's plain "
                      "URI, or listen with TLS"))
        elif self.outgoing and not self._first_bytes:
            why = (f"the peer closed the connection before answering FedConnRqst"
                   f"{': ' + detail if detail else ''} (if it is a TLS listener, "
                   "use an ewaf:/secure/ URI)")
        elif self._too_long is not None:
            length, limit = self._too_long
            why = (f"a frame of {length} bytes, over the {limit} bytes allowed "
                   "before the link is up: reset unread")
        else:
            why = f"the connection ended{': ' + detail if detail else ''}"
        self.manager.link_failed_to_start(peer, self.outgoing, why)

    #: A frame over ``max_frame_length`` ended the channel: its announced
    #: length and the limit then, for the line saying why it failed.
    _too_long = None

    def frameTooLong(self, length):
        self._too_long = (length, self.max_frame_length)
        super().frameTooLong(length)

    def connectionLost(self, reason=None):
        live = getattr(self.factory, "live", None)
        if live is not None:
            live.discard(self)
        for waiter in self._lost_waiters:
            waiter.callback(None)
        self._lost_waiters = ()
        link = self.link
        if link is not None and link.state in (link.CONNECTING, link.AWAITING_REQUEST):
            self._failed_to_start(reason)
        super().connectionLost(reason)
        if self._liveness is not None and self._liveness.active():
            self._liveness.cancel()
        self._liveness = None
        if self._handshake is not None and self._handshake.active():
            self._handshake.cancel()
        self._handshake = None
        self._awaiting_up = False
        self.drop_unsent()
        if self.link is not None:
            self.link.connection_lost("connection_lost")

    def drop_unsent(self):
        """Empty the send queue: the notifications in it were counted out
        (and traced notify_forwarded) when queued and will never be written,
        so they are lost with the link (``unsent``). Done before the link
        goes down where the queue is to be dropped, so that its log line,
        totals and trace record count them; what a link closed politely
        still held when its connection ended is counted after."""
        unsent = self.queue.clear() + self._held_unwritten
        self._held_unwritten = 0
        link = self.link
        if link is None or not unsent:
            return
        link.stats["unsent"] += unsent
        if link.state == link.CLOSED:
            # already down (closed politely): add to the totals of links gone
            self.manager.gone_losses["unsent"] += unsent
            self.log.warn("federation link {domain}: {n} notifications still queued (or "
                          "held unwritten, estimated) when its connection ended were not "
                          "sent (unsent)",
                          domain=link.peer_domain or link.peer_host, n=unsent)

    def abort(self):
        self.drop_unsent()
        super().abort()

    # -- closing -------------------------------------------------------------------

    def close(self):
        """Close once everything queued is written (a Disconn last, when
        polite), lingering; bounded as a client channel's close is: once
        CLOSE_LINGER seconds pass in which the peer took nothing more, or
        CLOSE_LINGER seconds after everything was written if the peer has
        not closed its end, or once it has sent CLOSING_MAX_DISCARD bytes
        more, the link is closed at once, without a reset, and what was
        still queued is counted as unsent. The liveness check stops: the
        close has its own bound."""
        super().close()
        if self._liveness is not None and self._liveness.active():
            self._liveness.cancel()
        self._liveness = None
        self.boundClose(CLOSE_LINGER, "being closed", progress=True)

    def closeClock(self):
        return self.clock

    def when_lost(self):
        """A Deferred that fires once the connection is lost."""
        waiter = defer.Deferred()
        self._lost_waiters = (*self._lost_waiters, waiter)
        return waiter

    def lingerWritten(self):
        self.boundClose(CLOSE_LINGER, "being closed")

    def closeTookTooLong(self, why, progress):
        undone = "took nothing more of what it was sent" if progress else "did not close its end"
        self._closed_at_once(f"the peer {undone} for {CLOSE_LINGER:g} s while {why}")

    def discardedTooMuch(self):
        self._closed_at_once(f"the peer sent over {CLOSING_MAX_DISCARD} bytes while the "
                             "link was closed")

    def _closed_at_once(self, cause):
        link = self.link
        self.log.info("federation link {peer}: closing at once: {cause}",
                      peer=(link.peer_domain or link.peer_host) if link is not None else "?",
                      cause=cause)
        # What Twisted still holds goes with the connection: estimated in
        # frames, as for a client channel (unsent_frames), and counted with
        # what is queued as unsent when the link is aborted (drop_unsent).
        self.noteQueueMean()
        self._held_unwritten = unsent_frames(unsent_bytes(self.transport) or 0, 0,
                                             self.meanFrame())
        self.resetKeepingSent()     # (abort: what is queued is counted as unsent)

    # -- input -------------------------------------------------------------------

    #: The link's TCP socket, to acknowledge what the peer sent at once.
    _socket = None

    def dataReceived(self, data):
        if len(self._first_bytes) < 2:
            self._first_bytes += data[:2 - len(self._first_bytes)]
        sock = self._socket
        if sock is not None:
            # Acknowledge the segments just read now, not after the
            # kernel's delayed-ACK timer: a peer that leaves Nagle's
            # algorithm on (Avis) otherwise holds its next small packet,
            # such as the Ack of our next FedSubReplace that a client's
            # SubRply waits for, until that timer (40 ms) fires.
            try:
                sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                self._socket = None
        super().dataReceived(data)

    def frameReceived(self, data):
        self.last_heard = self.clock.seconds()
        packet_id = _packet_id(data)[0]
        if packet_id not in fed_packets.LINK_PACKET_IDS:
            self.link.violation(f"protocol_error: packet id {packet_id} "
                                "is not one a federation peer sends")
            return
        if self._awaiting_up and packet_id not in fed_packets.HANDSHAKE_PACKET_IDS:
            # Not decoded: its size and contents are the peer's to choose.
            self.link.violation(f"protocol_error: packet id {packet_id} before the "
                                "handshake is done")
            return
        try:
            packet = fed_packets.decode(data)
        except DecodeError as e:
            # A FedNotify wrong only in repeating an attribute name is a
            # protocol error in a notification (7.3.3): dropped, the link kept.
            try:
                packet, problem = packets.notification_repeating(data, e, fed_packets.decode)
            except DecodeError as error:
                self.link.violation(f"protocol_error: {error}")
                return
            self.link.notification_faulty(packet, problem, len(data))
            return
        self.link.packet_received(packet, len(data))
        if self._awaiting_up and self.link.state == LinkState.UP:
            self._came_up()

    # -- output (the link's) ---------------------------------------------------

    def send(self, packet):
        self.send_encoded(packets.encode(packet), False)

    #: Queue ``data``; False when it was dropped (overload: the queue's
    #: policy is "newest", so it is this packet that is dropped).
    send_encoded = QueuedFramedProtocol.writeOrQueue

    def is_tls(self):
        return isinstance(self.transport, TLSMemoryBIOProtocol)

    def peer_certificate(self):
        """The peer's certificate, which the TLS handshake verified against
        tls-ca (an unverifiable one ends the handshake), or None: plain TCP,
        or a TLS peer that presented none."""
        if not self.is_tls():
            return None
        return self.transport.getPeerCertificate()



class AcceptorFactory(protocol.Factory):
    """Incoming links: the class is chosen from the peer's address."""

    noisy = False          # no "Starting factory <... at 0x...>" lines

    def __init__(self, manager, keepalive=DEFAULT_KEEPALIVE):
        self.manager = manager
        self.keepalive = keepalive

    def buildProtocol(self, addr):
        proto = FederationProtocol(self.manager, False, None, self.keepalive)
        proto.factory = self
        return proto


class ConnectorFactory(protocol.Factory):
    """Outgoing links of one configured class."""

    noisy = False          # not two lines per redial

    def __init__(self, manager, fed_class, keepalive=DEFAULT_KEEPALIVE):
        self.manager = manager
        self.fed_class = fed_class
        self.keepalive = keepalive
        #: The redial backoff of the ClientService that uses this factory
        #: (``connector_service``): started again when a link comes up.
        self.backoff = None
        #: The configured link the status shows (``connector_service``).
        self.dial = None
        #: Its connections not yet lost (``_Keeper.stopService`` closes
        #: them politely first).
        self.live = set()

    def buildProtocol(self, addr):
        proto = FederationProtocol(self.manager, True, self.fed_class, self.keepalive)
        proto.factory = self
        proto.dial = self.dial
        proto.on_up = self._link_up
        self.live.add(proto)
        return proto

    def _link_up(self):
        if self.backoff is not None:
            self.backoff.reset()


class Backoff:
    """The redial delays of one outgoing link: ``initial_delay`` doubled
    for each attempt since a link last came up (``reset``), at most
    ``max_delay``, plus ``jitter()`` (0 to 1 s).

    A ClientService counts failures only until the TCP connect: a peer
    that accepts and then refuses us (a Nack, a bad FedConnRply, a
    hang-up, a handshake that never ends) would be redialled at the first
    step forever. Here an attempt counts as failed until the link is up.
    """

    log = Logger()

    def __init__(self, initial_delay=0.5, max_delay=30.0, factor=2.0, jitter=None,
                 name=None, dial=None):
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.factor = factor
        self.jitter = jitter if jitter is not None else random.random
        self.name = name
        #: Told when the next attempt is (a ``DialledPeer``), if anyone.
        self.dial = dial
        #: Attempts since a link was last up (or since the start).
        self.failures = 0

    #: True once the link's keeper stops: ClientService still asks for a
    #: delay when the last connection ends, but never dials again.
    stopped = False

    def __call__(self, _twisted_count=None):
        """The delay before the next attempt (a ClientService retryPolicy)."""
        self.failures += 1
        delay = min(self.initial_delay * self.factor ** self.failures, self.max_delay)
        delay += self.jitter()
        if self.stopped:
            return delay
        self.log.info("federation: redialling {peer} in {delay:.2f} s (attempt {n} "
                      "since a link was up)", peer=self.name, delay=delay,
                      n=self.failures)
        if self.dial is not None:
            self.dial.redial_in(delay, self.failures)
        return delay

    def reset(self):
        self.failures = 0


class _QuietRetries(Logger):
    """ClientService's log without its "Scheduling retry N" line, whose N
    restarts at every TCP connect: ``Backoff`` logs each redial instead."""

    def info(self, format=None, **kwargs):
        if format is not None and format.startswith("Scheduling retry"):
            return
        super().info(format, **kwargs)


class _Keeper(ClientService):
    """Keeps one configured link; its ``dial`` is in the manager's
    ``dialled`` (what the status shows) while it runs."""

    _log = _QuietRetries(namespace="elvin.federation.protocol.connector_service")
    dial = None

    def _dialled(self):
        manager = getattr(self.factory, "manager", None)
        return getattr(manager, "dialled", None)

    def startService(self):
        dialled = self._dialled()
        if dialled is not None and self.dial not in dialled:
            dialled.append(self.dial)
        super().startService()

    #: Why a link still up is closed when the keeper stops: a reload that
    #: removed its URI (the router's shutdown closes its links itself).
    end_reason = "federation link removed"

    def stopService(self):
        """Closes the link politely first, if one is connected (a Disconn
        after what is queued, lingering: ``FederationProtocol.close``,
        bounded), and stops once its connection is lost: ClientService
        alone would drop the connection with the peer's input unread, a
        reset, and wait for a peer that does not read without bound."""
        dialled = self._dialled()
        if dialled is not None and self.dial in dialled:
            dialled.remove(self.dial)
        backoff = getattr(self.factory, "backoff", None)
        if backoff is not None:
            backoff.stopped = True      # the connection's end is not a redial
        live = list(getattr(self.factory, "live", ()))
        if not live:
            return super().stopService()
        lost = [proto.when_lost() for proto in live]
        for proto in live:
            if proto.link is not None and proto.link.state != proto.link.CLOSED:
                proto.link.close(self.end_reason)
            elif not proto.closing:
                proto.close()
        stop = super().stopService
        # After ClientService has seen the connection go (it then waits to
        # redial, which stopping cancels).
        return defer.gatherResults(lost).addCallback(
            lambda _: task.deferLater(self.clock, 0, stop))


def connector_service(reactor, endpoint, factory, initial_delay=0.5, max_delay=30.0,
                      name=None, host=None):
    """A ClientService that keeps an outgoing link up, redialling with
    jittered exponential backoff (``Backoff``: it grows until a link is
    up, not merely connected); each failed dial is logged with its
    reason, naming ``name`` (the link's URI), and the manager's status
    shows the link, up or not (``DialledPeer``, with ``host``)."""
    name = name or repr(endpoint)
    fed_class = getattr(factory, "fed_class", None)
    dial = DialledPeer(name, host, fed_class.name if fed_class is not None else None, reactor)
    policy = Backoff(initial_delay, max_delay, 2.0, random.random, name, dial)
    factory.backoff = policy
    factory.dial = dial
    keeper = _Keeper(_ReasonLogged(endpoint, name, dial), factory, retryPolicy=policy,
                     clock=reactor)
    keeper.factory = factory
    keeper.dial = dial
    keeper.clock = reactor
    return keeper


class _ReasonLogged:
    """An endpoint whose failed connects are logged with their reason
    (ClientService says only that it will retry)."""

    log = Logger()

    def __init__(self, endpoint, name, dial=None):
        self.endpoint = endpoint
        self.name = name
        self.dial = dial

    def __repr__(self):
        return f"<{self.name}>"

    def connect(self, factory):
        def failed(failure):
            reason = failure.getErrorMessage()
            self.log.warn("federation: cannot reach {peer}: {reason}", peer=self.name,
                          reason=reason)
            if self.dial is not None:
                self.dial.dial_failed(reason)
            return failure
        if self.dial is not None:
            self.dial.dialling()
        return self.endpoint.connect(factory).addErrback(failed)
