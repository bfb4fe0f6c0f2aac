"""Bounded polling for asynchronous tests."""

from twisted.internet import defer, reactor


def wait_until(predicate, timeout=20.0, step=0.01):
    """A Deferred firing once ``predicate()`` is true; fails after ``timeout`` s."""
    d = defer.Deferred()
    deadline = reactor.seconds() + timeout

    def check():
        if predicate():
            d.callback(True)
        elif reactor.seconds() > deadline:
            d.errback(AssertionError(f"condition not met in {timeout} s"))
        else:
            reactor.callLater(step, check)
    check()
    return d
