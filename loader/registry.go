package loader

import (
	"fmt"
	"strings"

	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/cufile"
	"github.com/nvfeed/nvfeed/loader/fsread"
	"github.com/nvfeed/nvfeed/loader/raw"
)

// DefaultBackend is the backend used when Options.Backend is empty.
const DefaultBackend = fsread.Name

// Backends returns the description of every backend this build offers,
// the default first. Adding a backend is one package implementing
// backend.Backend and one line here.
func Backends() []backend.Spec {
	return []backend.Spec{fsread.Spec(), raw.GDSSpec(), raw.BAMSpec(), cufile.Spec()}
}

// BackendSpec returns the named backend's description ("" names the
// default); the error wraps ErrOptions and lists the backends.
func BackendSpec(name string) (backend.Spec, error) {
	if name == "" {
		name = DefaultBackend
	}
	var names []string
	for _, s := range Backends() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return backend.Spec{}, fmt.Errorf("%w: unknown backend %q (want %s)", ErrOptions, name, strings.Join(names, ", "))
}
