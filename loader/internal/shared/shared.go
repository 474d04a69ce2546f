// SPDX-License-Identifier: Apache-2.0

// Package shared lets backends share resources by key, refcounted: the
// daemon's one raw engine per device for all its sessions.
package shared

import (
	"errors"
	"io"
	"sync"
)

// Shared holds resources that several backends may share — one io_uring
// engine per block device for every session reading it, say. A resource is
// made by its first user and closed when its last user releases it. The
// zero value is ready to use; it is safe for concurrent use.
type Shared struct {
	mu sync.Mutex
	m  map[string]*sharedRes
}

type sharedRes struct {
	v    io.Closer
	refs int
}

// errReleased is returned by a release called more than once.
var errReleased = errors.New("shared: resource released twice")

// Acquire returns the resource under key, calling open to make it when
// there is none; open runs under Shared's lock, so it must be quick and
// must not call Acquire. release gives this reference back; the last
// release closes the resource and returns Close's error.
func (s *Shared) Acquire(key string, open func() (io.Closer, error)) (v io.Closer, release func() error, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.m[key]
	if r == nil {
		v, err := open()
		if err != nil {
			return nil, nil, err
		}
		if s.m == nil {
			s.m = map[string]*sharedRes{}
		}
		r = &sharedRes{v: v}
		s.m[key] = r
	}
	r.refs++
	var once sync.Once
	release = func() error {
		err := errReleased
		once.Do(func() { err = s.release(key, r) })
		return err
	}
	return r.v, release, nil
}

func (s *Shared) release(key string, r *sharedRes) error {
	s.mu.Lock()
	r.refs--
	last := r.refs == 0
	if last {
		delete(s.m, key)
	}
	s.mu.Unlock()
	if last {
		return r.v.Close()
	}
	return nil
}

// Len returns how many resources are held now.
func (s *Shared) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
