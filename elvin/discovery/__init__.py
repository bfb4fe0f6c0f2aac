"""Router discovery: multicast advertisements and DNS-SD.

* ``packets``     -- ERDP SvrRqst / SvrAdvt / SvrAdvtClose and their XDR form
* ``advertiser``  -- the router's side of ERDP (rate limit, revisions), no I/O
* ``solicitor``   -- the client's active discovery (pre-request intervals,
                     suppression, expanding locality), no I/O
* ``cache``       -- the client's passive cache and the choice of a URI
* ``channel``     -- ERDP over IPv4 multicast on Twisted
* ``dnssd``       -- DNS-SD (``_elvin._tcp.local.``) through ``zeroconf``
* ``service``     -- ``DiscoveryService``, the router's Twisted service
* ``discoverer``  -- ``Discoverer``, the client's finder (``connect_discovered``
                     lives in ``elvin.client``, and is re-exported here)
* ``settings``    -- the ``discovery*`` configuration file settings

See docs/discovery.md.  The names below are imported on first use, so
importing this package (as the configuration module does) stays cheap.
"""

__all__ = ["Discoverer", "NoRouterFound", "DiscoveryService",
           "DiscoveryUnavailable", "connect_discovered", "resolve_uri"]

from elvin.lazy import lazy_attributes

_LAZY = {
    "Discoverer": "elvin.discovery.discoverer",
    "NoRouterFound": "elvin.discovery.discoverer",
    "connect_discovered": "elvin.client",
    "resolve_uri": "elvin.discovery.discoverer",
    "DiscoveryService": "elvin.discovery.service",
    "DiscoveryUnavailable": "elvin.discovery.channel",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
