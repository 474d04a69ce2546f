// SPDX-License-Identifier: Apache-2.0

package confine

import (
	"fmt"
	"path"
	"strings"
)

// Hiding is a mount of a service manager's sandbox over a path: what
// the process sees there is not what the rest of the machine sees.
type Hiding struct {
	Setting string // the unit setting that made it: "PrivateTmp=yes", ...
	Mount   Mount  // the mount over the path
}

// String says what hides the path and how, for logs and errors.
func (h Hiding) String() string {
	what := "a mount of its own"
	switch h.Setting {
	case "PrivateTmp=yes":
		what = fmt.Sprintf("a %s of its own", h.Mount.Point)
	case "ProtectHome=yes", "ProtectHome=tmpfs":
		what = fmt.Sprintf("an empty %s", h.Mount.Point)
	case "InaccessiblePaths=":
		what = fmt.Sprintf("nothing at %s", h.Mount.Point)
	}
	return fmt.Sprintf("the daemon's service sandbox (systemd %s) gives it %s (mount of %s at %s, %s)", h.Setting, what, h.Mount.Root, h.Mount.Point, h.Mount.FSType)
}

// Hidden returns the sandbox mount covering absolute path p and the setting that made it.
// It knows systemd's PrivateTmp, ProtectHome and InaccessiblePaths.
func Hidden(mounts []Mount, p string) (Hiding, bool) {
	m, ok := covering(mounts, path.Clean(p))
	if !ok {
		return Hiding{}, false
	}
	inaccessible := strings.Contains(m.Root, "/systemd/inaccessible")
	switch {
	case strings.Contains(m.Root, "/systemd-private-") && (m.Point == "/tmp" || m.Point == "/var/tmp"):
		return Hiding{"PrivateTmp=yes", m}, true
	case isHome(m.Point) && inaccessible:
		return Hiding{"ProtectHome=yes", m}, true
	case isHome(m.Point) && m.FSType == "tmpfs" && m.Root == "/":
		return Hiding{"ProtectHome=tmpfs", m}, true
	case inaccessible:
		return Hiding{"InaccessiblePaths=", m}, true
	}
	return Hiding{}, false
}

// isHome says whether p is a folder systemd's ProtectHome hides.
func isHome(p string) bool {
	switch p {
	case "/home", "/root", "/run/user":
		return true
	}
	return false
}

// covering returns the mount p lies under: the longest mount point
// above it, the last mounted of equal ones.
func covering(mounts []Mount, p string) (Mount, bool) {
	var best Mount
	found := false
	for _, m := range mounts {
		if !under(p, m.Point) {
			continue
		}
		if !found || len(m.Point) >= len(best.Point) {
			best, found = m, true
		}
	}
	return best, found
}

// under says whether p is dir or below it.
func under(p, dir string) bool {
	if dir == "/" || p == dir {
		return true
	}
	return strings.HasPrefix(p, dir+"/")
}
