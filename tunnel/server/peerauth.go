package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// A forwarded request is signed, not sent with the peer secret: the peer
// port is plain HTTP on the cluster network, and a secret sent with every
// request would let anyone who can read that network send requests into
// every tunnel. The signature (peerAuthHeader) is
//
//	v1 <unix seconds> <hex HMAC-SHA256(secret, "tether peer v1\n" time "\n" method "\n" host "\n" request-URI)>
//
// so a captured request can only be replayed as it was, within
// peerSignatureSkew of its time, and never turned into another.
const peerSignatureSkew = time.Minute

// signPeer returns the peer signature of a request.
func signPeer(secret []byte, now time.Time, method, host, requestURI string) string {
	ts := strconv.FormatInt(now.Unix(), 10)
	return "v1 " + ts + " " + hex.EncodeToString(peerMAC(secret, ts, method, host, requestURI))
}

// verifyPeer checks a request's peer signature.
func verifyPeer(secret []byte, now time.Time, signature, method, host, requestURI string) bool {
	version, rest, ok := strings.Cut(signature, " ")
	if !ok || version != "v1" || len(secret) == 0 {
		return false
	}
	ts, sum, ok := strings.Cut(rest, " ")
	if !ok {
		return false
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	if d := now.Sub(time.Unix(unix, 0)); d > peerSignatureSkew || d < -peerSignatureSkew {
		return false
	}
	got, err := hex.DecodeString(sum)
	if err != nil {
		return false
	}
	return hmac.Equal(got, peerMAC(secret, ts, method, host, requestURI))
}

func peerMAC(secret []byte, ts, method, host, requestURI string) []byte {
	m := hmac.New(sha256.New, secret)
	for _, part := range []string{"tether peer v1", ts, method, host, requestURI} {
		m.Write([]byte(part))
		m.Write([]byte{'\n'})
	}
	return m.Sum(nil)
}
