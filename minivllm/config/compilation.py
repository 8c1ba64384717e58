"""torch.compile around attention (vLLM twin: vllm/config/compilation.py; minivllm reads only
its level). CUDA graphs are on unless the model config's enforce_eager."""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = (0, 3)       # 0: eager; 3: torch.compile of the layers around attention


@dataclass(slots=True, frozen=True)
class CompilationConfig:
    """Off by default: on this CPU it does not pay (docs/benchmarks.md)."""

    level: int = 0

    @classmethod
    def from_value(cls, value) -> CompilationConfig:
        """vLLM's `compilation_config=`: a level, or {"level": n}."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"level"})
            if unknown:
                raise ValueError(f"compilation_config: unknown key(s) {unknown}; minivllm "
                                 "reads only 'level'")
            value = value.get("level", 0)
        return cls(level=value)

    def __post_init__(self):
        if self.level not in LEVELS or isinstance(self.level, bool):
            raise ValueError(f"compilation_config level must be 0 (eager) or 3 (torch.compile "
                             f"around attention), got {self.level!r}")
