"""Quench at the router: SubAddNotify / SubModNotify / SubDelNotify."""

from twisted.trial import unittest

from elvin import errors
from elvin.core import keys as K
from elvin.protocols import packets as P
from elvin.subscription import parse
from elvin.test.test_router import RouterTestCase


class QuenchRouterTests(RouterTestCase):
    def quench(self, session, out, names, deliver_insecure=True, keys=P.Keys.EMPTY):
        session.packet_received(P.QnchAddRqst(self.xid(), tuple(names), deliver_insecure, keys))
        packets = out.take()
        self.assertIsInstance(packets[0], P.QnchRply)
        return packets[0].quench_id, packets[1:]

    def test_existing_and_new_subscriptions_are_notified(self):
        sub_s, sub_out = self.connect()
        existing = self.subscribe(sub_s, sub_out, "price > 10").subscription_id
        self.subscribe(sub_s, sub_out, "other == 1")
        q_s, q_out = self.connect()
        qid, initial = self.quench(q_s, q_out, ["price", "volume"])
        (note,) = initial
        self.assertIsInstance(note, P.SubAddNotify)
        self.assertEqual(note.term_id, existing)
        self.assertEqual(note.insecure_quench_ids, (qid,))
        self.assertEqual(note.sub_expr, parse("price > 10"))
        new = self.subscribe(sub_s, sub_out, 'volume < 5 && sym == "X"').subscription_id
        (note,) = q_out.take()
        self.assertEqual((type(note), note.term_id), (P.SubAddNotify, new))
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
            sub_s.packet_received(P.SubModRqst(self.xid(), sub_id, expression, True,
                                               P.Keys.EMPTY, P.Keys.EMPTY))
            self.assertIsInstance(sub_out.take()[0], P.SubRply)
            return q_out.take()

        (n,) = modify("price > 1")
        self.assertIsInstance(n, P.SubAddNotify)
        (n,) = modify("price > 2")
        self.assertIsInstance(n, P.SubModNotify)
        self.assertEqual(n.sub_expr, parse("price > 2"))
        (n,) = modify("a == 2")
        self.assertEqual(n, P.SubDelNotify((qid,), sub_id))

    def test_delete_and_disconnect_notify(self):
        sub_s, sub_out = self.connect()
        a = self.subscribe(sub_s, sub_out, "price > 1").subscription_id
        b = self.subscribe(sub_s, sub_out, "price > 2").subscription_id
        q_s, q_out = self.connect()
        qid, _ = self.quench(q_s, q_out, ["price"])
        sub_s.packet_received(P.SubDelRqst(self.xid(), a))
        self.assertEqual(q_out.take(), [P.SubDelNotify((qid,), a)])
        sub_s.connection_lost()
        self.assertEqual(q_out.take(), [P.SubDelNotify((qid,), b)])

    def test_one_packet_per_quenching_client(self):
        q_s, q_out = self.connect()
        q1, _ = self.quench(q_s, q_out, ["a"])
        q2, _ = self.quench(q_s, q_out, ["b"])
        sub_s, sub_out = self.connect()
        self.subscribe(sub_s, sub_out, "a == 1 && b == 2")
        (n,) = q_out.take()
        self.assertEqual(sorted(n.insecure_quench_ids), sorted([q1, q2]))

    def test_keys_decide_visibility(self):
        nfn, sub = K.producer_keys("k")
        sub_s, sub_out = self.connect()
        secret = self.subscribe_keys(sub_s, sub_out, "price > 1", accept_insecure=False, keys=sub)
        public = self.subscribe(sub_s, sub_out, "price > 2").subscription_id
        keyed_q, keyed_out = self.connect()
        kq, initial = self.quench(keyed_q, keyed_out, ["price"], deliver_insecure=False, keys=nfn)
        self.assertEqual([(n.term_id, n.secure_quench_ids) for n in initial], [(secret, (kq,))])
        plain_q, plain_out = self.connect()
        pq, initial = self.quench(plain_q, plain_out, ["price"])
        self.assertEqual([(n.term_id, n.insecure_quench_ids) for n in initial], [(public, (pq,))])

    def subscribe_keys(self, session, out, expression, accept_insecure, keys):
        session.packet_received(P.SubAddRqst(self.xid(), expression, accept_insecure, keys))
        return out.take()[0].subscription_id

    def test_quench_modify_adds_and_removes_names(self):
        sub_s, sub_out = self.connect()
        a = self.subscribe(sub_s, sub_out, "a > 1").subscription_id
        b = self.subscribe(sub_s, sub_out, "b > 1").subscription_id
        q_s, q_out = self.connect()
        qid, initial = self.quench(q_s, q_out, ["a"])
        self.assertEqual([n.term_id for n in initial], [a])
        q_s.packet_received(P.QnchModRqst(self.xid(), qid, ("b",), ("a",), True,
                                          P.Keys.EMPTY, P.Keys.EMPTY))
        packets = q_out.take()
        self.assertIsInstance(packets[0], P.QnchRply)
        self.assertEqual(packets[1:], [P.SubDelNotify((qid,), a),
                                       P.SubAddNotify((), (qid,), b, parse("b > 1"))])

    def test_quench_nacks(self):
        q_s, q_out = self.connect()
        q_s.packet_received(P.QnchAddRqst(1, (), True, P.Keys.EMPTY))
        self.assertEqual(q_out.take()[0].error, errors.EMPTY_QUENCH)
        qid, _ = self.quench(q_s, q_out, ["a"])
        cases = [
            (P.QnchModRqst(2, qid, ("a",), (), True, P.Keys.EMPTY, P.Keys.EMPTY), errors.ATTR_EXISTS),
            (P.QnchModRqst(3, qid, (), ("z",), True, P.Keys.EMPTY, P.Keys.EMPTY), errors.NO_SUCH_ATTR),
            (P.QnchModRqst(4, qid, (), ("a",), True, P.Keys.EMPTY, P.Keys.EMPTY), errors.EMPTY_QUENCH),
            (P.QnchModRqst(5, 999, ("b",), (), True, P.Keys.EMPTY, P.Keys.EMPTY), errors.NO_SUCH_QUENCH),
            (P.QnchDelRqst(6, 999), errors.NO_SUCH_QUENCH),
        ]
        for packet, code in cases:
            q_s.packet_received(packet)
            self.assertEqual(q_out.take()[0].error, code, packet)
        q_s.packet_received(P.QnchDelRqst(7, qid))
        self.assertEqual(q_out.take(), [P.QnchRply(7, qid)])
        sub_s, sub_out = self.connect()
        self.subscribe(sub_s, sub_out, "a > 1")
        self.assertEqual(q_out.take(), [])

    def test_quencher_disconnect_forgets_its_quenches(self):
        q_s, q_out = self.connect()
        self.quench(q_s, q_out, ["a"])
        q_s.connection_lost()
        self.assertEqual(len(self.router.quench), 0)
