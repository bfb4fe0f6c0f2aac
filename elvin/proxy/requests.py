"""A proxy client's requests once it has joined: subscriptions (made
upstream, announced to the session's other clients), QosRqst with the
proxy's options (TTL, Max-Count, Delete-Session, Ack), SecRqst on the
session's keys, notifications sent up, quench refused (docs/proxy.md).

Apart from the rest because these are the router's request handlers
replaced: each checks what the router would, then asks the core
(``elvin.proxy.core``) or upstream.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from elvin import errors
from elvin.client.state import NackError, RequestTimeout
from elvin.core.keys import CONSUMER, PRODUCER, KeyRing
from elvin.core.router import PROTOCOL_MAJOR, compile_expression, notification_problem, \
    subscription_nack_args
from elvin.errors import ElvinError, SubscriptionError
from elvin.protocols import packets
from elvin.proxy.model import (ACK, ACK_WINDOW, DELETE_SESSION, EVENT, MAX_COUNT, SESSION,
                               TTL, ProxySubscription, raw_ring)
from elvin.proxy.delivery import Receiving
from elvin.values import Int64

__all__ = ["Requests"]


class Requests(Receiving):
    """A ``ProxyClient``'s request handlers (its ``HANDLERS``)."""

    def _valid_keys(self, xid, wire, role):
        if not wire:
            return True
        if wire.key_count() > self.options["Connection.Max-Keys"]:
            self.protocol_error(xid, errors.QOS_LIMIT, "more keys than Connection.Max-Keys",
                      ("Connection.Max-Keys",))
            return False
        try:
            KeyRing.from_wire(wire, role)
        except ElvinError as e:
            self.protocol_error(xid, e.code, str(e), e.nack_args)
            return False
        return True

    def _may_change(self, xid, session) -> bool:
        if session.name in self.admin:
            return True
        self.protocol_error(xid, errors.AUTHZ_FAIL,
                  "changing the session needs its administrative password")
        return False

    def _own(self, xid, sub_id) -> Optional[ProxySubscription]:
        sub = self.core.subscriptions.get(sub_id)
        if sub is None or sub.session not in self.joined:
            self.protocol_error(xid, errors.NO_SUCH_SUB, f"no such subscription: {sub_id}",
                      (Int64(sub_id if sub_id < (1 << 63) else sub_id - (1 << 64)),))
            return None
        return sub

    def _compiles(self, xid, expression) -> bool:
        max_length = self.options["Subscription.Max-Length"]
        if len(expression.encode("utf-8")) > max_length:
            self.protocol_error(xid, errors.QOS_LIMIT, f"subscription longer than "
                      f"Subscription.Max-Length ({max_length} bytes)",
                      ("Subscription.Max-Length",))
            return False
        try:
            compile_expression(expression)
        except SubscriptionError as e:
            self.protocol_error(xid, e.code, str(e), subscription_nack_args(e))
            return False
        return True

    def _wait_for_upstream(self, d):
        """The request being handled is answered when ``d`` (upstream's
        answer) fires: what the client sends meanwhile waits (``_awaiting``,
        handled by ``packet_received``), so replies keep request order and
        a DisconnRqst is answered after every request before it. The wait
        is bounded by upstream-timeout (``_upstream_timed_out``), and by the
        upstream connection's loss, after which the request is answered
        without it."""
        if self._awaiting is None:
            self._awaiting = []
        d.addBoth(self._upstream_answered)

    def _upstream_answered(self, result):
        waiting, self._awaiting = self._awaiting, None
        for packet in waiting or ():
            self.packet_received(packet)       # held again behind a new wait
        return result

    def _relay_nack(self, failure, xid):
        """An upstream refusal, to the client (same code, message, args)."""
        error = failure.value
        self.protocol_error(xid, error.code, error.router_message or str(error), error.nack_args)

    def _upstream_timed_out(self, failure, xid, request, sub):
        """Upstream did not answer the client's ``request`` for ``sub`` within
        upstream-timeout: counted and logged, and the client refused with
        Nack 2006 (IMPL_LIMIT: the proxy's bound on the time it waits for
        upstream was reached; nothing of the request was done)."""
        self.core.upstream_timed_out(failure, request, sub, "refused to the client (Nack 2006)")
        self.nack(xid, errors.IMPL_LIMIT,           # (logged once, above: not protocol_error)
                  f"the upstream router did not answer within {failure.value.seconds:g} s "
                  "(the proxy's upstream-timeout): nothing was changed")

    def _sub_add(self, packet):
        xid = packet.xid
        session = self.primary
        if not self._may_change(xid, session):
            return
        limit = (self.core.max_session_subscriptions if session.persistent
                 else self.options["Subscription.Max-Count"])
        if len(session.subscriptions) >= limit:
            self.protocol_error(xid, errors.IMPL_LIMIT if session.persistent else errors.QOS_LIMIT,
                      f"the session already has {limit} subscriptions, its maximum",
                      () if session.persistent else ("Subscription.Max-Count",))
            return
        if not self._valid_keys(xid, packet.keys, CONSUMER):
            return
        if not self._compiles(xid, packet.expression):
            return
        core = self.core
        sub = core.new_subscription(session, packet.expression, packet.accept_insecure,
                                    raw_ring(packet.keys), self.ttl, self.max_count)
        d = core.subscribe_upstream(sub)

        def added(_=None):
            self.send(packets.SubRply(xid, sub.id))
            core.announce(session, sub.event(), but=self)

        if d is None:
            added()
            return

        def failed(failure):
            if failure.check(NackError):
                core.remove_subscription(sub)
                self._relay_nack(failure, xid)
            elif failure.check(RequestTimeout):
                core.remove_subscription(sub)     # a late SubRply is undone upstream
                self._upstream_timed_out(failure, xid, "SubAddRqst", sub)
            else:
                added()       # upstream went away: made again when it is back
        d.addCallbacks(added, failed)
        self._wait_for_upstream(d)

    def _sub_mod(self, packet):
        xid = packet.xid
        sub = self._own(xid, packet.subscription_id)
        if sub is None or not self._may_change(xid, sub.session):
            return
        for wire in (packet.add_keys, packet.del_keys):
            if not self._valid_keys(xid, wire, CONSUMER):
                return
        expression = packet.expression or sub.expression
        if packet.expression and not self._compiles(xid, packet.expression):
            return
        keys = sub.keys.union(raw_ring(packet.add_keys)).difference(
            raw_ring(packet.del_keys))
        core = self.core

        def apply(_=None):
            sub.expression, sub.accept_insecure, sub.keys = (
                expression, packet.accept_insecure, keys)
            core.save(sub)
            if sub.id in core.subscriptions:
                core.place(sub)
            self.send(packets.SubRply(xid, sub.id))
            core.announce(sub.session, sub.event(), but=self)

        d = core.modify_upstream(sub, expression, packet.accept_insecure, keys)
        if d is None:
            apply()
            return

        def failed(failure):
            if failure.check(NackError):
                self._relay_nack(failure, xid)
            elif failure.check(RequestTimeout):
                self._upstream_timed_out(failure, xid, "SubModRqst", sub)  # a late SubRply: reversed
            else:
                apply()
        d.addCallbacks(apply, failed)
        self._wait_for_upstream(d)

    def _sub_del(self, packet):
        xid = packet.xid
        sub = self._own(xid, packet.subscription_id)
        if sub is None or not self._may_change(xid, sub.session):
            return
        self.core.remove_subscription(sub)
        self.send(packets.SubRply(xid, sub.id))
        self.core.announce(sub.session, {EVENT: "subscription-removed",
                                         SESSION: sub.session.name,
                                         "Proxy.Subscription": Int64(sub.id)}, but=self)

    def _qos_rqst(self, packet):
        xid = packet.xid
        if type(packet.options) is packets.UnreadArray:
            # Left unread, as the router leaves one (its _qos_rqst).
            self.protocol_error(xid, errors.QOS_LIMIT,
                                f"more options than Attribute.Max-Count or 64, whichever "
                                f"is more ({packet.options.limit})",
                                ("Attribute.Max-Count",))
            return
        standard, proxy = split_options(packet.options)
        changes: List[Tuple[str, Any, Optional[int]]] = []
        for option, value in proxy.items():
            base, _, number = option.rpartition(".") if option.count(".") == 2 else (
                option, "", "")
            if option == ACK:
                if not self.ack_window:
                    self.protocol_error(xid, errors.PROT_ERROR,
                                        f"{ACK} needs {ACK_WINDOW} at connect")
                    return
                if not isinstance(value, int) or not 0 <= value <= self._sent:
                    self.protocol_error(xid, errors.PROT_ERROR,
                                        f"{ACK} must count notifications sent on this "
                                        f"connection (0 to {self._sent}), not {value!r}")
                    return
                changes.append((ACK, None, value))
            elif option == DELETE_SESSION:
                session = self.core.named.get(value) if isinstance(value, str) else None
                if session is None or session not in self.joined:
                    self.protocol_error(xid, errors.PROT_ERROR,
                              f"{DELETE_SESSION}: not a session this client has joined")
                    return
                if not self._may_change(xid, session):
                    return
                changes.append((DELETE_SESSION, session, None))
            elif base in (TTL, MAX_COUNT):
                if not isinstance(value, int) or value < 0:
                    self.protocol_error(xid, errors.PROT_ERROR,
                              f"{option} must be a non-negative integer")
                    return
                if number:
                    sub = self._own(xid, int(number)) if number.isdigit() else None
                    if sub is None:
                        if not number.isdigit():
                            self.protocol_error(xid, errors.PROT_ERROR, f"bad option {option!r}")
                        return
                    if not self._may_change(xid, sub.session):
                        return
                    changes.append((base, sub, value or None))
                else:
                    changes.append((base, None, value or None))
            else:
                self.protocol_error(xid, errors.PROT_ERROR, f"unknown proxy option {option!r}")
                return
        reply = self.options.negotiate(standard)
        self.output.configure(self.options)
        changed: Set[ProxySubscription] = set()
        for what, target, value in changes:
            if what == DELETE_SESSION:
                reply[DELETE_SESSION] = target.name
                continue
            if what == ACK:
                reply[ACK] = Int64(value)
                continue
            if target is None:
                if what == TTL:
                    self.ttl = value
                else:
                    self.max_count = value
            else:
                if what == TTL:
                    target.ttl = value
                else:
                    target.max_count = value
                changed.add(target)
            reply[what if target is None else f"{what}.{target.id}"] = value or 0
        for sub in changed:
            self.core.save(sub)
            self.core.announce(sub.session, sub.event(), but=self)
        self.send(packets.QosRply(xid, reply))
        for what, target, value in changes:
            if what == DELETE_SESSION:
                self.core.delete_session(target)
            elif what == ACK:
                self.acknowledged(value)

    def _sec_rqst(self, packet):
        xid = packet.xid
        session = self.primary
        if not self._may_change(xid, session):
            return
        for wire, role in ((packet.add_nfn_keys, PRODUCER), (packet.del_nfn_keys, PRODUCER),
                           (packet.add_sub_keys, CONSUMER), (packet.del_sub_keys, CONSUMER)):
            if not self._valid_keys(xid, wire, role):
                return
        add_nfn, del_nfn = raw_ring(packet.add_nfn_keys), raw_ring(packet.del_nfn_keys)
        add_sub, del_sub = raw_ring(packet.add_sub_keys), raw_ring(packet.del_sub_keys)
        if session.nfn_keys.intersects(add_nfn) or session.sub_keys.intersects(add_sub):
            self.protocol_error(xid, errors.KEY_EXISTS, "key already registered")
            return
        if not (session.nfn_keys.contains_all(del_nfn)
                and session.sub_keys.contains_all(del_sub)):
            self.protocol_error(xid, errors.NO_SUCH_KEY, "no such key to remove")
            return
        old = session.sub_keys
        session.nfn_keys = session.nfn_keys.union(add_nfn).difference(del_nfn)
        session.sub_keys = session.sub_keys.union(add_sub).difference(del_sub)
        self.core.save_keys(session)
        if add_sub or del_sub:
            self.core.session_keys_changed(session, old)
        self.send(packets.SecRply(xid))

    def _nfn_keys(self) -> KeyRing:
        keys = KeyRing.EMPTY
        for session in self.joined:
            if session.nfn_keys:
                keys = keys.union(session.nfn_keys)
        return keys

    def _unotify(self, packet):
        if packet.client_major_version != PROTOCOL_MAJOR:
            return
        self._emit_upstream(packet.attributes, packet.deliver_insecure, packet.keys, KeyRing.EMPTY)

    def _emit_upstream(self, attributes, deliver_insecure, wire_keys, connection_keys, size=None):
        problem = notification_problem(self.options, attributes, size)
        if problem is None and wire_keys:
            # Counted before any is hashed, as the router does.
            most = self.options["Connection.Max-Keys"]
            if wire_keys.key_count() > most:
                problem = f"more keys than Connection.Max-Keys ({most})"
        if problem is None and wire_keys:
            try:
                KeyRing.from_wire(wire_keys, PRODUCER)
            except ElvinError as e:
                problem = str(e)
        if problem is not None:
            self.log.info("ignored notification from {peer}: {problem}", peer=self.peer,
                          problem=problem)
            return
        keys = connection_keys.union(raw_ring(wire_keys)) if wire_keys else connection_keys
        self.core.forward(attributes, deliver_insecure, keys.to_wire() if keys else packets.Keys.EMPTY)

    def _quench(self, packet):
        self.protocol_error(packet.xid, errors.NOT_IMPL,
                            "the proxy does not relay quench requests (docs/proxy.md)")


def split_options(options):
    """(the standard connection options, the proxy's ``Proxy.*`` ones)."""
    standard: Dict[str, Any] = {}
    proxy: Dict[str, Any] = {}
    for name, value in options.items():
        (proxy if name.startswith("Proxy.") else standard)[name] = value
    return standard, proxy
