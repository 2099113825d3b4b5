package failpoint

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	s, err := Parse("after_commit_before_ack=1*crash; after_s3_write_before_commit=pause(250);x=error")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.specs[AfterCommitBeforeAck]; got.Action != Crash || got.Count != 1 {
		t.Errorf("crash spec: %+v", got)
	}
	if got := s.specs[AfterS3WriteBeforeCommit]; got.Action != Pause || got.Pause != 250*time.Millisecond || got.Count != 0 {
		t.Errorf("pause spec: %+v", got)
	}
	if !s.Armed("x") || s.Armed("y") {
		t.Error("Armed is wrong")
	}
	for _, bad := range []string{"a", "=crash", "a=explode", "a=0*crash", "a=x*crash", "a=pause(-1)", "a=pause(1"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if s, err := Parse(""); err != nil || s.Armed(AfterCommitBeforeAck) {
		t.Errorf("empty FAILPOINTS: %v", err)
	}
}

func TestCountLimitsHits(t *testing.T) {
	s, _ := Parse("w=2*error")
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		err := s.Hit(ctx, "w")
		if want := i <= 2; errors.Is(err, ErrInjected) != want {
			t.Errorf("hit %d: %v", i, err)
		}
	}
}

func TestCrashCallsCrash(t *testing.T) {
	s, _ := Parse("w=1*crash")
	crashed := 0
	s.crash = func() { crashed++ }
	_ = s.Hit(context.Background(), "w")
	_ = s.Hit(context.Background(), "w")
	if crashed != 1 {
		t.Errorf("crashed %d times, want 1", crashed)
	}
}

func TestPauseHonoursContext(t *testing.T) {
	s, _ := Parse("w=pause(10000)")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := s.Hit(ctx, "w"); err == nil || time.Since(start) > 2*time.Second {
		t.Errorf("pause ignored cancellation: %v after %s", err, time.Since(start))
	}
	var nilSet *Set
	if err := nilSet.Hit(context.Background(), "w"); err != nil {
		t.Error("a nil set must be inert")
	}
}
