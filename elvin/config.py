"""The router's configuration file.

One setting per line, ``name = value``; ``#`` starts a comment; blank lines
are ignored; ``listen`` may be repeated. Connection options (section 7.5
names, e.g. ``Send-Queue.Max-Length = 1048576``) set the router's default
for every client. Any line the router does not understand stops it from
starting, with the file, the line number and the reason, rather than being
guessed at.
"""

import os

from elvin.configvalues import ConfigError
from elvin.configvalues import parse_boolean as _boolean
from elvin.configvalues import parse_integer as _integer
from elvin.configvalues import parse_seconds as _seconds
from elvin.discovery import settings as _discovery_settings
from elvin.endpoints import UnsupportedStackError, check_supported
from elvin.federation.config import FederationConfig
from elvin.options import OPTIONS, DropPolicy
from elvin.router import MAX_PROTOCOL_ERRORS, PROTOCOL_ERROR_WINDOW
from elvin.uri import ElvinURI, InvalidURIError

__all__ = ["ConfigError", "RouterConfig", "load", "parse"]


class RouterConfig:
    """Settings for one router, from defaults, a file and the command line."""

    def __init__(self):
        self.listen = []
        self.verbose = False
        self.max_connections = 10_000
        self.max_subscriptions = 1_000_000
        self.max_queue_memory = 512 * 1024 * 1024
        self.connect_timeout = 30.0
        self.max_protocol_errors = MAX_PROTOCOL_ERRORS
        self.protocol_error_window = PROTOCOL_ERROR_WINDOW
        self.option_specs = dict(OPTIONS)
        self.source = None
        # Router discovery, off by default (docs/discovery.md)
        _discovery_settings.init(self)
        # TLS listeners (docs/security.md) and the HTTP tunnel (docs/protocols.md)
        self.tls_certificate = None
        self.tls_key = None
        self.tls_ca = None
        self.require_authenticated = False
        self.http_session_timeout = 60.0
        self.http_poll_timeout = 20.0
        # Federation (docs/federation.md)
        self.federation = FederationConfig()

    def set(self, name, value, where):
        """Apply one ``name = value`` setting; ``where`` is 'file:line'."""
        key = name.strip()
        value = value.strip()
        lowered = key.lower()
        if lowered.startswith("federation."):
            self.federation.set(key, value, where)
        elif lowered == "listen":
            try:
                self.listen.append(ElvinURI(value))
            except InvalidURIError as e:
                raise ConfigError(f"{where}: bad listen URI: {e}") from None
            try:
                check_supported(self.listen[-1])
            except UnsupportedStackError as e:
                raise ConfigError(f"{where}: {e}") from None
        elif lowered == "verbose":
            self.verbose = _boolean(value, key, where)
        elif lowered == "max-connections":
            self.max_connections = _integer(value, key, where, 1)
        elif lowered == "max-subscriptions":
            self.max_subscriptions = _integer(value, key, where, 1)
        elif lowered == "max-queue-memory":
            self.max_queue_memory = _integer(value, key, where, 0)
        elif lowered == "connect-timeout":
            self.connect_timeout = _seconds(value, key, where, allow_zero=True)
        elif lowered == "max-protocol-errors":
            self.max_protocol_errors = _integer(value, key, where, 0)
        elif lowered == "protocol-error-window":
            self.protocol_error_window = _seconds(value, key, where, allow_zero=False)
        elif lowered in ("tls-certificate", "tls-key", "tls-ca"):
            setattr(self, lowered.replace("-", "_"), self._path(value))
        elif lowered == "require-authenticated":
            self.require_authenticated = _boolean(value, key, where)
        elif lowered in ("http-session-timeout", "http-poll-timeout"):
            setattr(self, lowered.replace("-", "_"),
                    _seconds(value, key, where, allow_zero=False))
        elif lowered == "discovery" or lowered.startswith("discovery-"):
            try:
                _discovery_settings.apply_setting(self, lowered, value)
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
        elif key in OPTIONS:
            spec = self.option_specs[key]
            if spec.kind is int:
                number = _integer(value, key, where, spec.low)
                if number > spec.high:
                    raise ConfigError(f"{where}: {key} must be at most {spec.high}, "
                                      f"not {number}")
                self.option_specs[key] = spec.with_default(number)
            else:
                if value not in spec.choices:
                    raise ConfigError(f"{where}: {key} must be one of "
                                      f"{', '.join(spec.choices)}, not {value!r}")
                self.option_specs[key] = spec.with_default(value)
        else:
            known = ["listen", "verbose", "max-connections", "max-subscriptions",
                     "max-queue-memory", "connect-timeout", "max-protocol-errors",
                     "protocol-error-window", "tls-certificate",
                     "tls-key", "tls-ca", "require-authenticated", "http-session-timeout",
                     "http-poll-timeout"] + _discovery_settings.SETTINGS + sorted(OPTIONS)
            raise ConfigError(f"{where}: unknown setting {key!r} "
                              f"(known: {', '.join(known)})")

    def _path(self, value):
        """A file named in the configuration: relative to the file's folder."""
        source = self.source
        if os.path.isabs(value) or not source or source.startswith("<"):
            return value
        return os.path.join(os.path.dirname(source), value)


def parse(text, filename="<config>", config=None):
    """Apply the settings in ``text`` to ``config`` (a new one by default)."""
    config = config or RouterConfig()
    config.source = filename
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{filename}:{number}"
        if "=" not in line:
            raise ConfigError(f"{where}: expected 'name = value', got {raw.strip()!r}")
        name, value = line.split("=", 1)
        if not name.strip():
            raise ConfigError(f"{where}: missing setting name before '='")
        if not value.strip():
            raise ConfigError(f"{where}: missing value for {name.strip()!r}")
        config.set(name, value, where)
    config.federation.check(filename, config.tls_ca)
    return config


def load(path, config=None):
    """Read and apply the configuration file at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read configuration: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: {e}") from None
    return parse(text, path, config)
