"""XDR (RFC 1832) marshalling primitives for the Elvin 4.0 client protocol.

``Writer`` appends big-endian XDR items to a bytearray; ``Reader`` walks a
packet with a bounds check before every read, so a hostile or truncated
packet raises ``DecodeError`` (a ``ValueError``) naming what was being read
and the byte offset (from the start of the buffer, i.e. of the packet, the
pkt_id being at offset 0) -- never ``IndexError``, ``struct.error`` or a
huge allocation.

Layout decisions (client protocol 4.0, section 8.2.3, where it is silent
or vague; cross-checked against the Avis router's XdrCoding):

* Every item is a multiple of 4 bytes. boolean, uint8, uint16 and enums
  are 4-byte XDR ints. A boolean must decode to exactly 0 or 1 (XDR bool);
  anything else is a DecodeError.
* int64 and id64 are XDR hyper (8 bytes, MSB first); real64 is XDR double.
* string is a 4-byte byte count, UTF-8 bytes, zero padding to a multiple of
  4. Strict UTF-8 (no surrogates, no overlongs) with no NUL (0x00) bytes,
  as section 6.1.4 defines a string ("A UTF-8 encoded Unicode string of
  known length, with no NUL (0x00) bytes"); either fault raises
  ``BadUTF8Error`` carrying the offset of the first bad byte, and a string
  holding a NUL (U+0000) cannot be written (``EncodeError``). The contents
  of padding bytes are not checked on input (be liberal), and are always
  written as zeros.
* Arrays: an int32 count, then the items. A negative count, or one larger
  than the remaining bytes could hold at the item's minimum encoded size,
  is rejected before anything is allocated. A Reader given ``limits``
  (the receiver's, e.g. a connection's Attribute.Max-Count) refuses a
  count over its limit the same way, before any item is read
  (``CountOverLimit``).
* A typed Value is a value_typecode enum (int32=1, int64=2, real64=3,
  string=4, opaque=5) then the value. Decoded: int32 -> int, int64 ->
  elvin.values.Int64, real64 -> float, string -> str, opaque -> bytes.
  Encoded via elvin.values.type_of (plain int: int32 if it fits, else
  int64).
* A NameValue array decodes to a dict; a repeated name is a
  ``RepeatedNameError`` (a DecodeError: a notification is a set of
  attributes). A Reader whose ``repeats`` is a list instead takes the last
  value of a repeated name and adds the name to that list, so that whoever
  got the error can decode the packet again and tell a notification that
  is wrong only in its names (a protocol error, 7.3.3) from one that
  cannot be unmarshalled (a violation, 7.3.2). A connection options table
  (``Reader.options``) always takes the last value, as Avis does.
* SubAST: the spec gives only a C-like union. We write the layout the Avis
  router uses and reads back from Mantara elvind (the only deployed
  evidence there is): ``int32 subast_typecode``, then ``int32
  value_typecode`` -- for leaves the Value typecode of the leaf (name and
  string: 4, int32: 1, int64: 2, real64: 3), for every other kind 0 --
  then for leaves the XDR value, for other kinds an array of child SubASTs.
  ``empty`` (typecode 0) is that single int32 and nothing else. Decoding
  insists the value_typecode matches the leaf (0 for operators) and nests
  at most ``MAX_AST_DEPTH`` (256) deep. Typecodes are those of section
  8.2.3.4 (``elvin.subscription.ast.Kind``) by default; Avis's table
  (which numbers arithmetic, bitwise and decompose operators differently)
  is ``AVIS_AST_TYPECODES``. A federation peer's filter is read with
  ``Reader.peer_ast``, which keeps a tree using a disputed code as its
  bytes (``RawSubAST``) for ``elvin.federation.subast`` to read.
"""

import os
import struct

from elvin import values as _values
from elvin.subscription.ast import Kind, LEAF_KINDS, Node

__all__ = ["DecodeError", "BadUTF8Error", "RepeatedNameError", "CountOverLimit",
           "EncodeError", "Writer",
           "Reader",
           "MAX_AST_DEPTH", "SPEC_AST_TYPECODES", "AVIS_AST_TYPECODES",
           "AMBIGUOUS_AST_CODES", "RawSubAST",
           "encode_value", "decode_value", "encode_name_values",
           "decode_name_values", "encode_ast", "decode_ast"]

MAX_AST_DEPTH = 256


class DecodeError(ValueError):
    """Malformed XDR input. ``offset`` is where the problem was found."""

    def __init__(self, message, offset=None):
        self.reason = message
        self.offset = offset
        if offset is not None:
            message = f"{message} at offset {offset}"
        super().__init__(message)


class BadUTF8Error(DecodeError):
    """A string was not valid UTF-8 or held a NUL byte, which section 6.1.4
    rules out of a string; ``offset`` is the first bad byte.

    A router answers this with Nack BAD_UTF8 (1006) and the offset.
    """


class RepeatedNameError(DecodeError):
    """A NameValue array named ``name`` twice (at ``offset``, the second)."""

    def __init__(self, message, offset, name):
        super().__init__(message, offset)
        self.name = name


class CountOverLimit(Exception):
    """An array's count is over the limit a Reader's ``limits`` set for it
    (``what``, the name it is read under): raised once the count is read,
    before any of its items is. Not a DecodeError: the packet may be well
    formed; it is over a limit the receiver sets (the session answers it
    as for the decoded packet: ``packets.UnreadArray``). ``count`` is the
    count read (for a Keys field, the keys counted so far), ``offset``
    where it is."""

    def __init__(self, what, count, limit, offset):
        super().__init__(f"{what}: {count} items, over the limit of {limit}, at offset {offset}")
        self.what = what
        self.count = count
        self.limit = limit
        self.offset = offset


class EncodeError(ValueError):
    """A value cannot be represented (out of range, unencodable string).

    A value of a type Elvin has no wire form for raises TypeError instead.
    """


_I = struct.Struct(">I")
_i = struct.Struct(">i")
_q = struct.Struct(">q")
_Q = struct.Struct(">Q")
_d = struct.Struct(">d")
_ii = struct.Struct(">ii")
_iq = struct.Struct(">iq")
_id = struct.Struct(">id")
_iii = struct.Struct(">iii")
_pack_I = _I.pack
_pack_i = _i.pack
_pack_ii = _ii.pack
_unpack_I = _I.unpack_from
_unpack_i = _i.unpack_from
_unpack_q = _q.unpack_from
_unpack_Q = _Q.unpack_from
_unpack_d = _d.unpack_from
_unpack_ii = _ii.unpack_from

#: padding after n bytes, indexed by n & 3
_PAD = (b"", b"\0\0\0", b"\0\0", b"\0")

_INT32, _INT64, _REAL64, _STRING, _OPAQUE = (
    _values.INT32, _values.INT64, _values.REAL64, _values.STRING, _values.OPAQUE)
_Int64 = _values.Int64

#: The compiled NameValue decoder (elvin/protocols/_elvin_xdr.c), when
#: ``pip install .`` could build it; None otherwise, or when
#: ELVIN_PURE_PYTHON is set (to compare the two). It returns None for
#: anything not well formed, and the Python path then names the error.
_accelerated_name_values = None
#: The ``_elvin_xdr`` module itself when it may be used (built, and
#: ELVIN_PURE_PYTHON not set), else None: elvin/core/index.py takes its
#: look-up functions from it (ABI 5), a sans-IO module that reads no
#: environment of its own.
accelerator = None
if not os.environ.get("ELVIN_PURE_PYTHON"):
    try:
        import _elvin_xdr
    except ImportError:
        pass
    else:
        accelerator = _elvin_xdr
        # ABI 3: an array it decodes has zero padding (``packets.notify_emit_fields``
        # relies on it) and no NUL byte in a string; an older build is not used.
        # (4 decodes as 3 and adds the index's cell functions, 5 its
        # buckets' look-up.)
        if getattr(_elvin_xdr, "ABI", None) in (3, 4, 5):
            _accelerated_name_values = _elvin_xdr.name_values
_type_of = _values.type_of
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

_TYPE_STRING_BYTES = _pack_I(_STRING)
_TYPE_OPAQUE_BYTES = _pack_I(_OPAQUE)

#: wire typecode for every SubAST kind: the spec's numbering
SPEC_AST_TYPECODES = {kind: int(kind) for kind in Kind}

#: the numbering used by the Avis router (and, it says, Mantara elvind)
AVIS_AST_TYPECODES = dict(SPEC_AST_TYPECODES)
AVIS_AST_TYPECODES.update({
    Kind.UNARY_PLUS: 24, Kind.UNARY_MINUS: 25, Kind.MULTIPLY: 26,
    Kind.DIVIDE: 27, Kind.MODULO: 28, Kind.ADD: 29, Kind.SUBTRACT: 30,
    Kind.SHIFT_LEFT: 32, Kind.SHIFT_RIGHT: 33, Kind.LOGICAL_SHIFT_RIGHT: 34,
    Kind.BIT_AND: 35, Kind.BIT_XOR: 36, Kind.BIT_OR: 37, Kind.BIT_NEGATE: 38,
    Kind.FUNC_DECOMPOSE: 61, Kind.FUNC_DECOMPOSE_COMPAT: 62,
})

#: Typecodes whose meaning differs between the two numberings (arithmetic,
#: bitwise and decompose operators): a SubAST holding one of them cannot
#: be read without knowing which numbering its sender uses.
AMBIGUOUS_AST_CODES = frozenset(
    code for table in (SPEC_AST_TYPECODES, AVIS_AST_TYPECODES)
    for kind, code in table.items()
    if SPEC_AST_TYPECODES[kind] != AVIS_AST_TYPECODES[kind])

#: Leaf typecodes (the same in both numberings) -> their value_typecode.
_LEAF_CODES = {1: 4, 2: 1, 3: 2, 4: 3, 5: 4}


class RawSubAST:
    """A SubAST kept as its bytes because its typecodes do not say what it
    means: some are ambiguous between the spec's numbering and Avis's, or
    known to neither, or it nests deeper than ``MAX_AST_DEPTH``. Its
    framing is sound (``Reader.peer_ast`` walked it); the receiver decides
    how to read it (``decode_ast`` with a numbering) or refuses it."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = bytes(data)

    def __eq__(self, other):
        return isinstance(other, RawSubAST) and other.data == self.data

    def __hash__(self):
        return hash(self.data)

    def __repr__(self):
        return f"RawSubAST({self.data.hex()})"


#: value_typecode written after the SubAST typecode of each leaf kind
_LEAF_VALUE_TYPE = {Kind.NAME: _STRING, Kind.STRING: _STRING,
                    Kind.INT32: _INT32, Kind.INT64: _INT64,
                    Kind.REAL64: _REAL64}


def _kinds_by_code(typecodes):
    return {code: Kind(kind) for kind, code in typecodes.items()}


#: Attribute names repeat in almost every notification: their encoded form
#: (length, UTF-8, padding) is cached, up to a bound.
_NAME_CACHE = {}
_NAME_CACHE_MAX = 4096


def _nul_error(what, text):
    return EncodeError(f"{what} holds a NUL (U+0000) at character {text.index(chr(0))}, "
                       f"which an Elvin string cannot (section 6.1.4)")


def _encode_name(name):
    if type(name) is not str:
        if not isinstance(name, str):
            raise TypeError(f"attribute name must be str, not {type(name).__name__}")
        name = str(name)
    try:
        data = name.encode()
    except UnicodeEncodeError as e:
        raise EncodeError(f"name is not encodable as UTF-8: "
                          f"{e.reason} at character {e.start}") from None
    if 0 in data:
        raise _nul_error("name", name)
    n = len(data)
    encoded = _pack_I(n) + data + _PAD[n & 3]
    if len(_NAME_CACHE) < _NAME_CACHE_MAX and n <= 256:
        _NAME_CACHE[name] = encoded
    return encoded


class Writer:
    """Accumulates XDR items; ``getvalue()`` returns the bytes.

    Every method returns the writer so calls can be chained.
    """

    __slots__ = ("_buf",)

    def __init__(self):
        self._buf = bytearray()

    def getvalue(self):
        return bytes(self._buf)

    def __len__(self):
        return len(self._buf)

    def raw(self, data):
        """Append already-encoded XDR bytes."""
        self._buf += data
        return self

    def _pack(self, packer, value, what):
        try:
            self._buf += packer(value)
        except struct.error:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{what} must be a number, not {type(value).__name__}") from None
            raise EncodeError(f"{value!r} out of range for {what}") from None
        return self

    def int32(self, value):
        return self._pack(_pack_i, value, "int32")

    def uint32(self, value):
        return self._pack(_pack_I, value, "uint32")

    def int64(self, value):
        return self._pack(_q.pack, value, "int64")

    def uint64(self, value):
        return self._pack(_Q.pack, value, "uint64")

    def real64(self, value):
        return self._pack(_d.pack, value, "real64")

    def boolean(self, value):
        self._buf += _pack_I(1 if value else 0)
        return self

    def string(self, value):
        try:
            data = value.encode("utf-8")
        except AttributeError:
            raise TypeError(f"string must be str, not {type(value).__name__}") from None
        except UnicodeEncodeError as e:
            raise EncodeError(f"string is not encodable as UTF-8: {e.reason} "
                              f"at character {e.start}") from None
        if 0 in data:
            raise _nul_error("string", value)
        n = len(data)
        buf = self._buf
        buf += _pack_I(n)
        buf += data
        buf += _PAD[n & 3]
        return self

    def opaque(self, value):
        if isinstance(value, memoryview):
            value = value.tobytes()
        elif not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"opaque must be bytes, not {type(value).__name__}")
        n = len(value)
        buf = self._buf
        buf += _pack_I(n)
        buf += value
        buf += _PAD[n & 3]
        return self

    def value(self, value):
        """A typed Value: value_typecode then the value."""
        kind = type(value)
        if kind is str:
            self._buf += _TYPE_STRING_BYTES
            return self.string(value)
        if kind is int and _I32_MIN <= value <= _I32_MAX:
            self._buf += _pack_ii(_INT32, value)
            return self
        try:
            code = _type_of(value)
        except OverflowError as e:
            raise EncodeError(str(e)) from None
        buf = self._buf
        if code == _INT32:
            buf += _pack_ii(_INT32, value)
        elif code == _INT64:
            buf += _iq.pack(_INT64, value)
        elif code == _REAL64:
            buf += _id.pack(_REAL64, value)
        elif code == _STRING:
            buf += _TYPE_STRING_BYTES
            self.string(str(value))
        else:
            buf += _TYPE_OPAQUE_BYTES
            self.opaque(value)
        return self

    def values(self, items):
        """An array of typed Values."""
        self._buf += _pack_I(len(items))
        for item in items:
            self.value(item)
        return self

    def name_values(self, mapping):
        """A NameValue array from a mapping of str to value.

        Names, int32 and string values are written inline (hot path);
        other values go through ``value``.
        """
        buf = self._buf
        buf += _pack_I(len(mapping))
        value = self.value
        names = _NAME_CACHE
        name = None
        try:
            for name, item in mapping.items():
                encoded = names.get(name) if type(name) is str else None
                if encoded is None:
                    encoded = _encode_name(name)
                buf += encoded
                kind = type(item)
                if kind is int and _I32_MIN <= item <= _I32_MAX:
                    buf += _pack_ii(_INT32, item)
                elif kind is float:
                    buf += _id.pack(_REAL64, item)
                elif kind is str:
                    try:
                        data = item.encode()
                    except UnicodeEncodeError:
                        value(item)  # raises the EncodeError
                    if 0 in data:
                        value(item)  # raises the EncodeError
                    n = len(data)
                    buf += _pack_ii(_STRING, n)
                    buf += data
                    buf += _PAD[n & 3]
                else:
                    value(item)
        except EncodeError as e:
            raise EncodeError(f"attribute {name!r}: {e}") from None
        return self

    def strings(self, items):
        """An array of strings."""
        self._buf += _pack_I(len(items))
        for item in items:
            self.string(item)
        return self

    def uint64s(self, items):
        """An array of id64 (XDR unsigned hyper)."""
        n = len(items)
        try:
            self._buf += struct.pack(f">I{n}Q", n, *items)
        except struct.error:
            for item in items:
                Writer().uint64(item)  # raises the precise error
            raise EncodeError("invalid id64 array") from None
        return self

    def ast(self, node, typecodes=None):
        """A SubAST (see module docstring for the layout).

        Iterative pre-order, so encoding is not limited by Python's stack.
        """
        codes = SPEC_AST_TYPECODES if typecodes is None else typecodes
        buf = self._buf
        stack = [node]
        pop, push = stack.pop, stack.extend
        while stack:
            current = pop()
            if not isinstance(current, Node):
                raise TypeError(f"SubAST must be a Node, not {type(current).__name__}")
            kind = current.kind
            code = codes.get(kind)
            if code is None:
                raise EncodeError(f"no SubAST typecode for {kind.name}")
            if kind in LEAF_KINDS:
                value = current.value
                if kind is Kind.NAME or kind is Kind.STRING:
                    buf += _pack_ii(code, _STRING)
                    self.string(value)
                elif kind is Kind.INT32:
                    buf += _iii.pack(code, _INT32, value)
                elif kind is Kind.INT64:
                    buf += _pack_ii(code, _INT64) + _q.pack(value)
                else:
                    buf += _pack_ii(code, _REAL64) + _d.pack(value)
            elif kind is Kind.EMPTY:
                if current.children:
                    raise EncodeError("an empty SubAST node cannot have children")
                buf += _pack_i(code)
            else:
                children = current.children
                buf += _iii.pack(code, 0, len(children))
                push(reversed(children))
        return self


def _bad_string(data, start, what, error=None):
    """The BadUTF8Error for string bytes ``data`` (at ``start`` in the
    packet), which failed to decode (``error``) or hold a NUL: the first
    of the two faults is the one reported."""
    nul = data.find(0, 0, len(data) if error is None else error.start)
    if nul >= 0:
        return BadUTF8Error(f"NUL byte in {what}", start + nul)
    return BadUTF8Error(f"invalid UTF-8 in {what} ({error.reason})", start + error.start)


class Reader:
    """Reads XDR items from bytes, bytearray or memoryview, bounds-checked.

    A memoryview is copied to bytes once (a frame is at most a few MiB and
    bytes slices decode UTF-8 twice as fast as ``str(view, "utf-8")``).

    ``pos`` is the offset of the next item. Every read checks the remaining
    length first and raises DecodeError naming the item and its offset.

    ``limits``: None, or a mapping of array names (the ``what`` an array
    is read under, e.g. ``"NotifyEmit.attributes"``) to the most items
    the array may hold: a count over it, once checked against the bytes
    left like any count, raises ``CountOverLimit`` before any item is read.
    """

    __slots__ = ("_buf", "pos", "end", "repeats", "limits")

    def __init__(self, data, offset=0, repeats=None, limits=None):
        if isinstance(data, memoryview):
            data = data.tobytes()  # one copy, so slices have a fast .decode()
        elif not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"cannot read XDR from {type(data).__name__}")
        self._buf = data
        self.pos = offset
        self.end = len(data)
        #: None: a repeated name in a NameValue array is a RepeatedNameError;
        #: a list: the last value is taken and the name appended to it.
        self.repeats = repeats
        self.limits = limits

    @property
    def remaining(self):
        return self.end - self.pos

    def at_end(self):
        return self.pos >= self.end

    def expect_end(self, what="packet"):
        if self.pos != self.end:
            raise DecodeError(f"{self.end - self.pos} unexpected trailing bytes after {what}",
                              self.pos)

    def _need(self, n, what):
        pos = self.pos
        if pos + n > self.end:
            raise DecodeError(f"truncated {what}: need {n} bytes, have {self.end - pos}", pos)
        return pos

    def _fixed(self, unpack, size, what):
        pos = self.pos
        if pos + size > self.end:
            raise DecodeError(f"truncated {what}: need {size} bytes, have {self.end - pos}", pos)
        self.pos = pos + size
        return unpack(self._buf, pos)[0]

    def int32(self, what="int32"):
        return self._fixed(_unpack_i, 4, what)

    def uint32(self, what="uint32"):
        return self._fixed(_unpack_I, 4, what)

    def int64(self, what="int64"):
        return self._fixed(_unpack_q, 8, what)

    def uint64(self, what="uint64"):
        return self._fixed(_unpack_Q, 8, what)

    def real64(self, what="real64"):
        return self._fixed(_unpack_d, 8, what)

    def boolean(self, what="boolean"):
        pos = self.pos
        value = self._fixed(_unpack_I, 4, what)
        if value > 1:
            raise DecodeError(f"{what} must be 0 or 1, not {value}", pos)
        return value == 1

    def count(self, min_item_size, what="array"):
        """An array length, checked against the bytes left to hold it,
        then against ``limits`` (``CountOverLimit``)."""
        pos = self.pos
        if pos + 4 > self.end:
            raise DecodeError(f"truncated {what} count", pos)
        n = _unpack_i(self._buf, pos)[0]
        self.pos = pos + 4
        if n < 0:
            raise DecodeError(f"negative {what} count {n}", pos)
        if n * min_item_size > self.end - pos - 4:
            raise DecodeError(f"{what} count {n} is impossible with "
                              f"{self.end - pos - 4} bytes left", pos)
        limits = self.limits
        if limits is not None:
            limit = limits.get(what)
            if limit is not None and n > limit:
                raise CountOverLimit(what, n, limit, pos)
        return n

    def _length(self, what):
        pos = self.pos
        if pos + 4 > self.end:
            raise DecodeError(f"truncated {what} length", pos)
        n = _unpack_I(self._buf, pos)[0]
        start = pos + 4
        stop = start + n
        if stop > self.end:
            raise DecodeError(f"{what} of {n} bytes overruns the packet "
                              f"({self.end - start} bytes left)", pos)
        self.pos = stop + (-n & 3)
        if self.pos > self.end:
            raise DecodeError(f"truncated padding after {what}", stop)
        return start, stop

    def string(self, what="string"):
        start, stop = self._length(what)
        data = self._buf[start:stop]
        try:
            text = data.decode()
        except UnicodeDecodeError as e:
            raise _bad_string(data, start, what, e) from None
        if "\0" in text:
            raise _bad_string(data, start, what)
        return text

    def opaque(self, what="opaque"):
        start, stop = self._length(what)
        return bytes(self._buf[start:stop])

    def value(self, what="value"):
        """A typed Value, in the router's normalised Python form."""
        pos = self.pos
        if pos + 8 > self.end:
            raise DecodeError(f"truncated {what}", pos)
        code, word = _unpack_ii(self._buf, pos)
        if code == _INT32:
            self.pos = pos + 8
            return word
        if code == _STRING:
            self.pos = pos + 4
            return self.string(what)
        if code == _INT64:
            self.pos = pos + 4
            return _Int64(self._fixed(_unpack_q, 8, what))
        if code == _REAL64:
            self.pos = pos + 4
            return self._fixed(_unpack_d, 8, what)
        if code == _OPAQUE:
            self.pos = pos + 4
            return self.opaque(what)
        raise DecodeError(f"unknown value typecode {code} in {what}", pos)

    def values(self, what="value array"):
        n = self.count(8, what)
        value = self.value
        return tuple([value(what) for _ in range(n)])

    def name_values(self, what="attribute"):
        """A NameValue array as a dict; a repeated name is an error.

        The hot path of every notification: names and int32/string values
        are read inline; anything unusual (other value types, truncation,
        bad UTF-8, a NUL) goes through the checked methods, which also produce
        the error messages.
        """
        if _accelerated_name_values is not None:
            if self.limits is not None and what in self.limits:
                # The compiled decoder reads its own count: checked first.
                pos = self.pos
                self.count(12, what)
                self.pos = pos
            got = _accelerated_name_values(self._buf, self.pos, self.end, _Int64)
            if got is not None:
                result, self.pos = got
                return result
        return self._name_values(what)

    def options(self, what="option"):
        """A connection options table (ConnRqst, QosRqst and their replies):
        a NameValue array in which a repeated name takes its last value."""
        repeats, self.repeats = self.repeats, []
        try:
            return self.name_values(what)
        finally:
            self.repeats = repeats

    def _repeated(self, name, offset, what):
        if self.repeats is None:
            raise RepeatedNameError(f"duplicate {what} name {name!r}", offset, name)
        self.repeats.append(name)

    def _name_values(self, what):
        """The pure-Python name_values (also the fallback that names errors)."""
        n = self.count(12, what)
        buf, end = self._buf, self.end
        pos = self.pos
        result = {}
        for _ in range(n):
            item = pos
            if pos + 4 <= end:
                length = _unpack_I(buf, pos)[0]
                start = pos + 4
                stop = start + length
                pos = stop + (-length & 3)
                if pos + 8 <= end:
                    try:
                        name = buf[start:stop].decode()
                    except UnicodeDecodeError:
                        name = "\0"     # the checked path names the error
                    if "\0" not in name:
                        if name in result:
                            self._repeated(name, item, what)
                        code, word = _unpack_ii(buf, pos)
                        if code == _INT32:
                            result[name] = word
                            pos += 8
                            continue
                        if code == _STRING and word >= 0:  # >= 2**31 overruns
                            start = pos + 8
                            stop = start + word
                            if stop + (-word & 3) <= end:
                                try:
                                    text = buf[start:stop].decode()
                                except UnicodeDecodeError:
                                    text = "\0"     # the checked path names the error
                                if "\0" not in text:
                                    result[name] = text
                                    pos = stop + (-word & 3)
                                    continue
                        self.pos = pos
                        result[name] = self.value(what + " value")
                        pos = self.pos
                        continue
            # slow, fully checked path for this item (raises on error)
            self.pos = item
            name = self.string(what + " name")
            if name in result:
                self._repeated(name, item, what)
            result[name] = self.value(what + " value")
            pos = self.pos
        self.pos = pos
        return result

    def strings(self, what="string array"):
        n = self.count(4, what)
        string = self.string
        return tuple([string(what) for _ in range(n)])

    def uint64s(self, what="id64 array"):
        n = self.count(8, what)
        pos = self.pos
        self.pos = pos + 8 * n
        return struct.unpack_from(f">{n}Q", self._buf, pos)

    def ast(self, typecodes=None, what=None):
        """A SubAST as an ``elvin.subscription.ast.Node``.

        ``what`` (e.g. the packet field) prefixes any error message.
        """
        kinds = _SPEC_KINDS if typecodes is None else _kinds_by_code(typecodes)
        try:
            return self._ast(kinds, 1)
        except DecodeError as e:
            if what is None:
                raise
            raise type(e)(f"{what}: {e.reason}", e.offset) from None

    def _ast(self, kinds, depth):
        pos = self.pos
        if depth > MAX_AST_DEPTH:
            raise DecodeError(f"SubAST nested deeper than {MAX_AST_DEPTH}", pos)
        code = self.int32("SubAST typecode")
        kind = kinds.get(code)
        if kind is None:
            raise DecodeError(f"unknown SubAST typecode {code}", pos)
        if kind is Kind.EMPTY:
            return _EMPTY_NODE
        value_type = self.int32("SubAST value typecode")
        if kind in LEAF_KINDS:
            expected = _LEAF_VALUE_TYPE[kind]
            if value_type != expected:
                raise DecodeError(f"SubAST {kind.name.lower()} leaf has value typecode "
                                  f"{value_type}, expected {expected}", pos + 4)
            if expected == _STRING:
                value = self.string("SubAST " + kind.name.lower())
            elif expected == _INT32:
                value = self.int32("SubAST int32")
            elif expected == _INT64:
                value = self.int64("SubAST int64")
            else:
                value = self.real64("SubAST real64")
            return Node(kind, value)
        if value_type != 0:
            raise DecodeError(f"SubAST {kind.name.lower()} node has value typecode "
                              f"{value_type}, expected 0", pos + 4)
        n = self.count(4, "SubAST child")
        depth += 1
        return Node(kind, None, [self._ast(kinds, depth) for _ in range(n)])


    def peer_ast(self, what=None):
        """A SubAST from a peer whose numbering is not known: a ``Node``
        when every typecode means the same in both numberings (see
        ``AMBIGUOUS_AST_CODES``), else a ``RawSubAST``. Only the framing is
        checked here (leaf value typecodes, 0 for the rest, counts against
        the bytes left), iteratively, so any depth the packet holds is
        walked without recursion."""
        start = self.pos
        codes = set()
        stack = [1]
        deepest = 1
        try:
            while stack:
                if not stack[-1]:
                    stack.pop()
                    continue
                stack[-1] -= 1
                pos = self.pos
                code = self.int32("SubAST typecode")
                codes.add(code)
                if code == 0:
                    continue
                value_type = self.int32("SubAST value typecode")
                expected = _LEAF_CODES.get(code)
                if expected is not None:
                    if value_type != expected:
                        raise DecodeError(f"SubAST leaf typecode {code} has value typecode "
                                          f"{value_type}, expected {expected}", pos + 4)
                    if expected == _STRING:
                        self.string("SubAST string")
                    elif expected == _INT32:
                        self.int32("SubAST int32")
                    else:
                        self.int64("SubAST value")
                    continue
                if value_type != 0:
                    raise DecodeError(f"SubAST typecode {code} node has value typecode "
                                      f"{value_type}, expected 0", pos + 4)
                stack.append(self.count(4, "SubAST child"))
                deepest = max(deepest, len(stack))
        except DecodeError as e:
            if what is None:
                raise
            raise type(e)(f"{what}: {e.reason}", e.offset) from None
        if deepest <= MAX_AST_DEPTH and not codes & AMBIGUOUS_AST_CODES \
                and codes <= _SPEC_KINDS.keys():
            end, self.pos = self.pos, start
            tree = self.ast(None, what)
            assert self.pos == end
            return tree
        return RawSubAST(self._buf[start:self.pos])


_SPEC_KINDS = {int(kind): kind for kind in Kind}
_EMPTY_NODE = Node(Kind.EMPTY)


def _whole(data, read, what):
    reader = Reader(data)
    result = read(reader)
    reader.expect_end(what)
    return result


def encode_value(value):
    """The typed-Value encoding of one value."""
    return Writer().value(value).getvalue()


def decode_value(data):
    """Decode exactly one typed Value."""
    return _whole(data, Reader.value, "value")


def encode_name_values(mapping):
    """A NameValue array (an attribute or option list)."""
    return Writer().name_values(mapping).getvalue()


def decode_name_values(data):
    return _whole(data, Reader.name_values, "attributes")


def encode_ast(node, typecodes=None):
    return Writer().ast(node, typecodes).getvalue()


def decode_ast(data, typecodes=None):
    return _whole(data, lambda r: r.ast(typecodes), "SubAST")
