-- Staged uploads (applied by Alembic revision 0002): one row per staging object, written by the API BEFORE
-- the object is PUT, dated by the database's clock. The staging sweep works from this table only — it never
-- lists the bucket and never compares an S3 LastModified or a role's clock with anything:
--   * record_upload deletes the row when it records the attachment (the object is now the attachment's);
--   * a row still here after STAGING_RETENTION_SECONDS (by now()) is an upload that was never recorded: the
--     sweeper dooms it (doomed_at), deletes the object, then the row; record_upload refuses a doomed row;
--   * releasing a failed job's original inserts a doomed row for its key.
CREATE TABLE staged_uploads (
    object_key text        PRIMARY KEY,
    staged_at  timestamptz NOT NULL DEFAULT now(),
    doomed_at  timestamptz
);
CREATE INDEX staged_uploads_due ON staged_uploads (staged_at) WHERE doomed_at IS NULL;
CREATE INDEX staged_uploads_doomed ON staged_uploads (doomed_at) WHERE doomed_at IS NOT NULL;
