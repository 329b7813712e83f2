import { randomFillSync } from "node:crypto";

/** Bytes drawn from the system's CSPRNG at once: one draw serves a few hundred ids and nonces. */
const POOL_BYTES = 4096;
const pool = Buffer.alloc(POOL_BYTES);
let used = POOL_BYTES;

/**
 * `n` fresh random bytes (n ≤ 256), copied into `into` at `offset`: bytes
 * of the CSPRNG drawn a pool at a time, each handed out once, as Node's
 * randomUUID does. One draw per call cost the request path a system call and
 * a lock for every operation id and every sealing nonce.
 */
export function fillRandom(into: Uint8Array, offset = 0, n = into.byteLength - offset): Uint8Array {
  if (n > 256) throw new Error(`fillRandom hands out at most 256 bytes at a time, not ${n}`);
  if (used + n > POOL_BYTES) {
    randomFillSync(pool);
    used = 0;
  }
  pool.copy(into, offset, used, used + n);
  used += n;
  return into;
}

/** `n` fresh random bytes in a new Buffer (see fillRandom). */
export function randomBytesPooled(n: number): Buffer {
  return fillRandom(Buffer.allocUnsafe(n)) as Buffer;
}
