// The actions: each asks first (dialog.js), sends the CSRF token (api.js), and says
// what it did in the notice or what went wrong in the banner. The live loop of the
// page then shows the change itself.

import { ApiError, forgetSessionKey, paths, send } from "./api.js";
import { ask } from "./dialog.js";
import { clearBanner, showBanner, showNotice } from "./ui.js";

// The typed value as the API wants it: a number when it reads as one; anything else goes
// as it is, for the server to name what is wrong with it (422).
function number(text) {
  const trimmed = text.trim();
  if (trimmed === "") return null;
  const n = Number(trimmed);
  return Number.isNaN(n) ? trimmed : n;
}

function generation(result) {
  return result?.generation === undefined ? "" : ` (generation ${result.generation})`;
}

async function run(what, request, describe) {
  clearBanner("action");
  try {
    const result = await request();
    showNotice(describe(result));
  } catch (error) {
    const message = error instanceof ApiError ? error.message : String(error);
    showBanner("action", `${what} failed: ${message}`);
  }
}

/** Scale a backend: replicas for a fixed one, a min-max range for an autoscaled one. */
export async function scale(status) {
  const name = status.name;
  const auto = status.config?.autoscaling;
  if (auto) {
    const values = await ask({
      title: `Scale ${name}`,
      question: `${name} is autoscaled: set the range of its replicas.`,
      fields: [
        { name: "min", label: "Min replicas", type: "number", value: auto.min_replicas },
        { name: "max", label: "Max replicas", type: "number", value: auto.max_replicas },
      ],
      ok: "Scale",
    });
    if (!values) return;
    const body = { min_replicas: number(values.min), max_replicas: number(values.max) };
    await run(`Scaling ${name}`, () => send("POST", paths.scale(name), body),
      (r) => `Scaling ${name} to ${body.min_replicas}-${body.max_replicas} replicas${generation(r)}`);
    return;
  }
  const values = await ask({
    title: `Scale ${name}`,
    question: `How many replicas of ${name}?`,
    fields: [{
      name: "replicas",
      label: "Replicas",
      type: "number",
      value: status.config?.num_replicas ?? status.desired,
    }],
    ok: "Scale",
  });
  if (!values) return;
  const body = { replicas: number(values.replicas) };
  await run(`Scaling ${name}`, () => send("POST", paths.scale(name), body),
    (r) => `Scaling ${name} to ${body.replicas} replica${body.replicas === 1 ? "" : "s"}${generation(r)}`);
}

/** Delete a backend: the user types its name to confirm. */
export async function remove(name) {
  const values = await ask({
    title: `Delete ${name}`,
    question: `This stops every replica of ${name} and forgets it. Type its name to confirm.`,
    fields: [{ name: "name", label: "Backend name" }],
    ok: "Delete",
    danger: true,
    valid: (v) => v.name === name,
  });
  if (!values) return;
  await run(`Deleting ${name}`, () => send("DELETE", paths.backend(name)),
    (r) => `Deleting ${name}${generation(r)}`);
}

/** Undo: back one revision (toRevision null) or back to a given one. */
export async function undo(name, toRevision = null) {
  const to = toRevision === null ? "back one revision" : `back to revision ${toRevision}`;
  const values = await ask({
    title: `Roll back ${name}`,
    question: `Roll ${name} ${to}? Its replicas are replaced by a rollout.`,
    ok: "Roll back",
  });
  if (!values) return;
  const body = toRevision === null ? {} : { to_revision: toRevision };
  await run(`Rolling back ${name}`, () => send("POST", paths.undo(name), body),
    (r) => `Rolling ${name} ${to}${generation(r)}`);
}

/** Restart: every replica replaced by a rollout, running the code on disk now. */
export async function restart(name) {
  const values = await ask({
    title: `Restart ${name}`,
    question: `Replace every replica of ${name} by a rollout, running its code as it is on ` +
      "disk now? Its content stays; the rollout keeps to its surge and unavailability limits.",
    ok: "Restart",
  });
  if (!values) return;
  await run(`Restarting ${name}`, () => send("POST", paths.restart(name), {}),
    (r) => `Restarting ${name} as revision ${r.revision}${generation(r)}`);
}

/** Promote a canary release: skip its remaining steps; the rolling replacement begins. */
export async function promote(name, canary) {
  const values = await ask({
    title: `Promote ${name}'s canary`,
    question: `Skip the remaining steps of revision ${canary.revision} (at ${canary.weight}%, ` +
      `step ${canary.step} of ${canary.steps}) and replace revision ${canary.stable_revision} ` +
      "with it by a rollout?",
    ok: "Promote",
  });
  if (!values) return;
  await run(`Promoting ${name}`, () => send("POST", paths.promote(name), {}),
    () => `Promoted revision ${canary.revision} of ${name}: replacing the stable revision`);
}

/** Abort a canary release: its weight goes to 0, its replicas drain, back to stable. */
export async function abort(name, canary) {
  const values = await ask({
    title: `Abort ${name}'s canary`,
    question: `Send no more requests to revision ${canary.revision}, drain its replicas and ` +
      `go back to revision ${canary.stable_revision}? The revision is marked failed.`,
    ok: "Abort",
    danger: true,
  });
  if (!values) return;
  await run(`Aborting ${name}'s canary`, () => send("POST", paths.abort(name), {}),
    () => `Aborted revision ${canary.revision} of ${name}: back to revision ${canary.stable_revision}`);
}

/** Log out: ends the session on the server (no dialog: nothing is lost by it). */
export async function logout() {
  try {
    await send("POST", "/logout");
  } catch (error) {
    showBanner("action", `Logging out failed: ${error.message}`);
    return;
  }
  forgetSessionKey();
  location.assign("/login");
}
