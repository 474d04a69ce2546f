// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// Trust names the users whose writes a raw read may rely on; root is always trusted.
// A sample is read raw only while no one else can change its blocks by any path or ioctl.
//
// An immutable inode is trusted. Otherwise all of these must hold:
//
//   - its owner is a trusted uid;
//   - no group write unless its group is trusted, and no write for others;
//   - no ACL entry lets an untrusted uid or gid write, through the mask.
//
// Either way no one may hold it open for writing; a read lease tells.
// Any change of owner, mode, ACL or flags moves the change time and makes the sample stale.
type Trust struct {
	UIDs []uint32 // trusted uids besides 0
	GIDs []uint32 // trusted gids; none by default
}

// ErrUntrusted is wrapped by the reason a sample may be written by a user
// outside the Trust: such a sample is read through the filesystem.
var ErrUntrusted = errors.New("writable by an untrusted user")

func (t Trust) uid(u uint32) bool { return u == 0 || slices.Contains(t.UIDs, u) }
func (t Trust) gid(g uint32) bool { return slices.Contains(t.GIDs, g) }

// aclXattr is the extended attribute holding a file's access ACL.
const aclXattr = "system.posix_acl_access"

// Check judges the file open at fd (see Trust): nil when only trusted
// users may change its blocks, else an error wrapping ErrUntrusted that
// says who may, or the error that kept it from being judged. A trusted
// file keeps a read lease on fd's open file (see writers): close fd
// promptly.
func (t Trust) Check(fd int) error {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_SYNC_AS_STAT, unix.STATX_BASIC_STATS, &st); err != nil {
		return fmt.Errorf("fresh: statx: %w", err)
	}
	return t.checkStat(fd, &st)
}

// checkStat is Check of the file open at fd, whose statx is st.
func (t Trust) checkStat(fd int, st *unix.Statx_t) error {
	if st.Attributes_mask&unix.STATX_ATTR_IMMUTABLE == 0 || st.Attributes&unix.STATX_ATTR_IMMUTABLE == 0 {
		var acl []byte
		// The mode's group bits are the ACL's mask (or its group entry
		// where it has no mask), which bounds every named and group
		// entry: without group write there, no ACL entry lets anyone but
		// the owner write, and its xattr need not be read.
		if st.Mode&0o020 != 0 {
			var err error
			if acl, err = fileACL(fd); err != nil {
				return err
			}
		}
		if err := t.judge(st.Uid, st.Gid, uint32(st.Mode), acl); err != nil {
			return err
		}
	}
	return writers(fd)
}

// fileACL returns the access ACL xattr of the file open at fd, nil when
// it has none.
func fileACL(fd int) ([]byte, error) {
	var buf [512]byte
	n, err := unix.Fgetxattr(fd, aclXattr, buf[:])
	switch {
	case err == nil:
		return buf[:n], nil
	case errors.Is(err, unix.ERANGE):
		big := make([]byte, 64<<10)
		if n, err = unix.Fgetxattr(fd, aclXattr, big); err != nil {
			return nil, fmt.Errorf("fresh: %s: %w", aclXattr, err)
		}
		return big[:n], nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP):
		return nil, nil
	default:
		return nil, fmt.Errorf("fresh: %s: %w", aclXattr, err)
	}
}

// writers fails when anyone holds the file open for writing: a read
// lease, which the kernel refuses then (EAGAIN). The lease is not let go
// by a call of its own: it goes with the descriptor, which the caller
// closes at once (a writer's open meanwhile waits only that long). A
// descriptor opened for writing before the file became trusted would
// otherwise still write, truncate or move its blocks.
func writers(fd int) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("fresh: %w: open for writing", ErrUntrusted)
		}
		return fmt.Errorf("fresh: read lease: %w", err)
	}
	return nil
}

// judge applies the ownership, mode and ACL rules (see Trust) to a file
// of owner uid, group gid, mode and access ACL acl (its xattr's bytes;
// nil: none).
func (t Trust) judge(uid, gid, mode uint32, acl []byte) error {
	if !t.uid(uid) {
		return fmt.Errorf("fresh: %w: owned by uid %d", ErrUntrusted, uid)
	}
	if mode&0o002 != 0 {
		return fmt.Errorf("fresh: %w: writable by others", ErrUntrusted)
	}
	if acl == nil {
		if mode&0o020 != 0 && !t.gid(gid) {
			return fmt.Errorf("fresh: %w: writable by group %d", ErrUntrusted, gid)
		}
		return nil
	}
	entries, err := ParseACL(acl)
	if err != nil {
		return fmt.Errorf("fresh: %s: %w", aclXattr, err)
	}
	mask := uint16(7) // without a mask entry, named entries cannot exist
	for _, e := range entries {
		if e.Tag == ACLMask {
			mask = e.Perm
		}
	}
	for _, e := range entries {
		if e.Perm&mask&ACLWrite == 0 {
			continue
		}
		switch {
		case e.Tag == ACLUser && !t.uid(e.ID):
			return fmt.Errorf("fresh: %w: ACL lets uid %d write", ErrUntrusted, e.ID)
		case e.Tag == ACLGroup && !t.gid(e.ID):
			return fmt.Errorf("fresh: %w: ACL lets group %d write", ErrUntrusted, e.ID)
		case e.Tag == ACLGroupObj && !t.gid(gid):
			return fmt.Errorf("fresh: %w: writable by group %d", ErrUntrusted, gid)
		}
	}
	return nil
}

// ACL entry tags (linux/posix_acl_xattr.h) and the write permission.
const (
	ACLUserObj  = 0x01
	ACLUser     = 0x02
	ACLGroupObj = 0x04
	ACLGroup    = 0x08
	ACLMask     = 0x10
	ACLOther    = 0x20
	ACLWrite    = 0x02
)

// ACLEntry is one entry of a POSIX ACL: its tag, permission bits (read
// 4, write 2, execute 1) and, for ACLUser and ACLGroup, the uid or gid.
type ACLEntry struct {
	Tag, Perm uint16
	ID        uint32
}

// ErrACL is wrapped by ParseACL's errors.
var ErrACL = errors.New("malformed POSIX ACL")

// aclVersion is the version field every ACL xattr starts with.
const aclVersion = 2

// ParseACL decodes a system.posix_acl_access value as the kernel stores
// it: a little-endian version 2, then 8-byte entries (tag, permission,
// id). It refuses (ErrACL) another version, a ragged length, an unknown
// tag or permission bits, and an ACL without exactly one owner, group
// and other entry, or with named entries and no mask.
func ParseACL(b []byte) ([]ACLEntry, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		return nil, fmt.Errorf("%w: %d bytes", ErrACL, len(b))
	}
	if v := binary.LittleEndian.Uint32(b); v != aclVersion {
		return nil, fmt.Errorf("%w: version %d", ErrACL, v)
	}
	var out []ACLEntry
	var seen [0x21]int
	for p := 4; p < len(b); p += 8 {
		e := ACLEntry{Tag: binary.LittleEndian.Uint16(b[p:]), Perm: binary.LittleEndian.Uint16(b[p+2:]), ID: binary.LittleEndian.Uint32(b[p+4:])}
		switch e.Tag {
		case ACLUserObj, ACLUser, ACLGroupObj, ACLGroup, ACLMask, ACLOther:
		default:
			return nil, fmt.Errorf("%w: entry %d: tag %#x", ErrACL, len(out), e.Tag)
		}
		if e.Perm&^7 != 0 {
			return nil, fmt.Errorf("%w: entry %d: permission %#x", ErrACL, len(out), e.Perm)
		}
		seen[e.Tag]++
		out = append(out, e)
	}
	if seen[ACLUserObj] != 1 || seen[ACLGroupObj] != 1 || seen[ACLOther] != 1 || seen[ACLMask] > 1 {
		return nil, fmt.Errorf("%w: want one owner, group and other entry and at most one mask", ErrACL)
	}
	if seen[ACLUser]+seen[ACLGroup] > 0 && seen[ACLMask] == 0 {
		return nil, fmt.Errorf("%w: named entries without a mask", ErrACL)
	}
	return out, nil
}
