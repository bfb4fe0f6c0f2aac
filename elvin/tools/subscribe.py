"""elvin-subscribe: print each notification matching an expression.

    elvin-subscribe -e elvin://host 'Group == "chat"'
    elvin-subscribe -e elvin://proxy:2916 --session phone 'Group == "chat"'

Notifications are printed in the text form elvin-notify reads, each ended
by '---', until interrupted (Ctrl-C: exit 0) or after --count
notifications. A closed stdout (``| head -2``) ends it quietly. Through a
proxy session, what is printed is acknowledged (docs/proxy.md): what was
not printed yet when the connection ended is printed again next time,
and what the proxy or router reports lost is said on stderr.
"""

import sys

from twisted.internet import defer
from twisted.python import usage

from elvin import client
from elvin.errors import SubscriptionError
from elvin.subscription.analysis import names_compared
from elvin.subscription.parser import parse
from elvin.textformat import format_notification
from elvin.tools.common import (RouterSilent, StdoutError, ToolOptions, abort, answered, closing,
                                run, write)


class Options(ToolOptions):
    name = "elvin-subscribe"
    synopsis = "EXPRESSION"
    longdesc = ("Subscribe to EXPRESSION (the Elvin subscription language) and print "
                "every notification that matches it, in the text form elvin-notify "
                "reads, each ended by '---'. Runs until interrupted, or until "
                "--count notifications have arrived.")
    optFlags = [["ready", "r", "Print 'ready' on stderr once the subscription is in "
                               "place (scripts can wait for that line)."]]
    optParameters = [
        ["count", "n", None, "Exit after this many notifications (at least 1).", int],
        ["session", "s", None, "Through an Elvin proxy: join this session (created if "
                               "new), print what it stored while nobody was connected, "
                               "then what arrives. EXPRESSION is then optional (added to "
                               "the session unless it has it already). See docs/proxy.md."],
        ["password", None, None, "With --session: the session's password."],
        ["admin-password", None, None, "With --session: its administrative password "
                                       "(needed to add EXPRESSION to it)."],
        ["receipt", None, "destructive", "With --session: 'destructive' (what is printed "
                                         "is gone from the session) or 'non-destructive' "
                                         "(needs --client)."],
        ["client", None, None, "With --session: a name for this device, the same every "
                               "time (non-destructive receipt)."],
    ]

    def parseArgs(self, expression=None):
        self["expression"] = expression

    def postOptions(self):
        super().postOptions()
        if self["count"] is not None and self["count"] < 1:
            raise usage.UsageError(f"--count must be at least 1, not {self['count']}")
        if self["session"] is None:
            alone = [f"--{o}" for o in ("password", "admin-password", "client")
                     if self[o] is not None]
            if alone:
                verb = "goes" if len(alone) == 1 else "go"
                raise usage.UsageError(f"{' and '.join(alone)} only {verb} with --session "
                                       "(a session of an Elvin proxy)")
        if self["expression"] is None and self["session"] is None:
            raise usage.UsageError("an EXPRESSION is needed (or --session)")
        if self["receipt"] not in ("destructive", "non-destructive"):
            raise usage.UsageError("--receipt must be destructive or non-destructive")
        if self["receipt"] == "non-destructive" and self["session"] is None:
            raise usage.UsageError("--receipt non-destructive only goes with --session "
                                   "(and --client NAME)")
        if self["receipt"] == "non-destructive" and not self["client"]:
            raise usage.UsageError("--receipt non-destructive needs --client NAME")
        if self["expression"] is not None:
            for line in bare_name_warnings(self["expression"]):
                sys.stderr.write(f"{self.name}: warning: {line}\n")


def bare_name_warnings(expression):
    """A warning for each comparison of two attribute names (``Group ==
    chat``): legal, but usually a string whose quotes were forgotten."""
    try:
        tree = parse(expression).tree
    except SubscriptionError:
        return []                  # the router names the error
    return [f"{a} {op} {b} compares two attributes; if {b} is a string, quote it: "
            f"{a} {op} \"{b}\"" for a, op, b in names_compared(tree)]


class GapReporter:
    """Tells the user, one line on stderr each, of notifications the proxy
    or the router says were lost: a session's ``Proxy.Dropped`` on joining
    (and the DropWarn that follows it: one line, with the count and the
    gaps of unknown size apart, ``lost_line``) and each
    later DropWarn (no count: a DropWarn carries none). Without it, a gap in
    what is printed would look like nothing having matched. ``conn`` is set
    once connected (a DropWarn may come first: it is held until then)."""

    def __init__(self, name="elvin-subscribe", out=None):
        self.conn = None
        self.name = name
        self.out = out
        #: The joins (JoinedSession objects) already told of, by id (held,
        #: so that no later one gets the same id).
        self._told = {}
        #: DropWarns still to come for joins told of (each join's own).
        self._owed = 0
        #: DropWarns before ``conn`` was set.
        self._early = 0

    def _line(self, text):
        out = self.out or sys.stderr
        out.write(f"{self.name}: {text}\n")
        out.flush()

    def joined(self):
        """Tell of drops the sessions reported on joining, once per join."""
        if self.conn is None:
            return
        for joined in list(self.conn.sessions.values()):
            if id(joined) in self._told:
                continue
            self._told[id(joined)] = joined
            if joined.dropped:
                self._owed += 1
                self._line(lost_line(joined))
        early, self._early = self._early, 0
        for _ in range(early):
            self.dropwarn()

    def dropwarn(self):
        """``on_dropwarn``: a join's own DropWarn was told with its count."""
        if self.conn is None:
            self._early += 1
            return
        self.joined()
        if self._owed:
            self._owed -= 1
            return
        self._line("the router or proxy reports notifications lost here (a DropWarn; "
                   "it does not say how many)")


def lost_line(joined):
    """What a session's ``Proxy.Dropped`` on joining says: the
    notifications the proxy counted apart from its gaps of unknown size
    (``Proxy.Gaps``: each counted as one, and one may hide thousands)."""
    if joined.gaps is None:         # a proxy that does not tell them apart
        return (f"the proxy reports {joined.dropped} lost from session {joined.name!r} while "
                "no client of it was connected (notifications lost to a limit or a full "
                "disk, and gaps of unknown size, each counted as one: the proxy or its "
                "router restarting)")
    gaps = f"{joined.gaps} gap{'' if joined.gaps == 1 else 's'} of unknown size"
    why = []
    if joined.lost:
        text = f"{joined.lost} notification{'' if joined.lost == 1 else 's'} lost"
        text += f" from session {joined.name!r}"
        if joined.gaps:
            text += f", and more in {gaps},"
        why.append("a limit or a full disk")
    else:
        text = f"notifications lost from session {joined.name!r} in {gaps}"
    if joined.gaps:
        why.append("the proxy restarting, or its router restarting, out of reach "
                   "or dropping notifications for it")
    return (f"the proxy reports {text} while no client of it was connected "
            f"({'; '.join(why)})")


async def body(reactor, options):
    session = {}
    if options["session"] is not None:
        session = {"session": options["session"], "password": options["password"],
                   "admin_password": options["admin-password"],
                   "receipt": options["receipt"], "client": options["client"]}
    done = defer.Deferred()
    seen = {"n": 0}
    limit = options["count"]
    said = []

    def show(notification):
        if done.called or (limit is not None and seen["n"] >= limit):
            # Past --count: later packets of the same read are not printed,
            # so a proxy is not told they were (held: never acknowledged).
            conn.ack_hold(notification)
            return
        try:
            write(format_notification(notification))
        except StdoutError as e:
            conn.ack_hold(notification)
            done.errback(e)
            return
        seen["n"] += 1        # acknowledged to a proxy once this returns
        if limit is not None and seen["n"] >= limit:
            # Done once this has returned: firing ``done`` here would close
            # the connection, and send its last acknowledgement, before
            # this notification counts as handled.
            reactor.callLater(0, finish)

    def finish():
        if not done.called:
            done.callback(None)

    gaps = GapReporter()
    conn = await client.connect(options["uri"], reactor=reactor,
                                timeout=options["timeout"],
                                ack_window=ACK_WINDOW_ASKED if session else None,
                                on_dropwarn=gaps.dropwarn, **session)
    gaps.conn = conn
    gaps.joined()
    if session:
        # Everything the session's subscriptions match, stored (which
        # follows the join at once, so this is set before anything else
        # runs) or live, each once.
        conn.on_notification = show
    closing(reactor, conn)

    def router_closed(reason, message):
        if reason == 2 and conn.follow_redirects:
            # Redirected (the router is being drained): the connection
            # follows, with the subscription; nothing is printed twice.
            sys.stderr.write(f"redirected to {message}\n")
            sys.stderr.flush()
            return
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
    expression = options["expression"]
    try:
        if not session:
            await answered(reactor, options, conn.subscribe(expression, show),
                           "SubAddRqst")
        elif expression is not None and not any(
                sub.expression == expression for sub in conn.session_subscriptions.values()):
            await answered(reactor, options,
                           conn.subscribe(expression, lambda notification: None), "SubAddRqst")
    except RouterSilent:
        abort(conn)           # a polite close would wait for it again
        raise
    if options["ready"]:
        sys.stderr.write("ready\n")
        sys.stderr.flush()
    conn.disconnected.addBoth(lost)
    try:
        await done
    finally:
        if not conn._closed:
            await conn.close()      # after telling the proxy what was printed


#: How many notifications the tool lets a proxy have unacknowledged.
ACK_WINDOW_ASKED = 256


def main(argv=None):
    run(Options, body, argv)


if __name__ == "__main__":
    main()
