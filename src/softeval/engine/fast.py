"""The fast path: batched greedy generation, option loglikelihoods and the tuning loss over a
frozen HF causal LM, computed outside the model's own forward.

Every path left-pads a batch and gives every row explicit position ids (counted from its own first
token), so a row's result does not depend on what else is in its batch. Vocabulary logits are
computed only where a token is chosen or scored: the LM head over a large vocabulary at every
position would otherwise dominate small models. Because all this runs the model's decoder and head
apart, an engine serves a model only once `softeval.engine.selfcheck` has measured that it
computes what the model's own forward does (`start_engine`); other models run on the reference
path (`softeval.engine.reference`).

An `Engine` holds the model's settings and budgets; each job is a class of its own module, which
the engine combines: `Generation` (generation.py, over pools and decode steps: pool.py,
decoding.py, text.py), `OptionScoring` (options.py), `TuningLoss` (loss.py), and `Forward`
(forward.py), the inputs, decoder and LM head they share.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache

from softeval.engine.forward import TOKEN_BUDGET, Forward
from softeval.engine.generation import DECODE_ROWS, Generation, kv_bytes_per_token, kv_cache_budget
from softeval.engine.logits import LogitTransform
from softeval.engine.loss import TuningLoss
from softeval.engine.options import OptionScoring
from softeval.errors import SoftevalError
from softeval.models import LoadedModel


class Engine(Generation, OptionScoring, TuningLoss, Forward):
    """The fast path over one model (and soft prompt): `generate`, `loglikelihood`, `target_loss`."""

    path = "fast"

    def __init__(
        self,
        lm: LoadedModel,
        batch_size: int | None = None,  # the most rows of a batch; None: as many as the budgets allow
        logits_chunk: int = 256,
        soft_prompt: torch.Tensor | None = None,  # (L, hidden), placed after BOS in every sequence
        token_budget: int = TOKEN_BUDGET,  # rows x padded width (soft prompt included) of a batch
        kv_cache_bytes: int | None = None,  # the KV cache of the rows decoding together; None: from free memory
    ):
        self.lm = lm
        self.soft_prompt = soft_prompt
        self.model = lm.model
        # Multimodal wrappers (Gemma 3 of 4B and up loads as Gemma3ForConditionalGeneration) keep
        # the text decoder's settings under a text config and the decoder itself inside the
        # wrapper; for plain causal LMs both are the model's own config and base model.
        self.text_config = lm.model.config.get_text_config()
        self.decoder = lm.model.get_decoder()  # the text transformer without its LM head
        # Padding costs as much as real tokens, and attention grows with the square of the width:
        # batches are cut by positions, so one long row does not make its batch quadratic.
        self.token_budget = token_budget
        self.batch_size = batch_size or token_budget  # every row takes at least one position
        self.decode_rows = batch_size or DECODE_ROWS
        self.logits_chunk = logits_chunk
        self.device = next(lm.model.parameters()).device
        self.kv_cache_bytes = kv_cache_bytes or kv_cache_budget(self.device)
        self.kv_positions = max(1, self.kv_cache_bytes // kv_bytes_per_token(self.text_config, lm.model.dtype))
        # In a decoding cache, sliding-window attention counts slots, not positions (a row's own
        # slots, without holes, are as far apart as their positions); a shared prefix is attended
        # to by positions. (Option scoring builds its own window mask from positions.)
        self.window = getattr(self.text_config, "sliding_window", None)
        self.layer_types = getattr(self.text_config, "layer_types", None)  # None: every layer alike
        self.sliding_layers = tuple(layer.is_sliding for layer in DynamicCache(config=self.text_config).layers)
        # Qwen configs set a window that no layer uses
        self.slides = self.window is not None and (self.layer_types is None or "sliding_attention" in self.layer_types)
        # Rotary scalings that change with the largest position in a batch would see a draft's
        # positions before plain decoding reaches them: no drafts for those models.
        self.speculates = not _rope_depends_on_length(self.text_config)
        # Option scoring hands the model a 4D mask of its own; other kernels (flash attention)
        # would read it as a padding mask and score wrongly.
        self.attention = self.decoder.config._attn_implementation
        if self.attention not in ("sdpa", "eager"):
            raise SoftevalError(
                f"{lm.name}: attention implementation {self.attention!r} is not supported; load the model with 'sdpa' or 'eager'"
            )
        self.transform = LogitTransform.of(lm.model)
        self.check: dict | None = None  # what the self-check measured, once `start_engine` made this engine
        # called, where set, with the prompts joining a decoding pool and the logits their first
        # tokens are chosen from: the self-check compares their log-probabilities
        self.observe_admission: Callable[[list[int], torch.Tensor], None] | None = None
        # Generation keeps a shared prefix apart from the rows' caches when the engine's SDPA
        # function can attend to it: not with eager attention, capped attention scores (Gemma 2)
        # or sliding layers other than one window counted in positions (chunked attention).
        self.prefix_apart = (
            self.attention == "sdpa"
            and not getattr(self.text_config, "attn_logit_softcapping", None)
            and (self.slides or not any(self.sliding_layers))
        )
        # positions run through the transformer and through the LM head, padding included:
        # the work actually done, for throughput figures
        self.positions_computed = 0
        self.logit_rows_computed = 0
        # draft tokens run through the model, those the model confirmed, and the positions of
        # draft columns that kept no token (rejected drafts, and the columns of rows with fewer)
        self.drafts_proposed = 0
        self.drafts_accepted = 0
        self.draft_positions_discarded = 0

    # --- generation ---------------------------------------------------------------------------


    # --- loglikelihood ----------------------------------------------------------------------------


    # --- tuning loss ------------------------------------------------------------------------------


    # --- shared pieces ------------------------------------------------------------------------------


def _rope_depends_on_length(config) -> bool:
    """Whether the rotary embedding is rescaled by the largest position in a batch (dynamic
    NTK scaling, LongRoPE)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kinds = [params] if "rope_type" in params else [p for p in params.values() if isinstance(p, dict)]
    return any(kind.get("rope_type") in ("dynamic", "longrope") for kind in kinds)


