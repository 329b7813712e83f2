import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Criterion } from "../lib/criterion.js";
import { esc, reportStyle } from "../lib/html.js";
import { formatDuration } from "../lib/format.js";
import type { Point } from "./judge.js";
import type { StatementRate, WindowComparison } from "./compare.js";
import type { GeneratorSample, MachineSample, RegistrySample, SampledLife } from "./sampler.js";

/** What the soak keeps of a run: the verdict, the lines, and the time series the charts draw. */
export interface SoakReport {
  passed: boolean;
  startedAt: string;
  durationSeconds: number;
  options: Record<string, unknown>;
  /** Every line: the gate's and the soak's own. */
  criteria: Criterion[];
  facts: Array<{ name: string; value: string }>;
  /** The latency of the answers per window: start of the window (ms since the load began), P50, P99, the P99 without the answers sent while a killed process recovered (as the P99 line judges it), count. */
  windows: Array<{ fromMs: number; p50Ms: number; p99Ms: number; steadyP99Ms?: number; count: number }>;
  /** Answered and failed requests per second since the load began. */
  timeline: Array<[number, number]>;
  lives: SampledLife[];
  registry: RegistrySample[];
  machine: MachineSample[];
  /** The soak's own process, which sends the load and times the answers. */
  generator: GeneratorSample[];
  /** The first and last windows of the P99 line side by side: where the answers' time went. */
  comparison: WindowComparison;
  /** Faults as they happened: when (ms since the load began) and what. */
  faults: Array<{ atMs: number; what: string }>;
  loadStartedAt: number;
}

export async function writeSoakReport(report: SoakReport, outDir: string): Promise<{ json: string; html: string }> {
  await mkdir(outDir, { recursive: true });
  const json = join(outDir, "soak.json");
  const html = join(outDir, "soak.html");
  await writeFile(json, `${JSON.stringify(report, null, 2)}\n`);
  await writeFile(html, renderSoakHtml(report));
  return { json, html };
}

const PALETTE = ["#1565c0", "#c62828", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#5d4037", "#ad1457", "#37474f"];

/** Lines over time as inline SVG: x in minutes since the load began, fault marks along the top. */
function lineChart(title: string, unit: string, series: Array<{ name: string; points: readonly Point[] }>, origin: number, faults: SoakReport["faults"]): string {
  const W = 560;
  const legendRows = Math.ceil(new Set(series.map((s) => s.name)).size / 4);
  const H = 200 + 12 * legendRows;
  const left = 56;
  const top = 22;
  const plotW = W - left - 12;
  const plotH = H - top - 30 - 12 * legendRows;
  // One color and one legend entry per name: a process's lives share its name.
  const names = [...new Set(series.map((s) => s.name))];
  const all = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p.v));
  if (all.length === 0) return `<figure><figcaption>${esc(title)}: no samples</figcaption></figure>`;
  const minT = origin;
  const maxT = Math.max(origin + 60_000, ...all.map((p) => p.t));
  const maxV = Math.max(...all.map((p) => p.v)) * 1.08 || 1;
  const x = (t: number) => left + ((t - minT) / (maxT - minT)) * plotW;
  const y = (v: number) => top + plotH - (v / maxV) * plotH;
  const parts = [
    `<svg viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" role="img" aria-label="${esc(title)}">`,
    `<text x="${left}" y="14" class="t">${esc(title)} (${esc(unit)})</text>`,
  ];
  for (let i = 0; i <= 4; i++) {
    const v = (maxV * i) / 4;
    parts.push(`<line x1="${left}" x2="${left + plotW}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" class="grid"/>`);
    parts.push(`<text x="${left - 4}" y="${(y(v) + 3).toFixed(1)}" class="ax" text-anchor="end">${v >= 100 ? Math.round(v) : v.toFixed(1)}</text>`);
  }
  const minutes = (maxT - minT) / 60_000;
  const step = Math.max(1, Math.ceil(minutes / 10));
  for (let m = 0; m <= minutes; m += step) parts.push(`<text x="${x(minT + m * 60_000).toFixed(1)}" y="${top + plotH + 14}" class="ax" text-anchor="middle">${m} min</text>`);
  for (const fault of faults)
    parts.push(
      `<line x1="${x(origin + fault.atMs).toFixed(1)}" x2="${x(origin + fault.atMs).toFixed(1)}" y1="${top}" y2="${top + 5}" stroke="#999"><title>${esc(fault.what)}</title></line>`,
    );
  const colorOf = (name: string) => PALETTE[names.indexOf(name) % PALETTE.length]!;
  for (const s of series) {
    const d = s.points
      .filter((p) => Number.isFinite(p.v))
      .map((p, j) => `${j === 0 ? "M" : "L"}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`)
      .join("");
    parts.push(`<path d="${d}" fill="none" stroke="${colorOf(s.name)}" stroke-width="1.3"/>`);
  }
  names.forEach((name, i) =>
    parts.push(`<text x="${left + (i % 4) * 130}" y="${top + plotH + 30 + Math.floor(i / 4) * 12}" class="ax" fill="${colorOf(name)}">■ ${esc(name)}</text>`),
  );
  parts.push("</svg>");
  return `<figure>${parts.join("")}</figure>`;
}

export function renderSoakHtml(report: SoakReport): string {
  const origin = report.loadStartedAt;
  const perLife = (pick: (life: SampledLife) => readonly Point[] | undefined, scale = 1) =>
    report.lives.flatMap((life) => {
      const points = pick(life);
      return points && points.length > 0 ? [{ name: life.process, points: points.map((p) => ({ t: p.t, v: p.v / scale })) }] : [];
    });
  const fromSamples = (pick: (sample: SampledLife["samples"][number]) => number | undefined) => (life: SampledLife) =>
    life.samples.flatMap((s) => {
      const v = pick(s);
      return v === undefined || !Number.isFinite(v) ? [] : [{ t: s.t, v }];
    });
  // From one sample to the next: the CPU time used over the time between them.
  const cpuShare = (samples: ReadonlyArray<{ t: number; cpuSeconds: number }>) =>
    samples.slice(1).flatMap((s, i) => {
      const before = samples[i]!;
      return s.t > before.t ? [{ t: s.t, v: (100 * 1000 * (s.cpuSeconds - before.cpuSeconds)) / (s.t - before.t) }] : [];
    });
  const registry = (pick: (sample: RegistrySample) => number) => report.registry.map((s) => ({ t: s.t, v: pick(s) }));
  const tables = [...new Set(report.registry.flatMap((s) => Object.keys(s.bytes)))].sort();
  const chart = (title: string, unit: string, series: Array<{ name: string; points: readonly Point[] }>) => lineChart(title, unit, series, origin, report.faults);
  const charts = [
    chart("Latency of the answers per window", "ms", [
      { name: "P50", points: report.windows.map((w) => ({ t: origin + w.fromMs, v: w.p50Ms })) },
      { name: "P99", points: report.windows.map((w) => ({ t: origin + w.fromMs, v: w.p99Ms })) },
      { name: "P99, kills' recoveries left out", points: report.windows.flatMap((w) => (w.steadyP99Ms === undefined ? [] : [{ t: origin + w.fromMs, v: w.steadyP99Ms }])) },
    ]),
    chart("Requests per second", "requests/s", [
      { name: "answered", points: report.timeline.map(([ok], s) => ({ t: origin + s * 1000, v: ok })) },
      { name: "failed (503, 5xx, connection)", points: report.timeline.map(([, failed], s) => ({ t: origin + s * 1000, v: failed })) },
    ]),
    chart(
      "RSS per process",
      "MB",
      perLife((l) => l.rss, 1e6),
    ),
    chart(
      "V8 heap used, coordinators",
      "MB",
      perLife((l) => l.heap, 1e6),
    ),
    chart(
      "Open descriptors per process",
      "descriptors",
      perLife((l) => l.fds),
    ),
    chart("Sockets per process", "sockets", perLife(fromSamples((s) => s.sockets))),
    chart(
      "libuv handles, coordinators",
      "handles",
      perLife((l) => l.handles),
    ),
    chart(
      "CPU per process, share of one core",
      "%",
      perLife((life) => cpuShare(life.samples)),
    ),
    chart("Machine CPU", "cores", [
      { name: "busy", points: report.machine.map((m) => ({ t: m.t, v: m.busyCores })) },
      { name: "the soak's processes", points: report.machine.map((m) => ({ t: m.t, v: m.soakCores })) },
      { name: "stolen by the hypervisor", points: report.machine.map((m) => ({ t: m.t, v: m.stolenCores ?? 0 })) },
    ]),
    chart("Event-loop delay P99, coordinators", "ms", perLife(fromSamples((s) => s.eventLoopP99Ms))),
    chart("Load generator (this process): event-loop delay and CPU", "ms, % of a core", [
      { name: "event-loop delay P99", points: report.generator.map((g) => ({ t: g.t, v: g.eventLoopP99Ms })) },
      { name: "CPU", points: cpuShare(report.generator) },
    ]),
    chart("Registry pool: checked out", "connections", perLife(fromSamples((s) => (s.poolTotal === undefined ? undefined : s.poolTotal - s.poolIdle!)))),
    chart("Registry pool: waiting", "requests", perLife(fromSamples((s) => s.poolWaiting))),
    chart(
      "Table size with indexes",
      "MB",
      tables.map((name) => ({ name, points: registry((s) => (s.bytes[name] ?? 0) / 1e6) })),
    ),
    chart(
      "Dead tuples",
      "rows",
      tables.map((name) => ({ name, points: registry((s) => s.deadTuples[name] ?? 0) })),
    ),
    chart("Event log and tombstones", "rows", [
      { name: "events", points: registry((s) => s.events) },
      { name: "tombstones", points: registry((s) => s.tombstones) },
    ]),
    chart("UNKNOWN queue, sweep backlog, backends", "count", [
      { name: "UNKNOWN records", points: registry((s) => s.unknown) },
      { name: "past retention, not swept", points: registry((s) => s.overdue) },
      { name: "client backends", points: registry((s) => s.backends) },
    ]),
  ];
  const rows = report.criteria
    .map(
      (c) =>
        `<tr class="${c.pass ? "pass" : "fail"}"><td>${esc(c.name)}</td><td>${esc(c.measured)}</td><td>${esc(c.threshold)}</td><td class="r">${c.pass ? "PASS" : "FAIL"}</td></tr>`,
    )
    .join("");
  const facts = report.facts.map((f) => `<tr><td>${esc(f.name)}</td><td>${esc(f.value)}</td></tr>`).join("");
  const { comparison } = report;
  const figure = (v: number | undefined) => (v === undefined ? "–" : v >= 100 ? v.toFixed(0) : v.toPrecision(3));
  const change = (first: number | undefined, last: number | undefined) => (first && last !== undefined ? `${((last / first) * 100).toFixed(0)} %` : "");
  const compared = comparison.figures
    .map(
      (f) =>
        `<tr><td>${esc(f.name)}</td><td class="r">${figure(f.first)}</td><td class="r">${figure(f.last)}</td><td>${esc(f.unit)}</td><td class="r">${change(f.first, f.last)}</td></tr>`,
    )
    .join("");
  const rate = (r: StatementRate | undefined) =>
    r
      ? `<td class="r">${figure(r.callsPerSecond)}</td><td class="r">${figure(r.rowsPerCall)}</td><td class="r">${figure(r.meanMs)}</td><td class="r">${figure(r.msPerSecond)}</td>`
      : `<td></td><td></td><td></td><td></td>`;
  const statements = comparison.statements.map((s) => `<tr><td><code>${esc(s.query)}</code></td>${rate(s.first)}${rate(s.last)}</tr>`).join("");
  const faults = report.faults.map((f) => `<tr><td>${formatDuration(f.atMs)}</td><td>${esc(f.what)}</td></tr>`).join("");
  const verdict = report.passed ? "PASSED" : "FAILED";
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Soak: ${verdict}</title>
<style>
${reportStyle(report.passed)}
</style></head><body>
<h1>Soak <span class="verdict">${verdict}</span></h1>
<div class="muted">${esc(report.startedAt)} · ${formatDuration(report.durationSeconds * 1000)} · ${esc(JSON.stringify(report.options))}</div>
<h2>Lines</h2>
<table><thead><tr><th>line</th><th>measured</th><th>threshold</th><th></th></tr></thead><tbody>${rows}</tbody></table>
<h2>Facts</h2>
<table><tbody>${facts}</tbody></table>
<h2>First and last windows</h2>
<p class="muted">The windows the P99 line compares (${formatDuration(comparison.first.to - comparison.first.from)} from ${formatDuration(comparison.first.from - origin)}, and ${formatDuration(comparison.last.to - comparison.last.from)} from ${formatDuration(comparison.last.from - origin)}), kills' recoveries included: where the answers' time went.</p>
<table><thead><tr><th>figure</th><th>first</th><th>last</th><th>unit</th><th>last / first</th></tr></thead><tbody>${compared}</tbody></table>
<h3>Registry statements (pg_stat_statements)</h3>
<table><thead><tr><th></th><th colspan="4">first window</th><th colspan="4">last window</th></tr>
<tr><th>statement</th><th>calls/s</th><th>rows per call</th><th>ms per call</th><th>ms/s</th><th>calls/s</th><th>rows per call</th><th>ms per call</th><th>ms/s</th></tr></thead><tbody>${statements || `<tr><td colspan="9">not sampled (pg_stat_statements not preloaded)</td></tr>`}</tbody></table>
<h2>Over time</h2>
<p class="muted">Minutes since the load began; the ticks along the top of each chart are the faults (hover for which). A process's lives share its color: a line that breaks off is a process killed, the next one its restart.</p>
<div class="figs">${charts.join("\n")}</div>
<h2>Faults</h2>
<table><thead><tr><th>at</th><th>what</th></tr></thead><tbody>${faults}</tbody></table>
</body></html>
`;
}
