import { HOOK_POINTS, type FaultHooks, type HookPoint } from "./fault-hooks.js";

/**
 * Fault hooks that act where they are armed, for the fault suite, the launch
 * gate and outage rehearsals; nothing in production builds one. A process
 * gets them only by being handed them (src/fault-hooks.ts).
 */

export type FailpointAction = { kind: "kill" } | { kind: "fail" } | { kind: "pause"; ms: number };

interface Armed {
  action: FailpointAction;
  once: boolean;
  /** Settles when the point is first reached, before its action runs. */
  onReached: () => void;
}

/**
 * Hooks that act where they are armed: `kill` (SIGKILL this process, like a
 * crash: no cleanup, no flushing), `fail` (throw), `pause(ms)`. Unarmed, a
 * point costs one lookup in an empty map.
 */
export class Failpoints implements FaultHooks {
  private readonly armed = new Map<HookPoint, Armed>();

  /**
   * Failpoints armed from a specification such as
   * `registry.complete.after-commit=kill,gateway.effect.after-call=once:pause(2000)`
   * (`once:` disarms the point after its first hit); throws with what is wrong.
   */
  static fromSpec(spec: string): Failpoints {
    const failpoints = new Failpoints();
    for (const entry of spec
      .split(",")
      .map((e) => e.trim())
      .filter((e) => e.length > 0)) {
      const match = /^([a-z.-]+)=(once:)?(kill|fail|pause\((\d+)\))$/.exec(entry);
      if (!match || !HOOK_POINTS.includes(match[1] as HookPoint)) {
        throw new Error(`'${entry}' is not point=action with a point among ${HOOK_POINTS.join(", ")} and an action kill, fail or pause(ms), optionally once:`);
      }
      const action: FailpointAction = match[3] === "kill" ? { kind: "kill" } : match[3] === "fail" ? { kind: "fail" } : { kind: "pause", ms: Number(match[4]) };
      void failpoints.arm(match[1] as HookPoint, action, { once: match[2] !== undefined });
    }
    return failpoints;
  }

  /** Arms a point; the promise settles when it is first reached, so that a test acts exactly while a pause lasts. */
  arm(point: HookPoint, action: FailpointAction, options: { once?: boolean } = {}): Promise<void> {
    let onReached = (): void => undefined;
    const reached = new Promise<void>((resolve) => (onReached = resolve));
    this.armed.set(point, { action, once: options.once ?? false, onReached });
    return reached;
  }

  /** Disarms every point. */
  disarm(): void {
    this.armed.clear();
  }

  isArmed(point: HookPoint): boolean {
    return this.armed.has(point);
  }

  async reached(point: HookPoint): Promise<void> {
    const armed = this.armed.get(point);
    if (!armed) return;
    if (armed.once) this.armed.delete(point);
    armed.onReached();
    switch (armed.action.kind) {
      case "kill":
        process.kill(process.pid, "SIGKILL");
        // SIGKILL is not delivered synchronously everywhere: never run on past the point.
        await new Promise(() => undefined);
        return;
      case "fail":
        throw new Error(`failpoint ${point}`);
      case "pause": {
        const { ms } = armed.action;
        await new Promise((resolve) => setTimeout(resolve, ms));
      }
    }
  }
}
