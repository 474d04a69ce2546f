// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/cuda/standin"
)

// standinUUID is the UUID the stand-in gives physical GPU i.
func standinUUID(i int) string {
	var u [16]byte
	copy(u[:], "STANDIN-GPU-000")
	u[15] = "0123456789abcdef"[i]
	return FormatUUID(u)
}

// TestStandinFound: discovery finds the stand-in through
// NVFEED_CUDA_LIB_DIR and says so; its runtime reports a driver (it has no
// /proc file: the runtime decides); the devices are listed with the
// UUIDs of the GPUs CUDA_VISIBLE_DEVICES puts at each ordinal.
func TestStandinFound(t *testing.T) {
	if !standin.InChild(t, "CUDA_VISIBLE_DEVICES=1,0") {
		return
	}
	dir := os.Getenv(EnvLibDir)
	rt, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if rt.Found.From != EnvLibDir || rt.Found.Path != filepath.Join(dir, "libcudart.so.13") {
		t.Errorf("runtime found %s, want %s/libcudart.so.13 by %s", rt.Found, dir, EnvLibDir)
	}
	if d, err := rt.DriverVersion(); err != nil || d != 13000 {
		t.Errorf("driver %d %v, want 13000", d, err)
	}
	devs, err := rt.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].UUID != standinUUID(1) || devs[1].UUID != standinUUID(0) || devs[0].PCIBusID != "0000:11:00.0" {
		t.Errorf("devices %+v, want GPU 1 then GPU 0", devs)
	}
	if i, ok := FindDevice(devs, standinUUID(0)); !ok || i != 1 {
		t.Errorf("GPU 0's UUID is ordinal %d (%v) here, want 1", i, ok)
	}
	c := ProbeCuFile(SearchFromEnv())
	if c.Err != nil || c.Found.From != EnvLibDir || c.Found.Path != filepath.Join(dir, "libcufile.so.0") || c.Version == 0 {
		t.Errorf("cuFile %+v", c)
	}
}

// TestStandinThreadWork: on a Thread, device memory (made
// gpuDirectRDMACapable where attribute 110 says so), host registration,
// a stream, a blocking event and a copy: the bytes land at the device
// address, nothing spins, and everything is released.
func TestStandinThreadWork(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	rt, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	th, err := rt.NewThread(1)
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close()
	host, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(host)
	for i := range host {
		host[i] = byte(i * 7)
	}
	var got []byte
	err = th.Do(func() error {
		drv, err := rt.Driver()
		if err != nil {
			return err
		}
		m, err := drv.Alloc(1, 3<<20)
		if err != nil {
			return err
		}
		defer func() {
			if err := m.Free(); err != nil {
				t.Error(err)
			}
		}()
		if !m.RDMACapable || m.Size != 4<<20 {
			t.Errorf("memory %+v: want gpuDirectRDMACapable (attribute 110 is 1), 4 MiB (the granularity)", m)
		}
		if err := rt.HostRegister(host); err != nil {
			return err
		}
		defer func() {
			if err := rt.HostUnregister(host); err != nil {
				t.Error(err)
			}
		}()
		s, err := rt.NewStream()
		if err != nil {
			return err
		}
		defer rt.DestroyStream(s)
		ev, err := rt.NewEvent()
		if err != nil {
			return err
		}
		defer rt.DestroyEvent(ev)
		if err := rt.CopyToDevice(m.Ptr+4096, host, s); err != nil {
			return err
		}
		if err := rt.Record(ev, s); err != nil {
			return err
		}
		if err := rt.Wait(ev); err != nil {
			return err
		}
		got = bytes.Clone(deviceBytes(m.Ptr+4096, len(host)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, host) {
		t.Errorf("the device bytes differ from the host's")
	}
	reports, err := standin.ReadReports(os.Getenv(standin.ReportVar))
	if err != nil || len(reports) != 1 {
		t.Fatalf("reports %v %v", reports, err)
	}
	if r := reports[0]; r.SpinningEvents != 0 || r.Copies == 0 {
		t.Errorf("report %+v: want copies and no event waited on spinning", r)
	}
}

// TestStandinReadErrno: a cuFileRead that returns -1 reports the errno it
// set (read on the same thread), as a *FileError that is the errno.
func TestStandinReadErrno(t *testing.T) {
	if os.Getenv(standin.ChildVar) == "" {
		// the file below is in the temporary directory: cuFile needs a
		// udev record of its device, as real cuFile does
		standin.ProvideCuFileHost(t, false, os.TempDir())
	}
	if !standin.InChild(t, standin.FailVar+"=read-eio") {
		return
	}
	rt, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	lib, err := LoadCuFile("")
	if err != nil {
		t.Fatal(err)
	}
	th, err := rt.NewThread(0)
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close()
	f, err := os.CreateTemp(t.TempDir(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(bytes.Repeat([]byte{1}, 8192))
	var readErr error
	err = th.Do(func() error {
		if err := lib.Open(); err != nil {
			return err
		}
		drv, err := rt.Driver()
		if err != nil {
			return err
		}
		m, err := drv.Alloc(0, 1)
		if err != nil {
			return err
		}
		defer m.Free()
		if err := lib.RegisterBuffer(m.Ptr, m.Size); err != nil {
			return err
		}
		defer lib.DeregisterBuffer(m.Ptr)
		h, err := lib.RegisterFile(int(f.Fd()))
		if err != nil {
			return err
		}
		defer lib.DeregisterFile(h)
		_, readErr = lib.Read(h, m.Ptr, 8192, 0, 0)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var fe *FileError
	if !errors.As(readErr, &fe) || !errors.Is(readErr, syscall.EIO) || fe.Code != -int32(syscall.EIO) || !strings.Contains(readErr.Error(), "input/output error") {
		t.Errorf("read with an injected EIO: %v, want a FileError that is EIO", readErr)
	}
}

// deviceBytes is n bytes at a device address of the stand-in, whose
// device memory is mapped in this process.
func deviceBytes(p uintptr, n int) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}

// TestStandinNoRDMAFlagWhereUnsupported: where the device does not
// support gpuDirectRDMACapable with VMM (attribute 110 is 0), memory is
// made without it.
func TestStandinNoRDMAFlagWhereUnsupported(t *testing.T) {
	if !standin.InChild(t, standin.RDMAVar+"=0") {
		return
	}
	rt, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	th, err := rt.NewThread(0)
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close()
	err = th.Do(func() error {
		drv, err := rt.Driver()
		if err != nil {
			return err
		}
		if v, err := drv.Attribute(0, attrGPUDirectRDMAWithVMM); err != nil || v != 0 {
			t.Errorf("attribute 110: %d %v, want 0", v, err)
		}
		m, err := drv.Alloc(0, 1)
		if err != nil {
			return err
		}
		if m.RDMACapable {
			t.Errorf("memory made gpuDirectRDMACapable where the device does not support it")
		}
		return m.Free()
	})
	if err != nil {
		t.Fatal(err)
	}
}
