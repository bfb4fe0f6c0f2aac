"""Which SubAST numbering a federation peer speaks, and filters safe for both.

Section 8.2.3.4 of the client spec numbers the arithmetic, bitwise and
decompose operators 20-33, 57 and 58; the Avis router (and, by its own
account, Mantara elvind) numbers them 24-30, 32-38, 61 and 62. EFP 1.0
has no way to say which one a router uses, and codes 24-30, 32 and 33 are
valid in both with different meanings, so a filter read the wrong way
loses notifications silently. A pull filter promises what is wanted, so
each direction is made safe on its own:

* **Sending.** To a peer not known to read the spec's numbering (any
  peer but one of our mesh routers), every part of a filter that uses one
  of those operators is widened to the attribute names it requires
  (``portable``): what is left means the same to every router, and EFP
  6.2.3 lets a pull filter be "more general". Once a peer's own filters
  showed which numbering it uses, filters go to it exactly, in that
  numbering (``wire_filter``).
* **Receiving.** A filter that uses such codes is read in each numbering
  in which it decodes and type-checks (``read_filter``). A code that only
  one numbering has settles the peer's numbering for the rest of the
  link; while two readings remain, the filter is their OR, so the peer
  gets what it meant, and perhaps more, never less.

Patterns and string functions are read otherwise by other routers
whatever their numbering (RE2 against Java's regular expressions, POSIX
classes, wildcard syntax, Unicode versions), so they are widened both
ways too for a peer not known to be ours: in what is sent
(``wire_filter``, ``DIALECT_KINDS``) and in what is received
(``received``, ``FOREIGN_KINDS``; a pattern we cannot compile is widened
before the filter is checked, ``tolerated``).
"""

from elvin.errors import SubscriptionError
from elvin.federation import filters
from elvin.protocols.xdr import (AVIS_AST_TYPECODES, SPEC_AST_TYPECODES, DecodeError,
                                 RawSubAST, decode_ast, encode_ast)
from elvin.subscription import checker, patterns
from elvin.subscription.ast import Kind, Node

__all__ = ["SPEC", "AVIS", "AMBIGUOUS_KINDS", "DIALECT_KINDS", "FOREIGN_KINDS", "uses_ambiguous",
           "portable", "read_filter", "received", "wire_filter", "tolerated"]

SPEC = "spec"
AVIS = "avis"
_TABLES = {SPEC: SPEC_AST_TYPECODES, AVIS: AVIS_AST_TYPECODES}

#: Kinds whose typecode differs between the two numberings.
AMBIGUOUS_KINDS = frozenset(kind for kind in Kind
                            if SPEC_AST_TYPECODES[kind] != AVIS_AST_TYPECODES[kind])

#: Kinds another router may read otherwise whatever its numbering, so
#: widened in a filter to any peer not known to be ours: patterns (RE2
#: syntax such as ``(?P<n>x)``, which the Avis router cannot compile and
#: then keeps its old filter; POSIX classes with their Unicode meaning;
#: wildcard syntax), and string predicates and functions (the Avis
#: router fails a whole filter when one meets a number or an opaque,
#: where the spec makes only that part bottom: ``begins-with(s, "x") ||
#: t == 1`` would stop ``{s: 1, t: 1}``).
DIALECT_KINDS = frozenset({Kind.FUNC_BEGINS_WITH, Kind.FUNC_CONTAINS, Kind.FUNC_ENDS_WITH,
                           Kind.FUNC_WILDCARD, Kind.FUNC_REGEX, Kind.FUNC_FOLD_CASE,
                           Kind.FUNC_DECOMPOSE, Kind.FUNC_DECOMPOSE_COMPAT})

#: Kinds a peer not known to be ours may mean more widely than we read
#: them, so widened in a filter received from one: patterns (Java reads
#: ``[[:alpha:]]`` as the set of ``:alph`` and matches ``":::"``; Avis's
#: wildcards have no classes, so ``*[Hh]ello*`` matches ``"[Hh]ello"``
#: there) and the Unicode functions (their tables' versions differ). The
#: other string predicates stay exact: another router's reading of them
#: is never wider than ours (Avis fails a whole filter where one meets a
#: number; we make only that predicate bottom).
FOREIGN_KINDS = DIALECT_KINDS - {Kind.FUNC_BEGINS_WITH, Kind.FUNC_CONTAINS,
                                 Kind.FUNC_ENDS_WITH}

#: Codes that only one numbering has: seeing one says which a peer uses.
_ONLY = {name: frozenset(table.values()) - frozenset(_TABLES[other].values())
         for name, table, other in ((SPEC, SPEC_AST_TYPECODES, AVIS),
                                    (AVIS, AVIS_AST_TYPECODES, SPEC))}


def uses_ambiguous(tree):
    """Does filter ``tree`` use an operator the numberings disagree on?"""
    return _uses(tree, AMBIGUOUS_KINDS)


def _uses(tree, marked):
    """Does ``tree`` hold a node of ``marked`` (a set of kinds, or a test
    of a node)?"""
    if tree is filters.TRUE or tree is filters.FALSE:
        return False
    if not callable(marked):
        kinds = marked
        return any(node.kind in kinds for node in tree.walk())
    return any(marked(node) for node in tree.walk())


def _foreign_pattern(node):
    """A regex or wildcard test with a pattern we cannot compile, which its
    sender's dialect may (a Java lookahead ``(?=a)``, a backreference)."""
    if node.kind == Kind.FUNC_REGEX:
        check = patterns.check_regex
    elif node.kind == Kind.FUNC_WILDCARD:
        check = patterns.check_wildcard
    else:
        return False
    for child in node.children[1:]:
        if child.kind == Kind.STRING:
            try:
                check(child.value)
            except patterns.PatternError:
                return True
    return False


def portable(tree, kinds=AMBIGUOUS_KINDS):
    """``tree`` (a filter, TRUE or FALSE) with each part that uses an
    operator of ``kinds`` (or a node ``kinds`` is true of) widened to the
    names it requires.
    ANDs and ORs are widened part by part (a part true for a notification
    stays true once widened, so they do too); anything else holding such
    an operator, a NOT included, becomes its required names as a whole."""
    if not _uses(tree, kinds):
        return tree
    if tree.kind == Kind.OR:
        return filters.union([portable(child, kinds) for child in tree.children])
    if tree.kind == Kind.AND:
        parts = []
        for child in tree.children:
            part = portable(child, kinds)
            if part is filters.FALSE:
                return filters.FALSE
            if part is not filters.TRUE and part not in parts:
                parts.append(part)
        if not parts:
            return filters.TRUE
        return parts[0] if len(parts) == 1 else Node(Kind.AND, None, parts)
    return filters.requirement(tree)


def wire_filter(tree, numbering, ours=False):
    """What to send for filter ``tree`` (after ``filters.to_wire``) to a
    peer using ``numbering`` (SPEC, AVIS, or None: not known); ``ours``: a
    peer known to be this router (a mesh router), which reads every part
    as we do. Any other peer gets ``DIALECT_KINDS`` widened first."""
    if ours:
        return tree
    tree = portable(tree, DIALECT_KINDS)
    if numbering == SPEC or not uses_ambiguous(tree):
        return tree
    if numbering == AVIS:
        return RawSubAST(encode_ast(tree, AVIS_AST_TYPECODES))
    return portable(tree)


def received(tree, ours=False):
    """A received filter (after ``read_filter``; TRUE or FALSE too) as it
    is served: exactly from a peer known to be ours (``ours``: its filter
    carried the mesh marker), otherwise with each part holding one of
    ``FOREIGN_KINDS`` widened to the names it requires. The peer filters
    what it gets again, so it gets what its dialect meant, and perhaps
    more, never less."""
    if ours or tree is filters.TRUE or tree is filters.FALSE or tree.kind == Kind.EMPTY:
        return tree
    return portable(tree, FOREIGN_KINDS)


def tolerated(tree):
    """``(tree, widened)``: a received filter with each part holding a
    pattern we cannot compile widened to the names it requires (a filter
    may be more general than asked, EFP 6.2.3: the peer filters what it
    gets again), and whether any was. Refusing the filter instead would
    leave the peer's old one in force, and its new subscribers without
    what they asked for."""
    if not _uses(tree, _foreign_pattern):
        return tree, False
    return portable(tree, _foreign_pattern), True


def read_filter(raw, numbering=None, widened=None):
    """``(tree, numbering, both)`` for a received pull filter: ``raw`` as
    the peer's numbering reads it (a ``Node`` from ``Reader.peer_ast`` is
    returned as it is), the numbering the link is now known to use
    (``numbering`` as given, or settled by this filter), and whether
    ``tree`` is the OR of two readings. Patterns we cannot compile are
    widened first (``tolerated``; ``widened()`` is called if any was).
    Raises SubscriptionError when no numbering gives a valid filter."""

    def tolerate(tree):
        if tree.kind == Kind.EMPTY:
            return tree
        tree, changed = tolerated(tree)
        if changed and widened is not None:
            widened()
        return tree
    if not isinstance(raw, RawSubAST):
        if raw.kind != Kind.EMPTY:
            raw = tolerate(raw)
            checker.check(raw)      # before ``received`` widens a malformed part away
        return raw, numbering, False
    readings = {}
    problems = []
    for name in (numbering,) if numbering else (SPEC, AVIS):
        try:
            tree = decode_ast(raw.data, _TABLES[name])
            if tree.kind != Kind.EMPTY:
                tree = tolerate(tree)
                checker.check(tree)
        except DecodeError as e:
            problems.append(_refusal(e, name))
        except SubscriptionError as e:
            problems.append(e)
        else:
            readings[name] = tree
    if not readings:
        raise problems[0]
    if len(readings) == 1:
        (name, tree), = readings.items()
        table = _TABLES[name]
        if numbering is None and any(table[node.kind] in _ONLY[name] for node in tree.walk()):
            numbering = name
        return tree, numbering, False
    spec_tree, avis_tree = readings[SPEC], readings[AVIS]
    if spec_tree == avis_tree:
        return spec_tree, numbering, False
    return Node(Kind.OR, None, [spec_tree, avis_tree]), numbering, True


def _refusal(error, numbering):
    """The Nack-able form of a SubAST that ``numbering`` cannot decode."""
    reason = error.reason
    if reason.startswith("SubAST nested deeper"):
        return SubscriptionError(2112, 0, f"pull filter: {reason}")
    return SubscriptionError(2101, 0, f"pull filter in the {numbering} numbering: {reason}")
