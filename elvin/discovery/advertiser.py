"""The router's side of ERDP as a state machine, free of I/O.

``Advertiser`` decides *what* to send and *when*; whoever owns it supplies
``send(packet, locality)`` (the multicast channel, or a test's list) and a
clock with ``seconds()`` and ``callLater()`` (the reactor, or
``twisted.internet.task.Clock`` in tests).

Rules (draft section 5.3), and the decisions taken where it is loose:

* An advertisement goes out when the router starts, when its offer changes
  (``update``: the revision number is bumped for every change, so caching
  clients, which drop a repeated revision, see it) and in answer to every
  version-compatible SvrRqst.
* No two SvrAdvt are ever sent less than ``RATE_LIMIT`` (two) seconds
  apart -- this covers answers, start-up and change advertisements alike.
  Anything that asks for an advertisement during the quiet period is
  coalesced into a single advertisement sent when the period ends, at the
  highest locality asked for.  However many clients solicit, the router
  sends at most one SvrAdvt every two seconds.
* Answers use the locality of the SvrRqst (section 5.3, "MUST set the
  locality limit to that specified in the received SvrRqst"), capped at
  the configured ``ttl_limit``: an administrator can keep advertisements
  on the host (0) or link (1), and a forged SvrRqst with locality 255
  cannot make the router flood further than that (section 7.1.1).
* The start-up and change advertisements use ``min(ttl_limit, 64)`` (the
  draft: "not exceeding 64").
* The withdrawal (``stop``) is sent at the highest locality any SvrAdvt
  was sent with, and only if one was sent.
* Revisions start at 1 and skip 0 when they wrap (zero is reserved).
"""

from __future__ import annotations

from twisted.logger import Logger

from elvin.discovery.packets import (
    MAX_LOCALITY, SvrAdvt, SvrAdvtClose, SvrRqst, check_scope, compatible,
    fit_advert)

__all__ = ["Advertiser", "RATE_LIMIT", "INITIAL_LOCALITY_LIMIT"]

#: Seconds that must separate two SvrAdvt from one router.
RATE_LIMIT = 2.0

#: Highest locality for unsolicited (start-up and change) advertisements.
INITIAL_LOCALITY_LIMIT = 64


class Advertiser:
    """Sends a router's SvrAdvt / SvrAdvtClose under the ERDP rules.

    ``uris``: the URI strings to advertise (at least one); ``name``: the
    router's universally unique name; ``ttl_limit``: the highest locality
    (IP TTL) the router will ever use.
    """

    log = Logger()

    def __init__(self, clock, send, name, uris, scope="", default=False,
                 ttl_limit=INITIAL_LOCALITY_LIMIT):
        if not 0 <= ttl_limit <= MAX_LOCALITY:
            raise ValueError(f"ttl_limit must be 0-{MAX_LOCALITY}, not {ttl_limit}")
        self.clock = clock
        self._send = send
        self.name = name
        self.uris = self._check_uris(uris)
        self.scope = check_scope(scope)
        self.default = bool(default)
        self.ttl_limit = ttl_limit
        self.revision = 0
        self.running = False
        #: the highest locality a SvrAdvt has been sent with (None: none sent)
        self.max_locality_sent = None
        self.last_advert_at = None
        self.adverts_sent = 0
        self.requests_seen = 0
        self._pending = None
        self._pending_locality = None

    @staticmethod
    def _check_uris(uris):
        uris = tuple(str(u) for u in uris)
        if not uris:
            raise ValueError("a router must advertise at least one URI")
        return uris

    @property
    def initial_locality(self):
        return min(self.ttl_limit, INITIAL_LOCALITY_LIMIT)

    def advert(self):
        """The SvrAdvt describing the current offer."""
        return SvrAdvt(server=self.name, revision=self.revision or 1,
                       uris=self.uris, scope=self.scope, default=self.default)

    # -- events --------------------------------------------------------------

    def start(self):
        """The router has started: advertise."""
        if self.running:
            return
        self.running = True
        if self.revision == 0:
            self.revision = 1
        self._request_advert(self.initial_locality)

    def update(self, uris=None, scope=None, default=None):
        """Change the offer; bumps the revision and advertises if anything
        changed.  Returns True if it did."""
        new_uris = self.uris if uris is None else self._check_uris(uris)
        new_scope = self.scope if scope is None else check_scope(scope)
        new_default = self.default if default is None else bool(default)
        if (new_uris, new_scope, new_default) == (self.uris, self.scope, self.default):
            return False
        self.uris, self.scope, self.default = new_uris, new_scope, new_default
        self.revision = self.revision % 0xFFFFFFFF + 1  # 1..2**32-1, never 0
        if self.running:
            self._request_advert(self.initial_locality)
        return True

    def received(self, packet):
        """A packet arrived on the discovery group."""
        if type(packet) is not SvrRqst or not self.running:
            return  # adverts and withdrawals (ours included) are not for us
        if not compatible(packet):
            return
        self.requests_seen += 1
        self._request_advert(min(packet.locality, self.ttl_limit))

    def stop(self):
        """The router is shutting down: withdraw.  Returns True if a
        SvrAdvtClose was sent."""
        if not self.running:
            return False
        self.running = False
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None
        if self.max_locality_sent is None:
            return False
        self._send(SvrAdvtClose(server=self.name), self.max_locality_sent)
        return True

    # -- rate limiting -------------------------------------------------------

    def _request_advert(self, locality):
        if self._pending is not None:
            self._pending_locality = max(self._pending_locality, locality)
            return
        now = self.clock.seconds()
        if self.last_advert_at is None or now - self.last_advert_at >= RATE_LIMIT:
            self._send_advert(locality)
        else:
            self._pending_locality = locality
            self._pending = self.clock.callLater(
                self.last_advert_at + RATE_LIMIT - now, self._fire_pending)

    def _fire_pending(self):
        locality = self._pending_locality
        self._pending = None
        self._pending_locality = None
        if self.running:
            self._send_advert(locality)

    def _send_advert(self, locality):
        packet, dropped = fit_advert(self.advert())
        if dropped:
            self.log.warn("discovery: {n} URIs do not fit in one advertisement "
                          "and are not advertised: {uris}",
                          n=len(dropped), uris=", ".join(dropped))
        self.last_advert_at = self.clock.seconds()
        if self.max_locality_sent is None or locality > self.max_locality_sent:
            self.max_locality_sent = locality
        self.adverts_sent += 1
        self._send(packet, locality)
