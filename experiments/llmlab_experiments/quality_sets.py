"""The quality sets of §4 at the tutorial's sizes, written for this project: 100 knowledge questions, 50 Korean
instruction-following prompts and 50 service-style prompts, each with its scoring rule and a passing answer
written by hand (``example``: the rule's own test, see experiments/tests/test_quality_sets.py).

Scoring rule, the same for every item: an empty answer is ``empty_or_truncated``; an answer that repeats the
prompt is ``ignored_instruction``; then the item's checks run in order and the first that fails names the
failure (``wrong_language``, ``format_broken``, ``ignored_instruction``, ``wrong_fact``); a format cut off by
max_tokens counts as a truncation. Every check is deterministic (contains, exact, number, JSON, word count,
script share), so a greedy answer gets the same verdict on every run.

Knowledge answers match as whole words (``Mars`` not inside ``Marseille``, ``12`` not inside ``1912``); Korean
matches as substrings (Korean attaches particles to words: 서울 inside 서울입니다).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FAILURE_TYPES = ("empty_or_truncated", "wrong_language", "format_broken", "ignored_instruction", "wrong_fact")
SIZES = {"knowledge": 100, "korean": 50, "service": 50}  # the tutorial's §4 sizes

Check = Callable[[str], bool]


@dataclass(frozen=True)
class Item:
    id: str
    layer: str  # knowledge | korean | service
    prompt: str
    # (failure type, check that must hold); evaluated in order, the first failing one classifies the answer
    checks: tuple[tuple[str, Check], ...]
    example: str  # an answer that passes, written by hand
    quick: bool = False  # part of the --quick subset


# ---- checks ----------------------------------------------------------------------------------------------------


def _has(*words: str) -> Check:
    return lambda t: any(w.lower() in t.lower() for w in words)


def _says(*answers: str) -> Check:
    """One of ``answers`` as whole words, case-insensitive."""
    pats = [re.compile(rf"(?<!\w){re.escape(a)}(?!\w)", re.I) for a in answers]
    return lambda t: any(p.search(t) for p in pats)


def _contains(text: str) -> Check:
    """Case-sensitive: for instructions about letter case."""
    return lambda t: text in t


def _hangul(t: str) -> bool:
    letters = [c for c in t if c.isalpha()]
    return bool(letters) and sum("\uac00" <= c <= "\ud7a3" for c in letters) / len(letters) >= 0.5


def _latin(t: str) -> bool:
    """No other script: a bare number ("1945") is in no language and passes."""
    letters = [c for c in t if c.isalpha()]
    return not letters or sum(c.isascii() for c in letters) / len(letters) >= 0.8


def _words_at_most(n: int) -> Check:
    return lambda t: 0 < len(re.findall(r"\w+", t)) <= n


def _one_token(t: str) -> bool:
    """One whitespace-separated token (an address, a code)."""
    return len(t.split()) == 1


def _number(t: str) -> float | None:
    """The answer as a number when it is nothing else (a leading $ and a closing period allowed)."""
    s = t.strip().removeprefix("$").rstrip(".").strip()
    if not re.fullmatch(r"-?\d+(\.\d+)?", s):
        return None
    return float(s)


def _number_only(t: str) -> bool:
    return _number(t) is not None


def _equals(v: float) -> Check:
    return lambda t: _number(t) == v


def _exactly(*words: str) -> Check:
    """The whole answer is one of ``words`` (case-insensitive, quotes and closing punctuation ignored)."""
    allowed = {w.lower() for w in words}
    return lambda t: t.strip().strip("'\"").rstrip(".!").strip().lower() in allowed


def _unfence(t: str) -> str:
    return t.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()


def _json_value(t: str) -> Any:
    """The complete JSON value the answer starts with (code fence allowed), text after it ignored."""
    try:
        v, _ = json.JSONDecoder().raw_decode(_unfence(t))
    except ValueError:
        return None
    return v


def _json_obj(t: str) -> dict[str, Any] | None:
    v = _json_value(t)
    return v if isinstance(v, dict) else None


def _json_only(t: str) -> bool:
    """Nothing but one JSON object or array (in a code fence or not)."""
    s = _unfence(t)
    try:
        v, end = json.JSONDecoder().raw_decode(s)
    except ValueError:
        return False
    return isinstance(v, dict | list) and not s[end:].strip().strip("`").strip()


def _json_field(key: str, check: Check) -> Check:
    return lambda t: check(str((_json_obj(t) or {}).get(key, "")))


def _json_keys(*keys: str) -> Check:
    return lambda t: set(keys) <= set(_json_obj(t) or {})


def _one_sentence(t: str) -> bool:
    return len(re.findall(r"[.!?](\s|$)", t.strip())) <= 1


def _sentences_at_most(n: int) -> Check:
    return lambda t: len(re.findall(r"[.!?](\s|$)", t.strip())) <= n


def _starts(prefix: str) -> Check:
    return lambda t: t.strip().strip("'\"").startswith(prefix)


def _ends(suffix: str) -> Check:
    return lambda t: t.strip().strip("'\"").rstrip(".!").endswith(suffix)


def _lines(t: str) -> list[str]:
    return [ln.strip() for ln in t.strip().splitlines() if ln.strip()]


def _first_line(t: str) -> str:
    return t.strip().splitlines()[0].strip() if t.strip() else ""


def _matches(pattern: str) -> Check:
    p = re.compile(pattern)
    return lambda t: p.search(t) is not None


def _bullets(n: int) -> Check:
    return lambda t: sum(ln.startswith("- ") for ln in _lines(t)) >= n


JSON_FORMAT: tuple[tuple[str, Check], ...] = (
    ("format_broken", lambda t: _json_obj(t) is not None),
    ("format_broken!", _json_only),  # "!": complete JSON, then chatter: never a truncation
)


# ---- knowledge: 100 questions, "Answer in a few words." ---------------------------------------------------------


def _knowledge(i: int, q: str, *answers: str, quick: bool = False) -> Item:
    return Item(
        f"k{i:02d}" if i < 100 else f"k{i}",
        "knowledge",
        q + " Answer in a few words.",
        (("wrong_language", _latin), ("ignored_instruction", _words_at_most(25)), ("wrong_fact", _says(*answers))),
        f"{answers[0]}.",
        quick,
    )


_K: list[tuple[Any, ...]] = [
    ("What is the capital of France?", "Paris", True),
    ("What is the capital of Japan?", "Tokyo", True),
    ("Which planet is known as the Red Planet?", "Mars", True),
    ("What is the chemical formula of water?", "H2O", "H₂O", True),
    ("How many days are in a week?", "seven", "7", True),
    ("Who wrote Romeo and Juliet?", "Shakespeare", True),
    ("What is the largest planet in our solar system?", "Jupiter"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("At what temperature in Celsius does water freeze?", "0", "zero"),
    ("At what temperature in Celsius does water boil?", "100"),
    ("How many legs does a spider have?", "eight", "8"),
    ("Who painted the Mona Lisa?", "Leonardo", "da Vinci"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("What is the tallest mountain in the world?", "Everest"),
    ("Which language is mainly spoken in Brazil?", "Portuguese"),
    ("What is the currency of Japan?", "yen"),
    ("Who was the first person to walk on the Moon?", "Armstrong"),
    ("What is the capital of the United Kingdom?", "London"),
    ("What gas do plants absorb from the air for photosynthesis?", "carbon dioxide", "CO2"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the capital of Australia?", "Canberra"),
    ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Russia?", "Moscow"),
    ("What is the capital of China?", "Beijing", "Peking"),
    ("What is the capital of India?", "New Delhi", "Delhi"),
    ("What is the capital of South Korea?", "Seoul"),
    ("What is the capital of Greece?", "Athens"),
    ("What is the capital of Portugal?", "Lisbon"),
    ("What is the longest river in Africa?", "Nile"),
    ("What is the largest hot desert in the world?", "Sahara"),
    ("On which continent is Kenya?", "Africa"),
    ("Which country is the kangaroo native to?", "Australia"),
    ("Which planet is second from the Sun?", "Venus"),
    ("Which planet is famous for its bright rings?", "Saturn"),
    ("What is the star at the center of our solar system called?", "Sun"),
    ("What is the name of Earth's natural satellite?", "Moon"),
    ("How many sides does a hexagon have?", "six", "6"),
    ("How many sides does a triangle have?", "three", "3"),
    ("What is 9 times 9?", "81", "eighty-one"),
    ("What is the square root of 144?", "12", "twelve"),
    ("How many minutes are in an hour?", "60", "sixty"),
    ("How many hours are in a day?", "24", "twenty-four"),
    ("What is 15 plus 27?", "42", "forty-two"),
    ("What is the chemical symbol for gold?", "Au"),
    ("What is the chemical symbol for iron?", "Fe"),
    ("What is the chemical symbol for sodium?", "Na"),
    ("What gas do humans need to breathe to stay alive?", "oxygen"),
    ("What is the hardest natural material?", "diamond"),
    ("What is the center of an atom called?", "nucleus"),
    ("Which part of a plant mostly carries out photosynthesis?", "leaf", "leaves"),
    ("What force pulls objects toward the Earth?", "gravity"),
    ("At what temperature in Fahrenheit does water freeze?", "32"),
    ("How many bones are in the adult human body?", "206"),
    ("Which organ pumps blood through the human body?", "heart"),
    ("What is the largest organ of the human body?", "skin"),
    ("How many chambers does the human heart have?", "four", "4"),
    ("About how many kilometers per second does light travel?", "300,000", "300000", "299,792", "300 000"),
    ("Who developed the theory of relativity?", "Einstein"),
    ("Who discovered penicillin?", "Fleming"),
    ("Who proposed the theory of evolution by natural selection?", "Darwin"),
    ("Who is credited with inventing the telephone?", "Bell"),
    ("Who was the first President of the United States?", "Washington"),
    ("Who painted The Starry Night?", "Van Gogh", "Gogh"),
    ("Who wrote Pride and Prejudice?", "Austen"),
    ("Which ancient Greek poet is said to have written the Odyssey?", "Homer"),
    ("Which composer wrote the Moonlight Sonata?", "Beethoven"),
    ("In which year did World War II end?", "1945"),
    ("In which year did the Titanic sink?", "1912"),
    ("In which year did humans first land on the Moon?", "1969"),
    ("Which country gave the Statue of Liberty to the United States?", "France"),
    ("What is the largest country in the world by area?", "Russia"),
    ("Which language has the most native speakers in the world?", "Mandarin", "Chinese"),
    ("What is the currency of the United States?", "dollar", "dollars", "USD"),
    ("What is the currency of the United Kingdom?", "pound", "pounds", "sterling"),
    ("What is the currency of Germany today?", "euro", "euros"),
    ("What is the largest animal on Earth?", "blue whale"),
    ("What is the fastest land animal?", "cheetah"),
    ("Which animal is called the king of the jungle?", "lion"),
    ("What sweet food do bees make?", "honey"),
    ("What is a baby dog called?", "puppy", "pup"),
    ("How many players does a soccer team have on the field?", "11", "eleven"),
    ("In which sport do players score a touchdown?", "American football", "football"),
    ("How many rings are on the Olympic flag?", "five", "5"),
    ("What is the main language of Mexico?", "Spanish"),
    ("What is the capital of Mexico?", "Mexico City"),
    ("What color do you get by mixing blue and yellow?", "green"),
    ("What color do you get by mixing red and white?", "pink"),
    ("What is the opposite of hot?", "cold"),
    ("What is frozen water called?", "ice"),
    ("What is the main ingredient of guacamole?", "avocado", "avocados"),
    ("What is the largest continent?", "Asia"),
    ("Which ocean lies between Africa and Australia?", "Indian"),
    ("What is the longest river in South America?", "Amazon"),
    ("Which metal is liquid at room temperature?", "mercury"),
    ("What does CPU stand for?", "central processing unit"),
    ("What does HTML stand for?", "HyperText Markup Language", "Hypertext Markup Language"),
    ("Who founded Microsoft together with Paul Allen?", "Gates"),
    ("What is the capital of Argentina?", "Buenos Aires"),
]


def _knowledge_items() -> list[Item]:
    out = []
    for i, row in enumerate(_K, 1):
        quick = row[-1] is True
        q, *answers = row[:-1] if quick else row
        out.append(_knowledge(i, q, *answers, quick=quick))
    return out


KNOWLEDGE = _knowledge_items()


# ---- Korean instruction-following: 50 prompts ------------------------------------------------------------------


def _ko(i: int, prompt: str, checks: tuple[tuple[str, Check], ...], example: str, quick: bool = False) -> Item:
    return Item(f"ko{i:02d}", "korean", prompt, checks, example, quick)


def _ko_word(i: int, prompt: str, *answers: str, quick: bool = False) -> Item:
    """A one-word Korean answer."""
    checks = (("wrong_language", _hangul), ("ignored_instruction", _words_at_most(4)), ("wrong_fact", _has(*answers)))
    return _ko(i, prompt, checks, answers[0], quick)


def _ko_number(i: int, prompt: str, v: float, quick: bool = False) -> Item:
    return _ko(i, prompt, (("ignored_instruction", _number_only), ("wrong_fact", _equals(v))), f"{v:g}", quick)


def _to_english(i: int, word: str, *answers: str) -> Item:
    checks = (("ignored_instruction", _words_at_most(3)), ("wrong_fact", _says(*answers)))
    return _ko(i, f"다음 단어를 영어로 번역하세요. 번역된 단어만 쓰세요: {word}", checks, answers[0])


def _to_korean(i: int, word: str, *answers: str) -> Item:
    checks = (("wrong_language", _hangul), ("ignored_instruction", _words_at_most(3)), ("wrong_fact", _has(*answers)))
    return _ko(i, f"다음 영어 단어를 한국어로 번역하세요. 번역된 단어만 쓰세요: {word}", checks, answers[0])


def _ko_yes_no(i: int, question: str, yes: bool) -> Item:
    checks = (("wrong_language", _hangul), ("ignored_instruction", _exactly("네", "아니요")),
              ("wrong_fact", _exactly("네" if yes else "아니요")))  # fmt: skip
    return _ko(i, f"'네' 또는 '아니요'로만 답하세요: {question}", checks, "네" if yes else "아니요")


def _ko_sentence(i: int, prompt: str, *must: str, example: str) -> Item:
    """One Korean sentence that contains one of ``must``."""
    checks = (("wrong_language", _hangul), ("ignored_instruction", _one_sentence), ("wrong_fact", _has(*must)))
    return _ko(i, prompt, checks, example)


KOREAN = [
    _ko_word(1, "한국의 수도는 어디인가요? 한국어로 한 단어로 답하세요.", "서울", quick=True),
    _ko_number(2, "3 더하기 4는 얼마인가요? 숫자만 답하세요.", 7, quick=True),
    _ko(3, "하늘은 보통 무슨 색인가요? 한국어로 한 문장으로 답하세요.",
        (("wrong_language", _hangul), ("ignored_instruction", _one_sentence),
         ("wrong_fact", _has("파란", "파랑", "하늘색", "푸른"))), "하늘은 보통 파란색입니다.", quick=True),
    _ko(4, "'안녕하세요'로 시작하는 인사말을 한 문장 쓰세요.",
        (("wrong_language", _hangul), ("ignored_instruction", _starts("안녕하세요"))),
        "안녕하세요, 만나서 반갑습니다."),
    _to_english(5, "사과", "apple"),
    _ko(6, "과일 세 가지를 한국어로 쉼표로 구분해서 한 줄로 나열하세요.",
        (("wrong_language", _hangul), ("format_broken", lambda t: _first_line(t).count(",") == 2)), "사과, 배, 포도"),
    _ko(7, "1부터 5까지의 숫자를 공백으로 구분해서 쓰세요.", (("format_broken", _contains("1 2 3 4 5")),), "1 2 3 4 5"),
    _ko(8, "'예' 또는 '아니오'로만 답하세요: 불은 뜨겁습니까?",
        (("wrong_language", _hangul), ("ignored_instruction", _exactly("예", "아니오")),
         ("wrong_fact", _exactly("예"))),
        "예"),
    _ko(9, "다음 문장을 대문자로 바꾸세요: hello world", (("ignored_instruction", _contains("HELLO WORLD")),),
        "HELLO WORLD"),
    _ko(10, "고양이에 대해 한국어로 두 문장을 쓰세요.",
        (("wrong_language", _hangul), ("ignored_instruction", _has("고양이"))),
        "고양이는 귀여운 동물입니다. 고양이는 잠을 많이 잡니다."),
    _ko_word(11, "일본의 수도는 어디인가요? 한국어로 한 단어로 답하세요.", "도쿄", "동경"),
    _ko_number(12, "5 곱하기 6은 얼마인가요? 숫자만 답하세요.", 30),
    _ko(13, "'감사합니다'로 끝나는 문장을 하나 쓰세요.",
        (("wrong_language", _hangul), ("ignored_instruction", _ends("감사합니다"))), "도와주셔서 정말 감사합니다."),
    _to_english(14, "고양이", "cat"),
    _to_english(15, "물", "water"),
    _to_korean(16, "dog", "개", "강아지"),
    _to_korean(17, "book", "책"),
    _ko_number(18, "일주일은 며칠인가요? 숫자만 답하세요.", 7),
    _ko(19, "채소 두 가지를 한국어로 쉼표로 구분해서 한 줄로 나열하세요.",
        (("wrong_language", _hangul), ("format_broken", lambda t: _first_line(t).count(",") == 1)), "당근, 오이"),
    _ko_word(20, "월요일 다음 날은 무슨 요일인가요? 한국어로 한 단어로 답하세요.", "화요일"),
    _ko_yes_no(21, "물고기는 물속에 삽니까?", yes=True),
    _ko_yes_no(22, "눈은 검은색입니까?", yes=False),
    _ko(23, "다음 문장을 소문자로 바꾸세요: GOOD MORNING", (("ignored_instruction", _contains("good morning")),),
        "good morning"),
    _ko(24, "1부터 3까지 각 숫자를 한 줄에 하나씩 쓰세요.",
        (("format_broken", lambda t: _lines(t)[:3] == ["1", "2", "3"]),), "1\n2\n3"),
    _ko(25, "봄에 대해 한국어로 세 문장 이하로 쓰세요.",
        (("wrong_language", _hangul), ("ignored_instruction", _sentences_at_most(3)), ("wrong_fact", _has("봄"))),
        "봄에는 꽃이 핍니다. 날씨가 따뜻해집니다."),
    _ko(26, "다음 문장의 틀린 글자를 고쳐서 문장 전체를 다시 쓰세요: 나는 학교에 갑니따.",
        (("wrong_language", _hangul), ("wrong_fact", _has("갑니다"))), "나는 학교에 갑니다."),
    _ko_sentence(27, "'사랑'이라는 단어를 넣어서 한 문장을 쓰세요.", "사랑", example="나는 가족을 사랑합니다."),
    _ko_number(28, "다음 숫자 중 가장 큰 수를 숫자만 쓰세요: 12, 45, 7", 45),
    _ko_number(29, "10에서 4를 빼면 얼마인가요? 숫자만 답하세요.", 6),
    _ko_word(30, "대한민국 국기의 이름은 무엇인가요? 한국어로 한 단어로 답하세요.", "태극기"),
    _ko(31, "다음 문장을 존댓말로 바꾸세요: 밥 먹었어?",
        (("wrong_language", _hangul), ("ignored_instruction", _has("셨", "어요", "습니까", "나요"))), "식사하셨어요?"),
    _ko_word(32, "다음 단어의 반대말을 한 단어로 쓰세요: 크다", "작다", "작은"),
    _ko_word(33, "다음 단어의 반대말을 한 단어로 쓰세요: 덥다", "춥다", "추운", "시원하다"),
    _ko(34, "'김치'를 영어 알파벳으로 쓰세요. 그 단어만 쓰세요.",
        (("ignored_instruction", _words_at_most(3)), ("wrong_fact", _says("kimchi", "gimchi"))), "Kimchi"),
    _ko(35, "다음 문장을 영어로 번역하세요: 나는 학생입니다.",
        (("wrong_language", _latin), ("wrong_fact", _says("student"))), "I am a student."),
    _ko(36, "다음 영어 문장을 한국어로 번역하세요: I love music.",
        (("wrong_language", _hangul), ("wrong_fact", _has("음악"))), "나는 음악을 사랑합니다."),
    _ko(37, "한국어로 두 문장으로 자기소개를 하세요. 첫 문장은 '저는'으로 시작하세요.",
        (("wrong_language", _hangul), ("ignored_instruction", _starts("저는"))), "저는 민수입니다. 만나서 반갑습니다."),
    _ko(38, "'가', '나', '다'를 이 순서대로 쉼표로 구분해서 쓰세요.",
        (("format_broken", _matches(r"가\s*,\s*나\s*,\s*다")),), "가, 나, 다"),
    _ko(39, "다음 중 과일이 아닌 것 하나를 골라 그 단어만 쓰세요: 사과, 바나나, 자동차",
        (("ignored_instruction", _words_at_most(3)), ("wrong_fact", _has("자동차"))), "자동차"),
    _ko_number(40, "물은 섭씨 몇 도에서 끓나요? 숫자만 답하세요.", 100),
    _ko_sentence(41, "'좋은 아침'이라는 말을 넣어서 짧은 인사를 한 문장 쓰세요.", "좋은 아침",
                 example="좋은 아침이에요, 오늘도 힘내세요!"),
    _ko_number(42, "다음 문장은 몇 개의 단어로 되어 있나요? 숫자만 답하세요: 나는 오늘 학교에 간다", 4),
    _ko(43, '다음 JSON 형식으로만 답하세요: {"이름": <당신의 이름>}',
        (*JSON_FORMAT, ("ignored_instruction", _json_keys("이름"))), '{"이름": "도우미"}'),
    _ko_word(44, "한국의 전통 옷을 무엇이라고 하나요? 한국어로 한 단어로 답하세요.", "한복"),
    _ko_word(45, "한국에서 설날에 먹는 대표적인 음식은 무엇인가요? 한국어로 한 단어로 답하세요.", "떡국"),
    _ko_word(46, "숫자 3을 한국어 단어로 쓰세요. 그 단어만 쓰세요.", "삼", "셋"),
    _ko(47, "떠나는 사람이 남는 사람에게 하는 인사는 '안녕히 가세요'와 '안녕히 계세요' 중 무엇인가요? "
        "그 인사만 쓰세요.",
        (("wrong_language", _hangul), ("ignored_instruction", _words_at_most(4)),
         ("wrong_fact", lambda t: "계세요" in t and "가세요" not in t)), "안녕히 계세요"),
    _ko(48, "색깔 이름 세 개를 한국어로 한 줄에 하나씩 쓰세요.",
        (("wrong_language", _hangul),
         ("format_broken", lambda t: len(_lines(t)) >= 3 and all(map(_hangul, _lines(t)[:3])))),
        "빨강\n파랑\n노랑"),
    _ko(49, "다음 문장을 과거형으로 바꾸세요: 나는 책을 읽는다.",
        (("wrong_language", _hangul), ("wrong_fact", _has("읽었"))), "나는 책을 읽었다."),
    _ko_sentence(50, "다음 글을 한국어 한 문장으로 요약하세요: 오늘은 비가 많이 와서 우리는 소풍을 취소하고 집에서 "
                 "영화를 보았다.", "비", "소풍", "영화", example="비 때문에 소풍 대신 집에서 영화를 봤다."),
]  # fmt: skip


# ---- service-style: 50 prompts ---------------------------------------------------------------------------------


def _sv(i: int, prompt: str, checks: tuple[tuple[str, Check], ...], example: str, quick: bool = False) -> Item:
    return Item(f"s{i:02d}", "service", prompt, checks, example, quick)


def _sv_word(i: int, prompt: str, answer: str) -> Item:
    """A one-word label (a sentiment, a department, a priority)."""
    return _sv(i, prompt, (("ignored_instruction", _words_at_most(3)), ("wrong_fact", _says(answer))), answer)


def _sv_number(i: int, prompt: str, v: float) -> Item:
    return _sv(i, prompt + " Reply with the number only.",
               (("ignored_instruction", _number_only), ("wrong_fact", _equals(v))), f"{v:g}")  # fmt: skip


def _sv_yes_no(i: int, prompt: str, yes: bool, quick: bool = False) -> Item:
    checks = (("ignored_instruction", _exactly("yes", "no")), ("wrong_fact", _exactly("yes" if yes else "no")))
    return _sv(i, prompt, checks, "Yes" if yes else "No", quick)


def _sentiment(i: int, review: str, answer: str) -> Item:
    return _sv_word(i, "Classify the sentiment of this review as positive, negative or neutral. Reply with one "
                    f"word: '{review}'", answer)  # fmt: skip


def _department(i: int, ticket: str, answer: str) -> Item:
    return _sv_word(i, "Which team should handle this ticket: billing, shipping or technical? Reply with one word: "
                    f"'{ticket}'", answer)  # fmt: skip


def _sv_sentence(i: int, prompt: str, *must: str, example: str) -> Item:
    checks = (("wrong_language", _latin), ("ignored_instruction", _one_sentence), ("wrong_fact", _has(*must)))
    return _sv(i, prompt, checks, example)


def _shorten(i: int, prompt: str, n: int, *must: str, example: str) -> Item:
    checks = (("ignored_instruction", _words_at_most(n)), ("wrong_fact", _has(*must)))
    return _sv(i, prompt, checks, example)


SERVICE = [
    _sv(1, 'Reply with JSON only, with keys "intent" and "priority", for this support ticket: '
        "'My card was charged twice for one order.'",
        (*JSON_FORMAT, ("ignored_instruction", _json_keys("intent", "priority"))),
        '{"intent": "refund", "priority": "high"}', quick=True),
    _sv_yes_no(2, "Is 10 greater than 3? Answer with exactly one word: yes or no.", yes=True, quick=True),
    _sv(3, "Extract the order number from this message and reply with the number only: "
        "'Hi, my order #48213 has not arrived yet.'",
        (("wrong_fact", _has("48213")), ("ignored_instruction", _words_at_most(2))), "48213", quick=True),
    _sentiment(4, "The app keeps crashing and I am furious.", "negative"),
    _sv_number(5, "What is 12 multiplied by 3?", 36),
    _sv(6, "List three colors as a bulleted list, one per line, each line starting with '- '.",
        (("format_broken", _bullets(3)),), "- red\n- green\n- blue"),
    _sv(7, "Write a polite one-sentence apology to a customer for a late delivery.",
        (("wrong_language", _latin), ("ignored_instruction", _has("sorry", "apolog"))),
        "We are sorry that your delivery arrived late."),
    _sv(8, "Respond in uppercase letters only: thank you for your order",
        (("ignored_instruction", lambda t: any(c.isalpha() for c in t) and t == t.upper()),),
        "THANK YOU FOR YOUR ORDER"),
    _shorten(9, "Summarize in at most 10 words: 'Our office will be closed on Monday for a public holiday and will "
             "reopen on Tuesday at 9am.'", 10, "monday", "closed", "holiday",
             example="Office closed Monday for a holiday, reopens Tuesday."),
    _sv(10, 'Reply with JSON only: {"city": <the capital of France>}',
        (*JSON_FORMAT, ("wrong_fact", _json_field("city", _says("paris")))), '{"city": "Paris"}'),
    _sentiment(11, "Great service, my package arrived a day early!", "positive"),
    _sentiment(12, "The package arrived on Tuesday.", "neutral"),
    _sv(13, "Extract the email address from this message and reply with the address only: "
        "'Please contact me at jane.doe@example.com about the refund.'",
        (("wrong_fact", _has("jane.doe@example.com")), ("ignored_instruction", _one_token)), "jane.doe@example.com"),
    _sv(14, "Extract the date from this message and reply with it in the format YYYY-MM-DD only: "
        "'The meeting is on March 5, 2025.'",
        (("format_broken", _matches(r"^\s*\d{4}-\d{2}-\d{2}\s*\.?\s*$")), ("wrong_fact", _has("2025-03-05"))),
        "2025-03-05"),
    _sv(15, 'Reply with JSON only, with keys "name" and "email", extracted from: '
        "'Hi, I am Tom Lee, you can reach me at tom@example.org.'",
        (*JSON_FORMAT, ("ignored_instruction", _json_keys("name", "email")),
         ("wrong_fact", _json_field("email", lambda v: v.strip().lower() == "tom@example.org"))),
        '{"name": "Tom Lee", "email": "tom@example.org"}'),
    _sv(16, 'Reply with JSON only: {"total": <the sum of 19.99 and 5.01>}',
        (*JSON_FORMAT, ("wrong_fact", _json_field("total", lambda v: _number(v) == 25))), '{"total": 25.00}'),
    _shorten(17, "Translate to French and reply with the translation only: 'Thank you'", 4, "merci",
             example="Merci"),
    _shorten(18, "Translate to Spanish and reply with the translation only: 'Good morning'", 4, "buenos días",
             "buenos dias", example="Buenos días"),
    _sv_yes_no(19, "Is 7 an even number? Answer with exactly one word: yes or no.", yes=False),
    _sv_yes_no(20, "Does a week have more days than a weekend? Answer with exactly one word: yes or no.", yes=True),
    _sv(21, "Reply with the word OK and nothing else.", (("ignored_instruction", _exactly("ok")),), "OK"),
    _sv_number(22, "How many minutes are there in 2 hours?", 120),
    _sv_number(23, "A customer bought 3 items at $4 each. What is the total in dollars?", 12),
    _sv(24, "Write an email subject line of at most 8 words announcing a price increase.",
        (("wrong_language", _latin), ("ignored_instruction", _words_at_most(8)), ("wrong_fact", _has("price"))),
        "Important update: our prices are changing"),
    _sv_sentence(25, "Rewrite this request to be more polite, in one sentence: 'Send me the report now.'",
                 "please", "could", "would", "kindly", example="Could you please send me the report?"),
    _department(26, "I was charged the wrong amount on my invoice.", "billing"),
    _department(27, "My parcel has been stuck in transit for a week.", "shipping"),
    _department(28, "The app shows error 500 every time I log in.", "technical"),
    _sv_number(29, "How many words are in this sentence: 'The quick brown fox jumps'?", 5),
    _sv(30, "Reply with the first three letters of the alphabet in uppercase, separated by commas.",
        (("format_broken", _matches(r"A\s*,\s*B\s*,\s*C")),), "A, B, C"),
    _shorten(31, "Write a title of at most 5 words for a help article about resetting a password.", 5, "password",
             example="Resetting your password"),
    _sv(32, "Reply with a JSON array of three fruit names and nothing else.",
        (("format_broken", lambda t: isinstance(_json_value(t), list)), ("format_broken!", _json_only),
         ("ignored_instruction", lambda t: len(v := _json_value(t)) == 3 and all(isinstance(x, str) for x in v))),
        '["apple", "banana", "cherry"]'),
    _sv(33, "Fill in the blank and reply with the missing word only: 'The opposite of up is ___.'",
        (("ignored_instruction", _words_at_most(2)), ("wrong_fact", _says("down"))), "down"),
    _sv_sentence(34, "Tell a customer, in one short sentence, that their order ships tomorrow.", "tomorrow",
                 example="Your order ships tomorrow."),
    _sv_yes_no(35, "Reply 'yes' if this message is spam and 'no' if it is not: 'Congratulations! You won a free "
               "cruise, click here to claim your prize.'", yes=True),
    _sv_yes_no(36, "Reply 'yes' if this message is spam and 'no' if it is not: 'Hi Anna, the team meeting moved "
               "to 3pm today.'", yes=False),
    _sv(37, "Replace every digit in this text with X and reply with the text only: 'Call 555-1234'",
        (("ignored_instruction", lambda t: not any(c.isdigit() for c in t)), ("wrong_fact", _contains("XXX-XXXX"))),
        "Call XXX-XXXX"),
    _sv_number(38, "How many times does the letter 'a' appear in the word 'banana'?", 3),
    _sv_number(39, "What is 15% of 200?", 30),
    _sv(40, "Sort these numbers in ascending order and reply with them separated by spaces: 9 2 7 4",
        (("wrong_fact", _contains("2 4 7 9")),), "2 4 7 9"),
    _sv_sentence(41, "Write a one-sentence message for a new user that includes the word 'welcome'.", "welcome",
                 example="Welcome aboard, we are glad to have you!"),
    _sv(42, 'Reply with JSON only, with a key "language" naming the language of this text: '
        "'Bonjour, comment allez-vous ?'",
        (*JSON_FORMAT, ("wrong_fact", _json_field("language", _says("french")))), '{"language": "French"}'),
    _shorten(43, "Shorten this to at most 6 words: 'We are pleased to inform you that your application has been "
             "approved.'", 6, "approved", example="Your application has been approved."),
    _sv(44, "Which day comes after Friday? Reply with the day only.",
        (("ignored_instruction", _words_at_most(2)), ("wrong_fact", _says("saturday"))), "Saturday"),
    _sv_number(45, "Which is larger, 0.5 or 0.25?", 0.5),
    _sv(46, "Turn this into a bulleted list, one item per line, each line starting with '- ': apples, bread, milk",
        (("format_broken", _bullets(3)), ("wrong_fact", lambda t: all(_has(w)(t) for w in ("apple", "bread", "milk")))),
        "- apples\n- bread\n- milk"),
    _sv_word(47, "What priority does this ticket have: low, medium or high? Reply with one word: 'Our whole "
             "website is down and no customer can pay.'", "high"),
    _sv(48, "Reply with the three-letter ISO currency code of the euro only.", (("wrong_fact", _exactly("eur")),),
        "EUR"),
    _sv(49, "Write the word 'refund' backwards and reply with the result only.",
        (("ignored_instruction", _words_at_most(2)), ("wrong_fact", _says("dnufer"))), "dnufer"),
    _shorten(50, "Summarize in at most 8 words: 'The new update adds a dark mode and fixes the login bug that "
             "many users reported.'", 8, "dark mode", "login", example="Update adds dark mode, fixes login bug."),
]  # fmt: skip

ALL_ITEMS = KNOWLEDGE + KOREAN + SERVICE


def items(quick: bool) -> list[Item]:
    return [i for i in ALL_ITEMS if i.quick] if quick else list(ALL_ITEMS)


def echoes_prompt(item: Item, text: str) -> bool:
    """The answer repeats the prompt instead of answering it (small models often do, Korean most). An answer
    that begins as the right one does not echo, though the prompt holds it (an extracted address)."""
    a = text.strip()
    return len(a) >= 12 and a[:20] in item.prompt and not item.example.startswith(a[:12])


def classify(item: Item, text: str, finish_reason: str | None) -> str | None:
    """None when the answer passes; else the failure type (the first failing check). A kind ending in "!"
    is never turned into a truncation (the format was complete and then broken, e.g. chatter after JSON)."""
    if not text.strip():
        return "empty_or_truncated"
    if echoes_prompt(item, text):
        return "ignored_instruction"
    for kind, check in item.checks:
        try:
            ok = check(text)
        except Exception:
            ok = False
        if not ok:
            # a format cut off by max_tokens is a truncation, not the model breaking the format
            if kind == "format_broken" and finish_reason == "length":
                return "empty_or_truncated"
            return kind.rstrip("!")
    return None
