"""What each client flavour costs: notifications/s published and received.

    python bench/client.py [--notifs N] [--url elvin://host:port]

For each flavour -- blocking (``elvin.sync``), asyncio (``elvin.aio``) and
Twisted (``elvin.client``) -- one connection subscribes to ``require(seq)``
and another publishes N small notifications as fast as the flavour lets
it; prints one line per flavour:

    flavour=… notifs=… published_per_s=… received_per_s=… publish_cpu_us=… cpu_us=…

``published_per_s`` is N over the time the publishing calls took;
``received_per_s`` is N over the time until the last one arrived (every
one must arrive); ``publish_cpu_us`` is this process's CPU time per
notification while publishing, ``cpu_us`` until the last one arrived
(publishing and receiving: both connections are in this process). Without ``--url`` it starts a router of its own on a
free loopback port. The load generator and the router share the machine,
so compare flavours within one run.
"""

import argparse
import asyncio
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from throughput import start_router  # noqa: E402


def report(flavour, notifs, published, received, cpu_start, cpu_published):
    cpu = time.process_time() - cpu_start
    print(f"flavour={flavour} notifs={notifs} published_per_s={notifs / published:.0f} "
          f"received_per_s={notifs / received:.0f} "
          f"publish_cpu_us={(cpu_published - cpu_start) / notifs * 1e6:.1f} "
          f"cpu_us={cpu / notifs * 1e6:.1f}", flush=True)


def run_sync(url, notifs):
    import elvin.sync
    done = threading.Event()
    count = [0]

    def arrived(note):
        count[0] += 1
        if count[0] == notifs:
            done.set()
    with elvin.sync.connect(url) as consumer, elvin.sync.connect(url) as producer:
        consumer.subscribe("require(seq)", callback=arrived)
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(notifs):
            producer.notify({"seq": i, "body": "x"})
        published, cpu_published = time.perf_counter() - start, time.process_time()
        if not done.wait(120):
            raise SystemExit(f"blocking: {count[0]} of {notifs} arrived")
        report("blocking", notifs, published, time.perf_counter() - start, cpu, cpu_published)


async def run_aio(url, notifs):
    import elvin.aio
    async with elvin.aio.connect(url) as consumer, elvin.aio.connect(url) as producer:
        async with consumer.subscribe("require(seq)") as sub:
            start, cpu = time.perf_counter(), time.process_time()
            for i in range(notifs):
                producer.notify({"seq": i, "body": "x"})
                if i % 1000 == 999:
                    await asyncio.sleep(0)       # let the loop write and read
            published, cpu_published = time.perf_counter() - start, time.process_time()
            got = 0
            async for _ in sub:
                got += 1
                if got == notifs:
                    break
            report("asyncio", notifs, published, time.perf_counter() - start, cpu,
                   cpu_published)


def run_twisted(url, notifs):
    from twisted.internet import defer, task
    from elvin import client

    async def body(reactor):
        consumer = await client.connect(url, reactor=reactor)
        producer = await client.connect(url, reactor=reactor)
        done = defer.Deferred()
        count = [0]

        def arrived(note):
            count[0] += 1
            if count[0] == notifs:
                done.callback(None)
        await consumer.subscribe("require(seq)", arrived)
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(notifs):
            producer.notify({"seq": i, "body": "x"})
            if i % 1000 == 999:
                await task.deferLater(reactor, 0, lambda: None)
        published, cpu_published = time.perf_counter() - start, time.process_time()
        await done
        report("twisted", notifs, published, time.perf_counter() - start, cpu, cpu_published)
        await producer.close()
        await consumer.close()
    task.react(lambda reactor: defer.ensureDeferred(body(reactor)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="router to use (default: start one)")
    parser.add_argument("--notifs", type=int, default=20000)
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_router()
    try:
        run_sync(url, args.notifs)
        asyncio.run(run_aio(url, args.notifs))
        run_twisted(url, args.notifs)      # last: a reactor runs once per process
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
