"""The built-in verifiable tasks, generated locally from a seed with a difficulty knob in the name.

- ``arithmetic`` / ``arithmetic-N``: the sum of two N-digit numbers (default 3; 810,000 items at 3).
- ``multiply`` / ``multiply-N``: the product of two N-digit numbers (default 2).
- ``countdown`` / ``countdown-N``: reach a target from N given numbers (default 3, each in 1..20), each used
  exactly once with + − × ÷ — the task TinyZero trains on, with its verifier (every number used once, the
  expression's value equal to the target).
- ``multiples`` / ``multiples-K``: name a multiple of d in a range that holds K of them (default 6): K
  distinct correct answers, so pass@k counts distinct answers and a policy can lose the rare ones.

Process scores (VeriGate's fallback): arithmetic and multiply score the answer's columns — the digits
long addition or multiplication writes right to left, each an intermediate result — as the share that is
right; countdown scores an expression that uses the given numbers by how close its value comes to the
target; multiples gives half credit to a number in the range or a multiple of d outside it.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from .base import Problem, VerifiableTask, answer_text, parse_number


def _rng(task: str, seed: int) -> random.Random:
    return random.Random(f"{task}|{seed}")


def _column_share(stated: str | None, truth: int) -> float:
    """The share of ``truth``'s digits that ``stated`` has right, column by column from the right."""
    value = parse_number(stated)
    if value is None or value != int(value) or value < 0:
        return 0.0
    got, want = str(int(value))[::-1], str(truth)[::-1]
    right = sum(a == b for a, b in zip(got, want))
    return right / max(len(got), len(want))


@dataclass(repr=False)
class Arithmetic(VerifiableTask):
    """The sum (``op="+"``) or product (``op="*"``) of two ``digits``-digit numbers."""

    name: str = "arithmetic"
    digits: int = 3
    op: str = "+"

    @property
    def max_new_tokens(self) -> int:  # type: ignore[override]
        return 16 + 2 * self.digits

    def problem(self, seed: int) -> Problem:
        rng = _rng(self.name, seed)
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        value = a + b if self.op == "+" else a * b
        return Problem(self.name, f"What is {a} {self.op} {b}?", str(value), {"a": a, "b": b, "value": value})

    def reward(self, problem: Problem, completion: str) -> float:
        return float(parse_number(self.stated(problem, completion)) == problem.data["value"])

    def process(self, problem: Problem, completion: str) -> float:
        return _column_share(self.stated(problem, completion), problem.data["value"])


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """An arithmetic expression's exact value and the integers it uses, or None when it is not one
    (only integers, + − × ÷ and parentheses; ``x`` and ``×`` are read as ×, ``÷`` as ÷; nothing is executed)."""
    text = text.replace("×", "*").replace("x", "*").replace("÷", "/").replace("−", "-")
    if not re.fullmatch(r"[\d\s+\-*/()]+", text) or len(text) > 200:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []

    def walk(node) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ZeroDivisionError
            return _OPS[type(node.op)](left, right)
        raise ValueError("not an arithmetic expression")

    try:
        return walk(tree), used
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


@dataclass(repr=False)
class Countdown(VerifiableTask):
    """Reach ``target`` with ``count`` given numbers, each used exactly once (TinyZero's Countdown)."""

    name: str = "countdown"
    count: int = 3
    largest: int = 20
    max_new_tokens = 32

    def problem(self, seed: int) -> Problem:
        rng = _rng(self.name, seed)
        while True:
            nums = [rng.randint(1, self.largest) for _ in range(self.count)]
            order = nums[:]
            rng.shuffle(order)
            expr, value = str(order[0]), Fraction(order[0])
            for n in order[1:]:  # fold the numbers in with an operation that keeps a positive integer
                ops = list("+-*/")
                rng.shuffle(ops)
                for op in ops:
                    new = {"+": value + n, "-": value - n, "*": value * n, "/": value / n}[op]
                    if new.denominator == 1 and new > 0:
                        break
                else:
                    break
                expr, value = (f"({expr} {op} {n})" if op in "+-" else f"{expr} {op} {n}"), new
            else:
                if 1 <= value <= 999:
                    target = int(value)
                    break
        shown = ", ".join(map(str, nums))
        prompt = (f"Using the numbers {shown}, each exactly once, with + - * /, write an expression equal to "
                  f"{target}.")
        return Problem(self.name, prompt, _strip_outer(expr), {"numbers": nums, "target": target})

    def _value(self, problem: Problem, completion: str) -> Fraction | None:
        stated = self.stated(problem, completion)
        if stated is None:
            return None
        stated = stated.split("=")[0]  # "3 + 4 = 7" states the expression 3 + 4
        found = evaluate_expression(stated)
        if found is None or Counter(found[1]) != Counter(problem.data["numbers"]):
            return None
        return found[0]

    def reward(self, problem: Problem, completion: str) -> float:
        return float(self._value(problem, completion) == problem.data["target"])

    def process(self, problem: Problem, completion: str) -> float:
        value = self._value(problem, completion)
        if value is None:
            return 0.0
        target = problem.data["target"]
        return max(0.0, 1.0 - float(abs(value - target)) / target)


def _strip_outer(expr: str) -> str:
    if expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for i, ch in enumerate(expr):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(expr) - 1:
                return expr
        return expr[1:-1]
    return expr


@dataclass(repr=False)
class Multiples(VerifiableTask):
    """Name a multiple of d in a range holding ``count`` of them: ``count`` distinct correct answers."""

    name: str = "multiples"
    count: int = 6
    max_new_tokens = 16

    def problem(self, seed: int) -> Problem:
        rng = _rng(self.name, seed)
        d = rng.randint(3, 9)
        first = d * rng.randint(2, 12)
        lo, hi = first - rng.randint(0, d - 1), first + d * (self.count - 1)
        hi += rng.randint(0, d - 1 - (hi - first) % d if (hi - first) % d else d - 1)
        answers = tuple(str(x) for x in range(lo, hi + 1) if x % d == 0)
        prompt = f"Name a multiple of {d} between {lo} and {hi}."
        return Problem(self.name, prompt, answers[0], {"d": d, "lo": lo, "hi": hi, "answers": answers, "seed": seed})

    def answers(self, problem: Problem) -> tuple[str, ...]:
        return tuple(problem.data["answers"])

    def solution(self, problem: Problem) -> str:
        """One of the correct answers, the i-th smallest with probability ∝ 2^−i (fixed by the problem): a
        demonstrator whose answers have unequal mass, so an SFT policy has common and rare correct answers."""
        answers = problem.data["answers"]
        rng = _rng(self.name + "/solution", int(problem.data["seed"]))
        return self.stated_answer(problem, rng.choices(answers, [2.0 ** -i for i in range(len(answers))])[0])

    def _number(self, problem: Problem, completion: str) -> int | None:
        value = parse_number(self.stated(problem, completion))
        return int(value) if value is not None and value == int(value) else None

    def reward(self, problem: Problem, completion: str) -> float:
        return float(str(self._number(problem, completion)) in problem.data["answers"])

    def process(self, problem: Problem, completion: str) -> float:
        x, d = self._number(problem, completion), problem.data
        if x is None:
            return 0.0
        inside, multiple = d["lo"] <= x <= d["hi"], x % d["d"] == 0
        return 1.0 if inside and multiple else 0.5 if inside or multiple else 0.0


#: Built-in task families: name → (constructor of the knob's value, the knob's default, its bounds).
FAMILIES = {
    "arithmetic": (lambda n, name: Arithmetic(name=name, digits=n, op="+"), 3, (1, 12)),
    "multiply": (lambda n, name: Arithmetic(name=name, digits=n, op="*"), 2, (1, 6)),
    "countdown": (lambda n, name: Countdown(name=name, count=n), 3, (2, 5)),
    "multiples": (lambda n, name: Multiples(name=name, count=n), 6, (2, 40)),
}
_NAME = re.compile(r"([a-z]+)(?:-(\d+))?")


def builtin(name: str) -> VerifiableTask | None:
    """The built-in task ``name`` (``family`` or ``family-N``), or None when ``name`` is not one."""
    m = _NAME.fullmatch(name)
    if not m or m[1] not in FAMILIES:
        return None
    make, default, (lo, hi) = FAMILIES[m[1]]
    n = int(m[2]) if m[2] else default
    if not lo <= n <= hi:
        from ..core.errors import GraftkitError

        raise GraftkitError(f"task {name}: difficulty {n} is outside {lo}..{hi}", f"pass e.g. {m[1]}-{default}")
    return make(n, name)


def solutions_are_right(task: VerifiableTask, seeds: int = 20) -> bool:
    """Every demonstrated solution of the first ``seeds`` problems scores 1 (a self-check)."""
    return all(task.reward(p, task.solution(p)) == 1.0 for p in map(task.problem, range(seeds)))


__all__ = ["Arithmetic", "Countdown", "Multiples", "FAMILIES", "builtin", "evaluate_expression", "answer_text"]
