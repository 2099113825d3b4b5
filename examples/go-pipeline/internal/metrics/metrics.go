// Package metrics is a minimal Prometheus text-format registry: monotonically
// increasing counters and callback gauges, enough for the few numbers the
// pipeline exposes without pulling in a metrics framework.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Registry holds named series.
type Registry struct {
	mu     sync.Mutex
	series map[string]*series
}

type series struct {
	help   string
	kind   string
	labels map[string]*atomic.Uint64 // rendered label set -> value
	gauge  func() float64
}

// New returns an empty registry.
func New() *Registry { return &Registry{series: map[string]*series{}} }

// Counter is one labelled counter series.
type Counter struct{ v *atomic.Uint64 }

// Add increases the counter by n.
func (c Counter) Add(n uint64) { c.v.Add(n) }

// Inc increases the counter by one.
func (c Counter) Inc() { c.v.Add(1) }

// Counter registers (or finds) a counter; labels are key, value pairs.
func (r *Registry) Counter(name, help string, labels ...string) Counter {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.series[name]
	if s == nil {
		s = &series{help: help, kind: "counter", labels: map[string]*atomic.Uint64{}}
		r.series[name] = s
	}
	key := renderLabels(labels)
	v := s.labels[key]
	if v == nil {
		v = new(atomic.Uint64)
		s.labels[key] = v
	}
	return Counter{v}
}

// Gauge registers a gauge read at scrape time.
func (r *Registry) Gauge(name, help string, read func() float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.series[name] = &series{help: help, kind: "gauge", gauge: read}
}

// WriteTo renders the Prometheus text exposition format.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	names := make([]string, 0, len(r.series))
	for n := range r.series {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		s := r.series[n]
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", n, s.help, n, s.kind)
		if s.gauge != nil {
			fmt.Fprintf(&b, "%s %g\n", n, s.gauge())
			continue
		}
		keys := make([]string, 0, len(s.labels))
		for k := range s.labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s%s %d\n", n, k, s.labels[k].Load())
		}
	}
	r.mu.Unlock()
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

// Handler serves the registry.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = r.WriteTo(w)
	})
}

func renderLabels(kv []string) string {
	if len(kv) == 0 {
		return ""
	}
	parts := make([]string, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		v := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(kv[i+1])
		parts = append(parts, fmt.Sprintf(`%s="%s"`, kv[i], v))
	}
	return "{" + strings.Join(parts, ",") + "}"
}
