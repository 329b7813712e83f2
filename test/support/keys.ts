import { randomBytes } from "node:crypto";

const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** A 48-bit millisecond timestamp somewhere in the last three years, as UUIDv7 and ULID carry it. */
function recentMilliseconds(): number {
  return Date.now() - Math.floor(Math.random() * 3 * 365 * 86_400_000);
}

/** A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, version 7, the variant, 74 random bits. */
export function uuidv7(): string {
  const bytes = randomBytes(16);
  bytes.writeUIntBE(recentMilliseconds(), 0, 6);
  bytes[6] = (bytes[6]! & 0x0f) | 0x70;
  bytes[8] = (bytes[8]! & 0x3f) | 0x80;
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** A ULID: 10 Crockford base32 characters of Unix milliseconds, then 16 of 80 random bits. */
export function ulid(): string {
  let ms = recentMilliseconds();
  let time = "";
  for (let i = 0; i < 10; i++) {
    time = CROCKFORD[ms % 32] + time;
    ms = Math.floor(ms / 32);
  }
  // 80 random bits, read as 16 groups of 5 from the most significant.
  const random = BigInt(`0x${randomBytes(10).toString("hex")}`);
  const tail = Array.from({ length: 16 }, (_, i) => CROCKFORD[Number((random >> BigInt(75 - 5 * i)) & 31n)]).join("");
  return time + tail;
}
