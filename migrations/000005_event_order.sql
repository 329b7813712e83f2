-- Event ids come from a sequence, so a transaction can commit an event with a
-- lower id after a reader has seen a higher one. Each event also records the
-- id of its transaction: a reader takes only events of transactions that
-- ended (below the snapshot's xmin), in (transaction, event) order, and
-- resumes after the last pair it saw, so that no event is ever skipped.
ALTER TABLE idem_event ADD COLUMN txid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX idem_event_in_commit_order ON idem_event (txid, event_id);
DROP INDEX idem_event_in_order;
