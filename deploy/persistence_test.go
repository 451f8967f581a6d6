package deploy

import (
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// dataVolume returns the claim mounted at the server's --data-dir, failing
// the test unless the directory is a writable, whole-directory mount of a
// PersistentVolumeClaim.
func dataVolume(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, dir string) string {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if filepath.Clean(vm.MountPath) != filepath.Clean(dir) {
			continue
		}
		if vm.ReadOnly || vm.SubPath != "" {
			t.Errorf("--data-dir %s is mounted readOnly %v, subPath %q; want the writable volume's whole directory", dir, vm.ReadOnly, vm.SubPath)
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.PersistentVolumeClaim != nil {
				return v.PersistentVolumeClaim.ClaimName
			}
		}
		t.Fatalf("--data-dir %s is volume %s, not a PersistentVolumeClaim: its state would not outlive the pod", dir, vm.Name)
	}
	t.Fatalf("--data-dir %s is not a mount of the server container: the read-only root would refuse it", dir)
	return ""
}

// TestServerPersistence: persistence.enabled mounts a claim, the chart's
// or an existing one, at the server's --data-dir, writable by the server's
// group under the read-only root; and the Deployment stops the old pod
// before it starts a new one, which could not open the file the old one
// holds. Without it, the server keeps its state in memory and rolls one
// pod at a time.
func TestServerPersistence(t *testing.T) {
	ci := func(name string) []string { return []string{filepath.Join(serverChart.dir(), "ci", name)} }
	for _, tc := range []struct {
		name  string
		files []string
		set   []string
		claim string // the claim mounted; "" for none
		made  bool   // whether the chart renders it
		class *string
		size  string
		modes string
	}{
		{name: "defaults"},
		{name: "made", files: ci("persistence-values.yaml"), claim: "rel-tether-server-data", made: true,
			class: ptr("fast-ssd"), size: "5Gi", modes: "[ReadWriteOncePod]"},
		{name: "made with the defaults", set: []string{"persistence.enabled=true"}, claim: "rel-tether-server-data", made: true,
			size: "2Gi", modes: "[ReadWriteOnce]"},
		{name: "made without a class", set: []string{"persistence.enabled=true", "persistence.storageClassName=-"},
			claim: "rel-tether-server-data", made: true, class: ptr(""), size: "2Gi", modes: "[ReadWriteOnce]"},
		{name: "existing", files: ci("persistence-claim-values.yaml"), claim: "tether-state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := serverChart.mustTemplate(t, tc.files, tc.set...)
			cfg, _ := serverConfig(t, m)
			d := m.deployment(t)
			pod := &d.Spec.Template.Spec
			c := container(t, pod, "server")
			checkHardened(t, pod, c)

			dir, _ := cfg["data-dir"].(string)
			if tc.claim == "" {
				if dir != "" || len(m.claims) != 0 {
					t.Errorf("data-dir %q, %d claims without persistence.enabled; want neither", dir, len(m.claims))
				}
				checkRollingUpdate(t, d)
				return
			}
			if dir == "" {
				t.Fatal("no data-dir in the server config with persistence.enabled")
			}
			if got := dataVolume(t, pod, c, dir); got != tc.claim {
				t.Errorf("--data-dir on claim %s; want %s", got, tc.claim)
			}
			if tc.made != (len(m.claims) == 1) || len(m.claims) > 1 {
				t.Fatalf("%d claims rendered; want %v", len(m.claims), tc.made)
			}
			if tc.made {
				pvc := m.claims[0]
				if pvc.Name != tc.claim {
					t.Errorf("claim %s rendered; the pod mounts %s", pvc.Name, tc.claim)
				}
				if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != tc.size {
					t.Errorf("claim size %s; want %s", got.String(), tc.size)
				}
				if got := accessModes(pvc.Spec.AccessModes); got != tc.modes {
					t.Errorf("claim accessModes %s; want %s", got, tc.modes)
				}
				if (pvc.Spec.StorageClassName == nil) != (tc.class == nil) ||
					(tc.class != nil && *pvc.Spec.StorageClassName != *tc.class) {
					t.Errorf("claim storageClassName %v; want %v (nil: the cluster's default)", deref(pvc.Spec.StorageClassName), deref(tc.class))
				}
			}

			// The old pod lets go of the file before the new one opens it.
			if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate != nil {
				t.Errorf("strategy %+v with persistence; want Recreate: a new pod beside the old one could not open %s/tether.db",
					d.Spec.Strategy, dir)
			}
			// The volume is the server's group's, whatever user made it.
			psc := pod.SecurityContext
			if psc == nil || psc.FSGroup == nil || psc.RunAsGroup == nil || *psc.FSGroup != *psc.RunAsGroup {
				t.Fatalf("pod securityContext %+v; want fsGroup = runAsGroup, so that the volume is writable by the server", psc)
			}
			if p := psc.FSGroupChangePolicy; p == nil || *p != corev1.FSGroupChangeOnRootMismatch {
				t.Errorf("fsGroupChangePolicy %v; want OnRootMismatch, so that the volume is not walked at every start", deref(p))
			}
		})
	}
}

// checkRollingUpdate asserts that d starts a new pod, and waits for it to be
// ready, before it stops an old one.
func checkRollingUpdate(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	ru := d.Spec.Strategy.RollingUpdate
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge.IntValue() != 1 {
		t.Errorf("strategy %+v; want RollingUpdate with maxUnavailable 0, maxSurge 1: the new pod is ready before the old one stops", d.Spec.Strategy)
	}
}

func accessModes(modes []corev1.PersistentVolumeAccessMode) string {
	s := make([]string, len(modes))
	for i, m := range modes {
		s[i] = string(m)
	}
	return "[" + strings.Join(s, " ") + "]"
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestServerPersistenceRefusesSeveralReplicas: the file in --data-dir is
// held by one process at a time, and with a registry the replicas keep
// their state in Redis (the server refuses --data-dir then): the chart
// refuses persistence with either, naming the values to change.
func TestServerPersistenceRefusesSeveralReplicas(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want []string
	}{
		{[]string{"replicaCount=2"}, []string{"persistence.enabled", "replicaCount is 2", "replicaCount=1"}},
		{[]string{"autoscaling.enabled=true"}, []string{"persistence.enabled", "autoscaling.enabled=false"}},
		{[]string{"registry.url=redis://r:6379", "peerSecret.existingSecret=p"}, []string{"persistence.enabled=false", "registry.url"}},
		{[]string{"registry.urlSecret.name=u", "peerSecret.existingSecret=p"}, []string{"persistence.enabled=false", "registry.urlSecret.name"}},
		{[]string{"redis.enabled=true", "redis.password=p", "peerSecret.existingSecret=p"}, []string{"persistence.enabled=false", "redis.enabled"}},
		{[]string{"registry.url=redis://r:6379", "peerSecret.existingSecret=p", "replicaCount=3"}, []string{"persistence.enabled=false", "registry.url"}},
	} {
		t.Run(strings.Join(tc.set, ","), func(t *testing.T) {
			t.Parallel()
			_, err := serverChart.template(t, nil, append([]string{"persistence.enabled=true"}, tc.set...)...)
			if err == nil {
				t.Fatal("rendered; want a refusal")
			}
			// What helm says, without the command line that names the values.
			_, said, _ := strings.Cut(err.Error(), "\nError: ")
			for _, w := range tc.want {
				if !strings.Contains(said, w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestServerBufferAndAccessLogDefaults: left empty, the webhook buffer's
// limits and the access log are the server's own defaults: the config file
// does not set them.
func TestServerBufferAndAccessLogDefaults(t *testing.T) {
	cfg, _ := serverConfig(t, serverChart.mustTemplate(t, nil))
	for k := range cfg {
		if strings.HasPrefix(k, "buffer-") || k == "access-log" || k == "data-dir" {
			t.Errorf("config sets %s = %v by default; want the server's default", k, cfg[k])
		}
	}
	cfg, _ = serverConfig(t, serverChart.mustTemplate(t, nil, "accessLog=true", "webhookBuffer.maxRequests=7"))
	if cfg["access-log"] != true || cfg["buffer-max-requests"] != 7 {
		t.Errorf("access-log %v, buffer-max-requests %v; want true, 7", cfg["access-log"], cfg["buffer-max-requests"])
	}
}
