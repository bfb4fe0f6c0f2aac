"""Router discovery for asyncio programs (``elvin.aio``).

The same finder as ``elvin.discovery.discoverer.Discoverer`` -- its
passive cache, its solicitor (pre-request intervals, suppression,
expanding locality) and its ``find`` -- on an asyncio event loop: ERDP
multicast through asyncio datagram sockets configured as the Twisted
channel configures its own (``elvin.discovery.channel``), DNS-SD through
zeroconf in the loop's executor, timers from the loop.

    async with AsyncioDiscoverer(interface="127.0.0.1") as d:
        candidates = await d.find(scope="chat", timeout=5)  # [(record, ElvinURI)]
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, Callable, List, Optional, Set, Tuple

from elvin.discovery import packets as discovery_packets
from elvin.discovery.channel import DiscoveryUnavailable, MulticastChannel
from elvin.discovery.discoverer import DEFAULT_MAX_LOCALITY, Discoverer, NoRouterFound
from elvin.discovery.dnssd import DnsSdBrowser

__all__ = ["AsyncioDiscoverer", "NoRouterFound", "DiscoveryUnavailable"]


class _Timer:
    """A loop timer with the two methods the solicitor uses (Twisted's
    ``IDelayedCall``: ``active``, ``cancel``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float,
                 function: Callable[..., Any], args: Tuple[Any, ...]) -> None:
        self._done = False

        def fire() -> None:
            self._done = True
            function(*args)
        self._handle = loop.call_later(delay, fire)

    def active(self) -> bool:
        return not self._done and not self._handle.cancelled()

    def cancel(self) -> None:
        self._handle.cancel()


class _Clock:
    """The ``seconds``/``callLater`` the discovery state machines ask of
    Twisted's reactor, from an asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def seconds(self) -> float:
        return self.loop.time()

    def callLater(self, delay: float, function: Callable[..., Any], *args: Any) -> _Timer:
        return _Timer(self.loop, delay, function, args)


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, received: Callable[[bytes, Tuple[str, int]], None]) -> None:
        self.received = received

    def datagram_received(self, data: bytes, addr: Tuple[str, int]) -> None:
        self.received(data, addr)


class AsyncioMulticastChannel(MulticastChannel):
    """``MulticastChannel`` on asyncio sockets: the same group, TTL,
    loopback and own-packet rules; only the sockets differ."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_packet: Callable[..., Any],
                 group: str = discovery_packets.GROUP, port: int = discovery_packets.PORT, interface: Optional[str] = None,
                 ttl_limit: int = discovery_packets.MAX_LOCALITY) -> None:
        super().__init__(None, on_packet, group=group, port=port, interface=interface,
                         ttl_limit=ttl_limit)
        self.loop = loop
        self._transports: List[asyncio.DatagramTransport] = []
        self._send_socket: Optional[socket.socket] = None

    async def start_async(self) -> "AsyncioMulticastChannel":
        try:
            receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
            receiver.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                receiver.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                receiver.bind((self.group, self.port))
            except OSError:
                receiver.bind(("", self.port))   # some systems cannot bind a group
            membership = struct.pack("4s4s", socket.inet_aton(self.group),
                                     socket.inet_aton(self.interface or "0.0.0.0"))
            receiver.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
            receiver.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
            sender.bind(("", 0))
            sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)
            if self.interface:
                sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                                  socket.inet_aton(self.interface))
            for sock in (receiver, sender):
                sock.setblocking(False)
                transport, _ = await self.loop.create_datagram_endpoint(
                    lambda: _Datagrams(self._datagram), sock=sock)
                self._transports.append(transport)
            self._send_socket = sender
        except OSError as e:
            self._close_transports()
            raise DiscoveryUnavailable(
                f"cannot open the discovery socket on {self.group}:{self.port}: {e}") from e
        return self

    @property
    def running(self) -> bool:
        return self._send_socket is not None

    def send(self, packet: Any, locality: int) -> bool:
        """Multicast ``packet`` with IP TTL ``min(locality, ttl_limit)``."""
        sock = self._send_socket
        if sock is None:
            return False
        ttl = max(0, min(locality, self.ttl_limit))
        try:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
            self._transports[-1].sendto(discovery_packets.encode(packet), (self.group, self.port))
        except OSError:
            self.send_errors += 1
            return False
        self.sent += 1
        return True

    def is_own(self, addr: Tuple[str, int]) -> bool:
        sock = self._send_socket
        return (sock is not None and addr[1] == sock.getsockname()[1]
                and self.is_local(addr[0]))

    def _close_transports(self) -> None:
        for transport in self._transports:
            transport.close()
        self._transports = []
        self._send_socket = None

    async def stop_async(self) -> None:
        self._close_transports()




class AsyncioDnsSdBrowser(DnsSdBrowser):
    """``DnsSdBrowser`` on an asyncio loop: zeroconf's blocking calls run in
    the loop's executor, its browser thread hands over with
    ``call_soon_threadsafe``; parsing and the cache updates are the
    Twisted browser's."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_found: Callable[..., Any],
                 on_removed: Callable[[str], Any], interfaces: Optional[List[str]] = None,
                 resolve_timeout: float = 3.0) -> None:
        super().__init__(None, on_found, on_removed, interfaces=interfaces,
                         resolve_timeout=resolve_timeout)
        self.loop = loop
        self._lookups: Set["asyncio.Future[Any]"] = set()

    async def start_async(self) -> None:
        await self.loop.run_in_executor(None, self._open)

    def _handler(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        self.loop.call_soon_threadsafe(self._changed, name, state_change.name)

    def _look_up(self, zc: Any, service_name: str) -> None:
        lookup = self.loop.run_in_executor(None, zc.get_service_info, self.service_type,
                                           service_name, int(self.resolve_timeout * 1000))
        self._lookups.add(lookup)

        def resolved(done: "asyncio.Future[Any]") -> None:
            self._lookups.discard(done)
            if not done.cancelled() and done.exception() is None:
                self._resolved(done.result(), service_name)
        lookup.add_done_callback(resolved)

    async def stop_async(self) -> None:
        self._stopped = True
        if self._lookups:
            await asyncio.gather(*self._lookups, return_exceptions=True)
        await self.loop.run_in_executor(None, self._close)


class AsyncioDiscoverer(Discoverer):
    """``Discoverer`` on an asyncio loop: ``await d.start()``, ``await
    d.find(scope, timeout)``, ``await d.stop()``; or ``async with``.
    Arguments as ``Discoverer``'s: ERDP multicast (``erdp``) and DNS-SD
    browsing (``dns_sd``, on ``dns_sd_interfaces``), both on by default."""

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None,
                 interface: Optional[str] = None,
                 max_locality: int = DEFAULT_MAX_LOCALITY, ttl_limit: int = discovery_packets.MAX_LOCALITY,
                 group: str = discovery_packets.GROUP, port: int = discovery_packets.PORT, random: Any = None,
                 erdp: bool = True, dns_sd: bool = True,
                 dns_sd_interfaces: Optional[List[str]] = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        super().__init__(_Clock(self.loop), interface=interface, max_locality=max_locality,
                         ttl_limit=ttl_limit, group=group, port=port, dns_sd=False,
                         erdp=False, random=random)
        self.erdp: Optional[AsyncioMulticastChannel] = None
        if erdp:
            self.erdp = AsyncioMulticastChannel(self.loop, self._packet, group=group,
                                                port=port, interface=interface,
                                                ttl_limit=ttl_limit)
        self.channel = self.erdp
        self.dns_sd: Optional[AsyncioDnsSdBrowser] = None
        if dns_sd:
            if dns_sd_interfaces is None and interface:
                dns_sd_interfaces = [interface]
            self.dns_sd = AsyncioDnsSdBrowser(self.loop, self._dns_sd_found,
                                              self._dns_sd_removed,
                                              interfaces=dns_sd_interfaces)

    async def start(self) -> "AsyncioDiscoverer":  # type: ignore[override]
        """Open the sources; raises DiscoveryUnavailable only if none could
        be started."""
        if self.running:
            return self
        self.running = True
        if self.erdp is not None:
            try:
                await self.erdp.start_async()
                self.erdp_running = True
            except DiscoveryUnavailable as e:
                self.errors.append(str(e))
        if self.dns_sd is not None:
            try:
                await self.dns_sd.start_async()
                self.dns_sd_running = True
            except Exception as e:          # zeroconf cannot bind, say
                self.errors.append(f"DNS-SD: {e}")
        if not (self.erdp_running or self.dns_sd_running):
            self.running = False
            raise DiscoveryUnavailable("no discovery source could be started: "
                                       + "; ".join(self.errors))
        return self

    async def stop(self) -> None:  # type: ignore[override]
        """Stop soliciting, fail pending ``find`` calls, close the sources."""
        self.running = False
        self.solicitor.stop()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            self._finish(waiter, error=NoRouterFound("discovery stopped"))
        if self.erdp is not None and self.erdp_running:
            self.erdp_running = False
            await self.erdp.stop_async()
        if self.dns_sd is not None and self.dns_sd_running:
            self.dns_sd_running = False
            await self.dns_sd.stop_async()

    async def find(self, scope: Optional[str] = None,  # type: ignore[override]
                   timeout: Optional[float] = None, exclude: Any = ()) -> list:
        """``[(record, ElvinURI), ...]`` (non-empty) for routers usable with
        ``scope`` (None: default routers), soliciting if the cache has
        none; NoRouterFound after ``timeout`` seconds."""
        future: asyncio.Future = self.loop.create_future()
        found = Discoverer.find(self, scope, timeout, exclude, waiting=_FutureSlot(future))
        if found is not None:
            return found
        return await future

    async def __aenter__(self) -> "AsyncioDiscoverer":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


class _FutureSlot:
    """What ``Discoverer`` settles a waiter through, on an asyncio Future
    (Twisted's Deferred has the same three names)."""

    def __init__(self, future: asyncio.Future) -> None:
        self.future = future

    @property
    def called(self) -> bool:
        return self.future.done()

    def callback(self, result: Any) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def errback(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
