"""TLS for the ``ssl,none,xdr`` (alias ``secure``) and ``tcp,ssl,xdr`` stacks.

Both stacks are the ordinary Elvin TCP framing and XDR packets inside a TLS
connection (pyOpenSSL through ``twisted.internet.ssl``); they differ only in
how the URI names them. Policy, on both sides:

* TLS 1.2 is the lowest version offered or accepted.
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

from OpenSSL import SSL, crypto
from twisted.internet import error, ssl

from elvin.configvalues import ConfigError

__all__ = ["TLSConfigError", "MINIMUM_VERSION", "load_certificates",
           "load_private_certificate", "server_options", "server_options_from_config",
           "client_options"]

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
        raise TLSConfigError(f"{setting}: bad certificate in {name}: {e}", setting) from None


def load_private_certificate(certificate, key=None, cert_setting="tls-certificate",
                             key_setting="tls-key"):
    """``(PrivateCertificate, [chain certificates])`` from PEM files or bytes.

    ``certificate`` holds the leaf certificate first, then any intermediate
    certificates; ``key`` holds its private key (unencrypted PEM) and
    defaults to ``certificate`` (one file with both).
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
    try:
        pair = ssl.KeyPair.load(match.group(0), crypto.FILETYPE_PEM)
    except (crypto.Error, ValueError, TypeError) as e:
        raise TLSConfigError(f"{key_setting}: cannot load the private key in "
                             f"{key_name}: {e}", key_setting) from None
    try:
        leaf = ssl.PrivateCertificate.fromCertificateAndKeyPair(certs[0], pair)
    except error.VerifyError:
        raise TLSConfigError(f"{key_setting}: the private key in {key_name} does not "
                             f"match the certificate in {cert_setting}", key_setting) from None
    return leaf, certs[1:]


def server_options(certificate, key=None, ca=None, require_authenticated=False):
    """CertificateOptions for a router listener (see the module policy).

    ``certificate``, ``key`` and ``ca`` are PEM file paths or PEM bytes.
    """
    if require_authenticated and ca is None:
        raise TLSConfigError("require-authenticated = yes needs tls-ca: the CA "
                             "certificate(s) that client certificates must chain to",
                             "require-authenticated")
    leaf, chain = load_private_certificate(certificate, key)
    kwargs = {}
    if ca is not None:
        cas = load_certificates(ca, "tls-ca")
        kwargs = dict(verify=True, caCerts=[c.original for c in cas],
                      requireCertificate=bool(require_authenticated))
    options = ssl.CertificateOptions(
        privateKey=leaf.privateKey.original, certificate=leaf.original,
        extraCertChain=[c.original for c in chain] or None,
        raiseMinimumTo=MINIMUM_VERSION, **kwargs)
    try:
        options.getContext()  # fail now, not at the first client
    except SSL.Error as e:
        raise TLSConfigError(f"tls-certificate: unusable certificate/key: {e}",
                             "tls-certificate") from None
    return options


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
    return ssl.optionsForClientTLS(hostname, _trust_root(ca), client_cert,
                                   extraCertificateOptions=extra)
