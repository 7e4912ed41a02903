// The HTTP layer: JSON calls with the CSRF header, readable errors, SSE over POST, uploads with progress.

let csrf = null;

export function setCsrf(token) {
  csrf = token;
}

// a shared chat's view reads artifacts through its share (share.js): `fn(path)` maps each path
let rewritePath = null;
export function setPathRewrite(fn) {
  rewritePath = fn;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorOf(resp) {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    message = body.error || body.detail || message;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(resp.status, message);
}

function headers(extra = {}) {
  const h = { Accept: "application/json", ...extra };
  if (csrf) h["X-CSRF-Token"] = csrf;
  return h;
}

export async function api(method, path, body) {
  const init = { method, headers: headers(), credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(rewritePath ? rewritePath(path) : path, init);
  if (!resp.ok) throw await errorOf(resp);
  if (resp.status === 204) return null;
  return resp.json();
}

// Read a server-sent event stream: onEvent(type, data, id) for each event as it arrives.
// Resolves with the HTTP status (204: nothing to stream) once the stream ends.
async function readStream(resp, onEvent) {
  if (resp.status === 204) return 204;
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      let type = "message";
      let id = null;
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        else if (line.startsWith("id:")) id = line.slice(3).trim();
      }
      if (!data.length) continue; // a ": ping" comment
      let parsed;
      try {
        parsed = JSON.parse(data.join("\n"));
      } catch {
        parsed = { text: data.join("\n") };
      }
      onEvent(type, parsed, id);
    }
  }
  return resp.status;
}

// POST a message and hand each server-sent event to onEvent(type, data, id) as it arrives.
export async function postStream(path, body, onEvent, signal) {
  const resp = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify(body),
    credentials: "same-origin",
    signal,
  });
  if (!resp.ok) throw await errorOf(resp);
  return readStream(resp, onEvent);
}

// Re-attach to a thread's running turn (GET .../events): the events after `lastId` (an SSE id),
// or all of the turn's. Resolves with 204 when no turn runs.
export async function attachStream(path, lastId, onEvent, signal) {
  const extra = { Accept: "text/event-stream" };
  if (lastId) extra["Last-Event-ID"] = lastId;
  const resp = await fetch(path, { method: "GET", headers: headers(extra), credentials: "same-origin", signal });
  if (!resp.ok) throw await errorOf(resp);
  return readStream(resp, onEvent);
}

// Upload one file as multipart/form-data; onProgress(fraction) while it is sent.
export function upload(path, file, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    if (csrf) xhr.setRequestHeader("X-CSRF-Token", csrf);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) onProgress(e.loaded / e.total);
    };
    xhr.onload = () => {
      let body = null;
      try {
        body = JSON.parse(xhr.responseText);
      } catch {
        body = null;
      }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else reject(new ApiError(xhr.status, (body && (body.error || body.detail)) || `upload failed (${xhr.status})`));
    };
    xhr.onerror = () => reject(new ApiError(0, "upload failed: the server could not be reached"));
    const form = new FormData();
    form.append("file", file, file.name);
    xhr.send(form);
  });
}
