package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/status"
)

// NewCmdToken builds `tether token` and its subcommands.
func NewCmdToken(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Make signing keys, issue tunnel tokens, and revoke them",
	}
	groupCommands(cmd)
	cmd.AddCommand(NewCmdTokenKeygen(f, nil), NewCmdTokenIssue(f, nil),
		NewCmdTokenRevoke(f, nil), NewCmdTokenRevocations(f, nil), NewCmdTokenUnrevoke(f, nil))
	return cmd
}

// KeygenOptions are the flags of `tether token keygen`.
type KeygenOptions struct {
	PrivateKey string
	PublicKey  string
	Algorithm  string
}

// NewCmdTokenKeygen builds `tether token keygen`.
func NewCmdTokenKeygen(f *Factory, runF func(*KeygenOptions) error) *cobra.Command {
	opts := &KeygenOptions{}
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Make a token signing key pair (Ed25519 by default)",
		Long: `Make a key pair for signing tunnel tokens. The private key (PKCS#8 PEM, mode 0600)
stays with the platform's token issuer; the public key goes to every tether
server (--jwt-public-key). Existing files are never overwritten.`,
		Example: `  tether token keygen --private-key jwt.key.pem --public-key jwt.pub.pem`,
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if runF != nil {
				return runF(opts)
			}
			if opts.PrivateKey == "" || opts.PublicKey == "" {
				return invalid(errors.New("--private-key and --public-key are required: the files to write"))
			}
			if err := auth.GenerateKeyPair(auth.Algorithm(opts.Algorithm), opts.PrivateKey, opts.PublicKey); err != nil {
				return err
			}
			signer, err := auth.LoadSigner(opts.PrivateKey)
			if err != nil {
				return err
			}
			fmt.Fprintf(f.Out, "wrote %s (private, %s, kid %s) and %s (public)\n",
				opts.PrivateKey, signer.Algorithm(), signer.KeyID(), opts.PublicKey)
			return nil
		},
	}
	cmd.Flags().StringVar(&opts.PrivateKey, "private-key", "", "private key file to write (required)")
	cmd.Flags().StringVar(&opts.PublicKey, "public-key", "", "public key file to write (required)")
	cmd.Flags().StringVar(&opts.Algorithm, "algorithm", string(auth.EdDSA), "EdDSA (Ed25519), ES256 or RS256")
	return cmd
}

// IssueOptions are the flags of `tether token issue`.
type IssueOptions struct {
	Key        string
	HMACSecret string
	Tunnel     string
	Account    string
	Runtime    string
	Issuer     string
	Audience   []string
	TTL        time.Duration
}

// NewCmdTokenIssue builds `tether token issue`.
func NewCmdTokenIssue(f *Factory, runF func(*IssueOptions) error) *cobra.Command {
	opts := &IssueOptions{}
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Issue a tunnel token (JWT) and print it on stdout",
		Long: `Issue a JWT for one tunnel. sub is the tunnel name (a DNS label): the tunnel is
served at <tunnel>.<domain> and the token can register nothing else.`,
		Example: `  tether token issue --key jwt.key.pem --tunnel acme-prod --account acme --runtime prod --ttl 720h > token`,
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if runF != nil {
				return runF(opts)
			}
			signer, err := opts.signer()
			if err != nil {
				return invalid(err)
			}
			if opts.TTL <= 0 {
				return invalid(errors.New("--ttl is required: how long the token is valid, e.g. 720h"))
			}
			token, err := signer.Issue(auth.IssueRequest{
				Tunnel: opts.Tunnel, Account: opts.Account, Runtime: opts.Runtime,
				Issuer: opts.Issuer, Audience: opts.Audience, TTL: opts.TTL,
			}, time.Now())
			if err != nil {
				return invalid(err)
			}
			fmt.Fprintln(f.Out, token)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Key, "key", "", "private key file from `tether token keygen`")
	fl.StringVar(&opts.HMACSecret, "hmac-secret-file", "", "sign with HS256 using the secret in this file instead of --key")
	fl.StringVar(&opts.Tunnel, "tunnel", "", "tunnel name, the token's sub (required)")
	fl.StringVar(&opts.Account, "account", "", "platform account, for logs and metrics")
	fl.StringVar(&opts.Runtime, "runtime", "", "platform runtime, for logs and metrics")
	fl.StringVar(&opts.Issuer, "issuer", "", "iss claim")
	fl.StringSliceVar(&opts.Audience, "audience", nil, "aud claim (repeat for several)")
	fl.DurationVar(&opts.TTL, "ttl", 0, "validity, e.g. 24h or 720h (required)")
	return cmd
}

func (o *IssueOptions) signer() (*auth.Signer, error) {
	switch {
	case o.Key != "" && o.HMACSecret != "":
		return nil, errors.New("--key and --hmac-secret-file exclude each other")
	case o.Key != "":
		return auth.LoadSigner(o.Key)
	case o.HMACSecret != "":
		secret, err := auth.ReadHMACSecret(o.HMACSecret)
		if err != nil {
			return nil, err
		}
		return auth.NewHMACSigner(secret)
	}
	return nil, errors.New("--key is required: the private key file from `tether token keygen`")
}

// RevokeOptions are the flags of `tether token revoke`.
type RevokeOptions struct {
	AdminOptions
	Tunnel string
	JTI    string
	Until  string
	Reason string
}

// NewCmdTokenRevoke builds `tether token revoke`. runF replaces the call to
// the server (tests assert on the parsed options); nil makes it.
func NewCmdTokenRevoke(f *Factory, runF func(*RevokeOptions) error) *cobra.Command {
	opts := &RevokeOptions{}
	cmd := &cobra.Command{
		Use:   "revoke (--tunnel NAME | --jti ID)",
		Short: "Revoke a tunnel's tokens, or one token and its renewals, through a server's admin API",
		Long: `Revoke, through a server's admin API (POST /api/revocations), every token of a
tunnel (--tunnel) or one token (--jti, the token's ID; tether status shows the
one a client uses): the sessions it covers close on every replica within
seconds, and their logins are refused with reason "revoked" until --until, or
for good. Revoking a token's jti revokes every renewal of it too (a renewal
names the first token of its line in its renews claim): revoke the jti of the
token you issued. Other tunnels are untouched. Revocations persist where the
servers keep them (Redis, or --data-dir).

It prints the revocation's ID, which tether token unrevoke takes.`,
		Example: `  tether token revoke --admin https://tether-admin.internal --admin-token-file admin-token --tunnel acme-prod --reason offboarded
  tether token revoke --admin 127.0.0.1:7700 --jti 3f2a9c1e0b7d4a6f --until 24h --reason "leaked in a CI log"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			req, err := opts.request(time.Now())
			admin, p, aerr := opts.client(f)
			if err := errors.Join(err, aerr); err != nil {
				return invalid(err)
			}
			rev, err := admin.Revoke(cmd.Context(), req)
			if err != nil {
				return err
			}
			return p.Revoked(rev)
		},
	}
	fl := cmd.Flags()
	opts.addFlags(fl)
	fl.StringVar(&opts.Tunnel, "tunnel", "", "revoke every token of this tunnel")
	fl.StringVar(&opts.JTI, "jti", "", "revoke the token with this ID (jti), and every renewal of it")
	fl.StringVar(&opts.Until, "until", "", "end of the revocation: a time (RFC 3339, e.g. 2025-03-01T12:00:00Z) or a duration from now (e.g. 24h); default: for good")
	fl.StringVar(&opts.Reason, "reason", "", "why, for the listing and the servers' logs")
	return cmd
}

// request checks the flags and makes the revocation to ask for at now.
func (o *RevokeOptions) request(now time.Time) (status.RevokeRequest, error) {
	var errs []error
	switch {
	case o.Tunnel != "" && o.JTI != "":
		errs = append(errs, errors.New("--tunnel and --jti exclude each other: revoke a tunnel (every token of it) or one token (and its renewals)"))
	case o.Tunnel == "" && o.JTI == "":
		errs = append(errs, errors.New("what to revoke? pass --tunnel NAME (every token of the tunnel) or --jti ID (one token and its renewals)"))
	case o.Tunnel != "":
		if err := auth.ValidTunnelName(o.Tunnel); err != nil {
			errs = append(errs, fmt.Errorf("--tunnel: %w", err))
		}
	}
	until, err := parseUntil(o.Until, now)
	if err != nil {
		errs = append(errs, err)
	}
	return status.RevokeRequest{Tunnel: o.Tunnel, JTI: o.JTI, Until: until, Reason: o.Reason}, errors.Join(errs...)
}

// parseUntil reads --until: a time in RFC 3339, or a duration from now;
// "" is zero (for good). It must be in the future.
func parseUntil(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		d, derr := time.ParseDuration(s)
		if derr != nil {
			return time.Time{}, fmt.Errorf("--until %q: want a time (RFC 3339, e.g. 2025-03-01T12:00:00Z) or a duration from now (e.g. 24h or 90m)", s)
		}
		t = now.Add(d)
	}
	if !t.After(now) {
		return time.Time{}, fmt.Errorf("--until %q is not in the future; leave it out to revoke for good", s)
	}
	return t.UTC().Truncate(time.Second), nil
}

// NewCmdTokenRevocations builds `tether token revocations`.
func NewCmdTokenRevocations(f *Factory, runF func(*AdminOptions) error) *cobra.Command {
	opts := &AdminOptions{}
	cmd := &cobra.Command{
		Use:   "revocations",
		Short: "List the revocations in force, through a server's admin API",
		Long: `List the revocations in force (GET /api/revocations), the oldest first: their ID
(for tether token unrevoke), the tunnel or token (jti) they revoke, until when
(never: for good), the reason given, and when they were made. -o json prints
the endpoint's JSON list.`,
		Example: `  tether token revocations --admin https://tether-admin.internal --admin-token-file admin-token`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			admin, p, err := opts.client(f)
			if err != nil {
				return invalid(err)
			}
			list, err := admin.Revocations(cmd.Context())
			if err != nil {
				return err
			}
			return p.Revocations(list)
		},
	}
	opts.addFlags(cmd.Flags())
	return cmd
}

// UnrevokeOptions are the flags and the argument of `tether token unrevoke`.
type UnrevokeOptions struct {
	AdminOptions
	ID string
}

// NewCmdTokenUnrevoke builds `tether token unrevoke`.
func NewCmdTokenUnrevoke(f *Factory, runF func(*UnrevokeOptions) error) *cobra.Command {
	opts := &UnrevokeOptions{}
	cmd := &cobra.Command{
		Use:   "unrevoke ID",
		Short: "Delete a revocation, through a server's admin API",
		Long: `Delete the revocation ID (DELETE /api/revocations/{id}; tether token revocations
lists them): the tunnel or token it covered may log in again.`,
		Example: `  tether token unrevoke --admin https://tether-admin.internal --admin-token-file admin-token 0195a1b2c3d4e5f6a7b8`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return invalid(fmt.Errorf("want one revocation ID, got %d arguments: tether token revocations lists them", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if runF != nil {
				return runF(opts)
			}
			admin, p, err := opts.client(f)
			if err != nil {
				return invalid(err)
			}
			rev, err := admin.Unrevoke(cmd.Context(), opts.ID)
			if err != nil {
				return err
			}
			return p.Unrevoked(rev)
		},
	}
	opts.addFlags(cmd.Flags())
	return cmd
}
