// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"errors"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// pyVersion is the Python client's side of the versions.
const pyVersion = "../../../../python/nvfeed/_version.py"

// TestPythonVersionsAreTheDaemons: the client's protocol, oldest daemon
// and feature tables (python/nvfeed/_version.py) are the daemon's, so a
// client fits its requests to what daemons declare by the same names.
func TestPythonVersionsAreTheDaemons(t *testing.T) {
	b, err := os.ReadFile(pyVersion)
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	num := func(name string) int {
		m := regexp.MustCompile(`(?m)^` + name + ` = (\d+)$`).FindStringSubmatch(src)
		if m == nil {
			t.Fatalf("%s: no %s", pyVersion, name)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if p := num("PROTOCOL"); p != Protocol {
		t.Errorf("PROTOCOL = %d, wire.Protocol = %d", p, Protocol)
	}
	if p := num("UNVERSIONED"); p != UnversionedProtocol {
		t.Errorf("UNVERSIONED = %d, wire.UnversionedProtocol = %d", p, UnversionedProtocol)
	}
	block := func(name, end string) string {
		i := strings.Index(src, name+" = ")
		if i < 0 {
			t.Fatalf("%s: no %s", pyVersion, name)
		}
		j := strings.Index(src[i:], end)
		return src[i : i+j]
	}
	pairs := regexp.MustCompile(`"([a-z_]+)": "([a-z_]+)"`).FindAllStringSubmatch(block("FIELD_FEATURES", "}"), -1)
	got := map[string]string{}
	for _, m := range pairs {
		got[m[1]] = m[2]
	}
	if !maps.Equal(got, FieldFeatures()) {
		t.Errorf("FIELD_FEATURES = %v, wire.FieldFeatures() = %v", got, FieldFeatures())
	}
	var old []string
	for _, m := range regexp.MustCompile(`"([a-z_]+)"`).FindAllStringSubmatch(block("UNVERSIONED_FEATURES", "))"), -1) {
		old = append(old, m[1])
	}
	for _, f := range old {
		if !slices.Contains(Features(), f) {
			t.Errorf("UNVERSIONED_FEATURES has %q, which wire.Features() lacks", f)
		}
	}
	for _, f := range FieldFeatures() {
		if !slices.Contains(Features(), f) {
			t.Errorf("wire.FieldFeatures() names %q, which wire.Features() lacks", f)
		}
	}
	// Every key FieldFeatures names is an open request's.
	keys := openKeys(reflect.TypeOf(OpenRequest{}))
	for k := range FieldFeatures() {
		if !slices.Contains(keys, k) {
			t.Errorf("wire.FieldFeatures() names %q, which OpenRequest lacks", k)
		}
	}
}

// openKeys lists a struct's msgpack keys, inline structs' included.
func openKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
		if strings.Contains(opts, "inline") {
			keys = append(keys, openKeys(f.Type)...)
			continue
		}
		keys = append(keys, name)
	}
	return keys
}

// The sides and refusals of the versions.
func TestCheckClient(t *testing.T) {
	d := Side{Name: "loaderd", Protocol: Protocol, Release: "0.3.0"}
	if err := CheckClient(d, Side{Name: "nvfeed", Protocol: UnversionedProtocol}, nil); err != nil {
		t.Errorf("an unversioned client: %v", err)
	}
	err := CheckClient(d, Side{Name: "nvfeed", Protocol: 0, Release: "0.1.0"}, nil)
	if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "upgrade the client") {
		t.Errorf("protocol 0: %v", err)
	}
	var v struct {
		A int `msgpack:"a"`
	}
	dec := Decode(mustMarshal(t, map[string]any{"a": 1, "zoom": 2}), &v)
	if f, ok := UnknownField(dec); !ok || f != "zoom" {
		t.Fatalf("UnknownField(%v) = %q, %v", dec, f, ok)
	}
	if err := CheckClient(d, Side{Name: "nvfeed", Protocol: Protocol}, dec); err != nil {
		t.Errorf("this protocol's unknown key is its own: %v", err)
	}
	err = CheckClient(d, Side{Name: "nvfeed", Protocol: Protocol + 1, Release: "9"}, dec)
	if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), `"zoom"`) || !strings.Contains(err.Error(), "upgrade loaderd") {
		t.Errorf("a newer client's unknown key: %v", err)
	}
	if s := (Side{Name: "nvfeed", Protocol: 1}).String(); !strings.Contains(s, "sends no version") {
		t.Errorf("an unversioned side: %q", s)
	}
	for _, h := range []string{"x", "-1", "1.5"} {
		if _, err := ParseProtocol(h); !errors.Is(err, ErrVersion) {
			t.Errorf("ParseProtocol(%q): %v", h, err)
		}
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
