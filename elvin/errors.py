"""Nack error codes (client protocol 4.0, section 7.4.2) and exceptions.

The codes are the protocol's, so an error raised anywhere in the library can
be sent on the wire unchanged.
"""

__all__ = [
    "PROT_INCOMPAT", "AUTHZ_FAIL", "AUTHN_FAIL", "PROT_ERROR", "NO_SUCH_SUB",
    "NO_SUCH_QUENCH", "BAD_KEY_SCHEME", "BAD_KEY_INDEX", "BAD_UTF8",
    "NO_SUCH_KEY", "KEY_EXISTS", "BAD_KEY", "NOTHING_TO_DO", "QOS_LIMIT",
    "IMPL_LIMIT", "NOT_IMPL", "PARSE_ERROR", "INVALID_TOKEN", "UNTERM_STRING",
    "UNKNOWN_FUNC", "OVERFLOW", "TYPE_MISMATCH", "TOO_FEW_ARGS",
    "TOO_MANY_ARGS", "INVALID_REGEXP", "EXP_IS_TRIVIAL", "REGEXP_TOO_COMPLEX",
    "NESTING_TOO_DEEP", "EMPTY_QUENCH", "ATTR_EXISTS", "NO_SUCH_ATTR",
    "ERROR_NAMES", "ElvinError", "SubscriptionError", "ECHO_CHARACTERS", "echoed",
]

PROT_INCOMPAT = 1
AUTHZ_FAIL = 2
AUTHN_FAIL = 3
PROT_ERROR = 1001
NO_SUCH_SUB = 1002
NO_SUCH_QUENCH = 1003
BAD_KEY_SCHEME = 1004
BAD_KEY_INDEX = 1005
BAD_UTF8 = 1006
NO_SUCH_KEY = 2001
KEY_EXISTS = 2002
BAD_KEY = 2003
NOTHING_TO_DO = 2004
QOS_LIMIT = 2005
IMPL_LIMIT = 2006
NOT_IMPL = 2007
PARSE_ERROR = 2101
INVALID_TOKEN = 2102
UNTERM_STRING = 2103
UNKNOWN_FUNC = 2104
OVERFLOW = 2105
TYPE_MISMATCH = 2106
TOO_FEW_ARGS = 2107
TOO_MANY_ARGS = 2108
INVALID_REGEXP = 2109
EXP_IS_TRIVIAL = 2110
REGEXP_TOO_COMPLEX = 2111
NESTING_TOO_DEEP = 2112
EMPTY_QUENCH = 2201
ATTR_EXISTS = 2202
NO_SUCH_ATTR = 2203

ERROR_NAMES = {value: key for key, value in list(globals().items())
               if key.isupper() and isinstance(value, int)}

#: Characters of a value an error message echoes: a longer one is cut.
ECHO_CHARACTERS = 80


def echoed(value: "str | bytes", quote: bool = True, limit: int = ECHO_CHARACTERS) -> str:
    """``value`` (a string or bytes someone gave) as an error message
    echoes it: its ``repr`` (``quote`` False: the text itself), cut after
    ``limit`` characters and followed by its whole size, so that a
    megabyte-long value makes a readable line:
    ``'xxxx...'... (1048576 bytes)``."""
    if len(value) <= limit:
        return repr(value) if quote else str(value)
    head = value[:limit]
    size = len(value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value)
    return f"{repr(head) if quote else head}... ({size} bytes)"


class ElvinError(Exception):
    """An error carrying an Elvin Nack code and a message for people."""

    def __init__(self, code, message, args=()):
        super().__init__(message)
        self.code = code
        self.message = message
        self.nack_args = tuple(args)

    @property
    def name(self):
        return ERROR_NAMES.get(self.code, str(self.code))

    def __str__(self):
        return self.message


class SubscriptionError(ElvinError):
    """A subscription expression was rejected.

    ``code`` is the Nack error code (2101-2112, or 2005 QOS_LIMIT),
    ``offset`` the 0-based character offset in the expression where the
    problem was found, and ``str(err)`` a message naming the problem.
    ``token`` is the text the Nack names (for TYPE_MISMATCH: the offending
    expression, printed canonically) and ``found``, for TYPE_MISMATCH
    only, the type that expression has.
    """

    def __init__(self, code, offset, message, token=None, found=None):
        self.offset = offset
        self.token = token
        self.found = found
        super().__init__(code, message)

    def __repr__(self):
        return f"SubscriptionError({self.name}, offset={self.offset}, {self.message!r})"
