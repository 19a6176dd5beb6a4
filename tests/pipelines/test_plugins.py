"""Block plugins through the real entry-point mechanism: a distribution's metadata on
sys.path publishes block types in the `appliance.blocks` group."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pipelines.blocks.base import BuildContext
from pipelines.catalog import describe_blocks
from pipelines.compiler import compile_workflow
from pipelines.registry import BUILTIN_BLOCKS, BlockRegistry

PLUGIN_MODULE = '''
from typing import Any
from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory, stateless

class GainParams(BlockParams):
    gain: float = 2.0

class GainBlock(BlockType):
    """Multiply the image by a gain."""
    type_name = "gain"
    Params = GainParams
    inputs = {"image": ("image", "frame")}
    outputs = {"image": "image"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        gain = params.gain
        return stateless(lambda image: (image * gain).clip(0, 255).astype(image.dtype))

class NotABlock:
    pass
'''


@pytest.fixture
def plugin_dist(tmp_path: Path) -> Iterator[str]:
    """An installed-looking distribution: a module plus its dist-info with entry points."""
    module = f"plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(PLUGIN_MODULE)
    info = tmp_path / "appliance_test_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: appliance-test-plugins\nVersion: 1.0\n"
    )
    group = f"appliance.test_blocks_{module}"
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            f"""
            [{group}]
            gain = {module}:GainBlock
            broken_import = {module}_missing:Block
            not_a_block = {module}:NotABlock
            detect = {module}:GainBlock
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    yield group
    sys.path.remove(str(tmp_path))
    sys.modules.pop(module, None)


def test_plugins_load_next_to_builtins_and_broken_ones_are_named(plugin_dist: str) -> None:
    registry = BlockRegistry()
    broken = registry.load_plugins(plugin_dist)
    assert set(broken) == {"broken_import", "not_a_block", "detect"}
    assert "cannot import" in broken["broken_import"]
    assert "is not a BlockType subclass" in broken["not_a_block"]
    assert "taken by 'pipelines.blocks.detect:DetectBlock'" in broken["detect"]
    assert set(registry.names()) == set(BUILTIN_BLOCKS) | {"gain"}
    assert registry.plugins == {"gain": registry.plugins["gain"]}

    wf = compile_workflow(
        {"blocks": [{"id": "g", "type": "gain", "gain": 3}], "outputs": {"video": "g"}},
        BuildContext(models={}),
        registry,
    )
    from pipelines.types import Frame

    image = np.full((2, 2, 3), 10, np.uint8)
    out = wf.instantiate().run(Frame("s", 0, None, 0.0, 0.0, image)).drawn()
    assert int(out[0, 0, 0]) == 30
    entry = next(e for e in describe_blocks(registry) if e["type"] == "gain")
    assert entry["plugin"] is True
    assert entry["parameters"]["gain"] == {"type": "float", "required": False, "default": 2.0}
    assert entry["description"] == "Multiply the image by a gain."


def test_plugin_parameters_are_validated_like_builtins(plugin_dist: str) -> None:
    registry = BlockRegistry()
    registry.load_plugins(plugin_dist)
    from pipelines.errors import WorkflowError

    with pytest.raises(WorkflowError) as info:
        compile_workflow(
            {"blocks": [{"id": "g", "type": "gain", "gain": "lots"}], "outputs": {"video": "g"}},
            BuildContext(models={}),
            registry,
        )
    assert info.value.problems[0].startswith("blocks[0].gain: Input should be a valid number")
