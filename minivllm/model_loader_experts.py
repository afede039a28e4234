"""Experts stacked at load: a checkpoint tensor of one expert's projection
(`<prefix>.experts.<e>.<part>.weight`) goes into its FusedMoE parameter (`<prefix>.experts.
<param>`, [E, ...]) with shard_id (e, kind), by the model's `expert_modules_mapping`
(part -> (param, kind)). A block-FP8 checkpoint's scale (`<part>.weight_scale_inv`, or
`.weight_scale`) goes into `<param>_weight_scale_inv` (`_weight_scale`) the same way."""

from __future__ import annotations

import re

import torch

ExpertMapping = dict[str, tuple[str, str]]
_EXPERT_NAME = re.compile(
    r"(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<part>[^.]+)\.(?P<leaf>weight\w*)"
)
SCALE_LEAVES = ("weight_scale_inv", "weight_scale")


def _param_leaf(param: str, leaf: str) -> str:
    return param if leaf == "weight" else f"{param}_{leaf}"


def expert_target(name: str, mapping: ExpertMapping) -> tuple[str, tuple[int, str]] | None:
    """(parameter name, (expert, kind)) for one expert's checkpoint tensor, else None."""
    match = _EXPERT_NAME.fullmatch(name)
    if match is None or match["part"] not in mapping:
        return None
    if match["leaf"] not in ("weight", *SCALE_LEAVES):
        return None
    param, kind = mapping[match["part"]]
    return f"{match['prefix']}.{_param_leaf(param, match['leaf'])}", (int(match["expert"]), kind)


def expected_expert_loads(
    params: dict[str, torch.Tensor], mapping: ExpertMapping
) -> dict[tuple[str, object], str]:
    """(parameter name, (expert, kind)) -> checkpoint name, for every expert tensor the stacked
    parameters need (their first dim is the number of experts); a scale made with its weight
    (`filled_by_weight`) needs none."""
    expected: dict[tuple[str, object], str] = {}
    for name, param in params.items():
        prefix, _, param_part = name.rpartition(".")
        if not prefix.endswith(".experts") or getattr(param, "filled_by_weight", False):
            continue
        for part, (target, kind) in mapping.items():
            for leaf in ("weight", *SCALE_LEAVES):
                if _param_leaf(target, leaf) == param_part:
                    for expert in range(param.shape[0]):
                        expected[(name, (expert, kind))] = f"{prefix}.{expert}.{part}.{leaf}"
    return expected
