"""Every fuzz strategy by name, with the number of cases the CI suite runs of each.

hypothesis draws some inputs twice (small strategies, minimal values), so what CI asks
of each strategy is a number of *distinct* inputs (fuzz.runner.run_distinct tops up with
more seeded rounds until it has them); the counts add up to 2,000 and more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from hypothesis import strategies as st

from fuzz.case import Case
from fuzz.grammar import grammar_programs
from fuzz.ir_mutate import mutated_ir
from fuzz.mutate import mutated_models, nudged_valid_models
from fuzz.structures import structures
from fuzz.valid_models import valid_models


class Plan(NamedTuple):
    factory: Callable[[], st.SearchStrategy[Case]]
    cases: int  # distinct inputs in CI; also the strategy's share of a long run


STRATEGIES: dict[str, Plan] = {
    "valid": Plan(valid_models, 520),
    "mutate": Plan(mutated_models, 700),
    "grammar": Plan(grammar_programs, 270),
    "structures": Plan(structures, 160),
    "ir": Plan(mutated_ir, 480),
    "nudge": Plan(nudged_valid_models, 200),
}
