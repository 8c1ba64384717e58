"""The configuration as vLLM's (issue 38, part 6): flat settings in, VllmConfig's parts out."""

import subprocess
import sys

import pytest

from minivllm.config import (CacheConfig, CompilationConfig, LoRAConfig, SchedulerConfig,
                             SpeculativeConfig, VllmConfig)
from minivllm.engine.arg_utils import LOAD_TIME_ARGS, EngineArgs

from conftest import engine_config


def test_flat_settings_land_in_their_parts():
    config = engine_config(max_num_seqs=4, block_size=8, kv_cache_dtype="int8",
                           enable_lora=True, max_loras=2,
                           speculative_config={"num_speculative_tokens": 3},
                           enable_chunked_prefill=False, max_num_batched_tokens=8192)
    assert isinstance(config, VllmConfig)
    assert config.scheduler_config == SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=8192, max_model_len=8192,
        enable_chunked_prefill=False)
    assert config.cache_config == CacheConfig(block_size=8, cache_dtype="int8")
    assert config.lora_config == LoRAConfig(max_loras=2)
    assert config.compilation_config == CompilationConfig(level=0)
    assert engine_config(compilation_config={"level": 3}).compilation_config.level == 3
    assert config.speculative_config == SpeculativeConfig(num_speculative_tokens=3)
    assert config.kv_transfer_config is None
    # max_model_len: the model's limit unless given, the same in the model and scheduler parts
    assert config.model_config.max_model_len == config.model_config.hf_config \
        .max_position_embeddings == 8192
    assert engine_config(enable_lora=False, max_loras=2).lora_config is None


def test_each_part_checks_its_own_fields_and_the_table_checks_the_mix():
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer, got 0"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="kv_cache_dtype must be 'auto', 'fp8' or 'int8'"):
        CacheConfig(cache_dtype="fp4")
    with pytest.raises(ValueError, match="max_cpu_loras .1. must be >= max_loras .2."):
        LoRAConfig(max_loras=2, max_cpu_loras=1)
    with pytest.raises(ValueError, match="without chunked prefill a whole prompt must fit"):
        engine_config(enable_chunked_prefill=False, max_num_batched_tokens=512)
    with pytest.raises(ValueError, match="enable_lora with quantization is not supported"):
        engine_config(enable_lora=True, quantization="int8")
    with pytest.raises(ValueError, match="enable_lora must be True or False"):
        engine_config(enable_lora="yes")
    with pytest.raises(TypeError, match=r"unknown engine setting\(s\) \['max_num_seq'\]"):
        EngineArgs.check_names({"max_num_seq": 4})
    with pytest.raises(TypeError, match=r"\['device'\].*need a new engine"):
        EngineArgs.check_names({"device": "cpu"}, fixed=LOAD_TIME_ARGS)


def test_the_engine_runs_the_config_reconfigure_builds(smol):
    llm = smol(max_num_seqs=4, block_size=8)
    engine = llm.engine
    assert engine.vllm_config.scheduler_config.max_num_seqs == 4
    assert engine.scheduler.scheduler_config is engine.vllm_config.scheduler_config
    assert engine.runner.vllm_config is engine.vllm_config
    assert engine.block_manager.block_size == engine.vllm_config.cache_config.block_size == 8
    llm.reconfigure(max_num_seqs=2)          # the other settings kept, the new one checked
    assert engine.engine_args.max_num_seqs == 2 and engine.engine_args.block_size == 8
    assert engine.scheduler.scheduler_config.max_num_seqs == 2
    assert engine.vllm_config.cache_config.block_size == 8


def test_importing_the_config_imports_no_torch():
    code = ("import sys, minivllm.config, minivllm.engine.arg_utils; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_an_engine_from_engine_args_is_the_engine_from_kwargs(tiny_checkpoint):
    from minivllm import LLMEngine
    path, _ = tiny_checkpoint("llama")
    args = EngineArgs(model=str(path), max_model_len=64, num_kv_blocks=6, block_size=8)
    engine = LLMEngine.from_engine_args(args)
    assert engine.engine_args == args                       # the checkpoint already a path
    assert engine.vllm_config == args.create_engine_config()
    assert engine.block_manager.num_blocks == 6 and engine.block_manager.block_size == 8


def test_every_engine_flag_reaches_the_engine_or_says_why_not():
    """engine_kwargs names the flags it reads (CLI_FIELDS): a flag added to add_cli_args and
    forgotten there would be parsed and dropped."""
    import argparse

    from minivllm.engine.arg_utils import CLI_FIELDS, EngineArgs, add_cli_args
    dests = set(vars(add_cli_args(argparse.ArgumentParser()).parse_args([])))
    read_apart = {"num_gpu_blocks_override", "max_num_batched_tokens"}    # renamed, optional
    launcher = {"node_rank", "headless", "data_parallel_start_rank"}      # serve --headless's
    assert dests == set(CLI_FIELDS) | read_apart | launcher
    assert set(CLI_FIELDS) <= set(EngineArgs.__dataclass_fields__)
