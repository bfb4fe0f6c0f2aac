"""Tests for ``--watch`` and ``--last``: the loop alone (no Spark), the window
of ``pipeline.run(last_us=...)``, and the command line kept running over a
trace directory that gets a new file."""

import io
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

from twisted.trial import unittest

from spark_analysis import traceformat as tf
from spark_analysis.watch import parse_duration, watch
from elvin.test.test_spark_analysis import (T, _tempdir, handmade_records, run_cli,
                                            spark_session, write_handmade)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class DurationTests(unittest.SynchronousTestCase):

    def test_units(self):
        self.assertEqual(parse_duration("90"), 90)
        self.assertEqual(parse_duration("90s"), 90)
        self.assertEqual(parse_duration("15m"), 900)
        self.assertEqual(parse_duration("1.5h"), 5400)
        self.assertEqual(parse_duration("2D"), 172800)

    def test_bad(self):
        for text in ("", "soon", "h", "-1h", "0", "0s", "1w", "nan", "inf"):
            with self.assertRaises(ValueError, msg=text) as caught:
                parse_duration(text)
            self.assertIn(repr(text), str(caught.exception))


class Listings:
    """A listing() that returns the given listings in turn (the last one for ever)."""

    def __init__(self, *listings):
        self.listings = list(listings)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        item = self.listings[0] if len(self.listings) == 1 else self.listings.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


class Clock:
    """A clock that moves only when slept on, or when a run says it took time."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


class WatchLoopTests(unittest.SynchronousTestCase):

    def test_runs_on_change_only(self):
        clock, runs, out = Clock(), [], io.StringIO()

        def analyse(files):                       # a run takes 5 s
            runs.append((clock.now, files))
            clock.now += 5
        listing = Listings([("/t/a.jsonl", 10)], [("/t/a.jsonl", 10)],
                           [("/t/a.jsonl", 20)],                       # grew
                           [("/t/a.jsonl.gz", 5)],                     # rotated
                           [("/t/a.jsonl.gz", 5)])
        made = watch(analyse, listing, 30, progress=out, sleep=clock.sleep, clock=clock,
                     max_runs=3)
        self.assertEqual(made, 3)
        self.assertEqual(runs, [(0, [("/t/a.jsonl", 10)]), (60, [("/t/a.jsonl", 20)]),
                                (90, [("/t/a.jsonl.gz", 5)])])
        # a look every 30 s, from the start of one to the next
        self.assertEqual(clock.sleeps, [25, 30, 25])
        self.assertEqual(out.getvalue().count("watching the traces every 30 s"), 1)

    def test_steady_growth_runs_once_an_interval(self):
        clock, starts = Clock(), []
        sizes = iter(range(1, 1000))

        def analyse(files):
            starts.append(clock.now)
            clock.now += 2
        watch(analyse, lambda: [("/t/a.jsonl", next(sizes))], 10, progress=None,
              sleep=clock.sleep, clock=clock, max_runs=4)
        self.assertEqual(starts, [0, 10, 20, 30])

    def test_a_long_run_is_followed_by_a_look_at_once(self):
        clock, runs = Clock(), []

        def analyse(files):                       # longer than the interval
            runs.append(files)
            clock.now += 100
        listing = Listings([("/t/a.jsonl", 1)], [("/t/a.jsonl", 1), ("/t/b.jsonl", 1)])
        watch(analyse, listing, 60, progress=None, sleep=self.fail, clock=clock, max_runs=2)
        self.assertEqual(len(runs), 2)

    def test_recoverable_errors_are_said_and_survived(self):
        clock, out = Clock(), io.StringIO()

        class NothingYet(Exception):
            pass

        def analyse(files):
            if len(files) == 1:
                raise NothingYet("no trace records in the requested time range")
        listing = Listings(NothingYet("trace directory /t does not exist"),
                           [("/t/a.jsonl", 0)], [("/t/a.jsonl", 0), ("/t/b.jsonl", 9)])
        made = watch(analyse, listing, 5, progress=out, sleep=clock.sleep, clock=clock,
                     max_runs=2, recoverable=(NothingYet,))
        self.assertEqual(made, 2)
        self.assertEqual(clock.sleeps, [5, 5])
        self.assertIn("error: trace directory /t does not exist", out.getvalue())
        self.assertIn("error: no trace records in the requested time range", out.getvalue())

    def test_the_same_listing_error_is_said_once(self):
        clock, out = Clock(), io.StringIO()
        missing = OSError("trace directory /t does not exist")
        listing = Listings(missing, missing, missing, OSError("/t: permission denied"),
                           [("/t/a.jsonl", 1)])
        watch(lambda files: None, listing, 2, progress=out, sleep=clock.sleep, clock=clock,
              max_runs=1, recoverable=(OSError,))
        self.assertEqual(clock.sleeps, [2, 2, 2, 2])
        self.assertEqual(out.getvalue().count("does not exist"), 1)
        self.assertEqual(out.getvalue().count("permission denied"), 1)

    def test_other_errors_end_it(self):
        def analyse(files):
            raise RuntimeError("a bug")
        with self.assertRaises(RuntimeError):
            watch(analyse, Listings([("/t/a.jsonl", 1)]), 1, progress=None,
                  sleep=self.fail, recoverable=(OSError,))


class CommandLineTests(unittest.SynchronousTestCase):

    def test_bad_arguments(self):
        status, err = run_cli("/tmp", "--out", "/tmp/x", "--last", "1h",
                              "--since", "2024-05-01")
        self.assertEqual(status, 2)
        self.assertIn("--last cannot be combined with --since or --until", err)
        status, err = run_cli("/tmp", "--out", "/tmp/x", "--last", "soon")
        self.assertEqual(status, 2)
        self.assertIn("--last: 'soon' is not a duration", err)
        status, err = run_cli("/tmp", "--out", "/tmp/x", "--watch", "0")
        self.assertEqual(status, 2)
        self.assertIn("--watch: '0': a duration must be positive", err)


class LastWindowTests(unittest.SynchronousTestCase):
    """``last_us``: the window ends just after the newest record."""

    timeout = 600

    def test_last_minute(self):
        from spark_analysis import pipeline
        spark = spark_session()
        traces = _tempdir("last-traces")
        out = _tempdir("last-report")
        self.addCleanup(shutil.rmtree, traces, True)
        self.addCleanup(shutil.rmtree, out, True)
        write_handmade(traces)
        analysis = pipeline.run(spark, traces, out, progress=None, report=False,
                                last_us=60 * 10**6)
        # the newest records are the link_ups at 360 s; (300 s, 360 s] holds
        # c's link_down at 300.0005 s, n6 at a and at b, and the two link_ups
        self.assertEqual((analysis.since_us, analysis.until_us), (T(300) + 1, T(360) + 1))
        self.assertEqual(analysis.records, 5)
        self.assertEqual(sum(r["records"] for r in analysis.tables["overview"]), 5)

    def test_not_with_since(self):
        from spark_analysis import pipeline
        with self.assertRaises(ValueError):
            pipeline.run(None, "/t", "/o", since_us=T(0), last_us=1)


class WatchCommandTests(unittest.SynchronousTestCase):
    """``python -m spark_analysis --watch``: started before its trace directory
    exists, it waits for it; a new trace file starts a new run in the same
    process; SIGTERM ends it with status 0."""

    timeout = 600

    def setUp(self):
        from spark_analysis.session import pyspark_available
        reason = pyspark_available()
        if reason:
            raise unittest.SkipTest(reason)
        self.dir = _tempdir("watch")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.traces = os.path.join(self.dir, "traces")

    def write_traces(self):
        """The hand-made traces, appearing at once (a directory renamed into place)."""
        records = handmade_records()
        aside = self.traces + ".new"
        os.makedirs(aside)
        for router in ("a", "b", "c"):
            with open(os.path.join(aside, f"{router}-20240501T120000Z-000001.jsonl"),
                      "w") as f:
                f.write("\n".join(records[router]) + "\n")
        os.rename(aside, self.traces)

    def test_new_file_new_run(self):
        out = os.path.join(self.dir, "report")
        tmp = os.path.join(self.dir, "tmp")
        os.makedirs(tmp)
        env = dict(os.environ, TMPDIR=tmp,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark_analysis", self.traces, "--out", out,
             "--watch", "0.5s", "--last", "1h", "--master", "local[2]",
             "--conf", "spark.sql.shuffle.partitions=2"],
            cwd=self.dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr] + [lines.put(None)],
                         daemon=True).start()
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        seen = []

        def until(text, seconds=240):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if line is None:
                    break
                seen.append(line)
                if text in line:
                    return line
            self.fail(f"no {text!r} within {seconds} s; output:\n" + "".join(seen))

        # started before there is anything to read: it says so, once, and waits
        until(f"error: trace directory {self.traces} does not exist")
        self.write_traces()
        first = until("wrote ")
        self.assertIn("(35 records, 0 bad lines skipped", first)
        until("watching ")
        self.assertTrue(os.path.exists(os.path.join(out, "report.html")))
        # an hour and a bit later, a's next file: b - a goes down and up
        later = [tf.format_record(T(4000), "a", "b", "link_down", "out", reason="liveness"),
                 tf.format_record(T(4010), "a", "b", "link_up", "out")]
        name = "a-20240501T130600Z-000002.jsonl"
        with open(os.path.join(self.traces, name + ".part"), "w") as f:
            f.write("\n".join(later) + "\n")
        os.rename(os.path.join(self.traces, name + ".part"), os.path.join(self.traces, name))
        second = until("wrote ")
        # the last hour up to 4010 s holds only the new file's two records
        self.assertIn("(2 records, 0 bad lines skipped", second)
        self.assertIn("1 files or parts (3 files already read)", "".join(seen))
        until("watching ")
        # one more file, and SIGTERM in the middle of the run it starts: the
        # run's Spark jobs are cancelled and the process ends cleanly
        name = "b-20240501T131000Z-000002.jsonl"
        with open(os.path.join(self.traces, name), "w") as f:
            f.write(tf.format_record(T(4020), "b", "a", "link_up", "in") + "\n")
        until("analysing: stages")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=60), 0)
        until("stopped watching", 30)
        self.assertEqual(sum("does not exist" in line for line in seen), 1)
        self.assertNotIn("Traceback", "".join(seen))
        # the copy of this package shipped to Spark's workers is removed on exit
        self.assertEqual([x for x in os.listdir(tmp) if x.startswith("elvin-spark-code-")], [])
