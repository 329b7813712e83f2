-- The event log keeps one B-tree, the one its stream reads
-- (idem_event_in_commit_order, migration 5). Its primary key
-- (tenant_id, event_id) gave every event a second entry, at every change of
-- every record, for one reader: a record's timeline in the console, which
-- walked the tenant's whole log backwards through it to find the few
-- events of one operation. That reader now has a BRIN index on the
-- operation id instead: events are appended in time order and name their
-- operation by a time-ordered id (UUIDv7), so each range of the log's pages
-- holds the ids of the operations of its moment (and, as a second cluster
-- that minmax-multi summaries keep apart, the older operations the
-- retention sweep or recovery wrote about then). Appending to the last,
-- unsummarized range of pages writes nothing to the index; VACUUM
-- summarizes the ranges that filled, never the last one. Building the index
-- summarizes every range, the last one too: its summary is removed again,
-- so that appending to it writes nothing from the start (a read of a
-- timeline reads the pages of unsummarized ranges whatever they hold).
--
-- Event ids stay unique by construction (an identity column that nothing
-- overrides); nothing updates or deletes events, so no replica identity is
-- needed beyond none.
ALTER TABLE idem_event DROP CONSTRAINT idem_event_pkey;
CREATE INDEX idem_event_by_operation ON idem_event USING brin (operation_id uuid_minmax_multi_ops);
SELECT brin_desummarize_range('idem_event_by_operation', greatest(pg_relation_size('idem_event') / current_setting('block_size')::bigint - 1, 0));
