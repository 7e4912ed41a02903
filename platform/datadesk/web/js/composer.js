// The line above the composer that says why a message was not sent (a turn already running
// here, or in another tab), instead of Enter doing nothing; it goes when the turn ends.

import { $, h } from "./dom.js";

export const BUSY_HERE = "A turn is running: Stop it or wait for it to finish. Your message stays here.";
export const BUSY_ELSEWHERE = "A turn is running in another tab: Stop it or wait for it to finish. Your message stays here.";

function noteEl() {
  let el = $("#composer-note");
  if (!el) {
    el = h("div", { id: "composer-note", class: "composer-note notice warn", role: "status", "aria-live": "polite", hidden: true });
    $("#composer").before(el);
  }
  return el;
}

// Say why nothing was sent: `elsewhere` when the running turn was not started from this tab.
export function refuseSend(elsewhere) {
  const el = noteEl();
  el.textContent = elsewhere ? BUSY_ELSEWHERE : BUSY_HERE;
  el.hidden = false;
}

// The turn ended (or another chat was opened): the reason no longer holds.
export function clearRefusal() {
  const el = $("#composer-note");
  if (el) el.hidden = true;
}
