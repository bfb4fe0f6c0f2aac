"""The status page: plain HTML and a little JavaScript, no build step. It
fetches ``status.json`` every second (not while the tab is hidden) and
redraws, so clients and links appear without a reload. Links and
refusals come before the clients; the page lists only the ``CLIENTS``
clients with the largest send queues and most drops (``?clients=N`` in
its address lists N), and its tables scroll sideways in their own box
in a narrow window (docs/operations.md)."""

#: How many clients the page lists unless its address says (?clients=N).
CLIENTS = 100

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Elvin router status</title>
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
 @media (max-width: 600px) { body { margin: .6em; } }
 h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
 #identity { overflow-wrap: anywhere; }
 /* Tables scroll sideways in their own box; a shadow shows there is more. */
 .scroll { overflow-x: auto; max-width: 100%;
   background: linear-gradient(to right, #fff 30%, #fff0) left / 3em 100% no-repeat local,
               linear-gradient(to left, #fff 30%, #fff0) right / 3em 100% no-repeat local,
               radial-gradient(farthest-side at 0 50%, #0003, #0000) left / 1em 100% no-repeat,
               radial-gradient(farthest-side at 100% 50%, #0003, #0000) right / 1em 100%
               no-repeat; }
 table { border-collapse: collapse; min-width: 100%; }
 th, td { text-align: left; padding: .2em .8em .2em 0; border-bottom: 1px solid #ddd;
          vertical-align: top; }
 th { font-weight: 600; white-space: nowrap; } th.n { text-align: right; }
 td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
 td.addr { white-space: nowrap; }
 code { font-size: 12px; word-break: break-all; }
 code.filter { display: block; min-width: 16em; max-height: 7.2em; overflow-y: auto; }
 .figures { display: flex; flex-wrap: wrap; gap: .6em; }
 .figure { border: 1px solid #ddd; border-radius: 6px; padding: .4em .7em;
           flex: 1 0 7em; max-width: 14em; }
 .figure b { display: block; font-size: 1.2em; white-space: nowrap; }
 .up { color: #176f2c; } .down { color: #a11; } .muted { color: #777; }
 .detail { font-size: 12px; min-width: 14em; max-width: 40em; }
 td.message { min-width: 14em; max-width: 40em; }
 #clients-more { margin: .4em 0; }
 /* In a narrow window a link or refusal is a card: one "label: value" a line. */
 @media (max-width: 600px) {
   table.cards, table.cards tbody, table.cards tr, table.cards td { display: block; }
   table.cards thead { display: none; }
   table.cards tr { border-bottom: 1px solid #ddd; padding: .3em 0; }
   table.cards td { border: 0; padding: .05em 0; text-align: left; white-space: normal; }
   table.cards td::before { content: attr(data-label) ": "; color: #777; }
 }
</style></head>
<body>
<h1>Elvin router <span id="domain" class="muted"></span></h1>
<div class="muted" id="identity">loading…</div>
<h2>Now</h2><div class="figures" id="figures"></div>
<h2>Federation links <span class="muted" id="link-count"></span></h2>
<div class="scroll"><table id="links" class="cards"><thead><tr><th>peer</th><th>state</th><th>carries</th>
<th class="n">in</th><th class="n">out</th><th>pull filter (what the peer wants)</th></tr></thead><tbody></tbody>
</table></div>
<h2>Recent refusals <span class="muted" id="refusal-count"></span></h2>
<div class="scroll"><table id="refusals" class="cards"><thead><tr><th>time</th><th>client</th><th>Nack</th>
<th>message</th></tr></thead><tbody></tbody></table></div>
<h2>Clients <span class="muted" id="client-count"></span></h2>
<div class="scroll"><table id="clients"><thead><tr><th>address</th>
<th class="n">queue (bytes)</th><th class="n">dropped</th><th class="n">subscriptions</th>
<th class="n">quenches</th><th>transport</th><th>state</th></tr></thead><tbody></tbody>
</table></div>
<p class="muted" id="clients-more"></p>
<p class="muted" id="updated"></p>
<script>
"use strict";
const params = new URLSearchParams(location.search);
const token = params.get("token");
// How many clients to list: the page's own ?clients=N, or @CLIENTS@.
const listed = /^[0-9]+$/.test(params.get("clients") || "") ? +params.get("clients")
                                                               : @CLIENTS@;
function num(n) { return typeof n === "number" ? n.toLocaleString("en-US") : n; }
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}
function fill(id, rows, make) {
  const labels = Array.from(document.querySelectorAll("#" + id + " thead th"),
                            th => th.textContent);
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows.map(row => {
    const tr = document.createElement("tr");
    make(row).forEach((td, i) => { td.dataset.label = labels[i]; tr.appendChild(td); });
    return tr;
  }));
}
function figure(label, value) {
  const div = document.createElement("div"); div.className = "figure";
  const b = document.createElement("b"); b.textContent = num(value);
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
    const query = new URLSearchParams({clients: listed});
    if (token) query.set("token", token);
    const url = "status.json?" + query;
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
    // The clients with the largest send queues and most drops come first.
    const omitted = s.clients_omitted || 0;
    document.getElementById("client-count").textContent =
      "(" + num(s.clients.length + omitted) + (omitted ? ": the " + num(s.clients.length) +
      " with the largest send queues and most drops" : "") + ")";
    fill("clients", s.clients, c => [cell(c.peer, "addr"), cell(num(c.queue_bytes), "n"),
      cell(num(c.dropped), "n"), cell(num(c.subscriptions), "n"), cell(num(c.quenches), "n"),
      cell(c.transport), cell(c.state)]);
    const more = document.getElementById("clients-more");
    if (omitted) {
      const wider = new URLSearchParams(location.search);
      wider.set("clients", Math.max(10 * listed, 1000));
      const a = document.createElement("a"); a.href = "?" + wider;
      a.textContent = "list up to " + num(Math.max(10 * listed, 1000));
      more.replaceChildren(document.createTextNode(
        num(omitted) + " more, with smaller send queues and fewer drops, not listed (" +
        "status.json lists every client) · "), a);
    } else {
      more.replaceChildren();
    }
    const down = s.links.filter(l => l.state !== "up").length;
    document.getElementById("link-count").textContent =
      "(" + s.links.length + (down ? ", " + down + " not up" : "") + ")";
    fill("links", s.links, l => {
      const f = cell(""); const code = document.createElement("code");
      code.className = "filter";
      code.textContent = l.pull_filter === null ? "—" : l.pull_filter; f.appendChild(code);
      const up = l.state === "up";
      return [cell((l.domain || "peer not yet known") + " (" + (l.uri || l.host) +
                   (l.outgoing ? ", we dial" : "") + ")"),
              linkState(l),
              cell(up ? (l.active ? (l.mesh ? "tree link" : "yes") : "idle (off the tree)")
                      : "no (not up)"),
              cell(num(l.in), "n"), cell(num(l.out), "n"), f];
    });
    document.getElementById("refusal-count").textContent =
      s.refusals.length ? "(latest " + s.refusals.length + ", newest first)" : "(none)";
    fill("refusals", s.refusals.slice().reverse(), x => [
      cell(new Date(x.time * 1000).toLocaleTimeString()), cell(x.peer, "addr"),
      cell(x.code + " " + x.name), cell(x.message, "message")]);
    document.getElementById("updated").textContent =
      "updated " + new Date().toLocaleTimeString();
    last = s;
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach the router: " + e;
  }
}
// Every second while the page is seen; a hidden tab fetches nothing.
refresh();
setInterval(() => { if (!document.hidden) refresh(); }, 1000);
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
</script>
</body></html>
""".replace("@CLIENTS@", str(CLIENTS))
