"""PLY lexer for the subscription language (client protocol 4.0, Appendix A).

Names are greedy, as the grammar's ``id-char`` rule makes them: they may
contain operator characters, so ``x==1`` is a single name and operators must
be separated from a preceding name by whitespace. A backslash in a name or
a string literal makes the next character literal.
"""

import sys

import ply.lex as lex

from elvin import errors
from elvin.errors import SubscriptionError, echoed

__all__ = ["tokens", "tokenize", "make_lexer", "ID_FIRST", "ID_CHARS", "unescape"]

reserved = {}

tokens = (
    "NAME", "INT", "REAL", "STRING",
    "OR", "XOR", "AND", "NOT",
    "EQ", "NE", "LT", "LE", "GT", "GE",
    "PLUS", "MINUS", "TIMES", "DIVIDE", "MOD",
    "LSHIFT", "RSHIFT", "URSHIFT",
    "BITAND", "BITXOR", "BITOR", "TILDE",
    "LPAREN", "RPAREN", "COMMA",
)

# Characters a name may start with / continue with, unescaped (Appendix A
# id-first and id-char, with U+0028 excluded as every implementation does:
# otherwise no function call could be written).
ID_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
ID_CHARS = frozenset(
    [chr(0x21)] + [chr(c) for c in range(0x23, 0x27)]
    + [chr(c) for c in range(0x2A, 0x2C)] + [chr(c) for c in range(0x2D, 0x5B)]
    + [chr(c) for c in range(0x5E, 0x100)])

_ID_FIRST_RE = r"[A-Za-z_]"
_ID_CHAR_RE = r"[\x21\x23-\x26\x2a\x2b\x2d-\x5a\x5e-\xff]"
_ESCAPE_RE = r"\\[^\x00]"


def unescape(text):
    """Remove backslash escapes: a backslash stands for the next character."""
    if "\\" not in text:
        return text
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class _Rules:
    tokens = tokens

    t_ignore = " \t\r\n"

    t_OR = r"\|\|"
    t_XOR = r"\^\^"
    t_AND = r"&&"
    t_EQ = r"=="
    t_NE = r"!="
    t_LE = r"<="
    t_GE = r">="
    t_URSHIFT = r">>>"
    t_LSHIFT = r"<<"
    t_RSHIFT = r">>"
    t_LT = r"<"
    t_GT = r">"
    t_NOT = r"!"
    t_PLUS = r"\+"
    t_MINUS = r"-"
    t_TIMES = r"\*"
    t_DIVIDE = r"/"
    t_MOD = r"%"
    t_BITAND = r"&"
    t_BITXOR = r"\^"
    t_BITOR = r"\|"
    t_TILDE = r"~"
    t_LPAREN = r"\("
    t_RPAREN = r"\)"
    t_COMMA = r","

    def __init__(self, text):
        self.text = text

    def t_STRING(self, t):
        r'"(?:[^"\\]|\\[\s\S])*"|\'(?:[^\'\\]|\\[\s\S])*\''
        raw = t.value[1:-1]
        nul = raw.find("\x00")
        if nul >= 0:
            raise SubscriptionError(errors.INVALID_TOKEN, t.lexpos + 1 + nul,
                                    "NUL character in string literal", "\x00")
        t.value = sys.intern(unescape(raw))
        return t

    def t_REAL(self, t):
        r"[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?"
        self._check_number_end(t)
        return t

    def t_INT(self, t):
        r"0[xX][0-9A-Fa-f]+[lL]?|[0-9]+[lL]?"
        self._check_number_end(t)
        return t

    def t_NAME(self, t):
        r"(?:[A-Za-z_]|\\[^\x00])(?:[\x21\x23-\x26\x2a\x2b\x2d-\x5a\x5e-\xff]|\\[^\x00])*"
        t.value = (sys.intern(unescape(t.value)), t.value)
        return t

    def _check_number_end(self, t):
        end = t.lexpos + len(t.value)
        text = self.text
        if end < len(text) and (text[end].isalnum() or text[end] in "._\\"):
            stop = end
            while stop < len(text) and (text[stop].isalnum() or text[stop] in "._+-"):
                stop += 1
            bad = text[t.lexpos:stop]
            raise SubscriptionError(errors.INVALID_TOKEN, t.lexpos,
                                    f"invalid number {echoed(bad)} at offset {t.lexpos}", bad)

    def t_error(self, t):
        c = t.value[0]
        if c in "\"'":
            raise SubscriptionError(errors.UNTERM_STRING, t.lexpos,
                                    f"unterminated string starting at offset {t.lexpos}",
                                    t.value)
        if c == "\\":
            raise SubscriptionError(errors.INVALID_TOKEN, t.lexpos,
                                    f"backslash at end of expression (offset {t.lexpos})",
                                    c)
        hint = " (equality is '==')" if c == "=" else ""
        raise SubscriptionError(errors.INVALID_TOKEN, t.lexpos,
                                f"invalid character {c!r} at offset {t.lexpos}{hint}", c)


def make_lexer(text):
    """A PLY lexer over ``text`` (built without writing any table file)."""
    rules = _Rules(text)
    lexer = lex.lex(module=rules, optimize=False, debug=False,
                    errorlog=lex.NullLogger())
    lexer.input(text)
    return lexer


_TEMPLATE = None


def _lexer_for(text):
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = lex.lex(module=_Rules(""), optimize=False, debug=False,
                            errorlog=lex.NullLogger())
    lexer = _TEMPLATE.clone(_Rules(text))
    # clone() rebinds the rules in lexstatere but not the active lexre.
    lexer.begin("INITIAL")
    lexer.input(text)
    return lexer


def tokenize(text):
    """Return the list of PLY tokens of ``text``; raises SubscriptionError."""
    lexer = _lexer_for(text)
    return list(iter(lexer.token, None))


def more_tokens_than(text, limit):
    """Has ``text`` more than ``limit`` tokens? Reads at most ``limit + 1``
    of them, so the answer costs no more than the budget it checks. A
    lexical error counts as "no": parsing reports it with its offset."""
    if len(text) <= limit:
        return False       # every token is at least one character
    lexer = _lexer_for(text)
    token = lexer.token
    try:
        for _ in range(limit + 1):
            if token() is None:
                return False
    except SubscriptionError:
        return False
    return True
