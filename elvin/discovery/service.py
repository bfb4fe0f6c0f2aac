"""The router's discovery service: ERDP advertisements and a DNS-SD record.

``twistd elvin --discovery`` (or ``discovery = yes`` in the configuration
file) adds a ``DiscoveryService`` to the router's service tree.  On start it
joins the ERDP group, advertises (SvrAdvt) and registers
``_elvin._tcp.local.``; while running it answers solicitations (at most one
SvrAdvt every two seconds) and re-advertises with a new revision whenever
its offer changes; on stop it withdraws (SvrAdvtClose) and unregisters.

Discovery is a convenience, not the router's job: if the multicast socket
or zeroconf cannot be set up, the error is logged and the router runs on.
"""

from __future__ import annotations

import itertools
import os
import socket
import time

from twisted.application import service
from twisted.internet import defer, task
from twisted.logger import Logger

from elvin.discovery import packets as discovery_packets
from elvin.discovery.addresses import advertisable_uris, is_unspecified, local_addresses
from elvin.discovery.advertiser import INITIAL_LOCALITY_LIMIT, Advertiser
from elvin.discovery.channel import DiscoveryUnavailable, MulticastChannel
from elvin.uri import ElvinURI

__all__ = ["DiscoveryService", "new_router_name", "DEFAULT_REFRESH"]

#: Seconds between re-reading the interface addresses behind wildcard binds.
DEFAULT_REFRESH = 60.0

_counter = itertools.count(1)


def new_router_name():
    """A router name unique over time (draft section 5.3 recommends the
    process id, the fully-qualified domain name and the start time)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    micros = int(time.time() * 1_000_000) % 1_000_000
    return (f"elvin:{socket.getfqdn()}:{os.getpid()}:{stamp}.{micros:06d}"
            f":{next(_counter)}")


class DiscoveryService(service.Service):
    """Advertises one router by ERDP and DNS-SD.

    ``listen``: the router's listener URIs; ``advertise``: URIs to advertise
    instead (default: the listeners); either way wildcard hosts are
    replaced by the host's addresses and ``localhost`` by 127.0.0.1.
    ``interface``: IPv4 address of the multicast interface (default: the
    system's choice); ``ttl_limit``: highest IP TTL ever used;
    ``dns_sd``: also register with DNS-SD (on ``dns_sd_interfaces``,
    default ``[interface]`` if set, else all); ``dns_sd_probe``: probe for
    name conflicts before registering (tests switch it off for speed);
    ``addresses``: a callable giving the host's addresses (tests);
    ``refresh``: seconds between re-checks of those addresses (0: never).

    ``ready`` fires once both mechanisms have started (or failed, logged).
    """

    name = "discovery"
    log = Logger()

    def __init__(self, listen, reactor=None, scope="", default=True, advertise=None,
                 interface=None, ttl_limit=INITIAL_LOCALITY_LIMIT, group=discovery_packets.GROUP,
                 port=discovery_packets.PORT, dns_sd=True, dns_sd_interfaces=None, dns_sd_probe=True,
                 router_name=None, addresses=None, refresh=DEFAULT_REFRESH):
        self.sent = 0
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        self.listen = list(listen)
        self.advertise = list(advertise) if advertise else None
        self.scope = discovery_packets.check_scope(scope)
        self.default = bool(default)
        self.interface = interface
        self.ttl_limit = ttl_limit
        self.group = group
        self.port = port
        self.dns_sd = dns_sd
        if dns_sd_interfaces is None and interface:
            dns_sd_interfaces = [interface]
        self.dns_sd_interfaces = dns_sd_interfaces
        self.dns_sd_probe = dns_sd_probe
        self.router_name = router_name or new_router_name()
        self._addresses = addresses or local_addresses
        self.refresh = refresh
        self.advertiser = None
        self.channel = None
        self.publisher = None
        self.erdp_error = None
        self.dns_sd_error = None
        self.ready = defer.Deferred()
        self._refresher = None

    @classmethod
    def from_config(cls, config, reactor=None, **overrides):
        """A DiscoveryService for an ``elvin.config.RouterConfig``."""
        kwargs = dict(
            listen=config.listen, reactor=reactor, scope=config.discovery_scope,
            default=config.discovery_default, advertise=config.discovery_advertise,
            interface=config.discovery_interface, ttl_limit=config.discovery_ttl,
            group=config.discovery_group[0], port=config.discovery_group[1],
            dns_sd=config.discovery_dns_sd)
        kwargs.update(overrides)
        return cls(**kwargs)

    # -- the offer -----------------------------------------------------------

    def offered_uris(self):
        """The URI strings to advertise now."""
        uris = advertisable_uris(self.advertise or self.listen, self._addresses())
        return [str(u) for u in uris]

    def _has_wildcard(self):
        return any(is_unspecified(ElvinURI(str(u)).host)
                   for u in (self.advertise or self.listen))

    def update(self, listen=None, advertise=None, scope=None, default=None):
        """Change what is offered; re-advertises (new revision) if anything
        changed.  Returns True if it did."""
        if listen is not None:
            self.listen = list(listen)
        if advertise is not None:
            self.advertise = list(advertise) or None
        if scope is not None:
            self.scope = discovery_packets.check_scope(scope)
        if default is not None:
            self.default = bool(default)
        if self.advertiser is None:
            return False
        uris = self.offered_uris()
        if not uris:
            self.log.warn("discovery: nothing to advertise")
            return False
        changed = self.advertiser.update(uris=uris, scope=self.scope,
                                         default=self.default)
        if changed:
            self.log.info("discovery: offer changed (revision {rev}): {uris}",
                          rev=self.advertiser.revision, uris=", ".join(uris))
            if self.publisher is not None:
                a = self.advertiser
                self.publisher.update(a.name, a.scope, a.default, a.revision,
                                      a.uris).addErrback(self._dns_sd_failed)
        return changed

    # -- service -------------------------------------------------------------

    def startService(self):
        super().startService()
        if self.ready.called:
            self.ready = defer.Deferred()   # started again after a stop
        uris = self.offered_uris()
        if not uris:
            self.log.error("discovery: no URI to advertise; discovery is off")
            self.ready.callback(self)
            return
        self.advertiser = Advertiser(self.reactor, self._send, self.router_name,
                                     uris, scope=self.scope, default=self.default,
                                     ttl_limit=self.ttl_limit)
        self.channel = MulticastChannel(self.reactor, self._packet, group=self.group,
                                        port=self.port, interface=self.interface,
                                        ttl_limit=self.ttl_limit)
        steps = []
        try:
            d = self.channel.start()
        except DiscoveryUnavailable as e:
            d = defer.fail(e)
        d.addCallbacks(self._erdp_started, self._erdp_failed)
        steps.append(d)
        if self.dns_sd:
            from elvin.discovery.dnssd import DnsSdPublisher
            a = self.advertiser
            self.publisher = DnsSdPublisher(
                self.reactor, a.name, a.scope, a.default, a.revision or 1, a.uris,
                interfaces=self.dns_sd_interfaces, probe=self.dns_sd_probe)
            d = self.publisher.start()
            d.addCallbacks(self._dns_sd_started, self._dns_sd_failed)
            steps.append(d)
        if self.refresh and self._has_wildcard():
            self._refresher = task.LoopingCall(self.update)
            self._refresher.clock = self.reactor
            self._refresher.start(self.refresh, now=False)
        defer.DeferredList(steps).addCallback(lambda _: self.ready.callback(self))

    def _erdp_started(self, _):
        if not self.running or self.advertiser is None:
            return
        self.advertiser.start()
        a = self.advertiser
        self.log.info("discovery: advertising {name} (scope {scope!r}, default "
                      "{default}) on {group}:{port}: {uris}", name=a.name,
                      scope=a.scope, default="yes" if a.default else "no",
                      group=self.group, port=self.port, uris=", ".join(a.uris))

    def _erdp_failed(self, failure):
        self.erdp_error = failure.value
        self.channel = None
        self.log.error("discovery: ERDP multicast is off: {why}",
                       why=failure.getErrorMessage())

    def _dns_sd_started(self, registered):
        self.log.info("discovery: registered DNS-SD service {name!r}", name=registered)

    def _dns_sd_failed(self, failure):
        self.dns_sd_error = failure.value
        self.log.error("discovery: DNS-SD is off: {why}", why=failure.getErrorMessage())

    def _send(self, packet, locality):
        if self.channel is not None:
            self.channel.send(packet, locality)
            self.sent += 1       # ERDP packets sent (adverts, withdrawals): metrics

    def _packet(self, packet, address, own):
        if self.advertiser is not None and not own:
            self.advertiser.received(packet)

    def stopService(self):
        super().stopService()
        if self._refresher is not None and self._refresher.running:
            self._refresher.stop()
        self._refresher = None
        steps = []
        if self.advertiser is not None:
            if self.advertiser.stop():
                self.log.info("discovery: withdrew {name}", name=self.advertiser.name)
        if self.channel is not None:
            steps.append(self.channel.stop())
            self.channel = None
        if self.publisher is not None:
            steps.append(self.publisher.stop().addErrback(
                lambda f: self.log.warn("discovery: DNS-SD unregister failed: {why}",
                                        why=f.getErrorMessage())))
            self.publisher = None
        return defer.DeferredList(steps).addCallback(lambda _: None)
