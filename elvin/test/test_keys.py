"""Security keys: the SHA-1 schemes, and key-restricted delivery."""

import hashlib

from twisted.internet import defer
from twisted.trial import unittest

from elvin import errors
from elvin.core import keys as key_schemes
from elvin.core.keys import CONSUMER, PRODUCER, KeyRing
from elvin.protocols import packets
from elvin.test.test_integration import RouterFixture, wait_until
from elvin.test.test_router import RecordingOutput, RouterTestCase


class KeyRingTests(unittest.TestCase):
    def test_public_key_is_sha1(self):
        self.assertEqual(key_schemes.public_key(b"secret"), hashlib.sha1(b"secret").digest())

    def test_producer_scheme(self):
        nfn, sub = key_schemes.producer_keys("s")
        producer = KeyRing.from_wire(nfn, PRODUCER)
        consumer = KeyRing.from_wire(sub, CONSUMER)
        self.assertTrue(producer.matches(consumer))
        # Knowing only the public key does not let a producer match.
        forged = KeyRing.from_wire(sub, PRODUCER)
        self.assertFalse(forged.matches(consumer))

    def test_consumer_scheme(self):
        nfn, sub = key_schemes.consumer_keys("s")
        self.assertTrue(KeyRing.from_wire(nfn, PRODUCER).matches(
            KeyRing.from_wire(sub, CONSUMER)))
        # A consumer holding only the public key cannot receive.
        self.assertFalse(KeyRing.from_wire(nfn, PRODUCER).matches(
            KeyRing.from_wire(nfn, CONSUMER)))

    def test_dual_scheme_needs_both_halves(self):
        nfn, sub = key_schemes.dual_keys("p", "c")
        self.assertTrue(KeyRing.from_wire(nfn, PRODUCER).matches(
            KeyRing.from_wire(sub, CONSUMER)))
        other_nfn, _ = key_schemes.dual_keys("p", "other")
        self.assertFalse(KeyRing.from_wire(other_nfn, PRODUCER).matches(
            KeyRing.from_wire(sub, CONSUMER)))

    def test_different_secrets_do_not_match(self):
        nfn, _ = key_schemes.producer_keys("a")
        _, sub = key_schemes.producer_keys("b")
        self.assertFalse(KeyRing.from_wire(nfn, PRODUCER).matches(
            KeyRing.from_wire(sub, CONSUMER)))

    def test_empty_never_matches(self):
        _, sub = key_schemes.producer_keys("a")
        self.assertFalse(KeyRing.EMPTY.matches(KeyRing.from_wire(sub, CONSUMER)))

    def test_bad_scheme_and_index(self):
        with self.assertRaises(errors.ElvinError) as cm:
            KeyRing.from_wire(packets.Keys({7: [[b"k"]]}), PRODUCER)
        self.assertEqual(cm.exception.code, errors.BAD_KEY_SCHEME)
        with self.assertRaises(errors.ElvinError) as cm:
            KeyRing.from_wire(packets.Keys({key_schemes.SHA1_DUAL: [[b"k"]]}), PRODUCER)
        self.assertEqual(cm.exception.code, errors.BAD_KEY_INDEX)

    def test_bad_key_index_args_name_the_scheme_and_the_bad_index(self):
        """7.4.2's table: BAD_KEY_INDEX args are the scheme and the index of
        the bad key set (the first extra one, or the first missing one),
        not how many there were."""
        dual, producer = key_schemes.SHA1_DUAL, key_schemes.SHA1_PRODUCER
        for scheme, key_sets, index in ((dual, [[b"k"]] * 3, 2), (dual, [[b"k"]], 1),
                                        (dual, [], 0), (producer, [[b"k"]] * 2, 1)):
            for read in (lambda keys: KeyRing.from_wire(keys, PRODUCER),
                         KeyRing.from_prepared_wire):
                with self.assertRaises(errors.ElvinError) as cm:
                    read(packets.Keys({scheme: key_sets}))
                self.assertEqual((cm.exception.code, cm.exception.nack_args),
                                 (errors.BAD_KEY_INDEX, (scheme, index)))

    def test_set_operations(self):
        a = KeyRing.from_wire(key_schemes.producer_keys("a")[0], PRODUCER)
        b = KeyRing.from_wire(key_schemes.producer_keys("b")[0], PRODUCER)
        both = a.union(b)
        self.assertEqual(len(both), 2)
        self.assertTrue(both.contains_all(a))
        self.assertTrue(both.intersects(b))
        self.assertEqual(both.difference(b), a)
        self.assertIn("2 keys", repr(both))
        self.assertNotIn("secret", repr(both))


class KeyedRoutingTests(RouterTestCase):
    def deliveries(self, out):
        return [p for p in out.take() if type(p) is packets.NotifyDeliver]

    def scenario(self, nfn, sub, deliver_insecure=False, accept_insecure=True):
        consumer, out = self.connect()
        consumer.packet_received(packets.SubAddRqst(self.xid(), "require(a)", accept_insecure, sub))
        (rply,) = out.take()
        producer, _ = self.connect()
        producer.packet_received(packets.NotifyEmit({"a": 1}, deliver_insecure, nfn))
        return rply.subscription_id, self.deliveries(out)

    def test_each_scheme_delivers_securely(self):
        for nfn, sub in (key_schemes.producer_keys("x"), key_schemes.consumer_keys("x"), key_schemes.dual_keys("p", "c")):
            sub_id, (d,) = self.scenario(nfn, sub)
            self.assertEqual((d.secure_matches, d.insecure_matches), ((sub_id,), ()))

    def test_wrong_key_is_not_delivered_when_insecure_forbidden(self):
        nfn, _ = key_schemes.producer_keys("x")
        _, sub = key_schemes.producer_keys("y")
        self.assertEqual(self.scenario(nfn, sub)[1], [])

    def test_wrong_key_delivered_insecurely_when_both_allow(self):
        nfn, _ = key_schemes.producer_keys("x")
        _, sub = key_schemes.producer_keys("y")
        sub_id, (d,) = self.scenario(nfn, sub, deliver_insecure=True)
        self.assertEqual((d.secure_matches, d.insecure_matches), ((), (sub_id,)))
        self.assertEqual(self.scenario(nfn, sub, True, accept_insecure=False)[1], [])

    def test_connection_keys(self):
        nfn, sub = key_schemes.consumer_keys("x")
        consumer, out = self.connect()
        consumer.packet_received(packets.SecRqst(self.xid(), packets.Keys.EMPTY, packets.Keys.EMPTY,
                                           sub, packets.Keys.EMPTY))
        self.assertIsInstance(out.take()[0], packets.SecRply)
        consumer.packet_received(packets.SubAddRqst(self.xid(), "require(a)", False, packets.Keys.EMPTY))
        sub_id = out.take()[0].subscription_id
        producer, pout = self.connect()
        producer.packet_received(packets.SecRqst(self.xid(), nfn, packets.Keys.EMPTY,
                                           packets.Keys.EMPTY, packets.Keys.EMPTY))
        pout.take()
        producer.packet_received(packets.NotifyEmit({"a": 1}, False, packets.Keys.EMPTY))
        (d,) = self.deliveries(out)
        self.assertEqual(d.secure_matches, (sub_id,))
        # Removing the producer's key stops secure delivery.
        producer.packet_received(packets.SecRqst(self.xid(), packets.Keys.EMPTY, nfn,
                                           packets.Keys.EMPTY, packets.Keys.EMPTY))
        self.assertIsInstance(pout.take()[0], packets.SecRply)
        producer.packet_received(packets.NotifyEmit({"a": 1}, False, packets.Keys.EMPTY))
        self.assertEqual(self.deliveries(out), [])

    def test_secrqst_duplicate_and_missing_keys(self):
        nfn, _ = key_schemes.producer_keys("x")
        session, out = self.connect()
        session.packet_received(packets.SecRqst(1, nfn, packets.Keys.EMPTY, packets.Keys.EMPTY, packets.Keys.EMPTY))
        self.assertIsInstance(out.take()[0], packets.SecRply)
        session.packet_received(packets.SecRqst(2, nfn, packets.Keys.EMPTY, packets.Keys.EMPTY, packets.Keys.EMPTY))
        self.assertEqual(out.take()[0].error, errors.KEY_EXISTS)
        other, _ = key_schemes.producer_keys("y")
        session.packet_received(packets.SecRqst(3, packets.Keys.EMPTY, other, packets.Keys.EMPTY, packets.Keys.EMPTY))
        self.assertEqual(out.take()[0].error, errors.NO_SUCH_KEY)

    def test_submod_adds_and_removes_keys_silently(self):
        nfn, sub = key_schemes.producer_keys("x")
        consumer, out = self.connect()
        consumer.packet_received(packets.SubAddRqst(1, "require(a)", False, packets.Keys.EMPTY))
        sub_id = out.take()[0].subscription_id
        consumer.packet_received(packets.SubModRqst(2, sub_id, "", False, sub, packets.Keys.EMPTY))
        consumer.packet_received(packets.SubModRqst(3, sub_id, "", False, sub, packets.Keys.EMPTY))
        self.assertEqual([type(p) for p in out.take()], [packets.SubRply, packets.SubRply])
        producer, _ = self.connect()
        producer.packet_received(packets.NotifyEmit({"a": 1}, False, nfn))
        self.assertEqual(len(self.deliveries(out)), 1)
        consumer.packet_received(packets.SubModRqst(4, sub_id, "", False, packets.Keys.EMPTY, sub))
        out.take()
        producer.packet_received(packets.NotifyEmit({"a": 1}, False, nfn))
        self.assertEqual(self.deliveries(out), [])

    def test_subscription_key_limit(self):
        session, out = self.connect({"Subscription.Max-Keys": 1})
        two = packets.Keys({key_schemes.SHA1_PRODUCER: [[b"a", b"b"]]})
        session.packet_received(packets.SubAddRqst(1, "require(a)", True, two))
        (nack,) = out.take()
        self.assertEqual((nack.error, nack.args), (errors.QOS_LIMIT, ("Subscription.Max-Keys",)))

    def test_a_key_limit_nack_names_the_requests_own_limit(self):
        many = packets.Keys({key_schemes.SHA1_PRODUCER: [[bytes([i, j]) for i in range(8)
                                                          for j in range(250)]]})  # 2,000
        session, out = self.connect()
        session.packet_received(packets.SubAddRqst(1, "require(a)", True, many))
        self.assertEqual(out.take()[0].args, ("Subscription.Max-Keys",))
        session, out = self.connect({"Connection.Max-Keys": 10})
        twenty = packets.Keys({key_schemes.SHA1_PRODUCER: [[bytes([i]) for i in range(20)]]})
        session.packet_received(packets.SecRqst(2, add_nfn_keys=twenty))
        self.assertEqual(out.take()[0].args, ("Connection.Max-Keys",))

    def test_connrqst_keys_are_held_to_the_limit_it_asks_for(self):
        keys = packets.Keys({key_schemes.SHA1_PRODUCER: [[bytes([i, j]) for i in range(6)
                                                          for j in range(250)]]})  # 1,500
        out = RecordingOutput()
        session = self.router.open_session(out, "test")
        session.packet_received(packets.ConnRqst(1, 4, 0, {"Connection.Max-Keys": 4096}, keys,
                                                 packets.Keys.EMPTY))
        (reply,) = out.take()
        self.assertIsInstance(reply, packets.ConnRply)

    def test_supported_key_schemes_reported(self):
        out_session, out = self.connect()
        self.assertEqual(out_session.options.as_dict()["Supported-Key-Schemes"], "SHA-1")


class KeysOverTcpTests(RouterFixture):
    @defer.inlineCallbacks
    def test_keyed_delivery_over_tcp(self):
        nfn, sub = key_schemes.producer_keys("launch-codes")
        consumer = yield self.connect()
        producer = yield self.connect()
        eavesdropper = yield self.connect()
        got, spied = [], []
        secure_sub = yield consumer.subscribe("require(msg)", got.append,
                                              accept_insecure=False, keys=sub)
        yield eavesdropper.subscribe("require(msg)", spied.append)
        producer.notify({"msg": "secret"}, deliver_insecure=False, keys=nfn)
        producer.notify({"msg": "public"})
        yield wait_until(lambda: len(got) == 1 and len(spied) == 1)
        yield producer.test_connection()
        self.assertEqual(got[0]["msg"], "secret")
        self.assertEqual(got[0].secure, (secure_sub.id,))
        self.assertEqual(spied[0]["msg"], "public")


class ChangedKeysTests(unittest.TestCase):
    """``clientcore.state.changed_keys``: what a client registers again
    after a SubModRqst/QnchModRqst changed keys, as the router applied it."""

    def test_add_delete_and_dual_sets(self):
        from elvin.clientcore.state import changed_keys
        a = packets.Keys({key_schemes.SHA1_PRODUCER: [[b"a"]]})
        ab = packets.Keys({key_schemes.SHA1_PRODUCER: [[b"a", b"b"]]})
        b = packets.Keys({key_schemes.SHA1_PRODUCER: [[b"b"]]})
        self.assertEqual(changed_keys(a, b, None), ab)
        self.assertEqual(changed_keys(ab, a, a), b)        # added then taken off
        self.assertEqual(changed_keys(a, None, a), packets.Keys.EMPTY)
        self.assertEqual(changed_keys(None, None, a), packets.Keys.EMPTY)   # absent: nothing
        dual = packets.Keys({key_schemes.SHA1_DUAL: [[b"p"], [b"c"]]})
        half = packets.Keys({key_schemes.SHA1_DUAL: [[b"p"], []]})
        self.assertEqual(changed_keys(dual, None, packets.Keys(
            {key_schemes.SHA1_DUAL: [[], [b"c"]]})), half)


class SchemeArgumentTests(RouterTestCase):
    def test_bad_key_scheme_argument_is_an_int32(self):
        """7.4.2: the argument is the scheme id, an id32, carried as int32
        (two's complement past 2**31), not widened to int64."""
        session, out = self.connect()
        odd = packets.Keys({0xFFFFFFFF: [[b"k"]]})
        session.packet_received(packets.SubAddRqst(1, "require(a)", True, odd))
        (nack,) = out.take()
        self.assertEqual(nack.error, errors.BAD_KEY_SCHEME)
        (arg,) = nack.args
        self.assertIs(type(arg), int)
        self.assertEqual(arg, -1)

    def test_an_empty_secret_is_refused_by_the_helpers(self):
        from elvin import keys as client_keys
        for make in (client_keys.producer_keys, client_keys.consumer_keys):
            with self.assertRaises(ValueError):
                make("")
        with self.assertRaises(ValueError):
            client_keys.dual_keys(b"p", b"")


class EmptyKeyTests(RouterTestCase):
    """A key of zero bytes is refused wherever a client sends keys: the
    public key of an empty private key is SHA-1 of nothing, a constant
    anyone can compute, so it secures nothing (Avis ends such sessions)."""

    EMPTY_KEYS = [
        packets.Keys({key_schemes.SHA1_PRODUCER: [[b"k", b""]]}),
        packets.Keys({key_schemes.SHA1_CONSUMER: [[b""]]}),
        packets.Keys({key_schemes.SHA1_DUAL: [[b"p"], [b""]]}),
    ]

    def test_requests_with_an_empty_key_are_nacked_bad_key(self):
        for keys in self.EMPTY_KEYS:
            session, out = self.connect()
            for request in (packets.SubAddRqst(self.xid(), "require(a)", True, keys),
                            packets.SecRqst(self.xid(), keys, packets.Keys.EMPTY,
                                            packets.Keys.EMPTY, packets.Keys.EMPTY),
                            packets.SecRqst(self.xid(), packets.Keys.EMPTY, packets.Keys.EMPTY,
                                            keys, packets.Keys.EMPTY),
                            packets.QnchAddRqst(self.xid(), ("a",), True, keys)):
                session.packet_received(request)
                (nack,) = out.take()
                self.assertEqual((nack.xid, nack.error), (request.xid, errors.BAD_KEY),
                                 request)
            self.assertEqual(session.state, session.CONNECTED)
            out = RecordingOutput()
            fresh = self.router.open_session(out, "test")
            fresh.packet_received(packets.ConnRqst(self.xid(), 4, 0, {}, keys,
                                                   packets.Keys.EMPTY))
            (nack,) = out.take()
            self.assertEqual(nack.error, errors.BAD_KEY)
            self.assertEqual(fresh.state, fresh.NEW)

    def test_a_notification_with_an_empty_key_is_ignored(self):
        sub, sub_out = self.connect()
        self.subscribe(sub, sub_out, "require(a)")
        pub, pub_out = self.connect()
        for keys in self.EMPTY_KEYS:
            pub.packet_received(packets.NotifyEmit({"a": 1}, True, keys))
        self.assertEqual(sub_out.take(), [])
        self.assertEqual(pub_out.take(), [])
        self.assertEqual(self.router.stats["rejected_notifications"], 3)
        self.assertEqual(pub.state, pub.CONNECTED)
