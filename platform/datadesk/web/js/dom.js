// Small DOM helpers. Text always goes in as text (never innerHTML); the only HTML the UI
// inserts is what the server rendered and sanitized (see setHtml).

export const $ = (sel, root = document) => root.querySelector(sel);

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// Server-rendered HTML (markdown-it + nh3 on the server). Links open in a new tab without referrer.
export function setHtml(el, html) {
  el.innerHTML = html;
  for (const a of el.querySelectorAll("a[href]")) {
    a.target = "_blank";
    a.rel = "noopener noreferrer";
  }
}

export function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KB", "MB", "GB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

export function num(n) {
  return n === null || n === undefined ? "" : Number(n).toLocaleString("en-US");
}

export function when(ts) {
  if (!ts) return "";
  return new Date(ts * 1000).toLocaleString();
}

export function relative(ts) {
  if (!ts) return "";
  const s = ts - Date.now() / 1000;
  const abs = Math.abs(s);
  const unit = abs < 90 ? [Math.round(abs), "s"] : abs < 5400 ? [Math.round(abs / 60), "min"]
    : abs < 172800 ? [Math.round(abs / 3600), "h"] : [Math.round(abs / 86400), "d"];
  return s >= 0 ? `in ${unit[0]} ${unit[1]}` : `${unit[0]} ${unit[1]} ago`;
}

// An action of a panel's button: run `fn` (its error shown as a toast), then redraw the panel.
export function acting(rerender) {
  return async (fn) => {
    try {
      await fn();
    } catch (e) {
      toast(e.message);
    }
    await rerender();
  };
}

let toastTimer = null;
export function toast(message, kind = "error") {
  const el = $("#toast");
  el.textContent = message;
  el.className = `toast ${kind}`;
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => {
    el.hidden = true;
  }, 6000);
}

export function confirmDialog(title, text, okLabel = "OK") {
  const dlg = $("#confirm-dialog");
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = okLabel;
  dlg.returnValue = "";
  dlg.showModal();
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
  });
}

export function promptDialog(label, value = "") {
  const dlg = $("#prompt-dialog");
  $("#prompt-label").textContent = label;
  const input = $("#prompt-input");
  input.value = value;
  dlg.returnValue = "";
  dlg.showModal();
  input.focus();
  input.select();
  const enter = (e) => { // Enter saves, Shift+Enter adds a line
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      dlg.close("ok");
    }
  };
  input.addEventListener("keydown", enter);
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => {
      input.removeEventListener("keydown", enter);
      resolve(dlg.returnValue === "ok" ? input.value : null);
    }, { once: true });
  });
}

export function lightbox(src, alt) {
  const img = $("#lightbox-img");
  img.src = src;
  img.alt = alt || "chart";
  $("#lightbox").showModal();
}
