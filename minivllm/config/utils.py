"""The checks every config repeats, written once (vLLM twin: vllm/config/utils.py)."""

from __future__ import annotations


def check_positive_ints(config, *names: str, optional: tuple[str, ...] = (),
                        unit: str | None = None) -> None:
    """Each named field is an int >= 1 (or None, where it is in `optional`); with a `unit`
    (sizes in GiB), any number > 0."""
    for name in names:
        value = getattr(config, name)
        if value is None and name in optional:
            continue
        if type(value) not in ((int, float) if unit else (int,)) or value <= 0:
            raise ValueError(f"{name} must be a positive {unit or 'integer'}, got {value!r}")


def check_bools(config, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(config, name)!r}")


def check_choice(config, name: str, choices: tuple, setting: str | None = None) -> None:
    """The field is one of `choices` (the first is its default); `setting`: the name a user
    gives it, where that differs (LLM's kv_cache_dtype is CacheConfig's cache_dtype)."""
    if getattr(config, name) not in choices:
        *others, last = map(repr, choices)
        raise ValueError(f"{setting or name} must be {', '.join(others) + ' or ' * bool(others)}"
                         f"{last}, got {getattr(config, name)!r}")


def check_keys(cls, name: str, d: dict, required: str, hint: str) -> dict:
    """d, once its keys are all fields of cls and the `required` one is there (the configs
    given as vLLM's dicts: speculative_config, kv_transfer_config)."""
    keys = list(cls.__dataclass_fields__)
    unknown = sorted(set(d) - set(keys))
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {unknown}; the keys are {keys}")
    if required not in d:
        raise ValueError(f"{name} needs {required}{hint}")
    return d
