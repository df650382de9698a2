// The web view of `orchestrate daemon --http`: the runs list and one run's page, live from
// the run's event stream (server-sent events). Plain DOM and SVG; nothing loaded from elsewhere.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const SVG = "http://www.w3.org/2000/svg";
let current = null; // the open page's teardown

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}
function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
const mib = (b) => (b == null ? "" : (b / 1048576).toFixed(0) + " MiB");
const secs = (s) => (s == null ? "" : s < 0.05 ? Math.floor(s * 1000) + " ms" : s < 60 ? s.toFixed(1) + " s" : s < 3600 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(2) + " h");
// A run's state as a person reads it (the CSS class keeps the wire word: amber for a leak).
const stateLabel = (s) => (s === "succeeded_leaked" ? "succeeded with leaked GPU memory" : s);
const when = (unix) => (unix ? new Date(unix * 1000).toLocaleString() : "");
// A metric as a person reads it: whole numbers in full, others to 4 decimals (the hover has
// the exact value).
const num = (v) => (v == null || typeof v !== "number" ? String(v ?? "") : Number.isInteger(v) ? String(v) : Math.abs(v) >= 1e4 ? v.toFixed(0) : String(+v.toFixed(4)));
// A stage kind's headline metrics; a command stage shows what it reported, the usual first.
const HEADLINE = { train: ["final_loss", "tokens_per_s"], eval: ["accuracy", "loss"] };
const USUAL = ["final_loss", "loss", "accuracy", "perplexity", "tokens_per_s"];
// Results only: `t_*` are an attempt's milestone Unix times, kept in report.json.
const results = (metrics) => Object.entries(metrics || {}).filter(([k]) => !k.startsWith("t_"));
function headline(kind, metrics, most = 4) {
  const all = results(metrics);
  const first = HEADLINE[kind];
  if (first) return first.filter((k) => all.some(([n]) => n === k)).map((k) => [k, metrics[k]]);
  const rank = (k) => (USUAL.indexOf(k) < 0 ? USUAL.length : USUAL.indexOf(k));
  return all.sort((a, b) => rank(a[0]) - rank(b[0])).slice(0, most);
}
// A metrics cell: the headline, every result at full precision on hover.
function metricsCell(kind, metrics) {
  const shown = headline(kind, metrics), all = results(metrics);
  const text = shown.map(([k, v]) => `${k}=${num(v)}`).join(" ") + (all.length > shown.length ? ` (+${all.length - shown.length})` : "");
  return el("td", { class: "metrics", title: all.map(([k, v]) => `${k} = ${v}`).join("\n") }, text);
}
// A matrix value as a label: a path by its file name.
const valueLabel = (v) => (String(v).includes("/") ? String(v).split("/").pop() : String(v));
function bar(fraction) {
  const b = el("span", { class: "bar" }, el("span"));
  b.firstChild.style.width = Math.round(Math.max(0, Math.min(1, fraction)) * 100) + "%";
  return b;
}
// A sortable table: clicking a header sorts by its column (again: the other way). `rowsOf`
// gives each row's sort keys and a maker of its element: only the first 500 are made.
function sortable(table, rowsOf) {
  let by = null, up = true;
  table.addEventListener("click", (e) => {
    const th = e.target.closest("th[data-col]"); if (!th) return;
    const col = +th.dataset.col; up = by === col ? !up : true; by = col;
    for (const h of table.querySelectorAll("th")) h.classList.remove("asc", "desc");
    th.classList.add(up ? "asc" : "desc"); draw();
  });
  function draw() {
    const rows = rowsOf();
    if (by != null) rows.sort((a, b) => {
      const [x, y] = [a.keys[by], b.keys[by]];
      const c = typeof x === "number" && typeof y === "number" ? x - y : x == null ? 1 : y == null ? -1 : String(x).localeCompare(String(y), undefined, { numeric: true });
      return up ? c : -c;
    });
    table.tBodies[0].replaceChildren(...rows.slice(0, 500).map((r) => r.tr()));
  }
  return draw;
}
async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin" });
  if (!r.ok) throw new Error(url + ": " + r.status + " " + (await r.text()));
  return r.json();
}

// ---- runs list ----
function runsPage() {
  const filter = el("input", { id: "filter", placeholder: "filter by id or client id" });
  const state = el("select", { id: "state-filter" }, el("option", { value: "" }, "all states"),
    ...["queued", "running", "succeeded", "succeeded_leaked", "failed", "leaked", "interrupted", "cancelled"].map((s) => el("option", { value: s }, stateLabel(s))));
  const body = el("tbody");
  const main = $("#main");
  main.replaceChildren(el("h2", {}, "Machine"), el("table", { id: "machine" }, el("thead", {}, el("tr", {}, ...["GPU", "name", "memory", "used", "utilisation", "idle baseline", ""].map((h) => el("th", {}, h)))), el("tbody")),
    el("h2", {}, "Runs"), el("div", { class: "controls" }, filter, " ", state),
    el("table", { id: "runs" }, el("thead", {}, el("tr", {}, ...["run", "state", "progress", "ETA", "started", "duration", "GPUs", "client id"].map((h) => el("th", {}, h)))), body));
  let runs = [], now = Date.now() / 1000;
  function draw() {
    const q = filter.value.trim().toLowerCase(), s = state.value;
    body.replaceChildren(...runs.filter(({ info }) => (!s || info.state === s) &&
      (!q || info.id.toLowerCase().includes(q) || (info.client_id || "").toLowerCase().includes(q))).map(({ info, gpus }) => {
      const done = info.stages ? info.succeeded / info.stages : 0;
      const end = info.finished_unix || now;
      // The run's ETA from its pace so far (stages succeeded per second since it was submitted).
      const eta = !info.finished_unix && info.succeeded > 0 && info.succeeded < info.stages ? (end - info.submitted_unix) / info.succeeded * (info.stages - info.succeeded) : null;
      return el("tr", { "data-run": info.id },
        el("td", {}, el("a", { href: "#/run/" + encodeURIComponent(info.id) }, info.id)),
        el("td", { class: "status s-" + info.state }, stateLabel(info.state),
          info.waiting.length ? el("div", { class: "waiting" }, "waiting: " + info.waiting.join("; ")) : ""),
        el("td", {}, bar(done), ` ${info.succeeded}/${info.stages}` + (info.running ? `, ${info.running} running` : "")),
        el("td", { class: "num eta" }, eta == null ? "" : secs(eta)),
        el("td", {}, when(info.submitted_unix)),
        el("td", { class: "num" }, secs(end - info.submitted_unix)),
        el("td", {}, gpus.length ? gpus.map((g) => g.slice(0, 12)).join(", ") : "—"),
        el("td", {}, info.client_id || ""));
    }));
  }
  filter.addEventListener("input", draw);
  state.addEventListener("change", draw);
  // Pushed by the daemon: every run first ("all"), then the runs that changed, by id.
  const byId = new Map();
  const source = new EventSource("/api/events");
  source.addEventListener("runs", (m) => {
    const r = JSON.parse(m.data);
    if (r.all) byId.clear();
    for (const run of r.runs) byId.set(run.info.id, run);
    runs = [...byId.values()].sort((a, b) => b.info.submitted_unix - a.info.submitted_unix);
    now = r.now_unix; draw(); $("#conn").textContent = "live, updated " + new Date().toLocaleTimeString();
  });
  // The machine's GPUs, pushed when they change: memory in use of the total, utilisation.
  source.addEventListener("machine", (m) => {
    const { gpus } = JSON.parse(m.data);
    $("#machine tbody").replaceChildren(...(gpus.length ? gpus.map((g) => el("tr", { "data-gpu": g.uuid },
      el("td", {}, g.uuid), el("td", {}, g.name), el("td", {}, bar(g.used_bytes != null ? g.used_bytes / g.total_bytes : 0)),
      el("td", { class: "num mem" }, g.used_bytes == null ? "not sampled yet" : `${mib(g.used_bytes)} of ${mib(g.total_bytes)}`),
      el("td", { class: "num util" }, g.utilization == null ? "—" : g.utilization + " %"),
      el("td", { class: "num" }, mib(g.baseline_bytes)), el("td", { class: "s-failed" }, g.quarantined ? "quarantined" : "")))
      : [el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no GPU on this host"))]));
  });
  source.onerror = () => { $("#conn").textContent = "reconnecting…"; };
  return () => source.close();
}

// ---- one run ----
function runPage(id) {
  const st = { info: null, report: null, stages: new Map(), order: [], events: 0, memory: null, selected: null, t0: null, meta: new Map() };
  const stage = (name) => {
    if (!st.stages.has(name)) { st.stages.set(name, { name, status: "pending", attempts: 0, wall: null, spans: [], progress: [], gpu: [], detail: "" }); st.order.push(name); }
    return st.stages.get(name);
  };
  const main = $("#main");
  const cancel = el("button", { id: "cancel" }, "Cancel run");
  main.replaceChildren(
    el("h2", {}, "Run ", el("span", { id: "run-id" }, id), " ", el("span", { id: "run-state", class: "status" }), " ", cancel),
    el("div", { id: "run-summary", class: "muted" }),
    el("div", { id: "sweep" }),
    el("h3", {}, "Stages"), el("table", { id: "stages" }, el("thead", {}, el("tr", {}, ...["stage", "status", "attempts", "progress", "ETA", "wall", "metrics", "GPU verdicts", "failure"].map((h) => el("th", {}, h)))), el("tbody")),
    el("h3", {}, "Timeline"), el("div", { id: "timeline" }),
    el("h3", {}, "GPU memory"), el("div", { id: "memory" }),
    el("h3", {}, "GPU verdicts"), el("table", { id: "verdicts" }, el("thead", {}, el("tr", {}, ...["stage", "attempt", "GPU", "baseline", "peak", "after", "reclaim", "verdict", "holders"].map((h) => el("th", {}, h)))), el("tbody")),
    el("div", { id: "stage-detail" }));
  cancel.addEventListener("click", async () => {
    if (!confirm("Cancel run " + id + "? Running stages are stopped gracefully.")) return;
    const r = await fetch("/api/runs/" + encodeURIComponent(id) + "/cancel", { method: "POST", credentials: "same-origin" });
    $("#run-summary").textContent = r.ok ? "cancelling…" : "cancel refused: " + (await r.text());
  });

  function apply(ev) {
    const t = ev.t_ms;
    if (st.t0 == null) st.t0 = t;
    switch (ev.event) {
      case "stage_started": {
        const s = stage(ev.stage); s.status = "running"; s.attempts = ev.attempt;
        const gpus = [...(ev.placement || "").matchAll(/\(([^)]+)\)/g)].map((m) => m[1]);
        s.spans.push({ start: t, end: null, attempt: ev.attempt, gpus, status: "running" }); break;
      }
      case "stage_finished": {
        const s = stage(ev.stage); s.status = ev.status; s.wall = ev.wall_s; s.detail = ev.detail;
        let span = s.spans[s.spans.length - 1];
        // A large run's batch may carry a quick stage's end without its start: the span
        // is drawn from its wall time.
        if (!span || span.end != null) { span = { start: t - ev.wall_s * 1000, end: null, attempt: s.attempts = s.attempts + 1, gpus: [] }; s.spans.push(span); }
        span.end = t; span.status = ev.status; break;
      }
      case "stage_retrying": stage(ev.stage).status = "retrying"; break;
      case "stage_skipped": { const s = stage(ev.stage); s.status = "skipped"; s.detail = ev.reason; break; }
      case "stage_waiting": { const s = stage(ev.stage); if (s.status === "pending") s.detail = ev.reason; break; }
      case "progress": stage(ev.stage).progress.push([t, ev.step, ev.total, ev.loss, ev.tokens_per_s]); break;
      case "stage_gpu": { const s = stage(ev.stage); s.gpu = s.gpu.filter((g) => g.attempt !== ev.attempt).concat(ev.gpus.map((g) => ({ ...g, attempt: ev.attempt }))); break; }
      case "run_finished": st.finished = ev.status; break;
    }
  }
  function mergeReport() {
    for (const r of (st.report && st.report.stages) || []) {
      const s = stage(r.name);
      // A report read early says "pending" or "running": the events' state is newer then.
      const unfinished = r.status === "pending" || r.status === "running";
      if (s.status === "pending" || !unfinished) s.status = s.status === "retrying" && r.status === "running" ? s.status : r.status;
      s.attempts = Math.max(s.attempts, r.attempts); s.metrics = r.metrics; s.failure = r.failure; s.error = r.error;
      if (r.wall_s != null) s.wall = r.wall_s;
      if (r.gpu && r.gpu.length && !s.gpu.length) s.gpu = r.gpu.map((g) => ({ ...g, attempt: r.attempts }));
    }
  }
  let drawQueued = false, sweepTimer = null;
  function schedule() { if (!drawQueued) { drawQueued = true; requestAnimationFrame(() => { drawQueued = false; draw(); }); } }
  function draw() {
    const info = st.info;
    if (info) {
      $("#run-state").textContent = stateLabel(info.state); $("#run-state").className = "status s-" + info.state;
      cancel.disabled = !!info.finished_unix;
      $("#run-summary").textContent = `${info.succeeded}/${info.stages} stages succeeded · started ${when(info.submitted_unix)} · ${info.run_dir}` + (info.waiting.length ? " · waiting: " + info.waiting.join("; ") : "");
    }
    const rows = st.order.slice(0, 500).map((name) => {
      const s = st.stages.get(name), meta = st.meta.get(name) || {};
      const verdicts = s.gpu.filter((g) => g.attempt === s.attempts).map((g) => g.verdict).join(", ");
      const p = progressOf(s);
      return el("tr", { "data-stage": name, class: st.selected === name ? "sel" : "" },
        el("td", {}, el("a", { class: "stage", onclick: () => select(name), title: name }, label(name))),
        el("td", { class: "status s-" + s.status }, s.status), el("td", { class: "num" }, String(s.attempts)),
        el("td", { class: "progress" }, ...(p ? [p.total ? bar(p.step / p.total) : "", ` ${p.step}${p.total ? "/" + p.total : ""}` + (p.loss != null ? ` loss ${num(p.loss)}` : "") + (p.rate != null ? ` ${num(Math.round(p.rate))} tok/s` : "")] : [])),
        el("td", { class: "num eta" }, p && p.eta != null ? secs(p.eta) : ""),
        el("td", { class: "num" }, secs(s.wall)), metricsCell(meta.kind, s.metrics), el("td", { class: "v-" + verdicts }, verdicts),
        el("td", {}, (s.failure || "") + (s.status !== "succeeded" && s.detail ? " " + s.detail : "")));
    });
    $("#stages tbody").replaceChildren(...rows);
    if (st.order.length > 500) $("#stages tbody").append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, `… and ${st.order.length - 500} more stages`)));
    drawSweep(); drawTimeline(); drawMemory(); drawVerdicts(); drawDetail();
  }
  // A stage's label: a matrix instance by its stage and values (`finetune sample=a lr=0.1`).
  function label(name) {
    const m = st.meta.get(name);
    return m && m.values ? m.base + " " + m.values.map(([k, v]) => `${k}=${valueLabel(v)}`).join(" ") : name;
  }
  // A running stage's last progress, and its ETA from its pace since its attempt started.
  function progressOf(s) {
    const last = s.progress[s.progress.length - 1];
    if (!last || s.status !== "running") return null;
    const [t, step, total, loss, rate] = last, span = s.spans[s.spans.length - 1];
    let eta = null;
    if (total && step > 0 && span && t > span.start) eta = Math.max(0, (t - span.start) / 1000 / step * (total - step) - (Date.now() - t) / 1000);
    return { step, total, loss, rate, eta };
  }
  // A sweep's samples: one row per combination of matrix values, with every matrix stage's
  // status and headline metrics on it, sortable by any column.
  let sampleTable = null, drawSamples = null, sweepDrawn = 0;
  function drawSweep() {
    // A sweep's table is rebuilt at most once a second (a sweep's events come by hundreds),
    // and always once its run has ended.
    if (Date.now() - sweepDrawn < 1000 && !(st.info && st.info.finished_unix)) { if (!sweepTimer) sweepTimer = setTimeout(() => { sweepTimer = null; schedule(); }, 1000); return; }
    const instances = [...st.meta.values()].filter((m) => m.values);
    if (!instances.length) return;
    sweepDrawn = Date.now();
    const bases = [...new Set(instances.map((m) => m.base))];
    const keys = [...new Set(instances.flatMap((m) => m.values.map(([k]) => k)))];
    const kindOf = new Map(instances.map((m) => [m.base, m.kind]));
    // Each base stage's metric columns: its headline metrics, as its instances reported them.
    const metricCols = new Map(bases.map((b) => [b, []]));
    for (const m of instances) {
      const s = st.stages.get(m.name); if (!s || !s.metrics) continue;
      for (const [k] of headline(m.kind, s.metrics)) if (!metricCols.get(m.base).includes(k)) metricCols.get(m.base).push(k);
    }
    const heads = [...keys, ...bases.flatMap((b) => [b + " status", ...metricCols.get(b).map((k) => b + " " + k)])];
    if (!sampleTable || sampleTable.dataset.heads !== heads.join("\u0001")) {
      sampleTable = el("table", { id: "samples", "data-heads": heads.join("\u0001") }, el("thead", {}, el("tr", {}, ...heads.map((h, i) => el("th", { "data-col": i, class: "sort" }, h)))), el("tbody"));
      drawSamples = sortable(sampleTable, sampleRows);
      $("#sweep").replaceChildren(el("h3", {}, "Samples"), el("p", { class: "muted" }, `one row per combination of matrix values (${bases.map((b) => `${b}: ${kindOf.get(b)}`).join(", ")}); click a column to sort`), sampleTable);
    }
    function sampleRows() {
      const bySample = new Map();
      for (const m of instances) {
        const id = JSON.stringify(m.values);
        if (!bySample.has(id)) bySample.set(id, { values: new Map(), stages: new Map() });
        const row = bySample.get(id);
        for (const [k, v] of m.values) row.values.set(k, v);
        row.stages.set(m.base, m.name);
      }
      return [...bySample.values()].map((row) => {
        const keysOf = [], cells = [];
        for (const k of keys) { const v = row.values.get(k); keysOf.push(v == null ? null : valueLabel(v)); cells.push(() => el("td", { title: v ?? "" }, v == null ? "" : valueLabel(v))); }
        for (const b of bases) {
          const name = row.stages.get(b), s = name && st.stages.get(name);
          const status = s ? s.status : null;
          keysOf.push(status); cells.push(() => el("td", { class: "sstatus s-" + status, "data-stage": name || "" }, status || ""));
          for (const k of metricCols.get(b)) {
            const v = s && s.metrics ? s.metrics[k] : undefined;
            keysOf.push(typeof v === "number" ? v : null);
            cells.push(() => el("td", { class: "num", title: v == null ? "" : String(v) }, v == null ? "" : num(v)));
          }
        }
        return { keys: keysOf, tr: () => el("tr", { "data-sample": [...row.values.values()].map(valueLabel).join(" ") }, ...cells.map((c) => c())) };
      });
    }
    drawSamples();
  }
  function spansAll() { return st.order.flatMap((n) => st.stages.get(n).spans.map((sp) => ({ ...sp, stage: n }))); }
  function range() {
    const now = st.info && st.info.finished_unix ? st.info.finished_unix * 1000 : Date.now();
    const t0 = st.info ? st.info.submitted_unix * 1000 : (st.t0 || now);
    return [t0, Math.max(now, t0 + 1000)];
  }
  function drawTimeline() {
    const spans = spansAll(), [t0, t1] = range(), names = st.order.filter((n) => st.stages.get(n).spans.length).slice(0, 60);
    // Labels in full (a matrix instance by its values), the label column as wide as the widest.
    const labels = names.map(label), widest = Math.max(0, ...labels.map((l) => l.length));
    const L = Math.min(420, Math.max(110, 7 * widest + 12)), W = Math.max(900, L + 600), H = 16 * names.length + 24, x = (t) => L + (W - L - 10) * (t - t0) / (t1 - t0);
    const g = svg("svg", { width: W, height: H, class: "chart", "data-chart": "timeline" });
    labels.forEach((l, i) => { const t = svg("text", { x: 4, y: 16 * i + 14, class: "label" }, l.length > 60 ? l.slice(0, 59) + "…" : l); t.append(svg("title", {}, names[i])); g.append(t); });
    for (const sp of spans) {
      const i = names.indexOf(sp.stage); if (i < 0) continue;
      const end = sp.end || t1;
      const r = svg("rect", { x: x(sp.start), y: 16 * i + 3, width: Math.max(1, x(end) - x(sp.start)), height: 12, fill: colour(sp.status) });
      r.append(svg("title", {}, `${sp.stage} attempt ${sp.attempt}: ${sp.status}, ${secs((end - sp.start) / 1000)}`));
      g.append(r);
    }
    g.append(svg("text", { x: L, y: H - 4 }, "0 s"), svg("text", { x: W - 60, y: H - 4 }, secs((t1 - t0) / 1000)));
    $("#timeline").replaceChildren(names.length ? g : el("p", { class: "muted" }, "no stage has started yet"));
  }
  function colour(status) { return { succeeded: "#7fc97f", failed: "#f4a3a3", leaked: "#f4a3a3", running: "#8ab8f0", cancelled: "#e8cf80", interrupted: "#e8cf80" }[status] || "#ccc"; }
  function drawMemory() {
    const m = st.memory, box = $("#memory");
    if (!m || !m.gpus.length) { box.replaceChildren(el("p", { class: "muted" }, "no GPU on this host")); return; }
    const [t0, t1] = range(), spans = spansAll();
    // Only the GPUs this run's stages were given (by their start events and their verdicts).
    const used = new Set(spans.flatMap((sp) => sp.gpus));
    for (const n of st.order) for (const r of st.stages.get(n).gpu) used.add(r.uuid);
    const mine = m.gpus.filter((g) => used.has(g.uuid));
    if (!mine.length) { box.replaceChildren(el("p", { class: "muted", id: "no-gpu" }, st.order.some((n) => st.stages.get(n).spans.length) ? "this run used no GPU" : "no stage has started yet")); return; }
    box.replaceChildren(...mine.map((gpu) => {
      // A daemon restarted since the run ran has no samples of it: say so, not a flat 0 MiB.
      if (!gpu.samples.length) return el("p", { class: "muted", "data-gpu": gpu.uuid }, `${gpu.name} ${gpu.uuid}: no memory samples of this run (the daemon was not sampling while it ran; its verdicts are below)`);
      const W = 900, H = 170, L = 70, T = 18, B = 22, x = (t) => L + (W - L - 10) * (t - t0) / (t1 - t0);
      const top = Math.max(gpu.baseline_bytes || 0, ...gpu.samples.map((s) => s[1]), 1) * 1.1;
      const y = (b) => T + (H - T - B) * (1 - b / top);
      const g = svg("svg", { width: W, height: H, class: "chart", "data-gpu": gpu.uuid });
      g.append(svg("text", { x: 4, y: 12 }, `${gpu.name} ${gpu.uuid}${gpu.quarantined ? " (quarantined)" : ""}`));
      for (const sp of spans.filter((s) => s.gpus.includes(gpu.uuid))) {
        const rec = st.stages.get(sp.stage).gpu.find((r) => r.uuid === gpu.uuid && r.attempt === sp.attempt);
        const end = sp.end || t1;
        const r = svg("rect", { x: x(sp.start), y: T, width: Math.max(1, x(end) - x(sp.start)), height: H - T - B, fill: rec && rec.verdict !== "clean" ? "#f8d0d0" : "#e4efe4", class: "span" });
        r.append(svg("title", {}, `${sp.stage} #${sp.attempt}` + (rec ? `: ${rec.verdict}, baseline ${mib(rec.baseline_bytes)}, peak ${mib(rec.peak_bytes)}, after ${mib(rec.after_bytes)}, reclaim ${rec.reclaim_ms.toFixed(0)} ms` : "")));
        g.append(r, svg("text", { x: x(sp.start) + 2, y: T + 11 }, sp.stage.slice(0, 14)));
      }
      if (gpu.baseline_bytes != null) g.append(svg("line", { x1: L, x2: W - 10, y1: y(gpu.baseline_bytes), y2: y(gpu.baseline_bytes), stroke: "#555", "stroke-dasharray": "4 3" }), svg("text", { x: W - 130, y: y(gpu.baseline_bytes) - 3 }, "baseline " + mib(gpu.baseline_bytes)));
      const pts = gpu.samples.map(([t, b]) => `${x(t).toFixed(1)},${y(b).toFixed(1)}`).join(" ");
      g.append(svg("polyline", { points: pts, fill: "none", stroke: "#0969da", "stroke-width": 1.5, class: "used" }));
      g.append(svg("text", { x: 4, y: y(top / 1.1) + 4 }, mib(top / 1.1)), svg("text", { x: 4, y: H - B }, "0"), svg("text", { x: L, y: H - 6 }, "0 s"), svg("text", { x: W - 60, y: H - 6 }, secs((t1 - t0) / 1000)));
      return g;
    }));
  }
  function drawVerdicts() {
    const rows = [];
    for (const n of st.order) for (const g of st.stages.get(n).gpu) rows.push(el("tr", { "data-stage": n },
      el("td", {}, n), el("td", { class: "num" }, String(g.attempt)), el("td", {}, g.uuid), el("td", { class: "num" }, mib(g.baseline_bytes)),
      el("td", { class: "num" }, mib(g.peak_bytes)), el("td", { class: "num" }, mib(g.after_bytes)), el("td", { class: "num" }, (g.reclaim_ms < 10 ? g.reclaim_ms.toFixed(2) : g.reclaim_ms.toFixed(0)) + " ms"),
      el("td", { class: "status v-" + g.verdict }, g.verdict), el("td", {}, (g.holders || []).join(", "))));
    $("#verdicts tbody").replaceChildren(...rows.slice(-300));
  }
  // The selected stage: its progress and loss curves, its memory picture, its log tail.
  let logText = "", logStream = "stderr";
  function select(name) { st.selected = name; logText = "loading…"; fetchLog(); schedule(); }
  async function fetchLog() {
    if (!st.selected) return;
    const r = await fetch(`/api/runs/${encodeURIComponent(id)}/stages/${encodeURIComponent(st.selected)}/log?stream=${logStream}`, { credentials: "same-origin" });
    logText = await r.text(); schedule();
  }
  function curve(points, label, key) {
    const W = 440, H = 150, L = 50, T = 16, B = 20;
    const g = svg("svg", { width: W, height: H, class: "chart", "data-chart": key });
    g.append(svg("text", { x: 4, y: 12 }, label));
    if (points.length < 1) { g.append(svg("text", { x: L, y: H / 2 }, "no data yet")); return g; }
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
    const [x0, x1] = [Math.min(...xs), Math.max(...xs, Math.min(...xs) + 1)], [y0, y1] = [Math.min(...ys, 0), Math.max(...ys, 1e-9)];
    const px = (v) => L + (W - L - 10) * (v - x0) / (x1 - x0), py = (v) => T + (H - T - B) * (1 - (v - y0) / (y1 - y0));
    g.append(svg("polyline", { points: points.map((p) => `${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: "#8250df", "stroke-width": 1.5 }),
      svg("text", { x: 4, y: T + 8 }, (+y1.toPrecision(3)).toString()), svg("text", { x: 4, y: H - B }, (+y0.toPrecision(3)).toString()));
    return g;
  }
  function drawDetail() {
    const box = $("#stage-detail");
    if (!st.selected) { box.replaceChildren(); return; }
    const s = st.stages.get(st.selected);
    const prog = s.progress.map(([t, step]) => [(t - (s.spans[0] ? s.spans[0].start : t)) / 1000, step]);
    const loss = s.progress.filter((p) => p[3] != null).map(([, step, , l]) => [step, l]);
    const streams = el("select", { id: "log-stream" }, ...["stderr", "stdout"].map((v) => el("option", v === logStream ? { value: v, selected: "" } : { value: v }, v)));
    streams.addEventListener("change", () => { logStream = streams.value; fetchLog(); });
    // The log follows its tail unless the reader has scrolled up in it.
    const old = $("#log"), follow = !old || old.dataset.stage !== s.name || old.scrollTop + old.clientHeight >= old.scrollHeight - 8;
    const log = el("pre", { id: "log", "data-stage": s.name }, logText);
    box.replaceChildren(el("h3", {}, "Stage ", el("span", { id: "detail-name" }, s.name), " ", el("span", { class: "status s-" + s.status }, s.status)),
      el("div", {}, curve(prog, "progress: step over seconds", "progress"), " ", curve(loss, "loss over step", "loss")),
      el("div", { class: "controls" }, "log: ", streams, " ", el("button", { onclick: fetchLog }, "refresh")),
      log);
    log.scrollTop = follow ? log.scrollHeight : old.scrollTop;
  }

  const base = "/api/runs/" + encodeURIComponent(id);
  let reportTimer = null;
  async function refresh() {
    try {
      const r = await getJSON(base); st.info = r.info; st.report = r.report;
      if (r.stages && !st.meta.size) for (const m of r.stages) { st.meta.set(m.name, m); stage(m.name); }
      mergeReport(); schedule();
    } catch (e) { $("#run-summary").textContent = String(e); }
  }
  // The report of a big sweep is big: it is fetched less often the more stages the run has.
  function refreshSoon() { if (!reportTimer) reportTimer = setTimeout(() => { reportTimer = null; refresh(); }, 1500 + 2 * ((st.info && st.info.stages) || 0)); }
  async function memory() { try { st.memory = await getJSON(base + "/memory"); schedule(); } catch (e) { /* shown on the next success */ } }
  refresh(); memory();
  const source = new EventSource(base + "/events");
  // Each message is one event of the run, in order (a large run's batches keep each stage's
  // latest state: see the daemon's web::feed).
  const onEvent = (m) => {
    const { seq, event } = JSON.parse(m.data); st.events = seq + 1; apply(event);
    if (st.info) { if (event.event === "stage_finished" && event.status === "succeeded") st.info.succeeded += 1; st.info.state = st.info.finished_unix ? st.info.state : "running"; }
    if (event.event === "stage_finished" || event.event === "stage_skipped") { refreshSoon(); if (event.stage === st.selected) fetchLog(); }
    schedule();
  };
  source.addEventListener("message", onEvent);
  source.addEventListener("run", onEvent); // as daemons before the batches named them
  source.addEventListener("end", (m) => { source.close(); st.info = JSON.parse(m.data) || st.info; $("#conn").textContent = "run ended"; refresh(); memory(); });
  source.onopen = () => { $("#conn").textContent = "live"; };
  source.onerror = () => { $("#conn").textContent = "reconnecting…"; };
  const timer = setInterval(() => { if (!st.info || !st.info.finished_unix) { memory(); if (st.selected && st.stages.get(st.selected).status === "running") fetchLog(); } }, 2000);
  return () => { source.close(); clearInterval(timer); clearTimeout(reportTimer); clearTimeout(sweepTimer); };
}

function route() {
  if (current) current();
  const m = location.hash.match(/^#\/run\/(.+)$/);
  current = m ? runPage(decodeURIComponent(m[1])) : runsPage();
}
window.addEventListener("hashchange", route);
route();
