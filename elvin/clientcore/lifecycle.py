"""A client connection's life, as one sans-IO state machine.

Every client flavour -- the Twisted ``elvin.client.Connection``, the
asyncio ``elvin.aio.Connection`` (and through it ``elvin.sync``) and the
proxy's upstream connection -- holds one ``Lifecycle`` and feeds it what
happens (``start``, ``dialled``, ``dial_failed``, ``packet``,
``channel_lost``, ``timer_fired``, ``close``, ``held``, ``retry_now``);
the machine answers with *effects*, handed to the driver's ``execute`` as
they arise:

=================  ==========================================================
``Dial(uri)``      open a channel to ``uri``; then ``dialled(send)`` or
                   ``dial_failed(cause)``
``StartTimer(d)``  (re)start the connection's one timer; ``timer_fired()``
                   (handshake and close timeouts, reconnection back-off, and
                   while UP the liveness check and the requests' timeouts)
``CancelTimer()``  stop it
``CloseChannel``   close the current channel (``abort``: at once, and forget
                   it: no more events from it; else politely, then
                   ``channel_lost``)
``PauseReading``   stop / resume reading from the channel (the receive
``ResumeReading``  bound: the router's queue and drop policy take over)
``Connected()``    the first session is up: ``connect`` returns
``ConnectFailed``  the first session could not be made (``cause``)
``Ended(error)``   the session is over: ``None`` when the program closed it,
                   else the ConnectionClosed saying why
=================  ==========================================================

The machine itself sends the handshake (ConnRqst), the replay of keys,
subscriptions and quenches after a reconnection, and DisconnRqst; fails
waiting requests; ends subscriptions' iterators (their ``_end(error)``)
and calls the program's hooks (``on_connection_lost``, ``on_reconnected``,
``on_redirect``, ``on_disconnect``), all held on the ``ClientState``.

States (``Phase``)::

    IDLE -start-> DIALLING -dialled-> HANDSHAKING -ConnRply-> UP (first time)
                                                  -ConnRply-> REPLAYING -all answered-> UP
    UP -lost, reconnect policy-> WAITING -timer-> DIALLING ...
    UP -Disconn 2, follow_redirects-> DIALLING (the new router, at once)
    UP -close-> CLOSING -DisconnRply, channel ends-> CLOSED
    any -close, lost without policy, gave up-> CLOSED

While reconnecting (WAITING, DIALLING, HANDSHAKING, REPLAYING after a
session was up) what the program sends waits in a buffer of
``pending_size`` bytes, sent in order once the session is back;
``PublishBufferFull`` when it would overflow. A change to a subscription
or quench waiting there (a ``Targeted`` request) is built again as it is
sent, with the id the replay gave; if the replay could not register the
item again, a remove succeeds and a modify fails, neither sent.
"""

import enum
import logging
import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from elvin.clientcore.state import (ClientState, CloseUnconfirmed, ConnectionClosed, NackError,
                                    PublishBufferFull, Reconnect, RequestTimeout, Targeted,
                                    describe_disconn, describe_request)
from elvin.protocols import packets
from elvin.uri import ElvinURI

__all__ = ["Lifecycle", "Phase", "Dial", "StartTimer", "CancelTimer", "CloseChannel",
           "PauseReading", "ResumeReading", "Connected", "ConnectFailedEffect", "Ended",
           "HandshakeTimeout", "DEFAULT_PENDING_SIZE", "DEFAULT_RECEIVE_QUEUE",
           "TLS_FIRST_PACKET_DELAY", "DEFAULT_LIVENESS", "liveness_seconds",
           "REDIRECT_POLICY", "LifecycleView"]

_log = logging.getLogger("elvin.client")

#: Bytes of notifications and requests kept while reconnecting (as
#: nats-py's ``pending_size``).
DEFAULT_PENDING_SIZE = 2 * 1024 * 1024
#: Notifications a connection holds for the program (iterators' queues,
#: coroutine callbacks running) before it stops reading from the socket.
DEFAULT_RECEIVE_QUEUE = 10_000
#: Seconds a polite close waits for the router's DisconnRply.
CLOSE_TIMEOUT = 5.0
#: Seconds of silence from the router after which every client flavour's
#: ``connect`` sends TestConn, ending the channel as lost when nothing
#: answers (as the Avis client's liveness check, whose default this is): a
#: router that died without closing the socket (a cut cable, a host gone,
#: a half-open connection) is noticed, and a reconnect policy takes over.
DEFAULT_LIVENESS = 60.0
#: The retries of a redirection followed without a reconnect policy.
REDIRECT_POLICY = Reconnect(attempts=5)
#: Seconds every client flavour waits after its TLS handshake before the
#: first packet (ConnRqst, UNotify), which then goes in a write of its own.
#: Avis's router (MINA's SSL filter) does not read a packet that reached it
#: in the same read as the client's TLS Finished: it waits for more bytes,
#: which never come (docs/interop.md). The pause makes that unlikely, not
#: impossible: a router too busy to read for longer still sees both at once.
TLS_FIRST_PACKET_DELAY = 0.02


def liveness_seconds(seconds: Any, name: str = "liveness") -> Optional[float]:
    """``seconds`` as a liveness interval (or another setting ``name``):
    None for no check (None, 0 or infinity); TypeError for what is not a
    number, ValueError for a negative number or NaN."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{name} must be a number of seconds (0 or None: off), "
                        f"not {seconds!r}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{name} must be 0 (off) or more seconds, not {seconds!r}")
    if seconds == 0 or math.isinf(seconds):
        return None
    return float(seconds)


class Phase(enum.Enum):
    IDLE = "idle"
    DIALLING = "dialling"
    HANDSHAKING = "handshaking"
    REPLAYING = "replaying"
    UP = "up"
    WAITING = "waiting"          # for the timer before the next try
    CLOSING = "closing"          # DisconnRqst sent
    CLOSED = "closed"


class Effect:
    __slots__: Tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{getattr(self, k)!r}" for k in self.__slots__)
        return f"{type(self).__name__}({fields})"


class Dial(Effect):
    __slots__ = ("uri",)

    def __init__(self, uri: ElvinURI) -> None:
        self.uri = uri


class StartTimer(Effect):
    __slots__ = ("delay",)

    def __init__(self, delay: float) -> None:
        self.delay = delay


class CancelTimer(Effect):
    __slots__ = ()


class CloseChannel(Effect):
    __slots__ = ("abort",)

    def __init__(self, abort: bool) -> None:
        self.abort = abort


class PauseReading(Effect):
    __slots__ = ()


class ResumeReading(Effect):
    __slots__ = ()


class Connected(Effect):
    __slots__ = ()


class ConnectFailedEffect(Effect):
    """The first connect failed: ``cause`` is what the driver reported
    (a socket error), a ConnectionClosed (the channel ended before
    ConnRply), a NackError or a HandshakeTimeout."""
    __slots__ = ("cause",)

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause


class Ended(Effect):
    __slots__ = ("error",)

    def __init__(self, error: Optional[ConnectionClosed]) -> None:
        self.error = error


class HandshakeTimeout(TimeoutError):
    """No ConnRply (or replay) within the connect timeout."""


_RECONNECTING = (Phase.WAITING, Phase.DIALLING, Phase.HANDSHAKING, Phase.REPLAYING)
#: Requests a followed redirection sends again to the new router (they name
#: no id of the old session, which ended with them unanswered).
_RESENDABLE = (packets.SubAddRqst, packets.QnchAddRqst, packets.QosRqst, packets.SecRqst)


class Lifecycle:
    """See the module docstring. ``session`` is the ClientState the
    program's requests go through; ``owner`` is passed to
    ``on_reconnected``; ``clock()`` is the time in seconds."""

    def __init__(self, session: ClientState, uris: Union[ElvinURI, Sequence[ElvinURI]],
                 execute: Callable[[Effect], None], clock: Callable[[], float],
                 reconnect: Optional[Reconnect] = None, retry_connect: bool = False,
                 timeout: Optional[float] = None,
                 pending_size: int = DEFAULT_PENDING_SIZE,
                 receive_queue: int = DEFAULT_RECEIVE_QUEUE, owner: Any = None,
                 liveness: Optional[float] = None) -> None:
        self.session = session
        self.uris: List[ElvinURI] = [uris] if isinstance(uris, ElvinURI) else list(uris)
        if not self.uris:
            raise ValueError("connect needs at least one router URI")
        self.index = 0
        self.execute = execute
        self.clock = clock
        self.reconnect = reconnect
        self.retry_connect = retry_connect
        self.timeout = timeout
        self.pending_size = pending_size
        self.receive_queue = receive_queue
        self.owner = owner if owner is not None else session
        #: Seconds of silence before a TestConn (None or 0: never);
        #: ``liveness_wait()`` for the answer. ``_heard``: a packet came
        #: since the last check; ``_probing``: a check's TestConn is out.
        self._liveness = liveness_seconds(liveness)
        self._heard = False
        self._probing = False
        #: While UP, the timer serves the liveness check (its next tick at
        #: ``_liveness_at``) and the requests' timeouts (``_deadlines``:
        #: xid -> (when, the request, its seconds)); ``_armed``: when it is
        #: set to fire. Each request the program sends while UP waits at
        #: most ``request_timeout`` seconds for its reply: None, the
        #: connection's ``timeout``; 0, no bound (the proxy's upstream sets
        #: its own, ``upstream-timeout``). ``log_timeouts``: each request
        #: given up is logged as a warning (the proxy logs its own line,
        #: naming its client's session).
        self.request_timeout: Optional[float] = None
        self.log_timeouts = True
        self._liveness_at: Optional[float] = None
        self._deadlines: Dict[int, Tuple[float, Any, float]] = {}
        self._armed: Optional[float] = None
        self.phase = Phase.IDLE
        #: a session was up once (failures since are reconnection's)
        self.established = False
        self.reconnects = 0
        #: ConnRqst's (options, nfn_keys, sub_keys)
        self.connect_args: Tuple[Any, Any, Any] = (None, None, None)
        self._channel = False
        self._disconn: Optional[Tuple[int, str]] = None
        self._delays: Optional[Iterator[float]] = None
        self._tried = 0                   # URIs tried this round
        self._last: Optional[BaseException] = None
        self._policy: Optional[Reconnect] = None
        self._announced: Optional[ElvinURI] = None   # on_redirect told of it
        #: (packet, size, xid, the Targeted that builds it again or None)
        self._buffer: List[Tuple[Any, int, Optional[int], Optional[Targeted]]] = []
        self._buffered = 0
        #: Liveness checks waiting for the router a redirection moves us to.
        self._moving_waiters: List[Tuple[Callable[[bool], Any], Callable[[Exception], Any]]] = []
        self._inflight: Dict[int, Any] = {}   # xid -> the program's request sent
        self._replays = 0
        self.held_count = 0
        self._paused = False
        #: Packets and bytes the program's sends wrote, in all; those the
        #: router has confirmed (it answered a request written after them);
        #: what was written up to each request still unanswered (by xid,
        #: and TestConns in order). A close without DisconnRply names what
        #: is unconfirmed.
        self._written = [0, 0]
        self._confirmed = (0, 0)
        self._channels = 0
        self._marks: Dict[int, Tuple[int, int]] = {}
        self._ping_marks: List[Tuple[int, int]] = []
        self._close_confirmed = False
        #: Notifications a failed channel gave back to the buffer, and
        #: those refused for want of room in it (``channel_lost(unsent=)``).
        self.requeued = 0
        self.requeue_refused = 0
        session.post = self._post

    # -- what the program sees --------------------------------------------------

    @property
    def uri(self) -> ElvinURI:
        """The router the session is with (or being dialled)."""
        return self.uris[self.index]

    @property
    def is_closed(self) -> bool:
        return self.phase in (Phase.CLOSING, Phase.CLOSED)

    @property
    def reconnecting(self) -> bool:
        return self.established and self.phase in _RECONNECTING

    @property
    def buffered(self) -> int:
        """Bytes waiting to be sent once reconnected."""
        return self._buffered

    def _post(self, packet: Any, xid: Optional[int], target: Optional[Targeted] = None) -> None:
        phase = self.phase
        if phase is Phase.UP:
            send = self.session.send
            if send is None:              # never: the phase changes with the channel
                raise ConnectionClosed(f"connection to the router at {self.uri} was lost")
            written = self._written
            written[0] += 1
            written[1] += send(packet) or 0
            if xid is not None:
                if xid == -1:
                    # A router with packets queued for us may skip ConfConn:
                    # marks left unanswered pile up, so keep the oldest 64 (a
                    # ConfConn then confirms less than it could, never more).
                    if len(self._ping_marks) < 64:
                        self._ping_marks.append((written[0], written[1]))
                    return
                self._marks[xid] = (written[0], written[1])
                if self._request_seconds():
                    self._bound(xid, packet)
                inflight = self._inflight
                if len(inflight) > 64:    # forget those answered
                    pending = self.session._pending
                    for done in [x for x in inflight if x not in pending]:
                        del inflight[done]
                inflight[xid] = packet
            return
        if phase in _RECONNECTING and self.established and xid != -1 and self.pending_size:
            size = len(packets.encode(packet))
            if self._buffered + size > self.pending_size:
                raise PublishBufferFull(
                    f"reconnecting to {self.uri}: the buffer of {self.pending_size} bytes "
                    f"is full ({self._buffered} bytes waiting); not sent")
            self._buffer.append((packet, size, xid, target))
            self._buffered += size
            return
        if phase in _RECONNECTING and self.established:
            raise ConnectionClosed(f"reconnecting to {self.uri}")
        raise self.closed_error()

    def closed_error(self) -> ConnectionClosed:
        """What a request meets once the session is over: the cause that
        ended it (a router's Disconn with its reason), or "connection is
        closed" when the program closed it."""
        if self.phase is Phase.CLOSED and self._end_error is not None and \
                not isinstance(self._end_error, CloseUnconfirmed):
            return ConnectionClosed(str(self._end_error), self._end_error.reason,
                                    self._end_error.disconn_args)
        return ConnectionClosed("connection is closed" if self.established or
                                self.phase is not Phase.IDLE else "not connected")

    _end_error: Optional[ConnectionClosed] = None

    @property
    def close_reason(self) -> Optional[ConnectionClosed]:
        """Why the session ended: None while it lasts or when the program
        closed it, else the ConnectionClosed its iterators raised, or the
        CloseUnconfirmed of a close the router did not confirm."""
        return self._end_error

    @property
    def unconfirmed(self) -> Tuple[int, int]:
        """(packets, bytes) the program wrote on this channel that the
        router has not confirmed yet (no answer to a request written after
        them)."""
        return (self._written[0] - self._confirmed[0],
                self._written[1] - self._confirmed[1])

    @property
    def writes(self) -> Tuple[int, int, int]:
        """(written, confirmed, channel): packets the program's sends have
        written, how many of them the router has confirmed (it answered a
        request written after them), and the channel's number (1 for the
        first, one more for each reconnection or redirection). A program
        that notes ``written`` and ``channel`` after a send knows the
        router has it once ``confirmed`` reaches that count on that
        channel; a new channel takes what the lost one left unconfirmed as
        settled, so what was sent on an earlier one stays unknown."""
        return self._written[0], self._confirmed[0], self._channels

    def _confirm(self, mark: Tuple[int, int]) -> None:
        if mark[0] > self._confirmed[0]:
            self._confirmed = mark

    def unsend(self, xid: int) -> bool:
        """Take request ``xid`` back out of the reconnection buffer (its
        caller gave up on it); True if it was there."""
        for i, (_, size, buffered_xid, _) in enumerate(self._buffer):
            if buffered_xid == xid:
                del self._buffer[i]
                self._buffered -= size
                self.session._pending.pop(xid, None)
                return True
        return False

    # -- events from the driver -------------------------------------------------

    def start(self, options: Any = None, nfn_keys: Any = None, sub_keys: Any = None) -> None:
        """Open the first session (ConnRqst with these)."""
        assert self.phase is Phase.IDLE
        self.connect_args = (options, nfn_keys, sub_keys)
        self._dial()

    def attached(self, send: Callable[[Any], Optional[int]], options: Any = None,
                 nfn_keys: Any = None, sub_keys: Any = None) -> None:
        """A channel the driver opened itself (no Dial): handshake on it."""
        assert self.phase is Phase.IDLE
        self.connect_args = (options, nfn_keys, sub_keys)
        self.phase = Phase.DIALLING
        self.dialled(send)

    def dialled(self, send: Callable[[Any], Optional[int]]) -> None:
        if self.phase is not Phase.DIALLING:
            return
        self._channel = True
        self._disconn = None
        self.session.send = send
        # What a lost channel left unconfirmed is not this one's to answer for.
        self._confirmed = (self._written[0], self._written[1])
        self._channels += 1
        self._marks.clear()
        self._ping_marks.clear()
        self.session.channel_changed()
        self.phase = Phase.HANDSHAKING
        if self.timeout:
            self.execute(StartTimer(self.timeout))
        self.session.send_request(self.session.conn_rqst(*self.connect_args),
                                  self._connected, self._refused)

    def dial_failed(self, cause: BaseException) -> None:
        if self.phase is Phase.DIALLING:
            self._attempt_failed(cause)

    def packet(self, packet: Any) -> None:
        """A packet read from the current channel."""
        self._heard = True
        kind = type(packet)
        if kind is packets.Disconn:
            self._disconnected(packet.reason, packet.args)
            return
        if kind is packets.ConfConn:
            if self._ping_marks:
                self._confirm(self._ping_marks.pop(0))
        elif kind is not packets.NotifyDeliver and (self._marks or self._deadlines):
            xid = getattr(packet, "xid", None)
            if xid is not None:
                self._deadlines.pop(xid, None)
                mark = self._marks.pop(xid, None)
                if mark is not None:
                    self._confirm(mark)
        self.session.packet_received(packet)

    def channel_lost(self, detail: str = "", unsent: Sequence[Any] = ()) -> None:
        """The current channel ended (``detail``: why, if known).
        ``unsent``: notifications the channel took but never sent (the
        HTTP tunnel's queue), in order: they go back to the buffer."""
        if not self._channel:
            return
        self._channel = False
        self.session.send = None
        self.session.acks.stop()
        self._deadlines.clear()
        phase = self.phase
        error = self._loss(detail)
        if phase is Phase.UP and self._armed is not None:
            self._armed = None
            self.execute(CancelTimer())   # the liveness check's, the requests' timeouts
        if unsent and phase is Phase.UP:
            self._requeue(unsent)
        if phase is Phase.UP and self._disconn is not None and self._disconn[0] == 2 \
                and self._disconn[1] and self.session.follow_redirects:
            # Followed: what the old router left unanswered goes to the new one,
            # and a liveness check is answered by it (the session is moving).
            pending = self.session._pending
            self._buffer[:0] = [(packet, 0, xid, None)
                                for xid, packet in sorted(self._inflight.items())
                                if xid in pending and isinstance(packet, _RESENDABLE)]
            self._moving_waiters += self.session._liveness_waiters
            self.session._liveness_waiters = []
        self._inflight.clear()
        # The requests that waited on this channel fail once the phase has
        # moved on: an errback that makes a request at once (Twisted fires
        # them synchronously) sees the new phase (buffered while
        # reconnecting, ConnectionClosed once ended), never a half-lost UP.
        failed = self.session._take_pending(keep=self._buffered_xids())
        try:
            self._channel_ended(phase, error)
        finally:
            for on_error in failed:
                on_error(error)

    def _requeue(self, unsent: Sequence[Any]) -> None:
        """Put what the channel never sent at the front of the buffer, in
        order, within ``pending_size`` (sent once the session is back, or
        counted as not sent when it ends); what does not fit is counted
        and logged."""
        kept: List[Tuple[Any, int, Optional[int], Optional[Targeted]]] = []
        room = self.pending_size - self._buffered
        size_kept = refused = refused_bytes = 0
        for packet in unsent:
            size = len(packets.encode(packet))
            if refused or size_kept + size > room:
                refused += 1
                refused_bytes += size
                continue
            kept.append((packet, size, None, None))
            size_kept += size
        self._buffer[:0] = kept
        self._buffered += size_kept
        self.requeued += len(kept)
        if refused:
            self.requeue_refused += refused
            _log.warning("%d notifications (%d bytes) written for %s but never sent are "
                         "lost: the reconnection buffer of %d bytes is full", refused,
                         refused_bytes, self.uri, self.pending_size)

    def _channel_ended(self, phase: Phase, error: ConnectionClosed) -> None:
        """``channel_lost``'s transition out of ``phase``."""
        if phase is Phase.CLOSING:
            self._end(self._close_outcome("the channel ended before the router's "
                                          "DisconnRply"))
        elif phase is Phase.UP:
            if self._redirecting():
                return
            if self.reconnect is not None:
                self._delays = None
                self._policy = self.reconnect
                self._tried = 0
                self._last = error
                _log.warning("%s; reconnecting", error)
                self._wait_or_give_up()
                self._call("on_connection_lost", error)
            else:
                # Without reconnection too: a callback-only program has no
                # other sign that its session is over.
                self._end(error)
                self._call("on_connection_lost", error)
        elif phase in (Phase.HANDSHAKING, Phase.REPLAYING):
            if self.established and self._redirecting():
                return
            self._attempt_failed(error)

    def timer_fired(self) -> None:
        phase = self.phase
        if phase is Phase.WAITING:
            self._dial()
        elif phase in (Phase.HANDSHAKING, Phase.REPLAYING):
            self._drop_channel()
            self._attempt_failed(HandshakeTimeout(
                f"no Elvin ConnRply from {self.uri} within {self.timeout:g} s"))
        elif phase is Phase.CLOSING:
            self._drop_channel()
            self._end(self._close_outcome(f"no DisconnRply from {self.uri} within "
                                          f"{CLOSE_TIMEOUT:g} s"))
        elif phase is Phase.UP:
            self._up_timer()

    # -- the requests' timeouts ---------------------------------------------------

    def _request_seconds(self) -> float:
        """Seconds a request sent now waits for its reply (0: no bound)."""
        seconds = self.timeout if self.request_timeout is None else self.request_timeout
        return seconds or 0.0

    def _bound(self, xid: int, packet: Any) -> None:
        """Request ``xid`` went out while UP: it waits ``_request_seconds()``."""
        seconds = self._request_seconds()
        deadline = self.clock() + seconds
        self._deadlines[xid] = (deadline, packet, seconds)
        if self._armed is None or deadline < self._armed:
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        self._armed = at
        self.execute(StartTimer(max(0.0, at - self.clock())))

    def _rearm(self, cancel: bool = False) -> None:
        """Set the UP timer for the next liveness tick or request deadline
        (``cancel``: stop it if there is none)."""
        times = [deadline for deadline, _, _ in self._deadlines.values()]
        if self._liveness_at is not None:
            times.append(self._liveness_at)
        if times:
            self._arm(min(times))
        elif cancel:
            self._armed = None
            self.execute(CancelTimer())

    def _up_timer(self) -> None:
        """The UP timer fired: fail the requests whose time is up, tick the
        liveness check if due, and set the timer for what comes next."""
        at, self._armed = self._armed, None
        now = self.clock()
        due = now if at is None else max(now, at)   # a loop may fire a little early
        if self._deadlines:
            self._expire(due)
        if self.phase is Phase.UP and self._liveness_at is not None \
                and self._liveness_at <= due:
            self._check_liveness(now)
        if self.phase is Phase.UP:
            self._rearm()

    def _expire(self, due: float) -> None:
        """Fail the requests not answered by ``due`` with RequestTimeout;
        the connection stays up (a dead router is the liveness check's)."""
        expired = [(xid, packet, seconds)
                   for xid, (deadline, packet, seconds) in self._deadlines.items()
                   if deadline <= due]
        for xid, _, _ in expired:
            del self._deadlines[xid]
            self._marks.pop(xid, None)    # a late reply confirms nothing it was counted for
        for xid, packet, seconds in expired:
            error = RequestTimeout(f"the router at {self.uri} did not answer "
                                   f"{describe_request(packet)} within {seconds:g} s",
                                   type(packet).__name__, seconds)
            # Not if answered, failed (a closing errback) or abandoned meanwhile.
            if self.session.time_out(xid, packet, error) and self.log_timeouts:
                _log.warning("%s; the connection stays open", error)

    # -- the liveness check -------------------------------------------------------

    @property
    def liveness(self) -> Optional[float]:
        """Seconds of silence from the router after which TestConn is sent
        (None: no check). Set while up, the check starts over."""
        return self._liveness

    @liveness.setter
    def liveness(self, seconds: Optional[float]) -> None:
        self._liveness = liveness_seconds(seconds)
        if self.phase is Phase.UP:
            self._heard, self._probing = True, False
            self._liveness_at = self.clock() + self._liveness if self._liveness else None
            self._rearm(cancel=True)

    def liveness_wait(self) -> float:
        """Seconds the check waits for the router's answer: the
        connection's timeout, or the liveness interval without one."""
        return self.timeout or self._liveness or 0.0

    def _check_liveness(self, now: float) -> None:
        """The UP timer: a packet heard since the last tick (or reading
        paused by us, which silences the router) starts the interval over;
        silence sends TestConn; silence after it ends the channel as lost.
        A router with packets queued for us may answer with them instead
        of ConfConn: any packet counts."""
        liveness = self._liveness
        assert liveness is not None
        if self._heard or self._paused:
            self._heard = self._probing = False
            self._liveness_at = now + liveness
            return
        if not self._probing:
            self._probing = True
            self._post(packets.TestConn(), -1)
            self._liveness_at = now + self.liveness_wait()
            return
        self._probing = False
        self._liveness_at = None
        detail = (f"no answer to TestConn within {self.liveness_wait():g} s after "
                  f"{liveness:g} s without a packet from the router")
        self.execute(CloseChannel(abort=True))  # forgotten: no channel_lost from it
        self.channel_lost(detail)

    def close(self) -> None:
        """The program closes the connection: politely when up (the router
        has everything sent before once this ends), else at once."""
        phase = self.phase
        if phase in (Phase.CLOSING, Phase.CLOSED):
            return
        if phase is Phase.UP and self._channel:
            # The program's requests still waiting fail now, not when the
            # channel ends (up to CLOSE_TIMEOUT later).
            waiting = self.session._take_pending()
            self._inflight.clear()
            self._deadlines.clear()
            self.session.stop_acks()      # what the program handled, before DisconnRqst
            self._close_confirmed = False
            self.phase = Phase.CLOSING
            self.execute(StartTimer(CLOSE_TIMEOUT))
            self.session.send_request(self.session.disconn_rqst(),
                                      lambda reply: self._closing_answered(),
                                      lambda error: None)
            closed = ConnectionClosed("connection is closed")
            for on_error in waiting:
                on_error(closed)
            return
        self.execute(CancelTimer())
        if self.phase is not Phase.IDLE:
            self._drop_channel()
        if not self.established and phase is not Phase.IDLE:
            self.phase = Phase.CLOSED
            self.execute(ConnectFailedEffect(ConnectionClosed("closed before connecting")))
            return
        unsent = None
        if self._buffer:
            unsent = CloseUnconfirmed(
                f"closed while reconnecting to {self.uri}: {_count(len(self._buffer))} "
                f"queued ({self._buffered} bytes) not sent",
                unsent=len(self._buffer), unsent_bytes=self._buffered)
        self._end(unsent)

    def held(self, delta: int) -> None:
        """The program holds ``delta`` more (or fewer) delivered
        notifications: past ``receive_queue`` reading stops until they are
        down to half of it."""
        self.held_count += delta
        if not self.receive_queue:
            return
        if not self._paused and self.held_count >= self.receive_queue:
            self._paused = True
            self.execute(PauseReading())
        elif self._paused and self.held_count <= self.receive_queue // 2:
            self._paused = False
            self.execute(ResumeReading())

    def retry_now(self) -> bool:
        """The router is known to be back (router discovery announced it,
        or a connection to its port succeeded): if waiting out a back-off
        delay, dial now. A try that fails goes on with the back-off where
        it was, so calling this never makes retries more frequent than one
        per call. True if it dialled."""
        if self.phase is not Phase.WAITING:
            return False
        self.execute(CancelTimer())
        self._dial()
        return True

    def add_uris(self, uris: Sequence[Union[str, ElvinURI]]) -> None:
        """More routers to fail over to (router discovery found them)."""
        known = {str(u) for u in self.uris}
        for uri in uris:
            parsed = uri if isinstance(uri, ElvinURI) else ElvinURI(str(uri))
            if str(parsed) not in known:
                self.uris.append(parsed)
                known.add(str(parsed))

    # -- internals --------------------------------------------------------------

    def _dial(self) -> None:
        self.phase = Phase.DIALLING
        self.execute(Dial(self.uri))

    def _connected(self, reply: Any) -> None:
        if self.phase is not Phase.HANDSHAKING:
            return
        self.session.options = dict(reply.options)
        self.session.channel_started()
        self._delays = None
        self._tried = 0
        if not self.established:
            self.established = True
            self._up()
            self.execute(Connected())
            return
        steps = self.session.replay()
        self.phase = Phase.REPLAYING
        self._replays = len(steps)
        if not steps:
            self._back()
        for make_packet, apply, owner in steps:
            self.session.send_request(make_packet, self._replayed(apply),
                                      self._replay_refused(owner))

    def _replayed(self, apply: Optional[Callable[[Any], None]]) -> Callable[[Any], None]:
        def answered(reply: Any) -> None:
            if apply is not None:
                apply(reply)
            self._replay_done()
        return answered

    def _replay_refused(self, owner: Any) -> Callable[[Exception], None]:
        def refused(error: Exception) -> None:
            if not isinstance(error, NackError) or self.phase is not Phase.REPLAYING:
                return                    # the channel ended: channel_lost decides
            if owner is None:             # a key change refused: try again later
                self._drop_channel()
                self._attempt_failed(error)
                return
            # The router will not take it back (a new limit, say): it ends,
            # and its iterator says why.
            self.session.drop(*owner)
            end = getattr(owner[1], "_end", None)
            if end is not None:
                end(error)
            self._replay_done()
        return refused

    def _replay_done(self) -> None:
        self._replays -= 1
        if self._replays == 0 and self.phase is Phase.REPLAYING:
            self._back()

    def _back(self) -> None:
        announced = self._announced      # the router on_redirect last told of
        self.reconnects += 1
        self._up()
        buffer, self._buffer, self._buffered = self._buffer, [], 0
        send = self.session.send
        assert send is not None
        gone = []
        for packet, _, xid, target in buffer:
            if target is not None and xid is not None:
                if not target.registered():
                    gone.append((xid, target))
                    continue
                packet = target(xid)      # the id the replay gave
            self._written[0] += 1
            self._written[1] += send(packet) or 0
            if xid is not None and self._request_seconds():
                self._bound(xid, packet)
        for xid, target in gone:          # after the sends: what they do goes after them
            waiting = self.session._pending.pop(xid, None)
            if waiting is not None:
                target.settle_here(*waiting)
        if self._moving_waiters:
            self.session._liveness_waiters += self._moving_waiters
            self._moving_waiters = []
            send(packets.TestConn())
        if announced is not None and announced != self.uri:
            self.session.redirected(self.uri)
        self._call("on_reconnected", self.owner)

    def _up(self) -> None:
        self.phase = Phase.UP
        self._announced = self.uri
        self._policy = None
        self._deadlines.clear()
        self._armed = None
        if self._liveness:
            self._heard, self._probing = True, False
            self._liveness_at = self.clock() + self._liveness
            self._arm(self._liveness_at)
        else:
            self._liveness_at = None
            if self.timeout:
                self.execute(CancelTimer())

    def _refused(self, error: Exception) -> None:
        if self.phase is not Phase.HANDSHAKING or not isinstance(error, NackError):
            return                        # lost: channel_lost decides
        self._drop_channel()
        self._attempt_failed(error)

    def _closing_answered(self) -> None:
        if self.phase is Phase.CLOSING and self._channel:
            self._close_confirmed = True  # everything written before has reached it
            self.execute(CloseChannel(abort=False))

    def _close_outcome(self, why: str) -> Optional[CloseUnconfirmed]:
        """How a close the router did not answer ended: None if the router
        had confirmed everything written (or DisconnRply came), else the
        CloseUnconfirmed naming what it had not."""
        if self._close_confirmed:
            return None
        packets_, bytes_ = self.unconfirmed
        if not packets_:
            _log.info("%s; everything sent had been confirmed", why)
            return None
        return CloseUnconfirmed(
            f"closed without the router's confirmation ({why}): {_count(packets_)} "
            f"({bytes_} bytes) sent since it last confirmed receipt may not have "
            f"reached it", unconfirmed=packets_, unconfirmed_bytes=bytes_)

    def _disconnected(self, reason: int, args: str) -> None:
        self._disconn = (reason, args)
        hook = self.session.on_disconnect
        if hook is not None:
            try:
                hook(reason, args)
            except Exception:
                self.session._callback_failed("on_disconnect")
        if self._channel and self.phase is not Phase.CLOSING:
            self.execute(CloseChannel(abort=False))

    def _loss(self, detail: str) -> ConnectionClosed:
        if self._disconn is not None:
            reason, args = self._disconn
            return ConnectionClosed(describe_disconn(self.uri, reason, args), reason, args)
        why = f": {detail}" if detail else ""
        return ConnectionClosed(f"connection to the router at {self.uri} was lost{why}")

    def _redirecting(self) -> bool:
        """Follow the router's Disconn 2 if it sent one and we may."""
        if self._disconn is None or self._disconn[0] != 2 or not self._disconn[1]:
            return False
        target = self._disconn[1]
        if not self.session.follow_redirects:
            return False
        if not self.session.redirect_allowed(self.clock()):
            _log.warning("redirected more than 5 times in 10 s (a loop?); giving up at %r",
                         target)
            self._end(ConnectionClosed(f"redirection loop: last redirected to {target}",
                                       2, target))
            return True
        try:
            uri = ElvinURI(target)
        except Exception as e:
            _log.warning("router redirected us to %r, which we cannot use: %s", target, e)
            return False
        _log.info("redirected from %s to %s", self.uri, uri)
        self.uris[self.index] = uri
        self._announced = uri
        self.session.redirected(uri)
        self._policy = self.reconnect or REDIRECT_POLICY
        self._delays = None
        self._tried = 0
        self._dial()
        return True

    def _attempt_failed(self, cause: BaseException) -> None:
        self._last = cause
        if not self.established and not self.retry_connect:
            self._tried += 1
            if self._tried < len(self.uris):   # the first connect tries each in turn
                self.index = (self.index + 1) % len(self.uris)
                self._dial()
                return
            self.phase = Phase.CLOSED
            self.execute(CancelTimer())
            self.execute(ConnectFailedEffect(cause))
            return
        if self._policy is None:
            self._policy = self.reconnect or Reconnect()
        self._tried += 1
        if self._tried < len(self.uris):  # fail over to the next router at once
            self.index = (self.index + 1) % len(self.uris)
            self._dial()
            return
        self._tried = 0
        if len(self.uris) > 1:
            self.index = 0                # back to the first (preferred) after a round
        self._wait_or_give_up()

    def _wait_or_give_up(self) -> None:
        policy = self._policy or self.reconnect or Reconnect()
        if self._delays is None:
            self._delays = policy.delays()
        delay = next(self._delays, None)
        if delay is None:
            last = self._last
            if not self.established:
                self.phase = Phase.CLOSED
                self.execute(ConnectFailedEffect(last or ConnectionClosed("gave up")))
                return
            self._end(ConnectionClosed(f"gave up reconnecting to {self.uri}: {last}",
                                       getattr(last, "reason", None),
                                       getattr(last, "disconn_args", "")))
            return
        self.phase = Phase.WAITING
        self.execute(StartTimer(delay))

    def _drop_channel(self) -> None:
        if self._channel or self.phase is Phase.DIALLING:
            self._channel = False
            self.session.send = None
            self.execute(CloseChannel(abort=True))
            self.session._fail_pending(self._loss("closed"), keep=self._buffered_xids())

    def _buffered_xids(self) -> List[int]:
        return [xid for _, _, xid, _ in self._buffer if xid is not None]

    def _end(self, error: Optional[ConnectionClosed]) -> None:
        """The session is over: fail what waits, end the iterators."""
        self.phase = Phase.CLOSED
        self._end_error = error
        self.execute(CancelTimer())
        if isinstance(error, CloseUnconfirmed):
            _log.warning("session with %s: %s", self.uri, error)
        elif self._buffer:
            # Queued while the connection was away and never sent: said
            # here, with the reason, whichever way the session ended.
            _log.warning("session with %s ended (%s): %d queued packets (%d bytes) not sent",
                         self.uri, error or "closed", len(self._buffer), self._buffered)
        elif error is not None:
            _log.warning("session with %s ended: %s", self.uri, error)
        self._buffer, self._buffered = [], 0
        self.session._liveness_waiters += self._moving_waiters
        self._moving_waiters = []
        # The program closed it: iterators end normally even if the router
        # did not confirm the close (that is the close's to say).
        ending = None if isinstance(error, CloseUnconfirmed) else error
        closed = ending or ConnectionClosed("connection is closed")
        self.session._fail_pending(closed)
        for sub in list(self.session.subscriptions.values()):
            end = getattr(sub, "_end", None)
            if end is not None:
                end(ending)
        self.execute(Ended(error))

    def _call(self, hook: str, argument: Any) -> None:
        callback = getattr(self.session, hook, None)
        if callback is None:
            return
        try:
            callback(argument)
        except Exception:
            self.session._callback_failed(hook)


def _count(packets_: int) -> str:
    return f"{packets_} packet" if packets_ == 1 else f"{packets_} packets"


class LifecycleView:
    """What a driver's connection shows of the Lifecycle it holds
    (``self.lifecycle``): the same properties in every flavour."""

    lifecycle: Lifecycle

    @property
    def uri(self) -> ElvinURI:
        """The router's URI (the new one after a redirection or failover)."""
        return self.lifecycle.uri

    @property
    def is_closed(self) -> bool:
        """True from ``close()`` on, and once the session has ended (not
        while reconnecting)."""
        return self.lifecycle.is_closed

    @property
    def close_reason(self) -> Optional[ConnectionClosed]:
        """None while the session lasts or when the program closed it, else
        the ConnectionClosed that ended it (``reason``: the router's Disconn
        reason, if it sent one)."""
        return self.lifecycle.close_reason

    @property
    def reconnects(self) -> int:
        return self.lifecycle.reconnects

    def retry_now(self) -> bool:
        """Reconnect at once if waiting to (the router is known to be
        back); True if a dial started. See ``Lifecycle.retry_now``."""
        return self.lifecycle.retry_now()

    @property
    def reconnect(self) -> Optional[Reconnect]:
        return self.lifecycle.reconnect

    @reconnect.setter
    def reconnect(self, policy: Optional[Reconnect]) -> None:
        self.lifecycle.reconnect = policy

    @property
    def liveness(self) -> Optional[float]:
        """Seconds of silence from the router after which the connection
        sends TestConn, ending the channel as lost (``on_connection_lost``,
        then the reconnect policy) when nothing answers within its timeout;
        None: no check. Settable at any time."""
        return self.lifecycle.liveness

    @liveness.setter
    def liveness(self, seconds: Optional[float]) -> None:
        self.lifecycle.liveness = seconds

    @property
    def timeout(self) -> Optional[float]:
        """Seconds each request waits for the router's reply (then it
        fails with RequestTimeout; the connection stays open), the liveness
        check for its answer, and a reconnection for ConnRply: ``connect``'s
        ``timeout``. None: no bound. Settable at any time (for what is sent
        from then on)."""
        return self.lifecycle.timeout

    @timeout.setter
    def timeout(self, seconds: Optional[float]) -> None:
        self.lifecycle.timeout = liveness_seconds(seconds, "timeout")
