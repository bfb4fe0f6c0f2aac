"""What a client session needs from whoever serves it: ``SessionHost``.

``ClientSession`` (elvin.core.router) is the state machine of section 5.4:
states, violations, Disconn, protocol-error accounting, Nacks and the
checks every ConnRqst passes first. That part is shared: the router serves
it, and so does the proxy (elvin.proxy), whose ``ProxyClient`` keeps it and
brings its own request handlers. What the shared part reads or calls on
its host is declared here, so that a host lacking a member fails the type
check (mypy) and ``test_session_host`` instead of a client's request at
run time. The router's own request handlers (subscriptions, quenches,
routing) need the ``Router`` itself and are not part of this interface.

Written down as ``SessionOutput`` and ``RouterObserver`` are (a transport
gives a session its output; watchers hear from the router): a
``typing.Protocol`` that ``Router`` and ``ProxyCore`` declare as a base.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Deque, Protocol, Set, Tuple

from elvin.core.options import ConnectionOptions

__all__ = ["SessionHost", "SESSION_OVERRIDES"]

#: What a host's own session class (the proxy's ``ProxyClient``) replaces
#: of ``ClientSession``, and what each replacement must keep. Everything
#: else (the states, ``violation``, ``protocol_error``, ``nack``,
#: ``disconnect``, ``_admissible``, ``_established``, DisconnRqst and
#: TestConn) it inherits unchanged. ``test_session_host`` holds the
#: proxy's overrides to exactly these names, each a member of
#: ``ClientSession``, so that a rename there cannot leave an override
#: silently unused.
SESSION_OVERRIDES = {
    "HANDLERS": "packet class -> handler after ConnRqst; ConnRqst and UNotify must be keys "
                "(packet_received refuses a class that is not one)",
    "SERVER_NAME": "what Nacks call the host",
    "log": "the logger (its namespace names the host)",
    "_connect": "admit a ConnRqst: _admissible(packet) first; once admitted (it may "
                "be later: the state stays NEW meanwhile), _established(xid, reply)",
    "packet_received": "may hold packets while admitting, then passes each to "
                       "ClientSession.packet_received, in order",
    "connection_lost": "ends its own work, then ClientSession.connection_lost",
    "deliver": "writes a notification to the output only while CONNECTED",
    "notify_emit": "the transports' fast path for NotifyEmit: takes every "
                   "parameter of ClientSession.notify_emit (the transports "
                   "pass the received packet and where its attributes end)",
    "_unotify": "request handler",
    "_qos_rqst": "request handler", "_sec_rqst": "request handler",
    "_sub_add": "request handler", "_sub_mod": "request handler",
    "_sub_del": "request handler",
}


class SessionHost(Protocol):
    """What ``ClientSession``'s state machine uses of its router (or proxy)."""

    #: Seconds, monotonic; protocol errors are counted in a window of it.
    clock: Callable[[], float]
    #: Seconds since the epoch: what refusals are dated with.
    wall_clock: Callable[[], float]
    #: ``max_protocol_errors`` protocol errors (1xxx Nacks) within
    #: ``protocol_error_window`` seconds disconnect a client (0: never).
    max_protocol_errors: int
    protocol_error_window: float
    #: Nacks sent, by error code, and the latest refusals, newest last:
    #: (time, peer, code, message); operations show both.
    nacks: collections.Counter[int]
    refusals: Deque[Tuple[float, Any, int, str]]
    #: True once shutting down: a ConnRqst is refused.
    closing: bool
    #: The open sessions, and how many may be connected at once.
    sessions: Set[Any]
    max_connections: int

    def new_options(self) -> ConnectionOptions:
        """The connection options a new session negotiates from."""
        ...

    def notification_ignored(self, peer: Any, problem: str) -> None:
        """A notification from ``peer`` was ignored (7.3.3) for ``problem``:
        count it where the host counts such things, and log it, rate-limited."""
        ...

    def deliveries_lost(self, count: int) -> None:
        """``count`` deliveries to a session were dropped (its send queue's
        drop policy) or will never be written (its channel was reset or
        lost); the session's ``dropped`` counts them too."""
        ...

    def slow_client_disconnected(self) -> None:
        """A client's channel is being reset because it does not read what
        it is sent (its send queue overflowed, or the host's queue memory
        ran out)."""
        ...

    def session_closed(self, session: Any) -> None:
        """``session`` ended: forget it and what it held."""
        ...
