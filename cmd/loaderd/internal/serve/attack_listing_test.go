// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// The cost of a listing (docs/security.md, promise 8 and 10): a caller
// other than root is told a dataset's counts only if it may read every
// sample, which the kernel judges by opening them as the caller. These
// tests count those opens on the filesystem itself (a fanotify
// permission mark: every open of a file waits for the test's answer), so
// they hold for any build, and assert on the work a request caused, never
// on how long it took.

// openWatch counts the opens of regular files on one mount: each open
// waits for its answer, given at once, or after pace while paced.
type openWatch struct {
	f     *os.File
	opens atomic.Int64
	pace  atomic.Int64 // nanoseconds before each answer; 0: at once
}

// watchOpens starts counting the opens of files on the mount at dir,
// until the test ends.
func watchOpens(t *testing.T, dir string) *openWatch {
	t.Helper()
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		testenv.SkipPrivileged(t, "serve: fanotify permission events: %v", err)
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_MOUNT, unix.FAN_OPEN_PERM, unix.AT_FDCWD, dir); err != nil {
		unix.Close(fd)
		testenv.SkipPrivileged(t, "serve: fanotify permission mark on %s: %v", dir, err)
	}
	w := &openWatch{f: os.NewFile(uintptr(fd), "fanotify")}
	done := make(chan struct{})
	go w.answer(done)
	t.Cleanup(func() {
		w.f.Close() // every open still waiting is allowed
		<-done
	})
	return w
}

// answer allows every open, counting it, until the watch is closed.
func (w *openWatch) answer(done chan<- struct{}) {
	defer close(done)
	const metaLen = int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+metaLen <= n; {
			ev := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
			off += int(ev.Event_len)
			if ev.Fd < 0 {
				continue
			}
			if d := w.pace.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			w.opens.Add(1)
			r := unix.FanotifyResponse{Fd: ev.Fd, Response: unix.FAN_ALLOW}
			// Through the *os.File, not its Fd: a Close from the cleanup may
			// come at any time, and File's own methods are safe beside it.
			w.f.Write((*[unsafe.Sizeof(r)]byte)(unsafe.Pointer(&r))[:])
			unix.Close(int(ev.Fd))
		}
	}
}

// listingDaemon serves listingFS(classes, perClass), whose samples are
// raw (so a guard watches them), and counts the opens on its mount; root
// is connected.
func listingDaemon(t *testing.T, classes, perClass int) (*testfs.FS, string, *openWatch, *peerClient) {
	t.Helper()
	fs, m := listingFS(t, classes, perClass)
	sock := daemon(t, m)
	if m.Stats().FSOnly != 0 {
		t.Fatalf("the dataset's samples are not raw (%+v): no guard would watch them", m.Stats())
	}
	return fs, sock, watchOpens(t, fs.Dir), connectAs(t, sock, who{0, 0, nil})
}

// listingFS is an ext4 with a dataset of classes × perClass samples of
// about 1 KiB (not inline: read raw, so the dataset is guarded), mapped,
// that everyone may read.
func listingFS(t *testing.T, classes, perClass int) (*testfs.FS, *bmap.Map) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "serve: listing tests connect as other users (euid %d)", os.Geteuid())
	}
	fs := testfs.New(t, testfs.Ext4())
	for d := fs.Dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	for c := range classes {
		dir := fs.Path("data", fmt.Sprintf("c%03d", c))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range perClass {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%04d.jpg", i)), bytes.Repeat([]byte(fmt.Sprintf("SAMPLE-%d-%d|", c, i)), 64), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("data"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return fs, m
}

// TestAttackListingCostsOnlyWhatChanged: nobody's and a throwaway uid's
// GET /v1/datasets over 20 000 samples open every sample as the caller
// once; after one file is added to a class folder, four concurrent GETs
// by each open only that class's samples again (200, together), root's
// none; a sample made 0600 is still seen at once (readable false, at
// most its class opened), and readable again once it is 0644. Before, every
// GET after any change opened all 20 000 samples as the caller (minutes
// of CPU at a million).
func TestAttackListingCostsOnlyWhatChanged(t *testing.T) {
	const classes, perClass = 100, 200
	const n = classes * perClass
	fs, sock, ow, root := listingDaemon(t, classes, perClass)
	attackers := []*peerClient{connectAs(t, sock, nobodyWho), connectAs(t, sock, throwawayWho)}
	opened := func(f func()) int64 {
		n0 := ow.opens.Load()
		f()
		return ow.opens.Load() - n0
	}
	var d map[string]any
	for _, c := range attackers {
		if k := opened(func() { d = datasetAs(t, c) }); d["readable"] != true || k < n {
			t.Fatalf("uid %d's first GET: readable %v, %d samples opened; want true, all %d", c.w.uid, d["readable"], k, n)
		}
		if k := opened(func() { d = datasetAs(t, c) }); k != 0 {
			t.Errorf("uid %d's second GET, nothing changed: %d samples opened, want 0", c.w.uid, k)
		}
	}

	if err := os.WriteFile(fs.Path("data", "c007", "added.jpg"), []byte("ADDED"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range attackers {
		var wg sync.WaitGroup
		var unreadable atomic.Int32
		k := opened(func() {
			for range 4 {
				wg.Go(func() {
					if readable, err := readableTo(c); err != nil || !readable {
						t.Errorf("uid %d's GET: readable %v, %v", c.w.uid, readable, err)
						unreadable.Add(1)
					}
				})
			}
			wg.Wait()
		})
		t.Logf("uid %d, 4 GETs after one file added: %d samples opened", c.w.uid, k)
		if k > perClass || unreadable.Load() != 0 {
			t.Errorf("uid %d, 4 concurrent GETs after one file added to a class of %d: %d samples opened (%d not readable), want at most %d, all readable",
				c.w.uid, perClass, k, unreadable.Load(), perClass)
		}
	}
	if k := opened(func() { d = datasetAs(t, root) }); k != 0 || d["samples"] == nil {
		t.Errorf("root's GET: %d samples opened, %v; want 0, every count", k, d)
	}

	secret := fs.Path("data", "c042", "0003.jpg")
	if err := os.Chmod(secret, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range attackers {
		k := opened(func() { d = datasetAs(t, c) })
		t.Logf("uid %d, a sample made 0600: %d samples opened: %v", c.w.uid, k, d)
		if d["readable"] != false || d["samples"] != nil {
			t.Errorf("uid %d, a sample it may not read: %v, want readable false and no counts", c.w.uid, d)
		}
		if k > perClass+1 {
			t.Errorf("uid %d, one sample chmod'ed: %d samples opened, want at most %d", c.w.uid, k, perClass+1)
		}
	}
	if err := os.Chmod(secret, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range attackers {
		if d := datasetAs(t, c); d["readable"] != true {
			t.Errorf("uid %d, the sample readable again: %v", c.w.uid, d)
		}
	}
}

// TestAttackListingStopsWithItsCaller: nobody asks GET /v1/datasets over
// 20 000 samples and goes away once the daemon has begun opening them
// (each open paced, so that a whole check takes seconds): the check stops
// (nvfeed_access_checks_total counts it cancelled) having opened a
// fraction of them, nothing is kept, and nobody's next GET checks again.
// Before, the check went on to open every sample for no one.
func TestAttackListingStopsWithItsCaller(t *testing.T) {
	const classes, perClass = 100, 200
	const n = classes * perClass
	_, sock, ow, root := listingDaemon(t, classes, perClass)
	nobody := connectAs(t, sock, nobodyWho)

	ow.pace.Store(int64(200 * time.Microsecond)) // a whole check: 4 s at least
	ctx, cancel := context.WithCancel(context.Background())
	answered := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", nobody.c.base+"/v1/datasets", nil)
		resp, err := nobody.c.http.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	testenv.Eventually(t, "the check's first open", func() bool { return ow.opens.Load() > 0 })
	cancel()
	if err := <-answered; !errors.Is(err, context.Canceled) {
		t.Fatalf("the GET gone away: %v", err)
	}
	testenv.Eventually(t, "the check to end", func() bool { return cancelledChecks(t, root) > 0 || ow.opens.Load() >= n })
	ow.pace.Store(0)
	k := ow.opens.Load()
	t.Logf("the check opened %d of %d samples before it stopped", k, n)
	if k >= n/4 {
		t.Errorf("a GET gone away after the first open: its check opened %d of %d samples, want a fraction", k, n)
	}
	datasetAs(t, root)
	if again := ow.opens.Load(); again != k {
		t.Errorf("the stopped check went on: %d samples opened, then %d", k, again)
	}
	if d := datasetAs(t, nobody); d["readable"] != true || ow.opens.Load()-k < n {
		t.Errorf("nobody's next GET: %v after %d opens, want readable after a whole check (%d)", d["readable"], ow.opens.Load()-k, n)
	}
}

// readableTo is "ds"'s readable in GET /v1/datasets as c (safe on any
// goroutine).
func readableTo(c *peerClient) (bool, error) {
	resp, err := c.c.http.Get(c.c.base + "/v1/datasets")
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var r map[string][]map[string]any
	if err := msgpack.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || len(r["datasets"]) != 1 {
		return false, fmt.Errorf("%s: %v %v", resp.Status, r, err)
	}
	return r["datasets"][0]["readable"] == true, nil
}

// cancelledChecks is nvfeed_access_checks_total{scope="cancelled"} of
// dataset ds, as root's /metrics gives it (0 where there is none).
func cancelledChecks(t *testing.T, root *peerClient) int {
	t.Helper()
	re := regexp.MustCompile(`nvfeed_access_checks_total\{dataset="ds",scope="cancelled"\} (\d+)`)
	if s := re.FindStringSubmatch(metricsAs(t, root)); s != nil {
		n, _ := strconv.Atoi(s[1])
		return n
	}
	return 0
}
