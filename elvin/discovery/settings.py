"""The router's discovery settings in the configuration file.

``elvin.config.RouterConfig`` hands every ``discovery`` / ``discovery-*``
line to ``apply_setting``; a bad value raises ValueError, which the
configuration reports with the file and line.  See docs/discovery.md.

    discovery = yes                    # off unless switched on
    discovery-scope = chat             # scope name (no ':'), default empty
    discovery-default = yes            # advertise as a default router
    discovery-advertise = URI          # repeatable; default: every listener
    discovery-interface = 192.0.2.2    # IPv4 address of the multicast interface
    discovery-ttl = 64                 # highest IP TTL (locality) used, 0-255
    discovery-dns-sd = yes             # also register _elvin._tcp.local.
    discovery-group = 224.4.0.1:2917   # ERDP group and port (testing only)
"""

from __future__ import annotations

import ipaddress

from elvin.configvalues import ConfigError, Setting, did_you_mean, flag
from elvin.errors import echoed
from elvin.discovery.packets import GROUP, MAX_LOCALITY, PORT, check_scope
from elvin.uri import ElvinURI, InvalidURIError

__all__ = ["DISCOVERY_SETTINGS", "SETTINGS", "DEFAULTS", "apply_setting", "init",
           "parse_group", "reference_table"]


def _scope(value, key, where, config):
    # Quotes around a scope (``""`` for the empty one, ``"chat"``) are
    # taken off, as a user who writes them means.
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    try:
        return check_scope(value)
    except ValueError as e:
        raise ConfigError(f"{where}: {key}: {e}") from None


def _advertise(value, key, where, config):
    try:
        return ElvinURI(value)
    except InvalidURIError as e:
        raise ConfigError(f"{where}: bad {key} URI: {e}") from None


def _interface(value, key, where, config):
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        raise ConfigError(f"{where}: {key} must be an IPv4 address (the interface's), "
                          f"not {echoed(value)}") from None


def _ttl(value, key, where, config):
    try:
        ttl = int(value, 10)
    except ValueError:
        raise ConfigError(f"{where}: {key} must be an integer 0-{MAX_LOCALITY}, "
                          f"not {echoed(value)}") from None
    if not 0 <= ttl <= MAX_LOCALITY:
        raise ConfigError(f"{where}: {key} must be 0-{MAX_LOCALITY}, not {ttl}")
    return ttl


def _group(value, key, where, config):
    try:
        return parse_group(value, key)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


#: The discovery settings (docs/discovery.md's table is generated from
#: this: ``python -m elvin.discovery.settings``).
DISCOVERY_SETTINGS = (
    Setting("discovery", flag, False, "`no`",
            "advertise this router (same as `--discovery`)"),
    Setting("discovery-scope", _scope, "", "empty",
            "the scope name advertised; must not contain `:`; write `\"\"` for empty "
            "(quotes around a scope are taken off)"),
    Setting("discovery-default", flag, True, "`yes`",
            "the *default* flag: clients with no scope use only routers that set it"),
    Setting("discovery-advertise", _advertise, [], "every `listen` URI",
            "a URI to advertise instead of the listeners; repeatable", repeat=True),
    Setting("discovery-interface", _interface, None, "the system's choice",
            "IPv4 address of the interface to send and receive multicast on (DNS-SD "
            "then binds there too)"),
    Setting("discovery-ttl", _ttl, 64, "`64`",
            "the highest IP TTL (ERDP *locality*) the router ever uses, 0–255: 0 keeps "
            "adverts on this host, 1 on the local link"),
    Setting("discovery-dns-sd", flag, True, "`yes`",
            "also register `_elvin._tcp.local.`"),
    Setting("discovery-group", _group, (GROUP, PORT), "`224.4.0.1:2917`",
            "the ERDP group and port — change only for tests or a private deployment; "
            "other Elvin software uses the default"),
)

_BY_NAME = {setting.name: setting for setting in DISCOVERY_SETTINGS}

SETTINGS = [setting.name for setting in DISCOVERY_SETTINGS]

#: attribute -> default value, as RouterConfig sets them
DEFAULTS = {setting.attr: setting.default for setting in DISCOVERY_SETTINGS}


def parse_group(value, name="discovery-group"):
    """``"224.4.0.1:2917"`` (port optional) -> ``("224.4.0.1", 2917)``."""
    host, colon, port_text = value.partition(":")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"{name} must be an IPv4 multicast address[:port], "
                         f"not {echoed(value)}") from None
    if not address.is_multicast:
        raise ValueError(f"{name}: {echoed(host, quote=False)} is not a multicast address")
    port = PORT
    if colon:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{name}: bad port {echoed(port_text)} (1-65535)")
        port = int(port_text)
    return str(address), port


def apply_setting(config, name, value, where="<config>"):
    """Apply one discovery setting (``name`` lower-cased) to ``config``;
    a bad value raises ConfigError (a ValueError) naming ``where``."""
    setting = _BY_NAME.get(name)
    if setting is None:
        raise ConfigError(f"{where}: unknown setting {echoed(name)}{did_you_mean(name, SETTINGS)} "
                          f"(discovery settings: "
                          f"{', '.join(SETTINGS)})")
    parsed = setting.parse(value, name, where, config)
    if setting.repeat:
        getattr(config, setting.attr).append(parsed)
    else:
        setattr(config, setting.attr, parsed)


def init(config):
    """Give ``config`` every discovery attribute, at its default."""
    for setting in DISCOVERY_SETTINGS:
        default = setting.default
        setattr(config, setting.attr, list(default) if isinstance(default, list) else default)


def reference_table():
    """The rows of docs/discovery.md's table of settings."""
    return "\n".join(setting.row() for setting in DISCOVERY_SETTINGS)


if __name__ == "__main__":
    print(reference_table())
