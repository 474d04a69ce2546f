package session

import (
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// TestMaxSessionsConcurrent: opens racing past the session limit never
// exceed it (the check and the insertion are one step), and every refused
// open says why with ErrLimit.
func TestMaxSessionsConcurrent(t *testing.T) {
	const limit, opens = 2, 16
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": tree(t)}, MaxSessions: limit})
	defer m.Stop()
	me := Caller{UID: os.Getuid(), GID: os.Getgid()} // the owner of tree()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, opens)
	for i := range opens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = m.Open(me, OpenParams{Dataset: "d", ReaderArgs: loader.ReaderArgs{BatchSize: 1}})
		}()
	}
	close(start)
	wg.Wait()
	var opened int
	for _, err := range errs {
		switch {
		case err == nil:
			opened++
		case !errors.Is(err, ErrLimit):
			t.Errorf("open: %v (want success or ErrLimit)", err)
		}
	}
	if opened != limit {
		t.Errorf("%d concurrent opens with MaxSessions %d: %d sessions opened, want exactly %d", opens, limit, opened, limit)
	}
	if n := len(m.snapshot()); n > limit {
		t.Errorf("%d sessions open, over the limit of %d", n, limit)
	}
}
