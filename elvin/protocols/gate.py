"""The Twisted side of ``elvin.core.admission``: the open-file limit, and
a gate in front of every listener that refuses or makes room at accept
time.

* :func:`raise_open_file_limit` raises the soft ``RLIMIT_NOFILE`` to the
  hard limit (where it can) and returns the limit then in force.
* :class:`Admission` holds the router's :class:`ConnectionBudget`.
  ``gate(factory, pool)`` wraps the *outermost* factory of a listener (for
  TLS: beneath the TLS layer, see ``endpoint``), so a refused connection
  is closed before anything is built for it (``buildProtocol`` returns
  None: Twisted closes the socket at once), and every admitted one is
  counted until its ``connectionLost``. Protocols find their ticket as
  ``admission`` (set on the outermost protocol and every
  ``wrappedProtocol`` under it) and mark it busy or idle;
  ``ElvinServerProtocol`` and :class:`AdmittedHTTPChannel` do.
* A timer closes the idle connections of crowded pools (``expired``),
  and connections out of time in their TLS handshake; a TLS connection
  beyond ``max-tls-handshakes`` closes the oldest still in a handshake.
"""

import time

from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.web import http
from zope.interface import implementer

from elvin.core.admission import (CLIENT, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_HANDSHAKES,
                                  REAP_SLACK, SETTING, ConnectionBudget, fit_caps)

__all__ = ["Admission", "GateFactory", "GatedEndpoint", "AdmittedHTTPChannel",
           "raise_open_file_limit", "open_file_limit"]


def open_file_limit(getrlimit=None):
    """``(soft, hard)`` RLIMIT_NOFILE, or None where there is none."""
    try:
        import resource
    except ImportError:          # pragma: no cover - not on Windows
        return None
    getrlimit = getrlimit or resource.getrlimit
    try:
        return getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None


def raise_open_file_limit(getrlimit=None, setrlimit=None):
    """Raise the soft open-file limit to the hard one; ``(soft, hard)`` in
    force afterwards (unchanged if the system refuses), or None."""
    import resource
    limits = open_file_limit(getrlimit)
    if limits is None:
        return None
    soft, hard = limits
    setrlimit = setrlimit or resource.setrlimit
    if hard == resource.RLIM_INFINITY:
        # Linux refuses an unlimited RLIMIT_NOFILE; its ceiling is nr_open.
        targets = [_nr_open(), 1 << 20]
    else:
        targets = [hard]
    for target in targets:
        if target is None or (soft != resource.RLIM_INFINITY and target <= soft):
            continue
        try:
            setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            continue
        return target, hard
    return soft, hard


def reachable_open_files(getrlimit=None):
    """The most open files the router can have once it has raised its soft
    limit (``raise_open_file_limit``), or None where there is no limit."""
    import resource
    limits = open_file_limit(getrlimit)
    if limits is None:
        return None
    soft, hard = limits
    if hard == resource.RLIM_INFINITY:
        return _nr_open() or 1 << 20
    return max(soft, hard) if soft != resource.RLIM_INFINITY else hard


def _nr_open():
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


@implementer(IStreamServerEndpoint)
class GatedEndpoint:
    """A server endpoint whose listening factory is wrapped by ``wrap``
    (under any TLS layer wrapped around this endpoint)."""

    def __init__(self, endpoint, wrap):
        self.endpoint = endpoint
        self.wrap = wrap

    def listen(self, factory):
        return self.endpoint.listen(self.wrap(factory))


class GateFactory:
    """The outermost factory of a listener: admits, makes room or refuses
    each connection for pool ``pool`` of ``admission``'s budget."""

    def __init__(self, factory, admission, pool):
        self.factory = factory
        self.admission = admission
        self.pool = pool

    def buildProtocol(self, addr):
        admission = self.admission
        admitted, victim = admission.budget.admit(self.pool)
        if victim is not None:
            victim.close()
        if not admitted:
            admission.note(self.pool)
            return None
        proto = self.factory.buildProtocol(addr)
        if proto is None:
            return None
        ticket = admission.budget.opened(self.pool, lambda: _abort(proto))
        inner = proto
        while inner is not None:
            inner.admission = ticket
            inner = getattr(inner, "wrappedProtocol", None)
        if isinstance(proto, TLSMemoryBIOProtocol):
            # Bounded while in its handshake (ServerTLSOptions says when it ends).
            stalled = admission.budget.handshaking(ticket)
            if stalled is not None:
                stalled.close()
                admission.note(stalled.pool.name)
        lost = proto.connectionLost

        def connectionLost(*args, **kwargs):
            ticket.release()
            proto.__dict__.pop("connectionLost", None)
            return lost(*args, **kwargs)
        proto.connectionLost = connectionLost
        if victim is not None:
            admission.note(self.pool)
        admission.watch()
        return proto

    def doStart(self):
        self.factory.doStart()

    def doStop(self):
        self.factory.doStop()

    def logPrefix(self):
        prefix = getattr(self.factory, "logPrefix", None)
        return prefix() if prefix is not None else type(self.factory).__name__

    def __getattr__(self, name):
        return getattr(self.factory, name)


def _abort(proto):
    transport = getattr(proto, "transport", None)
    if transport is not None:
        transport.abortConnection()


class Admission:
    """The router's connection budget and the Twisted parts around it."""

    log = Logger()

    def __init__(self, caps, clock, crowded_timeout=2.0,
                 max_handshakes=DEFAULT_MAX_HANDSHAKES,
                 handshake_timeout=DEFAULT_HANDSHAKE_TIMEOUT):
        self.clock = clock
        self.budget = ConnectionBudget(caps, crowded_timeout,
                                       now=getattr(clock, "seconds", time.monotonic),
                                       max_handshakes=max_handshakes,
                                       handshake_timeout=handshake_timeout)
        self.configured = dict(caps)
        self._sweep = None

    def gate(self, factory, pool=CLIENT):
        return GateFactory(factory, self, pool)

    def endpoint(self, endpoint, pool=CLIENT):
        """``endpoint`` with this budget's gate under anything wrapped
        around it (TLS)."""
        return GatedEndpoint(endpoint, lambda factory: self.gate(factory, pool))

    # -- the open-file limit ------------------------------------------------------

    def fit(self, configured, reserved, getrlimit=None, setrlimit=None):
        """Raise the soft open-file limit to the hard one and set the caps
        from ``configured`` ({pool: cap}) so that they and ``reserved``
        other files fit it; log a line for each cap lowered. Returns the
        caps."""
        self.configured = dict(configured)
        limits = raise_open_file_limit(getrlimit, setrlimit)
        caps = dict(configured)
        if limits is not None:
            soft, hard = limits
            caps, lowered = fit_caps(soft, configured, reserved + REAP_SLACK)
            if lowered:
                self.log.warn(
                    "{changes} to fit the open-file limit of {soft} (hard limit "
                    "{hard}), keeping {reserved} files for listeners, log, outgoing "
                    "links and reserved-files; raise the limit (ulimit -n, systemd "
                    "LimitNOFILE=) to keep the configured values",
                    changes="; ".join(f"{SETTING[pool]} lowered from {was} to {now}"
                                      for pool, was, now in lowered),
                    soft=soft, hard="unlimited" if hard < 0 else hard,
                    reserved=reserved + REAP_SLACK)
        for pool, cap in caps.items():
            self.budget.set_cap(pool, cap)
        return caps

    # -- refusals and idle connections ----------------------------------------------

    def note(self, pool):
        """A connection was refused, or an idle one closed to make room:
        log it, at most once per report interval per pool."""
        line = self.budget.report(pool)
        if line is not None:
            self.log.warn("{line}", line=line)

    def watch(self):
        """Make sure a timer will close idle connections of crowded pools."""
        if self._sweep is not None and self._sweep.active():
            return
        delay = self.budget.next_expiry()
        call_later = getattr(self.clock, "callLater", None)
        if delay is not None and call_later is not None:
            self._sweep = call_later(delay, self._expire)

    def _expire(self):
        self._sweep = None
        expired = self.budget.expired()
        for ticket in expired:
            ticket.close()
        for pool in {ticket.pool.name for ticket in expired}:
            self.note(pool)
        self.watch()

    def stop(self):
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = None


class AdmittedHTTPChannel(http.HTTPChannel):
    """An HTTPChannel that tells its admission ticket when it serves a
    request (busy) and when it waits for the next one (idle)."""

    admission = None

    def allContentReceived(self):
        if self.admission is not None:
            self.admission.busy()
        super().allContentReceived()

    def requestDone(self, request):
        if self.admission is not None:
            # Before super(): it may start on a pipelined request (busy).
            self.admission.idle()
        super().requestDone(request)
