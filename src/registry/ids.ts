import { randomBytesPooled } from "../crypto/random.js";

/**
 * A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits.
 * Operation ids sort by creation time, which keeps the (tenant_id,
 * operation_id) index append-mostly, while staying unguessable.
 */
export function uuidv7(now = Date.now()): string {
  const bytes = randomBytesPooled(16);
  bytes.writeUIntBE(now, 0, 6);
  bytes[6] = 0x70 | (bytes[6]! & 0x0f);
  bytes[8] = 0x80 | (bytes[8]! & 0x3f);
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** True for a canonical lower-case UUID string. */
export function isUuid(text: string): boolean {
  return UUID.test(text);
}
