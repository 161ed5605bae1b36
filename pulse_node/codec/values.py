"""Value transforms of the patch codec: what is sent for each changed element.

Two value codings, both exact on raw bits:

- ``planes`` (overwrite mode, and 8-byte dtypes): the new bits, split into byte planes; each
  plane is a symbol 0..255. Idempotent: applying twice gives the same result.
- ``delta`` (compact mode): the new bits as an exact integer difference of order-preserving
  keys (for floats: sign-magnitude mapped to a monotone unsigned integer), taken modulo
  2**width, so any bit pattern (NaN payloads, inf, -0, subnormals) round-trips. Real
  optimizer steps are mostly +-1 ulp, so the zigzagged delta is a tiny symbol. Only valid on
  the exact base.

The base weight's exponent class labels both value models and the position model: small
weights change more often and by more ulps.
"""

from __future__ import annotations

import numpy as np

from pulse_node.codec import kernels as K
from pulse_node.codec.entropy import gap_bins

#: float dtype -> (bit width, mantissa bits)
FLOAT_LAYOUT: dict[str, tuple[int, int]] = {"BF16": (16, 7), "F16": (16, 10), "F32": (32, 23), "F64": (64, 52)}
SIGNED_INTS = {"I64", "I32", "I16", "I8"}
#: value codings (recorded per tensor in the header)
PLANES, DELTA = 0, 1


def width_of(bits: np.ndarray) -> int:
    return bits.dtype.itemsize * 8


def exponent_labels(dtype: str, bits: np.ndarray) -> np.ndarray:
    """Exponent field of each float element (uint8); all zero for integer dtypes."""
    layout = FLOAT_LAYOUT.get(dtype)
    if layout is None or layout[0] == 64:
        return np.zeros(bits.shape, np.uint8)
    width, mant = layout
    mask = (1 << (width - 1 - mant)) - 1
    return ((bits >> mant) & mask).astype(np.uint8)


def _sign_bit(bits: np.ndarray) -> np.ndarray:
    return np.array(1 << (width_of(bits) - 1), dtype=bits.dtype)


def ordered_key(dtype: str, bits: np.ndarray) -> np.ndarray:
    """A bijection of raw bits onto unsigned integers that preserves numeric order."""
    sign = _sign_bit(bits)
    if dtype in FLOAT_LAYOUT:
        negative = (bits & sign) != 0
        return np.where(negative, ~bits, bits | sign)
    if dtype in SIGNED_INTS:
        flipped: np.ndarray = bits ^ sign
        return flipped
    return bits


def key_to_bits(dtype: str, key: np.ndarray) -> np.ndarray:
    """Inverse of ``ordered_key``."""
    sign = _sign_bit(key)
    if dtype in FLOAT_LAYOUT:
        positive = (key & sign) != 0
        return np.where(positive, key ^ sign, ~key)
    if dtype in SIGNED_INTS:
        flipped: np.ndarray = key ^ sign
        return flipped
    return key


def kind_of(dtype: str) -> int:
    """Element kind of the order-preserving key (``kernels.FLOAT`` / ``SIGNED`` / ``UNSIGNED``)."""
    return K.FLOAT if dtype in FLOAT_LAYOUT else K.SIGNED if dtype in SIGNED_INTS else K.UNSIGNED


def label_layout(dtype: str) -> tuple[int, int, int]:
    """``(kind, shift, mask)``: an element's exponent label is ``(bits >> shift) & mask`` (0 for ints)."""
    layout = FLOAT_LAYOUT.get(dtype)
    if layout is None or layout[0] == 64:
        return kind_of(dtype), 0, 0
    width, mant = layout
    return kind_of(dtype), mant, (1 << (width - 1 - mant)) - 1


def delta_symbols(dtype: str, old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Changed elements -> (bin symbol, extra-bit widths, extra bits) of zigzag(delta) - 1."""
    if not K.AVAILABLE:
        return delta_symbols_np(dtype, old, new)
    zm1 = np.empty(old.size, np.int64)
    K.delta_zig(np.ascontiguousarray(old), np.ascontiguousarray(new), kind_of(dtype), width_of(old), zm1)
    return gap_bins(zm1)


def delta_symbols_np(dtype: str, old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The numpy twin of ``delta_symbols``."""
    width = width_of(old)
    diff = (ordered_key(dtype, new) - ordered_key(dtype, old)).astype(np.int64)
    if width < 64:
        diff = np.where(diff >= 1 << (width - 1), diff - (1 << width), diff)  # to signed
    zig = np.where(diff >= 0, 2 * diff, -2 * diff - 1)  # nonzero delta -> zig >= 1
    return gap_bins(zig - 1)


def apply_delta(dtype: str, old: np.ndarray, zig_minus_one: np.ndarray) -> np.ndarray:
    """New raw bits from old raw bits and ``zigzag(delta) - 1`` values (numpy reference of
    ``fused.decode_deltas_into``)."""
    zig = zig_minus_one + 1
    diff = np.where(zig & 1, -((zig + 1) >> 1), zig >> 1)
    key = ordered_key(dtype, old)
    return key_to_bits(dtype, (key + diff.astype(key.dtype, casting="unsafe")).astype(key.dtype))


def plane_symbols(bits: np.ndarray) -> list[np.ndarray]:
    """Byte planes (least significant first) of raw values, each as int32 symbols 0..255."""
    return [((bits >> (8 * j)) & 0xFF).astype(np.int32) for j in range(bits.dtype.itemsize)]


def planes_to_bits(planes: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Inverse of ``plane_symbols`` (numpy reference of ``fused.decode_planes_into``)."""
    out = np.zeros(planes[0].shape if planes else 0, dtype=dtype)
    for j, plane in enumerate(planes):
        out |= plane.astype(dtype) << np.array(8 * j, dtype=dtype)
    return out
