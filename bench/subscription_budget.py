"""Can one client's subscriptions hold the router or its memory?

    python bench/subscription_budget.py              # every case
    python bench/subscription_budget.py --memory-only

Starts a router (``twistd -n elvin`` on 127.0.0.1, this working tree's
code, its defaults unless ``-c FILE``) and, from raw sockets:

1. **Work per request.** An attacker asks for the largest
   ``Subscription.Max-Length`` the router grants, then sends the costliest
   subscriptions it can: a long OR of ``a == i``, ``equals(id, ...)`` with
   thousands of ids, a long AND of ``!=``, many wildcards, arithmetic, and
   one over the token budget (refused). While each is in flight a bystander
   sends TestConn every 10 ms; the longest wait for its Confirm is printed
   (target: under 0.5 s), with the attacker's answer (SubRply or Nack).
2. **Memory.** The attacker asks for the highest ``Subscription.Max-Count``,
   then adds 3,000 subscriptions of about 4 KB, each of a different shape
   (random comparisons, string predicates, regexes, arithmetic). Prints the
   router's RSS before, after (and how many were accepted before a limit
   refused the rest) and after the attacker leaves (targets: at most
   150 MiB more, and back within 60 MiB); then once more with a second
   such client, which should add nothing.
"""

import argparse
import os
import random
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

from connections import frame, read_packet, rss_kib  # noqa: E402  (bench/connections.py)
from elvin.protocols import packets  # noqa: E402
from elvin.subscription.lexer import tokenize  # noqa: E402
from elvin.test.places import start_twistd  # noqa: E402


def rss_mib(pid):
    return rss_kib(pid) / 1024


def connect(port, options=None):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(frame(packets.ConnRqst(1, 4, 0, options or {}, packets.Keys.EMPTY, packets.Keys.EMPTY)))
    reply = read_packet(sock)
    assert isinstance(reply, packets.ConnRply), reply
    return sock, reply.options


class Bystander(threading.Thread):
    """TestConn every 10 ms; keeps the longest wait for Confirm."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.sock, _ = connect(port)
        self.longest = 0.0
        self.running = True

    def run(self):
        while self.running:
            start = time.perf_counter()
            self.sock.sendall(frame(packets.TestConn()))
            reply = read_packet(self.sock)
            assert isinstance(reply, packets.ConfConn), reply
            self.longest = max(self.longest, time.perf_counter() - start)
            time.sleep(0.01)

    def take(self):
        longest, self.longest = self.longest, 0.0
        return longest


def costly_requests(max_length, budget_tokens):
    """(label, expression) for the costliest subscriptions that fit both
    the length and the token budget."""
    def fill(make, joiner):
        parts, total, tokens, i = [], 0, 0, 0
        while True:
            part = make(i)
            more = len(tokenize(part)) + 1
            if (total + len(part) + len(joiner) > max_length
                    or tokens + more > budget_tokens - 4):
                return joiner.join(parts)
            parts.append(part)
            total += len(part) + len(joiner)
            tokens += more
            i += 1

    def ids(i):
        return str(i)
    yield "OR of a == i", fill(lambda i: f"a == {i}", " || ")
    yield "AND of a != i", fill(lambda i: f"a != {i}", " && ")
    yield "equals(id, ...)", "equals(id, " + fill(ids, ", ") + ")"
    yield "OR of wildcards", fill(lambda i: f'wildcard(a, "x{i}*")', " || ")
    yield "OR of regexes", fill(lambda i: f'regex(a, "x{i}y+")', " || ")
    yield "OR of arithmetic", fill(lambda i: f"a + {i} * b > c - {i}", " || ")
    yield "nested (a == i && ...)", fill(lambda i: f'(a == {i} && b == "s{i}")', " || ")
    yield "over the token budget", " || ".join(["a == 1"] * (budget_tokens // 3))


TEMPLATES = ['{n} == {i}', '{n} > {i}', '{n} == "{s}"', 'begins-with({n}, "{s}")',
             'fold-case({n}) == "{s}"', 'require({n})', '({n} < {i} && {m} != "{s}")',
             'regex({n}, "{s}[0-9]+")', '{n} + {i} > {m}']


def random_expression(rnd, size):
    parts, total = [], 0
    while total < size:
        part = rnd.choice(TEMPLATES).format(
            n=f"n{rnd.randrange(50)}", m=f"m{rnd.randrange(50)}",
            i=rnd.randrange(10 ** 6), s=f"s{rnd.randrange(10 ** 6)}")
        parts.append(part)
        total += len(part) + 4
    return rnd.choice([" || ", " && "]).join(parts)


def work_per_request(port):
    print("-- work per request: a bystander's longest TestConn wait --")
    attacker, options = connect(port, {"Subscription.Max-Length": 2 ** 31 - 1})
    max_length = options["Subscription.Max-Length"]
    print(f"Subscription.Max-Length granted: {max_length}")
    bystander = Bystander(port)
    bystander.start()
    time.sleep(0.2)
    bystander.take()
    xid = 10
    for label, expression in costly_requests(max_length, 16384):
        start = time.perf_counter()
        attacker.sendall(frame(packets.SubAddRqst(xid, expression, True, packets.Keys.EMPTY)))
        reply = read_packet(attacker)
        took = time.perf_counter() - start
        time.sleep(0.05)
        answer = type(reply).__name__
        if isinstance(reply, packets.Nack):
            answer += f" {reply.error}"
        print(f"{label:26} {len(expression):6d} B  answered in {took:5.3f} s ({answer}); "
              f"bystander waited at most {bystander.take():5.3f} s")
        xid += 1
    bystander.running = False
    attacker.close()


def memory(port, pid, count, size):
    print(f"-- memory: {count} subscriptions of ~{size} B from one client --")
    rnd = random.Random(1)
    expressions = [random_expression(rnd, size) for _ in range(count)]
    time.sleep(0.5)
    before = rss_mib(pid)
    attacker, options = connect(port, {"Subscription.Max-Length": 65536,
                                       "Subscription.Max-Count": 2 ** 31 - 1})
    accepted, refused, first_refusal = 0, 0, None
    start = time.perf_counter()
    for xid, expression in enumerate(expressions, 10):
        attacker.sendall(frame(packets.SubAddRqst(xid, expression, True, packets.Keys.EMPTY)))
        reply = read_packet(attacker)
        if isinstance(reply, packets.SubRply):
            accepted += 1
        else:
            refused += 1
            first_refusal = first_refusal or f"Nack {reply.error}: {reply.message}"
    took = time.perf_counter() - start
    during = rss_mib(pid)
    attacker.close()
    time.sleep(2.0)
    after = rss_mib(pid)
    print(f"accepted {accepted}, refused {refused} in {took:.1f} s"
          + (f" (first refusal: {first_refusal})" if first_refusal else ""))
    print(f"router RSS: {before:.0f} MiB before, {during:.0f} MiB with them "
          f"(+{during - before:.0f} MiB, "
          f"{(during - before) * 1024 / max(accepted, 1):.1f} KiB each), "
          f"{after:.0f} MiB after the client left (+{after - before:.0f} MiB)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", help="router configuration file")
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("-n", type=int, default=3000, help="subscriptions (memory)")
    parser.add_argument("--size", type=int, default=4000, help="bytes each (memory)")
    args = parser.parse_args()
    extra = ["-c", os.path.abspath(args.config)] if args.config else []
    port, proc = start_twistd("elvin", lambda p: extra + ["-l", f"elvin://127.0.0.1:{p}"])
    try:
        if not args.memory_only:
            work_per_request(port)
        for _ in range(2):      # the second client reuses what the first freed
            memory(port, proc.pid, args.n, args.size)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
