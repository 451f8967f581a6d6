package deploy

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// peerTLSFiles maps the config keys of the peer channel's certificate
// files, which replace peer-secret-file, to the keys of a kubernetes.io/tls
// Secret as cert-manager writes it: the file names tunnel/server's
// TestPeerCertificatesFromFiles runs replicas with.
var peerTLSFiles = map[string]string{"peer-tls-cert": "tls.crt", "peer-tls-key": "tls.key", "peer-tls-ca": "ca.crt"}

// peerTLSKeys are peerTLSFiles' config keys, in order.
var peerTLSKeys = slices.Sorted(maps.Keys(peerTLSFiles))

// checkPeerCredentials asserts, for a render with a registry, that the
// server gets the peer channel's credentials from exactly one place: the
// peer secret, or the three files of one kubernetes.io/tls Secret (then no
// peer secret is made); and that a Certificate is rendered only to write
// that Secret.
func checkPeerCredentials(t *testing.T, m *manifests, pod *corev1.PodSpec, c *corev1.Container, cfg map[string]any) {
	t.Helper()
	secretFile, _ := cfg["peer-secret-file"].(string)
	var files int
	for _, k := range peerTLSKeys {
		if cfg[k] != nil {
			files++
		}
	}
	switch {
	case secretFile != "" && files > 0:
		t.Fatalf("config sets peer-secret-file and %d of %v: the server refuses both", files, peerTLSKeys)
	case secretFile != "":
		checkSecretFile(t, pod, c, secretFile)
		if len(m.certificates) != 0 {
			t.Errorf("%d Certificates rendered, yet the peer certificates come from the peer secret", len(m.certificates))
		}
		return
	case files != len(peerTLSKeys):
		t.Fatalf("a Redis registry with %d of %v and no peer-secret-file: the server refuses to start", files, peerTLSKeys)
	}
	var secret string
	for _, k := range peerTLSKeys {
		path, _ := cfg[k].(string)
		checkSecretFile(t, pod, c, path) // a whole-directory mount: renewed files reach the server
		name, key := secretFileSource(t, pod, c, path)
		if key != peerTLSFiles[k] {
			t.Errorf("%s from key %s of Secret %s; want %s, as cert-manager writes it", k, key, name, peerTLSFiles[k])
		}
		if secret != "" && name != secret {
			t.Errorf("%s from Secret %s, the others from %s: want the certificate, its key and its CA from one Secret", k, name, secret)
		}
		secret = name
	}
	for _, s := range m.secrets {
		if s.Name == secret || strings.HasSuffix(s.Name, "-peer") {
			t.Errorf("rendered Secret %s, yet the peer certificates come from the Secret %s", s.Name, secret)
		}
	}
	switch len(m.certificates) {
	case 0:
	case 1:
		if got := m.certificates[0].Spec.SecretName; got != secret {
			t.Errorf("the Certificate writes Secret %s; the server reads its peer certificates from %s", got, secret)
		}
		checkPeerCertificate(t, m.certificates[0])
	default:
		t.Errorf("%d Certificates rendered; want one, for every replica", len(m.certificates))
	}
}

// checkPeerCertificate asserts that a Certificate issues what the server
// takes as a replica's peer certificate: one that verifies for both server
// and client authentication (tunnel/server checks both at start), naming no
// host (replicas are dialled at pod IPs and no name is checked), not a CA,
// renewed with a new key before it expires, within cert-manager's limits.
func checkPeerCertificate(t *testing.T, cert *certificate) {
	t.Helper()
	s := cert.Spec
	for _, u := range []string{"server auth", "client auth"} {
		if !slices.Contains(s.Usages, u) {
			t.Errorf("Certificate %s usages %v lack %q: the server refuses a peer certificate without both server and client auth", cert.Name, s.Usages, u)
		}
	}
	if len(s.DNSNames)+len(s.IPAddresses)+len(s.URIs) != 0 {
		t.Errorf("Certificate %s names hosts %v %v %v: one certificate serves every pod, and no name is checked", cert.Name, s.DNSNames, s.IPAddresses, s.URIs)
	}
	if s.CommonName == "" || len(s.CommonName) > 64 {
		t.Errorf("Certificate %s commonName %q: cert-manager needs a name of at most 64 characters when there is no other", cert.Name, s.CommonName)
	}
	if s.IsCA {
		t.Errorf("Certificate %s is a CA", cert.Name)
	}
	if s.IssuerRef.Name == "" {
		t.Errorf("Certificate %s has no issuerRef.name", cert.Name)
	}
	if s.PrivateKey == nil || s.PrivateKey.RotationPolicy != "Always" {
		t.Errorf("Certificate %s privateKey %+v; want rotationPolicy Always: a renewal brings a new key", cert.Name, s.PrivateKey)
	}
	duration, err := time.ParseDuration(s.Duration)
	if err != nil || duration < time.Hour {
		t.Errorf("Certificate %s duration %q: want a Go duration of at least 1h (cert-manager's minimum): %v", cert.Name, s.Duration, err)
	}
	renew, err := time.ParseDuration(s.RenewBefore)
	if err != nil || renew < 5*time.Minute || renew >= duration {
		t.Errorf("Certificate %s renewBefore %q: want a Go duration of at least 5m and less than duration %s: %v", cert.Name, s.RenewBefore, s.Duration, err)
	}
}

// TestPeerTLS: with peerTLS the server takes the peer channel's
// certificates from a kubernetes.io/tls Secret (one cert-manager writes for
// the chart's Certificate, or an existing one) instead of making them from
// the peer secret, which is then neither required nor made.
func TestPeerTLS(t *testing.T) {
	reg := append(append([]string{}, serverChart.required...), "registry.url=redis://redis:6379", "replicaCount=2")
	for name, tc := range map[string]struct {
		files  []string
		set    []string
		secret string
		cert   bool
	}{
		"cert-manager":    {serverCI("peer-cert-manager-values.yaml"), nil, "rel-tether-server-peer-tls", true},
		"existing Secret": {serverCI("peer-tls-secret-values.yaml"), nil, "tether-peer-tls", false},
		// No peer secret given, none generated: none is required.
		"no peer secret": {nil, append(reg, "peerTLS.existingSecret=mine"), "mine", false},
		"generateSecrets": {nil, append(reg, "generateSecrets=true", "peerTLS.certManager.enabled=true",
			"peerTLS.certManager.issuerRef.name=peer-ca"), "rel-tether-server-peer-tls", true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := serverChart.mustTemplate(t, tc.files, tc.set...)
			cfg, _ := serverConfig(t, m)
			pod := &m.deployment(t).Spec.Template.Spec
			c := container(t, pod, "server")
			checkPeerCredentials(t, m, pod, c, cfg)
			if cfg["peer-secret-file"] != nil {
				t.Fatalf("peer-secret-file %v with peerTLS", cfg["peer-secret-file"])
			}
			for k, file := range peerTLSFiles {
				if want := "/etc/tether/peer-tls/" + file; cfg[k] != want {
					t.Errorf("%s = %v; want %s", k, cfg[k], want)
				}
				path, _ := cfg[k].(string)
				if name, _ := secretFileSource(t, pod, c, path); name != tc.secret {
					t.Errorf("%s from Secret %s; want %s", k, name, tc.secret)
				}
			}
			for _, v := range pod.Volumes {
				if v.Secret != nil && strings.HasSuffix(v.Secret.SecretName, "-peer") {
					t.Errorf("volume %s mounts the peer secret %s", v.Name, v.Secret.SecretName)
				}
			}
			want := 0
			if tc.cert {
				want = 1
			}
			if len(m.certificates) != want {
				t.Errorf("%d Certificates; want %d", len(m.certificates), want)
			}
		})
	}
}

// TestPeerCertificateValues: the Certificate takes its issuer, lifetime and
// renewal from the values.
func TestPeerCertificateValues(t *testing.T) {
	for _, tc := range []struct {
		files                 []string
		name, kind, group     string
		duration, renewBefore string
	}{
		{serverCI("peer-cert-manager-values.yaml"), "tether-peer-ca", "Issuer", "cert-manager.io", "2160h", "720h"},
		{[]string{serverChart.allOn()}, "tether-peer-ca", "AWSPCAClusterIssuer", "awspca.cert-manager.io", "168h", "48h"},
	} {
		m := serverChart.mustTemplate(t, tc.files)
		if len(m.certificates) != 1 {
			t.Fatalf("%v: %d Certificates; want 1", tc.files, len(m.certificates))
		}
		s := m.certificates[0].Spec
		if s.IssuerRef.Name != tc.name || s.IssuerRef.Kind != tc.kind || s.IssuerRef.Group != tc.group {
			t.Errorf("%v: issuerRef %+v; want %s %s.%s", tc.files, s.IssuerRef, tc.name, tc.kind, tc.group)
		}
		if s.Duration != tc.duration || s.RenewBefore != tc.renewBefore {
			t.Errorf("%v: duration %s renewBefore %s; want %s %s", tc.files, s.Duration, s.RenewBefore, tc.duration, tc.renewBefore)
		}
	}
}
