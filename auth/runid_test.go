package auth_test

import (
	"strings"
	"testing"

	"github.com/tether-dev/tether/auth"
)

func TestScopedRunID(t *testing.T) {
	long := strings.Repeat("a", 63)
	tests := []struct {
		name, tunnel, requested, want string
	}{
		{name: "a tether client's connection", tunnel: "acme", requested: "0f3a9c21-1", want: "acme.0f3a9c21-1"},
		{name: "given before, sent back on reconnect", tunnel: "acme", requested: "acme.0f3a9c21-1", want: "acme.0f3a9c21-1"},
		{name: "another tunnel's run ID stays in this tunnel", tunnel: "acme", requested: "globex.0f3a9c21-1", want: "acme.globex.0f3a9c21-1"},
		{name: "the bare tunnel name", tunnel: "acme", requested: "acme", want: "acme.acme"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := auth.ScopedRunID(tc.tunnel, tc.requested); got != tc.want {
				t.Errorf("ScopedRunID(%q, %q) = %q, want %q", tc.tunnel, tc.requested, got, tc.want)
			}
		})
	}

	t.Run("empty gets a random one of the tunnel", func(t *testing.T) {
		a, b := auth.ScopedRunID("acme", ""), auth.ScopedRunID("acme", "")
		if !strings.HasPrefix(a, "acme.") || len(a) < len("acme.")+16 || a == b {
			t.Errorf("two empty requests gave %q and %q; want distinct random IDs under acme.", a, b)
		}
		if again := auth.ScopedRunID("acme", a); again != a {
			t.Errorf("the random ID sent back gave %q, want it kept (%q)", again, a)
		}
	})
	for _, requested := range []string{"bad id with spaces", "ütf", strings.Repeat("x", 80), "a\x00b"} {
		t.Run("hashed: "+requested[:min(len(requested), 12)], func(t *testing.T) {
			got := auth.ScopedRunID("acme", requested)
			if !strings.HasPrefix(got, "acme.") || len(got) > 64 || strings.ContainsAny(got, " \x00ü") {
				t.Errorf("ScopedRunID(acme, %q) = %q, want acme.<hex> within 64 bytes", requested, got)
			}
			if got != auth.ScopedRunID("acme", requested) {
				t.Error("not stable")
			}
			if got == auth.ScopedRunID("globex", requested) {
				t.Error("two tunnels got the same run ID")
			}
		})
	}
	t.Run("a tunnel name that leaves no room", func(t *testing.T) {
		a, b := auth.ScopedRunID(long, "0f3a9c21-0"), auth.ScopedRunID(long, "0f3a9c21-1")
		if len(a) > 64 || a == b || a != auth.ScopedRunID(long, "0f3a9c21-0") {
			t.Errorf("got %q and %q: want distinct, stable, at most 64 bytes", a, b)
		}
	})
}
