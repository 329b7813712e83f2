import { describe, expect, it } from "vitest";
import { preparedName, statement } from "../../src/registry/statement.js";
import * as batchStatements from "../../src/registry/statements/batches.js";
import * as recordStatements from "../../src/registry/statements/records.js";

describe("statement", () => {
  it("names a statement's text for preparing, one name per text, unless told not to", () => {
    const a = statement("a", "SELECT :x::int AS a");
    const b = statement("b", "SELECT :x::int AS b");
    const unnamed = statement("c", "SELECT :x::int AS c", { prepare: false });
    expect(preparedName(a.text)).toMatch(/^idem_[0-9a-f]{20}$/);
    expect(preparedName(b.text)).not.toBe(preparedName(a.text));
    expect(preparedName(unnamed.text)).toBeUndefined();
  });

  it("prepares none of the batch statements, whose plans must fit the arrays each batch carries, and every statement of one record", () => {
    const batch = Object.values(batchStatements).filter((value) => typeof value === "object" && value !== null && "text" in value);
    expect(batch.length).toBeGreaterThanOrEqual(5);
    for (const s of batch) expect(preparedName((s as { text: string }).text), (s as { name: string }).name).toBeUndefined();
    const single = Object.values(recordStatements).filter((value) => typeof value === "object" && value !== null && "text" in value);
    expect(single.length).toBeGreaterThan(0);
    for (const s of single) expect(preparedName((s as { text: string }).text), (s as { name: string }).name).toBeDefined();
  });
});
