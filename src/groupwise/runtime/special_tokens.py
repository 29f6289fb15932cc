"""A tokenizer's special tokens (bos, eos, end of turn, pad), decided by groupwise from the model's own files.

Why groupwise decides instead of trusting the tokenizer object: transformers' conversions differ by
version. transformers 5.17 converts SmolLM2's GGUF with ``<|im_start|>`` as bos, eos AND pad, though
the GGUF's metadata says bos 1 (``<|im_start|>``), eos 2 and pad 2 (``<|im_end|>``); newer releases
read the metadata. Under 5.17 the engine stopped at the start of a turn, the trainer padded with the
token every chat starts with, and a random model built with that pad id (whose embedding row is
zeroed) produced a NaN gradient at its first update. So the tokens come from what the model ships:

    short names (a packaged GGUF)   the GGUF's ``tokenizer.ggml.{bos,eos,padding}_token_id``, read
                                    from its header here (the ``gguf`` package parses every tensor:
                                    seconds, on each load); loading.py passes the file
    a local folder                  tokenizer_config.json's bos/eos/pad token, else the ids of
                                    generation_config.json, else config.json (extra eos ids of
                                    generation_config.json, e.g. Llama 3's list, are stop tokens too)
    anything else (a hub id)        the tokenizer's own attributes

and the end of turn from the chat template itself: the special token the template writes right after
an assistant message's content. Two rules then hold whatever the source said: an eos equal to bos is
replaced by the end of turn when the template has a different one (a chat model's text ends where
its turn ends; that is exactly the 5.17 mis-conversion), and a pad equal to bos falls back to eos (a
pad must never be the token every sequence starts with). The engine stops at `stop_ids`.
`unused_token_id` is for benches and tests that build a RANDOM model: a token the chat template never
writes, so the zeroed embedding row of the model's pad never meets a real prompt.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from groupwise.errors import InvalidDataError

__all__ = ["SpecialTokens", "apply_special_tokens", "decide_special_tokens", "gguf_metadata", "special_tokens",
           "unused_token_id"]

_ATTR = "groupwise_special_tokens"  # where a tokenizer carries its decided tokens
_SENTINEL = "\u2063GWEOT\u2063"  # invisible separator: never produced by a chat template


@dataclass(frozen=True)
class SpecialTokens:
    """The decided tokens: each as text and id. `stop_ids`: every id that ends a generation."""

    bos: str | None
    bos_id: int | None
    eos: str
    eos_id: int
    end_of_turn: str | None
    end_of_turn_id: int | None
    pad: str
    pad_id: int
    stop_ids: frozenset[int]
    source: str  # which files the ids came from (for messages)


# ----------------------------------------------------------------------------- GGUF header

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: str | Path, keys: set[str] | None = None) -> dict[str, Any]:
    """The scalar key/values of a GGUF file's header (arrays are skipped), e.g.
    ``tokenizer.ggml.eos_token_id``; only `keys` when given. Reads the header, never the tensors."""
    out: dict[str, Any] = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InvalidDataError(f"{path} is not a GGUF file")
        (version,) = struct.unpack("<I", f.read(4))
        if version < 2:
            raise InvalidDataError(f"{path}: GGUF version {version} is not supported (2 or later)")
        _tensors, n_kv = struct.unpack("<QQ", f.read(16))
        for _ in range(n_kv):
            key = _gguf_string(f)
            (kind,) = struct.unpack("<I", f.read(4))
            if kind == _ARRAY:
                _gguf_skip_array(f)
                continue
            value = _gguf_string(f) if kind == _STRING else _gguf_scalar(f, kind)
            if keys is None or key in keys:
                out[key] = value
            if keys is not None and keys <= out.keys():
                break
    return out


def _gguf_string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8", errors="replace")


def _gguf_scalar(f: BinaryIO, kind: int) -> Any:
    fmt = _GGUF_SCALARS.get(kind)
    if fmt is None:
        raise InvalidDataError(f"unknown GGUF value type {kind}: the file is corrupt or from a newer GGUF writer")
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _gguf_skip_array(f: BinaryIO) -> None:
    kind, n = struct.unpack("<IQ", f.read(12))
    if kind == _STRING:  # each item has its own length
        for _ in range(n):
            (size,) = struct.unpack("<Q", f.read(8))
            f.seek(size, 1)
    elif kind == _ARRAY:
        for _ in range(n):
            _gguf_skip_array(f)
    else:
        f.seek(n * struct.calcsize(_GGUF_SCALARS[kind]), 1)


# ----------------------------------------------------------------------------- the model's declared tokens


@dataclass
class _Declared:
    """What a model's files declare; each entry a token text or an id (None: not declared)."""

    bos: str | int | None = None
    eos: str | int | None = None
    pad: str | int | None = None
    extra_stop_ids: tuple[int, ...] = ()
    source: str = "the tokenizer's own attributes"


def _declared_by_gguf(gguf: Path) -> _Declared:
    meta = gguf_metadata(gguf, {f"tokenizer.ggml.{k}_token_id" for k in ("bos", "eos", "padding")})
    return _Declared(bos=meta.get("tokenizer.ggml.bos_token_id"), eos=meta.get("tokenizer.ggml.eos_token_id"),
                     pad=meta.get("tokenizer.ggml.padding_token_id"), source=f"the GGUF metadata of {gguf}")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # a serialised AddedToken
        value = value.get("content")
    return value if isinstance(value, str) else None


def _first_id(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _declared_by_folder(folder: Path) -> _Declared:
    tok_cfg = _read_json(folder / "tokenizer_config.json")
    gen_cfg = _read_json(folder / "generation_config.json")
    cfg = _read_json(folder / "config.json")
    cfg = {**cfg.get("text_config", {}), **cfg} if isinstance(cfg.get("text_config"), dict) else cfg
    declared = _Declared(source=f"the files of {folder}")
    for name in ("bos", "eos", "pad"):
        for value in (_token_text(tok_cfg.get(f"{name}_token")), _first_id(gen_cfg.get(f"{name}_token_id")),
                      _first_id(cfg.get(f"{name}_token_id"))):
            if value is not None:
                setattr(declared, name, value)
                break
    extra: list[int] = []
    for value in (gen_cfg.get("eos_token_id"), cfg.get("eos_token_id")):
        extra += [v for v in (value if isinstance(value, list) else [value]) if _first_id(v) is not None]
    declared.extra_stop_ids = tuple(extra)
    return declared


def _declared(tokenizer: Any, source: str | None, gguf: str | Path | None) -> _Declared:
    if gguf is not None:
        return _declared_by_gguf(Path(gguf))
    where = source if source is not None else str(getattr(tokenizer, "name_or_path", "") or "")
    folder = Path(where).expanduser() if where else None
    if folder is not None and folder.is_dir():
        return _declared_by_folder(folder)
    return _Declared(bos=getattr(tokenizer, "bos_token", None), eos=getattr(tokenizer, "eos_token", None),
                     pad=getattr(tokenizer, "pad_token", None))


# ----------------------------------------------------------------------------- decision


def end_of_turn_token(tokenizer: Any) -> str | None:
    """The special token the chat template writes right after an assistant message's content, or None
    (no template, or plain text after the content)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that raises on this conversation declares no end of turn to us
        return None
    if not isinstance(text, str) or _SENTINEL not in text:
        return None
    tail = text[text.index(_SENTINEL) + len(_SENTINEL):]
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    names = [t.content for t in added.values() if getattr(t, "special", False)]
    names += [t for t in (getattr(tokenizer, "all_special_tokens", None) or []) if isinstance(t, str)]
    matches = [name for name in names if name and tail.startswith(name)]
    return max(matches, key=len) if matches else None


def _resolve(tokenizer: Any, value: str | int | None) -> tuple[str, int] | None:
    """(text, id) of a declared token, or None when it is not in the vocabulary."""
    if value is None:
        return None
    size = len(tokenizer)
    if isinstance(value, int):
        if not 0 <= value < size:
            return None
        return str(tokenizer.convert_ids_to_tokens(value)), value
    token_id = tokenizer.convert_tokens_to_ids(value)
    if not isinstance(token_id, int) or not 0 <= token_id < size:
        return None
    if token_id == getattr(tokenizer, "unk_token_id", None) and value != getattr(tokenizer, "unk_token", None):
        return None  # an unknown text maps to unk
    return value, token_id


def decide_special_tokens(tokenizer: Any, source: str | None = None, *, gguf: str | Path | None = None) -> SpecialTokens:
    """Decide bos, eos, end of turn and pad (see the module docstring). `gguf`: the GGUF file the
    tokenizer was converted from (its metadata declares the tokens); else `source`, the folder it came
    from (default: its ``name_or_path``)."""
    from groupwise.errors import ConfigError

    declared = _declared(tokenizer, source, gguf)
    bos = _resolve(tokenizer, declared.bos)
    eos = _resolve(tokenizer, declared.eos)
    eot_text = end_of_turn_token(tokenizer)
    eot = _resolve(tokenizer, eot_text)
    if eos is None or (bos is not None and eos[1] == bos[1] and eot is not None and eot[1] != bos[1]):
        eos = eot
    if eos is None:
        raise ConfigError(f"the tokenizer has no end-of-sequence token: none is declared in {declared.source} "
                          "and its chat template writes no special token after an assistant message; save "
                          "the model with an eos_token (tokenizer_config.json) or eos_token_id (config.json)",
                          what="tokenizer")
    pad = _resolve(tokenizer, declared.pad)
    if pad is None or (bos is not None and pad[1] == bos[1]):
        pad = eos
    stops = {eos[1]} | ({eot[1]} if eot is not None else set())
    stops |= {i for i in declared.extra_stop_ids if 0 <= i < len(tokenizer)}
    return SpecialTokens(bos=bos[0] if bos else None, bos_id=bos[1] if bos else None, eos=eos[0], eos_id=eos[1],
                         end_of_turn=eot[0] if eot else None, end_of_turn_id=eot[1] if eot else None,
                         pad=pad[0], pad_id=pad[1], stop_ids=frozenset(stops), source=declared.source)


def apply_special_tokens(tokenizer: Any, tokens: SpecialTokens) -> Any:
    """Set the tokenizer's bos/eos/pad to the decided tokens and keep the decision on it; returns it."""
    if tokens.bos is not None:
        tokenizer.bos_token = tokens.bos
    tokenizer.eos_token = tokens.eos
    tokenizer.pad_token = tokens.pad
    object.__setattr__(tokenizer, _ATTR, tokens)
    return tokenizer


def special_tokens(tokenizer: Any) -> SpecialTokens:
    """The tokenizer's decided tokens: those `load_tokenizer` decided, else decided now from the folder
    it names (for a short name's cache folder, written by some transformers, the two rules above
    still give the GGUF's tokens)."""
    tokens = getattr(tokenizer, _ATTR, None)
    if isinstance(tokens, SpecialTokens):
        return tokens
    tokens = decide_special_tokens(tokenizer)
    object.__setattr__(tokenizer, _ATTR, tokens)
    return tokens


def unused_token_id(tokenizer: Any) -> int:
    """A special token that no chat prompt contains: the pad id for a RANDOMLY initialised model.

    transformers zeroes the embedding row of a config's pad_token_id. When that token is in every
    prompt (as the start of turn, or ``<|im_end|>`` after each message), a random model carries a
    zero vector through the whole network at those positions; one at position 0 gave NaN gradients.
    A token the chat template never writes keeps the zero row away from real prompts.
    """
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    written = set(tokenizer(text, add_special_tokens=True)["input_ids"])
    decided = special_tokens(tokenizer)
    written |= {i for i in (decided.bos_id, decided.eos_id, decided.end_of_turn_id) if i is not None}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for token_id in sorted(added):
        if getattr(added[token_id], "special", False) and token_id not in written:
            return token_id
    from groupwise.errors import ConfigError

    raise ConfigError("every special token of this tokenizer appears in a chat prompt; pass a pad id yourself",
                      what="tokenizer")
