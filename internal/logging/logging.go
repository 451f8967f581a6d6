// Package logging builds the zap logger every tether command logs with, and
// the --log-level and --log-format flags that configure it.
//
// Usage, in a command:
//
//	var logOpts logging.Options
//	logOpts.AddFlags(cmd.Flags())
//	// ... after the flags (and config.Apply) ran:
//	log, err := logging.New(cmd.ErrOrStderr(), logOpts)
//	if err != nil {
//		return err
//	}
//	defer func() { _ = log.Sync() }()
//	srv, err := server.New(cfg, log.Named("server"))
//
// Output is JSON, one object per line with the keys ts (RFC 3339, millisecond
// precision), level, logger, msg and caller, unless the writer is a terminal:
// then it is zap's console format, tab-separated and without colour, for
// people reading it. Stack traces are attached only to DPanic and above: an
// Error log is for an operator, who needs the message and fields, not frames.
//
// What it deliberately does not do: install global loggers (zap.ReplaceGlobals,
// zap.RedirectStdLog), sample or drop entries, rotate files, or colour output.
// It cannot tell a secret from other data: callers never pass token, key,
// Authorization or Cookie values to a logger, and use Redact to show only
// whether such a value is present.
package logging

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
)

// levels lists the values Options.Level accepts, least severe first.
var levels = []string{"debug", "info", "warn", "error"}

// formats lists the values Options.Format accepts.
var formats = []string{"auto", "json", "console"}

// Options configure New. The zero value logs at info level in the auto format.
type Options struct {
	// Level is the least severe level written: debug, info, warn or error
	// (any case). "" means info.
	Level string
	// Format is the encoding: json, console, or auto for console when the
	// writer is a terminal and JSON otherwise. "" means auto.
	Format string
}

// timeLayout is RFC 3339 with milliseconds: entries written in the same second
// still sort, and every RFC 3339 parser reads it.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// New builds the process logger writing to w (stderr in production). Errors
// name the bad option and list the allowed values. Writes to w are serialised,
// so w need not be safe for concurrent use.
func New(w io.Writer, opts Options) (*zap.Logger, error) {
	level, errLevel := parseLevel(opts.Level)
	format, errFormat := parseFormat(opts.Format)
	if err := errors.Join(errLevel, errFormat); err != nil {
		return nil, err
	}
	if format == "auto" {
		format = "json"
		if isTerminal(w) {
			format = "console"
		}
	}

	enc := zapcore.EncoderConfig{
		TimeKey:        "ts",
		LevelKey:       "level",
		NameKey:        "logger",
		CallerKey:      "caller",
		FunctionKey:    zapcore.OmitKey,
		MessageKey:     "msg",
		StacktraceKey:  "stacktrace",
		LineEnding:     zapcore.DefaultLineEnding,
		EncodeLevel:    zapcore.LowercaseLevelEncoder,
		EncodeTime:     zapcore.TimeEncoderOfLayout(timeLayout),
		EncodeDuration: zapcore.StringDurationEncoder,
		EncodeCaller:   zapcore.ShortCallerEncoder,
		EncodeName:     zapcore.FullNameEncoder,
	}
	var encoder zapcore.Encoder
	if format == "console" {
		enc.EncodeLevel = zapcore.CapitalLevelEncoder
		encoder = zapcore.NewConsoleEncoder(enc)
	} else {
		encoder = zapcore.NewJSONEncoder(enc)
	}

	ws := zapcore.Lock(syncer{w})
	core := zapcore.NewCore(encoder, ws, level)
	return zap.New(core,
		zap.AddCaller(),
		zap.AddStacktrace(zapcore.DPanicLevel),
		zap.ErrorOutput(ws),
	), nil
}

// AddFlags registers --log-level and --log-format on fs, bound to o (used by
// every command). A value other than those New accepts is rejected when set,
// so a bad value from the command line, the environment or a config file is
// reported where it was given. Non-empty fields of o become the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	if o.Level == "" {
		o.Level = "info"
	}
	if o.Format == "" {
		o.Format = "auto"
	}
	fs.Var(&choice{value: &o.Level, allowed: levels}, "log-level",
		"least severe log level written: "+strings.Join(levels, ", "))
	fs.Var(&choice{value: &o.Format, allowed: formats}, "log-format",
		"log encoding: json, console, or auto (console when stderr is a terminal, else json)")
}

// Redact returns "[redacted]" for a non-empty s and "" for an empty one, so a
// log line can show that a secret is set without showing it:
// log.Info("token loaded", zap.String("token", logging.Redact(tok))).
func Redact(s string) string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

func parseLevel(s string) (zapcore.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return zapcore.DebugLevel, nil
	case "", "info":
		return zapcore.InfoLevel, nil
	case "warn":
		return zapcore.WarnLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	return 0, fmt.Errorf("log level %q not supported; want one of %s (--log-level)", s, strings.Join(levels, ", "))
}

func parseFormat(s string) (string, error) {
	switch f := strings.ToLower(s); f {
	case "":
		return "auto", nil
	case "auto", "json", "console":
		return f, nil
	}
	return "", fmt.Errorf("log format %q not supported; want one of %s (--log-format)", s, strings.Join(formats, ", "))
}

// isTerminal reports whether w is a file attached to a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// syncer adapts any writer to zapcore.WriteSyncer. Sync flushes writers that
// can be synced and ignores the errors that stderr gives when it is a terminal
// or a pipe, which cannot be synced (uber-go/zap#370, #880): a deferred Sync at
// exit must not turn a clean run into a failure.
type syncer struct{ io.Writer }

func (s syncer) Sync() error {
	f, ok := s.Writer.(interface{ Sync() error })
	if !ok {
		return nil
	}
	err := f.Sync()
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTTY) || errors.Is(err, syscall.ENOTSUP) ||
		errors.Is(err, os.ErrInvalid) {
		return nil
	}
	return err
}

// choice is a string flag restricted to a list of values, compared without
// regard to case and stored lower-cased.
type choice struct {
	value   *string
	allowed []string
}

func (c *choice) String() string {
	if c.value == nil {
		return ""
	}
	return *c.value
}

func (c *choice) Set(s string) error {
	v := strings.ToLower(s)
	for _, a := range c.allowed {
		if v == a {
			*c.value = v
			return nil
		}
	}
	return fmt.Errorf("want one of %s", strings.Join(c.allowed, ", "))
}

func (c *choice) Type() string { return "string" }
