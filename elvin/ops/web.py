"""The operations listener (docs/operations.md): the status page at ``/``,
its data at ``/status.json`` and Prometheus metrics at ``/metrics``, served
by twisted.web. Off unless ``status-listen`` is set; an optional token
(``status-token``) is required as ``Authorization: Bearer TOKEN`` or
``?token=TOKEN``."""

import hmac
import json
import time

from prometheus_client.twisted import MetricsResource
from twisted.logger import Logger
from twisted.web import resource, server

from elvin.ops.metrics import registry_for
from elvin.protocols.gate import AdmittedHTTPChannel
from elvin.ops.page import PAGE
from elvin.ops.status import snapshot

__all__ = ["StatusSite", "status_root"]


class _Guarded(resource.Resource):
    """Refuses (401) a request without the token, when there is one."""

    def __init__(self, inner, token):
        super().__init__()
        self.inner = inner
        self.token = token

    def getChildWithDefault(self, name, request):
        if self.token is not None and not _authorised(request, self.token):
            return resource.ErrorPage(401, "Unauthorized",
                                      "This router's status needs its token "
                                      "(Authorization: Bearer TOKEN, or ?token=TOKEN).")
        return self.inner.getChildWithDefault(name, request)

    def render(self, request):
        return self.getChildWithDefault(b"", request).render(request)


def _authorised(request, token):
    header = request.getHeader(b"authorization") or b""
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    given = header[7:] if header.lower().startswith("bearer ") else None
    if given is None:
        given = (request.args.get(b"token") or [b""])[0].decode("utf-8", "replace")
    return hmac.compare_digest(given.encode(), token.encode())


class _Page(resource.Resource):
    isLeaf = True

    def render_GET(self, request):
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        return PAGE.encode("utf-8")


class _Json(resource.Resource):
    """``/status.json``: ``source()`` as JSON. ``clients``: ``source``
    takes a limit, ``?clients=N``, to list at most N clients (those with
    the largest send queues and most drops), as the page asks."""

    isLeaf = True

    def __init__(self, source, clients=False):
        super().__init__()
        self.source = source
        self.clients = clients

    def render_GET(self, request):
        given = request.args.get(b"clients") if self.clients else None
        limit = None
        if given:
            text = given[0].decode("latin-1")
            if not (text.isascii() and text.isdigit()):
                request.setResponseCode(400)
                request.setHeader(b"content-type", b"text/plain; charset=utf-8")
                return (f"clients={text}: give the most clients to list, a whole number "
                        f"(0 or more), or leave it out for all\n").encode("utf-8")
            limit = int(text)
        status = self.source(limit) if self.clients else self.source()
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps(status).encode("utf-8")


class _Reload(resource.Resource):
    """``POST /reload``: re-read the configuration (only with a token)."""
    isLeaf = True

    def __init__(self, reload):
        super().__init__()
        self.reload = reload

    def render_POST(self, request):
        def done(result):
            applied, message = result
            request.setHeader(b"content-type", b"application/json")
            if not applied:
                request.setResponseCode(409)
            request.write(json.dumps({"applied": applied, "message": message}).encode())
            request.finish()
        self.reload().addCallback(done)
        return server.NOT_DONE_YET


def status_root(router, federation=None, listeners=(), domain=None, token=None,
                started=None, reload=None, discovery=None):
    """The resource tree for one router. ``federation``, ``listeners``,
    ``domain`` and ``discovery`` may each be a function returning it, read
    at every request: a reload changes the listeners, and a new federation
    a new manager and domain. ``reload``: served as ``POST /reload`` when
    there is a ``token``."""
    started = time.time() if started is None else started

    def now(value):
        return value() if callable(value) else value

    def source(clients_limit=None):
        return snapshot(router, now(federation), now(listeners), started, now(domain),
                        now(discovery), clients_limit)
    root = resource.Resource()
    root.putChild(b"", _Page())
    root.putChild(b"status.json", _Json(source, clients=True))
    # The metrics need the totals, not a row per client.
    root.putChild(b"metrics", MetricsResource(registry=registry_for(lambda: source(0))))
    if reload is not None and token is not None:
        root.putChild(b"reload", _Reload(reload))
    return _Guarded(root, token)


class StatusSite(server.Site):
    """A twisted.web Site that does not log every scrape, and tells the
    connection budget which of its connections serve a request."""

    protocol = AdmittedHTTPChannel
    noisy = False          # the line below says where it listens instead
    #: Where the page is served (set by whoever listens for it), for the log.
    url = None
    events = Logger()

    def startFactory(self):
        super().startFactory()
        if self.url is not None:
            self.events.info("status page at {url} (/status.json, /metrics)", url=self.url)

    def log(self, request):
        pass
