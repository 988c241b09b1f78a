// The live dashboard: polls /dashboard/state every second and draws the numbers, the step timeline and the roofline.
"use strict";

const COLORS = { prefill: "#f0a030", decode: "#3da5f0", mixed: "#b070e0" };
const TIMELINE_S = 60;

function $(id) { return document.getElementById(id); }

function fmt(value, digits = 1) {
  return value === null || value === undefined ? "–" : value.toFixed(digits);
}

function si(value, unit) {
  const prefixes = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [scale, p] of prefixes) if (value >= scale) return (value / scale).toFixed(1) + " " + p + unit;
  return value.toFixed(1) + " " + unit;
}

function showLatency(name, stats) {
  for (const key of ["p50", "p90", "p99", "mean"]) {
    $(`${name}-${key}`).textContent = stats ? fmt(stats[key]) + " ms" : "–";
  }
  $(`${name}-count`).textContent = stats ? stats.count : "0";
}

function drawTimeline(steps) {
  const canvas = $("timeline"), ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 40, bottom = 20;
  ctx.clearRect(0, 0, w, h);
  const recent = steps.filter(s => s.age_s <= TIMELINE_S);
  const maxBatch = Math.max(1, ...recent.map(s => s.batch));
  ctx.strokeStyle = "#2a3540"; ctx.fillStyle = "#8a96a3"; ctx.font = "11px sans-serif";
  const tick = Math.max(1, Math.ceil(maxBatch / 4));
  for (let b = 0; b <= maxBatch; b += tick) {
    const y = (h - bottom) * (1 - b / maxBatch);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText(b, 4, Math.max(y, 10));
  }
  for (let t = 0; t <= TIMELINE_S; t += 10) {
    const x = w - (w - left) * t / TIMELINE_S;
    ctx.fillText(t === 0 ? "now" : `-${t}s`, Math.min(x, w - 24), h - 4);
  }
  for (const s of recent) {
    const x = w - (w - left) * s.age_s / TIMELINE_S;
    const width = Math.max(2, (w - left) * (s.ms / 1000) / TIMELINE_S);
    const height = (h - bottom) * s.batch / maxBatch;
    ctx.fillStyle = COLORS[s.phase] || "#888";
    ctx.fillRect(x - width, h - bottom - height, width, height);
  }
}

function drawRoofline(roof) {
  const canvas = $("roofline"), ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 70, bottom = 30, top = 10;
  ctx.clearRect(0, 0, w, h);
  // one roof per compute path: quantized weights decode on weight-only kernels, prefill widens them to float
  const peaks = roof.peaks.slice().sort((a, b) => b.flops_per_s - a.flops_per_s);
  const peak = peaks[0].flops_per_s, bw = roof.bandwidth_bytes_per_s;
  const ridge = Math.min(...peaks.map(p => p.flops_per_s)) / bw;
  // log axes wide enough for the roof and every point (a point above the roof means the probe underestimated it)
  const xs = roof.points.map(p => p.intensity), ys = roof.points.map(p => p.flops_per_s);
  const xMin = Math.floor(Math.log10(Math.min(ridge / 10, ...xs) / 2));
  const xMax = Math.ceil(Math.log10(Math.max(ridge * 100, ...xs) * 2));
  const yMax = Math.log10(Math.max(peak, ...ys) * 3);
  const yMin = Math.log10(Math.min(bw * 10 ** xMin, ...ys) / 3);
  const X = i => left + (w - left - 10) * (Math.log10(i) - xMin) / (xMax - xMin);
  const Y = f => top + (h - top - bottom) * (1 - (Math.log10(f) - yMin) / (yMax - yMin));
  ctx.strokeStyle = "#2a3540"; ctx.fillStyle = "#8a96a3"; ctx.font = "11px sans-serif";
  for (let e = Math.ceil(xMin); e <= xMax; e++) {
    ctx.beginPath(); ctx.moveTo(X(10 ** e), top); ctx.lineTo(X(10 ** e), h - bottom); ctx.stroke();
    const label = 10 ** e >= 1 ? String(10 ** e) : (10 ** e).toPrecision(1);
    ctx.fillText(label, Math.min(X(10 ** e) - 8, w - ctx.measureText(label).width), h - bottom + 14);
  }
  for (let e = Math.ceil(yMin); e <= yMax; e++) {
    ctx.beginPath(); ctx.moveTo(left, Y(10 ** e)); ctx.lineTo(w - 10, Y(10 ** e)); ctx.stroke();
    ctx.fillText(si(10 ** e, "FLOP/s"), 2, Y(10 ** e) + 4);
  }
  ctx.fillText("arithmetic intensity (FLOP/byte)", w / 2 - 80, h - 4);
  ctx.strokeStyle = "#e4e8ec"; ctx.fillStyle = "#e4e8ec"; ctx.lineWidth = 2;
  peaks.forEach((p, i) => {
    const knee = p.flops_per_s / bw;
    ctx.setLineDash(i === 0 ? [] : [6, 4]);
    ctx.beginPath(); ctx.moveTo(X(10 ** xMin), Y(bw * 10 ** xMin)); ctx.lineTo(X(knee), Y(p.flops_per_s));
    ctx.lineTo(X(10 ** xMax), Y(p.flops_per_s)); ctx.stroke();
    ctx.fillText(`${si(p.flops_per_s, "FLOP/s")} (${p.compute})`, X(knee) + 6, Y(p.flops_per_s) - 6);
  });
  ctx.setLineDash([]); ctx.lineWidth = 1;
  ctx.fillText(`${si(bw, "B/s")}`, X(10 ** xMin) + 6, Y(bw * 10 ** xMin) - 8);
  for (const p of roof.points) {
    ctx.fillStyle = COLORS[p.phase] || "#888";
    ctx.beginPath(); ctx.arc(X(p.intensity), Y(p.flops_per_s), 3.5, 0, 2 * Math.PI); ctx.fill();
  }
}

function show(state) {
  const status = $("status");
  if (!state.ready) {
    status.className = "status " + (state.load_error ? "offline" : "loading");
    status.textContent = state.load_error ? "failed: " + state.load_error : "loading model";
    return;
  }
  status.className = "status live"; status.textContent = "live";
  $("model").textContent = state.model;
  $("running").textContent = state.running;
  $("waiting").textContent = state.waiting;
  $("kv").textContent = fmt(100 * state.kv_cache_usage) + " %";
  $("kv-bar").style.width = (100 * state.kv_cache_usage) + "%";
  $("kv-blocks").textContent = `${state.kv_blocks_used} / ${state.kv_blocks_total} blocks`;
  $("kv-dtype").textContent = state.kv_cache_dtype;
  $("tok-s").textContent = fmt(state.generation_tokens_per_s);
  const r = state.requests;
  $("finished").textContent = (r.stop || 0) + (r.length || 0);
  $("outcomes").textContent = Object.entries(r).map(([k, v]) => `${k} ${v}`).join(" · ");
  $("latency-window").textContent = `finished requests, last ${state.latency_window_s / 60} min`;
  showLatency("ttft", state.ttft_ms);
  showLatency("tpot", state.tpot_ms);
  drawTimeline(state.steps);
  const roof = state.roofline;
  $("hardware").textContent = roof.hardware;
  $("achieved").textContent = Object.entries(roof.achieved)
    .map(([phase, a]) => `${phase}: ${si(a.flops_per_s, "FLOP/s")}, ${si(a.bytes_per_s, "B/s")}; ` +
      `step ${a.step_ms.toFixed(2)} ms, expected ${a.expected_ms === null ? "-" : a.expected_ms.toFixed(2) + " ms"}, ` +
      `bound ${a.bound_ms.toFixed(2)} ms`).join("   ·   ");
  drawRoofline(roof);
}

async function poll() {
  try {
    const response = await fetch("/dashboard/state", { cache: "no-store" });
    show(await response.json());
  } catch (e) {
    $("status").className = "status offline"; $("status").textContent = "offline";
  }
  setTimeout(poll, 1000);
}

poll();
