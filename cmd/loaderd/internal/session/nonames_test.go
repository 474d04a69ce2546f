// SPDX-License-Identifier: Apache-2.0

package session

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/loader"
)

// TestNamesNoBackend keeps the session code asking what a backend can do
// (its backend.Spec) instead of matching its name: no string literal of
// a non-test file is a backend's name.
func TestNamesNoBackend(t *testing.T) {
	names := map[string]bool{}
	for _, s := range loader.Backends() {
		names[s.Name] = true
	}
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		for _, f := range p.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if v, err := strconv.Unquote(lit.Value); err == nil && names[v] {
						t.Errorf("%s: the backend name %q: ask its backend.Spec instead", fset.Position(lit.Pos()), v)
					}
				}
				return true
			})
		}
	}
}
