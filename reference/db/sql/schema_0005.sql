-- Production expectations of issue 23 (applied by Alembic revision 0005).
--
-- claimed_at: when the current claim began (set by claim_job, kept by adopt_claim and by lease renewals). The
-- sweeper abandons and recovers a claim older than EXECUTION_TIMEOUT_SECONDS whatever its lease says (a deadline
-- per execution, Temporal's start-to-close); NULL for a job claimed before this revision (lease recovery only).
ALTER TABLE jobs ADD COLUMN claimed_at timestamptz;
CREATE INDEX jobs_claims ON jobs (claimed_at) WHERE state = 'processing';

-- Retention (EVENTS_RETENTION_SECONDS, AUDIT_RETENTION_SECONDS): the sweeper finds what is due without a scan.
CREATE INDEX jobs_finished ON jobs (updated_at) WHERE state IN ('ready', 'failed');
CREATE INDEX attachment_events_by_job ON attachment_events (job_id);
CREATE INDEX replay_audit_by_time ON replay_audit (at);
CREATE INDEX dlq_replays_by_time ON dlq_replays (at);
