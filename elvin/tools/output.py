"""Writing a tool's output: a closed pipe (``| head``) ends the tool
quietly, any other failure (a full disk) with one error line, never a
traceback or a tool that keeps running with its output lost."""

import contextlib
import os
import sys

__all__ = ["StdoutError", "StdoutClosed", "StdoutFailed", "write", "print_and_exit",
           "output_guard"]


class StdoutError(Exception):
    """Our output cannot be written: the tool ends (StdoutClosed quietly,
    StdoutFailed with an error)."""


class StdoutClosed(StdoutError):
    """Whoever reads our output went away (``| head``): end quietly."""


class StdoutFailed(StdoutError):
    """Writing our output failed otherwise (a full disk, EIO): end with one
    error line and exit 1, since what was to be printed is lost."""


def _silence_stdout():
    """Point stdout at nothing, so that later flushes (at exit) do not
    fail again with a traceback."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def write(text, out=None):
    """Write to ``out`` (stdout); a closed pipe raises StdoutClosed, any
    other error writing it StdoutFailed."""
    out = out or sys.stdout
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        if out is sys.stdout:
            _silence_stdout()
        raise StdoutClosed() from None
    except OSError as e:
        if out is sys.stdout:
            _silence_stdout()
        raise StdoutFailed(f"cannot write to stdout: {e.strerror or e}") from None


@contextlib.contextmanager
def output_guard(name):
    """Within it, a closed stdout ends quietly and a failing one (a full
    disk) with one line, ``NAME: error: ...``, and exit 1."""
    try:
        yield
    except StdoutClosed:
        pass
    except StdoutFailed as e:
        sys.stderr.write(f"{name}: error: {e}\n")
        sys.exit(1)


def print_and_exit(text, name="elvin"):
    """Print ``text`` and exit 0, quietly when stdout is closed early
    (``--help | head``); 1 with one line when it cannot be written."""
    with output_guard(name):
        write(text + "\n")
    sys.exit(0)
