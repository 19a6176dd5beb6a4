"""WebRTC viewers: a stream's annotated video and its predictions to browsers and other
WebRTC clients (docs/api.md, "WebRTC").

- `feed.py`: one stream's newest result, made into video frames and messages once
  however many viewers watch;
- `track.py`: a viewer's video track, always the newest frame (never a queue);
- `sessions.py`: the peer connections, their limits, timeouts and cleanup;
- `ice.py`: the ICE servers and the host addresses offered;
- `config.py`: the config's `webrtc:` section.

Nothing is imported here: the config loads `config.py` without aiortc and the runtime.
"""
