"""Special tokens are groupwise's decision from the model's own files, the same under every transformers.

transformers 5.17 converts SmolLM2's GGUF with ``<|im_start|>`` as bos, eos and pad; newer releases
read the GGUF's metadata (eos = pad = ``<|im_end|>``). CI installs only the newest release, so the
5.17 conversion is simulated here (a tokenizer, and a cache folder, whose bos/eos/pad are all
``<|im_start|>``); `test_a_real_transformers_517_install_decides_the_same_tokens` runs the real set-up
in a subprocess when GROUPWISE_TRANSFORMERS_517 names a folder holding that release (e.g.
``pip install --no-deps --target DIR "transformers==5.17.*" "huggingface_hub>=1.5,<2"``).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from groupwise.runtime.loading import load_tokenizer, packaged_file
from groupwise.runtime.special_tokens import (SpecialTokens, apply_special_tokens, decide_special_tokens, special_tokens,
                                      unused_token_id)

pytest.importorskip("transformers")

DECIDED_ATTR = "groupwise_special_tokens"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m")


def as_517(tokenizer):
    """What transformers 5.17 made of SmolLM2's GGUF: bos, eos and pad all ``<|im_start|>``."""
    broken = copy.deepcopy(tokenizer)
    broken.__dict__.pop(DECIDED_ATTR, None)
    for name in ("bos_token", "eos_token", "pad_token"):
        setattr(broken, name, "<|im_start|>")
    assert broken.eos_token_id == broken.pad_token_id == broken.bos_token_id == 1
    return broken


def from_the_gguf() -> dict:
    """SmolLM2's tokens read from its GGUF by the `gguf` package (not by groupwise's header reader),
    and its end of turn from rendering the GGUF's chat template with jinja2 (not transformers)."""
    gguf = pytest.importorskip("gguf")
    import jinja2

    reader = gguf.GGUFReader(str(packaged_file("smollm2-135m")))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    template = jinja2.Environment().from_string(field("tokenizer.chat_template"))
    text = template.render(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "@@"}],
                           add_generation_prompt=False)
    tokens = field("tokenizer.ggml.tokens")
    after = text.split("@@", 1)[1]
    end_of_turn = max((t for t in tokens if t.startswith("<|") and after.startswith(t)), key=len)
    return dict(bos_id=field("tokenizer.ggml.bos_token_id"), eos_id=field("tokenizer.ggml.eos_token_id"),
                pad_id=field("tokenizer.ggml.padding_token_id"), end_of_turn=end_of_turn,
                end_of_turn_id=tokens.index(end_of_turn))


def test_smollm2_tokens_are_the_ones_its_own_files_declare(tok):
    want = from_the_gguf()
    got = special_tokens(tok)
    assert (got.bos_id, got.eos_id, got.pad_id) == (want["bos_id"], want["eos_id"], want["pad_id"]) == (1, 2, 2)
    assert (got.end_of_turn, got.end_of_turn_id) == (want["end_of_turn"], want["end_of_turn_id"]) == ("<|im_end|>", 2)
    assert got.stop_ids == {2}
    # load_tokenizer set them on the tokenizer, so every user of tokenizer.eos_token_id agrees
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")


def test_a_517_conversion_is_decided_the_same(tok, tmp_path):
    decided = special_tokens(tok)
    broken = as_517(tok)
    # the tokenizer object, with the GGUF it was converted from (what load_tokenizer passes)
    assert decide_special_tokens(broken, gguf=packaged_file("smollm2-135m")) == decided
    # a folder saved from it declares the 5.17 tokens in tokenizer_config.json: the rules still decide
    # eos = the template's end of turn (eos == bos) and pad = eos (pad == bos)
    broken.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())["eos_token"] == "<|im_start|>"
    from_folder = decide_special_tokens(broken, str(tmp_path / "saved"))
    assert (from_folder.bos_id, from_folder.eos_id, from_folder.end_of_turn_id, from_folder.pad_id) == (1, 2, 2, 2)


def test_a_cache_converted_by_517_loads_with_the_decided_tokens(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path))
    as_517(tok).save_pretrained(tmp_path / "models" / "smollm2-135m")  # the stale cache a 5.17 machine left
    loaded = load_tokenizer("smollm2-135m")
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (1, 2, 2)
    assert special_tokens(loaded) == special_tokens(tok)


def test_the_engine_stops_at_the_decided_end_of_turn(tiny):
    from groupwise.inference.engine import Engine

    model, tokenizer = tiny
    engine = Engine(model, as_517(tokenizer), max_batch_size=2)
    try:
        assert engine.eos_token_ids == {2}  # <|im_end|>; never <|im_start|>, which starts every turn
    finally:
        engine.close()


def test_a_folder_declares_extra_stop_ids_in_generation_config(tok, tmp_path):
    folder = tmp_path / "model"
    tok.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    decided = decide_special_tokens(tok, str(folder))
    assert decided.eos_id == 2 and decided.stop_ids == {0, 2}


def test_a_random_models_pad_is_a_token_no_prompt_contains(tok):
    pad = unused_token_id(tok)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    prompt = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert pad not in prompt and pad not in {1, 2}
    assert tok.convert_ids_to_tokens(pad) == "<|endoftext|>"


def test_applying_keeps_the_decision_on_the_tokenizer(tok):
    broken = as_517(tok)
    decided = special_tokens(tok)
    assert isinstance(decided, SpecialTokens)
    apply_special_tokens(broken, decided)
    assert (broken.bos_token_id, broken.eos_token_id, broken.pad_token_id) == (1, 2, 2)
    assert special_tokens(broken) is decided


SETUP = """
import json, transformers
from groupwise.runtime.loading import load_tokenizer
from groupwise.runtime.special_tokens import special_tokens
tok = load_tokenizer("smollm2-135m")
d = special_tokens(tok)
print(json.dumps(dict(version=transformers.__version__, bos=d.bos_id, eos=d.eos_id, eot=d.end_of_turn_id,
                      pad=d.pad_id, stops=sorted(d.stop_ids),
                      tokenizer=[tok.bos_token_id, tok.eos_token_id, tok.pad_token_id])))
"""


def run_setup(tmp_path, pythonpath: list[str], cache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), "GROUPWISE_CACHE": str(tmp_path / cache)}
    out = subprocess.run([sys.executable, "-c", SETUP], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.environ.get("GROUPWISE_TRANSFORMERS_517"),
                    reason="set GROUPWISE_TRANSFORMERS_517 to a folder holding transformers 5.17 (see the module doc)")
def test_a_real_transformers_517_install_decides_the_same_tokens(tmp_path):
    import groupwise

    src = os.path.dirname(os.path.dirname(groupwise.__file__))
    old = run_setup(tmp_path, [os.environ["GROUPWISE_TRANSFORMERS_517"], src], "c517")  # converts afresh
    new = run_setup(tmp_path, [src], "cnew")
    assert old.pop("version").startswith("5.17.") and not new.pop("version").startswith("5.17.")
    assert old == new == dict(bos=1, eos=2, eot=2, pad=2, stops=[2], tokenizer=[1, 2, 2])
