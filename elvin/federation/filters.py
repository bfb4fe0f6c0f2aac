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
from elvin.subscription.analysis import or_parts, required_names
from elvin.subscription.ast import Kind, Node, int32, name, node
from elvin.subscription.compiler import compile_tree

__all__ = ["TRUE", "FALSE", "Filter", "disjuncts", "to_wire", "from_wire", "parse_filter",
           "union", "intersect", "generalise", "node_count", "build_pull_filter",
           "top_disjuncts", "covers", "LocalInterest", "requirement"]


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


def top_disjuncts(tree):
    """The trees ``tree`` is the OR of at its top (ORs flattened, nothing
    distributed), as a frozenset; TRUE and FALSE as themselves."""
    if tree is TRUE or tree is FALSE or tree is None:
        return frozenset([tree])
    return frozenset(or_parts(tree))


def covers(parts, tree, requirement):
    """Is a filter whose ``top_disjuncts`` are ``parts`` surely true for
    every notification a subscription is true for? The subscription is
    given by its ``tree`` (None if not at hand) and its ``requirement``
    form (``LocalInterest.requirement_of``). Only what ``build_pull_filter``
    makes is recognised: the tree itself, or what ``generalise`` widens it
    to (its required names, all or the first); False means "not known to"."""
    if TRUE in parts or _TRUE_WIRE in parts or (tree is not None and tree in parts):
        return True
    if requirement is None or requirement is TRUE or requirement is FALSE:
        return False
    if requirement in parts:
        return True
    return _first_require(requirement) in parts


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


def requirement(tree):
    """The weakest filter implied by ``tree``: its required names."""
    if tree is TRUE or tree is FALSE:
        return tree
    return _requiring(required_names(tree))


def _requiring(names):
    """``require(a) && require(b) ...`` over ``names`` in order, or TRUE
    for none: a subscription's ``requirement`` from its required names."""
    requires = [node(Kind.FUNC_REQUIRE, name(n)) for n in sorted(names)]
    if not requires:
        return TRUE
    return requires[0] if len(requires) == 1 else Node(Kind.AND, None, requires)


def _first_require(requirement):
    """The ``require`` of a (non-constant) requirement's first name: what
    ``generalise``'s coarsest step widens a subscription to."""
    return requirement if requirement.kind == Kind.FUNC_REQUIRE else requirement.children[0]


def generalise(trees, max_nodes):
    """Union of ``trees``, widened until it has at most ``max_nodes`` nodes."""
    trees = list(trees)
    return _generalise(trees, [requirement(t) for t in trees], max_nodes)


def _generalise(exact, requirements, max_nodes):
    """``generalise`` given the trees (None: known to be over ``max_nodes``)
    and their ``requirement`` forms, in the same order."""
    if exact is not None:
        tree = union(exact)
        if node_count(tree) <= max_nodes:
            return tree
    widened = union(requirements)
    if node_count(widened) <= max_nodes:
        return widened
    # Still too big: any one required name per subscription (the first of
    # a requirement's sorted names).
    coarse = {}
    for requirement in requirements:
        if requirement is TRUE:
            return TRUE
        if requirement is FALSE:
            continue
        first = _first_require(requirement)
        coarse[first.children[0].value] = first
    tree = union(coarse[n] for n in sorted(coarse))
    if node_count(tree) <= max_nodes:
        return tree
    return TRUE


class LocalInterest:
    """The router's own subscriptions as a pull filter needs them, kept one
    subscription at a time: each one's ``requirement`` form counted (few
    distinct ones), and each tree only while their union is small enough
    to be sent exactly. A filter then costs the distinct forms, not a pass
    over every subscription and its tree, which would make placing
    subscriptions on a federated router quadratic."""

    def __init__(self):
        self._requirement_of = {}       # key -> requirement form
        self._forms = {}                # frozenset of names -> requirement form
        self._tree_of = {}              # key -> tree, while exact is kept
        self.requirements = {}          # requirement form -> count
        #: Distinct trees -> count; None once their nodes passed the limit
        #: (``exact_trees`` asks for them again when they may fit).
        self._exact = {}
        self._exact_nodes = 0
        self._limit = 0                 # the max_nodes exact was last kept for
        self._overflowed_at = 0         # how many subscriptions there were then

    def __len__(self):
        return len(self._requirement_of)

    def requirement_of(self, key):
        return self._requirement_of.get(key)

    def tree_of(self, key):
        """The subscription's tree while exact trees are kept, else None."""
        return self._tree_of.get(key)

    def add(self, key, required, tree):
        """Subscription ``key`` requires the names ``required``
        (``analysis.required_names``) and has the tree ``tree()``, asked
        for only while exact trees are kept. Replaces what ``key`` had."""
        if key in self._requirement_of:
            self.remove(key)
        required = frozenset(required)
        requirement = self._forms.get(required)
        if requirement is None:
            requirement = self._forms[required] = _requiring(required)
        self._requirement_of[key] = requirement
        self.requirements[requirement] = self.requirements.get(requirement, 0) + 1
        if self._exact is not None:
            self._add_exact(key, tree())

    def _add_exact(self, key, tree):
        exact = self._exact
        self._tree_of[key] = tree
        count = exact.get(tree, 0)
        exact[tree] = count + 1
        if not count:
            self._exact_nodes += node_count(tree)
            if self._limit and self._exact_nodes > self._limit:
                self._drop_exact()

    def remove(self, key):
        requirement = self._requirement_of.pop(key, None)
        if requirement is None:
            return
        count = self.requirements[requirement] - 1
        if count:
            self.requirements[requirement] = count
        else:
            del self.requirements[requirement]
        tree = self._tree_of.pop(key, None)
        if tree is not None and self._exact is not None:
            count = self._exact[tree] - 1
            if count:
                self._exact[tree] = count
            else:
                del self._exact[tree]
                self._exact_nodes -= node_count(tree)

    def _drop_exact(self):
        self._exact = None
        self._tree_of = {}
        self._exact_nodes = 0
        self._overflowed_at = len(self._requirement_of)

    def exact_trees(self, max_nodes, trees):
        """The distinct trees, or None when their union is known to be over
        ``max_nodes``. ``trees()`` yields every (key, tree) again: called to
        keep them anew once there are half as many subscriptions as when
        they were dropped, or the limit grew."""
        if self._exact is None and (len(self._requirement_of) * 2 <= self._overflowed_at
                                    or max_nodes > self._limit):
            self._exact, self._exact_nodes, self._tree_of = {}, 0, {}
            self._limit = max_nodes
            for key, tree in trees():
                self._add_exact(key, tree)
                if self._exact is None:
                    break
        self._limit = max_nodes
        if self._exact is not None and self._exact_nodes > max_nodes:
            self._drop_exact()
        return None if self._exact is None else list(self._exact)


def build_pull_filter(local, peer_filters, import_filter, max_nodes, trees):
    """What to ask one peer for (see module docstring): ``local`` is the
    router's ``LocalInterest`` (``trees`` as its ``exact_trees`` takes)."""
    peer_filters = list(peer_filters)
    exact = local.exact_trees(max_nodes, trees)
    requirements = list(local.requirements) + [requirement(p) for p in peer_filters]
    wanted = _generalise(None if exact is None else exact + peer_filters, requirements,
                         max_nodes)
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
