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
from elvin.errors import echoed
from elvin.textformat import FormatError, numbered_notifications, parse_line, repeated
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
    takes_udp = True

    def parseArgs(self, *attributes):
        self["attributes"] = attributes

    def uri_problem(self, uri):
        if uri.transport == "udp" and not self["unreliable"]:
            return ": add -u (--unreliable)"
        return None


def _from_arguments(arguments):
    attrs = {}
    for arg in arguments:
        try:
            name, value = parse_line(arg)
        except FormatError as e:
            raise FormatError(f"argument {echoed(arg)}: {e}") from None
        if name in attrs:
            raise FormatError(f"argument {echoed(arg)}: {repeated(name)}")
        attrs[name] = value
    return attrs


def _read_stdin(reactor, queue):
    """In a daemon thread: hand each notification to the reactor as soon as
    it is complete, with its first line's number; then None (end of input)
    or the FormatError."""
    try:
        # Bytes that are not UTF-8 reach the parser, which names their line.
        sys.stdin.reconfigure(errors="surrogateescape")
        for numbered in numbered_notifications(sys.stdin):
            reactor.callFromThread(queue.put, numbered)
    except Exception as e:  # FormatError, or a read error
        reactor.callFromThread(queue.put, e)
        return
    reactor.callFromThread(queue.put, None)


def _emit(conn, where, attrs):
    """Send one notification; one the router would not take (over a limit
    it reported: ConnRqst asks for them, since a router may ignore such a
    notification without a word) is an error naming its first line."""
    try:
        conn.notify(attrs)
    except ValueError as e:
        where = f"<stdin>:{where}" if isinstance(where, int) else where
        raise FormatError(f"{where}: {e}") from None


async def body(reactor, options):
    uri = options["uri"]
    if options["attributes"]:
        notes = defer.DeferredQueue()
        notes.put(("the arguments", _from_arguments(options["attributes"])))
        notes.put(None)
    else:
        notes = defer.DeferredQueue()
        threading.Thread(target=_read_stdin, args=(reactor, notes), daemon=True,
                         name="elvin-notify stdin").start()
    if options["unreliable"]:
        while (item := await notes.get()) is not None:
            if isinstance(item, Exception):
                raise item
            await client.unotify(uri, item[1], reactor=reactor, timeout=options["timeout"])
        return
    conn = await client.connect(uri, reactor=reactor, timeout=options["timeout"],
                                options=client.ASK_LIMITS)
    closing(reactor, conn)
    try:
        # A drained router answers ConnRqst, then redirects (Disconn 2): a
        # round trip first makes sure we emit to the router we end up with.
        await answered(reactor, options, conn.test_connection(), "TestConn after connecting")
        while (item := await notes.get()) is not None:
            if isinstance(item, Exception):
                raise item
            _emit(conn, *item)
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
