"""The sans-IO modules do no I/O: they import no socket, event loop or
reactor, and read no clock of their own (clocks are injected).

Read from the source with ``ast``, function-local imports included. A
reference to ``time.monotonic`` (an injected clock's default) is allowed;
a call to it in the module is not. What is allowed beyond that is listed
in EXCEPTIONS with its reason, and an exception that no longer applies
fails the test, so the list stays true.
"""

import ast
import os

from twisted.trial import unittest

from elvin.test.places import REPO

#: Folders whose every module is sans-IO, and single sans-IO modules of
#: folders that also hold their Twisted or asyncio drivers.
SANS_IO_FOLDERS = ("elvin/core", "elvin/subscription", "elvin/clientcore")
SANS_IO_MODULES = (
    "elvin/federation/filters.py", "elvin/federation/identity.py",
    "elvin/federation/link.py", "elvin/federation/manager.py",
    "elvin/federation/mesh.py", "elvin/federation/packets.py",
    "elvin/discovery/packets.py", "elvin/discovery/cache.py",
    "elvin/discovery/solicitor.py", "elvin/discovery/advertiser.py",
    "elvin/discovery/settings.py",
    "elvin/proxy/core.py", "elvin/proxy/model.py", "elvin/proxy/joining.py",
    "elvin/proxy/requests.py", "elvin/proxy/relay.py", "elvin/proxy/delivery.py",
    "elvin/proxy/state.py",
)

#: Imported modules (and their submodules) that do I/O or own an event loop.
FORBIDDEN_IMPORTS = ("socket", "asyncio", "select", "selectors", "ssl", "subprocess",
                     "threading", "os", "urllib", "http", "twisted")
#: Parts of Twisted with no I/O of their own.
ALLOWED_TWISTED = ("twisted.internet.defer", "twisted.python.failure")
#: Clock reads: a call to any of these is a read of the machine's clock.
CLOCK_CALLS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"),
               ("time", "time_ns"), ("time", "monotonic_ns"), ("datetime", "now"),
               ("datetime", "utcnow"), ("date", "today")}

#: (module path, what) -> why it is allowed.
EXCEPTIONS = {
    ("elvin/core/router.py", "twisted.logger"):
        "Logger only hands events to the observers the application set up "
        "(twistd's log file, a test's list); each class's ``log`` is "
        "replaced per instance where a test wants the lines",
    ("elvin/federation/link.py", "twisted.logger"): "as for elvin/core/router.py",
    ("elvin/federation/manager.py", "twisted.logger"): "as for elvin/core/router.py",
    ("elvin/discovery/advertiser.py", "twisted.logger"): "as for elvin/core/router.py",
    ("elvin/proxy/core.py", "twisted.logger"): "as for elvin/core/router.py",
    ("elvin/proxy/state.py", "twisted.logger"): "as for elvin/core/router.py",
    ("elvin/federation/manager.py", "time.time()"):
        "the mesh epoch: a restarted router's adverts must supersede the "
        "ones it sent before, across processes, which a test Clock starting "
        "at 0 would not give",
    ("elvin/subscription/parser.py", "os"):
        "only under ``python -m elvin.subscription.parser``, which writes "
        "the shipped parsetab.py",
}


def sans_io_files():
    for folder in SANS_IO_FOLDERS:
        for name in sorted(os.listdir(os.path.join(REPO, folder))):
            if name.endswith(".py"):
                yield f"{folder}/{name}"
    yield from SANS_IO_MODULES


def _imported(node):
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level and node.module:
        return [f"{node.module}.{a.name}" for a in node.names]
    return []


def _forbidden(name):
    if name.startswith(ALLOWED_TWISTED):
        return False
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN_IMPORTS)


def io_in(path):
    """What in ``path`` does I/O: forbidden imports (the module named, or
    ``twisted.logger`` for ``from twisted.logger import Logger``) and
    clock calls (``time.time()``)."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        names = _imported(node)
        if names:
            bad = [n for n in names if _forbidden(n)]
            if bad:
                found.add(node.module if isinstance(node, ast.ImportFrom) else bad[0])
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and (node.func.value.id, node.func.attr) in CLOCK_CALLS):
            found.add(f"{node.func.value.id}.{node.func.attr}()")
    return found


class SansIOTests(unittest.TestCase):

    def test_sans_io_modules_do_no_io(self):
        found = {(path, what) for path in sans_io_files() for what in io_in(path)}
        self.assertEqual(sorted(found - set(EXCEPTIONS)), [],
                         "a sans-IO module does I/O or reads a clock: inject it")
        self.assertEqual(sorted(set(EXCEPTIONS) - found), [],
                         "an exception no longer applies: remove it from EXCEPTIONS")

    def test_the_check_sees_io(self):
        """The reader finds each kind of I/O it looks for."""
        source = ("import socket\nfrom twisted.internet import reactor\n"
                  "from twisted.internet.defer import Deferred\nimport time\n"
                  "CLOCK = time.monotonic\n"
                  "def f():\n    import asyncio\n    return time.time()\n")
        path = os.path.join(self.mktemp() + ".py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        self.assertEqual(io_in(os.path.abspath(path)),
                         {"socket", "twisted.internet", "asyncio", "time.time()"})

    def test_every_listed_module_exists(self):
        for path in SANS_IO_MODULES:
            self.assertTrue(os.path.exists(os.path.join(REPO, path)), path)
