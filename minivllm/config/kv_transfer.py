"""Prefill/decode disaggregation's KV connector (vLLM twin: vllm/config/kv_transfer.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.config.utils import check_keys

KV_CONNECTORS = ("TorchDistributedConnector",)
KV_ROLES = ("kv_producer", "kv_consumer")


@dataclass(slots=True, frozen=True)
class KVTransferConfig:
    """Prefill/decode disaggregation (minivllm/distributed/kv_transfer/kv_connector.py), from
    vLLM's `kv_transfer_config` dict.

    The kv_producer (rank 0) prefills prompts and sends their KV; the kv_consumer (rank 1)
    decodes. The producer listens at kv_ip:kv_port, the consumer connects there.
    kv_connector_extra_config takes {"timeout": seconds} (default 120): how long to wait for
    the other role to join, and for a send to complete.
    """

    kv_role: str
    kv_connector: str = "TorchDistributedConnector"
    kv_rank: int | None = None            # 0 (producer) or 1 (consumer); derived if None
    kv_parallel_size: int = 2             # one producer and one consumer
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> KVTransferConfig:
        return cls(**check_keys(cls, "kv_transfer_config", d, "kv_role",
                                 f", one of {list(KV_ROLES)}"))

    def __post_init__(self):
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_transfer_config: kv_role must be one of {list(KV_ROLES)}, "
                             f"got {self.kv_role!r}")
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(f"kv_transfer_config: unknown kv_connector {self.kv_connector!r}; "
                             f"minivllm has {list(KV_CONNECTORS)}")
        if self.kv_rank not in (None, self.rank):
            raise ValueError(f"kv_transfer_config: a {self.kv_role} is kv_rank {self.rank}, "
                             f"got {self.kv_rank!r}")
        if self.kv_parallel_size != 2:
            raise ValueError(f"kv_transfer_config: kv_parallel_size must be 2 (one producer, "
                             f"one consumer), got {self.kv_parallel_size!r}")
        if not isinstance(self.kv_port, int) or not 0 < self.kv_port < 65536:
            raise ValueError(f"kv_transfer_config: kv_port must be in 1..65535, got "
                             f"{self.kv_port!r}")
        unknown = sorted(set(self.kv_connector_extra_config) - {"timeout"})
        if unknown or not self.timeout > 0:
            raise ValueError(f"kv_transfer_config: kv_connector_extra_config takes "
                             f"{{'timeout': seconds > 0}}, got {self.kv_connector_extra_config!r}")

    @property
    def rank(self) -> int:
        return KV_ROLES.index(self.kv_role)

    @property
    def timeout(self) -> float:
        return self.kv_connector_extra_config.get("timeout", 120.0)
