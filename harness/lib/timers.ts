import { setTimeout as sleep } from "node:timers/promises";

/**
 * Waits `ms`, or until `signal` aborts, whichever comes first. An abort ends
 * the wait without an error: the loops that wait check the signal themselves
 * and wind down (a client gives up, the settling stops), which a rejection
 * in every one of them would only get in the way of.
 */
export async function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  await sleep(ms, undefined, signal ? { signal } : {}).catch((error: unknown) => {
    if (!signal?.aborted) throw error;
  });
}
