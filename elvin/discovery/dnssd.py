"""DNS-SD over multicast DNS (RFC 6763 / 6762) through the ``zeroconf`` package.

A router registers one service instance of type ``_elvin._tcp.local.`` so
that ordinary service browsers (avahi-browse, dns-sd, Bonjour) see Elvin
routers; clients browse the same type as a second discovery source beside
ERDP.

The TXT record (keys short, as RFC 6763 section 6.4 suggests):

    txtvers=1
    name=<the router's ERDP name>      same name as in its SvrAdvt
    scope=<scope name>                 may be empty
    default=yes|no                     the ERDP default flag
    rev=<revision>                     bumped with every change, as in ERDP
    uri0=<first URI>, uri1=..., ...    the advertised URIs, in order

The SRV record points at the host (``<hostname>.local.``) and the port of
the first URI; the address records carry the IP addresses named by the
URIs (or all of the host's, if the URIs name none), loopback addresses only
when there are no others.

Threads: zeroconf's synchronous API runs its own asyncio loop in a thread
of its own and its calls block, so every call is made in the reactor's
thread pool (``deferToThread``) and results come back as Deferreds; the
browser's callbacks arrive on zeroconf's thread and are handed to the
reactor with ``callFromThread``.  That works with the default reactor.
Each publisher or browser runs its zeroconf calls one after another.
"""

from __future__ import annotations

import ipaddress
import os

from twisted.internet import defer, threads
from twisted.logger import Logger

from elvin.discovery.addresses import host_label, local_addresses
from elvin.uri import ElvinURI, InvalidURIError

__all__ = ["SERVICE_TYPE", "txt_properties", "parse_properties",
           "DnsSdPublisher", "DnsSdBrowser", "instance_name"]

SERVICE_TYPE = "_elvin._tcp.local."
TXT_VERSION = "1"
_MAX_TXT_ITEM = 255        # one TXT string: key=value, at most 255 bytes
_MAX_TXT_TOTAL = 1300      # RFC 6763 6.2: keep the whole record modest
_MAX_LABEL = 63


def instance_name(name=None):
    """A human-readable DNS-SD instance name (at most 63 bytes)."""
    if name is None:
        name = f"Elvin router {os.getpid()} on {host_label()}"
    data = name.encode("utf-8")[:_MAX_LABEL]
    return data.decode("utf-8", "ignore")


def txt_properties(name, scope, default, revision, uris):
    """The TXT record as a dict of str; URIs that don't fit are left out."""
    props = {"txtvers": TXT_VERSION, "name": name, "scope": scope,
             "default": "yes" if default else "no", "rev": str(revision)}
    total = sum(len(k) + len(v.encode()) + 2 for k, v in props.items())
    for index, uri in enumerate(str(u) for u in uris):
        key = f"uri{index}"
        size = len(key) + 1 + len(uri.encode())
        if size > _MAX_TXT_ITEM or total + size + 1 > _MAX_TXT_TOTAL:
            break
        props[key] = uri
        total += size + 1
    return props


def _text(value):
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def parse_properties(properties):
    """``(name, scope, default, revision, uris)`` from a TXT dict (bytes or
    str keys and values), or None if it is not an Elvin record we read."""
    props = {_text(k).lower(): _text(v) for k, v in (properties or {}).items()}
    if props.get("txtvers", TXT_VERSION) != TXT_VERSION:
        return None
    name = props.get("name", "")
    try:
        revision = int(props.get("rev", "1"))
    except ValueError:
        revision = 1
    uris = []
    index = 0
    while f"uri{index}" in props:
        uris.append(props[f"uri{index}"])
        index += 1
    if not uris:
        return None
    default = props.get("default", "no").lower() in ("yes", "true", "1", "on")
    return name, props.get("scope", ""), default, revision, tuple(uris)


def _ip_version(interfaces):
    from zeroconf import IPVersion
    if not interfaces:
        return None
    versions = set()
    for item in interfaces:
        try:
            versions.add(ipaddress.ip_address(item).version)
        except (ValueError, TypeError):
            return None
    if versions == {4}:
        return IPVersion.V4Only
    if versions == {6}:
        return IPVersion.V6Only
    return None


def make_zeroconf(interfaces=None):
    """A Zeroconf instance (blocking; call from a thread), bound to
    ``interfaces`` (a list of addresses) or to all interfaces."""
    from zeroconf import InterfaceChoice, Zeroconf
    if interfaces:
        return Zeroconf(interfaces=list(interfaces), ip_version=_ip_version(interfaces))
    return Zeroconf(interfaces=InterfaceChoice.All)


class _Serial:
    """Runs blocking calls in the thread pool one after another."""

    def __init__(self, reactor):
        self.reactor = reactor
        self._tail = defer.succeed(None)

    def run(self, fn, *args, **kwargs):
        result = defer.Deferred()

        def go(_):
            d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(),
                                          fn, *args, **kwargs)
            d.addCallbacks(result.callback, result.errback)
            return d
        self._tail.addCallback(go)
        return result


class DnsSdPublisher:
    """Registers (and updates, and withdraws) a router's DNS-SD service."""

    log = Logger()

    def __init__(self, reactor, name, scope, default, revision, uris,
                 interfaces=None, instance=None, probe=True, zeroconf_factory=None):
        self.reactor = reactor
        self.interfaces = interfaces
        self.instance = instance_name(instance)
        self.probe = probe
        self._factory = zeroconf_factory or make_zeroconf
        self._serial = _Serial(reactor)
        self._zc = None
        self._info = None
        self.registered_name = None
        self._state = (name, scope, default, revision, tuple(str(u) for u in uris))

    def _service_info(self):
        from zeroconf import ServiceInfo
        name, scope, default, revision, uris = self._state
        parsed = []
        for text in uris:
            try:
                parsed.append(ElvinURI(text))
            except InvalidURIError:
                pass
        port = parsed[0].port if parsed else 2917
        addresses = []
        for uri in parsed:
            try:
                address = ipaddress.ip_address(uri.host)
            except ValueError:
                continue
            if str(address) not in addresses:
                addresses.append(str(address))
        if not addresses:
            addresses = local_addresses()
        # Loopback addresses only if there is nothing else: the A records
        # are for other hosts too.
        routable = [a for a in addresses if not ipaddress.ip_address(a).is_loopback]
        addresses = routable or addresses
        full = (self.registered_name
                or f"{self.instance}.{SERVICE_TYPE}")
        return ServiceInfo(
            SERVICE_TYPE, full, port=port,
            properties=txt_properties(name, scope, default, revision, uris),
            server=f"{host_label()}.local.",
            parsed_addresses=addresses)

    def start(self):
        """Register; fires with the registered instance name."""
        def register():
            zc = self._factory(self.interfaces)
            info = self._service_info()
            try:
                zc.register_service(info, allow_name_change=True,
                                    cooperating_responders=not self.probe)
            except Exception:
                zc.close()
                raise
            self._zc, self._info = zc, info
            self.registered_name = info.name
            return info.name
        return self._serial.run(register)

    def update(self, name, scope, default, revision, uris):
        """Publish a changed offer (new TXT record)."""
        self._state = (name, scope, default, revision, tuple(str(u) for u in uris))

        def update():
            if self._zc is None:
                return None
            info = self._service_info()
            self._zc.update_service(info)
            self._info = info
            return info.name
        return self._serial.run(update)

    def stop(self):
        """Unregister (goodbye packets) and close zeroconf."""
        def stop():
            zc, info = self._zc, self._info
            self._zc = self._info = None
            if zc is None:
                return
            try:
                if info is not None:
                    zc.unregister_service(info)
            finally:
                zc.close()
        return self._serial.run(stop)


class DnsSdBrowser:
    """Browses ``_elvin._tcp.local.``; ``on_found(fields, host, local)``
    with ``fields = (name, scope, default, revision, uris)`` for each
    service resolved, ``on_removed(name)`` when one goes."""

    log = Logger()

    def __init__(self, reactor, on_found, on_removed, interfaces=None,
                 zeroconf_factory=None, resolve_timeout=3.0,
                 service_type=SERVICE_TYPE):
        self.reactor = reactor
        self.on_found = on_found
        self.on_removed = on_removed
        self.interfaces = interfaces
        self.resolve_timeout = resolve_timeout
        self.service_type = service_type
        self._factory = zeroconf_factory or make_zeroconf
        self._serial = _Serial(reactor)
        self._zc = None
        self._browser = None
        self._stopped = False
        self._names = {}         # service instance name -> router name
        self._resolving = set()  # get_service_info calls in flight
        self._my_host = host_label()

    def start(self):
        return self._serial.run(self._open)

    def _open(self):
        """Make the Zeroconf and its browser (blocking: in a thread)."""
        from zeroconf import ServiceBrowser
        zc = self._factory(self.interfaces)
        try:
            browser = ServiceBrowser(zc, self.service_type, handlers=[self._handler])
        except Exception:
            zc.close()
            raise
        self._zc, self._browser = zc, browser

    def _close(self):
        """Cancel the browser and close Zeroconf (blocking: in a thread)."""
        browser, zc = self._browser, self._zc
        self._browser = self._zc = None
        try:
            if browser is not None:
                browser.cancel()
        finally:
            if zc is not None:
                zc.close()

    def _removed(self, service_name):
        router = self._names.pop(service_name, None)
        if router is not None:
            self.on_removed(router)

    def _handler(self, zeroconf, service_type, name, state_change):
        # zeroconf's thread: hand over to the reactor.
        self.reactor.callFromThread(self._changed, name, state_change.name)

    def _changed(self, service_name, change):
        if self._stopped:
            return
        if change == "Removed":
            self._removed(service_name)
            return
        zc = self._zc
        if zc is None:
            return
        self._look_up(zc, service_name)

    def _look_up(self, zc, service_name):
        """Resolve ``service_name`` off the reactor thread, then ``_resolved``."""
        d = threads.deferToThreadPool(
            self.reactor, self.reactor.getThreadPool(), zc.get_service_info,
            self.service_type, service_name, int(self.resolve_timeout * 1000))
        d.addCallback(self._resolved, service_name)
        d.addErrback(lambda f: self.log.debug(
            "dns-sd: cannot resolve {name}: {why}", name=service_name,
            why=f.getErrorMessage()))
        self._resolving.add(d)
        d.addBoth(lambda _: self._resolving.discard(d))

    def _resolved(self, info, service_name):
        if info is None or self._stopped:
            return
        fields = parse_properties(info.properties)
        if fields is None:
            return
        name, scope, default, revision, uris = fields
        if not name:
            name = service_name
        self._names[service_name] = name
        host = (info.server or "").rstrip(".")
        if host.endswith(".local"):
            host = host[: -len(".local")]
        local = bool(host) and host_label(host) == self._my_host
        self.on_found((name, scope, default, revision, uris), host, local)

    def stop(self):
        """Stop browsing; fires when zeroconf is closed and no lookup is
        left running."""
        self._stopped = True
        pending = defer.DeferredList(list(self._resolving))
        closed = self._serial.run(self._close)
        return defer.gatherResults([closed, pending]).addCallback(lambda _: None)

