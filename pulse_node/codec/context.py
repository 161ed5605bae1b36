"""Position context of compact patches: which base elements get their own position model.

Elements whose base exponent is below a per-tensor threshold T (small weights, which change
far more often) are split into one class per exponent; all others form the background class.
T is chosen by the encoder from the exponents of the changed elements and a strided sample
of the base, minimising the estimated code length while keeping the materialised classes
small (the background is never materialised, see ``positions.Classes``). The receiver
rebuilds the identical partition from the base bits and T, which the header carries.
"""

from __future__ import annotations

import numpy as np

from pulse_node.codec import kernels as K
from pulse_node.codec.positions import Classes
from pulse_node.codec.values import FLOAT_LAYOUT, exponent_labels

BACKGROUND = 255
#: at most this fraction of a tensor's elements may be materialised in non-background classes
MAX_MEMBER_FRACTION = 0.1
_SAMPLE_TARGET = 1 << 16
_MIN_NUMEL = 256


def supports_context(dtype: str) -> bool:
    return dtype in FLOAT_LAYOUT and FLOAT_LAYOUT[dtype][0] <= 32


def _entropy_bits(n: np.ndarray, m: np.ndarray) -> np.ndarray:
    n = np.maximum(n, m).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, m / np.maximum(n, 1), 0.0)
        h = -(p * np.log2(np.where(p > 0, p, 1)) + (1 - p) * np.log2(np.where(p < 1, 1 - p, 1)))
    bits: np.ndarray = n * h
    return bits


def choose_threshold(dtype: str, base_bits: np.ndarray, changed_labels: np.ndarray) -> int:
    """Exponent threshold T for a tensor (0 = no context). Heuristic only: any T decodes."""
    numel = base_bits.size
    if not supports_context(dtype) or numel < _MIN_NUMEL or changed_labels.size == 0:
        return 0
    stride = max(1, numel // _SAMPLE_TARGET)
    sample = exponent_labels(dtype, base_bits[::stride])
    n_est = np.bincount(sample, minlength=256)[:256] * (numel / sample.size)
    m = np.bincount(changed_labels, minlength=256)[:256].astype(np.float64)
    n_est = np.maximum(n_est, m)
    # cost(T) = sum_{e<T} n_e H(m_e/n_e) + n_bg H(m_bg/n_bg), for T = 0..255
    own = np.concatenate([[0.0], np.cumsum(_entropy_bits(n_est, m))])[:256]
    n_low = np.concatenate([[0.0], np.cumsum(n_est)])[:256]
    m_low = np.concatenate([[0.0], np.cumsum(m)])[:256]
    cost = own + _entropy_bits(np.maximum(numel - n_low, 0), m.sum() - m_low)
    allowed = n_low <= MAX_MEMBER_FRACTION * numel
    t = int(np.argmin(np.where(allowed, cost, np.inf)))
    return t if cost[t] < cost[0] * 0.995 else 0


def position_classes(dtype: str, base_bits: np.ndarray, threshold: int) -> Classes:
    """The partition both sides derive from the base bits and T."""
    numel = base_bits.size
    if threshold == 0:
        return Classes.single(numel)
    width, mant = FLOAT_LAYOUT[dtype]
    if K.AVAILABLE:
        bits = np.ascontiguousarray(base_bits).reshape(-1)
        n = K.count_below(bits, threshold << mant, (1 << (width - 1)) - 1)
        members, labels = np.empty(n + 1, np.int64), np.empty(n + 1, np.uint8)
        K.members_below(bits, threshold << mant, (1 << (width - 1)) - 1, mant, members, labels)
        return Classes(numel, members[:n], labels[:n], BACKGROUND)
    magnitude = base_bits & np.array((1 << (width - 1)) - 1, dtype=base_bits.dtype)
    members = np.flatnonzero(magnitude < np.array(threshold << mant, dtype=base_bits.dtype))
    return Classes(numel, members, exponent_labels(dtype, base_bits[members]), BACKGROUND)
