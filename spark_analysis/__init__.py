"""Offline analysis of Elvin federation traces with Spark (PySpark).

The routers' federation layer can write a trace of every federation event
(docs/traces.md); this package reads a directory of such traces and reports
what crosses each link and why (docs/analysis.md):

    python -m spark_analysis TRACE_DIR --out REPORT_DIR [--since T] [--until T]
    python -m spark_analysis.synth --out DIR --routers N --clients M --rate R --seconds S

Modules: ``traceformat`` (the format in plain Python: digest, file names,
record writer and validator -- no Spark needed), ``synth`` (a simulated
federation's traces), ``ingest`` (JSON -> checked Parquet), ``jobs`` (the
DataFrame jobs), ``pipeline`` (all stages in order), ``report`` (charts and
HTML), ``cli`` and ``session``. Only ``ingest``, ``jobs``, ``pipeline`` and
``session`` import pyspark, and only when used.
"""

__all__ = ["FORMAT_VERSION"]

from spark_analysis.traceformat import FORMAT_VERSION  # noqa: E402
