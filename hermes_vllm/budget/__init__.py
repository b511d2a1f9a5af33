"""Token budgets: plan a turn's tokens so its call (or answer) is complete within ``max_tokens``.

Beside :mod:`hermes_vllm.grammar` (what may be written) this room says how much is left to write
it: the shortest value of a schema, every reading of a partial call, the turn's reserve, and the
text a row is steered to, spelled in the served vocabulary's tokens. Engine- and vLLM-free.
"""

from hermes_vllm.budget.completer import AnswerCompleter, CallCompleter
from hermes_vllm.budget.shortest import Measure
from hermes_vllm.budget.speller import Speller
from hermes_vllm.budget.turn_budget import MARK, NOTHING, Plan, TurnBudget, call_reserve

__all__ = [
    "MARK",
    "NOTHING",
    "AnswerCompleter",
    "CallCompleter",
    "Measure",
    "Plan",
    "Speller",
    "TurnBudget",
    "call_reserve",
]
