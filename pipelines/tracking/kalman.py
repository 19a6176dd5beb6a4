"""ByteTrack's constant-velocity Kalman filter on (cx, cy, a, h), batched over tracks.

State x = (cx, cy, a, h, vcx, vcy, va, vh): box centre (px), aspect w/h, height (px) and
their per-frame velocities. Noise scales with the box height, so a near and a far person
get the same relative uncertainty. The constants and noise model are those of ByteTrack's
`yolox/tracker/kalman_filter.py` (MIT), itself from DeepSORT; here every operation runs on
a whole (T, 8) batch at once instead of one track at a time.
"""

from __future__ import annotations

import numpy as np

from pipelines.tracking.boxes import F64

_STD_POSITION = 1.0 / 20  # position std as a fraction of the box height, per frame
_STD_VELOCITY = 1.0 / 160  # velocity std as a fraction of the box height, per frame
# Per state entry: std = scale · h + fixed. The aspect ratio is nearly constant, so its
# noise is a small absolute std instead of a height fraction.
_PROCESS_SCALE = np.array(
    [_STD_POSITION] * 2 + [0.0, _STD_POSITION] + [_STD_VELOCITY] * 2 + [0.0, _STD_VELOCITY]
)
_PROCESS_FIXED = np.array([0.0, 0.0, 1e-2, 0.0, 0.0, 0.0, 1e-5, 0.0])
_INIT_SCALE = _PROCESS_SCALE * np.array([2.0] * 4 + [10.0] * 4)  # a wide prior at birth
_MEASURE_SCALE = np.array([_STD_POSITION, _STD_POSITION, 0.0, _STD_POSITION])
_MEASURE_FIXED = np.array([0.0, 0.0, 1e-1, 0.0])  # detectors jitter the aspect more
_DIAG8, _DIAG4 = np.arange(8), np.arange(4)
# The motion model: x' = F x with dt = 1 frame, F = [[I, I], [0, I]] (predict); the
# measurement is the first four state entries (update).


def _variance(h: F64, scale: F64, fixed: F64) -> F64:
    """(T, k) variances, std = scale · h + fixed per entry."""
    std = h[:, None] * scale + fixed
    result: F64 = std * std
    return result


def initiate(measurement: F64) -> tuple[F64, F64]:
    """New tracks from (T, 4) xyah measurements: zero velocity, wide velocity prior."""
    t = measurement.shape[0]
    mean = np.concatenate([measurement, np.zeros((t, 4))], axis=1)
    cov = np.zeros((t, 8, 8))
    fixed = _PROCESS_FIXED  # the reference uses the same fixed aspect stds at birth
    cov[:, _DIAG8, _DIAG8] = _variance(measurement[:, 3], _INIT_SCALE, fixed)
    return mean, cov


def predict(mean: F64, cov: F64) -> tuple[F64, F64]:
    """One frame ahead for every track (returns new arrays).

    F = [[I, I], [0, I]], so F x adds the velocities to the positions and F P Fᵀ adds
    P's lower blocks to its upper ones, rows then columns: the same sums a product with
    F's ones and zeros makes (adding an exact zero changes no float), in a few in-place
    adds instead of two batched matrix products (numpy's per-call cost dominates at a
    few tracks)."""
    new_mean = mean.copy()
    new_mean[:, :4] += mean[:, 4:]
    new_cov = cov.copy()
    new_cov[:, :4, :] += cov[:, 4:, :]
    new_cov[:, :, :4] += new_cov[:, :, 4:]
    new_cov[:, _DIAG8, _DIAG8] += _variance(mean[:, 3], _PROCESS_SCALE, _PROCESS_FIXED)
    return new_mean, new_cov


def update(mean: F64, cov: F64, measurement: F64) -> tuple[F64, F64]:
    """Correct (T, 8) states with (T, 4) xyah measurements (one per track)."""
    s = cov[:, :4, :4].copy()  # innovation covariance H P Hᵀ + R, (T, 4, 4)
    s[:, _DIAG4, _DIAG4] += _variance(mean[:, 3], _MEASURE_SCALE, _MEASURE_FIXED)
    pht = cov[:, :, :4]  # P Hᵀ, (T, 8, 4)
    # K = P Hᵀ S⁻¹; S is symmetric, so Kᵀ = S⁻¹ (P Hᵀ)ᵀ: one batched solve, no inverse.
    gain = np.linalg.solve(s, pht.transpose(0, 2, 1)).transpose(0, 2, 1)
    innovation = measurement - mean[:, :4]
    new_mean = mean + (gain @ innovation[:, :, None])[:, :, 0]
    new_cov = cov - gain @ s @ gain.transpose(0, 2, 1)
    return new_mean, new_cov
