// Charts in the chat and the artifacts panel (issue 32): Vega-Lite charts drawn by vega-embed
// (hover values, zoom and pan, legend toggles, PNG and SVG download), matplotlib figures with
// their dark-theme variant, and small lazy thumbnails. Both follow the system's light or dark
// theme (prefers-color-scheme, as app.css does).
//
// The renderer (web/vendor/vega/, fetched by vendor/fetch-vega.sh, served by the app) loads only
// when a chart comes on screen. The CSP forbids eval: vega parses expressions to an AST and
// runs them with vega-interpreter (`ast: true`, `expr`), and vega-embed's and vega-tooltip's
// injected <style> elements are off (charts.css holds their styles).

import { h } from "./dom.js";
import { chartViewer } from "./code.js";

const VENDOR = "/static/vendor/vega";
const DARK = window.matchMedia("(prefers-color-scheme: dark)");
// the kernel's matplotlib palette (sandbox/kernel_style.py): reads on both themes
const PALETTE = ["#3d7fe0", "#ef8a2b", "#2ba58b", "#e05a5c", "#9b6bd6", "#c08f00", "#d9679f", "#7d8a99"];
const CONTINUOUS = new Set(["quantitative", "temporal"]);
const enc = encodeURIComponent;
const live = new Set(); // drawn charts, redrawn when the theme changes

let loading = null;
// the charts' styles (small: the renderer itself loads only with the first chart)
document.head.append(h("link", { rel: "stylesheet", href: "/static/charts.css" }));

function script(src) {
  return new Promise((resolve, reject) => {
    const el = h("script", { src });
    el.addEventListener("load", resolve);
    el.addEventListener("error", () => reject(new Error(`could not load ${src}`)));
    document.head.append(el);
  });
}

// vega, vega-lite and vega-embed (UMD builds: globals, in this order) and the interpreter;
// once per page
export function loadRenderer() {
  if (!loading) {
    loading = (async () => {
      await script(`${VENDOR}/vega.min.js`);
      await script(`${VENDOR}/vega-lite.min.js`);
      await script(`${VENDOR}/vega-embed.min.js`);
      const { expressionInterpreter } = await import(`${VENDOR}/vega-interpreter.module.js`);
      return { embed: window.vegaEmbed, expr: expressionInterpreter };
    })();
    loading.catch(() => { loading = null; });
  }
  return loading;
}

export const isDark = () => DARK.matches;

function themeConfig() {
  const css = getComputedStyle(document.documentElement);
  const v = (name) => css.getPropertyValue(name).trim();
  const ink = v("--ink"), muted = v("--muted"), line = v("--line");
  return {
    background: v("--panel"),
    range: { category: PALETTE },
    axis: { domainColor: muted, tickColor: muted, gridColor: line, labelColor: ink, titleColor: ink },
    legend: { labelColor: ink, titleColor: ink },
    header: { labelColor: ink, titleColor: ink },
    title: { color: ink, subtitleColor: muted },
    view: { stroke: line, step: 32, fill: "transparent" }, // a filled view takes the pointer (zoom, reset)
    mark: { color: PALETTE[0] },
  };
}

const channelOf = (c) => (c && typeof c === "object" && !Array.isArray(c) ? c : null);

// The tooltip of a view that has none: each encoded field, numbers with thousands separators.
function tooltipOf(e) {
  const tips = [];
  for (const key of ["x", "y", "color", "size", "theta", "column", "row", "x2", "y2"]) {
    const c = channelOf(e[key]);
    if (!c || !c.field || tips.some((t) => t.field === c.field && t.aggregate === c.aggregate)) continue;
    const tip = { field: c.field, type: c.type };
    for (const k of ["aggregate", "bin", "timeUnit", "title"]) if (c[k] !== undefined) tip[k] = c[k];
    if (c.type === "quantitative" && !c.bin) tip.format = ",~f";
    tips.push(tip);
  }
  return tips;
}

// What every chart gets when its spec does not say otherwise: values on hover (tooltip), zoom and
// pan on its continuous axes, and legend entries that toggle their series. Only a single view
// without parameters of its own is changed (a layered or composed chart is drawn as written).
export function withInteraction(spec) {
  const s = structuredClone(spec);
  if (!s.mark || !s.encoding || s.params || s.layer || s.facet || s.repeat || s.concat || s.hconcat || s.vconcat) {
    return s;
  }
  const e = s.encoding;
  const mark = typeof s.mark === "string" ? { type: s.mark } : { ...s.mark };
  if (mark.tooltip === undefined && !e.tooltip) {
    const tips = tooltipOf(e);
    if (tips.length) e.tooltip = tips;
    else mark.tooltip = true;
  }
  s.mark = mark;
  const params = [];
  const zoomable = ["x", "y"].filter((k) => {
    const c = channelOf(e[k]);
    return c && CONTINUOUS.has(c.type) && !c.bin && !c.timeUnit;
  });
  if (zoomable.length) params.push({ name: "dd_zoom", select: { type: "interval", encodings: zoomable }, bind: "scales" });
  const color = channelOf(e.color);
  if (color && color.field && !CONTINUOUS.has(color.type) && !e.opacity) {
    params.push({ name: "dd_legend", select: { type: "point", fields: [color.field] }, bind: "legend" });
    e.opacity = { condition: { param: "dd_legend", value: 1 }, value: 0.15 };
  }
  if (params.length) s.params = params;
  return s;
}

function specTitle(spec) {
  const t = spec && spec.title;
  const text = t && typeof t === "object" && !Array.isArray(t) ? t.text : t;
  return Array.isArray(text) ? text.join(" ") : typeof text === "string" ? text : "";
}

function slug(text) {
  return (text || "chart").toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 60) || "chart";
}

async function fetchSpec(id) {
  const res = await fetch(`/api/artifacts/${enc(id)}/view`, { credentials: "same-origin" });
  if (!res.ok) throw new Error(res.status === 410 ? "this chart is no longer available" : `chart ${id}: HTTP ${res.status}`);
  return res.json();
}

async function draw(box) {
  const { embed, expr } = await loadRenderer();
  const spec = box.spec || (box.spec = await fetchSpec(box.dataset.artifact));
  if (box.view) box.view.finalize();
  const target = box.querySelector(".vl-target");
  const dark = isDark();
  const result = await embed(target, withInteraction(spec), {
    renderer: "svg", ast: true, expr, defaultStyle: false, forceActionsMenu: true, config: themeConfig(),
    tooltip: { theme: dark ? "dark" : "light", disableDefaultStyle: true },
    actions: { export: { svg: true, png: true }, source: false, compiled: false, editor: false },
    downloadFileName: slug(box.dataset.title || specTitle(spec)),
    i18n: { SVG_ACTION: "Download SVG", PNG_ACTION: "Download PNG" },
  });
  box.view = result.view;
  box.dataset.theme = dark ? "dark" : "light";
  box.classList.add("drawn");
  live.add(box);
}

function failed(box, e) {
  box.querySelector(".vl-target").replaceChildren(h("div", { class: "notice warn" }, `The chart could not be drawn: ${e.message}`));
}

// Draw each chart when it first comes near the screen (the renderer loads then).
const onScreen = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.isIntersecting) continue;
    onScreen.unobserve(entry.target);
    draw(entry.target).catch((e) => failed(entry.target, e));
  }
}, { rootMargin: "200px" }) : null;

// A Vega-Lite chart artifact in the chat.
export function vegaChart(id, title) {
  const box = h("figure", { class: "vl-chart", dataset: { artifact: id, title: title || "" } },
    h("div", { class: "vl-target" }, h("span", { class: "muted" }, "Loading the chart…")),
    title ? h("figcaption", { class: "muted" }, title) : null);
  if (onScreen) onScreen.observe(box);
  else queueMicrotask(() => draw(box).catch((e) => failed(box, e)));
  return box;
}

// A matplotlib figure: the dark-theme variant in dark mode, a click shows it full size.
export function figureImage(id, darkId, title, cls = "chart") {
  const src = `/api/artifacts/${enc(id)}/view`;
  const darkSrc = darkId ? `/api/artifacts/${enc(darkId)}/view` : null;
  const alt = title || `chart ${id}`;
  const img = h("img", { class: cls, src, alt, loading: "lazy", dataset: { artifact: id } });
  const pic = h("picture", { class: `${cls}-picture`, dataset: { artifact: id } },
    darkSrc ? h("source", { srcset: darkSrc, media: "(prefers-color-scheme: dark)" }) : null, img);
  if (darkSrc) img.classList.add("has-dark");
  img.addEventListener("click", () => chartViewer(darkSrc && isDark() ? darkSrc : src, alt));
  img.addEventListener("error", () => pic.replaceWith(h("div", { class: "notice warn" }, `${alt} is no longer available`)));
  return pic;
}

// A small picture of a Vega-Lite chart for the artifacts panel: drawn off screen as PNG when
// it comes into view.
export function vegaThumb(id, title) {
  const img = h("img", { class: "chart-thumb vl-thumb", alt: title || `chart ${id}`, dataset: { artifact: id } });
  const render = async () => {
    try {
      const { embed, expr } = await loadRenderer();
      const spec = await fetchSpec(id);
      const scratch = h("div", { class: "vl-scratch" });
      document.body.append(scratch);
      try {
        const res = await embed(scratch, spec, { renderer: "canvas", ast: true, expr, defaultStyle: false,
          actions: false, tooltip: false, config: themeConfig() });
        img.src = await res.view.toImageURL("png", 0.5);
        res.view.finalize();
      } finally {
        scratch.remove();
      }
    } catch (e) {
      img.replaceWith(h("span", { class: "muted chart-thumb" }, "no preview"));
    }
  };
  if ("IntersectionObserver" in window) {
    const seen = new IntersectionObserver((entries) => {
      if (entries.some((x) => x.isIntersecting)) {
        seen.disconnect();
        render();
      }
    });
    seen.observe(img);
  } else {
    render();
  }
  return img;
}

DARK.addEventListener("change", () => {
  for (const box of [...live]) {
    if (!box.isConnected) {
      if (box.view) box.view.finalize();
      live.delete(box);
    } else {
      draw(box).catch((e) => failed(box, e));
    }
  }
});

// The artifacts panel's thumbnail of a chart artifact (a figure or a Vega-Lite chart).
export function chartThumb(a) {
  return a.format === "vega-lite" ? vegaThumb(a.id, a.title)
    : figureImage(a.id, a.dark_variant, a.title || `chart ${a.id}`, "chart-thumb");
}
