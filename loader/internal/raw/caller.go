// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// check decides whether raw sample i's bytes may be trusted now. Without
// a caller (Env.Cred) it stats the file (fresh.Guard.Check). For a caller
// it opens the file as the caller, so the kernel checks the caller's
// access to it and to every directory on its path now, and checks the
// open file against the map: identity, times, and that the mapped extents
// are still its own. The error names the sample and why.
func (b *Backend) check(i int) error {
	if b.caller == nil {
		return b.guard.Check(i)
	}
	s := &b.m.Samples[i]
	fd, err := b.caller.Openat(unix.AT_FDCWD, filepath.Join(b.m.Root, s.Path), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return fmt.Errorf("raw: sample %d (%s): open as %v: %w", i, s.Path, b.caller.Cred(), err)
	}
	defer unix.Close(fd)
	return b.guard.CheckFd(i, fd)
}
