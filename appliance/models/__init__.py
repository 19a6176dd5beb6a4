"""Model runtime: ONNX Runtime sessions (providers, fallback) and the dynamic batcher."""

from appliance.models.batcher import BatchRecord, ModelBatcher, ModelRunError, ModelStoppedError
from appliance.models.errors import ModelLoadError
from appliance.models.session import LoadedModel, load_model

__all__ = [
    "BatchRecord",
    "LoadedModel",
    "ModelBatcher",
    "ModelLoadError",
    "ModelRunError",
    "ModelStoppedError",
    "load_model",
]
