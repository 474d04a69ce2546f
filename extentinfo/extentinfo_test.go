// SPDX-License-Identifier: Apache-2.0

package extentinfo

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

func TestFlagString(t *testing.T) {
	tests := []struct {
		flags uint32
		want  string
	}{
		{0, ""},
		{FlagLast, "last"},
		{FlagLast | FlagNotAligned | FlagDataInline, "last,not_aligned,inline"},
		{FlagUnwritten | FlagShared | 0x10000, "unwritten,shared,0x10000"},
	}
	for _, tt := range tests {
		if got := FlagString(tt.flags); got != tt.want {
			t.Errorf("FlagString(%#x) = %q, want %q", tt.flags, got, tt.want)
		}
	}
}

func TestParseFSUUID(t *testing.T) {
	uuid := []byte{0x0c, 0x07, 0xb0, 0xd4, 0x2d, 0xbd, 0x44, 0x6c, 0x9a, 0x8f, 0xe7, 0xec, 0xde, 0x89, 0x57, 0x4f}
	const want = "0c07b0d4-2dbd-446c-9a8f-e7ecde89574f"
	ext4 := make([]byte, 2048)
	binary.LittleEndian.PutUint16(ext4[1024+0x38:], 0xEF53)
	copy(ext4[1024+0x68:], uuid)
	xfs := make([]byte, 2048)
	copy(xfs, "XFSB")
	copy(xfs[32:], uuid)
	tests := []struct {
		name   string
		sb     []byte
		fstype string
		want   string
	}{
		{"ext4", ext4, "ext4", want},
		{"xfs", xfs, "xfs", want},
		{"ext4 bad magic", xfs, "ext4", ""},
		{"xfs bad magic", ext4, "xfs", ""},
		{"short", ext4[:100], "ext4", ""},
		{"other fs", ext4, "btrfs", ""},
	}
	for _, tt := range tests {
		if got := ParseFSUUID(tt.sb, tt.fstype); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestResolvePartition puts ext4 in a partition starting at 1 MiB of a
// loop device and checks the device, disk and partition start, and that
// FIEMAP's offsets are relative to the partition.
func TestResolvePartition(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "needs root for loop devices (euid %d)", os.Geteuid())
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	const start, sectors = 2048, 2048 * 63
	f.Truncate((start + sectors) * 512)
	mbr := make([]byte, 512)
	e := mbr[446:]
	e[4] = 0x83
	binary.LittleEndian.PutUint32(e[8:], start)
	binary.LittleEndian.PutUint32(e[12:], sectors)
	mbr[510], mbr[511] = 0x55, 0xAA
	f.WriteAt(mbr, 0)
	f.Close()
	out, err := exec.Command("losetup", "--find", "--show", "--partscan", "--direct-io=on", img).CombinedOutput()
	if err != nil {
		testenv.SkipPrivileged(t, "no loop device: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", loop).Run()
	part := loop + "p1"
	for i := 0; i < 50; i++ {
		if _, err := os.Stat(part); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", part).CombinedOutput(); err != nil {
		// Not a privilege: some kernels and containers never scan loop
		// devices for partitions (no sysfs entry, no node), root or not.
		t.Skipf("kernel made no partition device %s for the loop device (no partition scanning here): %v: %s", part, err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if out, err := exec.Command("mount", part, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	defer exec.Command("umount", mnt).Run()
	data := []byte(strings.Repeat("partition-test!\n", 1024))
	os.WriteFile(filepath.Join(mnt, "f"), data, 0o644)

	d, err := ResolveDevice(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if d.Path != part || d.Disk != loop || d.PartitionStart != start*512 || d.FSType != "ext4" || d.FSUUID == "" || d.LogicalBlockSize != 512 {
		t.Fatalf("device = %+v, want %s on %s at %d", d, part, loop, start*512)
	}
	ff, err := os.Open(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer ff.Close()
	var m Mapper
	exts, err := m.Extents(ff)
	if err != nil || len(exts) != 1 {
		t.Fatalf("extents %v, %v", exts, err)
	}
	exec.Command("sync").Run()
	// The same bytes at physical on the partition and at start+physical on the disk.
	for _, c := range []struct {
		dev string
		off int64
	}{{part, int64(exts[0].Physical)}, {loop, int64(d.PartitionStart + exts[0].Physical)}} {
		dv, err := os.Open(c.dev)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(data))
		_, err = dv.ReadAt(got, c.off)
		dv.Close()
		if err != nil || string(got) != string(data) {
			t.Errorf("%s at %d: bytes differ from the file (%v)", c.dev, c.off, err)
		}
	}
}

// TestSysfsPartition resolves a partition through a sysfs tree laid out as
// the kernel lays out an NVMe namespace and its partition.
func TestSysfsPartition(t *testing.T) {
	sys := t.TempDir()
	disk := filepath.Join(sys, "devices/pci0000:00/nvme/nvme0/nvme0n1")
	part := filepath.Join(disk, "nvme0n1p2")
	files := map[string]string{
		disk + "/uevent":                   "MAJOR=259\nMINOR=0\nDEVNAME=nvme0n1\nDEVTYPE=disk\n",
		disk + "/queue/logical_block_size": "4096\n",
		part + "/uevent":                   "MAJOR=259\nMINOR=2\nDEVNAME=nvme0n1p2\nDEVTYPE=partition\nPARTN=2\n",
		part + "/partition":                "2\n",
		part + "/start":                    "1050624\n",
	}
	for p, c := range files {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(sys, "dev/block"), 0o755)
	if err := os.Symlink("../../devices/pci0000:00/nvme/nvme0/nvme0n1/nvme0n1p2", filepath.Join(sys, "dev/block/259:2")); err != nil {
		t.Fatal(err)
	}
	d := Device{Major: 259, Minor: 2}
	if err := d.fillFromSysfs(sys); err != nil {
		t.Fatal(err)
	}
	want := Device{Major: 259, Minor: 2, Path: "/dev/nvme0n1p2", Disk: "/dev/nvme0n1", PartitionStart: 1050624 * 512, LogicalBlockSize: 4096}
	if d != want {
		t.Errorf("got %+v, want %+v", d, want)
	}
	d = Device{Major: 8, Minor: 1}
	if err := d.fillFromSysfs(sys); err == nil {
		t.Error("missing device: no error")
	}
}

func TestResolveRefuses(t *testing.T) {
	// /proc has no block device and is no supported filesystem.
	if _, err := ResolveDevice("/proc"); err == nil || !strings.Contains(err.Error(), "proc") {
		t.Errorf("err = %v, want refusal naming proc", err)
	}
}
