# SPDX-License-Identifier: Apache-2.0
"""Writes the .npy files of npy's tests and numpy's verdict on each.

Run from this directory with the project's virtual environment:
    ../../../.venv/bin/python gen.py
Good files are written by np.save; the others by hand where numpy would
not write them. numpy.json records, for each file, what np.load and
numpy.lib.format make of it: dtype, shape, fortran_order and data offset,
or numpy's error; "np_save" says np.save wrote it; "want" is the npy
package's sentinel for files it refuses.
"""
import io
import json
import os
import struct

import numpy as np
from numpy.lib import format as npf

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = os.path.join(HERE, "files")


def raw(name, header, data=b"", version=(1, 0), magic=b"\x93NUMPY"):
    h = header.encode("latin1")
    size = struct.pack("<H" if version[0] == 1 else "<I", len(h))
    with open(os.path.join(FILES, name), "wb") as f:
        f.write(magic + bytes(version) + size + h + data)


def padded(d):
    n = 10 + len(d) + 1
    return d + " " * (-n % 64) + "\n"


def save(name, a, **kw):
    saved.add(name)
    with open(os.path.join(FILES, name), "wb") as f:
        np.save(f, a, **kw)


def write_version(name, a, version):
    with open(os.path.join(FILES, name), "wb") as f:
        npf.write_array(f, a, version=version)


want = {}
saved = set()
os.makedirs(FILES, exist_ok=True)
for old in os.listdir(FILES):
    os.remove(os.path.join(FILES, old))

# np.save of every supported type, and of shapes that matter.
for t in ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]:
    save(f"{t}.npy", (np.arange(5) % 2).astype(t))
save("f4_2x3.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
save("scalar.npy", np.array(7, dtype=np.int32))
save("empty_0x3.npy", np.zeros((0, 3), dtype=np.float32))
save("empty_3x0.npy", np.zeros((3, 0), dtype=np.uint16))
save("long_axis.npy", np.zeros(12_345, dtype=np.uint8))
save("rank32.npy", np.zeros((1,) * 31 + (2,), dtype=np.int8))
save("fortran_2x3.npy", np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)))
want["fortran_2x3.npy"] = "ErrFortran"

# Headers numpy reads but does not write this way.
raw("dq_keys_reordered.npy", padded('{"shape": (2,), "fortran_order": False, "descr": "<i4"}'), struct.pack("<2i", 5, 6))
raw("no_trailing_comma.npy", padded("{'descr': '<i2', 'fortran_order': False, 'shape': (2, 1)}"), struct.pack("<2h", 5, 6))
raw("fortran_1x5.npy", padded("{'descr': '<i4', 'fortran_order': True, 'shape': (1, 5), }"), struct.pack("<5i", *range(5)))
raw("native_order.npy", padded("{'descr': '=i4', 'fortran_order': False, 'shape': (2,), }"), struct.pack("<2i", 5, 6))
raw("big_u1.npy", padded("{'descr': '>u1', 'fortran_order': False, 'shape': (2,), }"), b"\x01\x02")
raw("unaligned.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n", struct.pack("<2i", 5, 6))
raw("trailing_bytes.npy", padded("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }"), struct.pack("<3i", 5, 6, 7))
want["trailing_bytes.npy"] = "ErrSize"

# Refused: other versions, types and orders.
write_version("v2.npy", np.arange(3, dtype=np.int32), (2, 0))
want["v2.npy"] = "ErrVersion"
write_version("v3.npy", np.arange(3, dtype=np.int32), (3, 0))
want["v3.npy"] = "ErrVersion"
save("big_endian.npy", np.arange(3, dtype=">i4"))
want["big_endian.npy"] = "ErrBigEndian"
save("object.npy", np.array([1, "a", None], dtype=object), allow_pickle=True)
want["object.npy"] = "ErrObject"
save("structured.npy", np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]))
want["structured.npy"] = "ErrStructured"
save("void.npy", np.zeros(2, dtype="V8"))
want["void.npy"] = "ErrStructured"
save("unicode.npy", np.array(["ab", "c"]))
want["unicode.npy"] = "ErrDType"
save("bytes.npy", np.array([b"ab", b"c"]))
want["bytes.npy"] = "ErrDType"
save("datetime.npy", np.array(["2020-01-01"], dtype="M8[D]"))
want["datetime.npy"] = "ErrDType"
save("longdouble.npy", np.zeros(2, dtype=np.longdouble))
want["longdouble.npy"] = "ErrDType"
raw("short_data.npy", padded("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }"), struct.pack("<i", 5))
want["short_data.npy"] = "ErrSize"

# Malformed headers.
with open(os.path.join(FILES, "not_npy.npy"), "wb") as f:
    f.write(b"PK\x03\x04 a zip, not an array")
want["not_npy.npy"] = "ErrNotNpy"
raw("truncated_header.npy", "")
with open(os.path.join(FILES, "truncated_header.npy"), "wb") as f:
    f.write(b"\x93NUMPY\x01\x00\x80\x00{'descr': '<i4'")
want["truncated_header.npy"] = "ErrHeader"
raw("int_not_tuple.npy", padded("{'descr': '<i4', 'fortran_order': False, 'shape': (2), }"), struct.pack("<2i", 5, 6))
want["int_not_tuple.npy"] = "ErrHeader"
raw("extra_key.npy", padded("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), 'x': 1, }"), struct.pack("<2i", 5, 6))
want["extra_key.npy"] = "ErrHeader"
raw("missing_key.npy", padded("{'descr': '<i4', 'shape': (2,), }"), struct.pack("<2i", 5, 6))
want["missing_key.npy"] = "ErrHeader"
raw("negative_dim.npy", padded("{'descr': '<i4', 'fortran_order': False, 'shape': (-2,), }"))
want["negative_dim.npy"] = "ErrHeader"
raw("rank33.npy", padded("{'descr': '|u1', 'fortran_order': False, 'shape': (%s), }" % ", ".join(["1"] * 33)), b"\x00")
want["rank33.npy"] = "ErrHeader"
raw("fortran_int.npy", padded("{'descr': '<i4', 'fortran_order': 0, 'shape': (2,), }"), struct.pack("<2i", 5, 6))
want["fortran_int.npy"] = "ErrHeader"
raw("hex_dim.npy", padded("{'descr': '<i4', 'fortran_order': False, 'shape': (0x2,), }"), struct.pack("<2i", 5, 6))
want["hex_dim.npy"] = "ErrHeader"
raw("too_large.npy", padded("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"))
want["too_large.npy"] = "ErrHeader"
raw("bad_version.npy", padded("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }"), struct.pack("<2i", 5, 6), version=(1, 1))
want["bad_version.npy"] = "ErrVersion"

# numpy's verdict on each file.
verdict = {}
for name in sorted(os.listdir(FILES)):
    path = os.path.join(FILES, name)
    v = {"size": os.path.getsize(path)}
    try:
        with open(path, "rb") as f:
            major, minor = npf.read_magic(f)
            shape, fortran, dtype = npf._read_array_header(f, (major, minor), max_header_size=1 << 30)
            v.update(offset=f.tell(), shape=list(shape), fortran_order=fortran, descr=dtype.str)
        a = np.load(path, allow_pickle=True)
        v["loads"] = True
    except Exception as e:  # numpy refuses it
        v.update(loads=False, error=f"{type(e).__name__}: {e}"[:200])
    if name in want:
        v["want"] = want[name]
    v["np_save"] = name in saved
    verdict[name] = v
with open(os.path.join(HERE, "numpy.json"), "w") as f:
    json.dump({"numpy": np.__version__, "files": verdict}, f, indent=1, sort_keys=True)
    f.write("\n")
