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

from elvin.discovery.packets import GROUP, MAX_LOCALITY, PORT, check_scope
from elvin.uri import ElvinURI, InvalidURIError

__all__ = ["SETTINGS", "DEFAULTS", "apply_setting", "parse_group"]

SETTINGS = ["discovery", "discovery-scope", "discovery-default",
            "discovery-advertise", "discovery-interface", "discovery-ttl",
            "discovery-dns-sd", "discovery-group"]

#: attribute -> default value, as RouterConfig sets them
DEFAULTS = {
    "discovery": False,
    "discovery_scope": "",
    "discovery_default": True,
    "discovery_advertise": [],
    "discovery_interface": None,
    "discovery_ttl": 64,
    "discovery_dns_sd": True,
    "discovery_group": (GROUP, PORT),
}

_BOOLEANS = {"yes": True, "true": True, "on": True, "1": True,
             "no": False, "false": False, "off": False, "0": False}


def _boolean(name, value):
    try:
        return _BOOLEANS[value.lower()]
    except KeyError:
        raise ValueError(f"{name} must be yes or no, not {value!r}") from None


def _ipv4(name, value):
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{name} must be an IPv4 address (the interface's), "
                         f"not {value!r}") from None
    return str(address)


def parse_group(value, name="discovery-group"):
    """``"224.4.0.1:2917"`` (port optional) -> ``("224.4.0.1", 2917)``."""
    host, colon, port_text = value.partition(":")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"{name} must be an IPv4 multicast address[:port], "
                         f"not {value!r}") from None
    if not address.is_multicast:
        raise ValueError(f"{name}: {host} is not a multicast address")
    port = PORT
    if colon:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{name}: bad port {port_text!r} (1-65535)")
        port = int(port_text)
    return str(address), port


def apply_setting(config, name, value):
    """Apply one discovery setting (``name`` lower-cased) to ``config``."""
    if name == "discovery":
        config.discovery = _boolean(name, value)
    elif name == "discovery-scope":
        if value in ('""', "''"):
            value = ""
        try:
            config.discovery_scope = check_scope(value)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    elif name == "discovery-default":
        config.discovery_default = _boolean(name, value)
    elif name == "discovery-advertise":
        try:
            uri = ElvinURI(value)
        except InvalidURIError as e:
            raise ValueError(f"bad discovery-advertise URI: {e}") from None
        if not config.discovery_advertise:
            config.discovery_advertise = []
        config.discovery_advertise.append(uri)
    elif name == "discovery-interface":
        config.discovery_interface = _ipv4(name, value)
    elif name == "discovery-ttl":
        try:
            ttl = int(value, 10)
        except ValueError:
            raise ValueError(f"{name} must be an integer 0-{MAX_LOCALITY}, "
                             f"not {value!r}") from None
        if not 0 <= ttl <= MAX_LOCALITY:
            raise ValueError(f"{name} must be 0-{MAX_LOCALITY}, not {ttl}")
        config.discovery_ttl = ttl
    elif name == "discovery-dns-sd":
        config.discovery_dns_sd = _boolean(name, value)
    elif name == "discovery-group":
        config.discovery_group = parse_group(value, name)
    else:
        raise ValueError(f"unknown setting {name!r} (discovery settings: "
                         f"{', '.join(SETTINGS)})")


def init(config):
    """Give ``config`` every discovery attribute, at its default."""
    for attribute, default in DEFAULTS.items():
        setattr(config, attribute, list(default) if isinstance(default, list) else default)
