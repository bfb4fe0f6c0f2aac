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
"""

import re
import socket

from elvin.configvalues import ConfigError, parse_boolean, parse_integer
from elvin.errors import SubscriptionError
from elvin.federation.filters import parse_filter
from elvin.uri import InvalidURIError, parse_ewaf

__all__ = ["FederationConfig", "ClassConfig"]

_CLASSED = re.compile(r"^federation\.([a-z-]+(?:\.[a-z-]+)?)\[([^\]]+)\]$", re.IGNORECASE)


class ClassConfig:
    def __init__(self, name):
        self.name = name
        self.subscribe = "TRUE"
        self.provide = "TRUE"
        self.hosts = []
        self.connect = []
        self.require_authenticated = False
        self.where = None


class FederationConfig:
    def __init__(self):
        self.activated = None
        self.router_name = None
        self.listen = []
        self.classes = {}
        self.default_class = None
        self.keepalive = 30.0
        self.max_filter_nodes = 2000
        self.trace_directory = None
        self.trace_max_bytes = 64 * 1024 * 1024
        self.trace_max_seconds = 3600.0
        #: Avis's global form: peers whose host matches one of these
        #: patterns must authenticate, whatever their class.
        self.require_authenticated_hosts = []

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
        lowered = key.lower()
        match = _CLASSED.match(key)
        if match:
            setting, name = match.group(1).lower(), match.group(2).strip()
            fed_class = self._class(name, where)
            if setting == "connect":
                try:
                    fed_class.connect.append(parse_ewaf(value))
                except InvalidURIError as e:
                    raise ConfigError(f"{where}: bad federation URI: {e}") from None
            elif setting in ("subscribe", "provide"):
                try:
                    parse_filter(value)
                except SubscriptionError as e:
                    raise ConfigError(f"{where}: bad {key} filter at offset {e.offset}: {e}") from None
                setattr(fed_class, setting, value)
            elif setting == "apply-class":
                fed_class.hosts.extend(value.split())
            elif setting == "require-authenticated":
                fed_class.require_authenticated = parse_boolean(value, key, where)
            else:
                raise ConfigError(f"{where}: unknown federation setting {key!r}")
            return
        if lowered == "federation.activated":
            self.activated = parse_boolean(value, key, where)
        elif lowered == "federation.router-name":
            self.router_name = value
        elif lowered == "federation.listen":
            for item in value.split():
                try:
                    self.listen.append(parse_ewaf(item))
                except InvalidURIError as e:
                    raise ConfigError(f"{where}: bad federation URI: {e}") from None
        elif lowered == "federation.require-authenticated":
            self.require_authenticated_hosts.extend(value.split())
        elif lowered == "federation.default-class":
            self.default_class = value
        elif lowered in ("federation.keepalive-interval", "federation.keepalive"):
            try:
                self.keepalive = float(value)
            except ValueError:
                raise ConfigError(f"{where}: {key} must be seconds, not {value!r}") from None
        elif lowered == "federation.filter.max-nodes":
            self.max_filter_nodes = parse_integer(value, key, where, 1)
        elif lowered == "federation.trace-directory":
            self.trace_directory = value
        elif lowered == "federation.trace.max-bytes":
            self.trace_max_bytes = parse_integer(value, key, where, 1024)
        elif lowered == "federation.trace.max-seconds":
            try:
                self.trace_max_seconds = float(value)
            except ValueError:
                raise ConfigError(f"{where}: {key} must be seconds, not {value!r}") from None
        else:
            raise ConfigError(f"{where}: unknown federation setting {key!r} (known: "
                              "Federation.Activated, Router-Name, Listen, Connect[C], "
                              "Subscribe[C], Provide[C], Apply-Class[C], Default-Class, "
                              "Require-Authenticated[C], Require-Authenticated, "
                              "Keepalive-Interval, "
                              "Filter.Max-Nodes, Trace-Directory, Trace.Max-Bytes, "
                              "Trace.Max-Seconds)")

    def requires_authentication(self):
        """True when some link must be authenticated (a class or hosts)."""
        return bool(self.require_authenticated_hosts) or any(
            c.require_authenticated for c in self.classes.values())

    def check(self, source="<config>", tls_ca=None):
        """Cross-setting checks after the whole file is read."""
        if self.requires_authentication() and tls_ca is None:
            raise ConfigError(f"{source}: Federation.Require-Authenticated needs tls-ca: "
                              "the CA certificate(s) a federation peer's certificate "
                              "must chain to")
        if self.default_class is not None and self.default_class not in self.classes:
            raise ConfigError(f"{source}: Federation.Default-Class names unknown class "
                              f"{self.default_class!r}")
