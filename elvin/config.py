"""The router's configuration file.

One setting per line, ``name = value``; ``#`` starts a comment; blank lines
are ignored; ``listen`` may be repeated. Connection options (section 7.5
names, e.g. ``Send-Queue.Max-Length = 1048576``) set the router's default
for every client. Any line the router does not understand stops it from
starting, with the file, the line number and the reason, rather than being
guessed at.
"""

import copy
import os
from typing import Tuple

from elvin.configvalues import (ConfigError, Setting, at_least, did_you_mean, duration,
                                duration_up_to, flag, text)
from elvin.configvalues import parse_integer as _integer
from elvin.discovery import settings as _discovery_settings
from elvin.endpoints import UnsupportedStackError, check_supported
from elvin.errors import echoed
from elvin.federation.config import FederationConfig
from elvin.protocols.keepalive import MAX_KEEPALIVE
from elvin.protocols.framing import DEFAULT_MAX_RECEIVE_MEMORY
from elvin.protocols.turns import DEFAULT_MAX_TURN_TIME
from elvin.core.options import CEILING_SUFFIX, HARD_CEILINGS, OPTIONS
from elvin.core.quench import DEFAULT_MAX_QUENCH_MEMORY
from elvin.core.admission import DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_HANDSHAKES
from elvin.core.router import (DEFAULT_MAX_CLIENT_SUBSCRIPTION_BYTES, DEFAULT_MAX_PATTERN_WORK,
                               DEFAULT_MAX_EVALUATION_BYTES, DEFAULT_MAX_CLIENT_QUENCHES,
                               DEFAULT_MAX_HEAVY_EVALUATION_BYTES,
                               DEFAULT_MAX_SUBSCRIPTION_MEMORY,
                               DEFAULT_MAX_CLIENT_SUBSCRIPTION_MEMORY,
                               DEFAULT_MAX_SUBSCRIPTION_TOKENS, MAX_PROTOCOL_ERRORS,
                               PROTOCOL_ERROR_WINDOW)
from elvin.uri import ElvinURI, InvalidURIError

__all__ = ["ConfigError", "RouterConfig", "SettingsConfig", "load", "parse", "listen_uri",
           "config_file", "status_uri"]


def listen_uri(value, key, where, config):
    """A ``listen`` setting (or another ``elvin:`` URI: ``redirect-to``,
    the proxy's ``upstream``): a URI whose version and stack are
    supported (as a listener's, for ``listen``)."""
    try:
        uri = ElvinURI(value)
    except InvalidURIError as e:
        raise ConfigError(f"{where}: bad {key} URI: {e}") from None
    try:
        check_supported(uri, listening=key.lower() == "listen")
    except UnsupportedStackError as e:
        raise ConfigError(f"{where}: {e}") from None
    return uri


def status_uri(value, key, where, config=None):
    """``http://host:port``, ``https://host:port``, or a bare port (then
    ``http://127.0.0.1:PORT``: loopback unless told otherwise)."""
    from urllib.parse import urlsplit
    if value.isdigit():
        value = f"http://127.0.0.1:{value}"
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None \
            or parts.path not in ("", "/"):
        raise ConfigError(f"{where}: {key} must be http://HOST:PORT or https://HOST:PORT, "
                          f"not {echoed(value)}")
    return (parts.scheme, parts.hostname, port)


def config_file(value, key, where, config):
    """A file named in a configuration, relative to the file's folder."""
    return config._path(value)


#: The router's own settings, in the order docs/router.md lists them (the
#: table there is generated from this: ``python -m elvin.config``).
ROUTER_SETTINGS = (
    Setting("listen", listen_uri, [], "`elvin://localhost:2917` (if none given)",
            "An `elvin:` URI to accept clients on; repeatable.", repeat=True),
    Setting("verbose", flag, False, "`no`",
            "Log every notification's attribute names. `yes`/`no`, `true`/`false`, "
            "`on`/`off`, `1`/`0`."),
    Setting("max-connections", at_least(1), 10_000, "`10000`",
            "Most client connections at once (≥ 1): TCP, TLS and HTTP-tunnel "
            "connections, logged in or not. Beyond it a new connection is closed as it "
            "is accepted, unless an idle one (no ConnRqst yet) can be closed to make "
            "room; a ConnRqst beyond this many sessions gets Nack 2006. Lowered at start "
            "to fit the open-file limit (`reserved-files`)."),
    Setting("max-subscriptions", at_least(1), 1_000_000, "`1000000`",
            "Most subscriptions in the whole router (≥ 1)."),
    Setting("max-subscription-tokens", at_least(0), DEFAULT_MAX_SUBSCRIPTION_TOKENS,
            "`16384`",
            "Most tokens (names, literals, operators, brackets, commas) in one "
            "subscription expression; a longer one is refused with Nack 2006 "
            "(`IMPL_LIMIT`) before it is parsed. Bounds the time one request can "
            "hold the router for (5-20 µs a token). `0`: no limit."),
    Setting("max-client-subscription-bytes", at_least(0),
            DEFAULT_MAX_CLIENT_SUBSCRIPTION_BYTES, "`2097152`",
            "Most UTF-8 bytes of subscription expressions one client may hold at once "
            "(its subscriptions' texts together); past it SubAddRqst and a longer "
            "SubModRqst are refused with Nack 2006 (`IMPL_LIMIT`). What they cost in "
            "memory is `max-client-subscription-memory`'s matter. `0`: no limit."),
    Setting("max-client-subscription-memory", at_least(0),
            DEFAULT_MAX_CLIENT_SUBSCRIPTION_MEMORY, "`167772160`",
            "Most memory one client's subscriptions may hold at once, estimated per "
            "subscription: 2,700 bytes, plus 150 for each attribute name it refers to "
            "and 30 for each byte of its text (it errs high: a placed subscription costs "
            "1.9-3 KB when tiny, about 30 times its text when long). Past it SubAddRqst "
            "and a costlier SubModRqst are refused with Nack 2006 (`IMPL_LIMIT`). 10,000 "
            "subscriptions of 200 bytes fit. `0`: no limit. See docs/reliability.md."),
    Setting("max-subscription-memory", at_least(0), DEFAULT_MAX_SUBSCRIPTION_MEMORY,
            "`4294967296`",
            "Most memory all clients' subscriptions together may hold, estimated as for "
            "`max-client-subscription-memory`; past it SubAddRqst and a costlier "
            "SubModRqst are refused with Nack 2006 (`IMPL_LIMIT`). `max-subscriptions` "
            "(1,000,000) of the Java load generator's shape fit. `0`: no limit."),
    Setting("max-pattern-work", at_least(0), DEFAULT_MAX_PATTERN_WORK, "`33554432`",
            "Most string-matching work one client's subscriptions may do for one "
            "notification: for each `regex`/`wildcard` test run, its RE2 program's "
            "instructions times the string's bytes (for `contains`, needles times "
            "bytes); about 50 ms at worst. A test past it is not run (the subscription "
            "does not match), and the client gets a DropWarn; counted in "
            "`elvin_pattern_work_refusals_total`. `0`: no limit."),
    Setting("max-evaluation-bytes", at_least(0), DEFAULT_MAX_EVALUATION_BYTES, "`65536`",
            "Most of one client's subscriptions one notification may have evaluated, "
            "counted as their expressions' bytes plus 16 each (evaluation costs up to "
            "about 30 ns a byte: about 2 ms); counted when a notification has more than "
            "16 candidates. Past it that client's other candidates are skipped and it "
            "gets a DropWarn; counted in `elvin_evaluation_refusals_total`. `0`: no "
            "limit."),
    Setting("max-heavy-evaluation-bytes", at_least(0), DEFAULT_MAX_HEAVY_EVALUATION_BYTES,
            "`131072`",
            "Most of the heavy clients' subscriptions one notification may have evaluated, "
            "all of them together (counted as for `max-evaluation-bytes`). A client "
            "is heavy once a notification's candidates of its own came to more than "
            "`max-evaluation-bytes`: its subscriptions are then looked at after "
            "everyone else's, each heavy client within its own budget and, in turn, "
            "all within this one, so several heavy clients cannot add up to a delay "
            "for the others. A heavy client left out gets a DropWarn; counted in "
            "`elvin_evaluation_refusals_total`. It is light again once its subscriptions "
            "together fit its budget, or after 10,000 notifications in a row within it "
            "(doubled each time it is heavy again). `0`: no limit (each heavy client "
            "within its own budget)."),
    Setting("max-client-quenches", at_least(0), DEFAULT_MAX_CLIENT_QUENCHES, "`256`",
            "Most quenches one client may hold; past it QnchAddRqst is refused with Nack "
            "2006 (`IMPL_LIMIT`). Each subscription added, changed or removed costs a "
            "check per quench on its names, so this bounds what one client's quenches "
            "add to everyone's subscription changes. `0`: only `Subscription.Max-Count`."),
    Setting("max-quench-memory", at_least(0), DEFAULT_MAX_QUENCH_MEMORY, "`67108864`",
            "Bytes all quenches together may hold, estimated per quench (about 80 bytes "
            "plus the string for each name, 400 for the quench); a QnchAddRqst or "
            "QnchModRqst past it is refused with Nack 2006 (`IMPL_LIMIT`). `0`: no limit. "
            "See docs/quench.md."),
    Setting("max-queue-memory", at_least(0), 512 * 1024 * 1024, "`536870912`",
            "Memory of all clients' send queues together: each queued packet's bytes "
            "plus 192 bytes of bookkeeping (288 under drop policy `largest`); over it, "
            "the largest queue sheds deliveries by its own drop policy (or is "
            "disconnected if it can shed nothing). `0` switches the cap off. See "
            "docs/reliability.md."),
    Setting("max-receive-memory", at_least(0), DEFAULT_MAX_RECEIVE_MEMORY, "`67108864`",
            "Bytes held in unfinished packets by all connections together (clients, "
            "HTTP tunnel request bodies, federation links); over it, the connections "
            "holding the most are reset until the total is a tenth under it. Keep it "
            "above the largest `Packet.Max-Length` clients may negotiate. `0` switches "
            "the cap off. See docs/reliability.md."),
    Setting("max-turn-time", at_least(0), DEFAULT_MAX_TURN_TIME, "`5`",
            "Milliseconds one connection's packets (a client's or a federation "
            "link's) may take in one reading turn. Past it the rest of what was read "
            "waits, reading from that connection pauses, and the router serves other "
            "connections and timers before going on with it, so a client sending "
            "costly requests delays others by this and one packet's cost, not by a "
            "whole 64 KiB read of requests; counted in `elvin_turns_sliced_total`. "
            "`0`: turns are never cut. See docs/reliability.md."),
    Setting("connect-timeout", duration(True), 30.0, "`30`",
            "Seconds a new channel may stay silent before sending ConnRqst or UNotify; "
            "then it is closed. On an HTTP tunnel listener, the seconds a connection has "
            "for the headers of its first request (then 408 and closed; any request "
            "must be whole within 60 s, plus 1 s per KiB of it: docs/reliability.md). "
            "`0` disables. Not negative."),
    Setting("client-keepalive", duration_up_to(MAX_KEEPALIVE), 120.0, "`120`",
            "Seconds a client's TCP or TLS connection may carry nothing either way "
            "before the router's kernel probes the client's host (TCP keepalive: 3 "
            "probes a quarter of this apart, at least 1 s); a host that does not answer (gone, "
            "powered off, its network cut) has its connection closed and its session "
            "ended, as any lost client's, instead of holding its subscriptions and a "
            "`max-connections` slot for ever. A live client answers from its kernel: "
            "nothing is asked of it. `0`: off. At most 32767 (the kernel's limit). See "
            "docs/reliability.md."),
    Setting("shutdown-grace", duration(True), 10.0, "`10`",
            "Seconds a stopping router (SIGTERM) gives its clients to read what is "
            "queued for them and its Disconn 1 (`stopService` waits for them); a "
            "client still open then is closed at once, what it did not get counted in "
            "`dropped_deliveries` and the exit's summary line. `0`: close at once. Not "
            "negative. See docs/reliability.md, \"Shutdown\"."),
    Setting("max-federation-connections", at_least(1), 64, "`64`",
            "Most incoming federation connections at once (≥ 1); more are closed as "
            "they are accepted."),
    Setting("reserved-files", at_least(0), 64, "`64`",
            "Open files kept for everything but accepted connections (log, "
            "configuration, trace files). At start the router raises its soft "
            "open-file limit to the hard limit, then lowers `max-connections` (and if "
            "need be `max-federation-connections`, `status-max-connections`), with a "
            "log line, until they, this, 16 more and one file per listener and "
            "outgoing federation link fit the limit. A value that leaves no room for "
            "one connection of each kind under the hard limit is refused, with its "
            "line."),
    Setting("crowded-idle-timeout", duration(False), 2.0, "`2`",
            "Once a listener's connections reach 90% of their cap, its idle ones (no "
            "ConnRqst yet; HTTP with no request in progress) are closed after this many "
            "seconds, oldest first, instead of after `connect-timeout` or the HTTP idle "
            "timeout (60 s between requests); at the cap the oldest idle one is closed to admit a new connection "
            "(docs/reliability.md). More than 0."),
    Setting("max-tls-handshakes", at_least(0), DEFAULT_MAX_HANDSHAKES, "`1024`",
            "Most connections in a TLS handshake at once, over every TLS listener "
            "(clients, federation, an https status page); one more closes the oldest "
            "still in its handshake. A connection costs 10-47 KB until its handshake "
            "ends, so this bounds what stalled handshakes hold. `0`: no cap. See "
            "docs/reliability.md."),
    Setting("tls-handshake-timeout", duration(True), DEFAULT_HANDSHAKE_TIMEOUT, "`10`",
            "Seconds a TLS connection has to finish its handshake; then it is closed. "
            "`0`: only `connect-timeout` applies. Not negative."),
    Setting("max-protocol-errors", at_least(0), MAX_PROTOCOL_ERRORS, "`50`",
            "A client making this many protocol errors (requests Nacked with a 1xxx "
            "code) within `protocol-error-window` seconds is disconnected with Disconn "
            "reason 4. Refused requests (2xxx) never count. `0`: never disconnect."),
    Setting("protocol-error-window", duration(False), PROTOCOL_ERROR_WINDOW, "`10`",
            "The sliding window, in seconds, for `max-protocol-errors` (more than 0)."),
    Setting("status-listen", status_uri, None, "none (off)",
            "Serve the status page, `/status.json` and Prometheus `/metrics` here: "
            "`http://127.0.0.1:9917`, `https://...` (with `tls-certificate`), or a bare "
            "port (on 127.0.0.1). Off "
            "unless set; give a loopback address unless the page should be reachable "
            "from elsewhere (docs/operations.md)."),
    Setting("status-token", text, None, "none",
            "A token the status listener requires (`Authorization: Bearer TOKEN`, or "
            "`?token=TOKEN` in the page's address)."),
    Setting("status-max-connections", at_least(1), 32, "`32`",
            "Most connections to the status listener at once (≥ 1); more are closed as "
            "they are accepted."),
    Setting("status-idle-timeout", duration(False), 10.0, "`10`",
            "Seconds a status listener connection may wait between requests before it "
            "is closed. More than 0."),
    Setting("redirect-to", listen_uri, None, "none",
            "The router clients are handed over to when this one is drained (SIGUSR1, "
            "or `drain = yes`): each gets Disconn reason 2 with this URI and "
            "reconnects there (docs/router.md, \"Draining\"). Without it, a router "
            "with `discovery` on drains to another router its discovery finds."),
    Setting("drain", flag, False, "`no`",
            "Start drained: redirect every client to `redirect-to` (or, without it and "
            "with `discovery`, to another router of the discovery scope)."),
    Setting("tls-certificate", config_file, None, "none",
            "The router's certificate (PEM, with chain; may hold the key too). Needed "
            "by any TLS listener."),
    Setting("tls-key", config_file, None, "none",
            "The router's private key (PEM), unless it is in `tls-certificate`."),
    Setting("tls-ca", config_file, None, "none",
            "CA certificates that client certificates must chain to; when set, clients "
            "are asked for a certificate."),
    Setting("require-authenticated", flag, False, "`no`",
            "Refuse TLS clients that present no certificate (needs `tls-ca`)."),
    Setting("http-session-timeout", duration(False), 60.0, "`60`",
            "Seconds an HTTP-tunnelled session may have no GET attached and send no "
            "POST before it is abandoned. More than 0."),
    Setting("http-poll-timeout", duration(False), 20.0, "`20`",
            "Seconds a tunnel GET response streams before the client must issue the "
            "next. More than 0."),
)

_BY_NAME = {setting.name: setting for setting in ROUTER_SETTINGS}


def reference_table():
    """The rows of docs/router.md's table for ROUTER_SETTINGS."""
    return "\n".join(setting.row() for setting in ROUTER_SETTINGS)


class SettingsConfig:
    """The values of a settings table (``SETTINGS``), starting from their
    defaults; files it names are relative to the configuration file's
    folder. The router's and the proxy's configurations are two of these."""

    SETTINGS: Tuple[Setting, ...] = ()

    def __init__(self):
        for setting in self.SETTINGS:
            setattr(self, setting.attr, copy.copy(setting.default))
        self.option_specs = dict(OPTIONS)
        self.source = None
        #: Setting name (lower case) -> [(where, value)] as the file gave
        #: them, so a problem found later can name the line.
        self.origins = {}

    def origin(self, name, port=None):
        """Where setting ``name`` was given ('file:line', '-l' for a
        command-line listen), or None; with ``port``, the line whose value
        names that port."""
        import re
        entries = self.origins.get(name.lower(), [])
        if port is not None:
            entries = [(where, value) for where, value in entries
                       if re.search(rf":{port}(?!\d)", value)] or entries
        return entries[-1][0] if entries else None

    def _path(self, value):
        """A file named in the configuration: relative to the file's folder."""
        source = self.source
        if os.path.isabs(value) or not source or source.startswith("<"):
            return value
        return os.path.join(os.path.dirname(source), value)


class RouterConfig(SettingsConfig):
    """Settings for one router, from defaults, a file and the command line."""

    SETTINGS = ROUTER_SETTINGS

    def __init__(self):
        super().__init__()
        # Router discovery, off by default (docs/discovery.md)
        _discovery_settings.init(self)
        # Federation (docs/federation.md)
        self.federation = FederationConfig()

    def set(self, name, value, where):
        """Apply one ``name = value`` setting; ``where`` is 'file:line'."""
        key = name.strip()
        value = value.strip()
        lowered = key.lower()
        self.origins.setdefault(lowered, []).append((where, value))
        if lowered.startswith("federation."):
            self.federation.set(key, value, where)
        elif lowered in _BY_NAME:
            setting = _BY_NAME[lowered]
            parsed = setting.parse(value, key, where, self)
            if setting.repeat:
                getattr(self, setting.attr).append(parsed)
            else:
                setattr(self, setting.attr, parsed)
        elif lowered == "discovery" or lowered.startswith("discovery-"):
            _discovery_settings.apply_setting(self, lowered, value, where)
        elif key.endswith(CEILING_SUFFIX) and key[:-len(CEILING_SUFFIX)] in HARD_CEILINGS:
            option = key[:-len(CEILING_SUFFIX)]
            spec = self.option_specs[option]
            hard = HARD_CEILINGS[option]
            number = _integer(value, key, where, spec.low)
            if number > hard:
                raise ConfigError(f"{where}: {key} must be at most {hard}, not {number}")
            if number < spec.default:
                raise ConfigError(f"{where}: {key} ({number}) is below {option}'s "
                                  f"default ({spec.default})")
            self.option_specs[option] = spec.with_ceiling(number)
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
                                      f"{', '.join(spec.choices)}, not {echoed(value)}")
                self.option_specs[key] = spec.with_default(value)
        else:
            known = ([setting.name for setting in ROUTER_SETTINGS]
                     + _discovery_settings.SETTINGS + sorted(OPTIONS))
            raise ConfigError(f"{where}: unknown setting {echoed(key)}{did_you_mean(key, known)} "
                              f"(known: {', '.join(known)}; also Federation.* settings, "
                              "docs/federation.md, and OPTION.Ceiling for a connection "
                              "option above)")

    def check(self, filename):
        """Checks across settings, once the whole file is read; an error
        names the line of the setting that needs another."""
        self.federation.check(filename, self.tls_ca, self._line_of)
        if self.drain and self.redirect_to is None and not self.discovery:
            raise ConfigError(f"{self.origin('drain') or filename}: drain = yes needs "
                              "redirect-to (where clients go), or discovery to find "
                              "another router")

    def _line_of(self, prefix):
        """Where the last setting whose name starts with ``prefix`` was given."""
        prefix = prefix.lower()
        entries = [where for name, given in self.origins.items() if name.startswith(prefix)
                   for where, _ in given]
        return max(entries, key=_line_number, default=None)



def _line_number(where):
    """The line of a 'file:line' place, for ordering places in one file."""
    tail = where.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


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
            raise ConfigError(f"{where}: expected 'name = value', got {echoed(raw.strip())}")
        name, value = line.split("=", 1)
        if not name.strip():
            raise ConfigError(f"{where}: missing setting name before '='")
        if not value.strip():
            raise ConfigError(f"{where}: missing value for {echoed(name.strip())}")
        config.set(name, value, where)
    config.check(filename)
    return config


def load(path, config=None):
    """Read and apply the configuration file at ``path`` (UTF-8; a byte
    order mark at its start, which Notepad writes, is no setting's name)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read configuration: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: {e}") from None
    return parse(text, path, config)


if __name__ == "__main__":
    print(reference_table())
