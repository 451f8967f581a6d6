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
