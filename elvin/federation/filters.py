"""Federation filters: what a router asks its peers for, and evaluating it.

A filter is ``TRUE``, ``FALSE`` or a subscription tree. On the wire
(FedSubReplace) FALSE is the EMPTY SubAST node and TRUE the constant
expression ``1 == 1`` — the forms the Avis router reads (it folds constants
on receipt; it cannot encode TRUE itself).

The pull filter a router sends a peer is the union of what its side wants:
its local clients' subscriptions plus the pull filters its other peers
sent it, intersected with the link's import filter. When the union grows
beyond ``max_nodes`` it is generalised — each subscription replaced by the
attribute names it requires — which only ever widens it, so a client never
misses a notification because a filter was simplified.
"""

from elvin.errors import SubscriptionError
from elvin.subscription import checker
from elvin.subscription.analysis import required_names
from elvin.subscription.ast import Kind, Node, int32, name, node
from elvin.subscription.compiler import compile_tree

__all__ = ["TRUE", "FALSE", "Filter", "disjuncts", "to_wire", "from_wire", "parse_filter",
           "union", "intersect", "generalise", "node_count", "build_pull_filter"]


class _Constant:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return "TRUE" if self.value else "FALSE"


TRUE = _Constant(True)
FALSE = _Constant(False)

_TRUE_WIRE = node(Kind.EQUALS, int32(1), int32(1))
_FALSE_WIRE = Node(Kind.EMPTY)


class Filter:
    """A compiled filter: ``matches(attrs)`` is True only when it is true."""

    __slots__ = ("tree", "_fn", "nodes")

    def __init__(self, tree):
        self.tree = tree
        self._fn = None     # compiled on first use: routing uses disjuncts()
        self.nodes = 0 if tree is TRUE or tree is FALSE else node_count(tree)

    def matches(self, attributes):
        if self.tree is TRUE:
            return True
        if self.tree is FALSE:
            return False
        if self._fn is None:
            self._fn = compile_tree(self.tree).fn
        return self._fn(attributes) is True

    @property
    def is_false(self):
        return self.tree is FALSE

    def __repr__(self):
        return f"<Filter {self.tree!r}>"


#: Most disjuncts distributing an AND over an OR may make (past it the AND
#: stays one disjunct: still correct, only less selective in the index).
MAX_DISTRIBUTED = 64


def disjuncts(tree):
    """``tree`` as a list of trees whose OR it is, for filing each in a
    subscription index: true exactly when one of them is true (Kleene's
    three-valued OR). TRUE is ``[TRUE]`` and FALSE ``[]``. An AND over an
    OR is distributed (``(a || b) && c`` gives ``a && c``, ``b && c``), so an
    import filter does not hide the pull filter's disjuncts from the index.
    """
    if tree is FALSE:
        return []
    if tree is TRUE:
        return [TRUE]
    if tree.kind == Kind.OR:
        return [part for child in tree.children for part in disjuncts(child)]
    if tree.kind == Kind.AND:
        products = [[]]
        for child in tree.children:
            options = disjuncts(child) if child.kind in (Kind.OR, Kind.AND) else [child]
            if len(products) * len(options) > MAX_DISTRIBUTED:
                return [tree]
            products = [done + [option] for done in products for option in options]
        if len(products) == 1:
            return [tree]
        return [parts[0] if len(parts) == 1 else Node(Kind.AND, None, parts)
                for parts in products]
    return [tree]


def node_count(tree):
    if tree is TRUE or tree is FALSE:
        return 0
    return sum(1 for _ in tree.walk())


def to_wire(tree):
    """The SubAST to send for a filter."""
    if tree is TRUE:
        return _TRUE_WIRE
    if tree is FALSE:
        return _FALSE_WIRE
    return tree


def from_wire(tree):
    """A filter tree (or TRUE/FALSE) from a received SubAST.

    Raises SubscriptionError if the tree is malformed. Constant trees are
    accepted here (unlike client subscriptions): a peer may ask for all or
    nothing.
    """
    if tree.kind == Kind.EMPTY:
        if tree.children:
            raise SubscriptionError(2101, 0, "EMPTY filter node with children")
        return FALSE
    checker.check(tree)
    compiled = compile_tree(tree)
    if compiled.const:
        return TRUE if compiled.value is True else FALSE
    return tree


def parse_filter(text):
    """A filter from config text: TRUE, FALSE or a subscription expression."""
    stripped = text.strip()
    if stripped.upper() == "TRUE":
        return TRUE
    if stripped.upper() == "FALSE":
        return FALSE
    from elvin.subscription import parse
    return parse(stripped)


def union(trees):
    """OR of filters, folding TRUE/FALSE and duplicates."""
    parts = []
    seen = set()
    for tree in trees:
        if tree is TRUE:
            return TRUE
        if tree is FALSE:
            continue
        if tree in seen:
            continue
        seen.add(tree)
        parts.append(tree)
    if not parts:
        return FALSE
    if len(parts) == 1:
        return parts[0]
    return Node(Kind.OR, None, parts)


def intersect(a, b):
    if a is FALSE or b is FALSE:
        return FALSE
    if a is TRUE:
        return b
    if b is TRUE:
        return a
    return node(Kind.AND, a, b)


def _requirement(tree):
    """The weakest filter implied by ``tree``: its required names."""
    if tree is TRUE or tree is FALSE:
        return tree
    names = sorted(required_names(tree))
    if not names:
        return TRUE
    requires = [node(Kind.FUNC_REQUIRE, name(n)) for n in names]
    return requires[0] if len(requires) == 1 else Node(Kind.AND, None, requires)


def generalise(trees, max_nodes):
    """Union of ``trees``, widened until it has at most ``max_nodes`` nodes."""
    exact = union(trees)
    if node_count(exact) <= max_nodes:
        return exact
    widened = union(_requirement(t) for t in trees)
    if node_count(widened) <= max_nodes:
        return widened
    # Still too big: any one required name per subscription.
    names = set()
    for tree in trees:
        if tree is TRUE:
            return TRUE
        if tree is FALSE:
            continue
        required = required_names(tree)
        if not required:
            return TRUE
        names.add(min(required))
    coarse = union(node(Kind.FUNC_REQUIRE, name(n)) for n in sorted(names))
    if node_count(coarse) <= max_nodes:
        return coarse
    return TRUE


def build_pull_filter(local_trees, peer_filters, import_filter, max_nodes):
    """What to ask one peer for (see module docstring)."""
    wanted = generalise(list(local_trees) + list(peer_filters), max_nodes)
    return intersect(wanted, import_filter)


def marker(attribute):
    """``require(attribute)``: a disjunct a router adds to its pull filters
    to tell peers what it is (elvin.federation.mesh.MARKER_NAME)."""
    return node(Kind.FUNC_REQUIRE, name(attribute))


def with_marker(tree, mark):
    """``tree || mark``, kept non-constant so the mark survives TRUE."""
    if tree is FALSE:
        return mark
    if tree is TRUE:
        return Node(Kind.OR, None, [_TRUE_WIRE, mark])
    return union([tree, mark])


def strip_marker(tree, mark):
    """(``tree`` without a top-level ``mark`` disjunct, whether it had one)."""
    if tree is TRUE or tree is FALSE:
        return tree, False
    if tree == mark:
        return FALSE, True
    if tree.kind != Kind.OR:
        return tree, False
    parts = []
    stack = list(reversed(tree.children))
    while stack:
        child = stack.pop()
        if child.kind == Kind.OR:
            stack.extend(reversed(child.children))
        else:
            parts.append(child)
    if mark not in parts:
        return tree, False
    rest = [TRUE if part == _TRUE_WIRE else part for part in parts if part != mark]
    return union(rest), True
