// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// deviceQueue is a block device's request queue, split among the engines
// of the sessions reading it. Each may keep tags/engines requests in
// flight (at least one, at most its own depth). Past the device's tags a
// read cannot be queued without blocking: io_uring hands it to a worker
// thread that waits for a tag, which cost 8 ranks on a 128-tag loop device
// a third of the daemon's CPU (docs/decisions.md#one-device-queue-split-among-the-sessions).
type deviceQueue struct {
	tags    int          // the device's requests in flight at most; 0: unknown, no limit
	engines atomic.Int32 // the engines reading it now
}

// Close is io.Closer's, for backend.Shared: nothing to free.
func (q *deviceQueue) Close() error { return nil }

// limit returns how many requests an engine of depth qd may keep in flight now.
func (q *deviceQueue) limit(qd int) int {
	if q == nil || q.tags <= 0 {
		return qd
	}
	return min(qd, max(1, q.tags/max(1, int(q.engines.Load()))))
}

// deviceTags returns how many requests block device rdev holds in flight:
// its hardware queues' tags summed (a partition's are its disk's). It
// returns 0 where sysfs (at sys) does not say, as for a device without
// blk-mq queues.
func deviceTags(sys string, rdev uint64) int {
	dir, err := filepath.EvalSymlinks(filepath.Join(sys, "dev", "block", fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))))
	if err != nil {
		return 0
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Dir(dir)
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "mq", "*", "nr_tags"))
	total := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || n <= 0 {
			return 0
		}
		total += n
	}
	return total
}
