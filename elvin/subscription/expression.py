"""The Subscription class and ``parse``: the language's front door.

It lives in its own module so that importing the ``elvin.subscription``
package stays light (the package resolves these names on first use), and
the XDR codec can use the tree types without the package importing the
codec back.
"""

import sys

from elvin import errors
from elvin.errors import SubscriptionError
from elvin.protocols.xdr import decode_ast, encode_ast
from elvin.subscription import checker, compiler, parser
from elvin.subscription.ast import Node
from elvin.subscription.printer import to_text
from elvin.values import normalise

__all__ = ["Subscription", "parse"]


def parse(text):
    """Parse and check ``text``; return its AST or raise SubscriptionError."""
    result = parser.parse(text)
    checker.check(result.tree, result.offsets, result.op_offsets)
    return result.tree


class Subscription:
    """A checked, compiled subscription expression.

    ``Subscription(text)`` raises SubscriptionError (with the spec's Nack
    code and the character offset) for any bad expression.
    ``matches(attributes)`` is True only when the expression evaluates to
    true; ``evaluate`` gives the three-valued result (None is bottom).
    """

    __slots__ = ("expression", "_tree", "_packed", "names", "_fn", "__weakref__")

    def __init__(self, expression):
        result = parser.parse(expression)
        checker.check(result.tree, result.offsets, result.op_offsets)
        self._setup(expression, result.tree)

    @classmethod
    def from_ast(cls, tree):
        """Build from a tree (e.g. decoded from the wire); checks it first."""
        if not isinstance(tree, Node):
            raise TypeError("from_ast needs an elvin.subscription.ast.Node")
        checker.check(tree)
        self = cls.__new__(cls)
        self._setup(to_text(tree), tree)
        return self

    def _setup(self, expression, tree):
        compiled = compiler.compile_tree(tree)
        if compiled.const:
            value = {True: "true", False: "false", None: "bottom"}[compiled.value]
            raise SubscriptionError(
                errors.EXP_IS_TRIVIAL, 0,
                f"the expression is constant (always {value}), so it would "
                "match everything or nothing: refer to an attribute")
        self.expression = expression
        self._tree = tree
        self._packed = None
        self.names = frozenset(sys.intern(n) for n in tree.names())
        self._fn = compiled.fn

    @property
    def ast(self):
        """The immutable tree (kinds are the protocol's SubAST typecodes)."""
        tree = self._tree
        if tree is None:
            tree = decode_ast(self._packed)
        return tree

    def compact(self):
        """Keep the tree only in its XDR encoding (a few hundred bytes).

        A router holding many subscriptions calls this once it has indexed
        one: evaluation never needs the tree, and ``ast`` decodes it again
        on demand. Returns self.
        """
        if self._tree is not None:
            self._packed = encode_ast(self._tree)
            self._tree = None
        return self

    @property
    def evaluator(self):
        """The compiled callable: takes a normalised dict, returns True/False/None."""
        return self._fn

    def evaluate(self, attributes):
        """Three-valued result for ``attributes``: True, False or None (bottom)."""
        return self._fn(normalise(attributes))

    def matches(self, attributes):
        """True when a notification with ``attributes`` would be delivered."""
        return self._fn(normalise(attributes)) is True

    def __str__(self):
        return to_text(self.ast)

    def __repr__(self):
        return f"Subscription({self.expression!r})"

    def __eq__(self, other):
        if not isinstance(other, Subscription):
            return NotImplemented
        return self.ast == other.ast

    def __hash__(self):
        return hash(self.ast)
