"""The structure of a project's Dagster definitions as plain data, to compare two builds.

Asset specs (keys, deps, groups, kinds, owners, tags, metadata, descriptions, ...), each
assets and checks definition's op name, input and output names and check specs, jobs (their
op nodes, selected assets and checks, tags), schedules and sensors. Attributes are
compared through ``repr`` (none of them shows an object address); sets are sorted.
"""

from __future__ import annotations

from typing import Any

import dagster as dg


def _keys(keys: Any) -> list[str]:
    return sorted(k.to_user_string() if hasattr(k, "to_user_string") else str(k) for k in keys)


_SPEC_FIELDS = ("description", "metadata", "group_name", "skippable", "code_version",
                "legacy_freshness_policy", "freshness_policy", "automation_condition", "owners",
                "partitions_def", "is_virtual")


def _spec(spec: dg.AssetSpec) -> dict[str, str]:
    """The spec's every attribute; sets (deps, kinds and the tags they add) sorted."""
    out = {"key": spec.key.to_user_string(),
           "deps": repr(sorted(spec.deps, key=lambda d: d.asset_key.to_user_string())),
           "tags": repr(sorted(spec.tags.items())), "kinds": repr(sorted(spec.kinds))}
    out.update({name: repr(getattr(spec, name, None)) for name in _SPEC_FIELDS})
    return out


def definitions_structure(defs: dg.Definitions) -> dict[str, Any]:
    repo = defs.get_repository_def()
    assets: dict[str, Any] = {}
    for ad in repo.asset_graph.assets_defs:
        node = ad.node_def if ad.computation is not None else None
        name = node.name if node is not None else f"external {_keys(ad.keys)[0]}"
        assets[name] = {
            "specs": sorted((_spec(s) for s in ad.specs), key=lambda s: s["key"]),
            "checks": sorted(repr(s) for s in ad.check_specs),
            "ins": {n: str(k) for n, k in sorted(ad.keys_by_input_name.items())},
            "outs": {n: str(k) for n, k in sorted(ad.keys_by_output_name.items())},
            "check_outs": {n: str(s.key) for n, s in
                           sorted(ad.check_specs_by_output_name.items())},
            "can_subset": ad.can_subset,
            "pool": getattr(node, "pool", None),
            "op_ins": sorted(node.input_dict) if node is not None else [],
            "op_outs": sorted(node.output_dict) if node is not None else [],
        }
    jobs = {}
    for job in repo.get_all_jobs():
        layer = job.asset_layer
        jobs[job.name] = {
            "nodes": sorted(n.name for n in job.graph.nodes),
            "assets": _keys(layer.selected_asset_keys),
            "checks": _keys(layer.asset_graph.asset_check_keys),
            "tags": dict(sorted(job.tags.items())),
        }
    schedules = {s.name: {"cron": str(s.cron_schedule), "job": s.job_name,
                          "status": str(s.default_status), "tags": dict(sorted(s.tags.items()))}
                 for s in repo.schedule_defs}
    sensors = {s.name: {"jobs": sorted(j.name for j in s.jobs) if s.has_jobs else [],
                        "interval": s.minimum_interval_seconds,
                        "status": str(s.default_status),
                        "selection": repr(s.asset_selection)}
               for s in repo.sensor_defs}
    return {"assets": assets, "jobs": jobs, "schedules": schedules, "sensors": sensors}
