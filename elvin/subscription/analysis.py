"""What a subscription needs of a notification before it can be true.

Used by the matching index (and by quench and federation), these are sound
over-approximations under Elvin's three-valued logic: if a notification
lacks a name in ``required_names(tree)``, or does not carry one of the
values ``equality_constraints(tree)`` lists for a name, the subscription
cannot evaluate to true. Nothing here ever rules out a real match.

For every node we compute the names needed for it to be *true* (T) and for
it to be *false* (F). An atomic predicate is bottom when any name it reads
is missing, so T = F = its names; ``!`` swaps T and F; ``&&`` is true when
all children are (T = union) and false when one is (F = intersection);
``||`` is the dual; ``^^`` needs every child defined.
"""

from elvin.subscription.ast import Kind, LITERAL_KINDS
from elvin.values import Int64

__all__ = ["required_names", "equality_constraints", "equality_recipe",
           "apply_equality_recipe", "range_constraints", "range_recipe",
           "apply_range_recipe", "index_key", "names_compared", "or_parts"]

_LOGICAL = {Kind.AND, Kind.OR, Kind.XOR, Kind.NOT}


def or_parts(tree):
    """The trees ``tree`` is the OR of at its top (nested ORs flattened,
    nothing distributed); ``[tree]`` when it is no OR."""
    parts = []
    stack = [tree]
    while stack:
        part = stack.pop()
        if part.kind == Kind.OR:
            stack.extend(part.children)
        else:
            parts.append(part)
    return parts


def _atomic_names(node):
    """Names whose absence makes the atomic predicate ``node`` bottom."""
    kind = node.kind
    if kind == Kind.FUNC_EQUALS or kind in (
            Kind.FUNC_BEGINS_WITH, Kind.FUNC_CONTAINS, Kind.FUNC_ENDS_WITH,
            Kind.FUNC_WILDCARD, Kind.FUNC_REGEX):
        # equals(x, y, 1) can be true with y missing; patterns are literals.
        return node.children[0].names()
    return node.names()


def _true_false(node):
    kind = node.kind
    if kind not in _LOGICAL:
        names = _atomic_names(node)
        return names, names
    parts = [_true_false(c) for c in node.children]
    if kind == Kind.NOT:
        t, f = parts[0]
        return f, t
    if kind == Kind.AND:
        return (frozenset().union(*(t for t, _ in parts)),
                frozenset.intersection(*(f for _, f in parts)))
    if kind == Kind.OR:
        return (frozenset.intersection(*(t for t, _ in parts)),
                frozenset().union(*(f for _, f in parts)))
    defined = frozenset().union(*(t & f for t, f in parts))
    return defined, defined


def required_names(tree):
    """Names that must all be present for ``tree`` to be true."""
    return _true_false(tree)[0]


def index_key(value):
    """The hashable key under which an attribute value is indexed.

    Numbers are compared as Elvin promotes them (to real64 when mixed), so
    they are keyed by their real64 value; strings by themselves. Opaque
    values are never equal to anything, and have no key (None).
    """
    kind = type(value)
    if kind is str:
        return value
    if kind is int or kind is float or kind is Int64:
        return float(value)
    return None


def _literal_key(node):
    if node.kind == Kind.STRING:
        return node.value
    if node.kind in (Kind.INT32, Kind.INT64, Kind.REAL64):
        return float(node.value)
    return None


def _equalities(node):
    """{name: frozenset(keys)} that must hold for ``node`` to be true."""
    kind = node.kind
    if kind == Kind.EQUALS:
        left, right = node.children
        if left.kind == Kind.NAME and right.kind in LITERAL_KINDS:
            return {left.value: frozenset([_literal_key(right)])}
        if right.kind == Kind.NAME and left.kind in LITERAL_KINDS:
            return {right.value: frozenset([_literal_key(left)])}
        return {}
    if kind == Kind.FUNC_EQUALS:
        subject, *choices = node.children
        if subject.kind == Kind.NAME and all(c.kind in LITERAL_KINDS for c in choices):
            return {subject.value: frozenset(_literal_key(c) for c in choices)}
        return {}
    if kind == Kind.AND:
        result = {}
        for child in node.children:
            for name, keys in _equalities(child).items():
                result[name] = result[name] & keys if name in result else keys
        return result
    if kind == Kind.OR:
        parts = [_equalities(c) for c in node.children]
        common = set(parts[0]).intersection(*parts[1:])
        return {name: frozenset().union(*(p[name] for p in parts)) for name in common}
    return {}


def equality_constraints(tree):
    """Per name, the values (as ``index_key`` keys) one of which must match.

    Only constraints that hold whenever ``tree`` is true are reported; an
    empty set for a name means the subscription can never be true.
    """
    return _equalities(tree)


def equality_recipe(tree, position):
    """``equality_constraints(tree)`` as a function of its literals alone,
    for a shape shared by many subscriptions: ``{name: (index, ...)}``,
    where the keys for ``name`` are those of the literals at those indices
    (``position(leaf)``), or None when the constraints are not such a union
    (two equalities on one name under ``&&`` intersect, and an empty
    intersection would need the values to say so)."""
    kind = tree.kind
    if kind == Kind.EQUALS:
        left, right = tree.children
        if left.kind == Kind.NAME and right.kind in LITERAL_KINDS:
            return {left.value: (position(right),)}
        if right.kind == Kind.NAME and left.kind in LITERAL_KINDS:
            return {right.value: (position(left),)}
        return {}
    if kind == Kind.FUNC_EQUALS:
        subject, *choices = tree.children
        if subject.kind == Kind.NAME and all(c.kind in LITERAL_KINDS for c in choices):
            return {subject.value: tuple(position(c) for c in choices)}
        return {}
    if kind == Kind.AND:
        result = {}
        for child in tree.children:
            part = equality_recipe(child, position)
            if part is None:
                return None
            for name, indices in part.items():
                if name in result:
                    return None
                result[name] = indices
        return result
    if kind == Kind.OR:
        parts = [equality_recipe(c, position) for c in tree.children]
        if any(p is None for p in parts):
            return None
        common = set(parts[0]).intersection(*parts[1:])
        return {name: tuple(i for p in parts for i in p[name]) for name in common}
    return {}


def apply_equality_recipe(recipe, values):
    """The ``equality_constraints`` a recipe gives for literals ``values``."""
    return {name: frozenset([v if v.__class__ is str else float(v)
                             for v in [values[i] for i in indices]])
            for name, indices in recipe.items()}


_BOUNDS = {Kind.GREATER_THAN: (True, False), Kind.GREATER_THAN_EQUALS: (True, False),
           Kind.LESS_THAN: (False, True), Kind.LESS_THAN_EQUALS: (False, True),
           Kind.EQUALS: (True, True)}
_FLIPPED = {Kind.GREATER_THAN: Kind.LESS_THAN, Kind.GREATER_THAN_EQUALS: Kind.LESS_THAN_EQUALS,
            Kind.LESS_THAN: Kind.GREATER_THAN, Kind.LESS_THAN_EQUALS: Kind.GREATER_THAN_EQUALS,
            Kind.EQUALS: Kind.EQUALS}
_NUMBER_LITERALS = frozenset({Kind.INT32, Kind.INT64, Kind.REAL64})
_INF = float("inf")


def _bound(node):
    """(name, op, literal) for ``name OP number`` (OP an ordering or ==,
    the literal moved to the right), else None."""
    op = node.kind
    if op not in _BOUNDS:
        return None
    left, right = node.children
    if left.kind == Kind.NAME and right.kind in _NUMBER_LITERALS:
        return left.value, op, right
    if right.kind == Kind.NAME and left.kind in _NUMBER_LITERALS:
        return right.value, _FLIPPED[op], left
    return None


def _narrow(result, name, op, value):
    lo, hi = result.get(name, (-_INF, _INF))
    sets_lo, sets_hi = _BOUNDS[op]
    if sets_lo and value > lo:
        lo = value
    if sets_hi and value < hi:
        hi = value
    result[name] = (lo, hi)


def range_constraints(tree):
    """``{name: (lo, hi)}``: for ``tree`` to be true, attribute ``name``
    must be a number in the closed interval [lo, hi] (floats; a side may
    be infinite). Read from a comparison of a name with a number literal,
    or from the comparisons an ``&&`` joins (its other operands add
    nothing). A comparison with a non-number is never true (bottom), and a
    NaN fails every comparison, so this holds in three-valued logic."""
    result = {}
    for child in tree.children if tree.kind == Kind.AND else (tree,):
        found = _bound(child)
        if found is not None:
            name, op, literal = found
            _narrow(result, name, op, float(literal.value))
    return result


def range_recipe(tree, position):
    """``range_constraints(tree)`` as a function of its literals alone:
    ``(name, op, index)`` per bound, ``index`` being ``position(literal)``."""
    recipe = []
    for child in tree.children if tree.kind == Kind.AND else (tree,):
        found = _bound(child)
        if found is not None:
            name, op, literal = found
            recipe.append((name, op, position(literal)))
    return tuple(recipe)


def apply_range_recipe(recipe, values):
    """The ``range_constraints`` a recipe gives for literals ``values``."""
    result = {}
    for name, op, index in recipe:
        _narrow(result, name, op, float(values[index]))
    return result


def names_compared(tree):
    """(name, operator, name) for each ``==`` or ``!=`` between two attribute names,
    in the tree's order: ``Group == chat`` with the quotes forgotten is
    such a comparison, and never matches a notification without a ``chat``
    attribute, so the tools warn of it."""
    found = []
    todo = [tree]
    while todo:
        here = todo.pop()
        if (here.kind in (Kind.EQUALS, Kind.NOT_EQUALS) and len(here.children) == 2
                and all(c.kind is Kind.NAME for c in here.children)):
            found.append((here.children[0].value,
                          "==" if here.kind is Kind.EQUALS else "!=",
                          here.children[1].value))
        todo.extend(reversed(here.children))
    return found
