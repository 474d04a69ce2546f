// SPDX-License-Identifier: Apache-2.0

package confine

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestMemoryLimit reads the memory limit of each layout in
// testdata/memory: cgroup v1 (the daemon's own cgroup, a tighter
// ancestor, a container whose mount starts at its own cgroup with the
// pod's limit only in memory.stat, nothing readable) and v2 (a limited
// slice above the service, the service's own MemoryMax, a cgroup
// namespace, no limit anywhere).
func TestMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		layout  string
		bytes   int64
		file    string
		version int
	}{
		{"v1-own", 512 << 20, "/sys/fs/cgroup/memory/budget/loaderd/memory.limit_in_bytes", 1},
		{"v1-ancestor", 1 << 30, "/sys/fs/cgroup/memory/budget/memory.limit_in_bytes", 1},
		{"v1-container", 16 << 30, "/sys/fs/cgroup/memory/memory.stat hierarchical_memory_limit", 1},
		{"v1-unreadable", 0, "", 0},
		{"v2-slice", 2 << 30, "/sys/fs/cgroup/system.slice/memory.max", 2},
		{"v2-service", 24 << 30, "/sys/fs/cgroup/system.slice/loaderd.service/memory.max", 2},
		{"v2-namespace", 512 << 20, "/sys/fs/cgroup/memory.max", 2},
		{"v2-none", 0, "", 0},
	} {
		t.Run(tc.layout, func(t *testing.T) {
			got, err := MemoryLimit(filepath.Join("testdata", "memory", tc.layout))
			if err != nil {
				t.Fatal(err)
			}
			want := Limit{Bytes: tc.bytes, File: tc.file, Version: tc.version}
			if got != want {
				t.Fatalf("MemoryLimit = %+v, want %+v", got, want)
			}
			if tc.bytes != 0 && !strings.Contains(got.String(), tc.file) {
				t.Errorf("%q does not name %s", got, tc.file)
			}
		})
	}
}

// TestMemoryLimitNoProc: a root without /proc/self/cgroup is an error
// naming the file.
func TestMemoryLimitNoProc(t *testing.T) {
	_, err := MemoryLimit(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "proc/self/cgroup") {
		t.Fatalf("err = %v, want one naming proc/self/cgroup", err)
	}
}

// TestHidden judges paths against a systemd service's mounts
// (PrivateTmp, ProtectHome=yes, InaccessiblePaths) and the host's own,
// where nothing is hidden (a tmpfs /tmp, a user's /run/user/UID).
func TestHidden(t *testing.T) {
	unit, err := ReadMounts(filepath.Join("testdata", "sandbox", "unit"))
	if err != nil {
		t.Fatal(err)
	}
	host, err := ReadMounts(filepath.Join("testdata", "sandbox", "host"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mounts  []Mount
		path    string
		setting string // "": not hidden
	}{
		{unit, "/tmp/imagenet/train", "PrivateTmp=yes"},
		{unit, "/tmp", "PrivateTmp=yes"},
		{unit, "/var/tmp/ds/", "PrivateTmp=yes"},
		{unit, "/home/alice/ds", "ProtectHome=yes"},
		{unit, "/root/ds", "ProtectHome=yes"},
		{unit, "/run/user/1000/ds", "ProtectHome=tmpfs"},
		{unit, "/srv/secret/ds", "InaccessiblePaths="},
		{unit, "/srv/secretive/ds", ""},
		{unit, "/data/imagenet/train", ""},
		{unit, "/tmpdata/x", ""},
		{unit, "/mnt/with space/ds", ""},
		{host, "/tmp/imagenet/train", ""},
		{host, "/home/alice/ds", ""},
		{host, "/run/user/1000/ds", ""},
		{nil, "/tmp/x", ""},
	} {
		h, ok := Hidden(tc.mounts, tc.path)
		if ok != (tc.setting != "") || h.Setting != tc.setting {
			t.Errorf("Hidden(%s) = %+v, %v; want %q", tc.path, h, ok, tc.setting)
			continue
		}
		if ok && !strings.Contains(h.String(), tc.setting) {
			t.Errorf("%q does not name %s", h, tc.setting)
		}
	}
	if m, _ := covering(unit, "/mnt/with space/ds"); m.Point != "/mnt/with space" {
		t.Errorf("an escaped mount point: %+v", m)
	}
}
