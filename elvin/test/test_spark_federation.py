"""spark_analysis on traces written by real routers federated on 127.0.0.1.

Three routers in a star (left - hub - right) with trace writers; a client
at right subscribes to news, a client at left publishes news and sport.
The trace files must be valid (docs/traces.md) line by line, and the Spark
analysis must find what happened. Uses the shared local SparkSession of
test_spark_analysis (skipped, with the reason, without pyspark or Java).
"""

import glob
import os

from twisted.internet import defer

from spark_analysis import traceformat as tf
from elvin.test.test_federation import FederationTestCase, FedRouter
from elvin.test.test_integration import wait_until
from elvin.test.test_spark_analysis import by_key, spark_session


class RealRouterTraceTests(FederationTestCase):

    timeout = 600

    @defer.inlineCallbacks
    def make_traces(self):
        trace_dir = self.mktemp()
        hub = FedRouter(self, "hub.test", trace_dir=os.path.join(trace_dir, "hub"))
        left = FedRouter(self, "left.test", trace_dir=os.path.join(trace_dir, "left"))
        right = FedRouter(self, "right.test", trace_dir=os.path.join(trace_dir, "right"))
        yield left.link_to(hub)
        yield right.link_to(hub)
        consumer = yield self.connect(right)
        got = []
        yield consumer.subscribe('topic == "news"', got.append)
        yield self.settle(hub, left, right)
        producer = yield self.connect(left)
        for n in range(3):
            producer.notify({"topic": "news", "n": n})
        producer.notify({"topic": "sport", "n": 9})
        yield wait_until(lambda: len(got) == 3)
        yield producer.test_connection()
        for r in (hub, left, right):
            r.manager.trace.flush()
        return trace_dir

    @defer.inlineCallbacks
    def test_traces_are_valid(self):
        """Every line the routers wrote is a valid record (no Spark needed)."""
        trace_dir = yield self.make_traces()
        files = glob.glob(os.path.join(trace_dir, "*", "*.jsonl"))
        self.assertEqual(len(files), 3)
        for path in files:
            self.assertEqual(tf.check_file(path), [], path)
            domain, _, seq = tf.parse_trace_file_name(os.path.basename(path))
            self.assertEqual(seq, 1)
            self.assertEqual(os.path.basename(os.path.dirname(path)), domain.split(".")[0])

    @defer.inlineCallbacks
    def test_traces_are_analysed(self):
        spark = spark_session()                     # skip early without Spark
        trace_dir = yield self.make_traces()
        from spark_analysis import pipeline
        analysis = pipeline.run(spark, trace_dir, self.mktemp(), progress=None, report=False)
        self.assertEqual(analysis.bad_lines, 0)
        t = analysis.tables
        routes = by_key(t["routes"], "route")
        news = routes["left.test > hub.test > right.test"]
        self.assertEqual(news["deliveries"], 3)
        self.assertEqual(news["hops"], 2)
        self.assertEqual(news["timed"], 3)
        # one host, one clock: latencies are real, positive and small
        self.assertGreaterEqual(news["latency_min_us"], 0)
        self.assertLess(news["latency_max_us"], 5 * 10**6)
        self.assertEqual(routes["left.test > hub.test"]["deliveries"], 3)
        effect = by_key(t["filter_effect"], "router", "peer")
        self.assertEqual((effect[("left.test", "hub.test")]["considered"],
                          effect[("left.test", "hub.test")]["forwarded"],
                          effect[("left.test", "hub.test")]["suppressed_filter"]), (4, 3, 1))
        flood = by_key(t["flood"], "router", "peer")
        self.assertEqual(flood[("left.test", "hub.test")]["flood_notifications"], 4)
        self.assertEqual(flood[("hub.test", "right.test")]["flood_notifications"], 4)
        self.assertEqual(flood[("hub.test", "right.test")]["forwarded"], 3)
        hop = by_key(t["hop_latency"], "sender", "receiver")
        self.assertEqual(hop[("left.test", "hub.test")]["matched"], 3)
        self.assertGreaterEqual(hop[("left.test", "hub.test")]["delay_min_us"], 0)
        # three routers on one host share one clock: no offset may be stated
        # (a stated one, such as 3.3 ms, would be noise read as skew)
        self.assertEqual([r for r in t["hop_latency"] if r["clock_offset_est_us"] is not None],
                         [])
        links = by_key(t["links"], "router", "peer", "direction")
        self.assertEqual(links[("hub.test", "right.test", "out")]["notifications"], 3)
        self.assertEqual(links[("right.test", "hub.test", "in")]["notifications"], 3)
        churn = by_key(t["filter_churn"], "router", "peer", "direction")
        self.assertGreaterEqual(churn[("right.test", "hub.test", "out")]["replaces"], 1)
        self.assertEqual(t["drops"], [])
