// Talking to the daemon's JSON API: reads, actions (with the CSRF token), and the
// handling every call shares (401 -> log in again, errors as ApiError).

/** An error answer of the API ({"error": {"type", "message"}}) or a network failure. */
export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.name = "ApiError";
    this.status = status; // 0 for a network error
    this.type = type;
  }

  /** Worth retrying in a moment: the daemon is away or busy, not refusing. */
  get transient() {
    return this.status === 0 || this.status >= 500;
  }
}

/** The aborted fetch of a page we left: to be ignored, never shown. */
export function isAbort(error) {
  return error?.name === "AbortError";
}

// The session's key, given by the login and kept in this origin's storage: the browser sends
// the session cookie to every port of this host, but only this origin's pages can read this,
// and the daemon answers a call only with both. It is also what makes an action CSRF-safe.
const KEY = "controller-console-key";

export function sessionKey() {
  return localStorage.getItem(KEY);
}

export function keepSessionKey(key) {
  localStorage.setItem(KEY, key);
}

export function forgetSessionKey() {
  localStorage.removeItem(KEY);
}

let leaving = false;

/** The session ended: off to the login page, back here after it. */
function toLogin() {
  if (!leaving) {
    leaving = true;
    const here = location.pathname + location.search;
    location.assign("/login?next=" + encodeURIComponent(here));
  }
  // Never settles: whoever waits on this call just stops while the browser leaves.
  return new Promise(() => {});
}

async function call(method, url, { body, signal } = {}) {
  const key = sessionKey();
  if (key === null) return toLogin(); // logged in elsewhere, or storage cleared
  const headers = { accept: "application/json", "x-console-key": key };
  if (body !== undefined) headers["content-type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      credentials: "same-origin",
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (error) {
    if (isAbort(error)) throw error;
    throw new ApiError(0, "NetworkError", "cannot reach the daemon");
  }
  if (response.status === 401) {
    forgetSessionKey();
    return toLogin();
  }
  // 204 and the like have no body; an error page that is not JSON still gets a message.
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const error = data?.error;
    throw new ApiError(
      response.status,
      error?.type ?? "HTTPError",
      error?.message ?? `${method} ${url}: HTTP ${response.status}`,
    );
  }
  return data;
}

export function getJSON(url, signal) {
  return call("GET", url, { signal });
}

/** An action (with the session's key, as every call). */
export function send(method, url, body) {
  return call(method, url, { body });
}

/** Waits `ms`, or rejects with an AbortError as soon as `signal` aborts. */
export function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        reject(signal.reason);
      },
      { once: true },
    );
  });
}

// The API's paths, each part encoded (backend names and tags are not ours to trust).
const enc = encodeURIComponent;
export const paths = {
  backends: () => "/api/v1/backends",
  nodes: () => "/api/v1/nodes",
  applications: () => "/api/v1/applications",
  backend: (name) => `/api/v1/backends/${enc(name)}`,
  revisions: (name) => `/api/v1/backends/${enc(name)}/revisions`,
  history: (name) => `/api/v1/backends/${enc(name)}/history`,
  scale: (name) => `/api/v1/backends/${enc(name)}/scale`,
  undo: (name) => `/api/v1/backends/${enc(name)}/undo`,
  restart: (name) => `/api/v1/backends/${enc(name)}/restart`,
  promote: (name) => `/api/v1/backends/${enc(name)}/promote`,
  abort: (name) => `/api/v1/backends/${enc(name)}/abort`,
  logs: (name, tag, query) =>
    `/api/v1/backends/${enc(name)}/logs?replica=${enc(tag)}&${query}`,
  changes: (epoch, cursor) =>
    epoch === null
      ? "/api/v1/changes"
      : `/api/v1/changes?epoch=${enc(epoch)}&since=${enc(cursor)}&timeout_s=25`,
};

// The console's own pages.
export const pages = {
  overview: () => "/",
  backend: (name) => `/backends/${enc(name)}`,
  log: (name, tag) => `/backends/${enc(name)}/logs/${enc(tag)}`,
};
