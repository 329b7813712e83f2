import { mkdir, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import type { Distribution } from "../lib/histogram.js";
import { esc, reportStyle } from "../lib/html.js";
import type { ChaosEvent } from "./chaos.js";
import type { OutcomeClass } from "./load.js";
import type { Criterion } from "../lib/criterion.js";
import type { HistogramSummary } from "../lib/prometheus.js";
import type { ReserveInterval } from "./reserve.js";
import { formatDuration } from "../lib/format.js";

/** Everything a run found, as written to report.json. */
export interface GateReport {
  gate: "payments launch gate";
  /** What the table and the page are titled: the gate's own title, or that of the scenario run on it. */
  title: string;
  contract: "http.idempotency.v1, section 9";
  passed: boolean;
  startedAt: string;
  finishedAt: string;
  durationSeconds: number;
  phases: { startupSeconds: number; loadSeconds: number; settleSeconds: number; measureSeconds: number };
  options: Record<string, unknown>;
  environment: Record<string, unknown>;
  criteria: Criterion[];
  facts: Array<{ name: string; value: string }>;
  load: {
    httpRequests: number;
    logicalRequests: number;
    requestsPerSecond: number;
    byStatus: Record<string, number>;
    byOutcome: Record<string, number>;
    byVariant: Record<string, number>;
    byKind: Record<string, number>;
    replayedAnswers: number;
    refusedConnections: number;
    connectionErrors: Record<string, number>;
    providerFaultsRequested: Record<string, number>;
    timeline: Array<[number, number]>;
  };
  chaos: { events: ChaosEvent[]; unexpectedExits: Array<{ target: string; at: string }>; scrapeErrors: string[] };
  settle: { waitedSeconds: number; settled: boolean; remaining: { unknown: number; leased: number; recovering: number } };
  registry: Record<string, unknown>;
  latency: {
    clientBoundsMs: readonly number[];
    client: Partial<Record<OutcomeClass, Distribution>>;
    reserve: {
      histogram: Array<{ le: number | "+Inf"; count: number }>;
      count: number;
      sumSeconds: number;
      scrapes: number;
      series: ReserveInterval[];
      p50Ms: number;
      p90Ms: number;
      p99Ms: number;
      p999Ms: number;
      limitMs: number;
    };
    reserveRpc: HistogramSummary;
  };
  samples: Record<string, unknown[]>;
}

/** The gate's table, for stdout. */
export function renderTable(report: GateReport): string {
  const rows = report.criteria.map((c) => [c.name, c.measured, c.threshold, c.pass ? "PASS" : "FAIL"]);
  const head = ["criterion", "measured", "threshold", "result"];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => c.padEnd(widths[i]!))
      .join("  ")
      .trimEnd();
  const rule = widths.map((w) => "-".repeat(w)).join("  ");
  const contract = report.criteria.filter((c) => c.source === "contract").length;
  const out = [
    `${report.title} (${report.contract}): ${report.load.httpRequests.toLocaleString("en-US")} HTTP requests, ${report.load.logicalRequests.toLocaleString("en-US")} logical requests, ${formatDuration(report.durationSeconds * 1000)}`,
    "",
    line(head),
    rule,
    ...rows.slice(0, contract).map(line),
    rule,
    ...rows.slice(contract).map(line),
    "",
    ...report.facts.map((f) => `  ${f.name}: ${f.value}`),
    `  kills: ${
      report.chaos.events
        .filter((e) => e.killedAt)
        .map((e) => `${e.fault ?? e.target} at ${(e.requestsSent ?? 0).toLocaleString("en-US")} (down ${formatDuration(e.downMs ?? 0)})`)
        .join("; ") || "none"
    }`,
    "",
    `GATE ${report.passed ? "PASSED" : "FAILED"}${
      report.passed
        ? ""
        : `: ${report.criteria
            .filter((c) => !c.pass)
            .map((c) => c.name)
            .join("; ")}`
    }`,
  ];
  return `${out.join("\n")}\n`;
}

export async function writeReports(report: GateReport, outDir: string): Promise<{ json: string; html: string }> {
  const dir = resolve(outDir);
  await mkdir(dir, { recursive: true });
  const json = join(dir, "report.json");
  const html = join(dir, "report.html");
  await writeFile(json, `${JSON.stringify(report, (_k, v: unknown) => (typeof v === "number" && !Number.isFinite(v) ? null : v), 2)}\n`);
  await writeFile(html, renderHtml(report));
  return { json, html };
}

// --- HTML ----------------------------------------------------------------------

const COLORS: Record<OutcomeClass, string> = {
  created: "#2f7d32",
  replayed: "#1565c0",
  declined: "#8e6c00",
  "in-progress": "#6a1b9a",
  conflict: "#c62828",
  unavailable: "#ef6c00",
  "server-error": "#ad1457",
  "client-error": "#5d4037",
  "connection-error": "#455a64",
};

const OUTCOME_LABELS: Record<OutcomeClass, string> = {
  created: "2xx, the handler ran",
  replayed: "replayed snapshot (2xx/402)",
  declined: "402 declined, first answer",
  "in-progress": "409 in progress",
  conflict: "422 payload conflict",
  unavailable: "503/429 (fail closed, back off)",
  "server-error": "500/502 (outcome pending)",
  "client-error": "other 4xx",
  "connection-error": "connection error or client timeout",
};

function fmtMs(ms: number): string {
  if (!Number.isFinite(ms)) return "–";
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 100) return `${ms.toFixed(1)} ms`;
  if (ms < 10_000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(1)} s`;
}

interface Bar {
  fromMs: number;
  toMs: number;
  count: number;
  label?: string;
}

/** A chart's size and where its plot lies inside it. */
interface Frame {
  W: number;
  H: number;
  left: number;
  top: number;
  plotW: number;
  plotH: number;
}

function frame(W: number, H: number, margins: { left: number; top: number; bottom: number }): Frame {
  return { W, H, left: margins.left, top: margins.top, plotW: W - margins.left - 10, plotH: H - margins.top - margins.bottom };
}

/** Labels in seconds along a time axis, about a dozen of them. */
function timeAxis(f: Frame, x: (second: number) => number, seconds: number): string[] {
  const step = Math.max(1, Math.ceil(seconds / 12 / 10) * 10);
  const labels: string[] = [];
  for (let s = 0; s <= seconds; s += step) labels.push(`<text x="${x(s).toFixed(1)}" y="${f.H - 8}" class="ax" text-anchor="middle">${s}s</text>`);
  return labels;
}

/** A dashed vertical line at each kill, labelled. */
function killMarks(f: Frame, x: (second: number) => number, kills: Array<{ second: number; label: string }>): string[] {
  return kills.flatMap((k) => [
    `<line x1="${x(k.second).toFixed(1)}" y1="${f.top}" x2="${x(k.second).toFixed(1)}" y2="${f.top + f.plotH}" stroke="#000" stroke-dasharray="3 3"/>`,
    `<text x="${(x(k.second) + 3).toFixed(1)}" y="${f.top + 10}" class="ax">${esc(k.label)}</text>`,
  ]);
}

/** A histogram on a logarithmic latency axis, as inline SVG. */
function svgHistogram(bars: Bar[], options: { color: string; markers?: Array<{ ms: number; label: string; color: string }>; minMs: number; maxMs: number; title: string }): string {
  const { W, H, left, top, plotW, plotH } = frame(560, 170, { left: 46, top: 18, bottom: 28 });
  const lx = (ms: number) => left + ((Math.log10(Math.max(ms, options.minMs)) - Math.log10(options.minMs)) / (Math.log10(options.maxMs) - Math.log10(options.minMs))) * plotW;
  const maxCount = Math.max(1, ...bars.map((b) => b.count));
  const parts: string[] = [`<svg viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" role="img" aria-label="${esc(options.title)}">`];
  parts.push(`<text x="${left}" y="12" class="t">${esc(options.title)}</text>`);
  for (let decade = Math.ceil(Math.log10(options.minMs)); decade <= Math.floor(Math.log10(options.maxMs)); decade++) {
    const ms = 10 ** decade;
    const x = lx(ms);
    parts.push(`<line x1="${x.toFixed(1)}" y1="${top}" x2="${x.toFixed(1)}" y2="${top + plotH}" class="grid"/>`);
    parts.push(`<text x="${x.toFixed(1)}" y="${H - 12}" class="ax" text-anchor="middle">${esc(fmtMs(ms).replace(".0 ", " ").replace(".00 ", " "))}</text>`);
  }
  parts.push(`<line x1="${left}" y1="${top + plotH}" x2="${left + plotW}" y2="${top + plotH}" class="axis"/>`);
  parts.push(`<text x="${left - 4}" y="${top + 8}" class="ax" text-anchor="end">${maxCount.toLocaleString("en-US")}</text>`);
  parts.push(`<text x="${left - 4}" y="${top + plotH}" class="ax" text-anchor="end">0</text>`);
  for (const b of bars) {
    if (b.count === 0) continue;
    const x0 = lx(b.fromMs);
    const x1 = Math.max(x0 + 1, lx(b.toMs) - 0.5);
    const h = Math.max(1, (b.count / maxCount) * plotH);
    parts.push(
      `<rect x="${x0.toFixed(1)}" y="${(top + plotH - h).toFixed(1)}" width="${(x1 - x0).toFixed(1)}" height="${h.toFixed(1)}" fill="${options.color}"><title>${esc(b.label ?? `${fmtMs(b.fromMs)} – ${fmtMs(b.toMs)}`)}: ${b.count.toLocaleString("en-US")}</title></rect>`,
    );
  }
  for (const [i, m] of (options.markers ?? []).entries()) {
    if (!Number.isFinite(m.ms) || m.ms <= 0) continue;
    const x = lx(m.ms);
    parts.push(`<line x1="${x.toFixed(1)}" y1="${top}" x2="${x.toFixed(1)}" y2="${top + plotH}" stroke="${m.color}" stroke-width="1.5" stroke-dasharray="4 3"/>`);
    parts.push(`<text x="${(x + 3).toFixed(1)}" y="${top + 10 + i * 12}" class="ax" fill="${m.color}">${esc(m.label)}</text>`);
  }
  parts.push("</svg>");
  return parts.join("");
}

/** Requests per second over the run, with the kills marked. */
function svgTimeline(timeline: Array<[number, number]>, kills: Array<{ second: number; label: string }>): string {
  const f = frame(1140, 180, { left: 46, top: 14, bottom: 26 });
  const { W, H, left, top, plotW, plotH } = f;
  const n = Math.max(1, timeline.length);
  const max = Math.max(1, ...timeline.map(([ok, bad]) => ok + bad));
  const x = (s: number) => left + (s / n) * plotW;
  const y = (v: number) => top + plotH - (v / max) * plotH;
  const path = (pick: (p: [number, number]) => number) => timeline.map((p, i) => `${i === 0 ? "M" : "L"}${x(i + 0.5).toFixed(1)},${y(pick(p)).toFixed(1)}`).join("");
  const parts = [`<svg viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="requests per second">`];
  parts.push(`<line x1="${left}" y1="${top + plotH}" x2="${left + plotW}" y2="${top + plotH}" class="axis"/>`);
  parts.push(`<text x="${left - 4}" y="${top + 8}" class="ax" text-anchor="end">${max}/s</text>`);
  parts.push(...timeAxis(f, x, n));
  parts.push(`<path d="${path(([ok, bad]) => ok + bad)}" fill="none" stroke="#1565c0" stroke-width="1.2"><title>all answers per second</title></path>`);
  parts.push(`<path d="${path(([, bad]) => bad)}" fill="none" stroke="#c62828" stroke-width="1.2"><title>503, 5xx and connection errors per second</title></path>`);
  parts.push(...killMarks(f, x, kills));
  parts.push("</svg>");
  return parts.join("");
}

/** P50 and P99 of Reserve per scrape interval over the run (log scale), with the limit and the kills. */
function svgReserveSeries(series: readonly ReserveInterval[], kills: Array<{ second: number; label: string }>, limitMs: number, seconds: number): string {
  const f = frame(1140, 200, { left: 52, top: 14, bottom: 26 });
  const { W, H, left, top, plotW, plotH } = f;
  const minMs = 0.5;
  const maxMs = 10_000;
  const n = Math.max(1, seconds, ...series.map((p) => p.second));
  const x = (s: number) => left + (s / n) * plotW;
  const y = (ms: number) => top + plotH - ((Math.log10(Math.min(maxMs, Math.max(minMs, ms))) - Math.log10(minMs)) / (Math.log10(maxMs) - Math.log10(minMs))) * plotH;
  const parts = [`<svg viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="Reserve latency over time">`];
  for (const ms of [1, 10, 100, 1000, 10000]) {
    parts.push(`<line x1="${left}" y1="${y(ms).toFixed(1)}" x2="${left + plotW}" y2="${y(ms).toFixed(1)}" class="grid"/>`);
    parts.push(`<text x="${left - 4}" y="${(y(ms) + 3).toFixed(1)}" class="ax" text-anchor="end">${esc(fmtMs(ms).replace(".0 ", " "))}</text>`);
  }
  parts.push(...timeAxis(f, x, n));
  parts.push(
    `<line x1="${left}" y1="${y(limitMs).toFixed(1)}" x2="${left + plotW}" y2="${y(limitMs).toFixed(1)}" stroke="#000" stroke-dasharray="6 3"><title>limit ${fmtMs(limitMs)}</title></line>`,
  );
  const line = (pick: (p: ReserveInterval) => number, color: string, title: string) =>
    `<path d="${series.map((p, i) => `${i === 0 ? "M" : "L"}${x(p.second).toFixed(1)},${y(pick(p)).toFixed(1)}`).join("")}" fill="none" stroke="${color}" stroke-width="1.4"><title>${title}</title></path>` +
    series
      .map(
        (p) =>
          `<circle cx="${x(p.second).toFixed(1)}" cy="${y(pick(p)).toFixed(1)}" r="2" fill="${color}"><title>${p.second}s: ${title} ${fmtMs(pick(p))} (${p.count} transactions)</title></circle>`,
      )
      .join("");
  parts.push(line((p) => p.p50Ms, "#1565c0", "P50"));
  parts.push(line((p) => p.p99Ms, "#c62828", "P99"));
  parts.push(...killMarks(f, x, kills));
  parts.push("</svg>");
  return parts.join("");
}

export function renderHtml(report: GateReport): string {
  const bounds = report.latency.clientBoundsMs;
  const clientCharts = (Object.entries(report.latency.client) as Array<[OutcomeClass, Distribution]>)
    .filter(([, d]) => d.count > 0)
    .map(([outcome, d]) => {
      const bars: Bar[] = d.buckets.map((count, i) => ({ fromMs: i === 0 ? bounds[0]! / 1.26 : bounds[i - 1]!, toMs: bounds[i]!, count }));
      const chart = svgHistogram(bars, {
        color: COLORS[outcome],
        minMs: 0.1,
        maxMs: 100_000,
        title: `${OUTCOME_LABELS[outcome]}: ${d.count.toLocaleString("en-US")}`,
        markers: [
          { ms: d.p50Ms, label: "P50", color: "#333" },
          { ms: d.p99Ms, label: "P99", color: "#c62828" },
        ],
      });
      return `<figure>${chart}<figcaption>P50 ${fmtMs(d.p50Ms)} · P90 ${fmtMs(d.p90Ms)} · P99 ${fmtMs(d.p99Ms)} · P99.9 ${fmtMs(d.p999Ms)} · max ${fmtMs(d.maxMs)}</figcaption></figure>`;
    })
    .join("\n");

  const reserve = report.latency.reserve;
  const finite = reserve.histogram.filter((b): b is { le: number; count: number } => typeof b.le === "number");
  const reserveBars: Bar[] = [];
  let prevLe = 0;
  let prevCount = 0;
  for (const b of finite) {
    reserveBars.push({
      fromMs: prevLe === 0 ? (b.le * 1000) / 2 : prevLe * 1000,
      toMs: b.le * 1000,
      count: b.count - prevCount,
      label: `${fmtMs(prevLe * 1000)} – ${fmtMs(b.le * 1000)}`,
    });
    prevLe = b.le;
    prevCount = b.count;
  }
  const inf = reserve.histogram.find((b) => b.le === "+Inf");
  if (inf && prevLe > 0) reserveBars.push({ fromMs: prevLe * 1000, toMs: prevLe * 2000, count: inf.count - prevCount, label: `> ${fmtMs(prevLe * 1000)}` });
  const reserveChart = svgHistogram(reserveBars, {
    color: "#00695c",
    minMs: 0.5,
    maxMs: 10_000,
    title: `Reserve transactions: ${reserve.count.toLocaleString("en-US")}, ${reserve.scrapes} coordinator lives`,
    markers: [
      { ms: reserve.p99Ms, label: `P99 ${fmtMs(reserve.p99Ms)}`, color: "#c62828" },
      { ms: reserve.limitMs, label: `limit ${fmtMs(reserve.limitMs)}`, color: "#000" },
    ],
  });

  const startMs = Date.parse(report.startedAt) + report.phases.startupSeconds * 1000;
  const kills = report.chaos.events.filter((e) => e.killedAt).map((e) => ({ second: (Date.parse(e.killedAt!) - startMs) / 1000, label: `kill ${e.target}` }));

  const criteria = report.criteria
    .map(
      (c) =>
        `<tr class="${c.pass ? "pass" : "fail"}"><td>${esc(c.name)}${c.source === "supplementary" ? ' <span class="sup">supplementary</span>' : ""}</td><td>${esc(c.measured)}</td><td>${esc(c.threshold)}</td><td class="r">${c.pass ? "PASS" : "FAIL"}</td></tr>`,
    )
    .join("\n");
  const details = report.criteria.map((c) => `<details><summary>${esc(c.name)}</summary><pre>${esc(JSON.stringify(c.detail, null, 2))}</pre></details>`).join("\n");
  const facts = report.facts.map((f) => `<tr><th>${esc(f.name)}</th><td>${esc(f.value)}</td></tr>`).join("\n");
  const events = report.chaos.events
    .map(
      (e) =>
        `<tr><td>${esc(e.target)}</td><td>${esc(e.killedAt ?? "not reached")}</td><td>${(e.requestsSent ?? 0).toLocaleString("en-US")}</td><td>${e.downMs !== undefined ? fmtMs(e.downMs) : "–"}</td><td>${e.restartMs !== undefined ? fmtMs(e.restartMs) : "–"}</td><td>${esc(e.error ?? "")}</td></tr>`,
    )
    .join("\n");
  const statuses = Object.entries(report.load.byStatus)
    .sort()
    .map(([s, n]) => `${s}: ${n.toLocaleString("en-US")}`)
    .join(" · ");
  const samples = Object.keys(report.samples).length ? `<h2>Violations (examples)</h2><pre>${esc(JSON.stringify(report.samples, null, 2))}</pre>` : "";

  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${esc(report.title)}: ${report.passed ? "PASSED" : "FAILED"}</title>
<style>
${reportStyle(report.passed)}
.sup{font-size:11px;color:#666;border:1px solid #ccc;border-radius:3px;padding:0 4px}
figcaption{font-size:12px;color:#555;margin-left:46px}svg .axis{stroke:#999}
pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:12px;max-height:420px}
</style></head><body>
<h1>${esc(report.title)} <span class="verdict">${report.passed ? "PASSED" : "FAILED"}</span></h1>
<div class="muted">${esc(report.contract)} · ${esc(report.startedAt)} · ${formatDuration(report.durationSeconds * 1000)} · ${report.load.httpRequests.toLocaleString("en-US")} HTTP requests, ${report.load.logicalRequests.toLocaleString("en-US")} logical requests, ${report.load.requestsPerSecond.toFixed(0)} requests/s</div>
<h2>The gate</h2>
<table><tr><th>criterion</th><th>measured</th><th>threshold</th><th>result</th></tr>
${criteria}
</table>
${details}
<h2>The run</h2>
<table>${facts}
<tr><th>answers by status</th><td>${esc(statuses)}</td></tr>
<tr><th>sends by kind</th><td>${esc(
    Object.entries(report.load.byKind)
      .map(([k, n]) => `${k} ${n.toLocaleString("en-US")}`)
      .join(" · "),
  )}</td></tr>
<tr><th>sends by body</th><td>${esc(
    Object.entries(report.load.byVariant)
      .map(([k, n]) => `${k} ${n.toLocaleString("en-US")}`)
      .join(" · "),
  )}</td></tr>
<tr><th>phases</th><td>start ${formatDuration(report.phases.startupSeconds * 1000)} · load ${formatDuration(report.phases.loadSeconds * 1000)} · settle ${formatDuration(report.phases.settleSeconds * 1000)} · measure ${formatDuration(report.phases.measureSeconds * 1000)}</td></tr>
</table>
<h2>Throughput and kills</h2>
${svgTimeline(report.load.timeline, kills)}
<div class="muted">blue: HTTP requests completed per second; red: those that were 503, 5xx or connection errors; dashed: SIGKILLs. Connection attempts refused while the service was down are not drawn (${report.load.refusedConnections.toLocaleString("en-US")} in all).</div>
<table><tr><th>killed</th><th>at</th><th>after requests</th><th>down for</th><th>restart took</th><th></th></tr>${events}</table>
<h2>Reservation latency (server side)</h2>
<p class="muted">idem_registry_transaction_seconds{transaction="reserve"} from the coordinator's /metrics, scraped before each of its kills and at the end, summed. The whole Reserve RPC (idem_rpc_duration_seconds, pool wait and queueing included): P50 ${fmtMs(report.latency.reserveRpc.p50Ms)}, P99 ${fmtMs(report.latency.reserveRpc.p99Ms)}.</p>
${svgReserveSeries(reserve.series, kills, reserve.limitMs, report.phases.loadSeconds + report.phases.settleSeconds)}
<div class="muted">P50 (blue) and P99 (red) of the Reserve transactions of each scrape interval (about 5 s); dashed horizontal: the limit; dashed vertical: SIGKILLs.</div>
<figure>${reserveChart}<figcaption>P50 ${fmtMs(reserve.p50Ms)} · P90 ${fmtMs(reserve.p90Ms)} · P99 ${fmtMs(reserve.p99Ms)} · P99.9 ${fmtMs(reserve.p999Ms)} (interpolated in the histogram's buckets)</figcaption></figure>
<h2>End-to-end latency by outcome (client side)</h2>
<div class="figs">
${clientCharts}
</div>
<h2>Environment and options</h2>
<pre>${esc(JSON.stringify({ environment: report.environment, options: report.options }, null, 2))}</pre>
${samples}
</body></html>
`;
}
