"""Hardware profiles: one YAML file per rig (profiles/), validated into a frozen record.

    schema.py   the record: Profile and its parts (hardware, model, parallel, router, hosts, ...)
    values.py   what a value may be (no option-like word, line break or unusable number reaches a command line)
    loader.py   the one loading function: `extends:` deep-merged, errors with file, line and key
The one YAML reader (safe, bounded, with line numbers) is rigstack.profileyaml. Model paths are host paths, or
`tiny:KIND` for the locally built tiny model (rigstack.tinymodel), resolved by model_dir() when needed.
"""

from rigstack.profiles.loader import (DEFAULT_PROFILE, PROFILES_DIR, leaves, list_profiles, load_profile, merge,
                                      model_dir, resolve_path, resolved_dict)
from rigstack.profiles.schema import TINY_PREFIX, Host, Model, Profile, Router, Shape, Weights
from rigstack.profiles.values import MAX_UNITS, Word
from rigstack.profileyaml import Lines, read_yaml

__all__ = ["DEFAULT_PROFILE", "MAX_UNITS", "PROFILES_DIR", "TINY_PREFIX", "Host", "Lines", "Model", "Profile",
           "Router", "Shape", "Weights", "Word", "leaves", "list_profiles", "load_profile", "merge", "model_dir",
           "read_yaml", "resolve_path", "resolved_dict"]
