package deploy

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart uses. The Prometheus Operator's Go types are not a dependency of
// tether; decoding strictly into this struct still fails on a misspelt
// field, and the field names follow the operator's CRD.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			MatchNames []string `json:"matchNames,omitempty"`
			Any        bool     `json:"any,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			Authorization *struct {
				Type        string                    `json:"type,omitempty"`
				Credentials *corev1.SecretKeySelector `json:"credentials,omitempty"`
			} `json:"authorization,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// podMonitor is the part of monitoring.coreos.com/v1 PodMonitor the client
// chart uses, with the operator's field names.
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Interval string `json:"interval,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// prometheusRule is monitoring.coreos.com/v1 PrometheusRule, with the
// operator's field names.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert,omitempty"`
				Record      string            `json:"record,omitempty"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// certificate is the part of cert-manager.io/v1 Certificate the server
// chart uses, with cert-manager's field names (cert-manager's Go types are
// not a dependency of tether).
type certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName  string   `json:"secretName"`
		CommonName  string   `json:"commonName,omitempty"`
		DNSNames    []string `json:"dnsNames,omitempty"`
		IPAddresses []string `json:"ipAddresses,omitempty"`
		URIs        []string `json:"uris,omitempty"`
		Duration    string   `json:"duration,omitempty"`
		RenewBefore string   `json:"renewBefore,omitempty"`
		IsCA        bool     `json:"isCA,omitempty"`
		Usages      []string `json:"usages,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			Encoding       string `json:"encoding,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind,omitempty"`
			Group string `json:"group,omitempty"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// manifests holds one render, decoded into the API types.
type manifests struct {
	raw             string
	docs            []string
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	serviceAccounts []*corev1.ServiceAccount
	ingresses       []*networkingv1.Ingress
	networkPolicies []*networkingv1.NetworkPolicy
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	serviceMonitors []*serviceMonitor
	podMonitors     []*podMonitor
	prometheusRules []*prometheusRule
	certificates    []*certificate
	claims          []*corev1.PersistentVolumeClaim
}

func decodeAll(t *testing.T, stream string) *manifests {
	t.Helper()
	m, err := decodeManifests(stream)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// decodeManifests decodes every document strictly: an unknown field, a
// wrong type or an unknown kind is an error.
func decodeManifests(stream string) (*manifests, error) {
	m := &manifests{raw: stream}
	for i, doc := range splitDocs(stream) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w\n%s", i, err, doc)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			m.deployments, obj = append(m.deployments, o), o
		case "v1 Service":
			o := &corev1.Service{}
			m.services, obj = append(m.services, o), o
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			m.configMaps, obj = append(m.configMaps, o), o
		case "v1 Secret":
			o := &corev1.Secret{}
			m.secrets, obj = append(m.secrets, o), o
		case "v1 PersistentVolumeClaim":
			o := &corev1.PersistentVolumeClaim{}
			m.claims, obj = append(m.claims, o), o
		case "v1 ServiceAccount":
			o := &corev1.ServiceAccount{}
			m.serviceAccounts, obj = append(m.serviceAccounts, o), o
		case "networking.k8s.io/v1 Ingress":
			o := &networkingv1.Ingress{}
			m.ingresses, obj = append(m.ingresses, o), o
		case "networking.k8s.io/v1 NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			m.networkPolicies, obj = append(m.networkPolicies, o), o
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			m.pdbs, obj = append(m.pdbs, o), o
		case "autoscaling/v2 HorizontalPodAutoscaler":
			o := &autoscalingv2.HorizontalPodAutoscaler{}
			m.hpas, obj = append(m.hpas, o), o
		case "monitoring.coreos.com/v1 ServiceMonitor":
			o := &serviceMonitor{}
			m.serviceMonitors, obj = append(m.serviceMonitors, o), o
		case "monitoring.coreos.com/v1 PodMonitor":
			o := &podMonitor{}
			m.podMonitors, obj = append(m.podMonitors, o), o
		case "monitoring.coreos.com/v1 PrometheusRule":
			o := &prometheusRule{}
			m.prometheusRules, obj = append(m.prometheusRules, o), o
		case "cert-manager.io/v1 Certificate":
			o := &certificate{}
			m.certificates, obj = append(m.certificates, o), o
		default:
			return nil, fmt.Errorf("document %d: unknown kind %q of apiVersion %q: add it to decodeManifests with its Go type\n%s",
				i, tm.Kind, tm.APIVersion, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w\n%s", i, tm.Kind, err, doc)
		}
		m.docs = append(m.docs, doc)
	}
	return m, nil
}

// deployment returns the one Deployment that runs tether: every one
// rendered but the server chart's trial Redis.
func (m *manifests) deployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	var found []*appsv1.Deployment
	for _, d := range m.deployments {
		if d.Labels[componentLabel] != "redis" {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("rendered %d tether Deployments; want 1", len(found))
	}
	return found[0]
}

// redis returns the server chart's trial Redis Deployment, or nil.
func (m *manifests) redis(t *testing.T) *appsv1.Deployment {
	t.Helper()
	var found []*appsv1.Deployment
	for _, d := range m.deployments {
		if d.Labels[componentLabel] == "redis" {
			found = append(found, d)
		}
	}
	if len(found) > 1 {
		t.Fatalf("rendered %d Redis Deployments; want at most 1", len(found))
	}
	if len(found) == 0 {
		return nil
	}
	return found[0]
}

const componentLabel = "app.kubernetes.io/component"

func (m *manifests) configMap(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	for _, c := range m.configMaps {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no ConfigMap %q rendered", name)
	return nil
}

func (m *manifests) service(t *testing.T, suffix string) *corev1.Service {
	t.Helper()
	for _, s := range m.services {
		if strings.HasSuffix(s.Name, suffix) {
			return s
		}
	}
	t.Fatalf("no Service named *%s rendered", suffix)
	return nil
}

func (m *manifests) secret(t *testing.T, name string) *corev1.Secret {
	t.Helper()
	for _, s := range m.secrets {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no Secret %q rendered", name)
	return nil
}

// selects reports whether the equality selector sel (a Service's, a
// policy's podSelector matchLabels) matches labels; an empty one matches all.
func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("pod has no container %q", name)
	return nil
}

func TestDecodeIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"misspelt field": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicass: 2\n",
		"wrong type":     "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: seven}]\n",
		"unknown kind":   "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}\n",
		"misspelt ServiceMonitor field": "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\n" +
			"spec:\n  selector: {}\n  endpoints: [{port: admin, intervall: 10s}]\n",
		"misspelt Certificate field": "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: x}\n" +
			"spec:\n  secretName: x\n  issuerRef: {name: ca}\n  usage: [client auth]\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeManifests(doc); err == nil {
				t.Fatalf("decoded without error:\n%s", doc)
			}
		})
	}
	for kind, ok := range map[string]string{
		"ServiceMonitor": "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\n" +
			"spec:\n  selector: {matchLabels: {a: b}}\n  endpoints: [{port: admin, path: /metrics, interval: 10s}]\n",
		"Certificate": "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: x}\n" +
			"spec:\n  secretName: x\n  issuerRef: {name: ca}\n  usages: [client auth]\n",
	} {
		if _, err := decodeManifests(ok); err != nil {
			t.Errorf("a valid %s: %v", kind, err)
		}
	}
}
