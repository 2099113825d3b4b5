package metrics

import (
	"strings"
	"testing"
)

func TestExposition(t *testing.T) {
	r := New()
	r.Counter("gopipe_jobs_expired_total", "Jobs failed because their TTL ran out.", "role", "sweeper").Add(2)
	r.Counter("gopipe_jobs_expired_total", "Jobs failed because their TTL ran out.", "role", "sweeper").Inc()
	r.Gauge("gopipe_up", "1 while running.", func() float64 { return 1 })
	var b strings.Builder
	_, _ = r.WriteTo(&b)
	out := b.String()
	for _, want := range []string{
		"# TYPE gopipe_jobs_expired_total counter",
		`gopipe_jobs_expired_total{role="sweeper"} 3`,
		"gopipe_up 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
