import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import type { FindRecordsRequestSchema } from "../gen/idempotency/v1/admin_pb.js";
import { RecordState } from "../gen/idempotency/v1/types_pb.js";
import { admin, dateOf, Refused, stateName, STATES } from "./api.js";
import { $, badge, fill, recordLink, time } from "./dom.js";
import { failed, page, succeeded, type Route, type Search } from "./state.js";
import { clearView, reveal } from "./views.js";

/** Runs a search and shows its results; a search refused shows its error and no results (of it or of an earlier one). */
export async function runSearch(kind: Search["kind"], input: Record<string, string>, more = false): Promise<void> {
  const shown = page.route;
  try {
    await searchAndShow(kind, input, more, shown);
  } catch (error) {
    if (shown !== page.route) return;
    clearView("search");
    failed(error, "search");
  }
}

async function searchAndShow(kind: Search["kind"], input: Record<string, string>, more: boolean, shown: Route): Promise<void> {
  const earlier = more ? page.search : null;
  let about: string, empty: string, rows: Search["rows"];
  let next = "";
  if (kind === "state") {
    const state = input.state ?? "";
    const answer = await admin.listNewestRecords({ states: state ? [stateOf(state)] : [], pageSize: Number(input.limit), pageToken: earlier?.next ?? "" });
    const what = state ? `in state ${state}` : "in any state";
    rows = [...(earlier?.rows ?? []), ...answer.records];
    next = answer.nextPageToken;
    about = `Records ${what}, newest first.`;
    empty = `No record is ${what} in your tenants.`;
  } else {
    rows = (await admin.findRecords(findRequest(kind, input))).records;
    about =
      kind === "id"
        ? `Records with operation id ${input.operationId}.`
        : `The record of the scope ${input.tenant} / ${input.principal} / ${input.operation} / key ${input.idempotencyKey}.`;
    empty =
      kind === "id"
        ? "No record has this operation id in your tenants."
        : "No record has this scope: no request with this key was accepted for this tenant, principal and operation (at any published API revision when none is given).";
  }
  if (shown !== page.route) return;
  const search = (page.search = { kind, input, rows, next });
  reveal("search");
  succeeded("search");
  $("#results-about").textContent = about;
  $("[data-testid=results-empty]").textContent = empty;
  fill("results", search.rows, (r) => [
    time(dateOf(r.createdAt)),
    r.tenant,
    recordLink(r),
    `${r.operation}@${r.apiRevision}`,
    r.principal,
    badge(stateName(r.state)),
    String(r.generation),
    String(r.effectAttempts.length),
  ]);
  $("#more").hidden = !search.next;
  $("#results-title").focus();
}

function stateOf(name: string): RecordState {
  if (!(STATES as readonly string[]).includes(name))
    throw new Refused(Code.InvalidArgument, "INVALID_REQUEST", `state must be one of ${STATES.join(", ")}, or empty for every state`);
  return RecordState[name as (typeof STATES)[number]];
}

/** A search by operation id, or by scope: the operation written `name@API revision`, every published revision without one. */
function findRequest(kind: "id" | "scope", input: Record<string, string>): MessageInitShape<typeof FindRecordsRequestSchema> {
  if (kind === "id") return { by: { case: "operationId", value: input.operationId ?? "" } };
  const [operation = "", revision] = (input.operation ?? "").split("@");
  if (revision !== undefined && !/^[1-9][0-9]{0,8}$/.test(revision))
    throw new Refused(Code.InvalidArgument, "INVALID_REQUEST", "the API revision after @ must be a positive number");
  const subject = { tenant: input.tenant ?? "", principal: input.principal ?? "" };
  return { by: { case: "scope", value: { subject, operation, apiRevision: revision ? Number(revision) : 0, idempotencyKey: input.idempotencyKey ?? "" } } };
}
