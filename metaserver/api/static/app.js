// EmberFS dashboard: polls the admin API every 2 s and redraws. No build step, no dependencies.
"use strict";

const POLL_MS = 2000;
let previous = null; // {t, read, written} of the last poll, for throughput

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function pill(text, state, attrs) {
  return el("span", Object.assign({ class: "pill " + state, title: state }, attrs || {}), text);
}

function setText(id, text) { document.getElementById(id).textContent = text; }

async function getJSON(path) {
  const resp = await fetch(path, { cache: "no-store" });
  if (!resp.ok) throw new Error(path + ": HTTP " + resp.status);
  return resp.json();
}

function drawCluster(c) {
  const badge = document.getElementById("health");
  badge.textContent = c.health;
  badge.className = "badge " + c.health;
  setText("nodes", c.nodes);
  setText("targets-total", c.targets.total);
  const states = ["serving", "syncing", "waiting", "lastsrv", "offline"]
    .filter((s) => c.targets[s]).map((s) => c.targets[s] + " " + s);
  if (c.targets.full) states.push(c.targets.full + " full");
  setText("targets-by-state", states.join(", ") || "none");
  setText("chains-total", c.chains.total);
  setText("chains-by-health", ["healthy", "degraded", "unavailable"]
    .filter((h) => c.chains[h]).map((h) => c.chains[h] + " " + h).join(", ") || "none");
  setText("capacity", bytes(c.capacity));
  const pct = c.capacity ? (100 * c.used) / c.capacity : 0;
  document.getElementById("capacity-bar").style.width = pct.toFixed(1) + "%";
  setText("capacity-sub", bytes(c.used) + " used (" + pct.toFixed(1) + "%)");
  const now = performance.now() / 1000;
  if (previous) {
    const dt = Math.max(now - previous.t, 0.001);
    setText("read-rate", bytes(Math.max(0, c.bytes_read - previous.read) / dt) + "/s");
    setText("write-rate", bytes(Math.max(0, c.bytes_written - previous.written) / dt) + "/s");
  }
  previous = { t: now, read: c.bytes_read, written: c.bytes_written };
  setText("read-total", bytes(c.bytes_read) + " in total");
  setText("write-total", bytes(c.bytes_written) + " in total");
  if (c.namespace) {
    setText("files", c.namespace.files + " files");
    setText("namespace-sub", c.namespace.directories + " dirs, " + c.namespace.sessions +
      " open for write, " + c.gc_pending + " awaiting GC");
  } else {
    setText("files", "n/a");
  }
  setText("version", c.version);
  setText("routing-version", c.routing_version);
  const drains = document.querySelector("#drains tbody");
  drains.replaceChildren(...c.drains.map((d) => el("tr", { "data-target": d.target },
    el("td", {}, d.target), el("td", {}, d.chain), el("td", {}, d.replacement),
    el("td", {}, pill(d.replacement_state, d.replacement_state)))));
  document.getElementById("drains-section").hidden = c.drains.length === 0;
}

function chainHealth(chain) {
  const serving = chain.targets.filter((t) => t.state === "serving").length;
  if (serving === chain.targets.length && serving > 0) return "healthy";
  return serving ? "degraded" : "unavailable";
}

function drawChains(chains) {
  const body = document.querySelector("#chains tbody");
  body.replaceChildren(...chains.map((c) => {
    const health = chainHealth(c);
    return el("tr", { "data-chain": c.id },
      el("td", {}, c.id), el("td", {}, c.version),
      el("td", {}, el("span", { class: "badge " + health }, health)),
      el("td", {}, ...c.targets.map((t) =>
        pill("#" + t.id + " " + t.state, t.state, { "data-target": t.id, "data-state": t.state }))));
  }));
}

function scrubCells(s) {
  if (!s) return [el("td", { class: "muted" }, "-"), el("td", { class: "muted" }, "-")];
  const last = s.last_full_pass ? new Date(s.last_full_pass / 1e6).toLocaleString() : "never";
  const when = el("td", { class: "scrub", "data-last-scrub": s.last_full_pass },
    s.running ? last + " (scrubbing)" : last);
  const errors = el("td", { "data-scrub-errors": s.errors },
    s.errors ? pill(s.errors + " found, " + s.repairs + " repaired", "offline") : "0");
  return [when, errors];
}

function drawTargets(targets, scrub) {
  const byTarget = new Map(scrub.targets.map((s) => [s.id, s]));
  const body = document.querySelector("#targets tbody");
  body.replaceChildren(...targets.map((t) => {
    const pct = t.capacity ? (100 * t.used) / t.capacity : 0;
    const bar = el("div", { class: "bar" }, el("div", { style: "width:" + pct.toFixed(1) + "%" }));
    const state = el("td", { class: "state" }, pill(t.state, t.state));
    if (t.full) state.append(pill("full", "full", { title: "no room for writes" }));
    return el("tr", { "data-target": t.id, "data-state": t.state, "data-full": t.full },
      el("td", {}, t.id), el("td", {}, t.node), el("td", {}, t.address), state,
      el("td", {}, t.chain || "-"), el("td", {}, t.chunks),
      el("td", {}, el("span", { class: "usage" }, bar, bytes(t.used) + " / " + bytes(t.capacity))),
      ...scrubCells(byTarget.get(t.id)));
  }));
}

async function refresh() {
  const banner = document.getElementById("error");
  try {
    const [cluster, chains, targets, scrub] = await Promise.all([
      getJSON("/api/v1/cluster"), getJSON("/api/v1/chains"), getJSON("/api/v1/targets"),
      getJSON("/api/v1/scrub"),
    ]);
    drawCluster(cluster);
    drawChains(chains);
    drawTargets(targets, scrub);
    banner.hidden = true;
    setText("updated", "updated " + new Date().toLocaleTimeString());
  } catch (err) {
    banner.textContent = "Cannot reach the admin API: " + err.message;
    banner.hidden = false;
  }
}

refresh();
setInterval(refresh, POLL_MS);
