// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/confine"
)

// TestUnseen: a refusal whose cause is the root missing from a daemon
// whose sandbox hides it becomes ErrConflict naming the setting and not
// the caller's access; a refusal for access (EACCES), or any refusal of
// a dataset no sandbox hides, stays the caller's.
func TestUnseen(t *testing.T) {
	h := &confine.Hiding{Setting: "PrivateTmp=yes", Mount: confine.Mount{Root: "/tmp/systemd-private-x-loaderd.service-y/tmp", Point: "/tmp", FSType: "ext4"}}
	hidden := &dataset{name: "train", m: &bmap.Map{Root: "/tmp/ds"}, hidden: h}
	plain := &dataset{name: "train", m: &bmap.Map{Root: "/tmp/ds"}}
	gone := refusal("train", Caller{UID: 65534, GID: 65534}, fmt.Errorf("/tmp/ds: %w", unix.ENOENT))
	denied := refusal("train", Caller{UID: 65534, GID: 65534}, fmt.Errorf("/tmp/ds: %w", unix.EACCES))

	err := hidden.unseen(gone)
	if !errors.Is(err, ErrConflict) || errors.Is(err, ErrForbidden) {
		t.Fatalf("hidden root: %v, want ErrConflict only", err)
	}
	for _, want := range []string{"PrivateTmp=yes", "/tmp/ds", "not a matter of your access"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if err := hidden.unseen(denied); err != denied {
		t.Errorf("EACCES under a hidden root: %v, want the caller's refusal", err)
	}
	if err := plain.unseen(gone); err != gone {
		t.Errorf("no sandbox: %v, want the caller's refusal", err)
	}
}
