package status

import "testing"

func TestParseFormat(t *testing.T) {
	for in, want := range map[string]Format{"": Table, "table": Table, "wide": Wide, "json": JSON} {
		if got, err := ParseFormat(in); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseFormat("yaml"); err == nil || !contains(err.Error(), "--output", `"yaml"`, "json", "wide") {
		t.Errorf("ParseFormat(yaml) error %v; want one naming --output, the value and the choices", err)
	}
}
