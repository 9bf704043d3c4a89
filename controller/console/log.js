// A replica's log (/backends/{name}/logs/{tag}): the last 200 lines, then (with
// "Follow" on) what is new, every second.

import { ApiError, getJSON, isAbort, pages, paths, sleep } from "./api.js";
import { badge, el, link } from "./dom.js";
import { live } from "./live.js";
import { clearBanner, setLeadership, showBanner } from "./ui.js";

const FOLLOW_MS = 1000;
// Past this many characters the oldest half goes: a log followed for hours must not
// make the page heavy.
const MAX_CHARS = 2_000_000;

export function logPage(main, signal, name, tag) {
  document.title = `${tag} - trio-replica-controller`;
  const state = el("span", {}, badge(null));
  const follow = el("input", { type: "checkbox", id: "follow", checked: true });
  const pre = el("pre", { id: "log", className: "log", tabIndex: 0 });
  main.replaceChildren(
    el("p", { className: "crumbs" },
      link(pages.overview(), "Backends"), " / ", link(pages.backend(name), name), " / "),
    el("h1", {}, `Log of ${tag}`),
    el("p", { className: "log-meta" },
      "Replica state: ", state, " ",
      link(pages.backend(name), `Back to ${name}`)),
    el("p", { className: "log-controls" },
      el("label", {}, follow, " Follow")),
    pre,
  );

  let chars = 0;
  const atBottom = () => pre.scrollHeight - pre.scrollTop - pre.clientHeight < 8;

  function add(text) {
    if (!text) return;
    const stick = atBottom(); // before the text goes in: was the user reading the end?
    chars += text.length;
    if (chars > MAX_CHARS) {
      const keep = (pre.textContent + text).slice(-MAX_CHARS / 2);
      pre.textContent = keep;
      chars = keep.length;
    } else {
      pre.append(document.createTextNode(text)); // text, never markup
    }
    if (stick) pre.scrollTop = pre.scrollHeight;
  }

  const url = (query) => paths.logs(name, tag, query);
  const entry = (answer) =>
    (answer?.logs ?? []).find((l) => l.replica === tag) ?? answer?.logs?.[0] ?? null;

  async function follows() {
    let offset;
    try {
      const first = entry(await getJSON(url("tail=200"), signal));
      if (first === null) throw new ApiError(404, "NoSuchLog", `${tag} has no log`);
      add(first.text);
      pre.scrollTop = pre.scrollHeight;
      offset = first.offset;
    } catch (error) {
      if (isAbort(error)) return;
      showBanner("log", error.message);
      return;
    }
    for (;;) {
      try {
        await sleep(FOLLOW_MS, signal);
        if (!follow.checked) continue;
        const next = entry(await getJSON(url(`offset=${encodeURIComponent(offset)}&tail=10000`), signal));
        if (next === null) continue;
        add(next.text);
        offset = next.offset;
        clearBanner("log");
      } catch (error) {
        if (isAbort(error) || signal.aborted) return;
        if (error instanceof ApiError && error.transient) continue; // the live status says it
        showBanner("log", error.message); // e.g. the log is gone (404): stop following
        return;
      }
    }
  }

  // The replica's state, from the backend's status (and the header's role from the list).
  async function refresh() {
    const data = await getJSON(paths.backends(), signal);
    setLeadership(data.leadership);
    const backend = (data.backends ?? []).find((b) => b.name === name);
    const replica = backend?.replicas?.find((r) => r.tag === tag);
    const text = replica ? replica.state : backend ? "GONE" : "backend gone";
    if (state.textContent !== text) state.replaceChildren(badge(text));
  }

  follows();
  live(signal, refresh);
}
