"""Parse an expression once per *shape*, so that placing a subscription is fast.

Most subscriptions a router holds share a shape and differ only in their
literals: ``s1 == "a" && i1 >= 10 && i1 < 110`` and ``s1 == "q" && i1 >= 7
&& i1 < 107``. PLY's LR parse costs most of a new subscription's time, so
``checked_tree`` keys each expression by its text with the literals taken
out (``_key``: one regular-expression split, in C), and for a shape it has
parsed before it puts the new literals into the earlier tree's leaves.

The checker's verdict depends on the literals only through their kinds
(int32, int64, real64, string), except for the patterns of ``regex`` and
``wildcard``: so a shape also remembers the literal kinds it has checked,
and the checker runs again only for new kinds or when patterns are present.

The second time a shape is seen with given literal kinds, it gets a
``Recipe``: how to make the evaluator (``compiler.generated_plan``) and the
index's facts (``analysis.equality_recipe``) from the literals alone. After
that a subscription of the shape builds no tree at all (``Subscription``
rebuilds it only when asked), is not checked again and is not compiled.

Exactness: any problem on the fast path sends the expression down the full
path (``parser.parse`` + ``checker.check``), which raises the error, code
and offset it always has. A shape is remembered only when its key's
literals are exactly the lexer's literal tokens and the tree's literal
leaves, in order, so a parser that folded or moved a literal is never
templated. The cache is bounded by count and by the length of the texts
its shapes stand for.
"""

import re
import sys

from elvin.errors import SubscriptionError
from elvin.subscription import analysis, checker, compiler, parser
from elvin.subscription.ast import Kind, Node
from elvin.values import INT32_MAX as _INT32_MAX, INT32_MIN as _INT32_MIN

__all__ = ["Checked", "Recipe", "checked_tree", "rebuild", "clear", "MAX_SHAPES",
           "MAX_SHAPE_TEXT", "MAX_REMEMBERED_LENGTH"]

#: Most shapes remembered; past it the oldest is forgotten.
MAX_SHAPES = 4096
#: Most characters of expression text the remembered shapes stand for
#: together (their trees cost about ten times that); past it the oldest are
#: forgotten. Bounds the cache by memory, not only by count.
MAX_SHAPE_TEXT = 1 << 20
#: A longer expression is not remembered: its tree is large, and long
#: expressions rarely share a shape (``compiler.generated_plan`` makes no
#: recipe past 64 operands anyway).
MAX_REMEMBERED_LENGTH = 2048

_LITERAL_KINDS = frozenset({Kind.INT32, Kind.INT64, Kind.REAL64, Kind.STRING})
_PATTERN_KINDS = frozenset({Kind.FUNC_REGEX, Kind.FUNC_WILDCARD})
_node = Node._trusted
_intern = sys.intern
#: Numeric literals shared between subscriptions (compiler.shared_number).
_share_int = compiler._SHARED_INTS.setdefault
_share_float = compiler._SHARED_FLOATS.setdefault
_shapes = {}
#: Characters of text the shapes in ``_shapes`` stand for.
_shape_text = 0


class _Shape:
    """A parsed and checked tree of one shape, and what is known of it."""

    __slots__ = ("tree", "names", "checked_kinds", "has_patterns", "merged", "recipes",
                 "length")

    def __init__(self, tree, kinds, merged, length):
        self.tree = tree
        #: characters of the text it was parsed from (for the cache's bound)
        self.length = length
        #: per literal, last first: is a '-' before it part of its value?
        self.merged = merged
        self.names = frozenset(_intern(n) for n in tree.names())
        self.checked_kinds = {kinds}
        self.has_patterns = any(n.kind in _PATTERN_KINDS for n in tree.walk())
        #: literal kinds -> Recipe, or None where the tree is always needed;
        #: made when a shape is seen a second time (most never are)
        self.recipes = {}


class Recipe:
    """Placing a subscription of one shape and literal kinds from its
    literals alone, with no tree: the evaluator (``compiler.Plan``), and
    the index's facts (``analysis.equality_recipe``, None when it cannot
    say; the required names, which never depend on the literals; and
    ``analysis.range_recipe``)."""

    __slots__ = ("plan", "equalities", "required", "ranges")

    def __init__(self, plan, equalities, required, ranges):
        self.plan = plan
        self.equalities = equalities
        self.required = required
        self.ranges = ranges


def _recipe(tree, has_patterns):
    """A Recipe for ``tree``'s shape and literal kinds, or None."""
    if has_patterns:
        return None      # every pattern is checked (and compiled) anew
    positions = {id(n): i for i, n in enumerate(
        n for n in tree.walk() if n.kind in _LITERAL_KINDS)}
    position = positions.__getitem__

    def where(node):
        return position(id(node))

    plan = compiler.generated_plan(tree, where)
    if plan is None:
        return None
    return Recipe(plan, analysis.equality_recipe(tree, where),
                  analysis.required_names(tree), analysis.range_recipe(tree, where))


def clear():
    """Forget every shape (for tests and benchmarks)."""
    global _shape_text
    _shapes.clear()
    _shape_text = 0


def _leaf(kind, value, offset):
    """The tree leaf for a literal token (raises SubscriptionError)."""
    if kind == "INT":
        return parser._integer(value, offset)
    if kind == "REAL":
        return parser._real(value, offset)
    return _node(Kind.STRING, value, ())


def _fill(template, leaves):
    """``template`` with its literal leaves replaced, in order, by ``leaves``
    (reversed: the next one is popped from the end)."""
    if template.kind in _LITERAL_KINDS:
        return leaves.pop()
    if not template.children:
        return template
    return _node(template.kind, template.value,
                 tuple([_fill(child, leaves) for child in template.children]))


class Checked:
    """A checked tree and, when it has a shape, how to rebuild it: the
    shape's template and the literals' kinds (shared) and values."""

    __slots__ = ("tree", "names", "template", "kinds", "values", "recipe")

    def __init__(self, tree, names, template=None, kinds=None, values=None, recipe=None):
        #: None when ``recipe`` places the subscription without a tree
        self.tree = tree
        self.recipe = recipe
        self.names = names
        self.template = template
        self.kinds = kinds
        self.values = values


def rebuild(template, kinds, values):
    """The tree ``template`` with literals ``kinds``/``values`` in its leaves."""
    return _fill(template, [_node(kind, value, ())
                            for kind, value in zip(reversed(kinds), reversed(values))])


_KINDS = {}


def _shared(kinds):
    """One tuple object per distinct kinds tuple (many subscriptions hold it)."""
    return _KINDS.setdefault(kinds, kinds)


# The literals of a text without backslashes, found in one C-level pass:
# ``split`` gives [text, string, sign, number, text, ..., text], where a
# string literal leaves sign and number None and a number leaves string
# None. A string is the lexer's STRING (quotes never occur in names or
# operators, so the first quote always opens one). A number is the lexer's
# REAL or INT where it cannot continue a name: not after a character a
# name may contain; the sign is a '-' directly before it (after no such
# character either: '-' is always an operator token there). A number that
# does follow a name character (``x ==5``) is left in the key's text, which
# only makes that shape more specific. The key keeps the texts between
# literals and, per literal, its sign (None for a string): so two texts
# with one key have the same tokens but for the literals' values, and a
# '-' is merged into its number (``parser._merge_signs``) in both or in
# neither, as that depends only on the tokens before it. Every remembered
# key is also checked against the real lexer (``_remember``).
_ID_CHAR_CLASS = r"\x21\x23-\x26\x2a\x2b\x2d-\x5a\x5e-\xff"
#: The lookahead first: a position where no literal can start (most of a
#: text) fails on one character instead of trying each alternative (a
#: typical subscription's key 4.1 -> 2.3 us).
_SPLIT = re.compile(
    "(?=[\"'0-9-])(?:(\"[^\"]*\"|'[^']*')"
    f"|(?<![{_ID_CHAR_CLASS}])(-?)"
    r"([0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|0[xX][0-9A-Fa-f]+[lL]?|[0-9]+[lL]?))").split


def _key(text):
    """The shape key of ``text`` and its split parts, or (None, None)."""
    if "\\" in text or "\x00" in text:
        return None, None
    parts = _SPLIT(text)
    return (*parts[0::4], *parts[2::4]), parts


def _literals(parts, merged):
    """The kinds and values of a split text's literals, in text order;
    ``merged``, last first: is the literal's sign part of its value?
    Raises SubscriptionError for a number out of range."""
    kinds, values = [], []
    for string, number, minus in zip(parts[-4::-4], parts[-2::-4], merged):
        if string is not None:
            kinds.append(_STRING)
            values.append(_intern(string[1:-1]))
        elif "." in number:
            value = float(number)
            if value == _INF:
                parser._real(number, 0)    # raises the overflow error
            if minus:
                value = -value
            kinds.append(_REAL64)
            values.append(_share_float(value, value) if value else value)
        elif number[0] != "0" and number[-1] not in "lL" and len(number) <= 10:
            # Decimal int32, the usual number: int() without the parser's
            # octal, hex and int64 cases (nor its check of a number too
            # long for int()).
            value = int(number)
            if minus:
                value = -value
            if not _INT32_MIN <= value <= _INT32_MAX:
                parser._integer(("-" if minus else "") + number, 0)   # raises
            kinds.append(_INT32)
            values.append(_share_int(value, value) if value else value)
        else:
            leaf = parser._integer(("-" if minus else "") + number, 0)
            kinds.append(leaf.kind)
            values.append(leaf.value)
    kinds.reverse()
    values.reverse()
    compiler.trim_shared_numbers()
    return tuple(kinds), tuple(values)


_UNKNOWN = object()
_STRING, _REAL64, _INT32 = Kind.STRING, Kind.REAL64, Kind.INT32
_INF = float("inf")


def checked_tree(text):
    """A ``Checked`` for subscription ``text``; raises SubscriptionError
    exactly as ``parser.parse`` then ``checker.check`` would."""
    if not isinstance(text, str):
        raise TypeError(f"subscription expression must be str, not {type(text).__name__}")
    key, parts = _key(text)
    if key is not None:
        shape = _shapes.get(key)
        if shape is not None:
            try:
                kinds, values = _literals(parts, shape.merged)
                recipe = shape.recipes.get(kinds, _UNKNOWN)
                if (recipe is not None and recipe is not _UNKNOWN
                        and recipe.plan.applies(values)):
                    # The common case: no tree, no check (these kinds were
                    # checked when the recipe was made), no compile.
                    return Checked(None, shape.names, shape.tree, _shared(kinds), values,
                                   recipe)
                tree = rebuild(shape.tree, kinds, values)
                if shape.has_patterns or kinds not in shape.checked_kinds:
                    checker.check(tree)
                    shape.checked_kinds.add(kinds)
                if recipe is _UNKNOWN:
                    recipe = shape.recipes[kinds] = _recipe(tree, shape.has_patterns)
                    if recipe is not None and not recipe.plan.applies(values):
                        recipe = None
                else:
                    recipe = None
                return Checked(tree, shape.names, shape.tree, _shared(kinds), values, recipe)
            except SubscriptionError:
                pass  # the full path below names the error exactly
    result = parser.parse(text)
    checker.check(result.tree, result.offsets, result.op_offsets)
    shape = (_remember(key, parts, result)
             if key is not None and len(text) <= MAX_REMEMBERED_LENGTH else None)
    if shape is not None:
        leaves = [n for n in result.tree.walk() if n.kind in _LITERAL_KINDS]
        return Checked(result.tree, shape.names, shape.tree,
                       _shared(tuple(n.kind for n in leaves)),
                       tuple(n.value for n in leaves))
    return Checked(result.tree, frozenset(_intern(n) for n in result.tree.names()))


def _remember(key, parts, result):
    """File ``tree`` as the template of ``key`` if the key's literals are
    exactly the lexer's literal tokens, in order, and the tree's literal
    leaves are exactly those literals, in order; return the shape or None."""
    tree = result.tree
    literals = result.literals
    leaves = [n for n in tree.walk() if n.kind in _LITERAL_KINDS]
    strings, signs, numbers = parts[1::4], parts[2::4], parts[3::4]
    if not len(leaves) == len(literals) == len(strings):
        return None
    merged = []
    for leaf, tok, string, sign, number in zip(leaves, literals, strings, signs, numbers):
        kind, value, offset = tok
        if string is not None:
            if kind != "STRING" or value != string[1:-1]:
                return None
            merged.append(False)
        else:
            if kind == "STRING" or value not in (number, sign + number):
                return None
            merged.append(value != number)
        try:
            if leaf != _leaf(*tok):
                return None
        except SubscriptionError:
            return None
    global _shape_text
    length = len(result.text)
    while _shapes and (len(_shapes) >= MAX_SHAPES or _shape_text + length > MAX_SHAPE_TEXT):
        _shape_text -= _shapes.pop(next(iter(_shapes))).length
    shape = _shapes[key] = _Shape(tree, tuple(leaf.kind for leaf in leaves),
                                  tuple(reversed(merged)), length)
    _shape_text += length
    return shape
