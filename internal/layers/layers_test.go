// SPDX-License-Identifier: Apache-2.0

package layers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/loader"
)

const module = "github.com/nvfeed/nvfeed/"

// readLayers parses ARCHITECTURE.md's layer table (the one place the
// layers are written) into a rank per package, lowest first: a package
// may import only packages of a lower rank (tests aside). A row is
// "| RANK | `pkg/`, `pkg/` | its job |"; a row whose rank is not a number
// (the Python client's) names no Go package.
func readLayers(t *testing.T, root string) map[string]int {
	b, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	layer := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(line, "|") {
			continue
		}
		rank, err := strconv.Atoi(strings.TrimSpace(cells[1]))
		if err != nil {
			continue // the header, its rule, the client's row
		}
		for _, name := range strings.Split(cells[2], ",") {
			name = strings.TrimSuffix(strings.Trim(strings.TrimSpace(name), "`"), "/")
			if name == "" || strings.Contains(name, "...") {
				t.Errorf("ARCHITECTURE.md: layer %d names %q: give every package its whole path", rank, name)
				continue
			}
			if _, dup := layer[name]; dup {
				t.Errorf("ARCHITECTURE.md names %s twice", name)
			}
			layer[name] = rank
		}
	}
	if len(layer) < 10 {
		t.Fatalf("ARCHITECTURE.md's layer table gives only %d packages", len(layer))
	}
	return layer
}

// walkSources calls fn with every Go source file of the module below root
// (test files, testdata, the client and hidden directories aside) and its
// package's directory relative to root.
func walkSources(root string, fn func(path, rel string) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "python" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		return fn(path, rel)
	})
}

func TestNoImportRunsUp(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	layer := readLayers(t, root)
	imports := map[string]map[string]bool{} // package -> module packages it imports
	err = walkSources(root, func(path, rel string) error {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if imports[rel] == nil {
			imports[rel] = map[string]bool{}
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if dep, ok := strings.CutPrefix(p, module); ok {
				imports[rel][dep] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(imports) < 10 {
		t.Fatalf("found only %d packages under %s", len(imports), root)
	}
	for pkg, deps := range imports {
		r, ok := layer[pkg]
		if !ok {
			t.Errorf("package %s has no layer: give it a row in ARCHITECTURE.md's table", pkg)
			continue
		}
		for dep := range deps {
			if dr, ok := layer[dep]; ok && dr >= r {
				t.Errorf("%s (layer %d) imports %s (layer %d): an import runs up or across the layers", pkg, r, dep, dr)
			}
		}
	}
	for pkg := range layer {
		if _, ok := imports[pkg]; !ok {
			if _, err := os.Stat(filepath.Join(root, pkg)); err != nil {
				t.Errorf("ARCHITECTURE.md's layer table names %s, which does not exist", pkg)
			}
		}
	}
}

// TestSessionImportsNoLoaderInternals: the daemon's session core decides
// datasets, access, budget and delivery, never the loader's things: it
// imports the loader's facade, no backend and no memory kind. It names
// no backend either: it asks what a backend can do (its backend.Spec).
func TestSessionImportsNoLoaderInternals(t *testing.T) {
	dir := "../../cmd/loaderd/internal/session"
	backends := map[string]bool{}
	for _, s := range loader.Backends() {
		backends[s.Name] = true
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	n := 0
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		n++
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if strings.HasPrefix(p, module+"loader/") {
				t.Errorf("session/%s imports %s: the loader decides that, behind package loader", e.Name(), p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil && backends[v] {
					t.Errorf("%s: the backend name %q: ask its backend.Spec instead", fset.Position(lit.Pos()), v)
				}
			}
			return true
		})
	}
	if n == 0 {
		t.Fatal("no session sources found")
	}
}
