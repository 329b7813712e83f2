import { base64Encode } from "@bufbuild/protobuf/wire";
import { RecordState } from "../gen/idempotency/v1/types_pb.js";
import { admin, dateOf, effectStatusName, stateName } from "./api.js";
import { $, badge, facts, fill, h, time, when } from "./dom.js";
import { reconcileForm } from "./reconcile.js";
import { page, type Route } from "./state.js";
import { reveal } from "./views.js";

/** A record's page: its facts, attempts, timeline, generations and stored response's metadata; the reconcile form when it is UNKNOWN. */
export async function loadRecord(shown: Extract<Route, { view: "record" }>, explicit: boolean, refresh: (explicit: boolean) => Promise<void>): Promise<void> {
  const history = await admin.getRecordHistory({ ref: { tenant: shown.tenant, operationId: shown.operationId } });
  if (shown !== page.route) return;
  const r = history.record!;
  reveal("record");
  $("#record-title").replaceChildren("Record ", h("span", { class: "mono" }, r.operationId), " ", badge(stateName(r.state)));
  const lease = history.lease ? `${history.lease.live ? "held until" : "ended at"} ${when(dateOf(history.lease.expiresAt))}` : "none";
  const owner = history.owner;
  facts("record-facts", [
    ["Tenant", r.tenant],
    ["Principal", r.principal],
    ["Operation", `${r.operation}@${r.apiRevision}`],
    ["State", stateName(r.state) + (r.recovering ? " (held by a recovery worker)" : "") + (r.tombstoned ? " (tombstone)" : "")],
    ["Generation", String(r.generation)],
    ["Writer epoch", String(history.writerEpoch)],
    ["Effect possible", history.effectPossible ? "yes" : "no"],
    ["Lease", lease],
    ["Owner", owner ? `${owner.caller} (generation ${owner.generation}, since ${when(dateOf(owner.since))})` : "none"],
    ["Created", time(dateOf(r.createdAt))],
    ["Updated", time(dateOf(r.updatedAt))],
    ["Completed", time(dateOf(history.completedAt))],
    ["Kept until", time(dateOf(history.retainUntil))],
    ["Tombstoned", time(dateOf(history.tombstonedAt))],
  ]);
  const s = history.storedResponse;
  $("[data-testid=snapshot-empty]").hidden = Boolean(s);
  $("[data-testid=snapshot]").hidden = !s;
  if (s) {
    facts("snapshot", [
      ["Status code", s.statusCode === undefined ? "– (tombstone)" : String(s.statusCode)],
      ["Media type", s.mediaType || "–"],
      ["Body size", s.bodyBytes === undefined ? "– (tombstone)" : `${s.bodyBytes} bytes`],
      ["Headers", s.headerNames.length ? s.headerNames.join(", ") : "none"],
      ["Sealed", s.sealedWith ? `yes, with key ${s.sealedWith}` : "no (stored as it is)"],
      // Base64, as the RPCs and idemctl print digests: one spelling to compare.
      ["Digest (SHA-256)", h("code", {}, base64Encode(s.digest))],
    ]);
  }
  fill("generations", history.generations, (g) => [
    String(g.generation),
    g.beganWith || "(older than the timeline)",
    time(dateOf(g.beganAt)),
    g.beganBy || "–",
    g.attemptNumbers.length ? g.attemptNumbers.map((n) => `#${n}`).join(", ") : "none",
    String(g.events),
  ]);
  fill("attempts", r.effectAttempts, (a) => [
    String(a.attemptNumber),
    String(a.generation),
    a.effect,
    a.provider,
    effectStatusName(a.status),
    h("code", {}, a.downstreamKey),
    a.providerHandle ? h("code", {}, a.providerHandle) : "–",
    time(dateOf(a.createdAt)),
    time(dateOf(a.resolvedAt)),
  ]);
  const events = history.events;
  $("#timeline-about").textContent = events.length >= history.eventsLimit ? `The newest ${history.eventsLimit} events, oldest first.` : `${events.length} events, oldest first.`;
  $("[data-testid=timeline]").replaceChildren(
    ...events.map((e) =>
      h(
        "li",
        { "data-kind": e.kind },
        time(dateOf(e.at)),
        " ",
        h("span", { class: "kind" }, e.kind),
        e.generation !== undefined ? ` · generation ${e.generation}` : "",
        e.state ? ` · ${e.state}` : "",
        ` · by ${e.caller}`,
        Object.keys(e.detail ?? {}).length ? h("div", { class: "mono" }, JSON.stringify(e.detail)) : null,
      ),
    ),
  );
  const slot = $("#record-reconcile");
  if (r.state !== RecordState.UNKNOWN) slot.replaceChildren();
  else if (explicit || !slot.querySelector("form")) {
    const form = reconcileForm(r, () => refresh(true));
    $("[data-action=cancel]", form).textContent = "Clear";
    slot.replaceChildren(h("h3", {}, "Reconcile"), form);
  }
}
