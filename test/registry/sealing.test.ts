import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { StaticPolicies } from "../../src/policy/operations.js";
import { Registry } from "../../src/registry/registry.js";
import { parseKeyring } from "../../src/crypto/sealing.js";
import { useTestDatabase } from "../support/database.js";
import { actor, newKey, reserveInput, testPolicy } from "../support/fixtures.js";
import { expectRefusal } from "../support/registry-helpers.js";

const t = useTestDatabase();
const gateway = actor();
const key = () => randomBytes(32).toString("base64");
const [k1, k2] = [key(), key()];
const policies = new StaticPolicies([testPolicy()]);
const ring = (active: string, keys: Record<string, string>) => new Registry({ policies, keyring: parseKeyring({ active, keys }) });

const secret = "card 4242 4242 4242 4242, cvc 123";

async function finished(registry: Registry, body = secret) {
  const idempotencyKey = newKey();
  const { record } = await registry.reserve(t.db, reserveInput(idempotencyKey, undefined, { claim: true }), gateway);
  const ref = { tenant: "acme", operationId: record!.operationId };
  const done = await registry.complete(
    t.db,
    {
      ref,
      generation: 1,
      outcome: "SUCCEEDED",
      snapshot: { statusCode: 201, mediaType: "text/plain", location: "", businessVersion: "", headers: [], body: new TextEncoder().encode(body) },
    },
    gateway,
  );
  return { idempotencyKey, ref, done };
}

describe("response bodies sealed at rest", () => {
  it("stores no plaintext body, replays the plaintext, and keeps the digest over the plaintext", async () => {
    const registry = ring("k1", { k1 });
    const { idempotencyKey, ref, done } = await finished(registry);
    expect(new TextDecoder().decode(done.snapshot!.body)).toBe(secret);
    const dump = await t.pool.query<{ snapshot_body: Buffer; snapshot_key_id: string }>("SELECT snapshot_body, snapshot_key_id FROM idem_record WHERE operation_id = $1", [
      ref.operationId,
    ]);
    expect(dump.rows[0]?.snapshot_key_id).toBe("k1");
    expect(dump.rows[0]!.snapshot_body.toString("latin1")).not.toContain("4242");
    const whole = JSON.stringify((await t.pool.query("SELECT encode(snapshot_body, 'escape') AS b FROM idem_record")).rows);
    expect(whole).not.toContain("4242");

    const replay = await registry.reserve(t.db, reserveInput(idempotencyKey), gateway);
    expect(replay.decision).toBe("REPLAY");
    expect(new TextDecoder().decode(replay.record!.snapshot!.body)).toBe(secret);
    expect(Buffer.from(replay.record!.snapshot!.digest).equals(Buffer.from(done.snapshot!.digest))).toBe(true);
    expect(new TextDecoder().decode((await registry.lookupById(t.db, { ref, principal: "alice" }, gateway)).record.snapshot!.body)).toBe(secret);
    // A repeated identical Complete is still recognized (digests are over the plaintext).
    const again = await registry.complete(
      t.db,
      {
        ref,
        generation: 1,
        outcome: "SUCCEEDED",
        snapshot: { statusCode: 201, mediaType: "text/plain", location: "", businessVersion: "", headers: [], body: new TextEncoder().encode(secret) },
      },
      gateway,
    );
    expect(again.state).toBe("SUCCEEDED");
  });

  it("keeps old bodies readable through a rotation, and refuses clearly without their key", async () => {
    const { idempotencyKey: old } = await finished(ring("k1", { k1 }), "sealed with k1");
    const rotated = ring("k2", { k1, k2 });
    const { ref: fresh } = await finished(rotated, "sealed with k2");
    expect((await t.pool.query<{ snapshot_key_id: string }>("SELECT snapshot_key_id FROM idem_record WHERE operation_id = $1", [fresh.operationId])).rows[0]?.snapshot_key_id).toBe(
      "k2",
    );
    expect(new TextDecoder().decode((await rotated.reserve(t.db, reserveInput(old), gateway)).record!.snapshot!.body)).toBe("sealed with k1");

    const withoutOldKey = ring("k2", { k2 });
    const refusal = await expectRefusal(withoutOldKey.reserve(t.db, reserveInput(old), gateway), "SNAPSHOT_UNREADABLE");
    expect(refusal.metadata).toEqual({ key_id: "k1" });
    const plain = new Registry({ policies });
    await expectRefusal(plain.reserve(t.db, reserveInput(old), gateway), "SNAPSHOT_UNREADABLE");
  });

  it("refuses a body that was altered or copied onto another record, never returning garbage", async () => {
    const registry = ring("k1", { k1 });
    const a = await finished(registry, "body of a");
    const b = await finished(registry, "body of b");
    await t.pool.query("UPDATE idem_record SET snapshot_body = (SELECT snapshot_body FROM idem_record WHERE operation_id = $1) WHERE operation_id = $2", [
      a.ref.operationId,
      b.ref.operationId,
    ]);
    await expectRefusal(registry.reserve(t.db, reserveInput(b.idempotencyKey), gateway), "SNAPSHOT_UNREADABLE");
    await t.pool.query("UPDATE idem_record SET snapshot_body = set_byte(snapshot_body, 20, get_byte(snapshot_body, 20) # 1) WHERE operation_id = $1", [a.ref.operationId]);
    await expectRefusal(registry.reserve(t.db, reserveInput(a.idempotencyKey), gateway), "SNAPSHOT_UNREADABLE");
  });

  it("refuses an unusable key ring with what to fix", () => {
    expect(() => parseKeyring({ active: "k9", keys: { k1 } })).toThrow(/active key 'k9' is not among the keys/);
    expect(() => parseKeyring({ active: "k1", keys: { k1: "c2hvcnQ=" } })).toThrow(/exactly 32 bytes/);
    expect(() => parseKeyring("nope")).toThrow(/must be/);
  });
});
