package ids

import "testing"

func TestNewIsCanonicalAndRandom(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := New()
		if !Valid(id) || id[14] != '4' || !(id[19] == '8' || id[19] == '9' || id[19] == 'a' || id[19] == 'b') {
			t.Fatalf("%q is not a canonical version 4 UUID", id)
		}
		if seen[id] {
			t.Fatalf("%q repeated", id)
		}
		seen[id] = true
	}
	for _, bad := range []string{"", "5F1D2C3B-8A9E-4B7C-9D0E-1F2A3B4C5D6E", "5f1d2c3b8a9e4b7c9d0e1f2a3b4c5d6e", "../etc/passwd"} {
		if Valid(bad) {
			t.Errorf("Valid(%q)", bad)
		}
	}
}
