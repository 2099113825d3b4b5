-- Operators (applied by Alembic revision 0004; issue 23 defect 11): who may use the admin API, and what came of
-- every operator request.
--
-- operator_tokens: one row per token. Only the SHA-256 of the token is stored (the token itself is shown once, by
-- `reference operator-token create NAME`); the operator's identity is the row's name, never anything the client
-- writes. A revoked token stays (revoked_at set) so the audit keeps naming who it was. One live token per name.
CREATE TABLE operator_tokens (
    id            bigserial PRIMARY KEY,
    name          text        NOT NULL CHECK (name ~ '^[A-Za-z0-9._@-]{1,100}$'),
    token_sha256  text        NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    text        NOT NULL,
    revoked_at    timestamptz,
    last_used_at  timestamptz
);
CREATE UNIQUE INDEX operator_tokens_one_live_per_name ON operator_tokens (name) WHERE revoked_at IS NULL;

-- operator_audit: one row per operator request and outcome, whatever it was: accepted, refused (not failed, not
-- found, original released, a replay limit), lost to a concurrent request, and refused authentication (a wrong
-- token, then the 429 of too many). `operator` is the identity the server established (api:<token name>,
-- cli:<login>) or, for a refused authentication, `unauthenticated`; `client` the peer address.
CREATE TABLE operator_audit (
    id            bigserial PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    operator      text        NOT NULL,
    action        text        NOT NULL,
    attachment_id uuid,
    job_id        uuid,
    outcome       text        NOT NULL,
    status        integer     NOT NULL,
    detail        text,
    reason        text,
    client        text
);
CREATE INDEX operator_audit_by_time ON operator_audit (at);
CREATE INDEX operator_audit_by_attachment ON operator_audit (attachment_id, at) WHERE attachment_id IS NOT NULL;
