import type { GetRecordCensusResponse, RecordSummary } from "../gen/idempotency/v1/admin_pb.js";
import { refusalOf, unauthenticated } from "./api.js";
import { $ } from "./dom.js";

/** A view and what it shows, by hash route. */
export type Route = { view: "overview" } | { view: "search"; state?: string } | { view: "unknown" } | { view: "record"; tenant: string; operationId: string };

/** A search's form input and what it found (a listing by state also where it resumes). */
export interface Search {
  kind: "id" | "scope" | "state";
  input: Record<string, string>;
  rows: RecordSummary[];
  next: string;
}

/** What the status line's error is about: a view's data, a search, or a form sent. */
export type Concern = "load" | "search" | "action";

/** The page's state: the route shown, the last census, the search shown, and what the status line's error is about. */
export const page: { route: Route; census: GetRecordCensusResponse | null; search: Search | null; errorOf: Concern | null } = {
  route: { view: "overview" },
  census: null,
  search: null,
  errorOf: null,
};

let onSignedOut: (why: string) => void = () => undefined;

/** What a refused token does (sign the page out), set by the page once. */
export function whenTokenRefused(signOut: (why: string) => void): void {
  onSignedOut = signOut;
}

/** Writes the status line (announced to screen readers); its error, if any, is gone. */
export function say(text: string, warn = false): void {
  const message = $("#message");
  message.textContent = text;
  message.className = warn ? "warn" : "";
  page.errorOf = null;
}

/** Shows why something failed (a refused token signs the page out), until that thing next succeeds or another view opens. */
export function failed(error: unknown, about: Concern): void {
  const refusal = refusalOf(error);
  if (unauthenticated(refusal)) return onSignedOut(`Signed out: ${refusal.message}`);
  say(refusal.message, true);
  page.errorOf = about;
}

/** Clears the status line's error about what has just succeeded; an error about something else stays. */
export function succeeded(about: Concern): void {
  if (page.errorOf === about) say("");
}
