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

func TestPrintable(t *testing.T) {
	tests := []struct{ in, want string }{
		{"tether 1.2.0 (frp v0.71.0, go1.26.8 linux/amd64)", "tether 1.2.0 (frp v0.71.0, go1.26.8 linux/amd64)"},
		{"", ""},
		{"héllo wörld ✓ 日本", "héllo wörld ✓ 日本"},
		{"\x1b[2J\x1b[1;31mOWNED\x1b[0m", `\x1b[2J\x1b[1;31mOWNED\x1b[0m`},
		{"1.0\nacme  evil  0.0.0.0", `1.0\nacme  evil  0.0.0.0`},
		{"1.0\rforged", `1.0\rforged`},
		{"a\tb", `a\tb`},
		{"bell\a del\x7f", `bell\a del\x7f`},
		{"c1 \u009b31m", `c1 \u009b31m`},
		{"bidi \u202eexe.txt", `bidi \u202eexe.txt`},
		{"zero\u200bwidth", `zero\u200bwidth`},
		{"bad \xff utf-8", `bad \xff utf-8`},
		{`back\slash`, `back\\slash`},
	}
	for _, tc := range tests {
		if got := printable(tc.in); got != tc.want {
			t.Errorf("printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestShortID(t *testing.T) {
	for in, want := range map[string]string{
		"5f0c6a7b8c9d0e1f2a3b4c5d6e7f8091": "5f0c6a7b",
		"5f0c6a7b":                         "5f0c6a7b",
		"5f0c":                             "5f0c",
		"":                                 "",
		"日本語のセッションです":                      "日本語のセッショ", // characters, not bytes
	} {
		if got := shortID(in); got != want {
			t.Errorf("shortID(%q) = %q, want %q", in, got, want)
		}
	}
}
