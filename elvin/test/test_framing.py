"""Tests for elvin.protocols.framing: the TCP framing of client protocol 4.0
section 8.2.1 (4-byte big-endian length, then the packet)."""

import struct

from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.internet.error import ConnectionLost
from twisted.trial import unittest

from elvin.protocols.framing import DEFAULT_MAX_FRAME_LENGTH, FramedProtocol, frame


class Recorder(FramedProtocol):

    def __init__(self):
        super().__init__()
        self.frames = []
        self.too_long = []
        self.bad = []
        self.incomplete = []

    def frameReceived(self, data):
        self.frames.append(data)

    def frameTooLong(self, length):
        self.too_long.append(length)
        super().frameTooLong(length)

    def badFrame(self, reason):
        self.bad.append(reason)
        super().badFrame(reason)

    def frameIncomplete(self, buffered):
        self.incomplete.append(buffered)


class _CountingBytes(bytes):
    """bytes that count how many bytes slices of them hold, in total."""

    sliced = 0

    def __getitem__(self, index):
        got = super().__getitem__(index)
        if isinstance(index, slice):
            self.sliced += len(got)
        return got


def packet(n, fill=b"\x01"):
    return fill * n


class FramingTests(unittest.TestCase):

    def setUp(self):
        self.transport = StringTransport()
        self.proto = Recorder()
        self.proto.makeConnection(self.transport)

    def test_header_layout(self):
        self.assertEqual(frame(b"abcd"), b"\x00\x00\x00\x04abcd")
        self.proto.sendFrame(b"\x00\x00\x00\x3e")
        self.assertEqual(self.transport.value(), b"\x00\x00\x00\x04\x00\x00\x00\x3e")

    def test_send_frame_uses_write_sequence(self):
        calls = []
        self.transport.writeSequence = calls.append
        data = b"x" * 8
        self.proto.sendFrame(data)
        self.assertEqual(len(calls), 1)
        header, body = calls[0]
        self.assertEqual(header, b"\x00\x00\x00\x08")
        self.assertIs(body, data)

    def test_one_frame(self):
        self.proto.dataReceived(frame(b"\x00\x00\x00\x3f"))
        self.assertEqual(self.proto.frames, [b"\x00\x00\x00\x3f"])
        self.assertIs(type(self.proto.frames[0]), bytes)

    def test_split_byte_by_byte(self):
        data = frame(packet(8, b"a")) + frame(packet(12, b"b"))
        for i in range(len(data)):
            self.proto.dataReceived(data[i:i + 1])
        self.assertEqual(self.proto.frames, [packet(8, b"a"), packet(12, b"b")])

    def test_split_inside_header_and_body(self):
        data = frame(packet(16, b"z"))
        self.proto.dataReceived(data[:2])
        self.proto.dataReceived(data[2:7])
        self.assertEqual(self.proto.frames, [])
        self.proto.dataReceived(data[7:])
        self.assertEqual(self.proto.frames, [packet(16, b"z")])

    def test_several_frames_in_one_call(self):
        frames = [packet(4 * (i + 1), bytes([i])) for i in range(10)]
        self.proto.dataReceived(b"".join(frame(f) for f in frames))
        self.assertEqual(self.proto.frames, frames)

    def test_frames_plus_partial(self):
        data = frame(packet(4, b"a")) + frame(packet(8, b"b"))
        self.proto.dataReceived(data + frame(packet(8, b"c"))[:6])
        self.assertEqual(self.proto.frames, [packet(4, b"a"), packet(8, b"b")])
        self.proto.dataReceived(frame(packet(8, b"c"))[6:] + frame(packet(4, b"d")))
        self.assertEqual(self.proto.frames[2:], [packet(8, b"c"), packet(4, b"d")])

    def test_oversize_header_aborts(self):
        self.proto.max_frame_length = 1024
        self.proto.dataReceived(struct.pack(">I", 1028))
        self.assertEqual(self.proto.too_long, [1028])
        self.assertTrue(self.transport.disconnecting)
        self.assertTrue(self.transport.disconnected)  # abortConnection
        # nothing more is processed
        self.proto.dataReceived(frame(b"abcd"))
        self.assertEqual(self.proto.frames, [])

    def test_oversize_detected_before_body_arrives(self):
        self.proto.dataReceived(frame(b"okok") + struct.pack(">I", 0xFFFFFFF0) + b"xx")
        self.assertEqual(self.proto.frames, [b"okok"])
        self.assertEqual(self.proto.too_long, [0xFFFFFFF0])
        self.assertTrue(self.transport.disconnected)

    def test_default_and_per_instance_limit(self):
        self.assertEqual(FramedProtocol.max_frame_length, DEFAULT_MAX_FRAME_LENGTH)
        self.assertEqual(DEFAULT_MAX_FRAME_LENGTH, 1 << 20)
        self.proto.dataReceived(struct.pack(">I", (1 << 20) + 4))
        self.assertEqual(self.proto.too_long, [(1 << 20) + 4])
        other = Recorder()
        other.max_frame_length = 8
        other.makeConnection(StringTransport())
        other.dataReceived(frame(packet(8)))
        self.assertEqual(other.frames, [packet(8)])
        self.assertEqual(Recorder().max_frame_length, DEFAULT_MAX_FRAME_LENGTH)

    def test_limit_change_applies_to_next_buffered_frame(self):
        class Shrinking(Recorder):
            def frameReceived(self, data):
                super().frameReceived(data)
                self.max_frame_length = 4
        proto = Shrinking()
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(frame(packet(8)) + frame(packet(8)))
        self.assertEqual(proto.frames, [packet(8)])
        self.assertEqual(proto.too_long, [8])
        self.assertTrue(transport.disconnected)

    def test_zero_length_is_bad(self):
        self.proto.dataReceived(b"\0\0\0\0")
        self.assertEqual(len(self.proto.bad), 1)
        self.assertIn("zero", self.proto.bad[0])
        self.assertTrue(self.transport.disconnected)

    def test_unaligned_length_is_bad(self):
        self.proto.dataReceived(frame(b"abc"))
        self.assertIn("multiple of 4", self.proto.bad[0])
        self.assertEqual(self.proto.frames, [])
        self.assertTrue(self.transport.disconnected)

    def test_alignment_can_be_disabled(self):
        self.proto.require_alignment = False
        self.proto.dataReceived(frame(b"abc"))
        self.assertEqual(self.proto.frames, [b"abc"])

    def test_lost_mid_frame_is_reported(self):
        self.proto.dataReceived(frame(packet(8))[:7])
        self.proto.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.proto.incomplete, [7])

    def test_lost_mid_header_is_reported(self):
        self.proto.dataReceived(b"\0\0")
        self.proto.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.proto.incomplete, [2])

    def test_lost_between_frames_is_clean(self):
        self.proto.dataReceived(frame(packet(8)))
        self.proto.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.proto.incomplete, [])

    def test_lost_after_bad_frame_is_not_incomplete(self):
        self.proto.dataReceived(struct.pack(">I", 1 << 30) + b"xxxx")
        self.proto.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.proto.incomplete, [])

    def test_no_frames_after_connection_lost_inside_frame_received(self):
        class Closing(Recorder):
            def frameReceived(self, data):
                super().frameReceived(data)
                self.connectionLost(Failure(ConnectionLost()))
        proto = Closing()
        proto.makeConnection(StringTransport())
        proto.dataReceived(frame(b"aaaa") + frame(b"bbbb"))
        self.assertEqual(proto.frames, [b"aaaa"])
        proto.dataReceived(frame(b"cccc"))
        self.assertEqual(proto.frames, [b"aaaa"])

    def test_many_small_frames_linear(self):
        """200k frames in one chunk: each frame's bytes are copied out of
        the chunk once, and nothing else is (cutting the rest of the chunk
        off after every frame would copy it 200k times: minutes).
        Counted, not timed: the bytes sliced out of the chunk."""
        count = 200_000
        data = _CountingBytes(frame(b"\0\0\0\x3f") * count)
        self.proto.dataReceived(data)
        self.assertEqual(len(self.proto.frames), count)
        self.assertEqual(set(self.proto.frames), {b"\0\0\0\x3f"})
        self.assertEqual(data.sliced, 4 * count)

    def test_big_frame_in_small_chunks(self):
        body = bytes(range(256)) * 1024          # 256 KiB
        data = frame(body)
        for i in range(0, len(data), 64):
            self.proto.dataReceived(data[i:i + 64])
        self.assertEqual(self.proto.frames, [body])
        self.assertEqual(self.proto.buffered, 0)

    def test_many_small_chunks_with_leftovers(self):
        frames = [packet(4 * (i % 7 + 1), bytes([i % 256])) for i in range(2000)]
        data = b"".join(frame(f) for f in frames)
        for i in range(0, len(data), 13):
            self.proto.dataReceived(data[i:i + 13])
        self.assertEqual(self.proto.frames, frames)

    def test_memoryview_and_bytearray_input(self):
        self.proto.dataReceived(memoryview(frame(b"abcd")))
        self.proto.dataReceived(bytearray(frame(b"efgh")))
        self.assertEqual(self.proto.frames, [b"abcd", b"efgh"])
        self.assertTrue(all(type(f) is bytes for f in self.proto.frames))

    def test_frame_received_must_be_overridden(self):
        proto = FramedProtocol()
        proto.makeConnection(StringTransport())
        self.assertRaises(NotImplementedError, proto.dataReceived, frame(b"abcd"))

    def test_exception_in_frame_received_does_not_redeliver(self):
        class Failing(Recorder):
            def frameReceived(self, data):
                super().frameReceived(data)
                if data == b"boom":
                    raise RuntimeError("boom")
        proto = Failing()
        proto.makeConnection(StringTransport())
        proto.dataReceived(b"\0")
        self.assertRaises(RuntimeError, proto.dataReceived,
                          frame(b"boom")[1:] + frame(b"next")[:5])
        proto.dataReceived(frame(b"next")[5:])
        self.assertEqual(proto.frames, [b"boom", b"next"])
