package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

func TestNewJSON(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, Options{Format: "json"})
	if err != nil {
		t.Fatal(err)
	}
	log.Named("server").Info("client connected", zap.String("tunnel", "acme"), zap.Duration("duration", 1500*time.Millisecond))

	var entry map[string]any
	if err := json.Unmarshal(buf.Bytes(), &entry); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, buf.Bytes())
	}
	for key, want := range map[string]string{
		"level":    "info",
		"logger":   "server",
		"msg":      "client connected",
		"tunnel":   "acme",
		"duration": "1.5s",
	} {
		if got := entry[key]; got != want {
			t.Errorf("%s = %v, want %q", key, got, want)
		}
	}
	ts, _ := entry["ts"].(string)
	if _, err := time.Parse(time.RFC3339, ts); err != nil {
		t.Errorf("ts %q is not RFC 3339: %v", ts, err)
	}
	if caller, _ := entry["caller"].(string); !strings.HasPrefix(caller, "logging/logging_test.go:") {
		t.Errorf("caller = %q, want logging/logging_test.go:<line>", caller)
	}
	if _, ok := entry["stacktrace"]; ok {
		t.Error("info entry has a stacktrace")
	}
}

func TestNewConsole(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, Options{Format: "console", Level: "debug"})
	if err != nil {
		t.Fatal(err)
	}
	log.Warn("reconnecting", zap.String("tunnel", "acme"))
	out := buf.String()
	for _, want := range []string{"\tWARN\t", "reconnecting", `{"tunnel": "acme"}`} {
		if !strings.Contains(out, want) {
			t.Errorf("console output %q does not contain %q", out, want)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("console output %q has colour escapes", out)
	}
}

func TestNewAutoFormat(t *testing.T) {
	// A buffer and a regular file are not terminals: auto means JSON.
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = file.Close() })
	var buf bytes.Buffer
	for name, w := range map[string]interface {
		Write([]byte) (int, error)
	}{"buffer": &buf, "file": file} {
		t.Run(name, func(t *testing.T) {
			log, err := New(w, Options{})
			if err != nil {
				t.Fatal(err)
			}
			log.Info("hello")
			if err := log.Sync(); err != nil {
				t.Errorf("Sync: %v", err)
			}
		})
	}
	data, err := os.ReadFile(file.Name())
	if err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string][]byte{"buffer": buf.Bytes(), "file": data} {
		if !json.Valid(bytes.TrimSpace(out)) {
			t.Errorf("%s: auto format wrote %q, want JSON", name, out)
		}
	}
}

func TestLevelFiltering(t *testing.T) {
	tests := []struct {
		level string
		want  []string
	}{
		{"", []string{"info", "warn", "error"}},
		{"debug", []string{"debug", "info", "warn", "error"}},
		{"info", []string{"info", "warn", "error"}},
		{"WARN", []string{"warn", "error"}},
		{"error", []string{"error"}},
	}
	for _, tc := range tests {
		t.Run(tc.level, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := New(&buf, Options{Level: tc.level, Format: "json"})
			if err != nil {
				t.Fatal(err)
			}
			log.Debug("m")
			log.Info("m")
			log.Warn("m")
			log.Error("m")
			var got []string
			for line := range strings.Lines(buf.String()) {
				var entry struct{ Level string }
				if err := json.Unmarshal([]byte(line), &entry); err != nil {
					t.Fatalf("line %q: %v", line, err)
				}
				got = append(got, entry.Level)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("got levels %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want []string
	}{
		{"level", Options{Level: "verbose"}, []string{`log level "verbose"`, "debug, info, warn, error", "--log-level"}},
		{"format", Options{Format: "text"}, []string{`log format "text"`, "auto, json, console", "--log-format"}},
		{"both", Options{Level: "trace", Format: "xml"}, []string{`log level "trace"`, `log format "xml"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, err := New(new(bytes.Buffer), tc.opts)
			if err == nil {
				t.Fatalf("New(%+v) succeeded, want an error", tc.opts)
			}
			if log != nil {
				t.Error("New returned a logger with its error")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestAddFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Options
		wantErr string
	}{
		{name: "defaults", want: Options{Level: "info", Format: "auto"}},
		{name: "set", args: []string{"--log-level=DEBUG", "--log-format", "console"}, want: Options{Level: "debug", Format: "console"}},
		{name: "bad level", args: []string{"--log-level=loud"}, wantErr: "want one of debug, info, warn, error"},
		{name: "bad format", args: []string{"--log-format=yaml"}, wantErr: "want one of auto, json, console"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var opts Options
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			fs.SetOutput(new(bytes.Buffer))
			opts.AddFlags(fs)
			err := fs.Parse(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if opts != tc.want {
				t.Errorf("got %+v, want %+v", opts, tc.want)
			}
			if _, err := New(new(bytes.Buffer), opts); err != nil {
				t.Errorf("New with parsed flags: %v", err)
			}
		})
	}
}

func TestAddFlagsKeepsPresetDefaults(t *testing.T) {
	opts := Options{Level: "warn", Format: "json"}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if got := fs.Lookup("log-level").DefValue; got != "warn" {
		t.Errorf("--log-level default = %q, want warn", got)
	}
	if got := fs.Lookup("log-format").DefValue; got != "json" {
		t.Errorf("--log-format default = %q, want json", got)
	}
}

func TestRedact(t *testing.T) {
	if got := Redact(""); got != "" {
		t.Errorf(`Redact("") = %q, want ""`, got)
	}
	if got := Redact("eyJhbGciOi..."); got != "[redacted]" {
		t.Errorf("Redact(token) = %q, want [redacted]", got)
	}
}

// failSyncer fails Sync with a chosen error.
type failSyncer struct {
	bytes.Buffer
	err error
}

func (f *failSyncer) Sync() error { return f.err }

func TestSyncIgnoresUnsyncableOutputs(t *testing.T) {
	diskErr := errors.New("disk on fire")
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"terminal or pipe", &os.PathError{Op: "sync", Path: "/dev/stderr", Err: syscall.EINVAL}, nil},
		{"real failure", diskErr, diskErr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, err := New(&failSyncer{err: tc.err}, Options{Format: "json"})
			if err != nil {
				t.Fatal(err)
			}
			if got := log.Sync(); !errors.Is(got, tc.want) {
				t.Errorf("Sync() = %v, want %v", got, tc.want)
			}
		})
	}
}
