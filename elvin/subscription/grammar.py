"""The language's tables: functions with their argument counts, operator
symbols, and the nesting limit, shared by the parser, the checker and the
printer (so none of them imports another for them)."""

from elvin.subscription.kinds import Kind

__all__ = ["FUNCTIONS", "MAX_DEPTH", "SYMBOL"]

#: Deepest nesting accepted (parentheses, or the height of the tree).
MAX_DEPTH = 128

#: function name -> (kind, minimum args, maximum args or None)
FUNCTIONS = {
    "require": (Kind.FUNC_REQUIRE, 1, 1),
    "int32": (Kind.FUNC_INT32, 1, 1),
    "int64": (Kind.FUNC_INT64, 1, 1),
    "real64": (Kind.FUNC_REAL64, 1, 1),
    "string": (Kind.FUNC_STRING, 1, 1),
    "opaque": (Kind.FUNC_OPAQUE, 1, 1),
    "nan": (Kind.FUNC_NAN, 1, 1),
    "begins-with": (Kind.FUNC_BEGINS_WITH, 2, None),
    "ends-with": (Kind.FUNC_ENDS_WITH, 2, None),
    "contains": (Kind.FUNC_CONTAINS, 2, None),
    "wildcard": (Kind.FUNC_WILDCARD, 2, None),
    "regex": (Kind.FUNC_REGEX, 2, None),
    "equals": (Kind.FUNC_EQUALS, 2, None),
    "size": (Kind.FUNC_SIZE, 1, 1),
    "fold-case": (Kind.FUNC_FOLD_CASE, 1, 1),
    "decompose": (Kind.FUNC_DECOMPOSE, 1, 1),
    "decompose-compat": (Kind.FUNC_DECOMPOSE_COMPAT, 1, 1),
}

#: Operator kinds as written (the unary ones named so in messages).
SYMBOL = {
    Kind.AND: "&&", Kind.OR: "||", Kind.XOR: "^^", Kind.NOT: "!",
    Kind.EQUALS: "==", Kind.NOT_EQUALS: "!=", Kind.LESS_THAN: "<",
    Kind.LESS_THAN_EQUALS: "<=", Kind.GREATER_THAN: ">",
    Kind.GREATER_THAN_EQUALS: ">=", Kind.ADD: "+", Kind.SUBTRACT: "-",
    Kind.MULTIPLY: "*", Kind.DIVIDE: "/", Kind.MODULO: "%",
    Kind.SHIFT_LEFT: "<<", Kind.SHIFT_RIGHT: ">>",
    Kind.LOGICAL_SHIFT_RIGHT: ">>>", Kind.BIT_AND: "&", Kind.BIT_XOR: "^",
    Kind.BIT_OR: "|", Kind.UNARY_MINUS: "unary -", Kind.UNARY_PLUS: "unary +",
    Kind.BIT_NEGATE: "~",
}
