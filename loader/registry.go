// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"
	"strings"
	"sync"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/cufile"
	"github.com/nvfeed/nvfeed/loader/internal/fsread"
	"github.com/nvfeed/nvfeed/loader/internal/raw"
)

// Cred is who a loader reads for (Options.Cred): backend.Cred, named
// here for callers that leave backends to the loader.
type Cred = backend.Cred

// DefaultBackend is the backend of a loader that names none where raw
// reads cannot run (Options.Backend empty: see AutoBackend), and the one
// whose options BackendOptions given without a backend name are.
const DefaultBackend = fsread.Name

// AutoBackend is the backend a loader naming none reads with where the map allows raw reads.
// It reads raw only what the guard allows. Where it cannot open, DefaultBackend is used instead.
const AutoBackend = "gds"

// builtins returns the built-in backends' descriptions, the default
// first. They get what any registered backend gets: backend.Env. The
// cufile backend shares libs, the host's CUDA libraries (nil: its own).
func builtins(libs *cuda.Libs) []backend.Spec {
	return []backend.Spec{fsread.Spec(), raw.GDSSpec(), raw.BAMSpec(), cufile.Spec(libs)}
}

var (
	regMu      sync.RWMutex
	registered []backend.Spec // by Register, in order
)

// Register adds a backend to those this process offers, typically from an init function.
// The spec needs a name not yet taken and an Open; errors wrap ErrOptions.
func Register(s backend.Spec) error {
	if s.Name == "" || s.Open == nil {
		return fmt.Errorf("%w: register: a backend needs a name and an Open", ErrOptions)
	}
	regMu.Lock()
	defer regMu.Unlock()
	for _, t := range append(builtins(nil), registered...) {
		if t.Name == s.Name {
			return fmt.Errorf("%w: register: backend %q exists already", ErrOptions, s.Name)
		}
	}
	registered = append(registered, s)
	return nil
}

// Backends returns the description of every backend this process
// offers, the built-in ones first (the default first of all), then those
// added with Register in their order.
func Backends() []backend.Spec { return backends(nil) }

// backends is Backends with the built-ins sharing libs (builtins).
func backends(libs *cuda.Libs) []backend.Spec {
	regMu.RLock()
	defer regMu.RUnlock()
	return append(builtins(libs), registered...)
}

// BackendSpec returns the named backend's description ("" names the
// default); the error wraps ErrOptions and lists the backends.
func BackendSpec(name string) (backend.Spec, error) { return backendSpec(name, nil) }

// backendSpec is BackendSpec with the built-ins sharing libs (builtins).
func backendSpec(name string, libs *cuda.Libs) (backend.Spec, error) {
	if name == "" {
		name = DefaultBackend
	}
	var names []string
	for _, s := range backends(libs) {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return backend.Spec{}, fmt.Errorf("%w: unknown backend %q (want %s)", ErrOptions, name, strings.Join(names, ", "))
}
