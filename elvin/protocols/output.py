"""Queued, back-pressured framed output: one implementation for every
stream channel (client sessions and federation links, over TCP, TLS and the
HTTP tunnel).

Writes go straight to the transport while the socket drains. The protocol
is its transport's push producer: when Twisted's write buffer fills it is
paused, and frames wait in a bounded ``SendQueue`` (whose drop policy
applies) until it is resumed. A close waits for the queue to empty; the
producer is unregistered before the transport is closed, which TLS needs
to finish its close.

A graceful close over plain TCP lingers, as servers close: the channel
keeps reading what the peer sends and throws it away (never acting on
it), shuts down its sending side once everything is written (the peer
reads to the end, then sees end of file), and closes when the peer
closes, or when its owner's linger runs out. Closing a socket with
unread input makes the kernel send a reset, and the peer's kernel then
throws away what it had received and the peer not yet read. (TLS
already waits for the peer's close_notify; the HTTP tunnel has its own
transport.)
"""

import math
import socket
import struct

from twisted.internet import tcp
from twisted.internet.interfaces import IHalfCloseableProtocol, IPushProducer
from zope.interface import alsoProvides, implementer

from elvin.protocols.framing import FramedProtocol
from elvin.core.sendqueue import QueueOverflow

__all__ = ["QueuedFramedProtocol", "tcp_transport", "unsent_bytes", "unsent_frames",
           "CLOSING_MAX_DISCARD", "CLOSE_LINGER"]

#: Seconds a closing channel may go without anything more of what it was
#: sent being written (the peer does not read), and that a lingering close
#: waits for the peer to close its end once everything was written: then
#: it is closed at once (``boundClose``).
CLOSE_LINGER = 5.0

#: Most bytes a closing channel reads and throws away before it is closed
#: at once (``discardedTooMuch``), and the most ``_release`` reads.
CLOSING_MAX_DISCARD = 4 << 20


def unsent_bytes(transport):
    """Bytes written to ``transport`` that it still holds, not yet handed
    to the kernel (Twisted's write buffer of a socket; for TLS, the
    plaintext it has not encrypted yet and the records under it not yet
    written, a record's framing counted as data: an estimate, as the
    count made from it is); None when the transport does not show them
    (the HTTP tunnel)."""
    buffer = getattr(transport, "dataBuffer", None)
    if isinstance(buffer, bytes):
        return (len(buffer) - getattr(transport, "offset", 0)
                + getattr(transport, "_tempDataLen", 0))
    tcp_under = tcp_transport(transport)
    if tcp_under is None:
        return None
    plaintext = sum(len(data) for data in getattr(transport, "_appSendBuffer", None) or ())
    return plaintext + (unsent_bytes(tcp_under) or 0)


def tcp_transport(transport):
    """The TCP connection carrying ``transport``: itself, or the one under
    a TLS layer (Twisted's TLSMemoryBIOProtocol); None for any other."""
    if isinstance(transport, tcp.Connection):
        return transport
    under = getattr(transport, "transport", None)
    if getattr(transport, "_tlsConnection", None) is None or not isinstance(
            under, tcp.Connection):
        return None
    return under


def unsent_frames(unsent, tail, mean):
    """How many frames ``unsent`` bytes left in a transport stand for,
    not counting the last ``tail`` bytes (frames of our own, such as the
    Disconn): those bytes over ``mean``, the mean size of a frame,
    rounded up. Twisted keeps bytes, not frames, so this is an estimate
    (a frame begun but not finished counts whole)."""
    if not unsent or unsent <= tail or not mean:
        return 0
    return math.ceil((unsent - tail) / mean)


def _keep_socket(transport):
    """A duplicate of a TCP transport's socket, or of the one under a TLS
    transport (None for any other): held while Twisted resets the
    channel, it keeps the socket from being reset, so that closing it
    afterwards (``_release``) lets the kernel deliver what it holds. Over
    TLS that is whole records and at most part of one: the client reads
    the whole ones, then fails on the cut one as on any connection that
    ends without close_notify."""
    transport = tcp_transport(transport)
    if transport is None:
        return None
    try:
        return transport.getHandle().dup()
    except (AttributeError, OSError):
        return None


def _release(sock):
    """Close a socket kept by ``_keep_socket`` in order: read what the peer
    sent (unread input makes the kernel reset), drop the linger-0 Twisted
    set for its reset, close (FIN after what the kernel holds)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 0, 0))
        sock.setblocking(False)
        for _ in range(CLOSING_MAX_DISCARD >> 16):    # read and discarded
            if not sock.recv(65536):
                break
    except OSError:
        pass
    sock.close()


@implementer(IPushProducer)
class QueuedFramedProtocol(FramedProtocol):
    """A FramedProtocol with a send queue; subclasses set ``self.queue``
    (a SendQueue) and call ``registerAsProducer()`` once connected.

    Its hooks and methods are camelCase, as FramedProtocol's and Twisted's
    own are (``frameReceived``, ``queueOverflowed``); what implements the
    core's interfaces (``SessionOutput.send_encoded``, ``queued_bytes``)
    keeps their snake_case names."""

    def __init__(self):
        super().__init__()
        self.paused = False
        self.closing = False
        self.queue = None
        self._registered = False
        #: ``hold`` calls not yet released; while any, frames queue.
        self.held = 0
        self._transport_paused = False

    def registerAsProducer(self):
        self.transport.registerProducer(self, True)
        self._registered = True

    def queued_bytes(self):
        """Bytes waiting in the send queue now."""
        return self.queue.size if self.queue is not None else 0

    # -- writing -----------------------------------------------------------

    def writeOrQueue(self, data, droppable):
        """Write ``data`` now, or queue it while paused.

        Returns False when nothing was taken: the channel is closing, or
        the queue overflowed (``queueOverflowed`` is called), or the queue
        dropped frames to make room (``framesDropped`` is told how many;
        under the policy "newest" that is this frame). A droppable frame
        not taken because the channel is closing or overflowed is told to
        ``framesDiscarded``.
        """
        if self.closing or self.transport is None:
            if droppable:
                self.framesDiscarded(1)
            return False
        if self.paused or self.queue:
            try:
                dropped = self.queue.push(data, droppable)
            except QueueOverflow as e:
                self.queueOverflowed(e)
                if droppable:
                    self.framesDiscarded(1)
                return False
            if dropped:
                self.framesDropped(dropped)
            self.frameQueued()
            return dropped == 0
        self.sendFrame(data)
        return True

    def hold(self):
        """Queue every frame from now on, in order and under the queue's
        limits as for a paused transport, until ``release``."""
        if self.closing or self.transport is None or self.queue is None:
            return False
        self.held += 1
        self.paused = True
        return True

    def release(self):
        """Undo one ``hold``; the last writes what waited (unless the
        transport itself is paused: then its resume does)."""
        if not self.held:
            return
        self.held -= 1
        if not self.held and not self._transport_paused and self.transport is not None:
            self.resumeProducing()

    def queueOverflowed(self, error):
        """A frame that may not be dropped did not fit (override)."""

    def framesDropped(self, count):
        """The queue's drop policy dropped ``count`` frames (override)."""

    def framesDiscarded(self, count):
        """``count`` droppable frames will never be written: they were
        queued when the channel was reset, or offered while it was closing
        (override, to count them as lost)."""

    def frameQueued(self):
        """A frame was queued (override, e.g. to enforce a memory budget)."""

    def discardQueue(self):
        """Empty the send queue, telling ``framesDiscarded`` what it held."""
        if self.queue is not None:
            lost = self.queue.clear()
            if lost:
                self.framesDiscarded(lost)

    # -- closing -------------------------------------------------------------

    def close(self):
        """Close once everything queued has been written."""
        self.closing = True
        if not self.queue and self.transport is not None:
            self._hang_up()

    def abort(self):
        """Close at once, dropping what is queued."""
        self.closing = True
        self._stopped = True   # no more frames from the chunk being read
        self.discardQueue()
        self._unregister()
        if self.transport is not None:
            self.transport.abortConnection()

    def shutOut(self, frames):
        """Close a channel whose peer does not read, keeping what it was
        written: nothing more is read or queued, the send queue is dropped
        (told to ``framesDiscarded``), ``frames(dropped)`` (the encoded
        packets to write last, knowing how many deliveries the queue held:
        a DropWarn and a Disconn, say) go straight behind what the
        transport holds, and the channel closes gracefully. Returns how
        many deliveries were dropped from the queue; the caller bounds how
        long the close may take (``resetKeepingSent``)."""
        self._stopped = True
        self.noteQueueMean()
        lost = self.queue.clear() if self.queue is not None else 0
        if lost:
            self.framesDiscarded(lost)
        self.closing = True
        if self.transport is not None:
            for data in frames(lost):
                self.sendFrame(data)
            self._hang_up()
        return lost

    def resetKeepingSent(self):
        """Close at once, dropping what is queued and what the transport
        still holds, but over TCP and TLS without a reset: what the kernel
        holds is still delivered (see ``_keep_socket``)."""
        kept = _keep_socket(self.transport)
        if kept is not None:
            self._kept_socket = kept
        self.abort()

    _kept_socket = None
    _queued_mean = 0.0

    def noteQueueMean(self):
        """Remember the mean size of the frames queued now (before they are
        dropped), for ``meanFrame``."""
        queue = self.queue
        if queue:
            self._queued_mean = (queue.size + 4 * len(queue)) / len(queue)

    def meanFrame(self):
        """The mean size of a frame (header included) of this channel: of
        those its queue held when it was shut out, else of all it wrote."""
        if self._queued_mean:
            return self._queued_mean
        return self.bytes_out / self.frames_out if self.frames_out else 0.0

    def releaseKeptSocket(self):
        """After the transport is gone: close the socket ``resetKeepingSent``
        kept."""
        kept, self._kept_socket = self._kept_socket, None
        if kept is not None:
            _release(kept)

    def connectionLost(self, reason=None):
        super().connectionLost(reason)
        self._lost = True
        self.cancelCloseBound()
        self.releaseKeptSocket()       # Twisted has closed its own descriptor

    # -- bounding a close ----------------------------------------------------

    #: The pending call that ends a close taking too long (``boundClose``).
    _close_bound = None
    #: ``written()`` at the last look, for a close bounded by progress
    #: (None: bounded by a deadline).
    _close_mark = None
    #: The connection is gone (a transport may end it while it is closed).
    _lost = False

    def closeClock(self):
        """The clock timing a close (override)."""
        raise NotImplementedError

    def written(self):
        """Bytes the transport has passed on (to the kernel): all written
        to it less what it still holds, where it shows that."""
        return self.bytes_out - (unsent_bytes(self.transport) or 0)

    def boundClose(self, seconds, why, progress=False):
        """Bound the close begun: ``closeTookTooLong(why, progress)`` in
        ``seconds``, or, with ``progress``, once ``seconds`` pass in which
        nothing more was written (looked at every ``seconds``: cut 1 to 2
        times ``seconds`` after the peer last took anything). A deadline
        replaces a progress bound; otherwise the bound set first stays."""
        current = self._close_bound
        if current is not None:
            if progress or self._close_mark is None:
                return
            self.cancelCloseBound()
        if self.transport is None or self._lost:
            return
        self._close_mark = self.written() if progress else None
        self._close_bound = self.closeClock().callLater(seconds, self._close_due, seconds,
                                                        why)

    def _close_due(self, seconds, why):
        self._close_bound = None
        if self.transport is None:
            return
        mark = self._close_mark
        if mark is not None:
            now = self.written()
            if now > mark:               # it read some: another period
                self._close_mark = now
                self._close_bound = self.closeClock().callLater(seconds, self._close_due,
                                                                seconds, why)
                return
        self.closeTookTooLong(why, mark is not None)

    def cancelCloseBound(self):
        bound, self._close_bound = self._close_bound, None
        if bound is not None and bound.active():
            bound.cancel()

    def closeTookTooLong(self, why, progress):
        """A close bounded by ``boundClose`` took too long (``progress``:
        nothing was written for its period): close at once, keeping what
        was sent (override, to count and log it)."""
        self.resetKeepingSent()

    def receiveBudgetExhausted(self, held):
        """Out of the router-wide receive budget: close at once."""
        self.abort()

    def _unregister(self):
        # A producer still registered keeps some transports (TLS) from
        # finishing a close.
        if self._registered and self.transport is not None:
            self._registered = False
            self.transport.unregisterProducer()

    #: Whether a graceful close over plain TCP lingers (see the module's
    #: docstring); the owner bounds the linger (``lingerWritten``).
    lingering_close = False
    #: True once a lingering close has begun.
    lingering = False

    def _hang_up(self):
        self._unregister()
        transport = self.transport
        if self.lingering_close and isinstance(transport, tcp.Connection) \
                and not transport.disconnecting:
            self._linger_close(transport)
        else:
            transport.loseConnection()

    def _linger_close(self, transport):
        """Shut our sending side once what the transport holds is written,
        reading (and discarding) the peer's input until it closes."""
        self.lingering = True
        self.discard_input()
        # Told when our side is shut and when the peer's is (Twisted asks
        # the protocol, not its class: only a lingering channel is told;
        # a ClientService's wrapper forwards the question and the calls).
        alsoProvides(self, IHalfCloseableProtocol)
        transport.loseWriteConnection()

    def writeConnectionLost(self):
        """(IHalfCloseableProtocol, lingering) Everything was written and
        our side shut down: the peer reads to the end, then sees end of file."""
        self.lingerWritten()

    def readConnectionLost(self):
        """(IHalfCloseableProtocol, lingering) The peer closed its side:
        close (at once if ours is shut; else once written)."""
        if self.transport is not None:
            self.transport.loseConnection()

    def lingerWritten(self):
        """A lingering close wrote everything and shut our side; the peer
        has not closed yet (override, to bound how long it may take)."""

    _discarded = 0

    def inputDiscarded(self, size):
        """A closing channel throws away what it reads, up to
        CLOSING_MAX_DISCARD bytes: then ``discardedTooMuch``, once."""
        if not self.closing or self._discarded > CLOSING_MAX_DISCARD:
            return
        self._discarded += size
        if self._discarded > CLOSING_MAX_DISCARD:
            self.discardedTooMuch()

    def discardedTooMuch(self):
        """The peer sent over CLOSING_MAX_DISCARD bytes while the channel
        closed: close at once, keeping what was sent (override)."""
        self.resetKeepingSent()

    # -- IPushProducer -------------------------------------------------------

    def pauseProducing(self):
        self._transport_paused = True
        self.paused = True

    def resumeProducing(self):
        self._transport_paused = False
        if self.held:
            return          # release() writes them
        self.paused = False
        queue = self.queue
        while queue and not self.paused:
            self.sendFrame(queue.pop())
        if self.closing and not queue:
            self._hang_up()

    def stopProducing(self):
        self._transport_paused = True
        self.paused = True
