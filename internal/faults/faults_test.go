// SPDX-License-Identifier: Apache-2.0

package faults

import "testing"

func TestFaults(t *testing.T) {
	var none *Faults
	if _, ok := none.Inject(FileRead, "a"); ok {
		t.Error("a nil *Faults injected a fault")
	}
	f := (&Faults{}).Add(Rule{Op: FileRead, Path: "a", Short: true, Times: 2}).Add(Rule{Op: DeviceRead | FileRead, Err: ErrInjected})
	for i, want := range []struct {
		op    Op
		path  string
		short bool
		err   error
	}{{FileRead, "a", true, nil}, {DeviceRead, "a", false, ErrInjected}, {FileRead, "a", true, nil}, {FileRead, "a", false, ErrInjected}, {FileRead, "b", false, ErrInjected}} {
		ft, ok := f.Inject(want.op, want.path)
		if !ok || ft.Short != want.short || ft.Err != want.err {
			t.Errorf("read %d (%v %s): %+v %v, want short %v err %v", i, want.op, want.path, ft, ok, want.short, want.err)
		}
	}
	if f.Hits() != 5 {
		t.Errorf("hits %d, want 5", f.Hits())
	}
	if n, err := (Fault{Short: true}).Apply(16384, nil, 4096); n != 8192 || err != nil {
		t.Errorf("short device read: %d %v", n, err)
	}
	if n, err := (Fault{Short: true}).Apply(1001, nil, 1); n != 500 || err != nil {
		t.Errorf("short file read: %d %v", n, err)
	}
	if n, err := (Fault{Err: ErrInjected}).Apply(4096, nil, 1); n != 0 || err != ErrInjected {
		t.Errorf("failed read: %d %v", n, err)
	}
}

func TestInstall(t *testing.T) {
	if _, ok := Inject(FileRead, "a"); ok {
		t.Fatal("a fault injected with nothing installed")
	}
	f := (&Faults{}).Add(Rule{Op: FileRead, Path: "a", Err: ErrInjected})
	restore := Install(f)
	if ft, ok := Inject(FileRead, "a"); !ok || ft.Err != ErrInjected {
		t.Errorf("installed: %+v %v", ft, ok)
	}
	restore()
	if _, ok := Inject(FileRead, "a"); ok || f.Hits() != 1 {
		t.Errorf("after restore: injected %v, hits %d", ok, f.Hits())
	}
}
