// The Export menu of the open thread: Markdown, a printable page, a notebook, the notebook with
// the thread's data (GET /api/threads/{tid}/export?format=...), and the two for readers (questions,
// answers and charts only: &audience=readers). Plain links: the session cookie authorizes them,
// the browser downloads or opens them.

import { $ } from "./dom.js";

const FORMATS = {
  md: "md", html: "html", ipynb: "ipynb", zip: "zip",
  "readers-html": "html&audience=readers", "readers-md": "md&audience=readers",
};

export function initExport(app) {
  const menu = $("#export-menu");
  if (!menu || menu.dataset.wired) return;
  menu.dataset.wired = "1";
  const point = () => {
    if (!app.thread) return;
    const base = `/api/threads/${encodeURIComponent(app.thread.id)}/export?format=`;
    for (const [id, fmt] of Object.entries(FORMATS)) {
      const a = $(`#export-${id}`);
      if (a) a.href = base + fmt;
    }
  };
  menu.addEventListener("toggle", point);
  menu.addEventListener("click", (e) => {
    if (e.target.closest("a")) {
      point();
      menu.open = false;
    }
  });
  document.addEventListener("click", (e) => {
    if (menu.open && !menu.contains(e.target)) menu.open = false;
  });
}
