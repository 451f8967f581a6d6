package deploy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

func envByName(c *corev1.Container) map[string]corev1.EnvVar {
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	return env
}

func envIndex(c *corev1.Container, name string) int {
	for i, e := range c.Env {
		if e.Name == name {
			return i
		}
	}
	return -1
}

func fieldRef(e corev1.EnvVar) string {
	if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
		return ""
	}
	return e.ValueFrom.FieldRef.FieldPath
}

func serverCI(name string) []string {
	return []string{filepath.Join(serverChart.dir(), "ci", name)}
}

// checkReplicas asserts, for any render of the server chart, what running
// several replicas takes: more than one (or an autoscaler) only with a Redis
// registry, and with one, each replica's peer listener, identity and
// secrets from the right sources.
func checkReplicas(t *testing.T, m *manifests, cfg map[string]any) {
	t.Helper()
	d := m.deployment(t)
	pod := &d.Spec.Template.Spec
	c := container(t, pod, "server")
	env := envByName(c)
	url, urlInConfig := cfg["registry"].(string)
	_, urlFromEnv := env["TETHER_REGISTRY"]
	shared := (urlInConfig && url != "memory") || urlFromEnv
	several := len(m.hpas) > 0 || d.Spec.Replicas == nil || *d.Spec.Replicas > 1
	if several && !shared {
		t.Errorf("%v replicas (HPA: %d) without a Redis registry: a replica could not serve the tunnels the others hold",
			d.Spec.Replicas, len(m.hpas))
	}
	if len(m.pdbs) == 1 {
		pdb := m.pdbs[0]
		if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() < 1 {
			t.Errorf("PodDisruptionBudget minAvailable %v, maxUnavailable %v; want maxUnavailable only, at least 1 (a single replica must stay evictable)",
				pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
		}
		if !selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			t.Errorf("PodDisruptionBudget selects %v; the server pods have %v", pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
		}
	}
	for _, e := range c.Env {
		if strings.Contains(e.Name, "SECRET") || strings.Contains(e.Name, "PASSWORD") {
			t.Errorf("env %s: secrets reach the server as files only", e.Name)
		}
	}
	if !shared {
		for _, k := range []string{"peer-addr", "peer-secret-file", "registry-password-file"} {
			if cfg[k] != nil {
				t.Errorf("config sets %s without a Redis registry", k)
			}
		}
		for _, p := range c.Ports {
			if p.Name == "peer" {
				t.Error("a peer port without a Redis registry")
			}
		}
		return
	}
	if urlInConfig == urlFromEnv {
		t.Errorf("registry in the config (%q) and in TETHER_REGISTRY (%v): want exactly one", url, urlFromEnv)
	}
	if urlInConfig && !regexp.MustCompile(`^rediss?://[^/:]+(:\d+)?(/\d+)?$`).MatchString(url) {
		t.Errorf("registry %q: want redis://HOST[:PORT][/DB] or rediss://...", url)
	}
	peerAddr, _ := cfg["peer-addr"].(string)
	if h, _, _ := net.SplitHostPort(peerAddr); h != "0.0.0.0" {
		t.Errorf("peer-addr %q; want 0.0.0.0:PORT so the other replicas reach it", peerAddr)
	}
	peerPort := namedPort(t, c, "peer")
	if peerPort != port(t, peerAddr) {
		t.Errorf("peer container port %d; peer-addr is %s", peerPort, peerAddr)
	}
	if got := fieldRef(env["TETHER_REPLICA_ID"]); got != "metadata.name" {
		t.Errorf("TETHER_REPLICA_ID from %q; want the pod name (metadata.name): unique per pod", got)
	}
	// Kubernetes expands $(POD_IP) only from a variable defined before.
	podIP, adv := envIndex(c, "POD_IP"), envIndex(c, "TETHER_PEER_ADVERTISE_ADDR")
	if podIP < 0 || adv < podIP || fieldRef(c.Env[podIP]) != "status.podIP" {
		t.Errorf("POD_IP (index %d) must come from status.podIP before TETHER_PEER_ADVERTISE_ADDR (index %d)", podIP, adv)
	} else if want := fmt.Sprintf("$(POD_IP):%d", peerPort); c.Env[adv].Value != want {
		t.Errorf("TETHER_PEER_ADVERTISE_ADDR = %q; want %q", c.Env[adv].Value, want)
	}
	secretFile, _ := cfg["peer-secret-file"].(string)
	if secretFile == "" {
		t.Fatal("a Redis registry without peer-secret-file: the server refuses to start")
	}
	checkSecretFile(t, pod, c, secretFile)
	if f, ok := cfg["registry-password-file"].(string); ok {
		checkSecretFile(t, pod, c, f)
	}
}

// TestSingleReplicaByDefault: the defaults run one replica on the in-memory
// registry, with nothing of the replicas' machinery.
func TestSingleReplicaByDefault(t *testing.T) {
	m := serverChart.mustTemplate(t, nil)
	d := m.deployment(t)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas %v; want 1 without a registry", d.Spec.Replicas)
	}
	cfg, _ := serverConfig(t, m)
	for _, k := range []string{"registry", "peer-addr", "peer-secret-file", "max-sessions-per-tunnel"} {
		if v, ok := cfg[k]; ok {
			t.Errorf("config %s = %v; want it unset by default", k, v)
		}
	}
	if len(container(t, &d.Spec.Template.Spec, "server").Env) != 0 {
		t.Error("env set for a single replica")
	}
	for _, s := range m.secrets {
		if strings.HasSuffix(s.Name, "-peer") {
			t.Errorf("Secret %s rendered without a registry", s.Name)
		}
	}
}

// TestServerReplicas renders the HA values: a Redis of one's own, Secrets
// one made, a custom peer port.
func TestServerReplicas(t *testing.T) {
	m := serverChart.mustTemplate(t, serverCI("ha-values.yaml"))
	cfg, _ := serverConfig(t, m)
	d := m.deployment(t)
	pod := &d.Spec.Template.Spec
	c := container(t, pod, "server")
	if *d.Spec.Replicas != 3 {
		t.Errorf("replicas %d; want 3", *d.Spec.Replicas)
	}
	want := map[string]any{
		"registry":                "rediss://redis.example.internal:6380/1",
		"registry-password-file":  "/etc/tether/registry/redis-password",
		"peer-addr":               "0.0.0.0:7900",
		"peer-secret-file":        "/etc/tether/peer/secret",
		"max-sessions-per-tunnel": 8,
	}
	for k, v := range want {
		if fmt.Sprint(cfg[k]) != fmt.Sprint(v) {
			t.Errorf("config %s = %v; want %v", k, cfg[k], v)
		}
	}
	for key, want := range map[string]string{
		"peer-secret-file":       "tether-peer/secret",
		"registry-password-file": "tether-redis/redis-password",
	} {
		if secret, k := secretFileSource(t, pod, c, cfg[key].(string)); secret+"/"+k != want {
			t.Errorf("%s from Secret %s key %s; want %s", key, secret, k, want)
		}
	}
	if v := envByName(c)["TETHER_PEER_ADVERTISE_ADDR"].Value; v != "$(POD_IP):7900" {
		t.Errorf("TETHER_PEER_ADVERTISE_ADDR = %q; want $(POD_IP):7900", v)
	}
	for _, s := range m.secrets {
		if strings.HasSuffix(s.Name, "-peer") {
			t.Errorf("rendered Secret %s although peerSecret.existingSecret names one", s.Name)
		}
	}

	// The drain fits: one replica at a time, readiness on /readyz, and the
	// kubelet waits for the drain with a margin.
	if len(m.pdbs) != 1 || m.pdbs[0].Spec.MaxUnavailable == nil || m.pdbs[0].Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudgets %d; want one with maxUnavailable 1", len(m.pdbs))
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge.IntValue() != 1 {
		t.Errorf("rolling update %+v; want maxSurge 1, maxUnavailable 0: a new replica is ready before an old one drains", ru)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v; want GET /readyz, which fails while the replica drains", c.ReadinessProbe)
	}
	if got := *pod.TerminationGracePeriodSeconds; got != 10+30+5 {
		t.Errorf("terminationGracePeriodSeconds %d; want 45: preStop 10 + shutdown-timeout 30 + margin 5", got)
	}
}

// TestNetworkPolicyPeerRule: with a registry, the policy admits the
// release's server pods, and only them, to the peer port; without one it
// has no peer rule. Nothing else changes: the same three public rules.
func TestNetworkPolicyPeerRule(t *testing.T) {
	for name, tc := range map[string]struct {
		files []string
		set   []string
		peer  bool
	}{
		"ha-values":   {serverCI("ha-values.yaml"), nil, true},
		"no registry": {nil, []string{"networkPolicy.enabled=true"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := serverChart.mustTemplate(t, tc.files, tc.set...)
			d := m.deployment(t)
			c := container(t, &d.Spec.Template.Spec, "server")
			np := serverPolicy(t, m)
			if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
				t.Errorf("policyTypes %v; want [Ingress]", np.Spec.PolicyTypes)
			}
			ports := map[string]networkingv1.NetworkPolicyIngressRule{}
			for _, r := range np.Spec.Ingress {
				if len(r.Ports) != 1 {
					t.Fatalf("ingress rule %+v; want one port per rule", r)
				}
				ports[r.Ports[0].Port.String()] = r
			}
			want := []string{"admin", "http", "tunnel"}
			if tc.peer {
				want = append(want, "peer")
			}
			if len(ports) != len(want) {
				t.Errorf("ingress rules for %v; want %v", ports, want)
			}
			for _, p := range want {
				if _, ok := ports[p]; !ok {
					t.Errorf("no ingress rule for port %s", p)
				}
				namedPort(t, c, p)
			}
			if !tc.peer {
				return
			}
			from := ports["peer"].From
			if len(from) != 1 || from[0].PodSelector == nil || from[0].NamespaceSelector != nil || from[0].IPBlock != nil {
				t.Fatalf("peer rule from %+v; want the server pods of this namespace alone", from)
			}
			sel := from[0].PodSelector.MatchLabels
			if len(sel) == 0 || !selects(sel, d.Spec.Template.Labels) {
				t.Errorf("peer rule selects %v; the server pods have %v", sel, d.Spec.Template.Labels)
			}
			if sel[componentLabel] != "server" {
				t.Errorf("peer rule selects %v; want only the server component, not every pod of the release", sel)
			}
		})
	}
}

func serverPolicy(t *testing.T, m *manifests) *networkingv1.NetworkPolicy {
	t.Helper()
	d := m.deployment(t)
	for _, np := range m.networkPolicies {
		if selects(np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) {
			return np
		}
	}
	t.Fatal("no NetworkPolicy selects the server pods")
	return nil
}

// TestPeerSecret: the chart's peer Secret holds the value given, or a
// random secret that upgrades keep; an existing Secret is mounted as is.
func TestPeerSecret(t *testing.T) {
	reg := append(append([]string{}, serverChart.required...), "registry.url=redis://redis:6379", "replicaCount=2")
	mountedFrom := func(t *testing.T, m *manifests) *corev1.Secret {
		t.Helper()
		cfg, _ := serverConfig(t, m)
		pod := &m.deployment(t).Spec.Template.Spec
		name, key := secretFileSource(t, pod, container(t, pod, "server"), cfg["peer-secret-file"].(string))
		s := m.secret(t, name)
		if _, ok := s.Data[key]; !ok {
			t.Fatalf("Secret %s has no key %s", name, key)
		}
		return s
	}

	m := serverChart.mustTemplate(t, nil, append(reg, "peerSecret.value=given-peer-secret-0123456789")...)
	if got := string(mountedFrom(t, m).Data["secret"]); got != "given-peer-secret-0123456789" {
		t.Errorf("peer secret %q; want peerSecret.value", got)
	}

	m = serverChart.mustTemplate(t, nil, reg...)
	if got := mountedFrom(t, m).Data["secret"]; len(got) < 32 {
		t.Errorf("generated peer secret %q; want at least 32 characters", got)
	}
	// Replicas of an installed release must keep the secret they share:
	// the template looks the Secret up before making a new one.
	text, err := os.ReadFile(filepath.Join(serverChart.dir(), "templates", "secrets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)peerSecretName.*lookup "v1" "Secret" \.Release\.Namespace \$name`).Match(text) {
		t.Error("secrets.yaml does not look up the existing peer Secret: every upgrade would change the secret under running replicas")
	}
}
