"""Getting a SparkSession without hard-coding where it runs."""

import contextlib
import os
import re
import tempfile

__all__ = ["get_session", "pyspark_available", "local_test_session", "is_local_master",
           "local_settings", "common_settings", "quiet_jvm_options", "jvm_stderr_to",
           "QUICK_JIT_RECORDS", "ClassArchive", "test_jvm_options", "NO_VERIFY_OPTIONS",
           "java_path", "java_accepts", "no_verify_options"]


def pyspark_available():
    """None if pyspark and a Java runtime are there, else a reason why not."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install '.[spark]')"
    import shutil
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) \
            and shutil.which("java") is None:
        return "no Java runtime found (install Java 17+ or set JAVA_HOME)"
    return None


def get_session(master=None, app_name="elvin-trace-analysis", conf=None, log_level="WARN"):
    """The active SparkSession, or a new one.

    ``master`` is only set when given (``--master``); otherwise
    ``spark-submit`` or ``SparkSession.builder.getOrCreate()`` decide
    (pyspark alone defaults to ``local[*]``). ``conf`` adds settings.
    """
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.appName(app_name)
               .config("spark.ui.showConsoleProgress", "false"))  # we print our own
    if master:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if log_level:
        spark.sparkContext.setLogLevel(log_level)
    # All our times are UTC; this only affects timestamps shown by Spark.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def is_local_master(master):
    """True when this process will start Spark itself in local mode: ``--master
    local[...]``, or no master at all outside spark-submit (pyspark's default)."""
    if master:
        return master.startswith("local")
    return "PYSPARK_GATEWAY_PORT" not in os.environ and \
        "--master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", "")


def quiet_jvm_options():
    """Driver JVM options: log4j errors only (no notices a user cannot act on)."""
    quiet = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-quiet.properties")
    return f"-Dlog4j2.configurationFile={quiet}" if os.path.exists(quiet) else ""


# JVM options for the one JVM of local mode (driver and executor at once),
# each measured on the 2-core benchmark machine (docs/analysis.md):
# the throughput collector (batch work; G1's concurrent work competes for
# the two cores), the whole heap from the start (growing it from 1/64 of
# RAM cost the first pass over the traces 40%), JIT compilation of
# Spark's generated methods however large (the JVM otherwise interprets
# methods over 8,000 bytecodes for ever), and less inlining by the
# optimising compiler (hot callees up to 50 bytecodes instead of 325,
# compiled ones up to 500 bytes of code instead of 2,500): its one
# thread spent a third of the JVM's CPU compiling Spark afresh in every
# process, and with smaller units it gets through them sooner -- a 10M
# record run 63.8-67.3 s instead of 76.4-83.5 s, the same tables
# (docs/analysis.md, "Where the time goes").
LOCAL_JVM_OPTIONS = ("-XX:+UseParallelGC -XX:-DontCompileHugeMethods "
                     "-XX:FreqInlineSize=50 -XX:InlineSmallCode=500")


def local_cores(master=None):
    """The task threads of a local master: local[N] -> N, local -> 1,
    local[*] or none -> this machine's CPUs."""
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master or "local[*]")
    if match is None:
        return os.cpu_count() or 1
    if match.group(1) is None:
        return 1
    return os.cpu_count() or 1 if match.group(1) == "*" else int(match.group(1))


# A run expected to touch fewer records than this uses only the JVM's quick
# JIT tier (C1): its Spark work is dozens of small queries, each compiled
# and warmed up once, and the optimising compiler's (C2) own CPU time costs
# more than it gives back -- one more hour over a table of 10M records took
# 23 s instead of 30 s. On 10M records C1 alone was 4% slower, so bigger
# runs keep both tiers. With the quick tier alone the JVM reserves only
# 48 MB for compiled code, which a run with more than a minute of JVM work
# fills ("CodeCache is full. Compiler has been disabled"): everything later
# runs interpreted. 240 MB is the tiered JVM's default; start-up is the
# same (a 16 MB synthetic run: 27.1-27.9 s with it, 25.9-28.7 s without,
# alternating, load 0.2-3.0).
QUICK_JIT_RECORDS = 3_000_000
QUICK_JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


# Spark compiles the Java it generates for each query once and keeps the
# class in a cache of 100 by default: one run of the analysis makes more
# than that, so a process that runs it again (``--watch``) compiled every
# query anew each time, and the JIT never got to optimise them. With room
# for 1,000 the classes of the queries that do not depend on the window are
# reused (those that filter by its bounds, literals in the code, are not):
# a run over one hour in a process that has run a few took 11 s instead of
# 14-15 s (docs/analysis.md); the least recently used make way beyond that.
CODEGEN_CACHE_ENTRIES = 1000


def common_settings():
    """Settings for every run, local or on a cluster (static: set before
    Spark starts)."""
    return {"spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES)}


def local_settings(ui=False, driver_memory="1g", master=None, quick_jit=False):
    """Settings for a local-mode run: driver bound to loopback (with a host
    name resolving to loopback Spark would otherwise pick the first
    interface's address), no web UI unless asked, quiet logs, the JVM
    options above (``driver_memory``: the heap to start with, Spark's
    ``spark.driver.memory``), and 4 shuffle partitions a core (Spark's 200
    are 200 files for every map task to write, on one machine; adaptive
    execution coalesces the reduce side, not that). ``quick_jit``: the
    run is small (QUICK_JIT_RECORDS), so the JIT's quick tier only."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = common_settings()
    settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                     "spark.ui.enabled": "true" if ui else "false",
                     "spark.sql.shuffle.partitions": str(4 * local_cores(master))})
    jit = f" {QUICK_JIT_OPTIONS}" if quick_jit else ""
    java = f"{LOCAL_JVM_OPTIONS}{jit} -Xms{driver_memory} {quiet_jvm_options()}".strip()
    settings["spark.driver.extraJavaOptions"] = java
    return settings


def jvm_stderr_to(path):
    """Context manager: the JVM started inside it writes its standard error
    (the launcher's "Using incubator modules", log4j's notices) to ``path``."""
    return _stderr_to(path)


# Verifying the bytecode of every class a new JVM loads from Spark's jars
# is a good part of its start and of its first queries: a test JVM's
# session and first pipeline run (the hand-made traces, Spark's engine)
# took 31.0-32.1 s of the JVM's CPU with verification off and 36.7-38.6 s
# with it on (alternating runs, load 4-10). The tests' JVMs run only the
# jars pyspark installed; the option is HotSpot's, and diagnostic, so it
# is only given to a JVM that starts with it (``no_verify_options``).
NO_VERIFY_OPTIONS = "-XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"


def java_path():
    """The ``java`` a Spark started here runs: ``$JAVA_HOME/bin/java``, else
    the PATH's (None if there is neither)."""
    import shutil
    java_home = os.environ.get("JAVA_HOME")
    return os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")


_accepted = {}


def java_accepts(options):
    """True if ``java_path()`` starts with ``options`` (``-version``; asked
    once a process for each java and options)."""
    import subprocess
    java = java_path()
    key = (java, options)
    if key not in _accepted:
        try:
            done = subprocess.run([java, *options.split(), "-version"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=60)
            _accepted[key] = done.returncode == 0
        except (OSError, TypeError, subprocess.TimeoutExpired):
            _accepted[key] = False
    return _accepted[key]


def no_verify_options():
    """NO_VERIFY_OPTIONS where the JVM takes them, else "" (for the tests' JVMs)."""
    return NO_VERIFY_OPTIONS if java_accepts(NO_VERIFY_OPTIONS) else ""


def test_jvm_options():
    """The JVM options of ``local_test_session`` (without the class archive's)."""
    # the quick JIT tier only, and the simplest GC; quiet logs; no bytecode
    # verification (NO_VERIFY_OPTIONS). With the quick
    # tier alone the JVM reserves 48 MB for compiled code, which the suite's
    # Spark tests fill within a minute of one process's work ("CodeCache is
    # full. Compiler has been disabled"): every later query then runs
    # interpreted, for nearly twice the CPU. 240 MB is the tiered JVM's default.
    java = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"
    java = f"{java} {no_verify_options()}".strip()
    quiet = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-quiet.properties")
    if os.path.exists(quiet):
        java += f" -Dlog4j2.configurationFile={quiet}"
    return java


def local_test_session(partitions=1):
    """A small local session for tests: local[2], no UI, one shuffle partition.

    Code generation and adaptive execution are off: on inputs of a few
    hundred records they cost far more (JIT, compiling) than they save.
    """
    import sys
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    java = test_jvm_options()
    archive = ClassArchive(java)
    java = f"{java} {archive.java_options()}".strip()
    # The JVM writes straight to the inherited stderr (its launcher's
    # "WARNING: Using incubator modules", Spark's log4j notices), which
    # would land in the middle of the test output: give it a log file.
    with _stderr_to(os.path.join(tempfile.gettempdir(), "elvin-spark-jvm.log")):
        spark = _test_session(partitions, java)
    archive.started(spark)
    return spark


class ClassArchive:
    """A class-data-sharing archive of the classes a test JVM loads (JDK 13+).

    A new JVM spends seconds of CPU reading, parsing and verifying Spark's
    classes from its jars before the first query runs (a session and one
    small query: 9 s of the JVM's CPU, 4 s with the archive; the first run
    of the pipeline after it about 5 s less again). The first test session
    on a machine runs with ``-XX:ArchiveClassesAtExit``: when the process
    ends, its JVM is stopped and waited for (bounded) while it writes every
    class it loaded to a file, which is then renamed into place under the
    cache directory (``ELVIN_SPARK_CDS_DIR``, else ``$XDG_CACHE_HOME`` or
    ``~/.cache``, then ``elvin/spark-cds``); later sessions map it
    (``-XX:SharedArchiveFile``). The file's name is a digest of the Java
    runtime, the pyspark version and jars, and the JVM options, so another
    of any of them makes a new one (and removes the old). Nothing here can
    fail a run: a directory that cannot be written means no archive, and a
    JVM that cannot use a file (another JDK build, a file cut short) starts
    without it. Only with ``ELVIN_SPARK_CDS=1``: a single run on a fresh
    machine (CI) would pay for writing it and map it nowhere.
    """

    EXIT_WAIT = 120        # seconds the process waits, at its end, for the dump

    def __init__(self, java_options):
        self.path = self.writing = None
        if os.environ.get("ELVIN_SPARK_CDS", "0") != "1":
            return
        try:
            directory = self.directory()
            os.makedirs(directory, exist_ok=True)
            if not os.access(directory, os.W_OK):
                return
            self.path = os.path.join(directory, f"spark-{self.key(java_options)}.jsa")
        except (OSError, ValueError, ImportError):
            self.path = None

    @staticmethod
    def directory():
        where = os.environ.get("ELVIN_SPARK_CDS_DIR")
        if where:
            return where
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                   ".cache")
        return os.path.join(cache, "elvin", "spark-cds")

    @staticmethod
    def key(java_options):
        """A digest of what the archive depends on."""
        import hashlib
        import pyspark
        java = java_path()
        if not java:
            raise ValueError("no java")
        java = os.path.realpath(java)
        jars = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")
        parts = [java, str(os.stat(java).st_mtime_ns), pyspark.__version__, jars,
                 java_options]
        parts += sorted(f"{name}:{os.stat(os.path.join(jars, name)).st_size}"
                        for name in os.listdir(jars))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    # (warnings about classes it cannot archive, or an archive it cannot
    # map, would go to the JVM's standard output: the test output)
    QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

    def map_options(self):
        """JVM options mapping the archive, if there is one ("" if not)."""
        if self.path is None or not os.path.exists(self.path):
            return ""
        return f"-XX:SharedArchiveFile={self.path} {self.QUIET}"

    def java_options(self):
        """The options for the JVM about to start: map the archive, or write one."""
        if self.path is None:
            return ""
        mapped = self.map_options()
        if mapped:
            return mapped
        self.writing = f"{self.path}.{os.getpid()}.tmp"
        return f"-XX:ArchiveClassesAtExit={self.writing} {self.QUIET}"

    def started(self, spark):
        """Once the JVM runs: if it is to write the archive, stop it at exit."""
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        if self.writing is None or proc is None:
            return
        import atexit
        atexit.register(self._finish, spark, proc)

    def _finish(self, spark, proc):
        import contextlib
        import subprocess
        try:
            spark.stop()
        except Exception:
            pass
        try:
            proc.stdin.close()          # the JVM exits on the end of its input
            proc.wait(timeout=self.EXIT_WAIT)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        try:
            if proc.returncode == 0 and os.path.getsize(self.writing) > 0:
                os.replace(self.writing, self.path)
                self._remove_others()
        except OSError:
            pass
        with contextlib.suppress(OSError):
            os.unlink(self.writing)

    def _remove_others(self):
        """Archives of other keys, and unfinished ones a day old."""
        import time
        directory, keep = os.path.dirname(self.path), os.path.basename(self.path)
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if not name.startswith("spark-") or name == keep:
                continue
            try:
                if name.endswith(".jsa") or time.time() - os.stat(path).st_mtime > 86400:
                    os.unlink(path)
            except OSError:
                pass


@contextlib.contextmanager
def _stderr_to(path):
    """File descriptor 2 points at ``path`` while the JVM starts (it keeps
    that file for its life); ours is restored afterwards."""
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def _test_session(partitions, java):
    return get_session("local[2]", "elvin-trace-analysis-tests", {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.default.parallelism": str(partitions),
        # tiny inputs: compiling code for every query costs more than it saves
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": java,
        # no broadcast joins: each broadcast is a job of its own, and on
        # these inputs a one-partition shuffle join is cheaper (a run of the
        # pipeline over a small synthetic trace: 5.2-6.4 s of JVM CPU
        # instead of 7.7-8.3, warm; 16 instead of 21 cold)
        "spark.sql.autoBroadcastJoinThreshold": "-1",
    }, log_level="ERROR")
