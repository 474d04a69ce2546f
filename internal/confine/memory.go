// SPDX-License-Identifier: Apache-2.0

// Package confine reads what confines this process from its own /proc.
// It gives the memory cgroup's limit and the mounts a service sandbox puts over paths.
// Every reader takes the filesystem's root: "/" on a machine, testdata in tests.
package confine

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// unlimited: a cgroup v1 limit at or above this is no limit (the kernel
// writes PAGE_COUNTER_MAX pages, 9223372036854771712 bytes on x86-64).
const unlimited = 1 << 60

// Limit is a memory cgroup's limit on this process.
type Limit struct {
	Bytes   int64  // the limit; 0: none found
	File    string // the file that sets it, as this machine names it
	Version int    // the cgroup version: 1 or 2
}

// String names the limit and where it came from, for logs and errors.
func (l Limit) String() string {
	if l.Bytes == 0 {
		return "no memory cgroup limit"
	}
	return fmt.Sprintf("the memory cgroup's limit of %d MiB (%s, cgroup v%d)", l.Bytes>>20, l.File, l.Version)
}

// MemoryLimit returns the tightest memory limit of this process's cgroup and its ancestors.
// It reads cgroup v1 where mounted, else v2; unreadable files are passed over; 0 means none.
func MemoryLimit(root string) (Limit, error) {
	cgs, err := readCgroups(root)
	if err != nil {
		return Limit{}, err
	}
	mounts, err := ReadMounts(root)
	if err != nil {
		return Limit{}, err
	}
	if p, ok := cgs.v1["memory"]; ok {
		if m, ok := cgroupMount(mounts, "cgroup", "memory"); ok {
			return walkLimits(root, m, p, 1), nil
		}
	}
	if p, ok := cgs.v2, cgs.hasV2; ok {
		if m, ok := cgroupMount(mounts, "cgroup2", ""); ok {
			return walkLimits(root, m, p, 2), nil
		}
	}
	return Limit{}, nil
}

// cgroups is /proc/self/cgroup: each v1 controller's path, and the v2 path.
type cgroups struct {
	v1    map[string]string
	v2    string
	hasV2 bool
}

// readCgroups parses root's /proc/self/cgroup ("ID:CONTROLLERS:PATH"
// lines; v2's is "0::PATH").
func readCgroups(root string) (cgroups, error) {
	b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return cgroups{}, fmt.Errorf("confine: %w", err)
	}
	cg := cgroups{v1: map[string]string{}}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			cg.v2, cg.hasV2 = f[2], true
			continue
		}
		for c := range strings.SplitSeq(f[1], ",") {
			cg.v1[c] = f[2]
		}
	}
	return cg, nil
}

// cgroupMount returns the mount of a cgroup filesystem of type fstype
// (with controller among its super options, when not "").
func cgroupMount(mounts []Mount, fstype, controller string) (Mount, bool) {
	for _, m := range mounts {
		if m.FSType != fstype {
			continue
		}
		if controller == "" || hasOption(m.SuperOptions, controller) {
			return m, true
		}
	}
	return Mount{}, false
}

func hasOption(opts, want string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// walkLimits reads the limit of cgroup p (a path in the hierarchy
// mounted by m) and of each ancestor up to the mount, and returns the
// tightest.
func walkLimits(root string, m Mount, p string, version int) Limit {
	dir := m.Point
	if rel, ok := strings.CutPrefix(p, m.Root); ok && (m.Root == "/" || rel == "" || rel[0] == '/') {
		dir = path.Join(m.Point, rel)
	}
	var best Limit
	take := func(file string, n int64) {
		if n > 0 && (best.Bytes == 0 || n < best.Bytes) {
			best = Limit{Bytes: n, File: file, Version: version}
		}
	}
	name := "memory.max"
	if version == 1 {
		name = "memory.limit_in_bytes"
	}
	for d := dir; ; d = path.Dir(d) {
		file := path.Join(d, name)
		take(file, readLimit(filepath.Join(root, file)))
		if d == m.Point || d == "/" || !strings.HasPrefix(d, m.Point) {
			break
		}
	}
	if version == 1 { // ancestors above the mount (a container's own view)
		file := path.Join(dir, "memory.stat")
		take(file+" hierarchical_memory_limit", hierarchical(filepath.Join(root, file)))
	}
	return best
}

// readLimit reads a limit file: bytes, "max" (v2) or an unreadable
// file or no limit (v1's huge value) as 0.
func readLimit(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	return parseLimit(strings.TrimSpace(string(b)))
}

func parseLimit(s string) int64 {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n >= unlimited {
		return 0
	}
	return int64(n)
}

// hierarchical reads cgroup v1's memory.stat hierarchical_memory_limit.
func hierarchical(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "hierarchical_memory_limit "); ok {
			return parseLimit(strings.TrimSpace(v))
		}
	}
	return 0
}

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	Root         string // the mount's root within its filesystem
	Point        string // where it is mounted
	FSType       string
	Source       string
	SuperOptions string
}

// ReadMounts parses root's /proc/self/mountinfo, in its order (a later
// mount over the same point hides an earlier one).
func ReadMounts(root string) ([]Mount, error) {
	b, err := os.ReadFile(filepath.Join(root, "proc/self/mountinfo"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("confine: %w", err)
	}
	var out []Mount
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if m, ok := parseMount(line); ok {
			out = append(out, m)
		}
	}
	return out, nil
}

// parseMount parses "ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] -
// FSTYPE SOURCE SUPEROPTS".
func parseMount(line string) (Mount, bool) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 5 || sep < 0 || sep+3 > len(f) {
		return Mount{}, false
	}
	m := Mount{Root: unescape(f[3]), Point: unescape(f[4]), FSType: f[sep+1], Source: unescape(f[sep+2])}
	if sep+3 < len(f) {
		m.SuperOptions = f[sep+3]
	}
	return m, true
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
