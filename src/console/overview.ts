import type { GetRecordCensusResponse } from "../gen/idempotency/v1/admin_pb.js";
import { OperationMode } from "../gen/idempotency/v1/admin_pb.js";
import { RecordState } from "../gen/idempotency/v1/types_pb.js";
import { admin, dateOf, stateName } from "./api.js";
import { drawCharts } from "./charts.js";
import { $, age, fill, h, keepFocus, recordLink, time, when } from "./dom.js";
import { page, type Route } from "./state.js";
import { reveal } from "./views.js";

/** How many records are UNKNOWN, as a census counts them. */
export const unknownCount = (census: GetRecordCensusResponse): number => Number(census.states.find((s) => s.state === RecordState.UNKNOWN)?.records ?? 0n);

/**
 * The census, which every view's refresh reads (the navigation's count of
 * UNKNOWN records, the queue's total), and on the overview the counts, the
 * operations' switches, the recent conflicts and the charts.
 *
 * Every load is given the route shown when it began, and drops its answer when
 * another view has opened since: that view has a load of its own, and an old
 * answer must never fill it (another record's facts under this one's address).
 */
export async function loadOverview(shown: Route): Promise<void> {
  const census = await admin.getRecordCensus({});
  page.census = census;
  $("[data-testid=nav-unknown]").textContent = `UNKNOWN queue (${unknownCount(census)})`;
  if (shown !== page.route || shown.view !== "overview") return;
  const [{ controls }, { events: conflicts }] = await Promise.all([admin.listOperationControls({}), admin.listRecentEvents({ kinds: ["CONFLICT"], pageSize: 20 })]);
  if (shown !== page.route) return;
  const counts = $("[data-testid=counts]");
  keepFocus(counts, () =>
    counts.replaceChildren(
      ...census.states.map(({ state, records }) =>
        h(
          "li",
          { "data-state": stateName(state) },
          h("a", { href: `#/search/state/${stateName(state)}`, "aria-label": `List the ${stateName(state)} records` }, h("strong", {}, String(records)), stateName(state)),
        ),
      ),
    ),
  );
  const oldestSeconds = Number(census.oldestUnknown?.seconds ?? 0n);
  const oldest = $("#oldest");
  oldest.textContent = oldestSeconds > 0 ? `The oldest UNKNOWN record has been UNKNOWN for ${age(oldestSeconds)}.` : "No record is UNKNOWN.";
  oldest.className = oldestSeconds > 0 ? "warn" : "note";
  fill("modes", controls, (c) => [c.operation, String(c.apiRevision), OperationMode[c.mode], String(c.writerEpoch), c.updatedBy]);
  fill("conflicts", conflicts, (c) => [time(dateOf(c.at)), c.tenant, recordLink(c), c.operation, c.caller]);
  await loadCharts(shown);
  if (shown === page.route) reveal("overview");
}

async function loadCharts(shown: Route): Promise<void> {
  const charts = await admin.getEventSeries({ minutes: Number($<HTMLSelectElement>("#window").value) });
  if (shown !== page.route) return;
  const buckets = charts.bucketStarts.map(Number);
  drawCharts($("[data-testid=charts]"), charts.series, charts.minutes, buckets);
  const note = $("#replica-note");
  if (charts.replica) {
    note.textContent = `Replays, answers in progress and expired keys leave no event: this replica's metrics count them, for every tenant, since ${when(dateOf(charts.replica.since))}. Other replicas count their own.`;
    drawCharts($("[data-testid=replica-charts]"), charts.replica.series, charts.minutes, buckets);
  } else {
    note.textContent =
      "Replays, answers in progress and expired keys leave no event; each replica's metrics count them for every tenant, so they are shown to operators granted every tenant only.";
    drawCharts($("[data-testid=replica-charts]"), [], charts.minutes, buckets);
  }
}
