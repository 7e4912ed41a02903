// The result grid: a table artifact's FULL data, paged, sorted and filtered on the server
// (GET /api/artifacts/{id}/rows). Cells are copied as text; the current view downloads as CSV.

import { api } from "./api.js";
import { h, num, toast } from "./dom.js";

const enc = encodeURIComponent;
export const GRID_FORMATS = new Set(["parquet", "csv", "tsv"]); // what /rows reads
const PAGE_SIZES = [100, 250, 500, 1000];
const OPS = [["contains", "contains"], ["=", "="], ["<", "<"], [">", ">"], ["is null", "is null"], ["not null", "not null"]];

function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const area = h("textarea", { class: "offscreen", "aria-hidden": "true" });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
  return Promise.resolve();
}
export { copyText };

function show(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === "boolean") return value ? "true" : "false";
  return String(value);
}

class Grid {
  constructor() {
    this.aid = null;
    this.view = { sort: [], filters: [] };
    this.offset = 0;
    this.limit = 100;
    this.page = null;
    this.cache = new Map(); // query string -> page (this artifact)
    this.seq = 0;
    this.sel = null; // {r0, c0, r1, c1} in page coordinates
    this.build();
  }

  build() {
    this.title = h("h2", { id: "grid-title" });
    this.count = h("span", { id: "grid-count", class: "muted", "aria-live": "polite" });
    this.download = h("a", { id: "grid-download", class: "button", download: "" }, "Download view (CSV)");
    this.copyBtn = h("button", { type: "button", id: "grid-copy", title: "Copy the selected cells (Ctrl+C)" }, "Copy selection");
    this.copyBtn.addEventListener("click", () => this.copy());
    const close = h("button", { type: "button", class: "icon-btn", id: "grid-close", "aria-label": "Close the grid" }, "✕");
    close.addEventListener("click", () => this.dlg.close());
    this.col = h("select", { id: "grid-filter-column", "aria-label": "Filter column" });
    this.op = h("select", { id: "grid-filter-op", "aria-label": "Filter operator" }, ...OPS.map(([v, l]) => h("option", { value: v }, l)));
    this.value = h("input", { id: "grid-filter-value", type: "text", placeholder: "value", "aria-label": "Filter value" });
    this.op.addEventListener("change", () => { this.value.disabled = this.op.value.endsWith("null"); });
    const form = h("form", { class: "grid-filter", id: "grid-filter-form" }, this.col, this.op, this.value,
      h("button", { type: "submit" }, "Add filter"));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const f = { column: this.col.value, op: this.op.value };
      if (!f.op.endsWith("null")) f.value = this.value.value;
      this.view.filters.push(f);
      this.value.value = "";
      this.go(0);
    });
    this.chips = h("div", { class: "grid-chips", id: "grid-chips" });
    this.table = h("table", { class: "grid-table", id: "grid-table" });
    this.scroller = h("div", { class: "grid-scroll", tabindex: "0",
      "aria-label": "Table rows (arrows select cells, Shift extends, Ctrl+C copies, Page Down: next page)" }, this.table);
    this.pos = h("span", { id: "grid-pos", class: "muted" });
    const nav = (label, id, fn) => {
      const b = h("button", { type: "button", id, "aria-label": label, title: label }, { first: "«", prev: "‹", next: "›", last: "»" }[id.slice(5)]);
      b.addEventListener("click", fn);
      return b;
    };
    this.size = h("select", { id: "grid-size", "aria-label": "Rows per page" }, ...PAGE_SIZES.map((n) => h("option", { value: n }, `${n} rows`)));
    this.size.addEventListener("change", () => { this.limit = Number(this.size.value); this.go(0); });
    this.nav = {
      first: nav("First page", "grid-first", () => this.go(0)),
      prev: nav("Previous page", "grid-prev", () => this.go(this.offset - this.limit)),
      next: nav("Next page", "grid-next", () => this.go(this.offset + this.limit)),
      last: nav("Last page", "grid-last", () => this.go(Math.max(0, Math.floor((this.rows() - 1) / this.limit) * this.limit))),
    };
    this.status = h("p", { id: "grid-status", class: "error", role: "alert", hidden: true });
    this.dlg = h("dialog", { id: "grid-dialog", class: "grid-dialog", "aria-labelledby": "grid-title" },
      h("div", { class: "grid-head" }, this.title, this.count, h("span", { class: "spacer" }), this.copyBtn, this.download, close),
      h("div", { class: "grid-tools" }, form, this.chips), this.status, this.scroller,
      h("div", { class: "grid-pager" }, this.nav.first, this.nav.prev, this.pos, this.nav.next, this.nav.last, this.size));
    this.dlg.addEventListener("keydown", (e) => {
      if ((e.ctrlKey || e.metaKey) && e.key === "c" && this.sel && !window.getSelection().toString()) {
        e.preventDefault();
        this.copy();
      }
    });
    this.scroller.addEventListener("keydown", (e) => this.key(e));
    document.body.append(this.dlg);
  }

  // the keyboard on the rows: arrows move the selected cell, Shift+arrows extend it,
  // Page Down / Page Up turn the page
  key(e) {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (e.key === "PageDown" || e.key === "PageUp") {
      e.preventDefault();
      this.go(this.offset + (e.key === "PageDown" ? this.limit : -this.limit));
      return;
    }
    const m = moves[e.key];
    if (!m || !this.page || !this.page.data.length) return;
    e.preventDefault();
    const rows = this.page.data.length;
    const cols = this.page.columns.length;
    const s = this.sel;
    const r = s ? Math.max(0, Math.min(rows - 1, s.r1 + m[0])) : 0; // the first arrow selects the first cell
    const c = s ? Math.max(0, Math.min(cols - 1, s.c1 + m[1])) : 0;
    this.sel = e.shiftKey && s ? { ...s, r1: r, c1: c } : { r0: r, c0: c, r1: r, c1: c };
    this.paint();
    const td = this.table.querySelector(`td[data-r="${r}"][data-c="${c}"]`);
    if (td) td.scrollIntoView({ block: "nearest", inline: "nearest" });
  }

  rows() {
    return this.page ? this.page.rows : 0;
  }

  params(paging = true) {
    const q = new URLSearchParams();
    if (paging) {
      q.set("offset", String(this.offset));
      q.set("limit", String(this.limit));
    }
    for (const s of this.view.sort) q.append("sort", `${s.column}:${s.desc ? "desc" : "asc"}`);
    if (this.view.filters.length) q.set("filter", JSON.stringify(this.view.filters));
    return q.toString();
  }

  async open(aid, label) {
    this.cache.clear(); // the data may have changed since (a re-run query)
    if (this.aid !== aid) {
      this.view = { sort: [], filters: [] };
      this.page = null;
      this.table.replaceChildren();
    }
    this.aid = aid;
    this.title.textContent = label || `Table ${aid}`;
    if (!this.dlg.open) this.dlg.showModal();
    await this.go(0);
    this.scroller.focus();
  }

  async fetchPage(query) {
    if (this.cache.has(query)) return this.cache.get(query);
    const page = await api("GET", `/api/artifacts/${enc(this.aid)}/rows?${query}`);
    this.cache.set(query, page);
    if (this.cache.size > 40) this.cache.delete(this.cache.keys().next().value);
    return page;
  }

  async go(offset) {
    const total = this.page ? this.page.rows : Infinity;
    this.offset = Math.max(0, Math.min(offset, Math.max(0, total - 1)));
    this.offset -= this.offset % this.limit;
    const seq = ++this.seq;
    const query = this.params();
    this.dlg.setAttribute("aria-busy", "true");
    try {
      const page = await this.fetchPage(query);
      if (seq !== this.seq) return; // a newer request won
      this.page = page;
      this.status.hidden = true;
      this.draw();
      this.prefetch();
    } catch (e) {
      if (seq !== this.seq) return;
      this.status.textContent = e.message;
      this.status.hidden = false;
      if (this.view.filters.length && e.status === 400 && e.message.startsWith("filter")) {
        this.view.filters.pop(); // the filter just added was refused
      }
      this.drawChips();
    } finally {
      if (seq === this.seq) this.dlg.removeAttribute("aria-busy");
    }
  }

  prefetch() {
    if (this.offset + this.limit >= this.rows()) return;
    const saved = this.offset;
    this.offset += this.limit;
    const query = this.params();
    this.offset = saved;
    this.fetchPage(query).catch(() => {});
  }

  draw() {
    const p = this.page;
    const cols = p.columns;
    const filtered = this.view.filters.length > 0;
    this.count.textContent = filtered ? `${num(p.rows)} of ${num(p.total_rows)} rows match` : `${num(p.rows)} rows`;
    const last = Math.min(p.offset + p.data.length, p.rows);
    this.pos.textContent = p.rows ? `rows ${num(p.offset + 1)}–${num(last)} of ${num(p.rows)}` : "no rows";
    this.nav.first.disabled = this.nav.prev.disabled = p.offset === 0;
    this.nav.next.disabled = this.nav.last.disabled = last >= p.rows;
    this.download.href = `/api/artifacts/${enc(this.aid)}/rows.csv?${this.params(false)}`;
    if (this.col.options.length !== cols.length) {
      this.col.replaceChildren(...cols.map((c) => h("option", { value: c.name }, c.name)));
    }
    const head = h("tr", {}, h("th", { class: "rownum", scope: "col" }, "#"), ...cols.map((c, i) => this.headCell(c, i)));
    const body = h("tbody", {});
    p.data.forEach((row, r) => {
      body.append(h("tr", {}, h("th", { class: "rownum", scope: "row" }, num(p.offset + r + 1)),
        ...row.map((v, c) => {
          const text = show(v);
          return h("td", { class: `${cols[c].kind}${text === null ? " null" : ""}`, dataset: { r, c } }, text === null ? "null" : text);
        })));
    });
    this.table.replaceChildren(h("thead", {}, head), body);
    this.sel = null;
    this.bindSelection(body);
    this.drawChips();
  }

  headCell(c, i) {
    const k = this.view.sort.findIndex((s) => s.column === c.name);
    const dir = k < 0 ? "none" : this.view.sort[k].desc ? "descending" : "ascending";
    const mark = k < 0 ? "" : this.view.sort[k].desc ? " ▼" : " ▲";
    const btn = h("button", { type: "button", class: "sort", title: "Sort (Shift: add a sort key)", dataset: { column: c.name } },
      c.name, mark, k >= 0 && this.view.sort.length > 1 ? h("sup", {}, String(k + 1)) : null);
    btn.addEventListener("click", (e) => this.toggleSort(c.name, e.shiftKey));
    return h("th", { scope: "col", "aria-sort": dir, dataset: { col: i }, class: c.kind }, btn,
      h("div", { class: "col-meta" }, c.type.toLowerCase(), " · ", c.nulls ? `${num(c.nulls)} null` : "no nulls"));
  }

  toggleSort(name, add) {
    const k = this.view.sort.findIndex((s) => s.column === name);
    const cur = k >= 0 ? this.view.sort[k] : null;
    const next = !cur ? { column: name, desc: false } : !cur.desc ? { column: name, desc: true } : null;
    if (add) {
      if (k >= 0) this.view.sort.splice(k, 1, ...(next ? [next] : []));
      else if (this.view.sort.length < 3) this.view.sort.push(next);
    } else {
      this.view.sort = next ? [next] : [];
    }
    this.go(0);
  }

  drawChips() {
    this.chips.replaceChildren(...this.view.filters.map((f, i) => {
      const x = h("button", { type: "button", class: "icon-btn", "aria-label": `Remove filter ${f.column} ${f.op}` }, "×");
      x.addEventListener("click", () => {
        this.view.filters.splice(i, 1);
        this.go(0);
      });
      return h("span", { class: "chip" }, `${f.column} ${f.op}${f.value !== undefined ? ` ${f.value}` : ""} `, x);
    }));
  }

  bindSelection(body) {
    let dragging = false;
    const at = (e) => {
      const td = e.target.closest("td");
      return td ? { r: Number(td.dataset.r), c: Number(td.dataset.c) } : null;
    };
    body.addEventListener("mousedown", (e) => {
      const p = at(e);
      if (!p) return;
      if (e.shiftKey && this.sel) this.sel = { ...this.sel, r1: p.r, c1: p.c };
      else this.sel = { r0: p.r, c0: p.c, r1: p.r, c1: p.c };
      dragging = true;
      this.paint();
    });
    body.addEventListener("mouseover", (e) => {
      const p = dragging && at(e);
      if (!p) return;
      this.sel = { ...this.sel, r1: p.r, c1: p.c };
      this.paint();
    });
    this.dlg.addEventListener("mouseup", () => { dragging = false; });
  }

  box() {
    const s = this.sel;
    return { r0: Math.min(s.r0, s.r1), r1: Math.max(s.r0, s.r1), c0: Math.min(s.c0, s.c1), c1: Math.max(s.c0, s.c1) };
  }

  paint() {
    const b = this.sel && this.box();
    for (const td of this.table.querySelectorAll("td")) {
      const r = Number(td.dataset.r);
      const c = Number(td.dataset.c);
      const on = !!b && r >= b.r0 && r <= b.r1 && c >= b.c0 && c <= b.c1;
      td.classList.toggle("sel", on);
      if (on) td.setAttribute("aria-selected", "true");
      else td.removeAttribute("aria-selected");
    }
  }

  // the selected cells as tab-separated text (one line per row); a lone cell as its value
  selectionText() {
    if (!this.sel || !this.page) return "";
    const b = this.box();
    const lines = [];
    for (let r = b.r0; r <= b.r1; r += 1) {
      const row = this.page.data[r] || [];
      lines.push(row.slice(b.c0, b.c1 + 1).map((v) => show(v) ?? "").join("\t"));
    }
    return lines.join("\n");
  }

  async copy() {
    const text = this.selectionText();
    if (!text && !this.sel) {
      this.status.textContent = "Select a cell (click, Shift+click or drag) to copy it.";
      this.status.hidden = false;
      return;
    }
    try {
      await copyText(text);
      // said in the dialog (a toast would sit under the modal)
      this.copyBtn.textContent = this.sel.r0 !== this.sel.r1 || this.sel.c0 !== this.sel.c1 ? "Cells copied" : "Cell copied";
      setTimeout(() => { this.copyBtn.textContent = "Copy selection"; }, 1500);
    } catch (e) {
      this.status.textContent = `Could not copy: ${e.message}`;
      this.status.hidden = false;
    }
  }
}

let grid = null;

// Open table artifact `aid` in the grid (a modal dialog over the chat).
export function openGrid(aid, label) {
  if (!grid) grid = new Grid();
  return grid.open(aid, label).catch((e) => toast(e.message));
}

// A button that opens the grid (for cards, uploads and the artifacts panel).
export function gridButton(aid, label) {
  return h("button", { type: "button", class: "open-grid", dataset: { artifact: aid }, onclick: () => openGrid(aid, label) }, "Open in grid");
}
