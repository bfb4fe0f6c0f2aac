"""TLS for the ``ssl,none,xdr`` (alias ``secure``) and ``tcp,ssl,xdr`` stacks.

Both stacks are the ordinary Elvin TCP framing and XDR packets inside a TLS
connection; they differ only in how the URI names them. Policy, on both
sides:

* TLS 1.2 is the lowest version offered or accepted.
* Router listeners send no TLS 1.3 session tickets (OpenSSL sends two by
  default; the MINA SSL filter inside Avis's Java client and router then
  stalls, docs/interop.md), and no TLS 1.2 tickets either: there is no
  session resumption. pyOpenSSL cannot set the number of tickets, so a
  listener's TLS is the standard library's ``ssl`` module (an
  ``SSLObject`` on memory BIOs) under Twisted's ``TLSMemoryBIOProtocol``;
  clients use pyOpenSSL through ``twisted.internet.ssl``.
* The router presents the certificate (and chain) in ``tls-certificate``
  with the key in ``tls-key`` (or in the certificate file itself).
* With ``tls-ca`` set the router asks every client for a certificate and
  refuses a client whose certificate does not chain to one of those CAs.
  A client that presents no certificate is still accepted unless
  ``require-authenticated = yes``, which needs ``tls-ca``.
* The client verifies the router's certificate against ``tls_ca`` (the
  platform's trust store when not given, which honours ``SSL_CERT_FILE``)
  and checks that it names the host of the URI (service_identity; IP
  addresses are matched against IP subjectAltNames); ``tls_hostname``
  checks another name, e.g. when connecting to an address.

Every problem with the files is a :class:`TLSConfigError` (a
``ConfigError``) naming the setting and the file.
"""

import os
import re
import ssl as stdssl
import tempfile

from OpenSSL import SSL, crypto
from twisted.internet import error, ssl
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator
from zope.interface import implementer

from elvin.configvalues import ConfigError

__all__ = ["TLSConfigError", "MINIMUM_VERSION", "load_certificates",
           "load_private_certificate", "server_options", "server_options_from_config",
           "client_options", "ServerTLSOptions", "failure_text", "looks_like_tls",
           "certificate_date_problem"]

#: The lowest TLS version either side will negotiate.
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2

_CERT_RE = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
_KEY_RE = re.compile(rb"-----BEGIN ((?:[A-Z]+ )?PRIVATE KEY)-----.+?-----END \1-----", re.S)


class TLSConfigError(ConfigError):
    """TLS settings are missing or name files that cannot be used;
    ``setting`` is the one to blame, so the router can add where it was
    given (file and line)."""

    def __init__(self, message, setting=None):
        super().__init__(message)
        self.setting = setting


def _read(source, setting):
    """PEM bytes from a path (str/PathLike) or the bytes themselves."""
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), "<PEM data>"
    path = os.fspath(source)
    try:
        with open(path, "rb") as f:
            return f.read(), path
    except OSError as e:
        raise TLSConfigError(f"{setting}: cannot read {path}: {e.strerror}",
                             setting) from None


def load_certificates(source, setting="tls-ca"):
    """Every certificate in a PEM file (or PEM bytes), as ssl.Certificate."""
    data, name = _read(source, setting)
    blocks = _CERT_RE.findall(data)
    if not blocks:
        raise TLSConfigError(f"{setting}: no PEM certificate in {name}", setting)
    try:
        return [ssl.Certificate.loadPEM(block) for block in blocks]
    except (crypto.Error, ValueError) as e:
        raise TLSConfigError(f"{setting}: bad certificate in {name}: "
                             f"{failure_text(e)}", setting) from None


def load_private_certificate(certificate, key=None, cert_setting="tls-certificate",
                             key_setting="tls-key"):
    """``(PrivateCertificate, [chain certificates])`` from PEM files or bytes.

    ``certificate`` holds the leaf certificate first, then any intermediate
    certificates; ``key`` holds its private key (unencrypted PEM) and
    defaults to ``certificate`` (one file with both). An encrypted key is
    refused, never prompted for.
    """
    certs = load_certificates(certificate, cert_setting)
    if key is None:
        key_data, key_name = _read(certificate, cert_setting)
    else:
        key_data, key_name = _read(key, key_setting)
    match = _KEY_RE.search(key_data)
    if match is None:
        hint = "" if key is not None else f" (set {key_setting} to the key file)"
        if key is None:
            key_setting = cert_setting
        raise TLSConfigError(f"{key_setting}: no unencrypted PEM private key in "
                             f"{key_name}{hint}", key_setting)
    block = match.group(0)
    try:
        if b"ENCRYPTED" in block.split(b"-----", 3)[1] or b"Proc-Type: 4,ENCRYPTED" in block:
            raise _Encrypted()
        # A passphrase callback that refuses: OpenSSL's own would prompt
        # on a terminal.
        pair = ssl.KeyPair(crypto.load_privatekey(crypto.FILETYPE_PEM, block,
                                                  passphrase=_refuse_passphrase))
    except _Encrypted:
        raise TLSConfigError(f"{key_setting}: the private key in {key_name} is encrypted, "
                             "and encrypted keys are not supported: give the router an "
                             "unencrypted copy that only it can read (openssl pkey -in "
                             "KEY -out PLAIN)") from None
    except (crypto.Error, ValueError, TypeError) as e:
        raise TLSConfigError(f"{key_setting}: cannot load the private key in "
                             f"{key_name}: {failure_text(e)}", key_setting) from None
    try:
        leaf = ssl.PrivateCertificate.fromCertificateAndKeyPair(certs[0], pair)
    except error.VerifyError:
        raise TLSConfigError(f"{key_setting}: the private key in {key_name} does not "
                             f"match the certificate in {cert_setting}", key_setting) from None
    return leaf, certs[1:]


class _Encrypted(Exception):
    """A private key wants a passphrase."""


def _refuse_passphrase(*args):
    raise _Encrypted()


def server_options(certificate, key=None, ca=None, require_authenticated=False):
    """Server TLS options for a router listener (see the module policy): a
    :class:`ServerTLSOptions`, for ``twisted.internet.endpoints.wrapServerTLS``.

    ``certificate``, ``key`` and ``ca`` are PEM file paths or PEM bytes.
    """
    if require_authenticated and ca is None:
        raise TLSConfigError("require-authenticated = yes needs tls-ca: the CA "
                             "certificate(s) that client certificates must chain to",
                             "require-authenticated")
    leaf, chain = load_private_certificate(certificate, key)
    context = stdssl.SSLContext(stdssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = stdssl.TLSVersion.TLSv1_2
    context.num_tickets = 0
    context.options |= stdssl.OP_NO_TICKET
    try:
        _load_chain(context, certificate, key, leaf, chain)
    except (stdssl.SSLError, OSError) as e:
        raise TLSConfigError(f"tls-certificate: unusable certificate/key: {e}",
                             "tls-certificate") from None
    if ca is not None:
        cas = load_certificates(ca, "tls-ca")
        context.load_verify_locations(cadata="".join(c.dumpPEM().decode("ascii")
                                                     for c in cas))
        context.verify_mode = (stdssl.CERT_REQUIRED if require_authenticated
                               else stdssl.CERT_OPTIONAL)
    return ServerTLSOptions(context)


def _no_passphrase():
    raise TLSConfigError("tls-key: the private key is encrypted", "tls-key")


def _load_chain(context, certificate, key, leaf, chain):
    """Load the certificate chain and key that ``load_private_certificate``
    checked into the ``ssl.SSLContext``: from the files themselves, or (PEM
    bytes given) through a private temporary file."""
    paths = (str, os.PathLike)
    if isinstance(certificate, paths) and (key is None or isinstance(key, paths)):
        context.load_cert_chain(certificate, key, password=_no_passphrase)
        return
    pem = (leaf.privateKey.dump(crypto.FILETYPE_PEM) + leaf.dump(crypto.FILETYPE_PEM)
           + b"".join(c.dump(crypto.FILETYPE_PEM) for c in chain))
    folder = tempfile.mkdtemp(prefix="elvin-tls-")
    path = os.path.join(folder, "chain.pem")
    try:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(pem)
        context.load_cert_chain(path, password=_no_passphrase)
    finally:
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(folder)


@implementer(IOpenSSLServerConnectionCreator)
class ServerTLSOptions:
    """A router listener's TLS (``server_options``): each connection is an
    ``ssl.SSLObject`` of ``context`` behind the part of pyOpenSSL's
    ``Connection`` that Twisted's ``TLSMemoryBIOProtocol`` uses."""

    def __init__(self, context):
        #: The ``ssl.SSLContext`` every connection is made from.
        self.context = context

    def serverConnectionForTLS(self, protocol):
        # The connection's admission ticket (elvin.protocols.gate), if it
        # has one, is told when the handshake ends.
        return _ServerConnection(self.context, getattr(protocol, "admission", None))


def _openssl_error(e):
    """The pyOpenSSL exception Twisted expects for an ``ssl`` module one."""
    if isinstance(e, stdssl.SSLWantReadError):
        return SSL.WantReadError()
    if isinstance(e, stdssl.SSLWantWriteError):
        return SSL.WantWriteError()
    if isinstance(e, stdssl.SSLZeroReturnError):
        return SSL.ZeroReturnError()
    if isinstance(e, stdssl.SSLEOFError):
        return SSL.SysCallError(-1, "Unexpected EOF")
    return SSL.Error([(e.library or "SSL routines", "", _ssl_reason(e))])


def _ssl_reason(e):
    """An ``ssl.SSLError`` in words: "certificate verify failed: unable to
    get local issuer certificate", not "[SSL: ...] ... (_ssl.c:1006)"."""
    text = str(e.args[1]) if len(e.args) > 1 else str(e)
    text = re.sub(r"^\[[A-Z0-9_: ]+\] ", "", text)
    text = re.sub(r" \(_ssl\.c:\d+\)$", "", text)
    return text or (e.reason or type(e).__name__).lower().replace("_", " ")


class _ServerConnection:
    """One server-side TLS connection on memory BIOs (see ServerTLSOptions)."""

    def __init__(self, context, admission=None):
        self._admission = admission
        self._incoming = stdssl.MemoryBIO()
        self._outgoing = stdssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._app_data = None

    def set_accept_state(self):
        pass                      # made server-side

    def set_app_data(self, data):
        self._app_data = data

    def get_app_data(self):
        return self._app_data

    def _call(self, method, *args):
        try:
            return method(*args)
        except stdssl.SSLError as e:
            raise _openssl_error(e) from e

    def do_handshake(self):
        self._call(self._tls.do_handshake)
        if self._admission is not None:
            self._admission.handshake_done()
            self._admission = None

    def recv(self, size):
        data = self._call(self._tls.read, size)
        if not data:
            # The peer's close_notify: ``ssl`` reads b"", pyOpenSSL raises.
            raise SSL.ZeroReturnError()
        return data

    read = recv

    def send(self, data):
        return self._call(self._tls.write, data)

    write = send

    def shutdown(self):
        """Send close_notify; True once the peer's has come too."""
        try:
            self._tls.unwrap()
        except stdssl.SSLWantReadError:
            return False
        except stdssl.SSLError as e:
            raise _openssl_error(e) from e
        return True

    def bio_write(self, data):
        return self._incoming.write(data)

    def bio_read(self, size):
        data = self._outgoing.read(size)
        if not data:
            raise SSL.WantReadError()
        return data

    def bio_shutdown(self):
        self._incoming.write_eof()

    def get_peer_certificate(self):
        der = self._tls.getpeercert(binary_form=True)
        return crypto.load_certificate(crypto.FILETYPE_ASN1, der) if der else None

    def get_protocol_version_name(self):
        return self._tls.version() or "Unknown"

    def get_cipher_name(self):
        cipher = self._tls.cipher()
        return cipher[0] if cipher else None

    def get_alpn_proto_negotiated(self):
        return (self._tls.selected_alpn_protocol() or "").encode("ascii")


def server_options_from_config(config):
    """Server TLS options from a RouterConfig, or None when no certificate
    is configured (a TLS listener then refuses to start)."""
    if config.tls_certificate is None:
        for name, value in (("tls-key", config.tls_key), ("tls-ca", config.tls_ca)):
            if value is not None:
                raise TLSConfigError(f"{name} is set but tls-certificate is not", name)
        if config.require_authenticated:
            raise TLSConfigError("require-authenticated = yes but tls-certificate "
                                 "is not set", "require-authenticated")
        return None
    return server_options(config.tls_certificate, config.tls_key, config.tls_ca,
                          config.require_authenticated)


def certificate_date_problem(certificate, now=None):
    """A sentence when the router's certificate (the first in
    ``certificate``, a PEM path or bytes) has expired or is not valid yet
    at ``now`` (an aware datetime, default now), else None: clients refuse
    it, but it loads."""
    import datetime
    leaf = load_certificates(certificate, "tls-certificate")[0].original.to_cryptography()
    now = now or datetime.datetime.now(datetime.timezone.utc)
    name = certificate if isinstance(certificate, (str, os.PathLike)) else "<PEM data>"
    if leaf.not_valid_after_utc < now:
        when = f"expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC"
    elif leaf.not_valid_before_utc > now:
        when = f"is not valid until {leaf.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC"
    else:
        return None
    return (f"tls-certificate: the certificate in {os.fspath(name)} {when}: TLS clients "
            "and federation peers will refuse it")


def _trust_root(ca):
    if ca is None:
        return ssl.platformTrust()
    if isinstance(ca, (str, bytes, bytearray, os.PathLike)):
        return ssl.trustRootFromCertificates(load_certificates(ca, "tls_ca"))
    if isinstance(ca, ssl.Certificate):
        return ssl.trustRootFromCertificates([ca])
    if isinstance(ca, (list, tuple)):
        return ssl.trustRootFromCertificates(list(ca))
    return ca  # a trust root already, e.g. ssl.platformTrust()


def client_options(hostname, ca=None, certificate=None, key=None):
    """TLS options for a client connecting to ``hostname``.

    ``ca``: a PEM path or bytes, an ``ssl.Certificate`` (or list of them),
    or any IOpenSSLTrustRoot (e.g. ``ssl.platformTrust()``); default: the
    platform trust store. ``certificate``: a PEM path or bytes (with the key
    unless ``key`` is given), or an ``ssl.PrivateCertificate``, to present
    to routers that verify clients. The router's certificate must name
    ``hostname``.
    """
    client_cert = None
    extra = {"raiseMinimumTo": MINIMUM_VERSION}
    if certificate is not None:
        if isinstance(certificate, ssl.PrivateCertificate):
            client_cert = certificate
        else:
            client_cert, chain = load_private_certificate(
                certificate, key, "tls_certificate", "tls_key")
            if chain:
                extra["extraCertChain"] = [c.original for c in chain]
    try:
        return ssl.optionsForClientTLS(hostname, _trust_root(ca), client_cert,
                                       extraCertificateOptions=extra)
    except UnicodeError:
        # Twisted checks names as IDNA 2008 does: ``router_1`` resolves,
        # but no certificate can be checked against it.
        raise ValueError(
            f"TLS to {hostname!r}: a certificate cannot be checked against that "
            "host name (not a valid internationalised domain name); give the name "
            "the router's certificate holds as tls_hostname") from None


def failure_text(value):
    """Why a TLS (or any) channel was lost, in words: pyOpenSSL's errors
    are lists of (library, function, reason) tuples, service_identity's a
    list of mismatches."""
    if isinstance(value, (SSL.Error, crypto.Error)) and not isinstance(value, SSL.SysCallError) \
            and value.args and isinstance(value.args[0], list) and value.args[0]:
        return "; ".join(str(entry[-1]) for entry in value.args[0])
    mismatches = getattr(value, "errors", None)
    if type(value).__name__ == "VerificationError" and mismatches:
        names = ", ".join(repr(_mismatched_name(m)) for m in mismatches)
        return f"certificate name mismatch: the certificate does not name {names}"
    return str(value) or type(value).__name__


def _mismatched_name(mismatch):
    wanted = getattr(mismatch, "mismatched_id", None)
    for field in ("hostname", "ip", "pattern"):
        name = getattr(wanted, field, None)
        if name is not None:
            return name.decode("ascii", "replace") if isinstance(name, bytes) else str(name)
    return str(wanted)


def looks_like_tls(first_bytes):
    """Do these first bytes of a stream begin a TLS record (a handshake or
    an alert, TLS 1.x)? A TLS client on a plain Elvin port sends them; read
    as an Elvin frame header they announce a length of hundreds of MB."""
    return (len(first_bytes) >= 2 and first_bytes[0] in (0x15, 0x16)
            and first_bytes[1] == 0x03)
