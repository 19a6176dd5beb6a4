"""Tracker core and per-track geometry shared by the `track`, `line_counter` and
`zone_counter` blocks.

- `boxes`: box conversions, IoU matrices and anchor points (vectorised numpy).
- `kalman`: ByteTrack's constant-velocity Kalman filter, batched over tracks.
- `assignment`: thresholded minimum-cost assignment (a small Hungarian solver).
- `bytetrack`: the ByteTrack association loop over a struct-of-arrays track store.
- `regions`: lines and polygons resolved to pixels per frame size.
- `idtable`: per-track-id state columns for the counters, looked up vectorised.
"""
