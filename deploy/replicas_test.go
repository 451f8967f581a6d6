package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/registry"
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
		if len(m.certificates) != 0 {
			t.Errorf("%d Certificates rendered without a Redis registry: there is no peer channel", len(m.certificates))
		}
		for _, k := range append([]string{"peer-addr", "peer-secret-file", "registry-password-file"}, peerTLSKeys...) {
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
	checkPeerCredentials(t, m, pod, c, cfg)
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
	for _, k := range append([]string{"registry", "peer-addr", "peer-secret-file", "max-sessions-per-tunnel"}, peerTLSKeys...) {
		if v, ok := cfg[k]; ok {
			t.Errorf("config %s = %v; want it unset by default", k, v)
		}
	}
	if len(container(t, &d.Spec.Template.Spec, "server").Env) != 0 {
		t.Error("env set for a single replica")
	}
	for _, s := range m.secrets {
		if strings.HasSuffix(s.Name, "-peer") || strings.HasSuffix(s.Name, "-redis") {
			t.Errorf("Secret %s rendered without a registry", s.Name)
		}
	}
	if m.redis(t) != nil {
		t.Error("the trial Redis is on by default")
	}
	if len(m.certificates) != 0 {
		t.Errorf("%d Certificates rendered by default", len(m.certificates))
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

// TestPeerSecret: the chart's peer Secret holds the value given, or with
// generateSecrets a random one (TestGeneratedSecretsAreKept).
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

	m = serverChart.mustTemplate(t, nil, append(reg, "generateSecrets=true")...)
	if got := mountedFrom(t, m).Data["secret"]; len(got) < 32 {
		t.Errorf("generated peer secret %q; want at least 32 characters", got)
	}
}

// TestTrialRedis: redis.enabled runs one Redis, marked as not for
// production, wired as the registry with its password as a file, reachable
// only from the server pods; and the config the chart gives it makes a real
// redis-server require exactly that password and keep nothing on disk.
func TestTrialRedis(t *testing.T) {
	password := `trial "redis" pass\word`
	values := filepath.Join(t.TempDir(), "password-values.yaml")
	if err := os.WriteFile(values, []byte(fmt.Sprintf("redis:\n  password: %q\n", password)), 0o600); err != nil {
		t.Fatal(err)
	}
	m := serverChart.mustTemplate(t, append(serverCI("trial-redis-values.yaml"), values))
	r := m.redis(t)
	if r == nil {
		t.Fatal("redis.enabled rendered no Redis Deployment")
	}
	if r.Spec.Replicas == nil || *r.Spec.Replicas != 1 || r.Spec.Strategy.Type != "Recreate" {
		t.Errorf("Redis replicas %v, strategy %s; want 1, Recreate", r.Spec.Replicas, r.Spec.Strategy.Type)
	}
	if !strings.Contains(r.Annotations["tether.dev/not-for-production"], "no persistence") {
		t.Errorf("Redis annotations %v; want it marked not for production", r.Annotations)
	}
	rpod := &r.Spec.Template.Spec
	rc := container(t, rpod, "redis")
	checkHardened(t, rpod, rc)
	if rc.Image != "registry.example.com/mirror/redis:7.2-alpine" {
		t.Errorf("Redis image %s; want redis.image's", rc.Image)
	}
	for _, v := range rpod.Volumes {
		if v.EmptyDir == nil && v.Secret == nil {
			t.Errorf("Redis volume %s is neither an emptyDir nor a Secret: the trial Redis keeps nothing", v.Name)
		}
	}

	// Its Service, and only it, selects the Redis pod.
	var svc *corev1.Service
	for _, s := range m.services {
		if selects(s.Spec.Selector, r.Spec.Template.Labels) {
			if svc != nil {
				t.Errorf("Services %s and %s both select the Redis pod", svc.Name, s.Name)
			}
			svc = s
		}
	}
	if svc == nil {
		t.Fatal("no Service selects the Redis pod")
	}
	if p := namedPort(t, rc, svc.Spec.Ports[0].TargetPort.StrVal); p != 6379 {
		t.Errorf("Redis Service targets port %d; want 6379", p)
	}

	// The server uses it: URL, password file.
	cfg, _ := serverConfig(t, m)
	pod := &m.deployment(t).Spec.Template.Spec
	c := container(t, pod, "server")
	if want := fmt.Sprintf("redis://%s.tether.svc:%d/0", svc.Name, svc.Spec.Ports[0].Port); cfg["registry"] != want {
		t.Errorf("registry %v; want the trial Redis's Service, %s", cfg["registry"], want)
	}
	secretName, key := secretFileSource(t, pod, c, cfg["registry-password-file"].(string))
	secret := m.secret(t, secretName)
	if got := string(secret.Data[key]); got != password {
		t.Errorf("the server's Redis password file holds %q; want redis.password %q", got, password)
	}

	// Only the server pods reach it.
	var np *networkingv1.NetworkPolicy
	for _, p := range m.networkPolicies {
		if selects(p.Spec.PodSelector.MatchLabels, r.Spec.Template.Labels) {
			np = p
		}
	}
	if np == nil {
		t.Fatal("networkPolicy.enabled, yet no NetworkPolicy selects the Redis pod")
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil ||
		np.Spec.Ingress[0].From[0].NamespaceSelector != nil ||
		!selects(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, m.deployment(t).Spec.Template.Labels) ||
		np.Spec.Ingress[0].From[0].PodSelector.MatchLabels[componentLabel] != "server" {
		t.Errorf("Redis NetworkPolicy ingress %+v; want one rule from the server pods only", np.Spec.Ingress)
	}

	// The config file Redis runs with is in the same Secret.
	if len(rc.Command) != 2 || rc.Command[0] != "redis-server" {
		t.Fatalf("Redis command %q; want [redis-server CONFIG]", rc.Command)
	}
	confSecret, confKey := secretFileSource(t, rpod, rc, rc.Command[1])
	if confSecret != secretName {
		t.Errorf("Redis config from Secret %s; the server's password from %s", confSecret, secretName)
	}
	checkRedisConf(t, m.secret(t, confSecret).Data[confKey], secret.Data[key])
}

// checkRedisConf runs redis-server with conf on loopback (its port, address
// and directory replaced) and checks that it requires password and saves
// nothing.
func checkRedisConf(t *testing.T, conf, password []byte) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not on PATH; the trial Redis test needs it: install it (Debian: apt-get install redis-server)")
	}
	dir := t.TempDir()
	confFile, pwFile := filepath.Join(dir, "redis.conf"), filepath.Join(dir, "password")
	if err := os.WriteFile(confFile, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pwFile, password, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testutil.FreeAddr(t)
	_, p, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, confFile, "--port", p, "--bind", "127.0.0.1", "--daemonize", "no")
	cmd.Dir = dir // the pod's working directory is an emptyDir
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("redis-server with the chart's config:\n%s\n%s", conf, out.String())
		}
	})

	anon := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1, MaxRetries: -1})
	defer anon.Close()
	testutil.WaitFor(t, 10*time.Second, func() error {
		err := anon.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		if redis.IsAuthError(err) || strings.HasPrefix(err.Error(), "NOAUTH") {
			return nil // up, and asking for the password
		}
		return err
	})
	if err := anon.Ping(t.Context()).Err(); err == nil {
		t.Fatal("the trial Redis answers without a password")
	}

	// The server reads the password as it reads --registry-password-file.
	pw, err := registry.ReadPassword(pwFile)
	if err != nil {
		t.Fatal(err)
	}
	auth := redis.NewClient(&redis.Options{Addr: addr, Password: pw, DialerRetries: 1, MaxRetries: -1})
	defer auth.Close()
	if err := auth.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("ping with the password of --registry-password-file: %v", err)
	}
	for param, want := range map[string]string{"save": "", "appendonly": "no"} {
		got, err := auth.ConfigGet(t.Context(), param).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got[param] != want {
			t.Errorf("Redis %s = %q; want %q: the trial Redis keeps nothing on disk", param, got[param], want)
		}
	}
}
