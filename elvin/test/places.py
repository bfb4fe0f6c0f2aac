"""Where tests find the checkout, free loopback ports and processes, and
elvin-stat run in-process: one copy each."""

import os
import socket

#: The checkout's root (README.md, conf/, docs/ live there).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port(kind=socket.SOCK_STREAM):
    """A port on 127.0.0.1 that was free a moment ago (TCP by default)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_inodes(port):
    """Socket inodes listening on TCP ``port`` of 127.0.0.1 or any address
    (Linux's /proc/net/tcp); None where there is no /proc."""
    inodes = set()
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                address, state, inode = fields[1], fields[3], fields[9]
                host, _, hexport = address.partition(":")
                if (state == "0A" and int(hexport, 16) == port
                        and host in ("0100007F", "00000000")):
                    inodes.add(inode)
    except OSError:
        return None
    return inodes


def _owns(pid, inodes):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


class PortTaken(RuntimeError):
    """The process could not listen: another process has the port."""


def wait_listening(proc, port, what, timeout=20.0):
    """Wait until the process ``proc`` itself listens on 127.0.0.1:``port``.

    Something answering on the port is not enough: under ``trial -j`` another
    test's process may have taken a port that free_port() handed out here a
    moment before, and ours then fails to bind and exits -- while a client
    would talk to the other one. Raises PortTaken when ``proc`` exits first,
    RuntimeError when it is not listening within ``timeout`` seconds.
    """
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PortTaken(f"{what} exited with status {proc.returncode} before listening "
                            f"on 127.0.0.1:{port}")
        inodes = _listening_inodes(port)
        if inodes is None:          # no /proc: an answer on the port must do
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                pass
        elif inodes and _owns(proc.pid, inodes):
            return
        time.sleep(0.05)
    proc.kill()
    proc.wait(10)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def start_twistd(plugin, argv_for, port=None, attempts=5, log=None):
    """``twistd -n <plugin> <argv_for(port)>`` listening on ``port`` of
    127.0.0.1: (port, process). Without a ``port``, a free one -- and
    another if a process elsewhere takes it first (PortTaken). ``log``: a
    file its output (the log) is appended to, else it is thrown away."""
    import subprocess
    import sys
    for attempt in range(1 if port else attempts):
        chosen = port or free_port()
        argv = argv_for(chosen)
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c",
                 "import sys; from twisted.scripts.twistd import run; "
                 f"sys.argv = ['twistd', '-n', '--pidfile=', {plugin!r}] + {argv!r}; run()"],
                cwd=REPO, stdout=out, stderr=out)
        finally:
            if log:
                out.close()
        try:
            wait_listening(proc, chosen, f"twistd {plugin}")
            return chosen, proc
        except PortTaken:
            if port or attempt == attempts - 1:
                raise


def elvin_stat_on_a_thread(base, *args):
    """elvin-stat's main in this process on a thread (it blocks), against
    the status listener ``base``: a Deferred firing with (exit status,
    stdout, stderr)."""
    import contextlib
    import io
    from twisted.internet import threads
    from elvin.tools import stat

    def run():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                stat.main(["-e", base, *args])
                code = 0
            except SystemExit as e:
                code = e.code or 0
        return code, out.getvalue(), err.getvalue()
    return threads.deferToThread(run)
