"""edge_onnx's pure parts: the token-by-token agreement, the variants, the prompts' chat format."""

from __future__ import annotations

import pytest
from llmlab_experiments import edge_onnx as m


def test_first_divergence_counts_the_shared_leading_ids() -> None:
    assert m.first_divergence([5, 6, 7], [5, 6, 7]) == 3
    assert m.first_divergence([5, 6, 7], [5, 9, 7]) == 1  # later agreement does not count
    assert m.first_divergence([4], [5]) == 0
    assert m.first_divergence([5, 6], [5, 6, 7]) == 2


def test_agreement_over_prompts() -> None:
    a = [[1, 2, 3, 4], [1, 2, 3, 4], [9, 9, 9, 9]]
    b = [[1, 2, 3, 4], [1, 2, 0, 4], [8, 9, 9, 9]]
    got = m.agreement(a, b, max_tokens=4)
    assert got == {"identical": 1, "n": 3, "mean_shared_prefix": 2.0, "shared_prefix": [4, 2, 0]}
    with pytest.raises(ValueError):
        m.agreement(a, b[:2], max_tokens=4)  # one answer per prompt on both sides


def test_the_variants_cover_shapes_levels_int8_and_threads() -> None:
    full = m.variants(quick=False)
    assert len({v.key for v in full}) == len(full) and full[0].key == "dyn-fp32-all"  # the reference runs first
    assert {v.level for v in full} == {"disable", "basic", "extended", "all"}
    assert {(v.shapes, v.weights) for v in full} == {("dynamic", "fp32"), ("static", "fp32"), ("dynamic", "int8"),
                                                    ("static", "int8")}  # fmt: skip
    assert {v.threads for v in full} == {1, 2}
    quick = m.variants(quick=True)
    assert quick[0].key == "dyn-fp32-all" and {v.key for v in quick} <= {v.key for v in full}


@pytest.mark.vllm_cpu
def test_prompts_are_the_chat_format_as_ids() -> None:
    its = m.knowledge(quick=True)
    ids = m.prompt_ids(its)
    text = m.tokenizer().decode(ids[0], skip_special_tokens=False)
    assert text == (
        f"<|im_start|>system\n{m.SYSTEM}<|im_end|>\n<|im_start|>user\n{its[0].prompt}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # <|im_start|> (id 1) opens three turns and <|im_end|> (id 2) closes two: each a single special id
    assert ids[0].count(1) == 3 and ids[0].count(2) == 2
