/**
 * An ordinary problem the operator fixes (a port already taken, a database
 * that cannot be reached): reported as its one-line message, which names the
 * setting to change, and never with a stack trace.
 */
export class OperatorError extends Error {
  override readonly name = "OperatorError";
}
