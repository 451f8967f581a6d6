package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSchemaRejectsMistakes: helm refuses values that values.schema.json
// does not allow, naming the key: a misspelt key at the top and nested, and
// a value of the wrong type, in each chart.
func TestSchemaRejectsMistakes(t *testing.T) {
	for _, tc := range []struct {
		c    chart
		set  string
		want string
	}{
		{serverChart, "replicaCout=2", "additional properties 'replicaCout' not allowed"},
		{serverChart, "image.tagg=v1", "at '/image': additional properties 'tagg' not allowed"},
		{serverChart, "prometheusRule.enable=true", "at '/prometheusRule': additional properties 'enable' not allowed"},
		{serverChart, "replicaCount=two", "at '/replicaCount': got string, want integer"},
		{serverChart, "ingress.enabled=yes", "at '/ingress/enabled': got string, want boolean"},
		{serverChart, "ports.tunnel=70000", "at '/ports/tunnel': maximum: got 70,000, want 65,535"},
		{serverChart, "peerTLS.existingSecrett=tether-peer-tls", "at '/peerTLS': additional properties 'existingSecrett' not allowed"},
		{serverChart, "peerTLS.certManager.enable=true", "at '/peerTLS/certManager': additional properties 'enable' not allowed"},
		{serverChart, "peerTLS.certManager.issuerRef.nam=ca", "at '/peerTLS/certManager/issuerRef': additional properties 'nam' not allowed"},
		{serverChart, "peerTLS.certManager.duration=90d", "at '/peerTLS/certManager/duration': '90d' does not match pattern"},
		{serverChart, "persistence.size=1GB", "at '/persistence/size': '1GB' does not match pattern"},
		{serverChart, "persistence.accessModes={ReadOnlyMany}", "at '/persistence/accessModes/0': value must be one of"},
		{serverChart, "persistence.existingclaim=c", "at '/persistence': additional properties 'existingclaim' not allowed"},
		{serverChart, "webhookBuffer.retention=3d", "at '/webhookBuffer/retention': '3d' does not match pattern"},
		{serverChart, "webhookBuffer.maxBody=10MiB", "at '/webhookBuffer/maxBody': got string, want integer"},
		{serverChart, "webhookBuffer.maxTotalBytes=-1", "at '/webhookBuffer/maxTotalBytes': minimum: got -1, want 0"},
		{serverChart, "accessLog=yes", "at '/accessLog': got string, want boolean"},
		{clientChart, "replicaCout=2", "additional properties 'replicaCout' not allowed"},
		{clientChart, "routes.argoCd.enabled=false", "at '/routes': additional properties 'argoCd' not allowed"},
		{clientChart, "replicaCount=two", "at '/replicaCount': got string, want integer"},
		{clientChart, "transport=quic", "at '/transport': value must be one of 'tcp', 'wss'"},
	} {
		t.Run(tc.c.name+"/"+tc.set, func(t *testing.T) {
			t.Parallel()
			_, err := tc.c.template(t, nil, tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestSchemaMatchesValues: the schema has a property for every value in
// values.yaml and none that values.yaml lacks (but Helm's global), so that a
// new value cannot be forgotten in it, nor an old one linger.
func TestSchemaMatchesValues(t *testing.T) {
	for _, c := range charts {
		t.Run(c.name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(c.dir(), "values.schema.json"))
			if err != nil {
				t.Fatal(err)
			}
			var schema schemaNode
			if err := json.Unmarshal(data, &schema); err != nil {
				t.Fatalf("values.schema.json: %v", err)
			}
			values := readValues(t, filepath.Join(c.dir(), "values.yaml"))
			for _, problem := range compareSchema(&schema, values, "") {
				t.Error(problem)
			}
			if schema.AdditionalProperties == nil || *schema.AdditionalProperties {
				t.Error("the schema allows unknown keys at the top")
			}
		})
	}
}

type schemaNode struct {
	Type                 string                 `json:"type"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties *bool                  `json:"-"`
	RawAdditional        json.RawMessage        `json:"additionalProperties"`
}

func (n *schemaNode) UnmarshalJSON(b []byte) error {
	type plain schemaNode
	if err := json.Unmarshal(b, (*plain)(n)); err != nil {
		return err
	}
	var allowed bool
	if json.Unmarshal(n.RawAdditional, &allowed) == nil {
		n.AdditionalProperties = &allowed
	}
	return nil
}

// compareSchema lists the values under prefix that the schema node n does
// not describe, and the properties of n that values lacks. A map of values
// is walked where n lists its properties; where n is an open object (labels,
// resources) the map is one value.
func compareSchema(n *schemaNode, values map[string]any, prefix string) []string {
	var problems []string
	for k, v := range values {
		path := strings.TrimPrefix(prefix+"."+k, ".")
		p, ok := n.Properties[k]
		if !ok {
			problems = append(problems, "values.yaml has "+path+"; values.schema.json does not describe it")
			continue
		}
		if sub, isMap := v.(map[string]any); isMap && len(p.Properties) > 0 {
			problems = append(problems, compareSchema(p, sub, path)...)
		}
	}
	for k := range n.Properties {
		if _, ok := values[k]; !ok && (prefix != "" || k != "global") {
			problems = append(problems, "values.schema.json describes "+strings.TrimPrefix(prefix+"."+k, ".")+"; values.yaml has no such value")
		}
	}
	slices.Sort(problems)
	return problems
}
