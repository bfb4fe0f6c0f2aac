"""Every shell example in README.md and docs/ is run here, or listed with
the reason it cannot be, so the docs cannot drift from the tools.

Examples run as written, in bash, with three substitutions so they stay on
loopback and free ports: the tools and ``twistd`` are shell functions that
run this checkout's code; the well-known ports and example host names are
replaced by the test's own; and ``$ELVIN_URI`` names the test's router, so
examples without ``-e`` (the README walkthrough) reach it. Each run is
bounded by a timeout.
"""

import glob
import os
import re
import socket
import subprocess
import sys
import tempfile

from twisted.trial import unittest
from elvin.test.places import REPO
from elvin.test.places import free_port


#: Examples not run, by (file, first line), with the reason.
NOT_RUN = {
    ("README.md", "pip install . && twistd -n elvin"):
        "installs the package and runs the whole suite: what .ci/run does",
    ("docs/analysis.md", "pip install '.[spark]'"):
        "installs pyspark; the analysis itself is tested in test_spark_analysis",
    ("docs/analysis.md", "export SPARK_HOME=$(python -c 'import pyspark, os; print(os.pa"):
        "starts a standalone Spark master and worker (minutes, fixed port 7077); "
        "the analysis itself is tested in test_spark_analysis",
    ("docs/analysis.md", "SPARK_SUBMIT=$(python -c 'import pyspark, os; print(os.path."):
        "spark-submit on a cluster: bench/spark_cluster-style runs, minutes long",
    ("docs/analysis.md", "python bench/spark_cluster.py --port 0            # a free p"):
        "the cluster check itself: test_spark_cluster runs its small version",
    ("docs/analysis.md", "export HADOOP_CONF_DIR=/etc/hadoop/conf"):
        "needs a YARN cluster",
    ("docs/analysis.md", "ls \"$(python -c 'import pyspark, os; print(os.path.dirname(p"):
        "shows which Hadoop pyspark carries; harmless but not a test",
    ("docs/analysis.md", "$SPARK_SUBMIT … \\"):
        "needs an object store and its credentials",
    ("docs/discovery.md", "twistd -n elvin --discovery -l elvin://0.0.0.0:2917"):
        "multicasts beyond loopback and binds every interface; discovery is "
        "tested on loopback in test_discovery_integration",
    ("docs/discovery.md", "$ elvin-discover --time 5"):
        "multicast discovery on the local network (tested on loopback elsewhere)",
    ("docs/interop.md", "ec -e elvin://127.0.0.1:24917 &"):
        "needs the Go tools of cobaro/elvin, built by hand outside the repo",
    ("docs/interop.md", "CP=lib/avis-client.jar:mina-core-1.1.5.jar:mina-filter-ssl-1.1"):
        "needs the Avis Java tools, built by hand outside the repo",
    ("docs/performance.md", "python bench/throughput.py"):
        "benchmarks take minutes and print figures; not tests",
    ("docs/protocols.md", "twistd -n elvin -c elvind.conf \\"):
        "needs TLS certificate files and fixed ports; TLS listeners are tested "
        "in test_tls and test_tap",
    ("docs/protocols.md", "elvin-notify -u -e elvin:/udp,none,xdr/router:2917 'Temp: 21.5'"):
        "UDP delivery is tested in test_udp (this line names a host 'router')",
    ("docs/protocols.md", "elvin-subscribe -e 'elvin:/http,none,xdr/router.example.com:89"):
        "needs an HTTP proxy; the tunnel is tested in test_http",
    ("docs/router.md", "twistd -n elvin"):
        "starts routers on the well-known port and daemonises; start-up is "
        "tested in test_tap",
    ("docs/router.md", "twistd -n elvin -l elvin://127.0.0.1:2917 -l 'elvin://[::1]:2917' "):
        "binds example addresses that are not this host's (192.0.2.7)",
    ("docs/router.md", "elvin-notify [-e URI] [-u|--unreliable] ['Name: value' ...]"):
        "a synopsis, not a command",
    ("docs/router.md", "elvin-subscribe [-e URI] [-n COUNT] [--ready] EXPRESSION"):
        "a synopsis, not a command",
    ("docs/router.md", "$ twistd -n elvin --verbose"):
        "the walkthrough's router; its client commands are run below",
    ("docs/security.md", "mkdir -p /etc/elvin/tls && cd /etc/elvin/tls"):
        "writes under /etc; certificates are made with trustme in test_tls",
    ("docs/security.md", "python - <<'EOF'"):
        "writes certificate files under /etc/elvin; see test_tls",
    ("docs/security.md", "twistd -n elvin -c /etc/elvin/elvind.conf"):
        "needs the certificates above",
    ("docs/security.md", "SSL_CERT_FILE=/etc/elvin/tls/ca.pem elvin-subscribe -e elvin:/s"):
        "needs the certificates above and a host router.example.com",
    ("docs/security.md", "openssl s_client -connect router.example.com:29170 -CAfile ca."):
        "a diagnostic against a real host",
}

#: Examples that are run, by (file, first line): the method that runs them.
RUN = {
    ("docs/router.md", "pip install ."):
        "test_walkthroughs_in_one_folder",
    ("docs/proxy.md", "twistd -n --pidfile=router.pid elvin &"):
        "test_walkthroughs_in_one_folder",
    ("docs/proxy.md", "$ elvin-subscribe -e elvin://localhost:2916 --session phone"):
        "test_walkthroughs_in_one_folder",
    ("docs/proxy.md", "$ elvin-notify -e elvin://localhost:2917 'Group: \"chat\"'"):
        "test_walkthroughs_in_one_folder",
    ("docs/proxy.md", "$ elvin-subscribe -n 1 -e elvin://localhost:2916"):
        "test_walkthroughs_in_one_folder",
    ("docs/proxy.md", "kill $(cat proxy.pid) $(cat router.pid); wait"):
        "test_walkthroughs_in_one_folder",
    ("README.md", "$ elvin-subscribe 'Group == \"chat\" && size(Message) < 140'"):
        "test_readme_walkthrough",
    ("README.md", "$ elvin-notify 'Group: \"chat\"' 'Message: \"hello\"' 'Num: 42' 'Big: 12L'"):
        "test_readme_walkthrough",
    ("docs/federation.md", "twistd -n --pidfile= elvin -c conf/federation-pair-right.conf > r"):
        "test_federation_pair",
    ("docs/router.md", "elvin-notify 'Group: \"chat\"' 'Message: \"hi\"' 'Count: 42'"):
        "test_router_notify_examples",
    ("docs/router.md", "elvin-subscribe -e elvin://a.example.com 'require(Alarm)' | elvin-no"):
        "test_relay",
    ("docs/router.md", "$ elvin-subscribe -n 2 'Group == \"chat\" && size(Message) < 140'"):
        "test_router_walkthrough",
    ("docs/router.md", "$ elvin-notify 'Group: \"chat\"' 'Message: \"hello\"' 'From: \"ann\"'"):
        "test_router_walkthrough",
}

KEY_LENGTH = 64


def shell_examples():
    """(file, line, first line key, body) of every ```sh block."""
    found = []
    for path in ["README.md"] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))):
        name = os.path.relpath(os.path.join(REPO, path), REPO)
        with open(os.path.join(REPO, name), encoding="utf-8") as f:
            text = f.read()
        for m in re.finditer(r"^```sh\n(.*?)^```", text, re.S | re.M):
            body = m.group(1)
            first = body.strip().splitlines()[0]
            found.append((name, text[:m.start()].count("\n") + 1, _key(first), body))
    return found


def _key(first):
    # Comments after a command are not part of what identifies it.
    return first.split("  #", 1)[0].rstrip()[:KEY_LENGTH]


def _known(table):
    return {(f, _key(line)) for f, line in table}


def _same(name, key, listed):
    """Does the block (``name``, ``key``) match a table entry (a prefix)?"""
    return name == listed[0] and (key.startswith(listed[1]) or listed[1].startswith(key))


PRELUDE = f"""
set -u
elvin-notify() {{ "{sys.executable}" -m elvin.tools.notify "$@"; }}
elvin-subscribe() {{ "{sys.executable}" -m elvin.tools.subscribe "$@"; }}
twistd() {{ "{sys.executable}" -c "from twisted.scripts.twistd import run; run()" "$@"; }}
"""


class ExampleTests(unittest.TestCase):
    """Each runner starts what the example needs and runs it in bash."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="elvin-docs-")
        self.procs = []
        self.addCleanup(self._stop)

    def _stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        subprocess.run(["rm", "-rf", self.dir], check=False)

    def env(self, **extra):
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.update(extra)
        return env

    def router(self, *args):
        """A router subprocess on a free port; returns its URI once it answers."""
        return self.serve("elvin", *args)

    def serve(self, plugin, *args):
        """A ``twistd plugin`` subprocess listening on a free port; returns
        its URI once it answers."""
        port = free_port()
        uri = f"elvin://127.0.0.1:{port}"
        log = open(os.path.join(self.dir, f"{plugin}-{port}.log"), "w")
        proc = subprocess.Popen(
            [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
             "-n", "--pidfile=", plugin, "-l", uri] + list(args),
            cwd=self.dir, env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        for _ in range(100):   # bounded: 20 s
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return uri
            except OSError:
                if proc.poll() is not None:
                    break
                import time
                time.sleep(0.2)
        self.fail(f"{plugin} on {uri} did not start")

    def bash(self, script, timeout=60, **env):
        done = subprocess.run(["bash", "-c", PRELUDE + script], cwd=self.dir,
                              env=self.env(**env), capture_output=True, text=True,
                              timeout=timeout)
        return done

    def example(self, name, first):
        for f, _, key, body in shell_examples():
            if _same(f, key, (name, _key(first))):
                return body
        self.fail(f"no example in {name} starting {first!r}")

    def test_every_example_is_run_or_excused(self):
        known = _known(NOT_RUN) | _known(RUN)
        examples = [(f, key) for f, _, key, _ in shell_examples()]
        missing = [f"{f}: {key}" for f, key in examples
                   if not any(_same(f, key, k) for k in known)]
        self.assertEqual(missing, [], "shell examples neither run nor listed in NOT_RUN")
        stale = [k for k in known if not any(_same(f, key, k) for f, key in examples)]
        self.assertEqual(stale, [], "listed examples that are gone")
        for name in set(RUN.values()):
            self.assertTrue(hasattr(self, name), name)

    def _walkthrough(self, doc, sub_first, notify_first, expected):
        uri = self.router()
        sub = self.example(doc, sub_first).strip().removeprefix("$ ")
        notes = "\n".join(line.removeprefix("$ ") for line in
                          self.example(doc, notify_first).strip().splitlines())
        if " -n " not in sub:
            sub = sub.replace("elvin-subscribe ", "elvin-subscribe -n 2 ", 1)
        script = (f"{sub.replace('elvin-subscribe ', 'elvin-subscribe --ready ', 1)} "
                  "> out.txt 2> ready.txt &\n"
                  "for i in $(seq 1 150); do grep -q ready ready.txt && break; "
                  "sleep 0.1; done\n"
                  f"{notes}\nwait\ncat out.txt\n")
        done = self.bash(script, ELVIN_URI=uri)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, expected)

    def test_readme_walkthrough(self):
        with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        shown = re.search(r"form, ending each with `---`:\n\n```\n(.*?)```", readme, re.S)
        self.assertIsNotNone(shown, "the README shows the subscriber's output")
        self._walkthrough("README.md",
                          "$ elvin-subscribe 'Group == \"chat\" && size(Message) < 140'",
                          "$ elvin-notify 'Group: \"chat\"' 'Message: \"hello\"' 'Num: 42'"
                          " 'Big: 12L'", shown.group(1))

    def test_router_walkthrough(self):
        with open(os.path.join(REPO, "docs", "router.md"), encoding="utf-8") as f:
            doc = f.read()
        i = doc.index("$ elvin-subscribe -n 2")
        shown = re.search(r"```text\n(.*?)```", doc[i:], re.S)
        self.assertIsNotNone(shown)
        self._walkthrough("docs/router.md",
                          "$ elvin-subscribe -n 2 'Group == \"chat\" && size(Message) < 140'",
                          "$ elvin-notify 'Group: \"chat\"' 'Message: \"hello\"' 'From: \"ann\"'",
                          shown.group(1))

    def on_free_ports(self, text, ports):
        """``text`` with the well-known ports moved to this test's free
        ones, and each ``twistd -n elvin`` / ``elvin-proxy`` told so (the
        rest, ``--pidfile`` included, as written)."""
        router, proxy = (f"elvin://127.0.0.1:{ports[p]}" for p in (2917, 2916))
        text = re.sub(r"(twistd -n(?: --pidfile=\S*)?) elvin-proxy\b",
                      rf"\1 elvin-proxy -u {router} -l {proxy}", text)
        text = re.sub(r"(twistd -n(?: --pidfile=\S*)?) elvin(?=[ &\n]|$)",
                      rf"\1 elvin -l {router}", text)
        for port, free in ports.items():
            text = text.replace(f"localhost:{port}", f"127.0.0.1:{free}")
        return text

    def test_walkthroughs_in_one_folder(self):
        """docs/router.md's quick start, then docs/proxy.md's walkthrough,
        as a newcomer runs them: in one folder, one after the other, every
        command as written (a second twistd in the folder without its own
        --pidfile would find twistd.pid taken), the well-known ports moved
        to free ones."""
        ports = {p: free_port() for p in (2917, 2916)}
        router_uri = f"elvin://127.0.0.1:{ports[2917]}"
        listening = ("for i in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/{port}) "
                     "2>/dev/null && break; sleep 0.1; done\n")
        ready = ("for i in $(seq 1 150); do grep -q ready {file} && break; "
                 "sleep 0.1; done\n")
        stop_jobs = ("for j in $(jobs -p); do pkill -P $j; kill $j; done 2>/dev/null; "
                     "wait 2>/dev/null\n")
        # The quick start: pip install is what .ci/check-install checks.
        quick = [line.split("  #", 1)[0].strip() for line in self.example(
            "docs/router.md", "pip install .").strip().splitlines()]
        self.assertEqual(quick[0], "pip install .")
        start, subscribe, notify = (self.on_free_ports(line, ports) for line in quick[1:])
        script = (f"trap '{stop_jobs.strip()}' EXIT\n"
                  f"{start} > quick-router.log 2>&1 &\n"
                  + listening.format(port=ports[2917]) +
                  f"{subscribe.replace('elvin-subscribe ', 'elvin-subscribe -n 1 --ready ', 1)}"
                  " > quick.txt 2> quick-ready.txt &\n"
                  + ready.format(file="quick-ready.txt") +
                  f"{notify}\nwait %2\ncat quick.txt\n")
        done = self.bash(script, ELVIN_URI=router_uri)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, 'Group: "chat"\nMessage: "hello"\n---\n')
        # The proxy, in the same folder.
        with open(os.path.join(REPO, "docs", "proxy.md"), encoding="utf-8") as f:
            doc = f.read()
        i = doc.index("$ elvin-subscribe -n 1 -e")
        shown = re.search(r"```text\n(.*?)```", doc[i:], re.S).group(1)

        def command(first):
            return self.on_free_ports(
                self.example("docs/proxy.md", first).strip().removeprefix("$ "), ports)
        starts = command("twistd -n --pidfile=router.pid elvin &").splitlines()
        starts = "".join(f"{line.rstrip(' &')} > walk-{n}.log 2>&1 &\n"
                         for n, line in enumerate(starts))
        away = command("$ elvin-subscribe -e elvin://localhost:2916 --session phone")
        script = (f"trap '{stop_jobs.strip()}' EXIT\n{starts}"
                  + listening.format(port=ports[2917]) + listening.format(port=ports[2916]) +
                  f"{away.replace('elvin-subscribe ', 'elvin-subscribe --ready ', 1)} "
                  "> /dev/null 2> ready.txt &\npid=$!\n"
                  + ready.format(file="ready.txt") +
                  "pkill -P $pid; kill $pid; wait $pid\n"
                  f"{command('$ elvin-notify -e elvin://localhost:2917')}\n"
                  f"{command('$ elvin-subscribe -n 1 -e elvin://localhost:2916')}\n"
                  f"{command('kill $(cat proxy.pid) $(cat router.pid); wait')}\n"
                  # Stopped as the doc says: both ports free again for federation.md.
                  f"! (exec 3<>/dev/tcp/127.0.0.1/{ports[2916]}) 2>/dev/null && "
                  f"! (exec 3<>/dev/tcp/127.0.0.1/{ports[2917]}) 2>/dev/null\n")
        done = self.bash(script)
        log = ""
        for name in sorted(glob.glob(os.path.join(self.dir, "walk-*.log"))):
            with open(name, encoding="utf-8") as f:
                log += f.read()[-1500:]
        self.assertEqual(done.returncode, 0, done.stderr + log)
        self.assertEqual(done.stdout, shown, log)

    def test_router_notify_examples(self):
        uri = self.router("-l", f"elvin:/udp,none,xdr/127.0.0.1:{free_port()}")
        body = self.example("docs/router.md",
                            "elvin-notify 'Group: \"chat\"' 'Message: \"hi\"' 'Count: 42'")
        body = body.replace("elvin://router.example.com:2917", uri)
        done = self.bash(body, ELVIN_URI=uri)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stderr, "")

    def test_relay(self):
        a, b = self.router(), self.router()
        body = self.example("docs/router.md",
                            "elvin-subscribe -e elvin://a.example.com 'require(Alarm)' | "
                            "elvin-no").strip()
        body = body.replace("elvin://a.example.com", a).replace("elvin://b.example.com", b)
        body = body.replace("elvin-subscribe ", "elvin-subscribe -n 2 --ready ", 1)
        script = (f"elvin-subscribe -e {b} -n 2 --ready 'require(Alarm)' > out.txt "
                  "2> b-ready.txt &\n"
                  "for i in $(seq 1 150); do grep -q ready b-ready.txt && break; "
                  "sleep 0.1; done\n"
                  # Both ends of the pipe write to a-ready.txt: the
                  # subscriber's "ready" is what is waited for.
                  f"{{ {body}; }} 2> a-ready.txt &\n"
                  "for i in $(seq 1 150); do grep -q ready a-ready.txt && break; "
                  "sleep 0.1; done\n"
                  f"elvin-notify -e {a} 'Alarm: \"disk full\"'\n"
                  "sleep 0.5\n"     # the relay sends the first before the second arrives
                  f"elvin-notify -e {a} 'Alarm: \"fan\"'\n"
                  "wait\ncat out.txt\n")
        done = self.bash(script)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, 'Alarm: "disk full"\n---\nAlarm: "fan"\n---\n')

    def test_federation_pair(self):
        ports = {p: free_port() for p in (2917, 2927, 2916)}
        for side in ("left", "right"):
            with open(os.path.join(REPO, "conf", f"federation-pair-{side}.conf")) as f:
                text = f.read()
            for old, new in ports.items():
                text = text.replace(f"localhost:{old}", f"127.0.0.1:{new}")
            with open(os.path.join(self.dir, f"federation-pair-{side}.conf"), "w") as f:
                f.write(text)
        body = self.example("docs/federation.md",
                            "twistd -n --pidfile= elvin -c conf/federation-pair-right.conf > r")
        body = body.replace("conf/federation-pair-", "federation-pair-")
        for old, new in ports.items():
            body = body.replace(f"localhost:{old}", f"127.0.0.1:{new}")
        body = body.replace("elvin-subscribe ", "elvin-subscribe -n 1 ", 1).replace(
            "2> ready.txt &", "2> ready.txt > out.txt &", 1)
        # The jobs are subshells running the shell functions: stop their
        # children (the routers) too, or they outlive the test.
        script = ("trap 'for j in $(jobs -p); do pkill -P $j; kill $j; done 2>/dev/null' "
                  "EXIT\n" + body +
                  "\nfor i in $(seq 1 100); do grep -q -- --- out.txt && break; "
                  "sleep 0.1; done\ncat out.txt\n")
        done = self.bash(script, timeout=90)
        self.assertIn('greeting: "hello from the left"\n---\n', done.stdout, done.stderr)
