// SPDX-License-Identifier: Apache-2.0

package session

import (
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/internal/confine"
)

// TestMemoryEnvBudgets: the default budgets from the machine's memory,
// a memory cgroup's limit (less the daemon's reserve) and RLIMIT_MEMLOCK,
// each naming where it came from.
func TestMemoryEnvBudgets(t *testing.T) {
	cg := func(n int64) confine.Limit {
		return confine.Limit{Bytes: n, File: "/sys/fs/cgroup/memory/x/memory.limit_in_bytes", Version: 1}
	}
	for _, tc := range []struct {
		name            string
		env             MemoryEnv
		sampler, locked int64
		source          string // in the locked budget's source
	}{
		{"no cgroup", MemoryEnv{Total: 24 << 30}, 3 << 30, 12 << 30, "50% of MemTotal"},
		{"512 MiB cgroup", MemoryEnv{Total: 24 << 30, Cgroup: cg(512 << 20)}, 32 << 20, 224 << 20, "the memory cgroup's limit of 512 MiB (/sys/fs/cgroup/memory/x/memory.limit_in_bytes, cgroup v1) less 256 MiB kept for the daemon itself and 32 MiB of sample-order budget"},
		{"32 GiB cgroup on a big node", MemoryEnv{Total: 1 << 40, Cgroup: cg(32 << 30)}, 3584 << 20, 25088 << 20, "less 4096 MiB kept for the daemon itself"},
		{"cgroup above half the machine", MemoryEnv{Total: 24 << 30, Cgroup: cg(64 << 30)}, 3 << 30, 12 << 30, "50% of MemTotal"},
		{"cgroup under the reserve", MemoryEnv{Total: 24 << 30, Cgroup: cg(200 << 20)}, 0, 0, "limit of 200 MiB"},
		{"RLIMIT_MEMLOCK binds", MemoryEnv{Total: 24 << 30, Cgroup: cg(512 << 20), Memlock: 64 << 20}, 32 << 20, 64 << 20, "RLIMIT_MEMLOCK"},
		{"nothing known", MemoryEnv{}, DefaultSamplerBytesUnknown, 1 << 62, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.env.Sampler()
			l := tc.env.Locked(s.Bytes)
			if s.Bytes != tc.sampler || l.Bytes != tc.locked {
				t.Fatalf("sampler %d MiB, locked %d MiB; want %d, %d", s.Bytes>>20, l.Bytes>>20, tc.sampler>>20, tc.locked>>20)
			}
			if !strings.Contains(l.Source, tc.source) {
				t.Errorf("locked source %q, want %q in it", l.Source, tc.source)
			}
			if pool, ok := tc.env.pool(); ok && s.Bytes+l.Bytes > pool {
				t.Errorf("budgets pass what the limit leaves: %d + %d > %d", s.Bytes, l.Bytes, pool)
			}
		})
	}
}

// TestMemoryEnvOvercommit: budgets given past what the cgroup leaves are
// warned of, naming the limit; within it, or without one, not.
func TestMemoryEnvOvercommit(t *testing.T) {
	env := MemoryEnv{Total: 24 << 30, Cgroup: confine.Limit{Bytes: 32 << 30, File: "/sys/fs/cgroup/memory.max", Version: 2}}
	if w := env.Overcommit(24<<30, 2<<30); w != "" {
		t.Errorf("24 GiB + 2 GiB in a 32 GiB cgroup warned: %s", w)
	}
	if w := env.Overcommit(30<<30, 2<<30); !strings.Contains(w, "limit of 32768 MiB (/sys/fs/cgroup/memory.max, cgroup v2)") || !strings.Contains(w, "OOM") {
		t.Errorf("30 GiB + 2 GiB in a 32 GiB cgroup: %q", w)
	}
	if w := (MemoryEnv{Total: 24 << 30}).Overcommit(1<<40, 1<<40); w != "" {
		t.Errorf("no cgroup warned: %s", w)
	}
}
