"""spark_analysis on a real standalone Spark cluster: the small version of
``bench/spark_cluster.py``.

A master and one worker (one core, 1 GiB) on 127.0.0.1, on free ports,
started with the pyspark package's ``spark-class``; small synthetic traces
analysed in this process by the small-window engine (DuckDB, no JVM: the
engine-agreement tests hold it equal to local Spark, table for table) and
with ``python -m spark_analysis --master spark://... --no-report`` on the
cluster must give the same CSV tables (the charts and HTML are drawn in the
driver from those tables, nothing of the cluster's), and no process of the
cluster may be left afterwards.
(The bench script runs two workers and a local driver of its own.) The
check runs in a thread (so trial's timeout can fire) and every wait in it is
bounded by a deadline shorter than the timeout. The JVMs' output goes to
log files in the work dir, under ``_trial_temp``. Skipped, with the reason,
without pyspark, Java or ``spark-class``. About a minute on 2 cores.
"""

import csv
import importlib.util
import io
import os

from twisted.internet import threads
from twisted.trial import unittest

from elvin.test.places import REPO

BENCH = os.path.join(REPO, "bench", "spark_cluster.py")

#: Tiny inputs on the cluster: the shared local session's settings
#: (session.local_test_session: one shuffle partition, no code generation,
#: no adaptive execution, no broadcast joins), and the JVMs' quick JIT tier
#: only.
FAST = {
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}

#: The master's and the worker's JVMs: the quick JIT tier only and the
#: simplest GC (they schedule one application; the optimising tier's and the
#: parallel GC's threads would compete for the two cores with the driver and
#: the executor).
DAEMON_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def fast_conf():
    """FAST, every JVM without bytecode verification where it takes that
    (session.no_verify_options), the driver mapping the test sessions'
    class archive when there is one (session.ClassArchive: the driver is
    started as they are, by spark-submit, and loads the same classes)."""
    from spark_analysis.session import ClassArchive, no_verify_options, test_jvm_options
    conf = dict(FAST)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        conf[key] = f"{conf[key]} {no_verify_options()}".strip()
    mapped = ClassArchive(test_jvm_options()).map_options()
    if mapped:
        conf["spark.driver.extraJavaOptions"] += f" {mapped}"
    return conf


def daemon_java_options():
    """DAEMON_JAVA_OPTIONS, without bytecode verification where the JVM takes that."""
    from spark_analysis.session import no_verify_options
    return f"{DAEMON_JAVA_OPTIONS} {no_verify_options()}".strip()


def load_bench():
    spec = importlib.util.spec_from_file_location("elvin_bench_spark_cluster", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def processes_naming(*needles):
    """[(pid, command line)] of live processes whose command line holds a needle."""
    found = []
    if not os.path.isdir("/proc/self"):
        return found
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:].startswith("Z"):
            continue                                    # a zombie runs nothing
        if any(n in cmd for n in needles):
            found.append((int(name), cmd[:200]))
    return found


class StandaloneClusterTests(unittest.TestCase):

    timeout = 600

    def setUp(self):
        from spark_analysis.session import pyspark_available
        reason = pyspark_available()
        if reason:
            raise unittest.SkipTest(reason)
        import pyspark
        spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
        if not os.path.exists(spark_class):
            raise unittest.SkipTest(f"{spark_class} is missing")

    def test_cluster_tables_match_local(self):
        """DuckDB here and python -m on the cluster: the same CSV tables
        (latencies on a 1-in-2 sample: the same notifications on the
        executor as here); the master saw the cluster run; nothing left
        running. (The reference is the small-window engine rather than a
        local Spark session: the same tables, as the engine-agreement tests
        show, without a JVM's work in this process. spark-submit is the
        third way the bench script runs; left out here to keep the suite
        short: it runs the same module.)"""
        from spark_analysis import pipeline, smallwindow, synth
        if not smallwindow.available():
            raise unittest.SkipTest("DuckDB is not installed")
        bench = load_bench()

        def reference(traces, out):
            pipeline.run(None, traces, out, progress=None, report=False,
                         latency_sample=2, engine="duckdb")
        work = os.path.abspath(self.mktemp())
        traces = os.path.join(work, "traces")
        synth.generate(traces, routers=3, clients=8, rate=20, seconds=30, seed=3)
        cluster_dir = os.path.join(work, "cluster")
        log = io.StringIO()
        d = threads.deferToThread(
            bench.run_cluster_check, traces=traces, workdir=cluster_dir, port=0, conf=fast_conf(),
            start_timeout=90, run_timeout=240, deadline=self.timeout - 90, log=log,
            analysis_args=["--latency-sample", "2", "--no-report"], only=("local", "module"),
            workers=1, reference=reference, daemon_java_options=daemon_java_options())

        def check(result):
            report = "\n".join(bench.summary(result)) + "\n--- progress:\n" + log.getvalue()
            self.assertEqual(result["errors"], [], report)
            self.assertTrue(result["ok"], report)
            comparison = result["comparison"]
            self.assertTrue(comparison["equal"], report)
            for table in ("overview.csv", "links.csv", "routes.csv", "filter_effect.csv",
                          "hop_latency.csv"):
                self.assertIn(table, comparison["files"], report)
            self.assertGreater(sum(comparison["rows"].values()), 20, report)
            for run in ("local", "module"):
                with open(os.path.join(cluster_dir, run, "csv", "hop_latency.csv")) as f:
                    rows = list(csv.DictReader(f))
                self.assertTrue(rows, report)
                self.assertEqual({r["sample_1_in"] for r in rows}, {"2"}, report)
            self.assertTrue(result["master_url"].startswith("spark://127.0.0.1:"), report)
            self.assertNotEqual(result["master_url"], "spark://127.0.0.1:0")
            for run in ("start", "local", "module", "stop"):
                self.assertIn(run, result["seconds"], report)
            # no process left: the bench's own check, and one here by what
            # their command lines name (the master's address, the work dir)
            self.assertEqual(result["leftover"], [], report)
            self.assertEqual(processes_naming(result["master_url"][len("spark://"):],
                                              cluster_dir), [], report)
        return d.addCallback(check)


class DaemonOptionsTests(unittest.SynchronousTestCase):
    """The master's and workers' JVM options reach them through the
    environment spark-class reads (nothing is started here)."""

    def test_daemon_java_options_are_in_the_daemons_environment(self):
        if importlib.util.find_spec("pyspark") is None:
            raise unittest.SkipTest("pyspark is not installed")
        bench = load_bench()
        work = self.mktemp()
        env = bench.Cluster(work, port=0, daemon_java_options=DAEMON_JAVA_OPTIONS).env()
        self.assertEqual(env["SPARK_DAEMON_JAVA_OPTS"], DAEMON_JAVA_OPTIONS)
        self.assertIn("-XX:TieredStopAtLevel=1", env["SPARK_DAEMON_JAVA_OPTS"])
        # none given: whatever the caller's environment says
        self.assertEqual(bench.Cluster(work, port=0).env().get("SPARK_DAEMON_JAVA_OPTS"),
                         os.environ.get("SPARK_DAEMON_JAVA_OPTS"))

    def test_no_bytecode_verification_where_the_jvm_takes_it(self):
        """Every JVM of the cluster test (master, worker, driver, executor)
        is started as the test sessions' are (session.no_verify_options)."""
        from spark_analysis import session
        self.patch(session, "java_accepts", lambda options: True)
        conf = fast_conf()
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            self.assertIn(session.NO_VERIFY_OPTIONS, conf[key])
            self.assertIn("-XX:TieredStopAtLevel=1", conf[key])
        self.assertEqual(daemon_java_options(),
                         f"{DAEMON_JAVA_OPTIONS} {session.NO_VERIFY_OPTIONS}")
        self.patch(session, "java_accepts", lambda options: False)
        self.assertEqual(daemon_java_options(), DAEMON_JAVA_OPTIONS)
        self.assertEqual(fast_conf()["spark.executor.extraJavaOptions"],
                         FAST["spark.executor.extraJavaOptions"])
