"""elvin-stat: a router's figures in a terminal, from its status listener.

    elvin-stat -e http://127.0.0.1:9917            # once
    elvin-stat -e http://127.0.0.1:9917 -i 2       # every 2 s, with rates
    elvin-stat -e http://127.0.0.1:9917 --json     # the raw status, for scripts

The router must have ``status-listen`` set (docs/operations.md).
"""

import json
import sys
import time
import urllib.error
import urllib.request

from twisted.python import usage

from elvin.tools.common import BaseOptions, StdoutClosed, parse_options, write

DEFAULT_STATUS = "http://127.0.0.1:9917"


class Options(BaseOptions):
    name = "elvin-stat"
    synopsis = ""
    longdesc = ("Print a router's figures -- clients, subscriptions, notifications, "
                "deliveries, drops, federation links -- from its status listener "
                "(status-listen), once or every --interval seconds.")
    optFlags = [["json", "j", "Print the status as JSON (one object per line)."],
                ["reload", None, "Ask the router to re-read its configuration file "
                                 "(POST /reload; needs the router's status-token)."]]
    optParameters = [
        ["status", "e", DEFAULT_STATUS, "The router's status listener (its status-listen)."],
        ["interval", "i", None, "Print again every this many seconds, until interrupted.",
         float],
        ["count", "n", None, "With --interval: stop after this many prints.", int],
        ["token", "t", None, "The status-token, if the router requires one."],
    ]

    def postOptions(self):
        if self["interval"] is not None and not self["interval"] > 0:
            raise usage.UsageError("--interval must be more than 0 seconds")
        self["status"] = self["status"].rstrip("/")


def fetch(base, token=None, timeout=5.0):
    """The router's status (``/status.json``) as a dict."""
    request = urllib.request.Request(base + "/status.json")
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
            message = f"HTTP {e.code} {e.reason}" + (
                " (reload needs the router's status-token: give --token)"
                if e.code in (401, 404) else "")
        sys.stderr.write(f"elvin-stat: {message}\n")
        return 1
    except (urllib.error.URLError, OSError) as e:
        sys.stderr.write(f"elvin-stat: cannot reach {base}: {getattr(e, 'reason', e)}\n")
        return 1
    write(answer["message"] + "\n")
    return 0


def format_status(status, previous=None):
    """The figures as lines of text (rates when ``previous`` is given)."""
    router, totals = status["router"], status["totals"]

    def rate(key):
        if previous is None or router["uptime_s"] is None:
            return ""
        dt = router["uptime_s"] - previous["router"]["uptime_s"]
        return f" ({(totals[key] - previous['totals'][key]) / dt:,.0f}/s)" if dt > 0 else ""
    lines = [f"router {router['domain'] or ''} version {router['version']}, up "
             f"{router['uptime_s']:.0f} s, listening on {', '.join(router['listeners'])}"
             + (f", DRAINED to {router['drained_to']}" if router["drained_to"] else ""),
             f"clients {totals['connections_open']} "
             + " ".join(f"{k}={v}" for k, v in sorted(totals["connections_by_transport"].items()))
             + f"  subscriptions {totals['subscriptions']}  quenches {totals['quenches']}",
             f"notifications in {totals['notifications_received']:,}"
             f"{rate('notifications_received')}  deliveries {totals['deliveries']:,}"
             f"{rate('deliveries')}  dropped {totals['dropped_deliveries']:,}  "
             f"rejected {totals['notifications_rejected']:,}",
             f"send queues {totals['send_queue_bytes']:,} bytes  nacks "
             + (" ".join(f"{c}×{n}" for c, n in totals["nacks"].items()) or "none")]
    for link in status["links"]:
        lines.append(f"link {link['domain']} ({link['host']}) {link['state']}"
                     f"{'' if link['active'] else ' idle'}: in {link['in']:,} out "
                     f"{link['out']:,}  pull filter {link['pull_filter']}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    options = parse_options(Options, argv)
    if options["reload"]:
        sys.exit(reload(options["status"], options["token"]))
    previous = None
    printed = 0
    try:
        while True:
            try:
                status = fetch(options["status"], options["token"])
            except urllib.error.HTTPError as e:
                sys.stderr.write(f"elvin-stat: {options['status']}: HTTP {e.code} {e.reason}"
                                 + (" (give --token)" if e.code == 401 else "") + "\n")
                sys.exit(1)
            except (urllib.error.URLError, OSError, ValueError) as e:
                reason = getattr(e, "reason", e)
                sys.stderr.write(f"elvin-stat: cannot read {options['status']}/status.json: "
                                 f"{reason} (is status-listen set on the router?)\n")
                sys.exit(1)
            if options["json"]:
                write(json.dumps(status) + "\n")
            else:
                write(format_status(status, previous) + ("\n" if options["interval"] else ""))
            previous = status
            printed += 1
            if options["interval"] is None or (options["count"] and printed >= options["count"]):
                return
            time.sleep(options["interval"])
    except KeyboardInterrupt:
        return
    except StdoutClosed:
        return


if __name__ == "__main__":
    main()
