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
			p = &goPkg{name: f.Name.Name, decls: map[string]bool{}, members: map[string]map[string]bool{}}
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
	// goRef is a Go name as the document writes one: Name, pkg.Name,
	// Type.Member, pkg.Type.Member, a call's parentheses aside.
	goRef = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\(.*\))?$`)
)

// TestArchitectureNamesExist: what ARCHITECTURE.md names exists. Every
// path it names is in the tree; every file it names is in one of its row's
// packages (or, outside the table, anywhere); every Go name it writes as
// pkg.Name, Type.Member or a row's bare exported Name is declared where it
// says; every Python module of the client is named in the client's row,
// and every module the row names exists.
func TestArchitectureNamesExist(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	pkgs := parseTree(t, root)
	byName := map[string][]*goPkg{} // a package's name -> the packages of that name
	types := map[string][]*goPkg{}  // a type's name -> the packages declaring it
	for _, p := range pkgs {
		byName[p.name] = append(byName[p.name], p)
		for typ := range p.members {
			types[typ] = append(types[typ], p)
		}
	}
	memberOf := func(ps []*goPkg, typ, id string) bool {
		for _, p := range ps {
			if p.members[typ][id] {
				return true
			}
		}
		return false
	}
	// resolve reports whether ref (a.b or a.b.c) names something declared:
	// a is a package (b declared in it, c a member of type b) or a type (b
	// its member). ok is false when a is neither: not a Go name we know
	// (a Python or DALI one).
	resolve := func(parts []string) (found, ok bool) {
		if ps := byName[parts[0]]; len(ps) > 0 {
			for _, p := range ps {
				if !p.decls[parts[1]] && !p.has(parts[1]) {
					continue
				}
				if len(parts) == 2 || p.members[parts[1]][parts[2]] {
					return true, true
				}
			}
			return false, true
		}
		if ps := types[parts[0]]; len(ps) > 0 {
			return memberOf(ps, parts[0], parts[1]), true
		}
		return false, false
	}
	checked := 0
	clientRow := ""
	for _, line := range strings.Split(string(b), "\n") {
		var rowPkgs []string // the packages of a table row, if line is one
		text := line
		if cells := strings.Split(line, "|"); strings.HasPrefix(line, "|") && len(cells) >= 4 {
			for _, m := range codeSpan.FindAllStringSubmatch(cells[2], -1) {
				rowPkgs = append(rowPkgs, strings.TrimSuffix(m[1], "/"))
			}
			if strings.TrimSpace(cells[1]) == "—" {
				clientRow = line
				continue
			}
			text = strings.Join(cells[3:], "|")
		}
		for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
			span := m[1]
			switch {
			case strings.HasSuffix(span, "/") || strings.HasSuffix(span, ".go") && strings.Contains(span, "/"):
				if _, err := os.Stat(filepath.Join(root, span)); err != nil {
					if len(rowPkgs) == 0 || !existsIn(root, rowPkgs, span) {
						t.Errorf("ARCHITECTURE.md names %s, which does not exist", span)
					}
				}
				checked++
			case strings.HasSuffix(span, ".go"):
				where := rowPkgs
				if len(where) == 0 {
					for dir := range pkgs {
						where = append(where, dir)
					}
				}
				if !existsIn(root, where, span) {
					in := "anywhere in the tree"
					if len(rowPkgs) > 0 {
						in = "in its row's packages " + strings.Join(rowPkgs, ", ")
					}
					t.Errorf("ARCHITECTURE.md names the file %s, which is not %s", span, in)
				}
				checked++
			default:
				g := goRef.FindStringSubmatch(span)
				if g == nil {
					continue
				}
				parts := append([]string{g[1]}, strings.Split(strings.TrimPrefix(g[2], "."), ".")...)
				if g[2] == "" {
					parts = parts[:1]
				}
				if len(parts) == 1 {
					if len(rowPkgs) == 0 || !ast.IsExported(parts[0]) || strings.ToUpper(parts[0]) == parts[0] {
						continue // not a Go name of the row's, or an environment variable's or C's
					}
					found := false
					for _, dir := range rowPkgs {
						if p := pkgs[dir]; p != nil && p.has(parts[0]) {
							found = true
						}
					}
					if !found {
						t.Errorf("ARCHITECTURE.md: the row of %v names %s, which none of them declares", rowPkgs, parts[0])
					}
					checked++
					continue
				}
				found, ok := resolve(parts)
				if !ok {
					continue
				}
				if !found {
					t.Errorf("ARCHITECTURE.md names %s, which is not declared", span)
				}
				checked++
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d names in ARCHITECTURE.md checked: the parse missed the document", checked)
	}

	// The client's row: its modules (`_name`, `nvfeed.name`) against
	// python/nvfeed.
	if clientRow == "" {
		t.Fatal("ARCHITECTURE.md's table has no row for the Python client")
	}
	named := map[string]bool{}
	for _, m := range codeSpan.FindAllStringSubmatch(clientRow, -1) {
		s := m[1]
		if mod, ok := strings.CutPrefix(s, "nvfeed."); ok {
			s = mod
		} else if !strings.HasPrefix(s, "_") || strings.Contains(s, ".") {
			continue
		}
		named[s] = true
		if _, err := os.Stat(filepath.Join(root, "python", "nvfeed", s+".py")); err != nil {
			t.Errorf("ARCHITECTURE.md's client row names %s, which is not a module of python/nvfeed", s)
		}
	}
	mods, err := filepath.Glob(filepath.Join(root, "python", "nvfeed", "*.py"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range mods {
		mod := strings.TrimSuffix(filepath.Base(path), ".py")
		if mod != "__init__" && !named[mod] {
			t.Errorf("python/nvfeed/%s.py: the module is not named in ARCHITECTURE.md's client row", mod)
		}
	}
}

// existsIn reports whether name (a file, or a path below a package) is in
// one of the directories dirs (relative to root).
func existsIn(root string, dirs []string, name string) bool {
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(root, dir, name)); err == nil {
			return true
		}
	}
	return false
}
