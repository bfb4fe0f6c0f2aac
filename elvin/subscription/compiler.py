"""Compile a checked subscription AST into a Python callable.

Each node becomes a closure taking the notification (a dict in the form
produced by ``elvin.values.normalise``) and returning a value, or for
predicates True / False / None, where None is Elvin's *bottom*. A missing
attribute or a value of the wrong type yields None, which propagates as the
client protocol's Lukasiewicz logic table says.

Compilation happens once per subscription; evaluating never walks the AST.
Sub-trees that do not depend on the notification are folded to constants
while compiling, which is also how a trivial (constant) expression is found.
"""

import math
import types
import unicodedata
import weakref

from elvin.subscription.ast import Kind
from elvin.subscription import patterns
from elvin.subscription.workbudget import metered_test
from elvin.values import Int64

__all__ = ["compile_tree", "Compiled", "generated_plan", "Plan"]

_NUMERIC = (int, Int64, float)
_INTEGER = (int, Int64)


class Compiled:
    """A compiled sub-tree: ``fn(attrs)``, and ``const`` when it is constant."""

    __slots__ = ("fn", "const", "value")

    def __init__(self, fn, const=False, value=None):
        self.fn = fn
        self.const = const
        self.value = value


def _constant(value):
    return Compiled(lambda attrs: value, True, value)


def compile_tree(root):
    """Compile ``root`` (an already checked AST) to a ``Compiled``."""
    if _all_simple(root):
        # Every operand reads an attribute, so the whole cannot be constant:
        # skip the closure pass that only exists to find that out.
        generated = _generate(root)
        if generated is not None:
            return Compiled(generated)
    compiled = _compile(root)
    if not compiled.const:
        generated = _generate(root)
        if generated is not None:
            return Compiled(generated)
    return compiled


def _all_simple(root):
    """Is ``root`` a comparison of an attribute with a literal, or an && /
    || of only such comparisons?"""
    if root.kind in (Kind.AND, Kind.OR):
        return all(_simple_comparison(child) is not None for child in root.children)
    return _simple_comparison(root) is not None


def _compile(node):
    kind = node.kind
    handler = _HANDLERS[kind]
    return handler(node)


def _fold(fn, children):
    """Wrap ``fn``; if every child is constant, evaluate it now."""
    if all(c.const for c in children):
        return _constant(fn({}))
    return Compiled(fn)


# -- leaves -----------------------------------------------------------------

def _name(node):
    return Compiled(_attribute_reader(node.value))


def _int32(node):
    return _constant(node.value)


def _int64(node):
    return _constant(Int64(node.value))


def _real64(node):
    return _constant(float(node.value))


def _string(node):
    return _constant(node.value)


# -- logic ------------------------------------------------------------------

def _and(node):
    parts = _grouped_parts(node.children, conjunction=True)
    if any(p.const and p.value is False for p in parts):
        return _constant(False)
    seed = None if any(p.const and p.value is None for p in parts) else True
    fns = [p.fn for p in parts if not p.const]
    if not fns:
        return _constant(seed)
    if len(fns) == 1 and seed is True:
        return Compiled(fns[0])
    if len(fns) == 2 and seed is True:
        f1, f2 = fns

        def fn2(attrs):
            a = f1(attrs)
            if a is False:
                return False
            b = f2(attrs)
            if b is False:
                return False
            return True if (a is True and b is True) else None
        return Compiled(fn2)

    def fn(attrs):
        result = seed
        for f in fns:
            v = f(attrs)
            if v is False:
                return False
            if v is None:
                result = None
        return result
    return Compiled(fn)


def _or(node):
    parts = _grouped_parts(node.children, conjunction=False)
    if any(p.const and p.value is True for p in parts):
        return _constant(True)
    seed = None if any(p.const and p.value is None for p in parts) else False
    fns = [p.fn for p in parts if not p.const]
    if not fns:
        return _constant(seed)
    if len(fns) == 1 and seed is False:
        return Compiled(fns[0])
    if len(fns) == 2 and seed is False:
        f1, f2 = fns

        def fn2(attrs):
            a = f1(attrs)
            if a is True:
                return True
            b = f2(attrs)
            if b is True:
                return True
            return False if (a is False and b is False) else None
        return Compiled(fn2)

    def fn(attrs):
        result = seed
        for f in fns:
            v = f(attrs)
            if v is True:
                return True
            if v is None:
                result = None
        return result
    return Compiled(fn)


#: An attribute compared with at least this many literals in one && / ||
#: is tested with one set look-up (``_membership``) instead of a closure each.
_SET_MIN = 8


def _grouped_parts(children, conjunction):
    """The compiled operands of an && (``conjunction``) or ||, the comparisons of one attribute with ``_SET_MIN`` or more literals
    compiled as one membership test: ``a == 1 || ... || a == 5000`` costs
    one set look-up, not 5,000 calls. Kleene logic has no order and De
    Morgan's laws hold in it, so moving the comparisons together and
    writing a chain of != as the negation of one membership test changes
    no result."""
    kind = Kind.NOT_EQUALS if conjunction else Kind.EQUALS
    by_name = {}
    for child in children:
        simple = _simple_comparison(child)
        if simple is not None and simple[0] == kind:
            by_name.setdefault(simple[1], []).append(child)
    grouped = {name: members for name, members in by_name.items()
               if len(members) >= _SET_MIN}
    if not grouped:
        return _with_table(children, conjunction)
    taken = {id(member) for members in grouped.values() for member in members}
    parts = _with_table([c for c in children if id(c) not in taken], conjunction)
    for name, members in grouped.items():
        literals = [_compile(_simple_comparison(m)[2]).value for m in members]
        test = _membership(_attribute_reader(name), literals)
        if conjunction:
            parts.append(Compiled(_negation(test)))
        else:
            parts.append(Compiled(test))
    return parts


def _with_table(children, conjunction):
    """Compile ``children`` of an && (``conjunction``) or ||, the comparisons of an attribute with a literal together as one
    ``_table`` (a tuple each, where a closure each would cost about ten
    times the memory)."""
    rows = []
    parts = []
    for child in children:
        simple = _simple_comparison(child)
        test = None if simple is None else _TABLE_TESTS.get(
            (simple[0], simple[2].kind == Kind.STRING))
        if test is None:
            parts.append(_compile(child))
        else:
            rows.append((child, (simple[1], test, _compile(simple[2]).value)))
    if len(rows) == 1:
        parts.append(_compile(rows[0][0]))
    elif rows:
        parts.append(Compiled(_table(tuple(row for _, row in rows), conjunction)))
    return parts


def _table(rows, conjunction):
    """The && (``conjunction``) or || of ``rows``: (attribute, test,
    literal), ``test(value, literal)`` giving True, False or None."""
    if conjunction:
        def fn(attrs):
            result = True
            get = attrs.get
            for attribute, test, literal in rows:
                v = test(get(attribute), literal)
                if v is False:
                    return False
                if v is None:
                    result = None
            return result
    else:
        def fn(attrs):
            result = False
            get = attrs.get
            for attribute, test, literal in rows:
                v = test(get(attribute), literal)
                if v is True:
                    return True
                if v is None:
                    result = None
            return result
    return fn


def _test_equal(v, literal):
    return _equal(v, literal)


def _test_not_equal(v, literal):
    r = _equal(v, literal)
    return None if r is None else not r


def _test_string_equal(v, literal):
    return (v == literal) if type(v) is str else None


def _test_string_not_equal(v, literal):
    return (v != literal) if type(v) is str else None


def _ordering_test(op):
    """``value OP literal`` for a numeric literal, as ``_comparison``."""
    def test(v, literal):
        t = type(v)
        if t not in _NUMERIC:
            return None
        if t is float or type(literal) is float:
            return op(_real_compare(float(v), float(literal)), 0)
        return op(v, literal)
    return test


def _attribute_reader(attribute):
    """The function reading ``attribute``, one for every subscription that
    reads it (held weakly: it goes with the last of them)."""
    reader = _READERS.get(attribute)
    if reader is None:
        def reader(attrs):
            return attrs.get(attribute)
        _READERS[attribute] = reader
    return reader


_READERS: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()


def _negation(test):
    def fn(attrs):
        v = test(attrs)
        return None if v is None else not v
    return fn


def _membership(subject, literals):
    """``subject == l1 || subject == l2 || ...`` for constant ``literals``,
    exactly as ``_equal`` decides each comparison, with set look-ups:
    True when one is equal; otherwise None when some literal is of the
    other kind (string against number: bottom), else False."""
    strings = frozenset([v for v in literals if type(v) is str])
    integers = frozenset([v for v in literals if type(v) in _INTEGER])
    reals = [v for v in literals if type(v) is float]
    has_strings = bool(strings)
    has_numbers = bool(integers or reals)
    # A real compares as Java's Double.compare: NaN equals NaN, and -0.0
    # differs from 0.0 (and from the integer 0, which is +0.0 as a real).
    plain_reals = frozenset([v for v in reals if v == v and v != 0.0])
    integers_as_reals = frozenset([float(v) for v in integers if v != 0])
    nan = any(v != v for v in reals)
    positive_zero = 0 in integers or any(
        v == 0.0 and math.copysign(1.0, v) > 0 for v in reals)
    negative_zero = any(v == 0.0 and math.copysign(1.0, v) < 0 for v in reals)

    def fn(attrs):
        v = subject(attrs)
        t = type(v)
        if t is str:
            if v in strings:
                return True
            return None if has_numbers else False
        if t is int or t is Int64:
            if v in integers:
                return True
            f = float(v)
            if f == 0.0:
                hit = positive_zero
            else:
                hit = f in plain_reals
        elif t is float:
            if v != v:
                hit = nan
            elif v == 0.0:
                hit = positive_zero if math.copysign(1.0, v) > 0 else negative_zero
            else:
                hit = v in plain_reals or v in integers_as_reals
        else:
            return None
        if hit:
            return True
        return None if has_strings else False
    return fn


def _xor(node):
    parts = [_compile(c) for c in node.children]
    fns = [p.fn for p in parts]

    def fn(attrs):
        result = False
        for f in fns:
            v = f(attrs)
            if v is None:
                return None
            result = result is not v
        return result
    if any(p.const and p.value is None for p in parts):
        return _constant(None)
    return _fold(fn, parts)


def _not(node):
    (part,) = [_compile(c) for c in node.children]
    f = part.fn

    def fn(attrs):
        v = f(attrs)
        return None if v is None else not v
    return _fold(fn, [part])


# -- comparison -------------------------------------------------------------

def _real_compare(a, b):
    """Total order on real64 as Java's ``Double.compare`` (what Avis uses).

    The spec (6.1.11) defines real64 equality as equal sign, mantissa and
    exponent, so NaN equals NaN and -0.0 differs from 0.0; NaN sorts above
    every other value and -0.0 below 0.0.
    """
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a == 0.0:
            sa = math.copysign(1.0, a)
            sb = math.copysign(1.0, b)
            return 0 if sa == sb else (-1 if sa < sb else 1)
        return 0
    a_nan = a != a
    b_nan = b != b
    if a_nan and b_nan:
        return 0
    return 1 if a_nan else -1


def _equal(a, b):
    """Elvin equality: True/False for comparable values, else None."""
    ta = type(a)
    tb = type(b)
    if ta is str:
        return (a == b) if tb is str else None
    if ta in _NUMERIC and tb in _NUMERIC:
        if ta is float or tb is float:
            return _real_compare(float(a), float(b)) == 0
        return a == b
    return None


def _comparison(op):
    """An ordering predicate; ``op`` is applied to ints or to a -1/0/1 order."""
    def handler(node):
        parts = [_compile(c) for c in node.children]
        f1, f2 = parts[0].fn, parts[1].fn

        def fn(attrs):
            a = f1(attrs)
            b = f2(attrs)
            ta = type(a)
            tb = type(b)
            if ta not in _NUMERIC or tb not in _NUMERIC:
                return None
            if ta is float or tb is float:
                return op(_real_compare(float(a), float(b)), 0)
            return op(a, b)
        return _fold(fn, parts)
    return handler


def _equals_node(negate):
    def handler(node):
        parts = [_compile(c) for c in node.children]
        f1, f2 = parts[0].fn, parts[1].fn
        if parts[1].const and type(parts[1].value) is str:
            literal = parts[1].value

            def fn(attrs):
                a = f1(attrs)
                if type(a) is not str:
                    return None
                return (a != literal) if negate else (a == literal)
        elif negate:
            def fn(attrs):
                v = _equal(f1(attrs), f2(attrs))
                return None if v is None else not v
        else:
            def fn(attrs):
                return _equal(f1(attrs), f2(attrs))
        return _fold(fn, parts)
    return handler


# -- arithmetic -------------------------------------------------------------

def _wrap32(v):
    return ((v + 0x80000000) & 0xFFFFFFFF) - 0x80000000


def _wrap64(v):
    return Int64(((v + 0x8000000000000000) & 0xFFFFFFFFFFFFFFFF) - 0x8000000000000000)


def _int_result(a, b, value):
    """``value`` wrapped to the promoted integer type of ``a`` and ``b``."""
    if type(a) is Int64 or type(b) is Int64:
        return _wrap64(value)
    return _wrap32(value)


def _trunc_div(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _trunc_mod(a, b):
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _real_div(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0.0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _real_mod(a, b):
    try:
        return math.fmod(a, b)
    except ValueError:
        return math.nan


def _add(a, b):
    if type(a) is float or type(b) is float:
        return float(a) + float(b)
    return _int_result(a, b, a + b)


def _sub(a, b):
    if type(a) is float or type(b) is float:
        return float(a) - float(b)
    return _int_result(a, b, a - b)


def _mul(a, b):
    if type(a) is float or type(b) is float:
        try:
            return float(a) * float(b)
        except OverflowError:  # pragma: no cover - floats saturate
            return math.inf
    return _int_result(a, b, a * b)


def _div(a, b):
    if type(a) is float or type(b) is float:
        return _real_div(float(a), float(b))
    if b == 0:
        return None
    return _int_result(a, b, _trunc_div(a, b))


def _mod(a, b):
    if type(a) is float or type(b) is float:
        return _real_mod(float(a), float(b))
    if b == 0:
        return None
    return _int_result(a, b, _trunc_mod(a, b))


def _int_bits(a, b):
    return 64 if (type(a) is Int64 or type(b) is Int64) else 32


def _shl(a, b):
    bits = _int_bits(a, b)
    return _int_result(a, b, a << (b & (bits - 1)))


def _shr(a, b):
    bits = _int_bits(a, b)
    return _int_result(a, b, a >> (b & (bits - 1)))


def _ushr(a, b):
    bits = _int_bits(a, b)
    mask = (1 << bits) - 1
    return _int_result(a, b, (a & mask) >> (b & (bits - 1)))


def _band(a, b):
    return _int_result(a, b, a & b)


def _bor(a, b):
    return _int_result(a, b, a | b)


def _bxor(a, b):
    return _int_result(a, b, a ^ b)


def _arith(op, operand_types):
    def handler(node):
        parts = [_compile(c) for c in node.children]
        f1, f2 = parts[0].fn, parts[1].fn

        def fn(attrs):
            a = f1(attrs)
            b = f2(attrs)
            if type(a) not in operand_types or type(b) not in operand_types:
                return None
            return op(a, b)
        return _fold(fn, parts)
    return handler


def _unary(op, operand_types):
    def handler(node):
        (part,) = [_compile(c) for c in node.children]
        f = part.fn

        def fn(attrs):
            a = f(attrs)
            if type(a) not in operand_types:
                return None
            return op(a)
        return _fold(fn, [part])
    return handler


def _negate(a):
    if type(a) is float:
        return -a
    if type(a) is Int64:
        return _wrap64(-a)
    return _wrap32(-a)


def _invert(a):
    return Int64(~a) if type(a) is Int64 else ~a


# -- functions --------------------------------------------------------------

def _type_test(expected):
    def handler(node):
        attribute = node.children[0].value

        def fn(attrs):
            v = attrs.get(attribute)
            if v is None:
                return None
            return type(v) is expected
        return Compiled(fn)
    return handler


def _is_nan(node):
    attribute = node.children[0].value

    def fn(attrs):
        v = attrs.get(attribute)
        if v is None:
            return None
        if type(v) is not float:
            return None
        return v != v
    return Compiled(fn)


def _type_test_opaque(node):
    attribute = node.children[0].value

    def fn(attrs):
        v = attrs.get(attribute)
        if v is None:
            return None
        return type(v) is bytes
    return Compiled(fn)


def _require(node):
    attribute = node.children[0].value

    def fn(attrs):
        return True if attribute in attrs else None
    return Compiled(fn)


def _string_predicate(make_test):
    def handler(node):
        subject = _compile(node.children[0])
        literals = tuple(c.value for c in node.children[1:])
        test = make_test(literals)
        f = subject.fn

        def fn(attrs):
            v = f(attrs)
            if type(v) is not str:
                return None
            return test(v)
        return _fold(fn, [subject])
    return handler


def _begins_with(literals):
    return lambda v: v.startswith(literals)


def _ends_with(literals):
    return lambda v: v.endswith(literals)


def _contains(literals):
    # One scan of the string per needle: metered (workbudget).
    if len(literals) == 1:
        (needle,) = literals
        return metered_test(lambda v: needle in v, 1)
    return metered_test(lambda v: any(n in v for n in literals), len(literals))


def _wildcard(literals):
    matcher, weight = patterns.weighed_wildcards(literals)
    return metered_test(lambda v: matcher(v) is not None, weight)


def _regex(literals):
    matcher, weight = patterns.weighed_regexes(literals)
    return metered_test(lambda v: matcher(v) is not None, weight)


def _string_function(transform):
    def handler(node):
        (part,) = [_compile(c) for c in node.children]
        f = part.fn

        def fn(attrs):
            v = f(attrs)
            if type(v) is not str:
                return None
            return transform(v)
        return _fold(fn, [part])
    return handler


def _size(node):
    (part,) = [_compile(c) for c in node.children]
    f = part.fn

    def fn(attrs):
        v = f(attrs)
        t = type(v)
        if t is str:
            return len(v.encode("utf-8", "surrogatepass"))
        if t is bytes:
            return len(v)
        return None
    return _fold(fn, [part])


def _func_equals(node):
    parts = [_compile(c) for c in node.children]
    subject = parts[0].fn
    others = [p.fn for p in parts[1:]]
    if all(p.const for p in parts[1:]):
        return _fold(_membership(subject, [p.value for p in parts[1:]]), parts)

    def fn(attrs):
        v = subject(attrs)
        if v is None or type(v) is bytes:
            return None
        result = False
        for other in others:
            r = _equal(v, other(attrs))
            if r is True:
                return True
            if r is None:
                result = None
        return result
    return _fold(fn, parts)


def _lower_case(v):
    """Lower case as Java's ``String.toLowerCase`` gives it (Avis's fold-case):
    final sigma by context, dotted capital I to i + combining dot; no ß→ss."""
    return v.lower()


def _nfd(v):
    return unicodedata.normalize("NFD", v)


def _nfkd(v):
    return unicodedata.normalize("NFKD", v)


_HANDLERS = {
    Kind.NAME: _name,
    Kind.INT32: _int32,
    Kind.INT64: _int64,
    Kind.REAL64: _real64,
    Kind.STRING: _string,
    Kind.AND: _and,
    Kind.OR: _or,
    Kind.XOR: _xor,
    Kind.NOT: _not,
    Kind.EQUALS: _equals_node(False),
    Kind.NOT_EQUALS: _equals_node(True),
    Kind.LESS_THAN: _comparison(lambda a, b: a < b),
    Kind.LESS_THAN_EQUALS: _comparison(lambda a, b: a <= b),
    Kind.GREATER_THAN: _comparison(lambda a, b: a > b),
    Kind.GREATER_THAN_EQUALS: _comparison(lambda a, b: a >= b),
    Kind.ADD: _arith(_add, _NUMERIC),
    Kind.SUBTRACT: _arith(_sub, _NUMERIC),
    Kind.MULTIPLY: _arith(_mul, _NUMERIC),
    Kind.DIVIDE: _arith(_div, _NUMERIC),
    Kind.MODULO: _arith(_mod, _NUMERIC),
    Kind.SHIFT_LEFT: _arith(_shl, _INTEGER),
    Kind.SHIFT_RIGHT: _arith(_shr, _INTEGER),
    Kind.LOGICAL_SHIFT_RIGHT: _arith(_ushr, _INTEGER),
    Kind.BIT_AND: _arith(_band, _INTEGER),
    Kind.BIT_OR: _arith(_bor, _INTEGER),
    Kind.BIT_XOR: _arith(_bxor, _INTEGER),
    Kind.UNARY_MINUS: _unary(_negate, _NUMERIC),
    Kind.UNARY_PLUS: _unary(lambda a: a, _NUMERIC),
    Kind.BIT_NEGATE: _unary(_invert, _INTEGER),
    Kind.FUNC_INT32: _type_test(int),
    Kind.FUNC_INT64: _type_test(Int64),
    Kind.FUNC_REAL64: _type_test(float),
    Kind.FUNC_STRING: _type_test(str),
    Kind.FUNC_OPAQUE: _type_test_opaque,
    Kind.FUNC_NAN: _is_nan,
    Kind.FUNC_REQUIRE: _require,
    Kind.FUNC_BEGINS_WITH: _string_predicate(_begins_with),
    Kind.FUNC_ENDS_WITH: _string_predicate(_ends_with),
    Kind.FUNC_CONTAINS: _string_predicate(_contains),
    Kind.FUNC_WILDCARD: _string_predicate(_wildcard),
    Kind.FUNC_REGEX: _string_predicate(_regex),
    Kind.FUNC_FOLD_CASE: _string_function(_lower_case),
    Kind.FUNC_DECOMPOSE: _string_function(_nfd),
    Kind.FUNC_DECOMPOSE_COMPAT: _string_function(_nfkd),
    Kind.FUNC_SIZE: _size,
    Kind.FUNC_EQUALS: _func_equals,
}


# -- generated code for the common shape -------------------------------------
#
# Most subscriptions are a conjunction (or disjunction) of comparisons of an
# attribute with a literal. For those the closure tree costs a call per
# node; instead we generate one straight-line function with the same
# three-valued semantics: each operand is computed inline (or, when it is
# not a simple comparison, by its compiled closure), and the first false
# operand of && (true operand of ||) returns at once.

_FLIP = {Kind.LESS_THAN: Kind.GREATER_THAN, Kind.GREATER_THAN: Kind.LESS_THAN,
         Kind.LESS_THAN_EQUALS: Kind.GREATER_THAN_EQUALS,
         Kind.GREATER_THAN_EQUALS: Kind.LESS_THAN_EQUALS,
         Kind.EQUALS: Kind.EQUALS, Kind.NOT_EQUALS: Kind.NOT_EQUALS}
_PYOP = {Kind.LESS_THAN: "<", Kind.GREATER_THAN: ">", Kind.LESS_THAN_EQUALS: "<=",
         Kind.GREATER_THAN_EQUALS: ">=", Kind.EQUALS: "==", Kind.NOT_EQUALS: "!="}
_NUMBER_KINDS = (Kind.INT32, Kind.INT64, Kind.REAL64)
#: (comparison kind, literal is a string) -> the shared test ``_table`` calls.
_TABLE_TESTS = {
    (Kind.EQUALS, True): _test_string_equal,
    (Kind.NOT_EQUALS, True): _test_string_not_equal,
    (Kind.EQUALS, False): _test_equal,
    (Kind.NOT_EQUALS, False): _test_not_equal,
    (Kind.LESS_THAN, False): _ordering_test(lambda a, b: a < b),
    (Kind.LESS_THAN_EQUALS, False): _ordering_test(lambda a, b: a <= b),
    (Kind.GREATER_THAN, False): _ordering_test(lambda a, b: a > b),
    (Kind.GREATER_THAN_EQUALS, False): _ordering_test(lambda a, b: a >= b),
}


def _simple_comparison(node):
    """(op, name, literal node) for ``name OP literal``, else None."""
    if node.kind not in _PYOP:
        return None
    left, right = node.children
    if left.kind == Kind.NAME and (right.kind in _NUMBER_KINDS or right.kind == Kind.STRING):
        return node.kind, left.value, right
    if right.kind == Kind.NAME and (left.kind in _NUMBER_KINDS or left.kind == Kind.STRING):
        return _FLIP[node.kind], right.value, left
    return None


def _atom(node, simple, consts, index, same):
    """Put operand ``index``'s constants in ``consts``; return the key of
    the code it needs (``_atom_lines`` writes that code from the key alone,
    so a shape seen before costs no source building). ``simple``: the
    node's ``_simple_comparison``; ``same``: the operand before it
    compares the same attribute with a number, so a numeric comparison
    reuses that read (a range is two comparisons)."""
    if simple is None:
        consts[f"f{index}"] = _compile(node).fn
        return ("call",)
    kind, attribute, literal = simple
    consts[f"n{index}"] = attribute
    if literal.kind == Kind.STRING:
        if kind not in (Kind.EQUALS, Kind.NOT_EQUALS):
            return ("bottom",)  # ordering strings is bottom (checker rejects it)
        consts[f"c{index}"] = literal.value
        return ("string", kind)
    real = float(literal.value)
    # An int32 is exactly its real64, so a real value is compared with the
    # int itself; an int64 keeps a real64 copy (past 2**53 it differs).
    exact = literal.kind == Kind.INT32
    if literal.kind != Kind.REAL64:
        consts[f"i{index}"] = literal.value
    if not exact:
        consts[f"r{index}"] = real
    return ("number", kind, literal.kind == Kind.REAL64, real == 0.0, same, exact)


def _atom_lines(key, index, stop):
    """Lines deciding one operand: return ``stop`` (False in an ``&&``,
    True in an ``||``) when it is ``stop``, set ``r = None`` when it is
    bottom, else go on. Both Python branches of a comparison give a bool,
    so only a value of another type is bottom."""
    test = "if not ({}):" if stop == "False" else "if {}:"
    if key[0] == "call":
        return [f"x = f{index}(a)", f"if x is {stop}:", f"    return {stop}",
                "if x is None:", "    r = None"]
    if key[0] == "bottom":
        return ["r = None"]
    op = _PYOP[key[1]]
    if key[0] == "string":
        return [f"v = a.get(n{index})",
                "if v.__class__ is str:",
                "    " + test.format(f"v {op} c{index}"),
                f"        return {stop}",
                "else:",
                "    r = None"]
    _, _, is_real, is_zero, same, exact = key
    # The literal against a real value: an int32 is compared as it is
    # (Python compares a float with an int exactly) and made a real64
    # only for ``_rc``, which NaN and zeros take; ``_atom`` keeps no copy.
    if exact:
        real, as_real = f"i{index}", f"float(i{index})"
    else:
        real = as_real = f"r{index}"
    cmp_real = f"(_rc(v, {as_real}) {op} 0)"
    if is_real:
        int_case = f"_rc(float(v), r{index}) {op} 0" if is_zero else f"float(v) {op} r{index}"
    else:
        int_case = f"v {op} i{index}"
    fast_real = cmp_real if is_zero else (
        f"(v {op} {real}) if (v == v and v != 0.0) else {cmp_real}")
    read = [] if same else [f"v = a.get(n{index})", "t = v.__class__"]
    return read + [
        "if t is int or t is _I64:",
        "    " + test.format(int_case),
        f"        return {stop}",
        "elif t is float:",
        "    " + test.format(fast_real),
        f"        return {stop}",
        "else:",
        "    r = None",
    ]


def _operands(root):
    """The comparisons a generated evaluator for ``root`` tests, in order:
    an ``&&``/``||``'s children, or ``root`` alone. An ``&&`` tests those
    with a number first: the index files a subscription under its
    equalities (elvin.core.index), so a candidate it gives already has its
    ``name == "string"`` operands true and the ranges decide; any order
    gives the same three-valued result, as no operand has an effect."""
    if root.kind not in (Kind.AND, Kind.OR):
        return (root,)
    if root.kind == Kind.OR:
        return root.children
    numeric, other = [], []
    for operand in root.children:
        simple = _simple_comparison(operand)
        (numeric if simple is not None and simple[2].kind in _NUMBER_KINDS
         else other).append(operand)
    return tuple(numeric + other) if numeric and other else root.children


def _generate(root):
    """A generated evaluator for ``root``, or None when it does not apply."""
    if root.kind not in (Kind.AND, Kind.OR) and _simple_comparison(root) is None:
        return None
    operands = _operands(root)
    if len(operands) > _MAX_GENERATED_OPERANDS or not any(
            _simple_comparison(c) is not None for c in operands):
        return None
    shape, consts = _code_shape(root, operands)
    make, literal_names = _maker(shape, consts)
    return make(*[consts[n] for n in literal_names])


def _code_shape(root, operands):
    """The code shape of ``root`` over ``operands`` (the && / || and each
    operand's ``_atom`` key) and the constants it needs."""
    consts = {"_rc": _real_compare, "_I64": Int64}
    keys = []
    previous = None     # the attribute the operand before compares with a number
    for index, operand in enumerate(operands):
        simple = _simple_comparison(operand)
        numeric = simple is not None and simple[2].kind in _NUMBER_KINDS
        keys.append(_atom(operand, simple, consts, index,
                          numeric and previous is not None and simple[1] == previous))
        previous = simple[1] if numeric else None
    shape = (root.kind if root.kind in (Kind.AND, Kind.OR) else Kind.AND,) + tuple(keys)
    return shape, consts


def _is_fixed(name):
    """Is constant ``name`` the same for every subscription of a shape and
    its attribute names (a name ``n<i>`` or a helper), not a literal's?"""
    return name[0] in "_n"


def _maker(shape, consts):
    """The ``make(*literals)`` function for ``shape`` with the fixed
    constants of ``consts`` bound, and the names of its parameters.

    The code is compiled once per shape (``_factory``); the fixed
    constants (attribute names, helpers) are the globals of a function
    made from that code once per shape and names, so each evaluator holds
    only its literals, as keyword defaults: one small tuple per
    subscription, read with LOAD_FAST."""
    code, fixed_names, literal_names = _factory_for(shape, consts)
    fixed = tuple([consts[n] for n in fixed_names])
    key = (shape, fixed)
    make = _MAKERS.get(key)
    if make is None:
        if len(_MAKERS) >= _MAX_FACTORIES:
            _MAKERS.pop(next(iter(_MAKERS)))
        scope = dict(zip(fixed_names, fixed))
        scope["__builtins__"] = __builtins__
        make = _MAKERS[key] = types.FunctionType(code, scope, "make")
    return make, literal_names


def _factory_for(shape, consts):
    """The (cached) compiled ``make`` code for ``shape`` and the names of
    its fixed and literal constants."""
    made = _FACTORIES.get(shape)
    if made is None:
        if len(_FACTORIES) >= _MAX_FACTORIES:
            _FACTORIES.pop(next(iter(_FACTORIES)))
        # The constants' names follow from the shape, so this
        # subscription's are every later one's of the same shape.
        names = sorted(consts)
        made = _FACTORIES[shape] = (_factory(shape, [n for n in names if not _is_fixed(n)]),
                                    [n for n in names if _is_fixed(n)],
                                    [n for n in names if not _is_fixed(n)])
    return made


def generated_plan(root, position):
    """How ``_generate`` would build ``root``'s evaluator from its literals
    alone, for ``elvin.subscription.shapes``: a ``Plan`` whose
    ``evaluator(values)`` gives, for any literals of the same kinds, the
    evaluator ``compile_tree`` gives the tree holding them; or None when
    ``root`` is not all simple comparisons. ``position(node)`` is a literal
    leaf's index in the values.

    Which code a literal needs depends on its kind and on whether it is
    zero (``_atom``), so the plan also says which literals it assumed zero.
    """
    if not _all_simple(root):
        return None
    operands = _operands(root)
    if len(operands) > _MAX_GENERATED_OPERANDS:
        return None
    shape, consts = _code_shape(root, operands)
    keys = shape[1:]
    literal_of = {index: position(_simple_comparison(operand)[2])
                  for index, operand in enumerate(operands)}
    make, literal_names = _maker(shape, consts)
    # c<i>: operand i's string; i<i>: its integer; r<i>: it as a real64 (a real or int64)
    sources = tuple([(literal_of[int(name[1:])], name[0] == "r") for name in literal_names])
    zeros = tuple(sorted({(literal_of[i], key[3]) for i, key in enumerate(keys)
                          if key[0] == "number"}))
    return Plan(make, sources, zeros)


class Plan:
    """A shape's evaluator recipe (see ``generated_plan``)."""

    __slots__ = ("make", "sources", "zeros", "back")

    def __init__(self, make, sources, zeros):
        self.make = make
        self.sources = sources
        self.zeros = zeros
        # value index -> the evaluator parameter holding it (as given, or
        # as a real64 when only that is passed): see ``values_from``.
        back = {}
        for position, (index, real) in enumerate(sources):
            if index not in back or not real:
                back[index] = position
        self.back = tuple([back.get(index) for index in range(max(back) + 1)]) if back else ()

    def applies(self, values):
        """Do ``values`` have the zeros the code was generated for?"""
        for index, zero in self.zeros:
            if (values[index] == 0) != zero:
                return False
        return True

    def values_from(self, evaluator, count):
        """The literal values an evaluator of this plan was made from, read
        back from its defaults, or None when they cannot all be: a caller
        keeps them itself unless each one read back ``is`` its value."""
        back = self.back
        defaults = evaluator.__defaults__
        if len(back) != count or None in back or not defaults:
            return None
        return tuple([defaults[position] for position in back])

    def evaluator(self, values):
        share = _SHARED_FLOATS.setdefault
        args = []
        for index, real in self.sources:
            value = values[index]
            if real:
                value = float(value)
                if value:                   # 0.0 and -0.0: equal, not the same
                    value = share(value, value)
            args.append(value)
        trim_shared_numbers()
        return self.make(*args)


#: Numbers held once for every subscription holding an equal one (type
#: for type): the literals of placed subscriptions and the real64 copies
#: of their int64 literals. With 100,000 subscriptions of a few hundred
#: distinct bounds each would otherwise hold its own (24-28 bytes each).
#: Zeros are never shared (0.0 and -0.0 are equal but not the same literal).
_SHARED_INTS: dict = {}
_SHARED_FLOATS: dict = {}
_MAX_SHARED_NUMBERS = 1 << 16


def shared_number(value):
    """``value``, or an equal number of the same type held already."""
    if not value:
        return value
    if value.__class__ is int:
        return _SHARED_INTS.setdefault(value, value)
    if value.__class__ is float:
        return _SHARED_FLOATS.setdefault(value, value)
    return value


def trim_shared_numbers():
    """Start the shared numbers afresh once there are too many (they are
    only shared, never needed)."""
    if len(_SHARED_INTS) > _MAX_SHARED_NUMBERS:
        _SHARED_INTS.clear()
    if len(_SHARED_FLOATS) > _MAX_SHARED_NUMBERS:
        _SHARED_FLOATS.clear()


def _factory(shape, names):
    """Compile the ``make(*names)`` function for one shape of operands.
    Literals are parameters, so one compile (about a millisecond) serves
    every subscription of the same shape."""
    stop, seed = ("False", "True") if shape[0] == Kind.AND else ("True", "False")
    body = [f"r = {seed}"]
    for index, key in enumerate(shape[1:]):
        body += _atom_lines(key, index, stop)
    body.append("return r")
    # The literals are keyword defaults of ``evaluate``: one tuple per
    # subscription instead of a closure cell each, and LOAD_FAST. The
    # fixed constants are the globals ``_maker`` gives ``make``.
    defaults = ", ".join(f"{n}={n}" for n in names)
    source = (f"def make({', '.join(names)}):\n    def evaluate(a, {defaults}):\n"
              + "".join(f"        {line}\n" for line in body) + "    return evaluate\n")
    namespace = {}
    exec(compile(source, "<subscription>", "exec"), namespace)
    return namespace["make"].__code__

_FACTORIES = {}
_MAKERS = {}
#: Longer && / || chains keep the closure form (a huge OR of comparisons
#: would cost more to compile than it saves).
_MAX_GENERATED_OPERANDS = 64
_MAX_FACTORIES = 4096
