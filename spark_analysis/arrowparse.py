"""Trace lines to an Arrow table of events: the ingest's inner loop.

Runs in Spark's Python workers (``ingest.read_traces``), one trace file at
a time, and needs only pyarrow and numpy: Arrow's JSON reader (C++, with
the explicit schema ``JSON_SCHEMA``) parses a few megabytes of lines at
once, and the rules of docs/traces.md are checked on whole columns. A
chunk the fast path cannot vouch for line by line -- a parse error, a
value of another type, anything a rule rejects, a blank line -- is read
again in plain Python, line by line, with ``traceformat.check_record``:
bad lines are rare, and the reference validator names what was wrong.

So every line is judged by check_record's rules, with two allowances the
analysis has always made: ``attrs`` need not be sorted (it is stored
sorted) and a field the event does not use may be an explicit null.
"""

import gzip
import hashlib
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark_analysis import traceformat as tf

__all__ = ["JSON_SCHEMA", "EVENTS_SCHEMA", "CHUNK_BYTES", "parse_chunk", "line_reason",
           "read_chunks", "parse_file", "bad_lines", "set_aside", "lines_at_times",
           "ASIDE_EXAMPLES", "CUT_SHORT"]

CHUNK_BYTES = 4 << 20      # uncompressed bytes parsed at once (whole lines)
_S, _L = pa.string(), pa.int64()
_LIST = pa.list_(_S)

JSON_SCHEMA = pa.schema([
    ("v", _L), ("ts_us", _L), ("router", _S), ("peer", _S), ("event", _S),
    ("direction", _S), ("routing", _LIST), ("size", _L), ("attrs", _LIST), ("digest", _S),
    ("filter_nodes", _L), ("filter_bytes", _L), ("reason", _S), ("unsent", _L)])

# The events table's columns, in ingest.events_schema()'s order.
EVENTS_SCHEMA = pa.schema([
    ("ts_us", _L), ("peer", _S), ("event", _S), ("direction", _S), ("routing", _LIST),
    ("size", _L), ("attrs", _LIST), ("digest", _S), ("filter_nodes", _L),
    ("filter_bytes", _L), ("reason", _S), ("unsent", _L), ("origin", _S), ("hops", pa.int32()),
    ("dkey", _L), ("akey", _L), ("file", _S), ("bad_reason", _S), ("raw", _S),
    ("status", _S), ("day", pa.date32()), ("router", _S)])

_INT_FIELDS = [name for name, types in tf.FIELDS.items() if "integer" in types]
_PAIRS = pa.array(sorted(f"{e}/{d}" for e, ds in tf.DIRECTIONS.items() for d in ds))
_NOTIFY = pa.array(tf.NOTIFY_EVENTS)
_SUBREPLACE = pa.array(tf.SUBREPLACE_EVENTS)
_PARSE = pj.ParseOptions(explicit_schema=JSON_SCHEMA, unexpected_field_behavior="ignore")
_HEX = np.zeros(256, dtype=np.uint64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)
RAW_CHARS = 300            # of a bad line kept in the table


# ---------------------------------------------------------------------------
# one line, in plain Python: the reference path

def _normalise(obj):
    """check_record's input with the analysis' allowances: explicit nulls
    of fields other than ``peer`` dropped, a list of names in ``attrs`` sorted."""
    obj = {k: v for k, v in obj.items() if v is not None or k == "peer"}
    attrs = obj.get("attrs")
    if type(attrs) is list and all(type(a) is str for a in attrs):
        obj["attrs"] = _by_name(attrs)
    return obj


def _judge(raw):
    """(reason, record) of one line (bytes, no newline): (None, None) for a
    blank line, (None, dict) for a good one, (reason, None) for a bad one."""
    text = raw.strip()
    if not text:
        return None, None
    try:
        text = text.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8 (byte {e.start + 1} of the line)", None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        return f"not JSON ({e})", None
    if type(obj) is dict:
        obj = _normalise(obj)
    reason = tf.check_record(obj)
    if reason is None:
        for name in ("routing", "attrs"):
            # (elements are checked only where the event uses the list)
            if name in obj and any(type(x) is not str for x in obj[name]):
                del obj[name]
        for name in _INT_FIELDS:
            value = obj.get(name)
            if value is not None and not -2**63 <= value < 2**63:
                return f"field {name!r} out of range (64-bit integers)", None
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return "a string holds a lone surrogate (\\ud800-\\udfff escape)", None
    return reason, (obj if reason is None else None)


def line_reason(raw):
    """Why one line (bytes) is bad, or None (good or blank)."""
    return _judge(raw)[0]


# ---------------------------------------------------------------------------
# a chunk of lines

def _fast(data):
    """The chunk parsed by Arrow when every line is one good record, else None."""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    try:
        table = pj.read_json(pa.BufferReader(data), parse_options=_PARSE,
                             read_options=pj.ReadOptions(use_threads=False,
                                                         block_size=max(len(data), 1 << 20)))
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    # a blank line, or two objects on one line: let the line-by-line path judge
    if table.num_rows != lines:
        return None
    col = _column_of(table)
    event, direction = col("event"), col("direction")
    notify, subreplace = pc.is_in(event, _NOTIFY), pc.is_in(event, _SUBREPLACE)
    routing, attrs = col("routing"), col("attrs")
    if pc.list_flatten(routing).null_count:
        return None
    names = pc.list_flatten(attrs)
    # (a NUL in a name would let two lists share _sorted_sets' key)
    if names.null_count or (len(names) and pc.any(pc.match_substring(names, "\x00")).as_py()):
        return None

    def unless(cond, rule):      # rule must hold where cond does
        return pc.or_kleene(pc.invert(cond), rule)
    ts = col("ts_us")
    rules = [
        pc.equal(col("v"), tf.FORMAT_VERSION),
        pc.and_(pc.greater_equal(ts, tf.MIN_TS_US), pc.less_equal(ts, tf.MAX_TS_US)),
        pc.greater(pc.utf8_length(col("router")), 0),
        pc.is_in(pc.binary_join_element_wise(event, direction, "/"), _PAIRS),
        pc.is_valid(col("peer")),      # a null peer (link_down): the slow path tells absent
        unless(notify, pc.and_(pc.is_valid(col("size")), pc.is_valid(attrs))),
        unless(notify, pc.greater(pc.list_value_length(routing), 0)),
        unless(notify, pc.greater_equal(col("size"), 0)),
        unless(notify, pc.match_substring_regex(col("digest"), "^[0-9a-f]{40}$")),
        unless(subreplace, pc.and_(pc.greater_equal(col("filter_nodes"), 0),
                                   pc.greater_equal(col("filter_bytes"), 0))),
        unless(pc.equal(event, "link_down"), pc.is_valid(col("reason"))),
        unless(pc.and_(pc.equal(event, "link_down"), pc.is_valid(col("unsent"))),
               pc.greater_equal(col("unsent"), 1)),
    ]
    for rule in rules:
        if not pc.all(pc.fill_null(rule, False)).as_py():
            return None
    return table


def _set_key(names):
    """akey: a 64-bit hash of a (sorted) list of attribute names."""
    digest = hashlib.blake2b(json.dumps(names).encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _by_name(names):
    return sorted(names, key=lambda a: a.encode("utf-8", "surrogatepass"))


def _column_of(table):
    """name -> one contiguous pa.Array of ``table``'s column."""
    return lambda name: table.column(name).combine_chunks()


def _sorted_sets(attrs):
    """(attrs sorted by UTF-8 bytes, akey) per row, from each distinct list
    once; None if a list repeats a name (the slow path names it). Lists are
    told apart by their length and names joined by NUL (no name has one)."""
    key = pc.binary_join_element_wise(pc.cast(pc.list_value_length(attrs), _S),
                                      pc.binary_join(attrs, "\x00"), "\x01")
    encoded = pc.dictionary_encode(key)
    indices = encoded.indices
    firsts = np.unique(np.asarray(pc.fill_null(indices, -1)), return_index=True)
    lists, akeys = [None] * len(encoded.dictionary), [None] * len(encoded.dictionary)
    for index, row in zip(*firsts):
        if index < 0:
            continue
        names = _by_name(attrs[int(row)].as_py())
        if len(set(names)) != len(names):
            return None
        lists[index], akeys[index] = names, _set_key(names)
    return (pa.array(lists, _LIST).take(indices), pa.array(akeys, _L).take(indices))


def _dkey(digest):
    """The first 64 bits of each (SHA-1) digest, as a signed integer: an
    evenly spread 64-bit key to group and join on instead of 40 characters."""
    filled = pc.fill_null(digest, "0" * 40)
    offsets = np.frombuffer(filled.buffers()[1], dtype=np.int32,
                            count=len(filled) + 1 + filled.offset)[filled.offset:]
    # (padded: a shorter string where the event has no digest must not read past the end)
    data = np.concatenate([np.frombuffer(filled.buffers()[2], dtype=np.uint8),
                           np.zeros(16, dtype=np.uint8)])
    nibbles = _HEX[data[offsets[:-1, None] + np.arange(16)]]
    value = np.bitwise_or.reduce(nibbles << _SHIFTS, axis=1) if len(filled) else \
        np.zeros(0, dtype=np.uint64)
    return pa.array(value.view(np.int64), mask=np.asarray(pc.is_null(digest)))


def _events(table, file, sets=None):
    """Good records (a table of JSON_SCHEMA, checked) -> EVENTS_SCHEMA rows;
    ``sets``: their (sorted attrs, akey) if already known."""
    n = table.num_rows
    col = _column_of(table)
    sets = sets or _sorted_sets(col("attrs"))
    if sets is None:
        return None
    attrs, akey = sets
    routing = col("routing")
    length = pc.list_value_length(routing)
    origin = pc.list_element(pc.if_else(pc.greater(length, 0), routing,
                                        pa.nulls(n, _LIST)), 0)
    day = pc.cast(pc.cast(col("ts_us"), pa.timestamp("us", tz="UTC")), pa.date32())
    return pa.table([
        col("ts_us"), col("peer"), col("event"), col("direction"), routing, col("size"),
        attrs, col("digest"), col("filter_nodes"), col("filter_bytes"), col("reason"),
        col("unsent"), origin, pc.cast(length, pa.int32()), _dkey(col("digest")), akey,
        _repeat(file, n), pa.nulls(n, _S), pa.nulls(n, _S), _repeat("ok", n), day,
        col("router")], schema=EVENTS_SCHEMA)


def _repeat(value, n):
    return pa.array([value], _S).take(pa.array(np.zeros(n, dtype=np.int32)))


def _slow(data, file):
    """The chunk judged line by line: its good records and its bad lines."""
    good, bad = [], []
    for raw in data.split(b"\n"):
        reason, obj = _judge(raw)
        if reason is not None:
            bad.append((reason, _raw_text(raw)))
        elif obj is not None:
            good.append(obj)
    parts = []
    if good:
        table = pa.Table.from_pylist(good, schema=JSON_SCHEMA)
        lists = [obj.get("attrs") for obj in good]
        keys = [None if names is None else _set_key(names) for names in lists]
        parts.append(_events(table, file, (pa.array(lists, _LIST), pa.array(keys, _L))))
    if bad:
        parts.append(_bad_rows(file, bad))
    return parts


def _bad_rows(file, bad):
    """A table of EVENTS_SCHEMA of bad lines: [(reason, text)]."""
    n = len(bad)
    columns = [pa.nulls(n, f.type) for f in EVENTS_SCHEMA]
    names = EVENTS_SCHEMA.names
    columns[names.index("file")] = _repeat(file, n)
    columns[names.index("bad_reason")] = pa.array([r for r, _ in bad], _S)
    columns[names.index("raw")] = pa.array([t for _, t in bad], _S)
    columns[names.index("status")] = _repeat("bad", n)
    return pa.table(columns, schema=EVENTS_SCHEMA)


def _raw_text(raw):
    return raw[:4 * RAW_CHARS].decode("utf-8", "replace").strip()[:RAW_CHARS]


# the reason of a bad last line without its newline: in a closed file the
# writer was cut off mid-line (docs/traces.md: a killed router's last line)
CUT_SHORT = "last line cut short (no newline at the end of the file)"


def parse_chunk(data, file):
    """[pa.Table of EVENTS_SCHEMA] for ``data`` (bytes of whole lines) of ``file``."""
    if not data or data.isspace():      # (no copy of the chunk, unlike strip)
        return []
    table = _fast(data)
    if table is not None:
        events = _events(table, file)
        if events is not None:
            return [events]
    return _slow(data, file)


# ---------------------------------------------------------------------------
# records out of time

ASIDE_EXAMPLES = 5         # set-aside records a file names (their times)


def _opened_us(file):
    parsed = tf.parse_trace_file_name(file.rstrip("/").rsplit("/", 1)[-1])
    return parsed[1] if parsed else None


def set_aside(tables, file):
    """(tables, set aside, first times) for the tables of one whole trace
    file (or the part of it read now): valid records dated outside
    ``traceformat.plausible_range`` of the file's records get status
    ``aside`` (kept in the table, out of every analysis) with the reason in
    ``bad_reason``; the count, and the times of the first
    ``ASIDE_EXAMPLES`` of them in file order."""
    ok = [t for t in tables if t.num_rows and t.column("status")[0].as_py() == "ok"]
    if not ok:
        return tables, 0, []
    times = np.sort(np.concatenate([t.column("ts_us").to_numpy() for t in ok]))
    lo, hi = tf.plausible_range(times, _opened_us(file))
    if times[0] >= lo and times[-1] <= hi:
        return tables, 0, []
    out, count, first = [], 0, []
    for table in tables:
        if not (table.num_rows and table.column("status")[0].as_py() == "ok"):
            out.append(table)
            continue
        ts = table.column("ts_us")
        outside = pc.or_(pc.less(ts, lo), pc.greater(ts, hi))
        if not pc.any(outside).as_py():
            out.append(table)
            continue
        out.append(table.filter(pc.invert(outside)))
        aside = table.filter(outside)
        stamps = aside.column("ts_us").to_pylist()
        why = [f"dated {tf.format_time(t)}, outside {tf.format_time(lo)} .. "
               f"{tf.format_time(hi)} (its file's records, with room either side)"
               for t in stamps]
        names = aside.schema.names
        aside = aside.set_column(names.index("bad_reason"), "bad_reason", pa.array(why, _S))
        aside = aside.set_column(names.index("status"), "status", _repeat("aside", len(why)))
        out.append(aside)
        count += len(stamps)
        first += stamps[:max(0, ASIDE_EXAMPLES - len(first))]
    return [t for t in out if t.num_rows], count, first


def lines_at_times(source, gz, times, start_byte=0):
    """[(line_number, ts_us)] of the valid records at or after ``start_byte``
    whose ``ts_us`` is one of ``times`` (each time once, the first such
    line), numbered from the file's start: where set-aside records are."""
    import re
    wanted, found = set(times), []
    number, position = 0, 0
    stamp = re.compile(rb'"ts_us"\s*:\s*(-?\d+)')
    with open_trace(source, gz) as stream:
        for raw in stream:
            number += 1
            at, position = position, position + len(raw)
            if at < start_byte or not wanted:
                if not wanted:
                    break
                continue
            m = stamp.search(raw)
            if m is None or int(m.group(1)) not in wanted:
                continue
            if line_reason(raw.rstrip(b"\r\n")) is None:
                found.append((number, int(m.group(1))))
                wanted.discard(int(m.group(1)))
    return found


# ---------------------------------------------------------------------------
# files

def read_chunks(stream, chunk=CHUNK_BYTES):
    """Bytes of whole lines, about ``chunk`` at a time, from a binary stream
    (the last line need not end with a newline)."""
    carry = b""
    while True:
        block = stream.read(chunk)
        if not block:
            break
        data = carry + block
        cut = data.rfind(b"\n")
        if cut < 0:
            carry = data
            continue
        carry = data[cut + 1:]
        yield data[:cut + 1]
    if carry:
        yield carry


def open_trace(path_or_bytes, gz):
    """A binary stream of a trace file's lines: a local path, or its bytes."""
    raw = open(path_or_bytes, "rb") if isinstance(path_or_bytes, str) \
        else io.BytesIO(path_or_bytes)
    return gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw


def parse_file(source, file, gz, chunk=CHUNK_BYTES):
    """Yield pa.Tables of EVENTS_SCHEMA for a whole trace file (path or bytes).

    The file is read as finished: a last line without its newline is a
    record if it is one, else a bad line whose reason says it was cut short
    (``CUT_SHORT``)."""
    with open_trace(source, gz) as stream:
        for data in read_chunks(stream, chunk):
            if data.endswith(b"\n"):
                yield from parse_chunk(data, file)
                continue
            cut = data.rfind(b"\n") + 1
            yield from parse_chunk(data[:cut], file)
            last = data[cut:]
            reason = line_reason(last)
            if reason is None:
                yield from parse_chunk(last, file)
            else:
                yield _bad_rows(file, [(f"{CUT_SHORT}: {reason}", _raw_text(last))])


def bad_lines(source, gz, limit=5, start_byte=0):
    """[(line_number, reason, text)] of the first ``limit`` bad lines at or
    after ``start_byte`` (uncompressed), numbered from the file's start."""
    found, number, position = [], 0, 0
    with open_trace(source, gz) as stream:
        for raw in stream:
            number += 1
            at, position = position, position + len(raw)
            if at < start_byte:
                continue
            reason = line_reason(raw.rstrip(b"\r\n"))
            if reason is not None:
                if not raw.endswith(b"\n"):
                    reason = f"{CUT_SHORT}: {reason}"
                text = raw[:480].decode("utf-8", "replace").rstrip("\r\n")[:120]
                found.append((number, reason, text))
                if len(found) >= limit:
                    break
    return found
