// Live updates: the long poll of GET /api/v1/changes. A page gives a refresh function
// (fetch what it shows, draw it); live() calls it at once and again after every change,
// until the page is left (its AbortSignal aborts).

import { ApiError, getJSON, isAbort, paths, sleep } from "./api.js";
import { clearBanner, setLive, showBanner } from "./ui.js";

// After a change, wait this long before the next long poll: a busy daemon changes many
// times a second, and one refresh can show them all.
const SETTLE_MS = 250;
const RETRY_MS = 1000;

export async function live(signal, refresh) {
  let epoch = null;
  let cursor = null;
  let stale = true; // the page needs a refresh
  setLive("connecting");
  while (!signal.aborted) {
    try {
      if (epoch === null) {
        // The cursor first, then the data: a change made between the two is then
        // one the next long poll reports, not one lost.
        ({ epoch, cursor } = await getJSON(paths.changes(null), signal));
      }
      if (stale) {
        await refresh(signal);
        setLive("live"); // only now: "live" means the page shows what is
        clearBanner("page");
        stale = false;
        await sleep(SETTLE_MS, signal);
      }
      const answer = await getJSON(paths.changes(epoch, cursor), signal);
      setLive("live");
      // A new epoch (the daemon restarted, or another leader) or a moved cursor: changed.
      if (answer.epoch !== epoch || answer.cursor !== cursor) stale = true;
      ({ epoch, cursor } = answer);
    } catch (error) {
      if (signal.aborted || isAbort(error)) return;
      if (error instanceof ApiError && error.transient) {
        setLive("reconnecting");
      } else {
        // Not the network: a refusal or a bug. Say it, and try again in a moment.
        showBanner("page", error.message);
        console.debug("live update failed:", error);
      }
      stale = true;
      try {
        await sleep(RETRY_MS, signal);
      } catch {
        return; // aborted while waiting
      }
    }
  }
}
