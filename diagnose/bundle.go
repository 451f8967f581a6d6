package diagnose

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tether-dev/tether/tunnel/client"
)

// BundleOptions say what goes into a support bundle besides the report.
type BundleOptions struct {
	// Version is `tether version`'s output.
	Version string
	// Settings are the effective settings, secrets already redacted.
	Settings []Setting
	// HealthAddr is the client's --health-addr; when it answers, its
	// /status, /metrics and /debug/logs go into the bundle.
	HealthAddr string
	// Secrets are removed from every file, wherever they appear, as a last
	// line of defence: the token, and the egress proxy's credentials
	// (client.ProxySecrets).
	Secrets []string
	// Timeout bounds each request to the health address. Default 5s.
	Timeout time.Duration
	// Now stamps the files (time.Now when nil).
	Now func() time.Time
}

// WriteBundle writes a support bundle, a .tar.gz of: report.json,
// report.txt, version.txt, config.txt and, where the client's health address
// answers, status.json, metrics.txt and logs.txt (its recent log lines).
// missing.txt lists what could not be collected and why.
func WriteBundle(ctx context.Context, w io.Writer, r Report, o BundleOptions) error {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var files []bundleFile
	var reportJSON, reportText, cfg bytes.Buffer
	_ = WriteJSON(&reportJSON, r)
	WriteText(&reportText, r)
	for _, s := range o.Settings {
		fmt.Fprintf(&cfg, "%s = %s (%s)\n", s.Key, s.Value, s.Source)
	}
	files = append(files,
		bundleFile{"report.json", reportJSON.Bytes()},
		bundleFile{"report.txt", reportText.Bytes()},
		bundleFile{"version.txt", []byte(o.Version + "\n")},
		bundleFile{"config.txt", cfg.Bytes()},
	)
	var missing []string
	if o.HealthAddr == "" {
		missing = append(missing, "status.json, metrics.txt, logs.txt: no --health-addr, so the client's state could not be read; add kubectl logs of the client container")
	} else {
		base := "http://" + client.LocalHealthAddr(o.HealthAddr)
		for _, f := range []struct{ name, path string }{
			{"status.json", "/status"}, {"metrics.txt", "/metrics"}, {"logs.txt", "/debug/logs"},
		} {
			body, err := fetch(ctx, base+f.path, o.Timeout)
			if err != nil {
				missing = append(missing, fmt.Sprintf("%s: %v", f.name, err))
				continue
			}
			files = append(files, bundleFile{f.name, body})
		}
	}
	if len(missing) > 0 {
		files = append(files, bundleFile{"missing.txt", []byte(strings.Join(missing, "\n") + "\n")})
	}

	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		data := scrub(f.data, o.Secrets)
		hdr := &tar.Header{Name: "tether-diagnose/" + f.name, Mode: 0o644, Size: int64(len(data)), ModTime: o.Now()}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write bundle: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("write bundle: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return gz.Close()
}

type bundleFile struct {
	name string
	data []byte
}

// scrub replaces every occurrence of a secret.
func scrub(data []byte, secrets []string) []byte {
	for _, s := range secrets {
		if s != "" {
			data = bytes.ReplaceAll(data, []byte(s), []byte("[redacted]"))
		}
	}
	return data
}

func fetch(ctx context.Context, url string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 8<<20))
}
