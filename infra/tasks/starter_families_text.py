"""The six starter families over strings (registered in `starter_families.py`).

Reverse, change case, repeat, count letters, palindromes, and words (count or longest). What
a family function must return, and the rule every `wrong_body` follows, are in
`starter_instance.py`.
"""

from __future__ import annotations

import random

from infra.tasks.starter_instance import WORDS, Instance, random_text, random_word


def reverse_string(rng: random.Random) -> Instance:
    name = rng.choice(["reverse_text", "reverse_string", "backwards", "flip_string"])
    inputs = [
        (random_word(rng).lower(),),
        (random_text(rng, 2),),
        ("",),
        ("ab",),
        (random_word(rng),),
        (" ab ",),  # spaces at the ends stay, swapped (`s[::-1].strip()`)
        ("a  b ",),
    ]
    return Instance(
        name,
        "s: str",
        "str",
        "Return the string `s` reversed.",
        "    return s[::-1]",
        "    return s[:-1][::-1]",
        tuple(inputs),
    )


def change_case(rng: random.Random) -> Instance:
    upper = rng.random() < 0.5
    which = "uppercase" if upper else "lowercase"
    name = rng.choice(["to_{c}", "make_{c}", "convert_to_{c}"]).format(c=which)
    inputs = [(random_text(rng, 2),), ("MiXeD 42",), ("",), (random_word(rng).swapcase(),)]
    return Instance(
        name,
        "s: str",
        "str",
        f"Return `s` with every letter converted to {which}.",
        f"    return s.{'upper' if upper else 'lower'}()",
        "    return s.title()",
        tuple(inputs),
    )


def repeat_string(rng: random.Random) -> Instance:
    k, sep = rng.randint(2, 5), rng.choice(["-", " ", ",", ""])
    name = rng.choice(["repeat_{w}_times", "echo_{w}", "copy_{w}_times"]).format(w=WORDS[k])
    joined = f"joined by {sep!r}" if sep else "with nothing in between"
    wrong = f"    return (s + {sep!r}) * {k}" if sep else f"    return s * {k - 1}"
    inputs = [(random_word(rng).lower(),), ("ab",), ("x",), (random_word(rng),)]
    return Instance(
        name,
        "s: str",
        "str",
        f"Return `s` repeated {k} times, {joined}.",
        f"    return {sep!r}.join([s] * {k})",
        wrong,
        tuple(inputs),
    )


def count_letters(rng: random.Random) -> Instance:
    if rng.random() < 0.5:
        name = rng.choice(["count_vowels", "vowel_count", "number_of_vowels"])
        spec = (
            "Return how many characters of `s` are vowels (a, e, i, o, u), in upper or lower case."
        )
        body, wrong = (
            "    return sum(1 for c in s.lower() if c in 'aeiou')",
            ("    return sum(1 for c in s if c in 'aeiou')"),
        )
        inputs = [(random_text(rng, 2),), ("AEIOU xyz",), ("",), ("Education",)]
        inputs += [("Rhythm",), ("Aloe",)]  # 0 and 3: not the same count every time
    else:
        letter = rng.choice("aeiorst")
        name = f"count_{letter}"
        spec = f"Return how many times the lowercase letter {letter!r} occurs in `s`."
        body, wrong = f"    return s.count({letter!r})", f"    return s.lower().count({letter!r})"
        inputs = [
            (random_text(rng, 3),),
            (f"{letter}{letter.upper()}{letter}",),
            ("",),
            (random_text(rng, 2),),
            ("xyz",),  # none, and four: not the same count every time
            (f"{letter * 4}{letter.upper()}",),
        ]
    return Instance(name, "s: str", "int", spec, body, wrong, tuple(inputs))


def palindrome(rng: random.Random) -> Instance:
    ignore_case = rng.random() < 0.5
    name = rng.choice(["is_palindrome", "reads_same_backwards", "check_palindrome"])
    case = "ignoring upper/lower case" if ignore_case else "comparing case exactly"
    word = random_word(rng)
    inputs = [(word,), ("Abba",), ("level",), ("abca",), ("",), (word.lower(),)]
    if ignore_case:
        body, wrong = "    t = s.lower()\n    return t == t[::-1]", "    return s == s[::-1]"
    else:
        body, wrong = "    return s == s[::-1]", "    t = s.lower()\n    return t == t[::-1]"
    return Instance(
        name,
        "s: str",
        "bool",
        f"Return True if `s` reads the same forwards and backwards ({case}),\notherwise False.",
        body,
        wrong,
        tuple(inputs),
    )


def words(rng: random.Random) -> Instance:
    texts = [
        (random_text(rng, 3),),
        ("  two   spaces ",),
        ("",),
        (random_word(rng),),
        (random_text(rng, 5),),
    ]
    if rng.random() < 0.5:
        name = rng.choice(["count_words", "word_count", "number_of_words"])
        spec = "Return the number of words in `s`; words are separated by any amount of whitespace."
        body, wrong = "    return len(s.split())", "    return s.count(' ') + 1"
        return Instance(name, "s: str", "int", spec, body, wrong, tuple(texts))
    name = rng.choice(["longest_word", "find_longest_word", "biggest_word"])
    spec = (
        "Return the longest whitespace-separated word in `s` (the first one if several\n"
        "are equally long), or '' if `s` has no words."
    )
    body = "    best = ''\n    for w in s.split():\n        if len(w) > len(best):\n            best = w\n    return best"
    wrong = "    best = ''\n    for w in s.split():\n        if len(w) >= len(best):\n            best = w\n    return best"
    texts.append(("cat dog emu",))
    return Instance(name, "s: str", "str", spec, body, wrong, tuple(texts))
