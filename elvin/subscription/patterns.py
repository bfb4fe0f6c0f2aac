"""Wildcard (glob) and regular-expression patterns of the string predicates.

Both are compiled once, when a subscription is compiled; several patterns in
one call (``wildcard(x, "a*", "b*")``) become one alternation, so a match
costs one regex scan however many patterns there are.

Matching runs on RE2 (the ``google-re2`` package), whose time is linear in
the input, so no subscription can make the router backtrack for ever
(``(a+)+$`` against a long string costs microseconds). RE2's syntax covers
everything common in POSIX and Python expressions; what it cannot run in
linear time — backreferences, lookaround — is refused with
REGEXP_TOO_COMPLEX, as is a pattern whose program would need more than
``MAX_PROGRAM_MEMORY`` or a repetition over RE2's 1,000; other syntax RE2
does not have (``\Z``, possessive or atomic groups) is INVALID_REGEXP.
A regex's POSIX bracket classes (``[[:alpha:]]``) are given their Unicode
meaning before RE2 sees them (``unicode_classes``). Without the package,
Python's ``re`` is used, and the pattern as it is.
"""

import re

from elvin.errors import echoed
from elvin.subscription.posixclasses import CLASSES

try:
    import re2
except ImportError:  # pragma: no cover - google-re2 is a dependency
    re2 = None

__all__ = ["PatternError", "PatternTooComplex", "wildcard_to_regex", "unicode_classes",
           "weighed_wildcards", "weighed_regexes",
           "check_regex", "check_wildcard",
           "ENGINE", "MAX_PROGRAM_MEMORY"]

ENGINE = "re2" if re2 is not None else "re"
MAX_PROGRAM_MEMORY = 8 << 20


class PatternError(ValueError):
    """A pattern cannot be compiled; ``str()`` says why."""


class PatternTooComplex(PatternError):
    """A valid pattern that cannot be matched in bounded time or memory."""


def _options():
    options = re2.Options()
    options.dot_nl = True
    options.log_errors = False
    options.max_mem = MAX_PROGRAM_MEMORY
    return options


def _compile(source, what):
    """Compile ``source``: RE2 when available, else Python's re (DOTALL)."""
    if re2 is None:
        try:
            return re.compile(source, re.DOTALL)
        except (re.error, OverflowError, RecursionError) as e:
            raise PatternError(f"invalid {what}: {echoed(str(e), quote=False)}") from None
    try:
        return re2.compile(source, _options())
    except re2.error as e:
        reason = e.args[0].decode("utf-8", "replace") if e.args and isinstance(
            e.args[0], bytes) else str(e)
    except (TypeError, ValueError) as e:  # e.g. NUL bytes
        raise PatternError(f"invalid {what}: {echoed(str(e), quote=False)}") from None
    reversed_repeat = _REVERSED_REPEAT.search(reason)
    if _TOO_COMPLEX.search(reason) and not (
            reversed_repeat and int(reversed_repeat[1]) > int(reversed_repeat[2])):
        raise PatternTooComplex(f"{what} cannot be matched in linear time "
                                f"(backreferences, lookaround or too large): "
                                f"{echoed(reason, quote=False)}")
    # Anything else is syntax outside RE2's dialect (e.g. \Z, \u00e9,
    # possessive or atomic groups, [[:foo:]]), not a costly pattern.
    raise PatternError(f"invalid {what}: {echoed(reason, quote=False)}")


#: RE2's refusals of what it cannot match in linear time or within its
#: limits: backreferences, lookaround, programs or repetitions too large.
_TOO_COMPLEX = re.compile(r"invalid escape sequence: \\[1-9]|invalid perl operator: "
                          r"\(\?(?:=|!|<=|<!)|pattern too large|invalid repetition size")
#: ... but a repetition whose bounds are reversed ({3,1}) is only invalid.
_REVERSED_REPEAT = re.compile(r"invalid repetition size: \{(\d+),(\d+)\}$")


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
                raise PatternError(f"unterminated character class in wildcard {echoed(pattern)}")
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


def unicode_classes(pattern):
    """``pattern`` with each POSIX class in a bracket expression given its
    Unicode meaning (UTR #18 Annex C; ``elvin.subscription.posixclasses``):
    ``[[:alpha:]0-9_]`` becomes ``[\\p{L}\\p{Nl}...0-9_]``, ``[^[:space:]]``
    ``[^\\t-\\r\\x{85}\\p{Z}]``. A negated class (RE2's ``[:^alpha:]``)
    must be alone in its brackets (``[[:^alpha:]]``, ``[^[:^alpha:]]``),
    since RE2 cannot take a complement inside a set. Escapes (``\\[``,
    ``\\Q...\\E``) and unknown names are left as they are, for RE2."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if pattern.startswith("Q", i + 1):
                stop = pattern.find("\\E", i + 2)
                stop = n if stop < 0 else stop + 2
            else:
                stop = i + 2
            out.append(pattern[i:stop])
            i = stop
        elif c == "[":
            i = _bracket(pattern, i, out)
        else:
            out.append(c)
            i += 1
    return "".join(out)


#: a POSIX class inside a bracket expression: [:alpha:], or RE2's [:^alpha:]
_CLASS = re.compile(r"\[:(\^?)([a-z]+):\]")


def _bracket(pattern, start, out):
    """Translate the bracket expression at ``start`` onto ``out``; returns
    the index after it (its text is copied as it is if it is not closed)."""
    n = len(pattern)
    i = start + 1
    negated = pattern.startswith("^", i)
    if negated:
        i += 1
    items, classes = [], []
    first = True
    while i < n and (pattern[i] != "]" or first):
        first = False
        if pattern[i] == "\\":
            items.append(pattern[i:i + 2])
            i += 2
        elif (named := _CLASS.match(pattern, i)) and named[2] in CLASSES:
            meaning = CLASSES[named[2]]
            classes.append((bool(named[1]), meaning))
            items.append(meaning)
            i = named.end()
        else:
            items.append(pattern[i])
            i += 1
    if i >= n:
        out.append(pattern[start:])
        return n
    complemented = [meaning for inverse, meaning in classes if inverse]
    if complemented:
        if len(items) != 1:
            raise PatternError(f"invalid regular expression {echoed(pattern)}: a negated "
                               f"class such as [:^alpha:] must be alone in its brackets")
        negated = not negated
    out.append("[" + ("^" if negated else "") + "".join(items) + "]")
    return i + 1


def check_wildcard(pattern):
    """Raise PatternError if ``pattern`` is not a valid wildcard."""
    _compile(wildcard_to_regex(pattern), f"wildcard {echoed(pattern)}")


def _regex_source(pattern):
    """What RE2 runs for regular expression ``pattern``: its POSIX classes
    in their Unicode meaning (with Python's re, as it is)."""
    return pattern if re2 is None else unicode_classes(pattern)


def check_regex(pattern):
    """Raise PatternError (or PatternTooComplex) unless ``pattern`` compiles."""
    _compile(_regex_source(pattern), f"regular expression {echoed(pattern)}")


def _weight(compiled, source):
    """A compiled pattern's cost per byte of input, in RE2 program
    instructions (its NFA's worst case; ``elvin.subscription.workbudget``);
    with Python's re, the source's length stands in."""
    size = getattr(compiled, "programsize", None)
    return size if isinstance(size, int) and size > 0 else max(1, len(source))


def weighed_wildcards(patterns):
    """A ``fullmatch`` callable true for any of ``patterns``, and its weight."""
    source = "|".join(f"(?:{wildcard_to_regex(p)})" for p in patterns)
    compiled = _compile(source, "wildcards")
    return compiled.fullmatch, _weight(compiled, source)


def weighed_regexes(patterns):
    """A ``search`` callable true for any of ``patterns`` (unanchored), and
    its weight. Several patterns are searched as one alternation, one scan
    whatever their number (200 patterns searched one by one cost 200
    calls); each is compiled alone first, so an error names it, and if the
    alternation does not compile (RE2's size limit) they are searched one
    by one."""
    patterns = [_regex_source(p) for p in patterns]
    compiled = [_compile(p, "regular expression") for p in patterns]
    if len(compiled) == 1:
        return compiled[0].search, _weight(compiled[0], patterns[0])
    source = "|".join(f"(?:{p})" for p in patterns)
    try:
        together = _compile(source, "regular expressions")
    except PatternError:
        together = None
    if together is not None:
        return together.search, _weight(together, source)
    searches = [c.search for c in compiled]

    def search(value):
        for s in searches:
            m = s(value)
            if m is not None:
                return m
        return None
    return search, sum(_weight(c, p) for c, p in zip(compiled, patterns))


