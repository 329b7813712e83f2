-- Snapshot bodies may be sealed (AES-256-GCM) under a key of the configured
-- key ring; the key's id is kept beside the body so that rotated keys still
-- open old bodies. NULL: stored without a key ring (plaintext).
ALTER TABLE idem_record ADD COLUMN snapshot_key_id text;
