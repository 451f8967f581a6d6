package auth

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"testing"
)

// TestReasonsListsEveryReason: every Reason constant declared in
// reasons.go is in Reasons, so that the metrics export it from the start.
func TestReasonsListsEveryReason(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "reasons.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Reason" {
				continue
			}
			for i, name := range v.Names {
				declared++
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s is not a string literal", name.Name)
				}
				value, _ := strconv.Unquote(lit.Value)
				if !slices.Contains(Reasons(), Reason(value)) {
					t.Errorf("%s (%q) is not in Reasons()", name.Name, value)
				}
			}
		}
	}
	if declared != len(Reasons()) {
		t.Errorf("reasons.go declares %d Reason constants, Reasons() lists %d", declared, len(Reasons()))
	}
}
