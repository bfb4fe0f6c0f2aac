"""Wildcard (glob) and regular-expression patterns of the string predicates.

Both are compiled once, when a subscription is compiled; several patterns in
one call (``wildcard(x, "a*", "b*")``) become one alternation, so a match
costs one regex scan however many patterns there are.
"""

import re

__all__ = ["PatternError", "wildcard_to_regex", "compile_wildcards",
           "compile_regexes", "check_regex", "check_wildcard"]


class PatternError(ValueError):
    """A pattern cannot be compiled; ``str()`` says why."""


def wildcard_to_regex(pattern):
    """Translate a glob into Python regex source matching the whole string.

    ``*`` matches any run of characters (including none), ``?`` any single
    character, ``[...]`` a character class (``[!...]`` or ``[^...]``
    negated), and a backslash makes the next character literal.
    """
    out = []
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not out or out[-1] != ".*":
                out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\":
            if i < n:
                out.append(re.escape(pattern[i]))
                i += 1
            else:
                out.append(re.escape("\\"))
        elif c == "[":
            j = i
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                raise PatternError(f"unterminated character class in wildcard {pattern!r}")
            body = pattern[i:j]
            i = j + 1
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            body = body.replace("\\", "\\\\")
            if body.startswith("]"):
                body = "\\]" + body[1:]
            out.append("[" + ("^" if negate else "") + body + "]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def check_wildcard(pattern):
    """Raise PatternError if ``pattern`` is not a valid wildcard."""
    try:
        re.compile(wildcard_to_regex(pattern), re.DOTALL)
    except re.error as e:
        raise PatternError(f"invalid wildcard {pattern!r}: {e}") from None


def check_regex(pattern):
    """Raise PatternError if ``pattern`` is not a valid regular expression."""
    try:
        re.compile(pattern, re.DOTALL)
    except (re.error, OverflowError, RecursionError) as e:
        raise PatternError(f"invalid regular expression {pattern!r}: {e}") from None


def compile_wildcards(patterns):
    """Return a ``fullmatch`` callable true for any of ``patterns``."""
    source = "|".join(f"(?:{wildcard_to_regex(p)})" for p in patterns)
    return re.compile(source, re.DOTALL).fullmatch


def compile_regexes(patterns):
    """Return a ``search`` callable true for any of ``patterns`` (unanchored)."""
    if len(patterns) == 1:
        return re.compile(patterns[0], re.DOTALL).search
    compiled = [re.compile(p, re.DOTALL).search for p in patterns]

    def search(value):
        for s in compiled:
            m = s(value)
            if m is not None:
                return m
        return None
    return search
