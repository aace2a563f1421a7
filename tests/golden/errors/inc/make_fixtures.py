"""Write the weight and input files that the run_* error cases read (python make_fixtures.py).

Every byte is spelled out here (.npy headers, zip entries, safetensors headers), with no
timestamps and no library whose output could change between versions, so the files come
out identical on any machine; tests/test_error_catalogue_runtime.py checks that the
checked-in files are exactly what ``build()`` makes.

The cases' model: ``output y = linear(x, 3)`` on ``x: f32[2, 4]`` reads ``y.weight`` [3, 4]
and ``y.bias`` [3]; the inputs' model reads ``ids: i32[2, 3]`` (vocabulary 10) and
``x: f32[2, 3, 4]``. Pickled payloads call ``print`` when unpickled: a case whose stdout
is not empty would show that irc unpickled it.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# protocol-2 pickle of print("irc unpickled this file"): harmless, and visible if it ever runs
PAYLOAD = b"\x80\x02cbuiltins\nprint\nq\x00X\x17\x00\x00\x00irc unpickled this fileq\x01\x85q\x02Rq\x03."
BAD_HEADER = b"{'descr': <f4, }\n"  # not a Python literal: <f4 is unquoted
BAD_NPY = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(BAD_HEADER)) + BAD_HEADER


def npy(descr: str, shape: tuple[int, ...], data: bytes) -> bytes:
    """A version 1.0 .npy file: magic, header length, the header dict padded to 64 bytes, data."""
    quoted = descr if descr.startswith("(") else f"'{descr}'"  # a sub-array dtype is a tuple literal
    header = f"{{'descr': {quoted}, 'fortran_order': False, 'shape': {shape!r}, }}"
    pad = -(10 + len(header) + 1) % 64
    text = (header + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


def f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def f64(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def i32(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}i", *values)


def tenths(n: int) -> list[float]:
    return [i / 10 for i in range(n)]


def zip_of(entries: dict[str, bytes]) -> bytes:
    """A stored (uncompressed) zip with fixed dates and attributes, entries in the given order."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.create_system = 3
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return buf.getvalue()


def safetensors(entries: dict[str, tuple[str, list[int], bytes]], header_extra: bytes = b"") -> bytes:
    """The .safetensors layout: u64 header length, JSON header, data in the given order."""
    header, data, at = {}, b"", 0
    for key, (dtype, shape, raw) in entries.items():
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        data, at = data + raw, at + len(raw)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode() + header_extra
    return struct.pack("<Q", len(text)) + text + data


WEIGHT = npy("<f4", (3, 4), f32(tenths(12)))
BIAS = npy("<f4", (3,), f32([0.0, 0.5, 1.0]))
GOOD_NPZ = zip_of({"y.weight.npy": WEIGHT, "y.bias.npy": BIAS})
GOOD_ST = {"y.bias": ("F32", [3], f32([0.0, 0.5, 1.0])), "y.weight": ("F32", [3, 4], f32(tenths(12)))}


def _flip_last_data_byte(archive: bytes, entry: bytes) -> bytes:
    at = archive.index(entry) + len(entry) - 1
    return archive[:at] + bytes([archive[at] ^ 0xFF]) + archive[at + 1:]


def _patch_entry(archive: bytes, *, flags: int | None = None, method: int | None = None) -> bytes:
    """Set the general-purpose flags or the compression method of every entry, in the local headers
    (offsets 6 and 8 after ``PK\\3\\4``) and the central directory (8 and 10 after ``PK\\1\\2``)."""
    out = bytearray(archive)
    for sig, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        i = out.find(sig)
        while i >= 0:
            if flags is not None:
                out[i + at:i + at + 2] = struct.pack("<H", flags)
            if method is not None:
                out[i + at + 2:i + at + 4] = struct.pack("<H", method)
            i = out.find(sig, i + 4)
    return bytes(out)


def weights() -> dict[str, bytes]:
    good_st = safetensors(GOOD_ST)
    n = struct.unpack("<Q", good_st[:8])[0]
    length, header, data = good_st[:8], good_st[8:8 + n], good_st[8 + n:]
    return {
        # key and array errors, found against the model
        "w_missing.npz": zip_of({"y.weight.npy": WEIGHT}),
        "w_extra.npz": zip_of({"y.weight.npy": WEIGHT, "y.bias.npy": BIAS, "y.scale.npy": BIAS}),
        "w_renamed.npz": zip_of({"y.w.npy": WEIGHT, "y.bias.npy": BIAS}),
        "w_shape.npz": zip_of({"y.weight.npy": npy("<f4", (4, 3), f32(tenths(12))), "y.bias.npy": BIAS}),
        "w_dtype.npz": zip_of({"y.weight.npy": npy("<f8", (3, 4), f64(tenths(12))), "y.bias.npy": BIAS}),
        # .npz files that are not, or no longer, archives of arrays
        "w_empty.npz": b"",
        "w_text.npz": b"y.weight = [[0.1, 0.2], [0.3, 0.4]]\n",
        "w_pickle.npz": PAYLOAD,
        "w_truncated.npz": GOOD_NPZ[: len(GOOD_NPZ) // 2],
        "w_torch.npz": zip_of({"archive/data.pkl": PAYLOAD, "archive/version": b"3\n"}),
        "w_not_array.npz": zip_of({"y.weight.txt": b"0.1 0.2 0.3\n", "y.bias.npy": BIAS}),
        "w_object.npz": zip_of({"y.weight.npy": npy("|O", (1,), PAYLOAD), "y.bias.npy": BIAS}),
        "w_bad_header.npz": zip_of({"y.weight.npy": BAD_NPY, "y.bias.npy": BIAS}),
        "w_short_entry.npz": zip_of({"y.weight.npy": WEIGHT[:-8], "y.bias.npy": BIAS}),
        "w_checksum.npz": _flip_last_data_byte(GOOD_NPZ, WEIGHT),
        # .safetensors damage, one kind per file
        "w_good.safetensors": good_st,
        "w_text.safetensors": b"these are not weights\n",
        "w_truncated.safetensors": good_st[:-20],
        "w_header_cut.safetensors": good_st[:40],
        "w_header_length.safetensors": struct.pack("<Q", 2**40) + header + data,
        "w_header_json.safetensors": length + header.replace(b'"', b"'", 2) + data,
        "w_header_utf8.safetensors": length + header.replace(b"y.w", b"\xff.w") + data,
        "w_header_entry.safetensors": safetensors({"y.bias": GOOD_ST["y.bias"],
                                                   "y.weight": ("F32", [3, 5], f32(tenths(12)))}),
        "w_fp8.safetensors": safetensors({"y.bias": GOOD_ST["y.bias"],
                                          "y.weight": ("F8_E4M3", [3, 4], bytes(12))}),
        "w_gap.safetensors": good_st + bytes(8),
        # malformed in ways that once ended in an internal error
        "w_dtype_list.safetensors": safetensors({"y.bias": GOOD_ST["y.bias"], "y.weight": (["F32"], [3, 4],
                                                                                          f32(tenths(12)))}),
        "w_long_number.safetensors": struct.pack("<Q", n + 5007) + header[:-1] + b',"x":' + b"9" * 5000 + b"}"
        + data,
        "w_encrypted.npz": _patch_entry(GOOD_NPZ, flags=1),
        "w_method99.npz": _patch_entry(GOOD_NPZ, method=99),
        "w_subarray.npz": zip_of({"y.weight.npy": npy("('<f4', (2,))", (3, 2), f32(tenths(12))),
                                  "y.bias.npy": BIAS}),
    }


def inputs() -> dict[str, bytes]:
    good = npy("<f4", (2, 3, 4), f32(tenths(24)))
    return {
        "x_good.npy": good,
        "x_shape.npy": npy("<f4", (3, 4), f32(tenths(12))),
        "x_int.npy": npy("<i4", (2, 3, 4), i32(list(range(24)))),
        "ids_float.npy": npy("<f4", (2, 3), f32(tenths(6))),
        "ids_range.npy": npy("<i4", (2, 3), i32([1, 2, 3, 4, 12, 5])),
        "x_object.npy": npy("|O", (1,), PAYLOAD),
        "x_text.npy": b"0.1, 0.2, 0.3\n",
        "x_pickle.npy": PAYLOAD,
        "x_truncated.npy": good[:-10],
        "x_bad_header.npy": BAD_NPY,
        "x_subarray.npy": npy("('<f4', (2,))", (2, 3, 2), f32(tenths(24))),
        "x_huge_shape.npy": npy("<f4", (2**40, 2**40, 0), b""),
    }


def build() -> dict[str, bytes]:
    return {**weights(), **inputs()}


def main() -> None:
    for name, data in build().items():
        (HERE / name).write_bytes(data)


if __name__ == "__main__":
    main()
