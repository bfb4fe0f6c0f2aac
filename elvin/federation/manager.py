"""The federation manager: links, pull filters and forwarding for one router.

Filters follow subscriptions: whenever local subscriptions or a peer's
pull filter change, the filter each link should carry is recomputed after a
short debounce (so a burst of changes costs one FedSubReplace per link)
and sent if it changed. What we ask peer P for is the union of our local
subscriptions and the pull filters of our *other* peers (so interest
propagates across a tree of routers), generalised past ``max_filter_nodes``
and intersected with P's import filter.

A link is a pulling session of the router: the pull filter its peer sent
is filed, disjunct by disjunct, in the router's pull index
(``Router.set_pull_filter``), like a subscription, so a notification
evaluates only the disjuncts it could satisfy. A notification, from a
local client or a link, goes over each other link whose peer is not in
its routing list, whose pull filter it satisfies, and whose export filter
allows it; the FedNotify is encoded once for all of them.
"""

import collections
import fnmatch
import random
import time

from twisted.internet import defer
from twisted.logger import Logger

from elvin.federation import filters
from elvin.federation import mesh as MESH
from elvin.federation import packets as fed_packets
from elvin.federation.gone import IncomingPeers
from elvin.federation.identity import domain_problem
from elvin.federation.link import LOSS_CAUSES
from elvin.federation.trace import NullTrace
from elvin.protocols import packets
from elvin.core.lograte import LogLimiter
from elvin.core.router import RouterObserver

#: Why a link goes down after a closing handshake (our Disconn or the
#: peer's, each written after what was queued): nothing was in flight, so
#: no subscriber is warned of a loss.
POLITE_ENDS = frozenset(("shutdown", "federation class removed", "federation link removed",
                         "disconnected by peer"))

__all__ = ["FederationClass", "FederationManager", "host_matches"]

#: Computations of the mesh tree for other routers' adverts in one second
#: before the next waits for the second to end.
MESH_RECOMPUTE_BURST = 20


class _Waiter:
    """A SubRply waiting for the peers: by link, the FedSubReplace (its
    ``sent_seq``; None: the next one sent) whose answer it needs."""

    __slots__ = ("targets", "in_force", "timer")

    def __init__(self, targets, in_force):
        self.targets = targets
        self.in_force = in_force
        self.timer = None


def host_matches(patterns, *hosts):
    """True when a host (name or address) matches a pattern (``*``, ``?``)."""
    for pattern in patterns:
        for host in hosts:
            if host and fnmatch.fnmatchcase(host.lower(), pattern.lower()):
                return True
    return False


class FederationClass:
    """Per-peer policy: what we import and export, and who it applies to."""

    def __init__(self, name, import_filter=filters.TRUE, export_filter=filters.TRUE, hosts=(),
                 require_authenticated=False):
        self.name = name
        self.import_tree = import_filter
        self.export_tree = export_filter
        self.import_filter = filters.Filter(import_filter)
        self.export_filter = filters.Filter(export_filter)
        self.hosts = tuple(hosts)
        self.require_authenticated = require_authenticated

    def applies_to(self, *hosts):
        return host_matches(self.hosts, *hosts)

    def __repr__(self):
        return f"<FederationClass {self.name}>"


class FederationManager(RouterObserver):
    """Federation for one router, which it watches as a RouterObserver."""

    log = Logger()

    def __init__(self, router, domain, classes=(), default_class=None, clock=None,
                 max_filter_nodes=2000, debounce=0.05, trace=None,
                 require_authenticated_hosts=(), mesh=True, mesh_interval=30.0,
                 duplicate_window=200_000, mesh_grace=1.0, filter_refresh=600.0,
                 rng=None, subscribe_wait=2.0):
        if clock is None:
            # Injected (the reactor in the service, a Clock in tests) so the
            # manager stays free of the global reactor.
            raise TypeError("FederationManager needs a clock (seconds, callLater)")
        self.router = router
        self.domain = domain
        self.classes = {c.name: c for c in classes}
        self.default_class = default_class
        self.clock = clock
        self.max_filter_nodes = max_filter_nodes
        self.debounce = debounce
        self.trace = trace or NullTrace()
        self.links = []
        #: The configured outgoing links (``Federation.Connect``), up or
        #: not, in the order dialled (``dial.DialledPeer``): each while its
        #: ClientService runs (``protocol.connector_service``).
        self.dialled = []
        #: What links peers dialled to us counted, kept once they are down
        #: (``gone.IncomingPeers``), so their counters go on.
        self.incoming = IncomingPeers(self.clock)
        self._update_call = None
        #: Peers that must authenticate whatever their class (Avis's form).
        self.require_authenticated_hosts = tuple(require_authenticated_hosts)
        #: Federation over any graph (elvin.federation.mesh); None: plain EFP.
        self.mesh = None
        self.mesh_marker = filters.marker(MESH.MARKER_NAME)
        self.mesh_interval = mesh_interval
        self.duplicates = MESH.DuplicateWindow(duplicate_window)
        self._tree = set()
        #: Links just off the tree, active for mesh_grace seconds more.
        self._leaving = set()
        self._grace_calls = {}
        self._closing = False
        #: Leaving the tree before a stop (``leave``): fired once done.
        self._departure = None
        self._departure_call = None
        self.mesh_grace = mesh_grace
        self._mesh_call = None
        #: When the tree was computed for adverts in the last second
        #: (``_mesh_changed_soon``), and the computation put off, if any.
        self._mesh_recompute = None
        self._mesh_computed_at = collections.deque()
        self._mesh_full_log = LogLimiter(lambda: self.clock.seconds())
        #: Rate limits of "failed before the link came up" lines, by
        #: (peer, outgoing, reason).
        self._start_failure_logs: dict = {}
        #: Losses (LOSS_CAUSES) counted by links that have gone down.
        self.gone_losses: collections.Counter = collections.Counter()
        #: Pull filters are soft state: each link's is sent again in full
        #: every ``filter_refresh`` seconds (0: never), give or take a
        #: quarter, drawn from ``rng`` per link so links spread out.
        self.filter_refresh = filter_refresh
        self._rng = rng or random.Random()
        self._refresh_calls = {}
        #: Most seconds a client's SubRply waits for the peers to answer a
        #: pull filter that covers its subscription (0: it does not wait).
        self.subscribe_wait = subscribe_wait
        self._waiters = []
        self._parts_cache = {}
        #: The router's own subscriptions, as the pull filters need them.
        self.local = filters.LocalInterest()
        for entry in list(router.subscriptions.values()):
            self.subscriptions_changed(entry)
        #: How many replies waited, and how many of them gave up waiting.
        self.wait_stats = {"waited": 0, "timed_out": 0}
        #: DropWarns sent to local clients for notifications a link may
        #: have lost (``warn_subscribers``).
        self.loss_dropwarns = 0
        if mesh:
            lifetime = 3 * mesh_interval if mesh_interval else float("inf")
            self.mesh = MESH.MeshState(domain, int(time.time() * 1000), lifetime)
        router.observers.append(self)

    # -- classes ------------------------------------------------------------------

    def class_for(self, *hosts):
        """The class for a peer known by ``hosts`` (names/addresses), or None."""
        for fed_class in self.classes.values():
            if fed_class.applies_to(*hosts):
                return fed_class
        if self.default_class is not None:
            return self.classes.get(self.default_class)
        return None

    def requires_authentication(self, fed_class, host):
        """Must a link of ``fed_class`` with ``host`` be authenticated?"""
        return bool(fed_class is not None and fed_class.require_authenticated) or \
            host_matches(self.require_authenticated_hosts, host)

    # -- links --------------------------------------------------------------------------

    def check_domain(self, domain, link):
        """Why ``link``'s peer may not use ``domain``, or None: it must be
        a sane domain (``identity.domain_problem``), neither ours nor one
        already linked."""
        problem = domain_problem(domain)
        if problem is not None:
            return problem
        if domain == self.domain:
            return f"peer claims our own router domain {domain!r}"
        for other in list(self.links):
            if other is not link and other.peer_domain == domain:
                if not self._gone_silent(other):
                    return f"already federated with {domain!r}"
                # Its peer stopped answering (a hung process, a dead host
                # whose connection no reset has ended): the router that says
                # it is that peer now takes its place.
                self.log.warn("federation link to {domain} silent for {silent:.1f} s: "
                              "replaced by a new link from {host}", domain=domain,
                              silent=other.output.silent_for(), host=link.peer_host)
                other.connection_lost("replaced: silent peer")
                other.output.abort()
        return None

    @staticmethod
    def _gone_silent(link):
        """Has ``link``'s peer left a keepalive probe unanswered (silent
        for more than one keepalive interval)?"""
        keepalive = getattr(link.output, "keepalive", 0)
        silent_for = getattr(link.output, "silent_for", None)
        return bool(keepalive) and silent_for is not None and silent_for() > keepalive

    def link_up(self, link):
        self.links.append(link)
        if link.dial is not None:
            link.dial.came_up(link)
        self.log.info("federation link up: {domain} ({host}, class {cls})",
                      domain=link.peer_domain, host=link.peer_host,
                      cls=link.fed_class.name if link.fed_class else None)
        self.trace.link(link, "link_up")
        if not link.remote_filter.is_false:
            self.remote_filter_changed(link)
        link.send_filter(self.pull_filter_for(link))
        self._schedule_refresh(link)

    def link_failed_to_start(self, peer, outgoing, why):
        """A link's channel ended before the link came up (a failed TLS
        handshake, a peer that hung up): one line saying why, at most one
        per LOG_INTERVAL for a peer, direction and reason."""
        key = (peer, outgoing, why)
        limiter = self._start_failure_logs.get(key)
        if limiter is None:
            if len(self._start_failure_logs) >= 1024:     # a bound for scans
                self._start_failure_logs.clear()
            limiter = self._start_failure_logs[key] = LogLimiter(
                lambda: self.clock.seconds())
        skipped = limiter.allow()
        if skipped is not None:
            self.log.warn("federation: {direction} {peer} failed before the link came up: "
                          "{why}{more}", direction="link to" if outgoing else "link from",
                          peer=peer, why=why, more=limiter.more(skipped))

    def link_down(self, link, reason, was_up):
        if link in self.links:
            self.links.remove(link)
        if link.dial is not None:
            link.dial.went_down(link, reason)
        elif was_up and not link.outgoing:
            self.incoming.went_down(link, reason)
        call = self._refresh_calls.pop(link, None)
        if call is not None and call.active():
            call.cancel()
        self.router.set_pull_filter(link, [])
        if self.mesh is not None and link.mesh is not None:
            known = self.mesh.neighbours if link.mesh else self.mesh.plain
            if link.peer_domain in known and not any(
                    other.peer_domain == link.peer_domain for other in self.links):
                known.discard(link.peer_domain)
                self._advertise()
                self._mesh_changed()
        lost = {cause: link.stats[key] for cause, key in LOSS_CAUSES if link.stats[key]}
        self.gone_losses.update(lost)
        warned = 0
        if was_up and reason not in POLITE_ENDS:
            warned = self.warn_subscribers(link)
        if was_up:
            self.log.info("federation link down: {domain}: {reason}{losses}{warned}",
                          domain=link.peer_domain, reason=reason,
                          losses="; notifications lost: " + ", ".join(
                              f"{cause} {n}" for cause, n in lost.items()) if lost else "",
                          warned=f"; DropWarn sent to {warned} local subscribers"
                          if warned else "")
        self.trace.link(link, "link_down", reason=reason, unsent=link.stats["unsent"])
        self._parts_cache.pop(link, None)
        if self._waiters:
            self._check_waiters()
        if was_up:
            self.schedule_update()
        if self._departure is not None and not self._closing:
            self._check_departed()

    def warn_subscribers(self, link):
        """Notifications ``link`` was carrying to us may be lost: it went
        down other than by a closing handshake (the socket buffers held
        what neither side counts), or its peer sent DropWarn (its send
        queue to us overflowed). Each connected local client with a
        subscription gets a DropWarn (client protocol 5.4.6: notifications
        were dropped at this place in its stream), when the pull filter we
        sent the peer asked for anything: that filter is the union of
        every local subscription (widened, never narrowed), so each one
        could have been served by the link. Returns how many were told;
        counted in ``loss_dropwarns``."""
        tree = link.sent_filter
        if tree is None:
            return 0
        if self.mesh is not None:
            tree, _ = filters.strip_marker(tree, self.mesh_marker)
        if tree is filters.FALSE:
            return 0
        told = 0
        for session in list(self.router.sessions):
            if session.state == session.CONNECTED and session.subscriptions:
                session.send(packets.DropWarn())
                told += 1
        self.loss_dropwarns += told
        return told

    def peer_dropped(self, link):
        """``link``'s peer sent DropWarn: tell our subscribers (logged at
        most once per LOG_INTERVAL a link)."""
        told = self.warn_subscribers(link)
        limiter = link.dropwarn_log
        if limiter is None:
            limiter = link.dropwarn_log = LogLimiter(lambda: self.clock.seconds())
        skipped = limiter.allow()
        if skipped is not None:
            self.log.warn("federation peer {peer} dropped notifications for us (DropWarn); "
                          "DropWarn sent to {told} local subscribers{more}",
                          peer=link.peer_domain, told=told, more=limiter.more(skipped))

    def _overloaded(self, link, size):
        """A notification for ``link`` was dropped: its send queue is full
        (the peer reads slower than we send) or it is too long for a
        federation packet. Logged at most once per LOG_INTERVAL a link."""
        limiter = link.overload_log
        if limiter is None:
            limiter = link.overload_log = LogLimiter(lambda: self.clock.seconds())
        skipped = limiter.allow()
        if skipped is not None:
            why = (f"{size} bytes is past the {fed_packets.MAX_PACKET_LENGTH}-byte packet limit"
                   if size > fed_packets.MAX_PACKET_LENGTH else
                   "its send queue is full: the peer reads slower than we send")
            self.log.warn("federation link {domain}: a notification not forwarded ({why}); "
                          "{total} so far{more}", domain=link.peer_domain or link.peer_host,
                          why=why, total=link.stats["overload"], more=limiter.more(skipped))

    def losses(self):
        """Notifications lost by cause (LOSS_CAUSES) over every link, the
        ones that went down included."""
        totals = collections.Counter(self.gone_losses)
        for link in self.links:
            for cause, key in LOSS_CAUSES:
                totals[cause] += link.stats[key]
        return totals

    def remote_filter_changed(self, link, answer=None):
        """The peer sent a new pull filter: file it in the router's pull
        index (one entry per disjunct; nothing for a link off the mesh's
        tree), then recompute what we ask others in the next turn, not
        after the debounce. ``answer`` sends the peer its Ack: returns True
        when the Ack is to wait until our other peers answered the filters
        recomputed (at most ``subscribe_wait`` seconds), so that a
        subscription is in force all along the tree when its client's
        SubRply arrives; False: the caller sends it now. Only among mesh
        routers on a settled tree (``_acks_may_wait``): links in a cycle
        would wait on each other."""
        waiting = False
        if link in self.links:
            if (self.mesh is not None and link.mesh is False
                    and link.peer_domain not in self.mesh.plain):
                self.plain_peer_found(link)
            self._file(link)
            if answer is not None and self._acks_may_wait(link):
                others = {other: None for other in self.links
                          if other is not link and other.state == other.UP
                          and self.active(other)}
                if others:
                    self._wait(others, answer)
                    waiting = True
        self.schedule_update(soon=True)
        if self._departure is not None:
            self._check_departed()
        return waiting

    def _acks_may_wait(self, link):
        """May ``link``'s Ack wait for our other peers? Only when the waits
        cannot form a cycle: this router and every peer it would wait for
        are mesh routers on the tree they agreed (a tree has no cycle), and
        no link is in its ``mesh_grace`` (then two paths carry at once).
        Plain peers can close a cycle the mesh does not see."""
        if not self.subscribe_wait or self.mesh is None or self._leaving:
            return False
        if not link.mesh or not self.active(link):
            return False
        return all(other.mesh for other in self.links
                   if other is not link and other.state == other.UP and self.active(other))

    # -- pull filters as soft state ---------------------------------------------

    def _schedule_refresh(self, link):
        """Refresh ``link``'s filter in 0.75 to 1.25 ``filter_refresh``
        seconds (the spread keeps a router's links, and routers started
        together, from refreshing all at once)."""
        if not self.filter_refresh or self._closing:
            return
        delay = self.filter_refresh * (0.75 + 0.5 * self._rng.random())
        self._refresh_calls[link] = self.clock.callLater(delay, self._refresh, link)

    def _refresh(self, link):
        """Send ``link``'s pull filter again in full, changed or not: one
        that was lost, refused or misapplied by the peer (or that we
        computed from state that drifted) is replaced by what it should be
        now. The receiver refiles it only if it differs from its copy."""
        self._refresh_calls.pop(link, None)
        if link not in self.links or link.state != link.UP:
            return
        link.send_filter(self.pull_filter_for(link), force=True)
        self._schedule_refresh(link)

    # -- leaving before a stop or a drain (make before break) --------------------

    def leave(self, timeout=None):
        """Take this router off the mesh's tree before it stops or is
        drained (for good: it stays off while it runs), losing
        nothing that passes through it: advertise no links, so the other
        mesh routers build their tree without us (their new links carry
        before their links to us stop: ``mesh_grace``), keep forwarding
        meanwhile, and fire once every mesh peer asks us for nothing (it
        has rerouted) or after ``timeout`` seconds (default: the grace
        plus 3 s). Fires at once without mesh peers: a plain EFP peer has
        no other path to reroute to."""
        if self._departure is not None:
            return self._departure
        self._departure = defer.Deferred()
        if self.mesh is not None and not self._closing:
            # For good: links that come up later stay off the tree too (a
            # drained router keeps running but carries nobody's traffic).
            self.mesh.leaving = True
        mesh_links = [l for l in self.links if l.mesh and l.state == l.UP]
        if self.mesh is None or self._closing or not mesh_links:
            self._departed()
            return self._departure
        self.log.info("federation: leaving the mesh's tree ({n} mesh links)",
                      n=len(mesh_links))
        self._advertise()
        if timeout is None:
            timeout = self.mesh_grace + 3.0
        self._departure_call = self.clock.callLater(timeout, self._departed, True)
        self._check_departed()
        return self._departure

    def _check_departed(self):
        if all(link.remote_filter.is_false for link in self.links
               if link.mesh and link.state == link.UP):
            self._departed()

    def _departed(self, timed_out=False):
        call, self._departure_call = self._departure_call, None
        if call is not None and call.active():
            call.cancel()
        departure = self._departure
        if departure is None or departure.called:
            return
        if timed_out:
            self.log.warn("federation: mesh peers still asked for notifications when "
                          "the wait to leave the tree ended; closing anyway")
        departure.callback(None)

    def _file(self, link):
        trees = filters.disjuncts(link.remote_filter.tree) if self.active(link) else []
        self.router.set_pull_filter(link, [True if tree is filters.TRUE else tree for tree in trees])

    # -- the mesh (elvin.federation.mesh) ---------------------------------------------

    def active(self, link):
        """Does ``link`` carry notifications? Every link of a plain router;
        of a mesh router, those on the tree (which spans its plain peers
        too), and for ``mesh_grace`` seconds those that just left it (make
        before break: the new path carries before the old stops; the
        duplicate window drops what arrives both ways meanwhile). A link
        whose peer has not yet sent its first pull filter (which says
        whether it is a mesh router) carries nothing."""
        if self.mesh is None:
            return True
        if link.mesh is None:
            return False      # until its first filter says what the peer is
        return link.peer_domain in self._tree or link.peer_domain in self._leaving

    def is_duplicate(self, routing):
        ident = MESH.id_of(routing) if self.mesh is not None else None
        return ident is not None and self.duplicates.seen(ident)

    def mesh_peer_found(self, link):
        """``link``'s peer is a mesh router: tell it what we know."""
        self.log.info("federation link to {domain} is a mesh link", domain=link.peer_domain)
        self.mesh.neighbours.add(link.peer_domain)
        self.mesh.plain.discard(link.peer_domain)
        if self.mesh_interval and self._mesh_call is None and not self._closing:
            # Soft state is refreshed once there is a mesh to refresh it in.
            self._mesh_call = self.clock.callLater(self.mesh_interval, self._mesh_refresh)
        for advert in list(self.mesh.adverts.values()):
            link.output.send(fed_packets.FedMeshAdvert(advert.origin, advert.epoch, advert.sequence,
                                              sorted(advert.neighbours)))
        self._advertise()
        self._mesh_changed()

    def plain_peer_found(self, link):
        """``link``'s peer is a plain EFP 1.0 router (its first filter had
        no mesh marker): the mesh hears of the link, so that a plain router
        linked to several mesh routers is reached by one of them only."""
        self.log.info("federation link to {domain} is a plain EFP 1.0 link",
                      domain=link.peer_domain)
        self.mesh.plain.add(link.peer_domain)
        self._advertise()
        self._mesh_changed()
        if link.peer_domain not in self._tree:
            self.log.info("federation: the link to plain router {domain} closes a cycle "
                          "in the mesh; it stays up and idle while {domain} is reached "
                          "another way", domain=link.peer_domain)

    def mesh_advert(self, link, packet):
        now = self.clock.seconds()
        if self.mesh.receive(packet.origin, packet.epoch, packet.sequence,
                             packet.neighbours, now):
            for other in self.links:
                if other is not link and other.mesh and other.state == other.UP:
                    other.output.send(packet)
            self._mesh_changed_soon()
        elif packet.origin not in self.mesh.adverts and packet.origin != self.domain:
            skipped = self._mesh_full_log.allow()
            if skipped is not None:
                self.log.warn("ignored a mesh advert from {peer}: this router holds "
                              "{most} routers' adverts already{more}", peer=link.peer_domain,
                              most=MESH.MAX_MESH_ROUTERS, more=self._mesh_full_log.more(skipped))

    def _mesh_changed_soon(self):
        """Compute the tree again now, unless MESH_RECOMPUTE_BURST
        computations were done in the last second: then once the second
        is over. A peer flooding adverts costs a few computations a
        second, not one per advert; routers healing a mesh send a few."""
        if self._mesh_recompute is not None:
            return
        now = self.clock.seconds()
        recent = self._mesh_computed_at
        while recent and recent[0] <= now - 1.0:
            recent.popleft()
        if len(recent) < MESH_RECOMPUTE_BURST:
            recent.append(now)
            self._mesh_changed()
            return

        def recompute():
            self._mesh_recompute = None
            self._mesh_computed_at.append(self.clock.seconds())
            self._mesh_changed()
        self._mesh_recompute = self.clock.callLater(recent[0] + 1.0 - now, recompute)

    def _left(self, domain):
        """A link's grace off the tree is over (unless it is back on it)."""
        self._grace_calls.pop(domain, None)
        if domain in self._leaving and domain not in self._tree:
            self._leaving.discard(domain)
            for link in self.links:
                if link.peer_domain == domain:
                    self._file(link)
            self.schedule_update()

    def _advertise(self):
        origin, epoch, sequence, neighbours = self.mesh.own_advert()
        packet = fed_packets.FedMeshAdvert(origin, epoch, sequence, neighbours)
        for link in self.links:
            if link.mesh and link.state == link.UP:
                link.output.send(packet)

    def _mesh_refresh(self):
        """Soft state: say our links again, forget who stopped saying theirs."""
        self._mesh_call = self.clock.callLater(self.mesh_interval, self._mesh_refresh)
        self._advertise()
        if self.mesh.expire(self.clock.seconds()):
            self._mesh_changed()

    def _mesh_changed(self):
        if self._closing or (self.mesh is not None and self.mesh.leaving):
            return      # leaving: the tree we forward on stays as it was
        tree = self.mesh.tree_neighbours()
        if tree == self._tree:
            return
        self.log.info("federation mesh: tree links now {tree}", tree=sorted(tree))
        for domain in self._tree - tree:
            self._leaving.add(domain)
            previous = self._grace_calls.pop(domain, None)
            if previous is not None and previous.active():
                previous.cancel()
            self._grace_calls[domain] = self.clock.callLater(self.mesh_grace, self._left,
                                                             domain)
        self._leaving -= tree
        self._tree = tree
        for link in self.links:
            if link.mesh is not None:
                self._file(link)
        self.schedule_update()

    # -- RouterObserver ---------------------------------------------------------

    def subscriptions_changed(self, entry):
        if entry.id in self.router.subscriptions:
            subscription = entry.subscription
            self.local.add(entry.id, subscription.required_names(), lambda: subscription.ast)
        else:
            self.local.remove(entry.id)
        if self.links:
            self.schedule_update()

    def notification_routed(self, attributes, deliver_insecure, keys, routing, source,
                            pulled):
        self.forward(attributes, deliver_insecure, keys, routing, source, pulled)

    def router_shutting_down(self):
        self.shutdown()

    # -- filters -----------------------------------------------------------------------

    def _local_trees(self):
        """Every local subscription's (id, tree), for ``LocalInterest``."""
        return ((entry.id, entry.subscription.ast)
                for entry in list(self.router.subscriptions.values()))

    def pull_filter_for(self, link):
        if not self.active(link):
            tree = filters.FALSE            # off the mesh's tree: ask for nothing
        else:
            others = [other.remote_filter.tree for other in self.links
                      if other is not link and other.state == other.UP and self.active(other)]
            import_tree = link.fed_class.import_tree if link.fed_class else filters.TRUE
            tree = filters.build_pull_filter(self.local, others, import_tree,
                                             self.max_filter_nodes, self._local_trees)
        if self.mesh is not None:
            tree = filters.with_marker(tree, self.mesh_marker)
        return tree

    def schedule_update(self, soon=False):
        """Recompute the links' filters after the debounce, or (``soon``: a
        reply waits for it) in the next reactor turn, for all changes made
        in this one."""
        call = self._update_call
        if call is not None and call.active():
            if not soon or call.getTime() <= self.clock.seconds():
                return
            call.cancel()
        self._update_call = self.clock.callLater(0 if soon else self.debounce,
                                                 self.update_filters)

    def update_filters(self):
        """Recompute and send every link's pull filter (now)."""
        call, self._update_call = self._update_call, None
        if call is not None and call.active():
            call.cancel()
        for link in list(self.links):
            link.send_filter(self.pull_filter_for(link))
        if self._waiters:
            # Waiting for "the next filter": that is the one just sent, or
            # the one before if nothing changed.
            for waiter in self._waiters:
                for link, seq in waiter.targets.items():
                    if seq is None:
                        waiter.targets[link] = link.sent_seq
            self._check_waiters()

    # -- replies that wait for the peers (RouterObserver.subscription_placed) -----------

    def subscription_placed(self, entry, in_force):
        """Hold the client's SubRply until each peer that carries anything
        answered a pull filter covering the subscription: without this, a
        client that subscribes here and then publishes at a peer would race
        the filter's debounce and lose its first notifications. A filter
        already sent that covers it (generalised filters cover most new
        subscriptions) needs only its answer; otherwise the links' filters
        are recomputed in the next reactor turn, not after the debounce."""
        if not self.subscribe_wait:
            return False
        links = [link for link in self.links if link.state == link.UP and self.active(link)]
        if not links:
            return False
        tree = self.local.tree_of(entry.id)
        requirement = self.local.requirement_of(entry.id)
        targets = {}
        stale = False
        for link in links:
            if link.sent_filter is not None and filters.covers(self._sent_parts(link), tree,
                                                               requirement):
                if link.answered_seq < link.sent_seq:
                    targets[link] = link.sent_seq
            else:
                targets[link] = None
                stale = True
        if not targets:
            return False
        self._wait(targets, in_force)
        if stale:
            self.schedule_update(soon=True)
        return True

    def _wait(self, targets, in_force):
        waiter = _Waiter(targets, in_force)
        waiter.timer = self.clock.callLater(self.subscribe_wait, self._wait_timed_out, waiter)
        self._waiters.append(waiter)
        self.wait_stats["waited"] += 1

    def _sent_parts(self, link):
        cached = self._parts_cache.get(link)
        if cached is None or cached[0] is not link.sent_filter:
            cached = self._parts_cache[link] = (link.sent_filter,
                                                filters.top_disjuncts(link.sent_filter))
        return cached[1]

    def filter_answered(self, link):
        """``link``'s peer answered a FedSubReplace."""
        if self._waiters:
            self._check_waiters()

    def _check_waiters(self):
        done = []
        for waiter in self._waiters:
            for link, seq in list(waiter.targets.items()):
                if link not in self.links or link.state != link.UP or (
                        seq is not None and link.answered_seq >= seq):
                    del waiter.targets[link]
            if not waiter.targets:
                done.append(waiter)
        for waiter in done:
            self._release(waiter)

    def _wait_timed_out(self, waiter):
        waiter.timer = None
        self.wait_stats["timed_out"] += 1
        self.log.info("a subscription's reply waited {seconds:g} s for federation peers "
                      "({peers}) to answer its pull filter; sent without their answer",
                      seconds=self.subscribe_wait,
                      peers=", ".join(sorted(str(link.peer_domain) for link in waiter.targets)))
        self._release(waiter)

    def _release(self, waiter):
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        waiter.in_force()

    # -- forwarding ----------------------------------------------------------------------

    def forward(self, attributes, deliver_insecure, keys, routing=(), source=None,
                pulled=None):
        """Send a routed notification over every link that should carry it.

        ``pulled`` are the links whose pull filter it satisfies, found by the
        router's pull index (None: ask the router). The trace still gets one
        ``out`` record for every candidate link (up, not where it came from,
        not on its routing list), suppressed ones included.
        """
        if not self.links:
            return 0
        if pulled is None:
            pulled = self.router.pulled_by(attributes)
        trace = self.trace
        if trace.enabled:
            candidates = [link for link in self.links
                          if link is not source and link.state == link.UP
                          and link.peer_domain not in routing]
        else:
            candidates = [link for link in pulled
                          if link is not source and link.state == link.UP
                          and link.peer_domain not in routing]
        if not candidates:
            return 0
        if self.mesh is not None and self.mesh.neighbours and MESH.id_of(routing) is None:
            # Entering the mesh here: give it an id (a plain router passes
            # it on like a domain), so no mesh router delivers it twice.
            ident = self.mesh.next_id()
            self.duplicates.seen(ident)
            routing = (ident,) + tuple(routing)
        out_routing = tuple(routing) + (self.domain,)
        body = None
        sent = 0
        for link in candidates:
            if link not in pulled:
                trace.notify(link, "notify_suppressed_filter", "out", attributes, out_routing,
                             lambda: self._encode(attributes, deliver_insecure, keys, out_routing))
                continue
            if link.fed_class is not None and not link.fed_class.export_filter.matches(attributes):
                trace.notify(link, "notify_suppressed_export", "out", attributes, out_routing,
                             lambda: self._encode(attributes, deliver_insecure, keys, out_routing))
                continue
            if body is None:
                body = self._encode(attributes, deliver_insecure, keys, out_routing)
            if len(body) > fed_packets.MAX_PACKET_LENGTH or link.output.send_encoded(body, True) is False:
                link.stats["overload"] += 1
                self._overloaded(link, len(body))
                trace.notify(link, "notify_dropped_overload", "out", attributes, out_routing,
                             lambda: body)
                continue
            link.stats["out"] += 1
            sent += 1
            trace.notify(link, "notify_forwarded", "out", attributes, out_routing, lambda: body)
        return sent

    @staticmethod
    def _encode(attributes, deliver_insecure, keys, routing):
        wire_keys = keys.to_wire() if keys else packets.Keys.EMPTY
        return packets.encode(fed_packets.FedNotify(attributes, deliver_insecure, wire_keys, routing))

    def shutdown(self):
        self._closing = True
        self._departed()
        if self in self.router.observers:
            self.router.observers.remove(self)    # a reload may make another
        for pending in (self._mesh_call, self._mesh_recompute):
            if pending is not None and pending.active():
                pending.cancel()
        for call in [*self._grace_calls.values(), *self._refresh_calls.values()]:
            if call.active():
                call.cancel()
        self._grace_calls.clear()
        self._refresh_calls.clear()
        for link in list(self.links):
            link.close("shutdown")
        if self._update_call is not None and self._update_call.active():
            self._update_call.cancel()
        for waiter in list(self._waiters):
            self._release(waiter)
        return self.trace.close()

    def status(self):
        return [{"domain": l.peer_domain, "host": l.peer_host,
                 "class": l.fed_class.name if l.fed_class else None,
                 "outgoing": l.outgoing, "mesh": l.mesh, "active": self.active(l),
                 **l.stats} for l in self.links]

