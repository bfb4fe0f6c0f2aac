"""Where a router's CPU goes per notification: a py-spy profile split by stage.

    python bench/cpu_budget.py --bench /path/to/peer-bench/bench \\
        --url elvin://127.0.0.1:29171 --pid ROUTER_PID --subs 10 1000 10000

For each subscription count it runs the load generator once as a warm-up,
then once more while ``py-spy record`` samples the router process (raw
collapsed stacks, idle time excluded), and reads the router's CPU time
from /proc around that run. Each sample is put in the stage of the
deepest frame it recognises (table ``STAGES``); the router's CPU for the
notifications, less any samples placing subscriptions or removing them, is divided
among the stages in proportion and by the number of notifications:

    subs=1000 notifs=50000 router_cpu_s=... us_per_notif=... decode=...
        route=... evaluate=... encode=... write=... read=... reactor=...
        other=... place_share=...

``in_syscalls_share`` is the share of samples inside send, recv and
epoll_wait: wall time the router's one thread spends there, waiting for a
core as much as working (on loopback a send wakes the receiving thread).
Those samples are left out of the split; ``kernel`` is the process's
system CPU time instead.

Stages: ``read`` is the recv calls and the framing's split into packets;
``decode`` the NotifyEmit's fields (C NameValue decoder included);
``route`` the router's own work per notification (session checks, keys,
the index look-up, grouping matches by session); ``index`` the index's
candidate selection alone; ``evaluate`` the subscriptions' generated
evaluators; ``encode`` building NotifyDeliver bytes; ``write`` handing
them to the transports and the send calls; ``reactor`` the poll loop.
Needs py-spy (``pip install py-spy``) and permission to trace the router
(root, or ptrace_scope 0).
"""

import argparse
import collections
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from side_by_side import notifications_for, run_once  # noqa: E402

#: (stage, substrings of a frame "function (file:line)"); a sample goes to the
#: stage of its deepest frame that matches; the first matching row wins.
STAGES = (
    ("evaluate", ("(<subscription>",)),
    ("index", ("SubscriptionIndex.", "(elvin/core/index.py")),
    ("encode", ("encode_attributes", "encode_notify_deliver", "Writer.")),
    ("decode", ("notify_emit_fields", "decode_notify_emit", "Reader.", "_read_keys",
                "Int64.__new__")),
    ("write", ("writeOrQueue", "send_encoded", "sendFrame", "ClientSession.deliver",
               "doWrite", "writeSomeData", "FileDescriptor.write", "writeSequence",
               "startWriting", "stopWriting")),
    ("route", ("Router.route", "notify_emit", "frameReceived",
               "notification_problem", "KeyRing", "_secure")),
    ("read", ("doRead", "_dataReceived", "FramedProtocol.", "dataReceived")),
    ("reactor", ("doPoll", "mainLoop", "runUntilCurrent")),
)
#: A sample with any of these frames is placing a subscription (or another
#: request that is not a notification), or taking subscriptions away as the
#: generator's connections close at the end, wherever its deepest frame is.
PLACING = ("packet_received", "decode (elvin/protocols/packets.py", "_sub_add", "_sub_mod",
           "_sub_del", "add_subscription", "(elvin/subscription/", "remove_subscription",
           "session_closed", "connection_lost")
SHOWN = ("read", "decode", "route", "index", "evaluate", "encode", "write", "reactor",
         "other", "kernel")


#: Leaf frames that are a system call (send, recv, epoll_wait): py-spy counts
#: such a sample as busy even while the thread waits for a core (a send on
#: loopback wakes the receiving thread, which may take the core), so these
#: samples are not CPU; the kernel's time (the process's stime) is
#: reported as its own stage instead.
SYSCALL_LEAVES = ("untilConcludes", "writeSomeData", "Connection.doRead", "doPoll")


def stage_of(frames):
    """The stage of one sampled stack (list of frames, root first)."""
    if frames and any(mark in frames[-1] for mark in SYSCALL_LEAVES):
        return "syscall"
    if any(mark in frame for frame in frames for mark in PLACING):
        return "place"
    for frame in reversed(frames):
        for stage, marks in STAGES:
            if any(mark in frame for mark in marks):
                return stage
    return "other"


def cpu_split(pid):
    """(user, system) CPU seconds process ``pid`` has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def count_stages(path):
    counts = collections.Counter()
    with open(path, encoding="utf-8", errors="replace") as raw:
        for line in raw:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not n.isdigit():
                continue
            counts[stage_of(stack.split(";"))] += int(n)
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, help="the load generator's command")
    parser.add_argument("--url", required=True, help="the router's elvin: URI")
    parser.add_argument("--pid", type=int, required=True, help="the router's process id")
    parser.add_argument("--subs", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--notifs", type=int, help="notifications per run (default: by row)")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    parser.add_argument("--keep", help="directory to keep the raw profiles in")
    args = parser.parse_args(argv)
    where = args.keep or tempfile.mkdtemp(prefix="cpu_budget.")
    os.makedirs(where, exist_ok=True)
    for subs in args.subs:
        notifs = args.notifs or notifications_for(subs)
        run_once(args.bench, args.url, subs, notifs, [], 600)          # warm-up
        path = os.path.join(where, f"profile-{subs}.txt")
        command = [args.bench, args.url, str(min(50, subs)), str(subs), str(notifs), "1",
                   "--timeout", "10"]
        generator = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        for line in generator.stderr:         # placing: not part of the budget
            if line.startswith("# placed"):
                break
        before = cpu_split(args.pid)
        spy = subprocess.Popen(["py-spy", "record", "-p", str(args.pid), "-r", str(args.rate),
                                "-f", "raw", "-o", path, "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out, _ = generator.communicate(timeout=600)
        after = cpu_split(args.pid)
        spy.send_signal(2)                                # SIGINT: write the profile
        spy.wait(timeout=60)
        figures = dict(pair.split("=", 1) for line in out.splitlines()
                       if line.startswith("subs=") for pair in line.split() if "=" in pair)
        counts = count_stages(path)
        total = sum(counts.values()) or 1
        place = counts.pop("place", 0)
        waiting = counts.pop("syscall", 0)
        python = sum(counts.values()) or 1
        user, kernel = after[0] - before[0], after[1] - before[1]
        routing = 1 - place / total            # the share not placing subscriptions
        per_user = user * routing / notifs * 1e6
        counts["kernel"] = python * kernel / user if user else 0
        per = per_user + kernel * routing / notifs * 1e6
        line = [f"subs={subs} notifs={notifs} notif_rate={float(figures['notif_rate']):.0f}",
                f"delivered={figures.get('delivered')} expected={figures.get('expected')}",
                f"router_cpu_s={user + kernel:.2f} us_per_notif={per:.2f}"]
        line += [f"{stage}={per_user * counts.get(stage, 0) / python:.2f}" for stage in SHOWN]
        line.append(f"in_syscalls_share={waiting / total:.2f} place_share={place / total:.2f} "
                    f"samples={total}")
        print(" ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
