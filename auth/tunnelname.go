package auth

import (
	"errors"
	"fmt"
)

// MaxTunnelNameLength is the longest valid tunnel name: a DNS label.
const MaxTunnelNameLength = 63

// ErrInvalidTunnelName is wrapped by every error of [ValidTunnelName].
var ErrInvalidTunnelName = errors.New("invalid tunnel name")

// ValidTunnelName reports whether name is a valid tunnel name, with an error
// that says why not. A tunnel name is a DNS label (RFC 1123): 1 to 63
// characters, lowercase letters a-z, digits 0-9 and '-', neither starting nor
// ending with '-'. The tunnel named N is served at N.<domain>, so anything
// else could not be a hostname. The error wraps [ErrInvalidTunnelName].
func ValidTunnelName(name string) error {
	if problem := tunnelNameProblem(name); problem != "" {
		return fmt.Errorf("%w: %s", ErrInvalidTunnelName, problem)
	}
	return nil
}

// tunnelNameProblem says what is wrong with name, or "" if nothing is.
func tunnelNameProblem(name string) string {
	switch {
	case name == "":
		return fmt.Sprintf("tunnel name is empty; want 1 to %d characters a-z, 0-9 and '-'", MaxTunnelNameLength)
	case len(name) > MaxTunnelNameLength:
		return fmt.Sprintf("tunnel name %s is %d characters long; want at most %d", quote(name), len(name), MaxTunnelNameLength)
	}
	for i, r := range name {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || r == '-' {
			continue
		}
		hint := ""
		if 'A' <= r && r <= 'Z' {
			hint = " (uppercase is not allowed)"
		}
		return fmt.Sprintf("tunnel name %s has %q at byte %d%s; want only a-z, 0-9 and '-'", quote(name), r, i, hint)
	}
	if name[0] == '-' || name[len(name)-1] == '-' {
		return fmt.Sprintf("tunnel name %s starts or ends with '-'; want a letter or digit there", quote(name))
	}
	return ""
}
