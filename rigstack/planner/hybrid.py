"""The planner's hybrid models: attention layers beside layers that keep a Mamba-type state (GLM-5.3-Flash's KDA,
a Mamba2 hybrid such as GraniteMoeHybrid).

Each state layer's spec is MambaBase.get_kv_cache_spec's (model_executor/layers/mamba/abstract.py) over the shapes
and dtypes its model class gives. The block size is what vLLM's Platform._align_hybrid_block_size makes it: that
function reads the model class and every attention layer's backend, which cannot all be had here (glm5next does
not import on the CPU twin, and no layer is built), so its arithmetic runs here over the pages the planner's own
specs give. Proven equal to vLLM's function for GLM-5.3-Flash (tests/test_planner.py) and, for a Mamba2 hybrid,
to the pool a real CPU twin server logs (the same file).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from vllm.config import CacheConfig
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator
from vllm.utils.math_utils import cdiv
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.kv_cache_interface import MambaSpec

# Models whose ModelConfig.is_hybrid is True; their configs mark the state layers "linear_attention" in layer_types.
HYBRID = ("Glm5NextForCausalLM", "GraniteMoeHybridForCausalLM")


def is_state_layer(text: Any, layer: int) -> bool:
    """Whether decoder layer `layer` keeps a state (MTP layers past num_hidden_layers never do)."""
    types = getattr(text, "layer_types", None)
    return types is not None and layer < len(types) and types[layer] == "linear_attention"


def _state(setup: Any, text: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[torch.dtype, ...]]:
    model = STR_DTYPE_TO_TORCH_DTYPE[setup.model_dtype]
    if setup.architecture == "Glm5NextForCausalLM":
        # Glm5NextLinearAttention (models/glm5next/common/kda.py).
        shapes = MambaStateShapeCalculator.kda_state_shape(setup.tp, text.linear_num_heads, text.linear_head_dim,
                                                           conv_kernel_size=text.linear_conv_kernel_dim,
                                                           num_spec=setup.num_speculative_tokens)
        return tuple(shapes), MambaStateDtypeCalculator.kda_state_dtype(model, "auto", "auto")
    # GraniteMoeHybridForCausalLM.get_mamba_state_shape_from_config and _dtype_ (models/granitemoehybrid.py):
    # MambaMixer2's conv and SSM states.
    shapes = MambaStateShapeCalculator.mamba2_state_shape(
        tp_world_size=setup.tp, intermediate_size=text.mamba_expand * text.hidden_size, n_groups=text.mamba_n_groups,
        num_heads=text.mamba_n_heads, head_dim=text.mamba_d_head, state_size=text.mamba_d_state,
        conv_kernel=text.mamba_d_conv, num_spec=setup.num_speculative_tokens)
    # CpuPlatform.check_and_update_config keeps a Mamba2 SSM state in float32 (its kernels' type).
    ssm = "float32" if setup.cpu else "auto"
    return tuple(shapes), MambaStateDtypeCalculator.mamba2_state_dtype(model, "auto", ssm)


def state_spec(setup: Any, text: Any, block_size: int, page_size_padded: int | None) -> MambaSpec:
    """MambaBase.get_kv_cache_spec: the state, its block size and its page padded to the attention page. The state
    alignment is 1 (16 only for FlashInfer's ReplaySSM, which neither KDA nor Mamba2 uses here). MambaMixer2 adds
    a prefill checkpoint block (its get_kv_cache_spec; a request holds it in align mode); KDA's belongs to the
    flashkda backend (kda_checkpoint.py), which the planner does not take."""
    shapes, dtypes = _state(setup, text)
    # Prefix caching puts a hybrid's states in "align" mode (MambaModelConfig.verify_and_update_config).
    mode = "align" if setup.enable_prefix_caching else "none"
    mamba2 = setup.architecture == "GraniteMoeHybridForCausalLM"
    return MambaSpec(shapes=shapes, dtypes=dtypes, state_alignment=1, block_stride_alignment=1,
                     block_size=block_size, page_size_padded=page_size_padded,
                     num_speculative_blocks=setup.num_speculative_tokens, mamba_cache_mode=mode,
                     num_prefill_checkpoint_blocks=int(mamba2), prefill_checkpoint_alignment=1 if mamba2 else None)


def align_block(setup: Any, text: Any, attn_page_1: int, mla: bool, kernels: tuple[int, ...]) -> tuple[int, int | None]:
    """Platform._align_hybrid_block_size (platforms/interface.py): the smallest block, a multiple of the kernel
    block (the smallest of each attention backend, `kernels`; and of 128 for MLA), whose attention page
    (`attn_page_1` bytes a token) holds the state, and the state's page padded to it (None where equal). The align
    mode's checkpoint alignment is 1: neither KDA nor Mamba2 layers declare one
    (MambaBase.get_prefill_checkpoint_alignment)."""
    state = state_spec(setup, text, -1, None).page_size_bytes
    user = setup.block_size or CacheConfig.DEFAULT_BLOCK_SIZE
    kernel = max(max(kernels), user, 128 if mla else 0)
    block = kernel * cdiv(state, kernel * attn_page_1)
    backend = math.lcm(*kernels)
    block = max(backend * cdiv(block, backend), user)
    page = block * attn_page_1
    return block, (page if page != state else None)
