"""A per-client send queue bounded in bytes, with the drop policies of 7.5.1.

Packets wait here only while the client's socket is not draining (the
transport paused us). When a new packet would push the queue past its
limit, droppable packets (deliveries and quench notifications) are removed
as the client's ``Send-Queue.Drop-Policy`` says, and a DropWarn takes the
place of what was dropped, so the client learns where the gap is (5.4.6).
Replies (SubRply, Nack, ...) are never dropped: losing them would break the
session's state. They may take the queue past its limit, but only up to
``REPLY_SLACK`` times it: a client that keeps sending requests without
reading the replies raises QueueOverflow whatever its policy (the router
disconnects it), so replies cannot grow a queue without bound. A DropWarn
marks a gap and does not count against the limit (at most one stands
between two surviving packets), so the newest packet always fits under
policy ``oldest``.

``QueueBudget`` caps the memory of all the queues that join it (a
router's ``max-queue-memory``); see its docstring. That memory is
``SendQueue.memory``: the packets' bytes plus what Python spends on each
queued packet besides (``ENTRY_OVERHEAD``), which for small deliveries is
most of it.
"""

import collections
import heapq

from elvin.core.options import DropPolicy

__all__ = ["SendQueue", "QueueOverflow", "QueueBudget", "REPLY_SLACK", "ENTRY_OVERHEAD"]

#: Replies (never dropped) may fill a queue up to this many times its limit.
REPLY_SLACK = 2

#: Bytes a queued packet (or DropWarn) costs besides its data, by drop
#: policy: the bytes object's header (33), its ``_Entry`` (80 with the
#: garbage collector's header), the victim index's reference (a deque
#: slot; for ``largest`` a heap tuple of three and its list slot), stale
#: references the index keeps until it is rebuilt, and the allocator's
#: rounding. tracemalloc counts 153 bytes (249 for ``largest``: test_overload
#: ``PacketCostTests``); a router's RSS grew by about 190 a packet.
ENTRY_OVERHEAD = {DropPolicy.OLDEST: 192, DropPolicy.NEWEST: 192, DropPolicy.NONE: 192,
                  DropPolicy.LARGEST: 288}


class QueueOverflow(Exception):
    """The queue cannot take more and may not drop (policy ``none``)."""


class _Entry:
    """A queued packet: a node of the queue's doubly linked list.

    ``droppable`` is cleared when the entry leaves the queue (sent,
    dropped or turned into a DropWarn), which is how the victim indexes
    below recognise stale references.
    """

    __slots__ = ("data", "droppable", "dropwarn", "prev", "next", "seq")

    def __init__(self, data, droppable, dropwarn=False, seq=0):
        self.data = data
        self.droppable = droppable
        self.dropwarn = dropwarn
        self.prev = self.next = None
        self.seq = seq


class SendQueue:
    """FIFO of encoded packets (``bytes``) with a byte limit and drop policy.

    Every operation is O(1) or O(log n), whatever the policy and however
    long the queue: the packets form a linked list, so one can be removed
    from the middle, and victims are found through an index kept per
    policy -- the droppable packets in order for ``oldest``/``newest``, a
    heap by size for ``largest`` -- whose stale references are discarded
    lazily and which is rebuilt before it can grow past twice the queue.
    (Scanning the queue for a victim would let one slow client with a big
    queue cost the router milliseconds per delivery.)
    """

    def __init__(self, max_bytes, policy, dropwarn_bytes):
        self.max_bytes = max_bytes
        self.policy = DropPolicy(policy)
        self._overhead = ENTRY_OVERHEAD[self.policy]
        self._dropwarn = dropwarn_bytes
        self._head = _Entry(b"", False)   # sentinel: head.next is the oldest
        self._head.prev = self._head.next = self._head
        self._count = 0
        self._seq = 0
        self._victims = collections.deque()   # oldest/newest: droppables in order
        self._heap = []                       # largest: (-size, seq, entry)
        #: bytes of the queued packets (DropWarns not counted), held to
        #: ``max_bytes``
        self.size = 0
        self.dropped = 0
        #: the QueueBudget this queue counts against, if any
        self.budget = None

    def __len__(self):
        return self._count

    @property
    def memory(self):
        """What the queue holds in memory, estimated: its packets' bytes and
        ``ENTRY_OVERHEAD`` for each entry (DropWarns too). What a
        QueueBudget counts."""
        return self.size + self._count * self._overhead

    def __bool__(self):
        return self._count > 0

    def configure(self, max_bytes, policy):
        self.max_bytes = max_bytes
        policy = DropPolicy(policy)
        if policy != self.policy:
            before = self.memory
            self.policy = policy
            self._overhead = ENTRY_OVERHEAD[policy]
            self._reindex()
            if self.budget is not None:
                self.budget.changed(0, self.memory - before)

    # -- the list ----------------------------------------------------------

    def _append(self, entry):
        head = self._head
        last = head.prev
        entry.prev, entry.next = last, head
        last.next = head.prev = entry
        self._count += 1

    def _unlink(self, entry):
        entry.prev.next = entry.next
        entry.next.prev = entry.prev
        entry.prev = entry.next = None
        self._count -= 1

    def _reindex(self):
        """Rebuild the victim index from the list (policy change, compaction)."""
        self._victims.clear()
        self._heap = []
        entry = self._head.next
        while entry is not self._head:
            if entry.droppable:
                self._index(entry)
            entry = entry.next
        if self.policy == DropPolicy.LARGEST:
            heapq.heapify(self._heap)

    def _index(self, entry):
        if self.policy == DropPolicy.LARGEST:
            self._heap.append((-len(entry.data), entry.seq, entry))
        else:
            self._victims.append(entry)

    # -- pushing and dropping -----------------------------------------------

    def push(self, data, droppable):
        """Queue ``data``; returns how many packets were dropped to fit it.

        Raises QueueOverflow when the policy is ``none`` and it does not fit,
        or when replies would fill more than REPLY_SLACK times the limit.
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
            if not droppable and self.size + len(data) > REPLY_SLACK * self.max_bytes:
                raise QueueOverflow(
                    f"replies waiting beyond {REPLY_SLACK} x Send-Queue.Max-Length "
                    f"({self.max_bytes} bytes): the client is not reading")
        self._seq += 1
        entry = _Entry(data, droppable, False, self._seq)
        self._append(entry)
        if droppable:
            if self.policy == DropPolicy.LARGEST:
                heapq.heappush(self._heap, (-len(data), entry.seq, entry))
                if len(self._heap) > 2 * self._count + 64:
                    self._reindex()
            else:
                self._victims.append(entry)
        self.size += len(data)
        if self.budget is not None:
            self.budget.changed(len(data), len(data) + self._overhead)
        return self.dropped - before

    def _make_room(self, needed):
        if self.policy == DropPolicy.NONE:
            return
        self._drop_until(self.max_bytes - needed)

    def shed(self, nbytes):
        """Drop deliveries, as the policy says, until ``nbytes`` of
        ``memory`` are freed (or nothing droppable is left); returns the
        memory freed. Policy ``none`` drops nothing."""
        if self.policy == DropPolicy.NONE:
            return 0
        before = self.memory
        self._drop_until(before - nbytes, by_memory=True)
        return before - self.memory

    def _drop_until(self, target, by_memory=False):
        """Drop until ``size`` (``memory``, if ``by_memory``) is at most
        ``target``, or nothing droppable is left."""
        size, count = self.size, self._count
        while (self.memory if by_memory else self.size) > target:
            entry = self._choose_victim()
            if entry is None:
                break
            self.size -= len(entry.data)
            self.dropped += 1
            entry.droppable = False
            # A DropWarn takes its place, unless one is already next to it
            # (and if one is on each side, one of them goes too).
            if entry.prev.dropwarn or entry.next.dropwarn:
                after = entry.next
                if entry.prev.dropwarn and after.dropwarn:
                    self._unlink(after)
                self._unlink(entry)
            else:
                entry.data = self._dropwarn
                entry.dropwarn = True
        if self.budget is not None:
            self.budget.changed(self.size - size,
                                self.size - size + (self._count - count) * self._overhead)

    def _choose_victim(self):
        """The next droppable entry the policy gives up, or None."""
        if self.policy == DropPolicy.LARGEST:
            heap = self._heap
            while heap:
                entry = heapq.heappop(heap)[2]
                if entry.droppable:
                    return entry
            return None
        victims = self._victims
        take = victims.pop if self.policy == DropPolicy.NEWEST else victims.popleft
        while victims:
            entry = take()
            if entry.droppable:
                return entry
        return None

    def _warn_at_tail(self):
        if not self._head.prev.dropwarn:
            self._append(_Entry(self._dropwarn, False, True))
            if self.budget is not None:
                self.budget.changed(0, self._overhead)

    # -- sending -----------------------------------------------------------

    def pop(self):
        """Remove and return the oldest packet's bytes."""
        entry = self._head.next
        if entry is self._head:
            raise IndexError("pop from an empty SendQueue")
        self._unlink(entry)
        if not entry.dropwarn:
            self.size -= len(entry.data)
            if self.budget is not None:
                self.budget.changed(-len(entry.data), -len(entry.data) - self._overhead)
        elif self.budget is not None:
            self.budget.changed(0, -self._overhead)
        entry.droppable = False
        if not self._count:
            self._victims.clear()
            self._heap = []
        elif self._victims and not self._victims[0].droppable:
            self._victims.popleft()
        return entry.data

    def clear(self):
        """Empty the queue; returns how many droppable packets (deliveries,
        quench notifications) it held: never written, so the owner can
        count them as lost."""
        lost = 0
        memory = self.memory
        entry = self._head.next
        while entry is not self._head:  # let the victim indexes see them gone
            lost += entry.droppable
            entry.droppable = False
            entry = entry.next
        self._head.prev = self._head.next = self._head
        self._count = 0
        self._victims.clear()
        self._heap = []
        if self.budget is not None:
            self.budget.changed(-self.size, -memory)
        self.size = 0
        return lost


class QueueBudget:
    """A cap on the memory of a set of SendQueues (router-wide).

    Each queue joins with ``join(queue, evict, shed=None)`` and keeps
    ``total`` (the queues' ``memory`` together: packet bytes and each
    packet's overhead) and ``bytes`` (their packets' bytes) up to date
    itself. When ``total`` is over ``max_bytes``, ``enforce()`` takes the
    queue holding most memory: it sheds deliveries by its own drop policy
    (with DropWarn, as if its own limit had been reached; ``shed(count)``
    is then told how many it dropped). A largest queue that can shed
    nothing (policy ``none``, or only replies left) is evicted: it leaves
    the budget, ``evict(queue)`` is called and must end that client (the
    router disconnects it, counting what the queue held), and the queue is
    emptied. This repeats until the total is a tenth under the cap, so
    that under sustained pressure the O(queues) search for the largest
    runs once per tenth of the cap queued, not once per packet.
    ``max_bytes`` of 0 means no cap.
    """

    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        #: estimated memory of the queues (what ``max_bytes`` caps)
        self.total = 0
        #: bytes of the packets waiting in them
        self.bytes = 0
        self.evictions = 0
        self._queues = {}

    def __len__(self):
        return len(self._queues)

    def changed(self, nbytes, memory):
        """A member queue's packet bytes changed by ``nbytes``, its memory
        by ``memory``."""
        self.bytes += nbytes
        self.total += memory

    def join(self, queue, evict, shed=None):
        queue.budget = self
        self.changed(queue.size, queue.memory)
        self._queues[queue] = (evict, shed)

    def leave(self, queue):
        if self._queues.pop(queue, None) is not None:
            self.changed(-queue.size, -queue.memory)
            queue.budget = None

    def over(self):
        return 0 < self.max_bytes < self.total

    def enforce(self):
        """Bring ``total`` under ``max_bytes``; returns how many were evicted."""
        evicted = 0
        if not self.over():
            return evicted
        target = self.max_bytes - self.max_bytes // 10
        while self.total > target and self._queues:
            queue = max(self._queues, key=lambda q: q.memory)
            if queue.size == 0:
                break
            evict, on_shed = self._queues[queue]
            dropped = queue.dropped
            freed = queue.shed(self.total - target)
            if on_shed is not None and queue.dropped > dropped:
                on_shed(queue.dropped - dropped)
            if freed > 0:
                continue
            self.leave(queue)
            evict(queue)
            queue.clear()
            evicted += 1
            self.evictions += 1
        return evicted
