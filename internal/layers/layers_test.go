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

// layers gives each package of the module its layer, lowest first: a
// package may import only packages of a lower layer (tests aside). This
// is the one place the layers are written. A new package gets a line
// here.
func layers() map[string]int {
	return map[string]int{
		"extentinfo": 0, "bmap/npy": 0, "internal/uring": 0, "internal/cred": 0, "internal/caps": 0,
		"internal/confine": 0, "internal/cli": 0, "internal/numa": 0, "internal/stdrand": 0,
		"internal/faults": 0, "internal/testenv": 0, "internal/cuda/standin": 0,

		"internal/cuda": 1, "bmap": 1,

		"bmap/wds": 2, "bmap/fresh": 2, "internal/testfs": 2,

		"loader/backend": 3,

		"loader/batchmem": 4, "loader/backend/backendtest": 4, "loader/internal/readpool": 4,
		"loader/internal/shared": 4, "loader/internal/samplefile": 4, "loader/internal/counts": 4,
		"loader/internal/daliorder": 4, "loader/internal/permute": 4,

		"loader/internal/wdsorder": 5, "loader/internal/fsread": 5, "loader/internal/raw": 5,
		"loader/internal/cufile": 5,

		"loader": 6,

		"cmd/loaderd/internal/session": 7, "cmd/loaderd/internal/wire": 7,
		"cmd/loaderd/internal/check": 7, "cmd/loaderd/internal/benchrun": 7,

		"cmd/loaderd/internal/serve": 8,

		"cmd/mkbmap": 9, "cmd/loaderd": 9, "tools/gendataset": 9, "internal/layers": 9,
	}
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
	layer := layers()
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
			t.Errorf("package %s has no layer: give it one in layers()", pkg)
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
				t.Errorf("layers() names %s, which does not exist", pkg)
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
