"""The §4 quality sets and their scoring rule, without an engine: the sizes the tutorial asks for, every
item's hand-written answer passing its own rule, and every rule able to fail (the run itself, on real
engines: ``python -m llmlab_experiments --only real_quant_quality``; a quick run in test_real.py)."""

from __future__ import annotations

import pytest
from llmlab_experiments import quality_sets as q


def test_the_sets_have_the_tutorials_sizes_and_no_repeats() -> None:
    by_layer = {layer: [i for i in q.ALL_ITEMS if i.layer == layer] for layer in q.SIZES}
    assert {layer: len(v) for layer, v in by_layer.items()} == {"knowledge": 100, "korean": 50, "service": 50}
    assert len({i.id for i in q.ALL_ITEMS}) == len({i.prompt for i in q.ALL_ITEMS}) == 200
    quick = q.items(quick=True)
    assert {i.layer for i in quick} == set(q.SIZES) and len(quick) == 12


@pytest.mark.parametrize("item", q.ALL_ITEMS, ids=lambda i: i.id)
def test_every_items_own_answer_passes_and_the_usual_failures_do_not(item: q.Item) -> None:
    assert q.classify(item, item.example, "stop") is None, item.example
    assert q.classify(item, "", "stop") == "empty_or_truncated"
    assert q.classify(item, " \n", "length") == "empty_or_truncated"
    # Repeating the prompt is no answer (what a small model does most in Korean).
    assert q.classify(item, item.prompt, "stop") == "ignored_instruction"


def test_every_rule_rejects_answers_written_for_other_prompts() -> None:
    """A rule that passes anything cannot fail: each one must reject most of the other items' answers of its
    layer. Knowledge answers are one fact each, so none may pass another question (whole-word matching: '12'
    is not inside '1912', 'Mars' not inside 'Marseille')."""
    for layer in q.SIZES:
        mine = [i for i in q.ALL_ITEMS if i.layer == layer]
        for item in mine:
            passed = [o.id for o in mine if o is not item and q.classify(item, o.example, "stop") is None]
            if layer == "knowledge":
                assert passed == [], (item.id, passed)
            else:
                assert len(passed) <= 3, (item.id, passed)


@pytest.mark.parametrize(
    ("item_id", "answer", "failure"),
    [
        ("k01", "Paris.", None),
        ("k01", "The capital of France is Marseille.", "wrong_fact"),
        ("k01", "파리", "wrong_language"),
        ("k70", "It sank in 1912.", None),
        ("k42", "It sank in 1912.", "wrong_fact"),  # '12' only as a whole word
        ("ko01", "서울입니다", None),  # Korean attaches endings: a substring match
        ("ko01", "Seoul", "wrong_language"),
        ("ko02", "답은 7입니다", "ignored_instruction"),
        ("ko02", "8", "wrong_fact"),
        ("s01", '{"intent": "refund", "priority": "high"} I hope this helps!', "format_broken"),
        ("s01", '{"intent": "refund", "priority"', "empty_or_truncated"),  # cut by max_tokens: "length"
        ("s01", '```json\n{"intent": "refund", "priority": "high"}\n```', None),
        ("s13", "jane.doe@example.com", None),  # the answer is in the prompt, and not an echo
        ("s37", "Call 555-1234", "ignored_instruction"),
        ("s45", "$0.5", None),
        ("s45", "0.25", "wrong_fact"),
        ("s32", '["apple", "banana"]', "ignored_instruction"),
    ],
)
def test_the_rule_names_the_first_failure(item_id: str, answer: str, failure: str | None) -> None:
    item = next(i for i in q.ALL_ITEMS if i.id == item_id)
    finish = "length" if answer.endswith('"priority"') else "stop"
    assert q.classify(item, answer, finish) == failure
