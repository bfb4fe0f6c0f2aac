"""Routers whose clock is far off: the analysis period from the bulk of the routers.

Records dated far from the rest of their own file are set aside at ingest
(``arrowparse.set_aside``), but a router whose clock is two hours ahead
writes whole files that agree with themselves: without this its records
stretch the period (ten minutes of traffic over more than two hours, every
uptime and rate diluted). So, when no window is asked for, each router's
bulk (its 1st to 99th percentile record, from the per-minute counts) is
compared with the others': a router whose bulk lies wholly apart from the
bulk of more than half of the routers, by more than ``TIME_SLACK_US`` (an
hour) or that bulk's own length if longer, is *skewed*. The period is
then that of the other routers' records, and the skewed routers' records
outside it are left out and named (count, first and last). With fewer than
three routers, or no majority, nothing is judged: there is no telling
which clock is right. A clock a little off (minutes), or a router traced
for longer than the others, overlaps them and is kept.
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple

from spark_analysis.traceformat import TIME_SLACK_US

__all__ = ["Skewed", "judge"]


@dataclass(frozen=True)
class Skewed:
    """A router whose records lie far from the others': its bulk, and its
    records outside the period (left out)."""
    router: str
    bulk_first_us: int
    bulk_last_us: int
    outside: int
    first_us: int
    last_us: int


def _bulk(minutes):
    """(first, last) of a router's 1st and 99th percentile records, from its
    [(minute_us, n, first_us, last_us)] (the minutes' own first and last)."""
    minutes = sorted(minutes)
    total = sum(n for _, n, _, _ in minutes)
    lo_rank, hi_rank = max(1, -(-total // 100)), max(1, -(-total * 99 // 100))
    seen, lo, hi = 0, None, None
    for _, n, first, last in minutes:
        seen += n
        if lo is None and seen >= lo_rank:
            lo = first
        if hi is None and seen >= hi_rank:
            hi = last
    return lo, hi


def judge(rows) -> Tuple[Optional[Tuple[int, int]], List[Skewed]]:
    """(period, skewed) from per-minute counts [(router, minute_us, n,
    first_us, last_us)]: ``period`` (first, last record kept) is None when
    no router is skewed."""
    by_router = {}
    for router, minute, n, first, last in rows:
        if n:
            by_router.setdefault(router, []).append((minute, n, first, last))
    count = len(by_router)
    if count < 3:
        return None, []
    bulks = {router: _bulk(minutes) for router, minutes in by_router.items()}
    # the bulk of more than half of the routers: at most it ends / at least it begins
    ends = sorted(hi for _, hi in bulks.values())
    starts = sorted(lo for lo, _ in bulks.values())
    ref_lo, ref_hi = sorted((starts[-(count // 2) - 1], ends[count // 2]))
    slack = max(TIME_SLACK_US, ref_hi - ref_lo)
    apart = sorted(router for router, (lo, hi) in bulks.items()
                   if lo > ref_hi + slack or hi < ref_lo - slack)
    if not apart or 2 * len(apart) >= count:
        return None, []
    kept = [m for router, minutes in by_router.items() if router not in apart for m in minutes]
    period = (min(first for _, _, first, _ in kept), max(last for _, _, _, last in kept))
    skewed = []
    for router in apart:
        out = [(n, first, last) for _, n, first, last in by_router[router]
               if last < period[0] or first > period[1]]
        if out:
            skewed.append(Skewed(router, *bulks[router], sum(n for n, _, _ in out),
                                 min(f for _, f, _ in out), max(x for _, _, x in out)))
    return period, skewed
