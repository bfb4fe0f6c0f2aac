"""What the command-line tools share: the -e option and running a reactor."""

import sys

from twisted.internet import defer, task
from twisted.python import usage

from elvin.errors import ElvinError
from elvin.uri import ElvinURI, InvalidURIError

DEFAULT_URI = "elvin://localhost:2917"


class ToolOptions(usage.Options):
    optParameters = [
        ["elvin", "e", DEFAULT_URI, "URI of the Elvin router to use."],
    ]

    def postOptions(self):
        try:
            self["uri"] = ElvinURI(self["elvin"])
        except InvalidURIError as e:
            raise usage.UsageError(str(e)) from None


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
        d = defer.ensureDeferred(body(reactor, options))

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
