"""TCP framing for Elvin (client protocol 4.0, section 8.2.1).

Every packet travels behind a 4-byte big-endian unsigned length. The spec
lets an implementation cap the length it accepts and says that on a header
announcing more it MUST reset the connection; a connection lost between
header and end of packet is a communications error.

``FramedProtocol`` does exactly that for Twisted and hands each whole packet
to ``frameReceived``. Decisions:

* ``max_frame_length`` (default 1 MiB) is per instance, so a session can
  apply its negotiated Packet.Max-Length; a change takes effect from the
  next header, even one already buffered.
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
* Input is kept in one bytearray and consumed from an offset, so many
  small frames in one chunk, or one big frame in many chunks, cost linear
  time; a chunk holding only whole frames is sliced without buffering.
"""

import struct

from twisted.internet import protocol

__all__ = ["FramedProtocol", "DEFAULT_MAX_FRAME_LENGTH", "frame"]

DEFAULT_MAX_FRAME_LENGTH = 1 << 20

_header = struct.Struct(">I")
_unpack_header = _header.unpack_from
_pack_header = _header.pack


def frame(data):
    """``data`` behind its length header, as one bytes object."""
    return _pack_header(len(data)) + data


class FramedProtocol(protocol.Protocol):
    """A Protocol that receives and sends length-framed packets."""

    max_frame_length = DEFAULT_MAX_FRAME_LENGTH
    require_alignment = True

    _buffer = b""
    _stopped = False

    def __init__(self):
        self._buffer = bytearray()
        self._stopped = False

    # -- receiving ---------------------------------------------------------

    #: Bytes read and written on this channel (for metrics: elvin.ops).
    bytes_in = 0
    bytes_out = 0

    def dataReceived(self, data):
        if self._stopped:
            return
        self.bytes_in += len(data)
        buffer = self._buffer
        if buffer:
            buffer += data
            data = buffer
        total = len(data)
        pos = 0
        try:
            while total - pos >= 4:
                length = _unpack_header(data, pos)[0]
                if not self._length_ok(length):
                    self._buffer = bytearray()
                    return
                end = pos + 4 + length
                if end > total:
                    break
                packet = bytes(data[pos + 4:end])
                pos = end
                self.frameReceived(packet)
                if self._stopped:
                    return
        finally:
            # keep only unconsumed input, even if frameReceived raised
            if not self._stopped:
                if data is buffer:
                    if pos:
                        del buffer[:pos]
                elif pos < total:
                    self._buffer = bytearray(memoryview(data)[pos:])

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

    def frameIncomplete(self, buffered):
        """The connection closed with ``buffered`` bytes of an unfinished
        frame: a communications error (spec 8.2.1). Override to report it."""

    def connectionLost(self, reason=protocol.connectionDone):
        buffered = len(self._buffer)
        stopped = self._stopped
        self._buffer = bytearray()
        self._stopped = True
        if buffered and not stopped:
            self.frameIncomplete(buffered)

    # -- sending -----------------------------------------------------------

    def sendFrame(self, data):
        """Send one packet behind its length header (no copy of ``data``)."""
        self.bytes_out += len(data) + 4
        self.transport.writeSequence((_pack_header(len(data)), data))
