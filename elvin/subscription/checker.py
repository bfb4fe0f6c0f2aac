"""Static checks on a parsed subscription, with the spec's error codes.

The grammar of Appendix A separates predicates from values; the parser
accepts one expression language and this pass enforces the split
(PARSE_ERROR where a predicate or value is in the wrong place), literal
types (TYPE_MISMATCH, section 6.3), pattern validity (INVALID_REGEXP) and
the nesting limit (NESTING_TOO_DEEP). Names are untyped until a
notification arrives, so only literals can mismatch statically.
"""

from elvin import errors
from elvin.errors import SubscriptionError, echoed
from elvin.subscription import patterns
from elvin.subscription.ast import Kind, LITERAL_KINDS
from elvin.subscription.grammar import FUNCTIONS, MAX_DEPTH
from elvin.subscription.grammar import SYMBOL as _SYMBOL
from elvin.subscription.printer import to_text
from elvin.values import INT32, INT64, OPAQUE, REAL64, STRING, TYPE_NAMES

__all__ = ["check", "BOOL"]

BOOL = "predicate"
_ANY = frozenset({INT32, INT64, REAL64, STRING, OPAQUE})
_NUMERIC = frozenset({INT32, INT64, REAL64})
_INTEGER = frozenset({INT32, INT64})
_STRING = frozenset({STRING})
_SIZED = frozenset({STRING, OPAQUE})

_GLUE = ("==", "!=", "<", ">", "&&", "||", "^^", "+", "*", "/", "%", "=")

_LITERAL_TYPE = {Kind.INT32: INT32, Kind.INT64: INT64, Kind.REAL64: REAL64,
                 Kind.STRING: STRING}

_LOGICAL = {Kind.AND, Kind.OR, Kind.XOR, Kind.NOT}
_EQUALITY = {Kind.EQUALS, Kind.NOT_EQUALS}
_ORDERING = {Kind.LESS_THAN, Kind.LESS_THAN_EQUALS, Kind.GREATER_THAN,
             Kind.GREATER_THAN_EQUALS}
_ARITHMETIC = {Kind.ADD, Kind.SUBTRACT, Kind.MULTIPLY, Kind.DIVIDE, Kind.MODULO}
_BITWISE = {Kind.SHIFT_LEFT, Kind.SHIFT_RIGHT, Kind.LOGICAL_SHIFT_RIGHT,
            Kind.BIT_AND, Kind.BIT_XOR, Kind.BIT_OR}
_TYPE_TESTS = {Kind.FUNC_INT32, Kind.FUNC_INT64, Kind.FUNC_REAL64,
               Kind.FUNC_STRING, Kind.FUNC_OPAQUE, Kind.FUNC_NAN,
               Kind.FUNC_REQUIRE}
_STRING_PREDICATES = {Kind.FUNC_BEGINS_WITH, Kind.FUNC_CONTAINS,
                      Kind.FUNC_ENDS_WITH, Kind.FUNC_WILDCARD, Kind.FUNC_REGEX}
_STRING_FUNCTIONS = {Kind.FUNC_FOLD_CASE, Kind.FUNC_DECOMPOSE,
                     Kind.FUNC_DECOMPOSE_COMPAT}



def _describe(kind):
    if kind in _SYMBOL:
        return f"'{_SYMBOL[kind]}'"
    return kind.name.lower().replace("func_", "").replace("_", "-") + "()"


def _type_names(types):
    return "/".join(TYPE_NAMES[t] for t in sorted(types))


class _Checker:
    def __init__(self, offsets, op_offsets):
        self.offsets = offsets
        self.op_offsets = op_offsets

    def at(self, node):
        return self.offsets.get(id(node), 0)

    def fail(self, code, node, message, token=None):
        offset = self.at(node)
        raise SubscriptionError(code, offset, f"{message} (at offset {offset})", token)

    def mismatch(self, node, message, found):
        """TYPE_MISMATCH: ``node``, of type ``found``, does not fit its place
        (the Nack's arguments: offset, the expression, its type)."""
        offset = self.at(node)
        raise SubscriptionError(errors.TYPE_MISMATCH, offset,
                                f"{message} (at offset {offset})", to_text(node), found)

    def predicate(self, node, context):
        """Check ``node`` and require it to be a predicate."""
        result = self.check(node)
        if result is not BOOL:
            self._glued_name(node)
            what = "literal" if node.kind in LITERAL_KINDS else (
                "name" if node.kind == Kind.NAME else "value expression")
            self.fail(errors.PARSE_ERROR, node,
                      f"{context} needs a predicate, but found a {what}")
        return result

    def value(self, node, context, allowed=_ANY):
        """Check ``node`` and require a value that may have a type in ``allowed``."""
        result = self.check(node)
        if result is BOOL:
            self.fail(errors.PARSE_ERROR, node,
                      f"{context} needs a value, but found a predicate")
        if not (result & allowed):
            self.mismatch(node, f"{context} needs {_type_names(allowed)}, but found "
                                f"{_type_names(result)}", _type_names(result))
        return result & allowed

    def check(self, node):
        kind = node.kind
        self._arity(node)
        if kind == Kind.NAME:
            return _ANY
        if kind in _LITERAL_TYPE:
            return frozenset({_LITERAL_TYPE[kind]})
        context = _describe(kind)
        children = node.children
        if kind in _LOGICAL:
            for child in children:
                self.predicate(child, context)
            return BOOL
        if kind in _EQUALITY:
            left = self.value(children[0], context)
            right = self.value(children[1], context)
            self._comparable(left, right, children[1], context)
            return BOOL
        if kind in _ORDERING:
            for child in children:
                self.value(child, context, _NUMERIC)
            return BOOL
        if kind in _ARITHMETIC:
            left = self.value(children[0], context, _NUMERIC)
            right = self.value(children[1], context, _NUMERIC)
            return _promote(left, right)
        if kind in _BITWISE:
            left = self.value(children[0], context, _INTEGER)
            right = self.value(children[1], context, _INTEGER)
            return _promote(left, right)
        if kind in (Kind.UNARY_MINUS, Kind.UNARY_PLUS):
            return self.value(children[0], context, _NUMERIC)
        if kind == Kind.BIT_NEGATE:
            return self.value(children[0], context, _INTEGER)
        if kind in _TYPE_TESTS:
            self._name_argument(children[0], context)
            return BOOL
        if kind in _STRING_PREDICATES:
            self.value(children[0], context, _STRING)
            for child in children[1:]:
                self._string_constant(child, context)
                if kind == Kind.FUNC_REGEX:
                    self._pattern(child, patterns.check_regex)
                elif kind == Kind.FUNC_WILDCARD:
                    self._pattern(child, patterns.check_wildcard)
            return BOOL
        if kind in _STRING_FUNCTIONS:
            self.value(children[0], context, _STRING)
            return _STRING
        if kind == Kind.FUNC_SIZE:
            self.value(children[0], context, _SIZED)
            return frozenset({INT32})
        if kind == Kind.FUNC_EQUALS:
            first = self.value(children[0], context)
            for child in children[1:]:
                other = self.value(child, context)
                self._comparable(first, other, child, context)
            return BOOL
        self.fail(errors.PARSE_ERROR, node, f"unexpected node kind {kind.name}")

    def _arity(self, node):
        """Child counts, for trees that did not come from our parser."""
        low, high = _ARITY.get(node.kind, (0, 0))
        count = len(node.children)
        if count < low:
            self.fail(errors.TOO_FEW_ARGS, node,
                      f"{_describe(node.kind)} needs at least {low} operands, got {count}")
        if high is not None and count > high:
            self.fail(errors.TOO_MANY_ARGS, node,
                      f"{_describe(node.kind)} takes at most {high} operands, got {count}")

    def _glued_name(self, node):
        """A name like ``x==1`` is almost always missing spaces: say so."""
        if node.kind == Kind.NAME and any(op in node.value for op in _GLUE):
            self.fail(errors.PARSE_ERROR, node,
                      f"{echoed(node.value)} is read as one attribute name, because names "
                      "may contain operator characters: put spaces around operators, "
                      "e.g. 'x == 1'", node.value)

    def _comparable(self, left, right, node, context):
        if (left & _NUMERIC and right & _NUMERIC) or (STRING in left and STRING in right):
            return
        if OPAQUE in left and OPAQUE in right:
            return
        self.mismatch(node, f"{context} cannot compare {_type_names(left)} with "
                            f"{_type_names(right)}", _type_names(right))

    def _name_argument(self, node, context):
        if node.kind == Kind.NAME:
            return
        if node.kind in LITERAL_KINDS:
            self.mismatch(node, f"{context} needs an attribute name, but found a literal",
                          TYPE_NAMES[_LITERAL_TYPE[node.kind]])
        self.fail(errors.PARSE_ERROR, node, f"{context} needs an attribute name")

    def _string_constant(self, node, context):
        if node.kind == Kind.STRING:
            return
        if node.kind in LITERAL_KINDS:
            self.mismatch(node, f"{context} needs string literals after its first "
                                f"argument, but found {node.kind.name.lower()}",
                          TYPE_NAMES[_LITERAL_TYPE[node.kind]])
        self.fail(errors.PARSE_ERROR, node,
                  f"{context} needs string literals after its first argument")

    def _pattern(self, node, validate):
        try:
            validate(node.value)
        except patterns.PatternTooComplex as e:
            self.fail(errors.REGEXP_TOO_COMPLEX, node, str(e), node.value)
        except patterns.PatternError as e:
            self.fail(errors.INVALID_REGEXP, node, str(e), node.value)


def _arities():
    table = {kind: (low, high) for kind, low, high in FUNCTIONS.values()}
    for kind in _LOGICAL - {Kind.NOT}:
        table[kind] = (2, None)
    for kind in _EQUALITY | _ORDERING | _ARITHMETIC | _BITWISE:
        table[kind] = (2, 2)
    for kind in (Kind.NOT, Kind.UNARY_MINUS, Kind.UNARY_PLUS, Kind.BIT_NEGATE):
        table[kind] = (1, 1)
    return table


def _promote(left, right):
    """Static result type of a binary numeric operator."""
    if len(left) == 1 and len(right) == 1:
        (a,), (b,) = left, right
        return frozenset({max(a, b)})  # INT32 < INT64 < REAL64 as type codes
    return left | right


def _too_deep(tree, offsets):
    """The deepest node beyond MAX_DEPTH, or None (iterative: no recursion)."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return node
        for child in node.children:
            stack.append((child, depth + 1))
    return None


_ARITY = _arities()


def check(tree, offsets=None, op_offsets=None):
    """Raise SubscriptionError unless ``tree`` is a well-formed subscription."""
    offsets = offsets or {}
    deep = _too_deep(tree, offsets)
    if deep is not None:
        offset = offsets.get(id(deep), 0)
        raise SubscriptionError(errors.NESTING_TOO_DEEP, offset,
                                f"expression nested more than {MAX_DEPTH} deep "
                                f"(at offset {offset})")
    checker = _Checker(offsets, op_offsets or {})
    for node in tree.walk():
        if node.kind in (Kind.NAME, Kind.STRING) and "\x00" in node.value:
            checker.fail(errors.INVALID_TOKEN, node, "NUL character in a name or string")
        if node.kind == Kind.NAME and not node.value:
            checker.fail(errors.PARSE_ERROR, node, "empty attribute name")
    result = checker.check(tree)
    if result is not BOOL:
        checker._glued_name(tree)
        checker.fail(errors.PARSE_ERROR, tree,
                     "the expression is a value, not a predicate: compare it with "
                     "something, e.g. 'x == 1'")
