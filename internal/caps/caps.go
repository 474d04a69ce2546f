// SPDX-License-Identifier: Apache-2.0

// Package caps reads the calling thread's Linux capabilities (capget) and
// names them as the kernel's headers, setpriv(1) and systemd's
// CapabilityBoundingSet= do: CAP_SETUID, CAP_DAC_READ_SEARCH, ...
package caps

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Cap is one capability, by the kernel's number (unix.CAP_SETUID, ...).
type Cap uint

// names are the capabilities' names, by number, as <linux/capability.h>
// spells them.
var names = [...]string{
	unix.CAP_CHOWN: "CAP_CHOWN", unix.CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE", unix.CAP_DAC_READ_SEARCH: "CAP_DAC_READ_SEARCH",
	unix.CAP_FOWNER: "CAP_FOWNER", unix.CAP_FSETID: "CAP_FSETID", unix.CAP_KILL: "CAP_KILL", unix.CAP_SETGID: "CAP_SETGID",
	unix.CAP_SETUID: "CAP_SETUID", unix.CAP_SETPCAP: "CAP_SETPCAP", unix.CAP_LINUX_IMMUTABLE: "CAP_LINUX_IMMUTABLE",
	unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE", unix.CAP_NET_BROADCAST: "CAP_NET_BROADCAST", unix.CAP_NET_ADMIN: "CAP_NET_ADMIN",
	unix.CAP_NET_RAW: "CAP_NET_RAW", unix.CAP_IPC_LOCK: "CAP_IPC_LOCK", unix.CAP_IPC_OWNER: "CAP_IPC_OWNER",
	unix.CAP_SYS_MODULE: "CAP_SYS_MODULE", unix.CAP_SYS_RAWIO: "CAP_SYS_RAWIO", unix.CAP_SYS_CHROOT: "CAP_SYS_CHROOT",
	unix.CAP_SYS_PTRACE: "CAP_SYS_PTRACE", unix.CAP_SYS_PACCT: "CAP_SYS_PACCT", unix.CAP_SYS_ADMIN: "CAP_SYS_ADMIN",
	unix.CAP_SYS_BOOT: "CAP_SYS_BOOT", unix.CAP_SYS_NICE: "CAP_SYS_NICE", unix.CAP_SYS_RESOURCE: "CAP_SYS_RESOURCE",
	unix.CAP_SYS_TIME: "CAP_SYS_TIME", unix.CAP_SYS_TTY_CONFIG: "CAP_SYS_TTY_CONFIG", unix.CAP_MKNOD: "CAP_MKNOD",
	unix.CAP_LEASE: "CAP_LEASE", unix.CAP_AUDIT_WRITE: "CAP_AUDIT_WRITE", unix.CAP_AUDIT_CONTROL: "CAP_AUDIT_CONTROL",
	unix.CAP_SETFCAP: "CAP_SETFCAP", unix.CAP_MAC_OVERRIDE: "CAP_MAC_OVERRIDE", unix.CAP_MAC_ADMIN: "CAP_MAC_ADMIN",
	unix.CAP_SYSLOG: "CAP_SYSLOG", unix.CAP_WAKE_ALARM: "CAP_WAKE_ALARM", unix.CAP_BLOCK_SUSPEND: "CAP_BLOCK_SUSPEND",
	unix.CAP_AUDIT_READ: "CAP_AUDIT_READ", unix.CAP_PERFMON: "CAP_PERFMON", unix.CAP_BPF: "CAP_BPF",
	unix.CAP_CHECKPOINT_RESTORE: "CAP_CHECKPOINT_RESTORE",
}

// String is the capability's name, "CAP_SETUID"; an unknown one is
// "CAP_<number>".
func (c Cap) String() string {
	if int(c) < len(names) && names[c] != "" {
		return names[c]
	}
	return fmt.Sprintf("CAP_%d", uint(c))
}

// Parse returns the capability a name stands for, with or without the
// CAP_ prefix, in any case ("cap_setuid", "SETUID").
func Parse(name string) (Cap, error) {
	n := strings.ToUpper(name)
	if !strings.HasPrefix(n, "CAP_") {
		n = "CAP_" + n
	}
	for i, s := range names {
		if s == n {
			return Cap(i), nil
		}
	}
	return 0, fmt.Errorf("caps: unknown capability %q", name)
}

// Set is a set of capabilities, bit i for capability i (the layout of
// /proc/PID/status's CapEff).
type Set uint64

// Has reports whether c is in s.
func (s Set) Has(c Cap) bool { return c < 64 && s&(1<<c) != 0 }

// With returns s with c added.
func (s Set) With(c Cap) Set { return s | 1<<c }

// Without returns s with c removed.
func (s Set) Without(c Cap) Set { return s &^ (1 << c) }

// Caps are the capabilities of s, lowest number first.
func (s Set) Caps() []Cap {
	var out []Cap
	for c := Cap(0); c < 64; c++ {
		if s.Has(c) {
			out = append(out, c)
		}
	}
	return out
}

// String lists s's names separated by spaces, as CapabilityBoundingSet=
// takes them.
func (s Set) String() string {
	var b []string
	for _, c := range s.Caps() {
		b = append(b, c.String())
	}
	return strings.Join(b, " ")
}

// Sets are a thread's three capability sets.
type Sets struct {
	Effective, Permitted, Inheritable Set
}

// Current returns the calling thread's capability sets (capget; every
// thread of a process that never changed them has the same).
func Current() (Sets, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return Sets{}, fmt.Errorf("caps: capget: %w", err)
	}
	join := func(lo, hi uint32) Set { return Set(lo) | Set(hi)<<32 }
	return Sets{
		Effective:   join(data[0].Effective, data[1].Effective),
		Permitted:   join(data[0].Permitted, data[1].Permitted),
		Inheritable: join(data[0].Inheritable, data[1].Inheritable),
	}, nil
}
