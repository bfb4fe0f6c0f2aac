"""The proxy's durable store (issue 17; the mobile-proxy paper, sections
4.2-4.7 and 5.1): sessions, their subscriptions, and the notifications kept
for them while no client of theirs is connected.

No I/O but the database: one SQLite file (``:memory:`` for tests), opened
in WAL mode, so a transaction that has committed survives the process
being killed (``kill -9``); ``synchronous=NORMAL`` is enough for that (only
a crash of the whole machine could lose the last commits). Everything is
keyed so that memory stays bounded whatever is stored: rows live in the
file, and reads are paged (``pending(limit=...)``).

* One stored copy per notification (its encoded NameValue array, exactly
  as a NotifyDeliver carries it), however many sessions' subscriptions it
  matched; a ``pending`` row per (session, subscription) it still owes,
  with that subscription's expiry time.
* A subscription's time-to-live and maximum count interact as the paper
  says: "store notifications for up to X hours and store no more than Y of
  them" -- the oldest goes first when the count is reached; expiry is
  checked when notifications are read (an expired one is never returned)
  and swept periodically (``sweep``) to reclaim the space.
* Receipt: a destructive client's acknowledgement removes the session's
  pending rows; a non-destructive one records that this client has it
  (``delivered``), so the session's other clients still get it and no
  client ever gets it twice.
* A per-session cap on stored notifications (``max_stored``) drops the
  oldest and counts the drops, for the DropWarn the next client of the
  session is owed (``take_dropped``).
* Session passwords are kept only as salted scrypt hashes: one to join,
  one (administrative) for destructive operations (section 5.2.1).
"""

from __future__ import annotations

import hashlib
import heapq
import operator
import hmac
import os
import sqlite3
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from elvin.protocols import packets as P
from elvin.protocols.xdr import Reader

__all__ = ["Store", "StoredNotification", "SessionRecord", "hash_password",
           "check_password"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    name        TEXT PRIMARY KEY,
    join_hash   BLOB,
    admin_hash  BLOB,
    keys        BLOB,
    dropped     INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS subscriptions (
    session          TEXT NOT NULL REFERENCES sessions(name) ON DELETE CASCADE,
    id               INTEGER NOT NULL,
    expression       TEXT NOT NULL,
    accept_insecure  INTEGER NOT NULL,
    ttl              REAL,
    max_count        INTEGER,
    keys             BLOB,
    PRIMARY KEY (session, id)
);
CREATE TABLE IF NOT EXISTS notifications (
    id       INTEGER PRIMARY KEY,
    arrived  REAL NOT NULL,
    body     BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS pending (
    session       TEXT NOT NULL,
    subscription  INTEGER NOT NULL,
    notification  INTEGER NOT NULL,
    expires       REAL,
    secure        INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (session, subscription, notification)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS pending_by_session ON pending (session, notification);
CREATE INDEX IF NOT EXISTS pending_by_notification ON pending (notification);
CREATE INDEX IF NOT EXISTS pending_by_expiry ON pending (expires);
CREATE TABLE IF NOT EXISTS delivered (
    session       TEXT NOT NULL,
    client        TEXT NOT NULL,
    notification  INTEGER NOT NULL,
    PRIMARY KEY (session, client, notification)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS delivered_by_notification ON delivered (notification);
"""

#: scrypt parameters (RFC 7914's interactive-login figures).
_SCRYPT = {"n": 2 ** 14, "r": 8, "p": 1, "dklen": 32}


def hash_password(password: str) -> bytes:
    """A salted scrypt hash of ``password``: 16 bytes of salt, then the key."""
    salt = os.urandom(16)
    return salt + hashlib.scrypt(password.encode("utf-8"), salt=salt, **_SCRYPT)


def check_password(stored: Optional[bytes], password: Optional[str]) -> bool:
    """Does ``password`` match ``stored`` (None: no password needed)?"""
    if stored is None:
        return True
    if password is None:
        return False
    key = hashlib.scrypt(password.encode("utf-8"), salt=stored[:16], **_SCRYPT)
    return hmac.compare_digest(key, stored[16:])


class StoredNotification:
    """A notification owed to a session: its id (arrival order), when it
    arrived, its attributes, and the session's subscriptions it matched
    (``subscriptions``: all of them; ``secure`` / ``insecure``: split as
    the router's NotifyDeliver split them)."""

    __slots__ = ("id", "arrived", "body", "secure", "insecure")

    def __init__(self, id: int, arrived: float, body: bytes,
                 secure: Tuple[int, ...], insecure: Tuple[int, ...] = ()) -> None:
        self.id = id
        self.arrived = arrived
        self.body = body
        self.secure = secure
        self.insecure = insecure

    @property
    def subscriptions(self) -> Tuple[int, ...]:
        return tuple(sorted(self.secure + self.insecure))

    @property
    def attributes(self) -> Dict[str, Any]:
        return Reader(self.body).name_values()

    def __repr__(self) -> str:
        return f"<StoredNotification {self.id} for {self.subscriptions}>"


_first = operator.itemgetter(0)


def _ids(text: Any) -> Tuple[int, ...]:
    if text is None:
        return ()
    if isinstance(text, int):
        return (text,)
    return tuple(sorted(int(i) for i in text.split(",")))


class SessionRecord:
    """A session as stored: its name, password hashes, keys, drop count."""

    __slots__ = ("name", "join_hash", "admin_hash", "keys", "dropped")

    def __init__(self, name: str, join_hash: Optional[bytes], admin_hash: Optional[bytes],
                 keys: Optional[bytes], dropped: int) -> None:
        self.name = name
        self.join_hash = join_hash
        self.admin_hash = admin_hash
        self.keys = keys
        self.dropped = dropped


class Store:
    """The proxy's SQLite store (see the module docstring).

    Writes happen inside ``with store.batch():`` (one transaction: the
    proxy groups a reactor turn's notifications into one commit) or commit
    on their own. ``max_stored``: most notifications one session may hold
    (None: no cap but the subscriptions' own).
    """

    def __init__(self, path: str = ":memory:", max_stored: Optional[int] = None,
                 max_stored_bytes: Optional[int] = None) -> None:
        self.path = path
        self.max_stored = max_stored
        self.max_stored_bytes = max_stored_bytes
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA foreign_keys = ON")
        if path != ":memory:":
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA synchronous = NORMAL")
        self.db.executescript(_SCHEMA)
        self._depth = 0
        #: Exact count and bytes of the notifications each session is owed,
        #: kept as rows come and go (counted afresh after a sweep), so the
        #: caps are checked without counting rows at every store.
        self._owed: Dict[str, List[int]] = {}
        #: An upper bound of each capped subscription's pending rows.
        self._sub_bound: Dict[Tuple[str, int], int] = {}
        #: Each subscription's (ttl, max_count), read once.
        self._limit_cache: Dict[Tuple[str, int], Any] = {}

    def _limits(self, session: str, sub_id: int) -> Optional[Tuple[Any, Any]]:
        """A subscription's (ttl, max_count), or None if it does not exist."""
        key = (session, sub_id)
        if key in self._limit_cache:
            return self._limit_cache[key]
        found = self.db.execute("SELECT ttl, max_count FROM subscriptions "
                                "WHERE session = ? AND id = ?", key).fetchone()
        if len(self._limit_cache) > 100_000:
            self._limit_cache.clear()
        self._limit_cache[key] = found
        return found

    def hold(self) -> None:
        """Open a transaction that ``release`` commits: what is stored in
        between is committed together (the proxy holds one per reactor
        turn, so one read of many notifications costs one commit)."""
        if self._depth == 0:
            self.db.execute("BEGIN IMMEDIATE")
        self._depth += 1

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.db.execute("COMMIT")

    def _owed_of(self, session: str) -> List[int]:
        """[count, bytes] of what ``session`` is owed (expired or not)."""
        owed = self._owed.get(session)
        if owed is None:
            count, size = self.db.execute(
                "SELECT count(*), coalesce(sum(length(body)), 0) FROM notifications "
                "WHERE id IN (SELECT notification FROM pending WHERE session = ?)",
                (session,)).fetchone()
            owed = self._owed[session] = [count, size]
        return owed

    def _owed_count(self, session: str) -> int:
        return self._owed_of(session)[0]

    def _over_cap(self, session: str) -> bool:
        count, size = self._owed_of(session)
        return ((self.max_stored is not None and count > self.max_stored)
                or (self.max_stored_bytes is not None and size > self.max_stored_bytes))

    def _sizes(self, notes: Sequence[int]) -> int:
        total = 0
        for start in range(0, len(notes), 500):
            chunk = notes[start:start + 500]
            marks = ",".join("?" * len(chunk))
            total += self.db.execute(f"SELECT coalesce(sum(length(body)), 0) FROM notifications "
                                     f"WHERE id IN ({marks})", chunk).fetchone()[0]
        return total

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def batch(self) -> Iterator["Store"]:
        """One transaction for everything inside (nested: the outermost)."""
        if self._depth == 0:
            self.db.execute("BEGIN IMMEDIATE")
        self._depth += 1
        try:
            yield self
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self.db.execute("ROLLBACK")
                self._owed.clear()          # counted again from what is there
                self._sub_bound.clear()
            raise
        self._depth -= 1
        if self._depth == 0:
            self.db.execute("COMMIT")

    # -- sessions and subscriptions -------------------------------------------

    def create_session(self, name: str, password: Optional[str] = None,
                       admin_password: Optional[str] = None) -> SessionRecord:
        """A new session (raises KeyError if the name is taken)."""
        join_hash = hash_password(password) if password is not None else None
        admin_hash = hash_password(admin_password) if admin_password is not None else None
        return self.add_session(name, join_hash, admin_hash)

    def add_session(self, name: str, join_hash: Optional[bytes],
                    admin_hash: Optional[bytes]) -> SessionRecord:
        """``create_session`` with the password hashes already made."""
        try:
            with self.batch():
                self.db.execute("INSERT INTO sessions (name, join_hash, admin_hash) "
                                "VALUES (?, ?, ?)", (name, join_hash, admin_hash))
        except sqlite3.IntegrityError:
            raise KeyError(f"session {name!r} exists") from None
        return SessionRecord(name, join_hash, admin_hash, None, 0)

    def session(self, name: str) -> Optional[SessionRecord]:
        row = self.db.execute("SELECT name, join_hash, admin_hash, keys, dropped "
                              "FROM sessions WHERE name = ?", (name,)).fetchone()
        return SessionRecord(*row) if row else None

    def sessions(self) -> List[str]:
        return [name for (name,) in self.db.execute("SELECT name FROM sessions ORDER BY name")]

    def delete_session(self, name: str) -> None:
        """Forget the session, its subscriptions and what it is owed."""
        with self.batch():
            self.db.execute("DELETE FROM pending WHERE session = ?", (name,))
            self.db.execute("DELETE FROM delivered WHERE session = ?", (name,))
            self.db.execute("DELETE FROM sessions WHERE name = ?", (name,))
            self._collect()
        self._forget_counts(name)

    def set_keys(self, name: str, keys: Optional[bytes]) -> None:
        """Keep the session's security keys (an encoded Keys, or None)."""
        with self.batch():
            self.db.execute("UPDATE sessions SET keys = ? WHERE name = ?", (keys, name))

    def put_subscription(self, session: str, sub_id: int, expression: str,
                         accept_insecure: bool = True, ttl: Optional[float] = None,
                         max_count: Optional[int] = None,
                         keys: Optional[bytes] = None) -> None:
        """Add or replace a session's subscription (``ttl`` seconds and
        ``max_count`` notifications kept at most; None: no limit; ``keys``:
        its own security keys, encoded by the caller)."""
        self._limit_cache.pop((session, sub_id), None)
        with self.batch():
            self.db.execute(
                "INSERT OR REPLACE INTO subscriptions "
                "(session, id, expression, accept_insecure, ttl, max_count, keys) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session, sub_id, expression, int(accept_insecure), ttl, max_count, keys))

    def remove_subscription(self, session: str, sub_id: int) -> None:
        """Forget a subscription and what was kept for it alone."""
        with self.batch():
            self.db.execute("DELETE FROM subscriptions WHERE session = ? AND id = ?",
                            (session, sub_id))
            self.db.execute("DELETE FROM pending WHERE session = ? AND subscription = ?",
                            (session, sub_id))
            self._collect()
        self._forget_counts(session)

    def _forget_counts(self, session: str) -> None:
        self._owed.pop(session, None)
        for key in [k for k in self._limit_cache if k[0] == session]:
            del self._limit_cache[key]
        for key in [k for k in self._sub_bound if k[0] == session]:
            del self._sub_bound[key]

    def subscriptions(self, session: str) -> List[Tuple[int, str, bool, Optional[float],
                                                        Optional[int]]]:
        """``(id, expression, accept_insecure, ttl, max_count)`` per subscription."""
        return [(i, e, bool(a), t, m) for i, e, a, t, m in self.db.execute(
            "SELECT id, expression, accept_insecure, ttl, max_count FROM subscriptions "
            "WHERE session = ? ORDER BY id", (session,))]

    def subscription_keys(self, session: str) -> Dict[int, Optional[bytes]]:
        """Each of the session's subscriptions' own keys (as put)."""
        return dict(self.db.execute("SELECT id, keys FROM subscriptions WHERE session = ?",
                                    (session,)))

    def largest_subscription_id(self) -> int:
        """The largest subscription id in use (0: none), to number new ones."""
        return self.db.execute("SELECT coalesce(max(id), 0) FROM subscriptions").fetchone()[0]

    def stored_count(self, session: str) -> int:
        """How many notifications the session is owed (expired or not)."""
        return self.db.execute("SELECT count(DISTINCT notification) FROM pending "
                               "WHERE session = ?", (session,)).fetchone()[0]

    # -- notifications -------------------------------------------------------

    def store(self, attributes: Any, matches: Mapping[str, Any],
              now: float) -> Optional[int]:
        """Keep one copy of a notification for the sessions' subscriptions
        in ``matches`` (``{session: [subscription ids]}``, or ``{session:
        {subscription id: matched securely}}``); returns its id, or None if
        no subscription named there exists. ``attributes``: a mapping, or
        its encoding (``packets.encode_attributes``) when already made."""
        if isinstance(attributes, (bytes, bytearray)):
            body = bytes(attributes)
        else:
            body = P.encode_attributes(attributes)
        with self.batch():
            rows = []
            for session, sub_ids in matches.items():
                secure_of = sub_ids if isinstance(sub_ids, Mapping) else dict.fromkeys(sub_ids, True)
                for sub_id, secure in secure_of.items():
                    found = self._limits(session, sub_id)
                    if found is not None:
                        rows.append((session, sub_id, found[0], found[1], int(bool(secure))))
            if not rows:
                return None
            cursor = self.db.execute("INSERT INTO notifications (arrived, body) VALUES (?, ?)",
                                     (now, body))
            note = cursor.lastrowid
            assert note is not None
            self.db.executemany(
                "INSERT OR IGNORE INTO pending "
                "(session, subscription, notification, expires, secure) VALUES (?, ?, ?, ?, ?)",
                [(session, sub_id, note, None if ttl is None else now + ttl, secure)
                 for session, sub_id, ttl, _, secure in rows])
            sessions = {row[0] for row in rows}
            for session in sessions:
                owed = self._owed.get(session)
                if owed is not None:
                    owed[0] += 1
                    owed[1] += len(body)
            trimmed: List[int] = []
            for session, sub_id, _, max_count, _ in rows:
                if max_count is not None:
                    trimmed += self._trim_subscription(session, sub_id, max_count)
            if self.max_stored is not None or self.max_stored_bytes is not None:
                for session in sessions:
                    if self._over_cap(session):
                        trimmed += self._trim_session(session)
            if trimmed:
                self._collect(trimmed)
        return note

    def _trim_subscription(self, session: str, sub_id: int, max_count: int) -> List[int]:
        """Drop the subscription's oldest rows beyond ``max_count``."""
        key = (session, sub_id)
        bound = self._sub_bound.get(key)
        if bound is not None and bound < max_count:
            self._sub_bound[key] = bound + 1
            return []
        count = self.db.execute("SELECT count(*) FROM pending WHERE session = ? "
                                "AND subscription = ?", (session, sub_id)).fetchone()[0]
        self._sub_bound[key] = min(count, max_count)
        if count <= max_count:
            return []
        over = [n for (n,) in self.db.execute(
            "SELECT notification FROM pending WHERE session = ? AND subscription = ? "
            "ORDER BY notification LIMIT ?", (session, sub_id, count - max_count))]
        self.db.executemany("DELETE FROM pending WHERE session = ? AND subscription = ? "
                            "AND notification = ?", [(session, sub_id, n) for n in over])
        owed = self._owed.get(session)
        if owed is not None:
            gone = [n for n in over if self.db.execute(
                "SELECT 1 FROM pending WHERE session = ? AND notification = ? LIMIT 1",
                (session, n)).fetchone() is None]
            owed[0] -= len(gone)
            owed[1] -= self._sizes(gone)
        return over

    def _trim_session(self, session: str) -> List[int]:
        """Drop the session's oldest notifications until it is within
        ``max_stored`` and ``max_stored_bytes``."""
        owed = self._owed_of(session)
        over: List[int] = []
        while self._over_cap(session):
            batch = 64
            if self.max_stored is not None and owed[0] > self.max_stored:
                batch = max(batch, owed[0] - self.max_stored)
            oldest = self.db.execute(
                "SELECT p.notification, length(n.body) FROM pending p "
                "JOIN notifications n ON n.id = p.notification WHERE p.session = ? "
                "AND p.notification > ? GROUP BY p.notification ORDER BY p.notification "
                "LIMIT ?", (session, over[-1] if over else 0, batch)).fetchall()
            if not oldest:
                break
            for note, size in oldest:
                if not self._over_cap(session):
                    break
                over.append(note)
                owed[0] -= 1
                owed[1] -= size
        if over:
            self.db.executemany("DELETE FROM pending WHERE session = ? AND notification = ?",
                                [(session, n) for n in over])
            self.db.execute("UPDATE sessions SET dropped = dropped + ? WHERE name = ?",
                            (len(over), session))
            for key in [k for k in self._sub_bound if k[0] == session]:
                del self._sub_bound[key]
        return over

    def take_dropped(self, session: str) -> int:
        """How many of the session's notifications were dropped to stay
        under ``max_stored`` since this was last asked (then zero)."""
        with self.batch():
            row = self.db.execute("SELECT dropped FROM sessions WHERE name = ?",
                                  (session,)).fetchone()
            self.db.execute("UPDATE sessions SET dropped = 0 WHERE name = ?", (session,))
        return row[0] if row else 0

    def pending(self, session: str, client: str, now: float,
                limit: int = 1000) -> List[StoredNotification]:
        """Up to ``limit`` notifications the session is owed that ``client``
        has not had and that have not expired, oldest first, each with the
        session's subscriptions it matched (and that have not expired)."""
        return self.pending_many([session], client, now, limit)

    def pending_many(self, sessions: Sequence[str], client: str, now: float,
                     limit: int = 1000, after: int = 0) -> List[StoredNotification]:
        """``pending`` for a client joined to several sessions: each
        notification once, however many of them it is owed to, with the
        subscriptions of all of them it matched; only those after the
        notification id ``after`` (a replay's cursor)."""
        # One ordered walk of the (session, notification) index per
        # session, merged lazily: only the rows of the first ``limit``
        # notifications are read, however many sessions there are.
        walks = [self.db.execute(
            "SELECT p.notification, "
            "       group_concat(CASE WHEN p.secure THEN p.subscription END), "
            "       group_concat(CASE WHEN p.secure THEN NULL ELSE p.subscription END) "
            "FROM pending p WHERE p.session = ? AND p.notification > ? "
            "AND (p.expires IS NULL OR p.expires > ?) "
            "AND NOT EXISTS (SELECT 1 FROM delivered d WHERE d.session = p.session "
            "                AND d.client = ? AND d.notification = p.notification) "
            "GROUP BY p.notification ORDER BY p.notification LIMIT ?",
            (session, after, now, client, limit)) for session in sessions]
        merged: Dict[int, Tuple[List[int], List[int]]] = {}
        for note, secure, insecure in heapq.merge(*walks, key=_first):
            entry = merged.get(note)
            if entry is None:
                if len(merged) == limit:
                    break
                entry = merged[note] = ([], [])
            entry[0].extend(_ids(secure))
            entry[1].extend(_ids(insecure))
        chosen = sorted(merged)[:limit]
        if not chosen:
            return []
        marks = ",".join("?" * len(chosen))
        bodies = {note: (arrived, body) for note, arrived, body in self.db.execute(
            f"SELECT id, arrived, body FROM notifications WHERE id IN ({marks})", chosen)}
        return [StoredNotification(note, bodies[note][0], bodies[note][1],
                                   tuple(sorted(merged[note][0])),
                                   tuple(sorted(merged[note][1])))
                for note in chosen if note in bodies]

    def acknowledge(self, session: str, client: str, notifications: Iterable[int],
                    destructive: bool = True) -> None:
        """``client`` has these: destructively, the session no longer owes
        them; otherwise only this client is not to get them again."""
        self.acknowledge_many([session], client, notifications, destructive)

    def acknowledge_many(self, sessions: Sequence[str], client: str,
                         notifications: Iterable[int], destructive: bool = True) -> None:
        """``acknowledge`` for a client of several sessions, in one go."""
        ids = list(notifications)
        if not ids or not sessions:
            return
        with self.batch():
            if destructive:
                in_ids = ",".join("?" * len(ids))
                in_sessions = ",".join("?" * len(sessions))
                for session, count, size in self.db.execute(
                        "SELECT o.session, count(*), coalesce(sum(length(n.body)), 0) FROM "
                        "(SELECT DISTINCT session, notification FROM pending "
                        f" WHERE notification IN ({in_ids}) AND session IN ({in_sessions})) o "
                        "JOIN notifications n ON n.id = o.notification GROUP BY o.session",
                        (*ids, *sessions)):
                    owed = self._owed.get(session)
                    if owed is not None:
                        owed[0] -= count
                        owed[1] -= size
                for key in [k for k in self._sub_bound if k[0] in sessions]:
                    del self._sub_bound[key]
                for table in ("pending", "delivered"):
                    self.db.executemany(
                        f"DELETE FROM {table} WHERE notification = ? "
                        f"AND session IN ({in_sessions})", [(n, *sessions) for n in ids])
                self._collect(ids)
            else:
                self.db.executemany("INSERT OR IGNORE INTO delivered "
                                    "(session, client, notification) VALUES (?, ?, ?)",
                                    [(session, client, n) for session in sessions
                                     for n in ids])

    def sweep(self, now: float) -> int:
        """Delete what has expired; returns how many pending rows went."""
        with self.batch():
            gone = self.db.execute("DELETE FROM pending WHERE expires IS NOT NULL "
                                   "AND expires <= ?", (now,)).rowcount
            self._collect()
        if gone:
            self._owed.clear()
            self._sub_bound.clear()
        return gone

    def _collect(self, candidates: Optional[Sequence[int]] = None) -> None:
        """Drop notifications no session is owed any more: those among
        ``candidates`` (by index, cheap), or all of them (a full scan)."""
        if candidates is None:
            self.db.execute("DELETE FROM delivered WHERE notification NOT IN "
                            "(SELECT notification FROM pending)")
            self.db.execute("DELETE FROM notifications WHERE id NOT IN "
                            "(SELECT notification FROM pending)")
            return
        unique = list(set(candidates))
        owed = set()
        for start in range(0, len(unique), 500):
            chunk = unique[start:start + 500]
            marks = ",".join("?" * len(chunk))
            owed.update(n for (n,) in self.db.execute(
                f"SELECT DISTINCT notification FROM pending WHERE notification IN ({marks})",
                chunk))
        orphans = [(n,) for n in unique if n not in owed]
        self.db.executemany("DELETE FROM delivered WHERE notification = ?", orphans)
        self.db.executemany("DELETE FROM notifications WHERE id = ?", orphans)

    def counts(self) -> Dict[str, int]:
        """Rows per table (for statistics and tests)."""
        return {table: self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("sessions", "subscriptions", "notifications", "pending",
                              "delivered")}
