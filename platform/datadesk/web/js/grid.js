// The result grid: a table artifact's FULL data, paged, sorted and filtered on the server
// (GET /api/artifacts/{id}/rows). Cells are copied as text (with a header row); the current view
// downloads as CSV. As an explorer (grid_explore.js): column profiles, group-by, chart and ask.

import { api } from "./api.js";
import { h, num, toast } from "./dom.js";
import { askAboutView, chartView, describeFilter, fetchGroups, groupForm, showProfile } from "./grid_explore.js";

const enc = encodeURIComponent;
export const GRID_FORMATS = new Set(["parquet", "csv", "tsv"]); // what /rows reads
const PAGE_SIZES = [100, 250, 500, 1000];
const OPS = [["contains", "contains"], ["=", "="], ["!=", "≠"], ["<", "<"], ["<=", "≤"], [">", ">"], [">=", "≥"],
  ["between", "between"], ["in", "in list"], ["is null", "is null"], ["not null", "not null"]];

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
    this.view = { sort: [], filters: [], group: null };
    this.question = null;
    this.profiled = null; // the column whose profile is shown
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
    this.withHeader = h("input", { type: "checkbox", id: "grid-copy-header", checked: true });
    const headerBox = h("label", { class: "muted small", title: "Copy the column names as the first line" }, this.withHeader, " with header");
    this.chartBtn = h("button", { type: "button", id: "grid-chart", title: "Chart this view in the chat (a python step the assistant sees)" }, "Chart this view");
    this.chartBtn.addEventListener("click", () => chartView(this).catch((e) => this.fail(e.message)));
    this.askBtn = h("button", { type: "button", id: "grid-ask", title: "Start a question about this view in the composer" }, "Ask about this view");
    this.askBtn.addEventListener("click", () => askAboutView(this));
    const close = h("button", { type: "button", class: "icon-btn", id: "grid-close", "aria-label": "Close the grid" }, "✕");
    close.addEventListener("click", () => this.dlg.close());
    this.col = h("select", { id: "grid-filter-column", "aria-label": "Filter column" });
    this.op = h("select", { id: "grid-filter-op", "aria-label": "Filter operator" }, ...OPS.map(([v, l]) => h("option", { value: v }, l)));
    this.value = h("input", { id: "grid-filter-value", type: "text", placeholder: "value", "aria-label": "Filter value" });
    this.value2 = h("input", { id: "grid-filter-value2", type: "text", placeholder: "to", "aria-label": "Filter upper value", hidden: true });
    this.op.addEventListener("change", () => this.opChanged());
    const form = h("form", { class: "grid-filter", id: "grid-filter-form" }, this.col, this.op, this.value, this.value2,
      h("button", { type: "submit" }, "Add filter"));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const f = { column: this.col.value, op: this.op.value };
      if (f.op === "between") f.value = [this.value.value.trim(), this.value2.value.trim()];
      else if (f.op === "in") f.value = this.value.value.split(",").map((v) => v.trim()).filter((v) => v !== "");
      else if (!f.op.endsWith("null")) f.value = this.value.value;
      this.value.value = this.value2.value = "";
      this.addFilter(f);
    });
    this.groupForm = groupForm(this);
    this.side = h("aside", { class: "grid-profile", id: "grid-profile", "aria-label": "Column profile", hidden: true });
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
      h("div", { class: "grid-head" }, this.title, this.count, h("span", { class: "spacer" }), this.askBtn, this.chartBtn,
        this.copyBtn, headerBox, this.download, close),
      h("div", { class: "grid-tools" }, form, this.groupForm, this.chips), this.status,
      h("div", { class: "grid-body" }, this.scroller, this.side),
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

  opChanged() {
    const op = this.op.value;
    this.value.disabled = op.endsWith("null");
    this.value2.hidden = op !== "between";
    this.value.placeholder = op === "between" ? "from" : op === "in" ? "values, comma-separated" : "value";
  }

  addFilter(f) {
    this.view.filters.push(f);
    this.go(0);
  }

  setGroup(group) {
    this.view.group = group;
    this.go(0);
  }

  fail(message) {
    this.status.textContent = message;
    this.status.hidden = false;
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
      this.view = { sort: [], filters: [], group: null };
      this.page = null;
      this.question = null;
      this.profiled = null;
      this.side.hidden = true;
      this.table.replaceChildren();
      this.groupForm.replaceWith(this.groupForm = groupForm(this));
    }
    this.aid = aid;
    this.label = label || `Table ${aid}`;
    this.title.textContent = this.question || this.label;
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
      const page = this.view.group ? await fetchGroups(this) : await this.fetchPage(query);
      if (seq !== this.seq) return; // a newer request won
      this.status.hidden = true;
      if (this.view.group) {
        this.drawGroups(page);
        return;
      }
      this.page = page;
      if (page.question) this.setQuestion(page.question);
      this.draw();
      this.prefetch();
    } catch (e) {
      if (seq !== this.seq) return;
      this.fail(e.message);
      if (this.view.filters.length && e.status === 400 && e.message.startsWith("filter")) {
        this.view.filters.pop(); // the filter just added was refused
      } else if (this.view.group && e.status === 400) {
        this.view.group = null;
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
    this.groupForm.fill(cols);
    for (const el of [this.nav.first, this.nav.prev, this.nav.next, this.nav.last, this.size]) el.hidden = false;
    this.download.hidden = false;
    const head = h("tr", {}, h("th", { class: "rownum", scope: "col" }, "#"), ...cols.map((c, i) => this.headCell(c, i)));
    this.drawRows(head, cols, p.data, p.offset);
  }

  headCell(c, i) {
    const k = this.view.sort.findIndex((s) => s.column === c.name);
    const dir = k < 0 ? "none" : this.view.sort[k].desc ? "descending" : "ascending";
    const mark = k < 0 ? "" : this.view.sort[k].desc ? " ▼" : " ▲";
    const btn = h("button", { type: "button", class: "sort", title: "Sort (Shift: add a sort key)", dataset: { column: c.name } },
      c.name, mark, k >= 0 && this.view.sort.length > 1 ? h("sup", {}, String(k + 1)) : null);
    btn.addEventListener("click", (e) => this.toggleSort(c.name, e.shiftKey));
    const prof = h("button", { type: "button", class: "icon-btn profile-btn", title: `Profile ${c.name} (all rows)`,
      "aria-label": `Profile ${c.name}`, dataset: { column: c.name } }, "▥");
    prof.addEventListener("click", () => { this.profiled = c.name; showProfile(this, c.name, this.side); });
    return h("th", { scope: "col", "aria-sort": dir, dataset: { col: i }, class: c.kind }, btn, prof,
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
    const chips = this.view.filters.map((f, i) => {
      const x = h("button", { type: "button", class: "icon-btn", "aria-label": `Remove filter ${f.column} ${f.op}` }, "×");
      x.addEventListener("click", () => {
        this.view.filters.splice(i, 1);
        this.go(0);
      });
      return h("span", { class: "chip" }, `${describeFilter(f)} `, x);
    });
    const g = this.view.group;
    if (g) {
      const x = h("button", { type: "button", class: "icon-btn", id: "grid-ungroup", "aria-label": "Back to the rows (remove the group-by)" }, "×");
      x.addEventListener("click", () => this.setGroup(null));
      chips.push(h("span", { class: "chip group" }, `grouped by ${g.by.join(", ")}: ${g.aggs.join(", ")} `, x));
    }
    this.chips.replaceChildren(...chips);
  }

  setQuestion(question) {
    this.question = question;
    this.title.textContent = question;
    this.title.title = `${question} · ${this.label}`;
  }

  // a group-by's result in the table (no paging: up to 1,000 groups)
  drawGroups(res) {
    this.page = { ...res, offset: 0, total_rows: res.rows };
    this.count.textContent = `${num(res.groups)} groups of ${num(res.rows)} rows`;
    this.pos.textContent = res.groups > res.data.length ? `first ${num(res.data.length)} groups` : "";
    for (const el of [this.nav.first, this.nav.prev, this.nav.next, this.nav.last, this.size]) el.hidden = true;
    this.download.hidden = true; // the CSV is of rows; a group-by's result is copied instead
    const cols = res.columns;
    const head = h("tr", {}, h("th", { class: "rownum", scope: "col" }, "#"),
      ...cols.map((c) => h("th", { scope: "col", class: c.kind }, h("span", { class: "group-col" }, c.name))));
    this.drawRows(head, cols, res.data, 0);
  }

  // The table's rows under `head` (row numbers from `offset + 1`), selectable, with the filter chips.
  drawRows(head, cols, data, offset) {
    const body = h("tbody", {});
    data.forEach((row, r) => {
      body.append(h("tr", {}, h("th", { class: "rownum", scope: "row" }, num(offset + r + 1)),
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
    const single = b.r0 === b.r1 && b.c0 === b.c1;
    if (this.withHeader.checked && !single) lines.push(this.page.columns.slice(b.c0, b.c1 + 1).map((c) => c.name).join("\t"));
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

// The open grid's table and view (report.js pins it to the report), or null when none is open.
export function currentView() {
  if (!grid || !grid.aid) return null;
  const v = grid.view;
  return { artifact: grid.aid, sort: v.sort.map((s) => `${s.column}:${s.desc ? "desc" : "asc"}`),
    filters: v.filters, grouped: !!v.group };
}

// A button that opens the grid (for cards, uploads and the artifacts panel).
export function gridButton(aid, label) {
  return h("button", { type: "button", class: "open-grid", dataset: { artifact: aid }, onclick: () => openGrid(aid, label) }, "Open in grid");
}
