package layers

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/nvfeed/nvfeed/"

// layer ranks every package of the module, lowest first: a package may
// import only packages of a lower rank (tests aside). ARCHITECTURE.md shows
// the same table.
var layer = map[string]int{
	"extentinfo":       0, // building blocks: the kernel's interfaces
	"internal/uring":   0,
	"internal/cuda":    1,
	"internal/numa":    0,
	"internal/cred":    0,
	"internal/testenv": 0, // tests: skip or fail when the machine lacks root, loop devices

	"bmap":            1, // the block map
	"bmap/fresh":      2,
	"internal/testfs": 2, // test filesystems (tests only)

	"loader/backend":  3, // the contract between the core and backends
	"loader/batchmem": 4, // batch memory
	"loader/fsread":   4, // backends
	"loader/cufile":   5, // opens samples with fsread's
	"loader/raw":      5,
	"loader":          6, // the core

	"cmd/loaderd/internal/check":    7, // the daemon
	"cmd/loaderd/internal/benchrun": 7,
	"cmd/loaderd/internal/session":  7,
	"cmd/loaderd/internal/wire":     7, // the protocol's messages
	"cmd/loaderd/internal/serve":    8,

	"cmd/loaderd":      9, // mains
	"cmd/mkbmap":       9,
	"tools/gendataset": 9,
	"internal/layers":  9,
}

func TestNoImportRunsUp(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	imports := map[string]map[string]bool{} // package -> module packages it imports
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
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
			t.Errorf("package %s has no layer: give it one here and in ARCHITECTURE.md", pkg)
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
				t.Errorf("layer table names %s, which does not exist", pkg)
			}
		}
	}
}
