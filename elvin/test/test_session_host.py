"""``SessionHost`` (elvin.core.host) is what ``ClientSession``'s state
machine uses of its router, exactly, and both hosts have all of it.

The members a session uses are read from the source with ``ast``: every
``self.router.NAME`` (or ``NAME`` of a local bound to ``self.router``) in
the methods a proxy client runs, found by following ``self.method``
references from its own methods, its request handlers and the session's
public methods. A new use of the host in the shared state machine that
the interface does not declare fails here, and so does a host (the router
or the proxy) that lacks a declared member.
"""

import ast
import inspect
import textwrap

from twisted.trial import unittest

from elvin.core.host import SESSION_OVERRIDES, SessionHost
from elvin.core.router import ClientSession, Router
from elvin.proxy.core import ProxyClient, ProxyCore
from elvin.proxy.store import Store


def declared_members():
    """The names SessionHost declares: its attributes and its methods."""
    names = set(SessionHost.__annotations__)
    names.update(name for name, value in vars(SessionHost).items()
                 if inspect.isfunction(value) and not name.startswith("_"))
    return names


def _function(cls, name):
    value = inspect.getattr_static(cls, name, None)
    return value if inspect.isfunction(value) else None


def reached_functions(cls, base):
    """The functions instances of ``cls`` (a ``base`` subclass) can run:
    from the methods of the classes between them, the request handlers
    (``HANDLERS``) and ``base``'s public methods (what transports call),
    following every ``self.NAME`` that names a method of ``cls``."""
    todo = [name for klass in cls.__mro__[:cls.__mro__.index(base)]
            for name, value in vars(klass).items() if inspect.isfunction(value)]
    todo += [handler.__name__ for handler in cls.HANDLERS.values() if handler is not None]
    todo += [name for name, value in vars(base).items()
             if inspect.isfunction(value) and not name.startswith("_")]
    seen, reached = set(), []
    # The constructors run too, through super().__init__.
    todo += [f"{klass.__name__}.__init__" for klass in cls.__mro__[:cls.__mro__.index(base) + 1]]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        klass_name, _, method = name.rpartition(".")
        function = (_function(cls, name) if not klass_name else next(
            _function(k, method) for k in cls.__mro__ if k.__name__ == klass_name))
        if function is None:
            continue
        reached.append(function)
        for node in ast.walk(_tree(function)):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "self"):
                todo.append(node.attr)
    return reached


def _tree(function):
    return ast.parse(textwrap.dedent(inspect.getsource(function)))


def host_members_used(functions, attribute="router"):
    """The names read or called on ``self.<attribute>`` in ``functions``
    (directly, or on a local name bound to it either way round)."""
    used = set()
    for function in functions:
        tree = _tree(function)

        def is_host(node):
            return (isinstance(node, ast.Attribute) and node.attr == attribute
                    and isinstance(node.value, ast.Name) and node.value.id == "self")
        aliases = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and is_host(node.value) for target in node.targets
                   if isinstance(target, ast.Name)}
        # ``self.router = router``: the argument is the host too.
        aliases |= {node.value.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Name) and any(map(is_host, node.targets))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (
                    is_host(node.value) or (isinstance(node.value, ast.Name)
                                            and node.value.id in aliases)):
                used.add(node.attr)
    return used


class _Upstream:
    """An upstream that is never up (the host's members need no more)."""
    is_up = False


class SessionHostTests(unittest.TestCase):

    def test_the_proxy_client_uses_exactly_what_is_declared(self):
        used = host_members_used(reached_functions(ProxyClient, ClientSession))
        self.assertEqual(sorted(used), sorted(declared_members()))

    def test_the_proxy_client_replaces_exactly_the_declared_members(self):
        below = ProxyClient.__mro__[:ProxyClient.__mro__.index(ClientSession)]
        replaced = {name for klass in below for name in vars(klass)
                    if name in vars(ClientSession) and not name.startswith("__")}
        # A member renamed in ClientSession drops out of ``replaced`` (the
        # proxy's version would go unused) and fails this, as does a new
        # override nobody declared.
        self.assertEqual(replaced, set(SESSION_OVERRIDES))

    def test_each_replacement_takes_what_the_session_passes(self):
        # A replacement is called as the session's member is (the
        # transports pass notify_emit keywords, for one): it takes every
        # parameter, by the same name and kind.
        import inspect
        below = ProxyClient.__mro__[:ProxyClient.__mro__.index(ClientSession)]
        for name in SESSION_OVERRIDES:
            replacement = next(vars(k)[name] for k in below if name in vars(k))
            original = vars(ClientSession)[name]
            if not inspect.isfunction(original):
                continue                # a table (HANDLERS), not a call
            wanted = inspect.signature(original).parameters
            given = inspect.signature(replacement).parameters
            for parameter in wanted.values():
                self.assertIn(parameter.name, given, name)
                self.assertEqual(given[parameter.name].kind, parameter.kind,
                                 f"{name}({parameter.name})")

    def test_both_hosts_declare_the_interface(self):
        self.assertIn(SessionHost, Router.__mro__)
        self.assertIn(SessionHost, ProxyCore.__mro__)

    def test_both_hosts_have_every_member(self):
        store = Store(":memory:")
        self.addCleanup(store.close)
        for host in (Router(), ProxyCore(store, _Upstream())):
            missing = sorted(name for name in declared_members()
                             if not hasattr(host, name))
            self.assertEqual(missing, [], type(host).__name__)
            self.assertTrue(callable(host.new_options) and callable(host.session_closed))
            self.assertIsInstance(host.clock(), float)
            self.assertIsInstance(host.wall_clock(), float)

    def test_the_reader_sees_uses(self):
        """Uses through ``self.router`` and through a local bound to it
        are found, and methods are followed from handlers."""

        class Host(ClientSession):
            def _helper(self):
                router = self.router
                return router.stats, self.router.route

            def _handler(self, packet):
                self._helper()
        Host.HANDLERS = {object: Host._handler}
        functions = reached_functions(Host, ClientSession)
        self.assertIn(Host._helper, functions)
        used = host_members_used(functions)
        self.assertTrue({"stats", "route", "session_closed"} <= used, used)
