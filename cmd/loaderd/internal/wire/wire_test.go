// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"bufio"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// wirePy is the client's description of the messages.
const wirePy = "../../../../python/nvfeed/_wire.py"

// wireTypes pairs each TypedDict of the client with the Go struct that is
// its wire form.
var wireTypes = map[string]reflect.Type{
	"Sampling":         reflect.TypeFor[loader.Sampling](),
	"State":            reflect.TypeFor[loader.State](),
	"Content":          reflect.TypeFor[bmap.Content](),
	"Stage":            reflect.TypeFor[loader.Stage](),
	"ROI":              reflect.TypeFor[loader.ROI](),
	"OpenRequest":      reflect.TypeFor[OpenRequest](),
	"MemoryDesc":       reflect.TypeFor[batchmem.Desc](),
	"OpenResponse":     reflect.TypeFor[OpenResponse](),
	"MemoryResponse":   reflect.TypeFor[MemoryResponse](),
	"NextResponse":     reflect.TypeFor[NextResponse](),
	"BackendOption":    reflect.TypeFor[backend.Option](),
	"BackendSpec":      reflect.TypeFor[backend.Spec](),
	"BackendsResponse": reflect.TypeFor[BackendsResponse](),
	"ErrorResponse":    reflect.TypeFor[ErrorResponse](),
	"DatasetInfo":      reflect.TypeFor[DatasetInfo](),
	"DatasetsResponse": reflect.TypeFor[DatasetsResponse](),
	"Reloaded":         reflect.TypeFor[Reloaded](),
	"ReloadResponse":   reflect.TypeFor[ReloadResponse](),
	"StatusResponse":   reflect.TypeFor[StatusResponse](),
	"DatasetStatus":    reflect.TypeFor[DatasetStatus](),
	"StaleCause":       reflect.TypeFor[StaleCause](),
	"SessionInfo":      reflect.TypeFor[SessionInfo](),
	"Budget":           reflect.TypeFor[Budget](),
	"NextRequest":      reflect.TypeFor[NextRequest](),
	"ReleaseRequest":   reflect.TypeFor[ReleaseRequest](),
	"StreamRequest":    reflect.TypeFor[StreamRequest](),
	"StreamControl":    reflect.TypeFor[StreamControl](),
}

// TestWireMatchesClient: every key the daemon sends or takes is in the
// client's TypedDict with the same type, and the client names no key the
// daemon does not know: checked both ways, for every message.
func TestWireMatchesClient(t *testing.T) {
	py := parseTypedDicts(t, wirePy)
	for name, typ := range wireTypes {
		t.Run(name, func(t *testing.T) {
			fields, ok := py[name]
			if !ok {
				t.Fatalf("%s has no TypedDict %s (the Go wire type %s)", wirePy, name, typ)
			}
			goKeys := map[string]string{}
			goFields(typ, goKeys)
			for k, gt := range goKeys {
				pt, ok := fields[k]
				switch {
				case !ok:
					t.Errorf("key %q (%s) is on the wire but not in the client's %s", k, gt, name)
				case gt != "Any" && gt != pt: // Go any (a default of any kind) takes whatever the client says
					t.Errorf("key %q: Go %s is %s in Python, the client says %s", k, typ, gt, pt)
				}
			}
			for k := range fields {
				if _, ok := goKeys[k]; !ok {
					t.Errorf("the client's %s has key %q, which %s does not carry", name, k, typ)
				}
			}
		})
	}
	for name := range py {
		if _, ok := wireTypes[name]; !ok && name != "ReaderArgs" {
			t.Errorf("the client's TypedDict %s is paired with no Go wire type in this test", name)
		}
	}
}

// goFields adds the msgpack keys of struct t, inline fields flattened, with
// each field's Python annotation.
func goFields(t reflect.Type, out map[string]string) {
	for f := range t.Fields() {
		tag := f.Tag.Get("msgpack")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if f.Anonymous && (strings.Contains(opts, "inline") || tag == "") {
			goFields(f.Type, out)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = pyType(f.Type)
	}
}

// pyType is the annotation the client writes for a Go type.
func pyType(t reflect.Type) string {
	for name, wt := range wireTypes {
		if wt == t {
			return name
		}
	}
	switch t.Kind() {
	case reflect.String:
		return "str"
	case reflect.Bool:
		return "bool"
	case reflect.Float32, reflect.Float64:
		return "float"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "int"
	case reflect.Slice:
		return "List[" + pyType(t.Elem()) + "]"
	case reflect.Pointer:
		return "Optional[" + pyType(t.Elem()) + "]"
	case reflect.Map:
		return "Dict[" + pyType(t.Key()) + "," + pyType(t.Elem()) + "]"
	case reflect.Interface:
		return "Any"
	}
	return t.String()
}

var (
	classRe = regexp.MustCompile(`^class (\w+)\(([^)]*)\):`)
	fieldRe = regexp.MustCompile(`^    (\w+): ([^#]+?)\s*(#.*)?$`)
)

// parseTypedDicts reads the TypedDict classes of a Python file: name ->
// key -> annotation, inherited keys included.
func parseTypedDicts(t *testing.T, path string) map[string]map[string]string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string]string{}
	var cur map[string]string
	inDoc := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if n := strings.Count(line, `"""`); n == 1 {
			inDoc = !inDoc
			continue
		} else if n > 1 || inDoc {
			continue
		}
		if m := classRe.FindStringSubmatch(line); m != nil {
			cur = map[string]string{}
			out[m[1]] = cur
			for _, base := range strings.Split(m[2], ",") {
				base = strings.TrimSpace(base)
				if base == "TypedDict" || strings.HasPrefix(base, "total=") {
					continue
				}
				inherited, ok := out[base]
				if !ok {
					t.Fatalf("%s: class %s: base %s not defined before it", path, m[1], base)
				}
				for k, v := range inherited {
					cur[k] = v
				}
			}
			continue
		}
		if cur != nil {
			if m := fieldRe.FindStringSubmatch(line); m != nil {
				cur[m[1]] = strings.ReplaceAll(m[2], " ", "")
			} else if line != "" && !strings.HasPrefix(line, "    ") {
				cur = nil
			}
		}
	}
	if len(out["OpenRequest"]) == 0 {
		t.Fatalf("%s: no TypedDicts parsed", path)
	}
	return out
}
