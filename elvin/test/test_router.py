"""Unit tests of the sans-IO router core: packets in, packets out, no reactor."""

from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial import unittest

from elvin import errors
from elvin.protocols import packets as elvin_packets
from elvin.core.router import Router, SessionOutput, subscription_cost
from elvin.values import Int64


class RecordingOutput(SessionOutput):
    """A SessionOutput that keeps what the session sends, decoded."""

    def __init__(self):
        self.sent = []
        self.droppable = []
        self.closed = False
        self.aborted = False
        self.configured = None
        self.idle = True

    def send(self, packet):
        self.sent.append(elvin_packets.decode(elvin_packets.encode(packet)))
        self.droppable.append(False)

    def send_encoded(self, data, droppable):
        self.sent.append(elvin_packets.decode(data))
        self.droppable.append(droppable)

    def is_idle(self):
        return self.idle

    def configure(self, options):
        self.configured = options

    def close(self):
        self.closed = True

    def abort(self):
        self.aborted = True

    def take(self):
        sent, self.sent = self.sent, []
        return sent


class RouterTestCase(unittest.TestCase):
    def setUp(self):
        self.router = Router()
        self._xid = 0

    def xid(self):
        self._xid += 1
        return self._xid

    def connect(self, options=None):
        out = RecordingOutput()
        session = self.router.open_session(out, "test")
        session.packet_received(elvin_packets.ConnRqst(self.xid(), 4, 0, options or {},
                                           elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        (reply,) = out.take()
        self.assertIsInstance(reply, elvin_packets.ConnRply)
        return session, out

    def subscribe(self, session, out, expression, accept_insecure=True):
        session.packet_received(elvin_packets.SubAddRqst(self.xid(), expression, accept_insecure,
                                             elvin_packets.Keys.EMPTY))
        (reply,) = out.take()
        return reply

    def emit(self, session, attributes, deliver_insecure=True):
        session.packet_received(elvin_packets.NotifyEmit(attributes, deliver_insecure, elvin_packets.Keys.EMPTY))


class ConnectTests(RouterTestCase):
    def test_connrply_answers_every_understood_option(self):
        out = RecordingOutput()
        session = self.router.open_session(out)
        session.packet_received(elvin_packets.ConnRqst(7, 4, 0, {
            "Subscription.Max-Count": 50,
            "router.attribute.max-count": 100,
            "Unknown.Option": 3,
            "Attribute.Name.Max-Length": 10,     # below the minimum: offered 64
            "Send-Queue.Drop-Policy": "bogus",   # not a policy: offered the default
        }, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        (reply,) = out.take()
        self.assertEqual(reply.xid, 7)
        self.assertEqual(reply.options["Subscription.Max-Count"], 50)
        self.assertEqual(reply.options["router.attribute.max-count"], 100)
        self.assertNotIn("Unknown.Option", reply.options)
        self.assertEqual(reply.options["Attribute.Name.Max-Length"], 64)
        self.assertEqual(reply.options["Send-Queue.Drop-Policy"], "oldest")
        self.assertIn("Vendor-Identification", reply.options)
        self.assertIn("Supported-Key-Schemes", reply.options)
        self.assertEqual(session.options["Subscription.Max-Count"], 50)
        self.assertIs(out.configured, session.options)

    def test_standard_and_legacy_name_are_one_option(self):
        """A ConnRqst naming an option and its legacy alias (7.5.3) with
        different values: one value is decided (the standard name's, in
        whichever order they came, as Avis does), enforced, and reported
        under both names."""
        for options in ({"Packet.Max-Length": 8192, "router.packet.max-length": 4096},
                        {"router.packet.max-length": 4096, "Packet.Max-Length": 8192}):
            out = RecordingOutput()
            session = self.router.open_session(out)
            session.packet_received(elvin_packets.ConnRqst(
                1, 4, 0, options, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
            (reply,) = out.take()
            self.assertEqual(reply.options["Packet.Max-Length"], 8192)
            self.assertEqual(reply.options["router.packet.max-length"], 8192)
            self.assertEqual(out.configured["Packet.Max-Length"], 8192)

    def test_legacy_name_counts_where_the_standard_value_is_not_acceptable(self):
        """As Avis: a standard value out of range or of the wrong type gives
        way to an acceptable legacy one; the inverted coalesce-delay is
        reported inverted."""
        session, out = self.connect({"Packet.Max-Length": 100,
                                     "router.packet.max-length": 8192,
                                     "Send-Queue.Drop-Policy": "bogus",
                                     "router.send-queue.drop-policy": "newest",
                                     "TCP.Send-Immediately": 0,
                                     "router.coalesce-delay": 0})
        session.packet_received(elvin_packets.QosRqst(self.xid(), {
            "Subscription.Max-Count": 30, "router.subscription.max-count": 20}))
        (qos,) = out.take()
        self.assertEqual((session.options["Packet.Max-Length"],
                          session.options["Send-Queue.Drop-Policy"],
                          session.options["TCP.Send-Immediately"],
                          session.options["Subscription.Max-Count"]), (8192, "newest", 0, 30))
        self.assertEqual(qos.options["router.subscription.max-count"], 30)

    def test_repeated_option_name_takes_the_last_value(self):
        """ConnRqst with an option named twice: answered (as Avis does; the
        spec is silent and 7.3.3 says keep the connection), the last value
        in force."""
        data = elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0, {"Subscription.Max-Count": 10}))
        head, option = data[:16], data[20:-8]
        twice = head + b"\0\0\0\2" + option + option.replace(b"\0\0\0\x0a", b"\0\0\0\x14") \
            + data[-8:]
        packet = elvin_packets.decode(twice)
        out = RecordingOutput()
        session = self.router.open_session(out)
        session.packet_received(packet)
        (reply,) = out.take()
        self.assertEqual(reply.options["Subscription.Max-Count"], 20)
        self.assertEqual(session.options["Subscription.Max-Count"], 20)

    def test_wrong_major_version_is_nacked(self):
        out = RecordingOutput()
        session = self.router.open_session(out)
        session.packet_received(elvin_packets.ConnRqst(3, 5, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        (nack,) = out.take()
        self.assertIsInstance(nack, elvin_packets.Nack)
        self.assertEqual((nack.xid, nack.error), (3, errors.PROT_INCOMPAT))

    def test_later_minor_version_is_served_in_4_0(self):
        """4.1 (what the cobaro/elvin Go tools announce) is a compatible
        revision: the client is connected, and the version logged once."""
        events = []
        observer = events.append
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        out = RecordingOutput()
        session = self.router.open_session(out)
        session.packet_received(elvin_packets.ConnRqst(3, 4, 1, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        (reply,) = out.take()
        self.assertIsInstance(reply, elvin_packets.ConnRply)
        session.packet_received(elvin_packets.SubAddRqst(4, "require(a)", True, elvin_packets.Keys.EMPTY))
        self.assertIsInstance(out.take()[0], elvin_packets.SubRply)
        announced = [e for e in events if "announced" in e.get("log_format", "")]
        self.assertEqual(len(announced), 1)
        self.assertEqual(announced[0]["log_level"], LogLevel.debug)
        self.assertEqual((announced[0]["major"], announced[0]["minor"]), (4, 1))

    def test_any_minor_version_of_4_is_accepted(self):
        for minor in (0, 1, 9, 255):
            out = RecordingOutput()
            session = self.router.open_session(out)
            session.packet_received(elvin_packets.ConnRqst(3, 4, minor, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
            self.assertIsInstance(out.take()[0], elvin_packets.ConnRply, minor)

    def test_other_majors_are_nacked(self):
        for major in (0, 3, 5, 255):
            out = RecordingOutput()
            session = self.router.open_session(out)
            session.packet_received(elvin_packets.ConnRqst(3, major, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
            (nack,) = out.take()
            self.assertEqual(nack.error, errors.PROT_INCOMPAT, major)

    def test_packet_before_connect_is_a_violation(self):
        out = RecordingOutput()
        session = self.router.open_session(out)
        session.packet_received(elvin_packets.SubAddRqst(1, "x == 1", True, elvin_packets.Keys.EMPTY))
        self.assertTrue(out.aborted)
        self.assertEqual(out.take(), [])

    def test_second_connrqst_is_a_violation(self):
        session, out = self.connect()
        session.packet_received(elvin_packets.ConnRqst(9, 4, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertTrue(out.aborted)

    def test_reply_packet_from_client_is_a_violation(self):
        session, out = self.connect()
        session.packet_received(elvin_packets.SubRply(1, 1))
        self.assertTrue(out.aborted)
        (disconn,) = out.take()
        self.assertEqual((disconn.reason, disconn.args),
                         (4, "protocol violation: unexpected SubRply packet from client"))

    def test_undecodable_packet_is_a_violation(self):
        session, out = self.connect()
        session.decode_failed("bad")
        self.assertTrue(out.aborted)
        self.assertNotIn(session, self.router.sessions)

    def test_unknown_key_scheme_is_nacked(self):
        out = RecordingOutput()
        session = self.router.open_session(out)
        keys = elvin_packets.Keys({99: [[b"k"]]})
        session.packet_received(elvin_packets.ConnRqst(2, 4, 0, {}, keys, elvin_packets.Keys.EMPTY))
        (nack,) = out.take()
        self.assertEqual(nack.error, errors.BAD_KEY_SCHEME)

    def test_disconnect_request(self):
        session, out = self.connect()
        self.subscribe(session, out, "x == 1")
        session.packet_received(elvin_packets.DisconnRqst(44))
        (reply,) = out.take()
        self.assertEqual(reply, elvin_packets.DisconnRply(44))
        self.assertTrue(out.closed)
        self.assertEqual(len(self.router.index), 0)
        self.assertNotIn(session, self.router.sessions)

    def test_test_conn_gets_conf_conn_when_idle(self):
        session, out = self.connect()
        session.packet_received(elvin_packets.TestConn())
        self.assertEqual(out.take(), [elvin_packets.ConfConn()])

    def test_test_conn_not_answered_when_packets_are_waiting(self):
        session, out = self.connect()
        out.idle = False
        session.packet_received(elvin_packets.TestConn())
        self.assertEqual(out.take(), [])

    def test_shutdown_sends_disconn(self):
        s1, out1 = self.connect()
        s2, out2 = self.connect()
        self.router.shutdown()
        for out in (out1, out2):
            (packet,) = out.take()
            self.assertIsInstance(packet, elvin_packets.Disconn)
            self.assertEqual(packet.reason, 1)
            self.assertTrue(out.closed)
        self.assertEqual(self.router.sessions, set())

    def test_connect_refused_while_shutting_down(self):
        self.router.shutdown()
        out = RecordingOutput()
        session = self.router.open_session(out)
        session.packet_received(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertIsInstance(out.take()[0], elvin_packets.Nack)
        self.assertTrue(out.closed)

    def test_max_connections(self):
        self.router.max_connections = 1
        self.connect()
        out = RecordingOutput()
        session = self.router.open_session(out)
        session.packet_received(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertEqual(out.take()[0].error, errors.IMPL_LIMIT)

    def test_qos_renegotiates(self):
        session, out = self.connect()
        session.packet_received(elvin_packets.QosRqst(5, {"Subscription.Max-Count": 20}))
        (reply,) = out.take()
        self.assertIsInstance(reply, elvin_packets.QosRply)
        self.assertEqual(reply.options["Subscription.Max-Count"], 20)
        self.assertEqual(session.options["Subscription.Max-Count"], 20)

    def test_quench_is_answered(self):
        session, out = self.connect()
        session.packet_received(elvin_packets.QnchAddRqst(5, ("x",), True, elvin_packets.Keys.EMPTY))
        (reply,) = out.take()
        self.assertIsInstance(reply, elvin_packets.QnchRply)


class SubscriptionTests(RouterTestCase):
    def test_add_modify_delete(self):
        session, out = self.connect()
        reply = self.subscribe(session, out, 'Group == "chat"')
        self.assertIsInstance(reply, elvin_packets.SubRply)
        sub_id = reply.subscription_id
        self.assertNotEqual(sub_id, 0)
        self.emit(session, {"Group": "chat"})
        (deliver,) = out.take()
        self.assertEqual(deliver.insecure_matches, (sub_id,))
        session.packet_received(elvin_packets.SubModRqst(8, sub_id, 'Group == "news"', True,
                                             elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertEqual(out.take(), [elvin_packets.SubRply(8, sub_id)])
        self.emit(session, {"Group": "chat"})
        self.assertEqual(out.take(), [])
        self.emit(session, {"Group": "news"})
        self.assertEqual(len(out.take()), 1)
        session.packet_received(elvin_packets.SubDelRqst(9, sub_id))
        self.assertEqual(out.take(), [elvin_packets.SubRply(9, sub_id)])
        self.emit(session, {"Group": "news"})
        self.assertEqual(out.take(), [])

    def test_parse_error_nack_carries_code_and_args(self):
        session, out = self.connect()
        nack = self.subscribe(session, out, 'x == "abc')
        self.assertIsInstance(nack, elvin_packets.Nack)
        self.assertEqual(nack.error, errors.UNTERM_STRING)
        self.assertEqual(nack.args, (5,))
        nack = self.subscribe(session, out, "foo(x)")
        self.assertEqual(nack.error, errors.UNKNOWN_FUNC)
        self.assertEqual(nack.args, (0, "foo"))
        nack = self.subscribe(session, out, "1 == 1")
        self.assertEqual((nack.error, nack.args), (errors.EXP_IS_TRIVIAL, ()))

    def test_modify_with_bad_expression_keeps_old(self):
        session, out = self.connect()
        sub_id = self.subscribe(session, out, "x == 1").subscription_id
        session.packet_received(elvin_packets.SubModRqst(3, sub_id, "x ==", True,
                                             elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertEqual(out.take()[0].error, errors.PARSE_ERROR)
        self.emit(session, {"x": 1})
        self.assertEqual(len(out.take()), 1)

    def test_modify_empty_expression_changes_only_insecure_flag(self):
        session, out = self.connect()
        sub_id = self.subscribe(session, out, "x == 1").subscription_id
        session.packet_received(elvin_packets.SubModRqst(3, sub_id, "", False,
                                             elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertEqual(out.take(), [elvin_packets.SubRply(3, sub_id)])
        self.emit(session, {"x": 1})
        self.assertEqual(out.take(), [])  # no keys, and insecure not accepted

    def test_no_such_subscription(self):
        session, out = self.connect()
        session.packet_received(elvin_packets.SubDelRqst(4, 12345))
        (nack,) = out.take()
        self.assertEqual(nack.error, errors.NO_SUCH_SUB)
        self.assertEqual(nack.args, (Int64(12345),))
        session.packet_received(elvin_packets.SubModRqst(5, 12345, "x == 1", True,
                                             elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertEqual(out.take()[0].error, errors.NO_SUCH_SUB)

    def test_cannot_touch_another_clients_subscription(self):
        s1, out1 = self.connect()
        s2, out2 = self.connect()
        sub_id = self.subscribe(s1, out1, "x == 1").subscription_id
        s2.packet_received(elvin_packets.SubDelRqst(4, sub_id))
        self.assertEqual(out2.take()[0].error, errors.NO_SUCH_SUB)

    def test_subscription_max_count(self):
        session, out = self.connect({"Subscription.Max-Count": 16})
        for i in range(16):
            self.assertIsInstance(self.subscribe(session, out, f"x == {i}"), elvin_packets.SubRply)
        nack = self.subscribe(session, out, "x == 99")
        self.assertEqual(nack.error, errors.QOS_LIMIT)
        self.assertEqual(nack.args, ("Subscription.Max-Count",))

    def test_subscription_max_length(self):
        session, out = self.connect({"Subscription.Max-Length": 1024})
        nack = self.subscribe(session, out, "x == " + "1 + " * 300 + "1")
        self.assertEqual(nack.error, errors.QOS_LIMIT)
        self.assertEqual(nack.args, ("Subscription.Max-Length",))

    def test_router_wide_subscription_cap(self):
        self.router.max_subscriptions = 2
        session, out = self.connect()
        self.subscribe(session, out, "x == 1")
        self.subscribe(session, out, "x == 2")
        self.assertEqual(self.subscribe(session, out, "x == 3").error, errors.IMPL_LIMIT)

    def test_connection_lost_removes_subscriptions(self):
        session, out = self.connect()
        self.subscribe(session, out, "x == 1")
        session.connection_lost()
        self.assertEqual(len(self.router.index), 0)
        self.assertEqual(self.router.subscriptions, {})

    def test_repeated_protocol_errors_disconnect(self):
        """50 protocol errors (1xxx) within 10 s: Disconn reason 4."""
        session, out = self.connect()
        for i in range(49):
            session.packet_received(elvin_packets.SubDelRqst(i + 1, 999))
        self.assertFalse(out.closed)
        session.packet_received(elvin_packets.SubDelRqst(50, 999))
        packets = out.take()
        self.assertEqual([p.error for p in packets[:-1]], [errors.NO_SUCH_SUB] * 50)
        self.assertIsInstance(packets[-1], elvin_packets.Disconn)
        self.assertEqual(packets[-1].reason, 4)
        self.assertTrue(out.closed)

    def test_xid_zero_is_a_protocol_error(self):
        """Zero is a reserved xid (7.4): a request using it, before ConnRqst
        or after, is Nacked 1001 (PROT_ERROR, answering xid 0) and not
        carried out; it counts toward max-protocol-errors."""
        out = RecordingOutput()
        session = self.router.open_session(out, "test")
        session.packet_received(elvin_packets.ConnRqst(0, 4, 0, {}, elvin_packets.Keys.EMPTY,
                                                       elvin_packets.Keys.EMPTY))
        (nack,) = out.take()
        self.assertEqual((type(nack), nack.xid, nack.error),
                         (elvin_packets.Nack, 0, errors.PROT_ERROR))
        self.assertIn("xid 0", nack.message)
        self.assertEqual(session.state, session.NEW)
        session, out = self.connect()
        session.packet_received(elvin_packets.SubAddRqst(0, "require(a)", True,
                                                         elvin_packets.Keys.EMPTY))
        (nack,) = out.take()
        self.assertEqual((type(nack), nack.xid, nack.error),
                         (elvin_packets.Nack, 0, errors.PROT_ERROR))
        self.assertEqual(session.subscriptions, {})
        self.assertEqual(len(session.protocol_errors), 1)
        self.assertIsInstance(self.subscribe(session, out, "require(a)"), elvin_packets.SubRply)

    def test_refused_requests_never_disconnect(self):
        """A long-lived client relaying user-typed subscriptions collects
        2xxx Nacks without end and keeps its session."""
        session, out = self.connect()
        for i in range(1000):
            session.packet_received(elvin_packets.SubAddRqst(i + 1, "x ==", True, elvin_packets.Keys.EMPTY))
        packets = out.take()
        self.assertEqual({p.error for p in packets}, {errors.PARSE_ERROR})
        self.assertEqual(len(packets), 1000)
        self.assertFalse(out.closed)
        self.assertIsInstance(self.subscribe(session, out, "require(a)"), elvin_packets.SubRply)

    def test_protocol_errors_count_as_a_rate(self):
        """Errors spread wider than the window never add up to a Disconn."""
        now = [0.0]
        self.router = Router(clock=lambda: now[0], max_protocol_errors=5,
                             protocol_error_window=10.0)
        session, out = self.connect()
        for i in range(100):
            now[0] += 2.6  # 5 errors span 10.4 s > the window
            session.packet_received(elvin_packets.SubDelRqst(i + 1, 999))
        self.assertFalse(out.closed)
        self.assertEqual(len(out.take()), 100)
        for i in range(4):
            now[0] += 2.4  # now 5 fall within 9.6 s (the last slow one included)
            session.packet_received(elvin_packets.SubDelRqst(200 + i, 999))
        self.assertIsInstance(out.take()[-1], elvin_packets.Disconn)
        self.assertTrue(out.closed)

    def test_zero_max_protocol_errors_never_disconnects(self):
        self.router = Router(max_protocol_errors=0)
        session, out = self.connect()
        for i in range(200):
            session.packet_received(elvin_packets.SubDelRqst(i + 1, 999))
        self.assertFalse(out.closed)


class RoutingTests(RouterTestCase):
    def test_one_delivery_per_client_with_all_matching_ids(self):
        s1, out1 = self.connect()
        s2, out2 = self.connect()
        a = self.subscribe(s1, out1, "x > 1").subscription_id
        b = self.subscribe(s1, out1, "x > 2").subscription_id
        self.subscribe(s1, out1, "x > 100")
        c = self.subscribe(s2, out2, "require(x)").subscription_id
        publisher, pout = self.connect()
        self.emit(publisher, {"x": 5, "y": "text"})
        (d1,) = out1.take()
        self.assertEqual(sorted(d1.insecure_matches), sorted([a, b]))
        self.assertEqual(d1.secure_matches, ())
        self.assertEqual(d1.attributes, {"x": 5, "y": "text"})
        (d2,) = out2.take()
        self.assertEqual(d2.insecure_matches, (c,))
        self.assertEqual(pout.take(), [])
        self.assertEqual(out1.droppable, [False] * 4 + [True])  # ConnRply, 3 SubRply

    def test_string_function_subjects_of_equals_route(self):
        """equals() over fold-case, as presence clients subscribe, many
        subscriptions of one shape (shared compiled form and index) and
        one long presence expression: each delivery goes exactly where
        its expression says."""
        consumer, out = self.connect()
        ids = {}
        for i in range(300):
            reply = self.subscribe(consumer, out, f'equals(fold-case(User), "user{i}", "alias{i}")')
            self.assertIsInstance(reply, elvin_packets.SubRply)
            ids[i] = reply.subscription_id
        presence = self.subscribe(
            consumer, out,
            "Presence-Protocol < 2000 && string(Groups) && equals(Presence-Info, 'initial', "
            "'update') && (contains(fold-case(Groups), \"|elvin|\", \"|dev|\") || "
            "equals(fold-case(User), \"ann@home\"))")
        self.assertIsInstance(presence, elvin_packets.SubRply)
        publisher, _ = self.connect()
        self.emit(publisher, {"User": "USER7"})
        self.emit(publisher, {"User": "Alias250"})
        self.emit(publisher, {"User": "ANN@home", "Presence-Protocol": 1000,
                              "Presence-Info": "initial", "Groups": "|Ops|"})
        self.emit(publisher, {"User": "nobody", "Presence-Protocol": 1000,
                              "Presence-Info": "update", "Groups": "|Dev|"})
        self.emit(publisher, {"User": 7})
        matched = [sorted(d.insecure_matches) for d in out.take()]
        self.assertEqual(matched, [[ids[7]], [ids[250]], [presence.subscription_id],
                                   [presence.subscription_id]])

    def test_types_survive_delivery(self):
        session, out = self.connect()
        self.subscribe(session, out, "require(a)")
        attrs = {"a": 1, "b": Int64(2), "c": 2.5, "d": "s", "e": b"\x00\x01"}
        self.emit(session, attrs)
        (deliver,) = out.take()
        self.assertEqual(deliver.attributes, attrs)
        self.assertIs(type(deliver.attributes["b"]), Int64)

    def test_deliver_insecure_false_without_keys_reaches_nobody(self):
        session, out = self.connect()
        self.subscribe(session, out, "require(a)")
        self.emit(session, {"a": 1}, deliver_insecure=False)
        self.assertEqual(out.take(), [])

    def test_notification_over_attribute_limit_is_ignored(self):
        session, out = self.connect({"Attribute.Max-Count": 16})
        self.subscribe(session, out, "require(a0)")
        self.emit(session, {f"a{i}": i for i in range(17)})
        self.assertEqual(out.take(), [])
        self.assertEqual(self.router.stats["rejected_notifications"], 1)
        self.emit(session, {f"a{i}": i for i in range(16)})
        self.assertEqual(len(out.take()), 1)

    def test_string_length_limit(self):
        session, out = self.connect({"Attribute.String.Max-Length": 1024})
        self.subscribe(session, out, "require(a)")
        self.emit(session, {"a": "é" * 600})  # 1200 bytes of UTF-8
        self.assertEqual(out.take(), [])
        self.emit(session, {"a": "e" * 1000})
        self.assertEqual(len(out.take()), 1)

    def test_limits_by_size_follow_negotiation(self):
        # A packet no longer than the smallest length limit is checked by
        # its count alone; the limits are the ones negotiated last.
        from elvin.core.options import ConnectionOptions
        from elvin.core.router import notification_problem
        options = ConnectionOptions()
        small = {f"a{i}": i for i in range(16)}
        self.assertIsNone(notification_problem(options, {**small, "x": 1}, 200))
        options.negotiate({"Attribute.Max-Count": 16, "Attribute.String.Max-Length": 1024})
        self.assertIsNone(notification_problem(options, small, 200))
        self.assertIn("Attribute.Max-Count", notification_problem(options, {**small, "x": 1}, 200))
        self.assertIsNone(notification_problem(options, {"a": "e" * 1000}, 1020))
        self.assertIn("Attribute.String.Max-Length",
                      notification_problem(options, {"a": "e" * 1100}, 1120))
        self.assertEqual(notification_problem(options, {}, 8),
                         "a notification needs at least one attribute")

    def test_empty_notification_is_ignored(self):
        session, out = self.connect()
        self.subscribe(session, out, "require(a)")
        self.emit(session, {})
        self.assertEqual(out.take(), [])

    def test_unotify(self):
        consumer, out = self.connect()
        self.subscribe(consumer, out, "require(a)")
        producer_out = RecordingOutput()
        producer = self.router.open_session(producer_out)
        producer.packet_received(elvin_packets.UNotify(4, 0, {"a": 1}, True, elvin_packets.Keys.EMPTY))
        producer.packet_received(elvin_packets.UNotify(4, 0, {"a": 2}, True, elvin_packets.Keys.EMPTY))
        producer.packet_received(elvin_packets.UNotify(3, 0, {"a": 3}, True, elvin_packets.Keys.EMPTY))
        producer.packet_received(elvin_packets.UNotify(4, 1, {"a": 4}, True, elvin_packets.Keys.EMPTY))
        producer.packet_received(elvin_packets.UNotify(5, 0, {"a": 5}, True, elvin_packets.Keys.EMPTY))
        self.assertEqual([d.attributes["a"] for d in out.take()], [1, 2, 4])
        self.assertEqual(producer_out.take(), [])
        producer.packet_received(elvin_packets.NotifyEmit({"a": 1}, True, elvin_packets.Keys.EMPTY))
        self.assertTrue(producer_out.aborted)

    def test_no_delivery_after_disconnect_request(self):
        session, out = self.connect()
        self.subscribe(session, out, "require(a)")
        session.packet_received(elvin_packets.DisconnRqst(1))
        out.take()
        other, _ = self.connect()
        self.emit(other, {"a": 1})
        self.assertEqual(out.take(), [])


class SessionEndLogTests(RouterTestCase):
    """Every connected session's end is logged once, with its cause."""

    def setUp(self):
        super().setUp()
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def ends(self):
        from twisted.logger import formatEvent
        return [formatEvent(e) for e in self.events
                if "disconnected:" in e.get("log_format", "")]

    def test_causes(self):
        cases = []
        s, out = self.connect()
        s.connection_lost("client closed the connection")
        cases.append("client closed the connection")
        s, out = self.connect()
        s.packet_received(elvin_packets.DisconnRqst(self.xid()))
        s.connection_lost("client closed the connection")
        cases.append("client closed the session (DisconnRqst)")
        s, out = self.connect()
        s.packet_received(elvin_packets.ConnRqst(self.xid(), 4, 0, {}, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        s.connection_lost("connection lost: reset")
        cases.append("protocol violation: ConnRqst on an established session")
        s, out = self.connect()
        for i in range(50):
            s.packet_received(elvin_packets.SubDelRqst(self.xid(), 999))
        s.connection_lost("client closed the connection")
        cases.append("too many protocol errors; 49 more rejected requests not logged")
        s, out = self.connect()
        s.connection_lost("connection lost: Connection reset by peer")
        cases.append("connection lost: Connection reset by peer")
        s, out = self.connect()
        self.router.shutdown()
        s.connection_lost("client closed the connection")
        cases.append("router shutdown")
        ends = self.ends()
        self.assertEqual(len(ends), len(cases), ends)
        for line, cause in zip(ends, cases):
            self.assertTrue(line.startswith("client at test disconnected: "), line)
            self.assertTrue(line.endswith(cause), (line, cause))

    def test_refusals_are_logged_at_most_once_per_10_s(self):
        """A client pipelining refused requests gets every Nack, and the
        log a line per 10 s saying how many it did not log."""
        now = [0.0]
        self.router = Router(clock=lambda: now[0])
        s, out = self.connect({"Subscription.Max-Count": 1})
        limit = s.options["Subscription.Max-Count"]
        for n in range(limit):
            self.subscribe(s, out, f"a == {n}")
        for _ in range(1000):
            s.packet_received(elvin_packets.SubAddRqst(self.xid(), "require(b)", True,
                                                       elvin_packets.Keys.EMPTY))
        nacks = [p for p in out.take() if type(p) is elvin_packets.Nack]
        self.assertEqual(len(nacks), 1000)
        self.assertEqual(self.router.nacks[errors.QOS_LIMIT], 1000)
        self.assertEqual(s.state, s.CONNECTED)      # 2xxx: not protocol errors
        rejected = lambda: [l for l in self.formatted() if l.startswith("rejected request")]
        (first,) = rejected()
        self.assertEqual(first, "rejected request from test: client already has "
                                f"Subscription.Max-Count ({limit}) subscriptions")
        now[0] = 10.0
        s.packet_received(elvin_packets.SubDelRqst(self.xid(), 999))
        self.assertEqual(rejected()[1], "rejected request from test: no such subscription: "
                                        "999 (999 more in the last 10 s not logged)")
        for _ in range(5):
            s.packet_received(elvin_packets.SubDelRqst(self.xid(), 999))
        self.assertEqual(len(rejected()), 2)
        s.connection_lost("client closed the connection")
        self.assertEqual(self.ends(), ["client at test disconnected: client closed the "
                                       "connection; 5 more rejected requests not logged"])

    def test_refused_protocol_versions_are_rate_limited(self):
        now = [0.0]
        self.router = Router(clock=lambda: now[0])
        out = RecordingOutput()
        s = self.router.open_session(out, "test")
        for _ in range(100):
            s.packet_received(elvin_packets.ConnRqst(self.xid(), 5, 0, {}, elvin_packets.Keys.EMPTY,
                                                     elvin_packets.Keys.EMPTY))
        self.assertEqual(len(out.take()), 100)
        self.assertEqual([l for l in self.formatted() if l.startswith("refused test")],
                         ["refused test: protocol 5.0"])

    def formatted(self):
        from twisted.logger import formatEvent
        return [formatEvent(e) for e in self.events]

    def test_logged_once(self):
        s, out = self.connect()
        s.connection_lost("client closed the connection")
        s.connection_lost("client closed the connection")
        self.assertEqual(len(self.ends()), 1)


class SubscriptionBudgetTests(RouterTestCase):
    """What one client may make the router hold or do for one request;
    another client is served the same either way."""

    def test_too_many_tokens_refused_before_parsing(self):
        self.router.max_subscription_tokens = 100
        session, out = self.connect()
        # 104 tokens, and a syntax error at the end: the budget answers
        # first, so no parse was tried.
        expression = " || ".join(["a == 1"] * 26) + " ||"
        reply = self.subscribe(session, out, expression)
        self.assertIsInstance(reply, elvin_packets.Nack)
        self.assertEqual(reply.error, errors.IMPL_LIMIT)
        self.assertIn("more than 100 tokens", reply.message)
        self.assertIn("max-subscription-tokens", reply.message)
        # Within the budget (99 tokens): parsed as usual.
        reply = self.subscribe(session, out, " || ".join(["a == 1"] * 25))
        self.assertIsInstance(reply, elvin_packets.SubRply)
        bystander, bystander_out = self.connect()
        self.assertIsInstance(self.subscribe(bystander, bystander_out, "a == 2"), elvin_packets.SubRply)

    def test_token_budget_off(self):
        self.router.max_subscription_tokens = 0
        session, out = self.connect({"Subscription.Max-Length": 65536})
        expression = " || ".join(f"a == {i}" for i in range(5000))
        self.assertIsInstance(self.subscribe(session, out, expression), elvin_packets.SubRply)

    def test_lexical_error_past_the_budget_is_a_parse_error(self):
        """Only whole tokens count: a bad token is the parser's to report."""
        self.router.max_subscription_tokens = 2
        session, out = self.connect()
        reply = self.subscribe(session, out, "a == 'unterminated")
        self.assertEqual(reply.error, errors.UNTERM_STRING)

    def test_client_expression_bytes(self):
        self.router.max_client_subscription_bytes = 40
        session, out = self.connect()
        first = self.subscribe(session, out, "a == 'x'" + " " * 12)     # 20 bytes
        self.assertIsInstance(first, elvin_packets.SubRply)
        self.assertIsInstance(self.subscribe(session, out, "b == 'é'" + " " * 11), elvin_packets.SubRply)
        self.assertEqual(session.subscription_bytes, 40)
        reply = self.subscribe(session, out, "c == 1")
        self.assertEqual(reply.error, errors.IMPL_LIMIT)
        self.assertIn("more than 40 bytes", reply.message)
        self.assertIn("max-client-subscription-bytes", reply.message)
        # Another client has its own allowance.
        other, other_out = self.connect()
        self.assertIsInstance(self.subscribe(other, other_out, "c == 1"), elvin_packets.SubRply)
        # A modification counts the difference; deleting frees the bytes.
        session.packet_received(elvin_packets.SubModRqst(self.xid(), first.subscription_id, "a == 'y'",
                                             True, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertIsInstance(out.take()[0], elvin_packets.SubRply)
        self.assertEqual(session.subscription_bytes, 28)
        session.packet_received(elvin_packets.SubModRqst(self.xid(), first.subscription_id,
                                             "a == 'y'" + " " * 30, True,
                                             elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertEqual(out.take()[0].error, errors.IMPL_LIMIT)
        session.packet_received(elvin_packets.SubDelRqst(self.xid(), first.subscription_id))
        self.assertIsInstance(out.take()[0], elvin_packets.SubRply)
        self.assertEqual(session.subscription_bytes, 20)
        self.assertIsInstance(self.subscribe(session, out, "c == 1"), elvin_packets.SubRply)

    def test_compiled_expressions_freed_with_their_last_subscription(self):
        import gc
        from elvin.core import router as router_module
        expression = "weakly_cached == 'x'"
        session, out = self.connect()
        other, other_out = self.connect()
        first = self.subscribe(session, out, expression)
        self.subscribe(other, other_out, expression)
        self.assertIs(router_module.compile_expression(expression),
                      router_module._compiled[expression])
        session.packet_received(elvin_packets.SubDelRqst(self.xid(), first.subscription_id))
        gc.collect()
        self.assertIn(expression, router_module._compiled)     # still subscribed
        other.connection_lost()
        gc.collect()
        self.assertNotIn(expression, router_module._compiled)


class PatternWorkBudgetTests(RouterTestCase):
    """``max-pattern-work``: what one client's string tests may cost on one
    notification; past it they are not run, the client gets a DropWarn,
    and another client's same subscription is evaluated as usual."""

    def setUp(self):
        super().setUp()
        from elvin.subscription import patterns
        # RE2 program instructions of regex "x": the work of one test is
        # this times the string's length.
        self.weight = patterns.weighed_regexes(["x"])[1]
        self.router.max_pattern_work = self.weight * 100

    def test_over_the_budget_not_run_dropwarn_bystander_served(self):
        self.router.max_pattern_work = self.weight * 150
        attacker, attacker_out = self.connect()
        bystander, bystander_out = self.connect()
        for pattern in ("x", "z"):
            self.subscribe(attacker, attacker_out, f'regex(s, "{pattern}")')
        self.subscribe(bystander, bystander_out, 'regex(s, "z")')
        self.subscribe(bystander, bystander_out, 's == "y" || size(s) > 0')
        long = "y" * 100 + "z"          # 101 bytes: one test fits in 150, two do not
        self.emit(bystander, {"s": long})
        # Its "x" test ran (no match); its "z" test, which would have
        # matched, did not: a DropWarn says something may be missing.
        (warned,) = attacker_out.take()
        self.assertIsInstance(warned, elvin_packets.DropWarn)
        (delivered,) = bystander_out.take()
        self.assertEqual(len(delivered.insecure_matches), 2)
        self.assertEqual(self.router.stats["pattern_work_refusals"], 1)
        self.assertEqual(attacker.unevaluated, 1)
        self.assertEqual(bystander.unevaluated, 0)
        # Within the budget: matched as usual; each notification has its own.
        for _ in range(3):
            self.emit(bystander, {"s": "y" * 70 + "z"})
            (delivered,) = attacker_out.take()
            self.assertIsInstance(delivered, elvin_packets.NotifyDeliver)
        self.assertEqual(self.router.stats["pattern_work_refusals"], 1)

    def test_one_clients_subscriptions_share_its_budget(self):
        client, out = self.connect()
        for pattern in "xyz":
            self.subscribe(client, out, f'regex(s, "{pattern}")')
        self.emit(client, {"s": "xyz" + "-" * 37})      # 40 bytes: two tests fit
        (warned, delivered) = out.take()
        self.assertIsInstance(warned, elvin_packets.DropWarn)
        self.assertEqual(len(delivered.insecure_matches), 2)
        self.assertEqual(client.unevaluated, 1)    # once per notification

    def test_refused_test_is_bottom_under_not(self):
        client, out = self.connect()
        self.subscribe(client, out, '!regex(s, "x")')
        self.emit(client, {"s": "y" * 200})
        self.assertEqual([type(p) for p in out.take()], [elvin_packets.DropWarn])
        self.emit(client, {"s": "y" * 20})
        self.assertIsInstance(out.take()[0], elvin_packets.NotifyDeliver)

    def test_contains_costs_a_scan_per_needle(self):
        self.router.max_pattern_work = 100
        client, out = self.connect()
        self.subscribe(client, out, 'contains(s, "a", "b", "c", "d")')
        self.emit(client, {"s": "d" * 25})              # 4 x 25: fits
        self.assertIsInstance(out.take()[0], elvin_packets.NotifyDeliver)
        self.emit(client, {"s": "d" * 26})
        self.assertIsInstance(out.take()[0], elvin_packets.DropWarn)

    def test_wildcard_weight_is_its_program(self):
        from elvin.subscription import patterns
        short = patterns.weighed_wildcards(["a*"])[1]
        hostile = patterns.weighed_wildcards(["*a?" * 200])[1]
        self.assertGreater(hostile, 100 * short)
        self.router.max_pattern_work = hostile * 50
        client, out = self.connect()
        self.subscribe(client, out, f'wildcard(s, "{"*a?" * 200}")')
        self.emit(client, {"s": "ab" * 30})
        self.assertIsInstance(out.take()[0], elvin_packets.DropWarn)

    def test_zero_is_no_limit_and_reload_applies_next_notification(self):
        client, out = self.connect()
        self.subscribe(client, out, 'regex(s, "x")')
        self.router.max_pattern_work = 0
        self.emit(client, {"s": "y" * 5000 + "x"})
        self.assertIsInstance(out.take()[0], elvin_packets.NotifyDeliver)
        self.router.max_pattern_work = self.weight * 10
        self.emit(client, {"s": "y" * 5000 + "x"})
        self.assertIsInstance(out.take()[0], elvin_packets.DropWarn)

    def test_modified_into_a_pattern_is_metered(self):
        client, out = self.connect()
        reply = self.subscribe(client, out, 's == "x"')
        entry = self.router.subscriptions[reply.subscription_id]
        self.assertIs(entry.evaluate, entry.subscription.evaluator)   # not wrapped
        client.packet_received(elvin_packets.SubModRqst(
            self.xid(), reply.subscription_id, 'regex(s, "x")', True,
            elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        out.take()
        self.emit(client, {"s": "y" * 200 + "x"})
        self.assertIsInstance(out.take()[0], elvin_packets.DropWarn)

    def test_outside_a_budget_nothing_is_limited(self):
        from elvin.subscription import Subscription
        self.assertTrue(Subscription('regex(s, "x")').matches({"s": "y" * 100_000 + "x"}))

    def test_end_line_counts_refusals(self):
        logged = []
        globalLogPublisher.addObserver(logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, logged.append)
        client, out = self.connect()
        self.subscribe(client, out, 'regex(s, "x")')
        for _ in range(3):
            self.emit(client, {"s": "y" * 200})
        warnings = [e for e in logged if e.get("setting") == "max-pattern-work"]
        self.assertEqual(len(warnings), 1)          # rate-limited
        client.connection_lost()
        ends = [e for e in logged if "disconnected" in e.get("log_format", "")]
        self.assertIn("3 notifications not fully evaluated", ends[-1]["losses"])


class EvaluationBudgetTests(RouterTestCase):
    """``max-evaluation-bytes``: how much of one client's subscriptions a
    notification may have evaluated (each costs its text's length plus
    EVALUATION_OVERHEAD_BYTES); past it the rest are skipped and the
    client gets a DropWarn, and other clients are evaluated in full."""

    def setUp(self):
        super().setUp()
        from elvin.core import router as router_module
        self.overhead = router_module.EVALUATION_OVERHEAD_BYTES
        self.from_ = router_module.COUNT_EVALUATIONS_FROM

    def test_many_name_only_subscriptions_cost_at_most_the_budget(self):
        attacker, attacker_out = self.connect()
        bystander, bystander_out = self.connect()
        texts = [f"BY + {i} == {i + 1}" for i in range(100)]     # each matches BY == 1
        for text in texts:
            self.subscribe(attacker, attacker_out, text)
        self.subscribe(bystander, bystander_out, "BY + 1 == 2")
        per = len(texts[50]) + self.overhead
        self.router.max_evaluation_bytes = per * 60
        evaluated = []
        for entry in self.router.subscriptions.values():
            original = entry.evaluate
            entry.evaluate = (lambda f, e: lambda a: evaluated.append(e) or f(a))(original,
                                                                                  entry)
        self.emit(bystander, {"BY": 1})
        warned, delivered = attacker_out.take()
        self.assertIsInstance(warned, elvin_packets.DropWarn)
        self.assertLessEqual(sum(len(e.subscription.expression) + self.overhead
                                 for e in evaluated if e.session is attacker),
                             self.router.max_evaluation_bytes)
        self.assertGreater(len(delivered.insecure_matches), 50)
        self.assertLess(len(delivered.insecure_matches), 100)
        (mine,) = bystander_out.take()
        self.assertEqual(len(mine.insecure_matches), 1)
        self.assertEqual(self.router.stats["evaluation_refusals"], 1)
        self.assertEqual((attacker.unevaluated, bystander.unevaluated), (1, 0))

    def test_few_candidates_are_not_counted(self):
        client, out = self.connect()
        for i in range(self.from_):
            self.subscribe(client, out, f"BY + {i} == {i + 1}")
        self.router.max_evaluation_bytes = 1
        self.emit(client, {"BY": 1})
        (delivered,) = out.take()
        self.assertEqual(len(delivered.insecure_matches), self.from_)

    def test_zero_is_no_limit(self):
        client, out = self.connect()
        for i in range(self.from_ + 10):
            self.subscribe(client, out, f"BY + {i} == {i + 1}")
        self.router.max_evaluation_bytes = 0
        self.emit(client, {"BY": 1})
        (delivered,) = out.take()
        self.assertEqual(len(delivered.insecure_matches), self.from_ + 10)
        self.router.max_evaluation_bytes = 100
        self.emit(client, {"BY": 1})
        self.assertIsInstance(out.take()[0], elvin_packets.DropWarn)


class HeavyClientTests(RouterTestCase):
    """A client past ``max-evaluation-bytes`` once is heavy: its
    subscriptions move to an index of its own, and for each notification
    the heavy clients together are evaluated within
    ``max-heavy-evaluation-bytes``, in turn, so that several clients each
    within their own budget cannot add up to everyone's delay; the
    others are evaluated in full and first."""

    def setUp(self):
        super().setUp()
        from elvin.core import router as router_module
        self.overhead = router_module.EVALUATION_OVERHEAD_BYTES
        self.evaluated = []

    def heavy_client(self, count):
        client, out = self.connect({"Subscription.Max-Count": 1000})
        for i in range(count):
            self.subscribe(client, out, f"BY + {i} == {i + 1}")     # BY == 1 matches all
        return client, out

    def set_apart_client(self):
        """A client of 100 subscriptions that one notification set apart
        (its budget: 60 of them)."""
        heavy, out = self.heavy_client(100)
        per = len("BY + 50 == 51") + self.overhead
        self.router.max_evaluation_bytes = per * 60
        self.emit(heavy, {"BY": 1})
        self.assertIn(heavy, self.router._heavy)
        return heavy, out

    def count_evaluations(self):
        for entry in self.router.subscriptions.values():
            original = entry.evaluate
            entry.evaluate = (lambda f, e: lambda a: self.evaluated.append(e) or f(a))(
                original, entry)

    def spent(self, session=None):
        return sum(len(e.subscription.expression) + self.overhead
                   for e in self.evaluated if session is None or e.session is session)

    def test_clients_past_their_budget_share_one_budget(self):
        heavies = [self.heavy_client(100) for _ in range(5)]
        bystander, bystander_out = self.connect()
        self.subscribe(bystander, bystander_out, "BY + 1 == 2")
        per = len("BY + 50 == 51") + self.overhead
        self.router.max_evaluation_bytes = per * 60
        self.router.max_heavy_evaluation_bytes = per * 90
        self.emit(bystander, {"BY": 1})          # each past its own budget: set apart
        self.assertEqual(len(self.router._heavy), 5)
        self.assertEqual(len(self.router.index), 1)        # the bystander's alone
        for _, out in heavies:
            out.take()
        bystander_out.take()
        self.count_evaluations()
        firsts = set()
        for _ in range(5):
            self.evaluated.clear()
            self.emit(bystander, {"BY": 1})
            (mine,) = bystander_out.take()
            self.assertEqual(len(mine.insecure_matches), 1)
            self.assertIs(self.evaluated[0].session, bystander)      # first, in full
            firsts.add(self.evaluated[1].session)
            self.assertLessEqual(self.spent(), per * (90 + 1))
            for client, out in heavies:
                self.assertLessEqual(self.spent(client), self.router.max_evaluation_bytes)
                # Every heavy client is told it may have missed this one.
                self.assertIn(elvin_packets.DropWarn, [type(p) for p in out.take()])
        self.assertEqual(firsts, {client for client, _ in heavies})     # in turn
        self.assertEqual(self.router.stats["evaluation_refusals"], 5 + 5 * 5)

    def test_a_heavy_client_keeps_its_matches_within_its_budget(self):
        heavy, out = self.set_apart_client()
        out.take()
        self.emit(heavy, {"BY": 1})
        warned, delivered = out.take()
        self.assertIsInstance(warned, elvin_packets.DropWarn)
        self.assertGreater(len(delivered.insecure_matches), 50)
        self.assertLess(len(delivered.insecure_matches), 100)
        # Its subscriptions are still its own to change and remove (each
        # notification evaluating them all now: no limits).
        self.router.max_evaluation_bytes = self.router.max_heavy_evaluation_bytes = 0
        sub_id = delivered.insecure_matches[0]
        heavy.packet_received(elvin_packets.SubModRqst(self.xid(), sub_id, "BY == 7", True))
        self.assertIsInstance(out.take()[-1], elvin_packets.SubRply)
        def matched():
            return [i for p in out.take() if isinstance(p, elvin_packets.NotifyDeliver)
                    for i in p.insecure_matches]
        self.emit(heavy, {"BY": 7})
        self.assertIn(sub_id, matched())
        heavy.packet_received(elvin_packets.SubDelRqst(self.xid(), sub_id))
        out.take()
        self.emit(heavy, {"BY": 7})
        self.assertNotIn(sub_id, matched())
        heavy.connection_lost()
        self.assertEqual(self.router._heavy, {})
        self.assertEqual(len(self.router.subscriptions), 0)

    def test_a_light_client_is_not_set_apart(self):
        client, out = self.heavy_client(20)
        self.emit(client, {"BY": 1})
        (delivered,) = out.take()
        self.assertEqual(len(delivered.insecure_matches), 20)
        self.assertEqual(self.router._heavy, {})

    def test_zero_is_no_shared_limit(self):
        heavies = [self.heavy_client(40) for _ in range(3)]
        per = len("BY + 20 == 21") + self.overhead
        self.router.max_evaluation_bytes = per * 30
        self.router.max_heavy_evaluation_bytes = 0
        bystander, _ = self.connect()
        self.emit(bystander, {"BY": 1})
        self.assertEqual(len(self.router._heavy), 3)
        self.count_evaluations()
        self.emit(bystander, {"BY": 1})
        for client, _ in heavies:
            self.assertGreater(self.spent(client), per * 25)     # its own budget only

    def test_a_heavy_client_whose_subscriptions_fit_its_budget_is_light_again(self):
        heavy, out = self.set_apart_client()
        for sub_id in list(heavy.subscriptions)[:38]:
            heavy.packet_received(elvin_packets.SubDelRqst(self.xid(), sub_id))
        self.emit(heavy, {"BY": 1})          # 62 left: still past it
        self.assertIn(heavy, self.router._heavy)
        for sub_id in list(heavy.subscriptions)[:5]:
            heavy.packet_received(elvin_packets.SubDelRqst(self.xid(), sub_id))
        out.take()
        self.emit(heavy, {"BY": 1})          # 57 fit: back, and all of them match
        self.assertEqual(self.router._heavy, {})
        self.assertEqual(len(self.router.index), 57)
        (delivered,) = [p for p in out.take() if isinstance(p, elvin_packets.NotifyDeliver)]
        self.assertEqual(len(delivered.insecure_matches), 57)
        self.emit(heavy, {"BY": 1})
        (delivered,) = out.take()            # in full, no DropWarn
        self.assertEqual(len(delivered.insecure_matches), 57)

    def test_a_heavy_client_within_its_budget_for_its_probation_is_light_again(self):
        from elvin.core import router as router_module
        self.patch(router_module, "HEAVY_PROBATION", 3)
        heavy, out = self.heavy_client(100)
        bystander, _ = self.connect()
        per = len("BY + 50 == 51") + self.overhead
        self.router.max_evaluation_bytes = per * 60
        self.emit(bystander, {"BY": 1})
        self.assertIn(heavy, self.router._heavy)
        self.assertEqual(heavy.heavy_probation, 3)
        self.emit(bystander, {"Other": 1})
        self.emit(bystander, {"Other": 1})
        self.emit(bystander, {"BY": 1})      # past its own budget: the count starts again
        self.emit(bystander, {"Other": 1})
        self.emit(bystander, {"Other": 1})
        self.assertIn(heavy, self.router._heavy)
        self.emit(bystander, {"Other": 1})   # three in a row within it
        self.assertEqual(self.router._heavy, {})
        self.assertEqual(len(self.router.index), 100)
        out.take()
        self.emit(bystander, {"BY": 1})      # heavy again: a longer probation
        self.assertIn(heavy, self.router._heavy)
        self.assertEqual(heavy.heavy_probation, 6)
        warned, delivered = out.take()
        self.assertIsInstance(warned, elvin_packets.DropWarn)
        self.assertLess(len(delivered.insecure_matches), 100)

    def test_a_heavy_client_cut_by_the_shared_budget_stays_heavy(self):
        from elvin.core import router as router_module
        self.patch(router_module, "HEAVY_PROBATION", 2)
        heavies = [self.heavy_client(100) for _ in range(2)]
        bystander, _ = self.connect()
        per = len("BY + 50 == 51") + self.overhead
        self.router.max_evaluation_bytes = per * 60
        self.router.max_heavy_evaluation_bytes = per * 30
        self.emit(bystander, {"BY": 1})
        for _ in range(10):
            # Neither is ever looked at in full within its own budget (the
            # shared one runs out first), so neither is known to be light.
            self.emit(bystander, {"BY": 2})
        self.assertEqual(set(self.router._heavy), {client for client, _ in heavies})



class SubscriptionMemoryTests(RouterTestCase):
    """What subscriptions cost is estimated (``subscription_cost``) and
    held to a cap per client and one for the router."""

    many = {"Subscription.Max-Count": 100_000}

    def held_by(self, texts):
        """Bytes the router holds for ``texts`` subscribed by one client
        (tracemalloc), and what it counts for them."""
        import gc
        import tracemalloc
        from elvin.subscription import compiler, shapes
        # The caches of shapes are bounded (4,096 each): make them small and
        # full, so that what is measured is what each subscription adds.
        self.patch(shapes, "MAX_SHAPES", 32)
        self.patch(compiler, "_MAX_FACTORIES", 32)
        warm, warm_out = self.connect(self.many)
        for text in texts[:100]:
            self.subscribe(warm, warm_out, text + " || warm == 1")
        texts = texts[100:]
        session, out = self.connect(self.many)
        packets = [elvin_packets.SubAddRqst(self.xid(), text, True, elvin_packets.Keys.EMPTY)
                   for text in texts]
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            counted = self.router.subscription_memory
            for packet in packets:
                session.packet_received(packet)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        self.assertEqual(len(session.subscriptions), len(texts))
        self.assertEqual(session.subscription_memory, self.router.subscription_memory - counted)
        return held, session.subscription_memory

    def test_the_estimate_errs_high_by_at_most_two_and_a_half_times(self):
        tag = id(self)
        shapes = {
            "one name": [f"Flood{tag} == {i}" for i in range(600)],
            "a name each": [f"N{tag}x{i} == 1" for i in range(600)],
            "180 bytes, nine names": [
                f'Group == "g{i % 50}" && Name == "n{i}" && price > {i} && price < {i + 100}'
                f' && region == "r{i % 9}" && begins-with(Title, "Q{i % 31}") && qty >= '
                f'{i % 1000} && flags & 4 == 4 && size(Body) < {i % 500 + 100} || Urgent == 1'
                for i in range(600)],
            # The Java load generator's: a shape seen before (its recipe).
            "111 bytes, shared shape": [
                f's1{tag} == "sym-{i % 100:03d}" && s2 == "ex-{i % 10}" && i1 >= {i % 900} && '
                f'i1 < {i % 900 + 50} && i2 >= {i % 800} && i2 < {i % 800 + 60} && '
                f'r1 >= {i % 700}.25 && r1 < {i % 700 + 40}.75' for i in range(600)],
        }
        for shape, texts in shapes.items():
            held, counted = self.held_by(texts)
            self.assertGreaterEqual(counted, held, shape)
            self.assertLessEqual(counted, 2.5 * held, shape)

    def test_a_client_past_its_memory_is_refused_and_others_are_served(self):
        from elvin.core.router import compile_expression
        self.router.max_client_subscription_memory = 3 * subscription_cost(
            compile_expression("x0 == 1"))
        session, out = self.connect()
        ids = [self.subscribe(session, out, f"x{i} == 1").subscription_id for i in range(3)]
        reply = self.subscribe(session, out, "x3 == 1")
        self.assertEqual(reply.error, errors.IMPL_LIMIT)
        self.assertIn("max-client-subscription-memory", reply.message)
        # A bystander has its own allowance and is still served.
        other, other_out = self.connect()
        self.assertIsInstance(self.subscribe(other, other_out, "x3 == 1"), elvin_packets.SubRply)
        self.emit(other, {"x0": 1})
        (delivered,) = out.take()
        self.assertIsInstance(delivered, elvin_packets.NotifyDeliver)
        # A costlier change is refused; deleting one frees its share.
        session.packet_received(elvin_packets.SubModRqst(
            self.xid(), ids[0], "x0 == 1 && y > 2", True, elvin_packets.Keys.EMPTY,
            elvin_packets.Keys.EMPTY))
        self.assertEqual(out.take()[0].error, errors.IMPL_LIMIT)
        session.packet_received(elvin_packets.SubDelRqst(self.xid(), ids[0]))
        self.assertIsInstance(out.take()[0], elvin_packets.SubRply)
        self.assertIsInstance(self.subscribe(session, out, "x3 == 1"), elvin_packets.SubRply)

    def test_the_router_past_its_memory_refuses_everyone_until_some_go(self):
        from elvin.core.router import compile_expression
        self.router.max_subscription_memory = 4 * subscription_cost(
            compile_expression("x0 == 1"))
        hog, hog_out = self.connect()
        for i in range(4):
            self.assertIsInstance(self.subscribe(hog, hog_out, f"x{i} == 1"),
                                  elvin_packets.SubRply)
        reply = self.subscribe(hog, hog_out, "x4 == 1")
        self.assertEqual(reply.error, errors.IMPL_LIMIT)
        self.assertIn("max-subscription-memory", reply.message)
        other, other_out = self.connect()
        self.assertEqual(self.subscribe(other, other_out, "x4 == 1").error, errors.IMPL_LIMIT)
        hog.connection_lost()
        self.assertEqual(self.router.subscription_memory, 0)
        self.assertIsInstance(self.subscribe(other, other_out, "x4 == 1"), elvin_packets.SubRply)

    def test_the_default_caps_take_10000_subscriptions_of_200_bytes(self):
        from elvin.core.router import (DEFAULT_MAX_CLIENT_SUBSCRIPTION_MEMORY,
                                       DEFAULT_MAX_SUBSCRIPTION_MEMORY, Subscription)
        # The most names 200 bytes can refer to, and a usual mix.
        crowded = " && ".join(f"{chr(97 + i)} == 1" for i in range(20))
        usual = ('Group == "chat" && Name == "someone" && price > 10 && price < 1000 && '
                 'region == "north" && begins-with(Title, "Q") && qty >= 5 && '
                 'flags & 4 == 4 && size(Body) < 140 || Urgent == 1 || Rare == 2.5')
        for text in (crowded, usual):
            self.assertLessEqual(len(text), 200)
            cost = subscription_cost(Subscription(text))
            self.assertLessEqual(10_000 * cost, DEFAULT_MAX_CLIENT_SUBSCRIPTION_MEMORY, text)
            self.assertLessEqual(10_000 * cost, DEFAULT_MAX_SUBSCRIPTION_MEMORY, text)
