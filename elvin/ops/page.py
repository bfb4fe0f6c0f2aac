"""The status page: plain HTML and a little JavaScript, no build step. It
fetches ``status.json`` every second and redraws, so clients and links
appear without a reload (docs/operations.md)."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Elvin router status</title>
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
 h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
 table { border-collapse: collapse; min-width: 40em; }
 th, td { text-align: left; padding: .2em .8em .2em 0; border-bottom: 1px solid #ddd;
          vertical-align: top; }
 th { font-weight: 600; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
 code { font-size: 12px; word-break: break-all; }
 .figures { display: flex; flex-wrap: wrap; gap: 1em; }
 .figure { border: 1px solid #ddd; border-radius: 6px; padding: .5em .8em; min-width: 9em; }
 .figure b { display: block; font-size: 1.3em; }
 .up { color: #176f2c; } .down { color: #a11; } .muted { color: #777; }
 .detail { font-size: 12px; max-width: 40em; }
</style></head>
<body>
<h1>Elvin router <span id="domain" class="muted"></span></h1>
<div class="muted" id="identity">loading…</div>
<h2>Now</h2><div class="figures" id="figures"></div>
<h2>Clients <span class="muted" id="client-count"></span></h2>
<table id="clients"><thead><tr><th>address</th><th>transport</th><th>state</th>
<th>subscriptions</th><th>quenches</th><th>queue (bytes)</th><th>dropped</th></tr></thead>
<tbody></tbody></table>
<h2>Federation links <span class="muted" id="link-count"></span></h2>
<table id="links"><thead><tr><th>peer</th><th>state</th><th>carries</th><th>in</th>
<th>out</th><th>pull filter (what the peer wants)</th></tr></thead><tbody></tbody></table>
<h2>Recent refusals</h2>
<table id="refusals"><thead><tr><th>time</th><th>client</th><th>Nack</th><th>message</th>
</tr></thead><tbody></tbody></table>
<p class="muted" id="updated"></p>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}
function fill(id, rows, make) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows.map(row => {
    const tr = document.createElement("tr"); make(row).forEach(td => tr.appendChild(td));
    return tr;
  }));
}
function figure(label, value) {
  const div = document.createElement("div"); div.className = "figure";
  const b = document.createElement("b"); b.textContent = value;
  div.appendChild(b); div.appendChild(document.createTextNode(label)); return div;
}
function seconds(s) {
  return s < 90 ? Math.round(s) + " s" : s < 5400 ? Math.round(s / 60) + " min"
                                                  : Math.round(s / 3600) + " h";
}
function linkState(l) {
  // A configured link that is not up says why and when it is tried again.
  const td = cell(l.state, l.state === "up" ? "up" : "down");
  const more = [];
  const attempt = l.attempts ? "attempt " + l.attempts + " since up" : "next attempt";
  if (l.state !== "up" && l.next_attempt_s !== null)
    more.push(attempt + " in " + seconds(l.next_attempt_s));
  else if (l.state !== "up" && l.attempts) more.push(attempt);
  if (l.state !== "up" && l.last_error)
    more.push("last error " + (l.last_error_s !== null ? seconds(l.last_error_s) + " ago" : "")
              + ": " + l.last_error);
  if (more.length) {
    const detail = document.createElement("div");
    detail.className = "muted detail"; detail.textContent = more.join(" · ");
    td.appendChild(detail);
  }
  return td;
}
let last = null;
function rate(now, key) {
  if (!last || !now.router.uptime_s) return "";
  const dt = now.router.uptime_s - last.router.uptime_s;
  return dt > 0 ? Math.round((now.totals[key] - last.totals[key]) / dt) + "/s" : "";
}
async function refresh() {
  try {
    const url = "status.json" + (token ? "?token=" + encodeURIComponent(token) : "");
    const s = await (await fetch(url, {cache: "no-store"})).json();
    const r = s.router, t = s.totals;
    document.getElementById("domain").textContent = r.domain || "";
    document.getElementById("identity").textContent =
      "version " + r.version + " · up " + Math.round(r.uptime_s) + " s · listening on " +
      r.listeners.join(", ") + (r.drained_to ? " · DRAINED to " + r.drained_to : "");
    document.getElementById("figures").replaceChildren(
      figure("clients", t.connections_open), figure("subscriptions", t.subscriptions),
      figure("notifications in " + rate(s, "notifications_received"), t.notifications_received),
      figure("deliveries " + rate(s, "deliveries"), t.deliveries),
      figure("dropped deliveries", t.dropped_deliveries),
      figure("slow clients reset", t.slow_client_disconnections),
      figure("not fully evaluated", t.pattern_work_refusals + t.evaluation_refusals),
      figure("send queues (bytes)", t.send_queue_bytes));
    document.getElementById("client-count").textContent = "(" + s.clients.length + ")";
    fill("clients", s.clients, c => [cell(c.peer), cell(c.transport), cell(c.state),
      cell(c.subscriptions, "n"), cell(c.quenches, "n"), cell(c.queue_bytes, "n"),
      cell(c.dropped, "n")]);
    const down = s.links.filter(l => l.state !== "up").length;
    document.getElementById("link-count").textContent =
      "(" + s.links.length + (down ? ", " + down + " not up" : "") + ")";
    fill("links", s.links, l => {
      const f = cell(""); const code = document.createElement("code");
      code.textContent = l.pull_filter === null ? "—" : l.pull_filter; f.appendChild(code);
      const up = l.state === "up";
      return [cell((l.domain || "peer not yet known") + " (" + (l.uri || l.host) +
                   (l.outgoing ? ", we dial" : "") + ")"),
              linkState(l),
              cell(up ? (l.active ? (l.mesh ? "tree link" : "yes") : "idle (off the tree)")
                      : "no (not up)"),
              cell(l.in, "n"), cell(l.out, "n"), f];
    });
    fill("refusals", s.refusals.slice().reverse(), x => [
      cell(new Date(x.time * 1000).toLocaleTimeString()), cell(x.peer),
      cell(x.code + " " + x.name), cell(x.message)]);
    document.getElementById("updated").textContent =
      "updated " + new Date().toLocaleTimeString();
    last = s;
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach the router: " + e;
  }
}
refresh(); setInterval(refresh, 1000);
</script>
</body></html>
"""
