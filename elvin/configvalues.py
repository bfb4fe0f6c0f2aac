"""Reading one setting's value: the error type and the parsers every
configuration reader shares (router, federation, discovery), so none of
them imports another to get them."""

import difflib
import math
from dataclasses import dataclass
from typing import Callable

from elvin.errors import echoed

__all__ = ["ConfigError", "Setting", "did_you_mean", "parse_boolean", "parse_integer", "parse_seconds",
           "flag", "text", "at_least", "duration"]

_BOOLEANS = {"yes": True, "true": True, "on": True, "1": True,
             "no": False, "false": False, "off": False, "0": False}


class ConfigError(ValueError):
    """A configuration file is wrong; the message names file and line."""


def did_you_mean(name, known):
    """`` (did you mean 'listen'?)`` for the known name closest to a
    misspelt ``name`` (case aside), or "" when none is close."""
    by_lower = {k.lower(): k for k in known}
    if len(name) > 2 * max(map(len, by_lower), default=0):
        return ""                    # (and difflib is slow on a very long name)
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def parse_boolean(value, key, where):
    try:
        return _BOOLEANS[value.lower()]
    except KeyError:
        raise ConfigError(f"{where}: {key} must be yes or no, not {echoed(value)}") from None


def parse_integer(value, key, where, minimum):
    try:
        number = int(value, 0)
    except ValueError:
        raise ConfigError(f"{where}: {key} must be an integer, not {echoed(value)}") from None
    if number < minimum:
        raise ConfigError(f"{where}: {key} must be at least {minimum}, "
                          f"not {echoed(str(number), quote=False)}")
    return number


def parse_seconds(value, key, where, allow_zero):
    """A finite number of seconds: at least 0, or more than 0."""
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{where}: {key} must be a number of seconds, "
                          f"not {echoed(value)}") from None
    if allow_zero and not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"{where}: {key} must be a finite, non-negative number "
                          f"of seconds, not {echoed(value)}")
    if not allow_zero and not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"{where}: {key} must be more than 0 (and finite), "
                          f"not {echoed(value)}")
    return seconds


# -- Setting parsers: (value, key, where, config) -> value ----------------------

def flag(value, key, where, config):
    """A yes/no setting."""
    return parse_boolean(value, key, where)


def text(value, key, where, config):
    """A setting taken as written."""
    return value


def at_least(minimum):
    """An integer setting of at least ``minimum``."""
    return lambda value, key, where, config: parse_integer(value, key, where, minimum)


def duration(allow_zero):
    """A number of seconds (more than 0, or at least 0)."""
    return lambda value, key, where, config: parse_seconds(value, key, where, allow_zero)


def duration_up_to(maximum):
    """A number of seconds from 0 to ``maximum`` (a limit the kernel sets)."""
    def parse(value, key, where, config):
        seconds = parse_seconds(value, key, where, True)
        if seconds > maximum:
            raise ConfigError(f"{where}: {key} must be at most {maximum:g} seconds, "
                              f"not {echoed(value)}")
        return seconds
    return parse


@dataclass(frozen=True)
class Setting:
    """One router setting: its name in the file, where it goes, how its
    value is read, its default, and the sentence docs/router.md shows."""

    name: str
    parse: Callable     # (value, key, where, config) -> value
    default: object
    shown: str          # the default as docs/router.md writes it
    doc: str
    repeat: bool = False  # each line adds (listen): parse gives one, or a list
    target: str = None    # the attribute, when not the name with "_" for "-"

    @property
    def attr(self):
        return self.target or self.name.replace("-", "_")

    def row(self):
        return f"| `{self.name}` | {self.shown} | {self.doc} |"
