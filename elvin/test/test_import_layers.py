"""The package's import graph has no cycles, and none is hidden behind a
function-local import; modules import only from their own layer or the
layers above it, counting what their packages' ``__init__``s import; every
module is in a declared layer, and the parts of one layer import nothing
from one another.

The graph is read from the source with ``ast``: an edge A -> B for every
``import elvin.B`` / ``from elvin.B import ...`` in A. Module-level edges
must form no cycle. A function-local import is how a cycle is usually
dodged, so the graph is also read with every function-local import added:
the local imports that then lie on a cycle are listed in KNOWN_CYCLES,
which may only shrink (an entry that no longer closes a cycle fails the
test too, so the list stays true).
"""

import ast
import functools
import os
import subprocess
import sys

from twisted.trial import unittest

from elvin.test.places import REPO

#: (importing module, imported module) for function-local imports that
#: still close a cycle. Empty: keep it so.
KNOWN_CYCLES = frozenset()


def _modules():
    root = os.path.join(REPO, "elvin")
    for directory, _, files in os.walk(root):
        if os.sep + "test" in directory[len(root):]:
            continue
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__"), path


def _target(node, module):
    """The elvin module(s) an import node names (package-relative resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("elvin")]
    if node.level:
        base = module.rsplit(".", node.level)[0] if node.level else module
        name = f"{base}.{node.module}" if node.module else base
    else:
        name = node.module or ""
    if not name.startswith("elvin"):
        return []
    # ``from elvin import client`` imports the submodule elvin.client.
    return [f"{name}.{a.name}" for a in node.names] or [name]


def import_graph():
    """({module: {imported}} at module level, [(module, imported)] local):
    read once per process, a fresh copy each call."""
    top, local = _read_import_graph()
    return {m: set(targets) for m, targets in top.items()}, list(local)


@functools.lru_cache(maxsize=None)
def _read_import_graph():
    modules = dict(_modules())
    top, local = {}, []
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        top[module] = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top[module].update(_known(_target(node, module), modules))
        # Imports are statements: only statement lists are walked, not
        # expressions (most of a tree).
        todo = [(node, False) for node in tree.body]
        while todo:
            node, in_function = todo.pop()
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if in_function:
                    local.extend((module, target)
                                 for target in _known(_target(node, module), modules))
                continue
            inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for field in _STATEMENT_LISTS:
                todo.extend((child, inside) for child in getattr(node, field, None) or ())
    return top, local


#: The fields of a node that hold statements (or except handlers and match
#: cases, which hold statements in their ``body``).
_STATEMENT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")


def _known(names, modules):
    """Map ``a.b.c`` to the deepest existing module (``from a.b import c``)."""
    found = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found


def _reaches(graph, start, goal):
    seen, todo = set(), [start]
    while todo:
        here = todo.pop()
        if here == goal:
            return True
        if here in seen:
            continue
        seen.add(here)
        todo.extend(graph.get(here, ()))
    return False


def _with_packages(graph):
    """Importing ``a.b.c`` first runs package ``a.b``'s ``__init__``, unless
    the importer is inside that package already (it is being initialised):
    add those edges, which is how ``xdr -> subscription.ast`` meets the
    ``subscription`` package's own imports."""
    full = {m: set(targets) for m, targets in graph.items()}
    for module, targets in graph.items():
        for target in targets:
            package = target.rpartition(".")[0]
            while package:
                if package in graph and not module.startswith(package + "."):
                    full[module].add(package)
                package = package.rpartition(".")[0]
    return full


class ImportLayerTests(unittest.TestCase):

    def test_module_level_imports_form_no_cycle(self):
        top, _ = import_graph()
        top = _with_packages(top)
        cycles = sorted(f"{m} -> {t}" for m, targets in top.items() for t in targets
                        if t != m and _reaches(top, t, m))
        self.assertEqual(cycles, [])

    def test_function_local_imports_hide_only_known_cycles(self):
        top, local = import_graph()
        full = {m: set(targets) for m, targets in top.items()}
        for m, t in local:
            full[m].add(t)
        full = _with_packages(full)
        hiding = {(m, t) for m, t in local if t != m and _reaches(full, t, m)}
        self.assertEqual(sorted(hiding - KNOWN_CYCLES), [],
                         "a function-local import now dodges a new cycle")
        self.assertEqual(sorted(KNOWN_CYCLES - hiding), [],
                         "a known cycle is gone: remove it from KNOWN_CYCLES")

    def test_layers_import_only_downwards(self):
        """docs/architecture.md's layers: a module imports (even inside a
        function) only from its own layer or the ones above it."""
        top, local = import_graph()
        rank = self._ranks(top)
        edges = {(m, t) for m, targets in top.items() for t in targets} | set(local)
        upward = sorted(f"{m} (layer {rank[m]}) imports {t} (layer {rank[t]})"
                        for m, t in edges if rank[t] > rank[m])
        self.assertEqual(upward, [])

    def test_package_inits_import_only_downwards(self):
        """Importing a module first runs its packages' ``__init__``s, so
        what they import at module level counts as the module's import:
        ``import elvin.values`` (layer 1) must not load the parser."""
        top, _ = import_graph()
        rank = self._ranks(top)
        upward = []
        for module in top:
            package = module.rpartition(".")[0]
            while package:
                upward.extend(f"{module} (layer {rank[module]}) runs {package}, which "
                              f"imports {t} (layer {rank[t]})"
                              for t in top.get(package, ()) if t != module
                              and rank[t] > rank[module])
                package = package.rpartition(".")[0]
        self.assertEqual(sorted(upward), [])

    def test_values_load_no_parser(self):
        """``import elvin.values`` loads neither PLY nor the parser (the
        ``elvin`` package resolves its names on first use), in a fresh
        interpreter."""
        code = ("import elvin.values, sys; "
                "assert 'ply' not in sys.modules "
                "and 'elvin.subscription.parser' not in sys.modules, "
                "sorted(m for m in sys.modules if m.startswith(('elvin', 'ply')))")
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_parts_of_a_layer_import_not_one_another(self):
        """Above layer 6 a layer is made of parts that stand side by side:
        the clients do not reach into federation, federation not into the
        clients, operations not into the configuration reader."""
        top, local = import_graph()
        part = {m: self._part(m) for m in top}
        edges = {(m, t) for m, targets in top.items() for t in targets} | set(local)
        across = sorted(f"{m} ({part[m][1]}) imports {t} ({part[t][1]})"
                        for m, t in edges
                        if part[m][0] == part[t][0] and part[m][1] != part[t][1])
        self.assertEqual(across, [])

    def test_every_module_has_a_declared_layer(self):
        """A new module is placed in docs/architecture.md's layers, not
        left in a bucket that nothing constrains."""
        top, _ = import_graph()
        self.assertEqual(sorted(m for m in top if self._part(m) is None), [])
        for names in LAYERS.values():
            for name in (n for part in names.values() for n in part):
                self.assertTrue(any(m == name.removesuffix(".*")
                                    or m.startswith(name[:-1]) for m in top)
                                if name.endswith(".*") else name in top,
                                f"the layers name no module {name}")

    def _part(self, module):
        """(layer, part) that declares ``module``: its own name first, else
        the deepest ``package.*`` that holds it."""
        best, depth = None, -1
        for number, parts in LAYERS.items():
            for part, names in parts.items():
                for name in names:
                    if name == module:
                        return number, part
                    package = name.removesuffix(".*")
                    if (name.endswith(".*") and package.count(".") > depth
                            and (module == package or module.startswith(package + "."))):
                        best, depth = (number, part), package.count(".")
        return best

    def _ranks(self, top):
        rank = {}
        for module in top:
            found = self._part(module)
            self.assertIsNotNone(found, f"{module} is in no layer")
            rank[module] = found[0]
        return rank


_S = "elvin.subscription."
#: docs/architecture.md's layers: {layer: {part: modules}}; ``pkg.*`` is a
#: package and everything in it, a module's own name overrides its
#: package's. A module imports from its own layer (its own part, above
#: layer 6) and the layers above it only.
LAYERS = {
    1: {"data": ["elvin", "elvin.values", "elvin.errors", "elvin.configvalues",
                 "elvin.uri", "elvin.lazy", "elvin.textformat", "elvin.data"]},
    2: {"language": ["elvin.subscription"] + [_S + m for m in (
        "kinds", "grammar", "lexer", "ast", "printer", "parser", "checker", "compiler",
        "analysis", "partial", "patterns", "posixclasses", "workbudget", "shapes", "parsetab")]},
    3: {"codec": ["elvin.protocols", "elvin.protocols.xdr", "elvin.protocols.packets"]},
    4: {"subscription": [_S + "expression"]},
    5: {"core": ["elvin.keys", "elvin.core.*"]},
    6: {"transports": ["elvin.protocols.*", "elvin.endpoints"]},
    7: {"client core": ["elvin.clientcore.*"],
        "discovery": ["elvin.discovery.*"],
        "federation": ["elvin.federation.*"]},
    8: {"clients": ["elvin.client.*", "elvin.aio", "elvin.sync"],
        "configuration": ["elvin.config"],
        "operations": ["elvin.ops.*"]},
    9: {"router service": ["elvin.tap", "elvin.tools.config_example", "elvin.tools.output"]},
    10: {"proxy": ["elvin.proxy.*"]},
    11: {"tools": ["elvin.tools.*"]},
}
