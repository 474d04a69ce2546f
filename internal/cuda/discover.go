// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ebitengine/purego"
)

// Library discovery. The dynamic loader searches neither Python's NVIDIA wheels nor $CUDA_HOME.
// So libcudart and libcufile are looked for, in order:
//
//  1. NVFEED_CUDA_LIB_DIR (loaderd's --cuda-lib-dir sets it);
//  2. the NVIDIA wheels' lib directories of $VIRTUAL_ENV, $CONDA_PREFIX and the system's Python;
//  3. $CUDA_HOME/lib64, then /usr/local/cuda/lib64;
//  4. the dynamic loader's own search, by bare name.
//
// The first name found in a directory is loaded; one that fails to load is reported.
// Each library may come from a different place.
//
// loaderd runs as root, so a file or path someone else could change is passed over.
// Only root and the process's own user are trusted. Found.Refused says why each was passed.
// walk.go resolves every symlink itself; the file loaded is the inode judged.
// The dynamic loader's own search comes last, as for any program root runs.

// EnvLibDir names the explicit directory searched first.
const EnvLibDir = "NVFEED_CUDA_LIB_DIR"

// Lib is a library discovery looks for.
type Lib struct {
	Name  string   // for messages: "libcudart"
	Files []string // file names, preferred first
}

// Cudart is the CUDA runtime: CUDA 13, else 12 (cudaGetDriverEntryPointByVersion,
// which device memory needs, came with 12.5), else the unversioned link.
func Cudart() Lib {
	return Lib{Name: "libcudart", Files: []string{"libcudart.so.13", "libcudart.so.12", "libcudart.so"}}
}

// Cufile is cuFile (GPUDirect Storage).
func Cufile() Lib { return Lib{Name: "libcufile", Files: []string{"libcufile.so.0", "libcufile.so"}} }

// Place is a directory searched and how it was chosen.
type Place struct {
	Dir  string
	From string // "NVFEED_CUDA_LIB_DIR", "VIRTUAL_ENV (NVIDIA wheel)", "CUDA_HOME", ...
}

// Found is where a library was found: the path loaded and how.
type Found struct {
	Path     string `json:"path"`
	From     string `json:"from"`
	Resolved string `json:"resolved,omitempty"` // the file mapped, for a bare-name load
	// Refused lists the files passed over before this one as changeable by others, with why.
	Refused []string `json:"refused,omitempty"`

	checked checkedFile // what the walk judged: the file loaded
}

// File is the file that was loaded: Resolved, else Path.
func (f Found) File() string {
	if f.Resolved != "" {
		return f.Resolved
	}
	return f.Path
}

// String says "PATH (FROM)".
func (f Found) String() string { return fmt.Sprintf("%s (%s)", f.File(), f.From) }

// FromLoader is Found.From for a library the dynamic loader found by bare
// name.
const FromLoader = "the dynamic loader's search (ldconfig cache, LD_LIBRARY_PATH)"

// Search is where discovery looks. SearchFromEnv fills it from the
// process's environment; tests build their own.
type Search struct {
	// Getenv reads the environment (os.Getenv).
	Getenv func(string) string
	// SystemPrefixes hold the system's Python installations (/usr/local,
	// /usr), searched after the environments named by the variables.
	SystemPrefixes []string
	// CUDADirs are the toolkit's default library directories
	// (/usr/local/cuda/lib64), searched after $CUDA_HOME/lib64.
	CUDADirs []string
	// NoLoaderSearch leaves out the bare-name search (tests of the
	// directories alone).
	NoLoaderSearch bool
}

// SearchFromEnv is the search of a process: its environment, the system's
// Python prefixes and /usr/local/cuda.
func SearchFromEnv() Search {
	return Search{Getenv: os.Getenv, SystemPrefixes: []string{"/usr/local", "/usr"}, CUDADirs: []string{"/usr/local/cuda/lib64"}}
}

// wheelDirs are the lib directories of NVIDIA's wheels under a
// site-packages directory, newest layout first.
func wheelDirs() []string {
	return []string{"nvidia/cu13/lib", "nvidia/cu12/lib", "nvidia/cuda_runtime/lib", "nvidia/cufile/lib"}
}

// Places lists the directories searched, in order, without duplicates.
func (s Search) Places() []Place {
	getenv := s.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	var out []Place
	seen := map[string]bool{}
	add := func(dir, from string) {
		if dir == "" {
			return
		}
		dir = filepath.Clean(dir)
		if !seen[dir] {
			seen[dir] = true
			out = append(out, Place{Dir: dir, From: from})
		}
	}
	add(getenv(EnvLibDir), EnvLibDir)
	prefixes := []Place{{getenv("VIRTUAL_ENV"), "VIRTUAL_ENV"}, {getenv("CONDA_PREFIX"), "CONDA_PREFIX"}}
	for _, p := range s.SystemPrefixes {
		prefixes = append(prefixes, Place{p, "Python under " + p})
	}
	for _, p := range prefixes {
		if p.Dir == "" {
			continue
		}
		for _, site := range sitePackages(p.Dir) {
			for _, w := range wheelDirs() {
				add(filepath.Join(site, w), p.From+" (NVIDIA wheel)")
			}
		}
	}
	if h := getenv("CUDA_HOME"); h != "" {
		add(filepath.Join(h, "lib64"), "CUDA_HOME")
	}
	for _, d := range s.CUDADirs {
		add(d, "CUDA toolkit "+d)
	}
	return out
}

// sitePackages lists a Python prefix's site- and dist-packages directories, newest first.
func sitePackages(prefix string) []string {
	var out []string
	for _, pat := range []string{"lib/python3*/site-packages", "lib/python3*/dist-packages", "lib64/python3*/site-packages"} {
		m, _ := filepath.Glob(filepath.Join(prefix, pat))
		out = append(out, m...)
	}
	slices.SortStableFunc(out, func(a, b string) int { return pyMinor(b) - pyMinor(a) })
	return out
}

// pyMinor is the minor version of the python3.X element of a path; -1 for
// "python3".
func pyMinor(path string) int {
	for _, e := range strings.Split(path, string(filepath.Separator)) {
		if v, ok := strings.CutPrefix(e, "python3."); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}

// Candidates lists lib's files that exist in the places and only trusted owners can change.
// They come in the order they would be tried.
func (s Search) Candidates(lib Lib) []Found {
	out, _ := s.candidates(lib)
	return out
}

// candidates is Candidates, also returning every file or place passed over, with why.
func (s Search) candidates(lib Lib) (out []Found, refused []string) {
	euid := uint32(os.Geteuid())
	for _, p := range s.Places() {
		for _, f := range lib.Files {
			path := filepath.Join(p.Dir, f)
			c, err := walk(path, euid)
			if errors.Is(err, errAbsent) {
				continue
			}
			if err != nil {
				refused = append(refused, fmt.Sprintf("%s (%s): %v", path, p.From, err))
			} else {
				out = append(out, Found{Path: path, From: p.From, Refused: slices.Clone(refused), checked: c})
			}
			break // one file per directory: the preferred name
		}
	}
	return out, refused
}

// open loads lib: each candidate as the file its walk checked, then the dynamic loader's search.
// The error lists every attempt and every place.
func (s Search) open(lib Lib) (uintptr, Found, error) {
	candidates, refused := s.candidates(lib)
	errs := slices.Clone(refused)
	euid := uint32(os.Geteuid())
	for _, c := range candidates {
		h, err := openChecked(c.checked, euid, 0)
		if err == nil {
			return h, c, nil
		}
		errs = append(errs, fmt.Sprintf("%s (%s): %v", c.Path, c.From, err))
	}
	if !s.NoLoaderSearch {
		for _, n := range lib.Files {
			h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_LOCAL)
			if err == nil {
				return h, Found{Path: n, From: FromLoader, Resolved: mappedFile(n)}, nil
			}
			errs = append(errs, err.Error())
		}
	}
	var where []string
	for _, p := range s.Places() {
		where = append(where, p.Dir)
	}
	msg := fmt.Sprintf("%s (%s) not found", lib.Name, strings.Join(lib.Files, ", "))
	if len(where) > 0 {
		msg += " in " + strings.Join(where, ", ")
	} else {
		msg += " in any directory (" + EnvLibDir + ", VIRTUAL_ENV, CONDA_PREFIX and CUDA_HOME are unset)"
	}
	if !s.NoLoaderSearch {
		msg += " nor by the dynamic loader"
	}
	if len(errs) > 0 {
		msg += ": " + strings.Join(errs, "; ")
	}
	return 0, Found{}, fmt.Errorf("%w: %s", errNotFound, msg)
}

var errNotFound = errors.New("library not found")

// mappedFile returns the mapped file named name or a longer version of it; "" when none.
func mappedFile(name string) string {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return ""
	}
	defer f.Close()
	stem := name
	if i := strings.Index(name, ".so"); i >= 0 {
		stem = name[:i+len(".so")]
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		p := fields[len(fields)-1]
		if b := filepath.Base(p); b == name || strings.HasPrefix(b, stem+".") || b == stem {
			return p
		}
	}
	return ""
}
