package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/auth"
)

// NewCmdToken builds `tether token` and its subcommands.
func NewCmdToken(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Make signing keys and issue tunnel tokens",
	}
	groupCommands(cmd)
	cmd.AddCommand(NewCmdTokenKeygen(f, nil), NewCmdTokenIssue(f, nil))
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
