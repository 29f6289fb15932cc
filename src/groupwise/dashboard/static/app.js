// groupwise dashboard: polls the JSON API every 2 s and draws runs, curves (uPlot), rollouts and tokens.
"use strict";

const POLL_MS = 2000;
const KEY = new URLSearchParams(location.hash.slice(1)).get("key");
const COLOURS = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];
const S = { view: "runs", run: null, overlay: new Set(), runs: [], charts: {}, curves: {}, steps: {},
            rollouts: { split: null, step: null, group: null, traj: null }, tokenMode: "loss", lastOk: 0 };
window.gw = S; // the browser test reads the charts' data from here

async function api(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const r = await fetch(`/api/${path}?${q}`, { headers: KEY ? { Authorization: `Bearer ${KEY}` } : {} });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.text()).slice(0, 200)}`);
  S.lastOk = Date.now();
  return r.json();
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined) e.append(kid instanceof Node ? kid : String(kid));
  return e;
}
const fmt = (v, d = 3) => (v === null || v === undefined || Number.isNaN(v)) ? "–" : (+v).toFixed(d);
const withCi = (p) => p ? el("span", {}, fmt(p.value), p.lo !== null ? el("span", { class: "ci" }, ` [${fmt(p.lo)}, ${fmt(p.hi)}]`) : null) : "–";

// ------------------------------------------------------------------------------------------ views

function show(view) {
  S.view = view;
  document.querySelectorAll("#tabs button").forEach(b => b.classList.toggle("active", b.dataset.view === view));
  document.querySelectorAll(".view").forEach(v => v.classList.toggle("active", v.id === `view-${view}`));
  refresh();
}
document.querySelectorAll("#tabs button").forEach(b => b.addEventListener("click", () => show(b.dataset.view)));

function selectRun(id) {
  if (S.run !== id) { S.run = id; S.rollouts = { split: null, step: null, group: null, traj: null }; destroyCharts(); }
  document.getElementById("current-run").textContent = id || "";
}

// ------------------------------------------------------------------------------------------ runs

async function refreshRuns() {
  const data = await api("runs");
  S.runs = data.runs;
  document.getElementById("root").textContent = data.root;
  document.getElementById("runs-empty").hidden = data.runs.length > 0;
  if (!S.run && data.runs.length) selectRun(data.runs[0].id);
  const body = document.querySelector("#runs-table tbody");
  body.replaceChildren(...data.runs.map(r => {
    const box = el("input", { type: "checkbox", title: "draw on the shared axes", onclick: (e) => {
      e.stopPropagation(); e.target.checked ? S.overlay.add(r.id) : S.overlay.delete(r.id); destroyCharts(); } });
    box.checked = S.overlay.has(r.id);
    return el("tr", { class: "run-row" + (r.id === S.run ? " selected" : ""), "data-run": r.id, "data-state": r.state,
                      onclick: () => { selectRun(r.id); show("curves"); } },
      el("td", {}, box), el("td", {}, r.id),
      el("td", { title: r.detail || "" }, el("span", { class: `state state-${r.state}` }, r.state), " ", el("span", { class: "ci" }, r.detail || "")),
      el("td", { class: "latest-step" }, r.latest_step ?? "–"), el("td", {}, r.best_step ?? "–"),
      el("td", {}, withCi(r.base)), el("td", {}, withCi(r.best)),
      el("td", {}, fmt(r.minutes, 1)), el("td", {}, fmt(r.steps_per_min, 2)), el("td", {}, r.alerts));
  }));
}

// ------------------------------------------------------------------------------------------ curves

function destroyCharts() {
  for (const c of Object.values(S.charts)) c.u.destroy();
  S.charts = {};
  document.getElementById("charts").replaceChildren();
}

// One x axis for several series whose steps differ (runs of a sweep): the union, gaps as null.
function align(pairs) {
  const xs = [...new Set(pairs.flatMap(p => p[0]))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  return [xs, ...pairs.map(([px, py]) => { const y = xs.map(() => null); px.forEach((x, i) => { y[at.get(x)] = py[i]; }); return y; })];
}

function markersPlugin(name) {
  // alerts as triangles over the plot (clickable: they open the evidence), the stop as a dotted line
  return { hooks: { draw: (u) => {
    u.over.querySelectorAll(".alert-marker,.stop-marker").forEach(m => m.remove());
    const cv = S.curves[S.run];
    if (!cv) return;
    for (const a of cv.alerts) {
      const x = u.valToPos(a.step, "x");
      if (!(x >= 0 && x <= u.over.clientWidth)) continue;
      const m = el("div", { class: `alert-marker ${a.severity}`, "data-step": a.step, "data-name": a.name,
                            title: `step ${a.step}: ${a.name} (${a.severity}): ${a.message}`, onclick: () => openEvidence(a) });
      m.style.left = `${x}px`;
      u.over.append(m);
    }
    if (cv.stop) {
      const x = u.valToPos(cv.stop.step, "x");
      if (x >= 0 && x <= u.over.clientWidth) {
        const s = el("div", { class: "stop-marker", title: `stop: ${cv.stop.rule}: ${cv.stop.reason} (click: step 0 against the best step)`, onclick: openStop });
        s.style.left = `${x}px`; u.over.append(s);
      }
    }
  } } };
}

// A flat curve (KL 0 before any drift) gets a band around its value rather than 0..100.
function yRange(u, min, max) {
  if (min === null || max === null) return [0, 1];
  return min === max ? [min - Math.max(1, Math.abs(min)) / 2, max + Math.max(1, Math.abs(max)) / 2] : uPlot.rangeNum(min, max, 0.1, true);
}

function chart(id, title, series, data, opts) {
  const width = Math.max(480, Math.min(760, document.getElementById("charts").clientWidth / 2 - 30));
  const existing = S.charts[id];
  if (existing && existing.n === series.length) { existing.u.setData(data); spanOne(existing.u, data); return; }
  if (existing) { existing.u.destroy(); existing.box.remove(); }
  const box = el("div", { class: "chart", id: `chart-${id}` }, el("h4", {}, title));
  document.getElementById("charts").append(box);
  const u = new uPlot({ width, height: 220, series: [{ label: "step" }, ...series], bands: (opts && opts.bands) || [],
                        scales: { x: { time: false }, y: { range: opts && opts.y ? opts.y : yRange } },
                        axes: [{ label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, {}], plugins: [markersPlugin(id)] }, data, box);
  S.charts[id] = { u, n: series.length, box };
  spanOne(u, data);
}

// uPlot draws a lone x value on 0..100 whatever the range function says: span the run's steps instead
function spanOne(u, data) {
  const [a, b] = S.stepSpan || [0, 0];
  if (data[0].length === 1 && a < b) u.setScale("x", { min: Math.min(a, data[0][0]), max: Math.max(b, data[0][0]) });
}

const line = (label, stroke, extra) => Object.assign({ label, stroke, width: 1.5, spanGaps: true, points: { size: 4 } }, extra || {});
const bandEdge = (label, stroke) => ({ label, stroke, width: 0.5, dash: [3, 3], spanGaps: true, points: { show: false } });

async function refreshCurves() {
  if (!S.run) return;
  const ids = [S.run, ...[...S.overlay].filter(r => r !== S.run)];
  const all = await Promise.all(ids.map(r => api("curves", { run: r })));
  ids.forEach((r, i) => { S.curves[r] = all[i]; });
  const cv = all[0];
  const multi = ids.length > 1;
  const steps = all.flatMap(c => [...c.train.step, ...c.val.step]);
  S.stepSpan = steps.length ? [Math.min(...steps), Math.max(...steps)] : null;
  // train reward: the mean with +-1 std over the step's rollouts (a band); other runs' means beside it
  const tr = [[cv.train.step, cv.train.reward], [cv.train.step, cv.train.hi], [cv.train.step, cv.train.lo],
              ...all.slice(1).map(c => [c.train.step, c.train.reward])];
  chart("reward", "train reward (mean, ±1 std over rollouts)" + (multi ? " — runs on shared axes" : ""),
        [line(multi ? `${ids[0]} reward` : "reward", COLOURS[0]), bandEdge("+1 std", COLOURS[0]), bandEdge("-1 std", COLOURS[0]),
         ...ids.slice(1).map((r, i) => line(`${r} reward`, COLOURS[(i + 1) % COLOURS.length]))],
        align(tr), { bands: [{ series: [2, 3], fill: "rgba(31,119,180,0.18)" }] });
  // validation: the metric with its confidence interval (a band), every baseline as a flat line
  const metric = cv.metric || "validation";
  const xs = [...cv.val.step];
  const vp = [[cv.val.step, cv.val.value], [cv.val.step, cv.val.hi], [cv.val.step, cv.val.lo],
              ...all.slice(1).map(c => [c.val.step, c.val.value])];
  const aligned = align(vp.length ? vp : [[xs, []]]);
  const base = cv.baselines.filter(b => b.value !== undefined && b.value !== null);
  base.forEach(b => aligned.push(aligned[0].map(() => b.value)));
  chart("val", `validation ${metric} (95% interval band), baselines dashed`,
        [line(multi ? `${ids[0]} ${metric}` : metric, "#2ca02c"), bandEdge("interval hi", "#2ca02c"), bandEdge("interval lo", "#2ca02c"),
         ...ids.slice(1).map((r, i) => line(`${r} ${metric}`, COLOURS[(i + 1) % COLOURS.length])),
         ...base.map((b, i) => line(`baseline ${b.name}`, "#888", { dash: [6, 4], points: { show: false } }))],
        aligned, { bands: [{ series: [2, 3], fill: "rgba(44,160,44,0.18)" }] });
  // the judge's agreement comes from the trajectory files (slow the first time on a long run): not awaited
  if (!S.judgeBusy) {
    S.judgeBusy = true;
    const run = S.run;
    api("judge", { run }).then(ja => {
      if (run === S.run && ja.step.length)
        chart("judge", "judge agreement with ground truth (share of pairs ordered alike)", [line("agreement", "#9467bd")],
              [ja.step, ja.value], { y: [0, 1.05] });
    }).catch(e => console.warn(String(e))).finally(() => { S.judgeBusy = false; });
  }
  const m = cv.metrics;
  const groups = [["loss", "losses", ["loss", "policy_loss"]], ["kl", "KL to the reference", ["kl"]],
                  ["grad", "gradient norm", ["grad_norm"]], ["tokens", "tokens per step", ["trainable_tokens", "forced_tokens", "padded_tokens"]],
                  ["spread", "reward spread within groups; zero-variance share", ["reward_std_within_group", "zero_variance_fraction"]]];
  for (const [id, title, keys] of groups) {
    const present = keys.filter(k => m[k]);
    if (!present.length) continue;
    // the other ticked runs' same curves beside these (dashed), on the shared step axis
    const pairs = present.map(k => [m.step, m[k]]);
    const series = present.map((k, i) => line(multi ? `${ids[0]} ${k}` : k, COLOURS[i]));
    all.slice(1).forEach((c, r) => present.forEach((k, i) => {
      if (!c.metrics[k]) return;
      pairs.push([c.metrics.step, c.metrics[k]]);
      series.push(line(`${ids[r + 1]} ${k}`, COLOURS[(present.length + r * present.length + i) % COLOURS.length], { dash: [4, 3] }));
    }));
    chart(id, title + (multi ? " — runs on shared axes" : ""), series, align(pairs));
  }
  const ph = cv.phases;
  if (ph.step.length)
    chart("phases", "seconds per phase", ["gather_s", "reward_s", "train_s", "val_s"].map((k, i) => line(k, COLOURS[i])),
          [ph.step, ph.gather_s, ph.reward_s, ph.train_s, ph.val_s]);
  const stop = document.getElementById("stop-line");
  stop.textContent = cv.stop ? `stopped at step ${cv.stop.step} (${cv.stop.rule}): ${cv.stop.reason}; best ${cv.stop.best_metric} at step ${cv.stop.best_step}` : "";
  document.getElementById("alerts-list").replaceChildren(...(cv.alerts.length ? cv.alerts.map(a =>
    el("li", { class: "alert-item", "data-step": a.step },
      el("span", { class: `sev-${a.severity}` }, a.kind ? `${a.severity} · ${a.kind}` : a.severity), ` step ${a.step} `, el("b", {}, a.name), `: ${a.message} `,
      el("a", { onclick: () => openEvidence(a) }, "evidence →"),
      el("div", { class: "kv" }, JSON.stringify(a.evidence)))) : [el("li", { class: "hint" }, "no alerts")]));
  for (const c of Object.values(S.charts)) c.u.redraw(false, false);
}

// the stop's evidence: what training changed from step 0 to the step the loop kept (the same validation scenarios)
function openStop() {
  const f = document.getElementById("compare-form");
  f.a.value = "0"; f.b.value = "best";
  if (S.steps.val) f.split.value = "val";
  show("compare"); compare();
}

function openEvidence(a) {
  S.rollouts = { split: a.link.split, step: a.link.step, group: a.link.group, traj: null };
  show("rollouts");
}

// ------------------------------------------------------------------------------------------ rollouts

function options(select, values, current) {
  const have = [...select.options].map(o => o.value).join(",");
  if (have !== values.join(",")) select.replaceChildren(...values.map(v => el("option", { value: v }, v)));
  if (current !== null && current !== undefined) select.value = String(current);
}

async function refreshRollouts() {
  if (!S.run) return;
  S.steps = await api("steps", { run: S.run });
  const f = document.getElementById("filters");
  const splits = Object.keys(S.steps);
  if (!splits.length) return;
  const R = S.rollouts;
  if (!R.split || !S.steps[R.split]) R.split = splits.includes("train") ? "train" : splits[0];
  const steps = S.steps[R.split];
  if (R.step === null || !steps.includes(R.step)) R.step = steps[steps.length - 1];
  options(f.split, splits, R.split);
  options(f.step, steps, R.step);
  const cf = document.getElementById("compare-form");
  options(cf.split, splits, cf.split.value || (splits.includes("val") ? "val" : splits[0]));
  const data = await api("groups", { run: S.run, split: R.split, step: R.step });
  const gdiv = document.getElementById("groups");
  gdiv.replaceChildren(el("div", { class: "hint" }, `${R.split} step ${R.step}: ${data.groups.length} groups, rollouts ranked by reward`),
    ...data.groups.map(g => el("div", { class: "group" + (g.group === R.group ? " highlight" : ""), "data-group": g.group },
      el("div", { class: "group-head" }, el("b", {}, `group ${g.group}`), ` · scenario ${g.scenario} · mean reward ${fmt(g.mean_reward)} · ${g.prompt}`,
        g.exceptions.length ? el("span", { class: "sev-critical" }, ` · ${g.exceptions.length} exception(s)`) : null),
      g.exceptions.length ? el("details", { class: "group-exceptions" }, el("summary", {}, "the rollouts that raised (counted, not trained)"),
        g.exceptions.join("\n")) : null,
      el("div", { class: "group-trajs" }, ...g.trajectories.map(t => trajCard(t))))));
  const hl = gdiv.querySelector(".group.highlight");
  if (hl && !R.scrolled) { hl.scrollIntoView({ block: "center" }); R.scrolled = true; }
  if (R.traj) await showTrajectory(R.traj);
}

function trajCard(t) {
  const sel = S.rollouts.traj && S.rollouts.traj.group === t.group && S.rollouts.traj.index === t.index && S.rollouts.traj.step === t.step;
  return el("div", { class: "traj-card" + (sel ? " selected" : ""), "data-reward": t.reward, onclick: () => showTrajectory(t) },
    el("div", {}, el("span", { class: "reward" }, `reward ${fmt(t.reward)}`), t.advantage !== null ? el("span", { class: "ci" }, ` adv ${fmt(t.advantage, 2)}`) : null),
    el("div", { class: "answer" }, t.answer));
}

async function search(ev) {
  if (ev) ev.preventDefault();
  const progress = await api("indexed", { run: S.run });
  if (progress.indexed < progress.files)  // the first search parses what the background indexer has not yet
    document.getElementById("search-results").replaceChildren(
      el("div", { class: "hint" }, `searching: ${progress.files - progress.indexed} of ${progress.files} step files still to read…`));
  const f = document.getElementById("filters");
  const params = { run: S.run, split: f.split.value };
  for (const k of ["step_min", "step_max", "reward_min", "reward_max", "q", "order"]) params[k] = f[k].value;
  const data = await api("rollouts", params);
  document.getElementById("search-results").replaceChildren(
    el("div", { class: "hint" }, `${data.total} rollouts match; the first ${data.rollouts.length}:`),
    ...data.rollouts.map(t => el("div", { class: "result-row", onclick: () => showTrajectory(t) },
      `${t.split} step ${t.step} · group ${t.group} · #${t.index} · reward ${fmt(t.reward)} · `, el("span", { class: "ci" }, t.answer))));
}
document.getElementById("filters").addEventListener("submit", search);
function extremes(order) {
  const f = document.getElementById("filters");
  f.step_min.value = f.step_max.value = S.rollouts.step;
  f.reward_min.value = f.reward_max.value = f.q.value = "";
  f.order.value = order;
  search();
}
document.getElementById("best-of-step").addEventListener("click", () => extremes("best"));
document.getElementById("worst-of-step").addEventListener("click", () => extremes("worst"));
document.getElementById("filters").split.addEventListener("change", (e) => { S.rollouts.split = e.target.value; S.rollouts.step = null; refreshRollouts(); });
document.getElementById("filters").step.addEventListener("change", (e) => { S.rollouts.step = +e.target.value; S.rollouts.group = null; refreshRollouts(); });

async function showTrajectory(t) {
  S.rollouts.traj = { split: t.split, step: t.step, group: t.group, index: t.index };
  const box = document.getElementById("trajectory");
  let d;
  try { d = await api("trajectory", { run: S.run, split: t.split, step: t.step, group: t.group, index: t.index }); }
  catch (e) { box.replaceChildren(el("div", { class: "hint error" }, String(e.message))); return; }
  const modes = ["loss", "logprob", "advantage"].map(m => el("label", {},
    (() => { const r = el("input", { type: "radio", name: "tokmode", value: m, onchange: () => { S.tokenMode = m; showTrajectory(t); } }); r.checked = S.tokenMode === m; return r; })(), ` ${m} `));
  box.replaceChildren(...[
    el("h3", {}, `${d.split} step ${d.step} · group ${d.group} · trajectory ${d.index}`),
    el("div", { class: "kv" }, `reward ${fmt(d.reward, 4)}  advantage ${d.advantage === null ? "none (the group's rewards were equal: nothing trained)" : fmt(d.advantage, 3)}`),
    el("div", { class: "kv" }, "metrics: " + JSON.stringify(d.metrics)),
    Object.keys(d.metadata).length ? el("div", { class: "kv" }, "metadata: " + JSON.stringify(d.metadata)) : null,
    d.tools.length ? el("div", { class: "kv" }, "tools: " + d.tools.join(", ")) : null,
    d.logs.length ? el("div", {}, el("b", {}, "logs"), el("span", { class: "ci" }, " (the rollout's notes; a judge writes its explanation here)"), el("div", { class: "logs" }, d.logs.join("\n"))) : null,
    el("div", { class: "legend" }, "tokens by ", ...modes,
      el("span", { class: "tok loss-trained" }, "trained"), el("span", { class: "tok loss-forced" }, "grammar-forced"), el("span", { class: "tok loss-masked" }, "masked")),
    ...d.messages.map(m => messageView(m, d.advantage)),
    ...d.side.map((h, i) => el("details", {}, el("summary", {}, `side conversation ${i + 1}`), ...h.map(m => messageView(m, null))))]
    .filter(x => x !== null));
  document.querySelectorAll(".traj-card").forEach(c => c.classList.remove("selected"));
}

function messageView(m, advantage) {
  const kids = [el("div", { class: "role" }, m.role + (m.sampled ? " (sampled)" : "") + (m.tool_call_id ? ` → result of ${m.tool_call_id}` : ""))];
  if (m.tokens) kids.push(tokenView(m.tokens, advantage)); else if (m.content) kids.push(el("div", { class: m.sampled ? "" : "tok loss-masked" }, m.content));
  for (const c of m.tool_calls) kids.push(el("div", { class: "tool-call" }, `→ ${c.name}(${c.arguments})`));
  return el("div", { class: `msg role-${m.role}` }, ...kids);
}

function tokenView(tokens, advantage) {
  return el("div", { class: "tokens" }, ...tokens.map(t => {
    const s = el("span", { class: `tok loss-${t.loss}`, "data-loss": t.loss,
                           title: `id ${t.id} · logprob ${fmt(t.logprob)} · ${t.loss}` + (advantage !== null ? ` · advantage ${fmt(advantage, 2)}` : "") },
                 t.text !== null ? t.text : `⟨${t.id}⟩`);
    if (S.tokenMode === "logprob" && t.logprob !== null) {
      s.style.background = `hsl(${Math.round(120 * Math.exp(t.logprob))}, 70%, 80%)`; // red unlikely .. green certain
    } else if (S.tokenMode === "advantage" && advantage !== null && t.loss === "trained") {
      const a = Math.max(-1, Math.min(1, advantage / 2));
      s.style.background = a >= 0 ? `rgba(40,160,60,${0.15 + 0.6 * a})` : `rgba(210,40,40,${0.15 - 0.6 * a})`;
    }
    return s;
  }));
}

// ------------------------------------------------------------------------------------------ compare

async function compare(ev) {
  if (ev) ev.preventDefault();
  const f = document.getElementById("compare-form");
  let data;
  try { data = await api("compare", { run: S.run, split: f.split.value, a: f.a.value, b: f.b.value }); }
  catch (e) { document.getElementById("compare").replaceChildren(el("div", { class: "hint" }, String(e.message))); return; }
  const cell = (ts) => el("td", {}, ...ts.map(t => el("div", { class: "cmp-traj", onclick: () => { S.rollouts = { split: t.split, step: t.step, group: t.group, traj: t }; show("rollouts"); } },
    el("b", {}, fmt(t.reward)), " ", t.answer)));
  document.getElementById("compare").replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, el("th", {}, "scenario"), el("th", {}, `step ${data.a}`), el("th", {}, `step ${data.b}`))),
    el("tbody", {}, ...data.scenarios.map(s => el("tr", { class: "cmp-row" }, el("td", {}, `${s.scenario}: ${s.prompt}`), cell(s.a), cell(s.b))))));
}
document.getElementById("compare-form").addEventListener("submit", compare);

// ------------------------------------------------------------------------------------------ polling

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    await refreshRuns();
    if (S.view === "curves") await refreshCurves();
    else if (S.view === "rollouts") await refreshRollouts();
    else if (S.view === "compare" && S.run) { await refreshRollouts(); if (!document.querySelector("#compare table")) await compare(); }
  } catch (e) {
    console.warn(String(e));
  } finally {
    busy = false;
    const live = document.getElementById("live");
    const stale = Date.now() - S.lastOk > 3 * POLL_MS;
    live.classList.toggle("stale", stale);
    live.textContent = stale ? "not updating" : "live";
  }
}
refresh();
setInterval(refresh, POLL_MS);
