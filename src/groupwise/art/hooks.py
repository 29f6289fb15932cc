"""ART's module-level functions that programs replace, and what that does here.

ART's modules look some of their helpers up at call time, so a program changes ART's behaviour by
assigning a module attribute: ``art.local.backend.tokenize_sft_batch = my_masking`` (which tokens SFT
trains on), ``art.utils.sft.create_lr_schedule = my_schedule``. Ported unchanged, such an assignment used
to be accepted silently and change nothing. Now each module at one of those ART paths is an `ArtModule`:

- a replacement of a helper that groupwise looks up the same way (`EFFECTIVE`: its own code calls it
  through the module at call time) takes effect, as in ART;
- a replacement of one of ART's helpers whose step groupwise does differently (`REFUSED`: tokenizing,
  masking and packing for the trainer) raises `ArtHookError` naming what to do instead;
- a replacement of any other function of the module is made, with one warning that groupwise's own code
  does not call it through the module (the program's own calls through the module see it, as in Python).
  Other attributes (a program's own) are set as usual.

`guard(module_name)` turns a module into an `ArtModule`; the modules call it on themselves
(``guard(__name__)``), so the rule holds from their first import.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from groupwise.errors import GroupwiseError, warn_art_difference

_SFT_MASKING = ("groupwise's trainer tokenizes and masks SFT batches itself (groupwise.training.tokenize), so "
                "a replacement would never be called. To choose the target tokens: TrainSFTConfig(assistant_turns="
                "'last') trains only each example's last assistant turn, 'all' every one (train_sft_from_file("
                "assistant_turns=...) too); to train other text, make it the assistant turns of the trajectories")
_RL_MASKING = ("groupwise's trainer tokenizes trajectory groups itself: it trains exactly the sampled tokens of "
               "each assistant Choice and keeps plain message dicts as context (groupwise.training.tokenize). "
               "To leave a turn out of the loss, put it in the trajectory as a message dict instead of its "
               "Choice; TrainConfig(train_forced_tokens=...) decides on tokens a grammar forced")
_PACKING = ("groupwise's trainer packs tokenized sequences into micro-batches itself; "
            "TrainConfig(micro_batch_tokens=..., max_seq_len=...) sizes them")

# module -> {ART's name: why a replacement would do nothing here, and what to use instead}
REFUSED: dict[str, dict[str, str]] = {
    "groupwise.art.local.backend": {
        "tokenize_sft_batch": _SFT_MASKING,
        "tokenize_trajectory_groups": _RL_MASKING,
        "packed_tensors_from_tokenized_results": _PACKING,
        "packed_tensors_to_dir": _PACKING,
        "plot_packed_tensors": _PACKING,
    },
}
# module -> names groupwise's own code calls through the module at call time: replacing them takes effect
EFFECTIVE: dict[str, frozenset[str]] = {
    "groupwise.art.utils.sft": frozenset({"create_lr_schedule", "iterate_file", "get_file_row_count",
                                      "create_sft_dataset_iterator"}),
}


class ArtHookError(GroupwiseError, AttributeError):
    """A program replaced a module-level function of ART that groupwise's code would never call."""


class ArtModule(types.ModuleType):
    """A module at one of ART's paths whose function replacements are checked (module doc)."""

    def __setattr__(self, name: str, value: Any) -> None:
        module = self.__name__
        art = "art" + module[len("groupwise"):]
        refused = REFUSED.get(module, {}).get(name)
        if refused is not None:
            raise ArtHookError(f"{art}.{name} = ... changes ART's behaviour, not groupwise's: {refused}.")
        if name not in EFFECTIVE.get(module, ()) and isinstance(self.__dict__.get(name), types.FunctionType):
            warn_art_difference(art, f"hook:{name}", (
                f"{art}.{name} was replaced; groupwise's own code does not call it through {art}, so only the "
                f"program's own calls through the module see the replacement (Hooks). "
                f"The names replacing which changes groupwise's behaviour here: "
                f"{sorted(EFFECTIVE.get(module, ())) or 'none'}"), stacklevel=3)
        super().__setattr__(name, value)


def guard(module_name: str) -> None:
    """Make `module_name` (already in sys.modules) an `ArtModule`."""
    module = sys.modules[module_name]
    if not isinstance(module, ArtModule):
        module.__class__ = ArtModule
