"""elvin-subscribe: print each notification matching an expression.

    elvin-subscribe -e elvin://host 'Group == "chat"'

Notifications are printed in the text form elvin-notify reads, each ended
by '---', until interrupted (Ctrl-C: exit 0) or after --count
notifications. A closed stdout (``| head -2``) ends it quietly.
"""

import sys

from twisted.internet import defer
from twisted.python import usage

from elvin import client
from elvin.textformat import format_notification
from elvin.tools.common import StdoutClosed, ToolOptions, closing, run, write


class Options(ToolOptions):
    name = "elvin-subscribe"
    synopsis = "EXPRESSION"
    longdesc = ("Subscribe to EXPRESSION (the Elvin subscription language) and print "
                "every notification that matches it, in the text form elvin-notify "
                "reads, each ended by '---'. Runs until interrupted, or until "
                "--count notifications have arrived.")
    optFlags = [["ready", "r", "Print 'ready' on stderr once the subscription is in "
                               "place (scripts can wait for that line)."]]
    optParameters = [["count", "n", None, "Exit after this many notifications (at least 1).",
                      int]]

    def parseArgs(self, expression):
        self["expression"] = expression

    def postOptions(self):
        super().postOptions()
        if self["count"] is not None and self["count"] < 1:
            raise usage.UsageError(f"--count must be at least 1, not {self['count']}")


async def body(reactor, options):
    conn = await client.connect(options["uri"], reactor=reactor,
                                timeout=options["timeout"])
    closing(reactor, conn)
    done = defer.Deferred()
    seen = {"n": 0}
    limit = options["count"]
    said = []

    def show(notification):
        if done.called:
            return  # past --count: later packets of the same read are ignored
        try:
            write(format_notification(notification))
        except StdoutClosed as e:
            done.errback(e)
            return
        seen["n"] += 1
        if limit is not None and seen["n"] >= limit and not done.called:
            done.callback(None)

    def router_closed(reason, message):
        said.append(True)
        if not done.called:
            done.errback(client.ConnectionClosed(
                f"the router closed the connection (Disconn reason {reason}"
                f"{': ' + message if message else ''})"))

    def lost(_):
        if not done.called:
            done.errback(client.ConnectionClosed(
                f"the connection to {options['uri']} was lost"))

    conn.on_disconnect = router_closed
    await conn.subscribe(options["expression"], show)
    if options["ready"]:
        sys.stderr.write("ready\n")
        sys.stderr.flush()
    conn.disconnected.addBoth(lost)
    try:
        await done
    finally:
        if not conn._closed:
            await conn.close()


def main(argv=None):
    run(Options, body, argv)


if __name__ == "__main__":
    main()
