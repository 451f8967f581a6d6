package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// generates reports whether a values file asks the chart for random
// secrets (generateSecrets), the one way a render may differ from the next.
func generates(t *testing.T, file string) bool {
	t.Helper()
	v, _ := lookupPath(readValues(t, file), []string{"generateSecrets"})
	return v == true
}

// TestRendersAreReproducible: two renders with the same values are byte for
// byte the same, for every documented values set of both charts, so that a
// GitOps tool (Argo CD renders with helm template, which cannot look
// Secrets up) syncs without changing anything, and no checksum annotation
// rolls the pods. Only generateSecrets makes random values. Every kind of
// resource the chart renders with all its options on is in some render
// compared, so that no option escapes the comparison by showing only in
// all-on-values.yaml, which may generate secrets.
func TestRendersAreReproducible(t *testing.T) {
	for _, c := range charts {
		want := renderedKinds(t, c.mustTemplate(t, []string{c.allOn()}))
		var mu sync.Mutex
		compared := map[string]bool{}
		t.Cleanup(func() {
			for _, k := range want {
				if !compared[k] {
					t.Errorf("%s: no values set compared here renders a %s: add a ci/*-values.yaml without generateSecrets that does", c.name, k)
				}
			}
		})
		for name, files := range renders(t, c) {
			if len(files) == 1 && generates(t, files[0]) {
				continue
			}
			t.Run(c.name+"/"+name, func(t *testing.T) {
				t.Parallel()
				first, err := c.template(t, files)
				if err != nil {
					t.Fatal(err)
				}
				second, err := c.template(t, files)
				if err != nil {
					t.Fatal(err)
				}
				if first != second {
					t.Errorf("two renders differ:\n%s", firstDifference(first, second))
				}
				mu.Lock()
				defer mu.Unlock()
				for _, k := range renderedKinds(t, decodeAll(t, first)) {
					compared[k] = true
				}
			})
		}
	}
}

// renderedKinds lists the apiVersion and kind of each manifest of m.
func renderedKinds(t *testing.T, m *manifests) []string {
	t.Helper()
	var kinds []string
	for _, doc := range m.docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, tm.APIVersion+" "+tm.Kind)
	}
	return kinds
}

// firstDifference shows the first line where a and b differ.
func firstDifference(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return "line " + strconv.Itoa(i+1) + ":\n  " + al[i] + "\n  " + bl[i]
		}
	}
	return "one render is longer"
}

// TestGeneratedSecretsAreKept: with generateSecrets the chart makes the
// admin token, the peer secret and the trial Redis's password, each random
// and at least 32 characters, and looks the installed Secret up first, so
// that an upgrade keeps them.
func TestGeneratedSecretsAreKept(t *testing.T) {
	file := filepath.Join(serverChart.dir(), "ci", "generated-secrets-values.yaml")
	m := serverChart.mustTemplate(t, []string{file})
	again := serverChart.mustTemplate(t, []string{file})
	generated := 0
	for i, s := range m.secrets {
		for k, v := range s.Data {
			if k == "redis.conf" {
				continue
			}
			generated++
			if len(v) < 32 {
				t.Errorf("Secret %s key %s holds %d bytes; want a random value of at least 32", s.Name, k, len(v))
			}
			if string(again.secrets[i].Data[k]) == string(v) {
				t.Errorf("Secret %s key %s is the same in two renders: not random", s.Name, k)
			}
		}
	}
	if generated != 3 {
		t.Errorf("%d generated values; want the admin token, the peer secret and the Redis password", generated)
	}
	helpers, err := os.ReadFile(filepath.Join(serverChart.dir(), "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)define "tether-server.generated".*lookup "v1" "Secret" \.ctx\.Release\.Namespace \.name`).Match(helpers) {
		t.Error(`"tether-server.generated" does not look the installed Secret up: every upgrade would change the secrets under running replicas`)
	}
	for _, f := range []string{"secrets.yaml", "redis.yaml"} {
		text, err := os.ReadFile(filepath.Join(serverChart.dir(), "templates", f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(text), "randAlpha") || !strings.Contains(string(text), `include "tether-server.generated"`) {
			t.Errorf("%s makes a random value outside \"tether-server.generated\"", f)
		}
	}
}

// TestTmpIsWritable: every tether container has an emptyDir at /tmp, its
// root being read-only, so that `tether diagnose --bundle /tmp/...` works.
func TestTmpIsWritable(t *testing.T) {
	for _, tc := range []struct {
		c         chart
		container string
	}{{serverChart, "server"}, {clientChart, "tether-client"}} {
		pod := &tc.c.mustTemplate(t, nil).deployment(t).Spec.Template.Spec
		checkTmp(t, pod, container(t, pod, tc.container))
	}
}

func checkTmp(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != "/tmp" {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.EmptyDir != nil && !vm.ReadOnly {
				return
			}
		}
	}
	t.Errorf("container %s has no writable emptyDir at /tmp", c.Name)
}

// TestClientRedundancy: replicaCount reaches the Deployment, with a budget
// that never blocks a node drain for an unready pod, pods spread over nodes,
// and their /metrics reachable through a Service and a PodMonitor.
func TestClientRedundancy(t *testing.T) {
	m := clientChart.mustTemplate(t, nil, "replicaCount=3", "metrics.service.enabled=true", "metrics.podMonitor.enabled=true")
	d := m.deployment(t)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas %v; want replicaCount 3", d.Spec.Replicas)
	}
	pod := &d.Spec.Template.Spec
	c := container(t, pod, "tether-client")
	if len(m.pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets; want 1", len(m.pdbs))
	}
	pdb := m.pdbs[0]
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || !selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("PodDisruptionBudget %+v; want maxUnavailable 1 over the client's pods", pdb.Spec)
	}
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != "AlwaysAllow" {
		t.Errorf("unhealthyPodEvictionPolicy %v; want AlwaysAllow: with the platform away every pod is unready, and drains must go on", p)
	}
	if len(pod.TopologySpreadConstraints) != 1 {
		t.Fatalf("topology spread %+v; want one constraint over nodes", pod.TopologySpreadConstraints)
	}
	tsc := pod.TopologySpreadConstraints[0]
	if tsc.TopologyKey != "kubernetes.io/hostname" || tsc.WhenUnsatisfiable != "ScheduleAnyway" ||
		tsc.LabelSelector == nil || !selects(tsc.LabelSelector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("topology spread %+v; want the client's pods over kubernetes.io/hostname, ScheduleAnyway", tsc)
	}
	svc := m.service(t, "-metrics")
	if !selects(svc.Spec.Selector, d.Spec.Template.Labels) || namedPort(t, c, svc.Spec.Ports[0].TargetPort.StrVal) != 8081 {
		t.Errorf("metrics Service %+v; want the client's pods' health port", svc.Spec)
	}
	if len(m.podMonitors) != 1 {
		t.Fatalf("%d PodMonitors; want 1", len(m.podMonitors))
	}
	pm := m.podMonitors[0]
	if ep := pm.Spec.PodMetricsEndpoints; len(ep) != 1 || ep[0].Path != "/metrics" || namedPort(t, c, ep[0].Port) != 8081 ||
		!selects(pm.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("PodMonitor %+v; want /metrics on the health port of the client's pods", pm.Spec)
	}

	hard := clientChart.mustTemplate(t, nil, "topologySpread=hard").deployment(t).Spec.Template.Spec.TopologySpreadConstraints
	if len(hard) != 1 || hard[0].WhenUnsatisfiable != "DoNotSchedule" {
		t.Errorf("topologySpread=hard: %+v; want DoNotSchedule", hard)
	}
	if none := clientChart.mustTemplate(t, nil, "topologySpread=").deployment(t).Spec.Template.Spec.TopologySpreadConstraints; len(none) != 0 {
		t.Errorf("topologySpread empty: %+v; want none", none)
	}
}

// TestClientReadiness: the client's own Deployment is ready while its tunnel
// is logged in; probes.readiness.mode changes that.
func TestClientReadiness(t *testing.T) {
	for mode, want := range map[string]string{"": "/readyz", "tunnel": "/readyz", "process": "/healthz"} {
		pod := &clientChart.mustTemplate(t, nil, "probes.readiness.mode="+mode).deployment(t).Spec.Template.Spec
		if got := container(t, pod, "tether-client").ReadinessProbe.HTTPGet.Path; got != want {
			t.Errorf("mode %q: readiness on %s; want %s", mode, got, want)
		}
	}
}

// TestImageIsTheRelease: the charts' image is the one a release of their
// appVersion builds: `make release VERSION=vX.Y.Z` sets the charts' version
// X.Y.Z and appVersion vX.Y.Z and tags the image vX.Y.Z.
func TestImageIsTheRelease(t *testing.T) {
	for _, tc := range []struct {
		c         chart
		container string
	}{{serverChart, "server"}, {clientChart, "tether-client"}} {
		meta := chartMeta(t, tc.c)
		if meta.AppVersion != "v"+meta.Version {
			t.Errorf("%s: appVersion %q, version %q; want appVersion v<version>, as make release sets them", tc.c.name, meta.AppVersion, meta.Version)
		}
		pod := &tc.c.mustTemplate(t, nil).deployment(t).Spec.Template.Spec
		if got, want := container(t, pod, tc.container).Image, "ghcr.io/tether-dev/tether:"+meta.AppVersion; got != want {
			t.Errorf("%s: image %s; want %s", tc.c.name, got, want)
		}
	}
}

type chartYAML struct {
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func chartMeta(t *testing.T, c chart) chartYAML {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(c.dir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m chartYAML
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
