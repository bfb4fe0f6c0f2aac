"""The router side of a client channel over a stream transport (TCP, TLS).

``ElvinServerProtocol`` frames and decodes packets for one ``ClientSession``
and implements its output. Writes go straight to the transport while the
socket drains; when Twisted's write buffer fills, the transport pauses us
(we are its push producer) and packets wait in a bounded ``SendQueue``
where the client's drop policy applies, so a slow consumer costs only its
own queue and never stalls anybody else.
"""

import struct

from twisted.internet import error, protocol
from twisted.logger import Logger
from zope.interface import implementer
from twisted.internet.interfaces import IPushProducer

from elvin.protocols import packets as P
from elvin.protocols.framing import FramedProtocol
from elvin.protocols.xdr import DecodeError
from elvin.router import CLIENT_PACKET_IDS, SessionOutput
from elvin.sendqueue import QueueOverflow, SendQueue

__all__ = ["ElvinServerProtocol", "ElvinServerFactory", "CONNECT_TIMEOUT"]

#: Seconds a new channel may stay silent before it must send ConnRqst/UNotify.
CONNECT_TIMEOUT = 30.0

_DROPWARN = P.encode(P.DropWarn())
_packet_id = struct.Struct(">I").unpack_from


@implementer(IPushProducer)
class ElvinServerProtocol(FramedProtocol, SessionOutput):
    log = Logger()

    def __init__(self):
        super().__init__()
        self.session = None
        self.paused = False
        self.closing = False
        self.queue = None
        self._timeout = None
        self._registered = False

    # -- channel lifecycle -------------------------------------------------

    def connectionMade(self):
        factory = self.factory
        peer = self.transport.getPeer()
        self.peer = f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"
        router = factory.router
        if len(router.sessions) >= 2 * router.max_connections:
            # max-connections sessions, and as many again still connecting:
            # beyond that a channel costs memory nobody can use. Close it.
            self.log.warn("refusing channel from {peer}: {count} channels open "
                          "(max-connections {max})", peer=self.peer,
                          count=len(router.sessions), max=router.max_connections)
            self._stopped = True
            self.closing = True
            self.transport.abortConnection()
            return
        self.session = router.open_session(self, self.peer)
        options = self.session.options
        self.max_frame_length = options["Packet.Max-Length"]
        self.queue = SendQueue(options["Send-Queue.Max-Length"],
                               options["Send-Queue.Drop-Policy"], _DROPWARN)
        budget = getattr(factory.router, "queue_budget", None)
        if budget is not None:
            budget.join(self.queue, self._evicted, self._shed)
        self._apply_nodelay(options)
        self.transport.registerProducer(self, True)
        self._registered = True
        if factory.connect_timeout:
            self._timeout = factory.clock.callLater(factory.connect_timeout,
                                                    self._connect_timed_out)

    def _connect_timed_out(self):
        self._timeout = None
        if self.session.state == self.session.NEW:
            self.log.info("closing silent channel from {peer}", peer=self.peer)
            self.transport.loseConnection()

    def _cancel_timeout(self):
        if self._timeout is not None and self._timeout.active():
            self._timeout.cancel()
        self._timeout = None

    def connectionLost(self, reason=None):
        super().connectionLost(reason)
        self._cancel_timeout()
        if self.queue is not None:
            self.queue.clear()
            if self.queue.budget is not None:
                self.queue.budget.leave(self.queue)
        if self.session is not None:
            self.session.connection_lost(_why(reason))

    # -- input -------------------------------------------------------------

    def frameReceived(self, data):
        if _packet_id(data)[0] not in CLIENT_PACKET_IDS:
            # Not a packet a client may send (7.3.2): refuse it undecoded,
            # so nobody can make the router parse, say, a huge SubAST.
            self.session.decode_failed(f"packet id {_packet_id(data)[0]} is not "
                                       "one a client sends")
            return
        try:
            packet = P.decode(data)
        except DecodeError as e:
            self.session.decode_failed(str(e))
            return
        if self._timeout is not None:
            self._cancel_timeout()
        self.session.packet_received(packet)

    # -- SessionOutput -----------------------------------------------------

    def send(self, packet):
        self.send_encoded(P.encode(packet), False)

    def send_encoded(self, data, droppable):
        if self.closing or self.transport is None:
            return
        if self.paused or self.queue:
            try:
                dropped = self.queue.push(data, droppable)
            except QueueOverflow as e:
                self.log.warn("disconnecting slow client {peer}: {reason}",
                              peer=self.peer, reason=str(e))
                self.session.ending(f"slow client: {e}")
                self.abort()
                return
            if dropped:
                self.session.dropped += dropped
            budget = self.queue.budget
            if budget is not None and budget.over():
                budget.enforce()
            return
        self.sendFrame(data)

    def _shed(self, dropped):
        """The router-wide queue budget dropped deliveries from our queue."""
        self.session.dropped += dropped

    def _evicted(self, queue):
        """The router-wide queue budget is exhausted and ours is the largest
        queue that cannot shed: disconnect, as for drop policy none."""
        self.log.warn("disconnecting slow client {peer}: router-wide send queue "
                      "memory (max-queue-memory) exhausted", peer=self.peer)
        self.session.ending("slow client: router-wide send queue memory "
                            "(max-queue-memory) exhausted")
        self.abort()

    def is_idle(self):
        return not self.queue and not self.paused

    def _apply_nodelay(self, options):
        set_nodelay = getattr(self.transport, "setTcpNoDelay", None)
        if set_nodelay is not None:
            try:
                set_nodelay(bool(options["TCP.Send-Immediately"]))
            except OSError:
                pass

    def configure(self, options):
        self._apply_nodelay(options)
        self.max_frame_length = options["Packet.Max-Length"]
        self.queue.configure(options["Send-Queue.Max-Length"],
                             options["Send-Queue.Drop-Policy"])

    def close(self):
        self.closing = True
        if not self.queue:
            self._hang_up()

    def abort(self):
        self.closing = True
        self._stopped = True   # no more frames from the chunk being read
        self.queue.clear()
        self._unregister()
        self.transport.abortConnection()

    def _unregister(self):
        # A producer still registered keeps some transports (TLS) from
        # finishing a close.
        if self._registered and self.transport is not None:
            self._registered = False
            self.transport.unregisterProducer()

    def _hang_up(self):
        self._unregister()
        self.transport.loseConnection()

    # -- IPushProducer -----------------------------------------------------

    def pauseProducing(self):
        self.paused = True

    def resumeProducing(self):
        self.paused = False
        queue = self.queue
        while queue and not self.paused:
            self.sendFrame(queue.pop())
        if self.closing and not queue:
            self._hang_up()

    def stopProducing(self):
        self.paused = True


class ElvinServerFactory(protocol.Factory):
    """Makes a protocol per accepted channel, all sharing one Router."""

    protocol = ElvinServerProtocol

    def __init__(self, router, clock=None, connect_timeout=CONNECT_TIMEOUT):
        if clock is None:
            from twisted.internet import reactor as clock
        self.router = router
        self.clock = clock
        self.connect_timeout = connect_timeout


def _why(reason):
    """How a channel ended, from connectionLost's reason, for the log."""
    if reason is None or reason.check(error.ConnectionDone):
        return "client closed the connection"
    return f"connection lost: {reason.getErrorMessage()}"
