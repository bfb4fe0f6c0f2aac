"""The Elvin client library (Deferred-based, on Twisted).

    d = elvin.client.connect("elvin://localhost:2917")
    conn = yield d
    sub = yield conn.subscribe('Group == "chat"', on_notification)
    conn.notify({"Group": "chat", "Message": "hello"})
    yield sub.modify('Group == "chat" || Group == "news"')
    yield sub.remove()
    yield conn.close()

Every request returns a Deferred that fires with the reply, or fails with
``NackError`` carrying the router's Nack code, message and arguments.
"""

import itertools

from twisted.internet import defer, error, protocol
from twisted.logger import Logger

from elvin.errors import ElvinError
from elvin.protocols import packets as P
from elvin.protocols.framing import FramedProtocol
from elvin.protocols.xdr import DecodeError
from elvin.uri import ElvinURI
from elvin.values import normalise

__all__ = ["connect", "unotify", "Connection", "ClientSubscription",
           "NackError", "ConnectionClosed", "Notification"]

DEFAULT_URI = "elvin://localhost:2917"


class NackError(ElvinError):
    """The router refused a request: ``code``, ``message``, ``nack_args``."""

    def __init__(self, code, message, args=()):
        super().__init__(code, f"{message} (Nack {code})" if message else f"Nack {code}", args)
        self.router_message = message


class ConnectionClosed(ElvinError):
    """The connection ended before a reply arrived (``reason`` says how)."""

    def __init__(self, message, reason=None, args=""):
        super().__init__(0, message)
        self.reason = reason
        self.disconn_args = args


class Notification(dict):
    """A delivered notification: the attributes, plus which subscriptions
    matched securely (``secure``) or insecurely (``insecure``)."""

    def __init__(self, attributes, secure=(), insecure=()):
        super().__init__(attributes)
        self.secure = tuple(secure)
        self.insecure = tuple(insecure)


class ClientSubscription:
    """A subscription registered with the router."""

    def __init__(self, connection, sub_id, expression, callback, accept_insecure):
        self.connection = connection
        self.id = sub_id
        self.expression = expression
        self.callback = callback
        self.accept_insecure = accept_insecure

    def modify(self, expression=None, accept_insecure=None, add_keys=None,
               del_keys=None):
        """Change the expression and/or insecure flag; Deferred fires with self."""
        return self.connection._modify(self, expression, accept_insecure,
                                       add_keys, del_keys)

    def remove(self):
        """Delete the subscription; Deferred fires when the router confirms."""
        return self.connection._remove(self)

    def __repr__(self):
        return f"<ClientSubscription {self.id} {self.expression!r}>"


class ElvinClientProtocol(FramedProtocol):
    """Frames, decodes and dispatches packets for one Connection."""

    log = Logger()

    def connectionMade(self):
        self.factory.connection._attached(self)

    def frameReceived(self, data):
        try:
            packet = P.decode(data)
        except DecodeError as e:
            self.log.warn("undecodable packet from router: {e}", e=e)
            self.transport.abortConnection()
            return
        self.factory.connection._packet(packet)

    def connectionLost(self, reason=None):
        super().connectionLost(reason)
        self.factory.connection._lost(reason)

    def send(self, packet):
        self.sendFrame(P.encode(packet))


class Connection:
    """A session with an Elvin router (made by ``connect``)."""

    log = Logger()

    def __init__(self, uri, reactor=None):
        if reactor is None:
            from twisted.internet import reactor
        self.uri = uri
        self.reactor = reactor
        self.protocol = None
        self.options = {}
        self.subscriptions = {}
        self._pending = {}
        self._xids = itertools.count(1)
        self._closed = False
        self._close_deferred = None
        self.on_disconnect = None
        self.on_dropwarn = None
        #: Called once per delivered notification, however many of this
        #: connection's subscriptions it matched (before their callbacks).
        self.on_notification = None
        self.dropwarns = 0
        self.disconnected = defer.Deferred()

    # -- protocol callbacks --------------------------------------------------

    def _attached(self, proto):
        self.protocol = proto

    def _packet(self, packet):
        kind = type(packet)
        if kind is P.NotifyDeliver:
            self._deliver(packet)
        elif kind is P.Nack:
            d = self._pending.pop(packet.xid, None)
            if d is not None:
                d.errback(NackError(packet.error, packet.message, packet.args))
        elif kind is P.Disconn:
            self._closed = True
            if self.on_disconnect is not None:
                self.on_disconnect(packet.reason, packet.args)
            self._fail_pending(ConnectionClosed(
                f"router disconnected us (reason {packet.reason}): {packet.args}",
                packet.reason, packet.args))
        elif kind is P.DropWarn:
            self.dropwarns += 1
            if self.on_dropwarn is not None:
                self.on_dropwarn()
        elif kind is P.TestConn:
            self.protocol.send(P.ConfConn())
        elif kind is P.ConfConn:
            d = self._pending.pop("testconn", None)
            if d is not None:
                d.callback(True)
        else:
            xid = getattr(packet, "xid", None)
            d = self._pending.pop(xid, None)
            if d is not None:
                d.callback(packet)

    def _deliver(self, packet):
        note = Notification(packet.attributes, packet.secure_matches,
                            packet.insecure_matches)
        if self.on_notification is not None:
            try:
                self.on_notification(note)
            except Exception:
                self.log.failure("on_notification raised")
        seen = set()
        for sub_id in itertools.chain(packet.secure_matches, packet.insecure_matches):
            sub = self.subscriptions.get(sub_id)
            if sub is None or sub_id in seen:
                continue
            seen.add(sub_id)
            try:
                sub.callback(note)
            except Exception:
                self.log.failure("subscription callback for {sub} raised", sub=sub)

    def _lost(self, reason):
        self._closed = True
        why = ""
        if hasattr(reason, "check") and not reason.check(error.ConnectionDone):
            why = f": {reason.getErrorMessage()}"  # e.g. a TLS verification failure
        self._fail_pending(ConnectionClosed(f"connection to the router was lost{why}"))
        if self._close_deferred is not None and not self._close_deferred.called:
            self._close_deferred.callback(None)
        if not self.disconnected.called:
            self.disconnected.callback(None)

    def _fail_pending(self, error):
        pending, self._pending = self._pending, {}
        for d in pending.values():
            d.errback(error)

    # -- requests ------------------------------------------------------------

    def _request(self, make_packet):
        if self._closed or self.protocol is None:
            return defer.fail(ConnectionClosed("connection is closed"))
        xid = next(self._xids)
        d = defer.Deferred()
        self._pending[xid] = d
        self.protocol.send(make_packet(xid))
        return d

    def _handshake(self, options, nfn_keys, sub_keys):
        d = self._request(lambda xid: P.ConnRqst(
            xid, 4, 0, dict(options or {}), nfn_keys or P.Keys.EMPTY,
            sub_keys or P.Keys.EMPTY))

        def connected(reply):
            self.options = dict(reply.options)
            return self
        return d.addCallback(connected)

    def subscribe(self, expression, callback, accept_insecure=True, keys=None):
        """Register ``expression``; ``callback(notification)`` for each match.

        Fires with a ClientSubscription, or fails with NackError (e.g. a
        parse error: ``code`` 2101-2112).
        """
        d = self._request(lambda xid: P.SubAddRqst(
            xid, expression, accept_insecure, keys or P.Keys.EMPTY))

        def added(reply):
            sub = ClientSubscription(self, reply.subscription_id, expression,
                                     callback, accept_insecure)
            self.subscriptions[sub.id] = sub
            return sub
        return d.addCallback(added)

    def _modify(self, sub, expression, accept_insecure, add_keys, del_keys):
        insecure = sub.accept_insecure if accept_insecure is None else accept_insecure
        d = self._request(lambda xid: P.SubModRqst(
            xid, sub.id, expression or "", insecure, add_keys or P.Keys.EMPTY,
            del_keys or P.Keys.EMPTY))

        def modified(reply):
            if expression:
                sub.expression = expression
            sub.accept_insecure = insecure
            if reply.subscription_id != sub.id:
                self.subscriptions.pop(sub.id, None)
                sub.id = reply.subscription_id
                self.subscriptions[sub.id] = sub
            return sub
        return d.addCallback(modified)

    def _remove(self, sub):
        d = self._request(lambda xid: P.SubDelRqst(xid, sub.id))

        def removed(reply):
            self.subscriptions.pop(sub.id, None)
            return None
        return d.addCallback(removed)

    def notify(self, attributes, deliver_insecure=True, keys=None):
        """Emit a notification (no reply comes back; errors are local)."""
        if self._closed or self.protocol is None:
            raise ConnectionClosed("connection is closed")
        attributes = normalise(attributes)
        if not attributes:
            raise ValueError("a notification needs at least one attribute")
        self.protocol.send(P.NotifyEmit(attributes, deliver_insecure,
                                        keys or P.Keys.EMPTY))

    def set_options(self, options):
        """Renegotiate connection options (QosRqst); fires with the reply table."""
        d = self._request(lambda xid: P.QosRqst(xid, dict(options)))

        def done(reply):
            self.options.update(reply.options)
            return dict(reply.options)
        return d.addCallback(done)

    def set_keys(self, add_nfn_keys=None, del_nfn_keys=None, add_sub_keys=None,
                 del_sub_keys=None):
        """Change the connection's keys (SecRqst)."""
        empty = P.Keys.EMPTY
        return self._request(lambda xid: P.SecRqst(
            xid, add_nfn_keys or empty, del_nfn_keys or empty,
            add_sub_keys or empty, del_sub_keys or empty)).addCallback(lambda _: None)

    def test_connection(self):
        """Send TestConn; fires True when the router answers ConfConn."""
        if self._closed or self.protocol is None:
            return defer.fail(ConnectionClosed("connection is closed"))
        d = defer.Deferred()
        self._pending["testconn"] = d
        self.protocol.send(P.TestConn())
        return d

    def close(self):
        """Disconnect politely (DisconnRqst, wait for DisconnRply)."""
        if self._close_deferred is not None:
            return self._close_deferred
        self._close_deferred = defer.Deferred()
        if self._closed or self.protocol is None:
            self._close_deferred.callback(None)
            return self._close_deferred
        d = self._request(lambda xid: P.DisconnRqst(xid))
        d.addErrback(lambda f: None)
        d.addCallback(lambda _: self.protocol.transport.loseConnection())
        self._closed = True
        return self._close_deferred


class _ClientFactory(protocol.Factory):
    protocol = ElvinClientProtocol

    def __init__(self, connection):
        self.connection = connection


def _endpoint(reactor, uri, tls=None):
    from elvin.endpoints import client_endpoint
    return client_endpoint(reactor, uri, **(tls or {}))


def _tls_args(tls, tls_ca, tls_certificate, tls_key, tls_hostname):
    return {"tls": tls, "tls_ca": tls_ca, "tls_certificate": tls_certificate,
            "tls_key": tls_key, "tls_hostname": tls_hostname}


@defer.inlineCallbacks
def connect(uri=None, options=None, reactor=None, nfn_keys=None,
            sub_keys=None, *, tls=None, tls_ca=None, tls_certificate=None,
            tls_key=None, tls_hostname=None, scope=None, discover=False,
            discoverer=None, discovery_timeout=10.0):
    """Connect to the router at ``uri``; fires with a Connection.

    ``options`` is a dict of connection options to request (section 7.5);
    the router's answer is in ``connection.options``.

    The URI's protocol stack picks the transport (docs/protocols.md). For
    TLS stacks (``secure``, ``ssl,none,xdr``, ``tcp,ssl,xdr``) the router's
    certificate is verified against ``tls_ca`` (PEM file path or bytes, an
    ``ssl.Certificate`` or any trust root; default: the platform's trust
    store) and must name ``tls_hostname`` (default: the URI's host).
    ``tls_certificate`` (PEM path with the key, or with ``tls_key``, or an
    ``ssl.PrivateCertificate``) is presented to routers that verify
    clients. ``tls`` takes ready-made client TLS options instead.

    Without a ``uri`` this connects to ``elvin://localhost:2917``, unless
    discovery is asked for -- ``discover=True``, a ``scope`` name, or a
    started ``elvin.discovery.Discoverer`` -- when a router is found by
    router discovery (ERDP multicast and DNS-SD, docs/discovery.md): with
    ``scope`` one of that scope, else a default router. Each usable URI
    is tried in turn for up to ``discovery_timeout`` seconds;
    ``connection.router`` is the router chosen.
    """
    if reactor is None:
        from twisted.internet import reactor
    if uri is None and (discover or scope is not None or discoverer is not None):
        from elvin.discovery.discoverer import connect_discovered
        connection = yield connect_discovered(
            scope, discoverer, discovery_timeout, reactor, options=options,
            nfn_keys=nfn_keys, sub_keys=sub_keys, tls=tls, tls_ca=tls_ca,
            tls_certificate=tls_certificate, tls_key=tls_key,
            tls_hostname=tls_hostname)
        return connection
    if uri is None:
        uri = DEFAULT_URI
    if not isinstance(uri, ElvinURI):
        uri = ElvinURI(uri)
    connection = Connection(uri, reactor)
    yield _endpoint(reactor, uri, _tls_args(tls, tls_ca, tls_certificate, tls_key,
                                            tls_hostname)).connect(
        _ClientFactory(connection))
    try:
        yield connection._handshake(options, nfn_keys, sub_keys)
    except Exception:
        if connection.protocol is not None and connection.protocol.transport:
            connection.protocol.transport.abortConnection()
        raise
    return connection


@defer.inlineCallbacks
def unotify(uri, attributes, deliver_insecure=True, keys=None, reactor=None, *,
            tls=None, tls_ca=None, tls_certificate=None, tls_key=None,
            tls_hostname=None):
    """Send one session-less notification (UNotify) and close the channel.

    Over ``udp,none,xdr`` it is one datagram, and nothing confirms that
    the router received it. TLS arguments as for ``connect``.
    """
    if reactor is None:
        from twisted.internet import reactor
    if not isinstance(uri, ElvinURI):
        uri = ElvinURI(uri)
    packet = P.UNotify(4, 0, normalise(attributes), deliver_insecure,
                       keys or P.Keys.EMPTY)
    if uri.transport == "udp":
        from elvin.endpoints import check_supported
        from elvin.protocols.udp import send_unotify
        yield send_unotify(reactor, check_supported(uri), packet)
        return
    connection = Connection(uri, reactor)
    proto = yield _endpoint(reactor, uri, _tls_args(
        tls, tls_ca, tls_certificate, tls_key, tls_hostname)).connect(
        _ClientFactory(connection))
    proto.send(packet)
    proto.transport.loseConnection()
    yield connection.disconnected
