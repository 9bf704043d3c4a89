// The login page: fills the form's `next` field, and logs in with a one-time link
// (`/login#code=...`, printed by `controller console`).

const LINK_FAILED =
  "This login link is used or expired: run `controller console` again, or log in with the token.";

// Only a path on this site: "/x" but not "//host" nor "/\host" (Chromium reads a
// backslash as a slash, so "/\host" would leave the site too).
function safeNext(value) {
  return typeof value === "string" && value.startsWith("/") && !/^\/[/\\]/.test(value);
}

const next = new URLSearchParams(location.search).get("next");
if (safeNext(next)) {
  document.getElementById("next").value = next;
  // A wrong token is answered with this page again, at the form's address: with `next` in
  // that address too, the page after it still knows where to go (the server reads `next`
  // from the form only).
  document.getElementById("login-form").action = `/login?next=${encodeURIComponent(next)}`;
}

async function useLink(code) {
  const error = document.getElementById("login-error");
  error.textContent = "";
  try {
    const response = await fetch("/login/link", {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ code }),
    });
    if (response.status === 204) {
      location.replace("/");
      return;
    }
  } catch {
    // A network error: the same advice as a refused code.
  }
  error.textContent = LINK_FAILED;
}

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
  history.replaceState(null, "", "/login");
  useLink(code);
}

codeFromHash();
// (Focused from here, not with the autofocus attribute: Chromium logs a note when an
// autofocus comes after something else took the focus.)
if (document.activeElement === document.body) document.getElementById("token").focus();
// A new link pasted into this same tab only changes the hash: no reload, so listen.
window.addEventListener("hashchange", codeFromHash);
