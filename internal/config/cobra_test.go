package config

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestApplyWithCobra pins the integration the package doc describes: Apply in
// PreRunE, and a required flag satisfied by the environment or the file.
func TestApplyWithCobra(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		file    string
		want    string
		wantErr string
	}{
		{name: "required flag from env", env: map[string]string{"TETHER_SERVER": "env:7000"}, want: "env:7000"},
		{name: "required flag from file", file: "server: file:7000\n", want: "file:7000"},
		{name: "flag wins", args: []string{"--server=cli:7000"}, file: "server: file:7000\n", want: "cli:7000"},
		{name: "still required", wantErr: `required flag(s) "server" not set`},
		{name: "file errors stop the command", file: "sever: x\n", wantErr: `did you mean "server"?`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var server, got string
			cmd := &cobra.Command{
				Use:           "client",
				SilenceUsage:  true,
				SilenceErrors: true,
				PreRunE: func(cmd *cobra.Command, _ []string) error {
					fs := cmd.Flags()
					return Apply(fs, Path(fs, "config", env(tc.env)), env(tc.env), "config", "help")
				},
				RunE: func(*cobra.Command, []string) error {
					got = server
					return nil
				},
			}
			cmd.Flags().String("config", "", "config file")
			cmd.Flags().StringVar(&server, "server", "", "tunnel server address")
			if err := cmd.MarkFlagRequired("server"); err != nil {
				t.Fatal(err)
			}
			args := tc.args
			if tc.file != "" {
				args = append(args, "--config", writeFile(t, tc.file))
			}
			cmd.SetArgs(args)
			cmd.SetOut(new(bytes.Buffer))
			cmd.SetErr(new(bytes.Buffer))

			err := cmd.Execute()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("server = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestApplyTestdata(t *testing.T) {
	tests := []struct {
		file       string
		wantErrors int
	}{
		{"testdata/valid.yaml", 0},
		{"testdata/anchors.yaml", 0},
		{"testdata/invalid.yaml", 9},
		{"testdata/toplevel-list.yaml", 1},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			err := Apply(newTestFlags().fs, tc.file, nil, "config")
			if got := len(unjoinAll(err)); got != tc.wantErrors {
				t.Errorf("got %d errors, want %d:\n%v", got, tc.wantErrors, err)
			}
		})
	}
}

func unjoinAll(err error) []error {
	if err == nil {
		return nil
	}
	return unjoin(err)
}
