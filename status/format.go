package status

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tether-dev/tether/internal/human"
	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server"
)

// none stands for an empty field in a table.
const none = "<none>"

// Printer writes results in one format.
type Printer struct {
	Out    io.Writer
	Format Format
	// Now is the clock ages are measured against.
	Now func() time.Time
}

// Tunnels prints a server's tunnels. An empty list prints
// "No tunnels connected." (in JSON, []).
func (p Printer) Tunnels(list []server.Info) error {
	if p.Format == JSON {
		if list == nil {
			list = []server.Info{}
		}
		return writeJSON(p.Out, list)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(p.Out, "No tunnels connected.")
		return err
	}
	now := p.Now()
	tw := newTabWriter(p.Out)
	header := "NAME\tACCOUNT\tRUNTIME\tCLIENT\tCONNECTED\tVERSION\tIN\tOUT"
	if p.Format == Wide {
		header += "\tTRANSPORT\tROUTE\tTOKEN-EXPIRES\tREQUESTS"
	}
	fmt.Fprintln(tw, header)
	for _, t := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", orNone(t.Name), orNone(t.Account), orNone(t.Runtime),
			orNone(t.ClientAddress), human.Age(now.Sub(t.ConnectedSince)), orNone(t.ClientVersion), human.Bytes(t.BytesIn), human.Bytes(t.BytesOut))
		if p.Format == Wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%d", orNone(t.Transport), orNone(t.Route), timeLeft(t.TokenExpires, now), t.Requests)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// Client prints one client's state; Wide prints what Table does.
func (p Printer) Client(s client.Snapshot) error {
	if p.Format == JSON {
		return writeJSON(p.Out, s)
	}
	now := p.Now()
	tw := newTabWriter(p.Out)
	fmt.Fprintf(tw, "Tunnel:\t%s\n", orNone(s.Tunnel))
	fmt.Fprintf(tw, "Server:\t%s\n", orNone(s.Server))
	fmt.Fprintf(tw, "Transport:\t%s\n", orNone(s.Transport))
	fmt.Fprintf(tw, "Via:\t%s\n", orNone(s.Via))
	fmt.Fprintf(tw, "State:\t%s\n", orNone(s.State))
	fmt.Fprintf(tw, "Logged in:\t%s\n", since(s.LoggedInSince, now))
	fmt.Fprintf(tw, "Connected:\t%s\n", since(s.ConnectedSince, now))
	if s.LastError == "" {
		fmt.Fprintf(tw, "Last error:\t%s\n", none)
	} else {
		fmt.Fprintf(tw, "Last error:\t%s (%s)\n", s.LastError, ago(s.LastErrorAt, now))
	}
	fmt.Fprintf(tw, "Reconnects:\t%d\n", s.Reconnects)
	if len(s.Routes) == 0 {
		fmt.Fprintf(tw, "Routes:\t%s\n", none)
		return tw.Flush()
	}
	fmt.Fprintln(tw, "Routes:")
	if err := tw.Flush(); err != nil {
		return err
	}
	tw = newTabWriter(p.Out)
	fmt.Fprintln(tw, "  PREFIX\tUPSTREAM\tADAPTER")
	for _, r := range s.Routes {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", r.Prefix, r.Upstream, orNone(r.Adapter))
	}
	return tw.Flush()
}

func newTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

// since says "yes, for 5m (since 2006-01-02T15:04:05Z)", or "no" when t is nil.
func since(t *time.Time, now time.Time) string {
	if t == nil {
		return "no"
	}
	return fmt.Sprintf("yes, for %s (since %s)", human.Age(now.Sub(*t)), t.UTC().Format(time.RFC3339))
}

// ago says "5m ago"; unknown when t is nil.
func ago(t *time.Time, now time.Time) string {
	if t == nil {
		return "time unknown"
	}
	return human.Age(now.Sub(*t)) + " ago"
}

// timeLeft says how long until t: "29d", or "expired 5m ago".
func timeLeft(t, now time.Time) string {
	if t.IsZero() {
		return none
	}
	if d := t.Sub(now); d > 0 {
		return human.Age(d)
	}
	return "expired " + human.Age(now.Sub(t)) + " ago"
}

// FilteredTunnels prints the tunnels f keeps. When names match no tunnel it
// prints what did match (in JSON, always the list) and returns the
// *NoMatchError.
func (p Printer) FilteredTunnels(list []server.Info, f Filter) error {
	kept, err := f.Apply(list)
	if err != nil && len(kept) == 0 && p.Format != JSON {
		return err
	}
	if perr := p.Tunnels(kept); perr != nil {
		return perr
	}
	return err
}
