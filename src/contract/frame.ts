import { createHash } from "node:crypto";

/**
 * The unambiguous encoding every digest of the contract is computed over
 * (published in docs/fingerprint.md):
 *
 *   list(items) = u32be(count) ‖ for each item: u32be(byteLength) ‖ item bytes
 *
 * Every field carries its own length, so no choice of separators or contents
 * can make two different inputs encode to the same bytes.
 */
export function encodeList(items: readonly Uint8Array[]): Uint8Array {
  let size = 4;
  for (const item of items) size += 4 + item.byteLength;
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  view.setUint32(0, items.length);
  let offset = 4;
  for (const item of items) {
    view.setUint32(offset, item.byteLength);
    out.set(item, offset + 4);
    offset += 4 + item.byteLength;
  }
  return out;
}

/** A field value: text is encoded as UTF-8, numbers as their decimal text. */
export type FieldValue = string | number | bigint | Uint8Array;

const utf8 = new TextEncoder();

/** The bytes of one field value. */
export function fieldBytes(value: FieldValue): Uint8Array {
  if (value instanceof Uint8Array) return value;
  if (typeof value === "string") return utf8.encode(value);
  if (typeof value === "number" && !Number.isSafeInteger(value)) {
    throw new RangeError(`frame: ${value} is not a safe integer`);
  }
  return utf8.encode(value.toString(10));
}

/** `frame(domain, f1, …, fn)`: the domain tag first, then the fields, as one list. */
export function frame(domain: string, ...fields: FieldValue[]): Uint8Array {
  return encodeList([utf8.encode(domain), ...fields.map(fieldBytes)]);
}

/** SHA-256 of `frame(domain, …fields)`. */
export function framedDigest(domain: string, ...fields: FieldValue[]): Uint8Array {
  return sha256(frame(domain, ...fields));
}

/** SHA-256 of some bytes. */
export function sha256(bytes: Uint8Array): Uint8Array {
  return new Uint8Array(createHash("sha256").update(bytes).digest());
}

/** Lower-case hex of some bytes (for test vectors and logs of digests). */
export function toHex(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("hex");
}
