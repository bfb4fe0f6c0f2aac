"""Evaluate a subscription when some attributes are unknown.

A producer deciding whether anybody could want a notification may not yet
know every attribute's value. ``PartialEvaluator(tree).possible(attrs,
unknown)`` gives the set of results the subscription could take — a subset
of {True, False, None} (None is bottom) — when the attributes in
``unknown`` could have any value (or be absent) and every other attribute
is exactly as in ``attrs``. It is sound: the true result for any
completion of the unknowns is always in the set.

Atomic predicates that read an unknown name could be anything; logic nodes
combine the possible values of their children with the Lukasiewicz
operators.
"""

from elvin.subscription.ast import Kind
from elvin.subscription.compiler import compile_tree

__all__ = ["PartialEvaluator", "ANY"]

ANY = frozenset({True, False, None})


def _and(a, b):
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a, b):
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _xor(a, b):
    if a is None or b is None:
        return None
    return a is not b


def _combine(op, sets):
    result = sets[0]
    for other in sets[1:]:
        result = frozenset(op(a, b) for a in result for b in other)
    return result


class PartialEvaluator:
    """A tree compiled once for repeated partial evaluation."""

    def __init__(self, tree):
        self.tree = tree
        self._plan = self._build(tree)

    def _build(self, node):
        kind = node.kind
        if kind in (Kind.AND, Kind.OR, Kind.XOR, Kind.NOT):
            return (kind, [self._build(c) for c in node.children])
        return ("atom", node.names(), compile_tree(node).fn)

    def possible(self, attrs, unknown=()):
        """Results the subscription could have (a frozenset)."""
        return self._eval(self._plan, attrs, frozenset(unknown))

    def could_match(self, attrs, unknown=()):
        return True in self.possible(attrs, unknown)

    def _eval(self, plan, attrs, unknown):
        kind = plan[0]
        if kind == "atom":
            _, names, fn = plan
            if unknown and not names.isdisjoint(unknown):
                return ANY
            return frozenset([fn(attrs)])
        parts = [self._eval(p, attrs, unknown) for p in plan[1]]
        if kind == Kind.NOT:
            return frozenset(None if v is None else not v for v in parts[0])
        op = {Kind.AND: _and, Kind.OR: _or, Kind.XOR: _xor}[kind]
        return _combine(op, parts)
