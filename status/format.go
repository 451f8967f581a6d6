package status

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

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
			orNone(t.ClientAddress), Age(now.Sub(t.ConnectedSince)), orNone(t.ClientVersion), Bytes(t.BytesIn), Bytes(t.BytesOut))
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
	return fmt.Sprintf("yes, for %s (since %s)", Age(now.Sub(*t)), t.UTC().Format(time.RFC3339))
}

// ago says "5m ago"; unknown when t is nil.
func ago(t *time.Time, now time.Time) string {
	if t == nil {
		return "time unknown"
	}
	return Age(now.Sub(*t)) + " ago"
}

// timeLeft says how long until t: "29d", or "expired 5m ago".
func timeLeft(t, now time.Time) string {
	if t.IsZero() {
		return none
	}
	if d := t.Sub(now); d > 0 {
		return Age(d)
	}
	return "expired " + Age(now.Sub(t)) + " ago"
}

// Age prints a duration the way kubectl prints AGE: precise when short,
// coarser as it grows (45s, 3m20s, 25m, 3h12m, 20h, 3d4h, 12d, 2y30d).
// A negative duration, from clocks that disagree, is 0s.
func Age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	sec := int64(d / time.Second)
	mins, hours, days := sec/60, sec/3600, sec/86400
	switch {
	case sec < 120:
		return fmt.Sprintf("%ds", sec)
	case mins < 10:
		return withRest(mins, "m", sec%60, "s")
	case hours < 3:
		return fmt.Sprintf("%dm", mins)
	case hours < 8:
		return withRest(hours, "h", mins%60, "m")
	case hours < 48:
		return fmt.Sprintf("%dh", hours)
	case days < 8:
		return withRest(days, "d", hours%24, "h")
	case days < 2*365:
		return fmt.Sprintf("%dd", days)
	case days < 8*365:
		return withRest(days/365, "y", days%365, "d")
	}
	return fmt.Sprintf("%dy", days/365)
}

// withRest prints "3h12m", or "3h" when the rest is 0.
func withRest(n int64, unit string, rest int64, restUnit string) string {
	if rest == 0 {
		return fmt.Sprintf("%d%s", n, unit)
	}
	return fmt.Sprintf("%d%s%d%s", n, unit, rest, restUnit)
}

// Bytes prints a byte count in binary units: 512B, 1.5KiB, 20MiB, 3.2GiB.
// Below 10 of a unit it keeps one decimal.
func Bytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatUint(n, 10) + "B"
	}
	v, i := float64(n)/1024, 0
	for v >= 1023.5 && i < len(units)-1 { // what would print as 1024
		v /= 1024
		i++
	}
	if v < 9.95 { // what would print as 10.0
		return fmt.Sprintf("%.1f%ciB", v, units[i])
	}
	return fmt.Sprintf("%.0f%ciB", v, units[i])
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
