import { refuse } from "../contract/errors.js";

/** A listing's resume point, opaque to clients: the sort key of the last row returned. */
export function encodePageToken(key: readonly string[]): string {
  return Buffer.from(JSON.stringify(key)).toString("base64url");
}

/** The sort key in a page token (of `length` parts), undefined for the first page. */
export function decodePageToken(token: string, length: number): string[] | undefined {
  if (token === "") return undefined;
  try {
    const key = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as unknown;
    if (Array.isArray(key) && key.length === length && key.every((part) => typeof part === "string")) return key;
  } catch {
    // Falls through to the refusal.
  }
  return refuse("INVALID_REQUEST", "page_token is not one this coordinator returned");
}
