"""elvin-subscribe: print each notification matching an expression.

    elvin-subscribe -e elvin://host 'Group == "chat"'

Notifications are printed in the text form elvin-notify reads, each ended
by '---', until interrupted (or after --count notifications).
"""

import sys

from twisted.internet import defer

from elvin import client
from elvin.textformat import format_notification
from elvin.tools.common import ToolOptions, run


class Options(ToolOptions):
    synopsis = "[-e URI] [-n COUNT] EXPRESSION"
    optParameters = [["count", "n", None, "Exit after this many notifications.", int]]

    def parseArgs(self, expression):
        self["expression"] = expression


async def body(reactor, options):
    conn = await client.connect(options["uri"], reactor=reactor)
    done = defer.Deferred()
    seen = {"n": 0}
    limit = options["count"]

    def show(notification):
        if done.called:
            return  # past --count: later packets of the same read are ignored
        sys.stdout.write(format_notification(notification))
        sys.stdout.flush()
        seen["n"] += 1
        if limit is not None and seen["n"] >= limit and not done.called:
            done.callback(None)

    def router_closed(reason, message):
        sys.stderr.write(f"elvin-subscribe: router closed the connection "
                         f"(reason {reason}): {message}\n")

    def lost(_):
        if not done.called:
            done.errback(ConnectionError("connection to the router closed"))

    conn.on_disconnect = router_closed
    await conn.subscribe(options["expression"], show)
    conn.disconnected.addBoth(lost)
    await done
    await conn.close()


def main(argv=None):
    run(Options, body, argv)


if __name__ == "__main__":
    main()
