"""The proxy's durable store (the mobile-proxy paper, sections 4.2-4.7 and
5.1): sessions, their subscriptions, and the notifications kept for them
while no client of theirs has them.

No I/O but the database: one SQLite file (``:memory:`` for tests), opened
in WAL mode, so a transaction that has committed survives the process
being killed (``kill -9``); ``synchronous=NORMAL`` is enough for that (only
a crash of the whole machine could lose the last commits). The file and
its ``-wal``/``-shm`` companions are owner-only (0600) whatever the umask.
Everything is keyed so that memory stays bounded whatever is stored: rows
live in the file, and reads are paged (``pending(limit=...)``).

* One stored copy per notification (its encoded NameValue array, exactly
  as a NotifyDeliver carries it), however many sessions' subscriptions it
  matched; a ``pending`` row per (session, subscription) it still owes,
  with that subscription's expiry time. A notification that matched only
  through security keys is sealed (``elvin.proxy.seal``), as are the
  sessions' and subscriptions' keys.
* A subscription's time-to-live and maximum count interact as the paper
  says: "store notifications for up to X hours and store no more than Y of
  them" -- the oldest goes first when the count is reached; changing
  either applies to what is already kept. Expiry is checked when
  notifications are read (an expired one is never returned) and swept in
  bounded steps by the expiry index (``sweep``) to reclaim the space.
* Counts are kept, never recounted on the write path: each session's owed
  notifications and bytes, each subscription's rows, the bytes of all
  notifications; each is counted once, when first needed.
* Receipt: a destructive acknowledgement removes the session's pending
  rows; a non-destructive one records that this client has it
  (``delivered``), so the session's other clients still get it and no
  client ever gets it twice.
* Caps per session (``max_stored``, ``max_stored_bytes``) and for the
  whole proxy (``max_total_bytes``) drop the oldest and count the drops,
  for the DropWarn the session's next client is owed (``take_dropped``).
* Session passwords are kept only as salted scrypt hashes: one to join,
  one (administrative) for destructive operations (section 5.2.1).
* A write the disk cannot take raises ``StoreFailed`` (the transaction is
  rolled back); a file that is not a usable database raises ``StoreError``
  when the store is opened.
"""

from __future__ import annotations

import collections.abc
import hashlib
import heapq
import operator
import hmac
import os
import sqlite3
import time
from contextlib import contextmanager
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set,
                    Tuple)

from elvin.protocols import packets
from elvin.protocols.xdr import Reader
from elvin.proxy.seal import MARK, SealError, Sealer, create_private, make_private

__all__ = ["Store", "StoredNotification", "SessionRecord", "StoreError", "StoreFailed",
           "hash_password", "check_password"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    name        TEXT PRIMARY KEY,
    join_hash   BLOB,
    admin_hash  BLOB,
    keys        BLOB,
    dropped     INTEGER NOT NULL DEFAULT 0,
    last_seen   REAL,
    creator     TEXT,
    gaps        INTEGER NOT NULL DEFAULT 0
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
    body     BLOB NOT NULL,
    sealed   INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS delivered (
    session       TEXT NOT NULL,
    client        TEXT NOT NULL,
    notification  INTEGER NOT NULL,
    PRIMARY KEY (session, client, notification)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS delivered_by_notification ON delivered (notification);
"""

#: What each session is owed: a row per (session, notification,
#: subscription that matched), clustered by session and arrival (replay
#: pages and acknowledgements walk it in order), ``capped`` when the
#: subscription has a max_count and its session other subscriptions: only
#: those rows are in the index that finds a subscription's oldest (a store
#: for an uncapped one, or for the only subscription of its session, writes
#: one session-led tree, not two; see ``Store._capped_walk``).
_PENDING = """
CREATE TABLE IF NOT EXISTS {name} (
    session       TEXT NOT NULL,
    subscription  INTEGER NOT NULL,
    notification  INTEGER NOT NULL,
    expires       REAL,
    secure        INTEGER NOT NULL DEFAULT 1,
    capped        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session, notification, subscription)
) WITHOUT ROWID;
"""
_PENDING_INDEXES = """
CREATE INDEX IF NOT EXISTS pending_by_notification ON pending (notification);
CREATE INDEX IF NOT EXISTS pending_by_expiry_set ON pending (expires) WHERE expires IS NOT NULL;
CREATE INDEX IF NOT EXISTS pending_capped ON pending (session, subscription, notification)
    WHERE capped = 1;
"""

#: Columns added since the first schema: (table, column, declaration).
_ADDED_COLUMNS = (
    ("sessions", "last_seen", "REAL"),
    ("notifications", "sealed", "INTEGER NOT NULL DEFAULT 0"),
    ("sessions", "creator", "TEXT"),
    ("sessions", "gaps", "INTEGER NOT NULL DEFAULT 0"),
)

#: Pages of write-ahead log between checkpoints (about 40 MB of log).
_CHECKPOINT_PAGES = 10_000

#: scrypt parameters (RFC 7914's interactive-login figures).
_SCRYPT = {"n": 2 ** 14, "r": 8, "p": 1, "dklen": 32}

#: SQLite's result codes for a write the disk could not take.
_CANNOT_WRITE = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN,
                 sqlite3.SQLITE_READONLY}


class StoreError(Exception):
    """The database cannot be used (not a database, corrupted, or its key
    file is wrong); the message names the file and what to do."""


class StoreFailed(Exception):
    """A write failed for lack of space or an I/O error; nothing of the
    transaction it was in was kept."""


def _cannot_write(error: BaseException) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _CANNOT_WRITE
    text = str(error)
    return "disk is full" in text or "disk I/O error" in text


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


def _slack(max_count: int) -> int:
    """Rows a subscription may hold beyond its max_count before they are
    trimmed (an eighth of it, 1 to 256): what nobody reads yet."""
    return max(1, min(256, max_count // 8))


def _chunks(ids: Sequence[Any], size: int = 500) -> Iterator[Tuple[Sequence[Any], str]]:
    """``ids`` in chunks small enough for one statement, each with its
    ``?,?,...`` placeholders."""
    for start in range(0, len(ids), size):
        chunk = ids[start:start + size]
        yield chunk, ",".join("?" * len(chunk))


def _merged(spans: Iterable[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Ranges ``(first, last)`` sorted, overlapping ones joined."""
    merged: List[Tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(last, merged[-1][1]))
        else:
            merged.append((first, last))
    return merged


def _within(spans: Sequence[Tuple[int, int]], note: int) -> bool:
    """Is ``note`` in one of these (few, merged) ranges?"""
    return any(first <= note <= last for first, last in spans)


def _ids(text: Any) -> Tuple[int, ...]:
    if text is None:
        return ()
    if isinstance(text, int):
        return (text,)
    return tuple(sorted(int(i) for i in text.split(",")))


class SessionRecord:
    """A session as stored: its name, password hashes, keys, drop count
    (``gaps`` of it gaps of unknown size, each counted as one), and the
    host whose client created it (None: not known, a session from before
    hosts were kept)."""

    __slots__ = ("name", "join_hash", "admin_hash", "keys", "dropped", "creator", "gaps")

    def __init__(self, name: str, join_hash: Optional[bytes], admin_hash: Optional[bytes],
                 keys: Optional[bytes], dropped: int, creator: Optional[str] = None,
                 gaps: int = 0) -> None:
        self.name = name
        self.join_hash = join_hash
        self.admin_hash = admin_hash
        self.keys = keys
        self.dropped = dropped
        self.creator = creator
        self.gaps = gaps


class Store:
    """The proxy's SQLite store (see the module docstring).

    Writes happen inside ``with store.batch():`` (one transaction: the
    proxy groups a reactor turn's notifications into one commit) or commit
    on their own. ``max_stored`` / ``max_stored_bytes``: most notifications
    / bytes one session may hold; ``max_total_bytes``: most bytes of
    notifications kept for all sessions together (None: no cap).
    ``key_path``: the file of the key that seals keys and secure-only
    notifications (default: the database's name with ``.key`` added; an
    in-memory store uses a key of its own).
    """

    def __init__(self, path: str = ":memory:", max_stored: Optional[int] = None,
                 max_stored_bytes: Optional[int] = None,
                 max_total_bytes: Optional[int] = None,
                 key_path: Optional[str] = None) -> None:
        self.path = path
        #: Secure-only notifications of an earlier version's database found
        #: in clear and sealed as it was opened (the proxy logs the count).
        self.sealed_at_open = 0
        self.max_stored = max_stored
        self.max_stored_bytes = max_stored_bytes
        self.max_total_bytes = max_total_bytes
        memory = path == ":memory:"
        try:
            if not memory:
                # Owner-only, whatever the umask: SQLite gives the -wal and
                # -shm files the database file's permissions.
                if not create_private(path):
                    for suffix in ("", "-wal", "-shm"):
                        make_private(path + suffix)
            self.key_path = None if memory else (key_path or path + ".key")
            sealer = Sealer.ephemeral() if self.key_path is None else Sealer.from_file(
                self.key_path, create=False)
        except (OSError, SealError) as e:
            raise StoreError(f"{path}: cannot open the proxy's database: {e}") from None
        try:
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA foreign_keys = ON")
            # Deleted rows are zeroed where that costs no extra writes.
            self.db.execute("PRAGMA secure_delete = FAST")
            if not memory:
                self.db.execute("PRAGMA journal_mode = WAL")
                self.db.execute("PRAGMA synchronous = NORMAL")
                # Copied into the database every _CHECKPOINT_PAGES pages of
                # log, not SQLite's 1,000: a commit of rows for many sessions
                # dirties a page for each, and each checkpoint syncs and
                # copies every page the log holds, however often it changed.
                self.db.execute(f"PRAGMA wal_autocheckpoint = {_CHECKPOINT_PAGES}")
            self.db.executescript(_SCHEMA + _PENDING.format(name="pending"))
            self.sealer = self._check_key(sealer)
            self._migrate()
            self.db.executescript(_PENDING_INDEXES)
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"{path}: not a usable proxy database ({e}); move it aside to start "
                "with an empty one, or restore it from a backup") from None
        except SealError as e:
            raise StoreError(f"{path}: {e} (key file {self.key_path})") from None
        self._depth = 0
        #: Exact count and bytes of the notifications each session is owed,
        #: kept as rows come and go; counted once, when first needed.
        self._owed: Dict[str, List[int]] = {}
        #: Exact count of each subscription's pending rows (as ``_owed``).
        self._sub_rows: Dict[Tuple[str, int], int] = {}
        #: Bytes of every stored notification (None: not counted yet).
        self._total: Optional[int] = None
        #: Each subscription's (ttl, max_count), read once.
        self._limit_cache: Dict[Tuple[str, int], Any] = {}
        #: Whether each session has more than one subscription (read once).
        self._several: Dict[str, bool] = {}
        #: Subscriptions holding more than their max_count, by less than
        #: ``_slack``: trimmed in one go when the slack is used up, or before
        #: anything reads what a session is owed (``_catch_up``).
        self._lagging: Set[Tuple[str, int]] = set()
        #: Notifications taken from sessions since the store opened, to stay
        #: under max_stored / max_stored_bytes, and under max_total_bytes
        #: (each counted once per session it was taken from), counted as
        #: their transaction commits (``_caps_uncommitted`` until then: a
        #: transaction rolled back dropped nothing).
        self.dropped_session_cap = 0
        self.dropped_total_cap = 0
        self._caps_uncommitted = [0, 0]
        #: Sessions whose capped subscriptions were checked since the store
        #: opened (a previous run may have left some beyond their cap).
        self._checked: Set[str] = set()
        #: What is in flight to connected clients: ``in_flight(session)``
        #: (None: all sessions) gives ranges ``(first, last)`` of notification
        #: ids written (or being written) to a client and not yet
        #: acknowledged. The caps neither count nor drop those rows: the
        #: client has them, and they go when acknowledged (or are sent again
        #: at its next join), so what a cap drops is exactly what no client
        #: of the session was given. Set by the proxy's core.
        self.in_flight: Callable[[Optional[str]], List[Tuple[int, int]]] = lambda _: []
        #: Notification ids dropped by the caps since ``take_cap_dropped``,
        #: by session (the core tells connected clients where the gap is).
        self._cap_dropped: Dict[str, List[int]] = {}

    def _a_sealed_value(self) -> Optional[Tuple[bytes, bytes]]:
        """One sealed value the database holds and its context, or None:
        keys first (few rows), a notification only if no keys are sealed."""
        mark = sqlite3.Binary(MARK)
        for row in self.db.execute(
                "SELECT 'keys:' || name, keys FROM sessions WHERE substr(keys, 1, ?) = ? "
                "UNION ALL SELECT 'keys:' || session || '/' || id, keys FROM subscriptions "
                "WHERE substr(keys, 1, ?) = ? LIMIT 1", (len(MARK), mark, len(MARK), mark)):
            return bytes(row[1]), row[0].encode("utf-8")
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(notifications)")}
        if "sealed" in columns:
            for (body,) in self.db.execute(
                    "SELECT body FROM notifications WHERE sealed = 1 LIMIT 1"):
                return bytes(body), b"notification"
        return None

    def _check_key(self, sealer: Optional[Sealer]) -> Sealer:
        """Refuse, in one line, a key file that does not open the database's
        sealed values, or a missing one where it holds some; make a new key
        file only for a database with nothing sealed (a new key there would
        open nothing, and would hide which file went missing)."""
        sealed = self._a_sealed_value()
        if sealer is None:
            if sealed is not None:
                raise StoreError(
                    f"{self.path}: its key file {self.key_path} is missing, and the "
                    "database holds values sealed with it (security keys or secure-only "
                    "notifications); put that key file back, or move the database aside "
                    "to start with an empty one")
            try:
                made = Sealer.from_file(self.key_path or "")
            except OSError as e:
                raise StoreError(f"{self.path}: cannot make its key file: {e}") from None
            assert made is not None
            return made
        if sealed is not None:
            try:
                sealer.open(*sealed)
            except SealError:
                raise StoreError(
                    f"{self.path}: the key file {self.key_path} is not the one its values "
                    "were sealed with; put the right key file back, or move the database "
                    "aside to start with an empty one") from None
        return sealer

    def _migrate(self) -> None:
        """Bring a database made by an earlier version up to this schema, and
        seal any keys it kept in clear."""
        # The expiry index holds only rows that expire (a row without a TTL
        # costs it nothing); an earlier database's full one goes.
        self.db.execute("DROP INDEX IF EXISTS pending_by_expiry")
        (layout,) = self.db.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'pending'").fetchone()
        if "capped" not in layout:
            # An earlier layout (led by session and subscription, with a
            # second session-led index): copied into this one, once.
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(_PENDING.format(name="pending_new").replace(
                "IF NOT EXISTS ", ""))
            self.db.execute(
                "INSERT INTO pending_new "
                "(session, subscription, notification, expires, secure, capped) "
                "SELECT p.session, p.subscription, p.notification, p.expires, p.secure, "
                "EXISTS (SELECT 1 FROM subscriptions s WHERE s.session = p.session "
                "AND s.id = p.subscription AND s.max_count IS NOT NULL) FROM pending p")
            self.db.execute("DROP TABLE pending")
            self.db.execute("ALTER TABLE pending_new RENAME TO pending")
            self.db.execute("COMMIT")
        added = set()
        for table, column, declaration in _ADDED_COLUMNS:
            columns = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            if column not in columns:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                added.add((table, column))
        if ("notifications", "sealed") in added:
            self._seal_secure_only()
        clear = [(name, keys) for name, keys in self.db.execute(
            "SELECT name, keys FROM sessions WHERE keys IS NOT NULL")
            if not bytes(keys).startswith(b"\x00")]
        subs = [(session, sub, keys) for session, sub, keys in self.db.execute(
            "SELECT session, id, keys FROM subscriptions WHERE keys IS NOT NULL")
            if not bytes(keys).startswith(b"\x00")]
        if clear or subs:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany("UPDATE sessions SET keys = ? WHERE name = ?",
                                [(self._seal_keys(n, k), n) for n, k in clear])
            self.db.executemany("UPDATE subscriptions SET keys = ? WHERE session = ? AND id = ?",
                                [(self._seal_keys(f"{s}/{i}", k), s, i) for s, i, k in subs])
            self.db.execute("COMMIT")

    def _seal_secure_only(self) -> None:
        """A database from before notifications were sealed kept every body
        in clear: seal those that only secure matches are owed, as a store
        does now (once, when the ``sealed`` column is added)."""
        rows = self.db.execute(
            "SELECT n.id, n.body FROM notifications n WHERE n.sealed = 0 "
            "AND EXISTS (SELECT 1 FROM pending p WHERE p.notification = n.id) "
            "AND NOT EXISTS (SELECT 1 FROM pending p WHERE p.notification = n.id "
            "AND p.secure = 0)").fetchall()
        if not rows:
            return
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany(
            "UPDATE notifications SET body = ?, sealed = 1 WHERE id = ?",
            [(self.sealer.seal(bytes(body), b"notification"), note) for note, body in rows])
        self.db.execute("COMMIT")
        self.sealed_at_open = len(rows)

    def _seal_keys(self, owner: str, keys: Optional[bytes]) -> Optional[bytes]:
        if keys is None:
            return None
        return self.sealer.seal(bytes(keys), b"keys:" + owner.encode("utf-8"))

    def _open_keys(self, owner: str, keys: Optional[bytes]) -> Optional[bytes]:
        return self.sealer.open(keys, b"keys:" + owner.encode("utf-8"))

    def _limits(self, session: str, sub_id: int) -> Optional[Tuple[Any, Any, Any]]:
        """A subscription's (ttl, max_count, row count at which its oldest
        are trimmed), or None if it does not exist."""
        key = (session, sub_id)
        if key in self._limit_cache:
            return self._limit_cache[key]
        row = self.db.execute("SELECT ttl, max_count FROM subscriptions "
                              "WHERE session = ? AND id = ?", key).fetchone()
        found = None if row is None else (
            row[0], row[1], None if row[1] is None else row[1] + _slack(row[1]))
        if len(self._limit_cache) > 100_000:
            self._limit_cache.clear()
        self._limit_cache[key] = found
        return found

    def _write(self, sql: str, args: Any = ()) -> Any:
        return self.db.execute(sql, args)

    def hold(self) -> None:
        """Open a transaction that ``release`` commits: what is stored in
        between is committed together (the proxy holds one per reactor
        turn, so one read of many notifications costs one commit)."""
        if self._depth == 0:
            self._begin()
        self._depth += 1

    def release(self) -> None:
        """Commit what ``hold`` opened (StoreFailed: it was rolled back)."""
        self._depth -= 1
        if self._depth == 0:
            self._commit()

    def _begin(self) -> None:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if _cannot_write(e):
                raise StoreFailed(str(e)) from None
            raise

    def _commit(self) -> None:
        try:
            self.db.execute("COMMIT")
        except sqlite3.OperationalError as e:
            self._rolled_back()
            if _cannot_write(e):
                raise StoreFailed(str(e)) from None
            raise
        self._count_caps()

    def _count_caps(self, session_cap: int = 0, total_cap: int = 0) -> None:
        """Notifications the caps took: counted now if nothing can roll
        them back, else once the transaction commits."""
        uncommitted = self._caps_uncommitted
        uncommitted[0] += session_cap
        uncommitted[1] += total_cap
        if not self.db.in_transaction:
            self.dropped_session_cap += uncommitted[0]
            self.dropped_total_cap += uncommitted[1]
            uncommitted[:] = [0, 0]

    def _rolled_back(self) -> None:
        """The transaction is gone: counts are made again from what is there."""
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")
        self._caps_uncommitted[:] = [0, 0]
        self._cap_dropped.clear()   # the rows they were are back
        self._owed.clear()
        self._sub_rows.clear()
        self._several.clear()
        self._checked.clear()       # trims may be undone: look again
        self._total = None

    def abandon(self) -> None:
        """Roll back whatever transaction is open (after StoreFailed inside
        ``hold``), and forget the holds."""
        self._depth = 0
        self._rolled_back()

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def batch(self) -> Iterator["Store"]:
        """One transaction for everything inside (nested: the outermost).
        A write the disk cannot take raises StoreFailed, with the outermost
        transaction rolled back."""
        if self._depth == 0:
            self._begin()
        self._depth += 1
        try:
            yield self
        except BaseException as e:
            self._depth -= 1
            if self._depth == 0:
                self._rolled_back()
            if isinstance(e, sqlite3.OperationalError) and _cannot_write(e):
                # (an outer batch rolls back as this passes through it; one
                # opened by ``hold`` must be given up with ``abandon``)
                raise StoreFailed(str(e)) from None
            raise
        self._depth -= 1
        if self._depth == 0:
            self._commit()

    # -- counts ---------------------------------------------------------------

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

    def _rows_of(self, key: Tuple[str, int]) -> int:
        """How many pending rows subscription ``key`` has (counted once)."""
        rows = self._sub_rows.get(key)
        if rows is None:
            index, only = self._capped_walk(key[0])
            rows = self._sub_rows[key] = self.db.execute(
                f"SELECT count(*) FROM pending p {index} WHERE p.session = ? "
                f"AND p.subscription = ? {only}", key).fetchone()[0]
        return rows

    def _has_several(self, session: str) -> bool:
        """Has the session more than one subscription?"""
        several = self._several.get(session)
        if several is None:
            several = self._several[session] = self.db.execute(
                "SELECT 1 FROM subscriptions WHERE session = ? LIMIT 1 OFFSET 1",
                (session,)).fetchone() is not None
        return several

    def _capped_walk(self, session: str) -> Tuple[str, str]:
        """How to walk one capped subscription's rows of ``session`` in
        arrival order: with only one subscription, its rows are the
        session's, in the table's own order; with several, by the index of
        capped rows (a row is in it, ``capped``, when its subscription has
        a maximum count and its session more than one subscription).
        Returns (index clause, condition on ``p``)."""
        if self._has_several(session):
            return "INDEXED BY pending_capped", "AND p.capped = 1"
        return "", ""

    def total_bytes(self) -> int:
        """Bytes of every stored notification (counted once, then kept)."""
        if self._total is None:
            self._total = self.db.execute(
                "SELECT coalesce(sum(length(body)), 0) FROM notifications").fetchone()[0]
        return self._total

    def _over_cap(self, session: str) -> bool:
        count, size = self._owed_of(session)
        return ((self.max_stored is not None and count > self.max_stored)
                or (self.max_stored_bytes is not None and size > self.max_stored_bytes))

    def _sizes(self, notes: Iterable[int]) -> Dict[int, int]:
        """Each notification's body length."""
        sizes: Dict[int, int] = {}
        for chunk, marks in _chunks(list(set(notes))):
            sizes.update(self.db.execute(f"SELECT id, length(body) FROM notifications "
                                         f"WHERE id IN ({marks})", chunk))
        return sizes

    def _remove_rows(self, rows: Sequence[Tuple[str, int, int]], whole: bool = False) -> None:
        """Delete these pending rows ``(session, subscription, notification)``
        with every count kept right, and the notifications nobody is owed any
        more. ``whole``: the rows are all a session has of each of their
        notifications (it is owed none of them after)."""
        if not rows:
            return
        self.db.executemany("DELETE FROM pending WHERE session = ? AND subscription = ? "
                            "AND notification = ?", rows)
        sub_rows = self._sub_rows
        for session, sub_id, _ in rows:
            key = (session, sub_id)
            count = sub_rows.get(key)
            if count is not None:
                sub_rows[key] = count - 1
        notes = {row[2] for row in rows}
        tracked = [(s, n) for s, n in {(row[0], row[2]) for row in rows} if s in self._owed]
        sizes = self._sizes(notes) if tracked or self._total is not None else {}
        still: Set[Tuple[str, int]] = set()
        if not whole:
            by_session: Dict[str, List[int]] = {}
            for session, note in tracked:
                by_session.setdefault(session, []).append(note)
            for session, session_notes in by_session.items():
                for chunk, marks in _chunks(session_notes):
                    still.update((session, n) for (n,) in self.db.execute(
                        "SELECT DISTINCT notification FROM pending WHERE session = ? "
                        f"AND notification IN ({marks})", (session, *chunk)))
        for session, note in tracked:
            if (session, note) not in still:
                owed = self._owed[session]
                owed[0] -= 1
                owed[1] -= sizes.get(note, 0)
        self._collect(notes, sizes)

    def _collect(self, candidates: Iterable[int], sizes: Optional[Dict[int, int]] = None) -> None:
        """Drop those of ``candidates`` no session is owed any more (by index)."""
        unique = list(set(candidates))
        if not unique:
            return
        owed: Set[int] = set()
        for chunk, marks in _chunks(unique):
            owed.update(n for (n,) in self.db.execute(
                f"SELECT DISTINCT notification FROM pending WHERE notification IN ({marks})",
                chunk))
        orphans = [n for n in unique if n not in owed]
        if not orphans:
            return
        if self._total is not None:
            if sizes is None or any(n not in sizes for n in orphans):
                sizes = self._sizes(orphans)
            self._total -= sum(sizes.get(n, 0) for n in orphans)
        self.db.executemany("DELETE FROM delivered WHERE notification = ?",
                            [(n,) for n in orphans])
        self.db.executemany("DELETE FROM notifications WHERE id = ?", [(n,) for n in orphans])

    # -- sessions and subscriptions -------------------------------------------

    def create_session(self, name: str, password: Optional[str] = None,
                       admin_password: Optional[str] = None,
                       now: Optional[float] = None) -> SessionRecord:
        """A new session (raises KeyError if the name is taken)."""
        join_hash = hash_password(password) if password is not None else None
        admin_hash = hash_password(admin_password) if admin_password is not None else None
        return self.add_session(name, join_hash, admin_hash, now)

    def add_session(self, name: str, join_hash: Optional[bytes],
                    admin_hash: Optional[bytes], now: Optional[float] = None,
                    creator: Optional[str] = None) -> SessionRecord:
        """``create_session`` with the password hashes already made;
        ``creator``: the host of the client creating it."""
        try:
            with self.batch():
                self.db.execute("INSERT INTO sessions (name, join_hash, admin_hash, last_seen, "
                                "creator) VALUES (?, ?, ?, ?, ?)",
                                (name, join_hash, admin_hash, now, creator))
        except sqlite3.IntegrityError:
            raise KeyError(f"session {name!r} exists") from None
        return SessionRecord(name, join_hash, admin_hash, None, 0, creator)

    def session(self, name: str) -> Optional[SessionRecord]:
        row = self.db.execute("SELECT name, join_hash, admin_hash, keys, dropped, creator, gaps "
                              "FROM sessions WHERE name = ?", (name,)).fetchone()
        if not row:
            return None
        return SessionRecord(row[0], row[1], row[2], self._open_keys(name, row[3]), row[4],
                             row[5], row[6])

    def sessions(self) -> List[str]:
        return [name for (name,) in self.db.execute("SELECT name FROM sessions ORDER BY name")]

    def seen(self, names: Iterable[str], now: float) -> None:
        """The sessions had a client at ``now`` (their idle time starts again)."""
        with self.batch():
            self.db.executemany("UPDATE sessions SET last_seen = ? WHERE name = ?",
                                [(now, name) for name in names])

    def idle_sessions(self, before: float, limit: int = 100) -> List[str]:
        """Up to ``limit`` sessions last seen before ``before`` (a session
        never seen counts as seen when the store first met it)."""
        return [name for (name,) in self.db.execute(
            "SELECT name FROM sessions WHERE last_seen < ? ORDER BY last_seen LIMIT ?",
            (before, limit))]

    def unseen_since(self, now: float) -> None:
        """Sessions from before idle times were kept count as seen ``now``."""
        if self.db.execute("SELECT 1 FROM sessions WHERE last_seen IS NULL LIMIT 1").fetchone():
            with self.batch():
                self.db.execute("UPDATE sessions SET last_seen = ? WHERE last_seen IS NULL",
                                (now,))

    def delete_session(self, name: str) -> None:
        """Forget the session, its subscriptions and what it is owed."""
        with self.batch():
            notes = [n for (n,) in self.db.execute(
                "SELECT DISTINCT notification FROM pending WHERE session = ?", (name,))]
            self.db.execute("DELETE FROM pending WHERE session = ?", (name,))
            self.db.execute("DELETE FROM delivered WHERE session = ?", (name,))
            self.db.execute("DELETE FROM sessions WHERE name = ?", (name,))
            self._collect(notes)
        self._forget_counts(name)

    def set_keys(self, name: str, keys: Optional[bytes]) -> None:
        """Keep the session's security keys (an encoded Keys, or None), sealed."""
        with self.batch():
            self.db.execute("UPDATE sessions SET keys = ? WHERE name = ?",
                            (self._seal_keys(name, keys), name))

    def put_subscription(self, session: str, sub_id: int, expression: str,
                         accept_insecure: bool = True, ttl: Optional[float] = None,
                         max_count: Optional[int] = None,
                         keys: Optional[bytes] = None, now: Optional[float] = None) -> None:
        """Add or replace a session's subscription (``ttl`` seconds and
        ``max_count`` notifications kept at most; None: no limit; ``keys``:
        its own security keys, encoded by the caller). Changed limits apply
        to what is kept already: expiry times are moved, and the oldest
        beyond a lowered count go. What has expired by ``now`` (default:
        the time of day) stays expired, swept or not: a longer TTL never
        brings back what a client was already told was gone."""
        before = self._limits(session, sub_id)
        self._limit_cache.pop((session, sub_id), None)
        had_several = before is not None or self._has_several(session)
        with self.batch():
            self.db.execute(
                "INSERT OR REPLACE INTO subscriptions "
                "(session, id, expression, accept_insecure, ttl, max_count, keys) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session, sub_id, expression, int(accept_insecure), ttl, max_count,
                 self._seal_keys(f"{session}/{sub_id}", keys)))
            if before is None:
                if not had_several:
                    # Perhaps its second: the rows of its capped subscription
                    # join their index (see _capped_walk).
                    self.db.execute(
                        "UPDATE pending SET capped = 1 WHERE session = ? AND capped = 0 "
                        "AND subscription IN (SELECT id FROM subscriptions WHERE session = ? "
                        "AND max_count IS NOT NULL)", (session, session))
                self._several.pop(session, None)
                return
            if before[0] != ttl:
                self.db.execute(
                    "UPDATE pending SET expires = (SELECT arrived FROM notifications n "
                    "WHERE n.id = pending.notification) + ? WHERE session = ? "
                    "AND subscription = ? AND (expires IS NULL OR expires > ?)",
                    (ttl, session, sub_id, time.time() if now is None else now))
            if (before[1] is None) != (max_count is None):
                self.db.execute("UPDATE pending SET capped = ? WHERE session = ? "
                                "AND subscription = ?", (int(max_count is not None), session,
                                                         sub_id))
                self._sub_rows.pop((session, sub_id), None)
            if max_count is not None and before[1] != max_count:
                self._trim_subscription(session, sub_id, max_count)

    def remove_subscription(self, session: str, sub_id: int) -> None:
        """Forget a subscription and what was kept for it alone."""
        with self.batch():
            self.db.execute("DELETE FROM subscriptions WHERE session = ? AND id = ?",
                            (session, sub_id))
            rows = [(session, sub_id, n) for (n,) in self.db.execute(
                "SELECT notification FROM pending WHERE session = ? AND subscription = ?",
                (session, sub_id))]
            self._remove_rows(rows)
        self._limit_cache.pop((session, sub_id), None)
        self._sub_rows.pop((session, sub_id), None)
        self._lagging.discard((session, sub_id))
        # (rows left in the capped index by a session back to one
        # subscription are still found: _capped_walk then walks them all)
        self._several.pop(session, None)

    def _forget_counts(self, session: str) -> None:
        self._owed.pop(session, None)
        self._several.pop(session, None)
        self._lagging = {key for key in self._lagging if key[0] != session}
        for key in [k for k in self._limit_cache if k[0] == session]:
            del self._limit_cache[key]
        for key in [k for k in self._sub_rows if k[0] == session]:
            del self._sub_rows[key]

    def subscriptions(self, session: str) -> List[Tuple[int, str, bool, Optional[float],
                                                        Optional[int]]]:
        """``(id, expression, accept_insecure, ttl, max_count)`` per subscription."""
        return [(i, e, bool(a), t, m) for i, e, a, t, m in self.db.execute(
            "SELECT id, expression, accept_insecure, ttl, max_count FROM subscriptions "
            "WHERE session = ? ORDER BY id", (session,))]

    def subscription_keys(self, session: str) -> Dict[int, Optional[bytes]]:
        """Each of the session's subscriptions' own keys (as put)."""
        return {sub_id: self._open_keys(f"{session}/{sub_id}", keys) for sub_id, keys in
                self.db.execute("SELECT id, keys FROM subscriptions WHERE session = ?",
                                (session,))}

    def newest_notification(self) -> int:
        """The id of the newest stored notification (0: none)."""
        return self.db.execute("SELECT coalesce(max(id), 0) FROM notifications").fetchone()[0]

    def largest_subscription_id(self) -> int:
        """The largest subscription id in use (0: none), to number new ones."""
        return self.db.execute("SELECT coalesce(max(id), 0) FROM subscriptions").fetchone()[0]

    def stored_count(self, session: str) -> int:
        """How many notifications the session is owed (expired or not)."""
        self._catch_up([session])
        return self._owed_count(session)

    def unexpired_count(self, session: str, now: float) -> int:
        """``stored_count`` less what has expired but not been swept yet
        (what a joining client is told it will get). The expired rows are
        found by the expiry index, so this costs what the sweep has left,
        not the session's size; a notification also owed unexpired through
        another subscription still counts."""
        expired = self.db.execute(
            "SELECT count(DISTINCT p.notification) FROM pending p "
            "INDEXED BY pending_by_expiry_set "
            "WHERE p.expires IS NOT NULL AND p.expires <= ? AND p.session = ? "
            "AND NOT EXISTS (SELECT 1 FROM pending q WHERE q.session = p.session "
            "AND q.notification = p.notification AND (q.expires IS NULL OR q.expires > ?))",
            (now, session, now)).fetchone()[0]
        return max(0, self.stored_count(session) - expired)

    def _catch_up(self, sessions: Optional[Iterable[str]] = None) -> None:
        """Trim the subscriptions of ``sessions`` (None: all) still beyond
        their max_count, so that whatever reads sees the limits exact."""
        if sessions is None:
            lagging = list(self._lagging)
        else:
            wanted = set(sessions)
            lagging = [key for key in self._lagging if key[0] in wanted]
            for session in wanted - self._checked:
                self._checked.add(session)
                lagging += [(session, sub_id) for (sub_id,) in self.db.execute(
                    "SELECT id FROM subscriptions WHERE session = ? AND max_count IS NOT NULL",
                    (session,))]
        if not lagging:
            return
        with self.batch():
            for key in lagging:
                found = self._limits(*key)
                if found is not None and found[1] is not None:
                    self._trim_subscription(key[0], key[1], found[1])
                self._lagging.discard(key)

    # -- notifications -------------------------------------------------------

    def store(self, attributes: Any, matches: Mapping[str, Any],
              now: float) -> Optional[int]:
        """Keep one copy of a notification for the sessions' subscriptions
        in ``matches`` (``{session: [subscription ids]}``, or ``{session:
        {subscription id: matched securely}}``); returns its id, or None if
        no subscription named there exists. ``attributes``: a mapping, or
        its encoding (``packets.encode_attributes``) when already made.
        One that matched only securely (through keys) is sealed."""
        if isinstance(attributes, (bytes, bytearray)):
            body = bytes(attributes)
        else:
            body = packets.encode_attributes(attributes)
        with self.batch():
            rows = []
            for session, sub_ids in matches.items():
                secure_of = (sub_ids if isinstance(sub_ids, collections.abc.Mapping)
                             else dict.fromkeys(sub_ids, True))
                for sub_id, secure in secure_of.items():
                    found = self._limits(session, sub_id)
                    if found is not None:
                        rows.append((session, sub_id, found[0], found[1], int(bool(secure)),
                                     found[2]))
            if not rows:
                return None
            sealed = all(row[4] for row in rows)
            kept = self.sealer.seal(body, b"notification") if sealed else body
            cursor = self.db.execute("INSERT INTO notifications (arrived, body, sealed) "
                                     "VALUES (?, ?, ?)", (now, kept, int(sealed)))
            note = cursor.lastrowid
            assert note is not None
            self.db.executemany(
                "INSERT INTO pending (session, subscription, notification, expires, secure, "
                "capped) VALUES (?, ?, ?, ?, ?, ?)",
                [(session, sub_id, note, None if ttl is None else now + ttl, secure,
                  0 if max_count is None or not self._has_several(session) else 1)
                 for session, sub_id, ttl, max_count, secure, _ in rows])
            size = len(kept)
            if self._total is not None:
                self._total += size
            sessions = {row[0] for row in rows}
            for session in sessions:
                owed = self._owed.get(session)
                if owed is not None:
                    owed[0] += 1
                    owed[1] += size
            sub_rows = self._sub_rows
            for session, sub_id, _, max_count, _, trim_at in rows:
                key = (session, sub_id)
                count = sub_rows.get(key)
                if count is not None:
                    count += 1
                    sub_rows[key] = count
                elif max_count is None:
                    continue
                else:
                    count = self._rows_of(key)
                if max_count is not None and count > max_count:
                    # At the cap: the oldest go _slack at a time, as one
                    # range (_trim_subscription); readers see the cap exact
                    # (_catch_up).
                    if count > trim_at:
                        self._trim_subscription(session, sub_id, max_count)
                    else:
                        self._lagging.add(key)
            if self.max_stored is not None or self.max_stored_bytes is not None:
                for session in sessions:
                    if self._over_cap(session):
                        self._trim_session(session)
            if self.max_total_bytes is not None and self.total_bytes() > self.max_total_bytes:
                self._trim_total()
        return note

    def _trim_subscription(self, session: str, sub_id: int, max_count: int) -> None:
        """Drop the subscription's oldest rows beyond ``max_count``: its row
        count is kept, so the oldest it keeps is found by one walk of its
        rows (``_capped_walk``), and what goes is one range of them, deleted
        (with the notifications nobody else is owed) by one statement per
        table, with no row handled in Python."""
        key = (session, sub_id)
        self._lagging.discard(key)
        count = self._rows_of(key)
        if count <= max_count:
            return
        index, only = self._capped_walk(session)
        found = self.db.execute(
            f"SELECT p.notification FROM pending p {index} WHERE p.session = ? "
            f"AND p.subscription = ? {only} ORDER BY p.notification LIMIT 1 OFFSET ?",
            (session, sub_id, count - max_count - 1)).fetchone()
        if found is None:               # fewer rows than its count: count again
            self._sub_rows.pop(key, None)
            if self._rows_of(key) > max_count:
                self._trim_subscription(session, sub_id, max_count)
            return
        args = (session, sub_id, found[0])
        span = (f"FROM pending p {index} WHERE p.session = ? AND p.subscription = ? {only} "
                "AND p.notification <= ?")
        owed = self._owed.get(session)
        if owed is not None:
            # The session is owed no more what no other subscription of it
            # keeps (nothing, if it has no other subscription).
            gone, size = self.db.execute(
                "SELECT total(1), total(length(n.body)) " + span.replace(
                    " WHERE ", " JOIN notifications n ON n.id = p.notification WHERE ", 1) +
                (" AND NOT EXISTS (SELECT 1 FROM pending q WHERE q.session = p.session "
                 "AND q.notification = p.notification AND q.subscription != p.subscription)"
                 if only else ""), args).fetchone()
            owed[0] -= int(gone)
            owed[1] -= int(size)
        # The notifications no other row keeps go with the range.
        orphans = ("SELECT p.notification " + span + " AND NOT EXISTS (SELECT 1 FROM pending r "
                   "WHERE r.notification = p.notification AND (r.session != p.session "
                   "OR r.subscription != p.subscription))")
        if self._total is not None:
            (size,) = self.db.execute(
                f"SELECT total(length(body)) FROM notifications WHERE id IN ({orphans})",
                args).fetchone()
            self._total -= int(size)
        if self.db.execute("SELECT 1 FROM delivered LIMIT 1").fetchone():
            self.db.execute(f"DELETE FROM delivered WHERE notification IN ({orphans})", args)
        self.db.execute(f"DELETE FROM notifications WHERE id IN ({orphans})", args)
        deleted = self.db.execute(
            f"DELETE FROM pending WHERE session = ? AND subscription = ? "
            f"{only.replace('p.', '')} AND notification <= ?", args).rowcount
        self._sub_rows[key] = count - deleted

    def _trim_session(self, session: str) -> None:
        """Drop the session's oldest notifications until it is within
        ``max_stored`` and ``max_stored_bytes``, not counting (nor dropping)
        those in flight to its connected clients (``in_flight``)."""
        self._catch_up([session])
        count, size = self._owed_of(session)
        spans = _merged(self.in_flight(session))
        for first, last in spans:
            held, held_size = self.db.execute(
                "SELECT count(*), total(length(body)) FROM notifications WHERE id IN "
                "(SELECT DISTINCT notification FROM pending WHERE session = ? "
                "AND notification BETWEEN ? AND ?)", (session, first, last)).fetchone()
            count -= held
            size -= int(held_size)

        def over_cap():
            return ((self.max_stored is not None and count > self.max_stored)
                    or (self.max_stored_bytes is not None and size > self.max_stored_bytes))
        over: List[int] = []
        walked = 0
        while over_cap():
            batch = 64
            if self.max_stored is not None and count > self.max_stored:
                batch = max(batch, count - self.max_stored)
            oldest = self.db.execute(
                "SELECT p.notification, length(n.body) FROM pending p "
                "JOIN notifications n ON n.id = p.notification WHERE p.session = ? "
                "AND p.notification > ? GROUP BY p.notification ORDER BY p.notification "
                "LIMIT ?", (session, walked, batch)).fetchall()
            if not oldest:
                break
            for note, note_size in oldest:
                walked = note
                if _within(spans, note):
                    continue
                if not over_cap():
                    break
                over.append(note)
                count -= 1
                size -= note_size
        if over:
            self._drop_notes(session, over)
            self._count_caps(session_cap=len(over))

    def _drop_notes(self, session: str, notes: Sequence[int]) -> None:
        """Take these notifications from the session, counted as dropped."""
        rows: List[Tuple[str, int, int]] = []
        for chunk, marks in _chunks(notes):
            rows += self.db.execute(
                "SELECT session, subscription, notification FROM pending WHERE session = ? "
                f"AND notification IN ({marks})", (session, *chunk)).fetchall()
        self._remove_rows(rows, whole=True)
        self.db.execute("UPDATE sessions SET dropped = dropped + ? WHERE name = ?",
                        (len(notes), session))
        self._cap_dropped.setdefault(session, []).extend(notes)

    def take_cap_dropped(self) -> Dict[str, List[int]]:
        """The ids the caps dropped since this was last asked, by session
        (then forgotten)."""
        dropped, self._cap_dropped = self._cap_dropped, {}
        return dropped

    def _trim_total(self) -> None:
        """Drop the oldest notifications of all until within ``max_total_bytes``,
        each counted as dropped by every session that was owed it; those in
        flight to a connected client (``in_flight``) are kept, and the rest
        must make room."""
        assert self.max_total_bytes is not None
        self._catch_up()
        spans = _merged(self.in_flight(None))
        held = 0                    # bytes in flight: outside the cap
        for first, last in spans:
            (size,) = self.db.execute("SELECT total(length(body)) FROM notifications "
                                      "WHERE id BETWEEN ? AND ?", (first, last)).fetchone()
            held += int(size)
        walked = 0
        while self.total_bytes() - held > self.max_total_bytes:
            excess = self.total_bytes() - held - self.max_total_bytes
            oldest: List[int] = []
            seen = 0
            for note, size in self.db.execute(
                    "SELECT id, length(body) FROM notifications WHERE id > ? ORDER BY id "
                    "LIMIT 256", (walked,)):
                seen += 1
                walked = note
                if _within(spans, note):
                    continue
                oldest.append(note)
                excess -= size
                if excess <= 0:
                    break
            if not seen:
                if not spans:
                    self._total = None      # counted wrong: count again next time
                return
            if not oldest:
                continue
            by_session: Dict[str, List[int]] = {}
            marks = ",".join("?" * len(oldest))
            for session, note in self.db.execute(
                    "SELECT DISTINCT session, notification FROM pending "
                    f"WHERE notification IN ({marks})", oldest):
                by_session.setdefault(session, []).append(note)
            for session, notes in by_session.items():
                self._drop_notes(session, notes)
                self._count_caps(total_cap=len(notes))
            self._collect(oldest)       # any kept for nobody

    def add_dropped(self, session: str, count: int, gaps: int = 0) -> None:
        """Count ``count`` more of the session's notifications as lost, of
        them ``gaps`` gaps of unknown size (each counted as one)."""
        with self.batch():
            self.db.execute("UPDATE sessions SET dropped = dropped + ?, gaps = gaps + ? "
                            "WHERE name = ?", (count, gaps, session))

    def take_dropped(self, session: str) -> Tuple[int, int]:
        """The session's drop count since this was last asked (then zero),
        and how many of it are gaps of unknown size (``add_dropped``)."""
        with self.batch():
            row = self.db.execute("SELECT dropped, gaps FROM sessions WHERE name = ?",
                                  (session,)).fetchone()
            if row and (row[0] or row[1]):
                self.db.execute("UPDATE sessions SET dropped = 0, gaps = 0 WHERE name = ?",
                                (session,))
        return (row[0], row[1]) if row else (0, 0)

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
        if limit <= 0:
            return []
        self._catch_up(sessions)
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
        bodies = {note: (arrived, self.sealer.open_body(body) if sealed else body)
                  for note, arrived, body, sealed in self.db.execute(
                      f"SELECT id, arrived, body, sealed FROM notifications "
                      f"WHERE id IN ({marks})", chosen)}
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
                in_sessions = ",".join("?" * len(sessions))
                rows: List[Tuple[str, int, int]] = []
                for chunk, in_ids in _chunks(ids):
                    rows += self.db.execute(
                        "SELECT session, subscription, notification FROM pending "
                        f"WHERE notification IN ({in_ids}) AND session IN ({in_sessions})",
                        (*chunk, *sessions)).fetchall()
                self.db.executemany(
                    f"DELETE FROM delivered WHERE notification = ? AND session IN ({in_sessions})",
                    [(n, *sessions) for n in ids])
                self._remove_rows(rows, whole=True)
            else:
                self.db.executemany("INSERT OR IGNORE INTO delivered "
                                    "(session, client, notification) VALUES (?, ?, ?)",
                                    [(session, client, n) for session in sessions
                                     for n in ids])

    def sweep(self, now: float, limit: int = 2000) -> Tuple[int, bool]:
        """Delete up to ``limit`` expired pending rows, found by the expiry
        index (work bounded however much is stored); returns how many went
        and whether more have expired."""
        with self.batch():
            rows = self.db.execute(
                "SELECT session, subscription, notification FROM pending "
                "WHERE expires IS NOT NULL AND expires <= ? ORDER BY expires LIMIT ?",
                (now, limit + 1)).fetchall()
            more = len(rows) > limit
            rows = rows[:limit]
            self._remove_rows(rows)
        return len(rows), more

    def counts(self) -> Dict[str, int]:
        """Rows per table (for statistics and tests)."""
        self._catch_up()
        return {table: self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("sessions", "subscriptions", "notifications", "pending",
                              "delivered")}
