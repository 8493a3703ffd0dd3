"""Single-turn verifiable tasks: prompt → completion → reward in [0, 1] (math, puzzles, the user's own).

    from graftkit import verifiable
    task = verifiable.lookup("arithmetic")           # or countdown, multiples, FILE.jsonl, my_pkg.tasks:suite
    p = task.problem(seed=3)                         # Problem: prompt, reference answer, verifier data
    task.reward(p, "<answer>912</answer>")           # the verifier: 1.0 or 0.0
    task.process(p, "<answer>902</answer>")          # partial credit from intermediate results (VeriGate)

``ProblemEnv`` plays a problem as a one-turn episode with the web environments' interface, so rollouts,
evaluation (items, held-out splits, paired statistics, pass@k, headroom), SFT and GRPO take either kind.
"""

from .base import SYSTEM, Problem, VerifiableTask, answer_text, extract_answer, parse_number
from .builtin import FAMILIES, Arithmetic, Countdown, Multiples, builtin, evaluate_expression
from .env import ProblemEnv, ProblemObservation
from .registry import is_verifiable, lookup, register, registered, resolve_source

__all__ = [
    "SYSTEM", "Problem", "VerifiableTask", "answer_text", "extract_answer", "parse_number", "FAMILIES", "Arithmetic",
    "Countdown", "Multiples", "builtin", "evaluate_expression", "ProblemEnv", "ProblemObservation", "is_verifiable",
    "lookup", "register", "registered", "resolve_source",
]
