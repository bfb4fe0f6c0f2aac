"""SubAST node kinds: the typecodes of the client protocol (8.2.3.4).

Data only, so the tree, the grammar tables, the printer and the codec can
all name kinds without importing each other.
"""

import enum

__all__ = ["Kind", "LEAF_KINDS", "LITERAL_KINDS"]


class Kind(enum.IntEnum):
    """SubAST typecodes (client protocol 4.0, section 8.2.3.4)."""

    EMPTY = 0

    NAME = 1
    INT32 = 2
    INT64 = 3
    REAL64 = 4
    STRING = 5

    EQUALS = 8
    NOT_EQUALS = 9
    LESS_THAN = 10
    LESS_THAN_EQUALS = 11
    GREATER_THAN = 12
    GREATER_THAN_EQUALS = 13

    OR = 16
    XOR = 17
    AND = 18
    NOT = 19

    UNARY_PLUS = 20
    UNARY_MINUS = 21
    MULTIPLY = 22
    DIVIDE = 23
    MODULO = 24
    ADD = 25
    SUBTRACT = 26

    SHIFT_LEFT = 27
    SHIFT_RIGHT = 28
    LOGICAL_SHIFT_RIGHT = 29
    BIT_AND = 30
    BIT_XOR = 31
    BIT_OR = 32
    BIT_NEGATE = 33

    FUNC_INT32 = 40
    FUNC_INT64 = 41
    FUNC_REAL64 = 42
    FUNC_STRING = 43
    FUNC_OPAQUE = 44
    FUNC_NAN = 45

    FUNC_BEGINS_WITH = 48
    FUNC_CONTAINS = 49
    FUNC_ENDS_WITH = 50
    FUNC_WILDCARD = 51
    FUNC_REGEX = 52

    FUNC_FOLD_CASE = 56
    FUNC_DECOMPOSE = 57
    FUNC_DECOMPOSE_COMPAT = 58

    FUNC_REQUIRE = 64
    FUNC_EQUALS = 65
    FUNC_SIZE = 66


LITERAL_KINDS = frozenset({Kind.INT32, Kind.INT64, Kind.REAL64, Kind.STRING})
LEAF_KINDS = LITERAL_KINDS | {Kind.NAME}
