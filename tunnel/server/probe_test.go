package server

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel/client"
)

func newProber(t *testing.T, s *testServer) *client.Prober {
	t.Helper()
	p, err := client.NewProber(client.Config{Server: s.tunnel, TokenFile: "unused", TLSFingerprint: s.Fingerprint(), Proxy: "direct"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A probe is told exactly what a login with the same token would be told.
func TestProbeRejectionIsTheLoginRejection(t *testing.T) {
	s := startServer(t)
	expired, err := s.keys.signer.Issue(auth.IssueRequest{Tunnel: "acme", TTL: time.Hour}, time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for name, token := range map[string]string{
		"expired":       expired,
		"another key":   newKeys(t).token(t, "acme", time.Hour),
		"not a JWT":     "garbage",
		"missing token": "",
	} {
		t.Run(name, func(t *testing.T) {
			resp, _ := dialRaw(t, s.tunnel).login(token, "acme")
			if resp.Error == "" {
				t.Fatal("the login was accepted")
			}
			_, err := newProber(t, s).Login(t.Context(), token)
			rej, ok := errors.AsType[*client.RejectedError](err)
			if !ok {
				t.Fatalf("probe error %v, want a rejection", err)
			}
			// The two answers may be a second apart; "(now ...)" is the
			// server's clock at each.
			if withoutNow(rej.Reason) != withoutNow(resp.Error) {
				t.Errorf("probe told %q, login told %q", rej.Reason, resp.Error)
			}
		})
	}
}

var nowInMessage = regexp.MustCompile(`\(now [^)]*\)`)

func withoutNow(msg string) string { return nowInMessage.ReplaceAllString(msg, "(now …)") }

// An accepted probe reports the tunnel and registers nothing: the running
// client keeps its session and its route.
func TestProbeLeavesTheTunnelAlone(t *testing.T) {
	s := startServer(t)
	s.startClient(t, "acme", backend(t, "a").URL)
	before, ok := s.members.lookup("acme")
	if !ok {
		t.Fatal("tunnel not registered")
	}

	reply, err := newProber(t, s).Login(t.Context(), s.keys.token(t, "acme", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if reply.Tunnel != "acme" || reply.Account != "acct-acme" || !reply.Connected || reply.ClientAddress == "" {
		t.Errorf("probe reply %+v", reply)
	}
	if want := "http://acme." + testDomain + ":"; !strings.HasPrefix(reply.PublicURL, want) {
		t.Errorf("public URL %q, want it to start with %q", reply.PublicURL, want)
	}
	// A probe of a tunnel nobody serves says so.
	other, err := newProber(t, s).Login(t.Context(), s.keys.token(t, "other", time.Hour))
	if err != nil || other.Connected {
		t.Errorf("probe of an idle tunnel: %+v, %v", other, err)
	}

	if after, _ := s.members.lookup("acme"); after != before {
		t.Error("the probe replaced the tunnel's session")
	}
	if code, body, _ := s.get(t, "acme", "/"); code != http.StatusOK {
		t.Errorf("tunnel after the probe: %d %s", code, body)
	}
	req, _ := http.NewRequest(http.MethodGet, s.admin+"/metrics", nil)
	_, metrics, _ := do(t, req)
	if !strings.Contains(metrics, `tether_login_probes_total{result="accepted"} 2`) {
		t.Errorf("/metrics does not count the probes:\n%s", grepLines(metrics, "probe"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
