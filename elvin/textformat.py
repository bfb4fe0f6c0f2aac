"""The text form of notifications used by the command-line tools.

One attribute per line, ``Name: value``; a line ``---`` (or a blank line)
ends a notification. Values carry their Elvin type in their spelling:

    Num: 42            int32 (an integer too big for int32 is int64)
    Big: 12L           int64
    R: 3.25            real64 (also 1e10, inf, -inf, nan)
    Text: "hi\\n"      string; escapes \\n \\t \\r \\\\ \\" \\' \\0 \\xHH (no others), or 'single quotes'
    Blob: [de ad be]   opaque, hex bytes (spaces optional)

The name is everything before the first unescaped ``": "`` (or, failing
that, the first unescaped ``:``), so names typed by hand may contain
colons. What is printed escapes a name as Avis's ``ec`` does (a
backslash before each space and colon) and also its backslashes and
control characters, so that any name reads back as itself and no name can
end its line early (forging attributes or notifications in a relay).
Control characters in strings are written ``\\xHH`` so that a remote
producer cannot drive the reader's terminal.
"""

import math
import re

from elvin.errors import echoed
from elvin.values import (INT32, INT64, INT64_MAX, INT64_MIN, REAL64, STRING,
                          Int64, type_of)

__all__ = ["FormatError", "format_value", "format_notification", "parse_value",
           "parse_line", "read_notifications", "numbered_notifications", "repeated"]

SEPARATOR = "---"

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}
#: Control characters (Unicode category Cc: C0, DEL, C1) as escapes: a
#: terminal acts on them, and a raw line break would end the line.
_CONTROLS = {code: _NAMED.get(chr(code), f"\\x{code:02x}")
             for code in (*range(0x20), *range(0x7f, 0xa0))}
_VALUE_TABLE = {**_CONTROLS, ord("\\"): "\\\\", ord('"'): '\\"'}
#: Avis's ec escapes a space and a colon in a name; a backslash and the
#: control characters are escaped too, so that every name reads back.
_NAME_TABLE = {**_CONTROLS, ord("\\"): "\\\\", ord(" "): "\\ ", ord(":"): "\\:"}
#: One escape (a backslash and what follows) or a colon, with the space
#: after it if there is one: what splits a name from its value.
_NAME_SPLIT = re.compile(r"\\(?:x[0-9a-fA-F]{2}|.)?|:( ?)", re.S)
_NAME_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|.)?", re.S)


class FormatError(ValueError):
    """A line of notification text could not be understood."""


def format_value(value):
    kind = type_of(value)
    if kind == INT32:
        return str(int(value))
    if kind == INT64:
        return f"{int(value)}L"
    if kind == REAL64:
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(float(value))
        return text if ("." in text or "e" in text) else text + ".0"
    if kind == STRING:
        return '"' + value.translate(_VALUE_TABLE) + '"'
    return "[" + " ".join(f"{b:02x}" for b in bytes(value)) + "]"


def format_name(name):
    """``name`` as a line starts it: see the module docstring."""
    return name.translate(_NAME_TABLE)


def format_notification(attributes):
    lines = [f"{format_name(name)}: {format_value(value)}"
             for name, value in attributes.items()]
    lines.append(SEPARATOR)
    return "\n".join(lines) + "\n"


def _unquote(text):
    quote = text[0]
    if len(text) < 2 or text[-1] != quote:
        raise FormatError(f"unterminated string {echoed(text)}")
    body = text[1:-1]
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body):
                raise FormatError(f"string ends with a lone backslash: {echoed(text)}")
            nxt = body[i + 1]
            escaped = _ESCAPES.get(nxt)
            if nxt == "x":
                escaped = _hex_escape(body[i + 2:i + 4])
                i += 2
            if escaped is None:
                raise FormatError(f"unknown escape \\{nxt} in {echoed(text)} (the escapes are "
                                  f"\\n \\t \\r \\\\ \\\" \\' \\0 \\xHH; write "
                                  f"other characters as themselves)")
            out.append(escaped)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _hex_escape(digits):
    """The character of ``\\xHH``; None unless ``digits`` are two hex digits."""
    if len(digits) == 2 and all(c in "0123456789abcdefABCDEF" for c in digits):
        return chr(int(digits, 16))
    return None


def _unescape_name(raw):
    """A name as written, its escapes undone: ``\\n \\t \\r \\0 \\xHH``
    as in strings, and a backslash before any other character stands for
    that character (how Avis reads ``\\ `` and ``\\:``)."""
    if "\\" not in raw:
        return raw

    def one(match):
        escaped = match.group(1)
        if escaped is None:
            raise FormatError(f"name ends with a lone backslash: {echoed(raw)}")
        if len(escaped) == 3:
            return chr(int(escaped[1:], 16))
        return {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}.get(escaped, escaped)
    return _NAME_ESCAPE.sub(one, raw)


def parse_value(text):
    """The typed value written as ``text`` (see module docstring)."""
    text = text.strip()
    if not text:
        raise FormatError("missing value")
    if text[0] in "\"'":
        return _unquote(text)
    if text[0] == "[":
        if text[-1] != "]":
            raise FormatError(f"opaque value must end with ']': {echoed(text)}")
        digits = "".join(text[1:-1].split())
        try:
            return bytes.fromhex(digits)
        except ValueError:
            raise FormatError(f"opaque value must be hex bytes like [de ad]: "
                              f"{echoed(text)}") from None
    lowered = text.lower()
    try:
        value = int(lowered[:-1] if lowered.endswith("l") else lowered, 0)
    except ValueError:
        value = None
    if value is not None:
        if not INT64_MIN <= value <= INT64_MAX:
            raise FormatError(
                f"integer {echoed(text, quote=False)} is out of range: Elvin integers are "
                f"int32 or int64 ({INT64_MIN} to {INT64_MAX}); write a real like "
                f"{echoed(f'{value}.0', quote=False)} for a larger number")
    try:
        if lowered.endswith("l"):
            return Int64(int(text[:-1], 0))
        if lowered.lstrip("+-") in ("inf", "nan", "infinity"):
            return float(lowered)
        if lowered.lstrip("+-").startswith("0x"):
            value = int(text, 16)
        elif any(c in lowered for c in ".e"):
            return float(text)
        else:
            value = int(text, 10)
        type_of(value)
        return value
    except (ValueError, OverflowError):
        raise FormatError(
            f"not a value: {echoed(text)} (write strings in quotes, e.g. \"text\"; "
            "integers 42, 12L; reals 3.25; opaque [de ad])") from None


def parse_line(line):
    """``(name, value)`` from a ``Name: value`` line."""
    sep = width = None
    for match in _NAME_SPLIT.finditer(line):
        if match.group(1) is None:
            continue                     # an escape: part of the name
        if match.group(1):
            sep, width = match.start(), 2
            break
        if sep is None:
            sep, width = match.start(), 1
    if sep is None:
        _json_hint(line)
        raise FormatError(f"expected 'Name: value', got {echoed(line)}")
    try:
        return _unescape_name(line[:sep]), parse_value(line[sep + width:])
    except FormatError:
        _json_hint(line)
        raise


def _json_hint(line):
    if line.lstrip()[:1] in ("{", "["):
        raise FormatError(f"this looks like JSON, which is not the format: give one "
                          f"'Name: value' per line (e.g. Group: \"chat\"), got {echoed(line)}")


def repeated(name, first=None):
    """What is wrong with a notification that gives attribute ``name``
    twice (the first time on line ``first``): a notification holds each
    name once, and keeping one of the values would lose the other
    without a word."""
    at = "" if first is None else f" (first at line {first})"
    return (f"attribute {echoed(format_name(name), quote=False)} is given twice in one "
            f"notification{at}: a notification holds each name once")


def read_notifications(lines, where="<stdin>"):
    """Yield attribute dicts from an iterable of lines; errors name the line."""
    for _, attributes in numbered_notifications(lines, where):
        yield attributes


def numbered_notifications(lines, where="<stdin>"):
    """Yield ``(line number of its first attribute, attribute dict)``
    from an iterable of lines, so that what is wrong with a whole
    notification can name where it is; errors name the line."""
    current = {}
    lines_of = {}                  # each attribute's line, to name a repeat
    first = 0
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as e:    # bytes read with surrogateescape
            bad = ord(line[e.start])
            byte = f"byte 0x{bad - 0xdc00:02x}" if 0xdc80 <= bad <= 0xdcff else "a surrogate"
            raise FormatError(f"{where}:{number}: not UTF-8 text ({byte} at column "
                              f"{e.start + 1})") from None
        if line.strip() in ("", SEPARATOR):
            if current:
                yield first, current
                current = {}
                lines_of = {}
            continue
        try:
            name, value = parse_line(line)
        except FormatError as e:
            raise FormatError(f"{where}:{number}: {e}") from None
        if name in current:
            raise FormatError(f"{where}:{number}: {repeated(name, lines_of[name])}")
        if not current:
            first = number
        current[name] = value
        lines_of[name] = number
    if current:
        yield first, current
