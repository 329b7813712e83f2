/**
 * The quota of unfinished records per principal (migrations 9, 13 and 16):
 * each principal's count of unfinished records is kept on its gate row
 * (idem_quota_gate) by the statements that make a record unfinished or
 * finish it, in the same statement as the change (parts.ts countOpened,
 * countClosed and countMany), and the row stays locked until the
 * transaction ends, so that racing reservations count one after another.
 * A statement that makes a record reads the count it left and, over the
 * quota, fails with IDQ01 (idem_count_within_quota), so that the
 * transaction cannot commit the new record. A replay touches no gate and
 * never waits on one.
 */

/** The SQLSTATE of a count over its quota (idem_count_within_quota). */
export const QUOTA_EXCEEDED_SQLSTATE = "IDQ01";
