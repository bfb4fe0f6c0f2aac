"""Federation settings in the router's configuration file.

Names follow the Avis router's, so one federation can be described the
same way on both (docs/federation.md):

    Federation.Activated = yes
    Federation.Router-Name = hub.example.org
    Federation.Listen = ewaf://0.0.0.0:2916
    Federation.Connect[Branch] = ewaf://branch.example.org:2916
    Federation.Subscribe[Branch] = TRUE            # import filter: what we accept
    Federation.Provide[Branch] = require(Alert)    # export filter: what we give
    Federation.Apply-Class[Branch] = *.example.org 10.1.*
    Federation.Default-Class = Branch

Both kinds of setting, the router-wide ones and those of a class
(``Name[Class]``), are declared in tables (``configvalues.Setting``), from
which the reader, the defaults and docs/federation.md's reference rows
come (``python -m elvin.federation.config`` prints the rows).
"""

import copy
import re
import socket

from elvin.configvalues import ConfigError, Setting, at_least, did_you_mean, duration, flag, text
from elvin.errors import SubscriptionError
from elvin.errors import echoed
from elvin.federation.filters import parse_filter
from elvin.federation.identity import domain_problem
from elvin.uri import (InvalidURIError, options_problem, parse_ewaf, stack_problem,
                       version_problem)

__all__ = ["FederationConfig", "ClassConfig", "FEDERATION_SETTINGS", "CLASS_SETTINGS",
           "reference_table"]

_CLASSED = re.compile(r"^federation\.([a-z-]+(?:\.[a-z-]+)?)\[([^\]]+)\]$", re.IGNORECASE)


def _words(value, key, where, config):
    return value.split()


def _router_name(value, key, where, config):
    """Our domain, held to what we accept from peers (identity.py)."""
    problem = domain_problem(value)
    if problem is not None:
        raise ConfigError(f"{where}: {key}: {problem}")
    return value


def _ewaf_uris(value, key, where, config):
    try:
        uris = [parse_ewaf(item) for item in value.split()]
    except InvalidURIError as e:
        raise ConfigError(f"{where}: bad federation URI: {e}") from None
    listening = key.lower() == "federation.listen"
    for uri in uris:
        problem = (version_problem(uri, listening) or stack_problem(uri)
                   or options_problem(uri))
        if problem is not None:
            raise ConfigError(f"{where}: {key}: {problem}")
    return uris


def _filter(value, key, where, config):
    try:
        parse_filter(value)
    except SubscriptionError as e:
        at = "" if "offset" in str(e) else f" at offset {e.offset}"   # said once
        raise ConfigError(f"{where}: bad {key} filter{at}: {e}") from None
    return value


def _setting(name, parse, default, shown, doc, repeat=False, target=None):
    return Setting(f"Federation.{name}", parse, default, shown, doc, repeat,
                   target or name.lower().replace("-", "_").replace(".", "_"))


#: Router-wide federation settings, in docs/federation.md's order.
FEDERATION_SETTINGS = (
    _setting("Activated", flag, None, "on when any Listen or Connect is given",
             "Switch federation on or off (`yes`/`no`)."),
    _setting("Router-Name", _router_name, None, "the host's FQDN",
             "This router's globally unique domain."),
    _setting("Listen", _ewaf_uris, [], "none",
             "Accept links on these `ewaf:` URIs (several per line; repeatable).",
             repeat=True),
    _setting("Default-Class", text, None, "none",
             "Class for accepted peers no `Apply-Class` pattern matches; without it "
             "they are refused."),
    _setting("Require-Authenticated", _words, [], "none",
             "Avis's form: peers whose address matches a pattern must be "
             "authenticated, whatever their class (needs `tls-ca`).", repeat=True,
             target="require_authenticated_hosts"),
    _setting("Keepalive-Interval", duration(True), 5.0, "`5`",
             "A link silent this many seconds is sent TestConn; one silent for twice "
             "as long is closed (and its peer's name may link again at once); `0` "
             "switches this off (`Federation.Keepalive` is accepted too).",
             target="keepalive"),
    _setting("Mesh", flag, True, "`yes`",
             "Federate over any connected graph (rings, meshes, redundant links): mesh "
             "routers agree on a spanning tree and drop duplicates (docs/federation.md, "
             "\"Any connected graph\"). `no`: plain EFP 1.0, links must form a tree."),
    _setting("Mesh.Interval", duration(False), 10.0, "`10`",
             "Seconds between a mesh router's adverts of its links; an advert not "
             "refreshed for three intervals is forgotten."),
    _setting("Mesh.Grace", duration(True), 1.0, "`1`",
             "Seconds a link that left the mesh's tree keeps carrying notifications, "
             "so the new path is ready before the old one stops."),
    _setting("Filter.Refresh-Interval", duration(True), 600.0, "`600`",
             "Pull filters are soft state: each link's filter is sent again in full "
             "about this often (each link at its own time, 0.75 to 1.25 intervals "
             "apart) even if unchanged, so a peer's copy that drifted is put right; "
             "`0` switches this off.", target="filter_refresh"),
    _setting("Filter.Wait", duration(True), 2.0, "`2`",
             "Most seconds a client's SubRply (a new or changed expression) waits for "
             "the peers to answer a pull filter that covers it, so that what is "
             "published at a peer once the client has its reply reaches it; past this "
             "the reply goes anyway (counted and logged). `0`: reply at once.",
             target="subscribe_wait"),
    _setting("Filter.Max-Nodes", at_least(1), 2000, "`2000`",
             "Generalise pull filters beyond this many nodes.",
             target="max_filter_nodes"),
    _setting("Trace-Directory", text, None, "none",
             "Write federation traces there (docs/traces.md)."),
    _setting("Trace.Max-Bytes", at_least(1024), 64 * 1024 * 1024, "`67108864` (64 MiB)",
             "Start a new trace file past this size."),
    _setting("Trace.Max-Seconds", duration(False), 3600.0, "`3600`",
             "Start a new trace file after this many seconds."),
)

#: Settings of one federation class ``C``, written ``Federation.Name[C]``.
CLASS_SETTINGS = (
    _setting("Connect", _ewaf_uris, [], "none",
             "Dial these peers, which belong to class C (repeatable).", repeat=True),
    _setting("Subscribe", _filter, "TRUE", "`TRUE`",
             "Import filter for class C: what we accept (`EXPR`, `TRUE` or `FALSE`)."),
    _setting("Provide", _filter, "TRUE", "`TRUE`",
             "Export filter for class C: what we send (`EXPR`, `TRUE` or `FALSE`)."),
    _setting("Apply-Class", _words, [], "none",
             "Peers whose address matches a pattern (`*`, `?` wildcards) are accepted "
             "into class C (repeatable).", repeat=True, target="hosts"),
    _setting("Require-Authenticated", flag, False, "`no`",
             "Links of class C must be authenticated (docs/federation.md); needs "
             "`tls-ca`."),
)

_GLOBAL = {s.name.lower(): s for s in FEDERATION_SETTINGS}
_GLOBAL["federation.keepalive"] = _GLOBAL["federation.keepalive-interval"]
_PER_CLASS = {s.name.lower()[len("federation."):]: s for s in CLASS_SETTINGS}


def _defaults(target, settings):
    for setting in settings:
        setattr(target, setting.attr, copy.copy(setting.default))


def _apply(target, setting, value, key, where):
    parsed = setting.parse(value, key, where, target)
    if setting.repeat:
        getattr(target, setting.attr).extend(parsed)
    else:
        setattr(target, setting.attr, parsed)


def reference_table():
    """docs/federation.md's rows: router-wide settings, then a class's."""
    rows = [s.row() for s in FEDERATION_SETTINGS]
    rows += [s.row().replace(f"`{s.name}`", f"`{s.name}[C]`", 1) for s in CLASS_SETTINGS]
    return "\n".join(rows)


class ClassConfig:
    """One federation class's settings, as read (filters kept as text)."""

    def __init__(self, name):
        self.name = name
        _defaults(self, CLASS_SETTINGS)
        self.where = None


class FederationConfig:
    """The router-wide federation settings and the classes named."""

    def __init__(self):
        _defaults(self, FEDERATION_SETTINGS)
        self.classes = {}

    @property
    def enabled(self):
        if self.activated is not None:
            return self.activated
        return bool(self.listen or any(c.connect for c in self.classes.values()))

    def domain(self):
        return self.router_name or f"{socket.getfqdn()}"

    def _class(self, name, where):
        fed_class = self.classes.get(name)
        if fed_class is None:
            fed_class = self.classes[name] = ClassConfig(name)
            fed_class.where = where
        return fed_class

    def set(self, key, value, where):
        match = _CLASSED.match(key)
        if match:
            setting = _PER_CLASS.get(match.group(1).lower())
            if setting is None:
                hint = did_you_mean(f"Federation.{match.group(1)}",
                                    [s.name for s in CLASS_SETTINGS])
                named = echoed(match.group(2), quote=False)
                hint = hint.replace("'?)", f"[{named}]'?)") if hint else ""
                raise ConfigError(f"{where}: unknown federation setting {echoed(key)}{hint} "
                                  f"(known for a class C: {_known(CLASS_SETTINGS, '[C]')})")
            _apply(self._class(match.group(2).strip(), where), setting, value, key, where)
            return
        setting = _GLOBAL.get(key.lower())
        if setting is None:
            hint = did_you_mean(key, [s.name for s in FEDERATION_SETTINGS])
            raise ConfigError(f"{where}: unknown federation setting {echoed(key)}{hint} (known: "
                              f"{_known(FEDERATION_SETTINGS)}, "
                              f"{_known(CLASS_SETTINGS, '[C]')})")
        _apply(self, setting, value, key, where)

    def requires_authentication(self):
        """True when some link must be authenticated (a class or hosts)."""
        return bool(self.require_authenticated_hosts) or any(
            c.require_authenticated for c in self.classes.values())

    def check(self, source="<config>", tls_ca=None, line_of=None):
        """Cross-setting checks after the whole file is read; ``line_of``
        (a setting name's start -> 'file:line', or None) names the line."""
        def where(prefix):
            return (line_of(prefix) if line_of is not None else None) or source
        if self.requires_authentication() and tls_ca is None:
            raise ConfigError(f"{where('Federation.Require-Authenticated')}: "
                              "Federation.Require-Authenticated needs tls-ca: "
                              "the CA certificate(s) a federation peer's certificate "
                              "must chain to")
        if self.default_class is not None and self.default_class not in self.classes:
            raise ConfigError(f"{where('Federation.Default-Class')}: Federation.Default-Class "
                              f"names unknown class {echoed(self.default_class)}")


def _known(settings, suffix=""):
    return ", ".join(s.name + suffix for s in settings)


if __name__ == "__main__":
    print(reference_table())
