// The login page: logs in with the token typed in the form, or with a one-time link
// (`/login#code=...`, printed by `controller console`), then goes where the visitor was going.
//
// Either way the daemon answers with the session cookie (HttpOnly) and the session's key, kept
// here in this origin's storage: pages send it with every call (see api.js for why both).

import { keepSessionKey } from "./api.js";

const LINK_FAILED =
  "This login link is used or expired: run `controller console` again, or log in with the token.";

// Only a path on this site: "/x" but not "//host" nor "/\host" (Chromium reads a
// backslash as a slash, so "/\host" would leave the site too), nor control characters
// (a browser drops a tab or a newline from a URL, turning "/\t/host" into "//host").
function safeNext(value) {
  return (
    typeof value === "string" &&
    value.startsWith("/") &&
    !/^\/[/\\]/.test(value) &&
    !/[\u0000-\u001f\u007f]/.test(value)
  );
}

const asked = new URLSearchParams(location.search).get("next");
const next = safeNext(asked) ? asked : "/";
const error = document.getElementById("login-error");

/** POST `body` to `url`; on success keep the key and go on, else say `failed(status)`. */
async function logIn(url, body, failed) {
  error.textContent = "";
  let response;
  try {
    response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch {
    error.textContent = "Cannot reach the daemon: is it running?";
    return;
  }
  if (response.ok) {
    const { key } = await response.json();
    keepSessionKey(key);
    location.replace(next);
    return;
  }
  error.textContent = failed(response.status);
}

document.getElementById("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = document.getElementById("token").value;
  logIn("/login", { token }, (status) =>
    status === 401 ? "That is not the daemon's token." : `The login failed (HTTP ${status}).`,
  );
});

function codeFromHash() {
  if (!location.hash.startsWith("#code=")) return;
  const raw = location.hash.slice("#code=".length);
  let code = raw;
  try {
    code = decodeURIComponent(raw);
  } catch {
    // A malformed %-escape: send it as it is, and the server refuses it.
  }
  // The code is a secret that works once: out of the address bar (and history) at once.
  history.replaceState(null, "", location.pathname + location.search);
  logIn("/login/link", { code }, () => LINK_FAILED);
}

codeFromHash();
// (Focused from here, not with the autofocus attribute: Chromium logs a note when an
// autofocus comes after something else took the focus.)
if (document.activeElement === document.body) document.getElementById("token").focus();
// A new link pasted into this same tab only changes the hash: no reload, so listen.
window.addEventListener("hashchange", codeFromHash);
