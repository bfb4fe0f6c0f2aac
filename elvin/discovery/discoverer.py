"""Client-side discovery: find a router by ERDP multicast and DNS-SD.

    d = Discoverer(reactor)
    yield d.start()
    candidates = yield d.find(scope="chat", timeout=5)   # [(record, ElvinURI), ...]
    yield d.stop()

or simply ``elvin.client.connect(scope="chat")`` / ``connect(discover=True)``
(which uses ``elvin.client.connect_discovered``), or ``resolve_uri`` for a single
URI (what the command-line tools do when ``-e`` is omitted).

A ``Discoverer`` keeps a passive cache of every advertisement it hears
(``cache``), solicits actively only while someone is waiting in ``find``
(``solicitor``, following the draft's pre-request intervals, suppression
and expanding locality), and browses DNS-SD as a second source.
"""

from __future__ import annotations

from twisted.internet import defer
from twisted.logger import Logger

from elvin.discovery import packets as discovery_packets
from elvin.discovery.cache import DNS_SD, ERDP, RouterCache
from elvin.discovery.channel import DiscoveryUnavailable, MulticastChannel
from elvin.discovery.solicitor import Solicitor
from elvin.errors import ElvinError
from elvin.uri import ElvinURI

__all__ = ["Discoverer", "NoRouterFound", "resolve_uri",
           "DEFAULT_TIMEOUT", "DEFAULT_MAX_LOCALITY"]

#: Seconds ``connect`` looks for a router before giving up.
DEFAULT_TIMEOUT = 10.0

#: The widest locality solicited by default (the draft's table ends at 64).
DEFAULT_MAX_LOCALITY = 64


class NoRouterFound(ElvinError):
    """Discovery found no suitable router (in time)."""

    def __init__(self, message):
        super().__init__(0, message)


class _Waiter:
    __slots__ = ("scope", "exclude", "deferred", "timer")

    def __init__(self, scope, exclude):
        self.scope = scope
        self.exclude = exclude
        self.deferred = None
        self.timer = None


def _describe_scope(scope):
    return "a default router" if scope is None else f"a router of scope {scope!r}"


class Discoverer:
    """Finds Elvin routers for a client.

    ``interface``: IPv4 address of the interface to send and listen on
    (default: the system's choice); ``max_locality``: the widest locality
    (IP TTL) of the expanding search; ``ttl_limit``: never send with an IP
    TTL above this whatever the locality (tests use 0); ``group``/``port``:
    the ERDP group (only tests should change it); ``dns_sd``: also browse
    DNS-SD, on ``dns_sd_interfaces`` (default: ``[interface]`` if one is
    given, else all); ``erdp``: use ERDP multicast at all; ``random``: a
    ``random.Random`` for the pre-request intervals.
    """

    log = Logger()

    def __init__(self, reactor=None, interface=None, max_locality=DEFAULT_MAX_LOCALITY,
                 ttl_limit=discovery_packets.MAX_LOCALITY, group=discovery_packets.GROUP, port=discovery_packets.PORT, dns_sd=True,
                 dns_sd_interfaces=None, erdp=True, random=None, local_addresses=None):
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        self.interface = interface
        self.cache = RouterCache(reactor)
        self.cache.listeners.append(self._cache_changed)
        self.solicitor = Solicitor(reactor, self._send, max_locality, random,
                                   on_postponed=self._more_wanted,
                                   on_exhausted=self._more_wanted)
        self.channel = None
        if erdp:
            self.channel = MulticastChannel(reactor, self._packet, group=group,
                                            port=port, interface=interface,
                                            ttl_limit=ttl_limit, local=local_addresses)
        self.browser = None
        if dns_sd:
            from elvin.discovery.dnssd import DnsSdBrowser
            if dns_sd_interfaces is None and interface:
                dns_sd_interfaces = [interface]
            self.browser = DnsSdBrowser(reactor, self._dns_sd_found,
                                        self._dns_sd_removed,
                                        interfaces=dns_sd_interfaces)
        self.erdp_running = False
        self.dns_sd_running = False
        self.errors = []
        self.running = False
        self._waiters = []
        #: (time, kind, locality-or-server, own) of every packet heard
        self.heard = []

    # -- life cycle ----------------------------------------------------------

    @defer.inlineCallbacks
    def start(self):
        """Open the sources; fires with self.  Fails with DiscoveryUnavailable
        only if no source could be started."""
        if self.running:
            return self
        self.running = True
        if self.channel is not None:
            try:
                yield self.channel.start()
                self.erdp_running = True
            except DiscoveryUnavailable as e:
                self.errors.append(str(e))
                self.log.warn("discovery: ERDP multicast unavailable: {why}", why=str(e))
        if self.browser is not None:
            try:
                yield self.browser.start()
                self.dns_sd_running = True
            except Exception as e:
                self.errors.append(f"DNS-SD: {e}")
                self.log.warn("discovery: DNS-SD browsing unavailable: {why}", why=str(e))
        if not (self.erdp_running or self.dns_sd_running):
            self.running = False
            raise DiscoveryUnavailable("no discovery source could be started: "
                                       + "; ".join(self.errors))
        return self

    @defer.inlineCallbacks
    def stop(self):
        """Stop soliciting, fail pending ``find`` calls, close the sources."""
        self.running = False
        self.solicitor.stop()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            self._finish(waiter, error=NoRouterFound("discovery stopped"))
        if self.channel is not None and self.erdp_running:
            self.erdp_running = False
            yield self.channel.stop()
        if self.browser is not None and self.dns_sd_running:
            self.dns_sd_running = False
            try:
                yield self.browser.stop()
            except Exception as e:  # pragma: no cover - zeroconf internals
                self.log.warn("discovery: closing DNS-SD failed: {why}", why=str(e))

    # -- solicitation --------------------------------------------------------

    def solicit(self):
        """Ask routers to advertise (active discovery, section 5.2.1)."""
        if self.erdp_running:
            self.solicitor.solicit()

    def _send(self, packet, locality):
        if self.channel is not None:
            self.channel.send(packet, locality)

    def _more_wanted(self):
        # Solicitation was postponed (an advert arrived) or ran out of
        # steps: continue only if a find() is still unsatisfied.
        if self._waiters and self.running:
            self.solicit()

    # -- packets -------------------------------------------------------------

    def _packet(self, packet, address, own):
        kind = type(packet)
        if len(self.heard) < 10000:
            detail = packet.locality if kind is discovery_packets.SvrRqst else packet.server
            self.heard.append((self.reactor.seconds(), kind.__name__, detail, own))
        if own or not discovery_packets.compatible(packet):
            return
        if kind is discovery_packets.SvrAdvt:
            local = self.channel.is_local(address)
            self.cache.advert(packet, address=address, local=local, source=ERDP)
            self.solicitor.observed(packet)
        elif kind is discovery_packets.SvrAdvtClose:
            self.cache.withdraw(packet.server)
        else:
            self.solicitor.observed(packet)

    def _dns_sd_found(self, fields, host, local):
        name, scope, default, revision, uris = fields
        self.cache.learn(name, scope, default, revision, uris, source=DNS_SD,
                         address=host, local=local)

    def _dns_sd_removed(self, name):
        self.cache.withdraw(name, source=DNS_SD)

    # -- finding -------------------------------------------------------------

    def candidates(self, scope=None, exclude=()):
        """What the cache offers now (see RouterCache.candidates)."""
        return self.cache.candidates(scope, exclude)

    def find(self, scope=None, timeout=None, exclude=(), waiting=None):
        """Fires with ``[(record, ElvinURI), ...]`` (non-empty) for routers
        usable with ``scope`` (None: default routers), soliciting if the
        cache has none; fails with NoRouterFound after ``timeout`` seconds.
        ``exclude``: ``(name, revision, uri)`` triples already tried.

        ``waiting`` (for ``elvin.discovery.aio``): an object with the
        Deferred's ``called``/``callback``/``errback`` to settle instead;
        then the result is returned at once if the cache has one (else
        None), and NoRouterFound is raised if discovery is not running."""
        if scope is not None:
            discovery_packets.check_scope(scope)
        found = self.cache.candidates(scope, exclude)
        if found:
            return found if waiting is not None else defer.succeed(found)
        if not self.running:
            error = NoRouterFound("discovery is not running")
            if waiting is not None:
                raise error
            return defer.fail(error)
        waiter = _Waiter(scope, frozenset(exclude))

        def cancel(d):
            self._finish(waiter)
        waiter.deferred = defer.Deferred(cancel) if waiting is None else waiting
        if timeout is not None:
            waiter.timer = self.reactor.callLater(max(0.0, timeout), self._expire,
                                                  waiter, timeout)
        self._waiters.append(waiter)
        self.solicit()
        return waiter.deferred if waiting is None else None

    def _expire(self, waiter, timeout):
        waiter.timer = None
        self._finish(waiter, error=NoRouterFound(
            f"no Elvin router found by discovery: looked for "
            f"{_describe_scope(waiter.scope)} for {timeout:g} s"))

    def _finish(self, waiter, result=None, error=None):
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        d = waiter.deferred
        if d is not None and not d.called:
            if error is not None:
                d.errback(error)
            elif result is not None:
                d.callback(result)

    def _cache_changed(self, event, record):
        if event == "withdrawn":
            return
        for waiter in list(self._waiters):
            found = self.cache.candidates(waiter.scope, waiter.exclude)
            if found:
                self._finish(waiter, result=found)


@defer.inlineCallbacks
def resolve_uri(reactor=None, scope=None, timeout=1.5, fallback=None,
                **discoverer_kwargs):
    """The URI of the first usable router found; with no ``scope`` and
    nothing found in ``timeout`` seconds (or discovery unavailable), the
    ``fallback`` URI if one is given.  Fires with an ElvinURI."""
    if reactor is None:
        from twisted.internet import reactor
    discoverer = Discoverer(reactor, **discoverer_kwargs)
    use_fallback = fallback is not None and scope is None
    try:
        yield discoverer.start()
    except DiscoveryUnavailable:
        if use_fallback:
            return ElvinURI(str(fallback))
        raise
    try:
        found = yield discoverer.find(scope, timeout)
        return found[0][1]
    except NoRouterFound:
        if use_fallback:
            return ElvinURI(str(fallback))
        raise
    finally:
        yield discoverer.stop()
