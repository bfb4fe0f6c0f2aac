"""PLY grammar for the subscription language: text to SubAST.

Operator precedence, loosest first (docs/subscription-language.md):

    ||   ^^   &&   !   == != < <= > >=   + -   * / %   << >> >>>   |   ^   &
    unary - + ~

as the language reference states (multiplicative operators bind looser
than the bitwise ones; ``!`` binds tighter than ``&&`` but looser than a
comparison, so ``! x == 1`` is ``!(x == 1)``). Chains of ``&&``, ``||`` and
``^^`` that are not parenthesised become one n-ary node, as other routers
do; parenthesised groups are kept, so printing and re-parsing a tree gives
the same tree.

A minus sign written directly before a number in prefix position is part of
the literal (``-2147483648`` is a valid int32), as section 6.1.4 says.
"""

import ply.yacc as yacc

from elvin import errors
from elvin.errors import SubscriptionError, echoed
from elvin.subscription import lexer as _lexer
from elvin.subscription.ast import Kind, Node
from elvin.subscription.grammar import FUNCTIONS, MAX_DEPTH
from elvin.subscription.printer import to_text
from elvin.values import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

__all__ = ["parse", "ParseResult", "FUNCTIONS", "MAX_DEPTH"]

_NAME_ONLY = frozenset({Kind.NAME})
_STRING_FUNCTIONS = frozenset({Kind.FUNC_FOLD_CASE, Kind.FUNC_DECOMPOSE,
                               Kind.FUNC_DECOMPOSE_COMPAT})
_STRING_SUBJECT = _NAME_ONLY | _STRING_FUNCTIONS
_STRING_VALUE = _STRING_SUBJECT | {Kind.STRING}

#: function kind -> the node kinds its first argument may be (grammar).
_ARGUMENT_FORMS = {
    **{kind: _NAME_ONLY for kind in (
        Kind.FUNC_REQUIRE, Kind.FUNC_INT32, Kind.FUNC_INT64, Kind.FUNC_REAL64,
        Kind.FUNC_STRING, Kind.FUNC_OPAQUE, Kind.FUNC_NAN, Kind.FUNC_SIZE)},
    **{kind: _STRING_SUBJECT for kind in (
        Kind.FUNC_EQUALS, Kind.FUNC_BEGINS_WITH, Kind.FUNC_ENDS_WITH, Kind.FUNC_CONTAINS,
        Kind.FUNC_WILDCARD, Kind.FUNC_REGEX)},
    **{kind: _STRING_VALUE for kind in _STRING_FUNCTIONS},
}
_FORM_NAMES = {
    _NAME_ONLY: "an attribute name",
    _STRING_SUBJECT: "an attribute name or a string function (fold-case, decompose, "
                     "decompose-compat)",
    _STRING_VALUE: "an attribute name, a string literal or a string function",
}
_LITERAL_FORMS = {Kind.INT32: "int32 literal", Kind.INT64: "int64 literal",
                  Kind.REAL64: "real64 literal", Kind.STRING: "string literal"}
_LITERAL_TYPE_NAMES = {Kind.INT32: "int32", Kind.INT64: "int64", Kind.REAL64: "real64",
                       Kind.STRING: "string"}

_BINARY = {
    "||": Kind.OR, "^^": Kind.XOR, "&&": Kind.AND,
    "==": Kind.EQUALS, "!=": Kind.NOT_EQUALS, "<": Kind.LESS_THAN,
    "<=": Kind.LESS_THAN_EQUALS, ">": Kind.GREATER_THAN,
    ">=": Kind.GREATER_THAN_EQUALS,
    "+": Kind.ADD, "-": Kind.SUBTRACT, "*": Kind.MULTIPLY, "/": Kind.DIVIDE,
    "%": Kind.MODULO, "<<": Kind.SHIFT_LEFT, ">>": Kind.SHIFT_RIGHT,
    ">>>": Kind.LOGICAL_SHIFT_RIGHT, "&": Kind.BIT_AND, "^": Kind.BIT_XOR,
    "|": Kind.BIT_OR,
}

_NARY = (Kind.AND, Kind.OR, Kind.XOR)
_LITERAL_TOKENS = frozenset({"INT", "REAL", "STRING"})
_node = Node._trusted

# Tokens after which a '-' is a prefix (sign), not a subtraction.
_PREFIX_CONTEXT = frozenset({
    None, "OR", "XOR", "AND", "NOT", "EQ", "NE", "LT", "LE", "GT", "GE",
    "PLUS", "MINUS", "TIMES", "DIVIDE", "MOD", "LSHIFT", "RSHIFT", "URSHIFT",
    "BITAND", "BITXOR", "BITOR", "TILDE", "LPAREN", "COMMA"})


class ParseResult:
    """The tree and where each node started in the text (for error offsets)."""

    __slots__ = ("tree", "offsets", "op_offsets", "text", "literals")

    def __init__(self, tree, offsets, op_offsets, text, literals=()):
        self.tree = tree
        self.offsets = offsets
        self.op_offsets = op_offsets
        self.text = text
        #: the literal tokens as (type, value, offset), signs merged, in
        #: text order (``elvin.subscription.shapes`` checks its key by them)
        self.literals = literals


class _Grammar:
    tokens = _lexer.tokens

    precedence = (
        ("left", "OR"),
        ("left", "XOR"),
        ("left", "AND"),
        ("right", "NOT"),
        ("nonassoc", "EQ", "NE", "LT", "LE", "GT", "GE"),
        ("left", "PLUS", "MINUS"),
        ("left", "TIMES", "DIVIDE", "MOD"),
        ("left", "LSHIFT", "RSHIFT", "URSHIFT"),
        ("left", "BITOR"),
        ("left", "BITXOR"),
        ("left", "BITAND"),
        ("right", "UMINUS", "UPLUS", "TILDE"),
    )

    def __init__(self):
        self.state = None

    # The state of one parse lives in ``self.state`` (a _ParseState).

    def p_expression(self, p):
        "expression : expr"
        p[0] = p[1]

    def p_expr_binary(self, p):
        """expr : expr OR expr
                | expr XOR expr
                | expr AND expr
                | expr EQ expr
                | expr NE expr
                | expr LT expr
                | expr LE expr
                | expr GT expr
                | expr GE expr
                | expr PLUS expr
                | expr MINUS expr
                | expr TIMES expr
                | expr DIVIDE expr
                | expr MOD expr
                | expr LSHIFT expr
                | expr RSHIFT expr
                | expr URSHIFT expr
                | expr BITAND expr
                | expr BITXOR expr
                | expr BITOR expr"""
        kind = _BINARY[p[2]]
        left, right = p[1], p[3]
        s = self.state
        if kind in _NARY and left.kind == kind and id(left) not in s.grouped:
            # ``left`` is this chain's node, made by this rule and held by
            # nothing else: grow its children in a list (a new tuple per
            # term would make a long chain cost quadratic time); ``parse``
            # gives the node the tuple at the end.
            chain = s.chains.get(id(left))
            if chain is None:
                chain = s.chains[id(left)] = (left, list(left.children))
            chain[1].append(right)
            s.op_offsets[id(left)] = p.lexpos(2)
            p[0] = left
            return
        result = _node(kind, None, (left, right))
        s.keep(result, s.offsets.get(id(left), p.lexpos(2)))
        s.op_offsets[id(result)] = p.lexpos(2)
        p[0] = result

    def p_expr_not(self, p):
        "expr : NOT expr"
        p[0] = self.state.keep(_node(Kind.NOT, None, (p[2],)), p.lexpos(1))

    def p_expr_unary(self, p):
        """expr : MINUS expr %prec UMINUS
                | PLUS expr %prec UPLUS
                | TILDE expr"""
        kind = {"-": Kind.UNARY_MINUS, "+": Kind.UNARY_PLUS, "~": Kind.BIT_NEGATE}[p[1]]
        p[0] = self.state.keep(_node(kind, None, (p[2],)), p.lexpos(1))

    def p_expr_group(self, p):
        "expr : LPAREN expr RPAREN"
        p[0] = p[2]
        self.state.grouped.add(id(p[2]))

    def p_expr_call(self, p):
        "expr : NAME LPAREN args RPAREN"
        p[0] = self._call(p, p[3])

    def p_expr_call_empty(self, p):
        "expr : NAME LPAREN RPAREN"
        p[0] = self._call(p, [])

    def _call(self, p, args):
        function, raw = p[1]
        offset = p.lexpos(1)
        spec = FUNCTIONS.get(function)
        if spec is None:
            raise SubscriptionError(errors.UNKNOWN_FUNC, offset,
                                    f"unknown function {echoed(raw)} at offset {offset}", raw)
        kind, low, high = spec
        if len(args) < low:
            raise SubscriptionError(
                errors.TOO_FEW_ARGS, offset,
                f"too few arguments to {function}() at offset {offset}: "
                f"needs at least {low}, got {len(args)}", function)
        if high is not None and len(args) > high:
            raise SubscriptionError(
                errors.TOO_MANY_ARGS, offset,
                f"too many arguments to {function}() at offset {offset}: "
                f"takes at most {high}, got {len(args)}", function)
        self._restrict_arguments(function, kind, args)
        return self.state.keep(_node(kind, None, tuple(args)), offset)

    def _restrict_arguments(self, function, kind, args):
        """Refuse arguments the grammar does not allow in their place.

        Where the language requires an attribute name (type tests,
        ``require``, ``size``), or a subject (the first argument of
        ``equals`` and of the string predicates: a name or a string
        function, as section 6's string comparisons say; the string
        functions: a name, a string literal or a string function), anything else is refused here, at parse time, as
        the Avis router does: a literal with TYPE_MISMATCH (its type does
        not fit its place), any other expression with PARSE_ERROR.
        """
        allowed = _ARGUMENT_FORMS.get(kind)
        if allowed is None:
            return
        first = args[0]
        state = self.state
        if id(first) in state.grouped:
            form = "parenthesised expression"
        elif first.kind in allowed:
            return
        elif first.kind in _LITERAL_FORMS:
            form = _LITERAL_FORMS[first.kind]
        else:
            form = "expression"
        offset = state.offsets.get(id(first), 0)
        message = (f"{function}() needs {_FORM_NAMES[allowed]} as its first argument, "
                   f"not {'an' if form[0] in 'aei' else 'a'} {form} (at offset {offset})")
        if form in _LITERAL_FORMS.values() and first.kind in _LITERAL_TYPE_NAMES:
            # Nack args (7.4.2's table): offset, the expression, its type.
            raise SubscriptionError(errors.TYPE_MISMATCH, offset, message, to_text(first),
                                    _LITERAL_TYPE_NAMES[first.kind])
        raise SubscriptionError(errors.PARSE_ERROR, offset, message,
                                _token_at(state.text, offset))

    def p_args_one(self, p):
        "args : expr"
        p[0] = [p[1]]

    def p_args_more(self, p):
        "args : args COMMA expr"
        p[1].append(p[3])
        p[0] = p[1]

    def p_expr_name(self, p):
        "expr : NAME"
        p[0] = self.state.keep(_node(Kind.NAME, p[1][0], ()), p.lexpos(1))

    def p_expr_int(self, p):
        "expr : INT"
        p[0] = self.state.keep(_integer(p[1], p.lexpos(1)), p.lexpos(1))

    def p_expr_real(self, p):
        "expr : REAL"
        p[0] = self.state.keep(_real(p[1], p.lexpos(1)), p.lexpos(1))

    def p_expr_string(self, p):
        "expr : STRING"
        p[0] = self.state.keep(_node(Kind.STRING, p[1], ()), p.lexpos(1))

    def p_error(self, tok):
        text = self.state.text
        if tok is None:
            raise SubscriptionError(errors.PARSE_ERROR, len(text),
                                    f"unexpected end of expression at offset {len(text)}", "")
        shown = text[tok.lexpos:tok.lexpos + 20]
        raise SubscriptionError(errors.PARSE_ERROR, tok.lexpos,
                                f"syntax error at offset {tok.lexpos} near {shown!r}",
                                _token_text(tok))


class _ParseState:
    __slots__ = ("text", "offsets", "op_offsets", "grouped", "chains")

    def __init__(self, text):
        self.text = text
        self.offsets = {}
        self.op_offsets = {}
        self.grouped = set()
        #: id(node) -> (node, children list) of the && / || / ^^ chains
        self.chains = {}

    def close_chains(self):
        """Give each chain's node its children as a tuple."""
        for node, children in self.chains.values():
            object.__setattr__(node, "children", tuple(children))
        self.chains.clear()

    def keep(self, node, offset):
        self.offsets[id(node)] = offset
        return node


def _token_at(text, offset):
    """The token starting at ``offset`` in ``text`` (for Nack arguments)."""
    lexer = _lexer._lexer_for(text)
    lexer.lexpos = offset
    try:
        tok = lexer.token()
    except SubscriptionError:
        tok = None
    return "" if tok is None else _token_text(tok)


def _token_text(tok):
    if tok.type == "NAME":
        return tok.value[1]
    return str(tok.value)


def _integer(text, offset):
    body = text
    wide = body[-1] in "lL"
    if wide:
        body = body[:-1]
    negative = body.startswith("-")
    digits = body[1:] if negative else body
    hexadecimal = digits[:2] in ("0x", "0X")
    octal = not hexadecimal and len(digits) > 1 and digits[0] == "0"
    if octal and any(c in "89" for c in digits):
        raise SubscriptionError(errors.INVALID_TOKEN, offset, f"invalid octal literal "
                                f"{echoed(text)} at offset {offset}", text)
    if len((digits[2:] if hexadecimal else digits).lstrip("0")) > 32:
        value = 2**64        # out of range in any base (and past int()'s digit limit)
    else:
        value = int(digits[2:] if hexadecimal else digits, 16 if hexadecimal else 8 if octal
                    else 10)
    if negative:
        value = -value
    if wide:
        if not INT64_MIN <= value <= INT64_MAX:
            raise SubscriptionError(errors.OVERFLOW, offset, f"int64 literal {echoed(text)} "
                                    f"at offset {offset} is out of range", text)
        return _node(Kind.INT64, value, ())
    if not INT32_MIN <= value <= INT32_MAX:
        raise SubscriptionError(
            errors.OVERFLOW, offset,
            f"int32 literal {echoed(text)} at offset {offset} is out of range "
            "(add an L suffix for int64)", text)
    return _node(Kind.INT32, value, ())


def _real(text, offset):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise SubscriptionError(errors.OVERFLOW, offset, f"real64 literal {echoed(text)} "
                                f"at offset {offset} is out of range", text)
    return _node(Kind.REAL64, value, ())


_GRAMMAR = None
_PARSER = None


#: The LALR tables, generated once and shipped (``write_tables``): PLY
#: reads them instead of building them at start-up (about 0.1 s), and
#: rebuilds them in memory whenever their signature no longer matches the
#: grammar, so a stale file costs time, never correctness (a test checks
#: the shipped one is current).
TABLES = "elvin.subscription.parsetab"


def _parser():
    global _GRAMMAR, _PARSER
    if _PARSER is None:
        _GRAMMAR = _Grammar()
        _PARSER = yacc.yacc(module=_GRAMMAR, tabmodule=TABLES, write_tables=False,
                            debug=False, errorlog=yacc.NullLogger())
    return _GRAMMAR, _PARSER


def write_tables(directory):
    """Regenerate the shipped LALR tables (``parsetab.py``) in ``directory``:
    ``python -m elvin.subscription.parser`` after changing the grammar."""
    yacc.yacc(module=_Grammar(), tabmodule=TABLES, write_tables=True,
              outputdir=directory, debug=False, errorlog=yacc.NullLogger())


def tables_are_current():
    """Does the shipped table's signature match the grammar's?"""
    grammar = _Grammar()
    info = yacc.ParserReflect({name: getattr(grammar, name) for name in dir(grammar)})
    info.get_all()
    return yacc.LRTable().read_table(TABLES) == info.signature()


if __name__ == "__main__":
    import os
    write_tables(os.path.dirname(os.path.abspath(__file__)))


class _TokenStream:
    """Feeds pre-scanned tokens to yacc (PLY's ``lexer`` protocol)."""

    def __init__(self, toks):
        self._iter = iter(toks)

    def token(self):
        return next(self._iter, None)


def _merge_signs(toks, text):
    """Fold a '-' directly before a number in prefix position into it,
    and enforce the parenthesis nesting limit."""
    out = []
    previous = None
    depth = 0
    i = 0
    n = len(toks)
    while i < n:
        tok = toks[i]
        if tok.type == "LPAREN":
            depth += 1
            if depth > MAX_DEPTH:
                raise SubscriptionError(
                    errors.NESTING_TOO_DEEP, tok.lexpos,
                    f"expression nested more than {MAX_DEPTH} deep at offset {tok.lexpos}")
        elif tok.type == "RPAREN":
            depth -= 1
        if (tok.type == "MINUS" and previous in _PREFIX_CONTEXT and i + 1 < n
                and toks[i + 1].type in ("INT", "REAL")
                and toks[i + 1].lexpos == tok.lexpos + 1):
            number = toks[i + 1]
            number.value = "-" + number.value
            number.lexpos = tok.lexpos
            out.append(number)
            previous = number.type
            i += 2
            continue
        out.append(tok)
        previous = tok.type
        i += 1
    return out


def parse(text):
    """Parse subscription ``text`` into a ParseResult; raises SubscriptionError."""
    if not isinstance(text, str):
        raise TypeError(f"subscription expression must be str, not {type(text).__name__}")
    toks = _merge_signs(_lexer.tokenize(text), text)
    if not toks:
        raise SubscriptionError(errors.PARSE_ERROR, 0, "empty subscription expression", "")
    grammar, parser = _parser()
    state = _ParseState(text)
    grammar.state = state
    try:
        tree = parser.parse(lexer=_TokenStream(toks), tracking=False)
        state.close_chains()
    finally:
        grammar.state = None
    literals = [(t.type, t.value, t.lexpos) for t in toks if t.type in _LITERAL_TOKENS]
    return ParseResult(tree, state.offsets, state.op_offsets, text, literals)
