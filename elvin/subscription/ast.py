"""The subscription abstract syntax tree.

Node kinds are exactly the SubAST typecodes of the client protocol
(section 8.2.3.4), because the same tree is evaluated by the router, sent to
quenchers in SubAddNotify/SubModNotify, and used as a federation filter.
Trees are immutable and compare by value, so a tree decoded from the wire
can be checked against the router's own parse.
"""

import math

from elvin.subscription.kinds import LEAF_KINDS, LITERAL_KINDS, Kind
from elvin.subscription.printer import to_text

__all__ = ["Kind", "Node", "LEAF_KINDS", "LITERAL_KINDS", "name", "int32",
           "int64", "real64", "string", "node"]



_INT32_RANGE = (-(1 << 31), (1 << 31) - 1)
_INT64_RANGE = (-(1 << 63), (1 << 63) - 1)


class Node:
    """One immutable SubAST node.

    Leaves (name and literals) carry ``value`` and no children; every other
    kind carries a tuple of ``children`` and ``value`` None.
    """

    __slots__ = ("kind", "value", "children", "_hash")

    def __init__(self, kind, value=None, children=()):
        kind = Kind(kind)
        children = tuple(children)
        if kind in LEAF_KINDS:
            if children:
                raise ValueError(f"{kind.name} node takes a value, not children")
            value = _check_leaf(kind, value)
        elif value is not None:
            raise ValueError(f"{kind.name} node takes children, not a value")
        for child in children:
            if not isinstance(child, Node):
                raise TypeError(f"child of {kind.name} is not a Node: {child!r}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "children", children)
        object.__setattr__(self, "_hash", None)

    @classmethod
    def _trusted(cls, kind, value, children):
        """Build without validation (the parser has already checked)."""
        self = object.__new__(cls)
        setter = object.__setattr__
        setter(self, "kind", kind)
        setter(self, "value", value)
        setter(self, "children", children)
        setter(self, "_hash", None)
        return self

    def __setattr__(self, attr, value):
        raise AttributeError("subscription AST nodes are immutable")

    def __delattr__(self, attr):
        raise AttributeError("subscription AST nodes are immutable")

    @property
    def is_leaf(self):
        return self.kind in LEAF_KINDS

    def __eq__(self, other):
        if not isinstance(other, Node):
            return NotImplemented
        if self is other:
            return True
        if self.kind != other.kind:
            return False
        if self.kind == Kind.REAL64:
            # Bitwise comparison, so NaN equals NaN and 0.0 differs from -0.0.
            return math.copysign(1.0, self.value) == math.copysign(1.0, other.value) and (
                self.value == other.value or (self.value != self.value and other.value != other.value))
        return self.value == other.value and self.children == other.children

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self):
        if self._hash is None:
            value = self.value
            if self.kind == Kind.REAL64 and value != value:
                value = "nan"
            object.__setattr__(self, "_hash", hash((self.kind, value, self.children)))
        return self._hash

    def __repr__(self):
        if self.is_leaf:
            return f"Node({self.kind.name}, {self.value!r})"
        inner = ", ".join(repr(c) for c in self.children)
        return f"Node({self.kind.name}, [{inner}])"

    def __str__(self):
        return to_text(self)

    def walk(self):
        """Yield this node and every descendant, parents first."""
        stack = [self]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(reversed(current.children))

    def names(self):
        """The set of attribute names this tree refers to."""
        return frozenset(n.value for n in self.walk() if n.kind == Kind.NAME)

    def depth(self):
        """Height of the tree (a leaf has depth 1)."""
        best = 0
        stack = [(self, 1)]
        while stack:
            current, d = stack.pop()
            if d > best:
                best = d
            for child in current.children:
                stack.append((child, d + 1))
        return best


def _check_leaf(kind, value):
    if kind == Kind.NAME or kind == Kind.STRING:
        if not isinstance(value, str):
            raise TypeError(f"{kind.name} value must be str, not {type(value).__name__}")
        return value
    if kind == Kind.REAL64:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"REAL64 value must be float, not {type(value).__name__}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{kind.name} value must be int, not {type(value).__name__}")
    low, high = _INT32_RANGE if kind == Kind.INT32 else _INT64_RANGE
    if not low <= value <= high:
        raise ValueError(f"{value} out of range for {kind.name}")
    return int(value)


def name(attribute):
    return Node(Kind.NAME, attribute)


def int32(value):
    return Node(Kind.INT32, value)


def int64(value):
    return Node(Kind.INT64, value)


def real64(value):
    return Node(Kind.REAL64, value)


def string(value):
    return Node(Kind.STRING, value)


def node(kind, *children):
    return Node(kind, None, children)
