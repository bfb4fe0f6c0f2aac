"""TCP framing for Elvin (client protocol 4.0, section 8.2.1).

Every packet travels behind a 4-byte big-endian unsigned length. The spec
lets an implementation cap the length it accepts and says that on a header
announcing more it MUST reset the connection; a connection lost between
header and end of packet is a communications error.

``FramedProtocol`` does exactly that for Twisted and hands each whole packet
to ``frameReceived``. Decisions:

* ``max_frame_length`` (default 1 MiB) is per instance, so a session can
  apply its negotiated Packet.Max-Length; a change takes effect from the
  next header read, even one later in the chunk being read (a ConnRqst
  and the packet after it may arrive together).
* The length is read unsigned. Zero is rejected (every XDR packet has at
  least its pkt_id) and, while ``require_alignment`` is true (default), so
  is a length that is not a multiple of 4: section 8.2.3 says XDR is
  4-byte aligned and RFC 1832 makes every item a multiple of four bytes
  (Avis rejects such frames too).
* Violations go to the hooks ``frameTooLong(length)`` and
  ``badFrame(reason)``, which by default abort the connection (a TCP reset
  where the transport supports it). After a violation no more input is
  processed, nor is any after ``connectionLost`` (even if it is called
  from inside ``frameReceived``).
* ``connectionLost`` calls ``frameIncomplete(buffered)`` if it arrives with
  part of a header or packet buffered -- the "communications error" of the
  spec. The default does nothing; a subclass overriding connectionLost
  must call ``FramedProtocol.connectionLost`` to get it.
* An unfinished frame is kept as its header and the pieces of its payload
  (reads of 16 KiB or more as they came, smaller ones coalesced), joined
  once when it is complete: what is held is what was received, with no
  growing buffer over-allocating, and each read costs O(1) beyond its own
  bytes. A chunk holding only whole frames is sliced without buffering.
* Those bytes count against a ``ReceiveBudget`` (``receive_budget``, found
  when the connection is made: the router's, for a channel serving one).
  When the bytes held in unfinished frames router-wide pass its cap, the
  channels holding the most are reset until the total is a tenth under
  it; each is told by ``receiveBudgetExhausted(held)``, logged once and
  counted in the budget's ``closes``.
* A reading turn is cut when the channel's packets have taken more than
  its ``turn_slice`` (a ``TurnSlice``: the router's ``max-turn-time``,
  found when the connection is made; None: never cut). The check follows
  a packet with input after it in the same read: the rest of the input
  waits, in order, reading from the transport is paused (the pause reason
  ``SLICED``: see ``pause_reading``), and a later reactor turn goes on
  with it, slice by slice, resuming reading once nothing waits. Input
  arriving meanwhile (TLS decrypts a whole read; an HTTP tunnel's POSTs)
  waits after it. What waits counts against the receive budget; it is a
  view of the chunk it came in (never copied), which stays in memory until
  its last packet is handled. A connection lost meanwhile drops it.
"""

import collections
import struct
from operator import itemgetter

from twisted.internet import protocol
from twisted.logger import Logger

__all__ = ["FramedProtocol", "ReceiveBudget", "DEFAULT_MAX_FRAME_LENGTH",
           "DEFAULT_MAX_RECEIVE_MEMORY", "SLICED", "frame", "peer_text",
           "receive_budget_of"]

DEFAULT_MAX_FRAME_LENGTH = 1 << 20

#: Default router-wide cap on the bytes held in unfinished frames.
DEFAULT_MAX_RECEIVE_MEMORY = 64 << 20

#: Reads shorter than this are coalesced while a frame is unfinished, so
#: a peer trickling bytes cannot make the router keep an object per byte.
_PIECE = 16 << 10

#: The reason reading is paused while a cut turn's input waits.
SLICED = "sliced"

_header = struct.Struct(">I")
_unpack_header = _header.unpack_from
_pack_header = _header.pack

_log = Logger()


def frame(data):
    """``data`` behind its length header, as one bytes object."""
    return _pack_header(len(data)) + data


class ReceiveBudget:
    """A cap on the bytes held in unfinished frames by all the channels
    that count against it (a router's ``max-receive-memory``).

    A holder reports what it holds with ``hold`` (O(1)). When a report
    takes the total over ``max_bytes`` (0: no cap), the holders holding the
    most are closed, largest first, until the total is a tenth under the
    cap: each is forgotten, logged (naming ``holder.receive_budget_peer()``
    and the bytes it held) and told by ``holder.receive_budget_closed(held)``,
    which must drop what it holds and close its connection. ``closes`` and
    ``closed_bytes`` count them (for metrics).
    """

    def __init__(self, max_bytes=DEFAULT_MAX_RECEIVE_MEMORY):
        self.max_bytes = max_bytes
        #: Bytes held now, by all holders together.
        self.total = 0
        #: Channels closed because the budget ran out, and the bytes they held.
        self.closes = 0
        self.closed_bytes = 0
        self._held = {}

    def __len__(self):
        """How many holders hold something."""
        return len(self._held)

    def held_by(self, holder):
        return self._held.get(holder, 0)

    def hold(self, holder, held):
        """``holder`` now holds ``held`` bytes (0: nothing)."""
        if held:
            old = self._held.get(holder, 0)
            self._held[holder] = held
        else:
            old = self._held.pop(holder, 0)
        self.total += held - old
        if held > old and self.max_bytes and self.total > self.max_bytes:
            self._close_largest()

    def _close_largest(self):
        target = self.max_bytes - self.max_bytes // 10
        for holder, held in sorted(self._held.items(), key=itemgetter(1), reverse=True):
            if self.total <= target:
                break
            if self._held.pop(holder, None) is None:
                continue             # let go meanwhile (closing another)
            self.total -= held
            self.closes += 1
            self.closed_bytes += held
            _log.warn("resetting connection from {peer}: it held {held} bytes of an "
                      "unfinished packet when the router-wide receive memory "
                      "(max-receive-memory, {max} bytes) ran out",
                      peer=holder.receive_budget_peer(), held=held, max=self.max_bytes)
            holder.receive_budget_closed(held)


def receive_budget_of(router):
    """``router``'s ReceiveBudget (its ``receive_budget``), made with the
    default cap the first time it is asked for; the router's service sets
    the cap from ``max-receive-memory``."""
    budget = getattr(router, "receive_budget", None)
    if budget is None:
        budget = router.receive_budget = ReceiveBudget()
    return budget


def peer_text(transport):
    """``host:port`` of ``transport``'s peer, for log lines."""
    peer = transport.getPeer() if transport is not None else None
    return f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"


class FramedProtocol(protocol.Protocol):
    """A Protocol that receives and sends length-framed packets."""

    max_frame_length = DEFAULT_MAX_FRAME_LENGTH
    require_alignment = True
    #: The ReceiveBudget unfinished frames count against (None: none).
    receive_budget = None
    #: The TurnSlice that cuts long reading turns (None: never cut).
    turn_slice = None
    #: Whether the transport's ``pauseProducing`` stops it reading (TCP,
    #: TLS); an HTTP tunnel's pauses our writing instead, so is not called.
    reading_pausable = True

    _stopped = False
    #: Bytes of the unfinished frame held: header and payload so far.
    _held = 0
    #: What a cut turn left and what arrived after it (a deque while
    #: anything waits: 760 bytes a connection otherwise), and their bytes.
    _waiting: "collections.deque | tuple" = ()
    _waiting_bytes = 0
    #: The delayed call going on with the waiting input, while it waits.
    _resume_call = None
    #: Why reading from the transport is paused (``pause_reading``).
    _read_pauses: "frozenset | set" = frozenset()

    def __init__(self):
        self._stopped = False
        self._clear()

    def _clear(self):
        #: The unfinished frame's header, or (``_missing`` None) input not
        #: yet parsed: part of a header, or what follows a frame whose
        #: frameReceived raised.
        self._head = b""
        self._missing = None      # payload bytes still to come
        self._pieces = []         # the payload so far ...
        self._small = bytearray()  # ... and short reads not yet a piece
        self._held = 0

    @property
    def buffered(self):
        """Bytes held for the unfinished frame."""
        return self._held

    @property
    def waiting(self):
        """Bytes of input waiting for a later turn (a cut turn's rest)."""
        return self._waiting_bytes

    def makeConnection(self, transport):
        if self.receive_budget is None:
            self.receive_budget = self.find_receive_budget()
        if self.turn_slice is None:
            self.turn_slice = self.find_turn_slice()
        super().makeConnection(transport)

    def served_router(self):
        """The router this channel serves: its factory's ``router`` (client
        channels) or its ``manager``'s (federation links); None when it
        serves none (clients)."""
        for owner in (getattr(self, "factory", None), getattr(self, "manager", None)):
            router = getattr(owner, "router", None)
            if router is not None:
                return router
        return None

    def find_receive_budget(self):
        """The ReceiveBudget to count against, asked when the connection is
        made: by default the one of the router this channel serves."""
        router = self.served_router()
        return receive_budget_of(router) if router is not None else None

    def find_turn_slice(self):
        """The TurnSlice to cut turns by, asked when the connection is made:
        that of the router this channel serves (its ``turn_slice``, set by
        the router's service), if any."""
        return getattr(self.served_router(), "turn_slice", None)

    # -- receiving ---------------------------------------------------------

    #: Bytes read and written on this channel (for metrics: elvin.ops).
    bytes_in = 0
    bytes_out = 0
    #: Frames written (with ``bytes_out``, their mean size).
    frames_out = 0

    def dataReceived(self, data):
        if self._stopped:
            self.inputDiscarded(len(data))
            return
        self.bytes_in += len(data)
        if self._resume_call is not None or self._waiting_bytes:
            self._wait(data)     # after what a cut turn left, in order
            return
        turns = self.turn_slice
        self._take(data, turns.deadline() if turns is not None else None)

    def _take(self, data, deadline):
        """Handle ``data``, the next input, in a turn ending at ``deadline``."""
        if self._held:
            data = self._continue_frame(data, deadline)
            if data is None:
                return
        self._frames(data, deadline)

    def _continue_frame(self, data, deadline=None):
        """Add ``data`` to the unfinished frame: what follows the frame once
        it is complete (and delivered), else None."""
        missing = self._missing
        if missing is None:
            data = self._head + bytes(data)
            self._clear()
            self._account(0)
            return data
        size = len(data)
        if size < missing:
            self._add(data)
            self._missing = missing - size
            self._account(self._held + size)
            return None
        parts = self._pieces
        if self._small:
            parts.append(self._small)
        rest = None
        if size == missing:
            parts.append(data)
        else:
            view = memoryview(data)
            parts.append(view[:missing])
            rest = view[missing:]
        packet = b"".join(parts)
        self._clear()
        self._account(0)
        try:
            self.frameReceived(packet)
        except BaseException:
            if rest is not None and not self._stopped:
                self._keep_raw(rest)
            raise
        if self._stopped:
            return None
        if rest is not None and deadline is not None and self.turn_slice.now() > deadline:
            self._cut(rest)
            return None
        return rest

    def _add(self, data):
        if len(data) >= _PIECE:
            if self._small:
                self._pieces.append(bytes(self._small))
                self._small = bytearray()
            self._pieces.append(data if type(data) is bytes else bytes(data))
        else:
            small = self._small
            small += data
            if len(small) >= _PIECE:
                self._pieces.append(bytes(small))
                self._small = bytearray()

    def _frames(self, data, deadline=None):
        """Deliver the whole frames in ``data`` and keep what is left; past
        ``deadline`` (when not None) the rest waits for a later turn."""
        total = len(data)
        pos = 0
        complete = False
        now = self.turn_slice.now if deadline is not None else None
        try:
            while total - pos >= 4:
                length = _unpack_header(data, pos)[0]
                # (the limit is read each time: a packet may renegotiate it)
                if (length > self.max_frame_length or not length or length & 3) \
                        and not self._length_ok(length):
                    return
                end = pos + 4 + length
                if end > total:
                    break
                packet = bytes(data[pos + 4:end])
                pos = end
                self.frameReceived(packet)
                if self._stopped:
                    return
                if now is not None and total - pos >= 4 and now() > deadline:
                    self._cut(memoryview(data)[pos:])
                    pos = total
                    return
            complete = True
        finally:
            # keep only unconsumed input, even if frameReceived raised
            if pos < total and not self._stopped:
                if complete:
                    self._keep_frame(data, pos)
                else:
                    self._keep_raw(memoryview(data)[pos:])

    # -- cut turns -----------------------------------------------------------

    def _cut(self, rest):
        """The turn is over its slice: ``rest``, the input after the packet
        just handled, waits (before anything already waiting) for a later
        reactor turn, and reading pauses until nothing waits."""
        if not self._waiting:
            self._waiting = collections.deque()
        self._waiting.appendleft(rest)
        self._waiting_bytes += len(rest)
        self._account(self._held)
        if self._stopped:
            return          # the receive budget closed us
        if self._resume_call is None:
            self._resume_call = self.turn_slice.later(self._go_on)
        self.pause_reading(SLICED)

    def _wait(self, data):
        """Input read while a cut turn's rest waits: it waits after it."""
        if not self._waiting:
            self._waiting = collections.deque()
        self._waiting.append(data)
        self._waiting_bytes += len(data)
        self._account(self._held)

    def _go_on(self):
        """A later turn: handle waiting input for another slice; resume
        reading once nothing waits."""
        self._resume_call = None
        if self._stopped:
            return
        deadline = self.turn_slice.deadline()
        try:
            while self._waiting and self._resume_call is None and not self._stopped:
                data = self._waiting.popleft()
                self._waiting_bytes -= len(data)
                self._take(data, deadline)
        except Exception:
            # As Twisted does when dataReceived raises: log, and close.
            _log.failure("resetting connection from {peer}: handling its input raised",
                         peer=peer_text(self.transport))
            self._drop_waiting()
            self._stopped = True
            if self.transport is not None:
                self.transport.abortConnection()
            return
        self._account(self._held)
        if self._resume_call is None and not self._stopped:
            self._waiting = ()
            self.resume_reading(SLICED)

    def _drop_waiting(self):
        """Forget waiting input and its continuation (the channel ends)."""
        call, self._resume_call = self._resume_call, None
        if call is not None and call.active():
            call.cancel()
        self._waiting = ()
        self._waiting_bytes = 0

    def pause_reading(self, reason):
        """Stop reading from the transport for ``reason`` (hashable) until
        ``resume_reading(reason)``: it reads again once no reason is left,
        so a resume for one reason never undoes a pause for another. (The
        transport pausing *us*, ``pauseProducing``, is about our writing,
        and is not one of these.)"""
        pauses = self._read_pauses
        if reason in pauses:
            return
        if not pauses:
            self._read_pauses = pauses = set()
        pauses.add(reason)
        if len(pauses) == 1 and self.reading_pausable and self.transport is not None:
            self.transport.pauseProducing()

    def resume_reading(self, reason):
        """Undo ``pause_reading(reason)``."""
        pauses = self._read_pauses
        if reason not in pauses:
            return
        pauses.discard(reason)
        transport = self.transport
        if not pauses and self.reading_pausable and transport is not None \
                and not getattr(transport, "disconnecting", False):
            transport.resumeProducing()

    def discard_input(self):
        """From now on read what the peer sends and throw it away (a closing
        channel): the unfinished frame and waiting input are dropped, and
        reading resumes whatever paused it."""
        self._stopped = True
        self._drop_waiting()
        self._clear()
        self._account(0)
        if self._read_pauses:
            self._read_pauses = frozenset()
            transport = self.transport
            if self.reading_pausable and transport is not None:
                transport.resumeProducing()

    @property
    def read_paused(self):
        """The reasons reading from the transport is paused now."""
        return frozenset(self._read_pauses)

    def _keep_frame(self, data, pos):
        """``data[pos:]`` is the start of a frame (its header, if whole,
        already checked): hold it, without copying a chunk that is all of it."""
        rest = len(data) - pos
        if rest < 4:
            self._keep_raw(memoryview(data)[pos:])
            return
        self._head = bytes(data[pos:pos + 4])
        self._missing = _unpack_header(self._head)[0] - (rest - 4)
        if rest > 4:
            if pos == 0 and type(data) is bytes and rest >= _PIECE:
                self._pieces.append(memoryview(data)[4:])   # holds no more than data
            else:
                self._add(memoryview(data)[pos + 4:])
        self._account(rest)

    def _keep_raw(self, rest):
        self._head = bytes(rest)
        self._missing = None
        self._account(len(self._head))

    def _account(self, held):
        self._held = held
        budget = self.receive_budget
        if budget is not None:
            budget.hold(self, held + self._waiting_bytes)

    def receive_budget_peer(self):
        return peer_text(self.transport)

    def receive_budget_closed(self, held):
        """Called by the ReceiveBudget, which has forgotten us (and logged
        it): drop the unfinished frame and reset the connection."""
        self._stopped = True
        self._clear()
        self._drop_waiting()
        self.receiveBudgetExhausted(held)

    def _length_ok(self, length):
        if length > self.max_frame_length:
            self._stopped = True
            self.frameTooLong(length)
            return False
        if length == 0 or (self.require_alignment and length & 3):
            self._stopped = True
            self.badFrame(f"frame length {length} is "
                          + ("zero" if length == 0 else "not a multiple of 4"))
            return False
        return True

    def frameReceived(self, data):
        """Called with the bytes of each whole packet. Override."""
        raise NotImplementedError

    def frameTooLong(self, length):
        """A header announced ``length`` > ``max_frame_length``: reset."""
        self.transport.abortConnection()

    def badFrame(self, reason):
        """A header announced an impossible length: reset."""
        self.transport.abortConnection()

    def receiveBudgetExhausted(self, held):
        """The receive budget ran out and this channel, holding ``held``
        bytes of an unfinished frame, is among those holding the most (its
        frame is dropped and the event logged already): reset."""
        self.transport.abortConnection()

    def inputDiscarded(self, size):
        """``size`` bytes were read after input stopped being handled (a
        violation, a closing channel) and thrown away (override)."""

    def frameIncomplete(self, buffered):
        """The connection closed with ``buffered`` bytes of an unfinished
        frame: a communications error (spec 8.2.1). Override to report it."""

    def connectionLost(self, reason=protocol.connectionDone):
        buffered = self._held
        stopped = self._stopped
        self._stopped = True
        if self._waiting_bytes or self._resume_call is not None:
            self._drop_waiting()      # lost with the connection, as unread input is
            self._account(buffered)
        if buffered:
            self._clear()
            self._account(0)
        if buffered and not stopped:
            self.frameIncomplete(buffered)

    # -- sending -----------------------------------------------------------

    def sendFrame(self, data):
        """Send one packet behind its length header (no copy of ``data``)."""
        self.bytes_out += len(data) + 4
        self.frames_out += 1
        self.transport.writeSequence((_pack_header(len(data)), data))
