// SPDX-License-Identifier: Apache-2.0

package backend

import (
	"bytes"
	"encoding/json"
)

// Stats is what a backend reports of its work so far, for reports and
// metrics: what ran, as labels, and named counters. Any backend fills in
// what it has; the host exports every counter by its name (the daemon's
// nvfeed_backend{counter=NAME} series, loaderd bench's JSON) and every
// label as text. Names are snake_case.
type Stats struct {
	// Engine names how the backend reads ("uring", "pread", …); "" for
	// none worth naming.
	Engine string
	// Labels are other facts of what ran, e.g. {"device", "/dev/nvme0n1"},
	// {"freshness", "watch"}; empty values are left out of reports.
	Labels []Label
	// Counters are the backend's counts in its order. A counter named
	// peak_* is a high-water mark: hosts take the largest over backends
	// rather than the sum.
	Counters []Counter
}

// Label is one named fact of Stats.
type Label struct {
	Name, Value string
}

// Counter is one named counter of Stats.
type Counter struct {
	Name  string
	Value int64
}

// Counter returns the counter name's value, 0 when the backend has none.
func (s Stats) Counter(name string) int64 {
	for _, c := range s.Counters {
		if c.Name == name {
			return c.Value
		}
	}
	return 0
}

// Label returns the label name's value ("engine" is Engine), "" when the
// backend has none.
func (s Stats) Label(name string) string {
	if name == "engine" {
		return s.Engine
	}
	for _, l := range s.Labels {
		if l.Name == name {
			return l.Value
		}
	}
	return ""
}

// MarshalJSON writes one flat object: "engine" and the labels that are
// set, then every counter, each under its name.
func (s Stats) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	field := func(name string, v any) error {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(name)
		val, err := json.Marshal(v)
		b.Write(k)
		b.WriteByte(':')
		b.Write(val)
		return err
	}
	if s.Engine != "" {
		field("engine", s.Engine)
	}
	for _, l := range s.Labels {
		if l.Value != "" {
			field(l.Name, l.Value)
		}
	}
	for _, c := range s.Counters {
		field(c.Name, c.Value)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
