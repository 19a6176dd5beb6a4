"""Model runtime: ONNX Runtime sessions (providers, fallback) and the dynamic batcher."""

from appliance.models.batcher import BatchRecord, ModelBatcher, ModelRunError, ModelStoppedError
from appliance.models.session import LoadedModel, ModelLoadError, load_model

__all__ = [
    "BatchRecord",
    "LoadedModel",
    "ModelBatcher",
    "ModelLoadError",
    "ModelRunError",
    "ModelStoppedError",
    "load_model",
]
