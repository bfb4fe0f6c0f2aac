"""The proxy's configuration file (``twistd elvin-proxy -c FILE``).

The same format as the router's (elvin.config): ``name = value`` lines,
``#`` comments, ``listen`` repeatable; an unknown or bad line stops the
proxy from starting with the file, the line and the reason. The reference
table in docs/proxy.md is generated from PROXY_SETTINGS
(``python -m elvin.proxy.config``).
"""

from typing import List, Optional, Tuple

from elvin.config import (ROUTER_SETTINGS, SettingsConfig, config_file, listen_uri, load, parse,
                          status_uri)
from elvin.configvalues import (ConfigError, Setting, at_least, did_you_mean, duration, flag,
                                text)
from elvin.endpoints import UDP, stack_kind
from elvin.errors import echoed
from elvin.uri import ElvinURI

__all__ = ["ProxyConfig", "PROXY_SETTINGS", "DEFAULT_LISTEN", "DEFAULT_UPSTREAM",
           "DEFAULT_UPSTREAM_PROBE", "DEFAULT_UPSTREAM_KEEPALIVE", "DEFAULT_UPSTREAM_TIMEOUT",
           "load_proxy_config",
           "parse_proxy_config", "ConfigError"]

DEFAULT_LISTEN = "elvin://localhost:2916"
DEFAULT_UPSTREAM = "elvin://localhost:2917"
#: Seconds between probes of an absent upstream router's port, and between
#: TestConn checks of a present one (also ``Upstream``'s own defaults).
DEFAULT_UPSTREAM_PROBE = 0.2
DEFAULT_UPSTREAM_KEEPALIVE = 30.0
#: Seconds a request to the upstream router waits for its answer: below
#: the client libraries' 10 s reply timeout, so that the proxy's Nack
#: reaches a client of ours before that client gives up by itself.
DEFAULT_UPSTREAM_TIMEOUT = 5.0


def _not_udp(uri, where, problem):
    """``uri``, unless it is UDP: then a ConfigError saying ``problem``."""
    if stack_kind(uri) == UDP:
        raise ConfigError(f"{where}: {problem}")
    return uri


def _upstream(value, key, where, config):
    if value == "discover":
        return None
    return _not_udp(listen_uri(value, key, where, config), where,
                    f"upstream {value}: the proxy subscribes upstream, which UDP cannot "
                    "carry (it only sends notifications); give the router's TCP, TLS or "
                    "HTTP URI")


def _stream_listen(value, key, where, config):
    return _not_udp(listen_uri(value, key, where, config), where,
                    "the proxy keeps sessions, which UDP cannot carry; listen on TCP, TLS "
                    "or HTTP")


#: Settings that mean for the proxy what they mean for the router.
_ROUTER = {setting.name: setting for setting in ROUTER_SETTINGS}

PROXY_SETTINGS = (
    Setting("listen", _stream_listen, [], f"`{DEFAULT_LISTEN}` (if none given)",
            "An `elvin:` URI to accept clients on (TCP, TLS or HTTP); repeatable.",
            repeat=True),
    Setting("upstream", _upstream, ElvinURI(DEFAULT_UPSTREAM), f"`{DEFAULT_UPSTREAM}`",
            "The router the proxy is a client of: an `elvin:` URI (TCP, TLS or HTTP; not "
            "UDP, which carries no subscription), or `discover` to find one by router "
            "discovery (see `upstream-scope`)."),
    Setting("upstream-scope", text, None, "none",
            "With `upstream = discover`: the discovery scope to find a router in "
            "(none: a default router)."),
    Setting("upstream-probe", duration(True), DEFAULT_UPSTREAM_PROBE, "`0.2`",
            "While the upstream router is away: seconds between probes of its port (a "
            "TCP connect, closed at once); the first that succeeds in an outage "
            "reconnects at once instead of after the back-off (at most 1 s). `0`: no "
            "probes."),
    Setting("upstream-discovery", flag, False, "`no`",
            "Also hear router discovery (ERDP multicast and DNS-SD, docs/discovery.md) "
            "and reconnect at once when the router advertises the `upstream` URI's host "
            "and port. Always on with `upstream = discover` (for a router of "
            "`upstream-scope`). Listens only; sends nothing."),
    Setting("upstream-tls-ca", config_file, None, "none",
            "CA certificates (PEM) that a TLS upstream router's certificate must chain "
            "to (default: the platform's trust store)."),
    Setting("upstream-keepalive", duration(True), DEFAULT_UPSTREAM_KEEPALIVE, "`30`",
            "Seconds between TestConn checks of the upstream connection; one unanswered "
            "for as long again drops and remakes it. `0`: no checks."),
    Setting("upstream-timeout", duration(True), DEFAULT_UPSTREAM_TIMEOUT, "`5`",
            "Seconds the proxy waits for the upstream router's answer to each request it "
            "sends (SubAddRqst, SubModRqst, SubDelRqst); then it gives up, the "
            "connection staying open: a client's request is refused (Nack 2006, "
            "IMPL_LIMIT) and nothing of it is kept, and a late answer is undone upstream "
            "(docs/proxy.md, \"An upstream that does not answer\"). Below the client "
            "libraries' 10 s, so that the Nack reaches their clients first. `0`: wait "
            "for ever."),
    Setting("database", config_file, "elvin-proxy.db", "`elvin-proxy.db`",
            "The SQLite file holding sessions and stored notifications (relative to "
            "the configuration file's folder; created if missing)."),
    Setting("database-key", config_file, None, "the database's name + `.key`",
            "The file of the key sealing security keys and secure-only notifications "
            "in the database (created, owner-only, if missing and the database holds "
            "nothing sealed). Keep it out of the database's backups."),
    Setting("max-connections", at_least(1), 10_000, "`10000`",
            "Most client connections at once, logged in or not. As on the router "
            "(docs/reliability.md, \"Open files\"), it is lowered at start to fit the "
            "open-file limit, a connection beyond it closes the oldest idle one (no "
            "ConnRqst yet) or is refused as it is accepted, and idle ones are closed "
            "after 2 s once 90% of it is in use; the status listener holds at most 32."),
    Setting("max-sessions", at_least(1), 10_000, "`10000`",
            "Most sessions the proxy keeps; a ConnRqst creating one more is refused "
            "(Nack 2006, IMPL_LIMIT)."),
    Setting("max-sessions-per-host", at_least(0), 1_000, "`1000`",
            "Most sessions the proxy keeps that the clients of one host (its address, "
            "whatever the port; as for password failures) created; a ConnRqst from that "
            "host creating one more is refused (Nack 2006, IMPL_LIMIT) until one of them "
            "is deleted or expires (`session-expiry`). `0`: no cap."),
    Setting("max-session-subscriptions", at_least(1), 1_000, "`1000`",
            "Most subscriptions in one session; one more is refused (Nack 2006)."),
    Setting("max-stored", at_least(1), 100_000, "`100000`",
            "Most notifications kept for one session; beyond it the oldest go first, "
            "counted in `Proxy.Dropped` for its next client, logged, and told to its "
            "connected clients by DropWarn where the gap is. What is written to an "
            "acknowledging client and not yet acknowledged is kept outside the cap."),
    Setting("max-stored-bytes", at_least(0), 0, "`0`",
            "Most bytes of notifications (their encoded attributes) kept for one "
            "session; beyond it the oldest go first, with DropWarn as for `max-stored`. "
            "`0`: no byte cap."),
    Setting("max-backlog", at_least(0), 10_000, "`10000`",
            "Most notifications from clients kept in memory while upstream is down "
            "(sent when it is back); beyond it the oldest are dropped and logged."),
    Setting("max-total-stored-bytes", at_least(0), 0, "`0`",
            "Most bytes of notifications kept for all sessions together; beyond it the "
            "oldest go first, counted as dropped by each session they were kept for "
            "(DropWarn as for `max-stored`; what is in flight to an acknowledging "
            "client is kept). `0`: no cap."),
    Setting("max-inflight", at_least(1), 1024, "`1024`",
            "Most notifications an acknowledging client (`Proxy.Ack-Window`) may have "
            "unacknowledged; it may ask for fewer."),
    Setting("session-expiry", duration(True), 30 * 86400.0, "`2592000` (30 days)",
            "Seconds a session may go without any client before it is deleted, with its "
            "subscriptions (upstream too) and what it kept. `0`: never."),
    Setting("sweep-interval", duration(False), 60.0, "`60`",
            "Seconds between sweeps deleting expired notifications (in steps of at most "
            "2,000, one per reactor turn) and expired sessions (expiry is also checked "
            "at every delivery: an expired notification is never delivered)."),
    Setting("status-listen", status_uri, None, "none (off)",
            "Serve the proxy's counters as `/status.json` and Prometheus `/metrics` "
            "here (http only): `http://127.0.0.1:9916`, or a bare port (on 127.0.0.1). "
            "Off unless set (docs/proxy.md, \"Operations\")."),
    Setting("status-token", text, None, "none",
            "A token the status listener requires (`Authorization: Bearer TOKEN`, or "
            "`?token=TOKEN`)."),
    _ROUTER["connect-timeout"],
    _ROUTER["client-keepalive"],
    _ROUTER["tls-certificate"],
    _ROUTER["tls-key"],
    _ROUTER["tls-ca"],
    _ROUTER["require-authenticated"],
    _ROUTER["http-session-timeout"],
    _ROUTER["http-poll-timeout"],
)

_BY_NAME = {setting.name: setting for setting in PROXY_SETTINGS}


class ProxyConfig(SettingsConfig):
    """Settings for one proxy, from defaults, a file and the command line:
    one attribute per setting (``upstream-probe`` is ``upstream_probe``),
    declared here so that the type checker knows each (test_proxy_tap holds
    the declarations to PROXY_SETTINGS)."""

    SETTINGS: Tuple[Setting, ...] = PROXY_SETTINGS

    listen: List[ElvinURI]
    upstream: Optional[ElvinURI]          # None: by discovery
    upstream_scope: Optional[str]
    upstream_probe: float
    upstream_discovery: bool
    upstream_tls_ca: Optional[str]
    upstream_keepalive: float
    upstream_timeout: float
    database: str
    database_key: Optional[str]
    max_connections: int
    max_sessions: int
    max_sessions_per_host: int
    max_session_subscriptions: int
    max_stored: int
    max_stored_bytes: int
    max_backlog: int
    max_total_stored_bytes: int
    max_inflight: int
    session_expiry: float
    sweep_interval: float
    status_listen: Optional[Tuple[str, str, int]]    # (scheme, host, port)
    status_token: Optional[str]
    connect_timeout: float
    client_keepalive: float
    tls_certificate: Optional[str]
    tls_key: Optional[str]
    tls_ca: Optional[str]
    require_authenticated: bool
    http_session_timeout: float
    http_poll_timeout: float

    def set(self, name, value, where):
        key = name.strip()
        setting = _BY_NAME.get(key.lower())
        if setting is None:
            names = [s.name for s in PROXY_SETTINGS]
            raise ConfigError(f"{where}: unknown setting {echoed(key)}{did_you_mean(key, names)} "
                              f"(known: {', '.join(names)})")
        self.origins.setdefault(setting.name, []).append((where, value.strip()))
        parsed = setting.parse(value.strip(), key, where, self)
        if setting.repeat:
            getattr(self, setting.attr).append(parsed)
        else:
            setattr(self, setting.attr, parsed)

    def check(self, filename):
        if self.upstream_scope is not None and self.upstream is not None:
            raise ConfigError(f"{filename}: upstream-scope needs upstream = discover")



def parse_proxy_config(text_, filename="<config>"):
    return parse(text_, filename, ProxyConfig())


def load_proxy_config(path):
    return load(path, ProxyConfig())


def reference_table():
    return "\n".join(setting.row() for setting in PROXY_SETTINGS)


if __name__ == "__main__":
    print(reference_table())
