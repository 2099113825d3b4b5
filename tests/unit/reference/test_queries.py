from reference.db.queries import parse_named_sql, queries

REQUIRED = {"record_upload", "claim_job", "renew_lease", "commit_result", "retry_job", "fail_job", "expire_leases",
            "replay_job", "outbox_fetch", "outbox_mark_published", "get_attachment", "get_events"}


def test_every_query_the_roles_use_is_defined():
    assert REQUIRED <= set(queries().names())


def test_fenced_statements_check_token_state_and_lease():
    for name in ("commit_result", "retry_job", "fail_job"):
        sql = getattr(queries(), name)
        assert "fencing_token = %(fencing_token)s" in sql
        assert "state = 'processing'" in sql and "lease_expires_at > now()" in sql


def test_renewal_and_release_are_fenced_by_token_and_state():
    # A lapsed lease nobody recovered may be revived: token + processing prove no one else claimed the job.
    for name in ("renew_lease", "release_job"):
        sql = getattr(queries(), name)
        assert "fencing_token = %(fencing_token)s" in sql and "state = 'processing'" in sql
    assert "lease_owner = %(owner)s" in queries().adopt_claim


def test_parser_splits_blocks_and_drops_leading_comments():
    parsed = parse_named_sql("-- name: a\n-- doc\nSELECT 1;\n\n-- name: b\nSELECT 2\n")
    assert parsed == {"a": "SELECT 1", "b": "SELECT 2"}
