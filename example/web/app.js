// The idemgate example page: a client that follows the three rules where
// you can see it. Plain browser JavaScript, no build step, no framework.
"use strict";

const $ = (id) => document.getElementById(id);

// st is the one business action in flight: its key, the exact body sent
// under it, and the task it created.
const st = { token: null, key: null, body: null, taskId: null, timer: null, pollEntry: null, polls: 0 };

// ---- the wire log ----------------------------------------------------------

function logEntry(lines) {
  const li = document.createElement("li");
  for (const [cls, text] of lines) {
    const div = document.createElement("div");
    div.className = cls;
    div.textContent = text;
    li.appendChild(div);
  }
  $("log").appendChild(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

// shorten keeps data URLs of images out of the log.
function shorten(text) {
  return text.replace(/data:image\/png;base64,[A-Za-z0-9+/=]+/g, (m) => `data:image/png;base64,…(${m.length} chars)`);
}

// call sends one request and logs it with its answer. It never retries:
// retrying is the user's decision, made with the buttons.
async function call(method, path, body, headers) {
  headers = Object.assign({ Authorization: "Bearer " + st.token }, headers || {});
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const reqLines = [["req", `${method} ${path}`]];
  if (headers["Idempotency-Key"]) reqLines.push(["hdr", `Idempotency-Key: ${headers["Idempotency-Key"]}`]);
  if (body !== undefined) reqLines.push(["hdr", body]);
  let res, text;
  try {
    res = await fetch(path, { method, headers, body });
    text = await res.text();
  } catch (err) {
    const li = logEntry([...reqLines, ["res err", `network error: ${err.message}`]]);
    return { status: 0, json: { title: "Network error", detail: err.message }, replayed: false, log: () => li };
  }
  let json = null;
  try { json = JSON.parse(text); } catch (_) { json = { title: res.statusText, detail: text.slice(0, 200) }; }
  const replayed = res.headers.get("Idempotent-Replayed") === "true";
  const resLine = [`→ ${res.status} ${res.statusText || ""}`.trim()];
  if (replayed) resLine.push("Idempotent-Replayed: true");
  if (res.headers.get("Retry-After")) resLine.push(`Retry-After: ${res.headers.get("Retry-After")}`);
  const cls = res.ok ? (replayed ? "res replay" : "res") : "res err";
  return { status: res.status, statusText: res.statusText, json, replayed, text,
    log: () => logEntry([...reqLines, [cls, resLine.join("  ·  ")], ["hdr", shorten(text)]]) };
}

// ---- what the page shows ---------------------------------------------------

function setStatus(parts) {
  const el = $("status");
  el.replaceChildren();
  for (const p of parts) {
    if (typeof p === "string") { el.append(p); continue; }
    const span = document.createElement("span");
    span.className = p.cls;
    span.textContent = p.text;
    el.append(span);
  }
}

function statusBadge(r) {
  return { cls: `badge s${String(r.status)[0]}`, text: `${r.status} ${r.statusText || ""}`.trim() };
}

// showProblem renders an RFC 9457 problem document: its title and detail,
// and the fields the server says changed, when it says so.
function showProblem(p, status) {
  const box = $("problem");
  box.replaceChildren();
  if (!p) { box.hidden = true; return; }
  const title = document.createElement("div");
  title.className = "title";
  title.textContent = (p.title || "Error") + (status ? ` (${status})` : "");
  const detail = document.createElement("div");
  detail.className = "detail";
  detail.textContent = p.detail || "";
  box.append(title, detail);
  if (Array.isArray(p.changed) && p.changed.length) {
    const ch = document.createElement("div");
    ch.className = "changed";
    ch.append("changed: ");
    p.changed.forEach((f, i) => {
      const c = document.createElement("code");
      c.textContent = f;
      if (i) ch.append(" ");
      ch.append(c);
    });
    box.append(ch);
  }
  if (p.code) {
    const code = document.createElement("div");
    code.className = "code";
    code.textContent = "code: " + p.code;
    box.append(code);
  }
  box.hidden = false;
}

function showImages(urls) {
  const g = $("gallery");
  g.replaceChildren();
  (urls || []).forEach((u, i) => {
    const img = document.createElement("img");
    img.src = u;
    img.alt = `generated image ${i + 1}`;
    g.appendChild(img);
  });
}

function met(rule) { $(rule).classList.add("met"); }

function buttons() {
  const sent = st.body !== null;
  $("retry-btn").disabled = !sent;
  $("reword-btn").disabled = !sent;
  $("cancel-btn").disabled = !st.taskId;
  $("new-btn").disabled = !sent;
}

// ---- sign in ---------------------------------------------------------------

async function signIn(ev) {
  ev.preventDefault();
  const tenant = $("tenant").value.trim(), user = $("user").value.trim();
  const res = await fetch("/dev/token", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ tenant, user }) });
  if (res.status === 404) {
    // The server has a real JWT_SECRET: no dev tokens; paste one.
    $("paste").hidden = false;
    showProblem({ title: "No dev sign-in on this server", detail: "JWT_SECRET is set: paste a token made with `go run ./example token`." });
    return;
  }
  const j = await res.json();
  if (!res.ok) { showProblem(j, res.status); return; }
  st.token = j.token;
  $("who").textContent = `signed in as ${user} @ ${tenant} (dev token)`;
  showProblem(null);
  showQueue();
}

function useToken(ev) {
  ev.preventDefault();
  st.token = $("token").value.trim();
  $("who").textContent = "using the pasted token";
  showProblem(null);
  showQueue();
}

// ---- the queue ---------------------------------------------------------------

// showQueue fills the queue card from GET /v1/queue. It is read every two
// seconds while signed in, outside the wire log: it is not the action.
async function showQueue() {
  if (!st.token) return;
  let j;
  try {
    const res = await fetch("/v1/queue", { headers: { Authorization: "Bearer " + st.token } });
    if (!res.ok) return;
    j = await res.json();
  } catch (_) { return; }
  const body = document.createElement("tbody");
  const head = document.createElement("tr");
  for (const h of ["kind", "running / limit", "waiting", "per tenant", "starts/s", ""]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.appendChild(th);
  }
  body.appendChild(head);
  const limit = (v) => (v ? String(v) : "–");
  for (const k of j.kinds) {
    const tr = document.createElement("tr");
    tr.dataset.kind = k.kind;
    for (const text of [k.kind, `${k.running} / ${limit(k.max_running)}`, String(k.waiting),
      limit(k.max_running_per_tenant), limit(k.starts_per_second), k.paused ? "paused" : ""]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    if (k.paused) tr.className = "paused";
    body.appendChild(tr);
  }
  $("queue").replaceChildren(body);
}

// ---- the business action ---------------------------------------------------

function stopPolling() {
  clearTimeout(st.timer);
  st.timer = null;
}

async function submit(body, label) {
  stopPolling();
  const r = await call("POST", "/v1/images", body, { "Idempotency-Key": st.key });
  r.log();
  if (r.status !== 202) {
    setStatus([`${label}: `, statusBadge(r)]);
    showProblem(r.json, r.status);
    if (r.status === 409 && r.json && r.json.code === "key_reused") met("rule2");
    return;
  }
  showProblem(null);
  st.taskId = r.json.task_id;
  const parts = [`${label}: `, statusBadge(r)];
  if (r.replayed) parts.push({ cls: "badge replayed", text: "replayed" });
  parts.push(` task ${st.taskId} `, { cls: "state", text: r.json.status }, ` · polling every ${r.json.poll_after_ms} ms`);
  setStatus(parts);
  buttons();
  st.polls = 0;
  st.pollEntry = null;
  schedulePoll(r.json.poll_after_ms);
}

function schedulePoll(ms) {
  st.timer = setTimeout(poll, Math.max(100, Math.min(ms || 1000, 5000)));
}

// poll reads the same task id until it is finished: a 202 is a promise
// about this task, never a reason to submit again.
async function poll() {
  const id = st.taskId;
  const r = await call("GET", `/v1/tasks/${encodeURIComponent(id)}`);
  if (id !== st.taskId) return; // a newer action replaced this one
  st.polls++;
  met("rule3");
  // One log line for the whole polling, updated in place.
  if (st.pollEntry) st.pollEntry.remove();
  st.pollEntry = r.log();
  st.pollEntry.firstChild.textContent += `   (poll #${st.polls})`;
  if (r.status !== 200) {
    showProblem(r.json, r.status);
    return;
  }
  const t = r.json;
  const badge = $("status").querySelector(".state");
  if (badge) badge.textContent = t.status + (t.poll_after_ms ? ` (poll #${st.polls})` : "");
  if (t.poll_after_ms) { schedulePoll(t.poll_after_ms); return; }
  if (t.status === "succeeded") {
    showImages(t.images);
  } else {
    showProblem({ title: `Task ${t.status}`, detail: t.error || "" });
  }
}

function generate(ev) {
  ev.preventDefault();
  if (!st.token) { showProblem({ title: "Not signed in", detail: "Sign in as a dev tenant and user first." }); return; }
  st.key = $("action").value.trim();
  st.body = JSON.stringify({ prompt: $("prompt").value, aspect_ratio: $("aspect").value, n: Number($("count").value) });
  st.taskId = null;
  showImages([]);
  met("rule1");
  submit(st.body, "Generate");
}

// retrySame resends the very same bytes under the same key: a true retry,
// answered from the stored response.
function retrySame() { submit(st.body, "Retry the same"); }

// reword changes the prompt but keeps the key: the server refuses it (409)
// before anything is generated.
function reword() {
  const p = JSON.parse(st.body);
  let prompt = $("prompt").value;
  if (prompt === p.prompt) prompt = p.prompt.replace(/dawn/, "dusk");
  if (prompt === p.prompt) prompt = p.prompt + ", reworded";
  $("prompt").value = prompt;
  p.prompt = prompt;
  const body = JSON.stringify(p);
  // The task under this key goes on; only the reworded request is refused.
  call("POST", "/v1/images", body, { "Idempotency-Key": st.key }).then((r) => {
    r.log();
    const parts = ["Reword and retry under the same key: ", statusBadge(r)];
    setStatus(parts);
    showProblem(r.status === 202 ? null : r.json, r.status);
    if (r.status === 409 && r.json && r.json.code === "key_reused") met("rule2");
  });
}

async function cancelTask() {
  stopPolling();
  const r = await call("POST", `/v1/tasks/${encodeURIComponent(st.taskId)}/cancel`, "{}");
  r.log();
  if (r.status !== 200) { showProblem(r.json, r.status); return; }
  setStatus(["Cancel: ", statusBadge(r), ` task ${r.json.task_id} `, { cls: "state", text: r.json.status }]);
  showProblem(null);
  if (r.json.poll_after_ms) schedulePoll(r.json.poll_after_ms);
  else if (r.json.status !== "succeeded") showProblem({ title: `Task ${r.json.status}`, detail: r.json.error || "" });
}

// newAction starts the next business action: new parameters, new key.
function newAction() {
  stopPolling();
  const a = $("action");
  const m = a.value.match(/^(.*?)(\d+)(\D*)$/);
  a.value = m ? `${m[1]}${Number(m[2]) + 1}${m[3]}` : a.value + "-2";
  Object.assign(st, { key: null, body: null, taskId: null });
  showImages([]);
  showProblem(null);
  setStatus(["New action: press Generate to send it under its own key."]);
  buttons();
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin").addEventListener("submit", signIn);
  $("paste").addEventListener("submit", useToken);
  $("generate").addEventListener("submit", generate);
  $("retry-btn").addEventListener("click", retrySame);
  $("reword-btn").addEventListener("click", reword);
  $("cancel-btn").addEventListener("click", cancelTask);
  $("new-btn").addEventListener("click", newAction);
  setInterval(showQueue, 2000);
});
