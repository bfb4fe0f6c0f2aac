"""Print a SubAST as canonical subscription text.

Every operator child that is itself an operator is parenthesised, so the
text parses back to an equal tree (n-ary chains included), whatever the
precedence rules. Names are backslash-escaped where the grammar needs it.
"""

import math

from elvin.subscription.grammar import FUNCTIONS
from elvin.subscription.grammar import SYMBOL as _SYMBOL
from elvin.subscription.kinds import LEAF_KINDS, Kind
from elvin.subscription.lexer import ID_CHARS, ID_FIRST

__all__ = ["to_text", "name_to_text", "string_to_text", "real_to_text"]

_FUNCTION_NAMES = {kind: name for name, (kind, _, _) in FUNCTIONS.items()}
_UNARY = {Kind.NOT: "!", Kind.UNARY_MINUS: "-", Kind.UNARY_PLUS: "+",
          Kind.BIT_NEGATE: "~"}


def name_to_text(attribute):
    """An attribute name as it must be written in an expression."""
    if not attribute:
        raise ValueError("an empty attribute name cannot be written in an expression")
    if "\x00" in attribute:
        raise ValueError("an attribute name containing NUL cannot be written")
    out = [attribute[0] if attribute[0] in ID_FIRST else "\\" + attribute[0]]
    for c in attribute[1:]:
        out.append(c if c in ID_CHARS else "\\" + c)
    return "".join(out)


def string_to_text(value):
    """A string literal, double-quoted with backslash escapes."""
    if "\x00" in value:
        raise ValueError("a string containing NUL cannot be written as a literal")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def real_to_text(value):
    """A real64 literal with the decimal point the grammar requires."""
    if math.isinf(value) or math.isnan(value):
        raise ValueError(f"{value!r} has no literal form in the subscription language")
    text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + (e + exponent if e else "")


def _leaf(node):
    kind = node.kind
    if kind == Kind.NAME:
        return name_to_text(node.value)
    if kind == Kind.STRING:
        return string_to_text(node.value)
    if kind == Kind.INT32:
        return str(node.value)
    if kind == Kind.INT64:
        return f"{node.value}L"
    return real_to_text(node.value)


def _operand(node):
    text = to_text(node)
    if node.kind in LEAF_KINDS or node.kind in _FUNCTION_NAMES:
        return text
    return "(" + text + ")"


def to_text(node):
    """Canonical text for ``node``."""
    kind = node.kind
    if kind in LEAF_KINDS:
        return _leaf(node)
    if kind in _FUNCTION_NAMES:
        args = ", ".join(to_text(c) for c in node.children)
        return f"{_FUNCTION_NAMES[kind]}({args})"
    if kind in _UNARY:
        return f"{_UNARY[kind]}({to_text(node.children[0])})"
    symbol = _SYMBOL.get(kind)
    if symbol is None:
        raise ValueError(f"cannot print a {kind.name} node")
    return f" {symbol} ".join(_operand(c) for c in node.children)
