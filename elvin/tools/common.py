"""What the command-line tools share: the -e option and running a reactor."""

import sys

from twisted.internet import defer, task
from twisted.python import usage

from elvin.errors import ElvinError
from elvin.uri import ElvinURI, InvalidURIError

DEFAULT_URI = "elvin://localhost:2917"


class ToolOptions(usage.Options):
    optParameters = [
        ["elvin", "e", None, "URI of the Elvin router to use (default: find a "
                             "router by discovery, else " + DEFAULT_URI + ")."],
        ["scope", None, None, "Without -e: discover a router of this scope "
                              "(no fallback to " + DEFAULT_URI + ")."],
        ["discovery-time", None, 1.5, "Without -e: seconds to look for a router.",
         float],
    ]

    def postOptions(self):
        try:
            # None: found by discovery when the tool runs (see _with_uri)
            self["uri"] = None if self["elvin"] is None else ElvinURI(self["elvin"])
        except InvalidURIError as e:
            raise usage.UsageError(str(e)) from None


async def _with_uri(reactor, options, body):
    """Run ``body``; first, if a tool got no -e, find its router by
    discovery (docs/discovery.md): a router of ``--scope``, or else a
    default router, else DEFAULT_URI."""
    if isinstance(options, ToolOptions) and options.get("uri") is None:
        from elvin.discovery.discoverer import resolve_uri
        options["uri"] = await resolve_uri(
            reactor, scope=options["scope"], timeout=options["discovery-time"],
            fallback=DEFAULT_URI)
    return await body(reactor, options)


def run(options_class, body, argv=None):
    """Parse options, run ``body(reactor, options)`` (a Deferred) and exit."""
    options = options_class()
    try:
        options.parseOptions(sys.argv[1:] if argv is None else argv)
    except usage.UsageError as e:
        prog = sys.argv[0].rsplit("/", 1)[-1]
        sys.stderr.write(f"{prog}: {e}\n{options}")
        sys.exit(2)
    status = {"code": 0}

    def main(reactor):
        d = defer.ensureDeferred(_with_uri(reactor, options, body))

        def failed(failure):
            error = failure.value
            if isinstance(error, (ElvinError, ValueError, OSError, ConnectionError)) or \
                    failure.check(Exception):
                sys.stderr.write(f"error: {error}\n")
            status["code"] = 1
        d.addErrback(failed)
        return d
    try:
        task.react(main)
    except SystemExit as e:
        if e.code not in (0, None) or status["code"]:
            sys.exit(status["code"] or e.code)
    sys.exit(status["code"])
