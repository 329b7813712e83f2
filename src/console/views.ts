import { $, h } from "./dom.js";
import { page, type Route } from "./state.js";

export const VIEWS = ["login", "overview", "search", "unknown", "record"] as const;
export type View = (typeof VIEWS)[number];

/**
 * Empties a view of the registry's data it showed: each view shows its own
 * data only, never what an earlier view or an earlier load left. A view's data
 * is in its [data-content] parts, hidden until a load of that view succeeds.
 */
export function clearView(view: View): void {
  const section = $(`#${view}-view`);
  for (const content of section.querySelectorAll<HTMLElement>("[data-content]")) {
    content.hidden = true;
    for (const holder of content.querySelectorAll("[data-registry]")) holder.replaceChildren();
  }
  if (view === "search") page.search = null;
  // The record asked for, by the address only: whether it exists is for its load to say.
  const route = page.route;
  if (view === "record") $("#record-title").replaceChildren("Record", ...(route.view === "record" ? [" ", h("span", { class: "mono" }, route.operationId)] : []));
}

/** Shows a view's data, once a load of it has succeeded. */
export function reveal(view: View): void {
  for (const content of $(`#${view}-view`).querySelectorAll<HTMLElement>("[data-content]")) content.hidden = false;
}

/** Shows one view, and marks its link in the navigation as the current page. */
export function show(view: View): void {
  for (const name of VIEWS) $(`#${name}-view`).hidden = name !== view;
  for (const link of document.querySelectorAll<HTMLElement>("nav a")) {
    if (link.dataset.view === view) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

/** The route of the address's hash: `#/`, `#/search[/state/<STATE>]`, `#/unknown`, `#/records/<tenant>/<operation id>`. */
export function parseRoute(): Route {
  try {
    const parts = location.hash
      .replace(/^#[/]?/, "")
      .split("/")
      .filter(Boolean)
      .map((part) => decodeURIComponent(part));
    if (parts[0] === "records" && parts.length === 3) return { view: "record", tenant: parts[1]!, operationId: parts[2]! };
    if (parts[0] === "search") return parts[1] === "state" ? { view: "search", state: parts[2] ?? "" } : { view: "search" };
    if (parts[0] === "unknown") return { view: "unknown" };
  } catch {
    // A malformed route shows the overview.
  }
  return { view: "overview" };
}
