// Edit a question, regenerate an answer, and switch between the branches they leave (issue 31).
// The server keeps every branch (GET /api/threads/{tid}/branches); the chat shows the active one.
// An earlier branch is shown read-only in place of the active one; continuing is done on the newest.

import { api, postStream } from "./api.js";
import { h, toast } from "./dom.js";

const enc = encodeURIComponent;

// Called after a thread is drawn (chat.js loadThread): Edit on each question of the active branch,
// Regenerate on the last answer, and a "‹ n / m ›" switcher at each branch point.
export async function branchControls(conv, tid, records) {
  const root = conv.root;
  for (const el of root.querySelectorAll(".msg.user[data-seq]")) {
    if (!el.querySelector(".edit-msg")) el.append(editButton(conv, tid, el));
  }
  const answers = root.querySelectorAll(".msg.assistant");
  const last = answers[answers.length - 1];
  if (last && records.some((r) => r.role === "user")) last.append(regenerateButton(conv, tid, last));
  let points = [];
  try {
    points = (await api("GET", `/api/threads/${enc(tid)}/branches`)).points;
  } catch (e) {
    toast(e.message);
  }
  for (const point of points) {
    const active = point.branches.findIndex((b) => b.active);
    if (active < 0) continue;
    const el = root.querySelector(`.msg.user[data-seq="${point.branches[active].seq}"]`);
    if (el) el.before(switcher(conv, tid, point, active));
  }
}

function button(cls, title, text, onclick) {
  return h("button", { type: "button", class: cls, title, onclick: (e) => { e.stopPropagation(); onclick(); } }, text);
}

function editButton(conv, tid, el) {
  return button("edit-msg", "Edit this question (the earlier answer is kept as a branch)", "✎", () => {
    const seq = Number(el.dataset.seq);
    const text = el.firstChild && el.firstChild.nodeType === 3 ? el.firstChild.textContent : conv.lastAsked;
    const area = h("textarea", { class: "edit-area", rows: "3", "aria-label": "edited question" });
    area.value = text;
    const form = h("div", { class: "msg user editing" }, area,
      h("div", { class: "edit-actions" },
        button("edit-save", "Ask the edited question", "Save & submit", () => {
          const content = area.value.trim();
          if (!content) return toast("The question is empty.");
          runBranch(conv, tid, form, `/api/threads/${enc(tid)}/messages`, { content, edit_of: seq }, content);
        }),
        button("edit-cancel", "Keep the question as it is", "Cancel", () => form.replaceWith(el))));
    el.replaceWith(form);
    area.focus();
  });
}

function regenerateButton(conv, tid, answer) {
  return button("regenerate", "Regenerate this answer (the current one is kept as a branch)", "↻ Regenerate", () => {
    let question = answer.previousElementSibling;
    while (question && !question.matches(".msg.user[data-seq]")) question = question.previousElementSibling;
    if (!question) return toast("No question to regenerate.");
    runBranch(conv, tid, question, `/api/threads/${enc(tid)}/regenerate`, { seq: Number(question.dataset.seq) },
      conv.lastAsked, true);
  });
}

// Remove what the new branch replaces from view (from `from` on; `keep`: keep `from` itself),
// stream the new turn into the chat, then draw the thread from its log again.
async function runBranch(conv, tid, from, path, body, text, keep = false) {
  if (conv.app.running) return toast("A turn is running: wait for it or stop it first.");
  const running = new AbortController();
  conv.app.running = running;
  for (let el = from.nextElementSibling; el; el = from.nextElementSibling) el.remove();
  if (!keep) {
    from.remove();
    conv.userMessage(text);
  }
  try {
    await postStream(path, body, (type, data) => conv.onEvent(type, data), running.signal);
  } catch (e) {
    conv.notice(e.message, "error");
  }
  if (conv.app.running === running) conv.app.running = null;
  const { loadThread } = await import("./chat.js");
  conv.app.thread = await loadThread(conv, tid);
}

function switcher(conv, tid, point, active) {
  let shown = active;
  const label = h("span", { class: "branch-pos" });
  const prev = button("branch-prev", "Earlier version of this question", "‹", () => show(shown - 1));
  const next = button("branch-next", "Later version of this question", "›", () => show(shown + 1));
  const el = h("div", { class: "branch-switch", "data-at": String(point.at) }, prev, label, next);
  const paint = () => {
    label.textContent = `${shown + 1} / ${point.branches.length}`;
    prev.disabled = shown === 0;
    next.disabled = shown === point.branches.length - 1;
  };
  async function show(i) {
    if (i < 0 || i >= point.branches.length) return;
    shown = i;
    paint();
    el.parentElement.querySelectorAll(`.branch-view[data-at="${point.at}"]`).forEach((v) => v.remove());
    const activeSeq = point.branches[active].seq;
    const later = [...el.parentElement.querySelectorAll("[data-seq]")].filter((x) => Number(x.dataset.seq) >= activeSeq);
    later.forEach((x) => { x.hidden = i !== active; });
    if (i === active) return;
    const b = point.branches[i];
    try {
      const [branch, artifacts] = await Promise.all([
        api("GET", `/api/threads/${enc(tid)}/branches/${b.seq}`),
        api("GET", `/api/threads/${enc(tid)}/artifacts`).catch(() => []),
      ]);
      const { Conversation } = await import("./chat.js");
      const box = h("div", { class: "branch-body" });
      const view = h("div", { class: "branch-view", "data-at": String(point.at) },
        h("p", { class: "notice info" }, "An earlier branch, read-only: continue on the newest one (›)."), box);
      const sub = new Conversation(box, conv.app);
      clearInterval(sub.ticker);
      sub.render(branch.records, artifacts);
      box.querySelectorAll(".pin-msg, .edit-msg, .regenerate").forEach((x) => x.remove());
      el.after(view);
    } catch (e) {
      toast(e.message);
    }
  }
  paint();
  return el;
}
