package deploy

import (
	"encoding/base64"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-dev/tether/proxy"
)

// renders returns every values set each chart is tested with: the defaults
// (plus the values they require) and each ci/*-values.yaml file.
func renders(t *testing.T, c chart) map[string][]string {
	t.Helper()
	r := map[string][]string{"defaults": nil}
	for _, f := range c.ciValues(t) {
		r[filepath.Base(f)] = []string{f}
	}
	return r
}

func TestLint(t *testing.T) {
	for _, c := range charts {
		for name, files := range renders(t, c) {
			t.Run(c.name+"/"+name, func(t *testing.T) {
				t.Parallel()
				args := []string{"lint", "--strict", "--kube-version", kubeVersion, c.dir()}
				for _, f := range files {
					args = append(args, "--values", f)
				}
				if len(files) == 0 {
					for _, s := range c.required {
						args = append(args, "--set", s)
					}
				}
				if _, err := helm(t, args...); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestRenderDecodes renders every values set and decodes each manifest
// strictly into its Kubernetes type.
func TestRenderDecodes(t *testing.T) {
	for _, c := range charts {
		for name, files := range renders(t, c) {
			t.Run(c.name+"/"+name, func(t *testing.T) {
				t.Parallel()
				m := c.mustTemplate(t, files)
				// Only a release for the sidecar alone renders nothing.
				if (len(m.docs) == 0) != (name == "sidecar-only-values.yaml") {
					t.Fatalf("rendered %d manifests", len(m.docs))
				}
			})
		}
	}
}

func TestRequiredValuesFailClearly(t *testing.T) {
	for _, tc := range []struct {
		c    chart
		set  []string
		want string
	}{
		{serverChart, []string{"jwt.publicKey=x"}, "domain is required"},
		{serverChart, []string{"domain=t.example.com"}, "token verification key is required"},
		{serverChart, append(serverChart.required, "tls.cert=x"), "tls.cert and tls.key go together"},
		{serverChart, append(serverChart.required, "drain.marginSeconds=0"), "drain.marginSeconds must be positive"},
		{serverChart, append(serverChart.required, "podAntiAffinity=always"), "at '/podAntiAffinity': value must be one of 'soft', 'hard', ''"},
		{serverChart, append(serverChart.required, "replicaCount=2"), "replicaCount is 2, but more than one replica needs a registry"},
		{serverChart, append(serverChart.required, "registry.url=memory", "replicaCount=3"), "replicaCount is 3, but more than one replica needs a registry"},
		{serverChart, append(serverChart.required, "autoscaling.enabled=true"), "autoscaling.enabled needs a registry"},
		{serverChart, append(serverChart.required, "registry.url=redis.example.com:6379"), `registry.url "redis.example.com:6379": want redis://`},
		{serverChart, append(serverChart.required, "redis.enabled=true", "registry.url=redis://r:6379"), "redis.enabled runs a trial Redis and makes it the registry"},
		{serverChart, append(serverChart.required, "registry.passwordSecret.name=p"), "registry.passwordSecret.name is set but there is no Redis registry"},
		{serverChart, append(serverChart.required, "podDisruptionBudget.minAvailable=1"), "at '/podDisruptionBudget': additional properties 'minAvailable' not allowed"},
		{serverChart, []string{"domain=t.example.com", "jwt.publicKey=x"}, "adminToken.existingSecret is required"},
		{serverChart, append(serverChart.required, "registry.url=redis://r:6379"), "peerSecret.existingSecret is required with a registry"},
		{serverChart, append(serverChart.required, "redis.enabled=true", "peerSecret.existingSecret=p"), "redis.password is required with redis.enabled"},
		{serverChart, append(serverChart.required, "registry.url=redis://r:6379", "peerTLS.existingSecret=s", "peerTLS.certManager.enabled=true",
			"peerTLS.certManager.issuerRef.name=ca"), "peerTLS.existingSecret and peerTLS.certManager.enabled exclude each other"},
		{serverChart, append(serverChart.required, "registry.url=redis://r:6379", "peerTLS.certManager.enabled=true"),
			"peerTLS.certManager.issuerRef.name is required with peerTLS.certManager.enabled"},
		{serverChart, append(serverChart.required, "peerTLS.existingSecret=s"), "peerTLS is set but there is no Redis registry"},
		{serverChart, []string{"domain=t.example.com", "jwt.publicKey=x"}, "or set generateSecrets=true"},
		{clientChart, append(clientChart.required, "probes.readiness.mode=ready"), "at '/probes/readiness/mode': value must be one of 'tunnel', 'process', ''"},
		{clientChart, append(clientChart.required, "topologySpread=always"), "at '/topologySpread': value must be one of 'soft', 'hard', ''"},
		{clientChart, append(clientChart.required, "connections=0"), "at '/connections': minimum: got 0, want 1"},
		{clientChart, append(clientChart.required, "connections=17"), "at '/connections': maximum: got 17, want 16"},
		{clientChart, []string{"token.existingSecret=t"}, "server is required"},
		{clientChart, []string{"server=s:1"}, "a token is required"},
		{clientChart, append(clientChart.required, "tls.caConfigMap=a", "tls.caSecret=b"), "tls.caConfigMap and tls.caSecret are exclusive"},
		{clientChart, append(clientChart.required, "networkPolicy.enabled=true"), "networkPolicy.serverCIDRs is required"},
		{clientChart, append(clientChart.required, "routes.appProxy.enabled=false", "routes.argoCD.enabled=false",
			"routes.argoWorkflows.enabled=false", "routes.argoEvents.enabled=false", "routes.argoRollouts.enabled=false"), "no routes"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			args := []string{"template", "rel", tc.c.dir(), "--kube-version", kubeVersion}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			_, err := helm(t, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

// checkHardened asserts what every tether container must be: non-root,
// read-only root filesystem, no capabilities, no privilege escalation,
// seccomp RuntimeDefault.
func checkHardened(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	psc := pod.SecurityContext
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("container %s has no securityContext", c.Name)
	}
	nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
	if !nonRoot {
		t.Errorf("container %s: runAsNonRoot is not true", c.Name)
	}
	uid := sc.RunAsUser
	if uid == nil && psc != nil {
		uid = psc.RunAsUser
	}
	if uid == nil || *uid == 0 {
		t.Errorf("container %s: runAsUser = %v; want the image's nonroot uid 65532", c.Name, uid)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container %s: readOnlyRootFilesystem is not true", c.Name)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container %s: allowPrivilegeEscalation is not false", c.Name)
	}
	if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 {
		t.Errorf("container %s: capabilities = %+v; want drop [ALL], add none", c.Name, sc.Capabilities)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && psc != nil {
		seccomp = psc.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container %s: seccompProfile = %+v; want RuntimeDefault", c.Name, seccomp)
	}
}

// serverConfig returns the server's rendered config file, decoded.
func serverConfig(t *testing.T, m *manifests) (map[string]any, string) {
	t.Helper()
	d := m.deployment(t)
	c := container(t, &d.Spec.Template.Spec, "server")
	var path string
	for _, a := range c.Args {
		if p, ok := strings.CutPrefix(a, "--config="); ok {
			path = p
		}
	}
	if path == "" {
		t.Fatalf("server args %q have no --config", c.Args)
	}
	dir, file := filepath.Split(path)
	var cmName string
	for _, vm := range c.VolumeMounts {
		if filepath.Clean(vm.MountPath) == filepath.Clean(dir) {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == vm.Name && v.ConfigMap != nil {
					cmName = v.ConfigMap.Name
				}
			}
		}
	}
	if cmName == "" {
		t.Fatalf("--config %s is not in a mounted ConfigMap", path)
	}
	text, ok := m.configMap(t, cmName).Data[file]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s (the --config file)", cmName, file)
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		t.Fatalf("server config: %v\n%s", err, text)
	}
	return cfg, text
}

func port(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, err := strconv.ParseInt(p, 10, 32)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return int32(n)
}

func namedPort(t *testing.T, c *corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, name)
	return 0
}

func TestServerDeployment(t *testing.T) {
	for name, files := range renders(t, serverChart) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := serverChart.mustTemplate(t, files)
			d := m.deployment(t)
			pod := &d.Spec.Template.Spec
			c := container(t, pod, "server")
			checkHardened(t, pod, c)
			cfg, _ := serverConfig(t, m)

			// Every config key is a flag of `tether server`, and the args
			// are just the subcommand and --config.
			for k := range cfg {
				if !serverFlags[k] {
					t.Errorf("config key %q is not a flag of `tether server` (see its --help)", k)
				}
			}
			if len(c.Args) != 2 || c.Args[0] != "server" {
				t.Errorf("args = %q; want [server --config=FILE]", c.Args)
			}
			// What differs per pod comes as TETHER_* variables.
			for _, e := range c.Env {
				if name, ok := strings.CutPrefix(e.Name, "TETHER_"); ok {
					if f := strings.ReplaceAll(strings.ToLower(name), "_", "-"); !serverFlags[f] {
						t.Errorf("%s: --%s is not a flag of `tether server` (see its --help)", e.Name, f)
					}
				}
			}

			// Probes on the admin port the config gives the server.
			adminAddr, _ := cfg["admin-addr"].(string)
			if h, _, _ := net.SplitHostPort(adminAddr); net.ParseIP(h) == nil || net.ParseIP(h).IsLoopback() {
				t.Errorf("admin-addr %q: the kubelet's probes need a non-loopback address", adminAddr)
			}
			if cfg["admin-token-file"] == nil {
				t.Error("no admin-token-file: the server refuses a non-loopback admin address without one")
			}
			for probe, want := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
				if probe == nil || probe.HTTPGet == nil {
					t.Fatalf("missing HTTP probe for %s", want)
				}
				if probe.HTTPGet.Path != want {
					t.Errorf("probe path %q; want %q", probe.HTTPGet.Path, want)
				}
				if got := namedPort(t, c, probe.HTTPGet.Port.StrVal); got != port(t, adminAddr) {
					t.Errorf("probe %s on port %d; admin-addr is %s", want, got, adminAddr)
				}
			}
			for name, key := range map[string]string{"tunnel": "tunnel-addr", "http": "http-addr"} {
				addr, _ := cfg[key].(string)
				if got := namedPort(t, c, name); got != port(t, addr) {
					t.Errorf("container port %s = %d; %s is %s", name, got, key, addr)
				}
			}

			// Grace period covers the preStop delay and the drain.
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
				t.Fatal("no preStop sleep action")
			}
			shutdown, err := time.ParseDuration(fmt.Sprint(cfg["shutdown-timeout"]))
			if err != nil {
				t.Fatalf("shutdown-timeout: %v", err)
			}
			preStop := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
			grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
			if grace <= preStop+shutdown {
				t.Errorf("terminationGracePeriodSeconds %v <= preStop %v + shutdown-timeout %v", grace, preStop, shutdown)
			}

			// The server's Services point at the container's ports.
			for _, svc := range m.services {
				if !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
					continue
				}
				for _, sp := range svc.Spec.Ports {
					namedPort(t, c, sp.TargetPort.StrVal)
				}
			}
			if got := m.service(t, "-tunnel").Spec.Type; name == "defaults" && got != corev1.ServiceTypeLoadBalancer {
				t.Errorf("tunnel Service type %s; want LoadBalancer by default", got)
			}
			if len(m.pdbs) != 1 {
				t.Errorf("%d PodDisruptionBudgets; want 1", len(m.pdbs))
			}
			checkReplicas(t, m, cfg)
			checkSecretsAreFiles(t, m, pod)
		})
	}
}

// checkSecretsAreFiles asserts that no Secret's content reaches args, env
// or a ConfigMap, and that containers get Secrets only as volumes.
func checkSecretsAreFiles(t *testing.T, m *manifests, pod *corev1.PodSpec) {
	t.Helper()
	var outside strings.Builder
	for _, c := range pod.Containers {
		outside.WriteString(strings.Join(c.Args, "\n"))
		for _, e := range c.Env {
			outside.WriteString(e.Value + "\n")
			// The registry URL is an address, kept in a Secret when the
			// operator's Redis provisioning writes one; its password is a file.
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.Name != "TETHER_REGISTRY" {
				t.Errorf("container %s takes env %s from a Secret; mount it as a file", c.Name, e.Name)
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil {
				t.Errorf("container %s takes env from Secret %s; mount it as a file", c.Name, ef.SecretRef.Name)
			}
		}
	}
	for _, cm := range m.configMaps {
		for _, v := range cm.Data {
			outside.WriteString(v + "\n")
		}
	}
	for _, s := range m.secrets {
		for k, v := range s.Data {
			if len(v) < 8 {
				continue
			}
			for _, form := range []string{string(v), base64.StdEncoding.EncodeToString(v)} {
				if strings.Contains(outside.String(), form) {
					t.Errorf("Secret %s key %s appears in args, env or a ConfigMap", s.Name, k)
				}
			}
		}
	}
}

func TestServerValuesReachConfig(t *testing.T) {
	m := serverChart.mustTemplate(t, []string{serverChart.allOn()})
	cfg, _ := serverConfig(t, m)
	want := map[string]any{
		"domain":               "tunnels.example.com",
		"tunnel-addr":          "0.0.0.0:7443",
		"http-addr":            "0.0.0.0:8088",
		"admin-addr":           "0.0.0.0:9700",
		"admin-token-file":     "/etc/tether/admin/admin-token",
		"jwt-public-key":       "/etc/tether/jwt/keys.jwks",
		"jwt-issuer":           "https://platform.example.com",
		"jwt-audience":         "tether",
		"tls-cert":             "/etc/tether/tls/tls.crt",
		"tls-key":              "/etc/tether/tls/tls.key",
		"shutdown-timeout":     "40s",
		"heartbeat-timeout":    "45s",
		"public-url":           "https://*.tunnels.example.com:8443",
		"log-level":            "debug",
		"log-format":           "console",
		"trusted-proxies":      []any{"10.0.0.0/8", "192.168.0.0/16"},
		"jwt-hmac-secret-file": "/etc/tether/hmac/secret",
		// The URL comes from registry.urlSecret, as TETHER_REGISTRY.
		"registry-password-file":  "/etc/tether/registry/redis-password",
		"peer-addr":               "0.0.0.0:9800",
		"peer-tls-cert":           "/etc/tether/peer-tls/tls.crt",
		"peer-tls-key":            "/etc/tether/peer-tls/tls.key",
		"peer-tls-ca":             "/etc/tether/peer-tls/ca.crt",
		"max-sessions-per-tunnel": 24,
		"token-renewal-key":       "/etc/tether/token-renewal/renewal.key.pem",
		"access-log":              true,
		// Buffered webhooks live in the registry's Redis: no data-dir.
		"buffer-retention":       "24h",
		"buffer-max-body":        1048576,
		"buffer-max-requests":    500,
		"buffer-max-bytes":       33554432,
		"buffer-max-total-bytes": 2147483648,
	}
	for k, v := range want {
		if fmt.Sprint(cfg[k]) != fmt.Sprint(v) {
			t.Errorf("config %s = %v; want %v", k, cfg[k], v)
		}
	}
	if len(cfg) != len(want) {
		t.Errorf("config has %d keys; want %d: %v", len(cfg), len(want), cfg)
	}
	d := m.deployment(t)
	if got := *d.Spec.Template.Spec.TerminationGracePeriodSeconds; got != 15+40+10 {
		t.Errorf("terminationGracePeriodSeconds = %d; want 65 (preStop 15 + shutdown 40 + margin 10)", got)
	}
	// Each file flag names a file in a mounted Secret volume.
	pod := &d.Spec.Template.Spec
	c := container(t, pod, "server")
	for _, key := range []string{"admin-token-file", "jwt-public-key", "tls-cert", "tls-key"} {
		checkSecretFile(t, pod, c, cfg[key].(string))
	}
	for key, want := range map[string]string{
		"peer-tls-cert":          "tether-edge-peer-tls/tls.crt",
		"peer-tls-key":           "tether-edge-peer-tls/tls.key",
		"peer-tls-ca":            "tether-edge-peer-tls/ca.crt",
		"registry-password-file": "tether-registry/redis-password",
	} {
		path, _ := cfg[key].(string)
		if secret, k := secretFileSource(t, pod, c, path); secret+"/"+k != want {
			t.Errorf("%s from Secret %s key %s; want %s", key, secret, k, want)
		}
	}
	env := envByName(c)
	if ref := env["TETHER_REGISTRY"].ValueFrom; ref == nil || ref.SecretKeyRef == nil ||
		ref.SecretKeyRef.Name != "tether-registry" || ref.SecretKeyRef.Key != "redis-url" {
		t.Errorf("TETHER_REGISTRY = %+v; want it from Secret tether-registry key redis-url", env["TETHER_REGISTRY"])
	}
	if got := namedPort(t, c, "peer"); got != 9800 {
		t.Errorf("peer container port %d; want 9800", got)
	}
	if pdb := m.pdbs[0]; pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntVal != 2 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v; want 2", pdb.Spec.MaxUnavailable)
	}
	if m.redis(t) != nil {
		t.Error("redis.enabled is false, yet a Redis Deployment was rendered")
	}
	if d.Spec.Replicas != nil {
		t.Error("replicas set although autoscaling.enabled: the HPA owns it")
	}
	if len(m.hpas) != 1 || len(m.serviceMonitors) != 1 || len(m.ingresses) != 1 || len(m.networkPolicies) != 1 || len(m.certificates) != 1 {
		t.Errorf("HPA %d, ServiceMonitor %d, Ingress %d, NetworkPolicy %d, Certificate %d; want one of each",
			len(m.hpas), len(m.serviceMonitors), len(m.ingresses), len(m.networkPolicies), len(m.certificates))
	}
	if ing := m.ingresses[0]; ing.Spec.Rules[0].Host != "*.tunnels.example.com" || ing.Spec.TLS[0].SecretName != "tunnels-wildcard" {
		t.Errorf("Ingress host %q, TLS secret %q; want *.tunnels.example.com, tunnels-wildcard",
			ing.Spec.Rules[0].Host, ing.Spec.TLS[0].SecretName)
	}
	sm := m.serviceMonitors[0]
	admin := m.service(t, "-admin")
	for k, v := range sm.Spec.Selector.MatchLabels {
		if admin.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s; the admin Service has %q", k, v, admin.Labels[k])
		}
	}
	if sm.Spec.Endpoints[0].Port != admin.Spec.Ports[0].Name || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoint %+v; want port %s path /metrics", sm.Spec.Endpoints[0], admin.Spec.Ports[0].Name)
	}
}

func checkSecretFile(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, path string) {
	t.Helper()
	dir, file := filepath.Split(path)
	for _, vm := range c.VolumeMounts {
		if filepath.Clean(vm.MountPath) != filepath.Clean(dir) {
			continue
		}
		if vm.SubPath != "" {
			t.Errorf("%s is mounted with subPath: a rotated Secret would never reach it", path)
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.Secret != nil {
				for _, it := range v.Secret.Items {
					if it.Path == file {
						return
					}
				}
			}
		}
	}
	t.Errorf("%s is not a file of a mounted Secret volume", path)
}

// TestServiceMonitorSendsAdminToken: the server requires its admin token on
// /metrics, so the ServiceMonitor must send exactly the token the server
// reads, from the Secret and key mounted as its --admin-token-file.
func TestServiceMonitorSendsAdminToken(t *testing.T) {
	for name, files := range map[string][]string{"defaults": nil, "all-on": {serverChart.allOn()}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := serverChart.mustTemplate(t, files, "serviceMonitor.enabled=true")
			cfg, _ := serverConfig(t, m)
			tokenFile, _ := cfg["admin-token-file"].(string)
			if tokenFile == "" {
				t.Fatal("no admin-token-file in the server config")
			}
			pod := &m.deployment(t).Spec.Template.Spec
			secret, key := secretFileSource(t, pod, container(t, pod, "server"), tokenFile)
			if len(m.serviceMonitors) != 1 || len(m.serviceMonitors[0].Spec.Endpoints) != 1 {
				t.Fatalf("want one ServiceMonitor with one endpoint; got %d", len(m.serviceMonitors))
			}
			ep := m.serviceMonitors[0].Spec.Endpoints[0]
			a := ep.Authorization
			if a == nil || a.Credentials == nil {
				t.Fatalf("ServiceMonitor endpoint %s has no authorization: Prometheus would get 401", ep.Path)
			}
			if a.Type != "Bearer" || a.Credentials.Name != secret || a.Credentials.Key != key {
				t.Errorf("ServiceMonitor authorization %s from Secret %s key %s; want Bearer from Secret %s key %s (the server's --admin-token-file)",
					a.Type, a.Credentials.Name, a.Credentials.Key, secret, key)
			}
		})
	}
}

// secretFileSource returns the Secret and key that the file at path in
// container c comes from.
func secretFileSource(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, path string) (secret, key string) {
	t.Helper()
	dir, file := filepath.Split(path)
	for _, vm := range c.VolumeMounts {
		if filepath.Clean(vm.MountPath) != filepath.Clean(dir) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			for _, it := range v.Secret.Items {
				if it.Path == file {
					return v.Secret.SecretName, it.Key
				}
			}
		}
	}
	t.Fatalf("%s is not a file of a mounted Secret volume", path)
	return "", ""
}

// clientArgs returns the client container's settings as flag name ->
// values. The container runs `tether client` with its settings in TETHER_*
// variables, so that `tether diagnose` and `tether status` run in the same
// container (kubectl exec) see them too; each must name a client flag.
func clientArgs(t *testing.T, c *corev1.Container) map[string][]string {
	t.Helper()
	if len(c.Args) != 1 || c.Args[0] != "client" {
		t.Fatalf("args %q; want [client], with the settings in TETHER_* variables", c.Args)
	}
	flags := map[string][]string{}
	for _, e := range c.Env {
		name, ok := strings.CutPrefix(e.Name, "TETHER_")
		if !ok {
			continue
		}
		if e.ValueFrom != nil {
			t.Errorf("%s comes from a reference; the settings are plain values", e.Name)
		}
		name = strings.ReplaceAll(strings.ToLower(name), "_", "-")
		if !clientFlags[name] {
			t.Errorf("%s: --%s is not a flag of `tether client` (see its --help)", e.Name, name)
		}
		values := []string{e.Value}
		if name == "route" { // a list: comma-separated in the environment
			values = strings.Split(e.Value, ",")
		}
		flags[name] = append(flags[name], values...)
	}
	return flags
}

func checkClientContainer(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) map[string][]string {
	t.Helper()
	checkHardened(t, pod, c)
	flags := clientArgs(t, c)
	for _, r := range flags["route"] {
		if _, err := proxy.ParseRoute(r); err != nil {
			t.Errorf("--route %q: %v", r, err)
		}
	}
	health := flags["health-addr"]
	if len(health) != 1 {
		t.Fatalf("--health-addr given %d times; want once", len(health))
	}
	if h, _, _ := net.SplitHostPort(health[0]); h != "0.0.0.0" {
		t.Errorf("--health-addr %s; want 0.0.0.0:PORT so the kubelet can probe it", health[0])
	}
	// Readiness is the tunnel's (/readyz) or the process's (/healthz):
	// TestClientReadiness and TestSidecarInRuntimeChart say which.
	readiness := "/readyz"
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path == "/healthz" {
		readiness = "/healthz"
	}
	for probe, want := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: readiness} {
		if probe == nil || probe.HTTPGet == nil {
			t.Fatalf("missing HTTP probe for %s", want)
		}
		if probe.HTTPGet.Path != want || probe.HTTPGet.Port.IntVal != port(t, health[0]) {
			t.Errorf("probe %s:%d; want %s on the --health-addr port %s", probe.HTTPGet.Path, probe.HTTPGet.Port.IntVal, want, health[0])
		}
	}
	checkTmp(t, pod, c)
	for _, key := range []string{"token-file", "tls-ca"} {
		for _, p := range flags[key] {
			if key == "tls-ca" {
				checkMountedFile(t, pod, c, p)
			} else {
				checkSecretFile(t, pod, c, p)
			}
		}
	}
	return flags
}

// checkMountedFile asserts path is a file of a mounted Secret or ConfigMap.
func checkMountedFile(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, path string) {
	t.Helper()
	dir, file := filepath.Split(path)
	for _, vm := range c.VolumeMounts {
		if filepath.Clean(vm.MountPath) != filepath.Clean(dir) {
			continue
		}
		for _, v := range pod.Volumes {
			var items []corev1.KeyToPath
			switch {
			case v.Name != vm.Name:
			case v.Secret != nil:
				items = v.Secret.Items
			case v.ConfigMap != nil:
				items = v.ConfigMap.Items
			}
			for _, it := range items {
				if it.Path == file {
					return
				}
			}
		}
	}
	t.Errorf("%s is not a file of a mounted volume", path)
}

func TestClientDeployment(t *testing.T) {
	for name, files := range renders(t, clientChart) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := clientChart.mustTemplate(t, files)
			if name == "sidecar-only-values.yaml" {
				if len(m.deployments) != 0 {
					t.Fatal("deployment.enabled=false rendered a Deployment")
				}
				return
			}
			d := m.deployment(t)
			pod := &d.Spec.Template.Spec
			c := container(t, pod, "tether-client")
			checkClientContainer(t, pod, c)
			checkSecretsAreFiles(t, m, pod)
			if d.Spec.Replicas == nil || *d.Spec.Replicas < 1 {
				t.Errorf("replicas = %v; want at least one client pod", d.Spec.Replicas)
			}
		})
	}
}

// TestClientRollsWithoutDowntime: by default a client update starts the new
// pod before the old one stops; the server serves both side by side.
func TestClientRollsWithoutDowntime(t *testing.T) {
	checkRollingUpdate(t, clientChart.mustTemplate(t, nil).deployment(t))
}

// TestClientDefaultRoutesAreTheAdapters: without route values the client
// serves what `tether client --help` lists as the built-in adapters.
func TestClientDefaultRoutesAreTheAdapters(t *testing.T) {
	want := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^  (/\S*)\s+.+?\s+(\w+://\S+)$`).FindAllStringSubmatch(clientHelp, -1) {
		want[m[1]] = m[2]
	}
	if len(want) < 5 {
		t.Fatalf("found %d adapters in `tether client --help`; want 5:\n%s", len(want), clientHelp)
	}
	m := clientChart.mustTemplate(t, nil)
	d := m.deployment(t)
	flags := clientArgs(t, container(t, &d.Spec.Template.Spec, "tether-client"))
	got := map[string]string{}
	for _, r := range flags["route"] {
		prefix, rest, _ := strings.Cut(r, "=")
		url, _, _ := strings.Cut(rest, ";")
		got[prefix] = url
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("default routes %v; `tether client --help` lists %v", got, want)
	}
}

func TestClientValuesReachArgs(t *testing.T) {
	m := clientChart.mustTemplate(t, []string{clientChart.allOn()})
	d := m.deployment(t)
	c := container(t, &d.Spec.Template.Spec, "tether-client")
	flags := clientArgs(t, c)
	want := map[string]string{
		"server":             "[tunnels.example.com:443]",
		"token-file":         "[/var/run/tether/token/jwt]",
		"renewed-token-file": "[/tmp/renewed-token]",
		"health-addr":        "[0.0.0.0:9091]",
		"transport":          "[wss]",
		"proxy":              "[http://proxy.corp.example.com:3128]",
		"tls-ca":             "[/etc/tether/ca/bundle.pem]",
		"tls-fingerprint":    "[3f2a9c1e0b7d4a6f8e2c5b9d1a7f3e6c0b4d8a2f6e1c9b5d3a7f0e4c8b2d6a1f]",
		"tls-server-name":    "[tunnels.internal.example.com]",
		"log-level":          "[debug]",
		"log-format":         "[console]",
		"connections":        "[4]",
		"route": "[/app=http://app-proxy.runtime:8080;timeout=30s;insecure-skip-verify /wf=https://argo-server.argo:2746/;timeout=0 " +
			"/hooks=http://webhook-eventsource-svc.argo-events:12000/;timeout=10s;insecure-skip-verify " +
			"/ro=http://argo-rollouts-dashboard.argo-rollouts:3100;timeout=20s;insecure-skip-verify " +
			"/grafana=http://grafana.monitoring:3000;timeout=15s]",
	}
	for k, v := range want {
		if got := fmt.Sprint(flags[k]); got != v {
			t.Errorf("--%s = %s; want %s", k, got, v)
		}
	}
	if len(flags) != len(want) {
		t.Errorf("%d distinct flags; want %d: %v", len(flags), len(want), flags)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["HTTPS_PROXY"] != "http://proxy.corp.example.com:3128" || env["NO_PROXY"] != ".cluster.local,10.0.0.0/8" {
		t.Errorf("env %v; want HTTPS_PROXY and NO_PROXY from proxy.*", env)
	}
	if len(m.networkPolicies) != 1 {
		t.Fatalf("%d NetworkPolicies; want 1", len(m.networkPolicies))
	}
	np := m.networkPolicies[0]
	if len(np.Spec.Egress) != 4 {
		t.Fatalf("%d egress rules; want server, DNS and two upstream rules", len(np.Spec.Egress))
	}
	server := np.Spec.Egress[0]
	if server.To[0].IPBlock.CIDR != "203.0.113.10/32" || server.Ports[0].Port.IntVal != 443 {
		t.Errorf("server egress rule %+v; want 203.0.113.10/32 port 443", server)
	}
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("NetworkPolicy selects %s=%s; the pods have %q", k, v, d.Spec.Template.Labels[k])
		}
	}
}

// The URL `tether diagnose` tests follows the Ingress when none is given.
func TestServerPublicURL(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want any
	}{
		{nil, nil}, // the server's own default
		{[]string{"ingress.enabled=true"}, "https://*.tunnels.example.com"},
		{[]string{"ingress.enabled=true", "ingress.tls.enabled=false"}, "http://*.tunnels.example.com"},
		{[]string{"ingress.enabled=true", "publicURL=https://*.t.example.net"}, "https://*.t.example.net"},
	} {
		cfg, _ := serverConfig(t, serverChart.mustTemplate(t, nil, tc.set...))
		if got := cfg["public-url"]; got != tc.want {
			t.Errorf("%v: public-url = %v, want %v", tc.set, got, tc.want)
		}
	}
}

// clientConnectionsDefault is the default of `tether client --connections`
// as its --help shows it, or the contract's (DESIGN.md) when --help does not
// list the flag.
func clientConnectionsDefault() string {
	if m := regexp.MustCompile(`--connections int\s.*\(default (\d+)\)`).FindStringSubmatch(clientHelp); m != nil {
		return m[1]
	}
	return "2"
}

// TestClientConnectionsDefault: the chart keeps as many sessions as the
// binary does when neither is told otherwise.
func TestClientConnectionsDefault(t *testing.T) {
	vals := readValues(t, filepath.Join(clientChart.dir(), "values.yaml"))
	want := clientConnectionsDefault()
	if got := fmt.Sprint(vals["connections"]); got != want {
		t.Errorf("values.yaml connections: %s; `tether client --connections` defaults to %s", got, want)
	}
	m := clientChart.mustTemplate(t, nil)
	flags := clientArgs(t, container(t, &m.deployment(t).Spec.Template.Spec, "tether-client"))
	if got := fmt.Sprint(flags["connections"]); got != "["+want+"]" {
		t.Errorf("rendered --connections %s; want [%s]", got, want)
	}
}

// TestRendersWithoutKubeVersion: the helm that `make helm` builds renders
// the charts without --kube-version, as a released helm does. A plain
// `go install` of helm assumes Kubernetes v1.20, older than the charts'
// kubeVersion; the Makefile stamps a current one (HELM_KUBE_MINOR).
func TestRendersWithoutKubeVersion(t *testing.T) {
	for _, c := range charts {
		args := []string{"template", "rel", c.dir()}
		for _, s := range c.required {
			args = append(args, "--set", s)
		}
		if _, err := helm(t, args...); err != nil {
			t.Errorf("%v\nthis helm assumes a Kubernetes older than the charts' kubeVersion: build it with `make helm`, which pins a current one, or pass --kube-version", err)
		}
	}
}
