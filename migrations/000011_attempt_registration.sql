-- Each effect attempt remembers the RecordEffectAttempt call that registered
-- it: a call whose COMMIT answer was lost with its connection is run again by
-- the coordinator, and finds its own attempt instead of registering a second
-- one. Older attempts have none.
ALTER TABLE idem_effect_attempt ADD COLUMN registration_id uuid;
