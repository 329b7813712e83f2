import type { EffectAttempt } from "../gen/idempotency/v1/types_pb.js";
import { Outcome } from "../gen/idempotency/v1/types_pb.js";
import { admin, effectStatusName, stateName } from "./api.js";
import { $ } from "./dom.js";
import { failed, say } from "./state.js";

/** An attempt as one line: what to ask the downstream system for. */
export const attemptText = (a: EffectAttempt): string =>
  `${a.effect} #${a.attemptNumber} ${effectStatusName(a.status)} key ${a.downstreamKey}${a.providerHandle ? ` handle ${a.providerHandle}` : ""}`;

/**
 * The form that reconciles an UNKNOWN record (AdminService.Reconcile, as
 * `idemctl reconcile`): settles it as SUCCEEDED or FAILED_FINAL with the
 * response retries will replay, or reopens it, so that it runs again, when
 * the evidence shows that nothing happened. `onDone` runs once it is
 * reconciled, or with `cancelled` when the form is closed in the queue.
 */
export function reconcileForm(record: { tenant: string; operationId: string }, onDone: (cancelled?: boolean) => unknown): HTMLFormElement {
  const form = $<HTMLTemplateElement>("#reconcile-template").content.firstElementChild!.cloneNode(true) as HTMLFormElement;
  const outcome = $<HTMLSelectElement>("[name=outcome]", form);
  // Reopening records no response: its fields are put away, and its warning shown.
  const reopening = () => {
    const reopen = outcome.value === "REOPEN";
    $("[data-testid=reopen-warning]", form).hidden = !reopen;
    const response = $<HTMLFieldSetElement>("[data-response]", form);
    response.hidden = reopen;
    response.disabled = reopen;
    return reopen;
  };
  outcome.addEventListener("change", reopening);
  const submit = async () => {
    const data = Object.fromEntries(new FormData(form)) as Record<string, string>;
    const ref = { tenant: record.tenant, operationId: record.operationId };
    const reason = { evidence: data.evidence ?? "", operator: data.operator ?? "" };
    try {
      const reopen = reopening();
      const answer = await admin.reconcile(
        reopen
          ? { ref, reopen, ...reason }
          : {
              ref,
              outcome: data.outcome === "FAILED_FINAL" ? Outcome.FAILED_FINAL : Outcome.SUCCEEDED,
              snapshot: { statusCode: Number(data.statusCode), mediaType: data.mediaType || "application/json", body: new TextEncoder().encode(data.body ?? "") },
              ...reason,
            },
      );
      const settled = answer.record!;
      say(
        reopen
          ? `Reopened ${settled.operationId}: ${stateName(settled.state)} at generation ${settled.generation}; the next identical retry runs it again.`
          : `Reconciled ${settled.operationId}: ${stateName(settled.state)} at generation ${settled.generation}.`,
      );
      form.remove();
      await onDone();
    } catch (error) {
      failed(error, "action");
    }
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    void submit();
  });
  // In the queue, Cancel closes the form; on a record's page, where the form stays, it clears it.
  $("[data-action=cancel]", form).addEventListener("click", () => {
    const row = form.closest(".form-row");
    if (!row) {
      form.reset();
      reopening();
      return;
    }
    row.remove();
    void onDone(true);
  });
  return form;
}
