// With the demo model (no LLM configured), an empty chat offers the demo's suggested questions:
// each runs a scripted analysis for real (SQL, Python over the full result, a chart, a report).

import { $, h } from "./dom.js";

function suggestions(questions, ask) {
  return h("div", { class: "demo-suggestions", role: "group", "aria-label": "Suggested questions" },
    h("p", { class: "muted" }, "Try one: each runs a real analysis on the demo data: SQL, Python over the full result, a chart and a report."),
    ...questions.map((q) => h("button", { type: "button", class: "suggestion", onclick: () => ask(q) }, q)));
}

// Offer `app.me.model.suggestions` whenever the chat shows its empty state.
export function initDemo(app) {
  const model = (app.me && app.me.model) || {};
  const questions = model.demo ? model.suggestions || [] : [];
  const root = $("#messages");
  if (!questions.length || !root || root.dataset.demo) return;
  root.dataset.demo = "1";
  const ask = (q) => {
    const input = $("#input");
    input.value = q;
    $("#composer").requestSubmit();
  };
  const offer = () => {
    const empty = root.querySelector(".empty");
    if (empty && !root.querySelector(".demo-suggestions")) empty.after(suggestions(questions, ask));
  };
  new MutationObserver(offer).observe(root, { childList: true });
  offer();
}
