"""The client's session state, under its documented name: the classes live
in ``elvin.clientcore.state`` (importable without Twisted, as ``elvin.aio``
does); they are the same objects here."""

from elvin.clientcore.state import *  # noqa: F401,F403 (every public name)
from elvin.clientcore.state import (  # noqa: F401 (documented beside them)
    ASK_LIMITS, DISCONN_REASONS, PROXY_EVENT, MakePacket, QuenchCallback, ReplayStep,
    SessionArg)
from elvin.clientcore.state import __all__  # noqa: F401
