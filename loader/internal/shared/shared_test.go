// SPDX-License-Identifier: Apache-2.0

package shared

import (
	"errors"
	"io"
	"sync"
	"testing"
)

type closeCounter struct{ closed int }

func (c *closeCounter) Close() error { c.closed++; return nil }

func TestShared(t *testing.T) {
	var s Shared
	opens := 0
	open := func() (io.Closer, error) { opens++; return &closeCounter{}, nil }
	a, relA, err := s.Acquire("dev0", open)
	if err != nil {
		t.Fatal(err)
	}
	b, relB, _ := s.Acquire("dev0", open)
	c, relC, _ := s.Acquire("dev1", open)
	if a != b || a == c || opens != 2 || s.Len() != 2 {
		t.Fatalf("same key shared %v, other key apart %v, opens %d, held %d", a == b, a != c, opens, s.Len())
	}
	if relA(); a.(*closeCounter).closed != 0 {
		t.Errorf("closed while another user holds it")
	}
	if err := relA(); !errors.Is(err, errReleased) {
		t.Errorf("second release: err = %v, want errReleased", err)
	}
	if relB(); a.(*closeCounter).closed != 1 {
		t.Errorf("last release: closed %d times, want 1", a.(*closeCounter).closed)
	}
	relC()
	if s.Len() != 0 {
		t.Errorf("%d resources held after every release", s.Len())
	}
	d, relD, _ := s.Acquire("dev0", open)
	if d == a || opens != 3 {
		t.Errorf("a released key was not made anew")
	}
	relD()
	boom := errors.New("boom")
	if _, _, err := s.Acquire("bad", func() (io.Closer, error) { return nil, boom }); !errors.Is(err, boom) || s.Len() != 0 {
		t.Errorf("failed open: err = %v, held %d", err, s.Len())
	}
}

func TestSharedConcurrent(t *testing.T) {
	var s Shared
	var mu sync.Mutex
	opens := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, rel, err := s.Acquire("dev", func() (io.Closer, error) {
					mu.Lock()
					opens++
					mu.Unlock()
					return &closeCounter{}, nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				if err := rel(); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if s.Len() != 0 || opens == 0 {
		t.Errorf("held %d after all released, opens %d", s.Len(), opens)
	}
}
