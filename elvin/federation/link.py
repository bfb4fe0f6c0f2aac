"""One federation link: the router-to-router session of federation 1.0.

Like ``ClientSession``, it takes decoded packets and answers through an
output object (``send``, ``send_encoded``, ``close``, ``abort``), so it is
tested without sockets. The connecting side sends FedConnRqst; the
accepting side checks version, domain and class, and answers FedConnRply
or Nack. Once up, each side sends FedSubReplace with its pull filter and
acknowledges the other's; FedNotify carries notifications both ways.
"""

import enum
import itertools
from typing import TypedDict

from twisted.logger import Logger

from elvin import errors
from elvin.errors import SubscriptionError
from elvin.federation import filters, subast
from elvin.federation import packets as fed_packets
from elvin.federation.identity import domain_problem, shown
from elvin.federation.mesh import MAX_ADVERT_NEIGHBOURS, advert_domain
from elvin.core.keys import PRODUCER, KeyRing
from elvin.core.lograte import LogLimiter
from elvin.protocols import packets
from elvin.core.router import notification_problem

__all__ = ["FederationLink", "LinkState"]


class LinkState(enum.IntEnum):
    """Where a federation link is in its handshake (federation 1.0, 6.2)."""

    CONNECTING = 0        # we dialled and sent FedConnRqst
    AWAITING_REQUEST = 1  # we accepted and wait for FedConnRqst
    UP = 2                # linked: filters and notifications flow
    CLOSED = 3


#: What a link counts (``FederationLink.stats``): notifications in and out,
#: and those dropped as loops, suppressed, duplicates or for overload
#: (its send queue full), those counted out but still queued when the
#: connection was lost (unsent), pull-filter refreshes that changed nothing, and mesh adverts ignored
#: (the link is not a mesh link). Declared, so that a reader naming a
#: counter that is not here fails the type check.
LinkStats = TypedDict("LinkStats", {"in": int, "out": int, "loops": int, "suppressed": int,
                                    "duplicates": int, "overload": int, "unsent": int,
                                    "refreshed": int, "adverts_ignored": int})

#: The LinkStats that count notifications lost, with the cause each is
#: exported under (``elvin_federation_dropped``).
LOSS_CAUSES = (("loop", "loops"), ("import", "suppressed"), ("duplicate", "duplicates"),
               ("overload", "overload"), ("unsent", "unsent"))

#: Seconds between log lines about one link's ignored mesh adverts.
IGNORED_ADVERT_LOG_INTERVAL = 60.0


class FederationLink:
    log = Logger()

    CONNECTING, AWAITING_REQUEST, UP, CLOSED = LinkState

    def __init__(self, manager, output, outgoing, fed_class=None, peer_host=None):
        self.manager = manager
        self.output = output
        self.outgoing = outgoing
        self.fed_class = fed_class
        self.peer_host = peer_host
        self.peer_domain = None
        #: The configured link (``dial.DialledPeer``) this one was dialled
        #: for, if any: told when the link comes up and goes down.
        self.dial = None
        self.state = self.CONNECTING if outgoing else self.AWAITING_REQUEST
        self.remote_filter = filters.Filter(filters.FALSE)   # what the peer asked us for
        self.sent_filter = None                  # what we last asked the peer for
        self.acked_filter = None
        #: FedSubReplaces sent, and the latest of them the peer answered
        #: (Ack or Nack): a filter is in force once answered_seq reaches it.
        self.sent_seq = 0
        self.answered_seq = 0
        self._xids = itertools.count(1)
        self._pending = {}
        self.stats: LinkStats = {"in": 0, "out": 0, "loops": 0, "suppressed": 0,
                                 "duplicates": 0, "overload": 0, "unsent": 0,
                                 "refreshed": 0, "adverts_ignored": 0}
        #: Rate limit of this link's overload lines (made when first needed).
        self.overload_log = None
        self.dropwarn_log = None
        #: When ignored adverts were last logged, and how many had been then.
        self._adverts_logged_at = None
        self._adverts_logged = 0
        self._filter_heard = False
        #: When the peer last sent anything (the manager's clock's seconds;
        #: keepalives included).
        self.last_heard = None
        #: The peer is a mesh router (elvin.federation.mesh): True once it
        #: said so, False once its first pull filter came without the mark
        #: (a plain EFP 1.0 router), None until then.
        self.mesh = None
        #: The SubAST numbering the peer's filters showed it uses
        #: (elvin.federation.subast: SPEC, AVIS, or None while unknown).
        self.ast_numbering = None
        self._ambiguity_logged = False
        self._size = None
        # Notifications from a peer are held to the attribute limits an
        # ordinary client of this router gets (its default connection options).
        specs = getattr(manager.router, "option_specs", None) or {}
        self._limits = {name: spec.default for name, spec in specs.items()}
        self._dropped_log = LogLimiter(lambda: manager.clock.seconds())
        self._widened_log = LogLimiter(lambda: manager.clock.seconds())
        self._routing_log = LogLimiter(lambda: manager.clock.seconds())

    def __repr__(self):
        return (f"<FederationLink {self.peer_domain or self.peer_host} "
                f"state={self.state.name}>")

    # -- lifecycle -------------------------------------------------------------

    def start(self):
        """Called when the channel is open."""
        if self.outgoing:
            xid = next(self._xids)
            self._pending[xid] = "connect"
            self.output.send(fed_packets.FedConnRqst(xid, fed_packets.PROTOCOL_MAJOR, fed_packets.PROTOCOL_MINOR,
                                            self.manager.domain))

    def connection_lost(self, reason="connection lost"):
        if self.state != self.CLOSED:
            was_up = self.state == self.UP
            self.state = self.CLOSED
            self.manager.link_down(self, reason, was_up)

    def close(self, reason="closing"):
        """Close politely (Disconn) and forget the link at once."""
        if self.state == self.UP:
            self.output.send(packets.Disconn(1, reason))
        self.connection_lost(reason)
        self.output.close()

    def violation(self, reason):
        self.log.warn("federation protocol violation from {peer}: {reason}",
                      peer=self.peer_domain or self.peer_host, reason=reason)
        drop = getattr(self.output, "drop_unsent", None)
        if drop is not None:
            drop()          # lost with the link: counted before it goes down
        self.connection_lost(reason)
        self.output.abort()

    def handshake_timed_out(self, seconds):
        """The handshake was not done within ``seconds`` of the connection
        opening (the output's timer): close, whatever the peer sent."""
        if self.state == self.UP or self.state == self.CLOSED:
            return
        waiting = "FedConnRply" if self.outgoing else "FedConnRqst"
        self.log.warn("federation link with {host}: no {waiting} within {seconds:g} s; "
                      "closing", host=self.peer_host, waiting=waiting, seconds=seconds)
        self.connection_lost("handshake timeout")
        self.output.abort()

    # -- input -------------------------------------------------------------------

    def packet_received(self, packet, size=None):
        """Handle one packet; ``size`` is its encoded length (for traces)."""
        self.last_heard = self.manager.clock.seconds()
        if self.state == self.CLOSED:
            return
        self._size = size
        kind = type(packet)
        if self.state != self.UP and (kind is packets.TestConn or kind is packets.ConfConn):
            # Liveness holds from the moment the connection opens, before
            # the handshake too, both ways (as the Avis router's): a probe
            # is answered whatever the state, and an answer is taken.
            if kind is packets.TestConn:
                self.output.send(packets.ConfConn())
            return
        if self.state == self.AWAITING_REQUEST:
            if kind is fed_packets.FedConnRqst:
                self._accept(packet)
            else:
                self.violation(f"{kind.__name__} before FedConnRqst")
            return
        if self.state == self.CONNECTING:
            if kind is fed_packets.FedConnRply and self._pending.pop(packet.xid, None) == "connect":
                self._connected(packet.router_domain)
            elif kind is packets.Nack and self._pending.pop(packet.xid, None) == "connect":
                message = shown(packet.message)
                # (not ``message=``: Twisted's legacy observers overwrite it)
                self.log.warn("federation peer {host} refused us: {reason} ({code})",
                              host=self.peer_host, reason=message, code=packet.error)
                self.connection_lost(f"refused: {message}")
                self.output.close()
            elif kind is packets.Disconn:
                self.log.warn("federation peer {host} disconnected before the link was "
                              "up: reason {code}{text}", host=self.peer_host,
                              code=packet.reason, text=_disconn_text(packet))
                self.connection_lost("disconnected by peer")
                self.output.close()
            else:
                self.violation(f"{kind.__name__} while connecting")
            return
        handler = _HANDLERS.get(kind)
        if handler is None:
            self.violation(f"unexpected {kind.__name__} on an established link")
            return
        handler(self, packet)

    def notification_faulty(self, packet, problem, size=None):
        """A FedNotify that decoded only by taking the last value of a
        repeated attribute name (``problem``): a protocol error in a
        notification, which is ignored (client protocol 7.3.3): dropped,
        counted and traced as an import drop (``suppressed``,
        ``notify_dropped_import``), logged at most once per 10 s, and the
        link goes on. Any other such packet, or one before the link is up,
        is a violation."""
        self.last_heard = self.manager.clock.seconds()
        if self.state == self.CLOSED:
            return
        if self.state != self.UP or type(packet) is not fed_packets.FedNotify:
            self.violation(f"protocol_error: {problem} in {type(packet).__name__}")
            return
        self._size = size
        self.stats["in"] += 1
        self._drop_import(packet, problem)

    def _accept(self, packet):
        manager = self.manager
        if packet.major_version != fed_packets.PROTOCOL_MAJOR or packet.minor_version > fed_packets.PROTOCOL_MINOR:
            # Federation 6.2.1: close at once, as for a protocol violation.
            self.violation(f"federation protocol {packet.major_version}."
                           f"{packet.minor_version} not supported")
            return
        problem = manager.check_domain(packet.router_domain, self)
        code = errors.AUTHZ_FAIL
        if problem is None and self.fed_class is None:
            problem = f"no federation class applies to {self.peer_host}"
        if problem is None:
            problem = self._authentication_problem()
            code = errors.AUTHN_FAIL
        if problem is not None:
            self.log.warn("refused federation from {host} ({domain}): {problem}",
                          host=self.peer_host, domain=shown(packet.router_domain),
                          problem=problem)
            self.output.send(packets.Nack(packet.xid, code, problem, ()))
            self.state = self.CLOSED
            self.output.close()
            return
        self.output.send(fed_packets.FedConnRply(packet.xid, manager.domain))
        self._up(packet.router_domain)

    def _authentication_problem(self):
        """Why this link may not go on unauthenticated, or None.

        A class with ``Federation.Require-Authenticated[Class] = yes`` (or
        a peer host matching Avis's ``Federation.Require-Authenticated``)
        needs a TLS link whose peer presented a certificate that tls-ca
        verifies.
        """
        if not self.manager.requires_authentication(self.fed_class, self.peer_host):
            return None
        if not self.output.is_tls():
            return (f"{self._class_name()} requires an authenticated peer, and the link "
                    f"with {self.peer_host} is not over TLS")
        if self.output.peer_certificate() is None:
            return (f"{self._class_name()} requires an authenticated peer, and "
                    f"{self.peer_host} presented no certificate")
        return None

    def _class_name(self):
        if self.fed_class is not None and self.fed_class.require_authenticated:
            return f"federation class {self.fed_class.name!r}"
        return "Federation.Require-Authenticated"

    def refuse_unauthenticated(self, why):
        """An outgoing link that cannot be authenticated: log, close."""
        self.log.warn("not federating with {host}: {cls} requires an authenticated "
                      "peer, and {why}", host=self.peer_host, cls=self._class_name(),
                      why=why)
        self.connection_lost("unauthenticated")
        self.output.abort()

    def _connected(self, domain):
        problem = self.manager.check_domain(domain, self) or self._authentication_problem()
        if problem is not None:
            self.log.warn("closing federation link to {host} ({domain}): {problem}",
                          host=self.peer_host, domain=shown(domain), problem=problem)
            self.connection_lost(problem)
            self.output.close()
            return
        self._up(domain)

    def _up(self, domain):
        self.peer_domain = domain
        self.state = self.UP
        self.manager.link_up(self)

    # -- filters -------------------------------------------------------------------

    def send_filter(self, tree, force=False):
        """Send our pull filter if it changed since the last one (or,
        ``force``, whether or not: a soft-state refresh)."""
        if self.state != self.UP or (tree == self.sent_filter and not force):
            return False
        self.sent_filter = tree
        self.sent_seq += 1
        xid = next(self._xids)
        self._pending[xid] = ("filter", tree, self.sent_seq)
        numbering = subast.SPEC if self.mesh else self.ast_numbering
        packet = fed_packets.FedSubReplace(xid, subast.wire_filter(
            filters.to_wire(tree), numbering, ours=bool(self.mesh)))
        self.output.send(packet)
        self.manager.trace.subreplace(self, "out", tree)
        return True

    def _sub_replace(self, packet):
        try:
            # A mesh router says what it is with one disjunct of its filter
            # (mesh.MARKER_NAME). Every router takes it out, a plain one too,
            # so that no router passes a peer's mark on as its own.
            tree = self._read_filter(packet.pull_filter)
            tree, marked = filters.strip_marker(tree, self.manager.mesh_marker)
            # Patterns as another dialect means them (elvin.federation.subast).
            tree = subast.received(tree, ours=marked)
            if self.manager.mesh is not None:
                if marked and not self.mesh:
                    self.mesh = True
                    self.manager.mesh_peer_found(self)
                elif not marked and self.mesh is None:
                    self.mesh = False     # a plain peer: the manager hears of it below
            if tree is not filters.TRUE and tree is not filters.FALSE:
                if _larger_than(tree, self.manager.max_filter_nodes):
                    # We never send a filter over max_filter_nodes; a bigger
                    # one would cost every notification its evaluation. Widen
                    # it to TRUE: the peer gets more than it asked for, never less.
                    tree = filters.TRUE
                else:
                    tree = filters.from_wire(tree)
        except SubscriptionError as e:
            self.output.send(packets.Nack(packet.xid, e.code, f"bad pull filter: {e}", ()))
            return
        heard, self._filter_heard = self._filter_heard, True
        self.manager.trace.subreplace(self, "in", tree)
        if heard and tree == self.remote_filter.tree:
            self.output.send(fed_packets.Ack(packet.xid))
            self.stats["refreshed"] += 1      # a refresh that changes nothing
            return
        self.remote_filter = filters.Filter(tree)

        def answer():
            if self.state == self.UP:
                self.output.send(fed_packets.Ack(packet.xid))
        # Among mesh routers the Ack may wait until our other peers answered
        # the filters this one changes (FederationManager.remote_filter_changed).
        if not self.manager.remote_filter_changed(self, answer):
            answer()

    def _foreign_pattern_widened(self):
        skipped = self._widened_log.allow()
        if skipped is not None:
            self.log.info("federation peer {peer} sent a pull filter with a pattern this "
                          "router cannot compile (another dialect's): that part is read "
                          "as its required names, so the peer gets more, never less{more}",
                          peer=shown(self.peer_domain), more=self._widened_log.more(skipped))

    def _read_filter(self, wire):
        """The peer's pull filter as it meant it (elvin.federation.subast)."""
        known = self.ast_numbering
        tree, self.ast_numbering, both = subast.read_filter(wire, known,
                                                            self._foreign_pattern_widened)
        if self.ast_numbering != known:
            self.log.info("federation peer {peer} numbers SubAST operators as {numbering} "
                          "does: filters to it are sent so", peer=shown(self.peer_domain),
                          numbering="the spec" if self.ast_numbering == subast.SPEC
                          else "Avis")
            if self.sent_filter is not None and subast.uses_ambiguous(self.sent_filter):
                self.send_filter(self.sent_filter, force=True)
        elif both and not self._ambiguity_logged:
            self._ambiguity_logged = True
            self.log.info("federation peer {peer} sent a pull filter whose operators the "
                          "spec and Avis number differently: both readings are served",
                          peer=shown(self.peer_domain))
        return tree

    def _ack(self, packet):
        pending = self._pending.pop(packet.xid, None)
        if isinstance(pending, tuple) and pending[0] == "filter":
            self.acked_filter = pending[1]
            self._answered(pending[2])

    def _answered(self, seq):
        if seq > self.answered_seq:
            self.answered_seq = seq
            self.manager.filter_answered(self)

    def _nack(self, packet):
        pending = self._pending.pop(packet.xid, None)
        if isinstance(pending, tuple) and pending[0] == "filter":
            self._answered(pending[2])      # refused: nothing more to wait for
        self.log.warn("federation peer {peer} rejected our {what}: {reason}",
                      peer=self.peer_domain, what=pending, reason=shown(packet.message))

    # -- notifications --------------------------------------------------------------

    def _fed_notify(self, packet):
        self.stats["in"] += 1
        manager = self.manager
        routing = packet.routing
        if self.peer_domain not in routing:
            # EFP 6.2.4 has the sender add its domain; one that did not
            # would hide where the notification has been from the routers
            # after us (their loop and duplicate checks). Added here, as
            # the sender should have (Avis ends the link instead).
            routing = (*routing, self.peer_domain)
            skipped = self._routing_log.allow()
            if skipped is not None:
                self.log.info("federation peer {peer} sent a FedNotify whose routing list "
                              "lacks its own domain: added{more}", peer=self.peer_domain,
                              more=self._routing_log.more(skipped))
        if manager.domain in routing:
            self.stats["loops"] += 1
            manager.trace.notify(self, "notify_dropped_loop", "in", packet.attributes,
                                 routing, self._encoded_size(packet))
            return
        if manager.is_duplicate(routing):
            # Seen already by another path (the mesh's tree was changing).
            self.stats["duplicates"] += 1
            manager.trace.notify(self, "notify_dropped_duplicate", "in", packet.attributes,
                                 routing, self._encoded_size(packet))
            return
        attributes = packet.attributes
        problem = notification_problem(self._limits, attributes) if self._limits else None
        if problem is None and self._limits:
            # As a client's NotifyEmit: more keys than Connection.Max-Keys
            # are not hashed (200,000 keys took half a second).
            most = self._limits.get("Connection.Max-Keys")
            if most is not None and packet.keys.key_count() > most:
                problem = f"more than Connection.Max-Keys ({most}) keys"
        if problem is not None or not self.fed_class.import_filter.matches(attributes):
            self._drop_import(packet, problem)
            return
        manager.trace.notify(self, "notify_received", "in", attributes, routing,
                             self._encoded_size(packet))
        # A FedNotify carries the producer's keys as the producer gave them
        # (what Avis sends): prepared here as a NotifyEmit's would be, and
        # passed on unchanged.
        try:
            keys = KeyRing.from_wire(packet.keys, PRODUCER)
            forward_keys = KeyRing.from_prepared_wire(packet.keys)
        except errors.ElvinError:
            keys = forward_keys = KeyRing.EMPTY
        manager.router.route(attributes, packet.deliver_insecure, keys, KeyRing.EMPTY,
                             routing=tuple(routing), source=self,
                             forward_keys=forward_keys)

    def _drop_import(self, packet, problem=None):
        """Drop a FedNotify at import: one the import filter refuses, or
        with a ``problem`` (logged, at most once per 10 s)."""
        if problem is not None:
            skipped = self._dropped_log.allow()
            if skipped is not None:
                self.log.info("dropped notification from federation peer {peer}: "
                              "{problem}{more}", peer=self.peer_domain, problem=problem,
                              more=self._dropped_log.more(skipped))
        self.stats["suppressed"] += 1
        self.manager.trace.notify(self, "notify_dropped_import", "in", packet.attributes,
                                  packet.routing, self._encoded_size(packet))

    def _encoded_size(self, packet):
        size = self._size
        if size is None:
            return lambda: packets.encode(packet)
        return lambda: _Sized(size)

    def _mesh_advert(self, packet):
        if self.manager.mesh is None:
            self._ignore_advert("federation mesh is off here")
            return
        if not self.mesh:
            # A link is what its peer's first pull filter says, and adverts
            # go only to peers whose filters carried the mesh marker: an
            # advert on any other link changes nothing.
            self._ignore_advert("not a mesh link (its first pull filter had no mesh "
                                "marker)" if self.mesh is False else
                                "its first pull filter has not arrived")
            return
        if len(packet.neighbours) > MAX_ADVERT_NEIGHBOURS:
            self._ignore_advert(f"it names {len(packet.neighbours)} neighbours, more than "
                                f"{MAX_ADVERT_NEIGHBOURS}")
            return
        for domain in (packet.origin, *map(advert_domain, packet.neighbours)):
            problem = domain_problem(domain)
            if problem is not None:
                # Other routers' domains, held as long as the advert lives.
                self.log.warn("ignored a mesh advert from {peer} naming {domain}: {problem}",
                              peer=self.peer_domain, domain=shown(domain), problem=problem)
                return
        self.manager.mesh_advert(self, packet)

    def _ignore_advert(self, why):
        """Count an ignored FedMeshAdvert; log at most one line per
        ``IGNORED_ADVERT_LOG_INTERVAL`` for the link, with the count."""
        self.stats["adverts_ignored"] += 1
        now = self.manager.clock.seconds()
        last = self._adverts_logged_at
        if last is not None and now - last < IGNORED_ADVERT_LOG_INTERVAL:
            return
        count = self.stats["adverts_ignored"] - self._adverts_logged
        self._adverts_logged_at, self._adverts_logged = now, self.stats["adverts_ignored"]
        self.log.warn("ignored {count} mesh advert(s) from federation peer {peer}: {why}",
                      count=count, peer=self.peer_domain, why=why)

    def _test_conn(self, packet):
        self.output.send(packets.ConfConn())

    def _conf_conn(self, packet):
        pass

    def _disconn(self, packet):
        self.log.info("federation peer {peer} disconnected (reason {reason}{text})",
                      peer=self.peer_domain, reason=packet.reason,
                      text=_disconn_text(packet))
        self.connection_lost("disconnected by peer")
        self.output.close()

    def _drop_warn(self, packet):
        if self.state == self.UP:
            self.manager.peer_dropped(self)


def _disconn_text(packet):
    """A Disconn's text (a redirection's URI, or the peer's reason: Avis
    says why it ends a link there), ready to follow its code."""
    return f": {shown(packet.args)}" if packet.args else ""


def _larger_than(tree, limit):
    """True when the SubAST ``tree`` has more than ``limit`` nodes."""
    count = 0
    stack = [tree]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            return True
        stack.extend(node.children)
    return False


class _Sized:
    """Stands in for bytes of a known length (only ``len`` is used)."""

    __slots__ = ("n",)

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


_HANDLERS = {
    fed_packets.FedMeshAdvert: FederationLink._mesh_advert,
    fed_packets.FedSubReplace: FederationLink._sub_replace,
    fed_packets.FedNotify: FederationLink._fed_notify,
    fed_packets.Ack: FederationLink._ack,
    packets.Nack: FederationLink._nack,
    packets.TestConn: FederationLink._test_conn,
    packets.ConfConn: FederationLink._conf_conn,
    packets.Disconn: FederationLink._disconn,
    packets.DropWarn: FederationLink._drop_warn,
}
