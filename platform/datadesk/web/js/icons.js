// SVG icons, drawn with DOM calls (no markup strings, no inline style: within the CSP), in the
// text colour (stroke="currentColor"), so they read in both themes and never depend on an
// emoji font (the pin was an empty box where none is installed). `icon(name)` makes one;
// `decorateIcons(root)` fills every `[data-icon]` element of the page with its icon.

const SVG_NS = "http://www.w3.org/2000/svg";

// 24x24 outline paths (stroke 2, round caps)
const PATHS = {
  pin: ["M9 4h6l-1 5 3 3v2H7v-2l3-3-1-5z", "M12 14v6"],
  close: ["M6 6l12 12", "M18 6L6 18"],
  upload: ["M12 16V4", "M7 9l5-5 5 5", "M5 20h14"],
  menu: ["M4 6h16", "M4 12h16", "M4 18h16"],
  memory: ["M6 3h12v18l-6-4-6 4z"],
  check: ["M5 12l5 5 9-10"],
  coins: ["M12 3a7 3 0 1 0 .01 0z", "M5 6v6c0 1.7 3.1 3 7 3s7-1.3 7-3V6", "M5 12v6c0 1.7 3.1 3 7 3s7-1.3 7-3v-6"],
};

export function icon(name, label = "") {
  const paths = PATHS[name];
  if (!paths) throw new Error(`no icon named ${name}`);
  const svg = document.createElementNS(SVG_NS, "svg");
  for (const [k, v] of Object.entries({ viewBox: "0 0 24 24", width: "16", height: "16", fill: "none",
    stroke: "currentColor", "stroke-width": "2", "stroke-linecap": "round", "stroke-linejoin": "round" })) {
    svg.setAttribute(k, v);
  }
  svg.classList.add("icon", `icon-${name}`);
  if (label) {
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", label);
  } else {
    svg.setAttribute("aria-hidden", "true");
  }
  for (const d of paths) {
    const p = document.createElementNS(SVG_NS, "path");
    p.setAttribute("d", d);
    svg.append(p);
  }
  return svg;
}

// Every `[data-icon="name"]` under `root` shows its icon instead of its text glyph.
export function decorateIcons(root = document) {
  for (const el of root.querySelectorAll("[data-icon]")) {
    if (el.querySelector("svg.icon")) continue;
    el.replaceChildren(icon(el.dataset.icon));
  }
}
