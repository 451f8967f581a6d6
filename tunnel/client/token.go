package client

import (
	"fmt"
	"os"
	"strings"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tether-dev/tether/auth"
)

// readToken reads the JWT from the token file. It is called at every
// connect, so the file may change under a running client.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read --token-file: %w; mount the tunnel's token Secret there or fix the path", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("--token-file %s is empty: put the JWT from `tether token issue` in it", path)
	}
	return token, nil
}

// tunnelOf returns the tunnel a token names (its sub), without verifying
// it: only the server can, and the client needs the name to register the
// tunnel's route.
func tunnelOf(token string) (string, error) {
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err != nil {
		return "", fmt.Errorf("not a JWT (%w): put the token from `tether token issue` in the file", err)
	}
	if err := auth.ValidTunnelName(claims.Subject); err != nil {
		return "", fmt.Errorf("token's sub %q is not a tunnel name: %w", claims.Subject, err)
	}
	return claims.Subject, nil
}
