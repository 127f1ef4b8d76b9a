"""Tiny random configs of the architectures softeval is checked on (the conformance suite).

Each entry builds a two-layer model of its architecture from a config, sized for the SmolLM2
tokenizer's vocabulary: small enough that the whole catalogue runs in CI, with the settings that
make the architecture differ from llama (sliding windows, ALiBi, logit scales, rotary variants,
state-space layers) switched on.
"""

from __future__ import annotations

from collections.abc import Callable

import transformers

# wide initial weights make sharp, context-dependent next-token choices (no near-ties)
INIT = 0.3
WINDOW = 24  # shorter than the suite's prompts, so sliding layers are exercised


def _llama_like(vocab: int, special: dict) -> dict:
    """Fields most decoder configs share (hidden 64, 2 layers, 4 query heads over 2 kv heads)."""
    return dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=INIT,
        **special,
    )


def _plain(config_class: str, **extra) -> Callable[[int, dict], object]:
    def build(vocab: int, special: dict):
        return getattr(transformers, config_class)(**(_llama_like(vocab, special) | extra))

    return build


def _gpt2(vocab, special):
    return transformers.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=INIT, **special)


def _gptj(vocab, special):
    return transformers.GPTJConfig(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256, initializer_range=INIT, **special)


def _gpt_neox(vocab, special):
    return transformers.GPTNeoXConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=256, initializer_range=INIT, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        **special,
    )


def _falcon(alibi: bool):
    def build(vocab, special):
        return transformers.FalconConfig(
            # the new decoder groups its 4 query heads over 2 kv heads; the ALiBi models (Falcon-RW) give each its own
            vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=4 if alibi else 2,
            new_decoder_architecture=not alibi, alibi=alibi, multi_query=False, parallel_attn=not alibi,
            max_position_embeddings=256, initializer_range=INIT, **special,
        )

    return build


def _bloom(vocab, special):
    return transformers.BloomConfig(vocab_size=vocab, hidden_size=64, n_layer=2, n_head=4, initializer_range=INIT, **special)


def _mpt(vocab, special):
    return transformers.MptConfig(
        vocab_size=vocab, d_model=64, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=256,
        attn_config={"alibi": True}, initializer_range=INIT, **special,
    )


def _opt(vocab, special):
    return transformers.OPTConfig(
        vocab_size=vocab, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
        word_embed_proj_dim=64, max_position_embeddings=256, init_std=INIT, **special,
    )


def _mamba(vocab, special):
    return transformers.MambaConfig(
        vocab_size=vocab, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
        initializer_range=INIT, use_mambapy=False, **special,
    )


def _mamba2(vocab, special):
    return transformers.Mamba2Config(
        vocab_size=vocab, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, num_heads=8, head_dim=16,
        n_groups=1, initializer_range=INIT, **special,
    )


def _falcon_h1(vocab, special):
    # a hybrid: attention and Mamba-2 heads side by side in every layer
    return transformers.FalconH1Config(
        **_llama_like(vocab, special), head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8,
        mamba_n_groups=1, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=16,
    )


def _jamba(vocab, special):
    # a hybrid: Mamba layers and attention layers in turn
    return transformers.JambaConfig(
        **_llama_like(vocab, special), num_experts=2, num_experts_per_tok=1, expert_layer_period=2, expert_layer_offset=1,
        attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
    )


def _lfm2(vocab, special):
    # a hybrid: short gated convolutions and attention layers
    return transformers.Lfm2Config(**_llama_like(vocab, special), layer_types=["conv", "full_attention"], conv_L_cache=3)


def _deepseek_v3(vocab, special):
    # multi-head latent attention: keys and values expand from a compressed latent, one per query head
    return transformers.DeepseekV3Config(
        **(_llama_like(vocab, special) | {"num_key_value_heads": 4}), kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        moe_intermediate_size=32, first_k_dense_replace=1,
    )


def _deepseek_v2(vocab, special):
    # multi-head latent attention without a compressed query (DeepSeek-V2-Lite's kind), greedy routing
    return transformers.DeepseekV2Config(
        **(_llama_like(vocab, special) | {"num_key_value_heads": 4}), kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
        first_k_dense_replace=1,
    )


def _recurrent_gemma(vocab, special):
    return transformers.RecurrentGemmaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, lru_width=64, attention_window_size=WINDOW, block_types=["recurrent", "attention", "recurrent"],
        initializer_range=INIT, **special,
    )


def _gemma_family(config_class: str, **extra):
    return _plain(config_class, head_dim=16, **extra)


def _gemma3_multimodal(vocab, special):
    text = transformers.Gemma3TextConfig(
        **_llama_like(vocab, special), head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"],
    )
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    return transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4, **special)


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

# name -> (config builder(vocab size, special token ids), model class or None for AutoModelForCausalLM)
ARCHITECTURES: dict[str, Callable[[int, dict], object]] = {
    "llama": _plain("LlamaConfig"),
    "llama-rope-llama3": _plain("LlamaConfig", rope_parameters=LLAMA3_ROPE),
    "qwen2": _plain("Qwen2Config"),
    "qwen2-sliding": _plain("Qwen2Config", use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "qwen3": _plain("Qwen3Config", head_dim=16),
    "qwen3_moe": _plain("Qwen3MoeConfig", head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
    "mistral": _plain("MistralConfig", sliding_window=None),
    "mistral-sliding": _plain("MistralConfig", sliding_window=WINDOW),
    "mixtral": _plain("MixtralConfig", num_local_experts=4, num_experts_per_tok=2),
    "gemma": _gemma_family("GemmaConfig"),
    "gemma2": _gemma_family("Gemma2Config", sliding_window=WINDOW, query_pre_attn_scalar=16, final_logit_softcapping=30.0,
                            attn_logit_softcapping=50.0),
    "gemma3_text": _gemma_family("Gemma3TextConfig", sliding_window=WINDOW, query_pre_attn_scalar=16,
                                 layer_types=["sliding_attention", "full_attention"]),
    "gemma3-multimodal": _gemma3_multimodal,
    "phi": _plain("PhiConfig", num_key_value_heads=4),
    "phi3": _plain("Phi3Config"),
    "olmo": _plain("OlmoConfig"),
    "olmo2": _plain("Olmo2Config"),
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "gptj": _gptj,
    "falcon": _falcon(alibi=False),
    "falcon-alibi": _falcon(alibi=True),
    "bloom": _bloom,
    "mpt": _mpt,
    "opt": _opt,
    "stablelm": _plain("StableLmConfig"),
    "granite": _plain("GraniteConfig", logits_scaling=8.0, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625),
    "cohere": _plain("CohereConfig", logit_scale=0.0625),
    "starcoder2": _plain("Starcoder2Config", sliding_window=WINDOW),
    "smollm3": _plain("SmolLM3Config", no_rope_layer_interval=2),
    "mamba": _mamba,
    "mamba2": _mamba2,
    "falcon_h1": _falcon_h1,
    "jamba": _jamba,
    "lfm2": _lfm2,
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v3,
    "recurrent_gemma": _recurrent_gemma,
}


def build_model(name: str, tokenizer, seed: int = 0):
    """A randomly initialised model of architecture `name` for `tokenizer`'s vocabulary, frozen,
    in eval mode and in float32."""
    import torch

    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = ARCHITECTURES[name](len(tokenizer), special)
    torch.manual_seed(seed)
    if name == "gemma3-multimodal":
        model = transformers.Gemma3ForConditionalGeneration(config)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model.float().eval().requires_grad_(False)


# The path each architecture's self-check chooses, and why the reference for those that take it.
REFERENCE_PATH = {
    "falcon-alibi": "ALiBi position biases",
    "mpt": "ALiBi position biases",
    "mamba": "no attention heads",
    "mamba2": "no attention heads",
    "falcon_h1": "LinearAttentionAndFullAttentionLayer layers",
    "jamba": "LinearAttentionLayer layers",
    "lfm2": "LinearAttentionLayer layers",
    "recurrent_gemma": "LinearAttentionLayer layers",
}

# Reference-path models whose rows the self-check sends one at a time through generation (left
# padding changes a Mamba layer's convolution state); every other reference-path model batches
# both scoring and generation.
ONE_ROW_GENERATION = {"mamba": "greedy tokens"}

# Reference-path models whose option scoring runs each context and option as one row, where
# encoding a context once and continuing its options from copies of its cache is not what the
# model computes alone (Jamba's Mamba layers take no several tokens after a cache), not possible
# (RecurrentGemma hands back no cache) or not checked (Mamba: left padding already failed).
WHOLE_ROW_SCORING = {"mamba": "", "jamba": "option log-likelihoods", "recurrent_gemma": "no attribute 'cache'"}


def loaded(name: str, tokenizer, seed: int = 0):
    """A LoadedModel of a fresh tiny model of architecture `name`, as `load_model` describes one."""
    from softeval.models.loading import _describe, model_identity

    model = build_model(name, tokenizer, seed)
    return _describe(name, model, tokenizer, model_identity(name, model, {"built": name}), None, lambda: model)
