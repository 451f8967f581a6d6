package tunnel

import (
	"bytes"
	"time"

	golog "github.com/fatedier/golib/log"

	frplog "github.com/fatedier/frp/pkg/util/log"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tether-dev/tether/auth"
)

// BridgeFRPLog routes frp's logger into log (as the child logger "frp").
//
// frp logs through one process-wide logger, so main calls this exactly once
// and never undoes it: frp goroutines may log until the process exits.
// frp's lifecycle lines at info ("new proxy [x] success", "client exit
// success") duplicate tether's own lifecycle logs, so frp's info becomes
// debug here; frp's warnings and errors keep their level, but for frp's
// line about a login tether's auth plugin refused, which the plugin logged
// already with its reason and the tunnel (see loginRejected). frp never logs
// login metadata, so tokens cannot reach the output through this bridge.
func BridgeFRPLog(log *zap.Logger) {
	level := golog.WarnLevel
	if log.Core().Enabled(zapcore.DebugLevel) {
		level = golog.DebugLevel
	}
	frplog.Logger = frplog.Logger.WithOptions(
		golog.WithOutput(frpWriter{log: log.Named("frp")}),
		golog.WithLevel(level),
		golog.WithCaller(false),
	)
}

// frpWriter receives frp's formatted lines ("2026-11-23 03:00:00.000 [W] msg").
type frpWriter struct{ log *zap.Logger }

// headerLen is the length of golib's "2006-01-02 15:04:05.000 [I] " prefix.
const headerLen = len("2006-01-02 15:04:05.000 [I] ")

func (w frpWriter) WriteLog(p []byte, level golog.Level, _ time.Time) (int, error) {
	msg := bytes.TrimRight(p, "\n")
	if len(msg) >= headerLen {
		msg = msg[headerLen:]
	}
	if level == golog.WarnLevel && benign(msg) {
		level = golog.DebugLevel
	}
	if level == golog.WarnLevel && loginRejected(msg) {
		return len(p), nil
	}
	switch level {
	case golog.ErrorLevel:
		w.log.Error(string(msg))
	case golog.WarnLevel:
		w.log.Warn(string(msg))
	default:
		w.log.Debug(string(msg))
	}
	return len(p), nil
}

// benignWarnings are frp warnings that describe tether's normal operation:
// its stream listener closing at shutdown, and close-of-route notifications
// to the auth plugin that race with the plugin's own shutdown.
var benignWarnings = [][]byte{
	[]byte("listener for incoming connections from client closed"),
	[]byte("send CloseProxy request to plugin"),
}

func benign(msg []byte) bool {
	for _, b := range benignWarnings {
		if bytes.Contains(msg, b) {
			return true
		}
	}
	return false
}

// registerControlError is how frp's server logs a refused login: with the
// refusal the auth plugin answered, "<reason>: <detail>" (auth.RejectError).
var registerControlError = []byte("register control error: ")

// loginRejected reports whether msg is frp's line about a login the auth
// plugin refused: its error starts with one of auth's reasons. frp's other
// failures to register a login (what tether did not log) are not.
func loginRejected(msg []byte) bool {
	i := bytes.Index(msg, registerControlError)
	if i < 0 {
		return false
	}
	rest := msg[i+len(registerControlError):]
	for _, r := range auth.Reasons() {
		if after, ok := bytes.CutPrefix(rest, []byte(r)); ok && (len(after) == 0 || after[0] == ':') {
			return true
		}
	}
	return false
}

// Write is unused by golib when WriteLog exists; it keeps frpWriter an io.Writer.
func (w frpWriter) Write(p []byte) (int, error) {
	return w.WriteLog(p, golog.InfoLevel, time.Time{})
}
