// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/loader"
)

// protocolMD is the protocol's documentation, with the bounds table.
const protocolMD = "../../../../docs/protocol.md"

// TestBoundsTableNamesEveryOpenField: every number and string an open
// request carries (and a state's sampling) has its row in
// docs/protocol.md's bounds table, so no field a client sends goes
// unbounded without the table saying so; a row names no field the wire
// does not have. Booleans have no range; the state is listed by its
// fields (state.version, state.epoch, state.batch, n and the sampling's
// reader arguments).
func TestBoundsTableNamesEveryOpenField(t *testing.T) {
	b, err := os.ReadFile(protocolMD)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	cell := regexp.MustCompile("`([a-z_.]+)`")
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, m := range cell.FindAllStringSubmatch(first, -1) {
			rows[m[1]] = true
		}
	}
	if len(rows) < 10 {
		t.Fatalf("%s: %d rows in the bounds table: the table was not found", protocolMD, len(rows))
	}
	need := map[string]bool{}
	add := func(typ reflect.Type, prefix string) {
		keys := map[string]string{}
		goFields(typ, keys)
		for k, pt := range keys {
			if pt == "bool" || k == "state" || k == "sampling" {
				continue
			}
			need[prefix+k] = true
		}
	}
	add(reflect.TypeFor[OpenRequest](), "")
	add(reflect.TypeFor[loader.Sampling](), "")
	add(reflect.TypeFor[loader.State](), "state.")
	need["state.sampling"] = false // listed by its fields
	for k, must := range need {
		if must && !rows[k] {
			t.Errorf("the open request's %q has no row in %s's bounds table", k, protocolMD)
		}
	}
	// Rows name fields of the wire (of other requests too).
	known := map[string]bool{}
	for _, typ := range wireTypes {
		keys := map[string]string{}
		goFields(typ, keys)
		for k := range keys {
			known[k] = true
		}
	}
	for k := range rows {
		base := strings.TrimPrefix(k, "state.")
		if !known[base] && !need[k] {
			t.Errorf("%s's bounds table has a row for %q, which no message carries", protocolMD, k)
		}
	}
}
