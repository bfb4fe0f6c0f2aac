"""The federation trace format (docs/traces.md), in plain Python.

Nothing here needs Spark: this module is the executable form of the format
document, shared by the generator (``spark_analysis.synth``), the tests and
whoever writes traces. It provides

* the event names and which fields each event carries (``EVENTS``,
  ``REQUIRED``, ``DIRECTIONS``);
* ``notification_digest(attributes)`` -- the reference digest recipe;
* ``routing_entry_size(domain)`` -- the bytes one routing-list entry adds to
  an encoded FedNotify;
* ``trace_file_name`` / ``parse_trace_file_name`` -- the file naming rule;
* ``format_record(...)`` -- one trace line, exactly as a writer emits it;
* ``check_record(obj)`` / ``check_line(text)`` / ``check_file(path)`` --
  a validator (the same rules as trace_schema.json and as the Spark ingest
  stage) returning a reason string, or None for a good record.
"""

import datetime
import hashlib
import json
import re

__all__ = ["FORMAT_VERSION", "EVENTS", "NOTIFY_EVENTS", "SUBREPLACE_EVENTS",
           "LINK_EVENTS", "DIRECTIONS", "REQUIRED", "FIELDS",
           "notification_digest", "canonical_attributes", "routing_entry_size",
           "trace_file_name", "parse_trace_file_name", "TRACE_FILE_RE",
           "format_record", "check_record", "check_line", "check_file",
           "is_trace_file", "parse_time", "format_time", "TIME_SLACK_US",
           "plausible_range"]

FORMAT_VERSION = 1

LINK_EVENTS = ("link_up", "link_down")
SUBREPLACE_EVENTS = ("subreplace_sent", "subreplace_received")
NOTIFY_EVENTS = (
    "notify_forwarded",          # out: sent on the link
    "notify_received",           # in: accepted from the link
    "notify_suppressed_filter",  # out: did not match the peer's pull filter
    "notify_suppressed_export",  # out: matched the pull filter, not our export filter
    "notify_dropped_loop",       # in: our domain was already in the routing list
    "notify_dropped_duplicate",  # in: already seen by another path (mesh)
    "notify_dropped_import",     # in: did not match our import filter for the peer
    "notify_dropped_overload",   # out: send queue full; in: router overloaded
)
EVENTS = LINK_EVENTS + SUBREPLACE_EVENTS + NOTIFY_EVENTS

# Allowed values of "direction" per event.
DIRECTIONS = {
    "link_up": ("in", "out"),        # in: the peer dialled us; out: we dialled
    "link_down": ("in", "out"),      # as for the link's link_up
    "subreplace_sent": ("out",),
    "subreplace_received": ("in",),
    "notify_forwarded": ("out",),
    "notify_received": ("in",),
    "notify_suppressed_filter": ("out",),
    "notify_suppressed_export": ("out",),
    "notify_dropped_loop": ("in",),
    "notify_dropped_duplicate": ("in",),
    "notify_dropped_import": ("in",),
    "notify_dropped_overload": ("in", "out"),
}

# Every field of a record and its JSON type(s) ("null" = may be null).
FIELDS = {
    "v": ("integer",),
    "ts_us": ("integer",),
    "router": ("string",),
    "peer": ("string", "null"),
    "event": ("string",),
    "direction": ("string",),
    "routing": ("array",),
    "size": ("integer",),
    "attrs": ("array",),
    "digest": ("string",),
    "filter_nodes": ("integer",),
    "filter_bytes": ("integer",),
    "reason": ("string",),
    "unsent": ("integer",),
}

COMMON = ("v", "ts_us", "router", "peer", "event", "direction")
NOTIFY_FIELDS = ("routing", "size", "attrs", "digest")
REQUIRED = {event: COMMON for event in EVENTS}
REQUIRED.update({event: COMMON + NOTIFY_FIELDS for event in NOTIFY_EVENTS})
REQUIRED.update({event: COMMON + ("filter_nodes", "filter_bytes")
                 for event in SUBREPLACE_EVENTS})
REQUIRED["link_down"] = COMMON + ("reason",)

# Largest ts_us accepted (year 9999) -- guards against seconds or nanoseconds.
MIN_TS_US = 946684800 * 10**6        # 2000-01-01T00:00:00Z
MAX_TS_US = 253402300799 * 10**6     # 9999-12-31T23:59:59Z
DIGEST_RE = re.compile(r"\A[0-9a-f]{40}\Z")


# --------------------------------------------------------------------------
# digest

def canonical_attributes(attributes):
    """The canonical byte string the digest is computed over.

    The XDR NameValue array of the client protocol (section 8.2.3) with the
    attributes in ascending order of the UTF-8 bytes of their names:
    uint32 count, then per attribute the name as an XDR string (uint32
    length, UTF-8 bytes, zero padding to a multiple of 4), the int32 value
    type code (int32=1, int64=2, real64=3, string=4, opaque=5) and the value
    (int32: 4 bytes, int64: 8 bytes, real64: IEEE-754 binary64, all
    big-endian; string and opaque: uint32 length, bytes, zero padding).

    ``attributes`` is in the router's normalised form (elvin.values): a
    plain int in int32 range is int32, ``Int64`` is int64.
    """
    from elvin.protocols.xdr import Writer
    ordered = dict(sorted(attributes.items(), key=lambda item: item[0].encode("utf-8")))
    return Writer().name_values(ordered).getvalue()


def notification_digest(attributes):
    """SHA-1 of ``canonical_attributes(attributes)``, as 40 lowercase hex digits."""
    return hashlib.sha1(canonical_attributes(attributes)).hexdigest()


def routing_entry_size(domain):
    """Bytes one routing-list entry adds to an encoded FedNotify (an XDR string)."""
    n = len(domain.encode("utf-8"))
    return 4 + n + (-n & 3)


# --------------------------------------------------------------------------
# file names

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
TRACE_FILE_RE = re.compile(
    r"\A(?P<domain>.+)-(?P<stamp>\d{8}T\d{6}Z)-(?P<seq>\d{6,})\.jsonl(?:\.gz)?\Z")


def _safe_domain(domain):
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")),
                       domain) or "%"


def trace_file_name(domain, opened_us, seq, gzip=False):
    """``<domain>-<YYYYMMDDTHHMMSSZ>-<seq>.jsonl``: the name of a trace file.

    ``opened_us`` is when the file was opened (microseconds since the
    epoch, UTC); ``seq`` counts files from 1 for the writer's life and is
    zero-padded to 6 digits. Characters of the domain outside
    ``[A-Za-z0-9._-]`` are written as %XX of their UTF-8 bytes.
    """
    stamp = datetime.datetime.fromtimestamp(opened_us / 1e6, datetime.timezone.utc)
    name = f"{_safe_domain(domain)}-{stamp:%Y%m%dT%H%M%SZ}-{seq:06d}.jsonl"
    return name + ".gz" if gzip else name


def parse_trace_file_name(name):
    """(domain, opened_us, seq) from a trace file's base name, or None."""
    m = TRACE_FILE_RE.match(name)
    if not m:
        return None
    stamp = datetime.datetime.strptime(m.group("stamp"), "%Y%m%dT%H%M%SZ")
    opened = int(stamp.replace(tzinfo=datetime.timezone.utc).timestamp()) * 10**6
    domain = re.sub(r"(?:%[0-9A-F]{2})+",
                    lambda s: bytes.fromhex(s.group().replace("%", "")).decode("utf-8", "replace"),
                    m.group("domain"))
    return domain, opened, int(m.group("seq"))


def is_trace_file(name):
    """True for names the analysis reads: ``*.jsonl`` and ``*.jsonl.gz``."""
    return name.endswith(".jsonl") or name.endswith(".jsonl.gz")


# --------------------------------------------------------------------------
# records

def format_record(ts_us, router, peer, event, direction, *, routing=None, size=None,
                  attrs=None, digest=None, filter_nodes=None, filter_bytes=None,
                  reason=None, unsent=None):
    """One trace line (without the newline): compact JSON, UTF-8 safe.

    Fields that are None are left out (except ``peer``, always present);
    ``attrs`` is sorted here so callers may pass any iterable of names.
    """
    record = {"v": FORMAT_VERSION, "ts_us": int(ts_us), "router": router,
              "peer": peer, "event": event, "direction": direction}
    if routing is not None:
        record["routing"] = list(routing)
    if size is not None:
        record["size"] = int(size)
    if attrs is not None:
        record["attrs"] = sorted(attrs, key=lambda name: name.encode("utf-8"))
    if digest is not None:
        record["digest"] = digest
    if filter_nodes is not None:
        record["filter_nodes"] = int(filter_nodes)
    if filter_bytes is not None:
        record["filter_bytes"] = int(filter_bytes)
    if reason is not None:
        record["reason"] = reason
    if unsent is not None:
        record["unsent"] = int(unsent)
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _type_ok(value, types):
    for kind in types:
        if kind == "null" and value is None:
            return True
        if kind == "integer" and type(value) is int:
            return True
        if kind == "string" and type(value) is str:
            return True
        if kind == "array" and type(value) is list:
            return True
    return False


def check_record(obj):
    """None if ``obj`` (a decoded JSON value) is a valid record, else why not.

    The rules are those of trace_schema.json (plus: ``attrs`` sorted by
    UTF-8 bytes, which a schema cannot say). Fields a record's event does not
    use should be omitted; if present they must still have the right type.
    Unknown fields are allowed.
    """
    if type(obj) is not dict:
        return "not a JSON object"
    event = obj.get("event")
    if "event" in obj and type(event) is not str:
        return "field 'event' has the wrong type"
    if event not in REQUIRED:
        return f"unknown event {event!r}" if "event" in obj else "missing field 'event'"
    for name in REQUIRED[event]:
        if name not in obj:
            return f"missing field {name!r}"
    for name, types in FIELDS.items():
        if name in obj and not _type_ok(obj[name], types):
            return f"field {name!r} has the wrong type"
    if obj["v"] != FORMAT_VERSION:
        return f"unsupported format version {obj['v']!r}"
    if not MIN_TS_US <= obj["ts_us"] <= MAX_TS_US:
        return "ts_us out of range (microseconds since 1970 expected)"
    if not obj["router"]:
        return "empty 'router'"
    if obj["direction"] not in DIRECTIONS[event]:
        return f"direction {obj['direction']!r} not allowed for {event}"
    if obj["peer"] is None and event != "link_down":
        return "'peer' may be null only for link_down"
    if event in NOTIFY_EVENTS:
        if not obj["routing"]:
            return "'routing' must not be empty"
        if any(type(d) is not str for d in obj["routing"]):
            return "'routing' must be a list of strings"
        if any(type(a) is not str for a in obj["attrs"]):
            return "'attrs' must be a list of strings"
        keys = [a.encode("utf-8", "surrogatepass") for a in obj["attrs"]]
        if any(a >= b for a, b in zip(keys, keys[1:])):
            return "'attrs' must be sorted (by UTF-8 bytes) without duplicates"
        if obj["size"] < 0:
            return "negative 'size'"
        if not DIGEST_RE.match(obj["digest"]):
            return "'digest' must be 40 lowercase hex digits"
    if event in SUBREPLACE_EVENTS and (obj["filter_nodes"] < 0 or obj["filter_bytes"] < 0):
        return "negative filter size"
    if event == "link_down" and "unsent" in obj and obj["unsent"] < 1:
        return "'unsent' must be at least 1 (it is left out when none)"
    return None


def check_line(text):
    """None if ``text`` (one line, newline optional) is a valid record, else why not."""
    text = text.strip()
    if not text:
        return None  # blank lines are ignored
    try:
        obj = json.loads(text)
    except ValueError as e:
        return f"not JSON ({e})"
    return check_record(obj)


def check_file(path, limit=None):
    """[(line_number, reason)] for the bad lines of a trace file (.jsonl or .jsonl.gz)."""
    import gzip
    opener = gzip.open if str(path).endswith(".gz") else open
    bad = []
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            reason = check_line(line)
            if reason is not None:
                bad.append((number, reason))
                if limit is not None and len(bad) >= limit:
                    break
    return bad


# --------------------------------------------------------------------------
# times

# how far beyond the bulk of its file's records a record may lie (at least)
TIME_SLACK_US = 3600 * 10**6


def plausible_range(sorted_ts, opened_us=None):
    """(lo, hi): the times a file's records may plausibly have, from the
    times themselves (``sorted_ts``, ascending) and when the file was opened
    (from its name; None if unknown).

    The file's *bulk* runs from its 1st to its 99th percentile record (its
    median for fewer than 100 records), widened to take in the time the
    file was opened; a record is plausible within the bulk's own length,
    and at least ``TIME_SLACK_US`` (an hour), either side of it. One record
    dated decades away among a file's hours of traffic is outside; a clock
    step of minutes is not.
    """
    n = len(sorted_ts)
    if not n:
        return None
    if n >= 100:
        lo = int(sorted_ts[(n + 99) // 100 - 1])
        hi = int(sorted_ts[(99 * n + 99) // 100 - 1])
    else:
        lo = hi = int(sorted_ts[(n - 1) // 2])
    if opened_us is not None:
        lo, hi = min(lo, opened_us), max(hi, opened_us)
    slack = max(TIME_SLACK_US, hi - lo)
    return lo - slack, hi + slack

def parse_time(text):
    """Microseconds since the epoch from ISO 8601 (UTC unless it says) or epoch seconds.

    Accepts ``2024-05-01T12:00:00Z``, ``2024-05-01 12:00``, ``2024-05-01``,
    ``2024-05-01T14:00:00+02:00`` and ``1714564800`` / ``1714564800.5``.
    Raises ValueError naming the text otherwise.
    """
    text = text.strip()
    try:
        return int(round(float(text) * 1e6))
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a time (use ISO 8601, e.g. "
                         f"2024-05-01T12:00:00Z, or seconds since 1970)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    delta = when - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 10**6 + delta.microseconds


def format_time(ts_us, precision="seconds"):
    """ISO 8601 UTC text for microseconds since the epoch (``...Z``)."""
    when = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + \
        datetime.timedelta(microseconds=int(ts_us))
    return when.replace(tzinfo=None).isoformat(sep="T", timespec=precision) + "Z"
