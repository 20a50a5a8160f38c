// rlpost board: curves as inline SVG, live refresh. Text from runs is only ever
// set with textContent (never parsed as HTML), so model output cannot inject markup.
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
  "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
const W = 440, H = 210, L = 48, R = 10, T = 10, B = 28;

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(v) {
  if (!isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}

function drawChart(chart, axis, multi, tip) {
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.title = chart.title;
  const h = document.createElement("h3");
  h.textContent = chart.title;
  h.title = chart.text;
  box.appendChild(h);
  const pts = chart.series.flatMap(s => s.points);
  let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  let y0 = Math.min(...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" }, box);
  el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "frame" }, svg);
  const label = (x, y, text, anchor) => {
    const t = el("text", { x, y, "text-anchor": anchor, class: "tick" }, svg);
    t.textContent = text;
  };
  label(L - 4, T + 8, fmt(y1), "end");
  label(L - 4, H - B, fmt(y0), "end");
  label(L, H - B + 14, fmt(x0), "start");
  label(W - R, H - B + 14, fmt(x1), "end");
  label((L + W - R) / 2, H - 4, axis === "time" ? "seconds (cumulative step time)" : "step", "middle");
  const legend = document.createElement("ul");
  legend.className = "legend";
  chart.series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    el("polyline", {
      points: s.points.map(p => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" "),
      fill: "none", stroke: color, "stroke-width": 1.6, class: "line",
      "data-key": s.key, "data-run": s.run,
    }, svg);
    const r = s.points.length > 60 ? 1.5 : 3;  // dense curves: small dots, still hoverable
    for (const p of s.points) {
      const c = el("circle", {
        cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1), r, fill: color, class: "pt",
        "data-key": s.key, "data-run": s.run, "data-step": p[2], "data-value": p[1],
      }, svg);
      const text = `${multi ? s.run + " " : ""}${s.key} step ${p[2]}: ${fmt(p[1])}`;
      el("title", {}, c).textContent = text;
      c.addEventListener("mouseenter", ev => {
        tip.textContent = text;
        tip.hidden = false;
        tip.style.left = `${ev.pageX + 12}px`;
        tip.style.top = `${ev.pageY - 10}px`;
      });
      c.addEventListener("mouseleave", () => { tip.hidden = true; });
    }
    const li = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = color;
    li.appendChild(sw);
    const last = s.points[s.points.length - 1];
    li.appendChild(document.createTextNode(
      `${multi ? s.run + " · " : ""}${s.key} = ${fmt(last[1])} (step ${last[2]})`));
    legend.appendChild(li);
  });
  box.appendChild(legend);
  return box;
}

async function loadCharts(root) {
  const tip = document.getElementById("tip");
  const res = await fetch(root.dataset.src, { credentials: "same-origin" });
  if (!res.ok) { root.textContent = `could not load metrics (${res.status})`; return; }
  const data = await res.json();
  const runs = Object.keys(data.status);
  const frag = document.createDocumentFragment();
  for (const chart of data.charts) {
    if (chart.series.length) frag.appendChild(drawChart(chart, data.axis, runs.length > 1, tip));
  }
  root.replaceChildren(frag);
  if (!data.charts.length) root.textContent = "no metrics logged yet";
  for (const [run, status] of Object.entries(data.status)) {
    for (const s of document.querySelectorAll("[data-status-of]")) {
      if (s.dataset.statusOf === run) { s.textContent = status; s.className = `status ${status}`; }
    }
  }
  root.dataset.loaded = String(Date.now());
  if (Object.values(data.status).includes("running")) setTimeout(() => loadCharts(root), 3000);
}

async function loadLog(pre) {
  const res = await fetch(pre.dataset.log, { credentials: "same-origin" });
  if (res.ok) pre.textContent = await res.text();
  const running = [...document.querySelectorAll("[data-status-of]")]
    .some(s => s.textContent === "running");
  if (running) setTimeout(() => loadLog(pre), 3000);
}

function refreshList(box) {
  setInterval(async () => {
    const res = await fetch(location.href, { credentials: "same-origin" });
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    const fresh = doc.querySelector("[data-refresh]");
    if (!fresh) return;
    const checked = new Set([...box.querySelectorAll("input:checked")].map(i => i.value));
    box.replaceChildren(...fresh.childNodes);
    for (const i of box.querySelectorAll("input[type=checkbox]")) i.checked = checked.has(i.value);
  }, Number(box.dataset.refresh));
}

function keyFilter(input) {
  input.addEventListener("input", () => {
    const q = input.value.trim().toLowerCase();
    for (const row of document.querySelectorAll("tr.key")) {
      row.hidden = q !== "" && !row.dataset.key.toLowerCase().includes(q);
    }
    if (q) for (const d of document.querySelectorAll("form.launch details")) d.open = true;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const charts = document.getElementById("charts");
  if (charts) loadCharts(charts);
  for (const pre of document.querySelectorAll("pre[data-log]")) loadLog(pre);
  for (const box of document.querySelectorAll("[data-refresh]")) refreshList(box);
  const filter = document.getElementById("keyfilter");
  if (filter) keyFilter(filter);
});
