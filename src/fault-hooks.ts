/**
 * Fault hooks: exact places in the registry and the gateway where a fault
 * test, the launch gate or an operator rehearsing an outage makes a process
 * pause, fail or die. Production code reaches each point through the hooks
 * object it was given, which by default does nothing: there is no switch in
 * the environment or in a module. Whoever wants faults builds a Failpoints
 * object (src/failpoints.ts), arms it, and passes it in (startCoordinator's
 * `hooks`, the gateway's, the recovery worker's and co-located mode's options).
 */
export const HOOK_POINTS = [
  /** Reserve accepted a new record and its statement committed; the answer is not sent yet. */
  "registry.reserve.after-commit",
  /**
   * Complete decided the terminal state under the record's lock; it is written with the COMMIT that follows, not yet.
   * While this point is armed, every Complete decides after its read (two round trips), so that it reaches the point.
   */
  "registry.complete.before-commit",
  /** Complete committed; the answer is not sent yet. */
  "registry.complete.after-commit",
  /** The downstream call succeeded; its attempt is not resolved yet. */
  "gateway.effect.after-call",
  /** Co-located mode: the business rows and the terminal state are written; not committed. */
  "gateway.business.before-commit",
  /** Co-located mode: the business transaction committed; the response is not sent yet. */
  "gateway.business.after-commit",
] as const;

export type HookPoint = (typeof HOOK_POINTS)[number];

/** What production code calls at each hook point. */
export interface FaultHooks {
  /** The point is reached: act (pause, throw, die) or return at once. */
  reached(point: HookPoint): Promise<void> | void;
  /**
   * Whether reaching `point` would act: a path that has no place for the
   * point (Complete in one round trip has none between its decision and its
   * COMMIT) gives way to the path that has. Absent: any point may act.
   */
  isArmed?(point: HookPoint): boolean;
}

/** The hooks of production: nothing happens anywhere. */
export const NO_FAULTS: FaultHooks = { reached: () => undefined, isArmed: () => false };
