package client

import (
	"io"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// recentLogLines is how many of its last log lines a client keeps for
// /debug/logs (and so for `tether diagnose --bundle`).
const recentLogLines = 200

// recentLogs keeps the client's last log lines, as JSON, so that a person
// debugging a pod can read them over the health address even after the
// container's log has been rotated away. It holds what the client logs,
// which never includes a token.
type recentLogs struct {
	mu    sync.Mutex
	lines [][]byte
	next  int
}

func newRecentLogs() *recentLogs { return &recentLogs{lines: make([][]byte, 0, recentLogLines)} }

// tee returns log writing to r as well, at the levels log writes.
func (r *recentLogs) tee(log *zap.Logger) *zap.Logger {
	return log.WithOptions(zap.WrapCore(func(core zapcore.Core) zapcore.Core {
		ec := zap.NewProductionEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		enc := zapcore.NewJSONEncoder(ec)
		return zapcore.NewTee(core, zapcore.NewCore(enc, zapcore.AddSync(r), zap.LevelEnablerFunc(core.Enabled)))
	}))
}

// Write stores one encoded entry (zap writes each entry in one call).
func (r *recentLogs) Write(p []byte) (int, error) {
	line := append([]byte(nil), p...)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lines) < recentLogLines {
		r.lines = append(r.lines, line)
	} else {
		r.lines[r.next] = line
		r.next = (r.next + 1) % recentLogLines
	}
	return len(p), nil
}

// writeTo writes the kept lines, oldest first.
func (r *recentLogs) writeTo(w io.Writer) {
	r.mu.Lock()
	lines := append(append([][]byte(nil), r.lines[r.next:]...), r.lines[:r.next]...)
	r.mu.Unlock()
	for _, l := range lines {
		_, _ = w.Write(l)
	}
}
