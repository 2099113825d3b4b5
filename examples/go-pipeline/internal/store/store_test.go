package store

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every q("name") in this package names a query of sql/queries.sql, and every
// query there is used: a typo fails here instead of panicking in production.
func TestNamedQueriesMatchTheirUses(t *testing.T) {
	used := map[string]bool{}
	files, _ := os.ReadDir(".")
	call := regexp.MustCompile(`q\("([a-z-]+)"\)`)
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".go") || strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		src, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			used[m[1]] = true
		}
	}
	for name := range used {
		if _, ok := queries[name]; !ok {
			t.Errorf("q(%q) names no query in sql/queries.sql", name)
		}
	}
	for name, body := range queries {
		if !used[name] {
			t.Errorf("query %q is never used", name)
		}
		if strings.TrimSpace(body) == "" {
			t.Errorf("query %q is empty", name)
		}
	}
}
