import { createCipheriv, createDecipheriv } from "node:crypto";
import { randomBytesPooled } from "./random.js";
import { IdempotencyError } from "../contract/errors.js";

/**
 * Snapshot bodies at rest: AES-256-GCM under the key ring's active key, with
 * the record's tenant and operation id as associated data (a body copied onto
 * another record does not open). Stored as nonce ‖ ciphertext ‖ tag, with the
 * key id in its own column; rotation adds a key and makes it active, while
 * the older keys stay in the ring to open older bodies.
 */
export interface SnapshotKeyring {
  /** The key new bodies are sealed with. */
  activeKeyId: string;
  /** Every key that may have sealed a stored body: id → 32 bytes. */
  keys: ReadonlyMap<string, Uint8Array>;
}

const NONCE_BYTES = 12;
const TAG_BYTES = 16;

/** Parses `{"active": "<id>", "keys": {"<id>": "<base64 of 32 bytes>", …}}`, refusing anything unusable. */
export function parseKeyring(input: unknown): SnapshotKeyring {
  const o = input as { active?: unknown; keys?: unknown } | null;
  if (typeof o !== "object" || o === null || typeof o.active !== "string" || typeof o.keys !== "object" || o.keys === null) {
    throw new Error('must be {"active": "<key id>", "keys": {"<key id>": "<base64 of 32 random bytes>", …}}');
  }
  const keys = new Map<string, Uint8Array>();
  for (const [id, value] of Object.entries(o.keys as Record<string, unknown>)) {
    if (!/^[A-Za-z0-9._-]{1,64}$/.test(id)) throw new Error(`key id '${id}' must be 1 to 64 characters of A-Z a-z 0-9 . _ -`);
    const bytes = typeof value === "string" ? Buffer.from(value, "base64") : Buffer.alloc(0);
    if (bytes.length !== 32) throw new Error(`key '${id}' must be the base64 of exactly 32 bytes (idemctl keygen prints one)`);
    keys.set(id, bytes);
  }
  if (!keys.has(o.active)) throw new Error(`the active key '${o.active}' is not among the keys`);
  return { activeKeyId: o.active, keys };
}

/** Seals a body under the active key. */
export function sealBody(body: Uint8Array, keyring: SnapshotKeyring, tenant: string, operationId: string): { keyId: string; sealed: Buffer } {
  const nonce = randomBytesPooled(NONCE_BYTES);
  const cipher = createCipheriv("aes-256-gcm", keyring.keys.get(keyring.activeKeyId)!, nonce);
  cipher.setAAD(associatedData(tenant, operationId));
  const ciphertext = Buffer.concat([cipher.update(body), cipher.final()]);
  return { keyId: keyring.activeKeyId, sealed: Buffer.concat([nonce, ciphertext, cipher.getAuthTag()]) };
}

/** Opens a sealed body, or refuses clearly: a missing key or a failed check never yields garbage. */
export function openBody(sealed: Uint8Array, keyId: string, keyring: SnapshotKeyring | undefined, tenant: string, operationId: string): Buffer {
  const key = keyring?.keys.get(keyId);
  if (!key) {
    throw new IdempotencyError(
      "SNAPSHOT_UNREADABLE",
      `the stored response of operation ${operationId} is sealed with key '${keyId}', which is not in the configured key ring (IDEM_SNAPSHOT_KEYS)`,
      { key_id: keyId },
    );
  }
  try {
    const bytes = Buffer.from(sealed);
    const decipher = createDecipheriv("aes-256-gcm", key, bytes.subarray(0, NONCE_BYTES));
    decipher.setAAD(associatedData(tenant, operationId));
    decipher.setAuthTag(bytes.subarray(bytes.length - TAG_BYTES));
    return Buffer.concat([decipher.update(bytes.subarray(NONCE_BYTES, bytes.length - TAG_BYTES)), decipher.final()]);
  } catch (error) {
    throw new IdempotencyError(
      "SNAPSHOT_UNREADABLE",
      `the stored response of operation ${operationId} does not open with key '${keyId}': the stored bytes or the key changed`,
      { key_id: keyId },
      { cause: error },
    );
  }
}

function associatedData(tenant: string, operationId: string): Buffer {
  return Buffer.from(`idem-snapshot-v1\0${tenant}\0${operationId}`, "utf8");
}

/** The length of the body a stored one holds, without opening it: a sealed body is its plaintext between a nonce and a tag. */
export function bodyLength(stored: Uint8Array, keyId: string | null): number {
  return keyId === null ? stored.length : stored.length - NONCE_BYTES - TAG_BYTES;
}
