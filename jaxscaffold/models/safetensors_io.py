"""Streaming safetensors reading and writing without a full host copy of a checkpoint.

The format is an 8-byte little-endian header length, a JSON header mapping tensor names to
`{dtype, shape, data_offsets}`, then the raw bytes. We read row ranges of one tensor with
`os.pread` (no mmap: touched mmap pages would count towards resident memory for as long as
the file stays mapped), and write tensors one at a time. Our own reader also gives bf16 and
fp8 as `ml_dtypes`, which the `safetensors` numpy backend cannot.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Callable, Iterable

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class SafetensorsError(ValueError):
    """A malformed or inconsistent safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


def read_header(path: str) -> dict[str, TensorInfo]:
    """Name -> TensorInfo for every tensor of one .safetensors file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        size = os.fstat(f.fileno()).st_size
        if n > size - 8:
            raise SafetensorsError(f"{path}: header length {n} exceeds the file size {size}")
        try:
            header = json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise SafetensorsError(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the safetensors header is a JSON {type(header).__name__}, not an object")
    return {name: _tensor_info(path, name, meta, 8 + n, size)
            for name, meta in header.items() if name != "__metadata__"}


def _is_ints(value, count: int | None = None) -> bool:
    return (isinstance(value, list) and (count is None or len(value) == count)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value))


def _tensor_info(path: str, name: str, meta, data_start: int, size: int) -> TensorInfo:
    """One header entry, checked: a malformed one names the file and the tensor."""
    if not isinstance(meta, dict) or not {"dtype", "shape", "data_offsets"} <= meta.keys():
        raise SafetensorsError(f"{path}: tensor {name} needs dtype, shape and data_offsets in the header")
    if meta["dtype"] not in DTYPES:
        raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']!r}")
    if not _is_ints(meta["shape"]) or not _is_ints(meta["data_offsets"], 2):
        raise SafetensorsError(f"{path}: tensor {name} has a malformed shape or data_offsets "
                               f"({meta['shape']!r}, {meta['data_offsets']!r})")
    begin, end = meta["data_offsets"]
    info = TensorInfo(path, DTYPES[meta["dtype"]], tuple(meta["shape"]), data_start + begin, end - begin)
    expected = int(np.prod(info.shape, dtype=np.int64)) * info.dtype.itemsize
    if end < begin or expected != info.nbytes or data_start + end > size:
        raise SafetensorsError(f"{path}: tensor {name} has inconsistent offsets (file truncated?)")
    return info


def read_rows(info: TensorInfo, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows [start, stop) of a tensor's first axis, read with one pread (no mmap)."""
    shape = info.shape
    if not shape:
        start, stop, rows = 0, 1, 1
    else:
        stop = shape[0] if stop is None else stop
        rows = stop - start
    row_bytes = info.dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64)) if shape else info.dtype.itemsize
    fd = os.open(info.path, os.O_RDONLY)
    try:
        buf = bytearray(rows * row_bytes)
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = os.preadv(fd, [view[got:]], info.offset + start * row_bytes + got)
            if n == 0:
                raise SafetensorsError(f"{info.path}: unexpected end of file")
            got += n
    finally:
        os.close(fd)
    arr = np.frombuffer(buf, dtype=info.dtype)
    return arr.reshape((rows,) + shape[1:]) if shape else arr.reshape(())


def read_block(info: TensorInfo, rows: slice, cols: slice | None = None,
               chunk_bytes: int = 16 * 2**20) -> np.ndarray:
    """block = tensor[rows, cols] of a 1-D or 2-D tensor, read in row chunks of about
    `chunk_bytes` so a column slice never needs the whole row range on the host."""
    start, stop, _ = rows.indices(info.shape[0])
    if len(info.shape) == 1 or cols is None:
        return read_rows(info, start, stop)
    c0, c1, _ = cols.indices(info.shape[1])
    out = np.empty((stop - start, c1 - c0), info.dtype)
    step = max(1, chunk_bytes // max(1, info.shape[1] * info.dtype.itemsize))
    for r in range(start, stop, step):
        out[r - start: min(r + step, stop) - start] = read_rows(info, r, min(r + step, stop))[:, c0:c1]
    return out


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write: `produce()` returns, when its turn comes, its host array or an
    iterator of its row blocks in order (then only one block is on the host at a time)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def write_file(path: str, tensors: Iterable[TensorSpec], metadata: dict | None = None) -> None:
    """Writes tensors one at a time (only one is on the host at once), atomically."""
    tensors = list(tensors)
    header, offset = {}, 0
    for t in tensors:
        header[t.name] = {"dtype": DTYPE_NAMES[np.dtype(t.dtype)], "shape": list(t.shape),
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    header["__metadata__"] = {"format": "pt", **(metadata or {})}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((-len(blob)) % 8)  # data starts 8-byte aligned, as the reference writer does
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in tensors:
            _write_tensor(f, t)
    os.replace(tmp, path)


def _write_tensor(f, t: TensorSpec) -> None:
    produced = t.produce()
    if isinstance(produced, np.ndarray) or not hasattr(produced, "__next__"):
        produced = iter([np.asarray(produced)])
    shape, rows = tuple(t.shape), 0
    for block in produced:
        arr = np.ascontiguousarray(np.asarray(block).astype(t.dtype, copy=False))
        if arr.ndim != len(shape) or arr.shape[1:] != shape[1:]:
            raise SafetensorsError(f"{t.name}: produced shape {arr.shape}, declared {t.shape}")
        rows += arr.shape[0] if shape else 1
        arr.tofile(f)
        del arr, block  # the block's memory goes before the next is produced
    if rows != (shape[0] if shape else 1):
        raise SafetensorsError(f"{t.name}: produced shape with {rows} rows, declared {t.shape}")
