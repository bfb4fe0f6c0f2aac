"""What the command-line tools share: options, finding the router, running
a reactor, and ending well (Ctrl-C, a closed pipe, errors in one line)."""

import logging
import os
import signal
import sys

from twisted.internet import defer, task
from twisted.python import failure, usage

from elvin import __version__
from elvin.client import DEFAULT_CONNECT_TIMEOUT, RequestTimeout
from elvin.tools.output import (StdoutClosed, StdoutError, StdoutFailed,  # noqa: F401
                                print_and_exit, write)
from elvin.errors import echoed
from elvin.uri import ElvinURI, InvalidURIError

DEFAULT_URI = "elvin://localhost:2917"

#: Environment variable naming the router the tools use without -e.
URI_VARIABLE = "ELVIN_URI"


def default_uri():
    """The router tried first without -e: $ELVIN_URI, else DEFAULT_URI."""
    return os.environ.get(URI_VARIABLE) or DEFAULT_URI


class _NamedCoerce(usage.CoerceParameter):
    """A number option's bad value names the option (Twisted says only
    "Parameter type enforcement failed: invalid literal for int()")."""

    def dispatch(self, parameterName, value):
        if value is not None:
            try:
                self.coerce(value)
            except ValueError:
                kind = "a whole number" if self.coerce is int else "a number"
                raise usage.UsageError(f"--{parameterName} must be {kind}, "
                                       f"not {echoed(value)}") from None
        super().dispatch(parameterName, value)


class BaseOptions(usage.Options):
    """Help that names the program, --version that is elvin's, and number
    options whose bad values name them."""

    name = "elvin-tool"

    def __init__(self):
        super().__init__()
        for name, handler in self._dispatch.items():
            if isinstance(handler, usage.CoerceParameter):
                self._dispatch[name] = _NamedCoerce(self, handler.coerce)

    def getSynopsis(self):
        return f"Usage: {self.name} [options] {self.synopsis}".rstrip()

    def opt_version(self):
        """Print the version and exit."""
        print_and_exit(f"{self.name} (elvin) {__version__}", self.name)

    def opt_help(self):
        """Display this help and exit."""
        print_and_exit(str(self), self.name)


class ToolOptions(BaseOptions):
    """Options every tool that talks to a router takes."""

    #: Whether the tool can use a udp,none,xdr URI (elvin-notify -u only).
    takes_udp = False

    optFlags = [
        ["discover", None, "Without -e: find a router by discovery first, before "
                           "trying $ELVIN_URI or " + DEFAULT_URI + "."],
    ]
    optParameters = [
        ["elvin", "e", None, "URI of the Elvin router to use (default: $ELVIN_URI, or "
                             + DEFAULT_URI + " if a router answers there, else one "
                             "found by discovery)."],
        ["scope", None, None, "Without -e: discover a router of this scope only."],
        ["discovery-time", None, 1.5, "Without -e: seconds to look for a router.",
         float],
        ["timeout", "t", DEFAULT_CONNECT_TIMEOUT,
         "Seconds to wait for the router to accept and answer ConnRqst, and "
         "then for its answer to each request (a subscription, a quench, "
         "the round trip that confirms what was sent).", float],
    ]

    def postOptions(self):
        if not self["timeout"] > 0:
            raise usage.UsageError(f"--timeout must be more than 0 seconds, "
                                   f"not {self['timeout']:g}")
        # None: found when the tool runs (see _with_uri)
        self["uri"] = None
        if self["elvin"] is not None:
            self["uri"] = self.checked_uri(self["elvin"], "-e/--elvin")
        elif self["scope"] is None and os.environ.get(URI_VARIABLE):
            # Tried first when it runs: a bad one is told now, by its name.
            self.checked_uri(os.environ[URI_VARIABLE], f"${URI_VARIABLE} (in the environment)")

    def checked_uri(self, text, source):
        """The ElvinURI ``text`` names, given by ``source`` (the option or
        the environment variable), or a usage error saying what is wrong
        with it and where it came from."""
        from elvin.endpoints import UnsupportedStackError, check_supported
        try:
            uri = ElvinURI(text)
        except InvalidURIError as e:
            raise usage.UsageError(f"{source}: {e}{uri_hint(text)}") from None
        try:
            check_supported(uri)   # a usage error, like any bad URI
        except UnsupportedStackError as e:
            raise usage.UsageError(f"{source}: {e}") from None
        problem = self.uri_problem(uri)
        if problem is not None:
            raise usage.UsageError(f"{source}: {echoed(text, quote=False)} is a UDP URI, "
                                   f"which carries only session-less notifications{problem}")
        return uri

    def uri_problem(self, uri):
        """The end of the message for a URI this tool cannot use, or None."""
        if uri.transport == "udp" and not self.takes_udp:
            return (f" (elvin-notify -u); {self.name} needs a session: give a tcp, ssl "
                    "or http URI")
        return None


def uri_hint(text):
    """A suggestion for an -e value that is a host:port or a bare port
    rather than an elvin: URI ("" when there is none to make)."""
    if "://" in text or text.startswith("elvin:"):
        return ""
    if text.isdigit():
        return f" (did you mean elvin://localhost:{echoed(text, quote=False)}?)"
    host, _, port = text.rpartition(":")
    if host and port.isdigit():
        return f" (did you mean elvin://{echoed(text, quote=False)}?)"
    return ""


async def _answers(reactor, uri, timeout):
    """True when something accepts a TCP connection at ``uri`` in time."""
    from twisted.internet.endpoints import connectProtocol
    from twisted.internet.protocol import Protocol
    from elvin.endpoints import hostname_endpoint
    endpoint = hostname_endpoint(reactor, uri.host, uri.port, timeout=timeout)
    try:
        proto = await connectProtocol(endpoint, Protocol())
    except Exception:
        return False
    proto.transport.abortConnection()
    return True


async def find_router(reactor, options):
    """The router a tool without -e uses (README, "What the tools do
    without -e"): with --scope, one of that scope by discovery; otherwise
    $ELVIN_URI or elvin://localhost:2917 if a router answers there, else a
    router found by discovery, else that default again (so the error names
    it). --discover tries discovery first."""
    from elvin.discovery.discoverer import resolve_uri
    if options["scope"] is not None:
        return await resolve_uri(reactor, scope=options["scope"],
                                 timeout=options["discovery-time"])
    fallback = ElvinURI(default_uri())     # checked by ToolOptions.postOptions
    if not options["discover"] and await _answers(reactor, fallback, 1.0):
        return fallback
    return await resolve_uri(reactor, timeout=options["discovery-time"],
                             fallback=fallback)


class _Interrupt:
    """Ctrl-C (SIGINT) and SIGTERM: the first ends the tool politely (the
    reactor stops, so shutdown triggers close the session with
    DisconnRqst); later ones are ignored rather than raising from a
    reactor that is already stopping."""

    def __init__(self, reactor):
        self.reactor = reactor
        self.interrupted = False

    def install(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.handle)

    def handle(self, signum, frame):
        if self.interrupted:
            return
        self.interrupted = True
        self.reactor.callFromThread(self._stop)

    def _stop(self):
        if self.reactor.running:
            self.reactor.stop()


def close_politely(reactor, conn):
    """Close ``conn`` (DisconnRqst) unless it is closed: a Deferred firing
    once the router answers, or after 2 s (None if it was closed)."""
    if conn._closed:
        return None
    d = conn.close()
    d.addTimeout(2.0, reactor)
    d.addErrback(lambda _: None)
    return d


def closing(reactor, conn):
    """Close ``conn`` politely when the reactor is stopped."""
    reactor.addSystemEventTrigger("before", "shutdown", close_politely, reactor, conn)


class RouterSilent(Exception):
    """The router accepted the session but then did not answer a request
    within --timeout (it hangs: stopped, overloaded, or a network path that
    drops everything)."""


async def answered(reactor, options, d, what):
    """The result of request ``d`` (a Deferred), or RouterSilent naming the
    router and ``what`` was asked if no answer comes within --timeout: no
    wait of a tool is unbounded."""
    from elvin.clientcore.messages import shown
    uri, timeout = shown(options["uri"]), options["timeout"]

    def silent(result, after):
        return failure.Failure(RouterSilent(
            f"the router at {uri} did not answer within {after:g} s ({what})"))
    d.addTimeout(timeout, reactor, onTimeoutCancel=silent)
    try:
        return await d
    except RequestTimeout as e:   # the connection's own bound, the same --timeout
        raise RouterSilent(f"the router at {uri} did not answer within {e.seconds:g} s "
                           f"({what})") from None


def abort(conn):
    """Drop ``conn``'s channel at once: after an error a polite close to a
    router that may hang would only add its own wait."""
    protocol = conn.protocol
    if protocol is not None and protocol.transport is not None:
        protocol.transport.abortConnection()


def quiet_library_warnings(name):
    """The tools report what went wrong themselves, in one line: the
    client library's warnings (a lost session, notifications not
    confirmed) would repeat it on stderr. Errors of the library (a
    callback that raised) are still printed."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter(f"{name}: %(message)s"))
    logging.getLogger("elvin").addHandler(handler)
    return handler


async def _with_uri(reactor, options, body):
    """Run ``body`` once the router's URI is known."""
    if isinstance(options, ToolOptions) and options.get("uri") is None:
        options["uri"] = await find_router(reactor, options)
    return await body(reactor, options)


def ended_error(conn, uri):
    """Why ``conn``'s session ended, as the tools say it: the router's
    Disconn reason and text if it sent one (as elvin-subscribe says it),
    else that the connection was lost."""
    from elvin.client import ConnectionClosed
    reason = getattr(conn.close_reason, "reason", None)
    if reason is not None:
        message = conn.close_reason.disconn_args
        return ConnectionClosed(f"the router closed the connection (Disconn reason {reason}"
                                f"{': ' + message if message else ''})", reason, message)
    return ConnectionClosed(f"the connection to {uri} was lost")


def describe_error(error):
    """The one line a tool prints for ``error``: its text, or its type
    when it has none (an empty line would say nothing); advice given in
    the library's terms is given in the tools' (SSL_CERT_FILE, not tls_ca)."""
    from elvin.client import TLS_TRUST, TOOLS_TLS_TRUST
    return (str(error) or type(error).__name__).replace(TLS_TRUST, TOOLS_TLS_TRUST)


def parse_options(options_class, argv=None):
    """The tool's options from ``argv``; a usage error exits 2 with one
    line naming what was wrong and where the help is."""
    options = options_class()
    try:
        options.parseOptions(sys.argv[1:] if argv is None else argv)
    except usage.UsageError as e:
        sys.stderr.write(f"{options.name}: error: {e}\n"
                         f"(see {options.name} --help)\n")
        sys.exit(2)
    return options


def outcome(reactor, options, body, interrupted=lambda: False):
    """Run ``body(reactor, options)`` (a coroutine) once the router's URI is
    known: a Deferred firing with the tool's exit status, 0 on success, when
    stdout is closed and once ``interrupted()`` (Ctrl-C); 1, with one line
    on stderr, on any error (stdout failing too: a full disk)."""
    d = defer.ensureDeferred(_with_uri(reactor, options, body))

    def failed(failure):
        if interrupted() or failure.check(StdoutClosed, defer.CancelledError):
            return 0
        sys.stderr.write(f"{options.name}: error: {describe_error(failure.value)}\n")
        return 1
    return d.addCallbacks(lambda _: 0, failed)


def run(options_class, body, argv=None):
    """Parse options, run ``body(reactor, options)`` (a coroutine) and exit
    with its status (``outcome``); 2 for usage errors."""
    options = parse_options(options_class, argv)
    quiet_library_warnings(options.name)
    status = {"code": 0}

    def main(reactor):
        interrupt = _Interrupt(reactor)
        # After the reactor's own handlers are in place (it installs them as
        # it starts), so ours replace them.
        reactor.callWhenRunning(reactor.callLater, 0, interrupt.install)
        options["_reactor_interrupt"] = interrupt
        d = outcome(reactor, options, body, lambda: interrupt.interrupted)
        return d.addCallback(lambda code: status.update(code=code))
    try:
        task.react(main)
    except SystemExit as e:
        if e.code not in (0, None) or status["code"]:
            status["code"] = status["code"] or e.code
    # A further Ctrl-C while the interpreter exits (which restores default
    # handlers) would kill us by the signal: ignore it, we are ending.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status["code"])
