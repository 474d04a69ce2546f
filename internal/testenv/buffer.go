// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that a logger's goroutines and a test may use
// at once: where a test collects what a daemon logs.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
