import { refuse } from "./errors.js";

/** The most entries one page of a listing holds. */
export const MAX_PAGE_SIZE = 500;
/** The entries of a page whose size is not given. */
export const DEFAULT_PAGE_SIZE = 100;

/**
 * The one rule of every listing's page size: 0 (not given) is the default;
 * anything else must be from 1 to MAX_PAGE_SIZE, and is refused otherwise,
 * never quietly cut: a caller that asked for more than it gets is told so.
 */
export function pageSize(requested: number, field = "page_size"): number {
  if (requested === 0) return DEFAULT_PAGE_SIZE;
  if (!Number.isInteger(requested) || requested < 1 || requested > MAX_PAGE_SIZE) refuse("INVALID_REQUEST", `${field} must be from 1 to ${MAX_PAGE_SIZE}`);
  return requested;
}
