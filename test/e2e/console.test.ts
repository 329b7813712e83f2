import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { chromium, type Browser, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { as, consoleClient, reserveFor } from "../support/console.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { driveToUnknown, startTestServer, type TestServer } from "../support/server.js";

// The operator console in a real browser: Debian's Chromium, driven by
// playwright-core. CI installs it (.ci/run) and there a missing browser fails
// this file; on a machine without it, the file is skipped with a warning.
const CHROMIUM = "/usr/bin/chromium";
const skipHere = !existsSync(CHROMIUM) && process.env.CI !== "true";
if (skipHere) process.stderr.write(`skipping the console browser test: ${CHROMIUM} is missing (apt-get install -y chromium)\n`);

/** Where the test leaves a screenshot of each view, for a person to look at (not compared with anything). */
const SCREENSHOTS = new URL("../../test-results/console/", import.meta.url);

const t = useTestDatabase();
let server: TestServer;
let browser: Browser;

beforeAll(async () => {
  server = await startTestServer(t, { config: { recovererIntervalMs: 100 } });
  if (skipHere) return;
  await mkdir(SCREENSHOTS, { recursive: true });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
});
afterAll(async () => {
  await browser?.close();
  await server?.stop();
});

/** An acme record gone UNKNOWN after a payload conflict on its key, with the key. */
async function unknownRecord(): Promise<{ operationId: string; key: string }> {
  const key = newKey();
  const accepted = await reserveFor(server, "acme", key, '{"amount":1}', true);
  await reserveFor(server, "acme", key, '{"amount":2}'); // a conflict, for "recent conflicts" and the timeline
  await driveToUnknown(t, server, accepted.operationId);
  return { operationId: accepted.operationId, key };
}

/** Records per state of acme, as PostgreSQL counts them. */
async function acmeCount(state: string): Promise<number> {
  const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE tenant_id = 'acme' AND state = $1 AND tombstoned_at IS NULL", [state]);
  return rows[0]!.n;
}

const shoot = (page: Page, name: string) => page.screenshot({ path: new URL(name, SCREENSHOTS).pathname, fullPage: true });

/**
 * What a person with a keyboard and a screen reader needs of the view on
 * screen: a name for every control, landmarks and headings, and text that
 * stands out from its background (WCAG AA: 4.5:1, 3:1 for large text).
 * Run in the page, which answers what falls short (a script as text: the
 * test's own types know nothing of the DOM).
 */
const ACCESSIBILITY_FAULTS = `(() => {
  const faults = [];
  const shown = (el) => el.offsetParent !== null;
  for (const el of document.querySelectorAll("input, select, textarea")) {
    if (shown(el) && el.labels.length === 0 && !el.getAttribute("aria-label")) faults.push("unlabelled " + el.tagName.toLowerCase() + " " + (el.name || el.id));
  }
  for (const el of document.querySelectorAll("button, a[href]")) {
    if (shown(el) && !(el.getAttribute("aria-label") || el.textContent.trim())) faults.push("nameless " + el.tagName.toLowerCase());
  }
  for (const landmark of ["header", "nav", "main", "h1", "h2"]) if (!document.querySelector(landmark)) faults.push("no " + landmark);
  const rgb = (color) => (color.match(/[0-9.]+/g) || []).map(Number);
  const luminance = ([r, g, b]) => [r, g, b].map((c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4)).reduce((sum, c, i) => sum + c * [0.2126, 0.7152, 0.0722][i], 0);
  const background = (el) => {
    for (; el; el = el.parentElement) {
      const [r, g, b, a = 1] = rgb(getComputedStyle(el).backgroundColor);
      if (a > 0.5) return [r, g, b];
    }
    return [255, 255, 255];
  };
  for (const el of document.querySelectorAll("body *")) {
    if (!shown(el) || el.closest("svg") || !["P", "SPAN", "A", "TD", "TH", "LI", "DT", "DD", "H1", "H2", "H3", "LABEL", "BUTTON", "STRONG", "LEGEND", "SMALL", "TIME", "CODE", "DIV"].includes(el.tagName)) continue;
    if (![...el.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim())) continue;
    const style = getComputedStyle(el);
    const [l1, l2] = [luminance(rgb(style.color)), luminance(background(el))].sort((a, b) => b - a);
    const ratio = (l1 + 0.05) / (l2 + 0.05);
    const large = parseFloat(style.fontSize) >= 24 || (parseFloat(style.fontSize) >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) faults.push("contrast " + ratio.toFixed(2) + " of " + JSON.stringify(el.textContent.trim().slice(0, 30)));
  }
  return faults;
})()`;
const accessibilityFaults = (page: Page) => page.evaluate<string[]>(ACCESSIBILITY_FAULTS);
/**
 * How much of a chart's canvas its line spans, from its leftmost to its
 * rightmost pixel in the line's colour (#1a4fb5), as a share of the canvas's
 * width: 0 when nothing is drawn.
 */
const lineSpan = (page: Page, series: string) =>
  page.evaluate<number>(`(() => {
    const canvas = document.querySelector('[data-testid="chart-${series}"] canvas');
    if (!canvas || canvas.width === 0) return 0;
    const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
    const line = (i) => Math.abs(data[i] - 26) < 40 && Math.abs(data[i + 1] - 79) < 40 && Math.abs(data[i + 2] - 181) < 40 && data[i + 3] > 200;
    let first = -1, last = -1;
    for (let x = 0; x < canvas.width; x++) {
      for (let y = 0; y < canvas.height; y++) {
        if (!line((y * canvas.width + x) * 4)) continue;
        if (first < 0) first = x;
        last = x;
        break;
      }
    }
    return first < 0 ? 0 : (last - first) / canvas.width;
  })()`);
/** A property of the focused element, or of what `expression` names. */
const inPage = (page: Page, expression: string) => page.evaluate<string | null>(expression);

describe.skipIf(skipHere)("the operator console", () => {
  it("signs in, searches, shows a record's timeline, reconciles from the UNKNOWN queue, draws charts, and signs out", async () => {
    const { operationId, key } = await unknownRecord();
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors: string[] = [];
    page.on("pageerror", (error) => errors.push(error.message));
    // One self-contained page: nothing is requested from anywhere but its own origin.
    const elsewhere: string[] = [];
    page.on("request", (request) => !request.url().startsWith(`${server.adminUrl}/console`) && elsewhere.push(request.url()));
    // The browser reports each refused call (the wrong tokens below) as an error of its own; those are expected.
    page.on("console", (message) => message.type() === "error" && !message.text().startsWith("Failed to load resource") && errors.push(message.text()));
    await page.goto(`${server.adminUrl}/console`);
    expect(await accessibilityFaults(page)).toEqual([]);

    // Sign-in: a wrong token and a token without the operator role are refused, and forgotten.
    await page.getByTestId("token").fill("not-a-valid-token-at-all");
    await page.getByTestId("sign-in").click();
    await expect.poll(() => page.getByTestId("message").textContent()).toContain("UNAUTHENTICATED");
    await page.getByTestId("token").fill(server.tokens.gateway);
    await page.getByTestId("sign-in").click();
    await expect.poll(() => page.getByTestId("message").textContent()).toContain("PERMISSION_DENIED");
    expect(await inPage(page, "sessionStorage.getItem('idem-token')")).toBeNull();
    await page.getByTestId("token").fill(server.tokens.operator);
    await page.getByTestId("sign-in").click();

    // The overview: counts, charts drawn inline, modes, conflicts, the time of the last update.
    await page.locator("[data-testid=counts] [data-state=UNKNOWN]").waitFor();
    expect(await page.locator("[data-testid=counts] [data-state=UNKNOWN] strong").textContent()).toBe(String(await acmeCount("UNKNOWN")));
    expect(await page.locator("[data-testid=counts] [data-state=RESERVED] strong").textContent()).toBe(String(await acmeCount("RESERVED")));
    expect(await page.getByTestId("modes").textContent()).toContain("payments.create");
    expect(await page.getByTestId("conflicts").textContent()).toContain(operationId);
    expect(await page.getByTestId("oldest").textContent()).toMatch(/^The oldest UNKNOWN record has been UNKNOWN for \d+ s\.$/);
    await expect.poll(() => page.getByTestId("updated").textContent()).toMatch(/^Last updated \d\d:\d\d:\d\d$/);
    // Each chart is drawn on a canvas as wide as its figure, its line across the whole window.
    for (const name of ["accepted", "conflicts", "takeovers", "becameUnknown", "unknownOldest", "unknownRecords"]) {
      const chart = page.getByTestId(`chart-${name}`);
      expect(await chart.locator("[role=img]").getAttribute("aria-label")).toMatch(/over the last 10 minutes: now .+, highest .+/);
      await expect.poll(() => lineSpan(page, name), { message: name }).toBeGreaterThan(0.7);
    }
    expect(await page.getByTestId("chart-unknownRecords").getByTestId("chart-now").textContent()).toBe(`now ${await acmeCount("UNKNOWN")}`);
    expect(await page.getByTestId("replica-charts").locator("figure").count(), "acme's operator sees no replica-wide counts").toBe(0);
    expect(await accessibilityFaults(page)).toEqual([]);
    // A refresh redraws the counts under a keyboard user's focus, and leaves the focus where it was.
    await page.getByRole("link", { name: "List the UNKNOWN records" }).focus();
    await page.evaluate("refresh(false)");
    expect(await inPage(page, "document.activeElement.getAttribute('href')")).toBe("#/search/state/UNKNOWN");
    await shoot(page, "1-overview.png");
    // Enter on a count lists the records of its state, newest first.
    await page.keyboard.press("Enter");
    await expect.poll(() => page.getByTestId("results-about").textContent()).toBe("Records in state UNKNOWN, newest first.");
    expect(await page.locator("[data-testid=results] tbody tr").count()).toBe(await acmeCount("UNKNOWN"));
    expect(await page.getByTestId("results").textContent()).toContain(operationId);

    // Search, reached by keyboard: Tab to the operation id field, type, Enter.
    await page.getByRole("link", { name: "Search" }).click();
    // The listing was already the search view, so its heading shows before the click's hashchange is
    // handled: wait for the navigation itself, which moves the focus from the clicked link to the heading.
    await expect.poll(() => inPage(page, "location.hash + ' ' + (document.activeElement && document.activeElement.id)")).toBe("#/search search-title");
    for (let i = 0; i < 30 && (await inPage(page, "document.activeElement && document.activeElement.name")) !== "operationId"; i++) await page.keyboard.press("Tab");
    expect(await inPage(page, "getComputedStyle(document.activeElement).outlineStyle"), "a visible focus").not.toBe("none");
    await page.keyboard.type(operationId);
    // The view's own loading, still under way, leaves the focus in the field being typed in.
    expect(await inPage(page, "document.activeElement.value")).toBe(operationId);
    await page.keyboard.press("Enter");
    const found = page.locator("[data-testid=results] tbody tr");
    // The UNKNOWN listing may already show this one record: wait for the search's own answer.
    await expect.poll(() => page.getByTestId("results-about").textContent()).toBe(`Records with operation id ${operationId}.`);
    expect(await found.count()).toBe(1);
    expect(await found.textContent()).toContain(operationId);
    // By scope: the key is hashed by the registry.
    const scope = page.getByTestId("search-scope");
    await scope.getByLabel("Tenant").fill("acme");
    await scope.getByLabel("Principal").fill("alice");
    await scope.getByLabel(/^Operation/).fill("payments.create@1");
    await scope.getByLabel("Idempotency key").fill(key);
    await scope.getByRole("button", { name: "Find" }).click();
    await expect.poll(() => page.getByTestId("results-about").textContent()).toContain(`key ${key}`);
    expect(await found.count()).toBe(1);
    expect(await found.locator("a").textContent()).toBe(operationId);
    await scope.getByLabel("Idempotency key").fill(newKey());
    await scope.getByRole("button", { name: "Find" }).click();
    await expect.poll(() => page.getByTestId("results-empty").isVisible()).toBe(true);
    expect(await page.getByTestId("results-empty").textContent()).toMatch(/^No record has this scope/);
    await scope.getByLabel("Idempotency key").fill(key);
    await scope.getByRole("button", { name: "Find" }).click();
    await expect.poll(() => found.count()).toBe(1);
    expect(await accessibilityFaults(page)).toEqual([]);
    await shoot(page, "2-search.png");

    // The record's page: its facts, attempts and timeline, as the event log holds them.
    await found.locator("a").click();
    await expect.poll(() => page.getByTestId("record-title").textContent()).toContain(operationId);
    expect(page.url()).toContain(`#/records/acme/${operationId}`);
    const logged = async () =>
      (await t.pool.query<{ kind: string }>("SELECT kind FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [operationId])).rows.map((r) => r.kind);
    const timeline = async () => Promise.all((await page.locator("[data-testid=timeline] li").all()).map((li) => li.getAttribute("data-kind")));
    await expect.poll(timeline).toEqual(await logged());
    expect(await timeline()).toEqual(["ACCEPTED", "CONFLICT", "EFFECT_RECORDED", "UNKNOWN"]);
    const { rows } = await t.pool.query<{ key: string }>("SELECT downstream_key AS key FROM idem_effect_attempt WHERE operation_id = $1", [operationId]);
    expect(await page.getByTestId("attempts").textContent()).toContain(rows[0]!.key);
    expect(await page.getByTestId("record-facts").textContent()).toContain("Principalalice");
    expect(await page.getByTestId("snapshot-empty").isVisible()).toBe(true);
    expect(await page.locator("#record-reconcile form").count(), "an UNKNOWN record's page offers to reconcile it").toBe(1);
    expect(await accessibilityFaults(page)).toEqual([]);
    await shoot(page, "3-record.png");

    // The UNKNOWN queue: open the form on the record's row, fill it in, reconcile.
    await page.getByRole("link", { name: /^UNKNOWN queue/ }).click();
    const row = page.locator(`[data-testid=unknown] tr[data-operation-id="${operationId}"]`);
    await row.waitFor();
    expect(await row.textContent()).toContain("card.charge #1 PENDING key");
    await row.getByTestId("open-reconcile").click();
    const form = page.locator(`tr[data-form-for="${operationId}"]`).getByTestId("reconcile-form");
    await form.getByLabel("Outcome").selectOption("SUCCEEDED");
    await form.getByLabel("HTTP status to replay").fill("201");
    await form.getByLabel("Response body to replay").fill('{"id":"p_1"}');
    await form.getByLabel(/^Evidence/).fill("charge ch_1 found in the provider dashboard");
    await form.getByLabel("Your name").fill("dana");
    expect(await accessibilityFaults(page)).toEqual([]);
    await shoot(page, "4-unknown-queue.png");
    await form.getByRole("button", { name: "Reconcile" }).click();

    await expect.poll(() => page.getByTestId("message").textContent()).toContain(`Reconciled ${operationId}: SUCCEEDED at generation 2`);
    await expect.poll(() => row.count()).toBe(0);
    expect(await acmeCount("UNKNOWN")).toBe(0);
    expect(await page.getByTestId("unknown-empty").isVisible()).toBe(true);
    expect(await page.getByTestId("unknown-empty").textContent()).toBe("No record is UNKNOWN: nothing to reconcile.");
    const reconciled = await t.pool.query("SELECT r.state, e.detail FROM idem_record r JOIN idem_event e USING (operation_id) WHERE operation_id = $1 AND e.kind = 'RECONCILED'", [
      operationId,
    ]);
    expect(reconciled.rows).toEqual([{ state: "SUCCEEDED", detail: { outcome: "SUCCEEDED", evidence: "charge ch_1 found in the provider dashboard", operator: "dana" } }]);
    await shoot(page, "5-reconciled.png");

    // The record's page again: the reconciliation on its timeline, its response's metadata and no body.
    await page.goto(`${server.adminUrl}/console#/records/acme/${operationId}`);
    await expect.poll(timeline).toEqual(await logged());
    expect((await timeline()).at(-1)).toBe("RECONCILED");
    expect(await page.getByTestId("snapshot").textContent()).toContain("Status code201");
    expect(await page.getByTestId("snapshot").textContent()).toContain("Body size12 bytes");
    expect(await page.locator("body").textContent()).not.toContain('{"id":"p_1"}');
    expect(await page.locator("#record-reconcile form").count()).toBe(0);

    // Auto-refresh: on by default; the time of the last update moves on at the interval chosen.
    expect(await page.getByTestId("auto-refresh").isChecked()).toBe(true);
    await page.getByTestId("interval").selectOption("5");
    const stamped = await page.getByTestId("updated").textContent();
    await expect.poll(() => page.getByTestId("updated").textContent(), { timeout: 12_000 }).not.toBe(stamped);
    await page.getByTestId("auto-refresh").uncheck();
    await expect.poll(() => page.getByTestId("message").textContent()).toBe("Auto-refresh off.");

    // Sign-out: the token is forgotten, nothing of the registry stays on the page.
    await page.getByTestId("sign-out").click();
    await page.getByTestId("login").waitFor();
    expect(await inPage(page, "sessionStorage.getItem('idem-token')")).toBeNull();
    expect(await page.getByTestId("message").textContent()).toBe("Signed out: the token is forgotten.");
    expect(await page.locator("body").textContent()).not.toContain(operationId);
    expect(await inPage(page, "document.activeElement.id")).toBe("token");
    await shoot(page, "6-signed-out.png");
    expect(errors).toEqual([]);
    expect(elsewhere).toEqual([]);
    await page.close();
  }, 90_000);

  it("shows each view's own data and errors only: a record that cannot be read shows no other record's facts or form, and errors go with their view", async () => {
    // A globex record, seen by the operator of every tenant: acme's counts stay as the test above expects them.
    const key = newKey();
    const accepted = await reserveFor(server, "globex", key, '{"amount":1}', true);
    await driveToUnknown(t, server, accepted.operationId, "globex");
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors: string[] = [];
    page.on("pageerror", (error) => errors.push(error.message));
    page.on("console", (message) => message.type() === "error" && !message.text().startsWith("Failed to load resource") && errors.push(message.text()));
    await page.goto(`${server.adminUrl}/console#/records/globex/${accepted.operationId}`);
    await page.getByTestId("token").fill(server.tokens.allTenantsOperator);
    await page.getByTestId("sign-in").click();
    await expect.poll(() => page.getByTestId("record-title").textContent()).toContain(accepted.operationId);
    const recordView = page.locator("#record-view");
    const reconcileForms = page.locator("#record-view form.reconcile");
    await expect.poll(() => reconcileForms.count()).toBe(1);
    expect(await page.getByTestId("record-facts").isVisible()).toBe(true);
    const message = page.getByTestId("message");
    expect(await message.textContent()).toBe("");

    // A record that does not exist, then an id that is no operation id: the refusal alone, nothing of the record before.
    for (const [operationId, reason] of [
      [randomUUID(), "NOT_FOUND"],
      ["not-an-operation-id", "INVALID_REQUEST"],
    ] as const) {
      await page.evaluate(`location.hash = ${JSON.stringify(`#/records/globex/${operationId}`)}`);
      await expect.poll(() => message.textContent()).toMatch(new RegExp(`^${reason}: `));
      expect(await recordView.innerText(), operationId).not.toContain(accepted.operationId);
      expect(await reconcileForms.count(), operationId).toBe(0);
      for (const part of ["record-facts", "attempts", "timeline", "generations", "snapshot", "snapshot-empty"]) {
        expect(await page.getByTestId(part).isVisible(), `${part} of ${operationId}`).toBe(false);
      }
      expect(await page.getByTestId("record-title").textContent()).toBe(`Record ${operationId}`);
    }

    // A slow answer about the record comes after another record was opened: it is not shown there.
    let answerLate = () => {};
    const late = new Promise<void>((resolve) => (answerLate = resolve));
    const recordUrl = "**/console/idempotency.v1.AdminService/GetRecordHistory";
    const ofAccepted = (request: { postData(): string | null }) => (request.postData() ?? "").includes(accepted.operationId);
    await page.route(recordUrl, async (route) => {
      if (ofAccepted(route.request())) await late;
      await route.continue();
    });
    await page.evaluate(`location.hash = ${JSON.stringify(`#/records/globex/${accepted.operationId}`)}`);
    await page.evaluate(`location.hash = ${JSON.stringify(`#/records/globex/${randomUUID()}`)}`);
    await expect.poll(() => message.textContent()).toMatch(/^NOT_FOUND: /);
    const answered = page.waitForResponse((response) => response.url().endsWith("/GetRecordHistory") && ofAccepted(response.request()));
    answerLate();
    await answered;
    // Time passes on purpose: nothing marks an answer the page dropped, so the page is given a moment in
    // which it would have shown the late answer, and must not have.
    await page.evaluate("new Promise((resolve) => setTimeout(resolve, 100))");
    expect(await recordView.innerText()).not.toContain(accepted.operationId);
    expect(await reconcileForms.count()).toBe(0);
    await page.unroute(recordUrl);

    // Another view: the record's refusal is not its error, and a refresh brings none back.
    await page.getByRole("link", { name: /^UNKNOWN queue/ }).click();
    await page.locator(`[data-testid=unknown] tr[data-operation-id="${accepted.operationId}"]`).waitFor();
    expect(await message.textContent()).toBe("");
    const refreshed = async () => {
      const before = await page.locator("[data-testid=updated] time").getAttribute("datetime");
      await page.getByTestId("refresh").click();
      await expect.poll(() => page.locator("[data-testid=updated] time").getAttribute("datetime")).not.toBe(before);
    };
    await refreshed();
    expect(await message.textContent()).toBe("");

    // A load that fails shows its error and none of the view's earlier data; the next one that succeeds clears the error.
    await page.getByRole("link", { name: "Overview" }).click();
    await page.locator("[data-testid=counts] [data-state=UNKNOWN]").waitFor();
    const census = "**/console/idempotency.v1.AdminService/GetRecordCensus";
    await page.route(census, (route) =>
      route.fulfill({ status: 503, contentType: "application/json", body: JSON.stringify({ code: "unavailable", message: "the registry cannot be reached" }) }),
    );
    await page.getByTestId("refresh").click();
    await expect.poll(() => message.textContent()).toBe("UNAVAILABLE: the registry cannot be reached");
    expect(await page.getByTestId("counts").isVisible()).toBe(false);
    expect(await page.locator("#overview-view").innerText()).not.toContain(accepted.operationId);
    await page.unroute(census);
    await page.getByTestId("refresh").click();
    await page.locator("[data-testid=counts] [data-state=UNKNOWN]").waitFor();
    await expect.poll(() => message.textContent()).toBe("");
    expect(await page.getByTestId("conflicts").isVisible()).toBe(true);

    // A search refused shows its error and no earlier results; the next search that succeeds clears it.
    await page.getByRole("link", { name: "Search" }).click();
    const byId = page.getByTestId("search-id");
    await byId.getByLabel("Operation id").fill(accepted.operationId);
    await byId.getByRole("button", { name: "Find" }).click();
    await expect.poll(() => page.locator("[data-testid=results] tbody tr").count()).toBe(1);
    const scope = page.getByTestId("search-scope");
    await scope.getByLabel("Tenant").fill("globex");
    await scope.getByLabel("Principal").fill("gus");
    await scope.getByLabel(/^Operation/).fill("payments.create@first");
    await scope.getByLabel("Idempotency key").fill(key);
    await scope.getByRole("button", { name: "Find" }).click();
    await expect.poll(() => message.textContent()).toMatch(/^INVALID_REQUEST: /);
    expect(await page.getByTestId("results").isVisible()).toBe(false);
    await scope.getByLabel(/^Operation/).fill("payments.create@1");
    await scope.getByRole("button", { name: "Find" }).click();
    await expect.poll(() => page.getByTestId("results-about").textContent()).toContain(`key ${key}`);
    await expect.poll(() => message.textContent()).toBe("");
    expect(await page.locator("[data-testid=results] tbody a").textContent()).toBe(accepted.operationId);
    expect(errors).toEqual([]);
    await page.close();
  }, 90_000);
});

describe.skipIf(skipHere)("the operator console's reconcile form", () => {
  it("offers to reopen an UNKNOWN record, warning that it runs again, and reopens it at the next generation", async () => {
    // A globex record, seen by the operator of every tenant: acme's counts stay as the tests above expect them.
    const accepted = await reserveFor(server, "globex", newKey(), '{"amount":1}', true);
    await driveToUnknown(t, server, accepted.operationId, "globex");
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors: string[] = [];
    page.on("pageerror", (error) => errors.push(error.message));
    await page.goto(`${server.adminUrl}/console#/records/globex/${accepted.operationId}`);
    await page.getByTestId("token").fill(server.tokens.allTenantsOperator);
    await page.getByTestId("sign-in").click();
    const form = page.locator("#record-reconcile").getByTestId("reconcile-form");
    await form.waitFor();
    const warning = form.getByTestId("reopen-warning");
    expect(await warning.isVisible()).toBe(false);

    await form.getByLabel("Outcome").selectOption("REOPEN");
    expect(await warning.isVisible()).toBe(true);
    expect(await warning.textContent()).toMatch(/^Reopening runs the operation again: the next identical retry executes it afresh/);
    expect(await form.getByLabel("HTTP status to replay").isVisible(), "a reopening records no response").toBe(false);
    await form.getByLabel(/^Evidence/).fill("no charge for this key in the provider dashboard");
    await form.getByLabel("Your name").fill("dana");
    expect(await accessibilityFaults(page)).toEqual([]);
    await shoot(page, "7-reopen.png");
    await form.getByRole("button", { name: "Reconcile" }).click();

    await expect.poll(() => page.getByTestId("message").textContent()).toBe(`Reopened ${accepted.operationId}: RESERVED at generation 2; the next identical retry runs it again.`);
    const { rows } = await t.pool.query<{ state: string; generation: number }>("SELECT state, generation::int AS generation FROM idem_record WHERE operation_id = $1", [
      accepted.operationId,
    ]);
    expect(rows).toEqual([{ state: "RESERVED", generation: 2 }]);
    const reopened = await t.pool.query<{ detail: Record<string, unknown> }>(
      "SELECT detail FROM idem_event WHERE operation_id = $1 AND generation = 2 ORDER BY event_id DESC LIMIT 1",
      [accepted.operationId],
    );
    expect(reopened.rows[0]?.detail).toMatchObject({ reopened: true, evidence: "no charge for this key in the provider dashboard", operator: "dana" });
    // The record's page follows once it has read the record again: no longer UNKNOWN, no form.
    await expect.poll(() => page.getByTestId("record-title").textContent()).toContain("RESERVED");
    expect(await page.locator("#record-reconcile form").count()).toBe(0);
    expect(errors).toEqual([]);
    await page.close();
  }, 60_000);
});

// The console's API as the page calls it, without a browser: what each operator is shown.
describe("the operator console's overview", () => {
  const overview = async (token: string) => {
    const [census, conflicts] = await Promise.all([
      consoleClient(server).getRecordCensus({}, as(token)),
      consoleClient(server).listRecentEvents({ kinds: ["CONFLICT"], pageSize: 20 }, as(token)),
    ]);
    return {
      records: Object.fromEntries(census.states.map((s) => [RecordState[s.state], Number(s.records)])),
      oldestUnknownSeconds: Number(census.oldestUnknown?.seconds ?? 0n),
      conflicts: conflicts.events,
    };
  };
  /** Records by state, as PostgreSQL counts them for `tenants` (all when undefined). */
  const counted = async (tenants?: string[]) => {
    const { rows } = await t.pool.query<{ state: string; n: number }>(
      "SELECT state, count(*)::int AS n FROM idem_record WHERE tombstoned_at IS NULL AND ($1::text[] IS NULL OR tenant_id = ANY($1)) GROUP BY state",
      [tenants ?? null],
    );
    return { records: Object.fromEntries(["RESERVED", "EXECUTING", "SUCCEEDED", "FAILED_FINAL", "REJECTED", "UNKNOWN"].map((s) => [s, rows.find((r) => r.state === s)?.n ?? 0])) };
  };

  it("shows an operator only its tenants' counts, oldest UNKNOWN and conflicts", async () => {
    const { operationId: acmeConflict } = await unknownRecord();
    // Another tenant: an UNKNOWN record an hour old, and more conflicts than the table shows, all newer than acme's.
    const key = newKey();
    const stuck = await reserveFor(server, "globex", key, '{"amount":1}', true);
    await driveToUnknown(t, server, stuck.operationId, "globex");
    await t.pool.query("UPDATE idem_record SET updated_at = now() - interval '1 hour' WHERE operation_id = $1", [stuck.operationId]);
    for (let i = 0; i < 25; i++) await reserveFor(server, "globex", key, `{"amount":${i + 2}}`);

    const acme = await overview(server.tokens.operator);
    expect(acme.records).toEqual((await counted(["acme"])).records);
    expect(acme.oldestUnknownSeconds).toBeLessThan(3600);
    expect(new Set(acme.conflicts.map((c) => c.tenant))).toEqual(new Set(["acme"]));
    expect(acme.conflicts.map((c) => c.operationId)).toContain(acmeConflict);

    const all = await overview(server.tokens.allTenantsOperator);
    expect(all.records).toEqual((await counted()).records);
    expect(all.records).not.toEqual(acme.records);
    expect(all.oldestUnknownSeconds).toBeGreaterThanOrEqual(3600);
    expect(all.conflicts.map((c) => c.tenant)).toContain("globex");
  });
});
