// What went wrong with a backend, as its page says it: its failed starts (each replica's
// exception, message, traceback and a link to its kept log) and its rollout in words.
// Errors and tracebacks are the replica's own text: they go in as text, never as markup.

import { pages } from "./api.js";
import { el, link, timeAgo } from "./dom.js";

// The user's own frame and the exception come last in a traceback: it opens at its end.
function traceback(text, open) {
  const pre = el("pre", { className: "traceback", tabIndex: 0 }, text);
  const details = el("details", {
    open,
    ontoggle: () => {
      if (details.open) pre.scrollTop = pre.scrollHeight;
    },
  }, el("summary", {}, "Traceback"), pre);
  return details;
}

function failure(name, f, newest) {
  return el("article", { className: "failed-start", dataset: { replica: f.replica } },
    el("p", { className: "failed-head" },
      el("span", { className: "tag" }, f.replica),
      ` (version ${f.version}) `,
      timeAgo(f.time),
      " ",
      link(pages.log(name, f.replica), "its log"),
    ),
    el("p", { className: "failed-error" },
      f.error_type ? [el("strong", { className: "error-type" }, f.error_type), ": "] : null,
      el("span", { className: "error-message" }, f.message),
    ),
    f.traceback
      ? traceback(f.traceback, newest)
      : el("p", { className: "muted" }, "No traceback: the runtime reported none."),
  );
}

/** Newest first, its traceback open: the one that failed last is what a reader looks for. */
export function failedStarts(name, list) {
  return [
    el("h2", {}, "Failed starts"),
    el("p", { className: "muted" },
      "Replicas whose start failed, newest first, until the backend is healthy again. ",
      "Each was stopped; its log shows what it printed."),
    ...[...list].reverse().map((f, i) => failure(name, f, i === 0)),
  ];
}

const OUTCOMES = { in_progress: "in progress", complete: "complete", failed: "failed" };

function revision(n) {
  return n === null || n === undefined ? "a revision not recorded" : `revision ${n}`;
}

/** "From revision 2 to revision 3: failed"; a first deploy comes from nothing. */
export function rolloutWords(r) {
  const outcome = OUTCOMES[r.outcome] ?? "not begun";
  const to = revision(r.revision);
  let words;
  if (r.current_revision === null || r.current_revision === undefined) {
    // Nothing has completed a rollout yet: the first deploy, or every one since has failed.
    const from = r.revision === 1 ? "nothing (first deploy)" : "nothing rolled out yet";
    words = `From ${from} to ${to}: ${outcome}`;
  } else if (r.current_revision === r.revision) {
    words = `${to[0].toUpperCase()}${to.slice(1)}: ${outcome}`;
  } else {
    words = `From ${revision(r.current_revision)} to ${to}: ${outcome}`;
  }
  if (r.restores !== null && r.restores !== undefined) {
    words += ` (it brings back revision ${r.restores})`;
  }
  return words;
}
