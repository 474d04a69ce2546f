// SPDX-License-Identifier: Apache-2.0

// Package testenv decides what a test does when the machine lacks what it
// needs: root, loop devices, io_uring, inotify. On a developer's machine
// the test skips with the reason. NVFEED_REQUIRE_PRIVILEGED=1 says the
// machine has them all, and .ci/run sets it. There the same skip is a
// failure. So a CI that silently lost its loop devices goes red instead of
// green.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// RequireVar is the environment variable that turns SkipPrivileged into a
// failure.
const RequireVar = "NVFEED_REQUIRE_PRIVILEGED"

// SkipPrivileged skips tb with the reason, or fails it when RequireVar is 1.
func SkipPrivileged(tb testing.TB, format string, args ...any) {
	tb.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv(RequireVar) == "1" {
		tb.Fatalf("%s (%s=1: this machine must run the test, not skip it)", why, RequireVar)
	}
	tb.Skip(why)
}
