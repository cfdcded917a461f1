// loopbus dashboard: plain DOM, no framework. Data comes from /api/ as
// JSON and live from server-sent events; text is always set with
// textContent, never parsed as HTML.
"use strict";

const MAX_ROWS = 2000; // timeline rows kept in the page
const MAX_TOOLS = 500; // tool calls kept in the page

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}

function badge(status) {
  return el("span", { class: "st s-" + (status || "pending"), text: (status || "pending").replace("_", " ") });
}

function money(x) { return x ? "$" + x.toFixed(x < 1 ? 4 : 2) : "–"; }
function tokens(u) { return u ? (u.inputTokens || 0) + (u.outputTokens || 0) : 0; }
function size(n) {
  if (n < 1024) return n + " B";
  if (n < 1 << 20) return (n / 1024).toFixed(1) + " KiB";
  return (n / (1 << 20)).toFixed(1) + " MiB";
}
function dur(ms) {
  if (ms < 0 || !isFinite(ms)) return "–";
  if (ms < 1000) return ms + " ms";
  const s = Math.round(ms / 1000);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}
function when(t) { return t ? new Date(t).toLocaleString() : "–"; }
function showError(msg) {
  const e = document.getElementById("error");
  if (!e) return;
  e.hidden = !msg;
  e.textContent = msg || "";
}

async function api(path, opts) {
  const r = await fetch(path, Object.assign({ credentials: "same-origin", headers: { Accept: "application/json" } }, opts || {}));
  let body = null;
  try { body = await r.json(); } catch (_) { /* not JSON */ }
  if (!r.ok) throw new Error((body && body.error) || r.status + " " + r.statusText);
  return body;
}

// stream opens an EventSource with the given handlers and shows whether
// it is connected; the browser reconnects by itself.
function stream(url, handlers) {
  const live = document.getElementById("live");
  const es = new EventSource(url);
  es.onopen = () => { live.textContent = "● live"; live.classList.add("on"); };
  es.onerror = () => { live.textContent = "○ reconnecting"; live.classList.remove("on"); };
  for (const [name, fn] of Object.entries(handlers)) {
    es.addEventListener(name, (ev) => fn(JSON.parse(ev.data), ev));
  }
  return es;
}

// ---- sessions page ----

function sessionsPage() {
  const form = document.getElementById("filter");
  const params = new URLSearchParams(location.search);
  for (const name of ["status", "pipeline", "age"]) if (params.get(name)) form.elements[name].value = params.get(name);
  let pending = null, busy = false, again = false;

  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    const q = new URLSearchParams();
    for (const name of ["status", "pipeline", "age"]) if (form.elements[name].value) q.set(name, form.elements[name].value);
    try {
      const list = await api("/api/sessions?" + q);
      render(list);
      showError("");
    } catch (e) {
      showError("Could not list sessions: " + e.message);
    }
    busy = false;
    if (again) { again = false; schedule(); }
  }
  function schedule() {
    if (pending) return;
    pending = setTimeout(() => { pending = null; refresh(); }, 1000);
  }
  function render(list) {
    const body = document.querySelector("#sessions tbody");
    const rows = list.map((s) => {
      const end = s.status === "running" || s.status === "paused" ? Date.now() : Date.parse(s.updated);
      return el("tr", { "data-session": s.id },
        el("td", {}, el("a", { href: "/sessions/" + encodeURIComponent(s.id), text: s.id })),
        el("td", { text: s.pipeline + (s.kind ? " (" + s.kind + ")" : "") }),
        el("td", {}, badge(s.status), s.error ? el("div", { class: "muted", text: s.error }) : null),
        el("td", { class: "num", text: s.stepsDone + " / " + s.steps }),
        el("td", { class: "num", text: money(s.costUsd) }),
        el("td", { text: when(s.started) }),
        el("td", { class: "num", text: dur(end - Date.parse(s.started)) }));
    });
    body.replaceChildren(...rows);
    document.getElementById("empty").hidden = list.length > 0;
  }
  form.addEventListener("change", () => {
    const q = new URLSearchParams();
    for (const name of ["status", "pipeline", "age"]) if (form.elements[name].value) q.set(name, form.elements[name].value);
    history.replaceState(null, "", "?" + q);
    refresh();
  });
  form.addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
  refresh();
  stream("/api/updates", { changed: schedule, error: (d) => showError(d.error) });
  workers();
  setInterval(workers, 10000);
}

// workers shows the agent workers present and the lanes none serves.
async function workers() {
  const un = document.getElementById("unserved");
  let d;
  try { d = await api("/api/workers"); } catch (e) {
    un.textContent = "Could not list workers: " + e.message;
    un.hidden = false;
    return;
  }
  document.querySelector("#workers tbody").replaceChildren(...d.workers.map((w) => el("tr", { "data-worker": w.id },
    el("td", { text: w.id }),
    el("td", { text: w.host || "–" }),
    el("td", { text: (w.lanes || []).join(", ") }),
    el("td", { class: "num", text: String(w.concurrency || "–") }),
    el("td", { text: when(w.started) }),
    el("td", { text: when(w.seen) }))));
  const msg = d.workers.length === 0 ? "No agent worker is running: jobs wait."
    : d.unserved.length ? "No worker for lane " + d.unserved.join(", ") + ": jobs that need it wait." : "";
  un.textContent = msg;
  un.hidden = !msg;
}

// ---- session page ----

function sessionPage() {
  const id = document.body.dataset.session;
  const enc = encodeURIComponent(id);
  let manifest = null;
  const tools = new Map(); // job/tool id -> row element
  const timeline = document.querySelector("#timeline tbody");
  const box = document.getElementById("timeline");
  let seen = 0, rateStart = Date.now(), rateCount = 0;

  stream("/api/sessions/" + enc + "/events", {
    manifest: (m) => { manifest = m; render(m); },
    events: (d) => { addRows(d.rows, d.dropped); },
    error: (d) => showError("The event stream failed: " + d.error),
  });

  function rowOf(r) {
    return el("tr", { "data-seq": r.seq, "data-type": r.type },
      el("td", { class: "seq", text: r.seq }),
      el("td", { text: new Date(r.time).toLocaleTimeString() }),
      el("td", { text: r.type }),
      el("td", { class: "text", text: r.text }));
  }

  // earlier is the row that says older events are left out, with a
  // button that fetches them (GET .../rows?before=SEQ).
  function earlier(text) {
    const btn = el("button", { type: "button", id: "earlier", text: "show earlier events" });
    btn.addEventListener("click", showEarlier);
    return el("tr", { class: "earlier" }, el("td", {}), el("td", {}), el("td", {}), el("td", { class: "text muted" }, text + " ", btn));
  }

  // kept counts the rows fetched on demand: the newest MAX_ROWS plus
  // those stay in the page (up to 20,000 rows).
  let kept = 0;
  async function showEarlier() {
    const first = timeline.querySelector("tr[data-seq]");
    const before = first ? first.dataset.seq : "";
    const notice = timeline.querySelector("tr.earlier");
    try {
      const d = await api("/api/sessions/" + enc + "/rows?limit=500" + (before ? "&before=" + before : ""));
      const frag = document.createDocumentFragment();
      if (d.more) frag.append(earlier("… more earlier events"));
      for (const r of d.rows) frag.append(rowOf(r));
      if (notice) notice.remove();
      timeline.prepend(frag);
      kept = Math.min(kept + d.rows.length, 20000 - MAX_ROWS);
    } catch (e) { showError("Could not read earlier events: " + e.message); }
  }

  function addRows(rows, dropped) {
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    const frag = document.createDocumentFragment();
    if (dropped && !timeline.querySelector("tr.earlier")) frag.append(earlier("… " + dropped + " earlier events not shown"));
    for (const r of rows) {
      frag.append(rowOf(r));
      if (r.tool) tool(r);
    }
    timeline.append(frag);
    const extra = timeline.rows.length - MAX_ROWS - kept;
    for (let i = 0; i < extra; i++) timeline.deleteRow(0);
    if (extra > 0 && !timeline.querySelector("tr.earlier")) timeline.prepend(earlier("… earlier events not shown"));
    if (atBottom) box.scrollTop = box.scrollHeight;
    seen += rows.length;
    rateCount += rows.length;
    const now = Date.now();
    if (now - rateStart >= 1000) {
      document.getElementById("rate").textContent = seen + " events · " + Math.round(rateCount * 1000 / (now - rateStart)) + "/s";
      rateStart = now; rateCount = 0;
    }
  }

  function tool(r) {
    const key = r.job + "/" + r.tool.id;
    let tr = tools.get(key);
    const cells = [r.job, r.tool.name, r.tool.lane || "–", r.tool.status || "running", r.tool.durationMs ? dur(r.tool.durationMs) : "…"];
    if (!tr) {
      tr = el("tr", {}, ...cells.map((c) => el("td", { text: c })));
      tr.cells[3].replaceChildren(badge(cells[3] === "ok" ? "completed" : cells[3] === "running" ? "running" : "failed"));
      document.querySelector("#tools tbody").prepend(tr);
      tools.set(key, tr);
      if (tools.size > MAX_TOOLS) {
        const [first] = tools.keys();
        tools.get(first).remove();
        tools.delete(first);
      }
      return;
    }
    if (r.tool.status) {
      tr.cells[3].replaceChildren(badge(r.tool.status === "ok" ? "completed" : "failed"));
      tr.cells[3].title = r.tool.status;
      tr.cells[4].textContent = dur(r.tool.durationMs || 0);
    }
  }

  function render(m) {
    document.getElementById("status").replaceWith(Object.assign(badge(m.status), { id: "status" }));
    const u = m.usage || {};
    const b = m.budget || {};
    const parts = ["pipeline " + m.pipeline + (m.kind ? " (" + m.kind + ")" : ""), "started " + when(m.createdAt)];
    const live = m.status === "running" || m.status === "paused";
    const end = live ? Date.now() : Date.parse(m.updatedAt);
    parts.push((live ? "running for " : "ran for ") + dur(end - Date.parse(m.createdAt)));
    parts.push("cost " + money(u.costUsd) + (b.maxCostUsd ? " of " + money(b.maxCostUsd) : ""));
    parts.push(tokens(u) + " tokens" + (b.maxTokens ? " of " + b.maxTokens : ""));
    if (m.hold) parts.push(m.hold.kind + (m.hold.reason ? ": " + m.hold.reason : ""));
    if (m.error) parts.push("error: " + m.error);
    document.getElementById("summary").textContent = parts.join(" · ");
    lineage(m);
    stepOptions(m);
    controlsFor(m);
    drawGraph(m);
    jobs(m);
    artifacts(m);
    if (m.kind === "backlog") tasks();
    waiting(m);
    if (document.getElementById("manifest-box").open) document.getElementById("manifest").textContent = JSON.stringify(m, null, 2);
  }

  // controlsFor enables the controls that can act on the session as it
  // is now, and says on the others why they cannot.
  function controlsFor(m) {
    const ended = ["completed", "failed", "closed"].includes(m.status);
    const text = JSON.stringify(m.steps || {}) + JSON.stringify(m.loops || {});
    const held = ["paused", "stopped", "breaker", "waiting"].some((s) => text.includes('"status":"' + s + '"'));
    const gate = text.includes('"status":"awaiting_approval"');
    const why = ended ? "the session has ended (" + m.status + ")" : "";
    const rules = {
      pause: [m.status === "running", why || "the session is " + m.status],
      stop: [m.status === "running" || m.status === "paused", why || "the session is " + m.status],
      resume: [!ended && (m.status === "paused" || m.status === "stopped" || held), why || "nothing is paused, stopped or waiting"],
      hint: [!ended, why],
      invalidate: [!ended, why],
      approve: [!ended && gate, why || "no step awaits approval"],
      reject: [!ended && gate, why || "no step awaits approval"],
    };
    for (const btn of document.querySelectorAll(".controls button[data-verb]")) {
      const [ok, reason] = rules[btn.dataset.verb] || [!ended, why];
      setEnabled(btn, ok, reason);
    }
    for (const id of ["budget", "close"]) setEnabled(document.getElementById(id), !ended, why);
  }

  function setEnabled(btn, ok, reason) {
    if (!btn.dataset.title) btn.dataset.title = btn.title || "";
    btn.disabled = !ok;
    btn.title = ok ? btn.dataset.title : reason;
  }

  // lineage shows the fork tree around the session: where it was forked
  // from (its manifest's forkedFrom) and the sessions forked from it
  // (asked again at most every 5 s).
  let forks = [], forksAsked = 0;
  function lineage(m) {
    const p = document.getElementById("lineage");
    const link = (s) => el("a", { href: "/sessions/" + encodeURIComponent(s), text: s });
    const parts = [];
    const f = m.forkedFrom;
    if (f) parts.push("forked from ", link(f.session), " at stream seq " + f.seq + " (event " + f.event + ")" + (f.reason ? ": " + f.reason : ""));
    if (forks.length) {
      if (parts.length) parts.push(" · ");
      parts.push("forks: ");
      forks.forEach((k, i) => parts.push(...(i ? [", "] : []), link(k.session), " at seq " + k.seq));
    }
    p.replaceChildren(...parts);
    p.hidden = parts.length === 0;
    if (Date.now() - forksAsked < 5000) return;
    forksAsked = Date.now();
    api("/api/sessions/" + enc + "/forks").then((list) => {
      const changed = JSON.stringify(list) !== JSON.stringify(forks);
      forks = list || [];
      if (changed && manifest) lineage(manifest);
    }).catch((e) => showError("Could not read the session's forks: " + e.message));
  }

  function stepOptions(m) {
    const sel = document.getElementById("step");
    const names = m.stepOrder || Object.keys(m.steps || {});
    if (sel.options.length - 1 === names.length) return;
    const keep = sel.value;
    sel.replaceChildren(el("option", { value: "", text: "whole session" }), ...names.map((n) => el("option", { value: n, text: n })));
    sel.value = keep;
  }

  function node(name, st, extra) {
    st = st || {};
    const it = st.iterations ? "iteration " + st.iterations + (st.maxIterations ? " of " + st.maxIterations : "") : "not started";
    const meta = [it];
    if (st.worker) meta.push("on " + st.worker);
    if (st.usage && st.usage.costUsd) meta.push(money(st.usage.costUsd));
    if (st.hold) meta.push(st.hold.kind + (st.hold.reason ? ": " + st.hold.reason : ""));
    if (st.wait) meta.push("waits until " + when(st.wait.until));
    return el("div", { class: "node s-" + (st.status || "pending"), "data-step": name, "data-status": st.status || "pending" },
      el("div", { class: "name" }, name + " ", badge(st.status)),
      extra ? el("div", { class: "meta", text: extra }) : null,
      el("div", { class: "meta", text: meta.join(" · ") }),
      queued(st),
      st.errorMessage ? el("div", { class: "fb error", text: st.errorMessage }) : null,
      st.lastFeedback ? el("div", { class: "fb", text: "last feedback: " + st.lastFeedback }) : null,
      stepOutcome(st));
  }

  // queued says, on a step whose job waits for a worker to take it, that
  // it is queued, and why it may wait (from the waiting answer).
  function queued(st) {
    const j = manifest && manifest.jobs && manifest.jobs[st.jobId];
    if (!j || j.status !== "requested" || manifest.status !== "running") return null;
    const why = waitWhy.get(st.jobId);
    return el("div", { class: "meta queued", "data-part": "queued", text: "iteration " + (j.iteration || 1) + " queued" + (why ? ": " + why : ", waiting for a worker") });
  }

  // stepOutcome shows, on a step, how its newest job failed (when it did):
  // the validator's problems and the agent's output, folded.
  function stepOutcome(st) {
    const j = manifest && manifest.jobs && manifest.jobs[st.jobId];
    const o = outcomes.get(st.jobId);
    if (!j || !o || !failedJob(j)) return null;
    return el("div", { class: "outcome", "data-outcome": st.jobId },
      el("div", { class: "meta", text: "job " + st.jobId + " " + (j.verdict === "failed" ? "failed validation" : "failed") }),
      ...outcomeParts(o, false));
  }

  function dag(m) {
    document.getElementById("graph-title").textContent = m.kind === "backlog" ? "Runs" : "Steps";
    const steps = m.steps || {};
    const order = m.stepOrder || Object.keys(steps);
    const depth = {};
    const depthOf = (n, path) => {
      if (depth[n] !== undefined) return depth[n];
      if (path.has(n)) return 0;
      path.add(n);
      const req = (steps[n] && steps[n].requires) || [];
      const d = req.length ? 1 + Math.max(...req.map((r) => depthOf(r, path))) : 0;
      path.delete(n);
      return (depth[n] = d);
    };
    const cols = [];
    for (const n of order) {
      const d = depthOf(n, new Set());
      (cols[d] = cols[d] || []).push(n);
    }
    const graph = document.getElementById("graph");
    graph.className = "graph";
    graph.replaceChildren(...cols.filter(Boolean).map((c) => el("div", { class: "col" },
      ...c.map((n) => node(n, steps[n], steps[n] && steps[n].requires ? "after " + steps[n].requires.join(", ") : null)))));
    edges(graph, steps, order);
  }

  // edges draws an arrow from each step to each step that requires it:
  // side by side, from the right edge to the left; stacked (a narrow
  // screen), down the left side.
  function edges(graph, steps, order) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "edges");
    svg.setAttribute("aria-hidden", "true");
    const defs = document.createElementNS(ns, "defs");
    const marker = document.createElementNS(ns, "marker");
    for (const [k, v] of Object.entries({ id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" })) marker.setAttribute(k, v);
    const tip = document.createElementNS(ns, "path");
    tip.setAttribute("d", "M0,0 L10,5 L0,10 z");
    marker.append(tip);
    defs.append(marker);
    svg.append(defs);
    const box = graph.getBoundingClientRect();
    const ox = box.left - graph.scrollLeft, oy = box.top - graph.scrollTop;
    const at = (n) => graph.querySelector('.node[data-step="' + CSS.escape(n) + '"]');
    for (const n of order) {
      for (const r of (steps[n] && steps[n].requires) || []) {
        const from = at(r), to = at(n);
        if (!from || !to) continue;
        const a = from.getBoundingClientRect(), b = to.getBoundingClientRect();
        let d;
        if (b.left >= a.right) {
          const x1 = a.right - ox, y1 = a.top + a.height / 2 - oy, x2 = b.left - ox, y2 = b.top + b.height / 2 - oy;
          const mid = (x1 + x2) / 2;
          d = `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`;
        } else {
          const x1 = a.left + 6 - ox, y1 = a.bottom - oy, x2 = b.left + 6 - ox, y2 = b.top - oy;
          d = `M${x1},${y1} L${x2},${y2}`;
        }
        const p = document.createElementNS(ns, "path");
        p.setAttribute("d", d);
        p.setAttribute("marker-end", "url(#arrow)");
        p.dataset.from = r;
        p.dataset.to = n;
        svg.append(p);
      }
    }
    svg.setAttribute("width", graph.scrollWidth);
    svg.setAttribute("height", graph.scrollHeight);
    graph.prepend(svg);
  }
  let resizing = null;
  window.addEventListener("resize", () => {
    if (resizing) return;
    resizing = setTimeout(() => { resizing = null; if (manifest) drawGraph(manifest); }, 150);
  });

  function loopTree(m) {
    document.getElementById("graph-title").textContent = "Loops";
    const steps = m.steps || {};
    const kids = new Map();
    for (const l of m.loops || []) {
      const p = l.parent || "";
      if (!kids.has(p)) kids.set(p, []);
      kids.get(p).push(l);
    }
    const list = (parent, depth) => {
      const ls = kids.get(parent) || [];
      if (!ls.length || depth > 20) return null;
      return el("ul", {}, ...ls.map((l) => {
        // A running loop shows its step's hold or wait (as status does):
        // paused, waiting, awaiting approval.
        const step = steps[l.id] || {};
        const held = l.status === "running" && ["paused", "stopped", "breaker", "waiting", "awaiting_approval"].includes(step.status);
        const st = Object.assign({}, step, { status: held ? step.status : l.status });
        return el("li", {}, node(l.id, st, l.level + (l.title ? ": " + l.title : "") + (l.branch ? " · " + l.branch : "")), list(l.id, depth + 1));
      }));
    };
    const graph = document.getElementById("graph");
    graph.className = "tree";
    graph.replaceChildren(list("", 0) || el("p", { class: "muted", text: "No loop spawned yet." }));
  }

  // jobs lists the jobs in the order of their steps (the pipeline's),
  // then of their iterations: the manifest keys them by id, whose text
  // order puts iteration 10 before 2.
  function jobs(m) {
    const order = new Map((m.stepOrder || []).map((n, i) => [n, i]));
    const rank = (j) => (order.has(j.step) ? order.get(j.step) : order.size);
    const byNumber = new Intl.Collator(undefined, { numeric: true });
    const sorted = Object.entries(m.jobs || {}).sort(([ia, a], [ib, b]) =>
      rank(a) - rank(b) || byNumber.compare(a.step, b.step) || (a.round || 0) - (b.round || 0) ||
      (a.iteration || 0) - (b.iteration || 0) || byNumber.compare(ia, ib));
    const rows = [];
    for (const [jid, j] of sorted.slice(-300)) {
      const st = jobStatus(j);
      rows.push(el("tr", { "data-job": jid, "data-status": st },
        el("td", { text: jid }),
        el("td", { text: j.step + (j.iteration ? " #" + j.iteration : "") + (j.merge ? " (merge)" : "") }),
        el("td", {}, jobBadge(st), j.reason ? el("div", { class: "muted", text: j.reason }) : null),
        el("td", { text: j.worker || "–" }),
        el("td", { class: "num", text: tokens(j.usage) || "–" }),
        el("td", { class: "num", text: money(j.usage && j.usage.costUsd) })));
      const o = outcomes.get(jid);
      if (o && failedJob(j)) rows.push(el("tr", { class: "outcome", "data-outcome": jid }, el("td", { colspan: 6 }, ...outcomeParts(o, true))));
    }
    document.querySelector("#jobs tbody").replaceChildren(...rows);
    wantOutcomes(m);
  }

  // jobStatus is what a job's line says: a job whose agent exited 0 but
  // whose outputs the validator refused failed validation.
  function jobStatus(j) {
    return j.status === "completed" && j.verdict === "failed" ? "failed_validation" : j.status;
  }
  function jobBadge(st) {
    return st === "failed_validation" ? el("span", { class: "st s-failed", text: "failed validation" }) : badge(st);
  }
  function failedJob(j) { return j.status === "failed" || j.verdict === "failed"; }

  // outcomeParts renders how a job ended: its error, the validator's
  // problems and hint, and the end of the agent's output (stdout and
  // stderr), shown open when open is set.
  function outcomeParts(o, open) {
    const parts = [];
    if (o.error) parts.push(el("div", { class: "error", "data-part": "error", text: "error: " + o.error + (o.exitCode ? " (exit code " + o.exitCode + ")" : "") }));
    if (o.verdict === "failed") {
      parts.push(el("div", { "data-part": "validator" }, el("strong", { text: "validator: " }),
        el("ul", {}, ...(o.problems || []).map((p) => el("li", { text: p })),
          o.moreProblems ? el("li", { class: "muted", text: "… " + o.moreProblems + " more" }) : null)));
      if (o.retryHint) parts.push(el("div", { class: "muted", text: "hint for the next iteration: " + o.retryHint }));
    }
    if (o.outputTail) {
      parts.push(el("details", { open: open ? "" : null, "data-part": "output" },
        el("summary", { text: "agent output (stdout and stderr, last " + size(new TextEncoder().encode(o.outputTail).length) + ")" }),
        el("pre", { text: o.outputTail })));
    } else if (o.status === "failed") {
      parts.push(el("div", { class: "muted", text: "the agent printed nothing" }));
    }
    return parts;
  }

  // outcomes holds how the session's failed jobs ended (GET .../outcomes),
  // asked again when the set of failed jobs changes.
  const outcomes = new Map();
  let outcomesKey = "", outcomesTimer = null;
  function wantOutcomes(m) {
    const key = Object.entries(m.jobs || {}).filter(([, j]) => failedJob(j)).map(([id]) => id).sort().join(" ");
    if (key === outcomesKey || outcomesTimer) return;
    outcomesTimer = setTimeout(async () => {
      outcomesTimer = null;
      try {
        const list = await api("/api/sessions/" + enc + "/outcomes");
        outcomesKey = key;
        outcomes.clear();
        for (const o of list) outcomes.set(o.job, o);
        if (manifest) render(manifest);
      } catch (e) { showError("Could not read how the jobs ended: " + e.message); }
    }, 300);
  }

  function artifacts(m) {
    const list = [];
    const seenObj = new Set();
    const add = (a, step) => {
      if (!a || seenObj.has(a.object)) return;
      seenObj.add(a.object);
      list.push([a, step]);
    };
    add(m.input, "input");
    for (const n of m.stepOrder || []) for (const a of (m.steps[n] && m.steps[n].artifacts) || []) add(a, n);
    for (const a of m.final || []) add(a, "final");
    const link = (a, view, text) => el("a", { href: "/api/sessions/" + enc + "/artifact?object=" + encodeURIComponent(a.object) + (view ? "&view=1" : ""), text, target: view ? "_blank" : null, rel: "noopener" });
    // Several loops (or task runs) make outputs of one name: each says
    // which loop (its level and title) or task it is from.
    const loops = new Map((m.loops || []).map((l) => [l.id, l]));
    const from = (step) => {
      const l = loops.get(step);
      if (l) return step + " · " + l.level + (l.title ? ": " + l.title : "");
      const t = taskTitles.get(step.replace(/\.\d+$/, ""));
      return t ? step + " · task: " + t : step;
    };
    document.querySelector("#artifacts tbody").replaceChildren(...list.map(([a, step]) => el("tr", { "data-artifact": a.name, "data-from": step },
      el("td", { text: a.name }), el("td", { text: from(step) }), el("td", { class: "num", text: size(a.size || 0) }),
      el("td", { text: (a.digest || "").slice(0, 19) }),
      el("td", {}, link(a, true, "view"), " · ", link(a, false, "download")))));
  }

  let tasksTimer = null;
  const taskTitles = new Map(); // a backlog's task id -> its title
  function tasks() {
    if (tasksTimer) return;
    tasksTimer = setTimeout(async () => {
      tasksTimer = null;
      try {
        const tl = await api("/api/sessions/" + enc + "/tasks");
        const before = taskTitles.size;
        for (const t of tl.tasks || []) if (t.title) taskTitles.set(t.id, t.title);
        if (taskTitles.size !== before && manifest) artifacts(manifest);
        document.getElementById("tasks-section").hidden = false;
        document.querySelector("#tasks tbody").replaceChildren(...(tl.tasks || []).map((t) => el("tr", {},
          el("td", { text: t.id }), el("td", { text: t.title || "" }), el("td", {}, badge(t.status)),
          el("td", { class: "num", text: t.priority || "–" }),
          el("td", { class: "muted", text: (t.blockers || []).length ? "blocked by " + t.blockers.join(", ") : (t.notes || []).slice(-1).join("") }))));
      } catch (e) { showError("Could not read the task list: " + e.message); }
    }, 500);
  }

  // waiting says when the session's jobs wait for a worker ("no worker
  // for lane heavy"). The answer reads the session's history, so it is
  // asked when the jobs requested and not started change, and every 10 s
  // while there are any (workers come and go without an event of the
  // session).
  let waitTimer = null, waitTick = null, waitKey = "";
  const waitWhy = new Map(); // job -> why it waits
  function drawGraph(m) { if (m.kind === "loops") loopTree(m); else dag(m); }
  function waiting(m, tick) {
    const ids = m.status === "running" ? Object.entries(m.jobs || {}).filter(([, j]) => j.status === "requested").map(([id]) => id).sort() : [];
    const box = document.getElementById("unserved");
    if (!ids.length) {
      box.hidden = true;
      box.textContent = "";
      waitKey = "";
      waitWhy.clear();
      if (waitTick) { clearInterval(waitTick); waitTick = null; }
      return;
    }
    if (!waitTick) waitTick = setInterval(() => waiting(manifest, true), 10000);
    const key = ids.join(" ");
    if ((key === waitKey && !tick) || waitTimer) return;
    waitKey = key;
    waitTimer = setTimeout(async () => {
      waitTimer = null;
      try {
        const d = await api("/api/sessions/" + enc + "/waiting");
        const lines = d.waiting.filter((w) => w.job).map((w) => "Job " + w.job + " (" + w.step + "): " + w.message + ".");
        box.textContent = lines.join(" ");
        box.hidden = lines.length === 0;
        waitWhy.clear();
        for (const w of d.waiting) if (w.job && w.message) waitWhy.set(w.job, w.message);
        if (manifest) drawGraph(manifest);
      } catch (e) { showError("Could not tell which workers are present: " + e.message); }
    }, 300);
  }

  // The budget form and the close button: session.budget and
  // session.closed, as loopbus budget and loopbus close send them.
  const controls = document.getElementById("session-controls");
  const controlOut = document.getElementById("control-result");
  async function control(what, body) {
    controlOut.textContent = what + "…";
    try {
      const res = await api("/api/sessions/" + enc + "/" + what, { method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify(body) });
      controlOut.textContent = (what === "close" ? "closed" : "budget set") + " (recorded at stream sequence " + res.seq + ")";
      controlOut.dataset.result = "recorded";
      return true;
    } catch (e) {
      controlOut.textContent = what + " refused: " + e.message;
      controlOut.dataset.result = "error";
      return false;
    }
  }
  controls.addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = controls.elements;
    const body = {};
    if (f.maxCostUsd.value) body.maxCostUsd = Number(f.maxCostUsd.value);
    if (f.maxTokens.value) body.maxTokens = Number(f.maxTokens.value);
    if (f.maxIterations.value) body.maxIterations = Number(f.maxIterations.value);
    if (f.reason.value) body.reason = f.reason.value;
    if (await control("budget", body)) for (const name of ["maxCostUsd", "maxTokens", "maxIterations", "reason"]) f[name].value = "";
  });
  // Closing is for good: the first click asks, a second within 5 s closes.
  const closeBtn = document.getElementById("close");
  let armed = null;
  closeBtn.addEventListener("click", async () => {
    if (!armed) {
      closeBtn.textContent = "Close for good?";
      armed = setTimeout(() => { armed = null; closeBtn.textContent = "Close session"; }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    closeBtn.textContent = "Close session";
    const reason = controls.elements.reason.value;
    if (await control("close", reason ? { reason } : {})) controls.elements.reason.value = "";
  });

  document.getElementById("manifest-box").addEventListener("toggle", (e) => {
    if (e.target.open && manifest) document.getElementById("manifest").textContent = JSON.stringify(manifest, null, 2);
  });

  document.getElementById("text").addEventListener("input", (e) => { delete e.target.dataset.empty; });
  for (const btn of document.querySelectorAll(".controls button[data-verb]")) {
    btn.addEventListener("click", async () => {
      const verb = btn.dataset.verb;
      const step = document.getElementById("step").value;
      const text = document.getElementById("text").value;
      const out = document.getElementById("signal-result");
      const body = { verb };
      if (step) body.step = step;
      if (verb === "hint") body.message = text; else if (text) body.reason = text;
      out.textContent = verb + "…";
      try {
        const res = await api("/api/sessions/" + enc + "/signal", { method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify(body) });
        out.textContent = res.map((r) => r.signal + (r.step ? " " + r.step : "") + ": " + r.result + (r.detail ? " — " + r.detail : "")).join("; ") || "nothing to signal";
        out.dataset.result = res.length ? res[0].result : "";
        const input = document.getElementById("text");
        input.value = "";
        input.dataset.empty = "";
      } catch (e) {
        out.textContent = verb + " refused: " + e.message;
        out.dataset.result = "error";
      }
    });
  }
}

// ---- dead letters page ----

async function deadLettersPage() {
  try {
    const d = await api("/api/deadletters");
    document.getElementById("total").textContent = "(" + d.total + ")";
    document.querySelector("#letters tbody").replaceChildren(...d.letters.map((l) => el("tr", {},
      el("td", { text: when(l.stored) }),
      el("td", {}, l.session ? el("a", { href: "/sessions/" + encodeURIComponent(l.session), text: l.session }) : "–"),
      el("td", { text: l.consumer }),
      el("td", { text: l.reason }),
      el("td", {}, el("details", {}, el("summary", { text: l.subject + " #" + l.sourceSeq }), el("pre", { text: l.data }))))));
  } catch (e) { showError("Could not list dead letters: " + e.message); }
}

switch (document.body.dataset.page) {
  case "sessions": sessionsPage(); break;
  case "session": sessionPage(); break;
  case "deadletters": deadLettersPage(); break;
}
