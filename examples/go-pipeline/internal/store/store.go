// Package store is the PostgreSQL side of the pipeline: attachments, jobs and
// their leases, variant results, the transition log and the outbox. Every SQL
// statement lives in sql/*.sql; this file only binds them to Go types.
package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var queries = loadQueries()

// q returns the named query; a missing name is a programming error.
func q(name string) string {
	s, ok := queries[name]
	if !ok {
		panic("store: no query named " + name)
	}
	return s
}

func loadQueries() map[string]string {
	raw, err := sqlFiles.ReadFile("sql/queries.sql")
	if err != nil {
		panic(err)
	}
	out := map[string]string{}
	var name string
	var body strings.Builder
	flush := func() {
		if name != "" {
			out[name] = strings.TrimSpace(body.String())
		}
		body.Reset()
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "-- name: "); ok {
			flush()
			name = strings.TrimSpace(rest)
			continue
		}
		if name != "" {
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	flush()
	return out
}

// Errors callers branch on.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
)

// Store wraps a connection pool.
type Store struct {
	pool *pgxpool.Pool
	url  string
}

// Open connects lazily: the pool dials on first use, so a role starts even
// while the database is unreachable and recovers when it comes back.
//
// idleTx bounds how long a transaction may sit idle on the server: a process
// paused mid-transaction (SIGSTOP, a VM freeze) must not hold a job's row
// lock past its lease, or the sweeper (SKIP LOCKED) could never recover it.
func Open(ctx context.Context, url string, maxConns int32, idleTx time.Duration) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.MaxConns = maxConns
	cfg.MaxConnIdleTime = time.Minute
	cfg.HealthCheckPeriod = 5 * time.Second
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "gopipe"
	// A statement may never hang longer than this on the server side either.
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "15000"
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(max(idleTx, time.Second).Milliseconds(), 10)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, url: url}, nil
}

// Close releases the pool.
func (s *Store) Close() { s.pool.Close() }

// URL is the connection string (the relay opens its own LISTEN connection).
func (s *Store) URL() string { return s.url }

// Ping checks reachability.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// Migrate applies the schema under an advisory lock, so concurrent starts are safe.
func (s *Store) Migrate(ctx context.Context) error {
	schema, err := sqlFiles.ReadFile("sql/schema.sql")
	if err != nil {
		return err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	const lockKey = 0x6770697065 // "gpipe"
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck
	_, err = conn.Exec(ctx, string(schema))
	return err
}

// IsUnavailable tells a connectivity failure (retry later, answer 503) from a
// query the server refused.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// class 08 connection exception, 57P01-03 shutdown / cannot connect now, 53 resources
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") || strings.HasPrefix(pgErr.Code, "53")
	}
	return true // network errors, timeouts, pool closed: all transient
}

func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}

func secs(d time.Duration) float64 { return d.Seconds() }

// Transition is one row of the transition log.
type Transition struct {
	Seq           int64
	At            time.Time
	From          *string
	To            string
	Attempt       int
	Reason        *string
	Actor         string
	NextAttemptAt *time.Time
}

func logTransition(ctx context.Context, tx pgx.Tx, attachmentID, jobID string, from *string, to string, attempt int, actor, reason string, next *time.Time) error {
	_, err := tx.Exec(ctx, q("insert-transition"), attachmentID, jobID, from, to, attempt, actor, reason, next)
	return err
}

func state(s string) *string { return &s }

func notifyOutbox(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, q("notify-outbox"))
	return err
}
