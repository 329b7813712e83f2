/**
 * The page's DOM helpers. Text from the registry is always inserted as text
 * (text nodes, attributes), never parsed as HTML: the only markup parsed is
 * the page's own.
 */

/** The element `selector` names (within `root`); a missing one is the page's own mistake. */
export function $<E extends Element = HTMLElement>(selector: string, root: ParentNode = document): E {
  const element = root.querySelector<E>(selector);
  if (!element) throw new Error(`the page has no ${selector}`);
  return element;
}

export type Child = Node | string | null | undefined;
type Attributes = Record<string, string | number | boolean | null | undefined>;

const SVG = "http://www.w3.org/2000/svg";

/** An element with attributes and children (strings become text nodes: never parsed as HTML); `svg:` names an SVG element. */
export function h(tag: string, attributes: Attributes = {}, ...children: Child[]): HTMLElement {
  const element = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) if (value !== undefined && value !== null && value !== false) element.setAttribute(name, String(value));
  for (const child of children) if (child !== undefined && child !== null) element.append(child);
  return element as HTMLElement;
}

/**
 * Renders a container anew, keeping the keyboard focus on the same link or
 * button if it was inside: an automatic refresh never throws a keyboard user
 * back to the top of the page.
 */
export function keepFocus(container: Element, render: () => void): void {
  const name = (el: Element) => el.getAttribute("href") || el.getAttribute("aria-label") || el.textContent;
  const focused = document.activeElement && container.contains(document.activeElement) ? name(document.activeElement) : null;
  render();
  if (focused === null) return;
  const again = [...container.querySelectorAll<HTMLElement>("a, button")].find((el) => name(el) === focused);
  again?.focus();
}

/** Fills a table's body with a row per item (cells: text or nodes), and shows its empty state when there is none. */
export function fill<T>(name: string, items: readonly T[], cells: (item: T) => Child[], decorate?: (row: HTMLElement, item: T) => void): void {
  const body = $(`[data-testid=${name}] tbody`);
  keepFocus(body, () =>
    body.replaceChildren(
      ...items.map((item) => {
        const row = h("tr", {}, ...cells(item).map((cell) => h("td", {}, cell)));
        decorate?.(row, item);
        return row;
      }),
    ),
  );
  const empty = document.querySelector<HTMLElement>(`[data-testid=${name}-empty]`);
  if (empty) empty.hidden = items.length > 0;
  $(`[data-testid=${name}]`).hidden = items.length === 0 && Boolean(empty);
}

/** Fills a description list with terms and their values. */
export function facts(name: string, pairs: ReadonlyArray<[string, Child]>): void {
  $(`[data-testid=${name}]`).replaceChildren(...pairs.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

export const pad = (n: number): string => String(n).padStart(2, "0");

/** A moment as the page writes it: in UTC, to the second; "–" for none. */
export function when(date: Date | undefined): string {
  if (!date) return "–";
  return `${date.getUTCFullYear()}-${pad(date.getUTCMonth() + 1)}-${pad(date.getUTCDate())} ${pad(date.getUTCHours())}:${pad(date.getUTCMinutes())}:${pad(date.getUTCSeconds())} UTC`;
}

/** A moment as a `<time>` element; "–" for none. */
export const time = (date: Date | undefined): Child => (date ? h("time", { datetime: date.toISOString() }, when(date)) : "–");

/** A duration for people: "42 s", "3 min 5 s", "2 h 10 min", "1 d 4 h". */
export function age(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** A state written out (never shown by colour alone). */
export const badge = (state: string): HTMLElement => h("span", { class: `badge ${state}` }, state);

export const recordHref = (tenant: string, operationId: string): string => `#/records/${encodeURIComponent(tenant)}/${encodeURIComponent(operationId)}`;

export const recordLink = (r: { tenant: string; operationId: string }): HTMLElement => h("a", { href: recordHref(r.tenant, r.operationId), class: "mono" }, r.operationId);
