"""Quench from the client's side: callbacks, QuenchState, auto-quench."""

from twisted.internet import defer
from twisted.trial import unittest

from elvin.client import AutoQuench, QuenchState
from elvin.subscription import Subscription, parse
from elvin.subscription.partial import PartialEvaluator
from elvin.test.test_integration import RouterFixture, wait_until


class PartialEvaluatorTests(unittest.TestCase):
    def possible(self, text, attrs, unknown=()):
        return PartialEvaluator(parse(text)).possible(attrs, unknown)

    def test_known_attributes_evaluate_exactly(self):
        self.assertEqual(self.possible("a == 1", {"a": 1}), {True})
        self.assertEqual(self.possible("a == 1", {"a": 2}), {False})
        self.assertEqual(self.possible("a == 1", {}), {None})

    def test_unknown_attributes_could_be_anything(self):
        self.assertEqual(self.possible("a == 1 && b == 2", {"a": 1}, {"b"}),
                         {True, False, None})
        self.assertEqual(self.possible("a == 1 && b == 2", {"a": 3}, {"b"}), {False})
        self.assertEqual(self.possible("a == 1 || b == 2", {"a": 1}, {"b"}), {True})
        self.assertEqual(self.possible("!(b == 2)", {}, {"b"}), {True, False, None})

    def test_sound_against_every_completion(self):
        tree = parse("(a > 1 && b < 5) || !(c == 'x') ^^ require(d)")
        sub = Subscription.from_ast(tree)
        evaluator = PartialEvaluator(tree)
        values = [None, 0, 3, 10, "x", "y"]
        for a in values:
            for b in values:
                known = {k: v for k, v in (("a", a),) if v is not None}
                possible = evaluator.possible(known, {"b", "c", "d"})
                for c in values:
                    for d in (None, 1):
                        full = dict(known)
                        for k, v in (("b", b), ("c", c), ("d", d)):
                            if v is not None:
                                full[k] = v
                        self.assertIn(sub.evaluate(full), possible)


class QuenchStateTests(unittest.TestCase):
    def test_could_interest(self):
        state = QuenchState()
        self.assertFalse(state.could_interest({"a": 1}))
        state.add(1, parse("a > 5"))
        self.assertFalse(state.could_interest({"a": 1}))
        self.assertTrue(state.could_interest({"a": 9}))
        self.assertTrue(state.could_interest({}, unknown={"a"}))
        state.delete(1)
        self.assertFalse(state.could_interest({"a": 9}))


class QuenchOverTcpTests(RouterFixture):
    @defer.inlineCallbacks
    def test_quench_callbacks_carry_router_asts(self):
        quencher = yield self.connect()
        consumer = yield self.connect()
        events = []
        yield consumer.subscribe("price > 10", lambda n: None)
        yield quencher.quench(["price"],
                              on_add=lambda t, tree, s: events.append(("add", t, tree)),
                              on_modify=lambda t, tree, s: events.append(("mod", t, tree)),
                              on_delete=lambda t: events.append(("del", t)))
        yield wait_until(lambda: events)
        sub = yield consumer.subscribe('price < 3 && sym == "X"', lambda n: None)
        yield sub.modify("price < 4")
        yield sub.remove()
        yield wait_until(lambda: len(events) == 4)
        self.assertEqual([e[0] for e in events], ["add", "add", "mod", "del"])
        self.assertEqual(events[0][2], parse("price > 10"))
        self.assertEqual(events[1][2], parse('price < 3 && sym == "X"'))
        self.assertEqual(events[2][2], parse("price < 4"))
        self.assertEqual(events[3][1], sub.id)

    @defer.inlineCallbacks
    def test_auto_quench_starts_and_stops_with_subscribers(self):
        producer = yield self.connect()
        consumer = yield self.connect()
        auto = AutoQuench(producer, names={"file", "size"})
        yield auto.ready
        got = []
        self.assertFalse(auto.notify({"file": "a.txt", "size": 1}))
        sub = yield consumer.subscribe('file == "b.txt"', got.append)
        yield wait_until(lambda: auto.state)
        self.assertFalse(auto.notify({"file": "a.txt", "size": 1}))
        self.assertTrue(auto.notify({"file": "b.txt", "size": 2}))
        yield wait_until(lambda: got)
        self.assertEqual([n["file"] for n in got], ["b.txt"])
        yield sub.remove()
        yield wait_until(lambda: not auto.state)
        self.assertFalse(auto.notify({"file": "b.txt", "size": 3}))
        self.assertEqual((auto.sent, auto.dropped), (1, 3))

    @defer.inlineCallbacks
    def test_auto_quench_learns_new_names(self):
        producer = yield self.connect()
        consumer = yield self.connect()
        yield consumer.subscribe("temp > 30", lambda n: None)
        auto = AutoQuench(producer)
        # Registering: sent (a subscription on "temp" is not known yet).
        self.assertTrue(auto.notify({"temp": 20}))
        yield wait_until(lambda: auto.quench is not None and auto._pending is None)
        self.assertTrue(auto.notify({"temp": 35}))
        self.assertFalse(auto.notify({"temp": 20}))
