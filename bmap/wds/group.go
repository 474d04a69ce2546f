// SPDX-License-Identifier: Apache-2.0

package wds

import "strings"

// SplitName splits a member's name into its key and extension as DALI's
// split_name: at the first dot after the last slash. A name without one
// is its own key and its own extension (DALI's substr(npos + 1)).
func SplitName(name string) (key, ext string) {
	key, ext, _ = splitDot(name)
	return key, ext
}

// splitDot is SplitName, saying whether the name had the dot.
func splitDot(name string) (key, ext string, dot bool) {
	base := strings.LastIndexByte(name, '/') + 1
	i := strings.IndexByte(name[base:], '.')
	if i < 0 {
		return name, name, false
	}
	return name[:base+i], name[base+i+1:], true
}

// Group is one sample of a shard before extensions are chosen: its key
// and its components, a range of the shard's components.
type Group struct {
	Key          string
	First, Count int // components [First, First+Count)
}

// GroupMembers forms a shard's samples from its members as DALI's ParseTarFile does.
// Consecutive components with one key are a sample; an empty key is no component.
// DALI's quirks are kept: a shard may begin with an empty sample, and always ends with one.
func GroupMembers(members []Member) (groups []Group, comps []int) {
	last := ""
	if len(members) > 0 {
		last, _ = SplitName(members[0].Name)
	}
	first := 0
	for i, m := range members {
		key, _ := SplitName(m.Name)
		if key == "" {
			continue
		}
		if key != last {
			groups = append(groups, Group{Key: last, First: first, Count: len(comps) - first})
			last, first = key, len(comps)
		}
		comps = append(comps, i)
	}
	groups = append(groups, Group{Key: last, First: first, Count: len(comps) - first})
	return groups, comps
}
