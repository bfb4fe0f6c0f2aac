"""elvin-notify: emit notifications given as arguments or read from stdin.

    elvin-notify -e elvin://host 'Group: "chat"' 'Message: "hi"' 'Num: 42'
    printf 'Group: "chat"\\nNum: 42\\n---\\n' | elvin-notify

Stdin is read by a thread, so each notification is sent as soon as its
'---' (or blank line) arrives: ``elvin-subscribe -e A ... | elvin-notify -e
B`` relays as it goes, and Ctrl-C works while reading from a terminal.
"""

import sys
import threading

from twisted.internet import defer

from elvin import client
from elvin.textformat import FormatError, parse_line, read_notifications
from elvin.tools.common import RouterSilent, ToolOptions, abort, answered, closing, run


class Options(ToolOptions):
    name = "elvin-notify"
    synopsis = "['Name: value' ...]"
    longdesc = ("Emit one notification built from the arguments, or, with no "
                "arguments, every notification read from stdin (attributes one "
                "per line, each notification ended by '---' or a blank line), "
                "each sent as soon as it is complete.")
    optFlags = [["unreliable", "u", "Send UNotify (session-less) instead of NotifyEmit; "
                                    "needed for udp,none,xdr URIs."]]

    def parseArgs(self, *attributes):
        self["attributes"] = attributes

    def postOptions(self):
        super().postOptions()
        uri = self["uri"]
        if uri is not None and uri.transport == "udp" and not self["unreliable"]:
            from twisted.python import usage
            raise usage.UsageError(
                f"{self['elvin']} is a UDP URI, which carries only session-less "
                "notifications: add -u (--unreliable)")


def _from_arguments(arguments):
    attrs = {}
    for arg in arguments:
        try:
            name, value = parse_line(arg)
        except FormatError as e:
            raise FormatError(f"argument {arg!r}: {e}") from None
        attrs[name] = value
    return attrs


def _read_stdin(reactor, queue):
    """In a daemon thread: hand each notification to the reactor as soon as
    it is complete; then None (end of input) or the FormatError."""
    try:
        for attrs in read_notifications(sys.stdin):
            reactor.callFromThread(queue.put, attrs)
    except Exception as e:  # FormatError, or a read error
        reactor.callFromThread(queue.put, e)
        return
    reactor.callFromThread(queue.put, None)


async def body(reactor, options):
    uri = options["uri"]
    if options["attributes"]:
        notes = defer.DeferredQueue()
        notes.put(_from_arguments(options["attributes"]))
        notes.put(None)
    else:
        notes = defer.DeferredQueue()
        threading.Thread(target=_read_stdin, args=(reactor, notes), daemon=True,
                         name="elvin-notify stdin").start()
    if options["unreliable"]:
        while (attrs := await notes.get()) is not None:
            if isinstance(attrs, Exception):
                raise attrs
            await client.unotify(uri, attrs, reactor=reactor, timeout=options["timeout"])
        return
    conn = await client.connect(uri, reactor=reactor, timeout=options["timeout"])
    closing(reactor, conn)
    try:
        # A drained router answers ConnRqst, then redirects (Disconn 2): a
        # round trip first makes sure we emit to the router we end up with.
        await answered(reactor, options, conn.test_connection(), "TestConn after connecting")
        while (attrs := await notes.get()) is not None:
            if isinstance(attrs, Exception):
                raise attrs
            conn.notify(attrs)
        # A round trip makes sure everything emitted reached the router.
        await answered(reactor, options, conn.test_connection(),
                       "the TestConn that confirms the notifications sent: they may "
                       "not have reached it")
    except RouterSilent:
        abort(conn)           # a polite close would wait for it again
        raise
    except BaseException:
        if not conn._closed:
            await conn.close()
        raise
    await conn.close()


def main(argv=None):
    run(Options, body, argv)


if __name__ == "__main__":
    main()
