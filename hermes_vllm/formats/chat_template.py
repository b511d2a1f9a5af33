"""The Jinja chat template of a dialect (placeholder; the full template lands with the formats work)."""

from __future__ import annotations

from hermes_vllm.dialect import Dialect, get_dialect


def chat_template(dialect: str | Dialect = "hermes") -> str:
    """Jinja ChatML template for ``dialect``."""
    d = get_dialect(dialect)
    return (
        "{%- for m in messages %}" + d.turn.begin + "{{ m['role'] }}\n{{ m['content'] }}" + d.turn.end + "\n{%- endfor %}"
        "{%- if add_generation_prompt %}" + d.turn.begin + "assistant\n{%- endif %}"
    )
