import { readFile } from "node:fs/promises";
import { create, toJson } from "@bufbuild/protobuf";
import { type Duration, DurationSchema } from "@bufbuild/protobuf/wkt";
import type { OperationControl } from "../gen/idempotency/v1/admin_pb.js";
import { OperationRefSchema } from "../gen/idempotency/v1/coordinator_pb.js";
import { type OperationRecord, OperationRecordSchema } from "../gen/idempotency/v1/types_pb.js";
import { choice, EFFECT_STATUSES, OUTCOMES, RECORD_STATES, type Outcome, type Vocabulary } from "../contract/words.js";
import { parseDuration } from "../policy/document.js";
import { OPERATION_MODES } from "../policy/operations.js";
import { base64, clientsOf, isoTime, table, UsageError, type Connection } from "./connection.js";

/**
 * The operator commands of idemctl over AdminService and Lookup: records and
 * the UNKNOWN queue, reconciliation, the retention sweep, modes, epochs and
 * the event log. Tables for people, --json for scripts.
 */

type Out = (text: string) => void;

/** The word of an enum field of an answer; a number this idemctl does not know is an error saying so, never another word. */
function wordOf<Word extends string>(vocabulary: Vocabulary<Word, number>, value: number): Word {
  return vocabulary.word(value, (described) => {
    throw new Error(`the coordinator answered ${described}, a value this idemctl does not know: upgrade idempotency-coordinator`);
  });
}

const stateName = (state: number) => wordOf(RECORD_STATES, state);

/** The outcomes an operator settles a record with. */
const RECONCILED: readonly Outcome[] = ["SUCCEEDED", "FAILED_FINAL"];

/** `idemctl lookup`: one record, by tenant and operation id. */
export async function lookupCommand(tenant: string, operationId: string, json: boolean, connection: Connection, out: Out): Promise<void> {
  const { coordinator, call } = clientsOf(connection);
  const { record } = await coordinator.lookup({ by: { case: "ref", value: create(OperationRefSchema, { tenant, operationId }) } }, call);
  if (json) return out(JSON.stringify(toJson(OperationRecordSchema, record!), null, 2));
  out(describeRecord(record!));
}

/** `idemctl list`: records by state, tenant, operation and age, oldest first, paged until `limit`. */
export async function listCommand(
  filter: { states: string[]; tenant: string; operations: string[]; olderThan: string | undefined; limit: number },
  json: boolean,
  connection: Connection,
  out: Out,
): Promise<void> {
  const { admin, call } = clientsOf(connection);
  const states = filter.states.map((name) => {
    const word = name.toUpperCase();
    if (!RECORD_STATES.has(word)) throw new UsageError(`--state ${name}: use ${choice(RECORD_STATES.words)}`);
    return RECORD_STATES.number(word);
  });
  const records: OperationRecord[] = [];
  let pageToken = "";
  do {
    const page = await admin.listRecords(
      {
        states,
        tenant: filter.tenant,
        operations: filter.operations,
        ...(filter.olderThan ? { olderThan: duration(filter.olderThan, "--older-than") } : {}),
        pageSize: Math.min(500, filter.limit - records.length),
        pageToken,
      },
      call,
    );
    records.push(...page.records);
    pageToken = page.nextPageToken;
  } while (pageToken && records.length < filter.limit);
  if (json)
    return out(
      JSON.stringify(
        records.map((r) => toJson(OperationRecordSchema, r)),
        null,
        2,
      ),
    );
  const now = Date.now();
  out(
    table(
      ["TENANT", "OPERATION ID", "OPERATION", "STATE", "GEN", "AGE", "ATTEMPTS"],
      records.map((r) => [
        r.subject?.tenant ?? "",
        r.operationId,
        `${r.operation}@${r.apiRevision}`,
        stateName(r.state) + (r.recovering ? " (recovering)" : ""),
        String(r.generation),
        age(now - Number(r.createdAt?.seconds ?? 0n) * 1000),
        r.effectAttempts.map((a) => `${a.effect}#${a.attemptNumber}`).join(",") || "-",
      ]),
    ),
  );
  out(`${records.length} record(s)${pageToken ? " (more: raise --limit)" : ""}`);
}

/** `idemctl reconcile`: settles an UNKNOWN record with evidence, or reopens it to a fresh execution. */
export async function reconcileCommand(
  input: { tenant: string; operationId: string; evidence: string; operator: string } & (
    { reopen: true } | { reopen?: false; outcome: string; status: number; mediaType: string; body: Uint8Array }
  ),
  json: boolean,
  connection: Connection,
  out: Out,
): Promise<void> {
  const ref = create(OperationRefSchema, { tenant: input.tenant, operationId: input.operationId });
  const { admin, call } = clientsOf(connection);
  if (input.reopen) {
    const { record } = await admin.reconcile({ ref, reopen: true, evidence: input.evidence, operator: input.operator }, call);
    if (json) return out(JSON.stringify(toJson(OperationRecordSchema, record!), null, 2));
    return out(`reopened: ${input.operationId} is ${stateName(record!.state)} at generation ${record!.generation}; the client's next retry runs it again`);
  }
  const word = input.outcome.toUpperCase();
  if (!OUTCOMES.has(word) || !RECONCILED.includes(word)) throw new UsageError(`--outcome must be ${choice(RECONCILED)}`);
  const outcome = OUTCOMES.number(word);
  const { record } = await admin.reconcile(
    { ref, outcome, snapshot: { statusCode: input.status, mediaType: input.mediaType, body: input.body }, evidence: input.evidence, operator: input.operator },
    call,
  );
  if (json) return out(JSON.stringify(toJson(OperationRecordSchema, record!), null, 2));
  out(`reconciled: ${input.operationId} is ${stateName(record!.state)} at generation ${record!.generation}; retries now replay status ${input.status}`);
}

/** `idemctl sweep`: the retention sweep, now. */
export async function sweepCommand(batchSize: number, maxBatches: number, json: boolean, connection: Connection, out: Out): Promise<void> {
  const { admin, call } = clientsOf(connection);
  if (!json) out("sweeping finished records past their retention…");
  const { tombstoned, batches } = await admin.runRetentionSweep({ batchSize, maxBatches }, call);
  out(json ? JSON.stringify({ tombstoned: Number(tombstoned), batches: Number(batches) }) : `tombstoned ${tombstoned} record(s) in ${batches} batch(es)`);
}

/** `idemctl mode [OPERATION MODE]`: sets a mode, or lists every operation's switches. */
export async function modeCommand(operation: string | undefined, mode: string | undefined, apiRevision: number, json: boolean, connection: Connection, out: Out): Promise<void> {
  const { admin, call } = clientsOf(connection);
  if (operation === undefined) {
    const { controls } = await admin.listOperationControls({}, call);
    return out(renderControls(controls, json));
  }
  const wanted = (mode ?? "").toUpperCase();
  if (!OPERATION_MODES.has(wanted)) throw new UsageError(`the mode must be ${choice(OPERATION_MODES.words)}`);
  const { control } = await admin.setOperationMode({ operation, apiRevision, mode: OPERATION_MODES.number(wanted) }, call);
  out(renderControls([control!], json));
}

/** `idemctl epoch OPERATION EPOCH`: raises the writer epoch. */
export async function epochCommand(operation: string, epoch: bigint, apiRevision: number, json: boolean, connection: Connection, out: Out): Promise<void> {
  const { admin, call } = clientsOf(connection);
  const { control } = await admin.raiseWriterEpoch({ operation, apiRevision, writerEpoch: epoch }, call);
  out(renderControls([control!], json));
}

/** `idemctl events`: the event log from a cursor, one line per event (or JSON lines); --follow keeps reading. */
export async function eventsCommand(
  options: { after: string; follow: boolean; tenant: string; operation: string; json: boolean },
  connection: Connection,
  out: Out,
  signal: AbortSignal,
): Promise<void> {
  const { admin, call } = clientsOf(connection);
  try {
    for await (const event of admin.streamEvents({ after: options.after, follow: options.follow, tenant: options.tenant, operation: options.operation }, { ...call, signal })) {
      const at = isoTime(event.at);
      if (options.json) {
        out(
          JSON.stringify({
            cursor: event.cursor,
            eventId: String(event.eventId),
            at,
            tenant: event.tenant,
            operationId: event.operationId,
            operation: event.operation,
            kind: event.kind,
            generation: String(event.generation),
            state: event.state,
            caller: event.caller,
            detail: event.detail,
          }),
        );
      } else {
        out(
          `${at}  ${event.kind.padEnd(18)} ${event.tenant || "-"} ${event.operationId || event.operation} gen=${event.generation} ${event.state} by ${event.caller}${event.detail && Object.keys(event.detail).length > 0 ? ` ${JSON.stringify(event.detail)}` : ""}`,
        );
      }
    }
  } catch (error) {
    if (!signal.aborted) throw error;
  }
}

function renderControls(controls: OperationControl[], json: boolean): string {
  const rows = controls.map((c) => ({
    operation: c.operation,
    apiRevision: c.apiRevision,
    mode: wordOf(OPERATION_MODES, c.mode),
    writerEpoch: String(c.writerEpoch),
    updatedBy: c.updatedBy,
  }));
  if (json) return JSON.stringify(rows, null, 2);
  return table(
    ["OPERATION", "API", "MODE", "WRITER EPOCH", "CHANGED BY"],
    rows.map((r) => [r.operation, String(r.apiRevision), String(r.mode), r.writerEpoch, r.updatedBy]),
  );
}

function describeRecord(r: OperationRecord): string {
  const lines = [
    `operation ${r.operationId} (${r.operation}@${r.apiRevision}, schema revision ${r.schemaRevision})`,
    `  subject     ${r.subject?.tenant} / ${r.subject?.principal}`,
    `  state       ${stateName(r.state)}${r.recovering ? " (recovering)" : ""}, generation ${r.generation}`,
    `  lease until ${isoTime(r.leaseExpiresAt)}`,
    ...(r.snapshot ? [`  snapshot    status ${r.snapshot.statusCode}, ${r.snapshot.body.length} bytes, digest ${base64(r.snapshot.digest)}`] : []),
    ...r.effectAttempts.map(
      (a) =>
        `  attempt ${a.attemptNumber}   ${a.effect} via ${a.provider || "-"}: ${wordOf(EFFECT_STATUSES, a.status)}, key ${a.downstreamKey}` +
        (a.providerHandle ? `, handle ${a.providerHandle}` : ""),
    ),
  ];
  return lines.join("\n");
}

function age(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : s < 172_800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86_400)}d`;
}

function duration(text: string, option: string): Duration {
  const ms = parseDuration(text);
  if (ms === undefined) throw new UsageError(`${option} must be a duration such as 30s, 15m, 2h or 7d`);
  return create(DurationSchema, { seconds: BigInt(Math.floor(ms / 1000)) });
}

/** A reconcile body from --body or --body-file. */
export async function bodyOf(values: { body?: string | undefined; "body-file"?: string | undefined }): Promise<Uint8Array> {
  if (values.body !== undefined && values["body-file"] !== undefined) throw new UsageError("pass --body or --body-file, not both");
  if (values["body-file"] !== undefined) return new Uint8Array(await readFile(values["body-file"]));
  return new TextEncoder().encode(values.body ?? "");
}
