// A backend's page (/backends/{name}): its summary, latest error, actions, rollout, failed
// starts, replicas, chart, events and revisions.

import { getJSON, isAbort, pages, paths } from "./api.js";
import * as actions from "./actions.js";
import { drawChart } from "./chart.js";
import { failedStarts, rolloutWords } from "./failures.js";
import {
  age, append, badge, dash, el, link, loadText, range, syncRows, table, timeAgo,
} from "./dom.js";
import { live } from "./live.js";
import { disableActions, setLeadership } from "./ui.js";

// A read that may fail without failing the page: the chart and the revisions say so
// in their own place. An aborted read still stops the refresh.
async function optional(promise) {
  try {
    return { value: await promise };
  } catch (error) {
    if (isAbort(error)) throw error;
    return { error };
  }
}

function health(healthy) {
  if (healthy === true) return "ok";
  if (healthy === false) return "failing";
  return "-";
}

function yesNo(value) {
  if (value === true) return "yes";
  if (value === false) return "no";
  return "-";
}

function countsText(counts) {
  const parts = Object.entries(counts ?? {}).map(([state, n]) => `${n} ${state}`);
  return parts.length ? parts.join(", ") : "none";
}

/** Newest first (of events at the same time, the later in the list first). */
function newestFirst(events) {
  return (events ?? [])
    .map((event, i) => ({ event, i, t: Date.parse(event.time) || 0 }))
    .sort((a, b) => b.t - a.t || b.i - a.i)
    .map(({ event }) => event);
}

function canUndo(revisions) {
  if (revisions.length < 2) return false;
  const current = revisions.find((r) => r.current);
  const oldest = Math.min(...revisions.map((r) => r.number));
  return current !== undefined && current.number !== oldest;
}

/** Replaces a node's children only when what they show changed (no flicker, no lost focus). */
function update(node, signature, build) {
  if (node._sig === signature) return;
  node._sig = signature;
  node.replaceChildren();
  append(node, [build()]);
}

export function backendPage(main, signal, name) {
  document.title = `${name} - trio-replica-controller`;
  let view = null; // the page's parts, built at the first answer naming the backend
  let status = null; // the latest status: what the buttons act on

  function missing() {
    if (view === null && main.querySelector("#missing")) return; // already says so
    view = null;
    main.replaceChildren(
      el("h1", {}, name),
      el("p", { id: "missing", className: "empty" },
        `Backend ${name} does not exist (deleted?) `,
        link(pages.overview(), "Back to the overview"),
      ),
    );
  }

  function build() {
    const button = (id, text, action, onclick, className = "") =>
      el("button", { type: "button", id, className, dataset: { action }, onclick }, text);
    const replicas = table("replicas", [
      "Replica", "State", "Version", "Address", "PID", "Node", "Age", "Health", "Served",
      "Models", "",
    ]);
    const events = table("events", ["Time", "Kind", "Message"]);
    const models = table("models", ["Model", "Requests", "Held by"]);
    const revisions = table("revisions", [
      "#", "Version", "Created", "Cause", "Outcome", "Good", "Current", "",
    ]);
    view = {
      state: el("span", { className: "title-badge" }),
      reason: el("p", { className: "reason" }),
      lastError: el("p", { id: "last-error", className: "last-error", hidden: true }),
      summary: el("dl", { id: "summary", className: "summary" }),
      undo: button("undo", "Undo", "undo", () => actions.undo(name)),
      rollout: el("section", { id: "rollout", className: "rollout", hidden: true }),
      failures: el("section", { id: "failed-starts", className: "failures", hidden: true }),
      replicas: replicas.tbody,
      models: models.tbody,
      modelsPart: el("section", { id: "models", hidden: true },
        el("h2", {}, "Models"), models.table),
      noReplicas: el("p", { id: "no-replicas", className: "empty", hidden: true }),
      chart: el("div", { id: "chart", className: "chart-box" }),
      events: events.tbody,
      revisions: revisions.tbody,
      revisionsNote: el("p", { className: "muted", hidden: true }),
    };
    view.undo.hidden = true;
    main.replaceChildren(
      el("p", { className: "crumbs" }, link(pages.overview(), "Backends"), " / "),
      el("h1", {}, name, " ", view.state),
      view.reason,
      view.lastError,
      view.summary,
      el("div", { className: "buttons" },
        button("scale", "Scale", "scale", () => actions.scale(status)),
        button("restart", "Restart", "restart", () => actions.restart(name)),
        button("delete", "Delete", "delete", () => actions.remove(name), "danger"),
        view.undo,
      ),
      view.rollout,
      view.failures,
      el("h2", {}, "Replicas"), replicas.table, view.noReplicas,
      view.modelsPart,
      el("h2", {}, "Replicas and load, last hour"), view.chart,
      el("h2", {}, "Events"), events.table,
      el("h2", {}, "Revisions"), revisions.table, view.revisionsNote,
    );
  }

  // A multiplexed backend's models: the requests each had (as its serving replicas counted
  // them), and which replicas hold it now; the most asked for first.
  function showModels(models) {
    const requests = {};
    const holders = {};
    for (const [tag, said] of Object.entries(models)) {
      for (const [model, n] of Object.entries(said.requests)) {
        requests[model] = (requests[model] ?? 0) + n;
      }
      for (const model of said.models) (holders[model] ??= []).push(tag);
    }
    const names = [...new Set([...Object.keys(requests), ...Object.keys(holders)])];
    names.sort((a, b) => (requests[b] ?? 0) - (requests[a] ?? 0) || a.localeCompare(b));
    view.modelsPart.hidden = names.length === 0;
    syncRows(view.models, names.slice(0, 100), {
      key: (m) => m,
      sig: (m) => JSON.stringify([requests[m], holders[m]]),
      render: (m) => el("tr", { dataset: { model: m } },
        el("td", { className: "tag" }, m),
        el("td", {}, dash(requests[m])),
        el("td", {}, dash((holders[m] ?? []).join(", ") || null)),
      ),
    });
  }

  function showStatus(s) {
    update(view.state, s.state, () => badge(s.state));
    update(view.reason, JSON.stringify([s.message, s.reason]), () => [
      el("span", { className: "message" }, dash(s.message)),
      s.reason ? el("span", { className: "muted" }, ` (${s.reason})`) : null,
    ]);

    const auto = s.config?.autoscaling;
    const scaler = s.autoscaler;
    let autoscaling = range(auto);
    if (auto && scaler) {
      autoscaling += `, target ${dash(scaler.target)}`;
      if (scaler.capped_at !== null && scaler.capped_at !== undefined) {
        autoscaling += ` (capped at ${scaler.capped_at})`;
      }
    }
    const rows = [
      ["Ready", `${s.ready}/${s.desired}`, "ready"],
      ["Version", dash(s.version)],
      ["Revision", dash(s.rollout?.revision)],
      ["Route", dash(s.config?.route_prefix)],
      ["Autoscaling", autoscaling],
      ["Load", loadText(s.load)],
    ];
    update(view.summary, JSON.stringify(rows), () => rows.map(([term, value, id]) =>
      el("div", {}, el("dt", {}, term), el("dd", id ? { id } : {}, value))));

    // Gone from the status once the backend is healthy again: nothing stale stays here.
    view.lastError.hidden = !s.last_error;
    update(view.lastError, JSON.stringify(s.last_error), () => s.last_error
      ? [el("strong", {}, "Last error: "), el("span", { className: "message" }, s.last_error)]
      : null);
    showRollout(s);
    const failed = s.failed_starts ?? [];
    view.failures.hidden = failed.length === 0;
    update(view.failures, JSON.stringify(failed), () => failedStarts(name, failed));

    // Requests each replica answered, by its own count (code the worker serves).
    const served = s.load?.served ?? {};
    // What each multiplexed replica holds (@controller.multiplexed), by its own word.
    const models = s.load?.models ?? {};
    const held = (tag) => (models[tag] ? models[tag].models.join(", ") || "none" : null);
    syncRows(view.replicas, s.replicas ?? [], {
      key: (r) => r.tag,
      // Not the age: it counts up by itself (dom.js tick), no need to redraw the row for it.
      sig: (r) => JSON.stringify(
        [r.state, r.version, r.address, r.pid, r.node, r.healthy, served[r.tag], held(r.tag)]),
      render: (r) => el("tr", { dataset: { replica: r.tag } },
        el("td", { className: "tag" }, r.tag),
        el("td", {}, badge(r.state)),
        el("td", {}, dash(r.version)),
        el("td", {}, dash(r.address)),
        el("td", {}, dash(r.pid)),
        el("td", {}, dash(r.node)),
        el("td", {}, age(r.age_s)),
        el("td", { className: `health ${health(r.healthy)}` }, health(r.healthy)),
        el("td", { className: "served" }, dash(served[r.tag])),
        el("td", { className: "models" }, dash(held(r.tag))),
        el("td", {}, link(pages.log(name, r.tag), "log")),
      ),
    });
    showModels(models);
    view.noReplicas.hidden = (s.replicas ?? []).length !== 0;
    view.noReplicas.textContent = failed.length
      ? "No replicas: none is starting or running (see the failed starts above)."
      : "No replicas.";

    const events = newestFirst(s.events);
    update(view.events, JSON.stringify(events), () => events.map((e) =>
      el("tr", {},
        el("td", {}, timeAgo(e.time)),
        el("td", {}, dash(e.kind)),
        el("td", { className: "message" }, dash(e.message)),
      )));
  }

  function showRollout(s) {
    const r = s.rollout;
    const shown = r !== null && r !== undefined && (r.outcome !== "complete" || r.paused);
    view.rollout.hidden = !shown;
    if (!shown) return;
    const versions = Object.entries(s.counts_by_version ?? {});
    const signature = JSON.stringify([r, versions, s.version, s.config?.max_surge, s.config?.max_unavailable]);
    update(view.rollout, signature, () => [
      el("h2", {}, Number.isInteger(r.revision) ? `Rollout of revision ${r.revision}` : "Rollout"),
      el("p", { className: "rollout-words" },
        rolloutWords(r),
        r.paused ? el("strong", { className: "paused" }, " (paused)") : null,
        r.automatic ? " (automatic)" : null,
      ),
      el("div", { className: "table-scroll" },
        el("table", { className: "versions" },
          el("thead", {}, el("tr", {},
            el("th", { scope: "col" }, "Version"), el("th", { scope: "col" }, ""),
            el("th", { scope: "col" }, "Replicas"))),
          el("tbody", {}, versions.length === 0
            ? el("tr", {}, el("td", { colSpan: 3, className: "muted" },
              `None: no replica of any version is starting or running (the target is ${dash(s.version)})`))
            : versions.map(([version, counts]) =>
              el("tr", { dataset: { version } },
                el("td", {}, version),
                el("td", {}, version === s.version ? "new" : "old"),
                el("td", {}, countsText(counts)),
              ))),
        )),
      el("p", { className: "muted" },
        `max surge ${dash(s.config?.max_surge)}, max unavailable ${dash(s.config?.max_unavailable)}`,
        r.pending_revision !== null && r.pending_revision !== undefined
          ? `, revision ${r.pending_revision} waiting` : null),
      r.error ? el("p", { className: "error" }, `Error: ${r.error}`) : null,
      r.canary ? canaryPanel(r.canary) : null,
    ]);
  }

  // A canary release: its step and weight, each revision's numbers in the step, what the
  // gates say, and the buttons that skip to the end or go back.
  function canaryPanel(c) {
    const ms = (s) => (s === null || s === undefined ? "-" : `${(s * 1000).toFixed(1)} ms`);
    const pct = (x) => `${(x * 100).toFixed(1)}%`;
    const steering = ["starting", "judging", "held"].includes(c.phase);
    const clock = c.elapsed_s === null ? "" : `, ${Math.floor(c.elapsed_s)}/${c.pause_s}s`;
    const row = (label, weight, n) => el("tr", { dataset: { side: label } },
      el("td", {}, label), el("td", {}, n.version), el("td", {}, `${weight}%`),
      el("td", {}, String(n.requests)), el("td", {}, `${n.errors} (${pct(n.error_rate)})`),
      el("td", {}, ms(n.p99_s)));
    return el("div", { id: "canary", className: "canary" },
      el("h3", {}, `Canary: revision ${c.revision} against revision ${c.stable_revision}`),
      el("p", { id: "canary-step" },
        `Step ${c.step} of ${c.steps} at ${c.weight}%, ${c.phase}${clock}. Gates: ${c.verdict}`),
      el("p", { className: "muted" }, `Gates: ${c.gates}`),
      el("div", { className: "table-scroll" },
        el("table", { className: "versions" },
          el("thead", {}, el("tr", {}, ...["Revision", "Version", "Weight", "Requests",
            "Errors", "p99"].map((h) => el("th", { scope: "col" }, h)))),
          el("tbody", {},
            row("canary", c.weight, c.canary),
            row("stable", Math.round((100 - c.weight) * 100) / 100, c.stable)))),
      steering ? el("div", { className: "buttons" },
        el("button", { type: "button", id: "promote", dataset: { action: "promote" },
          onclick: () => actions.promote(name, c) }, "Promote"),
        el("button", { type: "button", id: "abort", className: "danger",
          dataset: { action: "abort" }, onclick: () => actions.abort(name, c) }, "Abort"),
      ) : null,
    );
  }

  function showRevisions(answer) {
    let list = [];
    if (answer.error) {
      // 404: no revisions (yet); anything else is said where the table is.
      if (answer.error.status !== 404) {
        view.revisionsNote.textContent = `Revisions unavailable: ${answer.error.message}`;
      }
    } else {
      list = answer.value?.revisions ?? [];
    }
    view.revisionsNote.hidden = !answer.error || answer.error.status === 404;
    list = [...list].sort((a, b) => b.number - a.number);
    syncRows(view.revisions, list, {
      key: (r) => String(r.number),
      sig: (r) => JSON.stringify([r.version, r.created_at, r.cause, r.outcome, r.good, r.current]),
      render: (r) => {
        const cause = r.cause ? [r.cause.via, r.cause.message].filter(Boolean).join(": ") : "-";
        return el("tr", { dataset: { revision: String(r.number) }, className: r.current ? "current" : "" },
          el("td", {}, String(r.number)),
          el("td", {}, dash(r.version)),
          el("td", {}, timeAgo(r.created_at)),
          el("td", { className: "message" }, cause),
          el("td", {}, dash(r.outcome)),
          el("td", {}, yesNo(r.good)),
          el("td", { className: "current-mark" }, r.current ? "current" : ""),
          el("td", {}, r.good && !r.current
            ? el("button", {
              type: "button",
              dataset: { action: "rollback", revision: String(r.number) },
              onclick: () => actions.undo(name, r.number),
            }, "Roll back to this")
            : null),
        );
      },
    });
    view.undo.hidden = !canUndo(list);
  }

  async function refresh() {
    // The list, not GET /api/v1/backends/{name}: it has the same status objects and the
    // `leadership` the header needs, and a backend that is gone is then no 404 (which
    // Chromium would log in the console at every update of this page).
    const all = await getJSON(paths.backends(), signal);
    setLeadership(all.leadership);
    const found = (all.backends ?? []).find((b) => b.name === name);
    if (found === undefined) {
      missing();
      return;
    }
    status = found;
    if (view === null) build();
    showStatus(status);
    if (status.deleting) {
      // Its revisions and history go with it, any moment now: asked for, they would answer
      // 404 once it is gone (a failed load in the browser's console). The last ones stay.
      disableActions(main);
      return;
    }
    const [revisions, history] = await Promise.all([
      optional(getJSON(paths.revisions(name), signal)),
      optional(getJSON(paths.history(name), signal)),
    ]);
    showRevisions(revisions);
    view.chart.replaceChildren(drawChart(history.value, {
      width: view.chart.clientWidth,
      error: history.error ? `History unavailable: ${history.error.message}` : null,
    }));
    disableActions(main);
  }

  live(signal, refresh);
}
