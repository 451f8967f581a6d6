package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSidecarInRuntimeChart installs tether-client as a dependency of a
// runtime's chart (helm/testdata/runtime-app), which includes the sidecar
// templates into its own pod, and checks the pod it renders.
func TestSidecarInRuntimeChart(t *testing.T) {
	needHelm(t)
	src := filepath.Join("helm", "testdata", "runtime-app")
	dst := filepath.Join(t.TempDir(), "runtime-app")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	clientDir, err := filepath.Abs(clientChart.dir())
	if err != nil {
		t.Fatal(err)
	}
	chartFile := filepath.Join(dst, "Chart.yaml")
	data, err := os.ReadFile(chartFile)
	if err != nil {
		t.Fatal(err)
	}
	const rel = "file://../../tether-client"
	if !strings.Contains(string(data), rel) {
		t.Fatalf("%s no longer depends on %s", src, rel)
	}
	data = []byte(strings.Replace(string(data), rel, "file://"+clientDir, 1))
	if err := os.WriteFile(chartFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := helm(t, "dependency", "update", dst); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		set         []string
		connections string
		readiness   string
	}{
		// A sidecar's readiness is the process's: the platform never makes
		// the runtime's pod NotReady.
		"defaults": {nil, clientConnectionsDefault(), "/healthz"},
		"ca, proxy and connections": {[]string{"tether-client.tls.caConfigMap=corp-ca", "tether-client.proxy.noProxy=.cluster.local",
			"tether-client.health.port=9999", "tether-client.connections=5"}, "5", "/healthz"},
		"tunnel readiness": {[]string{"tether-client.probes.readiness.mode=tunnel"}, clientConnectionsDefault(), "/readyz"},
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"template", "rt", dst, "--kube-version", kubeVersion}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := helm(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			m := decodeAll(t, out)
			d := m.deployment(t) // the runtime's own; the client renders none
			if d.Name != "rt-app-proxy" {
				t.Fatalf("rendered Deployment %s; want the runtime's rt-app-proxy", d.Name)
			}
			pod := &d.Spec.Template.Spec
			container(t, pod, "app-proxy")
			c := container(t, pod, "tether-client")
			flags := checkClientContainer(t, pod, c)
			if got := flags["token-file"]; len(got) != 1 || got[0] != "/var/run/tether/token/token" {
				t.Errorf("--token-file %v; want /var/run/tether/token/token", got)
			}
			if got := flags["connections"]; fmt.Sprint(got) != fmt.Sprint([]string{tc.connections}) {
				t.Errorf("--connections %v; want [%s]", got, tc.connections)
			}
			if got := c.ReadinessProbe.HTTPGet.Path; got != tc.readiness {
				t.Errorf("sidecar readiness on %s; want %s", got, tc.readiness)
			}
			if want := "ghcr.io/tether-dev/tether:" + chartMeta(t, clientChart).AppVersion; c.Image != want {
				t.Errorf("sidecar image %s; want the tether-client chart's appVersion, %s", c.Image, want)
			}
			checkTmp(t, pod, c)
			var tokenSecret string
			for _, v := range pod.Volumes {
				if v.Name == "tether-token" && v.Secret != nil {
					tokenSecret = v.Secret.SecretName
				}
			}
			if tokenSecret != "runtime-tunnel-token" {
				t.Errorf("token volume from Secret %q; want the runtime's runtime-tunnel-token", tokenSecret)
			}
			if len(pod.Volumes) < 2 || pod.Volumes[0].Name != "cache" {
				t.Errorf("volumes %v; want the runtime's own volume kept beside the sidecar's", pod.Volumes)
			}
			if len(m.secrets)+len(m.serviceAccounts)+len(m.networkPolicies) != 0 {
				t.Errorf("the dependency rendered resources of its own: %d Secrets, %d ServiceAccounts, %d NetworkPolicies",
					len(m.secrets), len(m.serviceAccounts), len(m.networkPolicies))
			}
		})
	}
}
