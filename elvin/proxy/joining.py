"""Joining sessions: reading a ConnRqst's ``Proxy.*`` options, checking
passwords off the reactor thread, and admitting the client to its sessions
(docs/proxy.md, "Sessions" and "Passwords"; the paper's 5.2.1).

Apart from the rest because admission is the one step that waits (scrypt
checks go through the ``PasswordGate``) and holds what the client sends
meanwhile, and because the password rules are easiest to read together.
``PasswordChecks`` is the ``ProxyCore``'s half, ``Joining`` the
``ProxyClient``'s.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Tuple

from twisted.internet import defer

from elvin import errors
from elvin.core.keys import CONSUMER, PRODUCER
from elvin.protocols import packets
from elvin.proxy.guard import Busy
from elvin.proxy.model import (ACK_WINDOW, ADMIN_PASSWORD, CLIENT, DESTRUCTIVE, EVENT,
                               MAX_COUNT, MAX_JOINED, NON_DESTRUCTIVE, PASSWORD, RECEIPT,
                               SESSION, TTL, Session, raw_ring)
from elvin.proxy.requests import Requests, split_options
from elvin.proxy.state import CoreState
from elvin.proxy.store import StoreFailed, check_password, hash_password

__all__ = ["PasswordChecks", "Joining", "sessions_asked", "join_rights", "needs_check"]


#: The Nack 2006 message for a new session while the store cannot write.
CANNOT_CREATE = ("the proxy cannot create a session now: its database cannot be written "
                 "(disk full?); existing sessions can still be joined")


class PasswordChecks(CoreState):
    """The core's part in joining: every password check, through the gate."""

    def check_passwords(self, wanted, peer=None):
        """Deferred ``[(name, rights, hashes)]`` for ConnRqst's ``[(name,
        password, admin password)]``: an existing session's rights (None:
        refused, False: join, True: change), or for a new one "new" and the
        hashes of its passwords. Every scrypt goes through ``gate`` (bounded,
        clean addresses first, failures throttled), one at a time, and the
        checks stop at the first refusal. Fails with Busy when the gate's
        queue is full."""
        return defer.ensureDeferred(self._check_passwords(wanted, peer))

    async def _check_passwords(self, wanted, peer):
        gate = self.gate
        checked: List[Tuple[str, Any, Any]] = []
        for name, password, admin_password in wanted:
            session = self.named.get(name)
            if session is None:
                hashes = []
                for given in (password, admin_password):
                    hashes.append(None if given is None else await gate.submit(
                        peer, functools.partial(hash_password, given)))
                checked.append((name, "new", tuple(hashes)))
                continue
            if not needs_check(session, password, admin_password):
                rights = join_rights(session, password, admin_password)
            elif gate.refuses(peer, name):
                rights = None
            else:
                rights = await gate.submit(
                    peer, functools.partial(join_rights, session, password, admin_password))
            if rights is None:
                if needs_check(session, password, admin_password):
                    gate.failed(peer, name)
                checked.append((name, None, None))
                break
            checked.append((name, rights, None))
        return checked


class Joining(Requests):
    """A client's ConnRqst: its options read, its passwords checked, its
    sessions joined and told to it (a ``ProxyClient`` part)."""

    def _connect(self, packet):
        if not self._admissible(packet):
            return
        core = self.core
        xid = packet.xid
        standard, proxy = split_options(packet.options)
        for wire, role in ((packet.nfn_keys, PRODUCER), (packet.sub_keys, CONSUMER)):
            if not self._valid_keys(xid, wire, role):
                return
        try:
            wanted = sessions_asked(proxy)
        except ValueError as e:
            self.nack(xid, errors.PROT_ERROR, str(e))
            return
        receipt = proxy.get(RECEIPT, DESTRUCTIVE)
        if receipt not in (DESTRUCTIVE, NON_DESTRUCTIVE):
            self.nack(xid, errors.PROT_ERROR,
                      f"{RECEIPT} must be {DESTRUCTIVE!r} or {NON_DESTRUCTIVE!r}, "
                      f"not {receipt!r}")
            return
        client = proxy.get(CLIENT)
        if client is not None and (not isinstance(client, str) or not client):
            self.nack(xid, errors.PROT_ERROR, f"{CLIENT} must be a non-empty string")
            return
        if receipt == NON_DESTRUCTIVE and wanted and client is None:
            self.nack(xid, errors.PROT_ERROR,
                      f"non-destructive receipt needs {CLIENT} (a name for this device, "
                      "the same at every connection), so that it never gets a "
                      "notification twice")
            return
        window = proxy.get(ACK_WINDOW, 0)
        if not isinstance(window, int) or window < 0:
            self.nack(xid, errors.PROT_ERROR, f"{ACK_WINDOW} must be a non-negative integer")
            return
        limits: Dict[str, Any] = {ACK_WINDOW: min(window, core.max_inflight)}
        for option in (TTL, MAX_COUNT):
            if option in proxy:
                value = proxy[option]
                if not isinstance(value, int) or value < 0:
                    self.nack(xid, errors.PROT_ERROR,
                              f"{option} must be a non-negative integer")
                    return
                limits[option] = value or None
        # Passwords are checked (scrypt: about 40 ms each) off the reactor
        # thread; what the client sends meanwhile waits (_admitting).
        self._admitting = []
        d = core.check_passwords(wanted, self.address())
        d.addCallback(self._admit, wanted, packet, standard, receipt, client, limits)
        d.addErrback(self._admission_failed, xid)

    def _admission_failed(self, failure, xid):
        # What the client sent meanwhile was for the session it asked for,
        # which it does not get (the Nack or the violation below says so):
        # it is not handled.
        self._admitting = None
        if self.state != self.NEW:
            return
        if failure.check(Busy):
            self.nack(xid, errors.IMPL_LIMIT, "the proxy is busy checking passwords; "
                                              "try again shortly")
            return
        if failure.check(StoreFailed):
            self.core.store_failed(failure.value)
            self.nack(xid, errors.IMPL_LIMIT, CANNOT_CREATE)
            return
        self.log.failure("admitting {peer} failed", failure, peer=self.peer)
        self.violation("the proxy could not admit the client")

    def _admit(self, checked, wanted, packet, standard, receipt, client, limits):
        """The passwords are checked: join the sessions (or refuse), then
        handle what the client sent meanwhile."""
        waiting, self._admitting = self._admitting, None
        if self.state != self.NEW:
            return                        # gone while we checked
        core, xid = self.core, packet.xid
        if any(name not in core.named for name, _, _ in wanted) and not core.store_writable():
            # A session row may still fit where notifications do not; one
            # made now would be the first thing lost if the proxy stopped.
            self.nack(xid, errors.IMPL_LIMIT, CANNOT_CREATE)
            return
        sessions, admin = [], set()
        host = str(core.gate.host(self.address()))
        for (name, password, admin_password), (_, rights, hashes) in zip(wanted, checked):
            session = core.named.get(name)
            if session is None:
                if len(core.named) >= core.max_sessions:
                    self.nack(xid, errors.IMPL_LIMIT,
                              f"the proxy holds its maximum number of sessions "
                              f"({core.max_sessions})")
                    return
                if not core.host_may_create(host):
                    self._refuse_host(xid, host)
                    return
                join_hash, admin_hash = hashes
                session = core.add_session(name, join_hash, admin_hash, creator=host)
                rights = True
            elif rights == "new":         # made by another client meanwhile
                rights = join_rights(session, password, admin_password)
            if rights is None:
                self.log.info("refused {peer}: wrong password for session {name!r}",
                              peer=self.peer, name=name)
                self.nack(xid, errors.AUTHZ_FAIL, "authorisation failed")
                return
            if rights:
                admin.add(name)
            sessions.append(session)
        if not sessions:
            sessions.append(Session())
            admin.add(None)
        nfn_keys, sub_keys = raw_ring(packet.nfn_keys), raw_ring(packet.sub_keys)
        primary = sessions[0]
        if (nfn_keys or sub_keys) and primary.name not in admin:
            self.nack(xid, errors.AUTHZ_FAIL,
                      "only the session's administrative password may change its keys")
            return
        reply = self.options.negotiate(standard)
        if nfn_keys or sub_keys:
            old = primary.sub_keys
            primary.nfn_keys = primary.nfn_keys.union(nfn_keys)
            primary.sub_keys = primary.sub_keys.union(sub_keys)
            core.save_keys(primary)
            if sub_keys:
                core.session_keys_changed(primary, old)
        self.joined, self.admin = sessions, admin
        self.destructive = receipt == DESTRUCTIVE
        self.name = client or core.client_name()
        self.ttl, self.max_count = limits.get(TTL), limits.get(MAX_COUNT)
        self.ack_window = limits[ACK_WINDOW]
        if self.ack_window:
            core.acking.add(self)
        for session in sessions:
            session.clients.add(self)
        if primary.persistent:
            reply.update({RECEIPT: receipt, CLIENT: self.name})
            if self.ack_window:
                reply[ACK_WINDOW] = self.ack_window
            core.write(core.store.seen, [s.name for s in sessions], core.clock())
            self.log.info("client {name!r} at {peer} joined {sessions}", name=self.name,
                          peer=self.peer, sessions=[s.name for s in sessions])
        else:
            self.log.info("client connected from {peer}", peer=self.peer)
        self._established(xid, reply)
        if primary.persistent:
            self._joined()
        for waiting_packet in waiting or ():
            self.packet_received(waiting_packet)

    def _refuse_host(self, xid, host):
        """Nack 2006: the sessions this client's host created are at
        ``max-sessions-per-host`` (logged at most once per 10 s)."""
        core = self.core
        most = core.max_sessions_per_host
        skipped = core.host_cap_log.allow()
        if skipped is not None:
            self.log.warn("refused a new session from {peer}: its host has created "
                          "{most} sessions the proxy keeps (max-sessions-per-host){more}",
                          peer=self.peer, most=most, more=core.host_cap_log.more(skipped))
        self.nack(xid, errors.IMPL_LIMIT,
                  f"the sessions created from this host are at the proxy's maximum for one "
                  f"host ({most}); join one of them, or delete one")

    def _joined(self):
        """Tell the client its sessions (4.5), their keys if it may change
        them (5.2.3), what it missed, and replay."""
        core = self.core
        store = core.store
        dropped = 0
        for session in self.joined:
            for sub in sorted(session.subscriptions.values(), key=lambda s: s.id):
                self.send_event(sub.event())
            if session.name in self.admin:
                keys = session.keys_event()
                if keys is not None:
                    self.send_event(keys)
            lost, gaps = core.take_dropped(session.name)
            dropped += lost
            self.send_event({EVENT: "joined", SESSION: session.name,
                             "Proxy.Subscriptions": len(session.subscriptions),
                             "Proxy.Stored": store.unexpired_count(session.name,
                                                                   core.clock()),
                             "Proxy.Dropped": lost, "Proxy.Gaps": gaps,
                             "Proxy.Admin": int(session.name in self.admin)})
        if dropped:
            self.send(packets.DropWarn())
        self.live = False
        self._replay()


def sessions_asked(proxy):
    """``[(name, password, admin password)]`` from ConnRqst's options:
    ``Proxy.Session`` (with ``Proxy.Password``, ``Proxy.Admin-Password``),
    then ``Proxy.Session.2`` (``Proxy.Password.2``, ...) and so on."""
    wanted: List[Tuple[str, Any, Any]] = []
    known = {RECEIPT, CLIENT, TTL, MAX_COUNT, ACK_WINDOW}
    for index in range(1, MAX_JOINED + 1):
        suffix = "" if index == 1 else f".{index}"
        name = proxy.get(SESSION + suffix)
        if name is None:
            continue
        if not isinstance(name, str) or not name:
            raise ValueError(f"{SESSION + suffix} must be a non-empty string")
        password, admin = proxy.get(PASSWORD + suffix), proxy.get(ADMIN_PASSWORD + suffix)
        for option, value in ((PASSWORD, password), (ADMIN_PASSWORD, admin)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{option + suffix} must be a string")
        if any(name == n for n, _, _ in wanted):
            raise ValueError(f"session {name!r} named twice")
        wanted.append((name, password, admin))
        known |= {SESSION + suffix, PASSWORD + suffix, ADMIN_PASSWORD + suffix}
    unknown = sorted(set(proxy) - known)
    if unknown:
        raise ValueError(f"unknown proxy option(s) {', '.join(unknown)} "
                         "(see docs/proxy.md)")
    return wanted


def join_rights(session, password, admin_password):
    """None: refused; False: may join and receive; True: may also change
    the session (the paper's two-level scheme, 5.2.1; docs/proxy.md,
    "Passwords"):

    * no password: anyone may join and change it;
    * a join password only: it joins, and changes;
    * an administrative password only: it joins, and changes; nothing
      else joins;
    * both: the join password joins and receives, the administrative one
      joins and changes.
    """
    if admin_password is not None and session.admin_hash is not None:
        if check_password(session.admin_hash, admin_password):
            return True
        return None
    if session.join_hash is not None:
        if password is None or not check_password(session.join_hash, password):
            return None
        return session.admin_hash is None
    if session.admin_hash is not None:
        return None
    return True


def needs_check(session, password, admin_password):
    """Would ``join_rights`` compute a scrypt hash?"""
    return ((admin_password is not None and session.admin_hash is not None)
            or (session.join_hash is not None and password is not None))
