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
_ASPECT_POSITION = 1e-2  # aspect ratio is nearly constant: small absolute std
_ASPECT_VELOCITY = 1e-5
_ASPECT_MEASURE = 1e-1  # detectors jitter the aspect more than the motion model does

# x' = F x with dt = 1 frame; the measurement is the first four state entries.
_F = np.eye(8)
_F[:4, 4:] = np.eye(4)


def _diag_batch(std: F64) -> F64:
    """(T, k) standard deviations -> (T, k, k) diagonal covariances."""
    k = std.shape[1]
    out = np.zeros((std.shape[0], k, k))
    out[:, np.arange(k), np.arange(k)] = std * std
    return out


def _std(h: F64, pos: float, aspect: float) -> F64:
    """(T, 4) standard deviations for (cx, cy, a, h) scaled by each track's height."""
    s = pos * h
    return np.stack([s, s, np.full_like(h, aspect), s], axis=1)


def initiate(measurement: F64) -> tuple[F64, F64]:
    """New tracks from (T, 4) xyah measurements: zero velocity, wide velocity prior."""
    t = measurement.shape[0]
    mean = np.concatenate([measurement, np.zeros((t, 4))], axis=1)
    h = measurement[:, 3]
    std = np.concatenate(
        [_std(h, 2 * _STD_POSITION, _ASPECT_POSITION), _std(h, 10 * _STD_VELOCITY, _ASPECT_VELOCITY)],
        axis=1,
    )
    return mean, _diag_batch(std)


def predict(mean: F64, cov: F64) -> tuple[F64, F64]:
    """One frame ahead for every track (returns new arrays)."""
    h = mean[:, 3]
    q = _diag_batch(
        np.concatenate(
            [_std(h, _STD_POSITION, _ASPECT_POSITION), _std(h, _STD_VELOCITY, _ASPECT_VELOCITY)],
            axis=1,
        )
    )
    return mean @ _F.T, _F @ cov @ _F.T + q


def update(mean: F64, cov: F64, measurement: F64) -> tuple[F64, F64]:
    """Correct (T, 8) states with (T, 4) xyah measurements (one per track)."""
    r = _diag_batch(_std(mean[:, 3], _STD_POSITION, _ASPECT_MEASURE))
    s = cov[:, :4, :4] + r  # innovation covariance, (T, 4, 4)
    pht = cov[:, :, :4]  # P Hᵀ, (T, 8, 4)
    # K = P Hᵀ S⁻¹; S is symmetric, so Kᵀ = S⁻¹ (P Hᵀ)ᵀ: one batched solve, no inverse.
    gain = np.linalg.solve(s, pht.transpose(0, 2, 1)).transpose(0, 2, 1)
    innovation = measurement - mean[:, :4]
    new_mean = mean + (gain @ innovation[:, :, None])[:, :, 0]
    new_cov = cov - gain @ s @ gain.transpose(0, 2, 1)
    return new_mean, new_cov
