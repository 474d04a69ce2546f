// SPDX-License-Identifier: Apache-2.0

package extentinfo

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Device describes the block device under a mounted filesystem.
type Device struct {
	Path             string // device node of the filesystem's device, e.g. /dev/nvme0n1p2
	Major, Minor     uint32 // its device number (st_dev of files on the filesystem)
	Disk             string // device node of the whole disk, e.g. /dev/nvme0n1
	PartitionStart   uint64 // byte offset of Path within Disk (0 when Path is a whole disk)
	LogicalBlockSize uint32 // the disk's logical block size in bytes
	FSType           string // filesystem type, from the statfs magic
	FSUUID           string // filesystem UUID from its superblock ("" when unreadable)
}

// Filesystem magic numbers from statfs(2) (linux/magic.h).
const (
	magicExt4     = 0xEF53
	magicXFS      = 0x58465342
	magicBtrfs    = 0x9123683E
	magicTmpfs    = 0x01021994
	magicRamfs    = 0x858458F6
	magicOverlay  = 0x794C7630
	magicFuse     = 0x65735546
	magicNFS      = 0x6969
	magicSMB2     = 0xFE534D42
	magicCIFS     = 0xFF534D42
	magicF2FS     = 0xF2F52010
	magicZFS      = 0x2FC12FC1
	magicCeph     = 0x00C36400
	magicSquashfs = 0x73717368
	magicProc     = 0x9FA0
	magicSysfs    = 0x62656572
	magicVFAT     = 0x4D44
	magicExFAT    = 0x2011BAB0
	magicNTFS     = 0x5346544E
	magic9P       = 0x01021997
)

var fsNames = map[int64]string{
	magicExt4: "ext4", magicXFS: "xfs", magicBtrfs: "btrfs", magicTmpfs: "tmpfs",
	magicRamfs: "ramfs", magicOverlay: "overlay", magicFuse: "fuse", magicNFS: "nfs",
	magicSMB2: "smb2", magicCIFS: "cifs", magicF2FS: "f2fs", magicZFS: "zfs",
	magicCeph: "ceph", magicSquashfs: "squashfs", magicProc: "proc", magicSysfs: "sysfs",
	magicVFAT: "vfat", magicExFAT: "exfat", magicNTFS: "ntfs", magic9P: "9p",
}

// rawCapable lists filesystems whose FIEMAP fe_physical is a byte offset on
// the single block device in st_dev. btrfs reports logical chunk addresses,
// network and virtual filesystems have no device, and the rest are untested.
var rawCapable = map[string]bool{"ext4": true, "xfs": true}

// FSType returns the filesystem type name of path from its statfs magic,
// or "unknown(0x…)".
func FSType(path string) (string, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return "", fmt.Errorf("extentinfo: statfs %s: %w", path, err)
	}
	return fsTypeName(int64(sfs.Type)), nil
}

func fsTypeName(magic int64) string {
	if n, ok := fsNames[magic&0xFFFFFFFF]; ok {
		return n
	}
	return fmt.Sprintf("unknown(0x%x)", uint32(magic))
}

// ResolveDevice finds the block device that holds the filesystem mounted at
// (or containing) path. It fails with ErrUnsupportedFS for filesystems whose
// FIEMAP addresses cannot be read from a block device (btrfs, tmpfs,
// overlay, fuse, network filesystems, …).
func ResolveDevice(path string) (Device, error) {
	fstype, err := FSType(path)
	if err != nil {
		return Device{}, err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, fmt.Errorf("extentinfo: stat %s: %w", path, err)
	}
	if !rawCapable[fstype] {
		return Device{}, fmt.Errorf("extentinfo: %s is on %s: %w (supported: ext4, xfs)", path, fstype, ErrUnsupportedFS)
	}
	d := Device{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev), FSType: fstype}
	if err := d.fillFromSysfs("/sys"); err != nil {
		return Device{}, fmt.Errorf("extentinfo: %s (%s, device %d:%d): %w", path, fstype, d.Major, d.Minor, err)
	}
	d.FSUUID = readFSUUID(d.Path, fstype)
	return d, nil
}

// fillFromSysfs fills Path, Disk, PartitionStart and LogicalBlockSize from
// SYSFS/dev/block/MAJ:MIN.
func (d *Device) fillFromSysfs(sysfs string) error {
	sys := fmt.Sprintf("%s/dev/block/%d:%d", sysfs, d.Major, d.Minor)
	real, err := filepath.EvalSymlinks(sys)
	if err != nil {
		return fmt.Errorf("%w: no block device in sysfs (%v)", ErrUnsupportedFS, err)
	}
	name, err := ueventDevname(real)
	if err != nil {
		return err
	}
	d.Path = "/dev/" + name
	diskDir := real
	if _, err := os.Stat(filepath.Join(real, "partition")); err == nil {
		start, err := readUint(filepath.Join(real, "start"))
		if err != nil {
			return err
		}
		d.PartitionStart = start * 512 // sysfs "start" is always in 512-byte sectors
		diskDir = filepath.Dir(real)
	}
	diskName, err := ueventDevname(diskDir)
	if err != nil {
		return err
	}
	d.Disk = "/dev/" + diskName
	lbs, err := readUint(filepath.Join(diskDir, "queue", "logical_block_size"))
	if err != nil {
		return err
	}
	d.LogicalBlockSize = uint32(lbs)
	return nil
}

func ueventDevname(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "uevent"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "DEVNAME="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s/uevent: no DEVNAME", dir)
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// readFSUUID reads the filesystem UUID from the superblock on dev. It
// returns "" when the device cannot be read (e.g. without permission).
func readFSUUID(dev, fstype string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	sb := make([]byte, 2048)
	if _, err := f.ReadAt(sb, 0); err != nil {
		return ""
	}
	return ParseFSUUID(sb, fstype)
}

// ParseFSUUID extracts the UUID from the first 2 KiB of a filesystem image
// of the given type, or returns "" when the superblock's magic is wrong.
func ParseFSUUID(sb []byte, fstype string) string {
	var u []byte
	switch fstype {
	case "ext4":
		// ext2/3/4 superblock at 1024: s_magic at +0x38, s_uuid at +0x68.
		if len(sb) < 1024+0x78 || binary.LittleEndian.Uint16(sb[1024+0x38:]) != magicExt4 {
			return ""
		}
		u = sb[1024+0x68 : 1024+0x78]
	case "xfs":
		// xfs superblock at 0: "XFSB", sb_uuid at +32.
		if len(sb) < 48 || !bytes.Equal(sb[:4], []byte("XFSB")) {
			return ""
		}
		u = sb[32:48]
	default:
		return ""
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
