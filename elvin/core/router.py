"""The router core: sessions, subscriptions and routing, with no I/O.

Sessions receive decoded packet objects from a transport and answer through
an *output* object the transport supplies (see ``SessionOutput``); the core
never touches sockets or the reactor, so it is tested by feeding packets.

A notification is decoded once by the transport, matched once per candidate
subscription, and its attributes are encoded once however many clients it
reaches; only the per-client subscription-id arrays differ.
"""

import abc
import collections
import enum
import itertools
import time
import weakref
from typing import Optional, TypedDict

from twisted.logger import Logger

from elvin import errors
from elvin.errors import SubscriptionError
from elvin.core.host import SessionHost
from elvin.core.index import SubscriptionIndex
from elvin.core.keys import CONSUMER, PRODUCER, SUPPORTED_KEY_SCHEMES, KeyRing
from elvin.core.lograte import LogLimiter
from elvin.core.options import ConnectionOptions, OPTIONS
from elvin.core.quench import QuenchEntry, QuenchRegistry, quench_cost
from elvin.core.sendqueue import QueueBudget
from elvin.protocols import packets
from elvin.subscription import Subscription
from elvin.subscription.ast import Kind, int32, node
from elvin.subscription.compiler import compile_tree
from elvin.subscription.lexer import more_tokens_than
from elvin.subscription.workbudget import PatternBudget, scans_strings
from elvin.values import OPAQUE, STRING, type_of

__all__ = ["Router", "RouterObserver", "ClientSession", "SessionState", "SessionOutput",
           "SessionHost", "SubscriptionEntry",
           "DISCONN_SHUTDOWN", "DISCONN_REDIRECT", "DISCONN_PROTOCOL_ERRORS",
           "CLIENT_PACKET_IDS", "notification_problem", "DEFAULT_MAX_QUEUE_MEMORY",
           "SEND_QUEUE_FULL", "QUEUE_MEMORY_FULL",
           "DEFAULT_MAX_SUBSCRIPTION_TOKENS", "DEFAULT_MAX_CLIENT_SUBSCRIPTION_BYTES",
           "DEFAULT_MAX_PATTERN_WORK", "DEFAULT_MAX_EVALUATION_BYTES",
           "DEFAULT_MAX_HEAVY_EVALUATION_BYTES", "DEFAULT_MAX_CLIENT_QUENCHES",
           "DEFAULT_MAX_SUBSCRIPTION_MEMORY",
           "DEFAULT_MAX_CLIENT_SUBSCRIPTION_MEMORY", "subscription_cost"]

DISCONN_SHUTDOWN = 1
DISCONN_REDIRECT = 2
DISCONN_PROTOCOL_ERRORS = 4

_DISCONN_CAUSES = {DISCONN_SHUTDOWN: "router shutdown",
                   DISCONN_REDIRECT: "redirected to another router",
                   DISCONN_PROTOCOL_ERRORS: "too many protocol errors"}

#: Protocol versions this router speaks (major, highest minor).
PROTOCOL_MAJOR = 4
PROTOCOL_MINOR = 0

#: Protocol errors (1xxx Nacks) within PROTOCOL_ERROR_WINDOW seconds after
#: which a client is disconnected (7.3.3); refused requests (2xxx) never count.
MAX_PROTOCOL_ERRORS = 50
PROTOCOL_ERROR_WINDOW = 10.0

#: Why deliveries to a client were dropped (``ClientSession.deliveries_dropped``):
#: its own send queue was full, or the router-wide queue memory was.
SEND_QUEUE_FULL = "send queue full"
QUEUE_MEMORY_FULL = "router-wide queue memory full"

#: Default router-wide cap on the bytes in all client send queues.
DEFAULT_MAX_QUEUE_MEMORY = 512 * 1024 * 1024

#: Most UTF-8 bytes of subscription expressions one client may hold at once;
#: 10,000 subscriptions of 200 bytes fit. (Their memory is the next caps'.)
DEFAULT_MAX_CLIENT_SUBSCRIPTION_BYTES = 2 * 1024 * 1024
#: What a placed subscription costs the router, estimated
#: (``subscription_cost``): a part for every subscription (its objects, its
#: place in the index, the router's and its client's tables, and for an
#: expression of a shape of its own the tree and evaluator that shape
#: needs), a part per attribute name it refers to, and a part per byte of
#: its text (its compiled form). Measured with tracemalloc
#: (test_router ``SubscriptionMemoryTests``, docs/reliability.md): 1.9 KB for
#: ``Flood == 7``, 3.0 KB for ``N17 == 1`` (a name no other subscription
#: has), 5.3 KB for a 180-byte expression of nine names, about 30 times the
#: text for a 4 KB one; the estimate errs high, at most about 2.5 times.
SUBSCRIPTION_BASE_COST = 2700
SUBSCRIPTION_NAME_COST = 150
SUBSCRIPTION_TEXT_COST = 30
#: The same for a subscription whose shape was seen before (placed from its
#: shape's recipe: the shape's tree and evaluator shared, its literals its
#: own): 1.8 KB measured for ``Flood == 7`` (each value a bucket of its
#: own), 1.3 KB for the Java load generator's 111-byte expressions of five
#: names (estimated 2.3 KB).
SHARED_SHAPE_BASE_COST = 1900
SHARED_SHAPE_TEXT_COST = 4
#: Most memory, estimated, of one client's subscriptions together: 10,000
#: subscriptions of 200 bytes fit (at most 13.7 KB each estimated, with 33
#: one-letter names).
DEFAULT_MAX_CLIENT_SUBSCRIPTION_MEMORY = 160 * 1024 * 1024
#: Most memory, estimated, of all the router's subscriptions together:
#: ``max-subscriptions`` (1,000,000) of the load generator's shape fit
#: (2.3 GB estimated, about 1.3 GB held).
DEFAULT_MAX_SUBSCRIPTION_MEMORY = 4 * 1024 * 1024 * 1024
#: String-matching work one client's subscriptions may do for one
#: notification (``elvin.subscription.workbudget``): pattern instructions
#: (or needles) times string bytes; about 50 ms at RE2's NFA rate, where
#: RE2's DFA or one scan per needle usually makes it a few milliseconds.
DEFAULT_MAX_PATTERN_WORK = 32 * 1024 * 1024
#: Expression bytes of one client's subscriptions evaluated for one
#: notification: evaluation costs up to about 30 ns an expression byte
#: (arithmetic in a long OR), so about 2 ms.
DEFAULT_MAX_EVALUATION_BYTES = 64 * 1024
#: Expression bytes of the heavy clients' subscriptions (those past
#: ``max_evaluation_bytes`` once) evaluated for one notification, all of
#: them together: two clients' budgets, about 4 ms at worst and about 1 ms
#: usually, whatever their number.
DEFAULT_MAX_HEAVY_EVALUATION_BYTES = 2 * DEFAULT_MAX_EVALUATION_BYTES
#: What looking in one heavy client's own index costs the heavy budget.
HEAVY_LOOKUP_BYTES = 256
#: Notifications in a row whose candidates of a heavy client, looked at in
#: full, fit its own ``max_evaluation_bytes`` before its subscriptions go
#: back among everyone's; doubled each time it is set apart again, up to
#: MAX_HEAVY_PROBATION, so a client whose costly notifications are rare
#: moves seldom (a move costs about 2 µs a subscription).
HEAVY_PROBATION = 10_000
MAX_HEAVY_PROBATION = 1_000_000
#: Quenches one client may hold: a subscription added, changed or removed
#: costs the router a visibility check per quench on its names, so one
#: client's 10,000 quenches on a name took every subscription change on it
#: from 0.3 to 13.6 ms.
DEFAULT_MAX_CLIENT_QUENCHES = 256
#: What a candidate costs beside its text (the call, reaching its objects).
EVALUATION_OVERHEAD_BYTES = 16
#: Candidates of one notification from which ``max_evaluation_bytes`` is
#: counted; fewer cost at most this many evaluations (the usual case, where
#: the index leaves a handful), and skip the count.
COUNT_EVALUATIONS_FROM = 16

#: Most tokens (names, literals, operators, brackets, commas) in one
#: subscription: parsing, checking and compiling cost 5-20 µs a token, so
#: this bounds what one request can hold the router for (about 0.3 s), while
#: ``equals(id, ...)`` with 5,000 ids (10,004 tokens) still fits.
DEFAULT_MAX_SUBSCRIPTION_TOKENS = 16384


class SessionOutput(abc.ABC):
    """What a transport gives a session to talk back with (an interface)."""

    @abc.abstractmethod
    def send(self, packet):
        """Queue ``packet`` (never dropped)."""

    @abc.abstractmethod
    def send_encoded(self, data, droppable):
        """Queue an already encoded packet; ``droppable`` for deliveries."""

    @abc.abstractmethod
    def is_idle(self):
        """True when nothing is waiting to be written to the client."""

    @abc.abstractmethod
    def configure(self, options):
        """Apply negotiated options (packet and send-queue limits)."""

    @abc.abstractmethod
    def close(self):
        """Flush what is queued, then close the channel."""

    @abc.abstractmethod
    def abort(self):
        """Close the channel at once (slow client, resources exhausted)."""

    def drop(self):
        """A protocol violation: read nothing more, write what was sent
        before (the Disconn saying why last), then close; a peer that does
        not read it all within a short time is cut off. By default, as
        ``abort``."""
        self.abort()

    def shed(self, packet):
        """The client does not read what it is sent: drop what is queued
        (counted), then write ``packet`` (a Disconn, or None) behind what
        was written, after a DropWarn if deliveries were dropped, and close
        so that what was written still reaches the client; one that does
        not read it within a short time is cut off, what is left unwritten
        then counted. By default, ``packet`` is sent and the channel
        aborted."""
        if packet is not None:
            self.send(packet)
        self.abort()

    #: Bytes read from and written to the channel (operations' counters).
    bytes_in = 0
    bytes_out = 0

    def queued_bytes(self):
        """Bytes waiting to be written to the client now."""
        return 0

    def hold(self):
        """Keep what is sent from now on in order, unwritten, until as many
        ``release`` calls: a reply must not reach the client before what
        it promises is true (``ClientSession._reply_in_force``). Returns
        False for a channel that cannot hold, which sends at once."""
        return False

    def release(self):
        """Undo one ``hold``; the last one writes what waited."""


class RouterStats(TypedDict):
    """What the router counts (``Router.stats``): declared, so that a
    reader (elvin.ops.status) naming a counter that is not here fails the
    type check instead of reading 0."""
    notifications: int
    deliveries: int
    unotify: int
    rejected_notifications: int
    connections: int
    dropped_deliveries: int
    slow_client_disconnections: int
    pattern_work_refusals: int
    evaluation_refusals: int
    dropwarns: int
    bytes_in: int
    bytes_out: int


class UdpCounters(TypedDict):
    """What one UDP listener counts of the datagrams it reads (summed over
    listeners by elvin.ops.status): declared for the same reason."""
    datagrams: int
    accepted: int
    incompatible: int
    rejected: int
    oversize: int
    malformed: int
    unexpected: int
    suppressed: int


class RouterObserver(abc.ABC):
    """What the router tells those who watch it (federation, for one):
    the narrow interface instead of the router knowing who they are."""

    @abc.abstractmethod
    def subscriptions_changed(self, entry):
        """Subscription ``entry`` was added or changed its expression, or
        was removed (then it is no longer in ``Router.subscriptions``)."""

    @abc.abstractmethod
    def notification_routed(self, attributes, deliver_insecure, keys, routing, source,
                            pulled):
        """A notification is being routed (``keys`` as the producer gave
        them; ``routing`` and ``source`` set when it came over a link).
        ``pulled``: the pulling sessions (see ``Router.set_pull_filter``)
        whose filter it satisfies, in no particular order."""

    @abc.abstractmethod
    def router_shutting_down(self):
        """The router is stopping."""

    def subscription_placed(self, entry, in_force):
        """A client's subscription ``entry`` was added, or its expression
        changed. Return True to have the client's SubRply wait until
        ``in_force()`` is called (once, later: never from here), when
        the subscription is in force wherever this observer carries it
        (federation: the peers acknowledged a pull filter that covers it).
        The default: in force at once."""
        return False


class SubscriptionEntry:
    """A registered subscription: who owns it, its compiled form, its keys."""

    __slots__ = ("id", "session", "subscription", "evaluate", "accept_insecure",
                 "keys")

    def __init__(self, sub_id, session, subscription, accept_insecure, keys):
        self.id = sub_id
        self.session = session
        self.subscription = subscription
        self.evaluate = subscription.evaluator
        self.accept_insecure = accept_insecure
        self.keys = keys


class PullEntry:
    """One disjunct of what a pulling session asks for, filed in the
    router's pull index the way a subscription is filed in its index, and
    shown to quenchers as a term (``QuenchRegistry.pull_added``): ``tree``
    is the disjunct (``_ALWAYS_TREE`` for everything), ``names`` the
    attribute names it refers to (empty: it wants everything)."""

    __slots__ = ("id", "session", "evaluate", "tree", "names")
    #: What the quench registry tells a pull from a subscription by.
    is_pull = True

    def __init__(self, entry_id, session, evaluate, tree, names):
        self.id = entry_id
        self.session = session
        self.evaluate = evaluate
        self.tree = tree
        self.names = names


def _always_true(attributes):
    return True


#: How a pull of everything is filed: no name or value selects it.
_ALWAYS_TREE = node(Kind.EQUALS, int32(1), int32(1))


class Router(SessionHost):
    """The routing core shared by every session and transport."""

    log = Logger()

    def __init__(self, option_specs=None, max_subscriptions=1_000_000,
                 max_connections=10_000, verbose=False,
                 max_queue_memory=DEFAULT_MAX_QUEUE_MEMORY,
                 max_protocol_errors=MAX_PROTOCOL_ERRORS,
                 protocol_error_window=PROTOCOL_ERROR_WINDOW, clock=time.monotonic,
                 max_subscription_tokens=DEFAULT_MAX_SUBSCRIPTION_TOKENS,
                 max_client_subscription_bytes=DEFAULT_MAX_CLIENT_SUBSCRIPTION_BYTES,
                 wall_clock=time.time, max_pattern_work=DEFAULT_MAX_PATTERN_WORK,
                 max_evaluation_bytes=DEFAULT_MAX_EVALUATION_BYTES,
                 max_client_quenches=DEFAULT_MAX_CLIENT_QUENCHES,
                 max_heavy_evaluation_bytes=DEFAULT_MAX_HEAVY_EVALUATION_BYTES,
                 max_subscription_memory=DEFAULT_MAX_SUBSCRIPTION_MEMORY,
                 max_client_subscription_memory=DEFAULT_MAX_CLIENT_SUBSCRIPTION_MEMORY):
        self.option_specs = dict(OPTIONS if option_specs is None else option_specs)
        #: Most tokens in one subscription expression (0: no limit).
        self.max_subscription_tokens = max_subscription_tokens
        #: Most bytes of expressions one client's subscriptions hold (0: no limit).
        self.max_client_subscription_bytes = max_client_subscription_bytes
        #: Most memory (``subscription_cost``) of all subscriptions, and of
        #: one client's (0: no limit); what they hold now.
        self.max_subscription_memory = max_subscription_memory
        self.max_client_subscription_memory = max_client_subscription_memory
        self.subscription_memory = 0
        #: Most string-matching work of one client's subscriptions on one
        #: notification (0: no limit; elvin.subscription.workbudget).
        self.max_pattern_work = max_pattern_work
        #: Most expression bytes of one client's subscriptions evaluated for
        #: one notification (0: no limit; ``_within_budgets``).
        self.max_evaluation_bytes = max_evaluation_bytes
        #: Most expression bytes of the heavy clients' subscriptions, all
        #: together, evaluated for one notification (0: no limit;
        #: ``_heavy_candidates``).
        self.max_heavy_evaluation_bytes = max_heavy_evaluation_bytes
        #: Most quenches one client may hold (0: no limit beyond
        #: Subscription.Max-Count).
        self.max_client_quenches = max_client_quenches
        #: A client making ``max_protocol_errors`` protocol errors within
        #: ``protocol_error_window`` seconds is disconnected (0: never).
        self.max_protocol_errors = max_protocol_errors
        self.protocol_error_window = protocol_error_window
        #: Seconds, monotonic; injected so the core stays free of the reactor.
        self.clock = clock
        #: Seconds since the epoch, for the times refusals are shown with.
        self.wall_clock = wall_clock
        self.max_subscriptions = max_subscriptions
        self.max_connections = max_connections
        #: Router-wide cap on bytes waiting in client send queues (0: none).
        self.queue_budget = QueueBudget(max_queue_memory)
        self.verbose = verbose
        self.sessions = set()
        self.subscriptions = {}
        self.index = SubscriptionIndex()
        #: The heavy clients (one of their notifications' candidates came
        #: to more than ``max_evaluation_bytes``): each one's subscriptions
        #: in an index of its own, out of ``index`` (``_set_apart``).
        self._heavy: dict = {}
        self._heavy_turn = 0
        #: Each heavy client's notifications in a row within its own budget
        #: (``_heavy_candidates``; at its probation it is light again).
        self._heavy_quiet: dict = {}
        #: Filters of pulling sessions (federation links), by disjunct.
        self.pull_index = SubscriptionIndex()
        self._pulls = {}
        #: Each pulling session's PatternBudget (elvin.subscription.workbudget).
        self._pull_budgets = {}
        self.quench = QuenchRegistry()
        self._sub_ids = itertools.count(1)
        self._quench_ids = itertools.count(1)
        self.closing = False
        #: While drained (``drain``): where clients are redirected.
        self.redirect_uri = None
        #: What watches the router (e.g. federation): see RouterObserver.
        self.observers = []
        self.stats: RouterStats = {"notifications": 0, "deliveries": 0, "unotify": 0,
                                   "rejected_notifications": 0, "connections": 0,
                                   "dropped_deliveries": 0, "dropwarns": 0,
                                   "slow_client_disconnections": 0,
                                   "pattern_work_refusals": 0, "evaluation_refusals": 0,
                                   "bytes_in": 0, "bytes_out": 0}
        #: Set by the layers that own them (the receive budget by
        #: elvin.protocols.framing, the reading turns' slice
        #: (elvin.protocols.turns) and the open-file admission by elvin.tap,
        #: each UDP listener's datagram counters by elvin.protocols.udp);
        #: declared here so that operations read them by name.
        self.receive_budget = None
        self.turn_slice = None
        self.admission = None
        #: Every UDP listener's counters (elvin.protocols.udp adds its own).
        self.udp_counters: list[UdpCounters] = []
        #: Nacks sent, by error code (for metrics: elvin.ops).
        self.nacks = collections.Counter()
        #: The latest refusals (Nacks, violations), newest last, for the
        #: status page: (time, peer, code, message).
        self.refusals = collections.deque(maxlen=50)
        self._ignored_log = LogLimiter(clock)

    # -- sessions -----------------------------------------------------------

    def notification_ignored(self, peer, problem):
        """A notification from ``peer`` was ignored (7.3.3): counted in
        ``stats["rejected_notifications"]``, logged at most once per 10 s."""
        self.stats["rejected_notifications"] += 1
        skipped = self._ignored_log.allow()
        if skipped is not None:
            self.log.info("ignored notification from {peer}: {problem}{more}", peer=peer,
                          problem=problem, more=self._ignored_log.more(skipped))

    def deliveries_lost(self, count):
        """``count`` deliveries a session was given were dropped or never
        written: counted at once (not when the session ends), so that the
        drops of a session already closing are counted too."""
        self.stats["dropped_deliveries"] += count

    def slow_client_disconnected(self):
        """A client was disconnected for not reading what it was sent."""
        self.stats["slow_client_disconnections"] += 1

    def open_session(self, output, peer=None):
        """A transport accepted a channel: make its session."""
        session = ClientSession(self, output, peer)
        self.sessions.add(session)
        return session

    def session_closed(self, session):
        if session in self.sessions:
            self.stats["bytes_in"] += getattr(session.output, "bytes_in", 0)
            self.stats["bytes_out"] += getattr(session.output, "bytes_out", 0)
        self.sessions.discard(session)
        self.quench.session_closed(session)
        for entry in list(session.subscriptions.values()):
            self._remove_entry(entry)
        session.subscriptions.clear()
        self._heavy.pop(session, None)
        self._heavy_quiet.pop(session, None)

    def new_options(self):
        return ConnectionOptions(self.option_specs, self.key_schemes(), COUNT_LIMITED_FIELDS)

    def key_schemes(self):
        return SUPPORTED_KEY_SCHEMES

    def drain(self, uri):
        """Hand every client over to the router at ``uri`` (Disconn 2, the
        spec's redirection): those connected now, and any that connect
        while the router stays drained. Returns how many were redirected."""
        self.redirect_uri = str(uri)
        moved = 0
        for session in list(self.sessions):
            if session.state == session.CONNECTED:
                session.disconnect(DISCONN_REDIRECT, self.redirect_uri)
                moved += 1
        self.log.info("drained: {n} clients redirected to {uri}", n=moved,
                      uri=self.redirect_uri)
        return moved

    def undrain(self):
        """Take clients again."""
        self.redirect_uri = None

    def shutdown(self):
        """Tell every connected client the router is closing (Disconn 1)."""
        self.closing = True
        for observer in list(self.observers):
            observer.router_shutting_down()
        for session in list(self.sessions):
            session.disconnect(DISCONN_SHUTDOWN, "router is shutting down")

    # -- subscriptions -------------------------------------------------------

    def add_subscription(self, session, subscription, accept_insecure, keys):
        if len(self.subscriptions) >= self.max_subscriptions:
            raise errors.ElvinError(errors.IMPL_LIMIT,
                                    "the router holds its maximum number of subscriptions")
        entry = SubscriptionEntry(next(self._sub_ids), session, subscription,
                                  accept_insecure, keys)
        self._meter(entry)
        self.subscriptions[entry.id] = entry
        self.subscription_memory += subscription_cost(subscription)
        self._heavy.get(session, self.index).add(entry)
        self.quench.subscription_added(entry)
        subscription.compact()
        self._subscriptions_changed(entry)
        return entry

    def _meter(self, entry):
        """Evaluate a subscription that scans strings under its client's
        PatternBudget (``elvin.subscription.workbudget``), made when first
        needed and kept on the session."""
        if not entry.subscription.reads_strings():
            return
        session = entry.session
        budget = session._pattern_budget
        if budget is None:
            def refused():
                self.stats["pattern_work_refusals"] += 1
                session.not_fully_evaluated(
                    "max-pattern-work", self.max_pattern_work,
                    "string tests (regex, wildcard, contains) of its subscriptions "
                    "needed more than", "the rest were not run")
            budget = session._pattern_budget = PatternBudget(self, refused)
        entry.evaluate = budget.metered(entry.subscription.evaluator)

    def modify_subscription(self, entry, subscription, keys, accept_insecure):
        """Change an entry (None keeps the expression); quenchers are told
        of a change, not of a request that changed nothing."""
        if (subscription is None and keys == entry.keys
                and accept_insecure == entry.accept_insecure):
            return
        token = self.quench.subscription_changing(entry)
        if subscription is not None:
            index = self._heavy.get(entry.session, self.index)
            index.remove(entry)
            self.subscription_memory += (subscription_cost(subscription)
                                         - subscription_cost(entry.subscription))
            entry.subscription = subscription
            entry.evaluate = subscription.evaluator
            self._meter(entry)
            index.add(entry)
            subscription.compact()
        entry.keys = keys
        entry.accept_insecure = accept_insecure
        self.quench.subscription_changed(entry, token)
        if subscription is not None:
            self._subscriptions_changed(entry)

    def _remove_entry(self, entry):
        if self.subscriptions.pop(entry.id, None) is None:
            return
        self.subscription_memory -= subscription_cost(entry.subscription)
        self._heavy.get(entry.session, self.index).remove(entry)
        self.quench.subscription_removed(entry)
        self._subscriptions_changed(entry)

    def _subscriptions_changed(self, entry):
        for observer in self.observers:
            observer.subscriptions_changed(entry)

    def remove_subscription(self, entry):
        self._remove_entry(entry)

    # -- pulling sessions ----------------------------------------------------

    def set_pull_filter(self, session, trees):
        """``session`` (a federation link, say) now pulls the notifications
        that make one of ``trees`` true (a tree may be ``True``: everything),
        replacing what it pulled before; ``[]`` stops it. Each tree is filed
        in ``pull_index`` like a subscription, so a notification evaluates
        only the disjuncts it could satisfy. Pulls are not subscriptions
        (observers' ``subscriptions_changed`` does not see them), but
        quenchers do: a pull is what the far side of a link wants, so each
        disjunct is a quench term (``QuenchRegistry.pull_added``). A
        disjunct the session pulled before keeps its entry and term id.
        """
        before = {}
        for entry in self._pulls.pop(session, ()):
            if entry.tree in before:          # the same disjunct twice
                self.pull_index.remove(entry)
                self.quench.pull_removed(entry)
            else:
                before[entry.tree] = entry
        entries = []
        for tree in trees:
            key = _ALWAYS_TREE if tree is True else tree
            entry = before.pop(key, None)
            if entry is None:
                if tree is True:
                    entry = PullEntry(next(self._sub_ids), session, _always_true,
                                      _ALWAYS_TREE, frozenset())
                else:
                    evaluate = compile_tree(tree).fn
                    if scans_strings(tree):
                        evaluate = self._pull_budget(session).metered(
                            evaluate, refused_means_true=True)
                    entry = PullEntry(next(self._sub_ids), session, evaluate,
                                      tree, frozenset(tree.names()))
                self.pull_index.add(entry, key)
                self.quench.pull_added(entry)
            entries.append(entry)
        for entry in before.values():
            self.pull_index.remove(entry)
            self.quench.pull_removed(entry)
        if entries:
            self._pulls[session] = entries
        else:
            self._pull_budgets.pop(session, None)

    def _pull_budget(self, session):
        """The PatternBudget of a pulling session's filter: a test it refuses
        makes the filter true, so the notification is passed on unfiltered
        (more than asked, never less); counted and logged."""
        budget = self._pull_budgets.get(session)
        if budget is None:
            limiter = LogLimiter(self.clock)

            def refused():
                self.stats["pattern_work_refusals"] += 1
                skipped = limiter.allow()
                if skipped is not None:
                    self.log.warn("pull filter of {peer}: string tests (regex, wildcard, "
                                  "contains) needed more than max-pattern-work ({limit}) "
                                  "for one notification; passed on without them{more}",
                                  peer=session, limit=self.max_pattern_work,
                                  more=limiter.more(skipped))
            budget = self._pull_budgets[session] = PatternBudget(self, refused)
        return budget

    def pulled_by(self, attributes):
        """The pulling sessions whose filter ``attributes`` satisfies."""
        if not self._pulls:
            return ()
        pulled = {}
        for entry in self.pull_index.candidates(attributes):
            if entry.session not in pulled and entry.evaluate(attributes) is True:
                pulled[entry.session] = True
        return pulled.keys()

    # -- routing -------------------------------------------------------------

    def route(self, attributes, deliver_insecure, keys=KeyRing.EMPTY,
              connection_keys=KeyRing.EMPTY, routing=(), source=None,
              forward_keys=KeyRing.EMPTY, emit_packet=None, attributes_end=0):
        """Deliver a (normalised) notification to every matching subscription.

        ``keys`` and ``connection_keys`` are the producer's prepared
        KeyRings (the notification's own and its connection's). A match is
        secure when either producer ring matches the subscription's keys or
        its connection's subscription keys; otherwise it is delivered
        insecurely only when both the notification allows it
        (``deliver_insecure``) and the subscription accepts it. Returns the
        number of clients it was delivered to. ``routing`` and ``source``
        are set for notifications that arrived over a federation link; the
        notification then goes on over every other link that wants it,
        carrying ``forward_keys``: the producer's keys as it gave them
        (unprepared), which is what a FedNotify holds (docs/federation.md).
        With ``attributes_end``, ``emit_packet[4:attributes_end]`` is the
        canonical encoding of ``attributes`` (the NotifyEmit they came in,
        ``packets.notify_emit_fields``): deliveries carry those bytes
        instead of encoding the attributes again.
        """
        self.stats["notifications"] += 1
        if self.observers:
            pulled = self.pulled_by(attributes)
            for observer in self.observers:
                observer.notification_routed(attributes, deliver_insecure, forward_keys,
                                             routing, source, pulled)
        matches = None      # made at the first match: most notifications have none
        keyed = ((keys is not _NO_KEYS and bool(keys))
                 or (connection_keys is not _NO_KEYS and bool(connection_keys)))
        candidates = self.index.candidates(attributes)
        over = None
        if len(candidates) > COUNT_EVALUATIONS_FROM and self.max_evaluation_bytes:
            candidates, over = self._within_budgets(candidates)
        if self._heavy:
            candidates.extend(self._heavy_candidates(attributes))
        if over:
            for session in over:
                self._set_apart(session)     # from the next notification on
        for entry in candidates:
            if entry.evaluate(attributes) is not True:
                continue
            if keyed and _secure(keys, connection_keys, entry):
                slot = 0
            elif deliver_insecure and entry.accept_insecure:
                slot = 1
            else:
                continue
            if matches is None:
                matches = {}
            found = matches.get(entry.session)
            if found is None:
                matches[entry.session] = found = ([], [])
            found[slot].append(entry.id)
        if matches is None:
            return 0
        body = (emit_packet[4:attributes_end] if attributes_end
                else packets.encode_attributes(attributes))
        for session, (secure, insecure) in matches.items():
            session.deliver(packets.encode_notify_deliver_from(body, secure, insecure))
        self.stats["deliveries"] += len(matches)
        return len(matches)

    def _within_budgets(self, candidates):
        """``candidates`` less those past their client's
        ``max_evaluation_bytes`` for this notification (each costs its
        expression's length plus EVALUATION_OVERHEAD_BYTES, in the index's
        order). A client left some out is told (``evaluation_refused``):
        one client's many subscriptions that only a name selects (``BY + 1
        == 2``) cost every notification carrying that name this much at
        most, not their number times their evaluation. Returns them, and
        those clients (set apart as heavy after this notification)."""
        limit = self.max_evaluation_bytes
        spent: dict = {}
        over: dict = {}
        kept = []
        keep = kept.append
        get = spent.get
        for entry in candidates:
            session = entry.session
            if session in over:
                continue
            cost = get(session, _OVERHEAD) + len(entry.subscription.expression)
            if cost > limit:
                over[session] = None
                continue
            spent[session] = cost + _OVERHEAD
            keep(entry)
        for session in over:
            self.stats["evaluation_refusals"] += 1
            session.not_fully_evaluated("max-evaluation-bytes", limit,
                                        "its subscriptions to evaluate came to more than",
                                        "the rest were skipped")
        return kept, over

    def _set_apart(self, session):
        """``session`` is heavy: its candidates for one notification came
        to more than its budget. Its subscriptions move to an index of its
        own, looked in after everyone else's (``_heavy_candidates``), so
        that a notification lists only as many of them as the heavy budget
        lets it evaluate, instead of every one for the other clients to
        wait on. It is light again (``_set_light``) once its subscriptions
        together fit its budget, or after its probation: that many
        notifications in a row within its budget."""
        if session in self._heavy or session.state == session.CLOSED:
            return
        own = SubscriptionIndex()
        for entry in session.subscriptions.values():
            if self.subscriptions.get(entry.id) is entry:
                self.index.move_to(entry, own)
        self._heavy[session] = own
        self._heavy_quiet[session] = 0
        session.heavy_probation = min(MAX_HEAVY_PROBATION,
                                      2 * session.heavy_probation if session.heavy_probation
                                      else HEAVY_PROBATION)
        self.log.info("client {peer}: its subscriptions set apart as heavy ({n}: more than "
                      "max-evaluation-bytes for one notification); with the other heavy "
                      "clients', at most max-heavy-evaluation-bytes ({limit}) of them "
                      "evaluated a notification", peer=session.peer,
                      n=len(session.subscriptions), limit=self.max_heavy_evaluation_bytes)

    def _set_light(self, session, why):
        """``session``'s subscriptions go back among everyone's
        (``_set_apart`` undone)."""
        own = self._heavy.pop(session)
        self._heavy_quiet.pop(session, None)
        for entry in session.subscriptions.values():
            if self.subscriptions.get(entry.id) is entry:
                own.move_to(entry, self.index)
        self.log.info("client {peer}: its subscriptions ({n}) back among everyone's: {why}",
                      peer=session.peer, n=len(session.subscriptions), why=why)

    def _heavy_candidates(self, attributes):
        """The heavy clients' candidates (``_set_apart``) that this
        notification may evaluate: in turn, a different client first each
        notification, each one's within ``max_evaluation_bytes`` and all
        together within ``max_heavy_evaluation_bytes`` (looking in a
        client's index costs ``HEAVY_LOOKUP_BYTES`` of it). A client with
        candidates left out, or not looked at once the budget is spent, is
        told as for its own budget (a DropWarn, ``evaluation_refusals``).
        A client looked at in full within its own budget counts towards its
        probation; one whose subscriptions all fit that budget is light at
        once."""
        heavy = list(self._heavy.items())
        count = len(heavy)
        first = self._heavy_turn % count
        self._heavy_turn += 1
        total = self.max_heavy_evaluation_bytes
        left = total if total else float("inf")
        limit = self.max_evaluation_bytes or float("inf")
        kept: list = []
        keep = kept.append
        cut = []
        light = []
        quiet = self._heavy_quiet
        for turn in range(first, first + count):
            session, own = heavy[turn % count]
            if (session.subscription_bytes
                    + _OVERHEAD * (len(session.subscriptions) + 1) <= limit):
                light.append((session, "together they fit max-evaluation-bytes"))
            if left <= 0:
                cut.append((session, False))
                continue
            left -= HEAVY_LOOKUP_BYTES
            allowance = min(limit, left)
            spent = 0
            for entry in own.candidates(attributes):
                cost = _OVERHEAD + len(entry.subscription.expression)
                if spent + cost > allowance:
                    cut.append((session, allowance == limit))
                    if allowance == limit:
                        quiet[session] = 0
                    break
                spent += cost
                keep(entry)
            else:
                if allowance == limit:
                    done = quiet[session] = quiet[session] + 1
                    if done >= session.heavy_probation:
                        light.append((session, f"{done} notifications in a row within "
                                               "max-evaluation-bytes"))
            left -= spent
        for session, own_limit in cut:
            self.stats["evaluation_refusals"] += 1
            if own_limit:
                session.not_fully_evaluated("max-evaluation-bytes", limit,
                                            "its subscriptions to evaluate came to more than",
                                            "the rest were skipped")
            else:
                session.not_fully_evaluated("max-heavy-evaluation-bytes", total,
                                            "the heavy clients' subscriptions to evaluate "
                                            "came to more than", "its candidates past it "
                                            "were skipped")
        for session, why in light:
            if session in self._heavy:
                self._set_light(session, why)
        return kept


_OVERHEAD = EVALUATION_OVERHEAD_BYTES


#: The empty key sets, told apart by identity on the per-notification path.
_NO_KEYS = KeyRing.EMPTY
_NO_WIRE_KEYS = packets.Keys.EMPTY


def _secure(keys, connection_keys, entry):
    for producer in (keys, connection_keys):
        if producer and (producer.matches(entry.keys)
                         or producer.matches(entry.session.sub_keys)):
            return True
    return False


class SessionState(enum.IntEnum):
    """Where a client session is in section 5.4's state machine."""

    NEW = 0          # channel open, nothing received yet
    CONNECTED = 1    # ConnRply sent: a session
    UNOTIFY = 2      # a session-less channel that has carried UNotify
    CLOSING = 3      # closing: nothing more is accepted or delivered
    CLOSED = 4       # the channel is gone


class ClientSession:
    """One client's session: the state machine of section 5.4.

    ``router`` is the host: what the state machine uses of it is declared
    by ``SessionHost`` (elvin.core.host), which the proxy implements too;
    the request handlers below ``_test_conn`` need a ``Router``."""

    log = Logger()

    NEW, CONNECTED, UNOTIFY, CLOSING, CLOSED = SessionState

    #: Deliveries (and quench notifications) dropped or never written, and
    #: of those, the ones still queued when the channel ended.
    dropped = 0
    discarded = 0
    #: Rate limits of this client's drop and refusal lines, and what they
    #: have yet to say: class defaults, set on a session only once needed
    #: (most never drop or are refused anything).
    _drop_log: Optional[LogLimiter] = None
    _refusal_log: Optional[LogLimiter] = None
    _drops_unlogged = 0
    _drop_logged_at: Optional[float] = None
    _slow = False
    #: Notifications in a row within its evaluation budget that make a
    #: heavy client light again (``Router._set_apart``); 0: never heavy.
    heavy_probation = 0
    #: Notifications not fully evaluated for this client (its PatternBudget,
    #: ``max-evaluation-bytes``), and that budget (made when first needed).
    unevaluated = 0
    _pattern_budget: Optional[PatternBudget] = None
    _pattern_log: Optional[LogLimiter] = None
    #: What Nacks call the host (the proxy's ProxyClient says "proxy").
    SERVER_NAME = "router"

    def __init__(self, router, output, peer=None):
        self.router = router
        self.output: SessionOutput = output
        self.peer = peer
        self.state = self.NEW
        self.options = router.new_options()
        self.subscriptions = {}
        #: UTF-8 bytes of the expressions of ``subscriptions`` together,
        #: held to the router's ``max_client_subscription_bytes``.
        self.subscription_bytes = 0
        #: Their memory, estimated (``subscription_cost``), held to the
        #: router's ``max_client_subscription_memory``.
        self.subscription_memory = 0
        #: Times of recent protocol errors (at most max_protocol_errors kept).
        self.protocol_errors = collections.deque(maxlen=router.max_protocol_errors or 1)
        self.dropped = 0
        self.nfn_keys = KeyRing.EMPTY
        #: The connection's notification keys as the client sent them
        #: (unprepared), forwarded with its notifications over federation.
        self.nfn_raw_keys = KeyRing.EMPTY
        self.sub_keys = KeyRing.EMPTY
        self.quenches = {}
        self._version_logged = False
        #: Why the session ended, logged once for sessions logged as connected.
        self.end_cause = None
        self._announced = False
        self._end_logged = False

    def __repr__(self):
        return f"<ClientSession {self.peer} state={self.state.name}>"

    # -- input ----------------------------------------------------------------

    def packet_received(self, packet):
        """Handle one decoded packet from the client."""
        if self.state in (self.CLOSING, self.CLOSED):
            return
        if type(packet) not in self.HANDLERS:
            self.violation(f"unexpected {type(packet).__name__} packet from client")
            return
        if type(packet) is packets.TestConn or type(packet) is packets.ConfConn:
            # 7.4.13: either side MAY send TestConn, so one is answered in
            # every state, before ConnRqst too; an unasked-for ConfConn is
            # harmless and ignored (both as Avis does).
            if type(packet) is packets.TestConn:
                self._test_conn(packet)
            return
        if getattr(packet, "xid", None) == 0:
            # 7.4: "the value zero is reserved, and MUST NOT be used": a
            # value that is incorrect, so a protocol error (7.3.3), Nacked
            # (with the xid it came with) and counted; the session goes on.
            self.protocol_error(0, errors.PROT_ERROR,
                                f"{type(packet).__name__} with xid 0, which is reserved "
                                "(client protocol 7.4)")
            return
        if self.state == self.NEW:
            if type(packet) is packets.ConnRqst:
                self._connect(packet)
            elif type(packet) is packets.UNotify:
                self.state = self.UNOTIFY
                self._unotify(packet)
            else:
                self.violation(f"{type(packet).__name__} before ConnRqst")
            return
        if self.state == self.UNOTIFY:
            if type(packet) is packets.UNotify:
                self._unotify(packet)
            else:
                self.violation(f"{type(packet).__name__} on a session-less channel")
            return
        if type(packet) is packets.ConnRqst or type(packet) is packets.UNotify:
            self.violation(f"{type(packet).__name__} on an established session")
            return
        self.HANDLERS[type(packet)](self, packet)

    def decode_failed(self, reason):
        """The transport could not unmarshal a packet: a protocol violation."""
        self.violation(f"undecodable packet: {reason}")

    def bad_utf8(self, pkt_id, xid, offset, reason):
        """A packet held a string that is not UTF-8 (at byte ``offset``).

        The spec gives this its own protocol error, BAD_UTF8 (1006, whose
        argument is the offset), so a request that may come now is Nacked
        with it and the session goes on (7.3.3), as for any other bad
        argument; a notification is ignored (7.3.3), counted like a
        repeated attribute name. ``xid``: the request's, or None when the
        packet was too short to hold one. Anything else (a request out of
        turn, a packet without strings) is the violation it would be."""
        if self.state in (self.CLOSING, self.CLOSED):
            return
        kind = _STRING_PACKETS.get(pkt_id)
        state = self.state
        if kind is packets.NotifyEmit and state == self.CONNECTED:
            self.ignore_notification(reason, counts=True)
        elif kind is packets.UNotify and state in (self.NEW, self.UNOTIFY):
            self.state = self.UNOTIFY
            self.ignore_notification(reason, counts=True)
        elif xid is not None and (kind is packets.ConnRqst and state == self.NEW or
                                  kind in _STRING_REQUESTS and state == self.CONNECTED):
            self.protocol_error(xid, errors.BAD_UTF8, f"{kind.__name__}: {reason}",
                                (offset,))
        else:
            self.decode_failed(reason)

    def notification_faulty(self, packet, problem):
        """A NotifyEmit or UNotify that decoded only by taking the last value
        of a repeated attribute name (``problem`` says which:
        ``packets.notification_repeating``). That is a protocol error in a
        notification, which 7.3.3 says to ignore: where the packet is one
        the client may send now, the notification is dropped, counted and
        logged (``SessionHost.notification_ignored``) and counts toward
        ``max_protocol_errors``, and the session goes on. Elsewhere it is
        the violation any such packet would be."""
        if self.state in (self.CLOSING, self.CLOSED):
            return
        kind = type(packet)
        if kind is packets.NotifyEmit and self.state == self.CONNECTED:
            self.ignore_notification(problem, counts=True)
        elif kind is packets.UNotify and self.state in (self.NEW, self.UNOTIFY):
            self.state = self.UNOTIFY
            if packet.client_major_version == PROTOCOL_MAJOR:  # else 7.4.1: discarded
                self.ignore_notification(problem, counts=True)
        else:
            self.violation(f"{kind.__name__} ({problem}) where the client may not send one")

    def ignore_notification(self, problem, counts=False):
        """7.3.3: a notification with a protocol error is ignored, not
        Nacked; ``counts``: toward ``max_protocol_errors`` too (a malformed
        one, not one over a negotiated limit)."""
        self.router.notification_ignored(self.peer, problem)
        if counts:
            self._count_protocol_error()

    def connection_lost(self, why="connection lost"):
        """The transport's channel ended (``why``, when nothing else said)."""
        self.ending(why)
        if self.state != self.CLOSED:
            self.state = self.CLOSED
            self.router.session_closed(self)
        if self._announced and not self._end_logged:
            self._end_logged = True
            self.log.info("client at {peer} disconnected: {cause}{losses}", peer=self.peer,
                          cause=self.end_cause, losses=self._losses(), dropped=self.dropped)

    def _losses(self):
        """What the end-of-session line adds: the deliveries this client
        lost and the refusals not logged, when there were any."""
        text = ""
        if self.dropped:
            text += f"; {_deliveries(self.dropped)} dropped"
            if self.discarded:
                text += f" ({self.discarded} of them lost with the channel)"
        if self.unevaluated:
            count = self.unevaluated
            text += (f"; {count} notification{'' if count == 1 else 's'} not fully "
                     f"evaluated (max-pattern-work, max-evaluation-bytes)")
        unlogged = self._refusal_log.suppressed if self._refusal_log is not None else 0
        if unlogged:
            text += f"; {unlogged} more rejected requests not logged"
        return text

    def ending(self, cause):
        """Record why this session ends (the first cause given wins); it is
        logged once, with the peer, when the channel is gone."""
        if self.end_cause is None:
            self.end_cause = cause

    # -- losses ---------------------------------------------------------------

    def deliveries_dropped(self, count, cause):
        """``count`` deliveries (or quench notifications) to this client were
        dropped and a DropWarn marks the gap; ``cause``: SEND_QUEUE_FULL or
        QUEUE_MEMORY_FULL. Counted, and logged with the client's policy:
        the first drop at once, then at most one line per LOG_INTERVAL
        with the count since the last, so a slow consumer cannot flood
        the log."""
        self.dropped += count
        self.router.deliveries_lost(count)
        self._drops_unlogged += count
        if self._drop_log is None:
            self._drop_log = LogLimiter(self.router.clock)
        if self._drop_log.allow() is None:
            return
        now, before = self.router.clock(), self._drop_logged_at
        since = "" if before is None else f" in the last {now - before:.0f} s"
        self._drop_logged_at = now
        unlogged, self._drops_unlogged = self._drops_unlogged, 0
        if cause == SEND_QUEUE_FULL:
            why = (f"its send queue is full (Send-Queue.Max-Length "
                   f"{self.options['Send-Queue.Max-Length']} bytes)")
        else:
            why = "the router-wide send queue memory (max-queue-memory) is full"
        self.log.warn("slow client {peer}: {dropped} dropped{since} ({total} since it "
                      "connected): {why}, Send-Queue.Drop-Policy {policy}; DropWarn sent",
                      peer=self.peer, dropped=_deliveries(unlogged), count=unlogged,
                      since=since, total=self.dropped, why=why,
                      policy=self.options["Send-Queue.Drop-Policy"])

    def deliveries_discarded(self, count):
        """``count`` deliveries to this client will never be written: they
        were queued when its channel was reset or lost. Counted; the line
        logging the session's end says how many."""
        self.dropped += count
        self.discarded += count
        self.router.deliveries_lost(count)

    def not_fully_evaluated(self, setting, limit, what, outcome):
        """A subscription of this client may have missed a notification
        because evaluating them all passed the router's ``setting``
        (``limit``; the router counts it): counted here, logged at most
        once per LOG_INTERVAL, and a DropWarn tells the client, as for a
        delivery dropped."""
        self.unevaluated += 1
        if self.state == self.CONNECTED:
            self.send(packets.DropWarn())
        limiter = self._pattern_log
        if limiter is None:
            limiter = self._pattern_log = LogLimiter(self.router.clock)
        skipped = limiter.allow()
        if skipped is not None:
            self.log.warn("client {peer}: {what} {setting} ({limit}) for one notification; "
                          "{outcome}, DropWarn sent ({total} notifications not fully "
                          "evaluated so far){more}", peer=self.peer, what=what,
                          setting=setting, limit=limit, outcome=outcome,
                          total=self.unevaluated, more=limiter.more(skipped))

    def slow_client(self, cause):
        """The client does not read what it is sent (``cause`` says how it
        showed): counted once, and the session's end line gives the cause.
        The session ends: a connected client is told why with Disconn 4
        (the one reason of 7.4.7 for the router ending a session because of
        the client's behaviour; its text says what), and its channel closes
        keeping what was already written (``SessionOutput.shed``)."""
        self.ending(f"slow client: {cause}")
        if not self._slow:
            self._slow = True
            self.router.slow_client_disconnected()
        packet = None
        if self.state == self.CONNECTED:
            packet = packets.Disconn(DISCONN_PROTOCOL_ERRORS, f"slow client: {cause}")
        if self.state not in (self.CLOSING, self.CLOSED):
            self.state = self.CLOSING
            self.router.session_closed(self)
        self.output.shed(packet)

    # -- output ---------------------------------------------------------------

    def deliver(self, data):
        if self.state == self.CONNECTED:
            self.output.send_encoded(data, True)
        elif self.state == self.CLOSING:
            # Matched before the session closed, in the same routing.
            self.deliveries_discarded(1)

    def send(self, packet):
        self.output.send(packet)

    def send_droppable(self, packet):
        """Quench notifications: may be dropped (with DropWarn) when congested."""
        if self.state == self.CONNECTED:
            self.output.send_encoded(packets.encode(packet), True)

    def nack(self, xid, code, message, args=()):
        self.router.nacks[code] += 1
        self.router.refusals.append((self.router.wall_clock(), self.peer, code, message))
        self.send(packets.Nack(xid, code, message, tuple(args)))

    def disconnect(self, reason, args=""):
        """Send Disconn and close (router shutdown, redirection, abuse)."""
        if self.state in (self.CLOSING, self.CLOSED):
            return
        self.ending(_DISCONN_CAUSES.get(reason, f"disconnected by the router "
                                                f"(reason {reason})"))
        if self.state == self.CONNECTED:
            self.send(packets.Disconn(reason, args))
        self._close()

    def _close(self):
        self.state = self.CLOSING
        self.router.session_closed(self)
        self.output.close()

    def violation(self, reason):
        """Section 7.3.2: the router MAY end the channel without a closure
        exchange. A connected client is told why first (Disconn 4, the
        code for protocol errors, with the reason), after the replies to
        what it sent before; then the channel is closed (``drop``)."""
        self.log.warn("protocol violation from {peer}: {reason}; closing",
                      peer=self.peer, reason=reason)
        self.ending(f"protocol violation: {reason}")
        if self.state == self.CONNECTED:
            self.send(packets.Disconn(DISCONN_PROTOCOL_ERRORS, f"protocol violation: {reason}"))
        if self.state != self.CLOSED:
            self.state = self.CLOSING
            self.router.session_closed(self)
        self.output.drop()

    def protocol_error(self, xid, code, message, args=()):
        """Nack a request and keep the session (7.3.3).

        Only protocol errors proper (1xxx codes: packets inconsistent with
        the session, such as deleting an unknown subscription) count toward
        disconnection, and only as a rate: a client that makes
        ``router.max_protocol_errors`` of them within
        ``router.protocol_error_window`` seconds is disconnected as a
        suspected denial of service. Refused requests (2xxx: a bad
        expression, a limit reached) are ordinary answers and never count.
        Each is logged, at most one line per LOG_INTERVAL per client
        (``_log_refusal``).
        """
        self._log_refusal("rejected request from {peer}: {reason}{more}", reason=message)
        self.nack(xid, code, message, args)
        if errors.PROT_ERROR <= code < errors.NO_SUCH_KEY:
            self._count_protocol_error()

    def _log_refusal(self, text, **fields):
        """Log a refusal of this client's request: the first at once, then
        at most one line per LOG_INTERVAL, saying how many were not logged
        (``{more}`` in ``text``), so that a client pipelining refused
        requests cannot flood the log; they are all counted as Nacks."""
        limiter = self._refusal_log
        if limiter is None:
            limiter = self._refusal_log = LogLimiter(self.router.clock)
        skipped = limiter.allow()
        if skipped is not None:
            self.log.info(text, peer=self.peer, more=limiter.more(skipped), **fields)

    def _count_protocol_error(self):
        """One more protocol error: too many too fast disconnect (Disconn 4)."""
        router = self.router
        if not router.max_protocol_errors or self.state in (self.CLOSING, self.CLOSED):
            return
        now = router.clock()
        recent = self.protocol_errors
        if recent.maxlen != router.max_protocol_errors:
            # The limit in force now (a reload may have changed it), the
            # newest errors kept.
            recent = self.protocol_errors = collections.deque(
                recent, maxlen=router.max_protocol_errors)
        recent.append(now)
        if len(recent) == recent.maxlen and now - recent[0] <= router.protocol_error_window:
            self.disconnect(DISCONN_PROTOCOL_ERRORS,
                            f"{len(recent)} protocol errors within "
                            f"{router.protocol_error_window:g} s (suspected denial of service)")

    # -- connection -----------------------------------------------------------

    def _admissible(self, packet):
        """The checks every ConnRqst passes first, at the router and the
        proxy alike: the host is not shutting down, the protocol version,
        the connection limit. Nacks (and closes, where asking again cannot
        help) and says False when one fails."""
        host = self.router
        if host.closing:
            self.nack(packet.xid, errors.IMPL_LIMIT, f"{self.SERVER_NAME} is shutting down")
            self._close()
            return False
        if packet.client_major_version != PROTOCOL_MAJOR:
            self._log_refusal("refused {peer}: protocol {major}.{minor}{more}",
                              major=packet.client_major_version,
                              minor=packet.client_minor_version)
            self.nack(packet.xid, errors.PROT_INCOMPAT,
                      f"protocol version {packet.client_major_version}."
                      f"{packet.client_minor_version} not supported "
                      f"(this {self.SERVER_NAME} speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR})")
            return False
        self._announced_version(packet)
        # (Counting is O(sessions): only done when it could reach the cap.)
        if len(host.sessions) > host.max_connections and sum(
                1 for s in host.sessions if s.state == s.CONNECTED) >= host.max_connections:
            self.nack(packet.xid, errors.IMPL_LIMIT, "too many connections")
            self._close()
            return False
        return True

    def _connect(self, packet):
        if not self._admissible(packet):
            return
        router = self.router
        # The keys are held to the Connection.Max-Keys this ConnRqst asks for.
        reply = self.options.negotiate(packet.options)
        nfn_keys = self._keys(packet.xid, packet.nfn_keys, PRODUCER, _CONNECTION_KEYS)
        sub_keys = self._keys(packet.xid, packet.sub_keys, CONSUMER, _CONNECTION_KEYS)
        if nfn_keys is None or sub_keys is None:
            return
        if len(nfn_keys) + len(sub_keys) > self.options["Connection.Max-Keys"]:
            self.protocol_error(packet.xid, errors.QOS_LIMIT,
                                "more keys than Connection.Max-Keys",
                                ("Connection.Max-Keys",))
            return
        self.nfn_keys, self.sub_keys = nfn_keys, sub_keys
        self.nfn_raw_keys = _raw(packet.nfn_keys)
        self.log.info("client connected from {peer}", peer=self.peer)
        router.stats["connections"] += 1
        self._established(packet.xid, reply)
        if router.redirect_uri is not None:
            # Drained: a session, then at once the redirection (7.4.4).
            self.disconnect(DISCONN_REDIRECT, router.redirect_uri)

    def _established(self, xid, reply):
        """A ConnRqst is admitted, at the router or the proxy alike: the
        output takes the negotiated options, the session is connected (its
        end will be logged) and ConnRply is sent with ``reply``, the
        options as negotiated."""
        self.output.configure(self.options)
        self.state = self.CONNECTED
        self._announced = True
        self.send(packets.ConnRply(xid, reply))

    def _too_many_keys(self, xid, keys):
        """Nack (and say True) when ``keys`` exceed Subscription.Max-Keys."""
        if len(keys) > self.options["Subscription.Max-Keys"]:
            self.protocol_error(xid, errors.QOS_LIMIT, "more keys than Subscription.Max-Keys",
                                ("Subscription.Max-Keys",))
            return True
        return False

    def _keys(self, xid, keys, role, option):
        """Prepare wire keys for ``role``, or Nack and return None. More
        keys than ``option`` (the limit of the request's kind) allows are
        refused before they are hashed: hashing a packet full of keys
        would stall the router."""
        if not keys:
            return KeyRing.EMPTY
        if keys.key_count() > self.options[option]:
            self.protocol_error(xid, errors.QOS_LIMIT, f"more keys than {option}", (option,))
            return None
        try:
            return KeyRing.from_wire(keys, role)
        except errors.ElvinError as e:
            self.protocol_error(xid, e.code, str(e), e.nack_args)
            return None

    def _announced_version(self, packet):
        """Note (once per channel, at debug level) a client's minor version.

        A later minor version is a compatible revision (the Go tools of
        cobaro/elvin announce 4.1): the client is served, in 4.0.
        """
        if self._version_logged:
            return
        self._version_logged = True
        self.log.debug("client at {peer} announced protocol {major}.{minor}; speaking "
                       "{ours}", peer=self.peer, major=packet.client_major_version,
                       minor=packet.client_minor_version,
                       ours=f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}")

    def _disconn_rqst(self, packet):
        self.send(packets.DisconnRply(packet.xid))
        self.ending("client closed the session (DisconnRqst)")
        self._close()

    def _test_conn(self, packet):
        if self.output.is_idle():
            self.send(packets.ConfConn())

    def _qos_rqst(self, packet):
        if type(packet.options) is packets.UnreadArray:
            # More entries than Attribute.Max-Count (there are 17 options):
            # left unread, as an over-long attribute list is.
            self.protocol_error(packet.xid, errors.QOS_LIMIT,
                                f"more options than Attribute.Max-Count or "
                                f"{ConnectionOptions.QOS_OPTIONS_FLOOR}, whichever is more "
                                f"({packet.options.limit})",
                                ("Attribute.Max-Count",))
            return
        # The ranges in force now: a ceiling lowered by a reload bounds what
        # a live session asks for next.
        self.options.specs = self.router.option_specs
        reply = self.options.negotiate(packet.options)
        self.output.configure(self.options)
        self.send(packets.QosRply(packet.xid, reply))

    def _sec_rqst(self, packet):
        xid = packet.xid
        prepared = [self._keys(xid, packet.add_nfn_keys, PRODUCER, _CONNECTION_KEYS),
                    self._keys(xid, packet.del_nfn_keys, PRODUCER, _CONNECTION_KEYS),
                    self._keys(xid, packet.add_sub_keys, CONSUMER, _CONNECTION_KEYS),
                    self._keys(xid, packet.del_sub_keys, CONSUMER, _CONNECTION_KEYS)]
        if any(ring is None for ring in prepared):
            return
        add_nfn, del_nfn, add_sub, del_sub = prepared
        # 7.4.8: adding a registered key or removing an unknown one is a
        # protocol error, and the change is atomic.
        if self.nfn_keys.intersects(add_nfn) or self.sub_keys.intersects(add_sub):
            self.protocol_error(xid, errors.KEY_EXISTS, "key already registered")
            return
        if not (self.nfn_keys.contains_all(del_nfn) and self.sub_keys.contains_all(del_sub)):
            self.protocol_error(xid, errors.NO_SUCH_KEY, "no such key to remove")
            return
        nfn_keys = self.nfn_keys.union(add_nfn).difference(del_nfn)
        sub_keys = self.sub_keys.union(add_sub).difference(del_sub)
        if len(nfn_keys) + len(sub_keys) > self.options["Connection.Max-Keys"]:
            self.protocol_error(xid, errors.QOS_LIMIT, "more keys than Connection.Max-Keys",
                                ("Connection.Max-Keys",))
            return
        quench = self.router.quench
        token = quench.keys_changing(self)
        self.nfn_keys, self.sub_keys = nfn_keys, sub_keys
        self.nfn_raw_keys = self.nfn_raw_keys.union(_raw(packet.add_nfn_keys)).difference(
            _raw(packet.del_nfn_keys))
        self.send(packets.SecRply(xid))
        quench.keys_changed(self, token)

    # -- quench ------------------------------------------------------------------

    def _qnch_add(self, packet):
        if not packet.names:
            self.protocol_error(packet.xid, errors.EMPTY_QUENCH,
                                "a quench needs at least one attribute name")
            return
        # A quench is "a set of named attributes" (section 5.4.4): one named twice in a
        # request is the same name, in QnchAddRqst as in QnchModRqst. More names
        # than Attribute.Max-Count, repeated or not, were left unread (an
        # UnreadArray: _quench_problem refuses it for its count).
        names = packet.names
        if type(names) is not packets.UnreadArray:
            names = tuple(dict.fromkeys(names))
        if self._quench_problem(packet.xid, names, len(self.quenches) + 1):
            return
        keys = self._keys(packet.xid, packet.keys, PRODUCER, _SUBSCRIPTION_KEYS)
        if keys is None:
            return
        if self._too_many_keys(packet.xid, keys):
            return
        router = self.router
        if len(router.quench) >= router.max_subscriptions:
            self.protocol_error(packet.xid, errors.IMPL_LIMIT,
                                "the router holds its maximum number of quenches")
            return
        quench = QuenchEntry(next(router._quench_ids), self, names,
                             packet.deliver_insecure, keys)
        if not router.quench.affordable(quench.cost):
            self._quench_memory_full(packet.xid)
            return
        self.quenches[quench.id] = quench
        self.send(packets.QnchRply(packet.xid, quench.id))
        router.quench.add(quench)

    def _qnch_mod(self, packet):
        quench = self.quenches.get(packet.quench_id)
        if quench is None:
            self.protocol_error(packet.xid, errors.NO_SUCH_QUENCH,
                                f"no such quench: {packet.quench_id}",
                                (_id_arg(packet.quench_id),))
            return
        # A list of more names than Attribute.Max-Count was left unread
        # (counted as sent, as in QnchAddRqst): no quench holds that many.
        for given in (packet.names_add, packet.names_del):
            if type(given) is packets.UnreadArray:
                most = self.options["Attribute.Max-Count"]
                self.protocol_error(packet.xid, errors.QOS_LIMIT,
                                    f"quench over Attribute.Max-Count ({most})",
                                    ("Attribute.Max-Count",))
                return
        # ATTR_EXISTS and NO_SUCH_ATTR are about the quench as it was: a
        # name given twice in one list is given once (see _qnch_add).
        names = set(quench.names)
        for name in dict.fromkeys(packet.names_add):
            if name in names:
                self.protocol_error(packet.xid, errors.ATTR_EXISTS,
                                    f"quench already has attribute {name!r}", (name,))
                return
            names.add(name)
        for name in dict.fromkeys(packet.names_del):
            if name not in names:
                self.protocol_error(packet.xid, errors.NO_SUCH_ATTR,
                                    f"quench has no attribute {name!r}", (name,))
                return
            names.discard(name)
        if not names:
            self.protocol_error(packet.xid, errors.EMPTY_QUENCH,
                                "the change would leave the quench with no names")
            return
        if self._quench_problem(packet.xid, packet.names_add, len(self.quenches),
                                len(names)):
            return
        if not self.router.quench.affordable(quench_cost(names), replacing=quench):
            self._quench_memory_full(packet.xid)
            return
        add_keys = self._keys(packet.xid, packet.add_keys, PRODUCER, _SUBSCRIPTION_KEYS)
        del_keys = self._keys(packet.xid, packet.del_keys, PRODUCER, _SUBSCRIPTION_KEYS)
        if add_keys is None or del_keys is None:
            return
        keys = quench.keys.union(add_keys).difference(del_keys)
        self.send(packets.QnchRply(packet.xid, quench.id))
        self.router.quench.modify(quench, names, packet.deliver_insecure, keys)

    def _quench_problem(self, xid, names, quenches, count=None):
        """Nack a quench that breaks this client's limits (True if so).

        The spec sets no limits on quenches; without them one client could
        register names without bound. A quench is held to the limits of a
        subscription: at most Subscription.Max-Count quenches per client,
        at most Attribute.Max-Count names in one (``count``, default the
        number of ``names``), and each of ``names`` (those it adds) no
        longer than Attribute.Name.Max-Length, as a notification's.
        """
        most = self.router.max_client_quenches
        if most and quenches > most:
            self.protocol_error(xid, errors.IMPL_LIMIT,
                                f"this client already holds {most} quenches (the router's "
                                f"max-client-quenches)")
            return True
        longest = self.options["Attribute.Name.Max-Length"]
        for name in names:
            if _utf8_length(name) > longest:
                self.protocol_error(xid, errors.QOS_LIMIT,
                                    f"quench name longer than Attribute.Name.Max-Length "
                                    f"({longest} bytes)", ("Attribute.Name.Max-Length",))
                return True
        for option, value in (("Attribute.Max-Count", len(names) if count is None else count),
                              ("Subscription.Max-Count", quenches)):
            if value > self.options[option]:
                self.protocol_error(xid, errors.QOS_LIMIT,
                                    f"quench over {option} ({self.options[option]})",
                                    (option,))
                return True
        return False

    def _quench_memory_full(self, xid):
        limit = self.router.quench.max_bytes
        self.protocol_error(xid, errors.IMPL_LIMIT,
                            f"the router's quenches hold their maximum memory "
                            f"(max-quench-memory, {limit} bytes)")

    def _qnch_del(self, packet):
        quench = self.quenches.pop(packet.quench_id, None)
        if quench is None:
            self.protocol_error(packet.xid, errors.NO_SUCH_QUENCH,
                                f"no such quench: {packet.quench_id}",
                                (_id_arg(packet.quench_id),))
            return
        self.router.quench.remove(quench)
        self.send(packets.QnchRply(packet.xid, quench.id))

    # -- notifications ----------------------------------------------------------

    def _notify_emit(self, packet):
        self.notify_emit(packet.attributes, packet.deliver_insecure, packet.keys)

    def _unotify(self, packet):
        if packet.client_major_version != PROTOCOL_MAJOR:
            return  # 7.4.1: silently discarded
        self._announced_version(packet)
        self.router.stats["unotify"] += 1
        self.notify_emit(packet.attributes, packet.deliver_insecure, packet.keys,
                         connection_keys=KeyRing.EMPTY, connection_raw_keys=KeyRing.EMPTY)

    def notify_emit(self, attributes, deliver_insecure, wire_keys, size=None,
                    connection_keys=None, connection_raw_keys=None,
                    emit_packet=None, attributes_end=0):
        """A notification from this session, as its decoded fields: the
        transports call it for a NotifyEmit on a CONNECTED session (their
        fast path, skipping the packet object and the dispatch). ``size``:
        the encoded packet's length, if known (see
        ``notification_problem``). The connection's notification keys are
        the session's unless given (a UNotify has none).
        ``emit_packet``/``attributes_end``: see ``Router.route``."""
        if connection_keys is None:
            connection_keys = self.nfn_keys
            connection_raw_keys = self.nfn_raw_keys
        # notification_problem's first test, inline: it passes almost always
        max_count, smallest = self.options.attribute_limits
        if size is not None and size <= smallest and 0 < len(attributes) <= max_count:
            problem = None
        else:
            problem = notification_problem(self.options, attributes, size)
        keys = KeyRing.EMPTY
        keyed = wire_keys is not _NO_WIRE_KEYS and bool(wire_keys)
        if problem is None and keyed:
            most = self.options[_CONNECTION_KEYS]
            if wire_keys.key_count() > most:
                # Not hashed: a 2 MiB NotifyEmit holds 262,000 keys.
                problem = f"more keys than Connection.Max-Keys ({most})"
            else:
                try:
                    keys = KeyRing.from_wire(wire_keys, PRODUCER)
                except errors.ElvinError as e:
                    problem = str(e)
        if problem is not None:
            # 7.3.3: a protocol error in a NotifyEmit is ignored, not Nacked.
            self.ignore_notification(problem)
            return
        if self.router.verbose:
            self.log.info("notification from {peer}: {names}", peer=self.peer,
                          names=sorted(attributes))
        forward_keys = connection_raw_keys
        if keyed:
            forward_keys = forward_keys.union(_raw(wire_keys))
        self.router.route(attributes, deliver_insecure, keys, connection_keys, (), None,
                          forward_keys, emit_packet, attributes_end)

    # -- subscriptions ----------------------------------------------------------

    def _compile(self, xid, expression, replacing=0):
        """Parse ``expression`` or Nack; returns a Subscription or None.
        ``replacing``: the size of the expression it replaces, if any."""
        max_length = self.options["Subscription.Max-Length"]
        size = _utf8_length(expression)
        if size > max_length:
            self.protocol_error(xid, errors.QOS_LIMIT,
                                f"subscription longer than Subscription.Max-Length "
                                f"({max_length} bytes)", ("Subscription.Max-Length",))
            return None
        most = self.router.max_client_subscription_bytes
        if most and self.subscription_bytes - replacing + size > most:
            self.protocol_error(xid, errors.IMPL_LIMIT,
                                f"this client's subscriptions would hold more than {most} "
                                f"bytes of expressions (the router's "
                                f"max-client-subscription-bytes)")
            return None
        budget = self.router.max_subscription_tokens
        if budget and more_tokens_than(expression, budget):
            self.protocol_error(xid, errors.IMPL_LIMIT,
                                f"subscription has more than {budget} tokens "
                                f"(the router's max-subscription-tokens)")
            return None
        try:
            return compile_expression(expression)
        except SubscriptionError as e:
            self.protocol_error(xid, e.code, str(e), subscription_nack_args(e))
            return None

    def _sub_add(self, packet):
        limit = self.options["Subscription.Max-Count"]
        if len(self.subscriptions) >= limit:
            self.protocol_error(packet.xid, errors.QOS_LIMIT,
                                f"client already has Subscription.Max-Count ({limit}) "
                                "subscriptions", ("Subscription.Max-Count",))
            return
        keys = self._keys(packet.xid, packet.keys, CONSUMER, _SUBSCRIPTION_KEYS)
        if keys is None:
            return
        if self._too_many_keys(packet.xid, keys):
            return
        subscription = self._compile(packet.xid, packet.expression)
        if subscription is None:
            return
        cost = subscription_cost(subscription)
        if self._memory_problem(packet.xid, cost):
            return
        try:
            entry = self.router.add_subscription(self, subscription,
                                                 packet.accept_insecure, keys)
        except errors.ElvinError as e:
            self.protocol_error(packet.xid, e.code, str(e))
            return
        self.subscriptions[entry.id] = entry
        self.subscription_bytes += _utf8_length(subscription.expression)
        self.subscription_memory += cost
        self._reply_in_force(packet.xid, entry)

    def _memory_problem(self, xid, cost, replacing=0):
        """Nack a subscription of ``cost`` (replacing one of ``replacing``)
        that would take this client's or the router's subscriptions past
        their memory caps (True if so)."""
        router = self.router
        for most, held, whose, setting in (
                (router.max_client_subscription_memory, self.subscription_memory,
                 "this client's subscriptions", "max-client-subscription-memory"),
                (router.max_subscription_memory, router.subscription_memory,
                 "the router's subscriptions", "max-subscription-memory")):
            if most and held - replacing + cost > most:
                self.protocol_error(xid, errors.IMPL_LIMIT,
                                    f"{whose} would hold more than {most} bytes of "
                                    f"memory, estimated (the router's {setting})")
                return True
        return False

    def _sub_mod(self, packet):
        entry = self.subscriptions.get(packet.subscription_id)
        if entry is None:
            self.protocol_error(packet.xid, errors.NO_SUCH_SUB,
                                f"no such subscription: {packet.subscription_id}",
                                (_id_arg(packet.subscription_id),))
            return
        add_keys = self._keys(packet.xid, packet.add_keys, CONSUMER, _SUBSCRIPTION_KEYS)
        del_keys = self._keys(packet.xid, packet.del_keys, CONSUMER, _SUBSCRIPTION_KEYS)
        if add_keys is None or del_keys is None:
            return
        # 7.4.18: adding a present key or removing an absent one is ignored.
        keys = entry.keys.union(add_keys).difference(del_keys)
        if self._too_many_keys(packet.xid, keys):
            return
        subscription = None
        if packet.expression:
            old_size = _utf8_length(entry.subscription.expression)
            subscription = self._compile(packet.xid, packet.expression, old_size)
            if subscription is None:
                return
            cost, old_cost = subscription_cost(subscription), subscription_cost(entry.subscription)
            if self._memory_problem(packet.xid, cost, old_cost):
                return
            self.subscription_bytes += _utf8_length(subscription.expression) - old_size
            self.subscription_memory += cost - old_cost
        self.router.modify_subscription(entry, subscription, keys, packet.accept_insecure)
        if subscription is None:
            self.send(packets.SubRply(packet.xid, entry.id))
        else:
            self._reply_in_force(packet.xid, entry)

    def _reply_in_force(self, xid, entry):
        """SubRply for a new or changed expression, sent once every observer
        says the subscription is in force (``RouterObserver.subscription_placed``):
        with federation, a notification published at a peer after the
        client has its reply reaches it. Until then the channel holds the
        reply and whatever follows it, in order (``SessionOutput.hold``)."""
        waiting = 0
        held = False
        output = self.output

        def in_force():
            nonlocal waiting
            waiting -= 1
            if not waiting and held:
                output.release()

        for observer in self.router.observers:
            if observer.subscription_placed(entry, in_force):
                waiting += 1
        held = bool(waiting) and output.hold()    # a channel that cannot hold sends now
        self.send(packets.SubRply(xid, entry.id))

    def _sub_del(self, packet):
        entry = self.subscriptions.pop(packet.subscription_id, None)
        if entry is None:
            self.protocol_error(packet.xid, errors.NO_SUCH_SUB,
                                f"no such subscription: {packet.subscription_id}",
                                (_id_arg(packet.subscription_id),))
            return
        self.subscription_bytes -= _utf8_length(entry.subscription.expression)
        self.subscription_memory -= subscription_cost(entry.subscription)
        self.router.remove_subscription(entry)
        self.send(packets.SubRply(packet.xid, entry.id))


_CONNECTION_KEYS = "Connection.Max-Keys"
_SUBSCRIPTION_KEYS = "Subscription.Max-Keys"

#: The arrays a client sends that one of its connection's options bounds
#: (``ConnectionOptions.count_fields``): one over its limit is left unread
#: (``packets.UnreadArray``), so a packet's decoding costs what its limits
#: allow, not what its length does, and is answered as if read: a request
#: Nacked (QOS_LIMIT, naming the option), a notification ignored (7.3.3).
#: A Keys field is held to its number of keys; a quench's names are
#: counted as sent, a repeated one too; a QosRqst's options, of which
#: there are 17, by Attribute.Max-Count as a notification's attributes.
#: (A ConnRqst's arrive in at most PRE_CONNECT_MAX_PACKET bytes and set
#: the limits.)
COUNT_LIMITED_FIELDS = {
    "NotifyEmit.attributes": "Attribute.Max-Count",
    "UNotify.attributes": "Attribute.Max-Count",
    "QnchAddRqst.names": "Attribute.Max-Count",
    "QnchModRqst.names_add": "Attribute.Max-Count",
    "QnchModRqst.names_del": "Attribute.Max-Count",
    "QosRqst.options": ("Attribute.Max-Count", ConnectionOptions.QOS_OPTIONS_FLOOR),
    "NotifyEmit.keys": _CONNECTION_KEYS,
    "UNotify.keys": _CONNECTION_KEYS,
    "SecRqst.add_nfn_keys": _CONNECTION_KEYS,
    "SecRqst.del_nfn_keys": _CONNECTION_KEYS,
    "SecRqst.add_sub_keys": _CONNECTION_KEYS,
    "SecRqst.del_sub_keys": _CONNECTION_KEYS,
    "SubAddRqst.keys": _SUBSCRIPTION_KEYS,
    "SubModRqst.add_keys": _SUBSCRIPTION_KEYS,
    "SubModRqst.del_keys": _SUBSCRIPTION_KEYS,
    "QnchAddRqst.keys": _SUBSCRIPTION_KEYS,
    "QnchModRqst.add_keys": _SUBSCRIPTION_KEYS,
    "QnchModRqst.del_keys": _SUBSCRIPTION_KEYS,
}


def _deliveries(count):
    return f"{count} delivery" if count == 1 else f"{count} deliveries"


def _utf8_length(text):
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def subscription_cost(subscription):
    """What ``subscription`` placed costs the router, estimated in bytes
    (see ``SUBSCRIPTION_BASE_COST``): held to ``max-subscription-memory``
    and ``max-client-subscription-memory``."""
    if subscription.shares_shape:
        return SHARED_SHAPE_BASE_COST + SHARED_SHAPE_TEXT_COST * _utf8_length(
            subscription.expression)
    return (SUBSCRIPTION_BASE_COST + SUBSCRIPTION_NAME_COST * len(subscription.names)
            + SUBSCRIPTION_TEXT_COST * _utf8_length(subscription.expression))


def notification_problem(options, attributes, size=None):
    """Why ``attributes`` break the attribute limits in ``options`` (a
    ConnectionOptions or a mapping of option name to value), or None.

    ``size`` is the length of the packet they were decoded from, when
    known: no name, string or opaque in it can be longer than the packet,
    so when the packet is no longer than the smallest length limit only
    the count is checked (the usual case: limits are at least 64 bytes for
    names and 1 KiB for values, and so are the defaults 2 KiB and 1 MiB).
    """
    if isinstance(options, ConnectionOptions):
        max_count, smallest = options.attribute_limits
        if size is not None and size <= smallest and 0 < len(attributes) <= max_count:
            return None
        options = options.values
    if not attributes:
        return "a notification needs at least one attribute"
    if len(attributes) > options["Attribute.Max-Count"]:
        return f"more than Attribute.Max-Count ({options['Attribute.Max-Count']}) attributes"
    name_max = options["Attribute.Name.Max-Length"]
    string_max = options["Attribute.String.Max-Length"]
    opaque_max = options["Attribute.Opaque.Max-Length"]
    if size is not None and size <= name_max and size <= string_max and size <= opaque_max:
        return None
    for name, value in attributes.items():
        if len(name) > name_max and len(name.encode("utf-8")) > name_max:
            return f"attribute name longer than Attribute.Name.Max-Length ({name_max})"
        kind = type_of(value)
        if kind == STRING and len(value) * 4 > string_max and len(
                value.encode("utf-8")) > string_max:
            return (f"string attribute {name!r} longer than "
                    f"Attribute.String.Max-Length ({string_max})")
        if kind == OPAQUE and len(value) > opaque_max:
            return (f"opaque attribute {name!r} longer than "
                    f"Attribute.Opaque.Max-Length ({opaque_max})")
    return None


def compile_expression(expression):
    """A compiled Subscription for ``expression``, shared between clients.

    Subscriptions are immutable, so many clients registering the same text
    (the common case) pay for parsing and compiling once. The cache holds
    them weakly: an expression no live subscription uses is freed with its
    last user, so the cache's size is that of what is subscribed and
    nothing more.
    """
    subscription = _compiled.get(expression)
    if subscription is None:
        subscription = _compiled[expression] = Subscription(expression)
    return subscription


#: Expression text -> its compiled Subscription, while something holds it.
_compiled: "weakref.WeakValueDictionary[str, Subscription]" = weakref.WeakValueDictionary()


def _raw(wire_keys):
    """Keys as a client sent them, kept unprepared (already validated)."""
    if not wire_keys:
        return KeyRing.EMPTY
    try:
        return KeyRing.from_prepared_wire(wire_keys)
    except errors.ElvinError:
        return KeyRing.EMPTY


def _id_arg(value):
    from elvin.values import Int64
    return Int64(value if value < (1 << 63) else value - (1 << 64))


def subscription_nack_args(error):
    """Nack arguments for a subscription error, as the table in 7.4.2 lists."""
    if error.code == errors.EXP_IS_TRIVIAL:
        return ()
    if error.code in (errors.UNTERM_STRING, errors.NESTING_TOO_DEEP):
        return (error.offset,)
    if error.code == errors.TYPE_MISMATCH:
        return (error.offset, error.token or "", error.found or "")
    return (error.offset, error.token or "")


_HANDLERS = {
    packets.ConnRqst: None,
    packets.UNotify: None,
    packets.DisconnRqst: ClientSession._disconn_rqst,
    packets.TestConn: ClientSession._test_conn,
    packets.ConfConn: None,
    packets.QosRqst: ClientSession._qos_rqst,
    packets.SecRqst: ClientSession._sec_rqst,
    packets.NotifyEmit: ClientSession._notify_emit,
    packets.SubAddRqst: ClientSession._sub_add,
    packets.SubModRqst: ClientSession._sub_mod,
    packets.SubDelRqst: ClientSession._sub_del,
    packets.QnchAddRqst: ClientSession._qnch_add,
    packets.QnchModRqst: ClientSession._qnch_mod,
    packets.QnchDelRqst: ClientSession._qnch_del,
}

#: pkt_ids a client may send; a transport refuses any other undecoded.
CLIENT_PACKET_IDS = frozenset(cls.ID for cls in _HANDLERS)
#: The requests a client sends that hold strings (ClientSession.bad_utf8).
_STRING_REQUESTS = frozenset((packets.QosRqst, packets.SubAddRqst, packets.SubModRqst,
                              packets.QnchAddRqst, packets.QnchModRqst))
#: pkt_id -> class of every client packet that holds strings.
_STRING_PACKETS = {cls.ID: cls for cls in _STRING_REQUESTS | {
    packets.ConnRqst, packets.NotifyEmit, packets.UNotify}}
#: A subclass (the proxy's ProxyClient) dispatches to its own handlers.
ClientSession.HANDLERS = _HANDLERS
