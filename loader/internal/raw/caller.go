// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// check decides whether raw sample i's bytes may be trusted now (see
// checkAll).
func (b *Backend) check(i int) error { return b.checkAll([]int{i})[0] }

// checkAll decides whether each raw sample's bytes may be trusted now.
// Without a caller (Env.Cred) it stats the files (backend.Guard.Check). For
// a caller it opens them as the caller (one hand-off per opener thread
// for them all), so the kernel checks the caller's access to each file
// and every directory on its path now, and checks each open file against
// the map: identity, times, and that the mapped extents are still its
// own. Each error names its sample and why.
func (b *Backend) checkAll(samples []int) []error {
	errs := make([]error, len(samples))
	if len(samples) == 0 {
		return errs
	}
	if b.caller == nil {
		for k, i := range samples {
			errs[k] = b.guard.Check(i)
		}
		return errs
	}
	paths := make([]string, len(samples))
	for k, i := range samples {
		paths[k] = filepath.Join(b.m.Root, b.m.Samples[i].Path)
	}
	fds, oerrs := b.caller.OpenAll(paths, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	for k, i := range samples {
		if oerrs[k] != nil {
			errs[k] = fmt.Errorf("raw: sample %d (%s): open as %v: %w", i, b.m.Samples[i].Path, b.caller.Cred(), oerrs[k])
			continue
		}
		errs[k] = b.guard.CheckFd(i, fds[k])
		unix.Close(fds[k])
	}
	return errs
}
