// Package failpoint arms named failure points from FAILPOINTS="name=spec;…".
//
// A spec is an optional count prefix "N*" (only the first N hits fire) and an
// action: crash (the process dies at once with SIGKILL: no deferred cleanup,
// no nack, no graceful close), pause(ms), or error (the call site gets
// ErrInjected and handles it like any other failure of that step).
package failpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The five failure windows of the contract (docs/CONTRACT.md §6).
const (
	AfterStagingBeforeRecord  = "after_staging_before_record"
	AfterCommitBeforePublish  = "after_commit_before_publish"
	AfterPublishBeforeConfirm = "after_publish_before_confirm"
	AfterS3WriteBeforeCommit  = "after_s3_write_before_commit"
	AfterCommitBeforeAck      = "after_commit_before_ack"
)

// ErrInjected is returned by Hit for the "error" action.
var ErrInjected = errors.New("failpoint: injected error")

// Action is what an armed failpoint does when hit.
type Action int

const (
	Crash Action = iota + 1
	Pause
	Error
)

// Spec is one parsed failpoint.
type Spec struct {
	Action Action
	Pause  time.Duration
	Count  int // 0 = every hit
}

// Set is a parsed FAILPOINTS value. The zero value has nothing armed.
type Set struct {
	mu    sync.Mutex
	specs map[string]*Spec
	hits  map[string]int
	// crash ends the process; replaced in tests.
	crash func()
}

// Parse reads "name=spec;name=spec". Empty input arms nothing.
func Parse(value string) (*Set, error) {
	s := &Set{specs: map[string]*Spec{}, hits: map[string]int{}, crash: crashNow}
	for _, item := range strings.Split(value, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, raw, ok := strings.Cut(item, "=")
		name, raw = strings.TrimSpace(name), strings.TrimSpace(raw)
		if !ok || name == "" {
			return nil, fmt.Errorf("failpoint %q: want name=action", item)
		}
		spec, err := parseSpec(raw)
		if err != nil {
			return nil, fmt.Errorf("failpoint %s: %w", name, err)
		}
		s.specs[name] = spec
	}
	return s, nil
}

func parseSpec(raw string) (*Spec, error) {
	spec := &Spec{}
	if count, rest, ok := strings.Cut(raw, "*"); ok {
		n, err := strconv.Atoi(strings.TrimSpace(count))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad count %q", count)
		}
		spec.Count, raw = n, strings.TrimSpace(rest)
	}
	switch {
	case raw == "crash":
		spec.Action = Crash
	case raw == "error":
		spec.Action = Error
	case strings.HasPrefix(raw, "pause(") && strings.HasSuffix(raw, ")"):
		ms, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(raw, "pause("), ")"))
		if err != nil || ms < 0 {
			return nil, fmt.Errorf("bad pause %q", raw)
		}
		spec.Action, spec.Pause = Pause, time.Duration(ms)*time.Millisecond
	default:
		return nil, fmt.Errorf("unknown action %q (want crash, pause(ms) or error)", raw)
	}
	return spec, nil
}

// Armed reports whether name has a failpoint.
func (s *Set) Armed(name string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.specs[name]
	return ok
}

// Hit passes through the failpoint name: it may kill the process, sleep
// (until ctx ends), or return ErrInjected. Unarmed or spent points return nil.
func (s *Set) Hit(ctx context.Context, name string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	spec, ok := s.specs[name]
	if ok {
		s.hits[name]++
		ok = spec.Count == 0 || s.hits[name] <= spec.Count
	}
	s.mu.Unlock()
	if !ok {
		return nil
	}
	slog.Warn("failpoint hit", "failpoint", name, "action", spec.Action.String())
	switch spec.Action {
	case Crash:
		s.crash()
	case Pause:
		t := time.NewTimer(spec.Pause)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	case Error:
		return fmt.Errorf("%s: %w", name, ErrInjected)
	}
	return nil
}

func (a Action) String() string {
	switch a {
	case Crash:
		return "crash"
	case Pause:
		return "pause"
	case Error:
		return "error"
	}
	return "none"
}

// crashNow kills the process the way a power cut would: SIGKILL to itself, so
// no deferred function, no connection close and no broker nack ever runs.
func crashNow() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	os.Exit(137) // not reached
}
