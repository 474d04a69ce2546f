// SPDX-License-Identifier: Apache-2.0

package backend

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Kind is the type of an option's value.
type Kind string

// Option kinds.
const (
	Int  Kind = "int"  // an integer in [Min, Max], a multiple of Multiple when set
	Bool Kind = "bool" // true or false
	Enum Kind = "enum" // one of Choices
)

// Option describes one backend option. Its Name is the key on the wire
// (snake_case) and, with '_' as '-', the loaderd flag.
type Option struct {
	Name     string   `json:"name" msgpack:"name"`
	Kind     Kind     `json:"kind" msgpack:"kind"`
	Default  any      `json:"default" msgpack:"default"` // int64, bool or string by Kind
	Min      int64    `json:"min,omitempty" msgpack:"min,omitempty"`
	Max      int64    `json:"max,omitempty" msgpack:"max,omitempty"`
	Multiple int64    `json:"multiple,omitempty" msgpack:"multiple,omitempty"`
	Choices  []string `json:"choices,omitempty" msgpack:"choices,omitempty"`
	Doc      string   `json:"doc" msgpack:"doc"`
}

// Flag returns the option's command-line flag name (no dashes before).
func (o Option) Flag() string { return strings.ReplaceAll(o.Name, "_", "-") }

// Spec is a backend's description of itself: its name, what it does, its
// options with defaults and limits, and how to open it. Everything that
// names backends or their options (loaderd's flags, the daemon's request
// validation, GET /v1/backends, the Python docs) derives from Specs.
type Spec struct {
	Name    string   `json:"name" msgpack:"name"`
	Doc     string   `json:"doc" msgpack:"doc"`
	Options []Option `json:"options" msgpack:"options"`
	// DeviceWrites says the backend writes GPU memory itself (Request.Dev);
	// for a backend that writes only host memory, GPU batch memory gives it
	// a host staging area and copies it over in Publish.
	DeviceWrites bool `json:"device_writes" msgpack:"device_writes"`
	// ReadsExtents says the backend reads raw extents from the block
	// device. The host then tells its client which samples it reads
	// through the filesystem instead, and why.
	ReadsExtents bool `json:"-" msgpack:"-"`
	// MeasuresMode says the open backend measures how it reaches the
	// device (it implements ModeReporter): under GPU path auto the host
	// asks it once open and takes bounce where it says ModeCompat. Only
	// with DeviceWrites.
	MeasuresMode bool   `json:"-" msgpack:"-"`
	Open         Opener `json:"-" msgpack:"-"`
}

// Option returns the option called name.
func (s *Spec) Option(name string) (Option, bool) {
	i := slices.IndexFunc(s.Options, func(o Option) bool { return o.Name == name })
	if i < 0 {
		return Option{}, false
	}
	return s.Options[i], true
}

// OptionNames returns the names of the spec's options, in order.
func (s *Spec) OptionNames() []string {
	names := make([]string, len(s.Options))
	for i, o := range s.Options {
		names[i] = o.Name
	}
	return names
}

// Params are a backend's options after Resolve: every option has a value
// of its kind, defaults filled in.
type Params struct {
	backend string
	v       map[string]any
}

// Int returns an Int option's value. It panics on a name the spec lacks:
// that is a bug in the backend, not bad input.
func (p Params) Int(name string) int64 { return p.get(name).(int64) }

// Bool returns a Bool option's value.
func (p Params) Bool(name string) bool { return p.get(name).(bool) }

// String returns an Enum option's value.
func (p Params) String(name string) string { return p.get(name).(string) }

// Map returns every option's value by name (a copy), for reports.
func (p Params) Map() map[string]any {
	m := make(map[string]any, len(p.v))
	for k, v := range p.v {
		m[k] = v
	}
	return m
}

func (p Params) get(name string) any {
	v, ok := p.v[name]
	if !ok {
		panic(fmt.Sprintf("backend %s: no option %q", p.backend, name))
	}
	return v
}

// Resolve checks in (option name to value: an integer, bool or string as
// msgpack or JSON decode them, or a string as a flag gives it) against the
// spec and fills in the defaults. Errors wrap ErrOptions and name the
// backend, the option and the allowed values.
func (s *Spec) Resolve(in map[string]any) (Params, error) {
	p := Params{backend: s.Name, v: make(map[string]any, len(s.Options))}
	for name := range in {
		if _, ok := s.Option(name); !ok {
			return Params{}, fmt.Errorf("%w: backend %s has no option %q (its options: %s)", ErrOptions, s.Name, name, strings.Join(s.OptionNames(), ", "))
		}
	}
	for _, o := range s.Options {
		raw, given := in[o.Name]
		if !given || raw == nil {
			p.v[o.Name] = o.Default
			continue
		}
		v, err := o.parse(raw)
		if err != nil {
			return Params{}, fmt.Errorf("%w: backend %s option %s: %v", ErrOptions, s.Name, o.Name, err)
		}
		p.v[o.Name] = v
	}
	return p, nil
}

// parse converts and checks one value.
func (o Option) parse(raw any) (any, error) {
	switch o.Kind {
	case Int:
		n, err := toInt(raw)
		if err != nil {
			return nil, err
		}
		if n < o.Min || n > o.Max {
			return nil, fmt.Errorf("%d not in [%d, %d]", n, o.Min, o.Max)
		}
		if o.Multiple > 0 && n%o.Multiple != 0 {
			return nil, fmt.Errorf("%d is not a multiple of %d", n, o.Multiple)
		}
		return n, nil
	case Bool:
		switch v := raw.(type) {
		case bool:
			return v, nil
		case string:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, fmt.Errorf("%q is not true or false", v)
			}
			return b, nil
		}
		return nil, fmt.Errorf("%v (%T) is not true or false", raw, raw)
	case Enum:
		v, ok := raw.(string)
		if !ok || !slices.Contains(o.Choices, v) {
			return nil, fmt.Errorf("%v is not one of %s", raw, strings.Join(o.Choices, ", "))
		}
		return v, nil
	}
	return nil, fmt.Errorf("unknown kind %q", o.Kind)
}

func toInt(raw any) (int64, error) {
	switch v := raw.(type) {
	case int:
		return int64(v), nil
	case int8:
		return int64(v), nil
	case int16:
		return int64(v), nil
	case int32:
		return int64(v), nil
	case int64:
		return v, nil
	case uint8:
		return int64(v), nil
	case uint16:
		return int64(v), nil
	case uint32:
		return int64(v), nil
	case uint64:
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("%d is too large", v)
		}
		return int64(v), nil
	case float64:
		if v != math.Trunc(v) || math.Abs(v) > 1<<53 {
			return 0, fmt.Errorf("%v is not an integer", v)
		}
		return int64(v), nil
	case string:
		n, err := strconv.ParseInt(v, 0, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not an integer", v)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%v (%T) is not an integer", raw, raw)
}
