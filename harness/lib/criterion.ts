/** One line of a run's table (the gate's, the failover scenario's, the soak's), as report.json keeps it. */
export interface Criterion {
  id: string;
  name: string;
  /** The measured value as a number (count, share or milliseconds). */
  value: number;
  /** The measured value as printed. */
  measured: string;
  /** The threshold as printed. */
  threshold: string;
  pass: boolean;
  /** Whether the line comes from the contract's section 9 or is a supplementary check of the gate. */
  source: "contract" | "supplementary";
  detail: Record<string, unknown>;
}
