"""An array a client sends over its connection's limit for it is refused
before its items are decoded (``ConnectionOptions.count_limits``,
``packets.UnreadArray``), with the answer the decoded packet gets.

Each test compares the router's answer with count limits to its answer
without them (``count_fields=None``: every array decoded, as before), and
counts the items decoded: work, not time (the time is in
bench/count_limits.py)."""

import itertools
import sys
import struct

from twisted.internet.task import Clock
from twisted.trial import unittest

from elvin import errors
from elvin.core.keys import SHA1_CONSUMER, SHA1_PRODUCER
from elvin.core.options import ConnectionOptions
from elvin.core.router import COUNT_LIMITED_FIELDS, Router
from elvin.protocols import packets as P, xdr
from elvin.protocols.udp import UNotifyDatagramProtocol
from elvin.test.test_server_protocol import Harness, frame, unframe

_MIB = 1 << 20
# The defaults the limits come from.
_ATTRIBUTES = 256          # Attribute.Max-Count
_CONNECTION_KEYS = 1024    # Connection.Max-Keys
_SUBSCRIPTION_KEYS = 256   # Subscription.Max-Keys


def _u32(*values):
    return struct.pack(f">{len(values)}I", *values)


def _opaque(data):
    return _u32(len(data)) + data + b"\0" * (-len(data) & 3)


_NAMES = []


def _names(count):
    """``count`` distinct names of four characters (a 2 MiB packet holds
    262,000 of them as strings, 131,000 as attributes)."""
    if len(_NAMES) < count:
        _NAMES[:] = map("".join, itertools.islice(
            itertools.product("0123456789abcdefghijklmnopqrstuvwxyz", repeat=4),
            max(count, 300_000)))
    return _NAMES[:count]


def _strings(names):
    return _u32(len(names)) + b"".join(_opaque(n.encode()) for n in names)


def _attributes(names):
    return _u32(len(names)) + b"".join(_opaque(n.encode()) + _u32(1, 7) for n in names)


def _keys(scheme, count):
    """A Keys field of one scheme with one key set of ``count`` 1-byte keys
    (8 bytes each: 262,000 in 2 MiB)."""
    return _u32(1, scheme, 1, count) + _opaque(b"k") * count


def _fill(build, size=2 * _MIB - 64):
    """The most items ``build(n)`` puts into ``size`` bytes (each item
    being of one size)."""
    one = len(build(1))
    return 1 + (size - one) // (len(build(2)) - one)


def _qnch_add(count):
    return _u32(P.QnchAddRqst.ID, 7) + _strings(_names(count)) + _u32(1, 0)


def _sub_add(keys):
    return (_u32(P.SubAddRqst.ID, 7) + _opaque(b"require(a)") + _u32(1)
            + _keys(SHA1_CONSUMER, keys))


def _sec_rqst(keys):
    """add_nfn_keys: one key; del_nfn_keys: ``keys`` keys."""
    return (_u32(P.SecRqst.ID, 7) + _keys(SHA1_PRODUCER, 1) + _keys(SHA1_PRODUCER, keys)
            + _u32(0, 0))


def _notify_emit(attributes=1, keys=0):
    return (_u32(P.NotifyEmit.ID) + _attributes(_names(attributes)) + _u32(1)
            + (_keys(SHA1_PRODUCER, keys) if keys else _u32(0)))


def _unotify(attributes=1, keys=0):
    return (_u32(P.UNotify.ID, 4, 0) + _attributes(_names(attributes)) + _u32(1)
            + (_keys(SHA1_PRODUCER, keys) if keys else _u32(0)))


class _Work:
    """Counts the array items the decoders read: strings and opaques one by
    one, NameValue arrays by their length (compiled or not); only while
    ``on`` (``_Answers.to`` sets it while the router reads)."""

    on = False

    def __init__(self, test):
        self.items = 0
        for name in ("string", "opaque"):
            test.patch(xdr.Reader, name, self._counting(getattr(xdr.Reader, name)))
        test.patch(xdr.Reader, "_name_values", self._counting_all(xdr.Reader._name_values))
        for module, name in ((xdr, "_accelerated_name_values"), (P, "_compiled_name_values")):
            compiled = getattr(module, name)
            if compiled is not None:
                test.patch(module, name, self._counting_compiled(compiled))

    def _counting(self, read):
        def counted(*args, **kwargs):
            self.items += self.on
            return read(*args, **kwargs)
        return counted

    def _counting_all(self, read):
        def counted(*args, **kwargs):
            got = read(*args, **kwargs)
            self.items += len(got) * self.on
            return got
        return counted

    def _counting_compiled(self, read):
        def counted(*args):
            got = read(*args)
            if got is not None:
                self.items += len(got[0]) * self.on
            return got
        return counted


def _unlimited(router):
    """The router decoding every array whole, as it did before limits."""
    router.new_options = lambda: ConnectionOptions(router.option_specs, router.key_schemes())
    return router


class _Answers:
    """What a router answers to a connected client's packets: the packets
    it sends back, whether it closes the channel, the notifications it
    ignores (and why) and the protocol errors it counts."""

    def __init__(self, limited=True, router=None, work=None):
        self.work = work
        router = router or Router()
        self.router = router if limited else _unlimited(router)
        self.ignored = []
        notification_ignored = router.notification_ignored

        def ignored(peer, problem):
            self.ignored.append(problem)
            notification_ignored(peer, problem)
        router.notification_ignored = ignored
        self.harness = Harness(router, Clock())

    def connected(self):
        proto, transport = self.harness.client()
        proto.dataReceived(frame(P.ConnRqst(1, 4, 0, {}, P.Keys.EMPTY, P.Keys.EMPTY)))
        transport.clear()
        return proto, transport

    def to(self, *datas, connect=True):
        proto, transport = self.connected() if connect else self.harness.client()
        work = self.work
        if work is not None:
            work.on = True
        for data in datas:
            proto.dataReceived(_u32(len(data)) + data)
        if work is not None:
            work.on = False
        return (unframe(transport.value()), transport.disconnecting, list(self.ignored),
                len(proto.session.protocol_errors), self.router.stats["rejected_notifications"])


class CountLimitTests(unittest.TestCase):
    def assertSameAnswer(self, data, connect=True):
        """``data`` is answered as without limits, reading fewer items."""
        work = _Work(self)
        limited = _Answers(work=work).to(data, connect=connect)
        read = work.items
        work.items = 0
        self.assertEqual(limited, _Answers(limited=False, work=work).to(data, connect=connect))
        self.assertLess(read, work.items)
        return limited

    def assertNacked(self, answer, option):
        (nack,), closed, _, _, _ = answer
        self.assertIsInstance(nack, P.Nack)
        self.assertEqual((nack.xid, nack.error, nack.args), (7, errors.QOS_LIMIT, (option,)))
        self.assertFalse(closed)
        return nack

    def assertCheap(self, data, answer, connect=True, most=2, size=2 * _MIB):
        """``data``, of about ``size`` bytes (the most a packet may have),
        gets ``answer`` having read at most ``most`` items."""
        self.assertGreater(len(data), size - 1024)
        work = _Work(self)
        self.assertEqual(_Answers(work=work).to(data, connect=connect), answer)
        self.assertLessEqual(work.items, most)

    def test_the_limits_are_the_options_in_force(self):
        options = Router().new_options()
        self.assertEqual(options.count_limits["NotifyEmit.attributes"], _ATTRIBUTES)
        options.negotiate({"Attribute.Max-Count": 1000, "Subscription.Max-Keys": 10})
        self.assertEqual(options.count_limits["QnchAddRqst.names"], 1000)
        self.assertEqual(options.count_limits["SubAddRqst.keys"], 10)
        self.assertEqual(set(options.count_limits), set(COUNT_LIMITED_FIELDS))

    def test_quench_names_over_attribute_max_count(self):
        answer = self.assertSameAnswer(_qnch_add(_ATTRIBUTES + 1))
        nack = self.assertNacked(answer, "Attribute.Max-Count")
        self.assertEqual(nack.message, f"quench over Attribute.Max-Count ({_ATTRIBUTES})")
        self.assertCheap(_qnch_add(_fill(_qnch_add)), answer, most=0)

    def test_quench_names_at_the_limit_are_read(self):
        work = _Work(self)
        (reply,), _, _, _, _ = _Answers(work=work).to(_qnch_add(_ATTRIBUTES))
        self.assertIsInstance(reply, P.QnchRply)
        self.assertEqual(work.items, _ATTRIBUTES)

    def test_quench_names_repeated_past_the_limit_are_counted(self):
        # A quench is a set of names, but they are counted as sent: more
        # than Attribute.Max-Count cannot be told apart without reading them.
        data = _u32(P.QnchAddRqst.ID, 7) + _strings(["a"] * (_ATTRIBUTES + 1)) + _u32(1, 0)
        self.assertNacked(_Answers().to(data), "Attribute.Max-Count")

    def test_subscription_keys_over_subscription_max_keys(self):
        answer = self.assertSameAnswer(_sub_add(_SUBSCRIPTION_KEYS + 1))
        nack = self.assertNacked(answer, "Subscription.Max-Keys")
        self.assertEqual(nack.message, "more keys than Subscription.Max-Keys")
        self.assertCheap(_sub_add(_fill(_sub_add)), answer, most=1)   # the expression

    def test_security_keys_over_connection_max_keys(self):
        # The first key field is read (and would be answered first); the
        # second is over the limit.
        answer = self.assertSameAnswer(_sec_rqst(_CONNECTION_KEYS + 1))
        nack = self.assertNacked(answer, "Connection.Max-Keys")
        self.assertEqual(nack.message, "more keys than Connection.Max-Keys")
        self.assertCheap(_sec_rqst(_fill(_sec_rqst)), answer, most=1)

    def test_notification_attributes_over_attribute_max_count(self):
        answer = self.assertSameAnswer(_notify_emit(_ATTRIBUTES + 1))
        replies, closed, ignored, errors_counted, rejected = answer
        self.assertEqual((replies, closed, errors_counted, rejected), ([], False, 0, 1))
        self.assertEqual(ignored, [f"more than Attribute.Max-Count ({_ATTRIBUTES}) attributes"])
        self.assertCheap(_notify_emit(_fill(_notify_emit)), answer, most=0)

    def test_notification_keys_over_connection_max_keys(self):
        answer = self.assertSameAnswer(_notify_emit(1, _CONNECTION_KEYS + 1))
        self.assertEqual(answer[2], [f"more keys than Connection.Max-Keys ({_CONNECTION_KEYS})"])
        self.assertCheap(_notify_emit(1, _fill(lambda n: _notify_emit(1, n))), answer, most=1)

    def test_notification_wrong_twice_is_ignored_for_its_first_fault_read(self):
        # A repeated attribute name, then too many keys: the keys are not
        # read to tell the notification is ignored for the repeated name.
        data = (_u32(P.NotifyEmit.ID) + _attributes(["a", "a"]) + _u32(1)
                + _keys(SHA1_PRODUCER, _CONNECTION_KEYS + 1))
        answer = self.assertSameAnswer(data)
        self.assertEqual(answer[2:], (["attribute name 'a' repeated"], 1, 1))

    def test_unotify_over_tcp(self):
        answer = self.assertSameAnswer(_unotify(_ATTRIBUTES + 1), connect=False)
        self.assertEqual(answer[2], [f"more than Attribute.Max-Count ({_ATTRIBUTES}) attributes"])
        # (Before ConnRqst a packet has at most 64 KiB.)
        self.assertCheap(_unotify(_fill(_unotify, 64 << 10)), answer, connect=False, most=0,
                         size=64 << 10)
        answer = self.assertSameAnswer(_unotify(1, _CONNECTION_KEYS + 1), connect=False)
        self.assertEqual(answer[2], [f"more keys than Connection.Max-Keys ({_CONNECTION_KEYS})"])

    def test_unotify_over_udp(self):
        def received(data, limited):
            router = Router() if limited else _unlimited(Router())
            udp = UNotifyDatagramProtocol(router)
            udp.datagramReceived(data, ("127.0.0.1", 9))
            return dict(udp.counters), router.stats["rejected_notifications"]

        for data in (_unotify(_ATTRIBUTES + 1), _unotify(1, _CONNECTION_KEYS + 1)):
            work = _Work(self)
            work.on = True
            answer = received(data, True)
            self.assertLessEqual(work.items, 1)
            self.assertEqual(answer, received(data, False))
            self.assertEqual((answer[0]["rejected"], answer[1]), (1, 1))

    def test_an_array_wrong_in_itself_is_the_violation_it_was(self):
        # A count the bytes left cannot hold is checked before the limit.
        data = _u32(P.QnchAddRqst.ID, 7, 1 << 20) + b"\0" * 64
        answer = _Answers().to(data)
        self.assertEqual(answer, _Answers(limited=False).to(data))
        replies, closed, _, _, _ = answer
        self.assertTrue(closed)
        self.assertIsInstance(replies[-1], P.Disconn)

    def test_a_bystander_is_answered_between_two_such_packets(self):
        answers = _Answers()
        attacker, attacker_t = answers.connected()
        bystander, bystander_t = answers.connected()
        bomb = _qnch_add(_fill(_qnch_add))
        work = _Work(self)
        work.on = True
        attacker.dataReceived(_u32(len(bomb)) + bomb)
        bystander.dataReceived(frame(P.SubAddRqst(3, "require(a)", True, P.Keys.EMPTY)))
        attacker.dataReceived(_u32(len(bomb)) + bomb)
        self.assertLessEqual(work.items, 1)
        (reply,) = unframe(bystander_t.value())
        self.assertIsInstance(reply, P.SubRply)
        self.assertEqual([type(p) for p in unframe(attacker_t.value())], [P.Nack, P.Nack])


class DecoderLimitTests(unittest.TestCase):
    """``packets.decode`` with limits, below the session."""

    def test_an_array_over_its_limit_is_not_read(self):
        # The first name is not UTF-8: reading it would be an error.
        data = _u32(P.QnchAddRqst.ID, 7, 3) + _opaque(b"\xff") * 3 + _u32(1, 0)
        with self.assertRaises(xdr.BadUTF8Error):
            P.decode(data)
        packet = P.decode(data, limits={"QnchAddRqst.names": 2})
        self.assertIsInstance(packet.names, P.UnreadArray)
        self.assertEqual((len(packet.names), list(packet.names)), (3, []))
        self.assertEqual((packet.xid, packet.deliver_insecure, packet.keys), (7, False, P.Keys.EMPTY))

    def test_at_the_limit_the_array_is_read(self):
        packet = P.QnchAddRqst(7, ("a", "b"), True, P.Keys.EMPTY)
        self.assertEqual(P.decode(P.encode(packet), limits={"QnchAddRqst.names": 2}), packet)

    def test_keys_are_counted_across_key_sets(self):
        keys = P.Keys({SHA1_PRODUCER: [[b"a", b"b"]], SHA1_CONSUMER: [[b"c"]]})
        data = P.encode(P.SecRqst(7, keys, P.Keys.EMPTY, P.Keys.EMPTY, P.Keys.EMPTY))
        self.assertEqual(P.decode(data, limits={"SecRqst.add_nfn_keys": 3}).add_nfn_keys, keys)
        unread = P.decode(data, limits={"SecRqst.add_nfn_keys": 2}).add_nfn_keys
        self.assertEqual((type(unread), unread.key_count()), (P.UnreadArray, 3))

    def test_compiled_and_pure_python_attributes_agree(self):
        data = P.encode(P.NotifyEmit({"a": 1, "b": 2}, True, P.Keys.EMPTY))
        limits = {"NotifyEmit.attributes": 1}
        for compiled in (xdr._accelerated_name_values, None):
            self.patch(xdr, "_accelerated_name_values", compiled)
            self.patch(P, "_compiled_name_values", compiled)
            attributes = P.decode(data, limits=limits).attributes
            self.assertEqual((type(attributes), len(attributes)), (P.UnreadArray, 2))
            attributes, insecure, keys, end = P.notify_emit_fields(data, limits)
            self.assertEqual((type(attributes), len(attributes)), (P.UnreadArray, 2))
            self.assertEqual((insecure, keys, end), (False, P.Keys.EMPTY, 0))
            self.assertEqual(P.notify_emit_fields(data, {"NotifyEmit.attributes": 2})[0],
                             {"a": 1, "b": 2})

    def test_the_shortest_notifications_over_a_limit(self):
        # The router decodes a NotifyEmit shorter than notify_emit_limits_from
        # without limits: none so short can hold an array over them.
        limits = {"NotifyEmit.attributes": 16, "NotifyEmit.keys": 3}
        shortest = P.notify_emit_limits_from(limits)
        over_attributes = _u32(P.NotifyEmit.ID, 17) + (_opaque(b"") + _u32(1, 7)) * 17 + _u32(1, 0)
        over_keys = _u32(P.NotifyEmit.ID, 0, 1, 1, SHA1_PRODUCER, 1, 4) + _opaque(b"") * 4
        self.assertEqual(min(len(over_attributes), len(over_keys)), shortest)
        self.assertIsInstance(P.notify_emit_fields(over_attributes, limits)[0], P.UnreadArray)
        self.assertIsInstance(P.notify_emit_fields(over_keys, limits)[2], P.UnreadArray)
        self.assertEqual(P.notify_emit_limits_from(None), sys.maxsize)


class NegotiatedLimitTests(unittest.TestCase):
    def test_a_limit_negotiated_lower_holds_the_shortest_packet_over_it(self):
        answers = _Answers()
        proto, transport = answers.harness.client()
        proto.dataReceived(frame(P.ConnRqst(1, 4, 0, {"Attribute.Max-Count": 16})))
        transport.clear()
        work = _Work(self)
        work.on = True
        data = _u32(P.NotifyEmit.ID, 17) + (_opaque(b"") + _u32(1, 7)) * 17 + _u32(1, 0)
        proto.dataReceived(_u32(len(data)) + data)
        self.assertEqual(work.items, 0)
        self.assertEqual(answers.ignored, ["more than Attribute.Max-Count (16) attributes"])
        # QosRqst: the limits follow.
        proto.dataReceived(frame(P.QosRqst(2, {"Attribute.Max-Count": 17})))
        proto.dataReceived(_u32(len(data)) + data)
        self.assertEqual(answers.ignored[1:], ["attribute name '' repeated"])


class UnboundedArrayTests(unittest.TestCase):
    """Arrays whose count no option held to before are held too, so that no
    client packet's decoding grows with its length: a QuenchModRqst's name
    lists and a QosRqst's options by Attribute.Max-Count, a Keys field's
    scheme entries and key sets by its key limit (at least
    KEY_FIELD_MIN_SHAPES)."""

    def counting_reads(self):
        """The array counts the decoders read while ``work.on``."""
        work = _Work(self)
        count = xdr.Reader.count

        def counted(reader, *args, **kwargs):
            work.items += work.on
            return count(reader, *args, **kwargs)
        self.patch(xdr.Reader, "count", counted)
        return work

    def quench_change(self, add=0, delete=0):
        # (names the quench of _qnch_add(1), "0000", does not have)
        return P.encode(P.QnchModRqst(8, 1, tuple(_names(add + 1)[1:]),
                                      tuple(_names(delete + 1)[1:]), True))

    def test_a_quench_change_of_more_names_than_attribute_max_count(self):
        for add, delete in ((_ATTRIBUTES + 1, 0), (0, _ATTRIBUTES + 1)):
            work = _Work(self)
            (reply, nack), closed, _, _, _ = _Answers(work=work).to(
                _qnch_add(1), self.quench_change(add, delete))
            self.assertIsInstance(reply, P.QnchRply)
            self.assertEqual(reply.quench_id, 1)
            self.assertEqual((nack.xid, nack.error, nack.args),
                             (8, errors.QOS_LIMIT, ("Attribute.Max-Count",)))
            self.assertEqual(nack.message, f"quench over Attribute.Max-Count ({_ATTRIBUTES})")
            self.assertEqual(work.items, 1)          # the quench's one name
        # Within it, as before (here: the names it would add are new).
        (_, reply), _, _, _, _ = _Answers().to(_qnch_add(1), self.quench_change(add=3))
        self.assertIsInstance(reply, P.QnchRply)
        big = self.quench_change(add=_fill(lambda n: self.quench_change(add=n)))
        work = _Work(self)
        (_, nack), _, _, _, _ = _Answers(work=work).to(_qnch_add(1), big)
        self.assertEqual(nack.error, errors.QOS_LIMIT)
        self.assertLessEqual(work.items, 1)

    def test_a_qos_request_of_more_options_than_attribute_max_count(self):
        def qos(count):
            return _u32(P.QosRqst.ID, 7) + _attributes(_names(count))
        (reply,), _, _, _, _ = _Answers().to(qos(_ATTRIBUTES))
        self.assertIsInstance(reply, P.QosRply)     # unknown options ignored
        work = _Work(self)
        answer = _Answers(work=work).to(qos(_fill(qos)))
        nack = CountLimitTests.assertNacked(self, answer, "Attribute.Max-Count")
        self.assertEqual(nack.message, "more options than Attribute.Max-Count or 64, "
                                       f"whichever is more ({_ATTRIBUTES})")
        self.assertEqual(work.items, 0)

    def test_a_qos_request_may_name_every_option_at_the_least_attribute_max_count(self):
        from elvin.core.options import COMPAT_NAMES, OPTIONS
        # Every option under its name and its old one (section 7.5.3), as
        # a client that speaks both would ask.
        every = {name: spec.default for name, spec in OPTIONS.items()}
        every["Attribute.Max-Count"] = 16
        for old, name in COMPAT_NAMES.items():
            if name in every and old != "router.coalesce-delay":
                every[old] = every[name]
        answers = _Answers()
        proto, transport = answers.connected()
        for options in ({"Attribute.Max-Count": 16}, every):
            data = P.encode(P.QosRqst(7, options))
            proto.dataReceived(_u32(len(data)) + data)
            (reply,) = unframe(transport.value())
            transport.clear()
            self.assertIsInstance(reply, P.QosRply)
        self.assertGreater(len(every), 16)
        data = _u32(P.QosRqst.ID, 7) + _attributes(_names(65))
        proto.dataReceived(_u32(len(data)) + data)
        (nack,) = unframe(transport.value())
        self.assertEqual((nack.error, nack.message[-4:]), (errors.QOS_LIMIT, "(64)"))

    def test_a_keys_field_of_empty_key_sets_is_bounded(self):
        from elvin.protocols.packets import KEY_FIELD_MIN_SHAPES

        def empty_sets(count):
            return (_u32(P.SubAddRqst.ID, 7) + _opaque(b"require(a)") + _u32(1)
                    + _u32(1, SHA1_CONSUMER, count) + _u32(0) * count)
        # Within the bound, answered as before (a consumer key scheme takes
        # one key set: Nack 1005); past it, as over the key limit.
        within = _SUBSCRIPTION_KEYS - 1
        self.assertEqual(_Answers().to(empty_sets(within)),
                         _Answers(limited=False).to(empty_sets(within)))
        self.assertEqual(_Answers().to(empty_sets(within))[0][0].error, 1005)
        self.assertGreater(_SUBSCRIPTION_KEYS, KEY_FIELD_MIN_SHAPES)
        work = self.counting_reads()
        answer = _Answers(work=work).to(empty_sets(_fill(empty_sets)))
        CountLimitTests.assertNacked(self, answer, "Subscription.Max-Keys")
        self.assertLessEqual(work.items, 3)       # the scheme and set counts only
        # Many scheme entries, each of no key set, likewise.
        many = (_u32(P.SubAddRqst.ID, 7) + _opaque(b"require(a)") + _u32(1)
                + _u32(200_000) + _u32(SHA1_CONSUMER, 0) * 200_000)
        work = self.counting_reads()
        CountLimitTests.assertNacked(self, _Answers(work=work).to(many),
                                     "Subscription.Max-Keys")
        self.assertLessEqual(work.items, 2)


class ProxyCountLimitTests(unittest.TestCase):
    """The proxy's client side (the same server protocol, its own
    handlers and limits: elvin.proxy.state.COUNT_LIMITED_FIELDS)."""

    def answer(self, data, limited, work=None):
        from twisted.internet.testing import StringTransport
        from elvin.proxy.core import ProxyCore
        from elvin.proxy.protocol import ProxyServerFactory
        from elvin.proxy.store import Store
        from elvin.test.test_proxy_core import Clock as CoreClock, InProcessUpstream
        upstream = InProcessUpstream()
        core = ProxyCore(Store(":memory:"), upstream, clock=CoreClock())
        upstream.core = core
        upstream.up()
        self.addCleanup(upstream.down)
        if not limited:
            core.new_options = lambda: ConnectionOptions(core.option_specs)
        protocol = ProxyServerFactory(core, Clock(), 30).buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(frame(P.ConnRqst(1, 4, 0, {})))
        transport.clear()
        if work is not None:
            work.on = True
        protocol.dataReceived(_u32(len(data)) + data)
        if work is not None:
            work.on = False
        return unframe(transport.value()), transport.disconnecting

    def test_the_proxy_answers_as_before(self):
        attributes = _notify_emit(_ATTRIBUTES + 1)
        for data, option in ((_qnch_add(_ATTRIBUTES + 1), None),
                             (_sub_add(_CONNECTION_KEYS + 1), "Connection.Max-Keys"),
                             (_sec_rqst(_CONNECTION_KEYS + 1), "Connection.Max-Keys"),
                             (attributes, None)):
            work = _Work(self)
            answer = self.answer(data, True, work)
            read, work.items = work.items, 0
            self.assertEqual(answer, self.answer(data, False, work))
            self.assertLess(read, work.items)
            self.assertLessEqual(read, 1)
            if option is not None:
                ((nack,), _) = answer
                self.assertEqual((nack.error, nack.args), (errors.QOS_LIMIT, (option,)))
        ((nack,), _) = self.answer(_qnch_add(_ATTRIBUTES + 1), True)
        self.assertEqual(nack.error, errors.NOT_IMPL)
        self.assertEqual(self.answer(attributes, True), ([], False))

    def test_a_notification_over_connection_max_keys_is_not_passed_upstream(self):
        from elvin.proxy.core import ProxyCore
        forwarded = []
        self.patch(ProxyCore, "forward", lambda core, *args: forwarded.append(args))
        self.answer(_notify_emit(1, keys=_CONNECTION_KEYS), True)
        self.assertEqual(len(forwarded), 1)          # at the limit: passed on
        work = _Work(self)
        self.assertEqual(self.answer(_notify_emit(1, keys=_CONNECTION_KEYS + 1), True, work),
                         ([], False))                # ignored (7.3.3), unanswered
        self.assertEqual(len(forwarded), 1)
        self.assertLessEqual(work.items, 1)          # its keys never read, nor hashed

    def test_a_qos_request_of_more_options_than_attribute_max_count(self):
        data = _u32(P.QosRqst.ID, 7) + _attributes(_names(_ATTRIBUTES + 1))
        work = _Work(self)
        ((nack,), closed) = self.answer(data, True, work)
        self.assertEqual((nack.error, nack.args, closed),
                         (errors.QOS_LIMIT, ("Attribute.Max-Count",), False))
        self.assertEqual(work.items, 0)
