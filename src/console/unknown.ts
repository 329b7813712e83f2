import { admin } from "./api.js";
import { $, age, fill, h, recordLink } from "./dom.js";
import { unknownCount } from "./overview.js";
import { attemptText, reconcileForm } from "./reconcile.js";
import { page, type Route } from "./state.js";
import { reveal } from "./views.js";

/** Most records the queue shows: the longest UNKNOWN (the overview's count says how many there are in all). */
const QUEUE_LIMIT = 200;

/** The UNKNOWN queue, longest UNKNOWN first, with a reconcile form to open on each row. */
export async function loadUnknown(shown: Route, explicit: boolean, refresh: (explicit: boolean) => Promise<void>): Promise<void> {
  // A reconcile form being filled in is never wiped by an automatic refresh.
  if (!explicit && document.querySelector("#unknown-view form.reconcile")) return;
  const queue = (await admin.listUnknownRecords({ pageSize: QUEUE_LIMIT })).records.flatMap(({ record, unknownFor }) =>
    record ? [{ ...record, unknownSeconds: Number(unknownFor?.seconds ?? 0n) }] : [],
  );
  if (shown !== page.route) return;
  reveal("unknown");
  const total = page.census ? unknownCount(page.census) : queue.length;
  const listed = queue.length;
  $("#unknown-about").textContent =
    listed === 0
      ? ""
      : `${listed < total ? `The ${listed} longest UNKNOWN of ${total} records.` : listed === 1 ? "1 record is UNKNOWN." : `${listed} records are UNKNOWN.`} An automatic refresh leaves this list alone while a reconcile form is open.`;
  fill(
    "unknown",
    queue,
    (r) => [age(r.unknownSeconds), r.tenant, recordLink(r), `${r.operation}@${r.apiRevision}`, String(r.generation), r.effectAttempts.map(attemptText).join("; ") || "none", ""],
    (row, r) => {
      row.dataset.operationId = r.operationId;
      const button = h("button", { type: "button", "data-testid": "open-reconcile", "aria-expanded": "false" }, "Reconcile…");
      button.setAttribute("aria-label", `Reconcile ${r.operationId}`);
      button.addEventListener("click", () => {
        if (row.nextElementSibling?.classList.contains("form-row")) return;
        const cell = h("td", { colspan: 7 });
        const formRow = h("tr", { class: "form-row", "data-form-for": r.operationId }, cell);
        cell.append(
          reconcileForm(r, (cancelled) => {
            if (!cancelled) return refresh(true);
            button.setAttribute("aria-expanded", "false");
            button.focus();
          }),
        );
        row.after(formRow);
        button.setAttribute("aria-expanded", "true");
        $("select", cell).focus();
      });
      row.lastElementChild!.append(button);
    },
  );
}
