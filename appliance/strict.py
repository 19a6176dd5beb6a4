"""The base of every appliance config model: each room's `config.py` builds on it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are errors (a misspelt option must not be ignored); values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
