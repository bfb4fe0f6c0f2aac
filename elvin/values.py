"""Elvin attribute values and their wire types.

Elvin has five value types: int32, int64, real64, string and opaque. In
Python they are int, int, float, str and bytes; because int covers both
integer types, ``Int32`` and ``Int64`` force a wire type where it matters.
A plain int is int32 when it fits and int64 otherwise.

Inside the router a notification is *normalised* once on arrival: int32 is
a plain ``int``, int64 is an ``Int64``, real64 a ``float``, string a ``str``
and opaque ``bytes``. The compiled subscriptions rely on that form, so they
never re-derive a type while matching.
"""

__all__ = ["Int32", "Int64", "INT32", "INT64", "REAL64", "STRING", "OPAQUE",
           "type_of", "normalise_value", "normalise", "TYPE_NAMES"]

INT32 = 1
INT64 = 2
REAL64 = 3
STRING = 4
OPAQUE = 5

TYPE_NAMES = {INT32: "int32", INT64: "int64", REAL64: "real64",
              STRING: "string", OPAQUE: "opaque"}

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class Int32(int):
    """An int that is always sent as int32."""

    __slots__ = ()

    def __new__(cls, value=0):
        result = int.__new__(cls, value)
        if not INT32_MIN <= result <= INT32_MAX:
            raise OverflowError(f"{int(result)} does not fit in int32")
        return result

    def __repr__(self):
        return f"Int32({int(self)})"


class Int64(int):
    """An int that is always sent as int64, even when it would fit in int32."""

    __slots__ = ()

    def __new__(cls, value=0):
        result = int.__new__(cls, value)
        if not INT64_MIN <= result <= INT64_MAX:
            raise OverflowError(f"{int(result)} does not fit in int64")
        return result

    def __repr__(self):
        return f"Int64({int(self)})"


def type_of(value):
    """The Elvin type code of a Python value, or raise TypeError/OverflowError."""
    kind = type(value)
    if kind is str:
        return STRING
    if kind is int or kind is bool:
        if INT32_MIN <= value <= INT32_MAX:
            return INT32
        if INT64_MIN <= value <= INT64_MAX:
            return INT64
        raise OverflowError(f"{value} does not fit in int64")
    if kind is float:
        return REAL64
    if kind is Int64:
        return INT64
    if kind is Int32:
        return INT32
    if kind is bytes or kind is bytearray or kind is memoryview:
        return OPAQUE
    if isinstance(value, Int64):
        return INT64
    if isinstance(value, Int32):
        return INT32
    if isinstance(value, int):
        return type_of(int(value))
    if isinstance(value, float):
        return REAL64
    if isinstance(value, str):
        return STRING
    if isinstance(value, (bytes, bytearray)):
        return OPAQUE
    raise TypeError(f"{kind.__name__} is not an Elvin value type "
                    "(use int, Int32, Int64, float, str or bytes)")


def normalise_value(value):
    """Return ``value`` in the router's internal form (see module docstring).
    A bool is refused (TypeError): Elvin has no boolean type, and sending
    True as the int 1 would hide the mistake."""
    kind = type(value)
    if kind is str or kind is float or kind is Int64 or kind is bytes:
        return value
    if kind is bool:
        raise TypeError(f"bool is not an Elvin value type ({value!r}): write 1 or 0 (Elvin "
                        "values are int, Int32, Int64, float, str or bytes)")
    code = type_of(value)
    if code == INT32:
        return int(value)
    if code == INT64:
        return value if type(value) is Int64 else Int64(value)
    if code == REAL64:
        return float(value)
    if code == STRING:
        return str(value)
    return bytes(value)


def normalise(attributes):
    """Normalise a mapping of attribute name to value; returns a new dict."""
    result = {}
    for key, value in attributes.items():
        if type(key) is not str:
            raise TypeError(f"attribute name must be str, not {type(key).__name__}")
        result[key] = normalise_value(value)
    return result
