// The parts of the page outside the current view: the error banner, the notice, the
// live status and the daemon's role in the header.

import { el } from "./dom.js";

const $ = (id) => document.getElementById(id);

/**
 * Shows `message` in the banner. Messages have a source ("page", "action", "standby"...):
 * a new message from a source replaces its old one, and clearBanner(source) takes it away
 * (e.g. the page's error goes when the page loads again).
 */
export function showBanner(source, message, { dismissable = true, content = null } = {}) {
  const banner = $("banner");
  const item = el("div", { className: `banner-item ${source}`, dataset: { source } },
    el("span", { className: "banner-text" }, content ?? message),
  );
  if (dismissable) {
    item.append(el("button", {
      type: "button",
      className: "banner-close",
      attrs: { "aria-label": "Dismiss" },
      onclick: () => clearBanner(source),
    })); // its "×" comes from console.css, out of the banner's text

  }
  const old = banner.querySelector(`[data-source="${source}"]`);
  if (old) old.replaceWith(item);
  else banner.append(item);
  banner.hidden = false;
}

export function clearBanner(source) {
  const banner = $("banner");
  banner.querySelector(`[data-source="${source}"]`)?.remove();
  banner.hidden = banner.childElementCount === 0;
}

let noticeTimer = 0;

/** A short note of what an action did; it goes away by itself after a while. */
export function showNotice(message) {
  const notice = $("notice");
  notice.textContent = message;
  notice.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => {
    notice.hidden = true;
    notice.textContent = "";
  }, 10000);
}

/** "live" / "reconnecting..." / "" (no live updates on this page). */
export function setLive(state) {
  const status = $("live-status");
  const text = { live: "live", reconnecting: "reconnecting...", connecting: "connecting..." };
  status.textContent = text[state] ?? "";
  status.dataset.state = state;
}

// Whether this daemon is a standby (read-only): the pages disable their action buttons.
let standby = false;
let shownLeadership = "";

export function isStandby() {
  return standby;
}

// A link only to a web address: a lease's address is data, and "javascript:..." is not one.
function webURL(address) {
  try {
    const url = new URL(address);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

/** Shows the daemon's role (from GET /api/v1/backends' `leadership`, when there is one). */
export function setLeadership(leadership) {
  const key = JSON.stringify([leadership?.role ?? null, leadership?.address ?? null]);
  standby = leadership?.role === "standby";
  disableActions();
  if (key === shownLeadership) return; // unchanged: keep the banner as it is (no new alert)
  shownLeadership = key;
  const role = $("role");
  role.hidden = !leadership;
  role.textContent = leadership ? leadership.role : "";
  role.dataset.role = leadership?.role ?? "";
  if (!standby) {
    clearBanner("standby");
    return;
  }
  const address = leadership.address;
  const href = address ? webURL(address) : null;
  const where = href ? el("a", { href }, address) : (address ?? "an address not known yet");
  showBanner("standby", "", {
    dismissable: false,
    content: el("span", {},
      "This daemon is a standby: it shows the store as the leader wrote it; actions go to the leader at ",
      where,
    ),
  });
}

/** Every action button of the view is disabled while this daemon is a standby. */
export function disableActions(root = document.getElementById("main")) {
  for (const button of root.querySelectorAll("button[data-action]")) {
    button.disabled = standby;
  }
}
