"""The model's and the drafter's configs as transformers reads them: config.json from the folder when it is here,
else the profile's planner.config / planner.drafter_config (real keys of the architecture's config class).

Runs in the serving interpreter (transformers ships the config classes); see rigstack.planner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigstack.errors import UserError
from rigstack.profiles import Profile, model_dir

# Checkpoints of these architectures carry their MTP (NextN) layers past the last decoder layer, whether or not the
# profile serves MTP: `num_nextn_predict_layers` of them (1 when the config leaves it unset).
CHECKPOINT_MTP = frozenset({"GlmMoeDsaForCausalLM", "Glm5NextForCausalLM"})


def text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def _read(path: Path) -> dict[str, Any]:
    from transformers import PretrainedConfig

    try:  # transformers' own reader: it decodes the floats JSON cannot hold ({"__float__": "Infinity"})
        return PretrainedConfig.get_config_dict(str(path))[0]
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not readable as JSON ({error}); re-download the model's config.json") from None


def shape_known(profile: Profile, folder: Path | None) -> bool:
    """Whether there is a config to plan from: the model folder's config.json or the profile's planner.config."""
    here = folder is not None and (folder / "config.json").is_file()
    return here or bool(profile.planner and profile.planner.config)


def load_config(profile: Profile, folder: Path | None) -> tuple[Any, str]:
    """The model's config and its architecture: config.json from the model folder, else planner.config."""
    from transformers import AutoConfig

    if folder is not None and (folder / "config.json").is_file():
        data, source = _read(folder / "config.json"), str(folder / "config.json")
    elif profile.planner is not None and profile.planner.config:
        data, source = dict(profile.planner.config), f"profile {profile.name} planner.config"
    else:
        raise UserError(f"profile {profile.name}: no config.json at {folder} and no planner.config; download the "
                        "model or add the model's config keys under planner.config")
    model_type = data.get("model_type")
    if not model_type:
        raise UserError(f"{source}: no model_type; add the architecture's model_type (e.g. glm_moe_dsa)")
    try:
        config = AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{source}: transformers cannot build a {model_type} config ({error}); fix the keys") from None
    archs = data.get("architectures") or list(profile.model.shape.architectures or ())
    if not archs:
        raise UserError(f"{source}: no architectures; add the model class name (e.g. GlmMoeDsaForCausalLM)")
    return config, archs[0]


@dataclass(frozen=True)
class Drafter:
    config: Any  # transformers' config of the drafter's config.json
    folder: Path | None  # where its weights are, if here
    source: str  # where the config came from


def load_drafter_config(profile: Profile) -> Drafter | None:
    """A DFlash drafter's config (its config.json from the drafter folder, else planner.drafter_config; DFlash
    drafters are Qwen3 configs); None without one."""
    from transformers import AutoConfig

    if (profile.speculative or {}).get("method") != "dflash":
        return None
    folder = model_dir(profile.drafter, build=False) if profile.drafter else None
    if folder is not None and (folder / "config.json").is_file():
        data, source = _read(folder / "config.json"), str(folder / "config.json")
    elif profile.planner is not None and profile.planner.drafter_config:
        data, source = dict(profile.planner.drafter_config), f"profile {profile.name} planner.drafter_config"
    else:
        return None
    kind = data.get("model_type", "qwen3")
    try:
        config = AutoConfig.for_model(kind, **{k: v for k, v in data.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{source}: transformers cannot build a {kind} config ({error}); fix the keys") from None
    return Drafter(config, folder if folder is not None and folder.is_dir() else None, source)


def nextn_layers(text: Any) -> int:
    """The MTP (NextN) layers of a config: num_nextn_predict_layers, 1 when unset."""
    return int(getattr(text, "num_nextn_predict_layers", 1) or 1)


def mtp_layers(profile: Profile, text: Any) -> int:
    """MTP modules vLLM builds (on the last stage): the config's NextN layers when the profile serves MTP."""
    return nextn_layers(text) if (profile.speculative or {}).get("method") == "mtp" else 0


def checkpoint_mtp_layers(architecture: str, text: Any) -> int:
    """MTP layers a checkpoint of this architecture holds past its decoder layers, served or not."""
    return nextn_layers(text) if architecture in CHECKPOINT_MTP else 0


def linear_layers(config: Any) -> frozenset[int]:
    types = getattr(text_config(config), "layer_types", None) or ()
    return frozenset(i for i, kind in enumerate(types) if kind == "linear_attention")
