-- A Reserve's statements and its COMMIT travel in one round trip: nothing can
-- be decided between the principal's quota count and the COMMIT. The count
-- itself refuses: over the quota it raises IDQ01, which aborts the
-- transaction, so that the COMMIT behind it rolls the new record back.
CREATE FUNCTION idem_within_quota(active integer, quota integer) RETURNS integer
    LANGUAGE plpgsql AS $$
BEGIN
    IF active > quota THEN
        RAISE EXCEPTION USING ERRCODE = 'IDQ01', MESSAGE = format('the principal has %s unfinished records, over its quota of %s', active, quota);
    END IF;
    RETURN active;
END
$$;
