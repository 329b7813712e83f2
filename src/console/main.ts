import { admin, forgetToken, keepToken, refusalOf, token } from "./api.js";
import { $, h, pad } from "./dom.js";
import { loadOverview } from "./overview.js";
import { loadRecord } from "./record.js";
import { runSearch } from "./search.js";
import { failed, page, say, succeeded, whenTokenRefused, type Route } from "./state.js";
import { loadUnknown } from "./unknown.js";
import { clearView, parseRoute, show, VIEWS } from "./views.js";

/**
 * The operator console (docs/console.md): views by hash route, `#/`
 * overview (counts, charts, modes, recent conflicts), `#/search` (by
 * operation id, scope or state; `#/search/state/<STATE>` lists a state),
 * `#/unknown` (the UNKNOWN queue with its reconcile forms),
 * `#/records/<tenant>/<operationId>` (a record and its timeline).
 *
 * Each view shows its own data and its own errors only: opening a view empties
 * it, a load that fails empties it and shows why, and the next load of the
 * same thing that succeeds clears that error.
 */

declare global {
  interface Window {
    /** An automatic refresh at once (what the timer runs), for scripts that drive the page. */
    refresh(explicit: boolean): Promise<void>;
  }
}

let timer = 0;
const autoRefresh = $<HTMLInputElement>("#auto");
const interval = $<HTMLSelectElement>("#interval");

/** The shown view's own data: the overview's comes with loadOverview; a search runs when asked only. */
async function loadView(shown: Route, explicit: boolean): Promise<void> {
  if (shown.view === "unknown") return loadUnknown(shown, explicit, refresh);
  if (shown.view === "record") return loadRecord(shown, explicit, refresh);
}

function stamp(): void {
  const now = new Date();
  $("#updated").replaceChildren("Last updated ", h("time", { datetime: now.toISOString() }, `${pad(now.getHours())}:${pad(now.getMinutes())}:${pad(now.getSeconds())}`));
}

function schedule(): void {
  clearTimeout(timer);
  if (token() && autoRefresh.checked) timer = window.setTimeout(() => void refresh(false), Number(interval.value) * 1000);
}

async function refresh(explicit: boolean): Promise<void> {
  const shown = page.route;
  try {
    await loadOverview(shown);
    await loadView(shown, explicit);
    if (shown !== page.route) return;
    stamp();
    succeeded("load");
  } catch (error) {
    // The view opened meanwhile has its own load, and its own errors.
    if (shown !== page.route) return;
    // No stale data under an error: what the view showed may be another record's, or no longer true.
    if (shown.view !== "search") clearView(shown.view);
    failed(error, "load");
  } finally {
    schedule();
  }
}

async function navigate(): Promise<void> {
  const route = (page.route = parseRoute());
  if (!token()) return;
  // The view opens empty and without the last one's errors: what it shows comes from its own loads.
  clearView(route.view);
  say("");
  show(route.view);
  const title = $(`#${route.view}-title`);
  title.focus();
  if (route.view === "search" && route.state !== undefined) {
    const form = $<HTMLFormElement>("#by-state");
    $<HTMLSelectElement>("[name=state]", form).value = route.state;
    await runSearch("state", { state: route.state, limit: $<HTMLSelectElement>("[name=limit]", form).value });
  }
  await refresh(true);
  // Back to the view's heading once its data is in, unless the user has moved on meanwhile: a slow
  // answer must not take the focus from a field being typed in.
  if (document.activeElement === title || document.activeElement === $("#results-title")) title.focus();
}

async function signIn(): Promise<void> {
  try {
    await admin.getRecordCensus({});
  } catch (error) {
    forgetToken();
    say(refusalOf(error).message, true);
    return;
  }
  $("#session").hidden = false;
  $("#nav").hidden = false;
  say("");
  await navigate();
}

function signOut(why?: string): void {
  forgetToken();
  clearTimeout(timer);
  page.census = null;
  page.search = null;
  // Nothing of the registry stays on the page once signed out: every element holding some is marked data-registry.
  for (const view of VIEWS) clearView(view);
  for (const holder of document.querySelectorAll("[data-registry]")) holder.replaceChildren();
  for (const form of document.querySelectorAll("form")) form.reset();
  $("[data-testid=nav-unknown]").textContent = "UNKNOWN queue";
  $("#session").hidden = true;
  $("#nav").hidden = true;
  $("#updated").textContent = "Not updated yet";
  $<HTMLInputElement>("#token").value = "";
  show("login");
  say(why ?? "Signed out: the token is forgotten.");
  $("#token").focus();
}

/** A form's fields, trimmed. */
const fieldsOf = (form: HTMLFormElement): Record<string, string> =>
  Object.fromEntries([...new FormData(form)].map(([name, value]) => [name, typeof value === "string" ? value.trim() : ""]));

whenTokenRefused(signOut);
window.refresh = refresh;
$("#login").addEventListener("submit", (event) => {
  event.preventDefault();
  keepToken($<HTMLInputElement>("#token").value.trim());
  $<HTMLInputElement>("#token").value = "";
  void signIn();
});
$("#sign-out").addEventListener("click", () => signOut());
$("#refresh").addEventListener("click", () => void refresh(true));
autoRefresh.addEventListener("change", () => {
  say(autoRefresh.checked ? "Auto-refresh on." : "Auto-refresh off.");
  schedule();
});
interval.addEventListener("change", schedule);
// The charts are the overview's: a new window reloads it, with a load's errors.
$("#window").addEventListener("change", () => void refresh(true));
$("#more").addEventListener("click", () => void (page.search && runSearch("state", page.search.input, true)));
for (const [id, kind] of [
  ["#by-id", "id"],
  ["#by-scope", "scope"],
  ["#by-state", "state"],
] as const) {
  $<HTMLFormElement>(id).addEventListener("submit", (event) => {
    event.preventDefault();
    void runSearch(kind, fieldsOf(event.currentTarget as HTMLFormElement));
  });
}
window.addEventListener("hashchange", () => void navigate());
if (token()) void signIn();
else show("login");
