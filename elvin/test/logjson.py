"""What ``--log-format json`` keeps of a log event (tests' helpers)."""

import json
import string

from twisted.logger import eventAsJSON, globalLogPublisher


def log_events(test):
    """Every log event from now until ``test`` ends, as a list."""
    events = []
    globalLogPublisher.addObserver(events.append)
    test.addCleanup(globalLogPublisher.removeObserver, events.append)
    return events


def kept_fields(test, event):
    """The fields ``event``'s format names, as the JSON log keeps them;
    fails ``test`` if one could not be kept (an exception object is
    written as ``{"unpersistable": true}``)."""
    kept = json.loads(eventAsJSON(event))
    names = [name for _, name, _, _ in string.Formatter().parse(event["log_format"]) if name]
    for name in names:
        test.assertNotIn("unpersistable", json.dumps(kept[name]), name)
    return {name: kept[name] for name in names}
