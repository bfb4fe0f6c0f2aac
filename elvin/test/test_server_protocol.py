"""Protocol tests: the server protocol over StringTransport, and the send queue."""

import struct

from twisted.internet.testing import StringTransport
from twisted.internet.task import Clock
from hypothesis import given, settings, strategies as st
from twisted.trial import unittest

from elvin.core.options import DropPolicy
from elvin.protocols import packets as elvin_packets, xdr
from elvin.protocols.server import ElvinServerFactory
from elvin.core.router import Router
from elvin.core.sendqueue import QueueOverflow, SendQueue
from elvin.values import Int64

from elvin.test.test_xdr import elvin_characters


def frame(packet):
    data = elvin_packets.encode(packet)
    return struct.pack(">I", len(data)) + data


def unframe(data):
    packets = []
    while data:
        (length,) = struct.unpack(">I", data[:4])
        packets.append(elvin_packets.decode(data[4:4 + length]))
        data = data[4 + length:]
    return packets


class Harness:
    def __init__(self, router=None, clock=None):
        self.router = router or Router()
        self.clock = clock or Clock()
        self.factory = ElvinServerFactory(self.router, self.clock, connect_timeout=30)

    def client(self):
        proto = self.factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport


class ServerProtocolTests(unittest.TestCase):
    def setUp(self):
        self.h = Harness()

    def connected(self, options=None):
        proto, transport = self.h.client()
        proto.dataReceived(frame(elvin_packets.ConnRqst(1, 4, 0, options or {}, elvin_packets.Keys.EMPTY,
                                            elvin_packets.Keys.EMPTY)))
        (reply,) = unframe(transport.value())
        self.assertIsInstance(reply, elvin_packets.ConnRply)
        transport.clear()
        return proto, transport

    def test_connect_split_across_reads(self):
        proto, transport = self.h.client()
        data = frame(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        for i in range(len(data)):
            proto.dataReceived(data[i:i + 1])
        self.assertIsInstance(unframe(transport.value())[0], elvin_packets.ConnRply)

    def test_subscribe_and_deliver(self):
        proto, transport = self.connected()
        proto.dataReceived(frame(elvin_packets.SubAddRqst(2, "a > 1", True, elvin_packets.Keys.EMPTY))
                           + frame(elvin_packets.NotifyEmit({"a": 2}, True, elvin_packets.Keys.EMPTY)))
        rply, deliver = unframe(transport.value())
        self.assertEqual(rply.xid, 2)
        self.assertEqual(deliver.insecure_matches, (rply.subscription_id,))

    def test_garbage_packet_aborts_only_that_connection(self):
        good, good_t = self.connected()
        good.dataReceived(frame(elvin_packets.SubAddRqst(2, "require(a)", True, elvin_packets.Keys.EMPTY)))
        good_t.clear()
        bad, bad_t = self.connected()
        bad.dataReceived(struct.pack(">II", 4, 9999))  # unknown packet id
        self.assertTrue(bad_t.disconnecting)
        other, other_t = self.connected()
        other.dataReceived(frame(elvin_packets.NotifyEmit({"a": 1}, True, elvin_packets.Keys.EMPTY)))
        self.assertEqual(len(unframe(good_t.value())), 1)

    def test_notification_repeating_an_attribute_name_is_ignored(self):
        """7.3.3: a protocol error in a NotifyEmit is ignored. Naming an
        attribute twice drops that notification (counted, and toward
        max-protocol-errors), and the publisher's session goes on; so for
        a UNotify on a session-less channel."""
        sub, sub_t = self.connected()
        sub.dataReceived(frame(elvin_packets.SubAddRqst(2, "require(x)", True,
                                                        elvin_packets.Keys.EMPTY)))
        sub_t.clear()
        good = elvin_packets.encode(elvin_packets.NotifyEmit({"x": 1, "y": 2}, True))
        twice = good.replace(b"\0\0\0\x01y\0\0\0", b"\0\0\0\x01x\0\0\0")
        pub, pub_t = self.connected()
        for data in (twice, good):
            pub.dataReceived(struct.pack(">I", len(data)) + data)
        pub.dataReceived(frame(elvin_packets.TestConn()))
        self.assertEqual(unframe(pub_t.value()), [elvin_packets.ConfConn()])
        self.assertFalse(pub_t.disconnecting)
        self.assertEqual([p.attributes for p in unframe(sub_t.value())], [{"x": 1, "y": 2}])
        self.assertEqual(self.h.router.stats["rejected_notifications"], 1)
        self.assertEqual(len(pub.session.protocol_errors), 1)
        udp, udp_t = self.h.client()
        unotify = elvin_packets.encode(elvin_packets.UNotify(4, 0, {"x": 1, "y": 2}, True))
        unotify = unotify.replace(b"\0\0\0\x01y\0\0\0", b"\0\0\0\x01x\0\0\0")
        udp.dataReceived(struct.pack(">I", len(unotify)) + unotify)
        self.assertFalse(udp_t.disconnecting)
        self.assertEqual(udp.session.state, udp.session.UNOTIFY)
        self.assertEqual(self.h.router.stats["rejected_notifications"], 2)

    def test_repeated_attribute_names_count_toward_max_protocol_errors(self):
        self.h.router.max_protocol_errors = 3
        pub, pub_t = self.connected()
        data = elvin_packets.encode(elvin_packets.NotifyEmit({"x": 1, "y": 2}, True))
        data = data.replace(b"\0\0\0\x01y\0\0\0", b"\0\0\0\x01x\0\0\0")
        pub.dataReceived((struct.pack(">I", len(data)) + data) * 3)
        (disconn,) = unframe(pub_t.value())
        self.assertEqual(disconn.reason, 4)
        self.assertTrue(pub_t.disconnecting)

    def test_repeated_name_and_more_wrong_is_still_a_violation(self):
        pub, pub_t = self.connected()
        data = elvin_packets.encode(elvin_packets.NotifyEmit({"x": 1, "y": 2}, True))
        data = data.replace(b"\0\0\0\x01y\0\0\0", b"\0\0\0\x01x\0\0\0")[:-4]
        pub.dataReceived(struct.pack(">I", len(data)) + data)
        self.assertTrue(pub_t.disconnecting)
        self.assertEqual(self.h.router.stats["rejected_notifications"], 0)

    def test_a_string_that_is_not_utf8_is_nacked_with_its_offset(self):
        """Client protocol 7.4.2 has BAD_UTF8 (1006, with the offset) for
        a string that is not UTF-8: a request holding one (quench names,
        a subscription, options) is Nacked with it and the session goes
        on; a notification holding one is ignored (7.3.3)."""
        pub, pub_t = self.connected()
        requests = [
            elvin_packets.QnchAddRqst(3, ("q\u00e9", "ok"), True),
            elvin_packets.QnchModRqst(4, 1, ("q\u00e9",), (), True),
            elvin_packets.SubAddRqst(5, "require(q\u00e9)", True),
            elvin_packets.QosRqst(6, {"q\u00e9": 1}),
        ]
        for request in requests:
            data = elvin_packets.encode(request).replace("\u00e9".encode(), b"\xff\xfe")
            pub.dataReceived(struct.pack(">I", len(data)) + data)
        data = elvin_packets.encode(elvin_packets.NotifyEmit({"q\u00e9": 1}, True))
        data = data.replace("\u00e9".encode(), b"\xff\xfe")
        pub.dataReceived(struct.pack(">I", len(data)) + data)
        pub.dataReceived(frame(elvin_packets.TestConn()))
        *nacks, confconn = unframe(pub_t.value())
        self.assertEqual(confconn, elvin_packets.ConfConn())
        self.assertFalse(pub_t.disconnecting)
        self.assertEqual([(n.xid, n.error) for n in nacks],
                         [(3, 1006), (4, 1006), (5, 1006), (6, 1006)])
        # the offset of the bad byte, from the start of the packet
        self.assertEqual([n.args for n in nacks], [(17,), (25,), (21,), (17,)])
        self.assertIn("QnchAddRqst", nacks[0].message)
        self.assertEqual(self.h.router.stats["rejected_notifications"], 1)
        self.assertEqual(len(pub.session.protocol_errors), 5)

    def test_a_string_holding_nul_is_treated_as_bad_utf8(self):
        """Section 6.1.4: a string has "no NUL (0x00) bytes". A NUL in any
        string takes BAD_UTF8's path, with the NUL's offset: a request is
        Nacked 1006 and the session goes on; a notification, whether the NUL
        is in a value or in a name, is ignored, counted and not delivered."""
        sub, sub_t = self.connected()
        sub.dataReceived(frame(elvin_packets.SubAddRqst(1, "require(v) || require(w)", True)))
        self.assertEqual(len(unframe(sub_t.value())), 1)
        sub_t.clear()
        pub, pub_t = self.connected()
        requests = [
            elvin_packets.QnchAddRqst(3, ("q@", "ok"), True),
            elvin_packets.SubAddRqst(5, 'v == "@"', True),
            elvin_packets.QosRqst(6, {"q@": 1}),
        ]
        for request in requests:
            data = elvin_packets.encode(request).replace(b"@", b"\0")
            pub.dataReceived(struct.pack(">I", len(data)) + data)
        for attributes in ({"v": "a@b"}, {"w@": 1}):
            data = elvin_packets.encode(elvin_packets.NotifyEmit(attributes, True))
            data = data.replace(b"@", b"\0")
            pub.dataReceived(struct.pack(">I", len(data)) + data)
        pub.dataReceived(frame(elvin_packets.NotifyEmit({"v": "ab"}, True)))
        pub.dataReceived(frame(elvin_packets.TestConn()))
        *nacks, confconn = unframe(pub_t.value())
        self.assertEqual(confconn, elvin_packets.ConfConn())
        self.assertFalse(pub_t.disconnecting)
        self.assertEqual([(n.xid, n.error, n.args) for n in nacks],
                         [(3, 1006, (17,)), (5, 1006, (18,)), (6, 1006, (17,))])
        self.assertIn("NUL byte", nacks[0].message)
        self.assertEqual(self.h.router.stats["rejected_notifications"], 2)
        self.assertEqual(len(pub.session.protocol_errors), 5)
        [delivered] = unframe(sub_t.value())
        self.assertEqual(delivered.attributes, {"v": "ab"})

    def test_a_string_that_is_not_utf8_out_of_turn_is_a_violation(self):
        proto, transport = self.h.client()
        data = elvin_packets.encode(elvin_packets.SubAddRqst(5, "require(q\u00e9)", True))
        data = data.replace("\u00e9".encode(), b"\xff\xfe")
        proto.dataReceived(struct.pack(">I", len(data)) + data)
        self.assertEqual(unframe(transport.value()), [])
        self.assertTrue(transport.disconnecting)

    def test_test_conn_before_connrqst_is_answered(self):
        """7.4.13: either side MAY send TestConn; one before ConnRqst gets
        ConfConn (as Avis answers), and does not keep a silent channel open.
        A ConfConn the client sends unasked is ignored (as by Avis)."""
        proto, transport = self.h.client()
        proto.dataReceived(frame(elvin_packets.TestConn()) + frame(elvin_packets.ConfConn()))
        self.assertEqual(unframe(transport.value()), [elvin_packets.ConfConn()])
        self.assertFalse(transport.disconnecting)
        self.h.clock.advance(31)
        self.assertTrue(transport.disconnecting)
        proto, transport = self.connected()
        proto.dataReceived(frame(elvin_packets.ConfConn()) + frame(elvin_packets.TestConn()))
        self.assertEqual(unframe(transport.value()), [elvin_packets.ConfConn()])
        self.assertFalse(transport.disconnecting)

    def test_violation_sends_earlier_replies_then_disconn_4_and_closes(self):
        """7.3.2 lets the router end the channel; it does so gracefully: the
        replies to the packets before the violation and a Disconn (reason
        4) saying why are written, the rest of the read is not looked at,
        and the channel closed (reset only if the peer has not read them
        within VIOLATION_LINGER seconds)."""
        from elvin.protocols.server import VIOLATION_LINGER
        proto, transport = self.connected()
        proto.dataReceived(frame(elvin_packets.SubAddRqst(5, "x == 1", True,
                                                          elvin_packets.Keys.EMPTY))
                           + struct.pack(">II", 4, 99) + frame(elvin_packets.TestConn()))
        rply, disconn = unframe(transport.value())
        self.assertEqual(rply.xid, 5)
        self.assertEqual(disconn.reason, 4)
        self.assertIn("packet id 99", disconn.args)
        self.assertTrue(transport.disconnecting)
        self.assertFalse(transport.disconnected)          # not reset
        self.h.clock.advance(VIOLATION_LINGER)
        self.assertTrue(transport.disconnected)           # the peer never read it

    def test_violation_linger_ends_with_the_connection(self):
        proto, transport = self.connected()
        proto.dataReceived(struct.pack(">II", 4, 99))
        proto.connectionLost(None)
        self.assertEqual(self.h.clock.getDelayedCalls(), [])

    def test_oversize_frame_resets(self):
        proto, transport = self.connected({"Packet.Max-Length": 1024})
        proto.dataReceived(struct.pack(">I", 4096))
        self.assertTrue(transport.disconnecting)

    def test_tls_or_http_on_a_plain_listener_said_so(self):
        """A TLS ClientHello (0x16 0x03 ...) or an HTTP request read as a
        frame header is a huge length: the log says what it looks like."""
        from twisted.logger import formatEvent, globalLogPublisher
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        for first, words in ((b"\x16\x03\x01\x01\x00\x01\x00\x00\xfc\x03\x03",
                              "it began with a TLS record, not an Elvin packet"),
                             (b"GET / HTTP/1.1\r\n", "it began with an HTTP request (GET)")):
            proto, transport = self.h.client()
            proto.dataReceived(first)
            self.assertTrue(transport.disconnecting)
            self.assertTrue(any(words in formatEvent(e) for e in events), events)
        self.assertFalse(any("byte packet is over" in formatEvent(e) for e in events))

    def test_silent_channel_closed_after_timeout(self):
        proto, transport = self.h.client()
        self.h.clock.advance(31)
        self.assertTrue(transport.disconnecting)

    def test_connected_channel_not_timed_out(self):
        proto, transport = self.connected()
        self.h.clock.advance(31)
        self.assertFalse(transport.disconnecting)

    def test_disconnect_flushes_then_closes(self):
        proto, transport = self.connected()
        proto.dataReceived(frame(elvin_packets.DisconnRqst(5)))
        self.assertEqual(unframe(transport.value()), [elvin_packets.DisconnRply(5)])
        self.assertTrue(transport.disconnecting)

    def test_connection_lost_cleans_up(self):
        proto, transport = self.connected()
        proto.dataReceived(frame(elvin_packets.SubAddRqst(2, "require(a)", True, elvin_packets.Keys.EMPTY)))
        proto.connectionLost(None)
        self.assertEqual(len(self.h.router.index), 0)
        self.assertEqual(self.h.router.sessions, set())

    def test_slow_consumer_gets_dropwarn_and_others_keep_receiving(self):
        slow, slow_t = self.connected({"Send-Queue.Max-Length": 4096})
        fast, fast_t = self.connected()
        for proto in (slow, fast):
            proto.dataReceived(frame(elvin_packets.SubAddRqst(2, "require(n)", True, elvin_packets.Keys.EMPTY)))
        slow_t.clear()
        fast_t.clear()
        slow.pauseProducing()  # what Twisted does when the socket stops draining
        producer, _ = self.connected()
        for n in range(200):
            producer.dataReceived(frame(elvin_packets.NotifyEmit({"n": n, "pad": "x" * 100},
                                                     True, elvin_packets.Keys.EMPTY)))
        self.assertEqual(len(unframe(fast_t.value())), 200)
        self.assertEqual(slow_t.value(), b"")
        self.assertLessEqual(slow.queue.size, 4096)
        slow.resumeProducing()
        received = unframe(slow_t.value())
        kinds = [type(p) for p in received]
        self.assertIn(elvin_packets.DropWarn, kinds)
        numbers = [p.attributes["n"] for p in received if type(p) is elvin_packets.NotifyDeliver]
        self.assertEqual(numbers, sorted(numbers))
        self.assertEqual(numbers[-1], 199)  # policy "oldest" keeps the newest
        self.assertGreater(slow.session.dropped, 0)

    def test_replies_are_never_dropped(self):
        proto, transport = self.connected({"Send-Queue.Max-Length": 1024})
        proto.dataReceived(frame(elvin_packets.SubAddRqst(2, "require(n)", True, elvin_packets.Keys.EMPTY)))
        transport.clear()
        proto.pauseProducing()
        for i in range(100):
            proto.dataReceived(frame(elvin_packets.SubAddRqst(10 + i, f"n == {i}", True, elvin_packets.Keys.EMPTY)))
        proto.resumeProducing()
        replies = [p for p in unframe(transport.value()) if type(p) is elvin_packets.SubRply]
        self.assertEqual(len(replies), 100)

    def test_shutdown_sends_disconn_to_every_client(self):
        clients = [self.connected() for _ in range(3)]
        self.h.router.shutdown()
        for proto, transport in clients:
            (packet,) = unframe(transport.value())
            self.assertEqual(packet, elvin_packets.Disconn(1, "router is shutting down"))
            self.assertTrue(transport.disconnecting)


class SendQueueTests(unittest.TestCase):
    WARN = b"WARN----"

    def queue(self, policy, size=100):
        return SendQueue(size, policy, self.WARN)

    def drain(self, q):
        out = []
        while q:
            out.append(q.pop())
        return out

    def test_fits(self):
        q = self.queue(DropPolicy.OLDEST)
        self.assertEqual(q.push(b"a" * 40, True), 0)
        self.assertEqual(q.push(b"b" * 40, True), 0)
        self.assertEqual(q.size, 80)
        self.assertEqual(self.drain(q), [b"a" * 40, b"b" * 40])

    def test_oldest(self):
        q = self.queue(DropPolicy.OLDEST)
        q.push(b"a" * 40, True)
        q.push(b"b" * 40, True)
        self.assertEqual(q.push(b"c" * 40, True), 1)
        self.assertEqual(self.drain(q), [self.WARN, b"b" * 40, b"c" * 40])

    def test_newest(self):
        q = self.queue(DropPolicy.NEWEST)
        q.push(b"a" * 40, True)
        q.push(b"b" * 40, True)
        self.assertEqual(q.push(b"c" * 40, True), 1)
        self.assertEqual(q.push(b"d" * 40, True), 1)
        self.assertEqual(self.drain(q), [b"a" * 40, b"b" * 40, self.WARN])

    def test_largest(self):
        q = self.queue(DropPolicy.LARGEST)
        q.push(b"a" * 20, True)
        q.push(b"b" * 60, True)
        q.push(b"c" * 30, True)
        self.assertEqual(self.drain(q), [b"a" * 20, self.WARN, b"c" * 30])

    def test_none_refuses(self):
        q = self.queue(DropPolicy.NONE)
        q.push(b"a" * 80, True)
        self.assertRaises(QueueOverflow, q.push, b"b" * 40, True)

    def test_undroppable_packets_are_kept(self):
        q = self.queue(DropPolicy.OLDEST)
        q.push(b"r" * 60, False)
        q.push(b"d" * 30, True)
        q.push(b"s" * 60, False)
        self.assertEqual(self.drain(q), [b"r" * 60, self.WARN, b"s" * 60])

    def test_adjacent_warnings_coalesce(self):
        q = self.queue(DropPolicy.OLDEST)
        for c in b"abcdef":
            q.push(bytes([c]) * 30, True)
        packets = self.drain(q)
        self.assertEqual(packets.count(self.WARN), 1)
        self.assertEqual(packets[-1], b"f" * 30)


class NotifyEmitFastPathTests(unittest.TestCase):
    """A NotifyEmit on a session skips the packet object, for speed: the
    limits, the errors and the deliveries stay those of the full path."""

    def setUp(self):
        self.h = Harness()
        self.consumer, self.consumer_t = ServerProtocolTests.connected(self)
        self.consumer.dataReceived(frame(elvin_packets.SubAddRqst(2, "require(a)", True, elvin_packets.Keys.EMPTY)))
        self.consumer_t.clear()

    def deliveries(self):
        got = unframe(self.consumer_t.value())
        self.consumer_t.clear()
        return [p.attributes for p in got if isinstance(p, elvin_packets.NotifyDeliver)]

    def test_limits_negotiated_small_still_refuse_long_names_and_strings(self):
        producer, _ = ServerProtocolTests.connected(
            self, {"Attribute.Name.Max-Length": 64, "Attribute.String.Max-Length": 1024})
        long_name = "n" * 65
        producer.dataReceived(frame(elvin_packets.NotifyEmit({"a": 1, long_name: 1}, True, elvin_packets.Keys.EMPTY))
                              + frame(elvin_packets.NotifyEmit({"a": "é" * 600}, True, elvin_packets.Keys.EMPTY))
                              + frame(elvin_packets.NotifyEmit({"a": "x" * 1024}, True, elvin_packets.Keys.EMPTY))
                              + frame(elvin_packets.NotifyEmit({"a": 2}, True, elvin_packets.Keys.EMPTY)))
        self.assertEqual(self.deliveries(), [{"a": "x" * 1024}, {"a": 2}])
        self.assertEqual(self.h.router.stats["rejected_notifications"], 2)

    def test_bad_notify_emit_gets_the_full_decoders_error(self):
        good = elvin_packets.encode(elvin_packets.NotifyEmit({"a": 1}, True, elvin_packets.Keys.EMPTY))
        for bad in (good[:-2], good[:-4] + struct.pack(">I", 7), good + b"\0\0\0\0",
                    good[:8] + b"\xff\xff\xff\xff" + good[12:]):
            with self.assertRaises(elvin_packets.DecodeError) as full:
                elvin_packets.decode(bad)
            with self.assertRaises(elvin_packets.DecodeError) as fast:
                elvin_packets.decode_notify_emit(bad)
            self.assertEqual(str(fast.exception), str(full.exception))

    def test_notify_emit_fast_decoding_is_the_full_decoders(self):
        keys = elvin_packets.Keys({1: [[b"k1", b"k2"]]})
        for deliver_insecure in (True, False):
            for key_list in (elvin_packets.Keys.EMPTY, keys):
                data = elvin_packets.encode(elvin_packets.NotifyEmit(
                    {"a": 1, "b": "x"}, deliver_insecure, key_list))
                full = elvin_packets.decode(data)
                self.assertEqual(elvin_packets.decode_notify_emit(data),
                                 (full.attributes, full.deliver_insecure, full.keys))
                # Where the compiled decoder read the array, its bytes are
                # the attributes' encoding, keys or none after it.
                end = elvin_packets.notify_emit_fields(data)[3]
                self.assertEqual(bool(end), xdr._accelerated_name_values is not None)
                if end:
                    self.assertEqual(data[4:end], elvin_packets.encode_attributes(full.attributes))

    def test_deliveries_carry_the_attributes_as_encoded(self):
        # Whether the delivery reuses the NotifyEmit's NameValue array (the
        # compiled decoder, zero padding) or encodes the attributes again
        # (the pure-Python decoder, or padding that is not zero), the
        # subscriber gets the canonical encoding.
        proto, transport = self.h.client()
        proto.dataReceived(frame(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY,
                                                        elvin_packets.Keys.EMPTY)))
        proto.dataReceived(frame(elvin_packets.SubAddRqst(2, "require(s)", True,
                                                          elvin_packets.Keys.EMPTY)))
        sub_id = elvin_packets.decode(transport.value()[-16:]).subscription_id
        transport.clear()
        attrs = {"s": "é", "n": 1, "l": Int64(-2), "r": float("nan"), "z": -0.0, "o": b"\x01"}
        body = elvin_packets.encode_attributes(attrs)
        data = elvin_packets.encode(elvin_packets.NotifyEmit(attrs, True, elvin_packets.Keys.EMPTY))
        index = data.index("é".encode())
        dirty = data[:index + 2] + b"\x07" + data[index + 3:]     # a padding byte not zero
        for emitted in (data, dirty):
            proto.dataReceived(struct.pack(">I", len(emitted)) + emitted)
            delivered = transport.value()[4:]
            self.assertEqual(delivered[4:4 + len(body)], body)
            self.assertEqual(delivered, elvin_packets.encode_notify_deliver_from(body, [], [sub_id]))
            transport.clear()

    @settings(max_examples=150, deadline=None)
    @given(st.dictionaries(st.text(elvin_characters, min_size=1, max_size=8),
                           st.one_of(st.integers(-(1 << 31), (1 << 31) - 1),
                                     st.integers(-(1 << 63), (1 << 63) - 1).map(Int64),
                                     st.floats(), st.text(elvin_characters, max_size=9),
                                     st.binary(max_size=9)),
                           max_size=6),
           st.lists(st.integers(0, 1 << 16), max_size=3))
    def test_any_notification_is_delivered_canonically(self, attrs, dirt):
        # Padding bytes set to 0xff at random: the delivery is still the
        # canonical encoding of what was decoded.
        proto, transport = self.h.client()
        proto.dataReceived(frame(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY,
                                                        elvin_packets.Keys.EMPTY)))
        proto.dataReceived(frame(elvin_packets.SubAddRqst(
            2, "require(k)", True, elvin_packets.Keys.EMPTY)))
        attrs["k"] = 1
        sub_id = elvin_packets.decode(transport.value()[-16:]).subscription_id
        transport.clear()
        data = bytearray(elvin_packets.encode(elvin_packets.NotifyEmit(
            attrs, True, elvin_packets.Keys.EMPTY)))
        padding = [i for i in range(len(data)) if _is_padding(data, i)]
        for choice in dirt:
            if padding:
                data[padding[choice % len(padding)]] = 0xff
        decoded = elvin_packets.decode(bytes(data)).attributes
        proto.dataReceived(struct.pack(">I", len(data)) + bytes(data))
        self.assertEqual(transport.value()[4:], elvin_packets.encode_notify_deliver_from(
            elvin_packets.encode_attributes(decoded), [], [sub_id]))

    def test_before_connect_a_notify_emit_is_still_a_violation(self):
        proto, transport = self.h.client()
        proto.dataReceived(frame(elvin_packets.NotifyEmit({"a": 1}, True, elvin_packets.Keys.EMPTY)))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.deliveries(), [])


def _is_padding(data, index):
    """Is ``data[index]`` a padding byte of a NotifyEmit's NameValue array
    (found by walking it: name, type code, value)?"""
    return index in _padding_of(bytes(data))


def _padding_of(data):
    pad = set()
    (count,) = struct.unpack_from(">i", data, 4)
    pos = 8

    def block(pos):
        (n,) = struct.unpack_from(">I", data, pos)
        end = pos + 4 + n
        padded = end + (-n & 3)
        pad.update(range(end, padded))
        return padded
    for _ in range(count):
        pos = block(pos)
        (code,) = struct.unpack_from(">i", data, pos)
        pos += 4
        pos = pos + 4 if code == 1 else pos + 8 if code in (2, 3) else block(pos)
    return pad


class LossAccountingTests(unittest.TestCase):
    """Whatever the router accepts for a client is written to it, or its
    loss is counted (``dropped_deliveries``), logged (rate-limited, and
    in the session's end line) and exported; a client reset for being slow
    is counted too. Written = deliveries - dropped_deliveries throughout."""

    def setUp(self):
        from twisted.logger import globalLogPublisher
        self.clock = Clock()
        self.h = Harness(Router(clock=self.clock.seconds), self.clock)
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.transports = []

    def connected(self, options=None, subscribe=True):
        proto, transport = self.h.client()
        data = frame(elvin_packets.ConnRqst(1, 4, 0, options or {}, elvin_packets.Keys.EMPTY,
                                            elvin_packets.Keys.EMPTY))
        if subscribe:
            data += frame(elvin_packets.SubAddRqst(2, "require(n)", True,
                                                   elvin_packets.Keys.EMPTY))
        proto.dataReceived(data)
        self.transports.append(transport)
        transport.clear()
        return proto, transport

    def publish(self, count, start=0):
        if not hasattr(self, "producer"):
            self.producer, _ = self.connected(subscribe=False)
        for n in range(start, start + count):
            self.producer.dataReceived(frame(elvin_packets.NotifyEmit(
                {"n": n, "pad": "x" * 100}, True, elvin_packets.Keys.EMPTY)))

    def lines(self, word):
        from twisted.logger import formatEvent
        return [formatEvent(e) for e in self.events if word in e.get("log_format", "")]

    def totals(self):
        from elvin.ops.status import snapshot
        return snapshot(self.h.router)["totals"]

    def assert_books_balance(self):
        """Every delivery the router made was written, or counted lost."""
        written = sum(type(p) is elvin_packets.NotifyDeliver
                      for t in self.transports for p in unframe(t.value()))
        totals = self.totals()
        self.assertEqual(totals["deliveries"] - totals["dropped_deliveries"], written)

    def test_drops_are_logged_once_then_at_most_every_10_s(self):
        slow, slow_t = self.connected({"Send-Queue.Max-Length": 4096})
        fast, fast_t = self.connected()
        slow.pauseProducing()
        self.publish(200)
        (first,) = self.lines("since it connected")
        self.assertGreater(slow.session.dropped, 1)
        self.assertIn(": 1 delivery dropped (1 since it connected)", first)  # at once
        self.assertIn(f"slow client {slow.peer}: ", first)
        self.assertIn("Send-Queue.Max-Length 4096 bytes", first)
        self.assertIn("Send-Queue.Drop-Policy oldest", first)
        self.clock.advance(9)
        self.publish(100, 200)
        self.assertEqual(len(self.lines("since it connected")), 1)      # held back
        self.clock.advance(1)
        self.publish(1, 300)
        first, second = self.lines("since it connected")
        since = slow.session.dropped - 1         # all but the first line's
        self.assertIn(f": {since} deliveries dropped in the last 10 s "
                      f"({slow.session.dropped} since it connected)", second)
        self.publish(500, 301)                    # a flood of drops: no more lines
        self.assertEqual(len(self.lines("since it connected")), 2)
        self.assertEqual(self.totals()["dropped_deliveries"], slow.session.dropped)
        slow.resumeProducing()
        self.assert_books_balance()
        slow.connectionLost(None)
        (end,) = [line for line in self.lines("disconnected:") if slow.peer in line]
        self.assertTrue(end.endswith(f"; {slow.session.dropped} deliveries dropped"), end)
        self.assert_books_balance()

    def test_policy_none_closes_gracefully_counting_what_was_queued(self):
        """A client over its queue under policy none is not reset: what
        was written stays ahead of a DropWarn (its queue was dropped) and
        Disconn 4 saying why, and the channel is closed gracefully
        (loseConnection), so the client can read up to the gap."""
        from elvin.ops.metrics import registry_for
        from elvin.ops.status import snapshot
        from prometheus_client import generate_latest
        slow, slow_t = self.connected({"Send-Queue.Max-Length": 4096,
                                       "Send-Queue.Drop-Policy": "none"})
        bystander, bystander_t = self.connected()
        written_before = len(unframe(slow_t.value()))
        slow.pauseProducing()
        self.publish(200)
        self.assertTrue(slow_t.disconnecting)
        self.assertFalse(slow_t.disconnected)             # closed, not reset
        self.assertEqual(len(unframe(bystander_t.value())), 200)
        queued = slow.session.discarded
        self.assertGreater(queued, 0)
        self.assertEqual(slow.session.dropped, queued)
        *delivered, dropwarn, disconn = unframe(slow_t.value())
        self.assertEqual(len(delivered), written_before)
        self.assertIsInstance(dropwarn, elvin_packets.DropWarn)
        self.assertEqual(disconn.reason, 4)
        self.assertIn("slow client: send queue over Send-Queue.Max-Length (4096 bytes) "
                      "with drop policy none", disconn.args)
        totals = self.totals()
        self.assertEqual((totals["dropped_deliveries"], totals["slow_client_disconnections"]),
                         (queued, 1))
        self.assert_books_balance()
        self.publish(10, 200)                            # no longer a subscriber
        self.assertEqual(self.totals()["dropped_deliveries"], queued)
        slow.connectionLost(None)
        (end,) = [line for line in self.lines("disconnected:") if slow.peer in line]
        self.assertIn(f"slow client: send queue over Send-Queue.Max-Length (4096 bytes) "
                      f"with drop policy none; {queued} deliveries dropped ({queued} of them "
                      f"lost with the channel)", end)
        text = generate_latest(registry_for(lambda: snapshot(self.h.router))).decode()
        self.assertIn(f"elvin_dropped_deliveries_total {queued}.0", text)
        self.assertIn("elvin_slow_client_disconnections_total 1.0", text)
        self.assert_books_balance()

    def test_slow_client_not_reading_within_the_linger_is_closed_and_counted(self):
        """A client that reads nothing within CLOSE_LINGER of being closed
        is closed at once; the deliveries the transport still held are
        counted as dropped (from its unwritten bytes)."""
        from elvin.protocols.server import CLOSE_LINGER
        slow, slow_t = self.connected({"Send-Queue.Max-Length": 4096,
                                       "Send-Queue.Drop-Policy": "none"})
        self.publish(5)                                   # written, then unread
        slow.pauseProducing()
        self.publish(200, 5)
        queued = slow.session.discarded
        unread = unframe(slow_t.value())
        self.assertEqual(len(unread), 7)                  # 5 deliveries, DropWarn, Disconn
        slow_t.dataBuffer, slow_t.offset = slow_t.value(), 0   # all still in Twisted's buffer
        self.clock.advance(CLOSE_LINGER - 0.1)
        self.assertFalse(slow_t.disconnected)
        self.clock.advance(0.1)
        self.assertTrue(slow_t.disconnected)
        self.assertEqual(slow.session.discarded, queued + 5)
        self.assertEqual(self.totals()["dropped_deliveries"], queued + 5)
        (line,) = self.lines("at once")
        self.assertIn("counted as 5 dropped deliveries", line)

    def test_disconn_rqst_from_a_client_that_stops_reading_is_bounded(self):
        """A client that sends DisconnRqst with deliveries still queued (its
        transport paused, within its queue's limit) and never reads again
        is closed at once after CLOSE_LINGER seconds in which nothing more
        was written, what it was not sent counted as dropped and logged."""
        from elvin.protocols.server import CLOSE_LINGER
        stuck, stuck_t = self.connected()
        stuck.pauseProducing()                            # the client stops reading
        self.publish(20)
        self.assertEqual(len(stuck.queue), 20)
        stuck.dataReceived(frame(elvin_packets.DisconnRqst(9)))
        self.clock.advance(CLOSE_LINGER - 0.1)
        self.assertFalse(stuck_t.disconnecting)           # (a period without progress)
        self.clock.advance(CLOSE_LINGER)
        self.assertTrue(stuck_t.disconnected)
        self.assertEqual(stuck.session.discarded, 20)     # what was queued
        self.assertEqual(self.totals()["dropped_deliveries"], 20)
        (line,) = self.lines("at once")
        self.assertIn(f"it took nothing more of what it was sent for {CLOSE_LINGER:g} s "
                      "while being closed", line)
        stuck.connectionLost(None)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assert_books_balance()

    def test_disconn_rqst_from_a_slow_but_steady_reader_is_not_cut(self):
        """A client reading its queue after DisconnRqst slowly, but taking
        something every few seconds, gets all of it, then the reply."""
        from elvin.protocols.server import CLOSE_LINGER
        slow, slow_t = self.connected()
        slow.pauseProducing()
        self.publish(20)
        slow.dataReceived(frame(elvin_packets.DisconnRqst(9)))
        written = slow_t.writeSequence

        def write_one(data):                              # the kernel takes one frame
            written(data)
            slow.pauseProducing()
        slow_t.writeSequence = write_one
        for _ in range(25):
            self.clock.advance(CLOSE_LINGER * 0.9)
            slow.resumeProducing()
            if not slow.queue:
                break
        self.assertGreater(self.clock.seconds(), 15 * CLOSE_LINGER)
        self.assertFalse(slow_t.disconnected)
        self.assertTrue(slow_t.disconnecting)             # closed gracefully, all written
        *delivered, reply = unframe(slow_t.value())
        self.assertEqual(len(delivered), 20)
        self.assertEqual(reply, elvin_packets.DisconnRply(9))
        slow.connectionLost(None)
        self.assertEqual(self.totals()["dropped_deliveries"], 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_closes_while_the_router_stops_are_left_to_shutdown_grace(self):
        from elvin.protocols.server import CLOSE_LINGER
        stuck, stuck_t = self.connected()
        stuck.pauseProducing()
        self.publish(3)
        self.h.router.shutdown()
        self.clock.advance(3 * CLOSE_LINGER)
        self.assertFalse(stuck_t.disconnecting)
        self.assertTrue(stuck.cutOff())
        self.assertTrue(stuck_t.disconnected)

    def test_slow_client_that_reads_is_not_reset(self):
        slow, slow_t = self.connected({"Send-Queue.Max-Length": 4096,
                                       "Send-Queue.Drop-Policy": "none"})
        slow.pauseProducing()
        self.publish(200)
        slow.connectionLost(None)                         # it read everything: closed
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertFalse(slow_t.disconnected)

    def test_unread_replies_disconnection_is_counted(self):
        proto, transport = self.connected({"Send-Queue.Max-Length": 1024}, subscribe=False)
        proto.pauseProducing()
        proto.dataReceived(b"".join(frame(elvin_packets.QosRqst(10 + i, {}))
                                    for i in range(500)))
        self.assertTrue(transport.disconnecting)
        totals = self.totals()
        self.assertEqual((totals["slow_client_disconnections"], totals["dropped_deliveries"]),
                         (1, 0))

    def test_deliveries_queued_when_the_connection_is_lost_are_counted(self):
        sub, sub_t = self.connected()
        sub.pauseProducing()
        self.publish(3)
        sub.connectionLost(None)
        self.assertEqual(self.totals()["dropped_deliveries"], 3)
        self.assertEqual(self.totals()["slow_client_disconnections"], 0)
        self.assert_books_balance()

    def test_router_wide_queue_memory_eviction_counts_what_was_queued(self):
        self.h = Harness(Router(clock=self.clock.seconds, max_queue_memory=16384), self.clock)
        hog, hog_t = self.connected({"Send-Queue.Drop-Policy": "none"})
        bystander, bystander_t = self.connected()
        hog.pauseProducing()
        self.publish(300)
        self.assertTrue(hog_t.disconnecting)
        self.assertFalse(hog_t.disconnected)              # closed, not reset
        *_, dropwarn, disconn = unframe(hog_t.value())
        self.assertIsInstance(dropwarn, elvin_packets.DropWarn)
        self.assertEqual(disconn.reason, 4)
        self.assertIn("max-queue-memory", disconn.args)
        self.assertEqual(len(unframe(bystander_t.value())), 300)
        totals = self.totals()
        self.assertEqual(totals["slow_client_disconnections"], 1)
        self.assertEqual(totals["dropped_deliveries"], hog.session.discarded)
        self.assertGreater(hog.session.discarded, 0)
        self.assert_books_balance()

    def test_quench_notifications_are_deliveries_and_their_drops_count(self):
        quencher, quencher_t = self.connected(
            {"Send-Queue.Max-Length": 1024, "Send-Queue.Drop-Policy": "newest"},
            subscribe=False)
        quencher.dataReceived(frame(elvin_packets.QnchAddRqst(3, ("n",), True,
                                                              elvin_packets.Keys.EMPTY)))
        quencher.pauseProducing()
        for n in range(40):                      # each a SubAddNotify to the quencher
            self.connected()
        totals = self.totals()
        self.assertEqual(totals["deliveries"], 40)
        self.assertGreater(totals["dropped_deliveries"], 0)
        quencher.resumeProducing()
        written = sum(type(p) is elvin_packets.SubAddNotify
                      for p in unframe(quencher_t.value()))
        self.assertEqual(totals["deliveries"] - totals["dropped_deliveries"], written)


class _ResetKeepingSent:
    """``resetKeepingSent`` over real TCP (127.0.0.1): what the kernel
    already holds still reaches a client that reads late, then an orderly
    end of stream, where ``abortConnection`` resets and the client's
    kernel throws away what it had received but not read."""

    def serve(self, close):
        from twisted.internet import reactor
        from twisted.internet.protocol import Factory
        from elvin.protocols.output import QueuedFramedProtocol

        class Writer(QueuedFramedProtocol):
            def connectionMade(self):
                for _ in range(20):
                    self.sendFrame(b"\0" * 4092)
                reactor.callLater(0.2, close, self)

        port = reactor.listenTCP(0, Factory.forProtocol(Writer), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return port.getHost().port

    def read_late(self, port):
        import socket
        from twisted.internet import threads

        def run():
            raw = socket.create_connection(("127.0.0.1", port))
            raw.settimeout(5)
            sock = self.wrap(raw)
            got = 0
            try:
                import time
                time.sleep(0.6)                 # the server has closed by now
                while True:
                    data = sock.recv(65536)
                    if not data:
                        return got, "eof"
                    got += len(data)
            except ConnectionResetError:
                return got, "reset"
            except self.cut_error:
                return got, "eof"               # TLS: the cut record, no close_notify
            finally:
                sock.close()
        return threads.deferToThread(run)

    cut_error: type = ()

    def wrap(self, sock):
        return sock

    def test_kernel_data_still_delivered(self):
        port = self.serve(lambda proto: proto.resetKeepingSent())
        d = self.read_late(port)
        d.addCallback(self.assertEqual, (20 * 4096, "eof"))
        return d


class ResetKeepingSentTests(_ResetKeepingSent, unittest.TestCase):

    def test_abort_loses_it(self):
        port = self.serve(lambda proto: proto.transport.abortConnection())
        d = self.read_late(port)
        d.addCallback(lambda result: self.assertEqual(result[1], "reset"))
        return d


class ResetKeepingSentOverTLSTests(_ResetKeepingSent, unittest.TestCase):
    """The same over TLS: the client reads every whole record the kernel
    held, then meets the cut (an end without close_notify), not a reset.
    What Twisted's TLS layer still holds is counted as unsent."""

    def serve(self, close):
        from twisted.protocols.tls import TLSMemoryBIOFactory
        from elvin.protocols.tls import server_options
        from elvin.test.transport_fixtures import Certificates
        certificates = Certificates(self.mktemp())
        self.ca = certificates.ca_path
        inner = super().serve   # (_ResetKeepingSent's)

        def wrapped(reactor_listen):
            return reactor_listen
        from twisted.internet import reactor
        real_listen = reactor.listenTCP

        def listen(port, factory, **kw):
            return real_listen(port, TLSMemoryBIOFactory(
                server_options(certificates.server_cert, certificates.server_key), False,
                factory), **kw)
        self.patch(reactor, "listenTCP", listen)
        try:
            return inner(close)
        finally:
            self.patch(reactor, "listenTCP", real_listen)

    @property
    def cut_error(self):
        import ssl
        return ssl.SSLError

    def wrap(self, sock):
        import ssl
        context = ssl.create_default_context(cafile=self.ca)
        return context.wrap_socket(sock, server_hostname="router.test")

    def test_the_socket_under_tls_is_kept(self):
        import socket
        from twisted.internet import tcp
        from elvin.protocols.output import _keep_socket
        sock = socket.socket()
        self.addCleanup(sock.close)

        class TCP(tcp.Connection):
            def __init__(self):
                self.socket = sock

            def getHandle(self):
                return self.socket

        class TLS:
            _tlsConnection = object()
            transport = TCP()
        kept = _keep_socket(TLS())
        self.addCleanup(kept.close)
        self.assertNotEqual(kept.fileno(), sock.fileno())
        self.assertIsNone(_keep_socket(object()))

    def test_unsent_bytes_of_a_tls_transport(self):
        from twisted.internet import tcp
        from elvin.protocols.output import unsent_bytes

        class TCP(tcp.Connection):
            def __init__(self):
                self.dataBuffer, self.offset, self._tempDataLen = b"x" * 100, 10, 5

        class TLS:
            _tlsConnection = object()
            _appSendBuffer = [b"y" * 7, b"z" * 3]
            transport = TCP()
        self.assertEqual(unsent_bytes(TLS()), 10 + 95)
        TLS._tlsConnection = None
        self.assertIsNone(unsent_bytes(TLS()))
