"""Hostile input: the codec, the router core and a live router, fuzzed.

Three layers, all with fixed seeds so a failure is reproducible:

* ``CodecFuzzTests`` feeds more than 100,000 frames -- valid encodings of
  every client and federation packet, mutated (truncated, extended, bytes
  flipped, counts and lengths replaced by extreme or negative values, bad
  UTF-8, unknown pkt_ids), structure-aware random packets, deep and wide
  SubASTs, huge and negative array counts -- to both decoders. Only
  ``DecodeError`` may come out, and decoding never allocates much more
  than the frame itself.
* ``CoreFuzzTests`` hands the packets that do decode to a ``ClientSession``
  and a ``FederationLink`` (no sockets): no handler may raise, and the
  router's tables are empty again once the sessions are gone.
* ``LiveFuzzTests`` runs a router on 127.0.0.1 and has fuzzing clients send
  thousands of such frames over hundreds of TCP connections while a
  well-behaved publisher and subscriber keep exchanging notifications: no
  error is logged, every byte the router sends back is a well-formed packet
  (Nacks among them), bad connections are closed one by one, and the good
  pair sees exactly every notification, in order.

``FrameFuzzer`` is also used by bench/soak.py's fuzzing client.
"""

import random
import struct
import tracemalloc
from dataclasses import fields

from twisted.internet import defer, protocol, reactor, task
from twisted.logger import globalLogPublisher
from twisted.trial import unittest

from elvin import client
from elvin.errors import SubscriptionError
from elvin.federation import packets as fed_packets, subast
from elvin.federation.link import FederationLink
from elvin.federation.manager import FederationClass, FederationManager
from elvin.core.options import OPTIONS
from elvin.protocols import packets as elvin_packets
from elvin.protocols.server import ElvinServerFactory, ElvinServerProtocol
from elvin.protocols.xdr import MAX_AST_DEPTH, DecodeError, RawSubAST
from elvin.core.router import CLIENT_PACKET_IDS, Router, SessionOutput
from elvin.subscription import parse
from elvin.subscription.ast import Kind, LEAF_KINDS, Node
from elvin.values import Int64

SEED = 20240501

# -- generating packets --------------------------------------------------------

EXPRESSIONS = [
    "x == 1", "require(a)", "a > 1 && b < 2", "regex(s, 'a+b')", "size(o) > 3",
    "x ==", "((((", "begins-with(s, 'a')", "int32(x) == 2", "!(a || b)", "1 == 1",
    "fold-case(s) == 'a'", "wildcard(s, '*a?')", "x in (1, 2, 3)", "a == 'open",
    "decompose(s) == 'e'", "x == 2147483648", "s + 1 > 2", "equals(a, 1, 2)",
    " || ".join(f"x == {i}" for i in range(60)), "(" * 140 + "x" + ")" * 140,
]
NAMES = list(OPTIONS) + ["router.packet.max-length", "Made.Up", "", "x", "a", "s"]
INTERESTING_WORDS = [0, 1, 2, 3, 4, 5, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000,
                     0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0x40000000,
                     0x00FFFFFF, 1 << 24, 1 << 20]
#: what a string may not hold: bytes that are not UTF-8, and NUL (6.1.4)
BAD_UTF8 = [b"\xff\xfe\xfd", b"\xed\xa0\x80", b"\xc0\x80", b"\x80\x80\x80",
            b"\xf4\x90\x80\x80", b"\xe2\x82", b"a\0"]


def _string(rng):
    c = rng.random()
    if c < 0.3:
        return rng.choice(EXPRESSIONS)
    if c < 0.5:
        return rng.choice(NAMES)
    if c < 0.55:
        return "y" * rng.choice([0, 1, 100, 3000])
    return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD7FF)]))
                   for _ in range(rng.randrange(12)))


def _value(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice([0, -1, 2**31 - 1, -2**31, rng.randrange(-1000, 1000)])
    if kind == 1:
        return Int64(rng.choice([0, 2**63 - 1, -2**63, rng.randrange(-10**12, 10**12)]))
    if kind == 2:
        return rng.choice([0.0, -0.0, 1e308, float("inf"), float("-inf"), float("nan"), 2.5])
    if kind == 3:
        return _string(rng)
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(10)))
    return rng.choice(["oldest", "newest", "largest", "none", "random"])


def _name_values(rng):
    return {(rng.choice(NAMES) if rng.random() < 0.5 else _string(rng)): _value(rng)
            for _ in range(rng.randrange(6))}


def _keys(rng):
    if rng.random() < 0.5:
        return elvin_packets.Keys.EMPTY
    return elvin_packets.Keys([(rng.choice([1, 2, 3, 0, 99]),
                    [[bytes([rng.randrange(256)]) * rng.randrange(1, 30)
                      for _ in range(rng.randrange(3))] for _ in range(rng.randrange(4))])
                   for _ in range(rng.randrange(1, 3))])


_LEAVES = [Node(Kind.NAME, "x"), Node(Kind.INT32, 1), Node(Kind.STRING, "a+"),
           Node(Kind.REAL64, 1.5), Node(Kind.INT64, 5)]
_OPERATORS = [k for k in Kind if k not in LEAF_KINDS and k != Kind.EMPTY]


_TREES = []


def _parsed_trees():
    if not _TREES:
        for text in EXPRESSIONS:
            try:
                _TREES.append(parse(text))
            except Exception:
                pass
    return _TREES


def _ast(rng, depth=0):
    if depth > 6 or rng.random() < 0.3:
        return rng.choice(_LEAVES)
    if rng.random() < 0.4:
        return rng.choice(_parsed_trees())
    return Node(rng.choice(_OPERATORS), None, [_ast(rng, depth + 1)
                                              for _ in range(rng.randrange(4))])


def deep_ast(depth, kind=Kind.NOT):
    """``kind`` applied ``depth`` times to a name (built without recursion)."""
    node = Node(Kind.NAME, "x")
    for _ in range(depth):
        node = Node(kind, None, [node])
    return node


_GENERATORS = {
    elvin_packets.ID32: lambda r: r.choice([0, 1, 2, 0xFFFFFFFF, r.randrange(1 << 32)]),
    elvin_packets.UINT32: lambda r: r.choice([0, 1, 4, r.randrange(1 << 32)]),
    elvin_packets.INT32: lambda r: r.randrange(-2**31, 2**31),
    elvin_packets.ID64: lambda r: r.choice([0, 1, 2, 3, (1 << 64) - 1, r.randrange(1 << 64)]),
    elvin_packets.UINT8: lambda r: r.choice([4, 4, 4, 0, 1, 5, 255]),
    elvin_packets.UINT16: lambda r: r.randrange(1 << 16),
    elvin_packets.BOOLEAN: lambda r: r.random() < 0.5,
    elvin_packets.STRING: _string,
    elvin_packets.NAME_VALUES: _name_values,
    elvin_packets.OPTIONS: _name_values,
    elvin_packets.VALUES: lambda r: tuple(_value(r) for _ in range(r.randrange(4))),
    elvin_packets.STRINGS: lambda r: tuple(_string(r) for _ in range(r.randrange(4))),
    elvin_packets.ID64S: lambda r: tuple(r.randrange(1 << 64) for _ in range(r.randrange(4))),
    elvin_packets.KEYS: _keys,
    elvin_packets.SUBAST: _ast,
    fed_packets.PULL_FILTER: _ast,
}

#: Every packet class of the client and federation protocols.
ALL_CLASSES = sorted(set(elvin_packets.CLIENT.classes()) | set(fed_packets.FEDERATION.classes()),
                     key=lambda cls: cls.ID)


def random_packet(rng, cls=None):
    """A well-formed packet of ``cls`` (random class by default), random fields."""
    cls = cls or rng.choice(ALL_CLASSES)
    return cls(*[_GENERATORS[f.type](rng) for f in fields(cls)])


def sample_packets():
    """One hand-made, valid instance of every packet class."""
    keys = elvin_packets.Keys({1: [[b"k1", b"k2"], [b"c"]], 2: [[b"p"]], 3: [[b"q" * 7]]})
    tree = parse('a == 1 && (b < 2.5 || regex(s, "x+")) && !require(z) && size(o) > 3L')
    attrs = {"a": 1, "s": "str\u00e9", "b": b"op", "r": 2.5, "l": Int64(7)}
    samples = [
        elvin_packets.UNotify(4, 0, attrs, True, keys), elvin_packets.Nack(3, 2101, "msg", (1, "x", 2.0, b"o")),
        elvin_packets.ConnRqst(1, 4, 0, {"Packet.Max-Length": 4096}, keys, keys),
        elvin_packets.ConnRply(1, {"a": 1}), elvin_packets.DisconnRqst(2), elvin_packets.DisconnRply(2), elvin_packets.Disconn(1, "bye"),
        elvin_packets.SecRqst(5, keys, keys, keys, keys), elvin_packets.SecRply(5),
        elvin_packets.NotifyEmit(attrs, True, keys), elvin_packets.NotifyDeliver(attrs, (1, 2), (3,)),
        elvin_packets.SubAddRqst(6, "x > 1 && y == 'a'", True, keys),
        elvin_packets.SubModRqst(7, 99, "x > 2", False, keys, keys), elvin_packets.SubDelRqst(8, 5),
        elvin_packets.SubRply(8, 5), elvin_packets.DropWarn(), elvin_packets.TestConn(), elvin_packets.ConfConn(),
        elvin_packets.QosRqst(9, {"Subscription.Max-Count": 20}), elvin_packets.QosRply(9, {"x": 1}),
        elvin_packets.QnchAddRqst(10, ("a", "b"), True, keys),
        elvin_packets.QnchModRqst(11, 3, ("c",), ("a",), False, keys, keys), elvin_packets.QnchDelRqst(12, 3),
        elvin_packets.QnchRply(12, 3), elvin_packets.SubAddNotify((1,), (2,), 3, tree),
        elvin_packets.SubModNotify((1,), (), 3, tree), elvin_packets.SubDelNotify((1, 2), 3),
        fed_packets.FedConnRqst(1, 1, 0, "peer.test"), fed_packets.FedConnRply(1, "peer.test"),
        fed_packets.FedSubReplace(2, tree), fed_packets.FedNotify(attrs, True, keys, ("a", "b")), fed_packets.Ack(3),
        fed_packets.FedMeshAdvert("a.test", 1795581970397, 7, ("b.test", "c.test")),
    ]
    assert {type(p) for p in samples} == set(ALL_CLASSES)
    return samples


class FrameFuzzer:
    """Makes hostile frame payloads (no length header), reproducibly.

    The corpus is a valid encoding of every packet class plus ``pool``
    structure-aware random packets; each frame is a corpus entry, mutated
    or not, or plain random bytes.
    """

    def __init__(self, seed=SEED, pool=1500):
        self.rng = random.Random(seed)
        self.valid = [elvin_packets.encode(p) for p in sample_packets()]
        self.pool = [data for data in (self.structured() for _ in range(pool)) if data]

    def _n(self, n):
        return int(self.rng.random() * n)

    def mutate(self, data):
        rng, n = self.rng, self._n
        b = bytearray(data)
        for _ in range(1 + n(4)):
            op = n(9)
            size = len(b)
            if op == 0 and b:                       # truncate
                del b[n(size):]
            elif op == 1 and b:                     # flip a byte
                b[n(size)] = n(256)
            elif op == 2 and size >= 4:             # extreme count / length
                i = n(size // 4) * 4
                b[i:i + 4] = struct.pack(">I", rng.choice(INTERESTING_WORDS))
            elif op == 3:                           # trailing garbage
                b += rng.randbytes(n(16))
            elif op == 4 and size > 4:              # inserted bytes (misalign)
                i = n(size)
                b[i:i] = rng.randbytes(1 + n(7))
            elif op == 5 and size >= 4:             # unknown / wrong pkt_id
                b[0:4] = struct.pack(">I", n(300) if rng.random() < 0.5 else n(1 << 32))
            elif op == 6 and size >= 8:             # bad UTF-8
                i = 4 + n(size - 4)
                bad = rng.choice(BAD_UTF8)
                b[i:i + len(bad)] = bad
            elif op == 7 and size >= 8:             # negative count
                i = n(size // 4) * 4
                b[i:i + 4] = struct.pack(">i", -1 - n((1 << 31) - 1))
            elif op == 8 and size >= 8:             # duplicated region
                i = n(size)
                j = i + n(size + 1 - i)
                b[j:j] = b[i:j]
        return bytes(b)

    def structured(self):
        """A new random well-formed packet's encoding (None if unencodable)."""
        try:
            return elvin_packets.encode(random_packet(self.rng))
        except (ValueError, TypeError, OverflowError):
            return None

    def frame(self):
        """One hostile payload: mostly mutated, sometimes well-formed."""
        rng = self.rng
        c = rng.random()
        if c < 0.25:
            data = rng.choice(self.pool)
            return data if rng.random() < 0.4 else self.mutate(data)
        if c < 0.3:
            return rng.randbytes(4 * (1 + self._n(15)))
        return self.mutate(rng.choice(self.valid))

    def client_frame(self, mutate=True):
        """Like ``frame`` but biased to packets a router accepts from clients;
        with ``mutate`` false, only such packets, well formed."""
        rng = self.rng
        if not mutate or rng.random() < 0.5:
            if self._client_pool is None:
                # Requests of an established session (ConnRqst, UNotify and
                # DisconnRqst would end it).
                ids = CLIENT_PACKET_IDS - {elvin_packets.ConnRqst.ID, elvin_packets.UNotify.ID, elvin_packets.DisconnRqst.ID}
                self._client_pool = [d for d in self.pool
                                     if struct.unpack_from(">I", d)[0] in ids]
            data = rng.choice(self._client_pool)
            return data if not mutate or rng.random() < 0.7 else self.mutate(data)
        return self.frame()

    _client_pool = None


def _aligned(data):
    """``data`` padded to a multiple of 4 (frames must be; 8.2.3)."""
    return data + b"\0" * (-len(data) & 3)


def framed(data, rng=None):
    """``data`` behind a length header; with ``rng``, sometimes a wrong one."""
    data = _aligned(data) or b"\0\0\0\0"
    length = len(data)
    if rng is not None and rng.random() < 0.01:
        length = rng.choice([length + 4, max(4, length - 4), 0, 3, 0xFFFFFFFF, 1 << 21])
    return struct.pack(">I", length) + data


# -- the codec -------------------------------------------------------------------


class CodecFuzzTests(unittest.TestCase):
    """Both decoders against >100,000 hostile frames: only DecodeError."""

    def decode_all(self, frames):
        """Decode each frame with both decoders; count what decoded."""
        decoded = 0
        for data in frames:
            for decode in (elvin_packets.decode, fed_packets.decode):
                try:
                    decode(data)
                    decoded += 1
                except DecodeError:
                    pass
        return decoded

    def test_samples_round_trip(self):
        for packet in sample_packets():
            decode = fed_packets.decode if packet.ID in (192, 193, 194, 195, 200, 65) else elvin_packets.decode
            self.assertEqual(decode(elvin_packets.encode(packet)), packet)

    def test_every_truncation_and_every_extreme_word(self):
        """Exhaustive over the samples: every prefix, every 4-byte word set
        to each extreme value, and bad UTF-8 at every offset."""
        frames = []
        for data in FrameFuzzer().valid:
            frames.extend(data[:i] for i in range(len(data)))
            for i in range(0, len(data) - 3, 4):
                for word in INTERESTING_WORDS:
                    frames.append(data[:i] + struct.pack(">I", word) + data[i + 4:])
                frames.append(data[:i] + struct.pack(">i", -1) + data[i + 4:])
            for i in range(4, len(data)):
                frames.append(data[:i] + b"\xff" + data[i + 1:])
        self.assertGreater(len(frames), 10_000)
        self.decode_all(frames)

    def test_hundred_thousand_mutated_and_random_frames(self):
        fuzzer = FrameFuzzer()
        frames = [fuzzer.frame() for _ in range(100_000)]
        decoded = self.decode_all(frames)
        # The mix reaches the decoders' deep paths, not just the pkt_id check.
        self.assertGreater(decoded, 10_000)

    def test_unknown_packet_ids(self):
        known = {cls.ID for cls in ALL_CLASSES}
        for pkt_id in list(range(0, 300)) + [0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]:
            if pkt_id in known:
                continue
            for decode in (elvin_packets.decode, fed_packets.decode):
                with self.assertRaises(DecodeError):
                    decode(struct.pack(">II", pkt_id, 0))

    def test_deep_asts(self):
        """Nesting is refused past MAX_AST_DEPTH, without RecursionError,
        however deep the input (the encoder is iterative)."""
        for kind in (Kind.NOT, Kind.AND, Kind.FUNC_SIZE):
            for depth in (MAX_AST_DEPTH - 2, MAX_AST_DEPTH, MAX_AST_DEPTH + 1, 5000):
                for packet in (elvin_packets.SubAddNotify((1,), (), 1, deep_ast(depth, kind)),
                               fed_packets.FedSubReplace(1, deep_ast(depth, kind))):
                    data = elvin_packets.encode(packet)
                    decode = fed_packets.decode if packet.ID == 194 else elvin_packets.decode
                    if depth < MAX_AST_DEPTH:
                        self.assertEqual(decode(data), packet)
                    elif packet.ID == 194:
                        # A link Nacks it (2112) and keeps going.
                        raw = decode(data).pull_filter
                        self.assertIsInstance(raw, RawSubAST)
                        with self.assertRaises(SubscriptionError) as caught:
                            subast.read_filter(raw)
                        self.assertEqual(caught.exception.code, 2112)
                    else:
                        with self.assertRaises(DecodeError):
                            decode(data)

    def test_huge_and_negative_counts_allocate_nothing(self):
        """An array count is checked against the bytes left before anything
        is allocated: frames claiming 2**31-1 items cost no memory."""
        fuzzer = FrameFuzzer()
        frames = []
        for data in fuzzer.valid:
            for i in range(4, len(data) - 3, 4):
                for word in (0x7FFFFFFF, 0x7FFFFFF0, 0x10000000, 0xFFFFFFFF, 0x80000000):
                    frames.append(data[:i] + struct.pack(">I", word) + data[i + 4:])
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            self.decode_all(frames)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        # Frames are under 1 KiB: a few hundred KiB is the decoders' working
        # set; a count believed would need gigabytes.
        self.assertLess(peak, 2 * 1024 * 1024, f"{len(frames)} frames peaked at {peak} bytes")

    def test_big_frames_stay_proportional(self):
        """The worst legal shapes (many tiny items) cost memory proportional
        to the frame, never a count's worth."""
        body = struct.pack(">I", 20000) + (struct.pack(">I", 0)) * 20000
        frames = [
            struct.pack(">II", 80, 1) + body + struct.pack(">II", 1, 0),  # QnchAddRqst
            struct.pack(">IIII", 48, 1, 1, 0) + struct.pack(">I", 10000)
            + struct.pack(">ii", 1, 5) * 10000,                         # Nack args
        ]
        tracemalloc.start()
        try:
            for data in frames:
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                elvin_packets.decode(data)
                peak = tracemalloc.get_traced_memory()[1] - base
                self.assertLess(peak, 40 * len(data))
        finally:
            tracemalloc.stop()


# -- the router core (no sockets) ---------------------------------------------------


class _CoreOutput(SessionOutput):
    def __init__(self):
        self.sent = 0
        self.closed = False

    def send(self, packet):
        elvin_packets.encode(packet)   # whatever the router answers must be encodable
        self.sent += 1

    def send_encoded(self, data, droppable):
        elvin_packets.decode(data)
        self.sent += 1

    def is_idle(self):
        return True

    def configure(self, options):
        pass

    def close(self):
        self.closed = True

    def abort(self):
        self.closed = True


class _LinkOutput:
    def send(self, packet):
        elvin_packets.encode(packet)

    def send_encoded(self, data, droppable):
        return True

    def close(self):
        pass

    def abort(self):
        pass


class CoreFuzzTests(unittest.TestCase):
    """Decoded hostile packets straight into sessions and federation links."""

    def test_sessions_and_links_never_raise(self):
        from twisted.internet.task import Clock
        fuzzer = FrameFuzzer(SEED + 1)
        rng = fuzzer.rng
        router = Router()
        clock = Clock()
        manager = FederationManager(router, "me.test", [FederationClass("D", hosts=["*"])],
                                    None, clock)
        peers = iter(range(10**9))

        def new_session():
            session = router.open_session(_CoreOutput(), "fuzz")
            session.packet_received(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
            return session

        def new_link():
            link = FederationLink(manager, _LinkOutput(), False, manager.classes["D"], "h")
            link.packet_received(fed_packets.FedConnRqst(1, 1, 0, f"peer{next(peers)}.test"))
            return link

        sessions = [new_session() for _ in range(3)]
        link = new_link()
        handled = 0
        for i in range(20_000):
            data = fuzzer.client_frame() if i % 2 else fuzzer.frame()
            try:
                packet = elvin_packets.decode(data)
            except DecodeError:
                packet = None
            if packet is not None:
                k = rng.randrange(len(sessions))
                if sessions[k].state != sessions[k].CONNECTED:
                    sessions[k] = new_session()
                sessions[k].packet_received(packet)
                handled += 1
            try:
                fed_packet = fed_packets.decode(data)
            except DecodeError:
                continue
            if link.state != link.UP:
                link = new_link()
            link.packet_received(fed_packet, len(data))
            handled += 1
            if i % 500 == 0:
                clock.advance(1)   # let filter updates run
        self.assertGreater(handled, 5_000)
        for session in list(router.sessions):
            session.connection_lost()
        link.connection_lost()
        clock.advance(1)
        self.assertEqual(router.sessions, set())
        self.assertEqual(router.subscriptions, {})
        self.assertEqual(len(router.index), 0)
        self.assertEqual(len(router.quench), 0)
        self.assertEqual(manager.links, [])


# -- a live router ----------------------------------------------------------------


class _CountingProtocol(ElvinServerProtocol):
    def frameReceived(self, data):
        self.factory.frames += 1
        super().frameReceived(data)


class _FuzzClient(protocol.Protocol):
    """Sends its frames and records what comes back until the router closes
    the connection (it ends with DisconnRqst, so a router still reading
    closes it politely); gives up after ``patience`` seconds (a frame whose
    header promised more bytes than came leaves the router waiting)."""

    patience = 0.5

    def __init__(self, payload, done):
        self.payload = payload
        self.done = done
        self.received = bytearray()
        self.gave_up = False
        self._timer = None

    def connectionMade(self):
        self.transport.write(self.payload)
        self._timer = reactor.callLater(self.patience, self._give_up)

    def _give_up(self):
        self._timer = None
        self.gave_up = True
        self.transport.loseConnection()

    def dataReceived(self, data):
        self.received += data

    def connectionLost(self, reason):
        if self._timer is not None:
            self._timer.cancel()
        self.done.callback(self)


#: What a router may send a client.
ROUTER_SENDS = (elvin_packets.ConnRply, elvin_packets.Nack, elvin_packets.DisconnRply, elvin_packets.Disconn, elvin_packets.SecRply, elvin_packets.NotifyDeliver,
                elvin_packets.SubRply, elvin_packets.DropWarn, elvin_packets.ConfConn, elvin_packets.QosRply, elvin_packets.QnchRply,
                elvin_packets.SubAddNotify, elvin_packets.SubModNotify, elvin_packets.SubDelNotify)


def split_frames(data):
    """Decode a byte stream from the router: every frame must be whole and
    well formed (a trailing partial frame is allowed only on an abort)."""
    packets = []
    pos = 0
    while len(data) - pos >= 4:
        (length,) = struct.unpack_from(">I", data, pos)
        if pos + 4 + length > len(data):
            break
        packets.append(elvin_packets.decode(data[pos + 4:pos + 4 + length]))
        pos += 4 + length
    return packets


class LiveFuzzTests(unittest.TestCase):
    timeout = 60

    def setUp(self):
        self.router = Router()
        self.factory = ElvinServerFactory(self.router, reactor)
        self.factory.protocol = _CountingProtocol
        self.factory.frames = 0
        self.port = reactor.listenTCP(0, self.factory, interface="127.0.0.1")
        self.uri = f"elvin://127.0.0.1:{self.port.getHost().port}"
        self.errors = []
        self.violations = 0

        def observe(event):
            if event.get("log_failure") is not None or \
                    event.get("log_level") is not None and event["log_level"].name in (
                        "error", "critical"):
                self.errors.append(event)
            if "protocol violation" in event.get("log_format", ""):
                self.violations += 1
        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)

    @defer.inlineCallbacks
    def tearDown(self):
        yield self.port.stopListening()

    @defer.inlineCallbacks
    def fuzz_connection(self, fuzzer, stats):
        rng = fuzzer.rng
        parts = []
        if rng.random() < 0.9:   # usually get past ConnRqst, to reach the handlers
            parts.append(framed(elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY,
                                                    elvin_packets.Keys.EMPTY))))
        count = rng.randint(1, 30)
        if rng.random() < 0.4:
            # Only well-formed packets: protocol errors, each Nacked (7.3.3).
            for _ in range(count):
                parts.append(framed(fuzzer.client_frame(mutate=False)))
        else:
            for _ in range(count):
                parts.append(framed(fuzzer.client_frame(), rng))
        parts.append(framed(elvin_packets.encode(elvin_packets.DisconnRqst(7))))
        stats["frames"] += count
        done = defer.Deferred()
        yield protocol.ClientCreator(reactor, _FuzzClient, b"".join(parts), done).connectTCP(
            "127.0.0.1", self.port.getHost().port)
        fuzz_client = yield done
        stats["gave_up"] += fuzz_client.gave_up
        packets = split_frames(bytes(fuzz_client.received))   # raises on garbage
        for packet in packets:
            self.assertIsInstance(packet, ROUTER_SENDS)
            stats[type(packet).__name__] = stats.get(type(packet).__name__, 0) + 1
        stats["connections"] += 1

    @defer.inlineCallbacks
    def test_live_router_under_fuzz_keeps_good_pair_exact(self):
        subscriber = yield client.connect(self.uri)
        publisher = yield client.connect(self.uri)
        self.addCleanup(lambda: [c.protocol.transport.abortConnection()
                                 for c in (subscriber, publisher)
                                 if c.protocol and c.protocol.transport])
        got = []
        yield subscriber.subscribe('origin == "good" && require(seq)', got.append)
        sent = []

        def publish():
            n = len(sent)
            publisher.notify({"origin": "good", "seq": n, "pad": "p" * (n % 50)})
            sent.append(n)
        ticker = task.LoopingCall(publish)
        ticker.start(0.004)

        fuzzer = FrameFuzzer(SEED + 2)
        stats = {"frames": 0, "connections": 0, "gave_up": 0}
        target = 16_000

        @defer.inlineCallbacks
        def worker():
            while stats["frames"] < target:
                yield self.fuzz_connection(fuzzer, stats)
        yield defer.gatherResults([worker() for _ in range(4)], consumeErrors=True)
        ticker.stop()
        # (test_connection settles on any packet, so it is no barrier for
        # deliveries still in flight: wait for the count, then look again.)
        yield self.wait_for(lambda: len(got) >= len(sent))
        yield publisher.test_connection()
        yield task.deferLater(reactor, 0.1, lambda: None)

        # The good pair: every notification, once, in order, nothing dropped.
        self.assertGreater(len(sent), 50)
        self.assertEqual([n["seq"] for n in got], sent)
        self.assertEqual(subscriber.dropwarns, 0)
        self.assertFalse(subscriber.disconnected.called)
        self.assertFalse(publisher.disconnected.called)

        # The fuzzers: thousands of frames reached the router, which answered
        # with Nacks and closed bad connections, one at a time.
        self.assertGreaterEqual(stats["frames"], target)
        self.assertGreater(self.factory.frames, 6_000)
        self.assertGreater(stats.get("Nack", 0), 100)
        self.assertGreater(self.violations, 100)
        self.assertLess(stats["gave_up"], stats["connections"] // 10)
        self.assertEqual(self.errors, [])
        self.assertEqual(self.flushLoggedErrors(), [])
        # Only the good pair is left, holding only its own subscription.
        yield self.wait_for(lambda: len(self.router.sessions) == 2)
        self.assertEqual(len(self.router.subscriptions), 1)
        self.assertEqual(len(self.router.quench), 0)
        self.assertEqual(self.router.queue_budget.total, 0)

    def wait_for(self, predicate, timeout=10):
        from elvin.test.test_integration import wait_until
        return wait_until(predicate, timeout)
