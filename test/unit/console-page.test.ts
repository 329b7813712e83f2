import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { bundleConsolePage, GENERATED_PAGE, pageModule } from "../../src/dev/console-bundle.js";
import { CONSOLE_PAGE } from "../../src/server/console-page.gen.js";

// The operator console's page is bundled from src/console and committed
// (src/server/console-page.gen.ts), so that the server never bundles.

describe("the operator console's page", () => {
  it("is committed as src/console bundles it", async () => {
    const committed = await readFile(GENERATED_PAGE, "utf8");
    expect(committed === pageModule(await bundleConsolePage()), "src/server/console-page.gen.ts is stale: run 'npm run console' and commit it").toBe(true);
  });

  it("loads nothing from elsewhere: one page, its style and script inline", () => {
    expect(CONSOLE_PAGE).toMatch(/^<!doctype html>/);
    expect(CONSOLE_PAGE.match(/<script\b[^>]*>/gi)).toEqual(["<script>"]);
    expect(CONSOLE_PAGE).not.toMatch(/<link\b|<img\b|<iframe\b|@import|url\(\s*["']?(https?:)?\/\//i);
    expect(CONSOLE_PAGE.split("</script>")).toHaveLength(2);
  });
});
