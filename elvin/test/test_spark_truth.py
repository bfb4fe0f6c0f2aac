"""The report states only what the traces show: hand-made traces with known answers.

Three routers on one host (one clock): a - b - c - a. Heartbeats with
identical contents repeat (two copies a second, 3 ms apart, each taking
2.5 ms: the nearest copy in time is the wrong one); a mesh sends 59
duplicates to c within 0.8 s (``notify_dropped_duplicate``, c not in
their routing lists) and c sends two real loops back to a; a - b is down
for 34 s, two notifications a forwarded still queued when it went down
(``unsent``); c's file is collected twice and b's once more half-way;
the links a's publications are considered for change (a
mesh's tree); d, linked to c, is killed at 300 s (its trace stops
without link_down); e's clock is two hours ahead; a ring delivery reaches c twice; every
other router stops at the end; and one record of a's file is
dated 2100. Each engine's answers are checked against those numbers, and
the two engines against each other (one small Spark run).
"""

import os

from twisted.trial import unittest

from elvin.test.test_spark_analysis import T, _tempdir, recorder, size
from elvin.test.test_spark_smallwindow import _Agreement, _skip_without_duckdb
from spark_analysis import traceformat as tf

HB = {"Heartbeat": 1, "Service": "ops"}
DUP = {"Group": "mesh", "n": 7}
LOOP = {"Group": "loop", "n": 9}
LOST = {"Group": "lost", "n": 0}
PUB = {"Group": "tree", "n": 0}
FROM_D = {"From": "d"}
SKEW = 7200
RING = {"Ring": 1}
KILLED = 300
A_FILE = "a-20240501T120000Z-000001.jsonl"
FUTURE_US = 4102444800 * 10**6          # 2100-01-01T00:00:00Z
OUTAGE = (200, 234)


def truth_records():
    """{router: [(ts_us, line)]} of the scenario (see the module's text)."""
    out = {"a": [], "b": [], "c": [], "d": [], "e": []}
    rec, note = recorder(out)
    # e's clock is two hours ahead (b traced nothing of its link)
    rec("e", T(SKEW), "b", "link_up", "out")
    for s in range(1, 300):
        note("e", T(SKEW + s), "b", "notify_forwarded", "out", dict(FROM_D, n=s), ["e"])
    rec("e", T(SKEW + 300), "b", "link_down", "out", reason="shutdown")
    # d is killed at 300 s: its trace stops without link_down; c notices at 302 s
    rec("d", T(0), "c", "link_up", "out")
    rec("c", T(0), "d", "link_up", "in")
    note("d", T(KILLED), "c", "notify_forwarded", "out", FROM_D, ["d"])
    note("c", T(KILLED, 1500), "d", "notify_received", "in", FROM_D, ["d"])
    rec("c", T(KILLED + 2), "d", "link_down", "in", reason="connection_lost")

    for x, y in (("a", "b"), ("c", "b"), ("c", "a")):
        rec(x, T(0), y, "link_up", "out")
        rec(y, T(0), x, "link_up", "in")
    for s in range(1, 600):
        if OUTAGE[0] <= s < OUTAGE[1]:
            continue
        for copy in (0, 3000):                   # two clients, the same heartbeat
            note("a", T(s, copy), "b", "notify_forwarded", "out", HB, ["a"])
            note("b", T(s, copy + 2500), "a", "notify_received", "in", HB, ["a"])
        if s % 10 == 5:                          # something unrepeated back: b -> a
            n = {"Group": "back", "n": s}
            note("b", T(s), "a", "notify_forwarded", "out", n, ["b"])
            note("a", T(s, 2000), "b", "notify_received", "in", n, ["b"])
    # two notifications still queued at a when a - b went down: never written
    for i in range(2):
        note("a", T(OUTAGE[0] - 1, 500 + i), "b", "notify_forwarded", "out",
             dict(LOST, n=i), ["a"])
    rec("a", T(OUTAGE[0]), "b", "link_down", "out", reason="liveness", unsent=2)
    rec("b", T(OUTAGE[0], 400), "a", "link_down", "in", reason="connection lost")
    rec("a", T(OUTAGE[1]), "b", "link_up", "out")
    rec("b", T(OUTAGE[1]), "a", "link_up", "in")
    # the mesh: 59 copies that reached c by another path first, in 0.8 s
    for i in range(59):
        d = dict(DUP, n=1000 + i)
        note("a", T(300, i * 13500), "c", "notify_forwarded", "out", d, ["b", "a"])
        note("c", T(300, i * 13500 + 1000), "a", "notify_dropped_duplicate", "in", d,
             ["b", "a"])
    # two real loops: c forwards to a what a had already passed
    for i in range(2):
        d = dict(LOOP, n=i)
        note("c", T(400 + i), "a", "notify_forwarded", "out", d, ["a", "b", "c"])
        note("a", T(400 + i, 1000), "c", "notify_dropped_loop", "in", d, ["a", "b", "c"])
    # a's mesh tree changes: ten notifications published at a, the first six
    # considered for the link to b only, the other four for the link to c only
    for i in range(10):
        note("a", T(450, 100000 + i * 1000), "b" if i < 6 else "c",
             "notify_suppressed_filter", "out", dict(PUB, n=i), ["a"])
    # the ring without mesh mode: published at b, c receives it from b and by way of a
    note("b", T(500), "a", "notify_forwarded", "out", RING, ["b"])
    note("b", T(500, 10), "c", "notify_forwarded", "out", RING, ["b"])
    note("a", T(500, 2000), "b", "notify_received", "in", RING, ["b"])
    note("c", T(500, 1010), "b", "notify_received", "in", RING, ["b"])
    note("a", T(500, 2100), "c", "notify_forwarded", "out", RING, ["b", "a"])
    note("c", T(500, 3100), "a", "notify_received", "in", RING, ["b", "a"])
    # everyone stops at the end
    for x, y in (("a", "b"), ("c", "b"), ("c", "a")):
        rec(x, T(599.9), y, "link_down", "out", reason="shutdown")
        rec(y, T(599.9, 300), x, "link_down", "in", reason="disconnected by peer")
    return {r: [line for _, line in sorted(lines, key=lambda p: p[0])]
            for r, lines in out.items()}


def write_truth(directory, legacy=False):
    """The scenario's files; a's has one record dated 2100 (returns its line
    number). ``legacy``: the mesh duplicates written as loop drops, as
    routers did before the duplicate event."""
    records = truth_records()
    if legacy:
        records["c"] = [line.replace("notify_dropped_duplicate", "notify_dropped_loop")
                        for line in records["c"]]
    lines = records["a"]
    at = len(lines) // 2
    lines.insert(at, tf.format_record(FUTURE_US, "a", "b", "notify_forwarded", "out",
                                      routing=["a"], size=size(HB, ["a"]), attrs=list(HB),
                                      digest=tf.notification_digest(HB)))
    for router, body in records.items():
        name = A_FILE if router == "a" else f"{router}-20240501T120000Z-000001.jsonl"
        with open(os.path.join(directory, name), "w") as f:
            f.write("\n".join(body) + "\n")
    # collected twice: c's file again from another host, b's as it was half-way
    for host, router, keep in (("again", "c", None), ("early", "b", 0.5)):
        os.makedirs(os.path.join(directory, host))
        body = records[router][:int(len(records[router]) * keep)] if keep else records[router]
        with open(os.path.join(directory, host, f"{router}-20240501T120000Z-000001.jsonl"),
                  "w") as f:
            f.write("\n".join(body) + "\n")
    return at + 1


_runs = {}


def truth_run(name="truth", legacy=False, again=False):
    """(analysis, report text, the future record's line) of a DuckDB run, cached."""
    key = (name, legacy, again)
    if key not in _runs:
        _skip_without_duckdb()
        from spark_analysis import pipeline
        traces = _tempdir(name)
        line = write_truth(traces, legacy)
        out = _tempdir(name + "-out")

        def no_spark():
            raise AssertionError("a small local window must not start Spark")
        analysis = pipeline.run(no_spark, traces, out, progress=None, engine="duckdb")
        if again:
            analysis = pipeline.run(no_spark, traces, out, progress=None, engine="duckdb")
        with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
            text = f.read()
        _runs[key] = (analysis, text, line, traces)
    return _runs[key]


def _plain(html_text):
    import html
    import re
    return html.unescape(re.sub(r"<[^>]+>", " ", html_text))


class TimeSanityTests(unittest.SynchronousTestCase):
    """A record dated 2100 among ten minutes: set aside, named, the window ten minutes."""

    def test_the_record_is_set_aside_and_named_with_its_line(self):
        a, text, line, traces = truth_run()
        self.assertEqual(a.aside, 1)
        self.assertEqual([(os.path.basename(f), n, ts) for f, n, ts in a.aside_examples],
                         [(A_FILE, line, FUTURE_US)])
        self.assertIn(f"{A_FILE} line {line}: dated 2100-01-01T00:00:00Z", _plain(text))

    def test_the_window_is_that_of_the_records_kept(self):
        a, _, _, _ = truth_run()
        # (the period [first, last] kept, as a window [since, until))
        self.assertEqual((a.start_us, a.end_us), (T(0), T(599.9, 300) + 1))
        for row in a.tables["link_uptime"]:
            if "d" not in (row["router"], row["peer"]):
                self.assertGreater(row["uptime_pct"], 90, row)

    def test_files_csv_counts_and_names_it(self):
        import csv
        a, _, line, _ = truth_run()
        with open(os.path.join(a.out_dir, "csv", "files.csv")) as f:
            rows = {os.path.basename(r["file"]): r for r in csv.DictReader(f)}
        self.assertEqual(rows[A_FILE]["set_aside"], "1")
        self.assertEqual(rows[A_FILE]["set_aside_first"], f"line {line}: 2100-01-01T00:00:00Z")
        self.assertEqual(rows["b-20240501T120000Z-000001.jsonl"]["set_aside"], "0")


class MatchingTests(unittest.SynchronousTestCase):
    """Identical heartbeats 3 ms apart, 2.5 ms on the way: paired with their own copy."""

    def hop(self, sender, receiver):
        a, _, _, _ = truth_run()
        return next(r for r in a.tables["hop_latency"]
                    if (r["sender"], r["receiver"]) == (sender, receiver))

    def test_every_delay_is_the_true_one(self):
        ab = self.hop("a", "b")
        self.assertEqual((ab["delay_min_us"], ab["delay_max_us"]), (2500, 2500))
        self.assertEqual(ab["matched"], 2 * (599 - 34))
        self.assertEqual(ab["repeated"], 2 * (599 - 34))
        self.assertEqual((ab["unpaired_no_send"], ab["unpaired_repeated"]), (0, 0))
        ba = self.hop("b", "a")
        self.assertEqual((ba["delay_min_us"], ba["delay_max_us"], ba["repeated"]), (2000, 2000, 0))

    def test_the_clocks_are_bounded_and_not_called_apart(self):
        ab = self.hop("a", "b")
        self.assertEqual((ab["clock_offset_low_us"], ab["clock_offset_high_us"]), (-2000, 2500))
        self.assertIsNone(ab["clock_offset_est_us"])
        route = next(r for r in truth_run()[0].tables["routes"] if r["route"] == "a > b")
        self.assertEqual((route["latency_min_us"], route["latency_max_us"]), (2500, 2500))

    def test_no_false_clock_or_one_way_claim(self):
        _, text, _, _ = truth_run()
        plain = _plain(text)
        self.assertNotIn("NTP", plain)
        self.assertNotIn("one way", plain)
        self.assertNotIn("differ by more", plain)
        self.assertIn("1,130 of them were copies of identical notifications", plain)

    def test_unpaired_receipts_are_counted_with_why(self):
        from spark_analysis import jobs
        self.assertEqual(jobs.hop_slack({("a", "b"): 2500, ("b", "a"): 1500}),
                         {"b>a": 500})
        a, _, _, _ = truth_run()
        # the duplicates and loops were sent with records of their own: all paired
        self.assertEqual(sum(r["unpaired_no_send"] for r in a.tables["hop_latency"]), 0)


class DropWordingTests(unittest.SynchronousTestCase):
    """Mesh duplicates are not loops; loops are named only from routing lists."""

    def test_duplicates_and_loops_are_counted_apart(self):
        a, _, _, _ = truth_run()
        rows = {r["event"]: r for r in a.tables["drops"]}
        self.assertEqual((rows["notify_dropped_duplicate"]["drops"],
                          rows["notify_dropped_duplicate"]["router_listed"]), (59, 0))
        self.assertEqual((rows["notify_dropped_loop"]["drops"],
                          rows["notify_dropped_loop"]["router_listed"]), (2, 2))

    def test_the_reading_blames_only_the_real_loops(self):
        plain = _plain(truth_run()[1])
        self.assertIn("59 mesh duplicate drops", plain)
        self.assertIn("2 of the 2 loop drops carry the receiving router in their routing list",
                      plain)
        self.assertIn("sent by c,", plain)
        self.assertNotIn("not loops", plain)
        # the burst: 59 in 0.8 s, the busiest second of it
        self.assertIn("The most in one 1 s: 59", plain)

    def test_old_traces_say_which_loop_drops_are_not_loops(self):
        plain = _plain(truth_run("legacy", legacy=True)[1])
        self.assertIn("59 loop drop records do not have the receiving router in their "
                      "routing list, so they are not loops", plain)


class CopiesTests(unittest.SynchronousTestCase):
    """c's file collected twice, b's once more half-way: read once, said (every
    count above is of one copy)."""

    def test_the_copies_are_named_and_not_read(self):
        import csv
        a, text, _, traces = truth_run()
        c, b = "c-20240501T120000Z-000001.jsonl", "b-20240501T120000Z-000001.jsonl"
        self.assertEqual(sorted((os.path.relpath(p, traces), os.path.relpath(k, traces), how)
                                for p, k, how in a.copies),
                         [(os.path.join("again", c), c, "same content"),
                          (os.path.join("early", b), b,
                           f"first {os.path.getsize(os.path.join(traces, 'early', b)):,} "
                           f"bytes")])
        with open(os.path.join(a.out_dir, "csv", "files.csv")) as f:
            rows = {os.path.relpath(r["file"], traces): r for r in csv.DictReader(f)}
        self.assertEqual((rows[os.path.join("again", c)]["records"],
                          rows[os.path.join("again", c)]["skipped"]),
                         ("0", f"same content of {os.path.join(traces, c)}"))
        self.assertNotEqual(rows[c]["records"], "0")
        self.assertIn("2 trace files were copies of others", _plain(text))


class SkewedClockTests(unittest.SynchronousTestCase):
    """A router two hours ahead: the period is the other routers', its records named."""

    def test_its_records_are_left_out_and_named(self):
        a, text, _, _ = truth_run()
        self.assertEqual([(r.router, r.outside, r.first_us, r.last_us) for r in a.skewed],
                         [("e", 301, T(SKEW), T(SKEW + 300))])
        self.assertNotIn("e", {r["router"] for r in a.tables["overview"]})
        self.assertIn("e: its records' bulk 2024-05-01T14:00:00Z to 2024-05-01T14:04:59Z; "
                      "301 records from 2024-05-01T14:00:00Z to 2024-05-01T14:05:00Z left out",
                      _plain(text))


class DuplicateDeliveryTests(unittest.SynchronousTestCase):
    """A plain ring (no mesh): c receives b's notification both ways round, stated."""

    def test_the_receipts_are_named(self):
        a, _, _, _ = truth_run()
        self.assertEqual([(r["router"], r["origin"], r["receipts"], r["extra"], r["routes"],
                           r["first_us"], r["route_a"], r["route_b"])
                          for r in a.tables["duplicate_deliveries"]],
                         [("c", "b", 2, 1, 2, T(500, 1010), "b", "b > a")])
        self.assertEqual([(r["router"], r["notifications"], r["extra"])
                          for r in a.tables["duplicate_delivery_totals"]], [("c", 1, 1)])

    def test_the_report_states_them(self):
        from spark_analysis import traceformat as tf
        digest = tf.notification_digest(RING)[:16]
        plain = _plain(truth_run()[1])
        self.assertIn("Duplicate deliveries: 1 time(s) a router received one notification "
                      "(the same origin and digest) by more than one route, 1 receipt(s) more "
                      "than one route would give: at c, 1 (1 extra), e.g. "
                      f"digest {digest}\u2026 from b, received by way of b and of b > a from "
                      "2024-05-01T12:08:20.001Z", plain)


class UnsentTests(unittest.SynchronousTestCase):
    """Notifications queued on a link when it went down are lost on that link, named."""

    def test_the_link_down_record_is_a_row(self):
        a, _, _, _ = truth_run()
        self.assertEqual([(r["router"], r["peer"], r["ts_us"], r["reason"], r["unsent"])
                          for r in a.tables["unsent"]],
                         [("a", "b", T(OUTAGE[0]), "liveness", 2)])

    def test_the_report_counts_them_lost_on_that_link(self):
        from spark_analysis import report
        a, text, _, _ = truth_run()
        plain = _plain(text)
        self.assertIn("Lost with their link: 2 notifications", plain)
        self.assertIn("a \u2192 b: 2 (link_down at 2024-05-01T12:03:20Z (liveness): 2)", plain)
        self.assertIn("2 of the 1,132 notifications a forwarded (notify_forwarded) have no "
                      "record at b, which recorded 1,130 from it; 2 of them were still queued "
                      "at a when the link went down", plain)
        self.assertIn("2 notifications lost still queued when a link went down", plain)
        self.assertEqual(report.summary(a)["drops"]["unsent"], 2)


class PublishedTests(unittest.SynchronousTestCase):
    """Each notification counted once at its origin, whichever links it was considered for."""

    def test_published_counts_each_notification_once(self):
        a, _, _, _ = truth_run()
        sets = {r["attribute_names"]: r for r in a.tables["attr_sets"]}
        # at a: 10 whose links changed, 2 lost with a - b; at b: 57 sent back
        self.assertEqual(sets["Group,n"]["published"], 10 + 2 + 57)
        self.assertEqual(sets["Heartbeat,Service"]["published"], 2 * (599 - 34))

    def test_the_flood_sends_every_publication_on_every_tree_link(self):
        a, _, _, _ = truth_run()
        flood = {(r["router"], r["peer"]): r["flood_notifications"] for r in a.tables["flood"]}
        at_a = 2 * (599 - 34) + 2 + 10
        self.assertEqual((flood[("a", "b")], flood[("a", "c")]), (at_a, at_a))
        self.assertEqual((flood[("b", "a")], flood[("b", "c")]), (57 + 1, 57 + 1))


class KilledRouterTests(unittest.SynchronousTestCase):
    """A router whose trace stops without link_down: its links' uptime ends there, said."""

    def test_the_uptime_ends_at_its_last_record(self):
        a, _, _, _ = truth_run()
        rows = {(r["router"], r["peer"]): r for r in a.tables["link_uptime"]}
        self.assertEqual((rows[("d", "c")]["uptime_s"], rows[("d", "c")]["traced_until_us"]),
                         (KILLED, T(KILLED)))
        self.assertEqual((rows[("c", "d")]["uptime_s"], rows[("c", "d")]["traced_until_us"]),
                         (KILLED + 2, None))
        self.assertIsNone(rows[("a", "b")]["traced_until_us"])

    def test_the_report_says_so(self):
        plain = _plain(truth_run()[1])
        self.assertIn("d's records end at 2024-05-01T12:05:00Z, 5.0 minutes before the last "
                      "record of the period, with its link to c up and no link_down. A router "
                      "that is killed writes no link_down, so the uptime of these links is "
                      "counted only to the last record of the router that traced them", plain)


class EventTests(unittest.SynchronousTestCase):
    """Outages at their real times; routers stopping are not outages."""

    def test_the_outage_and_the_stops(self):
        from spark_analysis import report
        a, text, _, _ = truth_run()
        outages, ends = report.split_outages(a)
        self.assertEqual(sorted((r["router"], r["seconds"]) for r in outages),
                         [("a", 34.0), ("b", 34.0)])
        self.assertEqual(len(ends), 7)
        plain = _plain(text)
        self.assertIn("Links went down 2 time(s)", plain)
        self.assertIn("7 link end(s) closed within 60 s of the end of a router's traces", plain)
        self.assertNotIn("still down at the end", plain)

    def test_the_drops_are_drawn_per_second(self):
        a, _, _, _ = truth_run()
        self.assertEqual(a.series["fine_us"], 10**6)
        dup = [r for r in a.series["drops"] if r["event"] == "notify_dropped_duplicate"]
        self.assertEqual(sorted((r["t_us"], r["drops"]) for r in dup), [(T(300), 59)])

    def test_frequent_means_a_hundred_timed(self):
        plain = _plain(truth_run()[1])
        self.assertIn("The slowest of the 1 routes with 100 or more timed deliveries is a > b",
                      plain)

    def test_labels_do_not_overlap_and_every_link_has_a_target(self):
        import re
        a, text, _, _ = truth_run()
        self.assertEqual({k: v for k, v in a.chart_overlaps.items() if v}, {})
        anchors = set(re.findall(r'id="([^"]+)"', text))
        for target in re.findall(r'href="#([^"]+)"', text):
            self.assertIn(target, anchors)
        self.assertNotIn('href="#changes"', text)
        again = truth_run(again=True)[1]
        self.assertIn('href="#changes"', again)
        self.assertIn('id="changes"', again)


class TruthAgreementTests(_Agreement, unittest.SynchronousTestCase):
    """Spark and DuckDB give the same tables over these traces."""
    name = "sw-truth"
    timeout = 600

    def make(self, traces):
        write_truth(traces)
