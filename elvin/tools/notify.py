"""elvin-notify: emit notifications given as arguments or read from stdin.

    elvin-notify -e elvin://host 'Group: "chat"' 'Message: "hi"' 'Num: 42'
    printf 'Group: "chat"\\nNum: 42\\n---\\n' | elvin-notify

Stdin is read by a thread, so each notification is sent as soon as its
'---' (or blank line) arrives: ``elvin-subscribe -e A ... | elvin-notify -e
B`` relays as it goes, and Ctrl-C works while reading from a terminal.
If the session ends before the input does, the error says how far the
router is known to have got (``Progress``), so a relay knows where to
resume.
"""

import collections
import sys
import threading

from twisted.internet import defer

from elvin import client
from elvin.client import ConnectionClosed
from elvin.clientcore.messages import shown
from elvin.errors import echoed
from elvin.textformat import FormatError, numbered_notifications, parse_line, repeated
from elvin.tools.common import (RouterSilent, ToolOptions, abort, answered, closing,
                                ended_error, run)


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


class Progress:
    """How far a relay from stdin got: ``read``, the lines read; ``sent``,
    the last line of the last notification sent; and ``confirmed()``, the
    last line of the last one the router has confirmed having (it answered
    a TestConn written after it: a router reads a session's packets in
    order). ``ask`` sends that TestConn when the relay has nothing more to
    send at once, and again as each is answered while something sent is
    not confirmed, at most one unanswered: the confirmation follows the
    stream by about a round trip, at one TestConn per round trip at most."""

    def __init__(self, conn):
        self.conn = conn
        self.read = 0
        self.sent = 0
        self._confirmed = 0
        #: (the connection's packets written once it was sent, its last
        #: line, the channel it went on)
        self._marks = collections.deque()
        self._asking = None

    def counted(self, lines):
        """``lines``, counting them in ``read`` (in the reading thread)."""
        for line in lines:
            self.read += 1
            yield line

    def emitted(self, last):
        self.sent = last
        written, _, channel = self.conn.lifecycle.writes
        self._marks.append((written, last, channel))

    def confirmed(self):
        """A channel's confirmations count for what went on it (looked at
        as each TestConn is answered): what went to a router that then
        redirected us (Disconn) stays unconfirmed, and so does what
        followed it."""
        _, confirmed, channel = self.conn.lifecycle.writes
        marks = self._marks
        while marks and marks[0][0] <= confirmed and marks[0][2] == channel:
            self._confirmed = marks.popleft()[1]
        return self._confirmed

    def ask(self):
        if self._asking is not None or not self._marks:
            return
        self._asking = self.conn.test_connection()

        def answered(result):
            self._asking = None
            self.confirmed()
            if result is True:
                self.ask()          # for what was sent after it, if any
            # (an error: the connection is lost, which the relay tells)
        self._asking.addBoth(answered)

    def told(self):
        """Where the relay stands, for the line that ends it."""
        confirmed, sent = self.confirmed(), self.sent
        if confirmed:
            text = f"the router confirmed having the notifications of <stdin> up to line {confirmed}"
        else:
            text = "the router confirmed none of the notifications of <stdin>"
        if sent > confirmed:
            text += (f"; those sent after, to line {sent}, may not have reached it; "
                     f"read to line {self.read}: resume from line {confirmed + 1} to send "
                     f"again what is not confirmed (some may arrive twice), or from line "
                     f"{sent + 1} to send nothing twice (some may be lost)")
        else:
            text += f"; read to line {self.read}: resume from line {confirmed + 1}"
        return text


def _read_stdin(reactor, queue, progress):
    """In a daemon thread: hand each notification to the reactor as soon as
    it is complete, with its first and last lines' numbers; then None (end
    of input) or the FormatError."""
    try:
        # Bytes that are not UTF-8 reach the parser, which names their line.
        sys.stdin.reconfigure(errors="surrogateescape")
        for first, attrs in numbered_notifications(progress.counted(sys.stdin)):
            # (it yields once the line ending the notification is read)
            reactor.callFromThread(queue.put, (first, progress.read, attrs))
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


def _reading(reactor, notes, progress):
    threading.Thread(target=_read_stdin, args=(reactor, notes, progress), daemon=True,
                     name="elvin-notify stdin").start()


#: Put in the queue of notifications when the session ends.
_ENDED = object()


async def body(reactor, options):
    uri = options["uri"]
    notes = defer.DeferredQueue()
    if options["attributes"]:
        notes.put(("the arguments", 0, _from_arguments(options["attributes"])))
        notes.put(None)
    if options["unreliable"]:
        if not options["attributes"]:
            _reading(reactor, notes, Progress(None))
        while (item := await notes.get()) is not None:
            if isinstance(item, Exception):
                raise item
            await client.unotify(uri, item[2], reactor=reactor, timeout=options["timeout"])
        return
    conn = await client.connect(uri, reactor=reactor, timeout=options["timeout"],
                                options=client.ASK_LIMITS)
    closing(reactor, conn)
    progress = None
    if not options["attributes"]:
        progress = options["_progress"] = Progress(conn)
        _reading(reactor, notes, progress)
    conn.disconnected.addBoth(lambda _: notes.put(_ENDED))

    def ended(error):
        """The session ended (the connection lost, the router's Disconn):
        why, and with stdin how far the router is known to have got."""
        error = ended_error(conn, shown(uri)) if isinstance(error, ConnectionClosed) else error
        if progress is None:
            return error
        return type(error)(f"{error}; {progress.told()}")
    try:
        # A drained router answers ConnRqst, then redirects (Disconn 2): a
        # round trip first makes sure we emit to the router we end up with.
        await answered(reactor, options, conn.test_connection(), "TestConn after connecting")
        while (item := await notes.get()) is not None:
            if isinstance(item, Exception):
                raise item
            if item is _ENDED:
                raise ConnectionClosed("ended")
            where, last, attrs = item
            _emit(conn, where, attrs)
            if progress is not None:
                progress.emitted(last)
                if not notes.pending:       # nothing more to send at once
                    progress.ask()
        # A round trip makes sure everything emitted reached the router.
        await answered(reactor, options, conn.test_connection(),
                       "the TestConn that confirms the notifications sent: they may "
                       "not have reached it")
    except ConnectionClosed as e:
        if not conn._closed:
            raise
        raise ended(e) from None
    except RouterSilent as e:
        abort(conn)           # a polite close would wait for it again
        raise ended(e) from None
    except BaseException:
        if not conn._closed:
            await conn.close()
        raise
    await conn.close()


def main(argv=None):
    run(Options, body, argv)


if __name__ == "__main__":
    main()
