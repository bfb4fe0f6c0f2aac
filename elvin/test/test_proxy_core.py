"""The proxy's core (elvin.proxy.core) without a reactor or a socket.

Upstream is a real routing core (elvin.core.router.Router) reached through
one of its client sessions, so matching and keys are the router's own; the
proxy's clients are ProxyClients writing to recording outputs.
"""

import itertools

from twisted.internet import defer
from twisted.trial import unittest

from elvin import errors
from elvin.client.state import ConnectionClosed, NackError
from elvin.core.keys import consumer_keys, producer_keys
from elvin.core.router import Router
from elvin.protocols import packets as elvin_packets
from elvin.proxy.core import EVENT, ProxyCore
from elvin.proxy.store import Store
from elvin.test.test_router import RecordingOutput


class InProcessUpstream:
    """The upstream interface ProxyCore uses, on a Router's client session."""

    def __init__(self):
        self.router = Router()
        self.core = None
        self.is_up = False
        self._xids = itertools.count(1)
        self._waiting = {}
        self.session = None
        self.requests = []

    def up(self):
        outer = self

        class Output(RecordingOutput):
            def send(self, packet):
                outer._received(elvin_packets.decode(elvin_packets.encode(packet)))

            def send_encoded(self, data, droppable):
                outer._received(elvin_packets.decode(data))
        self.session = self.router.open_session(Output(), "proxy")
        self.session.packet_received(elvin_packets.ConnRqst(next(self._xids), 4, 0, {}))
        self.is_up = True
        self.core.upstream_up()

    def down(self):
        self.session.connection_lost("test")
        self.is_up = False
        waiting, self._waiting = self._waiting, {}
        for d in waiting.values():
            d.errback(ConnectionClosed("upstream lost"))
        self.core.upstream_down()

    def _received(self, packet):
        if isinstance(packet, elvin_packets.NotifyDeliver):
            self.core.upstream_notification(packet.attributes, packet.secure_matches,
                                            packet.insecure_matches)
        elif isinstance(packet, elvin_packets.Nack):
            self._waiting.pop(packet.xid).errback(
                NackError(packet.error, packet.message, packet.args))
        elif hasattr(packet, "xid") and packet.xid in self._waiting:
            self._waiting.pop(packet.xid).callback(packet)

    def _request(self, make):
        xid = next(self._xids)
        d = defer.Deferred()
        self._waiting[xid] = d
        packet = make(xid)
        self.requests.append(packet)
        self.session.packet_received(packet)
        return d

    def subscribe(self, expression, accept_insecure, keys, late=None):
        return self._request(lambda x: elvin_packets.SubAddRqst(x, expression, accept_insecure, keys)
                             ).addCallback(lambda r: r.subscription_id)

    def modify(self, upstream_id, expression, accept_insecure, add_keys, del_keys, late=None):
        return self._request(lambda x: elvin_packets.SubModRqst(x, upstream_id, expression,
                                                    accept_insecure, add_keys, del_keys)
                             ).addCallback(lambda r: r.subscription_id)

    def unsubscribe(self, upstream_id):
        return self._request(lambda x: elvin_packets.SubDelRqst(x, upstream_id))

    def notify(self, attributes, deliver_insecure, keys):
        self.session.packet_received(elvin_packets.NotifyEmit(attributes, deliver_insecure, keys))


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class ProxyCoreCase(unittest.TestCase):
    """A proxy core on an in-memory store, upstream a real routing core."""

    def setUp(self, **limits):
        self.clock = Clock()
        self.store = Store(":memory:", max_stored=limits.pop("max_stored", None))
        self.upstream = InProcessUpstream()
        self.core = ProxyCore(self.store, self.upstream, clock=self.clock, **limits)
        self.upstream.core = self.core
        self.upstream.up()
        self.xids = itertools.count(1)

    def serve(self, http=False):
        """Listen for clients on 127.0.0.1 (a free port), TCP or the HTTP
        tunnel, as ``twistd elvin-proxy`` does (the core should be made
        with ``call_later=reactor.callLater``): (URI, the HTTP site or the
        factory)."""
        from twisted.internet import reactor
        from elvin.protocols.httptunnel import ElvinHTTPSite
        from elvin.proxy.protocol import ProxyServerFactory
        factory = ProxyServerFactory(self.core, reactor, 30)
        if http:
            factory = ElvinHTTPSite(factory)
            self.addCleanup(factory.close_all)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        stack = "/http,none,xdr/" if http else "//"
        return f"elvin:{stack}127.0.0.1:{port.getHost().port}", factory

    ports = itertools.count(40000)

    def connrqst_over_the_wire(self, host, options, ipv6=False):
        """A ConnRqst with ``options`` on one connection from ``host`` (a new
        port each time) through the proxy's stream protocol, as a socket
        gives the peer; the connection ends after the reply, returned."""
        import struct
        from twisted.internet.address import IPv4Address, IPv6Address
        from twisted.internet.task import Clock as ReactorClock
        from twisted.internet.testing import StringTransport
        from elvin.proxy.protocol import ProxyServerFactory
        address = (IPv6Address if ipv6 else IPv4Address)("TCP", host, next(self.ports))
        protocol = ProxyServerFactory(self.core, ReactorClock(), 30).buildProtocol(address)
        transport = StringTransport(peerAddress=address)
        protocol.makeConnection(transport)
        self.assertIn(":", protocol.peer)                     # log text, port included
        data = elvin_packets.encode(elvin_packets.ConnRqst(1, 4, 0, dict(options)))
        protocol.dataReceived(struct.pack(">I", len(data)) + data)
        reply = transport.value()
        protocol.connectionLost(None)
        return elvin_packets.decode(reply[4:4 + struct.unpack(">I", reply[:4])[0]])

    def left_subscribed(self, name="phone"):
        """Session ``name`` subscribed to ``require(n)`` with no client, on a
        core whose reactor turns are a Clock's: returned, for ``advance``."""
        from twisted.internet.task import Clock as ReactorClock
        reactor = ReactorClock()
        self.core.call_later = reactor.callLater
        client, out = self.join(name)
        self.subscribe(client, out, "require(n)")
        client.connection_lost()
        return reactor

    def refuse_commits(self):
        """Each reactor turn's COMMIT refused, as by a full disk (its
        transaction rolled back), until the function returned is called."""
        from elvin.proxy.store import StoreFailed
        store, release = self.store, self.store.release

        def full():
            store.abandon()
            raise StoreFailed("database or disk is full")
        store.release = full
        return lambda: setattr(store, "release", release)

    def restart(self, **limits):
        """A new proxy on the same store (as after kill -9 and a restart)."""
        self.upstream.down()
        self.upstream = InProcessUpstream()
        self.core = ProxyCore(self.store, self.upstream, clock=self.clock, **limits)
        self.upstream.core = self.core
        self.upstream.up()

    def connect(self, options=None, nfn_keys=elvin_packets.Keys.EMPTY, sub_keys=elvin_packets.Keys.EMPTY):
        output = RecordingOutput()
        client = self.core.open_session(output, "peer")
        client.packet_received(elvin_packets.ConnRqst(next(self.xids), 4, 0, dict(options or {}),
                                          nfn_keys, sub_keys))
        return client, output

    def join(self, name, **options):
        asked = {"Proxy.Session": name}
        for key, value in options.items():
            asked["Proxy." + key.replace("_", "-").title().replace("Ttl", "TTL")] = value
        return self.connect(asked)

    def request(self, client, packet):
        client.packet_received(packet)

    def subscribe(self, client, output, expression, keys=elvin_packets.Keys.EMPTY):
        self.request(client, elvin_packets.SubAddRqst(next(self.xids), expression, True, keys))
        reply = [p for p in output.take() if isinstance(p, (elvin_packets.SubRply, elvin_packets.Nack))][-1]
        if isinstance(reply, elvin_packets.Nack):
            raise NackError(reply.error, reply.message, reply.args)
        return reply.subscription_id

    def publish(self, attributes, keys=elvin_packets.Keys.EMPTY, deliver_insecure=True):
        publisher = self.upstream.router.open_session(RecordingOutput(), "publisher")
        publisher.packet_received(elvin_packets.ConnRqst(1, 4, 0, {}))
        publisher.packet_received(elvin_packets.NotifyEmit(attributes, deliver_insecure, keys))
        publisher.connection_lost("done")

    @staticmethod
    def delivered(output):
        return [p for p in output.take()
                if isinstance(p, elvin_packets.NotifyDeliver) and EVENT not in p.attributes]

    @staticmethod
    def events(packets):
        return [p.attributes for p in packets
                if isinstance(p, elvin_packets.NotifyDeliver) and EVENT in p.attributes]



class ProxyCoreTest(ProxyCoreCase):

    # -- plain clients -----------------------------------------------------------

    def test_plain_client_gets_router_behaviour(self):
        client, out = self.connect()
        self.assertIsInstance(out.take()[0], elvin_packets.ConnRply)
        sub = self.subscribe(client, out, 'Group == "chat"')
        self.publish({"Group": "chat", "n": 1})
        self.publish({"Group": "news"})
        (note,) = self.delivered(out)
        self.assertEqual(note.attributes, {"Group": "chat", "n": 1})
        self.assertEqual(tuple(note.secure_matches) + tuple(note.insecure_matches), (sub,))
        client.connection_lost()
        self.assertEqual(self.upstream.router.subscriptions, {})   # gone upstream too
        self.assertEqual(self.store.counts()["notifications"], 0)

    def test_bad_expression_is_nacked_with_the_router_code(self):
        client, out = self.connect()
        out.take()
        with self.assertRaises(NackError) as caught:
            self.subscribe(client, out, "Group ==")
        self.assertEqual(caught.exception.code, errors.PARSE_ERROR)
        self.assertEqual(self.core.subscriptions, {})

    def test_xid_zero_is_nacked_as_the_router_nacks_it(self):
        client, out = self.connect()
        out.take()
        self.request(client, elvin_packets.SubAddRqst(0, "require(a)", True,
                                                      elvin_packets.Keys.EMPTY))
        (nack,) = out.take()
        self.assertEqual((type(nack), nack.xid, nack.error),
                         (elvin_packets.Nack, 0, errors.PROT_ERROR))
        self.assertEqual(self.core.subscriptions, {})

    def test_notifications_go_upstream_with_connection_keys(self):
        secret = b"producer secret"
        subscriber = self.upstream.router.open_session(RecordingOutput(), "s")
        subscriber.packet_received(elvin_packets.ConnRqst(1, 4, 0, {}))
        nfn, sub = producer_keys(secret)
        subscriber.packet_received(elvin_packets.SubAddRqst(2, "require(x)", False, sub))
        subscriber.output.take()
        client, out = self.connect(nfn_keys=nfn)
        self.request(client, elvin_packets.NotifyEmit({"x": 1}, False, elvin_packets.Keys.EMPTY))
        (note,) = [p for p in subscriber.output.take() if isinstance(p, elvin_packets.NotifyDeliver)]
        self.assertEqual(note.attributes, {"x": 1})
        self.assertEqual(list(note.secure_matches), [subscriber.subscriptions and
                                                     next(iter(subscriber.subscriptions))])

    def over_the_wire(self, mangle=bytes):
        """An upstream subscriber to ``require(x)``, and a client connected
        through the proxy's stream protocol, as a client's bytes arrive
        (the transports' fast path, not the packet dispatch): (the
        subscriber, ``send(packet)`` framing ``mangle(encoded packet)``,
        the client's transport)."""
        import struct
        from twisted.internet.task import Clock as ReactorClock
        from twisted.internet.testing import StringTransport
        from elvin.proxy.protocol import ProxyServerFactory
        subscriber = self.upstream.router.open_session(RecordingOutput(), "s")
        subscriber.packet_received(elvin_packets.ConnRqst(1, 4, 0, {}))
        subscriber.packet_received(elvin_packets.SubAddRqst(2, "require(x)", True,
                                                            elvin_packets.Keys.EMPTY))
        subscriber.output.take()
        protocol = ProxyServerFactory(self.core, ReactorClock(), 30).buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)

        def send(packet):
            data = mangle(elvin_packets.encode(packet))
            protocol.dataReceived(struct.pack(">I", len(data)) + data)
        send(elvin_packets.ConnRqst(1, 4, 0, {}, elvin_packets.Keys.EMPTY,
                                    elvin_packets.Keys.EMPTY))
        return subscriber, send, transport

    def test_a_notify_emit_over_the_wire_goes_upstream(self):
        subscriber, send, transport = self.over_the_wire()
        send(elvin_packets.NotifyEmit({"x": 1, "s": "é"}, True, elvin_packets.Keys.EMPTY))
        self.assertFalse(transport.disconnecting)
        (note,) = [p for p in subscriber.output.take() if isinstance(p, elvin_packets.NotifyDeliver)]
        self.assertEqual(note.attributes, {"x": 1, "s": "é"})

    def test_a_string_holding_nul_is_refused_as_the_router_refuses_it(self):
        # 6.1.4: a string has no NUL bytes. Over the wire, a NotifyEmit
        # holding one is ignored (not passed upstream) and a request
        # holding one is Nacked 1006 with the NUL's offset.
        import struct
        subscriber, send, transport = self.over_the_wire(lambda data: data.replace(b"@", b"\0"))
        transport.clear()
        send(elvin_packets.NotifyEmit({"x": 1, "s": "a@"}, True, elvin_packets.Keys.EMPTY))
        send(elvin_packets.SubAddRqst(7, 's == "@"', True, elvin_packets.Keys.EMPTY))
        self.assertFalse(transport.disconnecting)
        self.assertEqual([p for p in subscriber.output.take()
                          if isinstance(p, elvin_packets.NotifyDeliver)], [])
        data = transport.value()
        nack = elvin_packets.decode(data[4:4 + struct.unpack(">I", data[:4])[0]])
        self.assertEqual((nack.xid, nack.error, nack.args), (7, 1006, (18,)))

    def test_quench_is_refused_as_not_implemented(self):
        client, out = self.connect()
        out.take()
        self.request(client, elvin_packets.QnchAddRqst(5, ("x",), True, elvin_packets.Keys.EMPTY))
        (nack,) = out.take()
        self.assertEqual((nack.xid, nack.error), (5, errors.NOT_IMPL))

    # -- sessions ----------------------------------------------------------------

    def test_stored_while_away_then_replayed_in_order_with_ids(self):
        client, out = self.join("phone")
        sub = self.subscribe(client, out, 'Group == "chat"')
        other = self.subscribe(client, out, "require(n)")
        client.connection_lost()
        for n in range(3):
            self.publish({"Group": "chat", "n": n})
        self.publish({"Group": "news"})
        client, out = self.join("phone")
        packets = out.take()
        self.assertIsInstance(packets[0], elvin_packets.ConnRply)
        events = self.events(packets)
        self.assertEqual([(e[EVENT], e.get("Proxy.Subscription")) for e in events],
                         [("subscription", sub), ("subscription", other), ("joined", None)])
        self.assertEqual(events[-1]["Proxy.Stored"], 3)
        notes = [p for p in packets if isinstance(p, elvin_packets.NotifyDeliver)
                 and EVENT not in p.attributes]
        self.assertEqual([n.attributes["n"] for n in notes], [0, 1, 2])
        for note in notes:
            self.assertEqual(sorted(note.secure_matches + note.insecure_matches),
                             sorted([sub, other]))
        self.assertTrue(client.live)
        self.assertEqual(self.store.counts()["notifications"], 0)   # destructive receipt
        self.publish({"Group": "chat", "n": 9})
        self.assertEqual([n.attributes["n"] for n in self.delivered(out)], [9])

    def test_connected_destructive_client_gets_it_and_nothing_is_stored(self):
        client, out = self.join("phone")
        self.subscribe(client, out, "require(n)")
        self.publish({"n": 1})
        self.assertEqual(len(self.delivered(out)), 1)
        self.assertEqual(self.store.counts()["notifications"], 0)

    def joined_and_delivered(self, out):
        """The "joined" event a rejoining client was sent, and the ``n`` of
        each notification delivered to it."""
        packets = out.take()
        (joined,) = [e for e in self.events(packets) if e[EVENT] == "joined"]
        return joined, [p.attributes["n"] for p in packets
                        if isinstance(p, elvin_packets.NotifyDeliver)
                        and EVENT not in p.attributes]

    def test_expired_notifications_are_never_delivered(self):
        client, out = self.join("phone", TTL=60)
        self.subscribe(client, out, "require(n)")
        client.connection_lost()
        self.publish({"n": 1})
        self.clock.now += 30
        self.publish({"n": 2})
        self.clock.now += 40            # the first is 70 s old, the second 40
        client, out = self.join("phone")
        joined, delivered = self.joined_and_delivered(out)
        self.assertEqual(joined["Proxy.Stored"], 1)    # the expired one, unswept, is not told
        self.assertEqual(delivered, [2])

    def test_max_count_keeps_the_newest(self):
        client, out = self.join("phone", Max_Count=2)
        self.subscribe(client, out, "require(n)")
        client.connection_lost()
        for n in range(5):
            self.publish({"n": n})
        client, out = self.join("phone")
        self.assertEqual([n.attributes["n"] for n in self.delivered(out)], [3, 4])

    def test_per_subscription_limits_by_qos_request(self):
        client, out = self.join("phone")
        sub = self.subscribe(client, out, "require(n)")
        self.request(client, elvin_packets.QosRqst(7, {f"Proxy.Max-Count.{sub}": 1, f"Proxy.TTL.{sub}": 5}))
        (reply,) = out.take()
        self.assertIsInstance(reply, elvin_packets.QosRply)
        self.assertEqual(reply.options[f"Proxy.Max-Count.{sub}"], 1)
        self.assertEqual(self.store.subscriptions("phone")[0][3:], (5, 1))
        client.connection_lost()
        self.publish({"n": 1})
        self.publish({"n": 2})
        client, out = self.join("phone")
        joined, delivered = self.joined_and_delivered(out)
        self.assertEqual(joined["Proxy.Stored"], 1)    # the expired one, unswept, is not told
        self.assertEqual(delivered, [2])

    def test_two_devices_non_destructive_never_twice(self):
        pda, pda_out = self.join("me", Receipt="non-destructive", Client="pda")
        self.subscribe(pda, pda_out, "require(n)")
        self.publish({"n": 1})                 # the PDA is there: it gets it, a copy stays
        self.assertEqual([n.attributes["n"] for n in self.delivered(pda_out)], [1])
        pda.connection_lost()
        self.publish({"n": 2})
        laptop, laptop_out = self.join("me", Receipt="non-destructive", Client="laptop")
        self.assertEqual([n.attributes["n"] for n in self.delivered(laptop_out)], [1, 2])
        laptop.connection_lost()
        pda, pda_out = self.join("me", Receipt="non-destructive", Client="pda")
        self.assertEqual([n.attributes["n"] for n in self.delivered(pda_out)], [2])
        pda.connection_lost()
        pda, pda_out = self.join("me", Receipt="non-destructive", Client="pda")
        self.assertEqual(self.delivered(pda_out), [])      # never twice, across reconnects
        pda.connection_lost()
        desk, desk_out = self.join("me", Client="desk")    # destructive: takes them away
        self.assertEqual([n.attributes["n"] for n in self.delivered(desk_out)], [1, 2])
        desk.connection_lost()
        laptop, laptop_out = self.join("me", Receipt="non-destructive", Client="laptop")
        self.assertEqual(self.delivered(laptop_out), [])
        self.assertEqual(self.store.counts()["notifications"], 0)

    def test_non_destructive_needs_a_client_name(self):
        _, out = self.join("me", Receipt="non-destructive")
        (nack,) = out.take()
        self.assertEqual(nack.error, errors.PROT_ERROR)
        self.assertIn("Proxy.Client", nack.message)

    def test_one_copy_for_a_client_in_two_sessions(self):
        a, a_out = self.join("work")
        wa = self.subscribe(a, a_out, "require(n)")
        b, b_out = self.join("home")
        hb = self.subscribe(b, b_out, "require(n)")
        a.connection_lost()
        b.connection_lost()
        self.publish({"n": 1})
        self.assertEqual(self.store.counts()["notifications"], 1)   # one stored copy
        both, out = self.connect({"Proxy.Session": "work", "Proxy.Session.2": "home"})
        (note,) = self.delivered(out)
        self.assertEqual(sorted(note.secure_matches + note.insecure_matches), [wa, hb])
        self.publish({"n": 2})
        (note,) = self.delivered(out)
        self.assertEqual(sorted(note.secure_matches + note.insecure_matches), [wa, hb])

    def test_joining_tells_the_subscriptions_and_changes_reach_other_clients(self):
        a, a_out = self.join("s")
        sub = self.subscribe(a, a_out, "require(x)")
        b, b_out = self.join("s")
        self.assertEqual([e.get("Proxy.Expression") for e in self.events(b_out.take())],
                         ["require(x)", None])
        self.request(a, elvin_packets.SubModRqst(3, sub, "require(y)", True, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY))
        self.assertEqual([(e[EVENT], e["Proxy.Expression"]) for e in self.events(b_out.take())],
                         [("subscription", "require(y)")])
        self.publish({"x": 1})
        self.publish({"y": 1})
        self.assertEqual([n.attributes for n in self.delivered(b_out)], [{"y": 1}])
        self.request(a, elvin_packets.SubDelRqst(4, sub))
        self.assertEqual([e[EVENT] for e in self.events(b_out.take())],
                         ["subscription-removed"])
        self.assertEqual(self.upstream.router.subscriptions, {})

    def test_wrong_password_is_an_authorisation_nack_and_leaks_nothing(self):
        client, out = self.join("secret", Password="right", Admin_Password="boss")
        self.subscribe(client, out, "require(x)")
        client.connection_lost()
        self.publish({"x": 1})
        for asked in ({"Password": "wrong"}, {"Admin_Password": "wrong"}, {}):
            _, out = self.join("secret", **asked)
            (nack,) = out.take()
            self.assertEqual(nack.error, errors.AUTHZ_FAIL)
            self.assertNotIn("require", nack.message)
        self.assertEqual(self.store.stored_count("secret"), 1)     # still kept

    def test_join_password_may_receive_but_not_change(self):
        owner, out = self.join("s", Password="pw", Admin_Password="boss")
        sub = self.subscribe(owner, out, "require(x)")
        owner.connection_lost()
        user, out = self.join("s", Password="pw")
        self.assertEqual(self.events(out.take())[-1]["Proxy.Admin"], 0)
        for packet in (elvin_packets.SubAddRqst(8, "require(y)", True, elvin_packets.Keys.EMPTY),
                       elvin_packets.SubDelRqst(9, sub),
                       elvin_packets.QosRqst(10, {"Proxy.Delete-Session": "s"})):
            self.request(user, packet)
            (nack,) = out.take()
            self.assertEqual((nack.xid, nack.error), (packet.xid, errors.AUTHZ_FAIL))
        admin, out = self.join("s", Admin_Password="boss")
        self.assertEqual(self.events(out.take())[-1]["Proxy.Admin"], 1)

    def test_passwords_are_stored_only_as_hashes(self):
        self.join("s", Password="hunter2", Admin_Password="boss")
        record = self.store.session("s")
        for stored in (record.join_hash, record.admin_hash):
            self.assertNotIn(b"hunter2", stored)
            self.assertNotIn(b"boss", stored)
            self.assertEqual(len(stored), 48)

    def test_delete_session(self):
        a, a_out = self.join("s", Admin_Password="boss")
        self.subscribe(a, a_out, "require(x)")
        b, b_out = self.join("s", Admin_Password="boss")
        b_out.take()
        self.request(a, elvin_packets.QosRqst(11, {"Proxy.Delete-Session": "s"}))
        reply = a_out.take()[0]
        self.assertIsInstance(reply, elvin_packets.QosRply)
        self.assertEqual(reply.options["Proxy.Delete-Session"], "s")      # echoed
        self.assertEqual([e[EVENT] for e in self.events(b_out.take())], ["session-deleted"])
        self.assertIsNone(self.store.session("s"))
        self.assertEqual(self.upstream.router.subscriptions, {})

    # -- limits ------------------------------------------------------------------

    def test_session_limit(self):
        self.setUp(max_sessions=1)
        self.join("one")
        _, out = self.join("two")
        (nack,) = out.take()
        self.assertEqual(nack.error, errors.IMPL_LIMIT)
        self.assertEqual(self.store.sessions(), ["one"])

    def test_subscriptions_per_session_limit(self):
        self.setUp(max_session_subscriptions=2)
        client, out = self.join("s")
        self.subscribe(client, out, "require(a)")
        self.subscribe(client, out, "require(b)")
        with self.assertRaises(NackError) as caught:
            self.subscribe(client, out, "require(c)")
        self.assertEqual(caught.exception.code, errors.IMPL_LIMIT)

    def test_stored_limit_drops_oldest_and_warns_next_client(self):
        self.setUp(max_stored=3)
        client, out = self.join("s")
        self.subscribe(client, out, "require(n)")
        client.connection_lost()
        for n in range(5):
            self.publish({"n": n})
        client, out = self.join("s")
        packets = out.take()
        self.assertEqual(self.events(packets)[-1]["Proxy.Dropped"], 2)
        self.assertEqual(sum(isinstance(p, elvin_packets.DropWarn) for p in packets), 1)
        self.assertEqual([p.attributes["n"] for p in packets
                          if isinstance(p, elvin_packets.NotifyDeliver) and EVENT not in p.attributes],
                         [2, 3, 4])

    # -- upstream ------------------------------------------------------------------

    def test_upstream_loss_keeps_sessions_and_resubscribes(self):
        client, out = self.join("s")
        sub = self.subscribe(client, out, "require(n)")
        self.upstream.down()
        self.request(client, elvin_packets.SubAddRqst(20, "require(m)", True, elvin_packets.Keys.EMPTY))
        (reply,) = out.take()
        self.assertEqual(reply.xid, 20)          # accepted while upstream is away
        self.request(client, elvin_packets.NotifyEmit({"m": 7}, True, elvin_packets.Keys.EMPTY))
        self.upstream = upstream = InProcessUpstream()
        upstream.core = self.core
        self.core.upstream = upstream
        upstream.up()
        self.assertEqual(len(upstream.router.subscriptions), 2)
        # the notification kept while upstream was down went out, and matched
        (note,) = self.delivered(out)
        self.assertEqual(note.attributes, {"m": 7})
        self.publish({"n": 1})
        (note,) = self.delivered(out)
        self.assertEqual(list(note.secure_matches + note.insecure_matches), [sub])

    def test_upstream_refusal_is_relayed(self):
        self.upstream.router.max_subscriptions = 0
        client, out = self.connect()
        out.take()
        with self.assertRaises(NackError) as caught:
            self.subscribe(client, out, "require(x)")
        self.assertEqual(caught.exception.code, errors.IMPL_LIMIT)
        self.assertEqual(self.core.subscriptions, {})

    def test_restart_restores_sessions_keys_and_stored(self):
        nfn, sub_keys = consumer_keys(b"consumer secret")
        client, out = self.connect({"Proxy.Session": "s"}, sub_keys=sub_keys)
        sub = self.subscribe(client, out, "require(n)")
        client.connection_lost()
        self.publish({"n": 1}, keys=nfn, deliver_insecure=False)
        self.restart()
        self.publish({"n": 2}, keys=nfn, deliver_insecure=False)
        self.publish({"n": 3}, deliver_insecure=False)          # no keys: not for us
        client, out = self.join("s")
        notes = self.delivered(out)
        self.assertEqual([n.attributes["n"] for n in notes], [1, 2])
        self.assertEqual([tuple(n.secure_matches) for n in notes], [(sub,), (sub,)])

    def test_keys_changed_by_sec_request_reach_upstream(self):
        nfn, sub_keys = producer_keys(b"k")
        client, out = self.join("s")
        self.subscribe(client, out, "require(n)")
        self.publish({"n": 0}, keys=nfn, deliver_insecure=False)
        self.assertEqual(self.delivered(out), [])
        self.request(client, elvin_packets.SecRqst(30, elvin_packets.Keys.EMPTY, elvin_packets.Keys.EMPTY, sub_keys, elvin_packets.Keys.EMPTY))
        self.assertIsInstance(out.take()[-1], elvin_packets.SecRply)
        self.publish({"n": 1}, keys=nfn, deliver_insecure=False)
        self.assertEqual(len(self.delivered(out)), 1)


class TurnCommitTest(ProxyCoreCase):
    """With a reactor, a turn's notifications are committed together, and
    clients get them only after the commit."""

    def setUp(self):
        from twisted.internet.task import Clock as ReactorClock
        self.reactor = ReactorClock()
        super().setUp()
        self.core.call_later = self.reactor.callLater

    def test_delivered_after_commit(self):
        laptop, laptop_out = self.join("me", Receipt="non-destructive", Client="laptop")
        self.subscribe(laptop, laptop_out, "require(n)")
        self.reactor.advance(0)
        laptop_out.take()
        self.publish({"n": 1})
        self.assertTrue(self.store.db.in_transaction)
        self.assertEqual(self.delivered(laptop_out), [])      # not yet committed
        self.reactor.advance(0)
        self.assertFalse(self.store.db.in_transaction)
        self.assertEqual([n.attributes["n"] for n in self.delivered(laptop_out)], [1])


class AdmissionTest(ProxyCoreCase):
    """Passwords are checked off the reactor thread; what a client sends
    meanwhile is handled, in order, once it is admitted."""

    def setUp(self):
        super().setUp()
        self.checks = []

        def later(f):
            d = defer.Deferred()
            self.checks.append((d, f))
            return d
        self.core.in_thread = later

    def run_checks(self):
        checks, self.checks = self.checks, []
        for d, f in checks:
            d.callback(f())

    def test_requests_sent_before_conn_rply_wait(self):
        client, out = self.join("s", Password="pw")
        client.packet_received(elvin_packets.SubAddRqst(40, "require(x)", True, elvin_packets.Keys.EMPTY))
        client.packet_received(elvin_packets.TestConn())
        self.assertEqual(out.take(), [])
        self.run_checks()
        kinds = [type(p).__name__ for p in out.take() if not (
            isinstance(p, elvin_packets.NotifyDeliver) and EVENT in p.attributes)]
        self.assertEqual(kinds[:2], ["ConnRply", "SubRply"])
        self.assertEqual(self.store.subscriptions("s")[0][1], "require(x)")

    def test_a_channel_gone_while_checking_is_forgotten(self):
        client, out = self.join("s", Password="pw")
        client.connection_lost()
        self.run_checks()
        self.assertEqual(out.take(), [])
        self.assertEqual(self.core.sessions, set())

    def test_two_clients_creating_one_session_at_once(self):
        a, a_out = self.join("s", Password="pw")
        b, b_out = self.join("s", Password="other")
        self.run_checks()
        self.assertIsInstance(a_out.take()[0], elvin_packets.ConnRply)
        (nack,) = b_out.take()
        self.assertEqual(nack.error, errors.AUTHZ_FAIL)     # the first made it


class ThrottleOverTheWireTest(ProxyCoreCase):
    """Password failures counted by host, as the real stream protocol gives
    the peer (its port differs at every connect)."""

    def join_over_the_wire(self, host, password, ipv6=False):
        """One connection from ``host`` (a new port each time): its reply."""
        return self.connrqst_over_the_wire(
            host, {"Proxy.Session": "locked", "Proxy.Password": password}, ipv6)

    def throttled(self):
        return self.core.gate.counters.throttled

    def test_one_host_is_throttled_whatever_its_port(self):
        for host, ipv6 in (("127.0.0.1", False), ("::1", True)):
            self.core.gate.peers._used.clear()
            self.core.gate.sessions._used.clear()
            before = self.throttled()
            self.assertIsInstance(self.join_over_the_wire(host, "right", ipv6),
                                  elvin_packets.ConnRply)
            replies = [self.join_over_the_wire(host, f"w{i}", ipv6) for i in range(30)]
            self.assertEqual({r.error for r in replies}, {errors.AUTHZ_FAIL})
            self.assertEqual(self.throttled() - before, 25)   # 5 checked, then refused
            # Refused unchecked even with the right password, until one ages
            # out (the refusals count too, one beyond the burst at most).
            self.assertIsInstance(self.join_over_the_wire(host, "right", ipv6), elvin_packets.Nack)
            self.clock.now += 24
            self.assertIsInstance(self.join_over_the_wire(host, "right", ipv6),
                                  elvin_packets.ConnRply)

    def test_a_session_is_throttled_across_hosts(self):
        self.join_over_the_wire("10.0.0.1", "right")
        for i in range(5):                                    # 10 failures, 2 per host
            for _ in range(2):
                self.join_over_the_wire(f"10.0.3.{i}", "wrong")
        before = self.throttled()
        # A host with failures left of its own is refused: the session's are used.
        self.assertIsInstance(self.join_over_the_wire("10.0.3.0", "right"), elvin_packets.Nack)
        self.assertEqual(self.throttled(), before + 1)
        # A host with no failure is still checked (the owner is not locked out).
        self.assertIsInstance(self.join_over_the_wire("10.0.0.1", "right"),
                              elvin_packets.ConnRply)
        self.clock.now += 12                                  # one back (of 11 counted)
        self.assertIsInstance(self.join_over_the_wire("10.0.3.0", "right"),
                              elvin_packets.ConnRply)


class HTTPTunnelSessionTest(ProxyCoreCase):
    """A session joined over the proxy's HTTP tunnel listener (loopback,
    port 0, the real client) is given what was stored, then live ones, as
    over TCP: the tunnel's protocol is the proxy's, whose draining goes on
    with the replay."""

    timeout = 30

    def setUp(self):
        from twisted.internet import reactor
        super().setUp(call_later=reactor.callLater)
        self.uri, self.site = self.serve(http=True)

    def test_tunnels_serve_the_proxys_protocol(self):
        from elvin.protocols.httptunnel import TunnelServerProtocol, tunnel_protocol
        from elvin.proxy.protocol import ProxyServerProtocol
        made = tunnel_protocol(self.site.elvin_factory)
        self.assertTrue(issubclass(made, TunnelServerProtocol))
        self.assertTrue(issubclass(made, ProxyServerProtocol))

    async def stored_then_live(self, mode):
        from twisted.internet import reactor
        from elvin import client
        from elvin.test.polling import wait_until
        uri = self.uri + (f";mode={mode}" if mode else "")
        phone = await client.connect(uri, session="phone", reactor=reactor)
        await phone.subscribe("require(n)", lambda n: None)
        await phone.close()
        self.publish({"n": 1})
        self.publish({"n": 2})
        got = []
        phone = await client.connect(uri, session="phone", reactor=reactor,
                                     on_notification=got.append)
        try:
            await wait_until(lambda: len(got) == 2, timeout=10)
            self.publish({"n": 3})
            await wait_until(lambda: len(got) == 3, timeout=10)
            self.assertEqual([n["n"] for n in got], [1, 2, 3])
        finally:
            await phone.close()
        # Acknowledged over the tunnel too: nothing is owed any more.
        self.assertEqual(self.store.counts()["notifications"], 0)

    def test_stored_then_live_over_streamed_gets(self):
        return defer.ensureDeferred(self.stored_then_live(None))

    def test_stored_then_live_over_polled_gets(self):
        return defer.ensureDeferred(self.stored_then_live("poll"))


class SessionsPerHostTest(ProxyCoreCase):
    """``max-sessions-per-host``: the sessions one host's clients created
    and the proxy keeps are capped (Nack 2006 for one more), by host
    whatever the port; joining them, and other hosts, go on; a deleted
    session frees its place; the count survives a restart."""

    def setUp(self):
        super().setUp(max_sessions_per_host=3)

    def create(self, host, name, ipv6=False):
        return self.connrqst_over_the_wire(host, {"Proxy.Session": name}, ipv6)

    def test_one_host_creates_at_most_its_share(self):
        for n in range(3):
            self.assertIsInstance(self.create("10.0.0.1", f"s{n}"), elvin_packets.ConnRply)
        nack = self.create("10.0.0.1", "s3")
        self.assertIsInstance(nack, elvin_packets.Nack)
        self.assertEqual(nack.error, errors.IMPL_LIMIT)
        self.assertIn("maximum for one host (3)", nack.message)
        self.assertNotIn("s3", self.core.named)
        # Its sessions are still joined; other hosts still create theirs
        # (an IPv4-mapped IPv6 address is the IPv4 host).
        self.assertIsInstance(self.create("10.0.0.1", "s0"), elvin_packets.ConnRply)
        self.assertIsInstance(self.create("::ffff:10.0.0.1", "s3", ipv6=True),
                              elvin_packets.Nack)
        self.assertIsInstance(self.create("10.0.0.2", "t0"), elvin_packets.ConnRply)
        self.assertEqual(self.core.created_by, {"10.0.0.1": 3, "10.0.0.2": 1})
        # A deleted session (here: expired) frees its place.
        self.core.delete_session(self.core.named["s1"])
        self.assertIsInstance(self.create("10.0.0.1", "s3"), elvin_packets.ConnRply)
        self.assertIsInstance(self.create("10.0.0.1", "s4"), elvin_packets.Nack)

    def test_the_count_is_kept_across_a_restart(self):
        for n in range(3):
            self.create("10.0.0.1", f"s{n}")
        self.restart(max_sessions_per_host=3)
        self.assertEqual(self.core.created_by, {"10.0.0.1": 3})
        self.assertIsInstance(self.create("10.0.0.1", "s3"), elvin_packets.Nack)
        self.restart(max_sessions_per_host=0)                 # 0: no cap
        self.assertIsInstance(self.create("10.0.0.1", "s3"), elvin_packets.ConnRply)

