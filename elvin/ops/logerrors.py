"""Counts log lines lost to failing writes.

A log file on a full disk, or past the process's file-size limit
(RLIMIT_FSIZE: Python ignores SIGXFSZ, so the write fails with EFBIG),
makes the observer writing it raise ``OSError``. Twisted's log publisher
catches that and tells the *other* observers, with the failure and the
observer; this observer is one of them and counts those events, so that
``elvin_log_write_errors_total`` and the status page (which need no disk)
show that lines are being lost, and how many.
"""

from twisted.logger import globalLogPublisher

__all__ = ["LogWriteErrors", "WRITE_ERRORS"]


class LogWriteErrors:
    """A log observer counting events another observer failed to write."""

    def __init__(self):
        self.count = 0
        self._installed = 0

    def __call__(self, event):
        failure = event.get("log_failure")
        if failure is not None and "observer" in event and failure.check(OSError):
            self.count += 1

    def install(self, publisher=globalLogPublisher):
        """Watch ``publisher`` (nested installs are counted: the last
        ``uninstall`` removes it)."""
        if not self._installed:
            publisher.addObserver(self)
        self._installed += 1

    def uninstall(self, publisher=globalLogPublisher):
        if self._installed:
            self._installed -= 1
            if not self._installed:
                publisher.removeObserver(self)


#: The router process's counter (installed by elvin.tap's RouterService).
WRITE_ERRORS = LogWriteErrors()
