// SPDX-License-Identifier: Apache-2.0

package layers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goPkg is what one package declares: its name, its top-level names, and
// per type its methods and fields (struct fields, interface methods).
type goPkg struct {
	dir     string // relative to the module's root
	name    string
	decls   map[string]bool
	members map[string]map[string]bool
}

// has reports whether id is declared in p at top level or as a member of
// one of its types.
func (p *goPkg) has(id string) bool {
	if p.decls[id] {
		return true
	}
	for _, m := range p.members {
		if m[id] {
			return true
		}
	}
	return false
}

// parseTree parses every package of the module (test files aside) into
// its declarations, keyed by its directory relative to root.
func parseTree(t *testing.T, root string) map[string]*goPkg {
	t.Helper()
	pkgs := map[string]*goPkg{}
	fset := token.NewFileSet()
	err := walkSources(root, func(path, rel string) error {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		p := pkgs[rel]
		if p == nil {
			p = &goPkg{dir: rel, name: f.Name.Name, decls: map[string]bool{}, members: map[string]map[string]bool{}}
			pkgs[rel] = p
		}
		member := func(typ, id string) {
			if p.members[typ] == nil {
				p.members[typ] = map[string]bool{}
			}
			p.members[typ][id] = true
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					p.decls[d.Name.Name] = true
					continue
				}
				typ := d.Recv.List[0].Type
				for {
					switch x := typ.(type) {
					case *ast.StarExpr:
						typ = x.X
						continue
					case *ast.IndexExpr:
						typ = x.X
						continue
					case *ast.IndexListExpr:
						typ = x.X
						continue
					}
					break
				}
				if id, ok := typ.(*ast.Ident); ok {
					member(id.Name, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							p.decls[n.Name] = true
						}
					case *ast.TypeSpec:
						p.decls[s.Name.Name] = true
						var fields *ast.FieldList
						switch tt := s.Type.(type) {
						case *ast.StructType:
							fields = tt.Fields
						case *ast.InterfaceType:
							fields = tt.Methods
						}
						if fields == nil {
							continue
						}
						for _, fl := range fields.List {
							for _, n := range fl.Names {
								member(s.Name.Name, n.Name)
							}
							if len(fl.Names) == 0 { // embedded: its type's name
								e := fl.Type
								if st, ok := e.(*ast.StarExpr); ok {
									e = st.X
								}
								switch x := e.(type) {
								case *ast.Ident:
									member(s.Name.Name, x.Name)
								case *ast.SelectorExpr:
									member(s.Name.Name, x.Sel.Name)
								}
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

var (
	codeSpan = regexp.MustCompile("`([^`]+)`")
	fileExt  = regexp.MustCompile(`\.(go|py|md|sh|yaml|conf|json|bmap|npy|tar|so|service)$`)
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// goRef is a Go name as the document writes one: Name, pkg.Name,
	// Type.Member, pkg.Type.Member, a call's parentheses aside.
	goRef = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\(.*\))?$`)
)

// TestArchitectureIsAMap: ARCHITECTURE.md stays a page a newcomer reads
// in ten minutes. It is at most 10 000 bytes, and no line of it runs past
// 200 characters.
func TestArchitectureIsAMap(t *testing.T) {
	b, err := os.ReadFile("../../ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 10000 {
		t.Errorf("ARCHITECTURE.md is %d bytes: keep it at most 10 000", len(b))
	}
	for i, line := range strings.Split(string(b), "\n") {
		if n := len([]rune(line)); n > 200 {
			t.Errorf("ARCHITECTURE.md:%d is %d characters long: keep lines under 200", i+1, n)
		}
	}
}

// TestDocNamesExist: what the documents name exists. Every path a code
// span or link names is in the tree. Every Go name written as pkg.Name,
// Type.Member or pkg.Type.Member is declared where it says.
func TestDocNamesExist(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := parseTree(t, root)
	for _, doc := range []string{"ARCHITECTURE.md", "README.md", "python/README.md", "docs/daemon.md", "docs/decisions.md", "docs/gpu.md", "docs/loader.md", "docs/mkbmap.md", "docs/protocol.md", "docs/security.md", "docs/torch.md"} {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		if n := checkNames(t, root, doc, string(b), pkgs); n < 3 {
			t.Errorf("only %d names in %s checked: the parse missed the document", n, doc)
		}
	}
}

// checkNames checks each path and Go name that text (the document doc)
// names, and returns how many it checked.
func checkNames(t *testing.T, root, doc, text string, pkgs map[string]*goPkg) int {
	t.Helper()
	byName := map[string][]*goPkg{} // a package's name -> the packages of that name
	types := map[string][]*goPkg{}  // a type's name -> the packages declaring it
	for _, p := range pkgs {
		byName[p.name] = append(byName[p.name], p)
		for typ := range p.members {
			types[typ] = append(types[typ], p)
		}
	}
	// resolve reports whether parts (a.b or a.b.c) name something
	// declared: a is a package (b declared in it, c a member of type b)
	// or a type (b its member). ok is false when a is neither: not a Go
	// name we know (a Python or DALI one).
	resolve := func(parts []string) (found, ok bool) {
		if ps := byName[parts[0]]; len(ps) > 0 {
			for _, p := range ps {
				if p.has(parts[1]) && (len(parts) == 2 || p.members[parts[1]][parts[2]]) || len(parts) == 2 && hasTest(root, p.dir, parts[1]) {
					return true, true
				}
			}
			return false, true
		}
		if ps := types[parts[0]]; len(ps) > 0 {
			for _, p := range ps {
				if p.members[parts[0]][parts[1]] {
					return true, true
				}
			}
			return false, true
		}
		return false, false
	}
	dir := filepath.Dir(filepath.Join(root, doc))
	checked := 0
	for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
		target, _, _ := strings.Cut(m[1], "#")
		if target == "" || strings.Contains(target, "://") {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, target)); err != nil {
			t.Errorf("%s links to %s, which does not exist", doc, target)
		}
		checked++
	}
	for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
		span := m[1]
		if strings.ContainsAny(span, " \n*:=<>$") {
			continue // a command line, a formula, a pattern
		}
		if strings.HasSuffix(span, "/") || strings.Contains(span, "/") && filepath.Ext(span) != "" {
			if _, err := os.Stat(filepath.Join(root, span)); err != nil {
				t.Errorf("%s names %s, which does not exist", doc, span)
			}
			checked++
			continue
		}
		g := goRef.FindStringSubmatch(span)
		if g == nil || g[2] == "" || fileExt.MatchString(span) {
			continue
		}
		parts := append([]string{g[1]}, strings.Split(strings.TrimPrefix(g[2], "."), ".")...)
		found, ok := resolve(parts)
		if !ok {
			continue
		}
		if !found {
			t.Errorf("%s names %s, which is not declared", doc, span)
		}
		checked++
	}
	return checked
}

// hasTest reports whether the tests of the package in dir (relative to
// root) declare the function name.
func hasTest(root, dir, name string) bool {
	if !strings.HasPrefix(name, "Test") && !strings.HasPrefix(name, "Benchmark") && !strings.HasPrefix(name, "Example") {
		return false
	}
	files, _ := filepath.Glob(filepath.Join(root, dir, "*_test.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), "func "+name+"(") {
			return true
		}
	}
	return false
}

// TestLoaderDocShowsTheExample: the Go code in docs/loader.md is the code
// of loader's Example, which go test compiles and runs. Each line of the
// block is a line of the example, in the same order.
func TestLoaderDocShowsTheExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/loader.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../../loader/example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "```go\n")
	block, _, _ = strings.Cut(block, "```")
	if !ok || strings.TrimSpace(block) == "" {
		t.Fatal("docs/loader.md has no Go block")
	}
	lines := strings.Split(string(src), "\n")
	at := 0
	for want := range strings.SplitSeq(block, "\n") {
		want = strings.TrimSpace(want)
		if want == "" {
			continue
		}
		for at < len(lines) && strings.TrimSpace(lines[at]) != want {
			at++
		}
		if at == len(lines) {
			t.Fatalf("docs/loader.md's Go block has %q, which loader/example_test.go lacks (in that order)", want)
		}
	}
}
