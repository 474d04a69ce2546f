// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/caps"
)

// ErrCapabilities is wrapped by loaderd serve's refusal to start as root
// without a capability that checking callers (or what the flags ask for)
// needs.
var ErrCapabilities = errors.New("serve: missing capabilities")

// capNeed is one capability loaderd serve uses: why, and whether the
// daemon refuses to start without it (required) or only warns (wanted:
// the daemon works, at the cost why names).
type capNeed struct {
	cap      caps.Cap
	why      string
	required bool
}

// capNeeds returns the capabilities loaderd serve uses with these
// settings (socketGroup: --socket-group, "" when not given). The systemd
// unit's CapabilityBoundingSet (deploy/systemd/loaderd.service) lists the
// same, each with its reason.
func capNeeds(socketGroup string) []capNeed {
	needs := []capNeed{
		{unix.CAP_SETUID, "loaderd switches to each caller's uid (setfsuid, per thread) to let the kernel judge its access; without it every open by a caller other than root is refused (403)", true},
		{unix.CAP_SETGID, "loaderd takes each caller's gid and supplementary groups (setfsgid, setgroups, per thread) to let the kernel judge its access; without it every open by a caller other than root is refused (403 \"setgroups: operation not permitted\")", true},
		{unix.CAP_DAC_READ_SEARCH, "loaderd reads the maps, stats and watches every sample folder and reads the block devices under the datasets whoever owns them", true},
	}
	if socketGroup != "" {
		needs = append(needs, capNeed{unix.CAP_CHOWN, fmt.Sprintf("loaderd gives its socket the group --socket-group %s names, which root is not a member of", socketGroup), true})
	}
	return append(needs,
		capNeed{unix.CAP_DAC_OVERRIDE, "without it loaderd opens for writing only what root's own mode bits allow (a socket directory, or a GPU or nvidia-fs device node, not writable by its owner class fails)", false},
		capNeed{unix.CAP_IPC_LOCK, "without it batch memory is page-locked only within RLIMIT_MEMLOCK, and the locked budget (--max-locked-mb) is bounded by that limit", false},
		capNeed{unix.CAP_SYS_ADMIN, "without it no filesystem-wide fanotify mark can see a sample change through another path: every raw read is checked with a stat after it and no access verdict is reused (every open checks every sample as the caller)", false},
		capNeed{unix.CAP_LEASE, "without it the check that no one holds a raw sample open for writing (a read lease) fails for samples not owned by root, so those of a --trusted-uid are read through the filesystem", false},
	)
}

// checkCaps compares the effective capabilities have with what loaderd
// serve needs (needs) when its effective uid is euid. As root a missing
// required capability is an error wrapping ErrCapabilities that names
// each one and what needs it; a missing wanted one is a warning naming
// its cost. A daemon that is not root is told, in one warning, what it
// can and cannot do.
func checkCaps(have caps.Set, euid int, needs []capNeed, log *slog.Logger) error {
	var missing []string
	var missingCaps []string
	for _, n := range needs {
		if have.Has(n.cap) {
			continue
		}
		missingCaps = append(missingCaps, n.cap.String())
		switch {
		case euid != 0:
		case n.required:
			missing = append(missing, fmt.Sprintf("%s missing: %s; add it to the unit's CapabilityBoundingSet (or the container's securityContext.capabilities.add)", n.cap, n.why))
		default:
			log.Warn(fmt.Sprintf("loaderd: %s missing: %s", n.cap, n.why), "capability", n.cap.String())
		}
	}
	if euid != 0 {
		switching := have.Has(unix.CAP_SETUID) && have.Has(unix.CAP_SETGID)
		works := "it serves only root's requests: checking any other caller switches to the caller's uid and groups, which needs CAP_SETUID and CAP_SETGID, so every other caller's open is refused (403)"
		if switching {
			works = "it checks callers as root would (CAP_SETUID, CAP_SETGID)"
		}
		log.Warn(fmt.Sprintf("loaderd: running as uid %d, not root: %s; it reads maps, watches sample folders and (gds, bam) reads block devices with uid %d's own permissions", euid, works, euid),
			"uid", euid, "missing", strings.Join(missingCaps, " "))
		return nil
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w (effective: %s):\n  %s", ErrCapabilities, have, strings.Join(missing, "\n  "))
	}
	return nil
}

// rootOnlySocket is the warning of a daemon started without
// --socket-group (and a mode that lets no others in): who alone may
// connect, and how to let users in, never by joining root's group.
func rootOnlySocket(euid, egid int, socket string) string {
	who := "root"
	if euid != 0 || egid != 0 {
		who = fmt.Sprintf("uid %d and members of gid %d (the daemon's own)", euid, egid)
	}
	return fmt.Sprintf("loaderd: no --socket-group: only %s can connect to %s; to let users in, give a group of their own "+
		"(--socket-group GROUP, or socket-group = GROUP in the config file; e.g. groupadd --system loaderd) and add the users to it", who, socket)
}
