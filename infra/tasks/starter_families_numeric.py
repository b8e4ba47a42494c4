"""The fourteen starter families over numbers and lists (registered in `starter_families.py`).

Arithmetic on one integer (add, multiply, linear, clamp, digits), conversions and
classifications of one number (temperature, fizzbuzz), and filters, folds and scans over a
list (sum above, extreme, parity, running sums/maxima, dedupe, compare, powers). What a family
function must return, and the rule every `wrong_body` follows, are in `starter_instance.py`.
"""

from __future__ import annotations

import random

from infra.tasks.starter_instance import WORDS, Instance, random_ints, random_word


def add_constant(rng: random.Random) -> Instance:
    k = rng.randint(2, 12)
    name = rng.choice(["add_{w}", "plus_{w}", "increase_by_{w}"]).format(w=WORDS[k])
    inputs = [(x,) for x in [rng.randint(0, 30), 0, rng.randint(-20, -1), rng.randint(31, 99)]]
    return Instance(
        name,
        "x: int",
        "int",
        f"Return `x` plus {k}.",
        f"    return x + {k}",
        f"    return x + {k - 1}",
        tuple(inputs),
    )


def multiply_constant(rng: random.Random) -> Instance:
    k = rng.randint(3, 12)
    name = rng.choice(["times_{w}", "multiply_by_{w}", "scale_by_{w}"]).format(w=WORDS[k])
    inputs = [(x,) for x in [rng.randint(1, 12), 0, rng.randint(-9, -1), rng.randint(13, 50)]]
    return Instance(
        name,
        "x: int",
        "int",
        f"Return `x` multiplied by {k}.",
        f"    return x * {k}",
        f"    return x + {k}",
        tuple(inputs),
    )


def linear(rng: random.Random) -> Instance:
    a, b = rng.randint(2, 9), rng.randint(1, 20)
    name = rng.choice(["line_value", "apply_rule", "compute_score", "transform"])
    inputs = [(x,) for x in [rng.randint(1, 10), 0, rng.randint(-10, -1), rng.randint(11, 40)]]
    return Instance(
        name,
        "x: int",
        "int",
        f"Return {a} times `x`, plus {b}.",
        f"    return {a} * x + {b}",
        f"    return {a} * (x + {b})",
        tuple(inputs),
    )


def sum_above(rng: random.Random) -> Instance:
    k = rng.randint(1, 5)  # not 0: adding a zero hides the >= bug
    name = rng.choice(["sum_above_{w}", "total_over_{w}", "add_up_above_{w}"]).format(w=WORDS[k])
    lists = [random_ints(rng, 5) + [k], [k, k + 1], [], random_ints(rng, 6, -5, 10) + [k]]
    return Instance(
        name,
        "nums: list[int]",
        "int",
        f"Return the sum of the numbers in `nums` that are greater than {k}.",
        f"    return sum(x for x in nums if x > {k})",
        f"    return sum(x for x in nums if x >= {k})",
        # -k-1 is not above k, though its magnitude is (the `abs(x) > k` mistake); drawn
        # from no randomness, so the earlier cases stay as they were
        tuple((rng.sample(xs, len(xs)),) for xs in lists) + (([-k - 1, k + 2, -k - 2],),),
    )


def extreme(rng: random.Random) -> Instance:
    largest = rng.random() < 0.5
    which = "largest" if largest else "smallest"
    name = rng.choice(["{w}_number", "find_{w}", "pick_{w}"]).format(w=which)
    best, op = ("max", ">") if largest else ("min", "<")
    sign = -1 if largest else 1  # the list the "start from 0" bug gets wrong
    lists = [
        random_ints(rng, 5),
        [4, 9, 1, 7],
        [sign * x for x in random_ints(rng, 4, 1, 30)],
        [rng.randint(-9, 9)],
    ]
    wrong = f"    best = 0\n    for x in nums:\n        if x {op} best:\n            best = x\n    return best"
    return Instance(
        name,
        "nums: list[int]",
        "int",
        f"Return the {which} number in the non-empty list `nums`.",
        f"    return {best}(nums)",
        wrong,
        # lists where the value and the magnitude disagree (`min(nums, key=abs)`): the
        # smallest is the negative of largest magnitude, the largest is not
        tuple((xs,) for xs in lists) + (([5, -7, 2],), ([-9, 3, 1],)),
    )


def keep_parity(rng: random.Random) -> Instance:
    even = rng.random() < 0.5
    which = "even" if even else "odd"
    name = rng.choice(["keep_{w}", "only_{w}", "filter_{w}"]).format(w=which)
    lists = [random_ints(rng, 6), [1, 2, 3, 4, 5], [], random_ints(rng, 8, -20, 20)]
    keep, inverted = ("x % 2 == 0", "x % 2 == 1") if even else ("x % 2 == 1", "x % 2 == 0")
    return Instance(
        name,
        "nums: list[int]",
        "list[int]",
        f"Return a list of the {which} numbers in `nums`, in their original order.",
        f"    return [x for x in nums if {keep}]",
        f"    return [x for x in nums if {inverted}]",
        tuple((xs,) for xs in lists),
    )


def clamp(rng: random.Random) -> Instance:
    low = rng.randint(-10, 5)
    high = low + rng.randint(3, 20)
    name = rng.choice(["clamp", "limit", "bound", "clip_value"])
    inputs = [
        (rng.randint(low, high),),
        (low - rng.randint(1, 9),),
        (high + rng.randint(1, 9),),
        (low,),
        (high,),
    ]
    spec = (
        f"Return `x` limited to the range {low}..{high}: {low} if `x` is below {low},\n"
        f"{high} if `x` is above {high}, otherwise `x` itself."
    )
    return Instance(
        name,
        "x: int",
        "int",
        spec,
        f"    return max({low}, min(x, {high}))",
        f"    return max({low}, x)",
        tuple(inputs),
    )


def fizzbuzz(rng: random.Random) -> Instance:
    a, b = rng.choice([(3, 5), (2, 7), (3, 7), (4, 5), (2, 5)])
    first, second = rng.choice([("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong")])
    name = rng.choice(["fizzbuzz", "say_number", f"{first.lower()}_{second.lower()}"])
    spec = (
        f"Return {first + second!r} if `n` is divisible by both {a} and {b}, {first!r} if it is\n"
        f"divisible only by {a}, {second!r} if only by {b}, otherwise `n` as a string."
    )
    body = (
        f"    if n % {a} == 0 and n % {b} == 0:\n        return {first + second!r}\n"
        f"    if n % {a} == 0:\n        return {first!r}\n"
        f"    if n % {b} == 0:\n        return {second!r}\n    return str(n)"
    )
    wrong = (
        f"    if n % {a} == 0:\n        return {first!r}\n"
        f"    if n % {b} == 0:\n        return {second!r}\n    return str(n)"
    )
    inputs = [(a * b * rng.randint(2, 4),), (a,), (b,), (a * b + 1,), (a * b,)]
    return Instance(name, "n: int", "str", spec, body, wrong, tuple(inputs))


def temperature(rng: random.Random) -> Instance:
    if rng.random() < 0.5:
        name, param = rng.choice(["celsius_to_fahrenheit", "c_to_f"]), "c"
        spec = "Convert `c` degrees Celsius to Fahrenheit, using F = C * 9 / 5 + 32."
        body, wrong = "    return c * 9 / 5 + 32", "    return c * 5 / 9 + 32"
    else:
        name, param = rng.choice(["fahrenheit_to_celsius", "f_to_c"]), "f"
        spec = "Convert `f` degrees Fahrenheit to Celsius, using C = (F - 32) * 5 / 9."
        body, wrong = "    return (f - 32) * 5 / 9", "    return f - 32 * 5 / 9"
    inputs = [(float(rng.randint(-10, 40)),), (100.0,), (0.0,), (float(rng.randint(41, 120)),)]
    return Instance(name, f"{param}: float", "float", spec, body, wrong, tuple(inputs))


def running(rng: random.Random) -> Instance:
    use_sum = rng.random() < 0.5
    lists = [random_ints(rng, 5, 0, 9), [3, 1, 4, 1, 5], [], random_ints(rng, 6, -9, 9)]
    if use_sum:
        name = rng.choice(["running_sum", "prefix_sums", "cumulative_sum"])
        spec = "Return the running sums of `nums`: item i is nums[0] + ... + nums[i]."
        body = "    out, total = [], 0\n    for x in nums:\n        total += x\n        out.append(total)\n    return out"
        wrong = "    out, total = [], 0\n    for x in nums:\n        out.append(total)\n        total += x\n    return out"
    else:
        name = rng.choice(["running_max", "prefix_maxima", "max_so_far"])
        spec = "Return the running maxima of `nums`: item i is max(nums[0], ..., nums[i])."
        body = "    out = []\n    for x in nums:\n        out.append(max(out[-1], x) if out else x)\n    return out"
        wrong = "    return [max(nums[: i + 1]) for i in range(len(nums) - 1)]"
    return Instance(
        name, "nums: list[int]", "list[int]", spec, body, wrong, tuple((xs,) for xs in lists)
    )


def dedupe(rng: random.Random) -> Instance:
    name = rng.choice(["dedupe", "remove_duplicates", "unique_in_order"])
    if rng.random() < 0.5:
        params, returns = "items: list[int]", "list[int]"
        lists: list[list[int] | list[str]] = [[3, 1, 3, 2, 1], random_ints(rng, 8, 0, 5), [], [7]]
    else:
        params, returns = "items: list[str]", "list[str]"
        lists = [[random_word(rng) for _ in range(6)], ["b", "a", "b", "c", "a"], [], ["x", "x"]]
    return Instance(
        name,
        params,
        returns,
        "Return `items` without duplicates, keeping the first occurrence of each\n"
        "item and the original order.",
        "    seen = set()\n    out = []\n    for item in items:\n        if item not in seen:\n"
        "            seen.add(item)\n            out.append(item)\n    return out",
        "    return sorted(set(items))",
        tuple((xs,) for xs in lists),
    )


def count_compared(rng: random.Random) -> Instance:
    k = rng.randint(0, 9)
    greater = rng.random() < 0.5
    which, op, wrong_op = ("greater", ">", ">=") if greater else ("less", "<", "<=")
    name = f"count_{which}_than_{WORDS[k]}"
    lists = [random_ints(rng, 6) + [k], [k, k, k + 1, k - 1], [], random_ints(rng, 9, -20, 20)]
    return Instance(
        name,
        "nums: list[int]",
        "int",
        f"Return how many numbers in `nums` are {which} than {k}.",
        f"    return sum(1 for x in nums if x {op} {k})",
        f"    return sum(1 for x in nums if x {wrong_op} {k})",
        # two on each side of k: a count other than 0 or 1 (`return 1 if nums else 0`)
        tuple((rng.sample(xs, len(xs)),) for xs in lists) + (([k - 2, k + 1, k, k - 1, k + 2],),),
    )


def powers(rng: random.Random) -> Instance:
    p = rng.randint(2, 3)
    name = rng.choice(["{w}_each", "raise_each", "power_all"]).format(
        w="square" if p == 2 else "cube"
    )
    lists = [random_ints(rng, 4, -5, 9), [3, 4], [], [10]]
    return Instance(
        name,
        "nums: list[int]",
        "list[int]",
        f"Return a new list with each number in `nums` raised to the power {p}.",
        f"    return [x ** {p} for x in nums]",
        f"    return [x * {p} for x in nums]",
        # negatives keep their sign under an odd power (`abs(x) ** 3`)
        tuple((xs,) for xs in lists) + (([-2, 0, -3],),),
    )


def digits(rng: random.Random) -> Instance:
    numbers = [(rng.randint(100, 99999),), (7,), (0,), (rng.randint(10, 99),), (1000,)]
    if rng.random() < 0.5:
        name = rng.choice(["digit_sum", "sum_of_digits", "add_digits"])
        spec = "Return the sum of the decimal digits of the non-negative integer `n`."
        body, wrong = (
            "    return sum(int(d) for d in str(n))",
            "    return sum(int(d) for d in str(n)[1:])",
        )
    else:
        name = rng.choice(["count_digits", "digit_count", "number_length"])
        spec = "Return how many decimal digits the non-negative integer `n` has (0 has one digit)."
        body, wrong = "    return len(str(n))", "    return len(str(n // 10)) if n >= 10 else 1"
    return Instance(name, "n: int", "int", spec, body, wrong, tuple(numbers))
