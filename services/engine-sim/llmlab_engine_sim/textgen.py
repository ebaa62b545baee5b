"""Deterministic text and the simulator's prompt-token counting rule.

Token counting (no real tokenizer; documented so callers can predict ``usage``):

* text: one token per regex match of ``\\w+|[^\\w\\s]`` (a run of word characters, or one
  punctuation/symbol character); whitespace is free. ``"Hello, world!"`` is 4 tokens.
* completions: the prompt's text count (a prompt given as token ids counts one per id).
* chat: 3 + the sum over messages of (4 + the text count of the message's content), where a list
  content counts its ``text`` parts; other fields (name, tool calls, tools) are not counted.

Generated text: each token is ``" " + word`` from a fixed vocabulary, drawn by a PRNG seeded with
(server seed, prompt hash, request ``seed``), so the same request always gets the same text and a
smaller ``max_tokens`` gives a prefix of it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import zlib
from collections.abc import Sequence
from typing import Any

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
# Extra tokens per chat message (role and separators) and per conversation (assistant header).
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_PER_CONVERSATION = 3
VOCAB_SIZE = 128000  # token ids reported by /tokenize lie below this
_SPECIAL_ID = VOCAB_SIZE  # ids at and above: chat-template tokens

_WORDS_TEXT = (
    "the of and to in is that it was for on are as with his they at be this from have or by one had"
    " not but what all were when we there can an your which their said if do will each about how up"
    " out them then she many some so these would other into has more her two like him see time could"
    " no make than first been its who now people my made over did down only way find use may water"
    " long little very after words called just where most know get through back much before go good"
    " new write our used me man too any day same right look think also around another came come work"
    " three word must because does part even place well such here take why things help put years"
    " different away again off went old number great tell men say small every found still between"
    " name should home big give air line set own under read last never us left end along while might"
    " next sound below saw something thought both few those always looked show large often together"
    " asked house world going want school important until form food keep children feet land side"
    " without boy once animals life enough took sometimes four head above kind began almost live page"
    " got earth need far hand high year mother light parts country father let night following picture"
    " being study second eyes soon times story boys since white days ever paper hard near sentence"
    " better best across during today others however sure means knew try told young miles sun ways"
    " thing whole hear example heard several change answer room sea against top turned learn point"
    " city play toward five using himself usually"
)
VOCAB: tuple[str, ...] = tuple(" " + w for w in dict.fromkeys(_WORDS_TEXT.split()))


def count_text_tokens(text: str) -> int:
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message's content (string, or the ``text`` of a list of parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def count_chat_tokens(messages: Sequence[dict[str, Any]]) -> int:
    return CHAT_TOKENS_PER_CONVERSATION + sum(
        CHAT_TOKENS_PER_MESSAGE + count_text_tokens(message_text(m)) for m in messages
    )


def _piece_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % VOCAB_SIZE


def tokenize_text(text: str) -> list[int]:
    """Stable fake token ids, one per counted token (for ``/tokenize``)."""
    return [_piece_id(m.group()) for m in _TOKEN_RE.finditer(text)]


def tokenize_chat(messages: Sequence[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for m in messages:
        ids.extend(range(_SPECIAL_ID, _SPECIAL_ID + CHAT_TOKENS_PER_MESSAGE))
        ids.extend(tokenize_text(message_text(m)))
    ids.extend(range(_SPECIAL_ID, _SPECIAL_ID + CHAT_TOKENS_PER_CONVERSATION))
    return ids


def prompt_key(prompt: str | list[int] | Sequence[dict[str, Any]]) -> bytes:
    """A canonical byte form of a prompt, for seeding."""
    if isinstance(prompt, str):
        return prompt.encode()
    return json.dumps(prompt, sort_keys=True, separators=(",", ":"), default=str).encode()


def text_seed(server_seed: int, key: bytes, request_seed: int | None) -> int:
    h = hashlib.blake2b(key, digest_size=8, person=b"llmlab-sim")
    h.update(f"|{server_seed}|{request_seed}".encode())
    return int.from_bytes(h.digest(), "big")


def generate_tokens(n: int, seed: int) -> list[str]:
    return random.Random(seed).choices(VOCAB, k=n)


def apply_stop(tokens: list[str], stop: Sequence[str]) -> tuple[list[str], bool]:
    """Cut the output at the first stop string: the emitted text ends before it, and the tokens
    that formed it are still generated (and counted) with empty text, as an engine does.
    Returns (pieces, stopped)."""
    stops = [s for s in stop if s]
    if not stops:
        return tokens, False
    text = "".join(tokens)
    hits = [(i, s) for s in stops if (i := text.find(s)) != -1]
    if not hits:
        return tokens, False
    start, s = min(hits)
    end = start + len(s)  # the stop is complete once the token holding its last char is out
    pieces: list[str] = []
    pos = 0
    for tok in tokens:
        if pos >= end:
            break
        keep = max(0, min(len(tok), start - pos))
        pieces.append(tok[:keep])
        pos += len(tok)
    return pieces, True
