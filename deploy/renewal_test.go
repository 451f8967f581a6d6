package deploy

import (
	"path/filepath"
	"testing"
)

// TestClientKeepsRenewedToken: by default the client keeps a renewed token
// in a file of its writable /tmp emptyDir, so that a restarted container
// logs in with it after the Secret's token has expired; token.keepRenewed
// false keeps renewals in memory only.
func TestClientKeepsRenewedToken(t *testing.T) {
	d := clientChart.mustTemplate(t, nil).deployment(t)
	pod := &d.Spec.Template.Spec
	c := container(t, pod, "tether-client")
	got := clientArgs(t, c)["renewed-token-file"]
	if len(got) != 1 || filepath.Dir(got[0]) != "/tmp" {
		t.Fatalf("--renewed-token-file %v; want one file in /tmp", got)
	}
	checkTmp(t, pod, c)

	d = clientChart.mustTemplate(t, nil, "token.keepRenewed=false").deployment(t)
	if got := clientArgs(t, container(t, &d.Spec.Template.Spec, "tether-client"))["renewed-token-file"]; got != nil {
		t.Errorf("--renewed-token-file %v with token.keepRenewed=false; want none", got)
	}

	_, err := clientChart.template(t, nil, "token.keepRenewed=yes")
	if err == nil {
		t.Error("token.keepRenewed=yes rendered; want the schema to refuse a string")
	}
}

// TestServerRenewsWithTheKeyInASecret: tokenRenewal.existingSecret mounts
// the Secret's key, read-only, and points --token-renewal-key at it; without
// it the servers renew no token.
func TestServerRenewsWithTheKeyInASecret(t *testing.T) {
	cfg, _ := serverConfig(t, serverChart.mustTemplate(t, nil))
	if v, ok := cfg["token-renewal-key"]; ok {
		t.Errorf("token-renewal-key %v without tokenRenewal.existingSecret; want none", v)
	}

	m := serverChart.mustTemplate(t, nil, "tokenRenewal.existingSecret=tether-renewal")
	cfg, _ = serverConfig(t, m)
	path, _ := cfg["token-renewal-key"].(string)
	if filepath.Base(path) != "token-renewal.key.pem" {
		t.Fatalf("token-renewal-key %q; want a file named after tokenRenewal.secretKey", path)
	}
	d := m.deployment(t)
	pod := &d.Spec.Template.Spec
	c := container(t, pod, "server")
	mounted := false
	for _, vm := range c.VolumeMounts {
		if filepath.Clean(vm.MountPath) != filepath.Dir(path) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.Secret != nil && v.Secret.SecretName == "tether-renewal" && vm.ReadOnly && vm.SubPath == "" {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("%s is not in a read-only, whole-directory mount of Secret tether-renewal", path)
	}

	if _, err := serverChart.template(t, nil, "tokenRenewal.key=inline"); err == nil {
		t.Error("tokenRenewal.key rendered; want the schema to refuse a private key in values")
	}
}
