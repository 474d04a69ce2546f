// SPDX-License-Identifier: Apache-2.0

package session

import "fmt"

// Caller is who makes a request: for a unix-socket client, the uid, gid
// and supplementary groups the kernel recorded when it connected
// (SO_PEERCRED, SO_PEERGROUPS); for a loopback TCP client (which carried
// the daemon's token), TCP and the identity TCP callers are judged as
// (loaderd's --tcp-user). Sessions belong to their opener's owner: a uid
// on the unix socket, or the TCP principal; neither reaches the other's.
// A caller of unknown uid (-1) may open nothing.
type Caller struct {
	UID, GID int
	Groups   []uint32 // supplementary groups (SO_PEERGROUPS)
	TCP      bool     // came over loopback TCP: the TCP principal, whatever UID says
}

// owner is whom a session belongs to.
type owner struct {
	uid int
	tcp bool
}

func (c Caller) owner() owner { return owner{c.UID, c.TCP} }

// String names the owner for messages: "uid 1000", "the TCP principal (uid 65534)".
func (o owner) String() string {
	if o.tcp {
		return fmt.Sprintf("the TCP principal (uid %d)", o.uid)
	}
	return fmt.Sprintf("uid %d", o.uid)
}
