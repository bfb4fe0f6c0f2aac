"""elvin-discover: list the Elvin routers that router discovery finds.

    elvin-discover                 # until interrupted (Ctrl-C)
    elvin-discover --time 5        # for five seconds
    elvin-discover --scope chat --passive

Solicits advertisements (ERDP, with the expanding search of the discovery
protocol; ``--passive`` only listens) and browses DNS-SD, printing each
router as it is seen or changes, and each withdrawal:

    router elvin:host.example.com:4242:20260101T000000.000000:1
      scope: "chat"  default: yes  revision: 1  via: erdp from 192.0.2.2
      uri: elvin:4.0/tcp,none,xdr/192.0.2.2:2917
    withdrawn elvin:host.example.com:4242:20260101T000000.000000:1

Exit status 0 if a router was seen, 1 if none was (with ``--time``).
"""

import json
import sys

from twisted.internet import defer
from twisted.python import usage

from elvin.discovery.packets import GROUP, MAX_LOCALITY, PORT, check_scope
from elvin.discovery.discoverer import DEFAULT_MAX_LOCALITY, Discoverer, NoRouterFound
from elvin.discovery.settings import parse_group
from elvin.tools.common import BaseOptions, StdoutError, run, write


class Options(BaseOptions):
    name = "elvin-discover"
    synopsis = ""
    longdesc = ("List Elvin routers found by router discovery (ERDP multicast and "
                "DNS-SD): name, scope, default flag and URIs, as they are seen, "
                "for --time seconds or until interrupted.")
    optFlags = [
        ["passive", "p", "Only listen for advertisements; do not solicit them."],
        ["no-dns-sd", None, "Do not browse DNS-SD (_elvin._tcp.local.)."],
        ["no-erdp", None, "Do not use ERDP multicast."],
        ["json", "j", "Print one JSON object per line instead of text."],
    ]
    optParameters = [
        ["time", "t", None, "Stop after this many seconds (default: run until "
                            "interrupted).", float],
        ["scope", "s", None, "Only list routers of this scope."],
        ["interface", "i", None, "IPv4 address of the interface for multicast "
                                 "(default: the system's choice)."],
        ["locality", "l", DEFAULT_MAX_LOCALITY, "Widest locality (IP TTL) to "
                                                "solicit with, 0-255.", int],
        ["group", None, f"{GROUP}:{PORT}", "ERDP multicast group[:port] "
                                                "(for testing)."],
    ]

    def postOptions(self):
        if self["time"] is not None and self["time"] < 0:
            raise usage.UsageError("--time must not be negative")
        if not 0 <= self["locality"] <= MAX_LOCALITY:
            raise usage.UsageError(f"--locality must be 0-{MAX_LOCALITY}")
        try:
            self["group_address"] = parse_group(self["group"], "--group")
            if self["scope"] is not None:
                check_scope(self["scope"])
        except ValueError as e:
            raise usage.UsageError(str(e)) from None
        if self["no-dns-sd"] and self["no-erdp"]:
            raise usage.UsageError("--no-dns-sd and --no-erdp leave nothing to do")


def format_record(event, record, as_json=False):
    """The lines printed for one cache event."""
    if as_json:
        data = {"event": event, "name": record.name, "scope": record.scope,
                "default": record.default, "revision": record.revision,
                "uris": list(record.uris), "source": record.source,
                "address": record.address}
        return json.dumps(data, ensure_ascii=False) + "\n"
    if event == "withdrawn":
        return f"withdrawn {record.name}\n"
    via = record.source + (f" from {record.address}" if record.address else "")
    lines = [f"router {record.name}",
             f"  scope: {json.dumps(record.scope, ensure_ascii=False)}  "
             f"default: {'yes' if record.default else 'no'}  "
             f"revision: {record.revision}  via: {via}"]
    lines += [f"  uri: {uri}" for uri in record.uris]
    return "\n".join(lines) + "\n"


async def body(reactor, options, out=None):
    out = out or sys.stdout
    group, port = options["group_address"]
    discoverer = Discoverer(reactor, interface=options["interface"],
                            max_locality=options["locality"], group=group, port=port,
                            dns_sd=not options["no-dns-sd"],
                            erdp=not options["no-erdp"])
    scope = options["scope"]
    seen = set()
    done = defer.Deferred()

    def show(event, record):
        if scope is not None and record.scope != scope:
            return
        seen.add(record.name)
        try:
            write(format_record(event, record, options["json"]), out)
        except StdoutError as e:
            if not done.called:
                done.errback(e)

    discoverer.cache.listeners.append(show)
    await discoverer.start()
    interrupted = []

    def shutting_down():
        # Interrupted (Ctrl-C): close the sockets and end quietly.
        interrupted.append(True)
        if not done.called:
            done.callback(None)
        return discoverer.stop()
    trigger = reactor.addSystemEventTrigger("before", "shutdown", shutting_down)
    timer = None
    try:
        if not options["passive"]:
            discoverer.solicit()
        if options["time"] is not None:
            timer = reactor.callLater(options["time"], done.callback, None)
        await done
    finally:
        if timer is not None and timer.active():
            timer.cancel()
        if not interrupted:
            reactor.removeSystemEventTrigger(trigger)
            await discoverer.stop()
    if not seen and not interrupted:
        which = "" if scope is None else f" of scope {scope!r}"
        raise NoRouterFound(f"no Elvin router{which} seen in {options['time']:g} s")


def main(argv=None):
    run(Options, body, argv)


if __name__ == "__main__":
    main()
