package gate

import (
	"testing"
	"time"
)

// The heartbeat pings a session once its client has been quiet for the
// whole quiet time, once until that ping is over, and never a session
// whose client pings more often than that.
func TestHeartbeatDue(t *testing.T) {
	const quiet = 40 * time.Second
	t0 := time.Unix(1_000_000, 0)
	var b heartbeat
	for _, step := range []struct {
		read uint64
		at   time.Duration
		want bool
	}{
		{100, 0, false},                // first sight
		{100, 30 * time.Second, false}, // quiet for 30s
		{130, 35 * time.Second, false}, // the client spoke
		{130, 74 * time.Second, false}, // quiet for 39s
		{130, 75 * time.Second, true},  // quiet for 40s: ping
		{130, 80 * time.Second, false}, // the ping is out
	} {
		if got := b.due(step.read, t0.Add(step.at), quiet); got != step.want {
			t.Fatalf("at %v with %d bytes read: due = %v, want %v", step.at, step.read, got, step.want)
		}
	}
	b.pinging.Store(false) // answered: the answer is read
	if b.due(142, t0.Add(81*time.Second), quiet) {
		t.Fatal("due right after the answer was read")
	}

	// A client that pings every 30s, swept every 5s for an hour.
	var c heartbeat
	read := uint64(0)
	for at := time.Duration(0); at < time.Hour; at += 5 * time.Second {
		if at%(30*time.Second) == 0 {
			read += 45
		}
		if c.due(read, t0.Add(at), quiet) {
			t.Fatalf("a client that pings every 30s was due a ping at %v", at)
		}
	}
}
