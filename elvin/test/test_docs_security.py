"""The Python examples of docs/security.md, run as written against a real
router on loopback. The shell examples are run by test_docs_examples.

Each ```python block is taken from the document itself, so an example that
stops working (an import that is gone, an argument renamed) fails here. The
only changes are the ones a reader makes for their own site: the example
host names and ports become this test's router, and the certificate paths
this test's throwaway files (made with trustme, as the document's own
recipe makes them).
"""

import os
import re
import textwrap

from twisted.internet import defer, threads

from elvin import client
from elvin.protocols import tls
from elvin.test.places import REPO
from elvin.test.polling import wait_until
from elvin.test.transport_fixtures import RouterFixture

DOC = os.path.join(REPO, "docs", "security.md")


def python_blocks():
    """The document's ```python blocks, in order."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def block_with(fragment):
    (block,) = [b for b in python_blocks() if fragment in b]
    return block


def as_generator(source, name="example"):
    """``source`` (top-level ``yield``s, as the docs write Deferred code)
    as an inlineCallbacks function returning the example's variables."""
    body = textwrap.indent(source, "    ")
    code = f"def {name}():\n{body}\n    return locals()\n    yield\n"
    namespace = {}
    exec(compile(code, DOC, "exec"), namespace)
    return defer.inlineCallbacks(namespace[name])


class SecurityDocExamples(RouterFixture):
    """docs/security.md's client examples work as printed."""

    timeout = 60

    def setUp(self):
        super().setUp()
        self.opened = []
        real_connect = client.connect

        def recording_connect(*args, **kwargs):
            d = real_connect(*args, **kwargs)
            d.addCallback(lambda conn: self.opened.append(conn) or conn)
            return d
        # The examples import elvin.client themselves: the same module.
        self.patch(client, "connect", recording_connect)
        self.addCleanup(self._close_opened)

    @defer.inlineCallbacks
    def _close_opened(self):
        for conn in self.opened:
            if not conn.is_closed:
                yield conn.close()

    def test_every_python_block_is_run_here(self):
        """A new block in the document needs a test here."""
        tested = ("tls_ca=\"/etc/elvin/tls/ca.pem\")", "keys.producer_keys(",
                  "sync.producer_keys(")
        for block in python_blocks():
            self.assertTrue(any(t in block for t in tested), f"untested example:\n{block}")

    @defer.inlineCallbacks
    def test_tls_client_examples(self):
        import trustme
        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        ca = trustme.CA()
        ca.cert_pem.write_to_path(os.path.join(folder, "ca.pem"))
        router = ca.issue_cert("router.example.com", "localhost", "127.0.0.1")
        router.private_key_and_cert_chain_pem.write_to_path(os.path.join(folder, "router.pem"))
        alice = ca.issue_cert("alice@example.com")
        alice.cert_chain_pems[0].write_to_path(os.path.join(folder, "alice.pem"))
        alice.private_key_pem.write_to_path(os.path.join(folder, "alice.key"))
        options = tls.server_options(os.path.join(folder, "router.pem"), None,
                                     ca=os.path.join(folder, "ca.pem"))
        port = self.listen_tls(options).rsplit(":", 1)[1]

        source = block_with("tls_hostname=")
        source = (source.replace("router.example.com:29170", f"localhost:{port}")
                  .replace("192.0.2.7:29170", f"127.0.0.1:{port}")
                  .replace("/etc/elvin/tls/", folder + "/")
                  .replace('"ca.pem"', repr(os.path.join(folder, "ca.pem")))
                  .replace('"alice.pem"', repr(os.path.join(folder, "alice.pem")))
                  .replace('"alice.key"', repr(os.path.join(folder, "alice.key"))))
        got = []
        watcher = yield client.connect(f"elvin:/secure/127.0.0.1:{port}",
                                       tls_ca=os.path.join(folder, "ca.pem"))
        yield watcher.subscribe("require(a)", got.append)
        names = yield as_generator(source)()
        # Three connections made and still up; the UNotify arrived.
        self.assertEqual(len([c for c in self.opened if c is not watcher]), 3)
        self.assertFalse(names["conn"].is_closed)
        yield wait_until(lambda: got)
        self.assertEqual(dict(got[0]), {"a": 1})
        # Exactly one connection (the one given alice's files) presented a
        # certificate, and the router, asking with tls-ca, accepted it.
        self.assertEqual(len(self._peer_certificates()), 1)

    def _peer_certificates(self):
        certificates = []
        for session in self.router.sessions:
            transport = getattr(session.output, "transport", None)
            cert = transport.getPeerCertificate() if transport is not None else None
            if cert is not None:
                certificates.append(cert)
        return certificates

    @defer.inlineCallbacks
    def test_key_examples_deferred_client(self):
        port = self.listen_tcp().rsplit(":", 1)[1]
        source = block_with("keys.producer_keys(").replace(
            '"elvin://localhost"', f'"elvin://127.0.0.1:{port}"')
        names = yield as_generator(source)()
        alerts = names["alerts"]
        yield wait_until(lambda: alerts)
        (note,) = alerts
        self.assertEqual(dict(note), {"Alert": "red"})
        self.assertEqual(len(note.secure), 1)
        self.assertEqual(note.insecure, ())
        # The producer's connection keys and the third connection's keys were
        # accepted by the router: a keyed notification from either reaches
        # the consumer securely, an unkeyed one does not reach it at all.
        names["producer"].notify({"Alert": "amber"}, deliver_insecure=False)
        names["conn"].notify({"Alert": "green"}, deliver_insecure=False)
        outsider = yield client.connect(f"elvin://127.0.0.1:{port}")
        outsider.notify({"Alert": "forged"}, deliver_insecure=False)
        yield outsider.test_connection()
        yield wait_until(lambda: len(alerts) >= 3)
        yield names["consumer"].test_connection()
        self.assertEqual(sorted(n["Alert"] for n in alerts), ["amber", "green", "red"])

    @defer.inlineCallbacks
    def test_key_example_blocking_client(self):
        port = self.listen_tcp().rsplit(":", 1)[1]
        source = block_with("sync.producer_keys(").replace(
            '"elvin://localhost"', f'"elvin://127.0.0.1:{port}"')
        printed = []
        namespace = {"print": lambda *args: printed.append(args)}
        # The blocking client waits on its own thread: run the example off
        # the reactor, which serves the router meanwhile.
        yield threads.deferToThread(exec, compile(source, DOC, "exec"), namespace)
        self.assertEqual(printed, [("amber", True)])


class SecurityDocErrorTexts(RouterFixture):
    """The TLS failures docs/security.md prints are the ones a client says
    (the document's host and port for this test's)."""

    timeout = 60

    def doc_lines(self):
        with open(DOC, encoding="utf-8") as f:
            text = f.read()
        return [line for block in re.findall(r"^```text\n(.*?)^```", text, re.S | re.M)
                for line in block.splitlines()]

    def assertDocumented(self, message, port, host):
        said = (message.replace(f"{host}:{port}", "router.example.com:29170")
                .replace(repr(host), "'router.example.com'"))
        lines = self.doc_lines()
        self.assertTrue(any(line == said or (line.endswith("...") and
                                             said.startswith(line[:-3]))
                            for line in lines), f"not in docs/security.md:\n{said}")

    @defer.inlineCallbacks
    def failure(self, uri, **kwargs):
        with self.assertRaises(client.ConnectFailed) as cm:
            yield client.connect(uri, timeout=10, **kwargs)
        return str(cm.exception)

    @defer.inlineCallbacks
    def test_client_tls_failures(self):
        from elvin.test.transport_fixtures import Certificates
        certs = Certificates(self.mktemp(), server_names=("127.0.0.1",))
        plain = self.listen_tls(tls.server_options(certs.server_cert, certs.server_key))
        port = plain.rsplit(":", 1)[1]
        strict = self.listen_tls(tls.server_options(certs.server_cert, certs.server_key,
                                                    ca=certs.ca_path,
                                                    require_authenticated=True))
        strict_port = strict.rsplit(":", 1)[1]
        text = yield self.failure(plain, tls_ca=certs.other_ca_path)
        self.assertDocumented(text, port, "127.0.0.1")
        text = yield self.failure(plain.replace("127.0.0.1", "localhost"),
                                  tls_ca=certs.ca_path)
        self.assertDocumented(text, port, "localhost")
        text = yield self.failure(strict, tls_ca=certs.ca_path)
        self.assertDocumented(text, strict_port, "127.0.0.1")
        text = yield self.failure(strict, tls_ca=certs.ca_path,
                                  tls_certificate=certs.stranger_pem)
        self.assertDocumented(text, strict_port, "127.0.0.1")
