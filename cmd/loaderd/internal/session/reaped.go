// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrReaped is wrapped, with ErrNotFound, by the error for a session the
// daemon closed as idle: its client may reopen it where it was, and say
// so, where another unknown session means another daemon.
var ErrReaped = errors.New("closed as idle")

// maxReaped is the most reaped sessions remembered; the oldest go first.
const maxReaped = 4096

// reapedSession is what the daemon remembers of a session it reaped.
type reapedSession struct {
	owner owner
	at    time.Time
}

// reapedLog remembers the sessions reaped last, so that their next
// request is told why the session is gone.
type reapedLog struct {
	mu    sync.Mutex
	by    map[string]reapedSession
	order []string // oldest first
}

// add remembers that session id of o was reaped at t.
func (r *reapedLog) add(id string, o owner, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[string]reapedSession{}
	}
	if len(r.order) >= maxReaped {
		delete(r.by, r.order[0])
		r.order = r.order[1:]
	}
	r.by[id] = reapedSession{o, t}
	r.order = append(r.order, id)
}

// error returns the error for c's request to session id when id is a
// session of c's that was reaped, nil otherwise.
func (r *reapedLog) error(c Caller, id string, timeout time.Duration) error {
	r.mu.Lock()
	s, ok := r.by[id]
	r.mu.Unlock()
	if !ok || s.owner != c.owner() {
		return nil
	}
	return fmt.Errorf("%w: session %s was %w at %s, after more than %s with no request (loaderd serve --session-timeout); the daemon is up",
		ErrNotFound, id, ErrReaped, s.at.Format("15:04:05"), timeout)
}
