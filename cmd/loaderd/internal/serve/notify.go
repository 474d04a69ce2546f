// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// notifier tells systemd the daemon's state for a Type=notify unit, per sd_notify(3).
// It sends READY=1, RELOADING=1 and STOPPING=1 with STATUS= lines to $NOTIFY_SOCKET.
// A name starting with '@' is abstract. Without NOTIFY_SOCKET it does nothing.
type notifier struct {
	addr string
}

// send writes one state change, e.g. "READY=1\nSTATUS=serving".
func (n notifier) send(state string) error {
	if n.addr == "" {
		return nil
	}
	if !strings.HasPrefix(n.addr, "/") && !strings.HasPrefix(n.addr, "@") {
		return fmt.Errorf("serve: NOTIFY_SOCKET %q: want a path or an abstract name (@...)", n.addr)
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: n.addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("serve: NOTIFY_SOCKET %s: %w", n.addr, err)
	}
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("serve: NOTIFY_SOCKET %s: %w", n.addr, err)
	}
	return nil
}

// reloading is the RELOADING=1 message, with the CLOCK_MONOTONIC time
// systemd asks it to carry.
func reloading() string {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d\nSTATUS=reloading the datasets' maps", ts.Nano()/1000)
}
