// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain sends libcufile's log (cufile.log in the working directory by
// default, which is this source directory under go test) to a temporary
// directory, unless the caller chose a place.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nvfeed-cufile-log-")
	if err == nil && os.Getenv("CUFILE_LOGFILE_PATH") == "" {
		os.Setenv("CUFILE_LOGFILE_PATH", filepath.Join(dir, "cufile.log"))
	}
	code := m.Run()
	if err == nil {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}
