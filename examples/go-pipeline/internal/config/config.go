// Package config reads the process configuration from the environment.
//
// The contract variables (DATABASE_URL, AMQP_URL, S3_*, HTTP_PORT, FAILPOINTS,
// LEVEL, OPERATOR_TOKEN) keep their names; every timing or limit of this
// implementation is a GOPIPE_* variable whose default is the production value
// (docs/CONTRACT.md §8). Durations accept Go syntax ("1m30s", "200ms") or plain seconds
// ("2", "0.5"), so a harness can set them from a number.
package config

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Config is everything a role needs. Not every role uses every field.
type Config struct {
	DatabaseURL string
	AMQPURL     string
	AMQPURLs    string // AMQP_URLS: a cluster's nodes, comma-separated (unset on one node)

	S3Endpoint  string
	S3Bucket    string
	S3AccessKey string
	S3SecretKey string

	HTTPPort      string
	MetricsAddr   string // worker and sweeper: where /metrics is served ("" = off)
	Failpoints    string
	Level         int
	OperatorToken string

	PipelineVersion int
	JobTTL          time.Duration
	MaxAttempts     int

	Lease      time.Duration
	LeaseRenew time.Duration
	RetryBase  time.Duration
	RetryCap   time.Duration

	Concurrency int
	Prefetch    int
	DecodeLimit time.Duration

	OutboxPoll time.Duration
	OutboxLock time.Duration

	SweepEvery       time.Duration
	StagingRetention time.Duration
	StaleQueued      time.Duration

	MaxUploadBytes int64
	IOTimeout      time.Duration
	ShutdownGrace  time.Duration
}

// Load reads the environment. It fails on malformed values rather than
// silently using a default.
func Load() (Config, error) {
	r := reader{}
	c := Config{
		DatabaseURL:   os.Getenv("DATABASE_URL"),
		AMQPURL:       os.Getenv("AMQP_URL"),
		AMQPURLs:      os.Getenv("AMQP_URLS"),
		S3Endpoint:    os.Getenv("S3_ENDPOINT_URL"),
		S3Bucket:      os.Getenv("S3_BUCKET"),
		S3AccessKey:   os.Getenv("S3_ACCESS_KEY"),
		S3SecretKey:   os.Getenv("S3_SECRET_KEY"),
		HTTPPort:      envOr("HTTP_PORT", "8080"),
		MetricsAddr:   os.Getenv("GOPIPE_METRICS_ADDR"),
		Failpoints:    os.Getenv("FAILPOINTS"),
		Level:         r.int("LEVEL", 4),
		OperatorToken: os.Getenv("OPERATOR_TOKEN"),

		PipelineVersion: r.int("GOPIPE_PIPELINE_VERSION", 1),
		JobTTL:          r.duration("GOPIPE_JOB_TTL", 24*time.Hour),
		MaxAttempts:     r.int("GOPIPE_MAX_ATTEMPTS", 20),

		Lease:      r.duration("GOPIPE_LEASE", 30*time.Second),
		LeaseRenew: r.duration("GOPIPE_LEASE_RENEW", 10*time.Second),
		RetryBase:  r.duration("GOPIPE_RETRY_BASE", time.Second),
		RetryCap:   r.duration("GOPIPE_RETRY_CAP", 10*time.Minute),

		Concurrency: r.int("GOPIPE_CONCURRENCY", 4),
		Prefetch:    r.int("GOPIPE_PREFETCH", 0),
		DecodeLimit: r.duration("GOPIPE_DECODE_LIMIT", 20*time.Second),

		OutboxPoll: r.duration("GOPIPE_OUTBOX_POLL", 2*time.Second),
		OutboxLock: r.duration("GOPIPE_OUTBOX_LOCK", 30*time.Second),

		SweepEvery:       r.duration("GOPIPE_SWEEP_EVERY", 15*time.Second),
		StagingRetention: r.duration("GOPIPE_STAGING_RETENTION", 24*time.Hour),
		StaleQueued:      r.duration("GOPIPE_STALE_QUEUED", 15*time.Minute),

		MaxUploadBytes: int64(r.int("GOPIPE_MAX_UPLOAD_BYTES", 25<<20)),
		IOTimeout:      r.duration("GOPIPE_IO_TIMEOUT", 10*time.Second),
		ShutdownGrace:  r.duration("GOPIPE_SHUTDOWN_GRACE", 25*time.Second),
	}
	if c.Prefetch <= 0 {
		c.Prefetch = c.Concurrency // one delivery per free worker slot
	}
	if c.LeaseRenew >= c.Lease {
		r.errs = append(r.errs, fmt.Errorf("GOPIPE_LEASE_RENEW (%s) must be shorter than GOPIPE_LEASE (%s)", c.LeaseRenew, c.Lease))
	}
	if c.Concurrency < 1 || c.MaxAttempts < 1 {
		r.errs = append(r.errs, errors.New("GOPIPE_CONCURRENCY and GOPIPE_MAX_ATTEMPTS must be at least 1"))
	}
	return c, errors.Join(r.errs...)
}

// Variants lists the variants promised at the configured level.
// BrokerURLs is AMQP_URLS when set (every node of a cluster), else AMQP_URL.
func (c Config) BrokerURLs() string {
	if strings.TrimSpace(c.AMQPURLs) != "" {
		return c.AMQPURLs
	}
	return c.AMQPURL
}

func (c Config) Variants() []string {
	if c.Level >= 4 {
		return []string{"thumbnail", "crop", "optimized"}
	}
	return []string{"thumbnail"}
}

// Require reports the first missing mandatory variable among names.
func (c Config) Require(names ...string) error {
	values := map[string]string{
		"DATABASE_URL": c.DatabaseURL, "AMQP_URL": c.AMQPURL, "S3_ENDPOINT_URL": c.S3Endpoint,
		"S3_BUCKET": c.S3Bucket, "S3_ACCESS_KEY": c.S3AccessKey, "S3_SECRET_KEY": c.S3SecretKey,
	}
	var missing []string
	for _, n := range names {
		if values[n] == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing environment: %s", strings.Join(missing, ", "))
	}
	return nil
}

func envOr(name, fallback string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return fallback
}

type reader struct{ errs []error }

func (r *reader) int(name string, fallback int) int {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return fallback
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s: %w", name, err))
		return fallback
	}
	return n
}

func (r *reader) duration(name string, fallback time.Duration) time.Duration {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return fallback
	}
	d, err := ParseDuration(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s: %w", name, err))
		return fallback
	}
	return d
}

// ParseDuration accepts Go duration syntax or a bare number of seconds.
func ParseDuration(v string) (time.Duration, error) {
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs < 0 {
			return 0, fmt.Errorf("negative duration %q", v)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration %q", v)
	}
	return d, nil
}
