"""Where a Spark run spent its time, from Spark's event log.

Run with ``--event-log DIR`` (``spark.eventLog.enabled``); then
``summarise(path)`` groups the log's jobs by their description (the
pipeline names each of its stages) and lists the costliest Spark stages:
wall time, task time (the sum over tasks, so up to cores x wall), GC and
shuffle bytes. ``python -m spark_analysis.eventlog FILE`` prints it.
"""

import json
import os
import sys

__all__ = ["summarise", "format_summary", "main"]


def _stages_of(events):
    jobs, stages, tasks = {}, {}, {}
    for ev in events:
        kind = ev.get("Event")
        if kind == "SparkListenerJobStart":
            props = ev.get("Properties") or {}
            jobs[ev["Job ID"]] = {
                "description": props.get("spark.job.description") or "(no description)",
                "stages": ev.get("Stage IDs", []), "start": ev.get("Submission Time")}
        elif kind == "SparkListenerJobEnd":
            if ev["Job ID"] in jobs:
                jobs[ev["Job ID"]]["end"] = ev.get("Completion Time")
        elif kind == "SparkListenerStageCompleted":
            info = ev["Stage Info"]
            stages[info["Stage ID"]] = {
                "name": info.get("Stage Name", "?"), "tasks": info.get("Number of Tasks", 0),
                "start": info.get("Submission Time"), "end": info.get("Completion Time")}
        elif kind == "SparkListenerTaskEnd":
            m = ev.get("Task Metrics") or {}
            t = tasks.setdefault(ev["Stage ID"], {"run_ms": 0, "gc_ms": 0, "shuffle_write": 0,
                                                 "shuffle_read": 0, "input": 0})
            t["run_ms"] += m.get("Executor Run Time", 0)
            t["gc_ms"] += m.get("JVM GC Time", 0)
            t["shuffle_write"] += (m.get("Shuffle Write Metrics") or {}).get(
                "Shuffle Bytes Written", 0)
            read = m.get("Shuffle Read Metrics") or {}
            t["shuffle_read"] += read.get("Remote Bytes Read", 0) + read.get("Local Bytes Read", 0)
            t["input"] += (m.get("Input Metrics") or {}).get("Bytes Read", 0)
    return jobs, stages, tasks


def _log_files(path):
    """An event log is a file, or (Spark 4's rolling logs) a directory of
    ``events_<n>_<app>`` files."""
    if not os.path.isdir(path):
        return [path]
    parts = [n for n in os.listdir(path) if n.startswith("events_")]
    parts.sort(key=lambda n: int(n.split("_")[1]))
    return [os.path.join(path, n) for n in parts]


def _lines(path):
    if path.endswith((".zstd", ".lz4", ".snappy", ".lzf")):
        raise ValueError(f"{path} is compressed; run with --conf spark.eventLog.compress=false "
                         f"(--event-log sets it)")
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def summarise(path):
    """{'by_description': [...], 'stages': [...]} from one event log (file or directory)."""
    events = [ev for part in _log_files(path) for ev in _lines(part)]
    jobs, stages, tasks = _stages_of(events)
    by_desc = {}
    stage_desc = {}
    for job in jobs.values():
        d = by_desc.setdefault(job["description"], {"description": job["description"],
                                                    "jobs": 0, "wall_s": 0.0, "task_s": 0.0,
                                                    "stages": 0})
        d["jobs"] += 1
        if job.get("end") and job.get("start"):
            d["wall_s"] += (job["end"] - job["start"]) / 1000
        for sid in job["stages"]:
            if sid in stages:
                stage_desc[sid] = job["description"]
                d["stages"] += 1
                d["task_s"] += tasks.get(sid, {}).get("run_ms", 0) / 1000
    rows = []
    for sid, st in stages.items():
        t = tasks.get(sid, {})
        rows.append({"stage": sid, "description": stage_desc.get(sid, ""),
                     "name": st["name"], "tasks": st["tasks"],
                     "wall_s": ((st["end"] or 0) - (st["start"] or 0)) / 1000,
                     "task_s": t.get("run_ms", 0) / 1000, "gc_s": t.get("gc_ms", 0) / 1000,
                     "input_mb": t.get("input", 0) / 1e6,
                     "shuffle_write_mb": t.get("shuffle_write", 0) / 1e6,
                     "shuffle_read_mb": t.get("shuffle_read", 0) / 1e6})
    rows.sort(key=lambda r: -r["task_s"])
    return {"by_description": sorted(by_desc.values(), key=lambda d: -d["wall_s"]),
            "stages": rows}


def format_summary(summary, top=15):
    lines = [f"{'wall s':>7} {'task s':>7} {'jobs':>5} {'stages':>6}  pipeline stage"]
    for d in summary["by_description"]:
        lines.append(f"{d['wall_s']:>7.1f} {d['task_s']:>7.1f} {d['jobs']:>5} {d['stages']:>6}"
                     f"  {d['description']}")
    lines.append("")
    lines.append(f"{'wall s':>7} {'task s':>7} {'gc s':>5} {'tasks':>5} {'in MB':>7} "
                 f"{'shw MB':>7} {'shr MB':>7}  Spark stage (pipeline stage)")
    for r in summary["stages"][:top]:
        lines.append(f"{r['wall_s']:>7.1f} {r['task_s']:>7.1f} {r['gc_s']:>5.1f} {r['tasks']:>5} "
                     f"{r['input_mb']:>7.0f} {r['shuffle_write_mb']:>7.0f} "
                     f"{r['shuffle_read_mb']:>7.0f}  {r['name'][:60]} ({r['description'][:40]})")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m spark_analysis.eventlog EVENT_LOG_FILE", file=sys.stderr)
        return 2
    print(format_summary(summarise(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
