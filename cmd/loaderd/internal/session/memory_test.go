// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// TestMemoryOnlyToItsOwner: a session's batch memory goes to the uid that
// opened it, as a descriptor with the session's description; another
// uid, and any caller over TCP (no descriptor passing), get ErrForbidden
// and no descriptor.
func TestMemoryOnlyToItsOwner(t *testing.T) {
	ds := tree(t)
	asRoot(t)
	searchable(t, ds.Root)
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}})
	defer m.Stop()
	owner := Caller{UID: os.Getuid(), GID: os.Getgid()}
	other := Caller{UID: owner.UID + 4242, GID: owner.GID + 4242}
	tcp := Caller{UID: 65534, GID: 65534, TCP: true} // the TCP principal (--tcp-user nobody)
	open := func(c Caller) string {
		o, err := m.Open(context.Background(), c, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		return o.ID
	}
	mine, overTCP := open(owner), open(tcp)
	tests := []struct {
		name   string
		c      Caller
		id     string
		refuse string // "" granted, else the refusal mentions it
	}{
		{"owner", owner, mine, ""},
		{"another uid", other, mine, "belongs to another user"},
		{"TCP caller, TCP session", tcp, overTCP, "only on the unix socket"},
		{"TCP caller, a uid's session", tcp, mine, "belongs to another user"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			desc, f, err := m.Memory(tt.c, tt.id)
			if tt.refuse == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if desc.Kind != batchmem.Pinned || desc.Slots < 1 || desc.Size != int64(desc.Slots)*desc.SlotSize {
					t.Errorf("description %+v", desc)
				}
				if st, err := f.Stat(); err != nil || st.Size() != desc.Size {
					t.Errorf("descriptor of %v bytes (%v), want %d", st.Size(), err, desc.Size)
				}
				return
			}
			if f != nil {
				f.Close()
				t.Errorf("a descriptor was handed out")
			}
			if !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), tt.refuse) {
				t.Errorf("err = %v, want ErrForbidden mentioning %q", err, tt.refuse)
			}
		})
	}
}

// TestMemoryRacesClose: exports of a session's memory running while the
// session closes (a client's memory request during DELETE or the
// daemon's shutdown) either get the memory — a file of the memory's size
// — or ErrNotFound, never a descriptor of whatever file reused the
// closed memory's number (before, Export read the number with no lock
// against Close: the race detector saw it, and /proc/self/fd/N could by
// then be another session's memory or a dataset file).
func TestMemoryRacesClose(t *testing.T) {
	ds := tree(t)
	asRoot(t)
	searchable(t, ds.Root)
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}})
	defer m.Stop()
	owner := Caller{UID: os.Getuid(), GID: os.Getgid()}
	for round := range 20 {
		o, err := m.Open(context.Background(), owner, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 4)
		for range 4 {
			go func() {
				for {
					desc, f, err := m.Memory(owner, o.ID)
					if err != nil {
						if errors.Is(err, ErrNotFound) {
							done <- nil
						} else {
							done <- err
						}
						return
					}
					st, serr := f.Stat()
					f.Close()
					if serr != nil || st.Size() != desc.Size {
						done <- fmt.Errorf("round %d: exported a file of %d bytes (%v), the memory is %d", round, st.Size(), serr, desc.Size)
						return
					}
				}
			}()
		}
		if err := m.Close(owner, o.ID); err != nil {
			t.Fatal(err)
		}
		for range 4 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
}
