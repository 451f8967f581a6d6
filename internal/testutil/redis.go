package testutil

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// RedisServer is a redis-server a test runs on a free loopback port, in a
// temp dir, without persistence: Restart brings it back empty, on the same
// address, as a Redis restarted without a volume (or a failover to a fresh
// server) would come back. The test fails, it does not skip, when
// redis-server is not installed: the tests that need it are the ones that
// show tether works with Redis.
type RedisServer struct {
	// Addr is where the server listens, 127.0.0.1:PORT, across restarts.
	Addr string
	// Password is the value of --requirepass among the extra arguments, or "".
	Password string
	// TLS, when set before Start, makes the server speak TLS on Addr (the
	// extra arguments name its certificate files) and is how Start's
	// liveness check trusts it.
	TLS *tls.Config

	t    testing.TB
	bin  string
	dir  string
	args []string
	out  *SyncBuffer

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// StartRedis starts a redis-server with extra arguments (e.g.
// "--requirepass", secret) and waits until it answers. It is killed when
// the test ends; its output is logged if the test failed.
func StartRedis(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	s := NewRedisServer(t, extra...)
	s.Start()
	return s
}

// NewRedisServer prepares a redis-server on a free port without starting it,
// for a test that sets TLS first; Start starts it.
func NewRedisServer(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not on PATH; this test runs a real Redis: install it (Debian/Ubuntu: apt-get install redis-server)")
	}
	s := &RedisServer{t: t, bin: bin, dir: t.TempDir(), Addr: FreeAddr(t), args: extra, out: &SyncBuffer{}}
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			s.Password = extra[i+1]
		}
	}
	t.Cleanup(func() {
		s.Kill()
		if t.Failed() {
			t.Logf("redis-server output:\n%s", s.out.String())
		}
	})
	return s
}

// URL is the server's redis:// URL (database 0), without a password.
func (s *RedisServer) URL() string { return "redis://" + s.Addr + "/0" }

// Start starts the server on Addr and waits until it answers a PING (an
// authentication error is an answer too).
func (s *RedisServer) Start() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	args := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--loglevel", "warning"}
	if s.TLS == nil {
		args = append(args, "--port", port)
	} else {
		args = append(args, "--port", "0", "--tls-port", port)
	}
	args = append(args, s.args...)
	// Not the test's context: it ends before the cleanups of the processes
	// that use this server, which would then see Redis die first.
	cmd := exec.CommandContext(context.Background(), s.bin, args...) //nolint:gosec // the test names the arguments
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	WaitFor(s.t, 10*time.Second, func() error {
		select {
		case <-exited:
			s.t.Fatalf("redis-server exited at start (%v):\n%s", cmd.ProcessState, s.out.String())
		default:
		}
		return s.ping()
	})
}

// Kill stops the server as a crash would, and waits for it to exit. It
// does nothing when the server is not running.
func (s *RedisServer) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd, s.exited = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Restart kills the server and starts it again, empty, on the same address.
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.Kill()
	s.Start()
}

// Output is what the server wrote so far.
func (s *RedisServer) Output() string { return s.out.String() }

// ping sends PING and reads one reply line: +PONG, or -NOAUTH from a
// server that wants a password, both show it is up.
func (s *RedisServer) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var conn net.Conn
	var err error
	if s.TLS != nil {
		conn, err = (&tls.Dialer{Config: s.TLS}).DialContext(ctx, "tcp", s.Addr)
	} else {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", s.Addr)
	}
	if err != nil {
		return fmt.Errorf("redis-server not answering on %s: %w", s.Addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return fmt.Errorf("PING redis-server on %s: %w", s.Addr, err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("PING redis-server on %s: %w", s.Addr, err)
	}
	if line = strings.TrimSpace(line); line != "+PONG" && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING redis-server on %s: got %q, want +PONG", s.Addr, line)
	}
	return nil
}

// SyncBuffer collects a process's output; safe for concurrent use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
