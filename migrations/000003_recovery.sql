-- Finds the records a recovery worker or the recoverer must look at: unfinished
-- ones by when their lease ended (UNKNOWN records keep the lease that ended).
-- Not on the request path, so it need not lead with the tenant.
CREATE INDEX idem_record_by_lease_end
    ON idem_record (lease_expires_at, tenant_id, operation_id)
    WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN');
