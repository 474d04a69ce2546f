// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// touch makes empty files (fake libraries) under root.
func touch(t *testing.T, root string, files ...string) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiscoveryOrder: in temporary trees holding fake library files, each
// library is found in the first place of the documented order that has
// it, under its preferred name, and says how it was found.
func TestDiscoveryOrder(t *testing.T) {
	const (
		cu13    = "venv/lib/python3.11/site-packages/nvidia/cu13/lib/"
		cu12rt  = "conda/lib/python3.10/site-packages/nvidia/cuda_runtime/lib/"
		cu12cf  = "conda/lib/python3.10/site-packages/nvidia/cufile/lib/"
		sys312  = "usr/lib/python3.12/dist-packages/nvidia/cu13/lib/"
		sys39   = "usr/lib/python3.9/site-packages/nvidia/cu13/lib/"
		home    = "cuda-home/lib64/"
		toolkit = "usr-local-cuda/lib64/"
	)
	for _, tc := range []struct {
		name       string
		files      []string
		env        map[string]string // values relative to the tree
		cudart     string            // expected file, relative; "" none
		cudartFrom string
		cufile     string
		cufileFrom string
	}{
		{name: "explicit first", files: []string{"mine/libcudart.so.13", "mine/libcufile.so.0", cu13 + "libcudart.so.13", cu13 + "libcufile.so.0"},
			env:    map[string]string{EnvLibDir: "mine", "VIRTUAL_ENV": "venv"},
			cudart: "mine/libcudart.so.13", cudartFrom: EnvLibDir, cufile: "mine/libcufile.so.0", cufileFrom: EnvLibDir},
		{name: "explicit lacks cufile: the wheel's", files: []string{"mine/libcudart.so.13", cu13 + "libcufile.so.0"},
			env:    map[string]string{EnvLibDir: "mine", "VIRTUAL_ENV": "venv"},
			cudart: "mine/libcudart.so.13", cudartFrom: EnvLibDir, cufile: cu13 + "libcufile.so.0", cufileFrom: "VIRTUAL_ENV (NVIDIA wheel)"},
		{name: "virtualenv before conda", files: []string{cu13 + "libcudart.so.13", cu12rt + "libcudart.so.12", cu12cf + "libcufile.so.0"},
			env:    map[string]string{"VIRTUAL_ENV": "venv", "CONDA_PREFIX": "conda"},
			cudart: cu13 + "libcudart.so.13", cudartFrom: "VIRTUAL_ENV (NVIDIA wheel)", cufile: cu12cf + "libcufile.so.0", cufileFrom: "CONDA_PREFIX (NVIDIA wheel)"},
		{name: "CUDA 12 wheels: two directories", files: []string{cu12rt + "libcudart.so.12", cu12cf + "libcufile.so.0"},
			env:    map[string]string{"CONDA_PREFIX": "conda"},
			cudart: cu12rt + "libcudart.so.12", cudartFrom: "CONDA_PREFIX (NVIDIA wheel)", cufile: cu12cf + "libcufile.so.0", cufileFrom: "CONDA_PREFIX (NVIDIA wheel)"},
		{name: "the preferred name of a directory", files: []string{"mine/libcudart.so", "mine/libcudart.so.12", "mine/libcudart.so.13", "mine/libcufile.so", "mine/libcufile.so.0"},
			env:    map[string]string{EnvLibDir: "mine"},
			cudart: "mine/libcudart.so.13", cudartFrom: EnvLibDir, cufile: "mine/libcufile.so.0", cufileFrom: EnvLibDir},
		{name: "system Python, newest first", files: []string{sys39 + "libcudart.so.13", sys312 + "libcudart.so.13"},
			cudart: sys312 + "libcudart.so.13", cudartFrom: "Python under usr (NVIDIA wheel)"},
		{name: "wheels before CUDA_HOME", files: []string{home + "libcudart.so.13", home + "libcufile.so.0", sys39 + "libcudart.so.13"},
			env:    map[string]string{"CUDA_HOME": "cuda-home"},
			cudart: sys39 + "libcudart.so.13", cudartFrom: "Python under usr (NVIDIA wheel)", cufile: home + "libcufile.so.0", cufileFrom: "CUDA_HOME"},
		{name: "CUDA_HOME before the toolkit's default", files: []string{home + "libcudart.so.13", toolkit + "libcudart.so.13", toolkit + "libcufile.so.0"},
			env:    map[string]string{"CUDA_HOME": "cuda-home"},
			cudart: home + "libcudart.so.13", cudartFrom: "CUDA_HOME", cufile: toolkit + "libcufile.so.0", cufileFrom: "CUDA toolkit usr-local-cuda/lib64"},
		{name: "named directories that do not exist", env: map[string]string{EnvLibDir: "none", "VIRTUAL_ENV": "none2", "CUDA_HOME": "none3"}},
		{name: "a directory named like a library is not one", files: []string{"mine/libcudart.so.13/x"}, env: map[string]string{EnvLibDir: "mine"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			touch(t, root, tc.files...)
			s := Search{
				Getenv:         func(k string) string { return abs(root, tc.env[k]) },
				SystemPrefixes: []string{filepath.Join(root, "usr")},
				CUDADirs:       []string{filepath.Join(root, toolkit)},
			}
			rel := func(f Found) (string, string) {
				if f.Path == "" {
					return "", ""
				}
				r, err := filepath.Rel(root, f.Path)
				if err != nil {
					t.Fatal(err)
				}
				return r, strings.ReplaceAll(f.From, root+"/", "")
			}
			for _, want := range []struct {
				lib        Lib
				path, from string
			}{{Cudart(), tc.cudart, tc.cudartFrom}, {Cufile(), tc.cufile, tc.cufileFrom}} {
				var first Found
				if c := s.Candidates(want.lib); len(c) > 0 {
					first = c[0]
				}
				if p, f := rel(first); p != want.path || f != want.from {
					t.Errorf("%s: found %q (%s), want %q (%s); places %v", want.lib.Name, p, f, want.path, want.from, s.Places())
				}
			}
		})
	}
}

// abs makes a tree-relative value absolute ("" stays "").
func abs(root, v string) string {
	if v == "" {
		return ""
	}
	return filepath.Join(root, v)
}

// TestDiscoveryLoadsPastBrokenFiles: a file that exists under a library's
// name but does not load is reported and skipped; the next place's real
// library (NVIDIA's wheel) is loaded and named with how it was found. When
// nothing loads, the error names every place and attempt.
func TestDiscoveryLoadsPastBrokenFiles(t *testing.T) {
	wheels, err := filepath.Abs(cudaWheels(t))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	touch(t, root, "broken/libcudart.so.13", "broken/libcufile.so.0")
	s := Search{Getenv: func(k string) string {
		return map[string]string{EnvLibDir: filepath.Join(root, "broken"), "CUDA_HOME": filepath.Join(root, "home")}[k]
	}, NoLoaderSearch: true}
	if err := os.MkdirAll(filepath.Join(root, "home"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(wheels, "lib"), filepath.Join(root, "home", "lib64")); err != nil {
		t.Fatal(err)
	}
	for _, lib := range []Lib{Cudart(), Cufile()} {
		h, found, err := s.open(lib)
		if err != nil || h == 0 {
			t.Fatalf("%s: %v", lib.Name, err)
		}
		if found.From != "CUDA_HOME" || filepath.Dir(found.Path) != filepath.Join(root, "home", "lib64") {
			t.Errorf("%s: loaded %s, want the one under CUDA_HOME", lib.Name, found)
		}
	}
	none := Search{Getenv: func(k string) string {
		return map[string]string{EnvLibDir: filepath.Join(root, "broken")}[k]
	}, NoLoaderSearch: true}
	_, _, err = none.open(Cudart())
	if err == nil || !strings.Contains(err.Error(), filepath.Join(root, "broken", "libcudart.so.13")) || !strings.Contains(err.Error(), EnvLibDir) {
		t.Errorf("nothing loads: %v, want an error naming the broken file and how it was found", err)
	}
}

// TestDiscoveryByTheLoader: with no directory to search, the dynamic
// loader's own search (here LD_LIBRARY_PATH, read when the process starts:
// a child process) finds the libraries by bare name, and the file it
// mapped is named.
func TestDiscoveryByTheLoader(t *testing.T) {
	const marker = "NVFEED_DISCOVERY_CHILD"
	wheels, err := filepath.Abs(cudaWheels(t))
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(wheels, "lib")
	if os.Getenv(marker) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDiscoveryByTheLoader$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), marker+"=1", "LD_LIBRARY_PATH="+lib)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "--- PASS: TestDiscoveryByTheLoader") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	real, err := filepath.EvalSymlinks(lib) // what the process maps
	if err != nil {
		t.Fatal(err)
	}
	s := Search{} // no variables, no system prefixes, no toolkit directory
	for _, l := range []Lib{Cudart(), Cufile()} {
		h, found, err := s.open(l)
		if err != nil || h == 0 {
			t.Fatalf("%s: %v", l.Name, err)
		}
		if found.From != FromLoader || found.Path != l.Files[0] || filepath.Dir(found.Resolved) != real || found.File() != found.Resolved {
			t.Errorf("%s: %+v, want %s by the dynamic loader, resolved in %s", l.Name, found, l.Files[0], real)
		}
	}
}

// TestDiscoveryRefusesWhatOthersCanChange: the daemon runs as root, so a
// library it loads must be one that only root (or the daemon's own user)
// can change: a library file, its directory or any directory above it
// that another user owns or may write (a VIRTUAL_ENV or CONDA_PREFIX
// inherited from an operator's environment, a world-writable directory)
// is passed over, named in the error with why, and the next place's is
// loaded. A sticky world-writable directory of root's (/tmp) above a
// root-owned directory is fine: no one else may replace what is in it.
func TestDiscoveryRefusesWhatOthersCanChange(t *testing.T) {
	const other = 65534 // nobody
	for _, tc := range []struct {
		name   string
		rel    string // the library, under the tree
		setup  func(t *testing.T, lib string)
		root   bool   // needs root (chown to another user)
		refuse string // what the refusal says; "" accepted
	}{
		{name: "root's own", rel: "good/libcudart.so.13", setup: func(*testing.T, string) {}},
		{name: "world-writable file", rel: "ww/libcudart.so.13", setup: func(t *testing.T, lib string) { chmod(t, lib, 0o666) }, refuse: "writable by others"},
		{name: "group-writable file of another group", rel: "gw/libcudart.so.13", root: true, setup: func(t *testing.T, lib string) {
			chown(t, lib, 0, other)
			chmod(t, lib, 0o664)
		}, refuse: "writable by group 65534"},
		{name: "world-writable directory", rel: "wwdir/libcudart.so.13", setup: func(t *testing.T, lib string) { chmod(t, filepath.Dir(lib), 0o777) }, refuse: "writable by others"},
		{name: "world-writable directory above", rel: "up/a/b/libcudart.so.13", setup: func(t *testing.T, lib string) {
			chmod(t, filepath.Dir(filepath.Dir(filepath.Dir(lib))), 0o777)
		}, refuse: "writable by others"},
		{name: "file of another user", rel: "theirs/libcudart.so.13", root: true, setup: func(t *testing.T, lib string) { chown(t, lib, other, other) }, refuse: "owned by uid 65534"},
		{name: "directory of another user (a venv of theirs)", rel: "venv/lib/libcudart.so.13", root: true, setup: func(t *testing.T, lib string) {
			chown(t, filepath.Dir(filepath.Dir(lib)), other, other)
		}, refuse: "owned by uid 65534"},
		{name: "symlink to a world-writable directory's", rel: "link/libcudart.so.13", setup: func(t *testing.T, lib string) {
			real := filepath.Join(filepath.Dir(filepath.Dir(lib)), "open", "libcudart.so.13")
			touch(t, "/", real)
			chmod(t, filepath.Dir(real), 0o777)
			os.Remove(lib)
			if err := os.Symlink(real, lib); err != nil {
				t.Fatal(err)
			}
		}, refuse: "writable by others"},
		{name: "sticky world-writable directory above", rel: "sticky/mine/libcudart.so.13", setup: func(t *testing.T, lib string) {
			chmod(t, filepath.Dir(filepath.Dir(lib)), os.ModeSticky|0o777)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("giving a file to another user needs root")
			}
			root := t.TempDir()
			touch(t, root, tc.rel, "home/lib64/libcudart.so.13")
			lib := filepath.Join(root, tc.rel)
			tc.setup(t, lib)
			s := Search{Getenv: func(k string) string {
				return map[string]string{EnvLibDir: filepath.Dir(lib), "CUDA_HOME": filepath.Join(root, "home")}[k]
			}, NoLoaderSearch: true}
			s.CUDADirs = nil
			c := s.Candidates(Cudart())
			if len(c) == 0 {
				t.Fatalf("no candidate at all")
			}
			if tc.refuse == "" {
				if c[0].Path != lib {
					t.Errorf("first candidate %s, want %s", c[0], lib)
				}
				return
			}
			if c[0].Path == lib {
				t.Fatalf("%s is a candidate: a library others can change would be loaded by root", lib)
			}
			if len(c[0].Refused) != 1 || !strings.Contains(c[0].Refused[0], tc.refuse) || !strings.Contains(c[0].Refused[0], lib) {
				t.Errorf("the candidate after it (%s) says it passed over %q, want %s named with %q", c[0], c[0].Refused, lib, tc.refuse)
			}
			_, _, err := Search{Getenv: func(k string) string { return map[string]string{EnvLibDir: filepath.Dir(lib)}[k] }, NoLoaderSearch: true}.open(Cudart())
			if err == nil || !strings.Contains(err.Error(), tc.refuse) {
				t.Errorf("with nothing else to load: %v, want an error saying %q", err, tc.refuse)
			}
		})
	}
}

func chmod(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, p string, uid, gid int) {
	t.Helper()
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
}
