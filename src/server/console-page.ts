/**
 * The operator console: one self-contained page (no build step, nothing loaded
 * from elsewhere) served on the admin port at /console. It calls
 * /console/api/* with the operator token the user enters, kept in this tab's
 * session storage only. All text from the registry is inserted as text, never
 * as HTML.
 */
export const CONSOLE_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Idempotency coordinator: operator console</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #1d2330; }
  h1 { font-size: 1.3rem; } h2 { font-size: 1.05rem; margin-top: 1.6rem; }
  table { border-collapse: collapse; margin-top: .4rem; }
  th, td { border-bottom: 1px solid #dde; padding: .3rem .6rem; text-align: left; vertical-align: top; }
  th { background: #f3f4f8; }
  code { font-size: 12px; }
  .counts span { display: inline-block; margin-right: 1.2rem; }
  .warn { color: #a33; font-weight: 600; }
  form.reconcile { background: #f7f7fb; padding: .6rem; margin-top: .4rem; }
  form.reconcile label { display: block; margin: .2rem 0; }
  #message { margin: .6rem 0; }
  [hidden] { display: none; }
</style>
</head>
<body>
<h1>Idempotency coordinator</h1>
<form id="login" data-testid="login">
  <label>Operator token <input id="token" type="password" autocomplete="off" size="50" data-testid="token"></label>
  <button type="submit" data-testid="sign-in">Sign in</button>
</form>
<div id="message" role="status" data-testid="message"></div>
<main id="console" hidden>
  <button id="refresh" data-testid="refresh">Refresh</button>
  <h2>Records by state</h2>
  <div class="counts" data-testid="counts"></div>
  <h2>Modes</h2>
  <table data-testid="modes"><thead><tr><th>Operation</th><th>API</th><th>Mode</th><th>Writer epoch</th><th>Changed by</th></tr></thead><tbody></tbody></table>
  <h2>UNKNOWN queue</h2>
  <p>Each record may have had an effect. Check the downstream system by each attempt's key or handle, then reconcile it with what you found.</p>
  <table data-testid="unknown"><thead><tr><th>Tenant</th><th>Operation id</th><th>Operation</th><th>Gen</th><th>Attempts</th><th></th></tr></thead><tbody></tbody></table>
  <h2>Recent conflicts</h2>
  <table data-testid="conflicts"><thead><tr><th>When</th><th>Tenant</th><th>Operation id</th><th>Operation</th><th>Caller</th></tr></thead><tbody></tbody></table>
</main>
<script>
"use strict";
const $ = (selector) => document.querySelector(selector);
const token = () => sessionStorage.getItem("idem-token") || "";

function say(text, warn) {
  const message = $("#message");
  message.textContent = text;
  message.className = warn ? "warn" : "";
}

async function api(path, init) {
  const response = await fetch("/console/api/" + path, {
    ...init,
    headers: { authorization: "Bearer " + token(), "content-type": "application/json" },
  });
  const body = await response.json();
  if (!response.ok) throw new Error((body.reason ? body.reason + ": " : "") + (body.message || response.status));
  return body;
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
  return td;
}

function fill(table, rows, render) {
  const body = table.querySelector("tbody");
  body.replaceChildren();
  for (const item of rows) {
    const row = document.createElement("tr");
    render(row, item);
    body.appendChild(row);
  }
}

function reconcileForm(record) {
  const form = document.createElement("form");
  form.className = "reconcile";
  form.dataset.testid = "reconcile-form";
  form.innerHTML =
    '<label>Outcome <select name="outcome"><option>SUCCEEDED</option><option>FAILED_FINAL</option></select></label>' +
    '<label>HTTP status to replay <input name="statusCode" type="number" min="100" max="599" value="201" required></label>' +
    '<label>Response body <textarea name="body" rows="2" cols="50"></textarea></label>' +
    '<label>Evidence <input name="evidence" size="50" required></label>' +
    '<label>Your name <input name="operator" size="30" required></label>' +
    '<button type="submit">Reconcile</button>';
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(form));
    try {
      const result = await api("reconcile", { method: "POST", body: JSON.stringify({ ...data, tenant: record.tenant, operationId: record.operationId }) });
      say("Reconciled " + result.operationId + ": " + result.state + " at generation " + result.generation);
      await load();
    } catch (error) {
      say(error.message, true);
    }
  });
  return form;
}

async function load() {
  const [overview, unknown] = await Promise.all([api("overview"), api("records?state=UNKNOWN")]);
  const counts = $("[data-testid=counts]");
  counts.replaceChildren();
  for (const [state, n] of Object.entries(overview.records)) {
    const span = document.createElement("span");
    span.dataset.state = state;
    span.textContent = state + ": " + n;
    counts.appendChild(span);
  }
  if (overview.oldestUnknownSeconds > 0) {
    const span = document.createElement("span");
    span.className = "warn";
    span.textContent = "oldest UNKNOWN: " + overview.oldestUnknownSeconds + " s";
    counts.appendChild(span);
  }
  fill($("[data-testid=modes]"), overview.controls, (row, c) => {
    [c.operation, String(c.apiRevision), c.mode, String(c.writerEpoch), c.updatedBy].forEach((text) => cell(row, text));
  });
  fill($("[data-testid=unknown]"), unknown.records, (row, r) => {
    row.dataset.operationId = r.operationId;
    [r.tenant, r.operationId, r.operation, String(r.generation)].forEach((text) => cell(row, text));
    cell(row, r.attempts.map((a) => a.effect + " #" + a.number + " " + a.status + " key " + a.downstreamKey + (a.handle ? " handle " + a.handle : "")).join("; ") || "-");
    const action = cell(row, "");
    const button = document.createElement("button");
    button.textContent = "Reconcile…";
    button.dataset.testid = "open-reconcile";
    button.addEventListener("click", () => action.replaceChildren(reconcileForm(r)));
    action.appendChild(button);
  });
  fill($("[data-testid=conflicts]"), overview.conflicts, (row, c) => {
    [new Date(c.at).toISOString(), c.tenant, c.operationId, c.operation, c.caller].forEach((text) => cell(row, text));
  });
}

async function start() {
  try {
    await load();
    $("#login").hidden = true;
    $("#console").hidden = false;
  } catch (error) {
    say(error.message, true);
  }
}

$("#login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("idem-token", $("#token").value.trim());
  say("");
  start();
});
$("#refresh").addEventListener("click", () => load().catch((error) => say(error.message, true)));
if (token()) start();
</script>
</body>
</html>
`;
