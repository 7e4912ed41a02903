// Code and outputs in the chat: a copy button on every code block and tool input, long outputs
// collapsed behind "Show all", and the chart viewer (zoom, download PNG).

import { $, h, toast } from "./dom.js";
import { copyText } from "./grid.js";

const LONG_PX = 320; // an output taller than this starts collapsed

// A "Copy" button on each <pre> under `root` (once each): copies the block's text.
export function addCopyButtons(root) {
  for (const pre of root.querySelectorAll("pre")) {
    if (pre.dataset.copy || pre.classList.contains("live-output")) continue;
    pre.dataset.copy = "1";
    const btn = h("button", { type: "button", class: "copy-btn", "aria-label": "Copy code", title: "Copy" }, "Copy");
    btn.addEventListener("click", async (e) => {
      e.stopPropagation();
      try {
        await copyText(pre.innerText.replace(/\n$/, ""));
        btn.textContent = "Copied";
        setTimeout(() => { btn.textContent = "Copy"; }, 1500);
      } catch (err) {
        toast(`Could not copy: ${err.message}`);
      }
    });
    const wrap = h("div", { class: "code-wrap" });
    pre.replaceWith(wrap);
    wrap.append(pre, btn);
  }
}

// Collapse `el` when it is long (measured once it is visible), with a toggle after it.
export function collapsible(el) {
  if (el.dataset.collapsible) return;
  el.dataset.collapsible = "1";
  const measure = () => {
    if (el.scrollHeight <= LONG_PX || el.nextElementSibling?.classList.contains("expand")) return;
    el.classList.add("collapsed");
    const btn = h("button", { type: "button", class: "expand link-btn", "aria-expanded": "false" }, "Show all");
    btn.addEventListener("click", () => {
      const open = el.classList.toggle("collapsed");
      btn.textContent = open ? "Show all" : "Collapse";
      btn.setAttribute("aria-expanded", String(!open));
    });
    el.after(btn);
  };
  const details = el.closest("details");
  if (details && !details.open) details.addEventListener("toggle", measure, { once: true });
  else requestAnimationFrame(measure);
}

// The text the model received with an offloaded preview (`.model-note`, from the server): hidden
// behind a toggle, apart from the clean preview table.
export function modelNotes(root) {
  for (const note of root.querySelectorAll(".model-note")) {
    if (note.dataset.toggle) continue;
    note.dataset.toggle = "1";
    note.hidden = true;
    const btn = h("button", { type: "button", class: "link-btn model-note-toggle", "aria-expanded": "false" },
      "What the model received with it");
    btn.addEventListener("click", () => {
      note.hidden = !note.hidden;
      btn.setAttribute("aria-expanded", String(!note.hidden));
    });
    note.before(btn);
  }
}

// ---- the chart viewer (the #lightbox dialog) ---------------------------------------------
const ZOOMS = [1, 1.5, 2, 3];
let zoom = 0;

function setZoom(i) {
  zoom = Math.max(0, Math.min(ZOOMS.length - 1, i));
  const img = $("#lightbox-img");
  for (const z of ZOOMS) img.classList.toggle(`zoom-${String(z).replace(".", "_")}`, z === ZOOMS[zoom] && z !== 1);
  img.classList.toggle("zoomed", zoom > 0);
  $("#lightbox-zoom-level").textContent = `${Math.round(ZOOMS[zoom] * 100)}%`;
}

function toolbar() {
  let bar = $("#lightbox-bar");
  if (bar) return bar;
  const btn = (id, label, text, fn) => h("button", { type: "button", id, "aria-label": label, title: label, onclick: fn }, text);
  bar = h("div", { id: "lightbox-bar", class: "lightbox-bar" },
    btn("lightbox-zoom-out", "Zoom out", "−", () => setZoom(zoom - 1)),
    h("span", { id: "lightbox-zoom-level", class: "muted" }, "100%"),
    btn("lightbox-zoom-in", "Zoom in", "+", () => setZoom(zoom + 1)),
    btn("lightbox-fit", "Fit to the window", "Fit", () => setZoom(0)),
    h("a", { id: "lightbox-download", class: "button", download: "" }, "Download PNG"));
  const dlg = $("#lightbox");
  dlg.prepend(bar);
  $("#lightbox-img").addEventListener("click", () => setZoom(zoom > 0 ? 0 : 2));
  dlg.addEventListener("keydown", (e) => {
    if (e.key === "+" || e.key === "=") setZoom(zoom + 1);
    else if (e.key === "-") setZoom(zoom - 1);
    else if (e.key === "0") setZoom(0);
  });
  return bar;
}

// Show a chart full size with zoom and a PNG download (`src`: its /view URL).
export function chartViewer(src, alt) {
  toolbar();
  const img = $("#lightbox-img");
  img.src = src;
  img.alt = alt || "chart";
  const dl = $("#lightbox-download");
  dl.href = src.replace(/\/view$/, "/download");
  setZoom(0);
  $("#lightbox").showModal();
}
