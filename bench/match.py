"""Subscription benchmark: how fast expressions compile and evaluate.

    python bench/match.py [--seconds S] [--subscriptions N] [--notifications M]
    python bench/match.py --index 10000 100000   # the router's index, in-process

Prints, for a realistic mix of subscriptions (string equality, numeric
ranges, string predicates, regular expressions and a few complex ones)
evaluated against realistic notifications:

    compile: N expr/s
    evaluate: N evals/s (match rate X%)

followed by a per-category breakdown. With ``--index S ...`` it instead
files S subscriptions of bench/throughput.py's workload through
``Router.add_subscription`` and prints, per S, the candidates the index
gives a notification against its matches, the rate of index look-up plus
evaluation (``Router.route``'s loop without delivery, per CPU second),
and the bytes per subscription the router holds, of which the index's
and the ``Subscription``'s own (``tracemalloc``, expression text
included). ``--shape java`` files instead subscriptions shaped as the
Java load generator's (``Bench.java`` in the shared peer-bench): string
equalities chosen from the per-subscription match probability as it
chooses them (at 1,000 and more subscriptions both ``s1`` and ``s2``, so
buckets of about S / 1,000 entries), and three ranges each covering the
cube root of what is left (the generator then calibrates that width by
bisection; this does not). Not a test: the figures depend on the
machine. The whole run takes about 3 x --seconds (default 4 s each
phase).
"""

import argparse
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from elvin import Int64, Subscription  # noqa: E402
from elvin.values import normalise  # noqa: E402

GROUPS = ["elvin", "Chat", "tickertape", "builds", "alerts", "weather", "stocks",
          "mail", "calendar", "lunch"]
USERS = ["alice", "bob", "carol", "dave", "erin", "bill@segall.net", "mallory",
         "Trent", "peggy", "victor", "walter", "\u00e9milie", "J\u00fcrgen"]
HOSTS = ["db1.example.com", "web3.example.com", "build.example.org",
         "cache-2.example.net", "mx.example.com"]
WORDS = ["hello", "sailor", "release", "early", "build", "failed", "passed",
         "lunch", "coffee", "meeting", "deploy", "rollback", "urgent", "\u20ac",
         "caf\u00e9", "STRASSE", "stra\u00dfe", "ok", "timeout", "disk", "full"]
SYMBOLS = ["ACME", "INITECH", "GLOBEX", "HOOLI", "UMBRELLA", "STARK", "WAYNE"]


def make_subscriptions(rng, count):
    """A mix of subscription texts, tagged with their category."""
    makers = [
        ("string-equality", 30, lambda: f'Group == "{rng.choice(GROUPS)}"'),
        ("string-equality", 10, lambda: f'User == "{rng.choice(USERS)}" && Group == "{rng.choice(GROUPS)}"'),
        ("numeric-range", 12, lambda: f"Price > {rng.uniform(1, 500):.2f} && Price < {rng.uniform(500, 1000):.2f}"),
        ("numeric-range", 8, lambda: f"Timeout >= {rng.randint(0, 20)} && Timeout <= {rng.randint(20, 60)}"),
        ("numeric-range", 5, lambda: f'Symbol == "{rng.choice(SYMBOLS)}" && Volume > {rng.randint(1, 10000)}L'),
        ("string-predicate", 8, lambda: f'begins-with(Host, "{rng.choice(HOSTS)[:4]}")'),
        ("string-predicate", 6, lambda: f'contains(fold-case(Message), "{rng.choice(WORDS).lower()}")'),
        ("string-predicate", 4, lambda: 'ends-with(Host, ".com", ".org")'),
        ("string-predicate", 5, lambda: f'wildcard(Message, "*[Hh]ello*", "*{rng.choice(WORDS)}*")'),
        ("regex", 6, lambda: f'regex(User, "^[{rng.choice("abcdemt")}-z][a-z]+$")'),
        ("regex", 3, lambda: 'regex(Message, "(fail|error|timeout)[a-z]*")'),
        ("complex", 3, lambda: ('(Group == "elvin" || Group == "Chat") && '
                                '! regex (User, "[Ss]egall?")')),
        ("complex", 3, lambda: (f'equals(Group, "{rng.choice(GROUPS)}", "{rng.choice(GROUPS)}", '
                                f'"{rng.choice(GROUPS)}") && size(Message) < {rng.randint(10, 140)} '
                                f'&& require(User)')),
        ("complex", 2, lambda: (f'(Load * 100 / Cpus > {rng.randint(50, 300)} || '
                                f'Free < {rng.randint(1, 10)} * 1024L * 1024L) && '
                                f'!begins-with(Host, "build")')),
        ("complex", 2, lambda: ('int32(Timeout) && Timeout % 5 == 0 ^^ '
                                'string(Priority) && fold-case(Priority) == "high"')),
    ]
    weights = [w for _, w, _ in makers]
    result = []
    for _ in range(count):
        category, _, make = rng.choices(makers, weights)[0]
        result.append((category, make()))
    return result


def make_notifications(rng, count):
    notifications = []
    for _ in range(count):
        n = {
            "Group": rng.choice(GROUPS),
            "User": rng.choice(USERS),
            "Message": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))),
            "Timeout": rng.randint(0, 60),
            "Message-Id": "%014x-%s" % (rng.getrandbits(56), rng.choice(SYMBOLS)),
        }
        kind = rng.random()
        if kind < 0.3:
            n["Symbol"] = rng.choice(SYMBOLS)
            n["Price"] = rng.uniform(0.5, 1000.0)
            n["Volume"] = Int64(rng.randint(0, 1 << 40))
        elif kind < 0.5:
            n["Host"] = rng.choice(HOSTS)
            n["Load"] = rng.uniform(0.0, 16.0)
            n["Cpus"] = rng.choice([1, 2, 4, 8, 16])
            n["Free"] = Int64(rng.randint(0, 1 << 34))
        if rng.random() < 0.2:
            n["Priority"] = rng.choice(["High", "low", "HIGH", 3])
        if rng.random() < 0.1:
            n["Attachment"] = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        notifications.append(n)
    return notifications


def bench_compile(texts, seconds):
    compiled = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for text in texts:
            Subscription(text)
        compiled += len(texts)
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - start
    return compiled, elapsed


def bench_evaluate(subscriptions, notifications, seconds):
    """Evaluate every subscription against every notification (as a router
    without an index would) until ``seconds`` have passed."""
    evals = matches = 0
    per_category = {}
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for notification in notifications:
            for category, sub in subscriptions:
                hit = sub.matches(notification)
                evals += 1
                if hit:
                    matches += 1
                    per_category[category] = per_category.get(category, 0) + 1
            if time.perf_counter() >= deadline:
                break
    elapsed = time.perf_counter() - start
    return evals, matches, elapsed, per_category


def bench_category(subscriptions, notifications, seconds):
    """Evaluations per second for each category on its own."""
    result = {}
    categories = sorted({c for c, _ in subscriptions})
    for category in categories:
        subs = [s for c, s in subscriptions if c == category]
        evals = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for notification in notifications[:50]:
                for sub in subs:
                    sub.matches(notification)
                evals += len(subs)
        result[category] = evals / (time.perf_counter() - start)
    return result


def java_subscription(rng, subs):
    """A subscription shaped as the Java load generator's for ``subs``
    subscriptions (10% of notifications matching one or more)."""
    p = -math.expm1(math.log1p(-0.1) / subs)
    if p * 1000 <= 0.125:
        use1, use2, rest = True, True, p * 1000
    elif p * 100 <= 0.125:
        use1, use2, rest = True, False, p * 100
    elif p * 10 <= 0.125:
        use1, use2, rest = False, True, p * 10
    else:
        use1, use2, rest = False, False, p
    width = rest ** (1 / 3)
    parts = []
    if use1:
        parts.append(f's1 == "sym-{rng.randrange(100):03d}"')
    if use2:
        parts.append(f's2 == "ex-{rng.randrange(10)}"')
    for name in ("i1", "i2"):
        lo = int(rng.random() * (1 - width) * 1000)
        parts.append(f"{name} >= {lo} && {name} < {lo + int(width * 1000)}")
    lo = rng.random() * (1 - width) * 1000
    parts.append(f"r1 >= {lo:.2f} && r1 < {lo + width * 1000:.2f}")
    return " && ".join(parts)


def bench_index(subs, notifications, seconds, seed, shape="python"):
    """Candidates and matches per notification, look-up + evaluation rate
    and bytes per subscription for ``subs`` workload subscriptions."""
    import gc
    import tracemalloc

    from elvin.core.index import SubscriptionIndex
    from elvin.core.router import Router
    from elvin.core.keys import KeyRing
    from throughput import make_notification, make_subscription

    rng = random.Random(seed)
    make = java_subscription if shape == "java" else make_subscription
    texts = [make(rng, subs) for _ in range(subs)]
    notes = [normalise(make_notification(rng)) for _ in range(notifications)]
    owners = [object() for _ in range(min(50, subs))]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    router = Router(max_subscriptions=subs)
    for i, text in enumerate(texts):
        router.add_subscription(owners[i % len(owners)], Subscription(text), True,
                                KeyRing.EMPTY)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    index_before = tracemalloc.get_traced_memory()[0]
    index = SubscriptionIndex()
    for entry in router.subscriptions.values():
        index.add(entry)
    gc.collect()
    index_bytes = tracemalloc.get_traced_memory()[0] - index_before
    del index
    gc.collect()
    alone_before = tracemalloc.get_traced_memory()[0]
    alone = [Subscription(text).compact() for text in texts]
    gc.collect()
    subscription_bytes = tracemalloc.get_traced_memory()[0] - alone_before
    tracemalloc.stop()
    del alone

    candidates = router.index.candidates
    found = matched = 0
    for note in notes:
        for entry in candidates(note):
            found += 1
            if entry.evaluate(note) is True:
                matched += 1
    # CPU time, not wall time: the figure should not count other processes.
    done = 0
    start = time.process_time()
    deadline = start + seconds
    while time.process_time() < deadline:
        for note in notes:
            for entry in candidates(note):
                entry.evaluate(note)
        done += len(notes)
    elapsed = time.process_time() - start
    print(f"shape={shape} subs={subs} candidates_per_notif={found / len(notes):.2f} "
          f"matches_per_notif={matched / len(notes):.3f} "
          f"lookup_eval_rate={done / elapsed:,.0f}/cpu-s "
          f"({elapsed / done * 1e6:.2f} us each) "
          f"bytes_per_sub={held / subs:.0f} index_bytes_per_sub={index_bytes / subs:.0f} "
          f"subscription_bytes_per_sub={subscription_bytes / subs:.0f} "
          f"text_bytes_per_sub={sum(map(len, texts)) / subs:.0f}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="time budget of each phase (default 4)")
    parser.add_argument("--subscriptions", type=int, default=200)
    parser.add_argument("--notifications", type=int, default=500)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--index", type=int, nargs="+", metavar="S",
                        help="measure the router's index at S subscriptions instead")
    parser.add_argument("--shape", choices=["python", "java"], default="python",
                        help="with --index: bench/throughput.py's subscriptions, or "
                             "shaped as the Java load generator's")
    args = parser.parse_args(argv)

    if args.index:
        for subs in args.index:
            bench_index(subs, args.notifications, args.seconds, args.seed, args.shape)
        return

    rng = random.Random(args.seed)
    tagged = make_subscriptions(rng, args.subscriptions)
    texts = [t for _, t in tagged]
    notifications = make_notifications(rng, args.notifications)

    compiled, elapsed = bench_compile(texts, args.seconds)
    print(f"compile: {compiled / elapsed:,.0f} expr/s "
          f"({compiled} compilations in {elapsed:.2f} s, mean length "
          f"{sum(map(len, texts)) / len(texts):.0f} chars)")

    subscriptions = [(c, Subscription(t)) for c, t in tagged]
    evals, matches, elapsed, per_category = bench_evaluate(
        subscriptions, notifications, args.seconds)
    rate = 100.0 * matches / evals if evals else 0.0
    print(f"evaluate: {evals / elapsed:,.0f} evals/s (match rate {rate:.1f}%) "
          f"({evals} evaluations of {len(subscriptions)} subscriptions x "
          f"{len(notifications)} notifications in {elapsed:.2f} s)")

    counts = {}
    for category, _ in subscriptions:
        counts[category] = counts.get(category, 0) + 1
    speeds = bench_category(subscriptions, notifications,
                            args.seconds / max(len(counts), 1))
    for category in sorted(counts):
        print(f"  {category:17s} {counts[category]:4d} subs  "
              f"{speeds[category]:>12,.0f} evals/s  "
              f"{per_category.get(category, 0):8d} matches")


if __name__ == "__main__":
    main()
