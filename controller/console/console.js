// The console's entry point: draws the page for location.pathname, and moves between
// pages without reloading (history.pushState; links stay real <a href> links).

import { logout } from "./actions.js";
import { backendPage } from "./backend.js";
import { setUpDialog } from "./dialog.js";
import { el, link, tick } from "./dom.js";
import { logPage } from "./log.js";
import { overviewPage } from "./overview.js";
import { clearBanner, setLive } from "./ui.js";

const main = document.getElementById("main");
let leave = null; // aborts the current page's fetches and loops

// "/backends/a%23b" -> ["a#b"]; null for a path that is no page of ours.
function parts(pathname, pattern) {
  const match = pattern.exec(pathname);
  if (!match) return null;
  try {
    return match.slice(1).map(decodeURIComponent);
  } catch {
    return null; // a malformed %-escape
  }
}

function notFound() {
  document.title = "No such page - trio-replica-controller";
  setLive("");
  main.replaceChildren(
    el("h1", {}, "No such page"),
    el("p", {}, link("/", "Back to the overview")),
  );
}

function show() {
  leave?.abort();
  const controller = new AbortController();
  leave = controller;
  // The messages of the page we leave go with it (the standby notice stays).
  for (const source of ["page", "log", "action"]) clearBanner(source);
  const path = location.pathname;
  let args;
  if (path === "/") {
    overviewPage(main, controller.signal);
  } else if ((args = parts(path, /^\/backends\/([^/]+)$/))) {
    backendPage(main, controller.signal, ...args);
  } else if ((args = parts(path, /^\/backends\/([^/]+)\/logs\/([^/]+)$/))) {
    logPage(main, controller.signal, ...args);
  } else {
    notFound();
  }
}

// A click on a link to one of our pages: draw it here instead of loading it.
document.addEventListener("click", (event) => {
  if (event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return; // new tab etc.
  const a = event.target.closest?.("a[href]");
  if (!a || a.target || a.hasAttribute("download")) return;
  const url = new URL(a.href);
  if (url.origin !== location.origin) return;
  if (url.pathname !== "/" && !url.pathname.startsWith("/backends/")) return;
  event.preventDefault();
  if (url.pathname + url.search !== location.pathname + location.search) {
    history.pushState(null, "", url.pathname + url.search);
    window.scrollTo(0, 0);
    show();
  }
});

window.addEventListener("popstate", show);
document.getElementById("logout").addEventListener("click", logout);
setUpDialog();
setInterval(tick, 1000); // "x ago" and ages count on between updates
show();
