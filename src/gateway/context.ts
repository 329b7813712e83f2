import { parseJsonBody } from "./http.js";
import { OwnedOperation, type OwnedOperationInit } from "./operation.js";
import type { Decision } from "../contract/words.js";
import type { IdempotentRoute } from "./route.js";
import type { Subject } from "./types.js";

/** What the gateway knows of a request when it hands the handler its context. */
export interface ContextFacts {
  route: IdempotentRoute;
  subject: Subject | undefined;
  key: string;
  decision: Decision | undefined;
  enforced: boolean;
  body: Uint8Array;
}

/**
 * What a business handler gets for one request: who it is for, the
 * operation it owns (id and generation), the request body, and the helpers
 * that keep the contract: `effect()` around every downstream call and, in
 * co-located mode, `transaction()` to commit the business rows with the
 * terminal state.
 */
export class IdempotencyContext extends OwnedOperation {
  /** The Idempotency-Key ("" when the route runs without one). */
  readonly idempotencyKey: string;
  /** The end user (from the service's authentication). */
  readonly subject: Subject | undefined;
  readonly operation: string;
  readonly apiRevision: number;
  /** Reserve's decision; ACCEPTED unless in shadow mode. */
  readonly decision: Decision | undefined;
  /** False in shadow mode (or without a key): the handler runs whatever the decision. */
  readonly enforced: boolean;
  /** The request body as received (the bytes that were fingerprinted). */
  readonly body: Buffer;

  constructor(init: OwnedOperationInit, facts: ContextFacts) {
    super(init);
    this.idempotencyKey = facts.key;
    this.subject = facts.subject;
    this.operation = facts.route.operation;
    this.apiRevision = facts.route.apiRevision;
    this.decision = facts.decision;
    this.enforced = facts.enforced;
    this.body = Buffer.from(facts.body.buffer, facts.body.byteOffset, facts.body.byteLength);
  }

  /**
   * The body parsed as JSON. A body that is not JSON throws MalformedJsonBody
   * (what is wrong, and where); left uncaught, the gateway answers it 400.
   */
  json<T = unknown>(): T {
    return parseJsonBody(this.body) as T;
  }
}
