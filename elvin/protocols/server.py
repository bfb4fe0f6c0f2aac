"""The router side of a client channel over a stream transport (TCP, TLS).

``ElvinServerProtocol`` frames and decodes packets for one ``ClientSession``
and implements its output. Writes go straight to the transport while the
socket drains; when Twisted's write buffer fills, the transport pauses us
(we are its push producer) and packets wait in a bounded ``SendQueue``
where the client's drop policy applies, so a slow consumer costs only its
own queue and never stalls anybody else.
"""

import struct

from twisted.internet import defer, error, protocol
from twisted.logger import Logger

from elvin.protocols import packets
from elvin.protocols.framing import peer_text
from elvin.protocols.keepalive import set_keepalive
from elvin.protocols.output import (CLOSE_LINGER, CLOSING_MAX_DISCARD, QueuedFramedProtocol,
                                    unsent_bytes, unsent_frames)
from elvin.protocols.xdr import BadUTF8Error, DecodeError
from elvin.core.router import (CLIENT_PACKET_IDS, QUEUE_MEMORY_FULL, SEND_QUEUE_FULL,
                               SessionOutput, SessionState)
from elvin.core.sendqueue import SendQueue

__all__ = ["ElvinServerProtocol", "ElvinServerFactory", "CONNECT_TIMEOUT", "VIOLATION_LINGER",
           "CLOSE_LINGER", "PRE_CONNECT_MAX_PACKET"]

#: Seconds a new channel may stay silent before it must send ConnRqst/UNotify.
CONNECT_TIMEOUT = 30.0
#: Seconds a client connection may be idle before TCP keepalive probes its
#: host (``client-keepalive``; elvin.protocols.keepalive).
CLIENT_KEEPALIVE = 120.0

#: Seconds a channel the router closes (a protocol violation, a client
#: that does not read) has to read what was written before (its Disconn
#: last) before it is closed at once: a peer that does not read cannot
#: hold the channel open. Any other close (DisconnRqst, a redirection)
#: is closed so once nothing was written for that long.
VIOLATION_LINGER = CLOSE_LINGER

#: The longest packet a channel may send before its session is connected
#: (ConnRqst, or UNotify on a session-less channel, as a UDP datagram): a
#: header announcing more resets the channel, so an unfinished frame costs
#: at most this much until the client has a session.
PRE_CONNECT_MAX_PACKET = 64 << 10

_DROPWARN = packets.encode(packets.DropWarn())
_packet_id = struct.Struct(">I").unpack_from
_NOTIFY_EMIT = packets.NotifyEmit.ID
_CONNECTED = SessionState.CONNECTED
_NEW = SessionState.NEW



#: The first four bytes of HTTP requests, read as a frame header.
_HTTP_METHODS = frozenset((b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"CONN",
                           b"PATC", b"TRAC"))

class ElvinServerProtocol(QueuedFramedProtocol, SessionOutput):
    log = Logger()

    #: A graceful close over plain TCP reads and discards the client's
    #: input until it closes, CLOSE_LINGER seconds at most after everything
    #: was written (``lingerWritten``), so that closing never resets it;
    #: writing everything is bounded too (``close``).
    lingering_close = True

    #: The connection's ticket in the router's connection budget, when a
    #: listener's gate admitted it (elvin.protocols.gate); None in a tunnel.
    admission = None

    #: The shortest NotifyEmit that could hold an array over the
    #: connection's limits (``packets.notify_emit_limits_from``), set by
    #: ``configure``: shorter ones are decoded without them.
    _emit_limits_from = 0

    def __init__(self):
        super().__init__()
        self.session = None
        self._timeout = None
        #: Bytes of our own frames written last (DropWarn, Disconn) when
        #: the router closed the channel: not deliveries, if left unsent.
        self._tail = 0
        self._gone = False
        self._closed_waiters = []

    # -- channel lifecycle -------------------------------------------------

    def connectionMade(self):
        factory = self.factory
        self.peer = peer_text(self.transport)
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
        self.max_frame_length = min(options["Packet.Max-Length"], PRE_CONNECT_MAX_PACKET)
        self.queue = SendQueue(options["Send-Queue.Max-Length"],
                               options["Send-Queue.Drop-Policy"], _DROPWARN)
        budget = getattr(factory.router, "queue_budget", None)
        if budget is not None:
            budget.join(self.queue, self._evicted, self._shed)
        self._apply_nodelay(options)
        set_keepalive(self.transport, factory.client_keepalive)
        self.registerAsProducer()
        if factory.connect_timeout:
            self._timeout = factory.clock.callLater(factory.connect_timeout,
                                                    self._connect_timed_out)

    def _connect_timed_out(self):
        self._timeout = None
        if self.session.state == self.session.NEW:
            self.log.info("closing silent channel from {peer}", peer=self.peer)
            self._stopped = True
            self.close()
            self._linger_for("being closed for silence")    # a deadline, not by progress

    def _cancel_timeout(self):
        if self._timeout is not None and self._timeout.active():
            self._timeout.cancel()
        self._timeout = None

    def connectionLost(self, reason=None):
        super().connectionLost(reason)
        self._cancel_timeout()
        if self.queue is not None:
            self.discardQueue()      # counted before the session's end is logged
            if self.queue.budget is not None:
                self.queue.budget.leave(self.queue)
        if self.session is not None:
            self.session.connection_lost(_why(reason))
        self._gone = True
        waiting, self._closed_waiters = self._closed_waiters, []
        for d in waiting:
            d.callback(None)

    # -- input -------------------------------------------------------------

    def frameReceived(self, data):
        pkt_id = _packet_id(data)[0]
        # An array over the connection's limit for it is not decoded
        # (ConnectionOptions.count_limits, packets.UnreadArray): the session
        # answers it as if it were.
        if pkt_id == _NOTIFY_EMIT and self.session.state is _CONNECTED:
            # The hot path: a NotifyEmit on a session goes straight to the
            # session as its fields, without building the packet or
            # dispatching on its type: every notification takes this path
            # (docs/performance.md). One too short to hold an array over
            # the limits (almost all) is decoded without them.
            try:
                if len(data) < self._emit_limits_from:
                    attributes, deliver_insecure, keys, end = packets.notify_emit_fields(data)
                else:
                    attributes, deliver_insecure, keys, end = packets.notify_emit_fields(
                        data, self.session.options.count_limits)
            except DecodeError as e:
                self._undecodable(data, e)
                return
            # (positional: a call with keywords is not specialised)
            self.session.notify_emit(attributes, deliver_insecure, keys, len(data),
                                     None, None, data, end)
            return
        if pkt_id not in CLIENT_PACKET_IDS:
            # Not a packet a client may send (7.3.2): refuse it undecoded,
            # so nobody can make the router parse, say, a huge SubAST.
            self.session.decode_failed(f"packet id {pkt_id} is not one a client sends")
            return
        try:
            packet = packets.decode(data, None, self.session.options.count_limits)
        except DecodeError as e:
            self._undecodable(data, e)
            return
        self.session.packet_received(packet)
        if self._timeout is not None and self.session.state is not _NEW:
            self._cancel_timeout()     # (a TestConn does not keep a channel open)
        ticket = self.admission
        if ticket is not None and ticket.is_idle and self.session.state is _CONNECTED:
            ticket.busy()     # logged in: no longer an idle socket to close first

    def _undecodable(self, data, error):
        """``data`` raised ``error``: a violation, unless it is a string
        that is not UTF-8 (``ClientSession.bad_utf8``) or the packet is a
        notification wrong only in repeating an attribute name (a protocol
        error in it, which the session ignores: 7.3.3)."""
        if isinstance(error, BadUTF8Error):
            xid = _packet_id(data, 4)[0] if len(data) >= 8 else None
            self.session.bad_utf8(_packet_id(data)[0], xid, error.offset, str(error))
            return
        try:
            packet, problem = packets.notification_repeating(
                data, error, limits=self.session.options.count_limits)
        except DecodeError as e:
            self.session.decode_failed(str(e))
            return
        self.session.notification_faulty(packet, problem)

    # -- SessionOutput -----------------------------------------------------

    def send(self, packet):
        data = packets.encode(packet)
        if type(packet) is packets.Disconn:
            self._tail = len(data) + 4        # ours, written last
        self.send_encoded(data, False)

    def whenClosed(self):
        """A Deferred fired once the channel is gone (at once if it is)."""
        if self._gone or self.transport is None:
            return defer.succeed(None)
        d = defer.Deferred()
        self._closed_waiters.append(d)
        return d

    def cutOff(self):
        """Close at once (the router is stopping and the client's grace is
        over), counting what it did not get (``_count_unsent``). Returns
        False when the channel was gone already."""
        if self._gone or self.transport is None:
            return False
        self._count_unsent()
        self.resetKeepingSent()                    # counts what is queued
        return True

    def _count_unsent(self):
        """Count as dropped the deliveries the transport still holds: its
        unwritten bytes, less our own DropWarn and Disconn when they were
        written last, over the mean size of the frames queued when the
        client was shut out (else of all written to it), rounded up
        (``unsent_frames``). Returns (unwritten bytes, deliveries counted);
        what is still queued is counted when the channel is aborted."""
        self.noteQueueMean()
        tail = 0 if self.queue else self._tail     # a queued Disconn is not yet written
        unsent = unsent_bytes(self.transport)
        lost = unsent_frames(unsent, tail, self.meanFrame())
        if lost:
            self.framesDiscarded(lost)
        return unsent, lost

    #: Deliveries go straight through (the hot path: no extra call).
    send_encoded = QueuedFramedProtocol.writeOrQueue

    def close(self):
        """Close gracefully once everything queued is written (DisconnRply
        or a Disconn last: a DisconnRqst, a redirection, too many protocol
        errors), bounded by progress: once CLOSE_LINGER seconds pass in
        which the client took nothing more of it, what is left is counted
        and the channel closed at once (``closeTookTooLong``), so a client
        that stops reading cannot hold it, and one reading a long queue
        slowly is not cut. While the router stops, ``shutdown-grace``
        bounds it instead (``cutOff``)."""
        super().close()
        if not getattr(self.factory.router, "closing", False):
            self._linger_for("being closed", progress=True)

    def drop(self):
        """A protocol violation (``SessionOutput.drop``): nothing more is
        read (not even the rest of this read: each further frame would log
        another violation), what was written goes out, the Disconn last,
        and the channel closes gracefully; reset after CLOSE_LINGER
        seconds if the peer has not read it all by then."""
        self._stopped = True
        self.close()
        self._linger_for("a protocol violation")

    def shed(self, packet):
        """The client does not read (``SessionOutput.shed``): its queue is
        dropped and counted, a DropWarn (when deliveries were among it) and
        ``packet`` are written behind what the transport holds, and the
        channel closes gracefully, reset after CLOSE_LINGER seconds if the
        client has not read it all by then."""
        def last(dropped):
            frames = [] if packet is None else [packets.encode(packet)]
            if dropped and frames:
                frames.insert(0, _DROPWARN)
            self._tail = sum(len(f) + 4 for f in frames)
            return frames
        self.shutOut(last)
        self._linger_for("being disconnected for not reading")

    def lingerWritten(self):
        """A graceful close wrote everything and sent end of file: the client
        has CLOSE_LINGER seconds to close its end (unless a deadline runs
        already), its input read and discarded meanwhile."""
        self._linger_for("being closed")

    def _linger_for(self, why, progress=False):
        """Bound the close (``boundClose``): CLOSE_LINGER seconds from now,
        or with ``progress`` once CLOSE_LINGER seconds pass with nothing
        more written."""
        self.boundClose(CLOSE_LINGER, why, progress)

    def closeClock(self):
        return self.factory.clock

    def closeTookTooLong(self, why, progress):
        self._linger_over(why, f"it took nothing more of what it was sent for "
                               f"{CLOSE_LINGER:g} s while {why}" if progress else None)

    def _linger_over(self, why, cause=None):
        """The close took too long (or ``cause``): what the transport still
        holds is counted (``_count_unsent``) and the channel closed at once
        (over TCP and TLS without a reset, so what the kernel holds still
        reaches a client that reads later); what is still queued is
        counted as it is dropped."""
        self.cancelCloseBound()
        if self.transport is None:
            return
        if cause is None:
            # All written and our side shut: the client read it, or the
            # kernel holds it for the client; only its close is missing.
            undone = ("close its end" if self.lingering and not unsent_bytes(self.transport)
                      else "read what it was sent")
            cause = f"it did not {undone} within {CLOSE_LINGER:g} s of {why}"
        unsent, lost = self._count_unsent()
        self.log.info("closing channel from {peer} at once: {cause}{unsent}", peer=self.peer,
                      cause=cause,
                      unsent="" if not unsent else
                      f"; {unsent} bytes left unwritten, counted as {lost} dropped deliveries")
        self.resetKeepingSent()

    def discardedTooMuch(self):
        """The client sent over CLOSING_MAX_DISCARD bytes while its channel
        closed: closed at once, as when the linger runs out."""
        self._linger_over("being closed", f"it sent over {CLOSING_MAX_DISCARD} bytes "
                                          "while being closed")

    def queueOverflowed(self, error):
        self.log.warn("disconnecting slow client {peer}: {reason}",
                      peer=self.peer, reason=str(error))
        self.session.slow_client(str(error))

    def framesDropped(self, count):
        self.session.deliveries_dropped(count, SEND_QUEUE_FULL)

    def framesDiscarded(self, count):
        if self.session is not None:
            self.session.deliveries_discarded(count)

    def frameQueued(self):
        budget = self.queue.budget
        if budget is not None and budget.over():
            budget.enforce()

    def _shed(self, dropped):
        """The router-wide queue budget dropped deliveries from our queue."""
        self.session.deliveries_dropped(dropped, QUEUE_MEMORY_FULL)

    def _evicted(self, queue):
        """The router-wide queue budget is exhausted and ours is the largest
        queue that cannot shed: disconnect, as for drop policy none."""
        self.log.warn("disconnecting slow client {peer}: router-wide send queue "
                      "memory (max-queue-memory) exhausted", peer=self.peer)
        self.session.slow_client("router-wide send queue memory (max-queue-memory) "
                                 "exhausted")

    def frameTooLong(self, length):
        before = self.session is not None and self.session.state is not _CONNECTED
        first = self.session is None or before
        header = length.to_bytes(4, "big") if 0 <= length < 1 << 32 else b""
        from elvin.protocols.tls import looks_like_tls
        if first and looks_like_tls(header):
            self.log.info("resetting channel from {peer}: it began with a TLS record, not "
                          "an Elvin packet: a TLS client on a plain listener (TLS clients "
                          "use an elvin:/secure/ listener)", peer=self.peer)
        elif first and header[:4] in _HTTP_METHODS:
            self.log.info("resetting channel from {peer}: it began with an HTTP request "
                          "({method}), not an Elvin packet: HTTP clients use an "
                          "elvin:/http,none,xdr/ listener", peer=self.peer,
                          method=header.decode("ascii").strip())
        else:
            self.log.info("resetting channel from {peer}: a {length}-byte packet is over "
                          "its limit of {limit} bytes{when}", peer=self.peer, length=length,
                          limit=self.max_frame_length,
                          when=" before ConnRqst" if before else "")
        super().frameTooLong(length)

    def receiveBudgetExhausted(self, held):
        if self.session is not None:
            self.session.ending("router-wide receive memory (max-receive-memory) exhausted")
        super().receiveBudgetExhausted(held)

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
        # (Called when a session is connected and whenever its options
        # change: the NotifyEmit fast path runs only on a connected one.)
        self._emit_limits_from = packets.notify_emit_limits_from(options.count_limits)
        self._apply_nodelay(options)
        self.max_frame_length = options["Packet.Max-Length"]
        self.queue.configure(options["Send-Queue.Max-Length"],
                             options["Send-Queue.Drop-Policy"])


class ElvinServerFactory(protocol.Factory):
    """Makes a protocol per accepted channel, all sharing one Router."""

    protocol = ElvinServerProtocol
    noisy = False          # the router logs the URIs it listens on instead

    def __init__(self, router, clock=None, connect_timeout=CONNECT_TIMEOUT,
                 client_keepalive=CLIENT_KEEPALIVE):
        if clock is None:
            from twisted.internet import reactor as clock
        self.router = router
        self.clock = clock
        self.connect_timeout = connect_timeout
        #: ``client-keepalive``: seconds idle before the kernel probes a client
        self.client_keepalive = client_keepalive


def _why(reason):
    """How a channel ended, from connectionLost's reason, for the log."""
    if reason is None or reason.check(error.ConnectionDone):
        return "client closed the connection"
    return f"connection lost: {reason.getErrorMessage()}"
