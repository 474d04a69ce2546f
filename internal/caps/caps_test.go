// SPDX-License-Identifier: Apache-2.0

package caps

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Cap
	}{
		{"CAP_SETUID", unix.CAP_SETUID},
		{"cap_setgid", unix.CAP_SETGID},
		{"DAC_READ_SEARCH", unix.CAP_DAC_READ_SEARCH},
		{"sys_admin", unix.CAP_SYS_ADMIN},
		{"CAP_CHECKPOINT_RESTORE", unix.CAP_CHECKPOINT_RESTORE},
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if back, err := Parse(got.String()); err != nil || back != got {
			t.Errorf("Parse(%q.String()) = %v, %v", tc.in, back, err)
		}
	}
	if _, err := Parse("CAP_FLY"); err == nil {
		t.Error("Parse(CAP_FLY): no error")
	}
	if s := Cap(63).String(); s != "CAP_63" {
		t.Errorf("Cap(63) = %q", s)
	}
	s := Set(0).With(unix.CAP_SETUID).With(unix.CAP_CHOWN)
	if s.String() != "CAP_CHOWN CAP_SETUID" || !s.Has(unix.CAP_SETUID) || s.Without(unix.CAP_SETUID).Has(unix.CAP_SETUID) {
		t.Errorf("set %v", s)
	}
}

// TestCurrentMatchesProc: capget's sets are /proc/self/status's.
func TestCurrentMatchesProc(t *testing.T) {
	got, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	want := map[string]Set{"CapEff": got.Effective, "CapPrm": got.Permitted, "CapInh": got.Inheritable}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if w, in := want[k]; ok && in {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil || Set(n) != w {
				t.Errorf("%s %s, capget %x", k, strings.TrimSpace(v), uint64(w))
			}
		}
	}
}
