// SPDX-License-Identifier: Apache-2.0

//go:build nvfeed_faults

package main

import (
	"flag"
	"syscall"

	"github.com/nvfeed/nvfeed/internal/faults"
)

// A test build of loaderd (go build -tags nvfeed_faults -o
// bin/loaderd-faults ./cmd/loaderd: the Makefile's test target and the
// Python suite's fixture) has --inject-eio, to test error handling end to
// end; a release build has no way to inject a fault.
func init() {
	serveTestFlags = func(fs *flag.FlagSet) {
		var f *faults.Faults
		fs.Func("inject-eio", "for testing error handling end to end (a test build only): every read of the sample at this path (relative to the dataset root) fails with EIO (repeatable)", func(p string) error {
			if f == nil {
				f = &faults.Faults{}
				faults.Install(f)
			}
			f.Add(faults.Rule{Op: faults.FileRead | faults.DeviceRead, Path: p, Err: syscall.EIO})
			return nil
		})
	}
}
