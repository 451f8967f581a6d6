package status

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tether-dev/tether/internal/human"
	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server"
	"github.com/tether-dev/tether/tunnel/server/registry"
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

// Tunnels prints a server's tunnels, a row per session. An empty list
// prints "No tunnels connected." (in JSON, []). Wide adds, besides the
// sessions' transport, route, token expiry and requests, each session's ID
// (its first 8 characters) and replica. The tunnels with buffered requests
// (webhooks stored while they were down) follow in a table of their own,
// those with no session here included.
func (p Printer) Tunnels(list []server.Info) error {
	if p.Format == JSON {
		if list == nil {
			list = []server.Info{}
		}
		return writeJSON(p.Out, list)
	}
	// A row with a buffer and no session is a tunnel's buffer alone.
	sessions := slices.DeleteFunc(slices.Clone(list), func(t server.Info) bool { return t.Session == "" && t.Buffer != nil })
	if err := p.sessionRows(sessions); err != nil {
		return err
	}
	return p.buffered(list)
}

// sessionRows prints the table of a server's sessions.
func (p Printer) sessionRows(list []server.Info) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(p.Out, "No tunnels connected.")
		return err
	}
	now := p.Now()
	tw := newTabWriter(p.Out)
	header := "NAME\tACCOUNT\tRUNTIME\tCLIENT\tCONNECTED\tVERSION\tIN\tOUT"
	if p.Format == Wide {
		header += "\tTRANSPORT\tROUTE\tTOKEN-EXPIRES\tREQUESTS\tSESSION\tREPLICA"
	}
	fmt.Fprintln(tw, header)
	for _, t := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", field(t.Name), field(t.Account), field(t.Runtime),
			field(t.ClientAddress), human.Age(now.Sub(t.ConnectedSince)), field(t.ClientVersion), human.Bytes(t.BytesIn), human.Bytes(t.BytesOut))
		if p.Format == Wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%d\t%s\t%s", field(t.Transport), field(t.Route), timeLeft(t.TokenExpires, now), t.Requests,
				field(shortID(t.Session)), field(t.Replica))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// buffered prints, after a blank line, a row for each tunnel of list with
// buffered requests: how many wait for delivery, how many their upstream
// rejected, their bytes and the age of the oldest. Nothing when none has.
func (p Printer) buffered(list []server.Info) error {
	seen := map[string]bool{}
	var rows []server.Info
	for _, t := range list {
		if t.Buffer != nil && !seen[t.Name] {
			seen[t.Name] = true
			rows = append(rows, t)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	now := p.Now()
	tw := newTabWriter(p.Out)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "BUFFERED\tQUEUED\tREJECTED\tBYTES\tOLDEST")
	for _, t := range rows {
		b := t.Buffer
		oldest := none
		if !b.Oldest.IsZero() {
			oldest = human.Age(now.Sub(b.Oldest))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", field(t.Name), b.Queued, b.Rejected, human.Bytes(uint64(max(b.Bytes, 0))), oldest)
	}
	return tw.Flush()
}

// shortIDLength is how much of a session ID a table shows: enough to tell a
// tunnel's sessions apart, and to find one in logs and in its client's
// status.
const shortIDLength = 8

// shortID returns the first shortIDLength characters of id.
func shortID(id string) string {
	n := 0
	for i := range id {
		if n == shortIDLength {
			return id[:i]
		}
		n++
	}
	return id
}

// Client prints one client's state, and its sessions when the client
// reports them; Wide adds each session's server session ID and last error.
func (p Printer) Client(s client.Snapshot) error {
	if p.Format == JSON {
		return writeJSON(p.Out, s)
	}
	now := p.Now()
	tw := newTabWriter(p.Out)
	fmt.Fprintf(tw, "Tunnel:\t%s\n", field(s.Tunnel))
	fmt.Fprintf(tw, "Server:\t%s\n", field(s.Server))
	fmt.Fprintf(tw, "Transport:\t%s\n", field(s.Transport))
	fmt.Fprintf(tw, "Via:\t%s\n", field(s.Via))
	fmt.Fprintf(tw, "State:\t%s\n", field(s.State))
	fmt.Fprintf(tw, "Logged in:\t%s\n", since(s.LoggedInSince, now))
	fmt.Fprintf(tw, "Connected:\t%s\n", since(s.ConnectedSince, now))
	if s.LastError == "" {
		fmt.Fprintf(tw, "Last error:\t%s\n", none)
	} else {
		fmt.Fprintf(tw, "Last error:\t%s (%s)\n", printable(s.LastError), ago(s.LastErrorAt, now))
	}
	fmt.Fprintf(tw, "Reconnects:\t%d\n", s.Reconnects)
	if s.Token != nil {
		clientToken(tw, s.Token, now)
	}
	if len(s.Routes) == 0 {
		fmt.Fprintf(tw, "Routes:\t%s\n", none)
		if err := tw.Flush(); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(tw, "Routes:")
		if err := tw.Flush(); err != nil {
			return err
		}
		tw = newTabWriter(p.Out)
		fmt.Fprintln(tw, "  PREFIX\tUPSTREAM\tADAPTER")
		for _, r := range s.Routes {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", printable(r.Prefix), printable(r.Upstream), field(r.Adapter))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return p.sessions(s.Sessions, now)
}

// clientToken prints the token a client logs in with: where it came from,
// its jti (and, for a renewal, the first token's, which a revocation by
// jti names), its expiry, the last renewal, and the warning when it has
// one.
func clientToken(tw io.Writer, t *client.TokenState, now time.Time) {
	what := field(t.Source)
	switch t.Source {
	case client.TokenFromFile:
		what += " (--token-file)"
	case client.TokenRenewed:
		what += " (by the server)"
	}
	if t.JTI != "" {
		what += ", jti " + printable(t.JTI)
	}
	if t.Renews != "" {
		what += ", renews jti " + printable(t.Renews)
	}
	fmt.Fprintf(tw, "Token:\t%s\n", what)
	expires := "never (no exp: the server refuses the token)"
	if t.ExpiresAt != nil {
		expires = fmt.Sprintf("%s (%s)", timeLeft(*t.ExpiresAt, now), t.ExpiresAt.UTC().Format(time.RFC3339))
		if t.ExpiresAt.After(now) {
			expires = "in " + expires
		}
	}
	fmt.Fprintf(tw, "Expires:\t%s\n", expires)
	renewed := "never"
	if t.RenewedAt != nil {
		renewed = fmt.Sprintf("%s (%s)", ago(t.RenewedAt, now), t.RenewedAt.UTC().Format(time.RFC3339))
	}
	if t.Renewals > 0 {
		renewed += fmt.Sprintf(", %d renewals since the client started", t.Renewals)
	}
	fmt.Fprintf(tw, "Renewed:\t%s\n", renewed)
	if t.Warning != "" {
		fmt.Fprintf(tw, "Warning:\t%s\n", printable(t.Warning))
	}
}

// sessions prints a client's sessions; nothing for a client that does not
// report them.
func (p Printer) sessions(list []client.SessionState, now time.Time) error {
	if len(list) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(p.Out, "Sessions:"); err != nil {
		return err
	}
	tw := newTabWriter(p.Out)
	header := "  SLOT\tREPLICA\tSTATE\tSINCE\tVIA"
	if p.Format == Wide {
		header += "\tSESSION\tLAST ERROR"
	}
	notes := slices.ContainsFunc(list, func(s client.SessionState) bool { return len(s.SharesReplicaWith) > 0 })
	if notes {
		header += "\tNOTE"
	}
	fmt.Fprintln(tw, header)
	for _, s := range list {
		age := none
		if s.Since != nil {
			age = human.Age(now.Sub(*s.Since))
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s", s.Slot, field(s.Replica), field(s.State), age, field(s.Via))
		if p.Format == Wide {
			fmt.Fprintf(tw, "\t%s\t%s", field(s.Session), field(s.LastError))
		}
		if notes {
			fmt.Fprintf(tw, "\t%s", sharing(s, now))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// sharing says which slots a session shares its replica with, and when its
// slot next tries to reach another replica.
func sharing(s client.SessionState, now time.Time) string {
	if len(s.SharesReplicaWith) == 0 {
		return ""
	}
	slots := make([]string, len(s.SharesReplicaWith))
	for i, o := range s.SharesReplicaWith {
		slots[i] = strconv.Itoa(o)
	}
	note := "shares its replica with slot " + strings.Join(slots, ", ")
	if len(slots) > 1 {
		note = "shares its replica with slots " + strings.Join(slots, ", ")
	}
	if s.NextTry != nil {
		note += "; tries another in " + human.Age(max(s.NextTry.Sub(now), 0))
	}
	return note
}

func newTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(escapeJSON(b), '\n'))
	return err
}

// escapeJSON writes as \uXXXX each character of encoded JSON that a
// terminal could act on and encoding/json leaves as it is (DEL, C1 controls,
// bidirectional overrides, ...; it escapes the C0 controls itself). The JSON
// still decodes to the same values.
func escapeJSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == '\n' || unicode.IsPrint(r) { // a raw newline is the indent's
			out = append(out, b[:size]...)
		} else {
			for _, u := range utf16.Encode([]rune{r}) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		}
		b = b[size:]
	}
	return out
}

// field is a value for a table: printable, or none when empty.
func field(s string) string {
	if s == "" {
		return none
	}
	return printable(s)
}

// printable returns s as it may reach a terminal. Every value status prints
// comes from the network (an admin API, a client's health address), and some
// from a tunnel client itself (its version, sent at login): a control
// character, an ANSI escape sequence, a bidirectional override or invalid
// UTF-8 in it could rewrite the screen, forge lines or break the table's
// columns. Each is shown escaped as Go writes it in a string (\x1b, \n, \r,
// \t, \u202e); backslashes are escaped too, so what is shown reads back
// unambiguously. Printable text, spaces included, is kept.
func printable(s string) string {
	if isPrintable(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r == '\\':
			b.WriteString(`\\`)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRuneToASCII(r) // '\x1b', '\n', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		s = s[size:]
	}
	return b.String()
}

func isPrintable(s string) bool {
	for _, r := range s {
		if r == '\\' || r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
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

// Fleet prints the registry's view of every replica's tunnels, as the
// replica asked sees it: a line on that replica and its registry, then a
// row per tunnel with the replicas that hold it. Wide adds the holders'
// peer addresses, in the order of their replicas. In JSON it prints the
// endpoint's object.
func (p Printer) Fleet(fl server.Fleet) error {
	if p.Format == JSON {
		if fl.Tunnels == nil {
			fl.Tunnels = map[string][]registry.Holder{}
		}
		return writeJSON(p.Out, fl)
	}
	if _, err := fmt.Fprintf(p.Out, "Replica: %s   Registry: %s\n", field(fl.Replica), registryState(fl.Registry, p.Now())); err != nil {
		return err
	}
	if len(fl.Tunnels) == 0 {
		_, err := fmt.Fprintln(p.Out, "No tunnels in the registry.")
		return err
	}
	tw := newTabWriter(p.Out)
	header := "TUNNEL\tREPLICAS"
	if p.Format == Wide {
		header += "\tPEER-ADDRESSES"
	}
	fmt.Fprintln(tw, header)
	for _, name := range slices.Sorted(maps.Keys(fl.Tunnels)) {
		holders := slices.SortedStableFunc(slices.Values(fl.Tunnels[name]), func(a, b registry.Holder) int {
			return strings.Compare(a.Replica, b.Replica)
		})
		replicas, addrs := make([]string, len(holders)), make([]string, len(holders))
		for i, h := range holders {
			replicas[i], addrs[i] = field(h.Replica), field(h.Addr)
		}
		fmt.Fprintf(tw, "%s\t%s", field(name), joinOrNone(replicas))
		if p.Format == Wide {
			fmt.Fprintf(tw, "\t%s", joinOrNone(addrs))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// registryState says "redis at redis://10.0.0.5:6379/0, up for 3h12m
// (since 2025-03-01T08:48:00Z)", and the last error when there was one.
func registryState(s registry.Status, now time.Time) string {
	var b strings.Builder
	b.WriteString(field(s.Backend))
	if s.Target != "" {
		b.WriteString(" at " + printable(s.Target))
	}
	state := "down"
	if s.Up {
		state = "up"
	}
	b.WriteString(", " + state)
	if !s.Since.IsZero() {
		fmt.Fprintf(&b, " for %s (since %s)", human.Age(now.Sub(s.Since)), s.Since.UTC().Format(time.RFC3339))
	}
	if s.LastError != "" {
		b.WriteString(", last error: " + printable(s.LastError))
	}
	return b.String()
}

func joinOrNone(list []string) string {
	if len(list) == 0 {
		return none
	}
	return strings.Join(list, ",")
}

// FilteredFleet prints the fleet's tunnels that f keeps. When names match
// no tunnel it prints what did match (in JSON, always the fleet) and
// returns the *NoMatchError.
func (p Printer) FilteredFleet(fl server.Fleet, f Filter) error {
	names := slices.Sorted(maps.Keys(fl.Tunnels))
	keep, err := f.match(names)
	if len(f.patterns) > 0 {
		kept := make(map[string][]registry.Holder)
		for i, name := range names {
			if keep[i] {
				kept[name] = fl.Tunnels[name]
			}
		}
		fl.Tunnels = kept
	}
	if err != nil && len(fl.Tunnels) == 0 && p.Format != JSON {
		return err
	}
	if perr := p.Fleet(fl); perr != nil {
		return perr
	}
	return err
}
