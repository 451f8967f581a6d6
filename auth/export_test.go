package auth

import "time"

// NewFileKeySourceWith is NewFileKeySource with the reload interval and clock
// injected, so tests neither sleep nor wait a second for a reload.
func NewFileKeySourceWith(path string, interval time.Duration, now func() time.Time) (KeySource, error) {
	return newFileKeySource(path, ParseKeySet, interval, now)
}

// NewHMACKeySourceWith is NewHMACKeySource with the reload interval and clock
// injected.
func NewHMACKeySourceWith(path string, interval time.Duration, now func() time.Time) (KeySource, error) {
	return newFileKeySource(path, parseHMACKeySet, interval, now)
}

// NewSignerFromKey returns a Signer for an in-memory private key.
func NewSignerFromKey(key any) (*Signer, error) {
	return newSigner(key)
}
