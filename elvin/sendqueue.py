"""A per-client send queue bounded in bytes, with the drop policies of 7.5.1.

Packets wait here only while the client's socket is not draining (the
transport paused us). When a new packet would push the queue past its
limit, droppable packets (deliveries and quench notifications) are removed
as the client's ``Send-Queue.Drop-Policy`` says, and a DropWarn takes the
place of what was dropped, so the client learns where the gap is (5.4.6).
Replies (SubRply, Nack, ...) are never dropped: losing them would break the
session's state. A DropWarn marks a gap and does not count against the
limit (at most one stands between two surviving packets), so the newest
packet always fits under policy ``oldest``.
"""

import collections

from elvin.options import DropPolicy

__all__ = ["SendQueue", "QueueOverflow"]


class QueueOverflow(Exception):
    """The queue cannot take more and may not drop (policy ``none``)."""


class _Entry:
    __slots__ = ("data", "droppable", "dropwarn")

    def __init__(self, data, droppable, dropwarn=False):
        self.data = data
        self.droppable = droppable
        self.dropwarn = dropwarn


class SendQueue:
    """FIFO of encoded packets (``bytes``) with a byte limit and drop policy."""

    def __init__(self, max_bytes, policy, dropwarn_bytes):
        self.max_bytes = max_bytes
        self.policy = DropPolicy(policy)
        self._dropwarn = dropwarn_bytes
        self._entries = collections.deque()
        self.size = 0
        self.dropped = 0

    def __len__(self):
        return len(self._entries)

    def __bool__(self):
        return bool(self._entries)

    def configure(self, max_bytes, policy):
        self.max_bytes = max_bytes
        self.policy = DropPolicy(policy)

    def push(self, data, droppable):
        """Queue ``data``; returns how many packets were dropped to fit it.

        Raises QueueOverflow when the policy is ``none`` and it does not fit.
        """
        before = self.dropped
        if self.size + len(data) > self.max_bytes:
            if not droppable or self.policy != DropPolicy.NEWEST:
                self._make_room(len(data))
            if self.size + len(data) > self.max_bytes and droppable:
                if self.policy == DropPolicy.NONE:
                    raise QueueOverflow(
                        f"send queue over Send-Queue.Max-Length ({self.max_bytes} bytes) "
                        "with drop policy none")
                self.dropped += 1
                self._warn_at_tail()
                return self.dropped - before
        self._entries.append(_Entry(data, droppable))
        self.size += len(data)
        return self.dropped - before

    def _make_room(self, needed):
        if self.policy == DropPolicy.NONE:
            return
        entries = self._entries
        while self.size + needed > self.max_bytes:
            victim = self._choose_victim()
            if victim is None:
                return
            index = victim
            entry = entries[index]
            self.size -= len(entry.data)
            self.dropped += 1
            neighbour_warns = (index > 0 and entries[index - 1].dropwarn)
            if neighbour_warns:
                del entries[index]
            else:
                entries[index] = _Entry(self._dropwarn, False, True)

    def _choose_victim(self):
        entries = self._entries
        if self.policy == DropPolicy.LARGEST:
            best = None
            for i, entry in enumerate(entries):
                if entry.droppable and (best is None or len(entry.data) > len(entries[best].data)):
                    best = i
            return best
        if self.policy == DropPolicy.NEWEST:
            for i in range(len(entries) - 1, -1, -1):
                if entries[i].droppable:
                    return i
            return None
        for i, entry in enumerate(entries):
            if entry.droppable:
                return i
        return None

    def _warn_at_tail(self):
        if not (self._entries and self._entries[-1].dropwarn):
            self._entries.append(_Entry(self._dropwarn, False, True))

    def pop(self):
        """Remove and return the oldest packet's bytes."""
        entry = self._entries.popleft()
        if not entry.dropwarn:
            self.size -= len(entry.data)
        return entry.data

    def clear(self):
        self._entries.clear()
        self.size = 0
