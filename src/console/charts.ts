import uPlot from "uplot";
import type { ChartSeries } from "../gen/idempotency/v1/admin_pb.js";
import { age, h } from "./dom.js";

/** The charts' colours: the page's accent for the line, its muted ink for the axes (WCAG AA on white). */
const LINE = "#1a4fb5";
const AREA = "rgba(26, 79, 181, 0.12)";
const AXIS = "#4b5366";
const GRID = "#d5d9e2";
const HEIGHT = 110;

/** The plots drawn in each container, to let go of when it is drawn anew, and what resizes them with it. */
const drawn = new WeakMap<Element, { plots: uPlot[]; resizer: ResizeObserver }>();

/**
 * Draws one small chart per series in `container`, over the buckets that
 * begin at `bucketStarts` (seconds since the epoch, the last one in
 * progress): uPlot on a canvas, with a caption saying the current value and
 * a text summary for screen readers. Each chart is as wide as its place in
 * the grid, also when that place is still hidden while its view loads.
 */
export function drawCharts(container: HTMLElement, series: readonly ChartSeries[], minutes: number, bucketStarts: readonly number[]): void {
  const earlier = drawn.get(container);
  earlier?.resizer.disconnect();
  for (const plot of earlier?.plots ?? []) plot.destroy();
  const last = bucketStarts.at(-1) ?? 0;
  // Minutes before the bucket in progress: the axis reads "−10 min" to "now".
  const x = bucketStarts.map((start) => (start - last) / 60);
  const figures = series.map((s) => figure(s, minutes));
  container.replaceChildren(...figures.map((f) => f.element));
  const plots = figures.map(({ plot, values }) => new uPlot(options(plot.clientWidth), [x, values], plot));
  const resizer = new ResizeObserver((entries) => {
    for (const entry of entries) plots[figures.findIndex((f) => f.plot === entry.target)]?.setSize({ width: Math.floor(entry.contentRect.width), height: HEIGHT });
  });
  for (const { plot } of figures) resizer.observe(plot);
  drawn.set(container, { plots, resizer });
}

/** A chart's figure: its caption, and the element its plot is drawn in, named for screen readers by its summary. */
function figure(series: ChartSeries, minutes: number): { element: HTMLElement; plot: HTMLElement; values: number[] } {
  const values = series.values;
  const max = Math.max(...values, 0);
  const now = values.at(-1) ?? 0;
  const rate = series.unit === "per second";
  const shown = (v: number) => (series.unit === "seconds" ? age(v) : format(v) + (rate ? "/s" : ""));
  const summary = `${series.title}${rate ? " per second" : ""} over the last ${minutes} minutes: now ${shown(now)}, highest ${shown(max)}`;
  const plot = h("div", { class: "plot", role: "img", "aria-label": summary, "data-series": series.key });
  const element = h(
    "figure",
    { class: "chart", "data-testid": `chart-${series.key}` },
    h("figcaption", {}, h("span", {}, series.title + (rate ? " /s" : "")), h("small", { "data-testid": "chart-now" }, `now ${shown(now)}`)),
    plot,
  );
  return { element, plot, values };
}

function options(width: number): uPlot.Options {
  const font = "10px system-ui, sans-serif";
  return {
    width: Math.max(width, 1),
    height: HEIGHT,
    legend: { show: false },
    cursor: { show: false },
    scales: {
      x: { time: false },
      // From zero, up to a round value above the highest (1 when all are zero).
      y: { range: (_u, _min, max) => [0, max > 0 ? niceCeiling(max) : 1] },
    },
    axes: [
      { stroke: AXIS, font, size: 22, grid: { show: false }, ticks: { stroke: GRID }, values: (_u, splits) => splits.map((m) => (m === 0 ? "now" : `−${-m} min`)) },
      { stroke: AXIS, font, size: 34, grid: { stroke: GRID, dash: [3, 3] }, ticks: { show: false }, values: (_u, splits) => splits.map(format) },
    ],
    series: [{}, { stroke: LINE, width: 2, fill: AREA, points: { show: false } }],
  };
}

function niceCeiling(v: number): number {
  const magnitude = Math.pow(10, Math.floor(Math.log10(v)));
  for (const step of [1, 2, 5, 10]) if (step * magnitude >= v) return step * magnitude;
  return 10 * magnitude;
}

const format = (v: number) => (v >= 100 ? String(Math.round(v)) : String(Math.round(v * 100) / 100));
