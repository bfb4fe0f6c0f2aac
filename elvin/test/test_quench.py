"""Quench at the router: SubAddNotify / SubModNotify / SubDelNotify."""

import gc
import random
import sys
import tracemalloc


from elvin import errors
from elvin.core import keys as key_schemes
from elvin.core.quench import NAME_COST, QuenchRegistry, quench_cost
from elvin.protocols import packets as elvin_packets
from elvin.subscription import parse
from elvin.test.test_router import RouterTestCase


class QuenchRouterTests(RouterTestCase):
    def quench(self, session, out, names, deliver_insecure=True, keys=elvin_packets.Keys.EMPTY):
        session.packet_received(elvin_packets.QnchAddRqst(self.xid(), tuple(names), deliver_insecure, keys))
        packets = out.take()
        self.assertIsInstance(packets[0], elvin_packets.QnchRply)
        return packets[0].quench_id, packets[1:]

    def test_existing_and_new_subscriptions_are_notified(self):
        sub_s, sub_out = self.connect()
        existing = self.subscribe(sub_s, sub_out, "price > 10").subscription_id
        self.subscribe(sub_s, sub_out, "other == 1")
        q_s, q_out = self.connect()
        qid, initial = self.quench(q_s, q_out, ["price", "volume"])
        (note,) = initial
        self.assertIsInstance(note, elvin_packets.SubAddNotify)
        self.assertEqual(note.term_id, existing)
        self.assertEqual(note.insecure_quench_ids, (qid,))
        self.assertEqual(note.sub_expr, parse("price > 10"))
        new = self.subscribe(sub_s, sub_out, 'volume < 5 && sym == "X"').subscription_id
        (note,) = q_out.take()
        self.assertEqual((type(note), note.term_id), (elvin_packets.SubAddNotify, new))
        self.assertEqual(note.sub_expr, parse('volume < 5 && sym == "X"'))
        self.subscribe(sub_s, sub_out, "unrelated > 1")
        self.assertEqual(q_out.take(), [])

    def test_modify_becomes_add_mod_or_delete(self):
        sub_s, sub_out = self.connect()
        sub_id = self.subscribe(sub_s, sub_out, "a == 1").subscription_id
        q_s, q_out = self.connect()
        qid, initial = self.quench(q_s, q_out, ["price"])
        self.assertEqual(initial, [])

        def modify(expression):
            sub_s.packet_received(elvin_packets.SubModRqst(self.xid(), sub_id, expression, True,
                                               elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
            self.assertIsInstance(sub_out.take()[0], elvin_packets.SubRply)
            return q_out.take()

        (n,) = modify("price > 1")
        self.assertIsInstance(n, elvin_packets.SubAddNotify)
        (n,) = modify("price > 2")
        self.assertIsInstance(n, elvin_packets.SubModNotify)
        self.assertEqual(n.sub_expr, parse("price > 2"))
        (n,) = modify("a == 2")
        self.assertEqual(n, elvin_packets.SubDelNotify((qid,), sub_id))

    def test_a_modification_that_changes_nothing_is_not_told(self):
        sub_s, sub_out = self.connect()
        sub_id = self.subscribe(sub_s, sub_out, "price > 1").subscription_id
        q_s, q_out = self.connect()
        self.quench(q_s, q_out, ["price"])
        sub_s.packet_received(elvin_packets.SubModRqst(self.xid(), sub_id, "", True,
                                                       elvin_packets.Keys.EMPTY,
                                                       elvin_packets.Keys.EMPTY))
        self.assertIsInstance(sub_out.take()[0], elvin_packets.SubRply)
        self.assertEqual(q_out.take(), [])
        sub_s.packet_received(elvin_packets.SubModRqst(self.xid(), sub_id, "", False,
                                                       elvin_packets.Keys.EMPTY,
                                                       elvin_packets.Keys.EMPTY))
        self.assertEqual(q_out.take(), [elvin_packets.SubDelNotify(
            (next(iter(q_s.quenches)),), sub_id)])

    def test_delete_and_disconnect_notify(self):
        sub_s, sub_out = self.connect()
        a = self.subscribe(sub_s, sub_out, "price > 1").subscription_id
        b = self.subscribe(sub_s, sub_out, "price > 2").subscription_id
        q_s, q_out = self.connect()
        qid, _ = self.quench(q_s, q_out, ["price"])
        sub_s.packet_received(elvin_packets.SubDelRqst(self.xid(), a))
        self.assertEqual(q_out.take(), [elvin_packets.SubDelNotify((qid,), a)])
        sub_s.connection_lost()
        self.assertEqual(q_out.take(), [elvin_packets.SubDelNotify((qid,), b)])

    def test_one_packet_per_quenching_client(self):
        q_s, q_out = self.connect()
        q1, _ = self.quench(q_s, q_out, ["a"])
        q2, _ = self.quench(q_s, q_out, ["b"])
        sub_s, sub_out = self.connect()
        self.subscribe(sub_s, sub_out, "a == 1 && b == 2")
        (n,) = q_out.take()
        self.assertEqual(sorted(n.insecure_quench_ids), sorted([q1, q2]))

    def test_keys_decide_visibility(self):
        nfn, sub = key_schemes.producer_keys("k")
        sub_s, sub_out = self.connect()
        secret = self.subscribe_keys(sub_s, sub_out, "price > 1", accept_insecure=False, keys=sub)
        public = self.subscribe(sub_s, sub_out, "price > 2").subscription_id
        keyed_q, keyed_out = self.connect()
        kq, initial = self.quench(keyed_q, keyed_out, ["price"], deliver_insecure=False, keys=nfn)
        self.assertEqual([(n.term_id, n.secure_quench_ids) for n in initial], [(secret, (kq,))])
        plain_q, plain_out = self.connect()
        pq, initial = self.quench(plain_q, plain_out, ["price"])
        self.assertEqual([(n.term_id, n.insecure_quench_ids) for n in initial], [(public, (pq,))])

    def test_notification_keys_changed_by_secrqst_are_told(self):
        """7.4.9: what follows a SecRply matches its keys, quench
        notifications too: a quencher whose connection gains the key sees
        the keyed subscription, and loses it with the key."""
        nfn, sub = key_schemes.producer_keys("k")
        sub_s, sub_out = self.connect()
        secret = self.subscribe_keys(sub_s, sub_out, "price > 1", accept_insecure=False, keys=sub)
        q_s, q_out = self.connect()
        qid, initial = self.quench(q_s, q_out, ["price"], deliver_insecure=False)
        self.assertEqual(initial, [])
        q_s.packet_received(elvin_packets.SecRqst(self.xid(), add_nfn_keys=nfn))
        reply, added = q_out.take()
        self.assertIsInstance(reply, elvin_packets.SecRply)
        self.assertEqual((type(added), added.term_id, added.secure_quench_ids),
                         (elvin_packets.SubAddNotify, secret, (qid,)))
        # Changing the subscription now is a modification, not a second add.
        sub_s.packet_received(elvin_packets.SubModRqst(self.xid(), secret, "price > 2", False,
                                                       elvin_packets.Keys.EMPTY,
                                                       elvin_packets.Keys.EMPTY))
        self.assertIsInstance(q_out.take()[0], elvin_packets.SubModNotify)
        q_s.packet_received(elvin_packets.SecRqst(self.xid(), del_nfn_keys=nfn))
        self.assertEqual(q_out.take()[1:], [elvin_packets.SubDelNotify((qid,), secret)])

    def test_subscription_keys_changed_by_secrqst_are_told(self):
        nfn, sub = key_schemes.producer_keys("k")
        sub_s, sub_out = self.connect()
        sub_id = self.subscribe_keys(sub_s, sub_out, "price > 1", accept_insecure=False,
                                     keys=elvin_packets.Keys.EMPTY)
        q_s, q_out = self.connect()
        qid, initial = self.quench(q_s, q_out, ["price"], deliver_insecure=False, keys=nfn)
        self.assertEqual(initial, [])
        sub_s.packet_received(elvin_packets.SecRqst(self.xid(), add_sub_keys=sub))
        self.assertIsInstance(sub_out.take()[0], elvin_packets.SecRply)
        (added,) = q_out.take()
        self.assertEqual((added.term_id, added.secure_quench_ids), (sub_id, (qid,)))
        sub_s.packet_received(elvin_packets.SecRqst(self.xid(), del_sub_keys=sub))
        self.assertEqual(q_out.take(), [elvin_packets.SubDelNotify((qid,), sub_id)])
        # A change no quench can notice sends nothing.
        sub_s.packet_received(elvin_packets.SecRqst(self.xid(),
                                                    add_nfn_keys=key_schemes.producer_keys("o")[0]))
        self.assertEqual(q_out.take(), [])

    def test_quench_modify_moving_a_subscription_to_the_secure_side(self):
        nfn, sub = key_schemes.producer_keys("k")
        sub_s, sub_out = self.connect()
        sub_id = self.subscribe_keys(sub_s, sub_out, "price > 1", accept_insecure=True, keys=sub)
        q_s, q_out = self.connect()
        qid, (initial,) = self.quench(q_s, q_out, ["price"])
        self.assertEqual(initial.insecure_quench_ids, (qid,))
        q_s.packet_received(elvin_packets.QnchModRqst(self.xid(), qid, (), (), True, nfn,
                                                      elvin_packets.Keys.EMPTY))
        reply, moved = q_out.take()
        self.assertIsInstance(reply, elvin_packets.QnchRply)
        self.assertEqual((type(moved), moved.term_id, moved.secure_quench_ids,
                          moved.insecure_quench_ids),
                         (elvin_packets.SubModNotify, sub_id, (qid,), ()))

    def subscribe_keys(self, session, out, expression, accept_insecure, keys):
        session.packet_received(elvin_packets.SubAddRqst(self.xid(), expression, accept_insecure, keys))
        return out.take()[0].subscription_id

    def test_quench_modify_adds_and_removes_names(self):
        sub_s, sub_out = self.connect()
        a = self.subscribe(sub_s, sub_out, "a > 1").subscription_id
        b = self.subscribe(sub_s, sub_out, "b > 1").subscription_id
        q_s, q_out = self.connect()
        qid, initial = self.quench(q_s, q_out, ["a"])
        self.assertEqual([n.term_id for n in initial], [a])
        q_s.packet_received(elvin_packets.QnchModRqst(self.xid(), qid, ("b",), ("a",), True,
                                          elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        packets = q_out.take()
        self.assertIsInstance(packets[0], elvin_packets.QnchRply)
        self.assertEqual(packets[1:], [elvin_packets.SubDelNotify((qid,), a),
                                       elvin_packets.SubAddNotify((), (qid,), b, parse("b > 1"))])

    def test_quench_nacks(self):
        q_s, q_out = self.connect()
        q_s.packet_received(elvin_packets.QnchAddRqst(1, (), True, elvin_packets.Keys.EMPTY))
        self.assertEqual(q_out.take()[0].error, errors.EMPTY_QUENCH)
        qid, _ = self.quench(q_s, q_out, ["a"])
        cases = [
            (elvin_packets.QnchModRqst(2, qid, ("a",), (), True, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY), errors.ATTR_EXISTS),
            (elvin_packets.QnchModRqst(3, qid, (), ("z",), True, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY), errors.NO_SUCH_ATTR),
            (elvin_packets.QnchModRqst(4, qid, (), ("a",), True, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY), errors.EMPTY_QUENCH),
            (elvin_packets.QnchModRqst(5, 999, ("b",), (), True, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY), errors.NO_SUCH_QUENCH),
            (elvin_packets.QnchDelRqst(6, 999), errors.NO_SUCH_QUENCH),
        ]
        for packet, code in cases:
            q_s.packet_received(packet)
            self.assertEqual(q_out.take()[0].error, code, packet)
        q_s.packet_received(elvin_packets.QnchDelRqst(7, qid))
        self.assertEqual(q_out.take(), [elvin_packets.QnchRply(7, qid)])
        sub_s, sub_out = self.connect()
        self.subscribe(sub_s, sub_out, "a > 1")
        self.assertEqual(q_out.take(), [])

    def test_a_name_given_twice_in_one_request_counts_once(self):
        """A quench is a set of names: a name twice in QnchAddRqst or in
        either list of QnchModRqst is that name once, and ATTR_EXISTS /
        NO_SUCH_ATTR are about the quench as it was before the request."""
        q_s, q_out = self.connect({"Attribute.Max-Count": 64})
        qid, _ = self.quench(q_s, q_out, ["a", "a"])
        q_s.packet_received(elvin_packets.QnchModRqst(self.xid(), qid, ("b", "b", "c"), (), True))
        self.assertEqual(q_out.take(), [elvin_packets.QnchRply(self._xid, qid)])
        q_s.packet_received(elvin_packets.QnchModRqst(self.xid(), qid, (), ("c", "c"), True))
        self.assertEqual(q_out.take(), [elvin_packets.QnchRply(self._xid, qid)])
        self.assertEqual(sorted(q_s.quenches[qid].names), ["a", "b"])

    def test_quench_names_are_held_to_attribute_name_max_length(self):
        q_s, q_out = self.connect({"Attribute.Name.Max-Length": 64})
        q_s.packet_received(elvin_packets.QnchAddRqst(self.xid(), ("n" * 65,), True,
                                                      elvin_packets.Keys.EMPTY))
        (nack,) = q_out.take()
        self.assertEqual((nack.error, nack.args), (errors.QOS_LIMIT,
                                                   ("Attribute.Name.Max-Length",)))
        qid, _ = self.quench(q_s, q_out, ["n" * 64])
        q_s.packet_received(elvin_packets.QnchModRqst(self.xid(), qid, ("é" * 33,), (), True,
                                                      elvin_packets.Keys.EMPTY,
                                                      elvin_packets.Keys.EMPTY))
        self.assertEqual(q_out.take()[0].error, errors.QOS_LIMIT)

    def test_max_client_quenches(self):
        """Each subscription change costs a check per quench on its names:
        one client's quenches are capped router-wide, another client's
        are its own."""
        self.router.max_client_quenches = 3
        q_s, q_out = self.connect()
        for _ in range(3):
            self.quench(q_s, q_out, ["BY"])
        q_s.packet_received(elvin_packets.QnchAddRqst(self.xid(), ("BY",), True,
                                                      elvin_packets.Keys.EMPTY))
        (nack,) = q_out.take()
        self.assertEqual(nack.error, errors.IMPL_LIMIT)
        self.assertIn("max-client-quenches", nack.message)
        other, other_out = self.connect()
        self.quench(other, other_out, ["BY"])

    def test_quencher_disconnect_forgets_its_quenches(self):
        q_s, q_out = self.connect()
        self.quench(q_s, q_out, ["a"])
        q_s.connection_lost()
        self.assertEqual(len(self.router.quench), 0)


def _names(prefix, count):
    """``count`` distinct names, each a new string object (as decoded)."""
    return tuple("".join((prefix, ".", str(i))) for i in range(count))


class _Entry:
    """What the registry files a subscription by."""

    def __init__(self, entry_id, names):
        self.id = entry_id
        self.names = frozenset(names)


class SubscriptionFilingTests(RouterTestCase):
    """The registry's subscriptions by name set: what they cost, and that
    every subscription on a name is found, however the groups change."""

    def test_subscriptions_on_names_of_their_own_cost_little(self):
        registry = QuenchRegistry()
        entries = [_Entry(i, (f"name{i}",)) for i in range(3000)]
        gc.collect()
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            for entry in entries:
                registry._file(entry, entry.names)
            held = tracemalloc.get_traced_memory()[0] - start
        finally:
            tracemalloc.stop()
        # Two dict slots each (their tables grow by doubling): no set of
        # one per subscription and name (some 430 bytes).
        self.assertLess(held / len(entries), 150)

    def test_random_filing_finds_every_subscription_on_a_name(self):
        rng = random.Random(5)
        registry = QuenchRegistry()
        names = [f"n{i}" for i in range(6)]
        filed = {}
        for step in range(3000):
            if filed and rng.random() < 0.45:
                entry = filed.pop(rng.choice(sorted(filed)))
                registry._unfile(entry, entry.names)
            else:
                entry = _Entry(step, rng.sample(names, rng.randint(1, 3)))
                filed[entry.id] = entry
                registry._file(entry, entry.names)
            asked = rng.sample(names, rng.randint(1, 3))
            found = {e.id for e in registry._subscriptions_on(asked)}
            self.assertEqual(found, {i for i, e in filed.items() if e.names & set(asked)})
        for entry in list(filed.values()):
            registry._unfile(entry, entry.names)
        self.assertEqual((registry._subs_by_names, registry._name_sets), ({}, {}))


class QuenchMemoryTests(RouterTestCase):
    """What quenches hold is in proportion to their names, capped
    router-wide by ``max-quench-memory``, and given back when they go."""

    quench = QuenchRouterTests.quench

    many = {"Subscription.Max-Count": 100_000}

    def setUp(self):
        super().setUp()
        self.router.max_client_quenches = 0      # these hold thousands on purpose

    def test_a_shared_name_is_held_once(self):
        sessions = [self.connect() for _ in range(3)]
        for session, out in sessions:
            self.quench(session, out, [str("".join(["pri", "ce"])), "own"])
        first, second, third = (s.quenches[min(s.quenches)] for s, _ in sessions)
        self.assertIs(third.names[0], second.names[0])
        self.assertEqual(self.router.quench.names(), 2)
        self.assertTrue(all(type(q.names) is tuple for q in (first, second, third)))

    def test_nothing_is_kept_after_close(self):
        registry = self.router.quench
        empty = {name: sys.getsizeof(getattr(registry, name))
                 for name in ("quenches", "_quenches_by_name")}
        q_s, q_out = self.connect(self.many)
        for i in range(300):
            self.quench(q_s, q_out, _names(f"q{i}", 64) + _names("shared", 64))
        self.assertEqual((len(registry), registry.names()), (300, 300 * 64 + 64))
        self.assertGreater(registry.bytes, 0)
        q_s.connection_lost()
        self.assertEqual((len(registry), registry.names(), registry.bytes), (0, 0, 0))
        self.assertEqual(q_s.quenches, {})
        for name, size in empty.items():
            self.assertLessEqual(sys.getsizeof(getattr(registry, name)), size, name)

    def test_removing_most_quenches_shrinks_the_index(self):
        registry = self.router.quench
        q_s, q_out = self.connect(self.many)
        ids = [self.quench(q_s, q_out, _names(f"q{i}", 64) + ("shared",))[0]
               for i in range(500)]
        full = sys.getsizeof(registry._quenches_by_name)
        full_shared = sys.getsizeof(registry._quenches_by_name["shared"].quenches)
        for qid in ids[:-5]:
            q_s.packet_received(elvin_packets.QnchDelRqst(self.xid(), qid))
        self.assertEqual(len(q_out.take()), len(ids) - 5)
        self.assertEqual(registry.names(), 5 * 64 + 1)
        self.assertLess(sys.getsizeof(registry._quenches_by_name), full / 16)
        self.assertLess(sys.getsizeof(registry._quenches_by_name["shared"].quenches),
                        full_shared / 4)

    def test_memory_is_in_proportion_and_comes_back(self):
        q_s, q_out = self.connect(self.many)
        packets = [elvin_packets.QnchAddRqst(self.xid(), _names(f"quench{i:04d}.attribute", 256), True,
                                 elvin_packets.Keys.EMPTY) for i in range(200)]
        sizes = sum(sys.getsizeof(name) for packet in packets for name in packet.names)
        gc.collect()
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            for packet in packets:
                q_s.packet_received(packet)
            q_out.take()
            held = tracemalloc.get_traced_memory()[0] - start
            charged = self.router.quench.bytes
            del packets
            q_s.connection_lost()
            gc.collect()
            after = tracemalloc.get_traced_memory()[0] - start
        finally:
            tracemalloc.stop()
        names = 200 * 256
        # The names' strings (kept: they are the index's keys) plus well
        # under 100 bytes a name for the rest.
        self.assertLess(held, sizes + 100 * names)
        self.assertGreater(charged, held - sizes)   # the estimate errs high
        # (The names were made before tracing began: their freeing is not seen.)
        self.assertLess(after, 64 * 1024)

    def test_router_wide_memory_cap(self):
        self.router.quench.max_bytes = 200_000
        hog, hog_out = self.connect(self.many)
        bystander, by_out = self.connect()
        sub_s, sub_out = self.connect()
        term = self.subscribe(sub_s, sub_out, "price > 1").subscription_id
        accepted = 0
        while True:
            hog.packet_received(elvin_packets.QnchAddRqst(self.xid(), _names(f"h{accepted}", 256), True,
                                              elvin_packets.Keys.EMPTY))
            reply = hog_out.take()[0]
            if isinstance(reply, elvin_packets.Nack):
                break
            accepted += 1
        self.assertEqual(reply.error, errors.IMPL_LIMIT)
        self.assertIn("max-quench-memory", reply.message)
        self.assertIn("200000", reply.message)
        self.assertGreater(accepted, 0)
        self.assertLessEqual(self.router.quench.bytes, 200_000)
        self.assertEqual(len(self.router.quench), accepted)
        # Growing a quench past the cap is refused too; the quench is kept.
        qid = min(hog.quenches)
        longer = _names("longer" * 100, 200)
        hog.packet_received(elvin_packets.QnchModRqst(self.xid(), qid, longer, _names("h0", 200), True,
                                          elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertEqual(hog_out.take()[0].error, errors.IMPL_LIMIT)
        self.assertEqual(len(hog.quenches[qid].names), 256)
        # Shrinking one is not.
        hog.packet_received(elvin_packets.QnchModRqst(self.xid(), qid, (), _names("h0", 200), True,
                                          elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertIsInstance(hog_out.take()[0], elvin_packets.QnchRply)
        # Everyone else is still served: subscriptions and notifications...
        self.emit(bystander, {"price": 5})
        (deliver,) = sub_out.take()
        self.assertIsInstance(deliver, elvin_packets.NotifyDeliver)
        # ... and, once the hog has gone, quenches.
        hog.connection_lost()
        self.assertEqual(self.router.quench.bytes, 0)
        qid, initial = self.quench(bystander, by_out, ["price"] + list(_names("b", 255)))
        self.assertEqual([n.term_id for n in initial], [term])

    def test_default_cap_takes_ordinary_quenches(self):
        producers = [self.connect() for _ in range(100)]
        for i, (session, out) in enumerate(producers):
            for j in range(10):
                self.quench(session, out, _names(f"p{i}.{j}", 256))
        self.assertEqual(len(self.router.quench), 1000)
        self.assertLess(self.router.quench.bytes, self.router.quench.max_bytes)

    def test_quench_cost_counts_names(self):
        small, large = quench_cost(["a"]), quench_cost(["a" * 1000])
        self.assertEqual(large - small, sys.getsizeof("a" * 1000) - sys.getsizeof("a"))
        self.assertEqual(quench_cost(["a", "b"]) - small, NAME_COST + sys.getsizeof("b"))
