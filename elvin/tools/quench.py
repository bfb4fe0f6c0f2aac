"""elvin-quench: print subscription adds, changes and removals on names.

    elvin-quench -e elvin://host price volume

Each line is ``add TERM [secure|insecure] EXPRESSION``,
``modify TERM [secure|insecure] EXPRESSION`` or ``delete TERM``, printed as
the router reports subscriptions referring to the names, until interrupted.
"""

from twisted.internet import defer

from elvin import client
from elvin.subscription.printer import to_text
from elvin.tools.common import (RouterSilent, StdoutError, ToolOptions, abort, answered, closing,
                                ended_error, run, write)


class Options(ToolOptions):
    name = "elvin-quench"
    synopsis = "NAME [NAME ...]"
    longdesc = ("Quench on attribute names: print a line whenever a subscription "
                "that refers to one of them is added, modified or removed at the "
                "router ('add TERM secure|insecure EXPRESSION', 'modify ...', "
                "'delete TERM'), until interrupted.")

    def parseArgs(self, *names):
        if not names:
            from twisted.python import usage
            raise usage.UsageError("give at least one attribute name to quench on")
        self["names"] = names


def _line(kind, term_id, tree=None, secure=False):
    if tree is None:
        return f"{kind} {term_id}\n"
    return f"{kind} {term_id} {'secure' if secure else 'insecure'} {to_text(tree)}\n"


async def body(reactor, options):
    conn = await client.connect(options["uri"], reactor=reactor,
                                timeout=options["timeout"])
    closing(reactor, conn)
    done = defer.Deferred()

    def show(kind):
        def handler(term_id, tree=None, secure=False):
            try:
                write(_line(kind, term_id, tree, secure))
            except StdoutError as e:
                if not done.called:
                    done.errback(e)
        return handler

    try:
        await answered(reactor, options,
                       conn.quench(options["names"], on_add=show("add"),
                                   on_modify=show("modify"), on_delete=show("delete")),
                       "QnchAddRqst")
    except RouterSilent:
        abort(conn)           # a polite close would wait for it again
        raise
    conn.disconnected.addBoth(lambda _: done.called or done.errback(
        ended_error(conn, options["uri"])))
    try:
        await done
    finally:
        if not conn._closed:
            await conn.close()


def main(argv=None):
    run(Options, body, argv)


if __name__ == "__main__":
    main()
