// Package testutil holds helpers shared by tether's tests. Non-test code
// never imports it.
package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every 10ms until it returns nil or timeout passes, then
// fails the test with cond's last error. It replaces fixed sleeps: the test
// waits exactly as long as the condition needs and no longer.
func WaitFor(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
