"""The client libraries' log lines in a twistd service's own log.

The clients log through the standard library (``elvin.client``: they run
in asyncio and blocking programs too). Inside ``twistd elvin-proxy`` their
lines (the upstream connection lost, reconnecting) had no handler and went
to stderr through logging's last resort, which twistd logs as
``[stderr#error]`` whatever their level. ``bridge_client_logging`` sends
them to Twisted's logger instead, under their own namespace and level.
"""

import logging

from twisted.logger import Logger, LogLevel

__all__ = ["TwistedHandler", "bridge_client_logging"]

_LEVELS = ((logging.CRITICAL, LogLevel.critical), (logging.ERROR, LogLevel.error),
           (logging.WARNING, LogLevel.warn), (logging.INFO, LogLevel.info))


class TwistedHandler(logging.Handler):
    """A standard-library handler writing each record to Twisted's log."""

    def emit(self, record):
        level = next((twisted for number, twisted in _LEVELS if record.levelno >= number),
                     LogLevel.debug)
        try:
            text = record.getMessage()
        except Exception:                      # a bad format: say so, do not raise
            text = f"{record.msg!r} {record.args!r}"
        Logger(namespace=record.name).emit(level, "{text}", text=text)


def bridge_client_logging(name="elvin", level=logging.INFO):
    """Route the ``name`` logger (the client libraries') to Twisted's log,
    once per process; returns its handler."""
    logger = logging.getLogger(name)
    for handler in logger.handlers:
        if isinstance(handler, TwistedHandler):
            return handler
    handler = TwistedHandler()
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    return handler
