"""elvin-stat: a router's (or a proxy's) figures in a terminal, from its
status listener.

    elvin-stat -e http://127.0.0.1:9917            # once
    elvin-stat -e http://127.0.0.1:9917 -i 2       # every 2 s, with rates
    elvin-stat -e http://127.0.0.1:9917 --json     # the raw status, for scripts
    elvin-stat -e 9917                             # a bare port: 127.0.0.1

The router must have ``status-listen`` set (docs/operations.md); ``-e``
names that listener (an http or https URL, host:port or a bare port), not
an elvin: URI. A proxy's status listener (``twistd elvin-proxy``,
docs/proxy.md) is read the same way, and its own figures printed.
"""

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from twisted.python import usage

from elvin.tools.common import BaseOptions, parse_options
from elvin.tools.output import output_guard, write

DEFAULT_STATUS = "http://127.0.0.1:9917"


class Options(BaseOptions):
    name = "elvin-stat"
    synopsis = ""
    longdesc = ("Print a router's figures -- clients, subscriptions, notifications, "
                "deliveries, drops, federation links -- from its status listener "
                "(status-listen), once or every --interval seconds. A proxy's status "
                "listener gives the proxy's: sessions, clients, stored, replayed, "
                "drops, upstream.")
    optFlags = [["json", "j", "Print the status as JSON (one object per line)."],
                ["reload", None, "Ask the router to re-read its configuration file "
                                 "(POST /reload; needs the router's status-token)."]]
    optParameters = [
        ["status", "e", DEFAULT_STATUS, "The router's status listener (its status-listen): "
                                        "an http(s) URL, host:port or a bare port."],
        ["interval", "i", None, "Print again every this many seconds, until interrupted.",
         float],
        ["count", "n", None, "With --interval: stop after this many prints.", int],
        ["token", "t", None, "The status-token, if the router requires one."],
    ]

    def postOptions(self):
        if self["interval"] is not None and not self["interval"] > 0:
            raise usage.UsageError("--interval must be more than 0 seconds")
        if self["count"] is not None and self["count"] < 1:
            raise usage.UsageError(f"--count must be at least 1, not {self['count']}")
        self["status"] = status_url(self["status"])


def status_url(text):
    """The status listener's base URL from -e: an http(s) URL, host:port,
    or a bare port (on 127.0.0.1, as status-listen reads one)."""
    text = text.strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "http", text
        if text.startswith("elvin:"):
            scheme = "elvin"
    if scheme.startswith("elvin"):
        raise usage.UsageError(
            f"-e {text}: -e here is the router's status listener (its status-listen, "
            f"e.g. {DEFAULT_STATUS} or a bare port), not an elvin: URI")
    if scheme not in ("http", "https"):
        raise usage.UsageError(f"-e {text}: the status listener is http or https, "
                               f"not {scheme}")
    if rest.isdigit():
        rest = f"127.0.0.1:{rest}"
    try:
        port = urllib.parse.urlsplit(f"{scheme}://{rest}").port
    except ValueError:
        raise usage.UsageError(f"-e {text}: the port is not a number from 1 to 65535") from None
    if port == 0:
        raise usage.UsageError(f"-e {text}: the port is not a number from 1 to 65535")
    return f"{scheme}://{rest}"


def refused(code, token, action="the status"):
    """Why the status listener refused us (``code`` 401) and what helps; None
    for any other code."""
    if code == 401 and token:
        return ("the router refused the token given with --token: it does not match "
                "the router's status-token")
    if code == 401:
        return f"the router requires its status-token for {action}: give --token"
    return None


def fetch(base, token=None, timeout=5.0, clients=None):
    """The router's status (``/status.json``) as a dict; ``clients``: list
    at most that many clients (None: all)."""
    query = f"?clients={clients}" if clients is not None else ""
    request = urllib.request.Request(base + "/status.json" + query)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8"))


def reload(base, token):
    """POST /reload; prints the router's answer; the exit status."""
    request = urllib.request.Request(base + "/reload", data=b"", method="POST")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        body = e.read().decode("utf-8", "replace")
        try:
            message = json.loads(body)["message"]
        except (ValueError, KeyError):
            message = f"HTTP {e.code} {e.reason}"
            if e.code == 404:
                message += (" (this router takes no reload over its status listener: it "
                            "has no status-token set; set one, or send the router SIGHUP)")
            elif e.code == 401:
                message += f" ({refused(401, token, 'a reload')})"
        sys.stderr.write(f"elvin-stat: error: {message}\n")
        return 1
    except (urllib.error.URLError, OSError) as e:
        sys.stderr.write(f"elvin-stat: error: cannot reach {base}: {getattr(e, 'reason', e)}\n")
        return 1
    write(answer["message"] + "\n")
    return 0


class NotAStatus(ValueError):
    """What was read is neither a router's status nor a proxy's."""


def format_status(status, previous=None):
    """The figures as lines of text (rates when ``previous`` is given): a
    router's, or a proxy's (its status has a ``proxy`` section); NotAStatus
    for anything else."""
    if isinstance(status, dict) and isinstance(status.get("proxy"), dict):
        return format_proxy_status(status, previous)
    if not (isinstance(status, dict) and isinstance(status.get("router"), dict)
            and isinstance(status.get("totals"), dict)):
        raise NotAStatus("not a router's or a proxy's status (no 'router' or 'proxy' "
                         "section)")
    router, totals = status["router"], status["totals"]

    def rate(key):
        if previous is None or router["uptime_s"] is None:
            return ""
        dt = router["uptime_s"] - previous["router"]["uptime_s"]
        return f" ({(totals[key] - previous['totals'][key]) / dt:,.0f}/s)" if dt > 0 else ""
    lines = [" ".join(filter(None, ["router", router["domain"], "version"]))
             + f" {router['version']}, up "
             f"{router['uptime_s']:.0f} s, listening on {', '.join(router['listeners'])}"
             + (f", DRAINED to {router['drained_to']}" if router["drained_to"] else ""),
             f"clients {totals['connections_open']} "
             + " ".join(f"{k}={v}" for k, v in sorted(totals["connections_by_transport"].items()))
             + f"  subscriptions {totals['subscriptions']}  quenches {totals['quenches']}",
             f"notifications in {totals['notifications_received']:,}"
             f"{rate('notifications_received')}  deliveries {totals['deliveries']:,}"
             f"{rate('deliveries')}  dropped {totals['dropped_deliveries']:,}  "
             f"rejected {totals['notifications_rejected']:,}  slow clients reset "
             f"{totals.get('slow_client_disconnections', 0):,}  not fully evaluated "
             f"{totals.get('pattern_work_refusals', 0) + totals.get('evaluation_refusals', 0):,}",
             f"send queues {totals['send_queue_bytes']:,} bytes  nacks "
             + (" ".join(f"{c}×{n}" for c, n in totals["nacks"].items()) or "none")]
    lines.extend(link_line(link) for link in status["links"])
    return "\n".join(lines) + "\n"


def link_line(link):
    """One federation link (or configured link that is not up) as a line."""
    if link["state"] == "up":
        return (f"link {link['domain']} ({link['host']}) up{'' if link['active'] else ' idle'}: "
                f"in {link['in']:,} out {link['out']:,}  pull filter {link['pull_filter']}")
    facts = []
    attempt = f"attempt {link['attempts']} since up" if link.get("attempts") else "next attempt"
    if link.get("next_attempt_s") is not None:
        facts.append(f"{attempt} in {link['next_attempt_s']:.0f} s")
    elif link.get("attempts"):
        facts.append(attempt)
    if link.get("last_error"):
        ago = link.get("last_error_s")
        facts.append("last error" + (f" {ago:.0f} s ago" if ago is not None else "")
                     + f": {link['last_error']}")
    return (f"link {link['domain'] or '(peer not yet known)'} "
            f"({link.get('uri') or link['host']}) "
            f"{link['state'].upper()}" + (f" ({'; '.join(facts)})" if facts else "")
            + f": in {link['in']:,} out {link['out']:,}")


def format_proxy_status(status, previous=None):
    """A proxy's figures (docs/proxy.md, "Operations") as lines of text."""
    proxy = status["proxy"]

    def rate(key):
        if previous is None or proxy.get("uptime_s") is None:
            return ""
        dt = proxy["uptime_s"] - previous["proxy"]["uptime_s"]
        return f" ({(status[key] - previous[key]) / dt:,.0f}/s)" if dt > 0 else ""
    up = proxy.get("uptime_s")
    listening = ", ".join(proxy.get("listeners") or []) or "?"
    upstream = proxy.get("upstream") or "?"
    dropped = {k: v for k, v in status["dropped"].items() if v}
    checks = status["password_checks"]
    return "\n".join([
        f"proxy version {proxy['version']}"
        + (f", up {up:.0f} s" if up is not None else "") + f", listening on {listening}",
        f"upstream {upstream} {'up' if status['upstream_up'] else 'DOWN'}  connects "
        f"{status['upstream_connects']:,}  early retries {status['upstream_early_retries']:,}"
        f"  dropwarns {status['upstream_dropwarns']:,}"
        f"  timeouts {status.get('upstream_timeouts', 0):,}",
        f"sessions {status['sessions']:,}  clients {status['clients']:,}  kept "
        f"{status['stored_bytes']:,} bytes  sessions expired {status['sessions_expired']:,}",
        f"stored {status['stored']:,}{rate('stored')}  replayed {status['replayed']:,}"
        f"{rate('replayed')}  delivered {status['delivered']:,}{rate('delivered')}  "
        f"acknowledged {status['acknowledged']:,}  forwarded {status['forwarded']:,}",
        "dropped " + (" ".join(f"{k}={v:,}" for k, v in dropped.items()) or "none")
        + f"  store failures {status['store_failed']:,}  password checks "
        + " ".join(f"{k}={v:,}" for k, v in checks.items())]) + "\n"


def main(argv=None):
    options = parse_options(Options, argv)
    with output_guard("elvin-stat"):
        _run(options)


def _run(options):
    if options["reload"]:
        sys.exit(reload(options["status"], options["token"]))
    previous = None
    printed = 0
    try:
        while True:
            try:
                # The lines print no client: fetch none (--json: all).
                status = fetch(options["status"], options["token"],
                               clients=None if options["json"] else 0)
            except urllib.error.HTTPError as e:
                why = refused(e.code, options["token"])
                sys.stderr.write(f"elvin-stat: error: {options['status']}: HTTP {e.code} "
                                 f"{e.reason}" + (f" ({why})" if why else "") + "\n")
                sys.exit(1)
            except (urllib.error.URLError, OSError, ValueError) as e:
                reason = getattr(e, "reason", e)
                sys.stderr.write(f"elvin-stat: error: cannot read {options['status']}/status.json: "
                                 f"{reason} (is status-listen set on the router?)\n")
                sys.exit(1)
            if options["json"]:
                write(json.dumps(status) + "\n")
            else:
                try:
                    text = format_status(status, previous)
                except (NotAStatus, KeyError, TypeError, AttributeError) as e:
                    why = e if isinstance(e, NotAStatus) else f"no {e} in it"
                    sys.stderr.write(f"elvin-stat: error: {options['status']}/status.json: "
                                     f"{why} (is -e the status-listen of an elvin router "
                                     "or proxy of this version?)\n")
                    sys.exit(1)
                write(text + ("\n" if options["interval"] else ""))
            previous = status
            printed += 1
            if options["interval"] is None or (options["count"] and printed >= options["count"]):
                return
            time.sleep(options["interval"])
    except KeyboardInterrupt:
        return


if __name__ == "__main__":
    main()
