"""The text form of notifications used by the command-line tools.

One attribute per line, ``Name: value``; a line ``---`` (or a blank line)
ends a notification. Values carry their Elvin type in their spelling:

    Num: 42            int32 (an integer too big for int32 is int64)
    Big: 12L           int64
    R: 3.25            real64 (also 1e10, inf, -inf, nan)
    Text: "hi\\n"      string; escapes \\n \\t \\r \\\\ \\" \\' \\0 (no others), or 'single quotes'
    Blob: [de ad be]   opaque, hex bytes (spaces optional)

The name is everything before the first ``": "`` (or, failing that, the
first ``:``), so names may contain colons.
"""

import math

from elvin.values import (INT32, INT64, INT64_MAX, INT64_MIN, REAL64, STRING,
                          Int64, type_of)

__all__ = ["FormatError", "format_value", "format_notification", "parse_value",
           "parse_line", "read_notifications"]

SEPARATOR = "---"

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_REVERSE = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", '"': '\\"', "\0": "\\0"}


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
        return '"' + "".join(_REVERSE.get(c, c) for c in value) + '"'
    return "[" + " ".join(f"{b:02x}" for b in bytes(value)) + "]"


def format_notification(attributes):
    lines = [f"{name}: {format_value(value)}" for name, value in attributes.items()]
    lines.append(SEPARATOR)
    return "\n".join(lines) + "\n"


def _unquote(text):
    quote = text[0]
    if len(text) < 2 or text[-1] != quote:
        raise FormatError(f"unterminated string {text!r}")
    body = text[1:-1]
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body):
                raise FormatError(f"string ends with a lone backslash: {text!r}")
            nxt = body[i + 1]
            escaped = _ESCAPES.get(nxt)
            if escaped is None:
                raise FormatError(f"unknown escape \\{nxt} in {text!r} (the escapes are "
                                  f"\\n \\t \\r \\\\ \\\" \\' \\0; write other "
                                  f"characters as themselves)")
            out.append(escaped)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_value(text):
    """The typed value written as ``text`` (see module docstring)."""
    text = text.strip()
    if not text:
        raise FormatError("missing value")
    if text[0] in "\"'":
        return _unquote(text)
    if text[0] == "[":
        if text[-1] != "]":
            raise FormatError(f"opaque value must end with ']': {text!r}")
        digits = "".join(text[1:-1].split())
        try:
            return bytes.fromhex(digits)
        except ValueError:
            raise FormatError(f"opaque value must be hex bytes like [de ad]: {text!r}") from None
    lowered = text.lower()
    try:
        value = int(lowered[:-1] if lowered.endswith("l") else lowered, 0)
    except ValueError:
        value = None
    if value is not None:
        if not INT64_MIN <= value <= INT64_MAX:
            raise FormatError(
                f"integer {text} is out of range: Elvin integers are int32 or int64 "
                f"({INT64_MIN} to {INT64_MAX}); write a real like {value}.0 for a "
                "larger number")
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
            f"not a value: {text!r} (write strings in quotes, e.g. \"text\"; "
            "integers 42, 12L; reals 3.25; opaque [de ad])") from None


def parse_line(line):
    """``(name, value)`` from a ``Name: value`` line."""
    sep = line.find(": ")
    width = 2
    if sep < 0:
        sep = line.find(":")
        width = 1
    if line.lstrip()[:1] in ("{", "["):
        raise FormatError(f"this looks like JSON, which is not the format: give one "
                          f"'Name: value' per line (e.g. Group: \"chat\"), got {line!r}")
    if sep <= 0:
        raise FormatError(f"expected 'Name: value', got {line!r}")
    return line[:sep], parse_value(line[sep + width:])


def read_notifications(lines, where="<stdin>"):
    """Yield attribute dicts from an iterable of lines; errors name the line."""
    current = {}
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if line.strip() in ("", SEPARATOR):
            if current:
                yield current
                current = {}
            continue
        try:
            name, value = parse_line(line)
        except FormatError as e:
            raise FormatError(f"{where}:{number}: {e}") from None
        current[name] = value
    if current:
        yield current
