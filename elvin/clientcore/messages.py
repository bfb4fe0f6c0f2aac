"""The sentences every client flavour says when ``connect`` fails: one
builder, so the Twisted, asyncio and blocking clients word the same
failure the same way (the URI in its short form, what went wrong, what to
try). No Twisted here: each flavour sorts its own exception classes into
the ``kind`` that ``cannot_connect`` takes."""

from typing import Any, Optional

from elvin.uri import ElvinURI

__all__ = ["shown", "endpoint_text", "stack_hint", "cannot_connect", "handshake_lost",
           "handshake_timeout", "tls_failed", "unotify_lost", "unotify_timeout", "no_http_response", "http_refused", "TLS_TRUST", "TOOLS_TLS_TRUST"]


def handshake_timeout(uri: ElvinURI, timeout: float) -> str:
    """No ConnRply within ``timeout`` seconds."""
    return (f"no Elvin ConnRply from {shown(uri)} within {timeout:g} s: is this "
            f"an Elvin router?{stack_hint(uri)}")


def stack_hint(uri: ElvinURI) -> str:
    """What to try if ``uri``'s stack is the wrong one (TLS or not)."""
    if uri.is_secure:
        return (f" (if it is a plain listener, use elvin://{endpoint_text(uri)}"
                " rather than a TLS URI)")
    return (f" (if it is a TLS listener, use elvin:/secure/{endpoint_text(uri)})")


def shown(uri: ElvinURI) -> str:
    """``uri`` as a person would write it (the short form when it has one)."""
    if uri.protocol == ("tcp", "none", "xdr") and uri.version == (4, 0) and not uri.options:
        return f"elvin://{endpoint_text(uri)}"
    return str(uri)


def endpoint_text(uri: ElvinURI) -> str:
    host = f"[{uri.host}]" if ":" in uri.host else uri.host
    return f"{host}:{uri.port}"


def cannot_connect(uri: ElvinURI, error_value: BaseException, kind: Optional[str]) -> str:
    """A sentence for a failed TCP/TLS connect to ``uri``."""
    if kind == "refused":
        proxy = http_proxy(uri)
        if proxy is not None:
            return (f"{shown(uri)}: the HTTP proxy at {proxy} refused the connection: is "
                    "it running there? (check proxy-host and proxy-port)")
        return (f"{shown(uri)}: connection refused: is the router running there? (start "
                f"one with 'twistd -n elvin', or give another URI with -e)")
    if kind == "unresolved":
        return f"{shown(uri)}: cannot resolve host {uri.host!r}: check the host name"
    if kind == "timeout":
        return (f"{shown(uri)}: no answer to the TCP connect: is the host up, and the port "
                f"open (no firewall in between)?")
    reasons = getattr(error_value, "reasons", None)
    if reasons:
        # twisted.web's ResponseFailed and kin: a list of Failures, whose
        # text is their repr; say what they mean.
        detail = "; ".join(r.getErrorMessage() if hasattr(r, "getErrorMessage") else str(r)
                           for r in reasons)
        return no_http_response(uri, detail)
    return f"{shown(uri)}: cannot connect: {error_value or type(error_value).__name__}"


def no_http_response(uri: ElvinURI, detail: str) -> str:
    """The HTTP server at ``uri`` did not answer (``detail``: how)."""
    return (f"{shown(uri)}: no HTTP response ({detail}): is this an Elvin HTTP "
            f"tunnel listener?{_http_hint(uri)}")


def http_refused(uri: ElvinURI, status: str, body: str) -> str:
    """The HTTP server at ``uri`` answered the POST that opens a tunnel
    session with ``status`` (code and phrase) and ``body`` (one line)."""
    return (f"{shown(uri)}: the HTTP server refused to open a session ({status}"
            f"{': ' + body if body else ''}): is this an Elvin HTTP tunnel "
            f"listener?{_http_hint(uri)}")


def _http_hint(uri: ElvinURI) -> str:
    return (f" (if it is a plain listener, use elvin://{endpoint_text(uri)})"
            if uri.protocol[0] == "http" else "")


def http_proxy(uri: ElvinURI) -> Optional[str]:
    """``host:port`` of the HTTP proxy an HTTP-tunnel ``uri`` goes
    through (``proxy-host``, ``proxy-port``), else None."""
    host = uri.options.get("proxy-host") if uri.options else None
    if not host:
        return None
    return f"{host}:{uri.options.get('proxy-port') or 8080}"


#: The advice on trusting a router's certificate, in the library's terms;
#: the command-line tools say TOOLS_TLS_TRUST instead (they take no tls_ca).
TLS_TRUST = "does tls_ca trust its certificate"
TOOLS_TLS_TRUST = ("is its CA trusted (SSL_CERT_FILE=CA.pem before the command, "
                   "docs/security.md)")


def handshake_lost(uri: ElvinURI, problem: Optional[str], first_bytes: Optional[bytes],
                   closed: Any) -> str:
    """A sentence for a channel that ended before ConnRply."""
    if problem == "not_elvin":
        first = first_bytes or b""
        if first[:1] in (b"\x15", b"\x16") and first[1:2] == b"\x03":
            return (f"{shown(uri)} answered with TLS: it is a TLS listener, so use "
                    f"elvin:/secure/{endpoint_text(uri)}")
        return (f"{shown(uri)} answered with something that is not Elvin (it began "
                f"{first!r}): is this an Elvin router?{stack_hint(uri)}")
    if closed.reason is not None:
        return str(closed)  # the router sent Disconn: its own words
    text = str(closed)
    detail = text.split("was lost: ", 1)[1] if "was lost: " in text else ""
    if uri.is_secure and detail:
        return tls_failed(uri, detail)
    return (f"{shown(uri)} closed the connection before answering ConnRqst: is this an "
            f"Elvin router?{stack_hint(uri)}")


def unotify_lost(uri: ElvinURI, problem: Optional[str], first_bytes: Optional[bytes],
                 detail: str, sent: bool) -> str:
    """A sentence for a UNotify channel that ended before the client hung
    up (``sent``: after the UNotify was written): a failed TLS handshake,
    or a peer that answered or closed, as no Elvin router does."""
    if problem == "not_elvin":
        return handshake_lost(uri, problem, first_bytes, None)
    if uri.is_secure and detail:
        return tls_failed(uri, detail)
    when = "right after" if sent else "before"
    return (f"{shown(uri)} closed the connection {when} the UNotify: is this an Elvin "
            f"router?{stack_hint(uri)}")


def unotify_timeout(uri: ElvinURI, timeout: float) -> str:
    """A UNotify channel opened, but could not carry the UNotify within
    ``timeout`` seconds (its TLS handshake did not end)."""
    return (f"{shown(uri)} accepted the connection but did not finish the TLS handshake "
            f"within {timeout:g} s: is this an Elvin TLS listener?{stack_hint(uri)}")


def tls_failed(uri: ElvinURI, detail: str) -> str:
    """The TLS handshake with ``uri`` failed (``detail``: how)."""
    said = detail.lower()
    if "alert certificate required" in said:
        # The router refused us, not we it.
        return (f"TLS with {shown(uri)} failed ({detail}): the router asks for a client "
                f"certificate (tls_certificate)")
    if "alert unknown ca" in said or "alert bad certificate" in said:
        return (f"TLS with {shown(uri)} failed ({detail}): the router does not trust the "
                f"client certificate: is it from a CA in the router's tls-ca?")
    return (f"TLS with {shown(uri)} failed ({detail}): is it a TLS listener, "
            f"{TLS_TRUST}, and does the certificate name "
            f"{uri.host!r}?{stack_hint(uri)}")
