"""ERDP packet codec: byte-exact vectors worked by hand from the draft
(elvin-router-discovery-protocol.txt, sections 5.2-5.3 and 6.1.2)."""

from twisted.trial import unittest

from elvin.discovery import packets as discovery_packets
from elvin.discovery.packets import (
    DecodeError, EncodeError, SvrAdvt, SvrAdvtClose, SvrRqst, UnknownPacketError,
    compatible, decode, encode, fit_advert)


def h(text):
    """Bytes from hex words, ignoring spaces and '|' separators."""
    return bytes.fromhex(text.replace("|", " "))


# SvrRqst: pkt_id 16, major 4, minor 0, locality 1 -- four XDR words.
RQST = h("00000010 | 00000004 | 00000000 | 00000001")

# SvrAdvt: pkt_id 17, major 4, minor 0, default true, revision 7,
# scope "chat", server "r1", one URI "elvin://h" (9 bytes + 3 padding).
ADVT = h("00000011 | 00000004 | 00000000 | 00000001 | 00000007"
         "| 00000004 63686174"            # "chat"
         "| 00000002 72310000"            # "r1" + 2 padding
         "| 00000001"                     # uri count
         "| 00000009 656c76696e3a2f2f68 000000")  # "elvin://h" + 3 padding

# SvrAdvtClose: pkt_id 18, major 4, minor 0, server "abcde" (+3 padding).
CLOSE = h("00000012 | 00000004 | 00000000 | 00000005 6162636465 000000")


class VectorTests(unittest.TestCase):
    timeout = 30

    def test_constants(self):
        self.assertEqual((discovery_packets.SVR_RQST, discovery_packets.SVR_ADVT, discovery_packets.SVR_ADVT_CLOSE), (16, 17, 18))
        self.assertEqual((discovery_packets.GROUP, discovery_packets.PORT), ("224.4.0.1", 2917))
        self.assertEqual(discovery_packets.VERSION, (4, 0))

    def test_svr_rqst(self):
        packet = SvrRqst(locality=1)
        self.assertEqual(encode(packet), RQST)
        self.assertEqual(decode(RQST), packet)

    def test_svr_rqst_locality_zero_default(self):
        self.assertEqual(encode(SvrRqst()), h("00000010 00000004 00000000 00000000"))
        self.assertEqual(encode(SvrRqst(locality=255))[-4:], h("000000ff"))

    def test_svr_advt(self):
        packet = SvrAdvt(server="r1", revision=7, uris=("elvin://h",),
                         scope="chat", default=True)
        self.assertEqual(encode(packet), ADVT)
        self.assertEqual(decode(ADVT), packet)

    def test_svr_advt_empty_scope_several_uris(self):
        packet = SvrAdvt(server="abcd", revision=0xFFFFFFFF, scope="",
                         uris=["elvin://a", "elvin:4.0/tcp,none,xdr/b:1"])
        data = encode(packet)
        self.assertEqual(data, h(
            "00000011 00000004 00000000 00000000 ffffffff"
            "00000000"                      # empty scope: just the length
            "00000004 61626364"             # "abcd", no padding needed
            "00000002"
            "00000009 656c76696e3a2f2f61 000000"
            "0000001a" + "elvin:4.0/tcp,none,xdr/b:1".encode().hex() + "0000"))
        self.assertEqual(decode(data), packet)
        self.assertEqual(decode(data).uris, ("elvin://a", "elvin:4.0/tcp,none,xdr/b:1"))

    def test_svr_advt_unicode(self):
        packet = SvrAdvt(server="r\u00e9", revision=1, uris=("elvin://h",),
                         scope="\u00e9t\u00e9")
        data = encode(packet)
        # "été" is 5 UTF-8 bytes: length 5, then 3 bytes of padding
        self.assertIn(h("00000005 c3a974c3a9 000000"), data)
        self.assertEqual(decode(data), packet)

    def test_svr_advt_close(self):
        packet = SvrAdvtClose(server="abcde")
        self.assertEqual(encode(packet), CLOSE)
        self.assertEqual(decode(CLOSE), packet)

    def test_every_packet_is_word_aligned(self):
        for packet in (SvrRqst(locality=3), SvrAdvtClose(server="x" * 7),
                       SvrAdvt(server="s", revision=2, uris=("elvin://hh",))):
            self.assertEqual(len(encode(packet)) % 4, 0)


class DecodeErrorTests(unittest.TestCase):
    timeout = 30

    def test_truncated_everywhere(self):
        for data in (RQST, ADVT, CLOSE):
            for n in range(len(data)):
                with self.assertRaises(DecodeError, msg=f"prefix {n}"):
                    decode(data[:n])

    def test_unknown_pkt_id(self):
        with self.assertRaises(UnknownPacketError):
            decode(h("00000001 00000004 00000000"))
        # UnknownPacketError is a DecodeError
        self.assertTrue(issubclass(UnknownPacketError, DecodeError))

    def test_uint8_out_of_range(self):
        with self.assertRaises(DecodeError) as cm:
            decode(h("00000010 00000004 00000000 00000100"))
        self.assertIn("locality", str(cm.exception))
        with self.assertRaises(DecodeError):
            decode(h("00000010 00000104 00000000 00000000"))

    def test_boolean_must_be_0_or_1(self):
        bad = bytearray(ADVT)
        bad[15] = 2
        with self.assertRaises(DecodeError):
            decode(bytes(bad))

    def test_advert_without_uri(self):
        data = h("00000011 00000004 00000000 00000000 00000001"
                 "00000000 00000001 72000000 00000000")
        with self.assertRaises(DecodeError) as cm:
            decode(data)
        self.assertIn("no URI", str(cm.exception))

    def test_impossible_uri_count(self):
        data = h("00000011 00000004 00000000 00000000 00000001"
                 "00000000 00000001 72000000 7fffffff")
        with self.assertRaises(DecodeError):
            decode(data)

    def test_bad_utf8(self):
        data = h("00000012 00000004 00000000 00000002 c328 0000")
        with self.assertRaises(DecodeError):
            decode(data)

    def test_trailing_bytes_rejected_at_our_version(self):
        with self.assertRaises(DecodeError):
            decode(RQST + h("00000000"))

    def test_trailing_bytes_allowed_for_later_minor_version(self):
        data = h("00000010 00000004 00000001 00000002 deadbeef")
        self.assertEqual(decode(data), SvrRqst(locality=2, minor=1))

    def test_decode_is_liberal_about_revision_zero_and_colon(self):
        data = encode(SvrAdvt(server="s", revision=1, uris=("elvin://h",), scope="ab"))
        data = data[:16] + h("00000000") + data[20:]          # revision 0
        data = data.replace(b"ab", b"a:")
        packet = decode(data)
        self.assertEqual((packet.revision, packet.scope), (0, "a:"))


class EncodeTests(unittest.TestCase):
    timeout = 30

    def test_refuses_reserved_revision(self):
        with self.assertRaises(EncodeError):
            encode(SvrAdvt(server="s", revision=0, uris=("elvin://h",)))

    def test_refuses_colon_in_scope(self):
        with self.assertRaises(EncodeError):
            encode(SvrAdvt(server="s", revision=1, uris=("elvin://h",), scope="a:b"))
        with self.assertRaises(ValueError):
            discovery_packets.check_scope("a:b")
        self.assertEqual(discovery_packets.check_scope(""), "")

    def test_refuses_no_uri(self):
        with self.assertRaises(EncodeError):
            encode(SvrAdvt(server="s", revision=1, uris=()))

    def test_field_ranges(self):
        with self.assertRaises(ValueError):
            SvrRqst(locality=256)
        with self.assertRaises(ValueError):
            SvrRqst(locality=-1)
        with self.assertRaises(TypeError):
            SvrRqst(locality=True)
        with self.assertRaises(ValueError):
            SvrAdvt(server="s", revision=1 << 32, uris=("u",))
        with self.assertRaises(TypeError):
            encode("not a packet")

    def test_fit_advert_drops_trailing_uris(self):
        uris = tuple(f"elvin://host{i:03d}.example.com:2917" for i in range(100))
        packet = SvrAdvt(server="s", revision=1, uris=uris)
        fitted, dropped = fit_advert(packet)
        self.assertLessEqual(len(encode(fitted)), discovery_packets.MAX_ADVERT_SIZE)
        self.assertEqual(fitted.uris + tuple(dropped), uris)
        self.assertTrue(dropped)
        small = SvrAdvt(server="s", revision=1, uris=uris[:2])
        self.assertEqual(fit_advert(small), (small, []))
        with self.assertRaises(EncodeError):
            fit_advert(SvrAdvt(server="s" * 2000, revision=1, uris=uris[:1]))


class CompatibilityTests(unittest.TestCase):
    timeout = 30

    def test_rule(self):
        # same major, and our minor (0) no greater than the packet's
        self.assertTrue(compatible(SvrRqst()))
        self.assertTrue(compatible(SvrRqst(minor=3)))
        self.assertFalse(compatible(SvrRqst(major=5)))
        self.assertFalse(compatible(SvrRqst(major=3)))
        self.assertFalse(compatible(SvrRqst(minor=0), ours=(4, 1)))
        self.assertTrue(compatible(SvrAdvtClose(server="x", minor=1), ours=(4, 1)))
