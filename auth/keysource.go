package auth

import (
	"bytes"

	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// KeySource supplies the verification keys. A [Verifier] asks it for the keys
// at every Verify, so implementations must be cheap and safe for concurrent
// use.
type KeySource interface {
	// Keys returns the keys in force. A nil error means the keys are current.
	// A non-nil error with a non-nil KeySet means a reload failed and the
	// returned keys are the last good ones, still in force; sources report
	// each failed reload once, so the caller can log every error it gets.
	// A nil KeySet means there are no usable keys at all.
	Keys() (*KeySet, error)
}

// NewStaticKeySource returns a KeySource that always returns ks.
func NewStaticKeySource(ks *KeySet) KeySource {
	return staticKeySource{ks}
}

type staticKeySource struct{ ks *KeySet }

func (s staticKeySource) Keys() (*KeySet, error) { return s.ks, nil }

// reloadInterval is how often a file key source looks at its file.
const reloadInterval = time.Second

// maxKeyFileSize bounds a key file: a JWKS with many RSA keys is a few KiB.
const maxKeyFileSize = 1 << 20

// NewFileKeySource loads verification keys from the PEM or JWKS file at path
// (see [ParseKeySet]) and returns a KeySource that re-reads the file when it
// changes, so that a rotated Kubernetes Secret takes effect without a
// restart. It looks at the file's size, modification time and identity at most
// once per second, during a call to Keys. If a reload fails, the previous keys
// stay in force and Keys reports the error once. NewFileKeySource fails,
// naming the file, if the first load fails.
func NewFileKeySource(path string) (KeySource, error) {
	return newFileKeySource(path, ParseKeySet, reloadInterval, time.Now)
}

// NewHMACKeySource loads an HS256 secret from the file at path and returns a
// KeySource that re-reads it when it changes, like [NewFileKeySource]. The
// secret is the file's bytes with trailing newlines removed (see
// [ReadHMACSecret]), at least 32 bytes long. Use HS256 only when the platform
// cannot sign with a key pair: every holder of the secret can mint tokens.
func NewHMACKeySource(secretPath string) (KeySource, error) {
	return newFileKeySource(secretPath, parseHMACKeySet, reloadInterval, time.Now)
}

// ReadHMACSecret reads an HS256 secret file the way [NewHMACKeySource] does:
// trailing "\n" and "\r" are removed and at least 32 bytes must remain. Use it
// to build the matching [NewHMACSigner].
func ReadHMACSecret(path string) ([]byte, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	secret := trimNewlines(data)
	if len(secret) < minHMACSecret {
		return nil, fmt.Errorf("read HS256 secret %s: secret is %d bytes; want at least %d", path, len(secret), minHMACSecret)
	}
	return secret, nil
}

func parseHMACKeySet(data []byte) (*KeySet, error) {
	k, err := newHMACKey(trimNewlines(data))
	if err != nil {
		return nil, err
	}
	return &KeySet{keys: []verifyKey{k}}, nil
}

func trimNewlines(b []byte) []byte {
	return bytes.TrimRight(b, "\r\n")
}

// readKeyFile reads a key file, refusing one too large to be a key.
func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxKeyFileSize {
		return nil, fmt.Errorf("read %s: file is larger than %d bytes; want a key file", path, maxKeyFileSize)
	}
	return data, nil
}

// fileKeySource re-reads a key file when its identity, size or mtime changes.
type fileKeySource struct {
	path     string
	parse    func([]byte) (*KeySet, error)
	interval time.Duration
	now      func() time.Time

	mu        sync.Mutex
	keys      *KeySet     // last good keys
	checked   time.Time   // when the file was last looked at
	attempted os.FileInfo // the file as of the last load attempt, good or bad
	statErr   bool        // the last look failed: report again only after a success
}

func newFileKeySource(path string, parse func([]byte) (*KeySet, error), interval time.Duration, now func() time.Time) (*fileKeySource, error) {
	s := &fileKeySource{path: path, parse: parse, interval: interval, now: now}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load keys: %w", err)
	}
	ks, err := s.load()
	if err != nil {
		return nil, err
	}
	s.keys, s.attempted, s.checked = ks, fi, now()
	return s, nil
}

// load reads and parses the file.
func (s *fileKeySource) load() (*KeySet, error) {
	data, err := readKeyFile(s.path)
	if err != nil {
		return nil, fmt.Errorf("load keys: %w", err)
	}
	ks, err := s.parse(data)
	if err != nil {
		return nil, fmt.Errorf("load keys from %s: %w", s.path, err)
	}
	return ks, nil
}

// Keys implements KeySource.
func (s *fileKeySource) Keys() (*KeySet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if since := now.Sub(s.checked); since >= 0 && since < s.interval {
		return s.keys, nil
	}
	s.checked = now
	fi, err := os.Stat(s.path)
	if err != nil {
		if s.statErr {
			return s.keys, nil
		}
		s.statErr = true
		return s.keys, fmt.Errorf("check key file: %w; keeping the %d keys loaded before", err, s.keys.Len())
	}
	s.statErr = false
	if unchanged(s.attempted, fi) {
		return s.keys, nil
	}
	s.attempted = fi
	ks, err := s.load()
	if err != nil {
		return s.keys, fmt.Errorf("%w; keeping the %d keys loaded before", err, s.keys.Len())
	}
	s.keys = ks
	return ks, nil
}

// unchanged reports whether b is the same file as a, with the same size and
// modification time. A Kubernetes Secret volume swaps a symlink to a new
// directory, so os.SameFile catches a rotation even within one mtime tick.
func unchanged(a, b os.FileInfo) bool {
	return a != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
