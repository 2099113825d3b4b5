// Command gopipe is a second, independent implementation of the attachment
// pipeline contract: one binary, one role per subcommand.
//
//	gopipe migrate   apply the database schema (idempotent, advisory-locked)
//	gopipe api       upload/status/events/replay HTTP API + the outbox relay
//	gopipe worker    consume jobs and render variants
//	gopipe sweeper   lease recovery, expiry, staging cleanup
//
// Configuration comes only from the environment (see internal/config).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"example.com/gopipe/internal/api"
	"example.com/gopipe/internal/backoff"
	"example.com/gopipe/internal/broker"
	"example.com/gopipe/internal/config"
	"example.com/gopipe/internal/failpoint"
	"example.com/gopipe/internal/imaging"
	"example.com/gopipe/internal/metrics"
	"example.com/gopipe/internal/relay"
	"example.com/gopipe/internal/storage"
	"example.com/gopipe/internal/store"
	"example.com/gopipe/internal/sweeper"
	"example.com/gopipe/internal/worker"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gopipe migrate|api|worker|sweeper")
		os.Exit(2)
	}
	role := os.Args[1]
	host, _ := os.Hostname()
	identity := fmt.Sprintf("%s-%d", host, os.Getpid())
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("role", role, "pid", os.Getpid()))

	cfg, err := config.Load()
	if err != nil {
		fatal("configuration", err)
	}
	fps, err := failpoint.Parse(cfg.Failpoints)
	if err != nil {
		fatal("FAILPOINTS", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	switch role {
	case "migrate":
		err = runMigrate(ctx, cfg)
	case "api":
		err = runAPI(ctx, cfg, fps, identity)
	case "worker":
		err = runWorker(ctx, cfg, fps, identity)
	case "sweeper":
		err = runSweeper(ctx, cfg)
	default:
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fatal(role, err)
	}
	slog.Info("stopped")
}

func fatal(what string, err error) {
	slog.Error(what+" failed", "err", err)
	os.Exit(1)
}

func openStore(ctx context.Context, cfg config.Config, conns int32) (*store.Store, error) {
	if err := cfg.Require("DATABASE_URL"); err != nil {
		return nil, err
	}
	return store.Open(ctx, cfg.DatabaseURL, conns, cfg.Lease)
}

func openObjects(cfg config.Config) (*storage.Store, error) {
	if err := cfg.Require("S3_ENDPOINT_URL", "S3_BUCKET", "S3_ACCESS_KEY", "S3_SECRET_KEY"); err != nil {
		return nil, err
	}
	return storage.New(cfg.S3Endpoint, cfg.S3Bucket, cfg.S3AccessKey, cfg.S3SecretKey, cfg.IOTimeout)
}

func runMigrate(ctx context.Context, cfg config.Config) error {
	s, err := openStore(ctx, cfg, 2)
	if err != nil {
		return err
	}
	defer s.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = s.Migrate(mctx)
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		slog.Warn("migration failed; retrying", "err", err)
		time.Sleep(time.Second)
	}
	if err == nil {
		slog.Info("schema up to date")
	}
	return err
}

func runAPI(ctx context.Context, cfg config.Config, fps *failpoint.Set, identity string) error {
	if err := cfg.Require("AMQP_URL"); err != nil {
		return err
	}
	db, err := openStore(ctx, cfg, 16)
	if err != nil {
		return err
	}
	defer db.Close()
	objects, err := openObjects(cfg)
	if err != nil {
		return err
	}
	reg := metrics.New()
	server := &api.Server{Config: cfg, Store: db, Objects: objects, Failpoints: fps, Metrics: reg, Actor: "intake"}
	r := &relay.Relay{
		Store:      db,
		Session:    &broker.Session{URL: cfg.BrokerURLs(), Name: "gopipe-relay-" + identity, Confirm: true},
		Failpoints: fps, Poll: cfg.OutboxPoll, Lock: cfg.OutboxLock, Timeout: cfg.IOTimeout, Batch: 50,
	}
	r.Register(reg)

	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	relayDone := make(chan struct{})
	go func() { r.Run(relayCtx); close(relayDone) }()

	srv := &http.Server{
		Addr:              net.JoinHostPort("", cfg.HTTPPort),
		Handler:           server.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       time.Minute,
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.ListenAndServe() }()
	slog.Info("api listening", "addr", srv.Addr)

	select {
	case err = <-serveErr:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
		err = srv.Shutdown(sctx)
		cancel()
	}
	stopRelay()
	<-relayDone
	r.Session.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func runWorker(ctx context.Context, cfg config.Config, fps *failpoint.Set, identity string) error {
	if err := cfg.Require("AMQP_URL"); err != nil {
		return err
	}
	db, err := openStore(ctx, cfg, int32(cfg.Concurrency*2+2))
	if err != nil {
		return err
	}
	defer db.Close()
	objects, err := openObjects(cfg)
	if err != nil {
		return err
	}
	reg := metrics.New()
	w := &worker.Worker{
		Config: cfg, Store: db, Objects: objects, Failpoints: fps,
		Identity: "w-" + identity,
		Session:  &broker.Session{URL: cfg.BrokerURLs(), Name: "gopipe-worker-" + identity, Prefetch: cfg.Prefetch},
		Limits:   imaging.DefaultLimits,
		Backoff:  backoff.Policy{Base: cfg.RetryBase, Cap: cfg.RetryCap},
	}
	w.Register(reg)
	serveMetrics(ctx, cfg.MetricsAddr, reg)
	return w.Run(ctx)
}

func runSweeper(ctx context.Context, cfg config.Config) error {
	db, err := openStore(ctx, cfg, 4)
	if err != nil {
		return err
	}
	defer db.Close()
	objects, err := openObjects(cfg)
	if err != nil {
		return err
	}
	// The sweeper publishes nothing itself (its messages go through the outbox),
	// but declaring the topology at start keeps every role self-sufficient.
	if cfg.AMQPURL != "" {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := broker.DeclareOnce(dctx, cfg.BrokerURLs(), "gopipe-sweeper"); err != nil {
			slog.Warn("could not declare the broker topology (the api and workers will)", "err", err)
		}
		cancel()
	}
	reg := metrics.New()
	s := &sweeper.Sweeper{Config: cfg, Store: db, Objects: objects}
	if cfg.AMQPURL != "" {
		queue := &broker.Session{URL: cfg.BrokerURLs(), Name: "gopipe-sweeper"}
		defer queue.Close()
		s.ReadyMessages = queue.ReadyMessages
	}
	s.Register(reg)
	serveMetrics(ctx, cfg.MetricsAddr, reg)
	slog.Info("sweeping", "every", cfg.SweepEvery, "staging_retention", cfg.StagingRetention)
	s.Run(ctx)
	return nil
}

// serveMetrics exposes /metrics on addr (worker and sweeper; the API serves
// it on its own port). Port 0 picks a free port, logged at start.
func serveMetrics(ctx context.Context, addr string, reg *metrics.Registry) {
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		slog.Warn("metrics listener failed; continuing without /metrics", "addr", addr, "err", err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", reg.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	slog.Info("metrics listening", "addr", ln.Addr().String())
}
