"""The trace analysis on a real Spark standalone cluster gives what local mode gives.

    python bench/spark_cluster.py [--port 7077|0] [--traces DIR] [--workdir DIR] [--keep]
                                  [--latency-sample N]
                                  [--conf KEY=VALUE ...] [--start-timeout S] [--run-timeout S]

Starts a Spark standalone master and two workers (one core, 1 GiB each) on
127.0.0.1 with the ``spark-class`` script the pyspark package ships
(``$SPARK_HOME/bin/spark-class``; pip's pyspark has no ``sbin/``), each in
its own process group with its log in the work dir, and waits (at most
``--start-timeout`` seconds) until the master reports two ALIVE workers.
``--port 0`` lets the system pick a free port for the master (the default
is Spark's 7077, which must be free); the web UIs get free ports.

Then it analyses the same traces three ways:

  local    python -m spark_analysis TRACES --out local --master local[2] --engine spark
  submit   $SPARK_HOME/bin/spark-submit --master spark://127.0.0.1:PORT ...
           spark_analysis/__main__.py TRACES --out submit
  module   python -m spark_analysis TRACES --out module --master spark://127.0.0.1:PORT

and compares every ``csv/*.csv`` of the local output with the two cluster
outputs: the same files, the same header and the same rows (as sorted
lists). Cells that are integers must be equal, other numbers equal within
a relative 1e-6; columns from Spark's ``percentile_approx`` (names with
``p50``, ``p90``, ``p99`` or ``_est_``) within 2 %, and the cells that
differ there are listed. Without ``--traces`` it first writes synthetic
traces (``python -m spark_analysis.synth --routers 5 --clients 20 --rate 50
--seconds 120``).

It prints the files and rows compared and the seconds of each run, always
stops the workers and the master (their whole process groups, also on
Ctrl-C or an error), checks that none of their processes is left, and exits
non-zero on any difference or failure. The work dir (a new temporary one
unless ``--workdir``) is removed afterwards unless ``--keep`` or a failure
(its ``*.log`` files say what happened). Not a unit test:
``elvin/test/test_spark_cluster.py`` runs a small version through
``run_cluster_check()``.
"""

import argparse
import contextlib
import csv
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Columns computed with percentile_approx: compared with APPROX_REL_TOL.
APPROX_COLUMN = re.compile(r"p50|p90|p99|_est_")
REL_TOL = 1e-6
APPROX_REL_TOL = 0.02

#: What each executor asks for: fits a worker's one core and 1 GiB.
EXECUTOR_CONF = {
    "spark.executor.memory": "768m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
}
#: The driver of a cluster run stays on loopback, without a web UI.
DRIVER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
}
SYNTH_DEFAULTS = {"routers": 5, "clients": 20, "rate": 50, "seconds": 120}
RUNS = ("local", "submit", "module")

__all__ = ["run_cluster_check", "compare_outputs", "Cluster", "ClusterError", "main"]


class ClusterError(Exception):
    """The cluster, the traces or a run did not do what was asked."""


def spark_home():
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def _port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the JVM does
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# ---------------------------------------------------------------------------
# processes: each in its own process group, stopped as a group

def _proc_table():
    """{pid: (pgid, state, cwd, ppid)} of the processes (Linux /proc), or None."""
    if not os.path.isdir("/proc/self"):
        return None
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue                                   # gone meanwhile
        # "pid (comm) state ppid pgrp ...": comm may hold spaces or ')'
        fields = stat[stat.rfind(")") + 2:].split()
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            cwd = ""
        table[int(name)] = (int(fields[2]), fields[0], cwd, int(fields[1]))
    return table


def process_groups(leaders, pgids=()):
    """The process groups of ``leaders`` (pids) and ``pgids``, plus the groups
    of all their live descendants: pyspark's worker daemon puts itself in a
    group of its own (os.setpgid(0, 0)), so a group kill alone misses it."""
    groups = set(leaders) | set(pgids)
    table = _proc_table()
    if table is None:
        return groups
    children = {}
    for pid, (_, _, _, ppid) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(leaders) + [pid for pid, info in table.items() if info[0] in groups]
    seen = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if pid in table:
            groups.add(table[pid][0])
        todo += children.get(pid, [])
    groups.discard(os.getpgrp())                       # never our own
    return groups


def leftover_processes(pgids, under=()):
    """Live (not zombie) processes in the groups ``pgids`` or whose working
    directory is below one of ``under`` (executors run in the workers' work
    dirs): [(pid, description)]."""
    pgids = set(pgids)
    under = [os.path.join(os.path.realpath(d), "") for d in under]
    table = _proc_table()
    if table is None:                                  # not Linux: ask the groups
        left = []
        for pgid in pgids:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            left.append((pgid, f"process group {pgid}"))
        return left
    left = []
    for pid, (pgid, state, cwd, _) in sorted(table.items()):
        if pid == os.getpid() or state == "Z":
            continue
        if pgid in pgids or any(os.path.join(cwd, "").startswith(d) for d in under):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            except OSError:
                cmd = "?"
            left.append((pid, f"pid {pid} (group {pgid}, in {cwd}): {cmd}"))
    return left


def _start(argv, log_path, env, cwd=None):
    """Popen in a new session (so a new process group), output to log_path."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)


def _signal_groups(pgids, sig):
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_groups(procs, grace=15.0, under=()):
    """SIGTERM to the groups of ``procs`` and of their descendants, wait up to
    ``grace`` s for them to empty, then SIGKILL what is left; reaps the
    leaders. Returns every group it signalled (for a final check)."""
    groups = process_groups([p.pid for p in procs])
    _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for proc in procs:
            proc.poll()
        groups |= process_groups([], groups)           # children started meanwhile
        if not leftover_processes(groups, under):
            break
        time.sleep(0.2)
    groups |= process_groups([], groups)
    _signal_groups(groups, signal.SIGKILL)
    for pid, _ in leftover_processes([], under):       # escaped the groups, still ours
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    end = time.monotonic() + 5                         # SIGKILL is quick, but not instant
    while leftover_processes(groups, under) and time.monotonic() < end:
        time.sleep(0.1)
    return groups


@contextlib.contextmanager
def _no_interrupts():
    """Ctrl-C and SIGTERM wait while processes are being stopped (main
    thread only; every wait in there is bounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------
# the cluster

class Cluster:
    """A standalone master and ``workers`` workers on 127.0.0.1.

    ``start()`` raises ClusterError (with the end of the log) if they do not
    come up in time; ``stop()`` ends every process group and returns the
    processes that were still there afterwards (should be none).
    """

    def __init__(self, workdir, port=7077, workers=2, cores=1, memory="1g", daemon_java_options=""):
        self.workdir = workdir
        self.daemon_java_options = daemon_java_options
        self.port = port
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.home = spark_home()
        self.procs = []                                # [(name, Popen, log path)]
        self.pgids = set()
        self.url = None
        self.webui = None
        self.worker_dirs = [os.path.join(workdir, f"worker-{n}") for n in range(1, workers + 1)]

    def env(self):
        env = dict(os.environ)
        env.update(SPARK_HOME=self.home, SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_PYTHON=sys.executable)
        if self.daemon_java_options:        # the master's and workers' own JVMs
            env["SPARK_DAEMON_JAVA_OPTS"] = self.daemon_java_options
        return env

    def _spawn(self, name, argv):
        path = os.path.join(self.workdir, f"{name}.log")
        proc = _start(argv, path, self.env(), cwd=self.workdir)
        self.procs.append((name, proc, path))
        self.pgids.add(proc.pid)
        return proc, path

    def start(self, timeout=60.0):
        os.makedirs(self.workdir, exist_ok=True)
        spark_class = os.path.join(self.home, "bin", "spark-class")
        if not os.path.exists(spark_class):
            raise ClusterError(f"{spark_class} is missing (pyspark installed without its scripts?)")
        if self.port and not _port_is_free(self.port):
            raise ClusterError(f"port {self.port} on 127.0.0.1 is in use (another Spark "
                               f"master?); --port 0 picks a free one")
        # our own settings file, so that nothing in $SPARK_HOME/conf applies;
        # no REST submission server (it would want port 6066)
        props = os.path.join(self.workdir, "spark-daemons.conf")
        with open(props, "w") as f:
            f.write("spark.master.rest.enabled false\n")
        deadline = time.monotonic() + timeout
        master, master_log = self._spawn("master", [
            spark_class, "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", "0",
            "--properties-file", props])
        # The log says where it listens (port 0: a free one; a taken port
        # would have been moved to the next one, which we refuse).
        url = ui = None
        while not (url and ui):
            text = _tail(master_log, 200)
            m = re.search(r"Starting Spark master at (spark://\S+)", text)
            url = m and m.group(1)
            m = re.search(r"Successfully started service 'MasterUI' on port (\d+)", text)
            ui = m and int(m.group(1))
            if url and ui:
                break
            self._check_alive(master, "master", master_log)
            if time.monotonic() > deadline:
                raise ClusterError(f"the master did not start within {timeout:.0f} s; "
                                   f"end of {master_log}:\n{_tail(master_log)}")
            time.sleep(0.25)
        if self.port and not url.endswith(f":{self.port}"):
            raise ClusterError(f"the master listens at {url}, not on port {self.port}")
        self.url = url
        self.webui = f"http://127.0.0.1:{ui}"
        for n, work in enumerate(self.worker_dirs, 1):
            os.makedirs(work, exist_ok=True)
            self._spawn(f"worker-{n}", [
                spark_class, "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
                "--webui-port", "0", "--work-dir", work, "--properties-file", props, url])
        while True:
            state = self.state()
            alive = [w for w in (state or {}).get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) >= self.workers:
                return state
            for name, proc, path in self.procs:
                self._check_alive(proc, name, path)
            if time.monotonic() > deadline:
                logs = "\n".join(f"end of {path}:\n{_tail(path, 8)}" for _, _, path in self.procs)
                raise ClusterError(f"{len(alive)} of {self.workers} workers ALIVE after "
                                   f"{timeout:.0f} s\n{logs}")
            time.sleep(0.5)

    @staticmethod
    def _check_alive(proc, name, path):
        if proc.poll() is not None:
            raise ClusterError(f"the {name} exited with status {proc.returncode}; "
                               f"end of {path}:\n{_tail(path)}")

    def state(self):
        """The master's JSON status (workers, apps), or None if it does not answer."""
        try:
            with urllib.request.urlopen(self.webui + "/json/", timeout=5) as response:
                return json.load(response)
        except (OSError, ValueError):
            return None

    def stop(self, grace=15.0):
        """Stop workers (and their executors), then the master; [(pid, text)] left."""
        workers = [p for name, p, _ in self.procs if name != "master"]
        masters = [p for name, p, _ in self.procs if name == "master"]
        with _no_interrupts():
            self.pgids |= _stop_groups(workers, grace, self.worker_dirs)
            self.pgids |= _stop_groups(masters, grace, self.worker_dirs)
            return leftover_processes(self.pgids, self.worker_dirs)


# ---------------------------------------------------------------------------
# comparing the CSV tables

def _number(text):
    """(kind, value): ("int", int), ("float", float) or (None, text)."""
    if re.fullmatch(r"[+-]?\d+", text):
        return "int", int(text)
    try:
        return "float", float(text)
    except ValueError:
        return None, text


def _sort_key(row, order):
    key = []
    for i in order:
        kind, value = _number(row[i]) if i < len(row) else (None, "")
        if kind is None:
            key.append((1, 0.0, value))
        else:                                          # numbers in numeric order, 9 digits
            key.append((0, float(f"{float(value):.9g}") if math.isfinite(value) else 0.0,
                        "" if math.isfinite(value) else str(value)))
    return tuple(key)


def _cells_match(a, b, approx):
    """(equal, relative difference or None)."""
    if a == b:
        return True, None
    (ka, va), (kb, vb) = _number(a), _number(b)
    if ka is None or kb is None:
        return False, None
    if math.isnan(va) and math.isnan(vb):
        return True, None
    if ka == kb == "int" and not approx:
        return False, None                             # counts, bytes, timestamps: exact
    scale = max(abs(va), abs(vb))
    diff = abs(va - vb) / scale if scale else 0.0
    return math.isclose(va, vb, rel_tol=APPROX_REL_TOL if approx else REL_TOL), diff


def compare_csv(reference, other):
    """Compare two CSV files; (rows, problems, approx_differences)."""
    name = os.path.basename(reference)
    with open(reference, newline="") as f:
        ref = list(csv.reader(f))
    with open(other, newline="") as f:
        oth = list(csv.reader(f))
    if not ref:
        return 0, ([] if not oth else [f"{name}: empty here, not in {other}"]), []
    if not oth or ref[0] != oth[0]:
        return 0, [f"{name}: header {oth[0] if oth else None} instead of {ref[0]}"], []
    header, ref_rows, oth_rows = ref[0], ref[1:], oth[1:]
    if len(ref_rows) != len(oth_rows):
        return len(ref_rows), [f"{name}: {len(oth_rows)} rows instead of {len(ref_rows)}"], []
    approx = [bool(APPROX_COLUMN.search(c)) for c in header]
    # sort on the exact columns first: approximate cells must not reorder rows
    order = [i for i, a in enumerate(approx) if not a] + [i for i, a in enumerate(approx) if a]
    ref_rows.sort(key=lambda r: _sort_key(r, order))
    oth_rows.sort(key=lambda r: _sort_key(r, order))
    problems, approx_diffs = [], []
    for n, (r, o) in enumerate(zip(ref_rows, oth_rows), 1):
        if len(r) != len(o):
            problems.append(f"{name} row {n}: {len(o)} cells instead of {len(r)}")
            continue
        for col, a, b, is_approx in zip(header, r, o, approx):
            same, diff = _cells_match(a, b, is_approx)
            where = f"{name} row {n} ({r[0]}) {col}"
            if not same:
                rel = f" (relative difference {diff:.2g})" if diff is not None else ""
                problems.append(f"{where}: {b!r} instead of {a!r}{rel}")
            elif a != b and is_approx:
                approx_diffs.append(f"{where}: {b} instead of {a} ({diff:.2%})")
    return len(ref_rows), problems, approx_diffs


def compare_outputs(reference, others):
    """Compare REFERENCE/csv/*.csv with each OTHER/csv/*.csv.

    ``others``: {name: report dir}. Returns {"equal", "files", "rows",
    "problems", "approx_differences"}; rows is {file: row count}.
    """
    result = {"files": [], "rows": {}, "problems": [], "approx_differences": []}
    ref_csv = os.path.join(reference, "csv")
    names = sorted(n for n in os.listdir(ref_csv) if n.endswith(".csv")) \
        if os.path.isdir(ref_csv) else []
    if not names:
        result["problems"].append(f"no CSV tables in {ref_csv}")
    result["files"] = names
    for label, directory in others.items():
        other_csv = os.path.join(directory, "csv")
        have = sorted(n for n in os.listdir(other_csv) if n.endswith(".csv")) \
            if os.path.isdir(other_csv) else []
        for missing in sorted(set(names) - set(have)):
            result["problems"].append(f"{label}: {missing} missing")
        for extra in sorted(set(have) - set(names)):
            result["problems"].append(f"{label}: {extra} not in the local output")
        for name in names:
            if name not in have:
                continue
            rows, problems, approx = compare_csv(os.path.join(ref_csv, name),
                                                 os.path.join(other_csv, name))
            result["rows"][name] = rows
            result["problems"] += [f"{label}: {p}" for p in problems]
            result["approx_differences"] += [f"{label}: {d}" for d in approx]
    result["equal"] = not result["problems"]
    return result


# ---------------------------------------------------------------------------
# the runs

def _run(name, argv, workdir, env, timeout, log, groups=None):
    """Run one analysis in its own process group; seconds taken. Raises
    ClusterError if it fails or overruns (its group is killed either way;
    the groups it had are added to ``groups``)."""
    path = os.path.join(workdir, f"run-{name}.log")
    _say(log, f"{name}: {' '.join(argv)}")
    began = time.monotonic()
    proc = _start(argv, path, env, cwd=ROOT)
    try:
        status = proc.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        raise ClusterError(f"run {name} did not finish within {timeout:.0f} s; end of "
                           f"{path}:\n{_tail(path)}") from None
    finally:
        # the driver's JVM (and anything else in the group) goes with it
        with _no_interrupts():
            found = _stop_groups([proc], grace=10)
        if groups is not None:
            groups |= found
    seconds = time.monotonic() - began
    if status != 0:
        raise ClusterError(f"run {name} exited with status {status}; end of {path}:\n"
                           f"{_tail(path)}")
    _say(log, f"{name}: {seconds:.1f} s")
    return seconds


def _call_reference(reference, traces, out, log):
    """The local tables written by ``reference`` in this process; seconds taken."""
    _say(log, f"local: in this process, to {out}")
    began = time.monotonic()
    reference(traces, out)
    seconds = time.monotonic() - began
    _say(log, f"local: {seconds:.1f} s")
    return seconds


def _say(log, text):
    if log is not None:
        print(text, file=log, flush=True)


class _Background:
    """A call in a thread of its own; ``result`` waits for it and returns
    what it returned, or raises what it raised."""

    def __init__(self, call):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call):
        try:
            self._value = call()
        except BaseException as e:                     # (raised again by result)
            self._error = e

    def join(self, timeout):
        self._thread.join(timeout)

    def result(self, timeout):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise ClusterError(f"the local run did not finish within {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        return self._value


def run_cluster_check(traces=None, workdir=None, port=7077, keep=False, synth=None, conf=None,
                      start_timeout=60.0, run_timeout=900.0, deadline=None, log=None,
                      analysis_args=(), only=RUNS, workers=2, reference=None,
                      daemon_java_options=""):
    """Start the cluster, run the analysis three ways (or the ``only`` of
    them named: "local" and at least one cluster run), compare, stop.

    ``traces``: a trace directory (else synthetic traces, ``synth`` options
    for ``spark_analysis.synth``, in the work dir). ``workdir``: where the
    logs and outputs go (default a new temporary directory, removed at the
    end unless ``keep`` or a failure). ``conf``: {key: value} of Spark
    settings for all three runs. ``deadline``: seconds for the whole
    check (every wait is cut to what is left of it). ``log``: a file for
    progress lines (None: silent). ``analysis_args``: more arguments of
    ``python -m spark_analysis`` for all three runs (``--latency-sample 2``
    checks that a sample is the same notifications on a cluster).
    ``workers``: how many workers (one core each) the cluster gets.
    ``reference``: a callable ``reference(traces, out_dir)`` that writes
    the local tables in this process (a Spark session already running
    here) instead of the "local" run's ``python -m spark_analysis
    --master local[2]`` with a driver of its own; ``analysis_args`` and
    ``conf`` are then the caller's to apply. ``daemon_java_options``: JVM
    options of the master and the workers (``SPARK_DAEMON_JAVA_OPTS``; the
    executors' are ``spark.executor.extraJavaOptions`` in ``conf``).

    Returns {"ok", "errors", "seconds" {"synth", "start", "local", "submit",
    "module", "stop"}, "comparison" (compare_outputs), "leftover" (processes
    left after the stop), "master_url", "workdir", "traces", "kept"}.
    Ctrl-C and other exceptions propagate after the processes are stopped.
    """
    began = time.monotonic()
    end = began + deadline if deadline else None

    def left(limit):
        return limit if end is None else max(1.0, min(limit, end - time.monotonic()))

    made = workdir is None
    workdir = os.path.abspath(workdir or tempfile.mkdtemp(prefix="elvin-spark-cluster-"))
    os.makedirs(workdir, exist_ok=True)
    result = {"ok": False, "errors": [], "seconds": {}, "comparison": None, "leftover": [],
              "master_url": None, "workdir": workdir, "traces": None, "kept": True}
    env = dict(os.environ)
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cluster = Cluster(workdir, port=port, workers=workers,
                      daemon_java_options=daemon_java_options)
    run_groups = set()                                 # of the analysis runs, checked at the end
    local_run = None                                   # the local run, in its own thread
    finished = False                                   # False: an exception is on its way out
    try:
        if traces is None:
            traces = os.path.join(workdir, "traces")
            options = dict(SYNTH_DEFAULTS, **(synth or {}))
            argv = [sys.executable, "-m", "spark_analysis.synth", "--out", traces]
            for key, value in options.items():
                argv += [f"--{key.replace('_', '-')}", str(value)]
            result["seconds"]["synth"] = _run("synth", argv, workdir, env, left(600), log,
                                             run_groups)
        traces = os.path.abspath(traces)
        result["traces"] = traces

        outs = {name: os.path.join(workdir, name) for name in RUNS}
        for path in outs.values():
            shutil.rmtree(path, ignore_errors=True)
        extra, confs = [], []                          # --conf for local, for the cluster
        analysis_args = list(analysis_args)
        for key, value in (conf or {}).items():
            extra += ["--conf", f"{key}={value}"]
        for key, value in {**DRIVER_CONF, **EXECUTOR_CONF, **(conf or {})}.items():
            confs += ["--conf", f"{key}={value}"]
        local_argv = [sys.executable, "-m", "spark_analysis", traces, "--out", outs["local"],
                      # (Spark's analysis, as on the cluster: a small window
                      # would otherwise go to DuckDB in the driver)
                      "--master", "local[2]", "--engine", "spark", "--quiet"] + extra + analysis_args
        # The local run needs no cluster: it runs while the cluster starts
        # (its JVMs spend their first seconds waiting on each other).
        if "local" in only and reference is not None:
            local_run = _Background(lambda: _call_reference(reference, traces, outs["local"],
                                                            log))
        elif "local" in only:
            local_run = _Background(lambda: _run("local", local_argv, workdir, env,
                                                 left(run_timeout), log, run_groups))

        _say(log, f"starting a master and {cluster.workers} workers on 127.0.0.1 "
                  f"(logs in {workdir})")
        t = time.monotonic()
        cluster.start(timeout=left(start_timeout))
        result["seconds"]["start"] = time.monotonic() - t
        result["master_url"] = cluster.url
        _say(log, f"master {cluster.url} (UI {cluster.webui}), {cluster.workers} workers ALIVE "
                  f"after {result['seconds']['start']:.1f} s")

        runs = {
            "submit": [os.path.join(spark_home(), "bin", "spark-submit"),
                       "--master", cluster.url] + confs +
                      [os.path.join(ROOT, "spark_analysis", "__main__.py"),
                       traces, "--out", outs["submit"], "--quiet"] + analysis_args,
            "module": [sys.executable, "-m", "spark_analysis", traces, "--out", outs["module"],
                       "--master", cluster.url] + confs + ["--quiet"] + analysis_args,
        }
        for name in only:
            if name != "local":
                result["seconds"][name] = _run(name, runs[name], workdir, env,
                                               left(run_timeout), log, run_groups)
        if local_run is not None:
            result["seconds"]["local"] = local_run.result(left(run_timeout))
        state = cluster.state() or {}
        apps = state.get("completedapps", []) + state.get("activeapps", [])
        on_cluster = [name for name in only if name != "local"]
        if len(apps) < len(on_cluster):
            result["errors"].append(f"the master knows {len(apps)} applications, not "
                                    f"{len(on_cluster)}: did the cluster runs use it?")
        comparison = compare_outputs(outs["local"], {name: outs[name] for name in on_cluster})
        result["comparison"] = comparison
        result["errors"] += comparison["problems"]
        finished = True
    except ClusterError as e:
        result["errors"].append(str(e))
        finished = True
    finally:
        if local_run is not None:
            local_run.join(run_timeout)               # (bounded: _run's own timeout)
        t = time.monotonic()
        result["leftover"] = cluster.stop()
        seen = {pid for pid, _ in result["leftover"]}
        result["leftover"] += [(pid, text) for pid, text in leftover_processes(run_groups)
                               if pid not in seen]
        result["seconds"]["stop"] = time.monotonic() - t
        if result["leftover"]:
            result["errors"].append("processes left after stopping the cluster:\n  " +
                                    "\n  ".join(text for _, text in result["leftover"]))
        result["ok"] = not result["errors"]
        if not finished:
            left = "; ".join(text for _, text in result["leftover"]) or "none"
            _say(log, f"stopped the cluster; processes left: {left}; work dir kept: {workdir}")
        if made and not keep and result["ok"] and finished:
            shutil.rmtree(workdir, ignore_errors=True)
            result["kept"] = False
    result["seconds"]["total"] = time.monotonic() - began
    return result


def summary(result):
    """The result as lines of text."""
    lines = []
    comparison = result["comparison"]
    if comparison:
        rows = comparison["rows"]
        lines.append(f"compared {len(comparison['files'])} CSV tables, "
                     f"{sum(rows.values()):,} rows each, local[2] against "
                     f"{len([r for r in RUNS if r != 'local' and r in result['seconds']])} "
                     "cluster runs:")
        for name in comparison["files"]:
            lines.append(f"  {name:<20} {rows.get(name, 0):>7,} rows")
        if comparison["approx_differences"]:
            lines.append(f"{len(comparison['approx_differences'])} percentile_approx cells "
                         f"differ within {APPROX_REL_TOL:.0%}:")
            lines += [f"  {d}" for d in comparison["approx_differences"]]
    seconds = result["seconds"]
    labels = {"synth": "generate traces", "start": "start cluster",
              "local": "local[2] (python -m)", "submit": "cluster (spark-submit)",
              "module": "cluster (python -m)", "stop": "stop cluster", "total": "total"}
    lines.append("seconds:")
    lines += [f"  {labels[k]:<24} {seconds[k]:7.1f}" for k in labels if k in seconds]
    if result["errors"]:
        lines.append(f"FAILED ({len(result['errors'])} problems):")
        lines += [f"  {e}" for e in result["errors"][:50]]
        if len(result["errors"]) > 50:
            lines.append(f"  ... and {len(result['errors']) - 50} more")
    else:
        lines.append("OK: the cluster runs give the local tables; no cluster process left")
    if result["kept"]:
        lines.append(f"work dir kept: {result['workdir']}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Run the trace analysis locally and on a 2-worker standalone Spark "
                    "cluster on 127.0.0.1, and check the CSV tables are the same.")
    parser.add_argument("--port", type=int, default=7077,
                        help="the master's port (default 7077; 0: a free port)")
    parser.add_argument("--traces", metavar="DIR",
                        help="analyse these traces (default: generate synthetic ones)")
    parser.add_argument("--workdir", metavar="DIR",
                        help="logs and outputs here (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for all three runs (repeatable)")
    parser.add_argument("--latency-sample", metavar="N|auto",
                        help="passed to the three analysis runs (e.g. 2: the latency tables "
                             "from a sample, which must be the same on the cluster)")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the master and 2 ALIVE workers (default 60)")
    parser.add_argument("--run-timeout", type=float, default=900.0, metavar="S",
                        help="seconds allowed for each analysis run (default 900)")
    args = parser.parse_args(argv)
    from spark_analysis.cli import parse_conf
    conf = parse_conf(args.conf, parser.error)
    if args.traces and not os.path.isdir(args.traces):
        parser.error(f"--traces {args.traces}: not a directory")
    from spark_analysis.session import pyspark_available
    missing = pyspark_available()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 1

    def terminated(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, terminated)
    # Ctrl-C raises KeyboardInterrupt even if started with SIGINT ignored (&)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = run_cluster_check(traces=args.traces, workdir=args.workdir, port=args.port,
                                   keep=args.keep, conf=conf, start_timeout=args.start_timeout,
                                   run_timeout=args.run_timeout, log=sys.stdout,
                                   analysis_args=(["--latency-sample", args.latency_sample]
                                                  if args.latency_sample else []))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print("\n".join(summary(result)))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
