"""elvin-notify: emit notifications given as arguments or read from stdin.

    elvin-notify -e elvin://host 'Group: "chat"' 'Message: "hi"' 'Num: 42'
    printf 'Group: "chat"\\nNum: 42\\n---\\n' | elvin-notify
"""

import sys

from twisted.internet import defer

from elvin import client
from elvin.textformat import FormatError, parse_line, read_notifications
from elvin.tools.common import ToolOptions, run


class Options(ToolOptions):
    synopsis = "[-e URI] [--unreliable] ['Name: value' ...]"
    longdesc = ("Emit one notification built from the arguments, or, with no "
                "arguments, every notification read from stdin (attributes one "
                "per line, each notification ended by '---' or a blank line).")
    optFlags = [["unreliable", "u", "Send UNotify (session-less) instead of NotifyEmit."]]

    def parseArgs(self, *attributes):
        self["attributes"] = attributes


def _notifications(options):
    if options["attributes"]:
        attrs = {}
        for arg in options["attributes"]:
            try:
                name, value = parse_line(arg)
            except FormatError as e:
                raise FormatError(f"argument {arg!r}: {e}") from None
            attrs[name] = value
        return [attrs]
    return read_notifications(sys.stdin)


async def body(reactor, options):
    notes = _notifications(options)
    if options["unreliable"]:
        for attrs in notes:
            await client.unotify(options["uri"], attrs, reactor=reactor)
        return
    conn = await client.connect(options["uri"], reactor=reactor)
    try:
        for attrs in notes:
            conn.notify(attrs)
        # A round trip makes sure everything emitted reached the router.
        await conn.test_connection()
    finally:
        await conn.close()


def main(argv=None):
    run(Options, body, argv)


if __name__ == "__main__":
    main()
