// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader"
)

// TestSelectionsCannotBeStarved: four uids open sessions with four junk
// ext lists each over a webdataset of 200 000 samples
// (NVFEED_WDS_STARVE_SAMPLES to change it); then a victim, another uid,
// opens its own selection again and again. Its opens cost what anyone's
// do: no pass over the samples, so no heap that grows with them (at
// most 256 KiB an open, where a pass keeps the 65 536 largest rooms, 512
// KiB). Its median open time and that of a selection made before the
// junk are logged. Before, the junk filled the dataset's table of 16
// kept selections and every later selection was a full pass per open:
// 550 KiB of heap an open at 200 000 samples, 4-6 ms became 18-28 ms.
func TestSelectionsCannotBeStarved(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "session: opens as other uids (euid %d)", os.Geteuid())
	}
	n := 200_000
	if s := os.Getenv("NVFEED_WDS_STARVE_SAMPLES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	dir := t.TempDir()
	reachable(dir)
	_, wm, err := LoadMap(scaleMap(t, dir, n))
	if err != nil {
		t.Fatal(err)
	}
	mgr := NewManager(Config{WebDatasets: map[string]*wds.Map{"w": wm}, MaxLockedBytes: 1 << 30, MaxSessions: 64, MaxSessionsPerUID: 64,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer mgr.Stop()
	// open opens and closes a session of c's; it returns the open's time
	// and the heap allocated meanwhile.
	open := func(c Caller, ext ...string) (time.Duration, uint64) {
		t.Helper()
		p := OpenParams{Dataset: "w", Ext: ext, Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 8, NumShards: 1}, Backend: "file"}}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		t0 := time.Now()
		o, err := mgr.Open(context.Background(), c, p)
		took := time.Since(t0)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("open as uid %d, ext %q: %v", c.UID, ext, err)
		}
		mgr.Close(c, o.ID)
		return took, after.TotalAlloc - before.TotalAlloc
	}
	early := Caller{UID: 43130, GID: 43130}
	open(early, "jpg", "cls")
	for u := range 4 {
		junk := Caller{UID: 43131 + u, GID: 43131 + u}
		for k := range 4 {
			open(junk, "jpg", fmt.Sprintf("cls;junk%d-%d", u, k)) // a selection of its own (one matching nothing is refused)
		}
	}
	victim := Caller{UID: 43140, GID: 43140}
	var victimT, earlyT []time.Duration
	for range 9 {
		took, heap := open(victim, "cls", "jpg")
		victimT = append(victimT, took)
		if heap > 256<<10 {
			t.Errorf("the victim's open allocated %d KiB of heap: a pass over the %d samples", heap>>10, n)
		}
		took, _ = open(early, "jpg", "cls")
		earlyT = append(earlyT, took)
	}
	slices.Sort(victimT)
	slices.Sort(earlyT)
	t.Logf("%d samples, after 16 junk selections of 4 uids: a new uid's selection opens in %v (median of 9; %v to %v), one made before the junk in %v",
		n, victimT[4].Round(10*time.Microsecond), victimT[0].Round(10*time.Microsecond), victimT[8].Round(10*time.Microsecond), earlyT[4].Round(10*time.Microsecond))
}
