"""The client's session state, under its documented name: the classes live
in ``elvin.clientcore.state`` (importable without Twisted, as ``elvin.aio``
does); they are the same objects here."""

from elvin.clientcore.state import (  # noqa: F401
    DISCONN_REASONS, PROXY_EVENT, AutoQuenchBase, ClientState, ConnectFailed,
    ConnectionClosed, Deframer, JoinedSession, MakePacket, NackError, Notification,
    PublishBufferFull, QuenchCallback, QuenchHandlers, QuenchState, Reconnect, ReplayStep,
    RequestTimeout, describe_request,
    SessionArg, SessionSubscription, coroutine_result_refused, describe_disconn,
    proxy_options, refuse_coroutine)
from elvin.clientcore.state import __all__  # noqa: F401
