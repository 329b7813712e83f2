-- Operation policies and switches. Small reference tables read by every
-- coordinator into its policy cache; written only by operators.

-- One row per published schema revision; rows are never updated or deleted.
CREATE TABLE idem_policy (
    operation       text        NOT NULL,
    api_revision    integer     NOT NULL CHECK (api_revision >= 1),
    schema_revision integer     NOT NULL CHECK (schema_revision >= 1),
    -- The revision with every default filled in (src/policy/document.ts).
    document        jsonb       NOT NULL,
    -- SHA-256 of the document's canonical JSON: republishing equal content is a no-op.
    digest          bytea       NOT NULL CHECK (octet_length(digest) = 32),
    published_at    timestamptz NOT NULL DEFAULT now(),
    published_by    text        NOT NULL,
    PRIMARY KEY (operation, api_revision, schema_revision)
);

CREATE FUNCTION idem_policy_is_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'published policy revisions never change; publish a higher revision'
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER idem_policy_immutable
    BEFORE UPDATE OR DELETE ON idem_policy
    FOR EACH ROW EXECUTE FUNCTION idem_policy_is_immutable();

-- The operational switches of an operation; its row is also the lock that
-- serializes publications of the operation's revisions.
CREATE TABLE idem_operation (
    operation    text        NOT NULL,
    api_revision integer     NOT NULL CHECK (api_revision >= 1),
    mode         text        NOT NULL DEFAULT 'ENFORCE' CHECK (mode IN ('ENFORCE', 'SHADOW', 'DRAINING')),
    writer_epoch bigint      NOT NULL DEFAULT 0 CHECK (writer_epoch >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text        NOT NULL,
    PRIMARY KEY (operation, api_revision)
);
