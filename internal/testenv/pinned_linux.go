// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// PinnedBytes returns the calling process's pinned memory, in bytes:
// /proc/self/status's VmPin, what io_uring's registered buffers (and
// other long-term pins) hold.
func PinnedBytes(tb testing.TB) int64 {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmPin:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				tb.Fatalf("/proc/self/status: VmPin line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	tb.Fatal("/proc/self/status: no VmPin line")
	return 0
}
