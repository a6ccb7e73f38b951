// The web dashboard's one page (GET / on the control endpoint): plain HTML,
// CSS and JavaScript in one string, nothing fetched from elsewhere (it works
// on an air-gapped host).  Fed by the WebSocket /v1/ws (actors/control_http.cpp):
// one JSON frame a second with the new step reports and events, the actor
// tree and the coordinator's status.  Charts are SVG polylines, one per
// drafter, of the last 20000 points of each chart; each chart's <svg>
// carries data-points (its number of points) and each tree row data-actor,
// which the headless-Chromium test reads.  @NONCE@ and @CSRF@
// are filled in per response.
#include "actors/control_http.hpp"

namespace tandem {

const char* dashboard_page() {
  return R"TANDEM(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tandem</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style nonce="@NONCE@">
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #1d1d1f; background: #fafafa; }
h1 { font-size: 18px; margin: 0 0 4px; } .sub { color: #666; margin-bottom: 12px; }
.grid { display: grid; grid-template-columns: repeat(3, 1fr); gap: 10px; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 8px; }
.card h2 { font-size: 12px; margin: 0 0 4px; color: #444; font-weight: 600; }
.card .last { float: right; color: #000; font-weight: 400; }
svg { width: 100%; height: 110px; display: block; } polyline { fill: none; stroke: #2463eb; stroke-width: 1.5; }
polyline.sim { stroke: #aaa; stroke-width: 1; }
polyline.d1 { stroke: #e8590c; } polyline.d2 { stroke: #2b8a3e; } polyline.d3 { stroke: #862e9c; }
table { border-collapse: collapse; width: 100%; } td, th { text-align: left; padding: 2px 8px; border-bottom: 1px solid #eee; }
#events { font-family: ui-monospace, monospace; font-size: 12px; max-height: 220px; overflow: auto; white-space: pre; }
button { margin-right: 6px; } .bad { color: #b00020; } .row { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; margin-top: 10px; }
</style></head><body>
<h1>tandem <span id="run"></span></h1>
<div class="sub"><span id="state">connecting…</span>
  <button id="pause">pause</button><button id="resume">resume</button><button id="checkpoint">checkpoint</button>
  <span id="said"></span></div>
<div class="grid" id="charts"></div>
<div class="row">
  <div class="card"><h2>actors</h2><table><thead><tr><th>actor</th><th>device</th><th>state</th><th>detail</th></tr></thead>
    <tbody id="tree"></tbody></table></div>
  <div class="card"><h2>events</h2><div id="events"></div></div>
</div>
<script nonce="@NONCE@">
"use strict";
const CSRF = "@CSRF@";
const PEAK = 989e12;  // dense bf16 FLOP/s of an H100/H200: the MFU denominator
const charts = [
  ["loss", "loss", r => r.loss],
  ["accuracy", "accuracy", r => r.accuracy],
  ["tau", "τ (real, [eval]; grey: simulated acceptance)", null],
  ["tokens_per_s", "tokens/s", r => r.tokens / ((r.compute_ms + r.wait_ms) / 1e3)],
  ["data_wait", "data wait %", r => 100 * r.wait_ms / (r.compute_ms + r.wait_ms)],
  ["mfu", "MFU % (of 989 TFLOP/s)", r => 100 * r.tflop * 1e12 / (r.compute_ms / 1e3) / PEAK],
];
const KEEP = 20000;  // points per chart: a long run's page stays small
const series = {}; let stepsAfter = 0, eventsAfter = 0, opened = false;
function push(id, p) { const s = series[id]; s.push(p); if (s.length > KEEP) s.splice(0, s.length - KEEP); }
const box = document.getElementById("charts");
for (const [id, title] of charts) {
  series[id] = [];
  const c = document.createElement("div"); c.className = "card";
  c.innerHTML = `<h2>${title}<span class="last" id="last-${id}"></span></h2>` +
    `<svg id="chart-${id}" data-points="0" viewBox="0 0 300 100" preserveAspectRatio="none">` +
    (id === "tau" ? `<polyline class="sim"/>` : ``) + `</svg>`;
  box.appendChild(c);
}
series.sim = [];
function draw(id) {
  const pts = series[id].filter(p => Number.isFinite(p[1]));
  const extra = id === "tau" ? series.sim.filter(p => Number.isFinite(p[1])) : [];
  const svg = document.getElementById("chart-" + id);
  svg.setAttribute("data-points", String(series[id].length));
  if (id === "tau") svg.setAttribute("data-sim-points", String(series.sim.length));
  const all = pts.concat(extra);
  if (!all.length) return;
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const p of all) { x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]); y0 = Math.min(y0, p[1]); y1 = Math.max(y1, p[1]); }
  if (x1 === x0) x1 = x0 + 1; if (y1 === y0) { y1 += 1; y0 -= 1; }
  const line = ps => ps.map(p =>
    ((p[0] - x0) / (x1 - x0) * 300).toFixed(1) + "," + (98 - (p[1] - y0) / (y1 - y0) * 96).toFixed(1)).join(" ");
  // One line per drafter (data-parallel replicas share step numbers).
  const by = new Map();
  for (const p of pts) { const d = p[2] ?? 0; if (!by.has(d)) by.set(d, []); by.get(d).push(p); }
  for (const [d, ps] of by) {
    let pl = svg.querySelector(`polyline[data-drafter="${d}"]`);
    if (!pl) {
      pl = document.createElementNS(svg.namespaceURI, "polyline");
      pl.setAttribute("class", "main d" + (d % 4)); pl.setAttribute("data-drafter", String(d)); svg.appendChild(pl);
    }
    pl.setAttribute("points", line(ps));
  }
  if (id === "tau") svg.querySelector("polyline.sim").setAttribute("points", line(extra));
  const last = pts.length ? pts[pts.length - 1][1] : extra[extra.length - 1][1];
  document.getElementById("last-" + id).textContent = Number(last).toPrecision(4) + (pts.length ? "" : " (simulated)");
}
function text(id, s) { document.getElementById(id).textContent = s; }
function onFrame(f) {
  text("run", f.run || "");
  const c = f.coordinator || {};
  text("state", `step ${c.step ?? "?"}, epoch ${c.epoch ?? "?"}` + (c.paused ? ", PAUSED" : "") +
       (c.stopping ? ", stopping" : "") + `, up ${Math.round(f.uptime_s || 0)} s`);
  for (const r of f.steps || []) {  // only reports after stepsAfter: each once
    for (const [id, , get] of charts) if (get) push(id, [r.step, get(r), r.drafter]);
    push("sim", [r.step, r.sim_accept, r.drafter]);
  }
  if (f.steps_seq !== undefined) stepsAfter = f.steps_seq;
  const ev = document.getElementById("events");
  for (const e of f.events || []) {
    if (e.event === "eval" && !e.error) push("tau", [e.step, e.tau, 0]);
    const line = document.createElement("div");
    line.setAttribute("data-event", e.event);
    if (e.event === "drafter_failed" || e.event === "end" && e.error) line.className = "bad";
    const rest = Object.assign({}, e); for (const k of ["seq", "event", "run", "time_s", "uptime_s"]) delete rest[k];
    line.textContent = `#${e.seq} ${e.event} ${JSON.stringify(rest)}`;
    ev.appendChild(line);
  }
  if (f.next_event !== undefined) eventsAfter = f.next_event;
  while (ev.childNodes.length > 2000) ev.removeChild(ev.firstChild);
  ev.scrollTop = ev.scrollHeight;
  for (const [id] of charts) draw(id);
  const tb = document.getElementById("tree"); tb.textContent = "";
  for (const a of f.tree || []) {
    const tr = document.createElement("tr"); tr.setAttribute("data-actor", a.name);
    let detail = a.role === "drafter" ? `incarnation ${a.incarnation}, ${a.steps_handled} steps, failures ${a.failures}`
               : a.role === "coordinator" ? `step ${a.step}` : a.role === "control" ? `${a.requests} requests` : "";
    if (a.messages_handled !== undefined)
      detail += (detail ? "; " : "") + `${a.messages_handled} messages, last ${a.last_message || "-"}, thread ${a.thread}`;
    if (a.vitals) detail += (detail ? "; " : "") + a.vitals;
    for (const v of [a.name, a.device, a.state, detail]) { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); }
    tb.appendChild(tr);
  }
}
function connect() {
  const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/v1/ws");
  ws.onopen = () => { opened = true; ws.send(JSON.stringify({steps_after: stepsAfter, events_after: eventsAfter})); };
  ws.onmessage = m => { onFrame(JSON.parse(m.data)); ws.send(JSON.stringify({steps_after: stepsAfter, events_after: eventsAfter})); };
  ws.onclose = async () => {
    // A refused handshake does not say why: ask once over HTTP.  A session
    // this endpoint does not know (the run restarted: a new port and
    // secret) will not come back by retrying.
    const r = opened ? null : await fetch("/v1/status").catch(() => null);
    if (r && r.status === 401) { text("state", "signed out: open the address `tandem shell RUN_DIR -c dashboard` prints"); return; }
    opened = false;
    text("state", "disconnected (the run has ended, or the connection dropped); retrying…"); setTimeout(connect, 2000);
  };
}
for (const action of ["pause", "resume", "checkpoint"])
  document.getElementById(action).onclick = async () => {
    const r = await fetch("/v1/" + action, {method: "POST", headers: {"X-Tandem-CSRF": CSRF, "Content-Type": "application/json"}, body: "{}"});
    const j = await r.json(); text("said", j.result || j.error || "");
  };
connect();
</script></body></html>
)TANDEM";
}

} // namespace tandem
