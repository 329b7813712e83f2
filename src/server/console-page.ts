/**
 * The operator console: one self-contained page (no build step, nothing loaded
 * from elsewhere) served on the admin port at /console. It calls
 * /console/api/* with the operator token the user enters, kept in this tab's
 * session storage only until sign-out. All text from the registry is inserted
 * as text (textContent, attributes), never as HTML; the only markup parsed is
 * this page's own.
 *
 * Views, by hash route: `#/` overview (counts, charts, modes, recent
 * conflicts), `#/search` (by operation id, scope or state;
 * `#/search/state/<STATE>` lists a state), `#/unknown` (the UNKNOWN queue
 * with its reconcile forms), `#/records/<tenant>/<operationId>` (a record and
 * its timeline). Charts are inline SVG drawn here.
 *
 * Each view shows its own data and its own errors only: opening a view empties
 * it, a load that fails empties it and shows why, and the next load of the
 * same thing that succeeds clears that error.
 */
export const CONSOLE_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Operator console · idempotency coordinator</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  :root { --ink: #1d2330; --muted: #4b5366; --line: #d5d9e2; --soft: #f3f5f9; --accent: #1a4fb5; --warn: #a11d1d; }
  * { box-sizing: border-box; }
  body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: var(--ink); background: #fff; }
  a { color: var(--accent); }
  :focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
  .skip { position: absolute; left: -999px; top: 0; background: #fff; padding: .5rem 1rem; }
  .skip:focus { left: .5rem; }
  header { background: var(--ink); color: #fff; padding: .7rem 1.5rem; display: flex; flex-wrap: wrap; gap: .6rem 1.5rem; align-items: center; justify-content: space-between; }
  header h1 { font-size: 1.15rem; margin: 0; }
  header h1 span { font-weight: 400; color: #d8dded; }
  header :focus-visible { outline-color: #ffd166; }
  #session { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: center; }
  #session label { display: inline-flex; gap: .35rem; align-items: center; }
  header button { background: #fff; color: var(--ink); border: 0; }
  nav { border-bottom: 1px solid var(--line); padding: 0 1.5rem; }
  nav ul { list-style: none; display: flex; gap: 1.5rem; margin: 0; padding: 0; }
  nav a { display: inline-block; padding: .7rem 0; text-decoration: none; font-weight: 600; }
  nav a[aria-current=page] { border-bottom: 3px solid var(--accent); color: var(--ink); }
  main { padding: 1rem 1.5rem 3rem; max-width: 1200px; }
  h2 { font-size: 1.3rem; margin: .6rem 0 .8rem; }
  h3 { font-size: 1.05rem; margin: 1.6rem 0 .5rem; }
  p.note, .empty, figcaption small { color: var(--muted); }
  .empty { font-style: italic; }
  #message { margin: .6rem 1.5rem 0; min-height: 1.4em; font-weight: 600; }
  .warn { color: var(--warn); }
  button { font: inherit; padding: .35rem .8rem; border-radius: 4px; border: 1px solid var(--accent); background: var(--accent); color: #fff; cursor: pointer; }
  button.secondary { background: #fff; color: var(--accent); }
  input, select, textarea { font: inherit; padding: .3rem .4rem; border: 1px solid #767d8c; border-radius: 4px; color: var(--ink); background: #fff; }
  table { border-collapse: collapse; width: 100%; margin-top: .3rem; }
  th, td { border-bottom: 1px solid var(--line); padding: .35rem .6rem; text-align: left; vertical-align: top; }
  th { background: var(--soft); font-weight: 600; }
  code, .mono { font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; }
  .counts { list-style: none; display: flex; flex-wrap: wrap; gap: .6rem; padding: 0; margin: 0; }
  .counts a { display: block; min-width: 9rem; padding: .5rem .8rem; border: 1px solid var(--line); border-radius: 6px; text-decoration: none; color: var(--ink); }
  .counts strong { display: block; font-size: 1.5rem; }
  .badge { display: inline-block; padding: 0 .4rem; border-radius: 4px; font-size: 13px; font-weight: 600; background: #eceef3; color: #2b3140; }
  .badge.SUCCEEDED { background: #e1f3e6; color: #14532d; } .badge.UNKNOWN { background: #fbe7e6; color: #8a1c1c; }
  .badge.EXECUTING { background: #e6edfc; color: #1e3a8a; } .badge.FAILED_FINAL { background: #fdf0dc; color: #7a4100; }
  .badge.REJECTED { background: #f1e6fc; color: #5b2185; }
  .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(250px, 1fr)); gap: .8rem; }
  figure.chart { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: .5rem .6rem; }
  figcaption { display: flex; justify-content: space-between; gap: .5rem; font-weight: 600; }
  figure.chart svg { width: 100%; height: auto; display: block; }
  .forms { display: grid; grid-template-columns: repeat(auto-fit, minmax(280px, 1fr)); gap: 1rem; }
  form.search, form.reconcile { border: 1px solid var(--line); border-radius: 6px; padding: .6rem .9rem .9rem; background: var(--soft); }
  form.reconcile, #login { max-width: 44rem; }
  form.search h3 { margin-top: .2rem; }
  .field { display: block; margin: .45rem 0; }
  .field > span { display: block; font-weight: 600; font-size: 14px; }
  .field input, .field select, .field textarea { width: 100%; }
  dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1.2rem; margin: 0; }
  dl.facts dt { font-weight: 600; }
  dl.facts dd { margin: 0; }
  @media (min-width: 900px) { dl.facts { grid-template-columns: max-content minmax(0, 1fr) max-content minmax(0, 1fr); } }
  ol.timeline { list-style: none; padding: 0; margin: 0; border-left: 3px solid var(--line); }
  ol.timeline li { position: relative; padding: .25rem 0 .6rem 1rem; }
  ol.timeline li::before { content: ""; position: absolute; left: -8px; top: .6rem; width: 11px; height: 11px; border-radius: 50%; background: var(--accent); }
  ol.timeline .kind { font-weight: 700; }
  fieldset { border: 0; padding: 0; margin: 0; }
  legend { font-weight: 700; padding: 0; }
  .sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
  [hidden] { display: none !important; }
</style>
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header>
  <h1>Idempotency coordinator <span>operator console</span></h1>
  <div id="session" hidden>
    <span data-testid="updated" id="updated">Not updated yet</span>
    <label><input type="checkbox" id="auto" checked data-testid="auto-refresh"> Auto-refresh</label>
    <label>every <select id="interval" data-testid="interval"><option value="5">5 s</option><option value="10" selected>10 s</option><option value="30">30 s</option><option value="60">60 s</option></select></label>
    <button type="button" id="refresh" data-testid="refresh">Refresh now</button>
    <button type="button" id="sign-out" data-testid="sign-out">Sign out</button>
  </div>
</header>
<nav id="nav" aria-label="Views" hidden>
  <ul>
    <li><a href="#/" data-view="overview">Overview</a></li>
    <li><a href="#/search" data-view="search">Search</a></li>
    <li><a href="#/unknown" data-view="unknown" data-testid="nav-unknown">UNKNOWN queue</a></li>
  </ul>
</nav>
<div id="message" role="status" aria-live="polite" data-testid="message"></div>
<main id="main" tabindex="-1">

<section id="login-view" aria-labelledby="login-title">
  <h2 id="login-title" tabindex="-1">Sign in</h2>
  <form id="login" data-testid="login">
    <label class="field"><span>Operator token</span><input id="token" type="password" autocomplete="off" required data-testid="token"></label>
    <button type="submit" data-testid="sign-in">Sign in</button>
    <p class="note">The token is kept in this tab's session storage only, until you sign out or close the tab.</p>
  </form>
</section>

<section id="overview-view" aria-labelledby="overview-title" hidden>
  <h2 id="overview-title" tabindex="-1">Overview</h2>
  <div data-content hidden>
  <h3>Records by state</h3>
  <ul class="counts" data-testid="counts" data-registry></ul>
  <p id="oldest" data-testid="oldest" data-registry></p>
  <h3 id="activity-title">Activity</h3>
  <p class="note">From the registry's event log, the same on every replica: events per second and the UNKNOWN records, over the last
    <label><span class="sr">Chart window</span> <select id="window" data-testid="window"><option value="5">5 minutes</option><option value="10" selected>10 minutes</option><option value="30">30 minutes</option><option value="60">60 minutes</option></select></label>.</p>
  <div class="charts" data-testid="charts" data-registry></div>
  <h3 id="replica-title">Decisions without events, on this replica</h3>
  <p class="note" id="replica-note" data-registry></p>
  <div class="charts" data-testid="replica-charts" data-registry></div>
  <h3 id="modes-title">Modes</h3>
  <table data-testid="modes" aria-labelledby="modes-title"><thead><tr><th scope="col">Operation</th><th scope="col">API revision</th><th scope="col">Mode</th><th scope="col">Writer epoch</th><th scope="col">Changed by</th></tr></thead><tbody data-registry></tbody></table>
  <p class="empty" data-testid="modes-empty" hidden>No operation has switches yet: every operation enforces, at writer epoch 0.</p>
  <h3 id="conflicts-title">Recent conflicts</h3>
  <table data-testid="conflicts" aria-labelledby="conflicts-title"><thead><tr><th scope="col">When</th><th scope="col">Tenant</th><th scope="col">Operation id</th><th scope="col">Operation</th><th scope="col">Caller</th></tr></thead><tbody data-registry></tbody></table>
  <p class="empty" data-testid="conflicts-empty" hidden>No payload conflict: no key was reused for a different request.</p>
  </div>
</section>

<section id="search-view" aria-labelledby="search-title" hidden>
  <h2 id="search-title" tabindex="-1">Search</h2>
  <div class="forms">
    <form class="search" id="by-id" data-testid="search-id">
      <h3>By operation id</h3>
      <label class="field"><span>Operation id</span><input name="operationId" required autocomplete="off" placeholder="0190f3a2-…" class="mono"></label>
      <button type="submit">Find</button>
    </form>
    <form class="search" id="by-scope" data-testid="search-scope">
      <h3>By scope</h3>
      <label class="field"><span>Tenant</span><input name="tenant" required autocomplete="off"></label>
      <label class="field"><span>Principal</span><input name="principal" required autocomplete="off"></label>
      <label class="field"><span>Operation (name@API revision; every revision without one)</span><input name="operation" required autocomplete="off" placeholder="payments.create@1"></label>
      <label class="field"><span>Idempotency key</span><input name="idempotencyKey" required autocomplete="off"></label>
      <button type="submit">Find</button>
    </form>
    <form class="search" id="by-state" data-testid="search-state">
      <h3>By state</h3>
      <label class="field"><span>State</span><select name="state"><option value="">Every state</option><option>RESERVED</option><option>EXECUTING</option><option>SUCCEEDED</option><option>FAILED_FINAL</option><option>REJECTED</option><option>UNKNOWN</option></select></label>
      <label class="field"><span>Records per page</span><select name="limit"><option>20</option><option selected>50</option><option>100</option></select></label>
      <button type="submit">List, newest first</button>
    </form>
  </div>
  <section id="results" aria-labelledby="results-title" data-content hidden>
    <h3 id="results-title" tabindex="-1">Results</h3>
    <p class="note" id="results-about" data-testid="results-about" data-registry></p>
    <table data-testid="results" aria-labelledby="results-title"><thead><tr><th scope="col">Created</th><th scope="col">Tenant</th><th scope="col">Operation id</th><th scope="col">Operation</th><th scope="col">Principal</th><th scope="col">State</th><th scope="col">Generation</th><th scope="col">Attempts</th></tr></thead><tbody data-registry></tbody></table>
    <p class="empty" data-testid="results-empty" hidden></p>
    <button type="button" class="secondary" id="more" data-testid="more" hidden>Show more</button>
  </section>
</section>

<section id="unknown-view" aria-labelledby="unknown-title" hidden>
  <h2 id="unknown-title" tabindex="-1">UNKNOWN queue</h2>
  <p>Each record here may have had its effect: its owner's lease ended after it registered an effect attempt. Ask the downstream system by each attempt's downstream key or provider handle what happened, then reconcile the record with what you found; retries then replay the response you record. Longest UNKNOWN first.</p>
  <div data-content hidden>
  <p class="note" id="unknown-about" data-testid="unknown-about" data-registry></p>
  <table data-testid="unknown" aria-labelledby="unknown-title"><thead><tr><th scope="col">UNKNOWN for</th><th scope="col">Tenant</th><th scope="col">Operation id</th><th scope="col">Operation</th><th scope="col">Generation</th><th scope="col">Effect attempts</th><th scope="col"><span class="sr">Action</span></th></tr></thead><tbody data-registry></tbody></table>
  <p class="empty" data-testid="unknown-empty" hidden>No record is UNKNOWN: nothing to reconcile.</p>
  </div>
</section>

<section id="record-view" aria-labelledby="record-title" hidden>
  <h2 id="record-title" tabindex="-1" data-testid="record-title" data-registry>Record</h2>
  <div data-content hidden>
  <dl class="facts" data-testid="record-facts" data-registry></dl>
  <h3 id="attempts-title">Effect attempts</h3>
  <table data-testid="attempts" aria-labelledby="attempts-title"><thead><tr><th scope="col">#</th><th scope="col">Generation</th><th scope="col">Effect</th><th scope="col">Provider</th><th scope="col">Status</th><th scope="col">Downstream key</th><th scope="col">Provider handle</th><th scope="col">Registered</th><th scope="col">Resolved</th></tr></thead><tbody data-registry></tbody></table>
  <p class="empty" data-testid="attempts-empty" hidden>No effect attempt: no downstream call was registered for this record.</p>
  <div id="record-reconcile" data-registry></div>
  <h3 id="timeline-title">Timeline</h3>
  <p class="note" id="timeline-about" data-registry></p>
  <ol class="timeline" data-testid="timeline" aria-labelledby="timeline-title" data-registry></ol>
  <h3 id="generations-title">Generations</h3>
  <table data-testid="generations" aria-labelledby="generations-title"><thead><tr><th scope="col">Generation</th><th scope="col">Began with</th><th scope="col">At</th><th scope="col">By</th><th scope="col">Effect attempts</th><th scope="col">Events</th></tr></thead><tbody data-registry></tbody></table>
  <h3 id="snapshot-title">Stored response</h3>
  <dl class="facts" data-testid="snapshot" data-registry></dl>
  <p class="empty" data-testid="snapshot-empty" hidden>No stored response: the operation has not finished.</p>
  <p class="note">The body is not shown here: it is the end user's data. An operator who must read it runs idemctl lookup.</p>
  </div>
</section>
</main>

<template id="reconcile-template">
  <form class="reconcile" data-testid="reconcile-form">
    <fieldset>
      <legend>Reconcile with what the downstream system says</legend>
      <label class="field"><span>Outcome</span><select name="outcome"><option>SUCCEEDED</option><option>FAILED_FINAL</option></select></label>
      <label class="field"><span>HTTP status to replay</span><input name="statusCode" type="number" min="100" max="599" value="201" required></label>
      <label class="field"><span>Media type of the response</span><input name="mediaType" value="application/json" required></label>
      <label class="field"><span>Response body to replay</span><textarea name="body" rows="3"></textarea></label>
      <label class="field"><span>Evidence (what you found, where)</span><input name="evidence" required></label>
      <label class="field"><span>Your name</span><input name="operator" required autocomplete="name"></label>
      <button type="submit">Reconcile</button>
      <button type="button" class="secondary" data-action="cancel">Cancel</button>
    </fieldset>
  </form>
</template>

<script>
"use strict";
const $ = (selector, root) => (root || document).querySelector(selector);
const TOKEN = "idem-token";
const token = () => sessionStorage.getItem(TOKEN) || "";
const SVG = "http://www.w3.org/2000/svg";
let timer = 0;
let route = { view: "overview" };
let overview = null;
let search = null;
/** What the error on the status line is about ("load": a view's data; "search"; "action": a form sent), or null: the success of the same thing clears it. */
let errorOf = null;

/** An element with attributes and children (strings become text nodes: never parsed as HTML). */
function h(tag, attributes, ...children) {
  const element = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) if (value !== undefined && value !== null && value !== false) element.setAttribute(name, String(value));
  for (const child of children) if (child !== undefined && child !== null) element.append(child instanceof Node ? child : String(child));
  return element;
}

function say(text, warn) {
  const message = $("#message");
  message.textContent = text;
  message.className = warn ? "warn" : "";
  errorOf = null;
}

/** Shows why something failed (a refused token signs the page out), until that thing next succeeds or another view opens. */
function failed(error, about) {
  if (error instanceof Refused && error.status === 401) return signOut("Signed out: " + error.message);
  say(error.message, true);
  errorOf = about;
}

/** Clears the status line's error about what has just succeeded; an error about something else stays. */
function succeeded(about) {
  if (errorOf === about) say("");
}

class Refused extends Error {
  constructor(status, body) {
    super((body.reason ? body.reason + ": " : "") + (body.message || "HTTP " + status));
    this.status = status;
  }
}

async function api(path, body) {
  const response = await fetch("/console/api/" + path, {
    method: body ? "POST" : "GET",
    headers: { authorization: "Bearer " + token(), "content-type": "application/json" },
    ...(body ? { body: JSON.stringify(body) } : {}),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Refused(response.status, answer);
  return answer;
}

const pad = (n) => String(n).padStart(2, "0");
function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " + pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
}
const time = (iso) => (iso ? h("time", { datetime: iso }, when(iso)) : "–");
function age(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
}
const badge = (state) => h("span", { class: "badge " + state }, state);
const recordHref = (tenant, operationId) => "#/records/" + encodeURIComponent(tenant) + "/" + encodeURIComponent(operationId);
const recordLink = (r) => h("a", { href: recordHref(r.tenant, r.operationId), class: "mono" }, r.operationId);
const attemptText = (a) => a.effect + " #" + a.number + " " + a.status + " key " + a.downstreamKey + (a.handle ? " handle " + a.handle : "");

/**
 * Renders a container anew, keeping the keyboard focus on the same link or
 * button if it was inside: an automatic refresh never throws a keyboard user
 * back to the top of the page.
 */
function keepFocus(container, render) {
  const name = (el) => el.getAttribute("href") || el.getAttribute("aria-label") || el.textContent;
  const focused = container.contains(document.activeElement) ? name(document.activeElement) : null;
  render();
  if (focused === null) return;
  const again = [...container.querySelectorAll("a, button")].find((el) => name(el) === focused);
  if (again) again.focus();
}

/** Fills a table's body with a row per item (cells: text or nodes), and shows its empty state when there is none. */
function fill(name, items, cells, decorate) {
  const body = $("[data-testid=" + name + "] tbody");
  keepFocus(body, () => body.replaceChildren(...items.map((item) => {
    const row = h("tr", {}, ...cells(item).map((cell) => h("td", {}, cell)));
    if (decorate) decorate(row, item);
    return row;
  })));
  const empty = $("[data-testid=" + name + "-empty]");
  if (empty) empty.hidden = items.length > 0;
  $("[data-testid=" + name + "]").hidden = items.length === 0 && Boolean(empty);
}

function facts(name, pairs) {
  $("[data-testid=" + name + "]").replaceChildren(...pairs.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

// ---- Charts: inline SVG, one small chart per series ----

function chart(series, minutes) {
  const values = series.values;
  const max = Math.max(...values, 0);
  const top = max > 0 ? niceCeiling(max) : 1;
  const width = 300, height = 110, left = 34, bottom = 92, right = 296, topY = 10;
  const x = (i) => left + ((right - left) * i) / Math.max(1, values.length - 1);
  const y = (v) => bottom - ((bottom - topY) * v) / top;
  const points = values.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
  const now = values.length ? values[values.length - 1] : 0;
  const rate = series.unit === "per second";
  const shown = (v) => (series.unit === "seconds" ? age(v) : format(v) + (rate ? "/s" : ""));
  const summary = series.title + (rate ? " per second" : "") + " over the last " + minutes + " minutes: now " + shown(now) + ", highest " + shown(max);
  const svg = h("svg:svg", { viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": summary, "data-series": series.key },
    h("svg:line", { x1: left, y1: bottom, x2: right, y2: bottom, stroke: "#767d8c" }),
    h("svg:line", { x1: left, y1: topY, x2: right, y2: topY, stroke: "#d5d9e2", "stroke-dasharray": "3 3" }),
    h("svg:text", { x: left - 4, y: topY + 4, "text-anchor": "end", "font-size": 10, fill: "#4b5366" }, format(top)),
    h("svg:text", { x: left - 4, y: bottom + 3, "text-anchor": "end", "font-size": 10, fill: "#4b5366" }, "0"),
    h("svg:text", { x: left, y: height - 2, "font-size": 10, fill: "#4b5366" }, "−" + minutes + " min"),
    h("svg:text", { x: right, y: height - 2, "text-anchor": "end", "font-size": 10, fill: "#4b5366" }, "now"),
    h("svg:polygon", { points: x(0) + "," + bottom + " " + points + " " + x(values.length - 1) + "," + bottom, fill: "#1a4fb5", "fill-opacity": 0.12 }),
    h("svg:polyline", { points, fill: "none", stroke: "#1a4fb5", "stroke-width": 2, "stroke-linejoin": "round" }),
  );
  return h("figure", { class: "chart", "data-testid": "chart-" + series.key },
    h("figcaption", {}, h("span", {}, series.title + (rate ? " /s" : "")), h("small", { "data-testid": "chart-now" }, "now " + shown(now))),
    svg);
}
function niceCeiling(v) {
  const magnitude = Math.pow(10, Math.floor(Math.log10(v)));
  for (const step of [1, 2, 5, 10]) if (step * magnitude >= v) return step * magnitude;
  return 10 * magnitude;
}
const format = (v) => (v >= 100 ? String(Math.round(v)) : String(Math.round(v * 100) / 100));

// ---- Views ----

const VIEWS = ["login", "overview", "search", "unknown", "record"];

/**
 * Empties a view of the registry's data it showed: each view shows its own
 * data only, never what an earlier view or an earlier load left. A view's data
 * is in its [data-content] parts, hidden until a load of that view succeeds.
 */
function clearView(view) {
  const section = $("#" + view + "-view");
  for (const content of section.querySelectorAll("[data-content]")) {
    content.hidden = true;
    for (const holder of content.querySelectorAll("[data-registry]")) holder.replaceChildren();
  }
  if (view === "search") search = null;
  // The record asked for, by the address only: whether it exists is for its load to say.
  if (view === "record") $("#record-title").replaceChildren("Record", ...(route.view === "record" ? [" ", h("span", { class: "mono" }, route.operationId)] : []));
}
function reveal(view) {
  for (const content of $("#" + view + "-view").querySelectorAll("[data-content]")) content.hidden = false;
}

function show(view) {
  for (const name of VIEWS) $("#" + name + "-view").hidden = name !== view;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.view === view) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function parseRoute() {
  try {
    const parts = location.hash.replace(/^#[/]?/, "").split("/").filter(Boolean).map(decodeURIComponent);
    if (parts[0] === "records" && parts.length === 3) return { view: "record", tenant: parts[1], operationId: parts[2] };
    if (parts[0] === "search") return { view: "search", state: parts[1] === "state" ? (parts[2] || "") : undefined };
    if (parts[0] === "unknown") return { view: "unknown" };
  } catch {
    // A malformed route shows the overview.
  }
  return { view: "overview" };
}

/**
 * Every load is given the route shown when it began, and drops its answer when
 * another view has opened since: that view has a load of its own, and an old
 * answer must never fill it (another record's facts under this one's address).
 */
async function loadOverview(shown) {
  overview = await api("overview");
  $("[data-testid=nav-unknown]").textContent = "UNKNOWN queue (" + overview.records.UNKNOWN + ")";
  if (shown !== route || shown.view !== "overview") return;
  const counts = $("[data-testid=counts]");
  keepFocus(counts, () => counts.replaceChildren(...Object.entries(overview.records).map(([state, n]) =>
    h("li", { "data-state": state }, h("a", { href: "#/search/state/" + state, "aria-label": "List the " + state + " records" }, h("strong", {}, String(n)), state)))));
  const oldest = $("#oldest");
  oldest.textContent = overview.oldestUnknownSeconds > 0 ? "The oldest UNKNOWN record has been UNKNOWN for " + age(overview.oldestUnknownSeconds) + "." : "No record is UNKNOWN.";
  oldest.className = overview.oldestUnknownSeconds > 0 ? "warn" : "note";
  fill("modes", overview.controls, (c) => [c.operation, String(c.apiRevision), c.mode, String(c.writerEpoch), c.updatedBy]);
  fill("conflicts", overview.conflicts, (c) => [time(c.at), c.tenant, recordLink(c), c.operation || "", c.caller]);
  await loadCharts(shown);
  if (shown === route) reveal("overview");
}

async function loadCharts(shown) {
  const minutes = $("#window").value;
  const charts = await api("charts?minutes=" + minutes);
  if (shown !== route) return;
  $("[data-testid=charts]").replaceChildren(...charts.series.map((s) => chart(s, charts.minutes)));
  const note = $("#replica-note");
  if (charts.replica) {
    note.textContent = "Replays, answers in progress and expired keys leave no event: this replica's metrics count them, for every tenant, since " + when(charts.replica.since) + ". Other replicas count their own.";
    $("[data-testid=replica-charts]").replaceChildren(...charts.replica.series.map((s) => chart(s, charts.minutes)));
  } else {
    note.textContent = "Replays, answers in progress and expired keys leave no event; each replica's metrics count them for every tenant, so they are shown to operators granted every tenant only.";
    $("[data-testid=replica-charts]").replaceChildren();
  }
}

/** Runs a search and shows its results; a search refused shows its error and no results (of it or of an earlier one). */
async function runSearch(kind, input, more) {
  const shown = route;
  try {
    await searchAndShow(kind, input, more, shown);
  } catch (error) {
    if (shown !== route) return;
    clearView("search");
    failed(error, "search");
  }
}

async function searchAndShow(kind, input, more, shown) {
  const earlier = more ? search : null;
  let about, empty, rows, next;
  if (kind === "state") {
    const after = earlier && earlier.next ? "&pageToken=" + encodeURIComponent(earlier.next) : "";
    const answer = await api("records?state=" + encodeURIComponent(input.state) + "&limit=" + encodeURIComponent(input.limit) + after);
    const what = input.state ? "in state " + input.state : "in any state";
    rows = (earlier ? earlier.rows : []).concat(answer.records);
    next = answer.nextPageToken;
    about = "Records " + what + ", newest first.";
    empty = "No record is " + what + " in your tenants.";
  } else {
    rows = (await api("search", input)).records;
    about = kind === "id" ? "Records with operation id " + input.operationId + "." : "The record of the scope " + input.tenant + " / " + input.principal + " / " + input.operation + " / key " + input.idempotencyKey + ".";
    empty = kind === "id" ? "No record has this operation id in your tenants." : "No record has this scope: no request with this key was accepted for this tenant, principal and operation (at any published API revision when none is given).";
  }
  if (shown !== route) return;
  search = { kind, input, rows, next };
  reveal("search");
  succeeded("search");
  $("#results-about").textContent = about;
  $("[data-testid=results-empty]").textContent = empty;
  fill("results", search.rows, (r) => [time(r.createdAt), r.tenant, recordLink(r), r.operation, r.principal, badge(r.state), String(r.generation), String(r.attempts.length)]);
  $("#more").hidden = !search.next;
  $("#results-title").focus();
}

function reconcileForm(record, onDone) {
  const form = $("#reconcile-template").content.firstElementChild.cloneNode(true);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(form));
    try {
      const result = await api("reconcile", { ...data, tenant: record.tenant, operationId: record.operationId });
      say("Reconciled " + result.operationId + ": " + result.state + " at generation " + result.generation + ".");
      form.remove();
      await onDone();
    } catch (error) {
      failed(error, "action");
    }
  });
  // In the queue, Cancel closes the form; on a record's page, where the form stays, it clears it.
  $("[data-action=cancel]", form).addEventListener("click", () => {
    const row = form.closest(".form-row");
    if (!row) return form.reset();
    row.remove();
    onDone(true);
  });
  return form;
}

async function loadUnknown(shown, explicit) {
  // A reconcile form being filled in is never wiped by an automatic refresh.
  if (!explicit && $("#unknown-view form.reconcile")) return;
  const queue = await api("unknown");
  if (shown !== route) return;
  reveal("unknown");
  const total = overview ? overview.records.UNKNOWN : queue.records.length;
  const listed = queue.records.length;
  $("#unknown-about").textContent = listed === 0 ? "" : (listed < total ? "The " + listed + " longest UNKNOWN of " + total + " records." : listed === 1 ? "1 record is UNKNOWN." : listed + " records are UNKNOWN.") + " An automatic refresh leaves this list alone while a reconcile form is open.";
  fill("unknown", queue.records, (r) => [age(r.ageSeconds), r.tenant, recordLink(r), r.operation, String(r.generation), r.attempts.map(attemptText).join("; ") || "none", ""], (row, r) => {
    row.dataset.operationId = r.operationId;
    const button = h("button", { type: "button", "data-testid": "open-reconcile", "aria-expanded": "false" }, "Reconcile…");
    button.setAttribute("aria-label", "Reconcile " + r.operationId);
    button.addEventListener("click", () => {
      if (row.nextElementSibling && row.nextElementSibling.classList.contains("form-row")) return;
      const cell = h("td", { colspan: 7 });
      const formRow = h("tr", { class: "form-row", "data-form-for": r.operationId }, cell);
      cell.append(reconcileForm(r, (cancelled) => (cancelled ? (button.setAttribute("aria-expanded", "false"), button.focus()) : refresh(true))));
      row.after(formRow);
      button.setAttribute("aria-expanded", "true");
      $("select", cell).focus();
    });
    row.lastElementChild.append(button);
  });
}

async function loadRecord(shown, explicit) {
  const r = await api("record?tenant=" + encodeURIComponent(shown.tenant) + "&operationId=" + encodeURIComponent(shown.operationId));
  if (shown !== route) return;
  reveal("record");
  $("#record-title").replaceChildren("Record ", h("span", { class: "mono" }, r.operationId), " ", badge(r.state));
  const lease = r.lease ? (r.lease.live ? "held until " + when(r.lease.expiresAt) : "ended at " + when(r.lease.expiresAt)) : "none";
  facts("record-facts", [
    ["Tenant", r.tenant], ["Principal", r.principal], ["Operation", r.operation],
    ["State", r.state + (r.recovering ? " (held by a recovery worker)" : "") + (r.tombstoned ? " (tombstone)" : "")],
    ["Generation", String(r.generation)], ["Writer epoch", String(r.writerEpoch)],
    ["Effect possible", r.effectPossible ? "yes" : "no"],
    ["Lease", lease],
    ["Owner", r.owner ? r.owner.caller + " (generation " + r.owner.generation + ", since " + when(r.owner.since) + ")" : "none"],
    ["Created", time(r.createdAt)], ["Updated", time(r.updatedAt)], ["Completed", time(r.completedAt)],
    ["Kept until", time(r.retainUntil)], ["Tombstoned", time(r.tombstonedAt)],
  ]);
  const s = r.snapshot;
  $("[data-testid=snapshot-empty]").hidden = Boolean(s);
  $("[data-testid=snapshot]").hidden = !s;
  if (s) {
    facts("snapshot", [
      ["Status code", s.statusCode === null ? "– (tombstone)" : String(s.statusCode)], ["Media type", s.mediaType || "–"],
      ["Body size", s.bodyBytes === null ? "– (tombstone)" : s.bodyBytes + " bytes"],
      ["Headers", s.headerNames.length ? s.headerNames.join(", ") : "none"],
      ["Sealed", s.sealedWith ? "yes, with key " + s.sealedWith : "no (stored as it is)"],
      ["Digest (SHA-256)", h("code", {}, s.digest)],
    ]);
  }
  fill("generations", r.generations, (g) => [String(g.generation), g.began || "(older than the timeline)", time(g.since), g.caller || "–", g.attempts.length ? g.attempts.map((n) => "#" + n).join(", ") : "none", String(g.events)]);
  fill("attempts", r.attempts, (a) => [String(a.number), String(a.generation), a.effect, a.provider, a.status, h("code", {}, a.downstreamKey), a.handle ? h("code", {}, a.handle) : "–", time(a.createdAt), time(a.resolvedAt)]);
  $("#timeline-about").textContent = r.events.length >= r.eventsLimit ? "The newest " + r.eventsLimit + " events, oldest first." : r.events.length + " events, oldest first.";
  $("[data-testid=timeline]").replaceChildren(...r.events.map((e) =>
    h("li", { "data-kind": e.kind },
      time(e.at), " ", h("span", { class: "kind" }, e.kind),
      e.generation !== null ? " · generation " + e.generation : "", e.state ? " · " + e.state : "", " · by " + e.caller,
      Object.keys(e.detail || {}).length ? h("div", { class: "mono" }, JSON.stringify(e.detail)) : null)));
  const slot = $("#record-reconcile");
  if (r.state !== "UNKNOWN") slot.replaceChildren();
  else if (explicit || !$("form", slot)) {
    const form = reconcileForm(r, () => refresh(true));
    $("[data-action=cancel]", form).textContent = "Clear";
    slot.replaceChildren(h("h3", {}, "Reconcile"), form);
  }
}

/** The shown view's own data: the overview's comes with loadOverview; a search runs when asked only. */
async function loadView(shown, explicit) {
  if (shown.view === "unknown") return loadUnknown(shown, explicit);
  if (shown.view === "record") return loadRecord(shown, explicit);
}

function stamp() {
  const now = new Date();
  $("#updated").replaceChildren("Last updated ", h("time", { datetime: now.toISOString() }, pad(now.getHours()) + ":" + pad(now.getMinutes()) + ":" + pad(now.getSeconds())));
}

function schedule() {
  clearTimeout(timer);
  if (token() && $("#auto").checked) timer = setTimeout(() => refresh(false), Number($("#interval").value) * 1000);
}

async function refresh(explicit) {
  const shown = route;
  try {
    await loadOverview(shown);
    await loadView(shown, explicit);
    if (shown !== route) return;
    stamp();
    succeeded("load");
  } catch (error) {
    // The view opened meanwhile has its own load, and its own errors.
    if (shown !== route) return;
    // No stale data under an error: what the view showed may be another record's, or no longer true.
    if (shown.view !== "search") clearView(shown.view);
    failed(error, "load");
  } finally {
    schedule();
  }
}

async function navigate() {
  route = parseRoute();
  if (!token()) return;
  // The view opens empty and without the last one's errors: what it shows comes from its own loads.
  clearView(route.view);
  say("");
  show(route.view);
  const title = $("#" + route.view + "-title");
  title.focus();
  if (route.view === "search" && route.state !== undefined) {
    const form = $("#by-state");
    form.elements.state.value = route.state;
    await runSearch("state", { state: route.state, limit: form.elements.limit.value });
  }
  await refresh(true);
  // Back to the view's heading once its data is in, unless the user has moved on meanwhile: a slow
  // answer must not take the focus from a field being typed in.
  if (document.activeElement === title || document.activeElement === $("#results-title")) title.focus();
}

async function signIn() {
  try {
    await api("overview");
  } catch (error) {
    sessionStorage.removeItem(TOKEN);
    return say(error.message, true);
  }
  $("#session").hidden = false;
  $("#nav").hidden = false;
  say("");
  await navigate();
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN);
  clearTimeout(timer);
  overview = null;
  search = null;
  // Nothing of the registry stays on the page once signed out: every element holding some is marked data-registry.
  for (const view of VIEWS) clearView(view);
  for (const holder of document.querySelectorAll("[data-registry]")) holder.replaceChildren();
  for (const form of document.querySelectorAll("form")) form.reset();
  $("[data-testid=nav-unknown]").textContent = "UNKNOWN queue";
  $("#session").hidden = true;
  $("#nav").hidden = true;
  $("#updated").textContent = "Not updated yet";
  $("#token").value = "";
  show("login");
  say(why || "Signed out: the token is forgotten.");
  $("#token").focus();
}

$("#login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN, $("#token").value.trim());
  $("#token").value = "";
  signIn();
});
$("#sign-out").addEventListener("click", () => signOut());
$("#refresh").addEventListener("click", () => refresh(true));
$("#auto").addEventListener("change", () => (say($("#auto").checked ? "Auto-refresh on." : "Auto-refresh off."), schedule()));
$("#interval").addEventListener("change", schedule);
// The charts are the overview's: a new window reloads it, with a load's errors.
$("#window").addEventListener("change", () => refresh(true));
$("#more").addEventListener("click", () => search && runSearch("state", search.input, true));
$("#by-id").addEventListener("submit", (event) => {
  event.preventDefault();
  runSearch("id", { operationId: event.target.elements.operationId.value.trim() });
});
$("#by-scope").addEventListener("submit", (event) => {
  event.preventDefault();
  runSearch("scope", Object.fromEntries(new FormData(event.target)));
});
$("#by-state").addEventListener("submit", (event) => {
  event.preventDefault();
  runSearch("state", Object.fromEntries(new FormData(event.target)));
});
window.addEventListener("hashchange", navigate);
if (token()) signIn();
else show("login");
</script>
</body>
</html>
`;
