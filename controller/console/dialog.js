// The confirmation dialog (<dialog id="confirm-dialog"> in index.html), shared by every
// action. Never window.confirm: it blocks the page, and it cannot hold an input.

import { el } from "./dom.js";

const $ = (id) => document.getElementById(id);

let settle = null; // resolves the promise of the dialog now open

/**
 * Asks; resolves with the fields' values ({name: string}) on confirm, null on cancel.
 * fields: [{name, label, type = "text", value = ""}]
 * valid(values): whether confirm is allowed yet (the button is disabled until then).
 */
export function ask({ title, question, fields = [], ok = "OK", danger = false, valid = null }) {
  const dialog = $("confirm-dialog");
  if (settle) finish(null); // a dialog already open: this one replaces it

  $("confirm-title").textContent = title;
  $("confirm-question").textContent = question;
  const inputs = fields.map((field) => {
    const input = el("input", {
      id: `confirm-field-${field.name}`,
      name: field.name,
      type: field.type ?? "text",
      value: field.value ?? "",
      autocomplete: "off",
      spellcheck: false,
    });
    if (field.type === "number") input.step = "1";
    return { field, input };
  });
  $("confirm-fields").replaceChildren(
    ...inputs.map(({ field, input }) => el("label", { className: "field" },
      el("span", {}, field.label), input)),
  );
  const okButton = $("confirm-ok");
  okButton.textContent = ok;
  okButton.classList.toggle("danger", danger);

  const values = () => Object.fromEntries(inputs.map(({ field, input }) => [field.name, input.value]));
  const check = () => {
    okButton.disabled = valid !== null && !valid(values());
  };
  $("confirm-fields").oninput = check;
  check();

  return new Promise((resolve) => {
    settle = (confirmed) => resolve(confirmed ? values() : null);
    dialog.showModal();
    // The first input, or else OK (showModal alone would pick Cancel, the first button).
    (inputs[0]?.input ?? okButton).focus();
  });
}

function finish(confirmed) {
  const done = settle;
  settle = null;
  const dialog = $("confirm-dialog");
  if (dialog.open) dialog.close();
  done?.(confirmed);
}

/** Wires the dialog's buttons once, at start. */
export function setUpDialog() {
  const dialog = $("confirm-dialog");
  $("confirm-form").addEventListener("submit", (event) => {
    // Our own handling, not the form's: the disabled state of OK is the only check,
    // and the server says what is wrong with a value (422).
    event.preventDefault();
    if (!$("confirm-ok").disabled) finish(true);
  });
  $("confirm-cancel").addEventListener("click", () => finish(false));
  // Escape closes a modal dialog by itself: that is a cancel.
  dialog.addEventListener("cancel", (event) => {
    event.preventDefault();
    finish(false);
  });
}
