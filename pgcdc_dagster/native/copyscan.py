"""The compiled framing and field walk of binary COPY buffers, called through ctypes.

:func:`library` returns the loaded library, or None when the numpy code must run:
``PGCDC_NATIVE=off``, or the library could not be built or loaded (said once, at INFO).
Each call handles a whole buffer or batch.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pgcdc_dagster.native.build import BuildError, build

log = logging.getLogger(__name__)

ENV = "PGCDC_NATIVE"
MAX_COLUMNS = 32767
"""Field counts above Int16's range never match a row; the numpy code reports them."""

Ints = npt.NDArray[np.int64]
_P = ctypes.c_void_p
_I64 = ctypes.c_int64


@dataclass(frozen=True)
class CopyScan:
    """The loaded library's functions."""

    lib: ctypes.CDLL

    def frame_rows(self, data: npt.NDArray[np.uint8], pos: int, end: int, ncols: int
                   ) -> tuple[Ints, Ints, int]:
        """The row messages that follow each other from ``data[pos]`` up to ``end``: each
        tuple's start and end, and where the first message not taken starts."""
        if end > len(data) or pos < 0:
            raise ValueError(f"frame_rows: {pos}..{end} outside {len(data)} bytes")
        cap = max((end - pos) // (7 + 4 * ncols), 0) + 1
        starts = np.empty(cap, dtype=np.int64)
        ends = np.empty(cap, dtype=np.int64)
        stop = _I64(pos)
        n = self.lib.pgcdc_frame_rows(data.ctypes.data, pos, end, ncols, starts.ctypes.data,
                                      ends.ctypes.data, cap, ctypes.byref(stop))
        return starts[:n], ends[:n], stop.value  # views: the pages past n are never touched

    def walk_fields(self, data: npt.NDArray[np.uint8], row_start: Ints, row_end: Ints,
                    ncols: int) -> tuple[Ints, npt.NDArray[np.int32]] | None:
        """Per column (a row of each result), every row's value start and length (-1:
        NULL); None when a row is malformed."""
        n = len(row_start)
        row_start = np.ascontiguousarray(row_start, dtype=np.int64)
        row_end = np.ascontiguousarray(row_end, dtype=np.int64)
        starts = np.empty((ncols, n), dtype=np.int64)
        lengths = np.empty((ncols, n), dtype=np.int32)
        fault = self.lib.pgcdc_walk_fields(data.ctypes.data, len(data), row_start.ctypes.data,
                                           row_end.ctypes.data, n, ncols, starts.ctypes.data,
                                           lengths.ctypes.data)
        return None if fault else (starts, lengths)


    def numeric_unscaled(self, data: npt.NDArray[np.uint8], starts: Ints,
                         lengths: npt.NDArray[np.int32], scale: int,
                         pow10f: npt.NDArray[np.float64], limit: float) -> Ints | None:
        """NUMERIC values (binary) as signed unscaled int64 at ``scale`` (0 for NULL), or
        None when a value needs the numpy code's judgement (see ``copyscan.c``)."""
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        lengths = np.ascontiguousarray(lengths, dtype=np.int32)
        pow10f = np.ascontiguousarray(pow10f, dtype=np.float64)
        if len(pow10f) != 81:
            raise ValueError("numeric_unscaled: pow10f must hold 10.0 ** k for k in -40..40")
        out = np.empty(len(starts), dtype=np.int64)
        fault = self.lib.pgcdc_numeric_unscaled(data.ctypes.data, starts.ctypes.data,
                                                lengths.ctypes.data, len(starts), scale,
                                                pow10f.ctypes.data, limit, out.ctypes.data)
        return None if fault else out


    def zoned_strings(self, micros: Ints, null: npt.NDArray[np.bool_] | None, width: int,
                      itemsize: int) -> npt.NDArray[np.uint8]:
        """``YYYY-MM-DDTHH:MM:SS[.f{width}]Z`` records (``itemsize`` bytes each) of the
        epoch microseconds that are not NULL, within years 1-9999 (the caller checks)."""
        if not 0 <= width <= 6 or itemsize != 20 + (width + 1 if width else 0):
            raise ValueError(f"zoned_strings: width {width}, record of {itemsize} bytes")
        micros = np.ascontiguousarray(micros, dtype=np.int64)
        count = len(micros) if null is None else len(micros) - int(np.count_nonzero(null))
        out = np.empty((count, itemsize), dtype=np.uint8)
        mask = None if null is None else np.ascontiguousarray(null, dtype=np.bool_)
        self.lib.pgcdc_zoned_strings(micros.ctypes.data,
                                     None if mask is None else mask.ctypes.data,
                                     len(micros), width, out.ctypes.data, itemsize)
        return out


    def strings(self, data: npt.NDArray[np.uint8], starts: Ints,
                lengths: npt.NDArray[np.int32], skip: int
                ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint8]] | None:
        """Arrow string offsets and bytes of the values (after their first ``skip`` bytes;
        NULL rows empty), or None when a value is shorter than ``skip`` or they pass 2 GiB
        (the numpy code names the fault)."""
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        lengths = np.ascontiguousarray(lengths, dtype=np.int32)
        n = len(starts)
        offsets = np.empty(n + 1, dtype=np.int32)
        total = self.lib.pgcdc_string_offsets(lengths.ctypes.data, n, skip, offsets.ctypes.data)
        if total < 0:
            return None
        values = np.empty(total, dtype=np.uint8)
        self.lib.pgcdc_string_bytes(data.ctypes.data, starts.ctypes.data, offsets.ctypes.data,
                                    n, skip, values.ctypes.data)
        return offsets, values


    def fixed_values(self, data: npt.NDArray[np.uint8], starts: Ints,
                     lengths: npt.NDArray[np.int32], dtype: np.dtype[np.generic]
                     ) -> npt.NDArray[np.generic] | None:
        """Big-endian numbers of ``dtype`` (1, 2, 4 or 8 bytes) in native order, 0 for
        NULL; None when a value has another width or the host is big-endian (the numpy
        code names the row)."""
        width = dtype.itemsize
        if sys.byteorder != "little" or width not in (1, 2, 4, 8):
            return None
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        lengths = np.ascontiguousarray(lengths, dtype=np.int32)
        out = np.empty(len(starts), dtype=dtype.newbyteorder("="))
        fault = self.lib.pgcdc_fixed_values(data.ctypes.data, starts.ctypes.data,
                                            lengths.ctypes.data, len(starts), width,
                                            out.ctypes.data)
        return None if fault else out


    def decimal_bytes(self, unscaled: Ints, null: npt.NDArray[np.bool_]
                      ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint8]]:
        """Arrow binary offsets and bytes of Kafka Connect Decimal values (each unscaled
        value's shortest big-endian two's complement; NULL rows empty)."""
        unscaled = np.ascontiguousarray(unscaled, dtype=np.int64)
        mask = np.ascontiguousarray(null, dtype=np.bool_)
        n = len(unscaled)
        if len(mask) != n:
            raise ValueError("decimal_bytes: values and NULL mask of different lengths")
        offsets = np.empty(n + 1, dtype=np.int32)
        out = np.empty(8 * n, dtype=np.uint8)
        self.lib.pgcdc_decimal_bytes(unscaled.ctypes.data, mask.ctypes.data, n,
                                     offsets.ctypes.data, out.ctypes.data)
        return offsets, out[:int(offsets[-1])]


def enabled() -> bool:
    """False when ``PGCDC_NATIVE=off`` forces the numpy code.

    Raises:
        ValueError: another value than ``on`` or ``off``.
    """
    value = os.environ.get(ENV, "on").strip().lower() or "on"
    if value not in ("on", "off"):
        raise ValueError(f"{ENV}={value!r}: expected 'on' (the default: the compiled loops "
                         "when they can be built) or 'off' (numpy only)")
    return value == "on"


def library() -> CopyScan | None:
    """The compiled loops, or None when the numpy code runs."""
    return _load() if enabled() else None


@functools.cache
def _load() -> CopyScan | None:
    try:
        lib = ctypes.CDLL(str(build()))
    except (BuildError, OSError) as exc:
        log.info("the snapshot reader's compiled loops are not available (%s); numpy runs "
                 "them (slower, same results)", exc)
        return None
    lib.pgcdc_frame_rows.restype = _I64
    lib.pgcdc_frame_rows.argtypes = [_P, _I64, _I64, ctypes.c_int32, _P, _P, _I64, _P]
    lib.pgcdc_walk_fields.restype = _I64
    lib.pgcdc_walk_fields.argtypes = [_P, _I64, _P, _P, _I64, ctypes.c_int32, _P, _P]
    lib.pgcdc_numeric_unscaled.restype = _I64
    lib.pgcdc_numeric_unscaled.argtypes = [_P, _P, _P, _I64, ctypes.c_int32, _P,
                                           ctypes.c_double, _P]
    lib.pgcdc_zoned_strings.restype = None
    lib.pgcdc_zoned_strings.argtypes = [_P, _P, _I64, ctypes.c_int32, _P, _I64]
    lib.pgcdc_string_offsets.restype = _I64
    lib.pgcdc_string_offsets.argtypes = [_P, _I64, ctypes.c_int32, _P]
    lib.pgcdc_string_bytes.restype = None
    lib.pgcdc_string_bytes.argtypes = [_P, _P, _P, _I64, ctypes.c_int32, _P]
    lib.pgcdc_fixed_values.restype = _I64
    lib.pgcdc_fixed_values.argtypes = [_P, _P, _P, _I64, ctypes.c_int32, _P]
    lib.pgcdc_decimal_bytes.restype = None
    lib.pgcdc_decimal_bytes.argtypes = [_P, _P, _I64, _P, _P]
    return CopyScan(lib)
