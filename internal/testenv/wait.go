// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"testing"
	"time"
)

// WaitLimit bounds how long Eventually waits. It is far above what any
// condition takes on an idle machine: a loaded one (both cores busy, the
// race detector) stretches background work many times.
const WaitLimit = 2 * time.Minute

// Eventually waits until cond holds, polling it every few milliseconds.
// It fails the test, naming what, if cond does not hold within
// WaitLimit. Tests wait on the progress of background work this way,
// never on a fixed sleep.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > WaitLimit {
			tb.Fatalf("%s: not after %v", what, WaitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
