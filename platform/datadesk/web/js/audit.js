// The audit trail for admins (issue 30): who queried which source, downloaded or exported what,
// signed in or out, and what admins changed. A table of GET /api/admin/audit, newest first, with
// its filters and cursor paging; the CSV button downloads /api/admin/audit.csv with the same
// filters. It adds an "Audit" button to the top bar once an admin is signed in (it watches the
// app view appear, so the rest of the UI knows nothing of it). Text goes in as text only.

import { api } from "./api.js";
import { $, bytes, h, num, toast } from "./dom.js";

const ACTIONS = ["query", "download", "export", "sign_in", "sign_out", "sign_in_failed", "admin", "share"];
const OUTCOMES = ["ok", "error", "refused", "cancelled"];
const PAGE_SIZES = [100, 250, 500];
const COLUMNS = [
  ["time", "Time (UTC)"], ["action", "Action"], ["outcome", "Outcome"], ["user", "User"],
  ["workspace", "Workspace"], ["source", "Source"], ["what", "SQL / target / detail"],
  ["rows", "Rows"], ["bytes", "Bytes"], ["duration_ms", "ms"], ["thread", "Thread"], ["client", "Client"],
];

function select(id, label, values) {
  return h("select", { id, "aria-label": label }, h("option", { value: "" }, `any ${label.toLowerCase()}`),
    ...values.map((v) => h("option", { value: v }, v)));
}

class AuditView {
  constructor() {
    this.cursors = [null]; // the cursor of each page seen; the last is the current page's
    this.next = null;
    this.build();
  }

  build() {
    const close = h("button", { type: "button", class: "icon-btn", id: "audit-close", "aria-label": "Close the audit trail" }, "✕");
    close.addEventListener("click", () => this.dlg.close());
    this.f = {
      user: h("input", { id: "audit-user", type: "text", placeholder: "user", "aria-label": "User" }),
      source: h("input", { id: "audit-source", type: "text", placeholder: "source", "aria-label": "Source" }),
      workspace: h("input", { id: "audit-workspace", type: "text", placeholder: "workspace", "aria-label": "Workspace" }),
      action: select("audit-action", "Action", ACTIONS),
      outcome: select("audit-outcome", "Outcome", OUTCOMES),
      from: h("input", { id: "audit-from", type: "date", "aria-label": "From (UTC day)" }),
      to: h("input", { id: "audit-to", type: "date", "aria-label": "To (UTC day, included)" }),
    };
    this.size = h("select", { id: "audit-size", "aria-label": "Entries per page" },
      ...PAGE_SIZES.map((n) => h("option", { value: n }, `${n} per page`)));
    const form = h("form", { class: "grid-filter", id: "audit-filters" }, ...Object.values(this.f), this.size,
      h("button", { type: "submit", class: "primary" }, "Apply"));
    form.addEventListener("submit", (e) => { e.preventDefault(); this.reload(); });
    this.csv = h("a", { id: "audit-csv", class: "button", download: "" }, "Download CSV");
    this.table = h("table", { class: "grid-table", id: "audit-table" });
    this.status = h("p", { id: "audit-status", class: "muted", "aria-live": "polite" });
    this.newer = h("button", { type: "button", id: "audit-newer" }, "‹ Newer");
    this.older = h("button", { type: "button", id: "audit-older" }, "Older ›");
    this.newest = h("button", { type: "button", id: "audit-newest" }, "« Newest");
    this.newer.addEventListener("click", () => { this.cursors.pop(); this.load(); });
    this.older.addEventListener("click", () => { this.cursors.push(this.next); this.load(); });
    this.newest.addEventListener("click", () => this.reload());
    this.pos = h("span", { id: "audit-pos", class: "muted" });
    this.dlg = h("dialog", { id: "audit-dialog", class: "grid-dialog", "aria-label": "Audit trail" },
      h("div", { class: "grid-head" }, h("h2", {}, "Audit trail"), h("span", { class: "spacer" }), this.csv, close),
      h("div", { class: "grid-tools" }, form),
      this.status,
      h("div", { class: "grid-scroll", tabindex: "0", "aria-label": "Audit entries" }, this.table),
      h("div", { class: "grid-pager" }, this.newest, this.newer, this.older, this.pos));
    document.body.append(this.dlg);
  }

  params() {
    const p = new URLSearchParams();
    for (const [k, el] of Object.entries(this.f)) if (el.value.trim()) p.set(k, el.value.trim());
    return p;
  }

  open() {
    if (!this.dlg.open) this.dlg.showModal();
    this.reload();
  }

  reload() {
    this.cursors = [null];
    this.load();
  }

  async load() {
    const p = this.params();
    this.csv.href = `/api/admin/audit.csv?${p}`;
    p.set("limit", this.size.value);
    const cursor = this.cursors[this.cursors.length - 1];
    if (cursor) p.set("cursor", cursor);
    this.dlg.setAttribute("aria-busy", "true");
    try {
      const page = await api("GET", `/api/admin/audit?${p}`);
      this.next = page.next_cursor;
      this.render(page.entries);
    } catch (e) {
      this.status.textContent = `The audit trail could not be read: ${e.message}`;
      toast(e.message);
    } finally {
      this.dlg.removeAttribute("aria-busy");
    }
  }

  render(entries) {
    const head = h("thead", {}, h("tr", {}, ...COLUMNS.map(([, label]) => h("th", { scope: "col" }, label))));
    const body = h("tbody", {}, ...entries.map((e) => h("tr", { class: `audit-${e.outcome}` },
      ...COLUMNS.map(([key]) => this.cell(e, key)))));
    this.table.replaceChildren(head, body);
    const page = this.cursors.length;
    this.status.textContent = entries.length ? "" : "No entry matches these filters.";
    this.pos.textContent = entries.length ? `page ${page} · ${entries.length} entries` : "";
    this.newer.disabled = page <= 1;
    this.newest.disabled = page <= 1;
    this.older.disabled = !this.next;
  }

  cell(e, key) {
    if (key === "time") return h("td", { title: String(e.ts) }, e.time.replace("T", " ").replace("Z", ""));
    if (key === "what") {
      const text = e.sql || [e.target, e.detail].filter(Boolean).join(" · ");
      return h("td", { title: text, class: e.sql ? "mono" : null }, text);
    }
    if (key === "bytes") return h("td", { class: "number" }, bytes(e.bytes));
    if (key === "rows") return h("td", { class: "number" }, e.rows === null || e.rows === undefined ? "" : num(e.rows));
    if (key === "duration_ms") return h("td", { class: "number" }, e.duration_ms == null ? "" : Math.round(e.duration_ms));
    const v = e[key];
    return h("td", { class: v === null || v === undefined ? "null" : null }, v ?? "");
  }
}

let view = null;

async function addButton() {
  if ($("#open-audit")) return;
  let me = window.datadesk && window.datadesk.me;
  if (!me) me = await api("GET", "/api/me").catch(() => null);
  if (!me || !(me.permissions || []).includes("admin")) return;
  const btn = h("button", { id: "open-audit", type: "button" }, "Audit");
  btn.addEventListener("click", () => { view = view || new AuditView(); view.open(); });
  $(".top-actions").insertBefore(btn, $("#user-name"));
}

// the app view is shown once someone is signed in (app.js boot): then the button, for admins
const appView = $("#app-view");
if (appView) {
  const check = () => { if (!appView.hidden) addButton(); };
  new MutationObserver(check).observe(appView, { attributes: true, attributeFilter: ["hidden"] });
  check();
}
