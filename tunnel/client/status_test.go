package client

import (
	"errors"
	"testing"
	"time"
)

// Not ready, /readyz says what each slot misses, naming slots that miss the
// same thing together; with one slot it reads as it always has.
func TestReadinessReason(t *testing.T) {
	refused := errors.New("connection refused")
	one := newStatus("acme", "s:1", "tcp", nil, 1, time.Now())
	one.onFailed(0, nil, refused)
	if _, reason := one.readiness(); reason != "not connected to the tunnel server: connection refused" {
		t.Errorf("one slot: %q", reason)
	}

	s := newStatus("acme", "s:1", "tcp", nil, 4, time.Now())
	s.onFailed(0, nil, refused)
	s.onFailed(2, nil, refused)
	s.onConnected(1, "direct", false)
	ss := s.onConnected(3, "direct", false)
	s.onLoggedIn(ss)
	s.onRoute(ss, errors.New("proxy rejected"))
	want := "slots 0, 2: not connected to the tunnel server: connection refused; slot 1: connected, not logged in; slot 3: logged in, route not registered: proxy rejected"
	if ok, reason := s.readiness(); ok || reason != want {
		t.Errorf("readiness %v %q, want false %q", ok, reason, want)
	}
	s.onRoute(ss, nil)
	if ok, reason := s.readiness(); !ok || reason != "ready" {
		t.Errorf("readiness %v %q with slot 3 ready, want true", ok, reason)
	}
	snap := s.snapshot()
	if snap.State != "ready" || !snap.Connected || snap.LoggedInSince == nil || snap.LastError != refused.Error() || snap.Connections != 4 {
		t.Errorf("snapshot %+v", snap)
	}
}
