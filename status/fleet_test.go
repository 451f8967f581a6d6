package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/server"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// fleet is what the test admin API answers at /api/fleet: three replicas on
// Redis, the holders of a tunnel deliberately not in replica order.
var fleet = server.Fleet{
	Replica: "tether-server-1",
	Registry: registry.Status{
		Backend: "redis", Target: "redis://redis.tether.svc:6379/0", Up: true,
		Since: now.Add(-(3*time.Hour + 12*time.Minute)), Errors: 2, Held: 2, Remote: 2,
	},
	Tunnels: map[string][]registry.Holder{
		"globex": {{Replica: "tether-server-2", Addr: "10.0.2.7:7800", Epoch: 77}},
		"acme-prod": {
			{Replica: "tether-server-2", Addr: "10.0.2.7:7800", Epoch: 12},
			{Replica: "tether-server-0", Addr: "10.0.0.4:7800", Epoch: 9},
			{Replica: "tether-server-1", Addr: "10.0.1.5:7800", Epoch: 31},
		},
		"acme-dev": {{Replica: "tether-server-1", Addr: "10.0.1.5:7800", Epoch: 5}},
	},
}

// fleetAPI serves v at /api/fleet, encoded as a tether server encodes it,
// behind token when it is not "", and returns the admin URL and the body.
func fleetAPI(t *testing.T, token string, v any) (url string, body []byte) {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/fleet", func(w http.ResponseWriter, r *http.Request) {
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "missing or wrong admin token", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b.Bytes())
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, b.Bytes()
}

// showFleet runs what `tether status --admin URL --fleet` does and returns
// stdout.
func showFleet(t *testing.T, url, tokenFile string, format Format, names ...string) (string, error) {
	t.Helper()
	admin, filter := adminAndFilter(t, url, tokenFile, names)
	fl, err := admin.Fleet(context.Background())
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	err = Printer{Out: &out, Format: format, Now: clock}.FilteredFleet(fl, filter)
	return out.String(), err
}

func TestFleetTable(t *testing.T) {
	url, _ := fleetAPI(t, "", fleet)
	out, err := showFleet(t, url, "", Table)
	if err != nil {
		t.Fatal(err)
	}
	want := `Replica: tether-server-1   Registry: redis at redis://redis.tether.svc:6379/0, up for 3h12m (since 2025-03-01T08:48:00Z)
TUNNEL      REPLICAS
acme-dev    tether-server-1
acme-prod   tether-server-0,tether-server-1,tether-server-2
globex      tether-server-2
`
	if out != want {
		t.Errorf("fleet:\n%s\nwant:\n%s", out, want)
	}
}

// Wide adds the holders' peer addresses, in the order of their replicas.
func TestFleetWide(t *testing.T) {
	url, _ := fleetAPI(t, "", fleet)
	out, err := showFleet(t, url, "", Wide, "acme-*")
	if err != nil {
		t.Fatal(err)
	}
	want := `Replica: tether-server-1   Registry: redis at redis://redis.tether.svc:6379/0, up for 3h12m (since 2025-03-01T08:48:00Z)
TUNNEL      REPLICAS                                          PEER-ADDRESSES
acme-dev    tether-server-1                                   10.0.1.5:7800
acme-prod   tether-server-0,tether-server-1,tether-server-2   10.0.0.4:7800,10.0.1.5:7800,10.0.2.7:7800
`
	if out != want {
		t.Errorf("fleet -o wide:\n%s\nwant:\n%s", out, want)
	}
}

// While Redis is away the replica says so, since when and why, and shows
// its last view of the fleet.
func TestFleetRegistryDown(t *testing.T) {
	down := fleet
	down.Registry.Up, down.Registry.Since = false, now.Add(-30*time.Second)
	down.Registry.LastError = "dial tcp 10.0.9.9:6379: connect: connection refused"
	url, _ := fleetAPI(t, "", down)
	out, err := showFleet(t, url, "", Table, "globex")
	if err != nil {
		t.Fatal(err)
	}
	want := `Replica: tether-server-1   Registry: redis at redis://redis.tether.svc:6379/0, down for 30s (since 2025-03-01T11:59:30Z), last error: dial tcp 10.0.9.9:6379: connect: connection refused
TUNNEL   REPLICAS
globex   tether-server-2
`
	if out != want {
		t.Errorf("fleet:\n%s\nwant:\n%s", out, want)
	}
}

// A single replica's in-memory registry, with nothing connected.
func TestFleetEmpty(t *testing.T) {
	url, _ := fleetAPI(t, "", server.Fleet{
		Replica:  "laptop",
		Registry: registry.Status{Backend: "memory", Up: true, Since: now.Add(-5 * time.Minute)},
		Tunnels:  map[string][]registry.Holder{},
	})
	out, err := showFleet(t, url, "", Table)
	if want := "Replica: laptop   Registry: memory, up for 5m (since 2025-03-01T11:55:00Z)\nNo tunnels in the registry.\n"; err != nil || out != want {
		t.Errorf("stdout %q, error %v; want %q", out, err, want)
	}
	out, err = showFleet(t, url, "", JSON)
	var got server.Fleet
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.Tunnels == nil || len(got.Tunnels) != 0 {
		t.Errorf("json: stdout %q, error %v; want the fleet with an empty tunnels object", out, err)
	}
}

// -o json prints what the endpoint answered, byte for byte; names keep
// only the matching tunnels in it.
func TestFleetJSON(t *testing.T) {
	url, body := fleetAPI(t, "", fleet)
	out, err := showFleet(t, url, "", JSON)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(body) {
		t.Errorf("stdout:\n%s\nwant the endpoint's JSON:\n%s", out, body)
	}

	out, err = showFleet(t, url, "", JSON, "acme-*")
	if err != nil {
		t.Fatal(err)
	}
	var got server.Fleet
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Fatalf("stdout is not one fleet object: %v\n%s", err, out)
	}
	want := fleet
	want.Tunnels = map[string][]registry.Holder{"acme-dev": fleet.Tunnels["acme-dev"], "acme-prod": fleet.Tunnels["acme-prod"]}
	if !reflect.DeepEqual(got.Tunnels, want.Tunnels) || got.Replica != want.Replica || !got.Registry.Since.Equal(want.Registry.Since) {
		t.Errorf("JSON %+v, want %+v", got, want)
	}
}

func TestFleetFilter(t *testing.T) {
	url, _ := fleetAPI(t, "", fleet)
	tests := []struct {
		names   []string
		want    []string // tunnels in the table
		missing string   // in the error, "" for none
	}{
		{nil, []string{"acme-dev", "acme-prod", "globex"}, ""},
		{[]string{"glob?x", "acme-prod"}, []string{"acme-prod", "globex"}, ""},
		{[]string{"globex", "initech-*"}, []string{"globex"}, `"initech-*"`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			out, err := showFleet(t, url, "", Table, tc.names...)
			var got []string
			for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
				if i > 1 { // the registry's line and the header
					got = append(got, strings.Fields(line)[0])
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rows %q, want %q\n%s", got, tc.want, out)
			}
			var noMatch *NoMatchError
			switch {
			case tc.missing == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.missing != "" && (!errors.As(err, &noMatch) || !contains(err.Error(), tc.missing, "(3 connected)")):
				t.Errorf("error %v, want a NoMatchError naming %s and the 3 tunnels", err, tc.missing)
			}
		})
	}

	// A name that matches nothing prints nothing, but in JSON.
	if out, err := showFleet(t, url, "", Table, "initech"); err == nil || out != "" {
		t.Errorf("table: stdout %q, error %v; want nothing and an error", out, err)
	}
	out, err := showFleet(t, url, "", JSON, "initech")
	var got server.Fleet
	if err == nil || json.Unmarshal([]byte(out), &got) != nil || got.Replica != fleet.Replica || len(got.Tunnels) != 0 {
		t.Errorf("json: stdout %q, error %v; want the fleet without tunnels, and an error", out, err)
	}
}

// Everything in the fleet came over the network, and replica IDs and
// addresses from whatever can write the registry: it reaches the terminal
// escaped.
func TestFleetEscapes(t *testing.T) {
	hostile := server.Fleet{
		Replica: "r-1\x1b[2J",
		Registry: registry.Status{
			Backend: "redis\r", Target: "redis://h:6379/0\n  evil", Since: now.Add(-time.Minute),
			LastError: "boom\x1b[1A\u202e",
		},
		Tunnels: map[string][]registry.Holder{
			"acme\x1b[8m": {{Replica: "r-2\nacme   r-9", Addr: "10.0.0.1:1\t\u009b1m"}},
		},
	}
	url, _ := fleetAPI(t, "", hostile)
	for _, format := range []Format{Table, Wide, JSON} {
		out, err := showFleet(t, url, "", format)
		if err != nil {
			t.Fatal(err)
		}
		if r, ok := unsafeForTerminal(out); ok {
			t.Errorf("%q output holds %q:\n%q", format, r, out)
		}
		if format == JSON {
			var got server.Fleet
			if err := json.Unmarshal([]byte(out), &got); err != nil || !reflect.DeepEqual(got.Tunnels, hostile.Tunnels) {
				t.Errorf("JSON output decodes to %+v, %v; want the tunnels as the server sent them", got, err)
			}
			continue
		}
		if n := strings.Count(out, "\n"); n != 3 {
			t.Errorf("%q output has %d lines, want the registry's line, the header and one tunnel:\n%s", format, n, out)
		}
		for _, want := range []string{`r-1\x1b[2J`, `redis\r at redis://h:6379/0\n  evil`, `down for 60s`, `last error: boom\x1b[1A\u202e`,
			`acme\x1b[8m`, `r-2\nacme   r-9`} {
			if !strings.Contains(out, want) {
				t.Errorf("%q output lacks %s:\n%s", format, want, out)
			}
		}
		if want := `10.0.0.1:1\t\u009b1m`; format == Wide && !strings.Contains(out, want) {
			t.Errorf("wide output lacks %s:\n%s", want, out)
		}
	}
}

func TestFleetToken(t *testing.T) {
	const token = "s3cret-admin-token-0123456789"
	url, _ := fleetAPI(t, token, fleet)
	out, err := showFleet(t, url, writeTokenFile(t, token+"\n"), Table, "globex")
	if err != nil || !strings.HasSuffix(out, "\nglobex   tether-server-2\n") || strings.Contains(out, token) {
		t.Errorf("stdout %q, error %v; want globex's row", out, err)
	}
	if _, err := showFleet(t, url, "", Table); err == nil || !contains(err.Error(), "needs a token: pass --admin-token-file") || strings.Contains(err.Error(), token) {
		t.Errorf("without the token: error %v; want one asking for --admin-token-file", err)
	}
}

// A server without /api/fleet, or an answer that is not a fleet, is no
// tether server's fleet.
func TestFleetNotOurs(t *testing.T) {
	older := adminAPI(t, "", tunnels, nil) // serves /api/tunnels only
	_, err := showFleet(t, older, "", Table)
	if err == nil || !contains(err.Error(), "does not look like a tether server admin address", "/api/fleet", "404", "--admin") {
		t.Errorf("without /api/fleet: error %v; want one naming /api/fleet, the 404 and --admin", err)
	}
	other, _ := fleetAPI(t, "", map[string]any{"tunnels": map[string]any{}})
	_, err = showFleet(t, other, "", Table)
	if err == nil || !contains(err.Error(), "does not look like a tether server admin address", "without the replica") {
		t.Errorf("a JSON object that is no fleet: error %v; want one saying it is not a tether server", err)
	}
}
