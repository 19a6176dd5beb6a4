"""What a config reload changes: streams added, removed, changed; models added or changed.

A stream counts as changed when its entry in the file changed, when the workflow file it
names now has a different content (its normalised digest), or when a model of the
config's `models:` that its workflow runs has a new definition: it restarts on the model
loaded anew (appliance/models/pool.py). Streams added over the API are not in either
file and are left alone (on the model they run).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from appliance.config import AppConfig, StreamConfig, load_config
from appliance.errors import FileAccessError, LimitError, ReloadError
from appliance.policy.files import FilePolicy
from appliance.runtime.sharding import Shard
from appliance.runtime.workflows import workflow_document
from pipelines.compiler import parse_workflow, workflow_digest
from pipelines.errors import WorkflowError


@dataclass
class ReloadPlan:
    added: list[StreamConfig] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[StreamConfig] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # The file's config as read, before a shard took its share of the streams: what the
    # request policy (appliance/policy/request_files.py) derives from.
    source: AppConfig | None = field(default=None, repr=False, compare=False)

    def summary(self) -> dict[str, list[str]]:
        return {
            "added": [s.id for s in self.added],
            "removed": list(self.removed),
            "restarted": [s.id for s in self.changed],
            "unchanged": list(self.unchanged),
        }


def plan_file_reload(
    path: Path,
    old: AppConfig,
    files: FilePolicy,
    running: Mapping[str, str],
    shard: Shard | None = None,
    uses: Mapping[str, Collection[str]] | None = None,
) -> tuple[AppConfig, ReloadPlan]:
    """The config file at `path` read again (only `shard`'s streams, if given) and diffed
    against `old`; ReloadError for what a reload cannot apply. `running`: every running
    stream's id -> its workflow digest; `uses`: its id -> the models its workflow runs."""
    source = load_config(path)
    new = source if shard is None else shard.apply(source)
    if new.sinks != old.sinks:
        raise ReloadError("sinks: changed in the file; restart the appliance to apply them")
    changed = changed_workflows(new, files, running) | using_changed_models(old, new, uses or {})
    plan = plan_reload(old, new, changed)
    plan.source = source
    taken = [c.id for c in plan.added if c.id in running]
    if taken:  # added over the API since: the file must not silently replace them
        raise ReloadError(
            f"streams {taken} were added over the API and are now also in the file: "
            "remove them over the API first; nothing was changed"
        )
    return new, plan


def plan_reload(old: AppConfig, new: AppConfig, changed_workflows: set[str]) -> ReloadPlan:
    """Diff two configs. `changed_workflows`: ids of streams whose workflow file (or a
    model it runs) changed."""
    before = {s.id: s for s in old.streams}
    after = {s.id: s for s in new.streams}
    plan = ReloadPlan()
    for sid, cfg in after.items():
        if sid not in before:
            plan.added.append(cfg)
        elif cfg != before[sid] or sid in changed_workflows:
            plan.changed.append(cfg)
        else:
            plan.unchanged.append(sid)
    plan.removed = [sid for sid in before if sid not in after]
    return plan


def changed_models(old: AppConfig, new: AppConfig) -> set[str]:
    """Ids of the config's models declared in both with different definitions."""
    return {m for m, spec in new.models.items() if m in old.models and old.models[m] != spec}


def using_changed_models(
    old: AppConfig, new: AppConfig, uses: Mapping[str, Collection[str]]
) -> set[str]:
    """Running streams (id -> the models their workflow runs) that run a config model
    whose definition changed: the new one loads, and they must restart to run it."""
    changed = changed_models(old, new)
    return {sid for sid, models in uses.items() if changed.intersection(models)}


def changed_workflows(new: AppConfig, files: FilePolicy, digests: Mapping[str, str]) -> set[str]:
    """Running streams (id -> their workflow's digest) whose workflow document in `new`
    now has another digest, or no longer reads or parses (the compile reports why)."""
    changed = set()
    for cfg in new.streams:
        if cfg.id not in digests:
            continue
        try:
            doc, _, _ = workflow_document(files, cfg.workflow, cfg.id)
            digest = workflow_digest(parse_workflow(doc))
        except (WorkflowError, FileAccessError, LimitError):
            changed.add(cfg.id)
            continue
        if digest != digests[cfg.id]:
            changed.add(cfg.id)
    return changed
