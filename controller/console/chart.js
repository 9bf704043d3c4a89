// The backend page's chart: desired and ready replicas (left axis) and requests in
// flight (right axis) over the history window, as step lines: a value holds until the
// next point, and the last one holds on to now. Inline SVG, drawn from scratch on each
// update; colours come from console.css (classes), so dark mode works too.

const NS = "http://www.w3.org/2000/svg";
const H = 160;
const PAD = { left: 34, right: 40, top: 24, bottom: 20 };

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

// The axis' top: a round number at least `max` (1, 2, 5, 10, 20, 50...).
function niceMax(max) {
  if (max <= 1) return 1;
  const step = 10 ** Math.floor(Math.log10(max));
  for (const m of [1, 2, 5, 10]) if (m * step >= max) return m * step;
  return 10 * step;
}

const SERIES = [
  { key: "desired", label: "desired", axis: "left", className: "line-desired" },
  { key: "ready", label: "ready", axis: "left", className: "line-ready" },
  { key: "in_flight", label: "in flight", axis: "right", className: "line-load" },
];

/**
 * Draws `history` ({window_s, points: [{time, desired, ready, in_flight, queued}]}) into
 * a new <svg> (backend.js puts it in <div id="chart">). `error`: a message to show instead (history unavailable).
 * `width`: the width it will be shown at, in CSS pixels: drawn in that many units (600 if
 * unknown), its text keeps its size on a narrow screen instead of shrinking with it.
 */
export function drawChart(history, { now = Date.now(), error = null, width = 600 } = {}) {
  const W = Math.round(Math.min(900, Math.max(300, width || 600)));
  const root = svg("svg", {
    viewBox: `0 0 ${W} ${H}`,
    role: "img",
    "aria-label": "Desired and ready replicas and requests in flight over the last hour",
  });
  root.classList.add("chart");
  root.append(svg("title", {}, "Replicas and load over the last hour"));

  const windowS = history?.window_s ?? 3600;
  const start = now - windowS * 1000;
  const points = (history?.points ?? [])
    .map((p) => ({ ...p, t: Date.parse(p.time) }))
    .filter((p) => !Number.isNaN(p.t));

  const x0 = PAD.left;
  const x1 = W - PAD.right;
  const y0 = H - PAD.bottom; // the zero line
  const y1 = PAD.top;
  const x = (t) => x0 + ((Math.min(Math.max(t, start), now) - start) / (now - start)) * (x1 - x0);
  const top = {
    left: niceMax(Math.max(0, ...points.map((p) => Math.max(p.desired ?? 0, p.ready ?? 0)))),
    right: niceMax(Math.max(0, ...points.map((p) => p.in_flight ?? 0))),
  };
  const y = (value, axis) => y0 - ((value ?? 0) / top[axis]) * (y0 - y1);

  // Grid and axes: counts at the sides (replicas left, in flight right), time below.
  const grid = svg("g", { class: "grid" });
  for (const f of [0, 0.5, 1]) {
    const yy = y0 - f * (y0 - y1);
    grid.append(svg("line", { x1: x0, x2: x1, y1: yy, y2: yy }));
    const left = top.left * f;
    const right = top.right * f;
    if (Number.isInteger(left)) {
      grid.append(svg("text", { x: x0 - 4, y: yy + 3, "text-anchor": "end", class: "axis-left" }, String(left)));
    }
    if (Number.isInteger(right)) {
      grid.append(svg("text", { x: x1 + 4, y: yy + 3, "text-anchor": "start", class: "axis-right" }, String(right)));
    }
  }
  const minutes = windowS / 60;
  for (let i = 0; i <= 4; i += 1) {
    const t = start + (i / 4) * (now - start);
    const ago = Math.round(minutes * (1 - i / 4));
    const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
    grid.append(svg("text", { x: x(t), y: H - 5, "text-anchor": anchor }, ago === 0 ? "now" : `-${ago}m`));
  }
  root.append(grid);

  // What each axis counts, above it.
  grid.append(svg("text", { x: 2, y: y1 - 8, "text-anchor": "start" }, "replicas"));
  grid.append(svg("text", { x: W - 2, y: y1 - 8, "text-anchor": "end" }, "in flight"));

  // The legend, along the top between the axis titles.
  const legend = svg("g", { class: "legend" });
  let lx = x0 + 30;
  for (const s of SERIES) {
    legend.append(svg("line", { x1: lx, x2: lx + 16, y1: 12, y2: 12, class: s.className }));
    legend.append(svg("text", { x: lx + 20, y: 15 }, s.label));
    lx += 20 + s.label.length * 6 + 14; // about 6 units a character at this font size
  }
  root.append(legend);

  if (error || points.length === 0) {
    root.append(svg("text", { x: (x0 + x1) / 2, y: (y0 + y1) / 2 + 4, "text-anchor": "middle", class: "chart-empty" },
      error ?? "No history yet"));
    return root;
  }

  for (const s of SERIES) {
    // M to the first point, then for each next one: along (H) to its time, then up or
    // down (V) to its value; and along to now at the end.
    const first = points[0];
    let d = `M${x(first.t).toFixed(1)},${y(first[s.key], s.axis).toFixed(1)}`;
    for (const p of points.slice(1)) {
      d += `H${x(p.t).toFixed(1)}V${y(p[s.key], s.axis).toFixed(1)}`;
    }
    d += `H${x1}`;
    root.append(svg("path", { d, class: `line ${s.className}`, fill: "none" }));
  }
  return root;
}
