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
from elvin.subscription import analysis, checker, compiler, shapes
from elvin.subscription.ast import Node
from elvin.subscription.workbudget import scans_strings
from elvin.subscription.printer import to_text
from elvin.values import normalise

__all__ = ["Subscription", "parse"]


def parse(text):
    """Parse and check ``text``; return its AST or raise SubscriptionError."""
    checked = shapes.checked_tree(text)
    if checked.tree is None:
        return shapes.rebuild(checked.template, checked.kinds, checked.values)
    return checked.tree


class Subscription:
    """A checked, compiled subscription expression.

    ``Subscription(text)`` raises SubscriptionError (with the spec's Nack
    code and the character offset) for any bad expression.
    ``matches(attributes)`` is True only when the expression evaluates to
    true; ``evaluate`` gives the three-valued result (None is bottom).
    """

    # _template, _kinds (both shared by a shape) and _values rebuild the
    # tree of an expression of a known shape; slots, not a tuple: this is
    # per subscription.
    __slots__ = ("expression", "_tree", "_packed", "names", "_fn", "_template", "_kinds",
                 "_values", "_recipe", "_scans", "__weakref__")

    def __init__(self, expression):
        # Parsed once per shape (elvin.subscription.shapes): same tree,
        # same errors as parser.parse + checker.check.
        checked = shapes.checked_tree(expression)
        recipe = checked.recipe
        if recipe is not None:
            # A shape and literal kinds seen before: the evaluator comes
            # from the literals alone, and the tree is built only if asked.
            self.expression = expression
            self._tree = checked.tree       # None unless it was built anyway
            self._packed = None
            self.names = checked.names
            values = checked.values
            self._fn = fn = recipe.plan.evaluator(values)
            self._template = checked.template
            self._kinds = checked.kinds
            # The evaluator's defaults hold the literals already: keep no
            # tuple of them too when they read back exactly (per
            # subscription: some 100 bytes of the workload's).
            back = recipe.plan.values_from(fn, len(values))
            if back is not None and all(a is b for a, b in zip(back, values)):
                values = None
            self._values = values
            self._recipe = recipe
            self._scans = False         # a recipe's are comparisons only
            return
        self._setup(expression, checked.tree, checked.names)
        if checked.template is not None:
            self._template = checked.template
            self._kinds = checked.kinds
            self._values = checked.values

    @classmethod
    def from_ast(cls, tree):
        """Build from a tree (e.g. decoded from the wire); checks it first."""
        if not isinstance(tree, Node):
            raise TypeError("from_ast needs an elvin.subscription.ast.Node")
        checker.check(tree)
        self = cls.__new__(cls)
        self._setup(to_text(tree), tree)
        return self

    def _setup(self, expression, tree, names=None):
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
        self._template = None
        self._recipe = None
        self._scans = scans_strings(tree)
        self.names = names if names is not None else frozenset(
            sys.intern(n) for n in tree.names())
        self._fn = compiled.fn

    @property
    def ast(self):
        """The immutable tree (kinds are the protocol's SubAST typecodes)."""
        tree = self._tree
        if tree is None:
            if self._template is not None:
                return shapes.rebuild(self._template, self._kinds, self._literals())
            tree = decode_ast(self._packed)
        return tree

    def index_facts(self):
        """What the matching index files this subscription by: its
        ``analysis.equality_constraints``, ``required_names`` and
        ``range_constraints`` (from the shape's recipe when it has one: no
        tree is built)."""
        recipe = self._recipe
        if recipe is not None and recipe.equalities is not None:
            values = self._literals()
            return (analysis.apply_equality_recipe(recipe.equalities, values),
                    recipe.required, analysis.apply_range_recipe(recipe.ranges, values))
        tree = self.ast
        return (analysis.equality_constraints(tree), analysis.required_names(tree),
                analysis.range_constraints(tree))

    def required_names(self):
        """``analysis.required_names`` of the expression (from the shape's
        recipe when it has one: no tree is built)."""
        recipe = self._recipe
        if recipe is not None and recipe.equalities is not None:
            return recipe.required
        return analysis.required_names(self.ast)

    def _literals(self):
        """The literal values of an expression of a known shape."""
        values = self._values
        if values is None:
            values = self._recipe.plan.values_from(self._fn, len(self._kinds))
        return values

    def compact(self):
        """Drop the tree, keeping only what rebuilds it: for an expression
        of a known shape, the shape's (shared) template and its literals;
        otherwise its XDR encoding (a few hundred bytes).

        A router holding many subscriptions calls this once it has indexed
        one: evaluation never needs the tree, and ``ast`` rebuilds it on
        demand. Returns self.
        """
        if self._tree is not None:
            if self._template is None:
                self._packed = encode_ast(self._tree)
            self._tree = None
        return self

    @property
    def shares_shape(self):
        """Placed from its shape's recipe: the shape's tree and evaluator
        are shared with every subscription of that shape."""
        return self._recipe is not None

    def reads_strings(self):
        """Does evaluation scan strings (``regex``, ``wildcard``,
        ``contains``), at a cost that grows with their length? Such
        subscriptions are evaluated under their client's PatternBudget
        (``elvin.subscription.workbudget``). Found once, with the tree at
        hand: a compacted subscription shared by several clients is asked
        again at each placement."""
        return self._scans

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
