// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// TestReapedSessionSaysSo: a session reaped as idle answers its owner's
// next request with ErrReaped (and ErrNotFound), naming the timeout and
// that the daemon is up; another owner, and a session closed by its
// client, get the plain unknown session; the log keeps maxReaped.
func TestReapedSessionSaysSo(t *testing.T) {
	ds := tree(t)
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}, SessionTimeout: 7 * time.Second})
	defer m.Stop()
	me := Caller{UID: os.Getuid(), GID: os.Getgid()}
	other := me
	other.TCP = true
	open := func() Opened {
		o, err := m.Open(context.Background(), me, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	a, b := open(), open()
	if err := m.Close(me, b.ID); err != nil {
		t.Fatal(err)
	}
	m.Reap(time.Now().Add(time.Minute))
	err := m.Check(me, a.ID)
	if !errors.Is(err, ErrReaped) || !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "was closed as idle at ") || !strings.Contains(err.Error(), "more than 7s with no request") || !strings.Contains(err.Error(), "daemon is up") {
		t.Errorf("the reaped session: %v, want ErrReaped naming the timeout", err)
	}
	if err := m.Check(other, a.ID); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrReaped) {
		t.Errorf("another owner asking: %v, want a plain unknown session", err)
	}
	if err := m.Check(me, b.ID); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrReaped) {
		t.Errorf("a session its client closed: %v, want a plain unknown session", err)
	}
	for i := range maxReaped {
		m.reaped.add(fmt.Sprint(i), me.owner(), time.Now())
	}
	if err := m.Check(me, a.ID); errors.Is(err, ErrReaped) || len(m.reaped.by) != maxReaped || len(m.reaped.order) != maxReaped {
		t.Errorf("after %d more reaped: %v, %d remembered, want the oldest forgotten", maxReaped, err, len(m.reaped.by))
	}
}
