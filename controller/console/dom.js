// Building DOM nodes from data, and formatting it. Every text goes in through
// textContent (or a text node): names, messages and log lines come from outside.

/**
 * el("a", {href: "/", className: "x", dataset: {backend: name}}, "text", otherNode)
 * Props are set as properties (className, href, disabled, onclick...), except `dataset`
 * and `attrs` (plain attributes, e.g. aria-label). Children: nodes, strings, or
 * null/false (skipped).
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "attrs") {
      for (const [name, v] of Object.entries(value)) node.setAttribute(name, v);
    } else node[key] = value;
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A link inside the console: console.js turns its clicks into pushState. */
export function link(href, text) {
  return el("a", { href }, text);
}

// The colour of a state's badge (console.css: .badge.good/.busy/.bad/.gone).
const TONES = {
  HEALTHY: "good",
  RUNNING: "good",
  UPDATING: "busy",
  UPSCALING: "busy",
  DOWNSCALING: "busy",
  STARTING: "busy",
  UNHEALTHY: "bad",
  DEPLOY_FAILED: "bad",
  DELETING: "gone",
  STOPPING: "gone",
};

export function badge(state) {
  const text = state ?? "-";
  return el("span", {
    className: `badge ${TONES[text] ?? "neutral"}`,
    dataset: { state: text },
  }, text);
}

/** 192.5 -> "3m 12s"; two units at most. */
export function formatDuration(seconds) {
  let s = Math.max(0, Math.floor(seconds));
  const units = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
  const parts = [];
  for (const [unit, size] of units) {
    if (s >= size || (unit === "s" && parts.length === 0)) {
      parts.push(`${Math.floor(s / size)}${unit}`);
      s %= size;
    }
    if (parts.length === 2) break;
  }
  return parts.join(" ");
}

export function formatAgo(iso, now = Date.now()) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "";
  return `${formatDuration((now - t) / 1000)} ago`;
}

/** Local time; the date only when it is not today. */
export function formatTime(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso ?? "-");
  const time = d.toLocaleTimeString([], { hour12: false });
  if (d.toDateString() === new Date().toDateString()) return time;
  return `${d.toLocaleDateString()} ${time}`;
}

/** A time that says how long ago it was; the ticker in console.js keeps "ago" current. */
export function timeAgo(iso) {
  return el("span", { className: "when" },
    el("time", { dateTime: iso ?? "", title: iso ?? "" }, formatTime(iso)),
    " ",
    el("span", { className: "ago muted", dataset: { time: iso ?? "" } }, `(${formatAgo(iso)})`),
  );
}

/** An age that counts up by itself from `seconds` (now) on: see tick() in console.js. */
export function age(seconds) {
  const since = Date.now() - (Number(seconds) || 0) * 1000;
  return el("span", { className: "age", dataset: { since: String(since) } },
    formatDuration(seconds ?? 0));
}

/** Brings every .ago and .age in the page up to date (called once a second). */
export function tick(root = document) {
  const now = Date.now();
  for (const node of root.querySelectorAll(".ago[data-time]")) {
    node.textContent = `(${formatAgo(node.dataset.time, now)})`;
  }
  for (const node of root.querySelectorAll(".age[data-since]")) {
    node.textContent = formatDuration((now - Number(node.dataset.since)) / 1000);
  }
}

export function dash(value) {
  return value === null || value === undefined || value === "" ? "-" : String(value);
}

// Parts of a backend's status as the overview and the backend page both show them.

/** config.autoscaling -> "1-5", or "-" for a fixed number of replicas. */
export function range(autoscaling) {
  return autoscaling ? `${autoscaling.min_replicas}-${autoscaling.max_replicas}` : "-";
}

/** "v1 rev 3" (the revision from the rollout, when there is one). */
export function versionText(status) {
  const rev = status.rollout?.revision;
  return rev === null || rev === undefined ? dash(status.version) : `${dash(status.version)} rev ${rev}`;
}

export function loadText(load) {
  return `${load?.in_flight ?? 0} in flight, ${load?.queued ?? 0} queued`;
}

/** A table with a header row and an empty tbody (filled by syncRows). */
export function table(id, headings) {
  const tbody = el("tbody");
  const t = el("table", { id },
    el("thead", {}, el("tr", {}, headings.map((h) => el("th", { scope: "col" }, h)))),
    tbody,
  );
  return { table: el("div", { className: "table-scroll" }, t), tbody };
}

/**
 * Makes `tbody` hold one row per item, in order, rebuilding only the rows whose data
 * changed: a row that stays is the same element, so a focused button or a row the user
 * is looking at does not flicker away at every live update.
 * `key(item)` names a row; `sig(item)` is what it shows (a string); `render(item)`
 * builds its <tr>.
 */
export function syncRows(tbody, items, { key, sig, render }) {
  const old = new Map();
  for (const row of tbody.rows) old.set(row._key, row);
  let index = 0;
  for (const item of items) {
    const k = key(item);
    const s = sig(item);
    let row = old.get(k);
    old.delete(k);
    if (row === undefined || row._sig !== s) {
      const fresh = render(item);
      fresh._key = k;
      fresh._sig = s;
      if (row !== undefined) row.replaceWith(fresh);
      row = fresh;
    }
    const at = tbody.rows[index];
    if (at !== row) tbody.insertBefore(row, at ?? null);
    index += 1;
  }
  for (const row of old.values()) row.remove();
}
