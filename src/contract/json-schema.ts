/**
 * The field schema of an operation whose fingerprint is computed in JSON mode:
 * which members a request body may have, of which type, and which of them
 * count in the fingerprint. Declared in a policy revision, never changed once
 * published.
 */
export type FieldType = "string" | "boolean" | "integer" | "decimal" | "number" | "object" | "array";

/** How a decimal's scale counts: `10.0` and `10` differ (significant) or not (normalized). */
export type DecimalScale = "significant" | "normalized";

export interface FieldSchema {
  type: FieldType;
  /** `null` is accepted (default false). */
  nullable?: boolean;
  /** A `null` value counts as if the member were absent (default false: they differ). */
  nullEqualsAbsent?: boolean;
  /** False: validated, but left out of the fingerprint (default true). */
  fingerprint?: boolean;
  /** The member must be present in its object (default false). */
  required?: boolean;
  /** decimal only (default significant). */
  scale?: DecimalScale;
  /** object only: every member the object may have; any other member is refused. */
  properties?: Record<string, FieldSchema>;
  /** array only: the schema of every element. */
  items?: FieldSchema;
  /** array only: order does not matter; equal elements are refused (default false). */
  set?: boolean;
}

/** What JSON mode needs from a policy revision. */
export interface JsonRules {
  /** The schema of the whole body. */
  root: FieldSchema;
  /** Deepest nesting of objects and arrays accepted (the root object or array is depth 1). */
  maxDepth: number;
  /** Largest body accepted, in bytes. */
  maxBytes: number;
}
