/**
 * Named failpoints: exact places in the registry and the gateway where a
 * fault test (or an operator rehearsing an outage) makes the process pause,
 * fail, or die by SIGKILL. Unarmed, a failpoint costs one lookup in an empty
 * map. Armed from the environment at start:
 *
 *   IDEM_FAILPOINTS="registry.complete.after-commit=kill,gateway.effect.after-call=pause(2000)"
 *
 * or in-process with armFailpoint(). Actions: `kill` (SIGKILL this process,
 * like a crash: no cleanup, no flushing), `fail` (throw), `pause(ms)`; a
 * `once:` prefix disarms the point after its first hit.
 */
export const FAILPOINTS = [
  /** Reserve accepted a new record and its statement committed; the answer is not sent yet. */
  "registry.reserve.after-commit",
  /** Complete wrote the terminal state; its transaction has not committed. */
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

export type FailpointName = (typeof FAILPOINTS)[number];

export type FailpointAction = { kind: "kill" } | { kind: "fail" } | { kind: "pause"; ms: number };

interface Armed {
  action: FailpointAction;
  once: boolean;
  /** Settles when the point is first reached, before its action runs. */
  onReached: () => void;
}

const armed = new Map<FailpointName, Armed>();

/** Reaches a failpoint: does what it is armed to do, or nothing. */
export async function failpoint(name: FailpointName): Promise<void> {
  if (armed.size === 0) return;
  const point = armed.get(name);
  if (!point) return;
  if (point.once) armed.delete(name);
  point.onReached();
  switch (point.action.kind) {
    case "kill":
      process.kill(process.pid, "SIGKILL");
      // SIGKILL is not delivered synchronously everywhere: never run on past the point.
      await new Promise(() => undefined);
      return;
    case "fail":
      throw new Error(`failpoint ${name}`);
    case "pause":
      await new Promise((resolve) => setTimeout(resolve, point.action.kind === "pause" ? point.action.ms : 0));
  }
}

/**
 * Arms a failpoint in this process (tests). The returned promise settles when
 * the point is first reached, so a test acts exactly while a pause lasts.
 */
export function armFailpoint(name: FailpointName, action: FailpointAction, options: { once?: boolean } = {}): Promise<void> {
  let onReached = (): void => undefined;
  const reached = new Promise<void>((resolve) => (onReached = resolve));
  armed.set(name, { action, once: options.once ?? false, onReached });
  return reached;
}

export function disarmFailpoints(): void {
  armed.clear();
}

/** Parses IDEM_FAILPOINTS; throws with what is wrong. */
export function parseFailpoints(spec: string): Array<{ name: FailpointName; action: FailpointAction; once: boolean }> {
  return spec
    .split(",")
    .map((entry) => entry.trim())
    .filter((entry) => entry.length > 0)
    .map((entry) => {
      const match = /^([a-z.-]+)=(once:)?(kill|fail|pause\((\d+)\))$/.exec(entry);
      if (!match || !FAILPOINTS.includes(match[1] as FailpointName)) {
        throw new Error(`'${entry}' is not name=action with a name among ${FAILPOINTS.join(", ")} and an action kill, fail or pause(ms), optionally once:`);
      }
      const action: FailpointAction = match[3] === "kill" ? { kind: "kill" } : match[3] === "fail" ? { kind: "fail" } : { kind: "pause", ms: Number(match[4]) };
      return { name: match[1] as FailpointName, action, once: match[2] !== undefined };
    });
}

// Armed from the environment once, when the first module that has a failpoint loads.
for (const { name, action, once } of parseFailpoints(process.env.IDEM_FAILPOINTS ?? "")) armFailpoint(name, action, { once });
