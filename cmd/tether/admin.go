package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/tether-dev/tether/status"
)

// AdminOptions are the flags of the commands that act through a server's
// admin API: tether token revoke, revocations and unrevoke, and tether
// tunnel disconnect.
type AdminOptions struct {
	Admin          string
	AdminTokenFile string
	Output         string
	Timeout        time.Duration
}

func (o *AdminOptions) addFlags(fl *pflag.FlagSet) {
	fl.StringVar(&o.Admin, "admin", "", "server admin URL (the server's --admin-addr), e.g. http://127.0.0.1:7700 (required)")
	fl.StringVar(&o.AdminTokenFile, "admin-token-file", "", "file holding the server's admin bearer token (the server's --admin-token-file)")
	fl.StringVarP(&o.Output, "output", "o", "", "json; default text for people")
	fl.DurationVar(&o.Timeout, "timeout", status.DefaultTimeout, "bound on the request")
}

// client checks the flags and returns the admin API client and the
// printer of the answer; its errors are usage errors.
func (o *AdminOptions) client(f *Factory) (*status.Admin, status.Printer, error) {
	var errs []error
	if o.Admin == "" {
		errs = append(errs, errors.New("--admin is required: the server's admin URL (its --admin-addr), e.g. http://127.0.0.1:7700"))
	}
	if o.Output != "" && o.Output != string(status.JSON) {
		errs = append(errs, fmt.Errorf("--output %q: want json (or nothing, for text)", o.Output))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, status.Printer{}, err
	}
	admin, err := status.NewAdmin(o.Admin, o.AdminTokenFile)
	if err != nil {
		return nil, status.Printer{}, err
	}
	admin.Timeout = o.Timeout
	return admin, status.Printer{Out: f.Out, Format: status.Format(o.Output), Now: time.Now}, nil
}
